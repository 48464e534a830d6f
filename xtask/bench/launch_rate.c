/* A launch storm that records its own progress: N cudaLaunchKernel calls into LIB (dlopen'd),
 * each followed by WORK iterations of CPU work, counting its calls per 5 ms slot of
 * CLOCK_MONOTONIC and printing "slot <start ns> <calls>" at the end. Traced with a budget
 * small enough for one window, the slots show what the window and its close cost the storm:
 * where the calls per slot fall below the median, the storm lost that share of the slot.
 *   launch_rate LIB N WORK */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);

static void kernel_stub(void) {}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

#define SLOT_NS 5000000L
#define SLOTS 20000
static long count[SLOTS];

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: launch_rate LIB N WORK\n"); return 2; }
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    launch_fn launch = (launch_fn)dlsym(h, "cudaLaunchKernel");
    if (!launch) { fprintf(stderr, "no cudaLaunchKernel in %s\n", argv[1]); return 1; }
    long n = atol(argv[2]), work = atol(argv[3]);
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    volatile unsigned long sink = 0;
    long t0 = now_ns(), slot = 0;
    for (long i = 0; i < n; i++) {
        launch((const void *)kernel_stub, g, b, NULL, 0, NULL);
        for (long j = 0; j < work; j++) sink += j;
        if ((i & 63) == 0) {
            slot = (now_ns() - t0) / SLOT_NS;
            if (slot >= SLOTS) slot = SLOTS - 1;
        }
        count[slot]++;
    }
    /* The last slot is cut short by the end: left out. */
    for (long s = 0; s < slot; s++) printf("slot %ld %ld\n", t0 + s * SLOT_NS, count[s]);
    return 0;
}

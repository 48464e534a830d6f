/* A launch storm: N cudaLaunchKernel calls into LIB (dlopen'd), each followed by a fixed amount
 * of CPU work (WORK iterations, ~1 us here: a storm of ~1M launches/s). Times itself and prints
 * "ns_per_op X" so that tracer start-up is not part of what is measured. The time is the
 * process's CPU time (probe handling runs in the probed thread and is charged to it), which,
 * unlike wall time, does not grow while a loaded machine keeps the thread waiting for a CPU;
 * "wall_ns_per_op" is printed as well.
 * With STORM_SLOTS set it also counts its calls per 5 ms slot of CLOCK_MONOTONIC and prints
 * "slot <start ns> <calls>" for every whole slot: where the calls per slot fall below the
 * median, the storm lost that share of the slot (`cargo xtask bench --window-cost`).
 *   launch_storm LIB N WORK */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);

static void kernel_stub(void) {}

#define SLOT_NS 5000000L
#define SLOTS 20000
static long slot_calls[SLOTS];

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: launch_storm LIB N WORK\n"); return 2; }
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    launch_fn launch = (launch_fn)dlsym(h, "cudaLaunchKernel");
    if (!launch) { fprintf(stderr, "no cudaLaunchKernel in %s\n", argv[1]); return 1; }
    long n = atol(argv[2]), work = atol(argv[3]);
    int slots = getenv("STORM_SLOTS") != NULL;
    long slot = 0, s0 = now_ns();
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    volatile unsigned long sink = 0;
    struct timespec t0, t1, c0, c1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    for (long i = 0; i < n; i++) {
        launch((const void *)kernel_stub, g, b, NULL, 0, NULL);
        for (long j = 0; j < work; j++) sink += j;
        if (slots) {
            if ((i & 63) == 0) {
                slot = (now_ns() - s0) / SLOT_NS;
                if (slot >= SLOTS) slot = SLOTS - 1;
            }
            slot_calls[slot]++;
        }
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    double cpu = (c1.tv_sec - c0.tv_sec) * 1e9 + (c1.tv_nsec - c0.tv_nsec);
    printf("ns_per_op %.2f\nwall_ns_per_op %.2f\n", cpu / n, ns / n);
    /* The last slot is cut short by the end: left out. */
    for (long s = 0; slots && s < slot; s++) printf("slot %ld %ld\n", s0 + s * SLOT_NS, slot_calls[s]);
    return 0;
}

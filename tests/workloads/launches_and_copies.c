/* Training-loop steps of 100 cudaLaunchKernel calls (~0.5 us of work each), then a
 * cudaMemcpyAsync and a cudaMemcpy (the loss read back, as `.item()` does: two calls in a row)
 * into LIB (dlopen'd). The launches are sampled by the budget's windows; the copies never are,
 * so tests/e2e/budget.rs expects every one of them counted, and the launches between windows
 * estimated from them.
 *   launches_and_copies LIB STEPS */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);
typedef int (*memcpy_fn)(void *, const void *, size_t, int);
typedef int (*memcpy_async_fn)(void *, const void *, size_t, int, void *);

static void kernel_stub(void) {}

/* The copy from a deeper frame than the launches: after a window's close loses a launch's
 * return, the next launch (same frame) tells the lost call from a nested one by its stack
 * level, but a copy made deeper looks nested in it until the threads' call states are known
 * stale (the return probes' generation). */
__attribute__((noinline)) static void copy_deeper(memcpy_fn copy, char *dst, const char *src) {
    volatile char pad[64];
    pad[0] = 0;
    copy(dst, src, 8, 1 + (pad[0] & 0));
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) return 3;
    launch_fn launch = (launch_fn)dlsym(h, "cudaLaunchKernel");
    memcpy_fn copy = (memcpy_fn)dlsym(h, "cudaMemcpy");
    memcpy_async_fn copy_async = (memcpy_async_fn)dlsym(h, "cudaMemcpyAsync");
    if (!launch || !copy || !copy_async) return 4;
    char dst[8], src[8] = {0};
    /* Lets gputrace find the library (it is probed within milliseconds of its mapping). */
    usleep(300000);
    long steps = atol(argv[2]);
    dim3 one = {1, 1, 1};
    volatile long work = 0;
    for (long s = 0; s < steps; s++) {
        for (int i = 0; i < 100; i++) {
            launch((const void *)kernel_stub, one, one, 0, 0, 0);
            for (int w = 0; w < 3000; w++) work += w;
        }
        copy_async(dst, src, 8, 2, 0);
        copy_deeper(copy, dst, src);
    }
    printf("steps %ld\n", steps);
    return 0;
}

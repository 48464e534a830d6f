/* A copy storm: N cudaMemcpyAsync calls of 8 bytes into LIB (dlopen'd), each followed by a
 * fixed amount of CPU work (WORK iterations), as a loop that reads a scalar back after every
 * tiny step makes. Prints "ns_per_op X" (the process's CPU time per call, as launch_storm).
 * The budget must switch the copy probes too: no launch window covers them.
 *   copy_storm LIB N WORK */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*memcpy_async_fn)(void *, const void *, size_t, int, void *);

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: copy_storm LIB N WORK\n"); return 2; }
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    memcpy_async_fn copy = (memcpy_async_fn)dlsym(h, "cudaMemcpyAsync");
    if (!copy) { fprintf(stderr, "no cudaMemcpyAsync in %s\n", argv[1]); return 1; }
    long n = atol(argv[2]), work = atol(argv[3]);
    char dst[8], src[8] = {0};
    volatile unsigned long sink = 0;
    struct timespec t0, t1, c0, c1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    for (long i = 0; i < n; i++) {
        if (copy(dst, src, sizeof dst, 2, NULL) != 0) return 3;
        for (long j = 0; j < work; j++) sink += j;
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    double cpu = (c1.tv_sec - c0.tv_sec) * 1e9 + (c1.tv_nsec - c0.tv_nsec);
    printf("ns_per_op %.2f\nwall_ns_per_op %.2f\n", cpu / n, ns / n);
    return 0;
}

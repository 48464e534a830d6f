/* A launch storm through one CUDA library (RT, its cudaLaunchKernel) that then loads another
 * (DRV, its cuLaunchKernel) and launches through that: the second library is mapped while the
 * budget's window is most likely closed, so its launch probes wait for the next window.
 *   late_library RT N1 DRV N2 WORK */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*rt_launch)(const void *, dim3, dim3, void **, size_t, void *);
typedef int (*drv_launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                          unsigned, void *, void **, void **);

static void kernel_stub(void) {}

int main(int argc, char **argv) {
    if (argc < 6) { fprintf(stderr, "usage: late_library RT N1 DRV N2 WORK\n"); return 2; }
    long n1 = atol(argv[2]), n2 = atol(argv[4]), work = atol(argv[5]);
    volatile unsigned long sink = 0;
    void *rt = dlopen(argv[1], RTLD_NOW);
    if (!rt) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    rt_launch launch = (rt_launch)dlsym(rt, "cudaLaunchKernel");
    if (!launch) { fprintf(stderr, "no cudaLaunchKernel in %s\n", argv[1]); return 1; }
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    for (long i = 0; i < n1; i++) {
        launch((const void *)kernel_stub, g, b, NULL, 0, NULL);
        for (long j = 0; j < work; j++) sink += j;
    }
    void *drv = dlopen(argv[3], RTLD_NOW);
    if (!drv) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    drv_launch cu = (drv_launch)dlsym(drv, "cuLaunchKernel");
    if (!cu) { fprintf(stderr, "no cuLaunchKernel in %s\n", argv[3]); return 1; }
    for (long i = 0; i < n2; i++) {
        cu((void *)kernel_stub, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        for (long j = 0; j < work; j++) sink += j;
    }
    printf("late_calls %ld\n", n2);
    return 0;
}

/* N cudaLaunchKernel calls into a libcudart.so.12 loaded with dlopen: cost per traced launch.
 *   launch_loop LIB N SETTLE_MS */
#include "common.h"
#include <dlfcn.h>
#include <stddef.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);

static void kernel_stub(void) {}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    launch_fn launch = (launch_fn)dlsym(h, "cudaLaunchKernel");
    long n = argc > 2 ? atol(argv[2]) : 1000000;
    bench_settle(argc, argv, 3);
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    double t = bench_now();
    for (long i = 0; i < n; i++) launch((const void *)kernel_stub, g, b, NULL, 0, NULL);
    bench_report(t, n);
    return 0;
}

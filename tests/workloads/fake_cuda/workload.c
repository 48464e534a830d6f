/* Makes known numbers of CUDA calls through the fake libcudart.so.12 (linked) and libcuda.so.1
 * (dlopen'd, as cuBLAS/Triton reach the driver). tests/e2e/cuda.rs checks the counts exactly.
 *
 *   workload [start_delay_ms]      the delay lets gputrace find the libraries first
 *   workload --bench N             N launches as fast as possible, then exit (benchmarks)
 *   workload --held N              one launch held inside the runtime, then N launches
 *   workload --paced N             N copies, each followed by a 1 ms sleep: at most 1,000 a
 *                                  second, so a window of T s can see at most 1,000 T of them
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct { unsigned int x, y, z; } dim3;
typedef struct {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    void *stream;
    void *attrs;
    unsigned int numAttrs;
} cudaLaunchConfig_t;

int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, void *s);
int cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args);
int cudaMemcpy(void *dst, const void *src, size_t count, int kind);
int cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, void *s);
int cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t w, size_t h,
                 int kind);
struct cudaPos { size_t x, y, z; };
struct cudaPitchedPtr { void *ptr; size_t pitch, xsize, ysize; };
struct cudaExtent { size_t width, height, depth; };
struct cudaMemcpy3DParms {
    void *srcArray;
    struct cudaPos srcPos;
    struct cudaPitchedPtr srcPtr;
    void *dstArray;
    struct cudaPos dstPos;
    struct cudaPitchedPtr dstPtr;
    struct cudaExtent extent;
    int kind;
};
int cudaMemcpy3D(const struct cudaMemcpy3DParms *p);
int cudaMalloc(void **p, size_t size);
int cudaFree(void *p);
int cudaDeviceSynchronize(void);
int cudaStreamSynchronize(void *s);
void __cudaRegisterFunction(void **, const char *, char *, const char *, int, void *, void *,
                            void *, void *, int *);

/* Host stubs. nvcc names a kernel's stub with the kernel's mangled name, so symbolising the
 * stub pointer names the kernel: vectorAdd(float const*, float const*, float*, int). */
void _Z9vectorAddPKfS0_Pfi(void) { __asm__ volatile(""); }
/* This one is named only through __cudaRegisterFunction: scale(float*, int, float). */
void scale_host_stub(void) { __asm__ volatile(""); }

typedef int (*get_fn)(void **, void *, const char *);
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
typedef int (*copy_fn)(uint64_t, const void *, size_t);
typedef int (*lib_kernel_fn)(void **, void *, const char *);
typedef int (*kernel_fn_fn)(void **, void *);

static int check(int got, int want, const char *what) {
    if (got != want) {
        fprintf(stderr, "workload: %s returned %d, expected %d\n", what, got, want);
        exit(1);
    }
    return got;
}

static int bench(long n) {
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < n; i++) cudaLaunchKernel((void *)_Z9vectorAddPKfS0_Pfi, g, b, 0, 0, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    printf("launches=%ld ns_per_launch=%.1f\n", n, ns / n);
    return 0;
}

/* One launch held inside the runtime before its driver call (FAKE_CUDART_HOLD, see
 * cudart.c), then n launches. */
static int held(long n) {
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    check(cudaLaunchKernel((void *)_Z9vectorAddPKfS0_Pfi, g, b, 0, 0, (void *)0x401d), 0,
          "held cudaLaunchKernel");
    for (long i = 0; i < n; i++)
        check(cudaLaunchKernel((void *)_Z9vectorAddPKfS0_Pfi, g, b, 0, 0, 0), 0,
              "cudaLaunchKernel");
    return 0;
}

static int paced(long n) {
    static char src[64], dst[64];
    struct timespec ms = {0, 1000000};
    for (long i = 0; i < n; i++) {
        cudaMemcpy(dst, src, sizeof src, 1);
        nanosleep(&ms, NULL);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "--bench") == 0) return bench(atol(argv[2]));
    if (argc > 2 && strcmp(argv[1], "--paced") == 0) return paced(atol(argv[2]));
    if (argc > 2 && strcmp(argv[1], "--held") == 0) return held(atol(argv[2]));
    /* The real runtime loads the driver when it initialises, before the first call. */
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    if (!drv) { fprintf(stderr, "workload: %s\n", dlerror()); return 1; }
    if (argc > 1) usleep(atoi(argv[1]) * 1000);

    __cudaRegisterFunction(0, (const char *)scale_host_stub, "_Z5scalePfif", "_Z5scalePfif", -1, 0,
                           0, 0, 0, 0);

    /* Runtime launches: 100 + 50 good, 3 failing with cudaErrorInvalidDeviceFunction (98). */
    dim3 g1 = {256, 1, 1}, b1 = {128, 1, 1};
    dim3 g2 = {64, 2, 1}, b2 = {32, 4, 1};
    for (int i = 0; i < 100; i++)
        check(cudaLaunchKernel((void *)_Z9vectorAddPKfS0_Pfi, g1, b1, 0, 0, 0), 0, "launch");
    for (int i = 0; i < 50; i++)
        check(cudaLaunchKernel((void *)scale_host_stub, g2, b2, 0, 0, 0), 0, "launch");
    for (int i = 0; i < 3; i++) check(cudaLaunchKernel(0, g1, b1, 0, 0, 0), 98, "bad launch");
    /* 7 through cudaLaunchKernelExC (which calls cudaLaunchKernel inside: counted once). */
    cudaLaunchConfig_t cfg = {{16, 16, 1}, {8, 8, 2}, 0, 0, 0, 0};
    for (int i = 0; i < 7; i++)
        check(cudaLaunchKernelExC(&cfg, (void *)_Z9vectorAddPKfS0_Pfi, 0), 0, "launchEx");

    /* Driver API directly, as cuBLAS and Triton do: 20 launches of a named module function. */
    get_fn get = (get_fn)dlsym(drv, "cuModuleGetFunction");
    launch_fn launch = (launch_fn)dlsym(drv, "cuLaunchKernel");
    copy_fn htod = (copy_fn)dlsym(drv, "cuMemcpyHtoD_v2");
    lib_kernel_fn lib_kernel = (lib_kernel_fn)dlsym(drv, "cuLibraryGetKernel");
    kernel_fn_fn kernel_fn = (kernel_fn_fn)dlsym(drv, "cuKernelGetFunction");
    void *f = 0;
    check(get(&f, 0, "_Z6reducePii"), 0, "cuModuleGetFunction");
    for (int i = 0; i < 20; i++) check(launch(f, 8, 1, 1, 256, 1, 1, 0, 0, 0, 0), 0, "cuLaunch");
    check(launch(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0), 400, "bad cuLaunch");
    /* A library kernel, launched through its function handle: named through the alias. */
    void *k = 0, *kf = 0;
    check(lib_kernel(&k, 0, "_Z7softmaxPf"), 0, "cuLibraryGetKernel");
    check(kernel_fn(&kf, k), 0, "cuKernelGetFunction");
    for (int i = 0; i < 4; i++) check(launch(kf, 2, 2, 2, 64, 1, 1, 0, 0, 0, 0), 0, "cuLaunch");

    /* Allocations: 1, 2, 3, 4 MiB; 1 and 3 freed. */
    void *p[4];
    for (int i = 0; i < 4; i++) check(cudaMalloc(&p[i], (size_t)(i + 1) << 20), 0, "cudaMalloc");
    check(cudaFree(p[0]), 0, "cudaFree");
    check(cudaFree(p[2]), 0, "cudaFree");

    /* Copies: 10 x 1 MiB H2D, 5 x 4096 D2H, 4 x 512 D2D async, 2 with a bad kind (21),
     * 1 2D copy of 64 x 32 bytes H2D, 1 3D copy D2H, 3 x 1000 bytes through the driver. */
    char *host = malloc(1 << 20);
    memset(host, 1, 1 << 20);
    for (int i = 0; i < 10; i++) check(cudaMemcpy(p[1], host, 1 << 20, 1), 0, "H2D");
    for (int i = 0; i < 5; i++) check(cudaMemcpy(host, p[1], 4096, 2), 0, "D2H");
    for (int i = 0; i < 4; i++) check(cudaMemcpyAsync(p[3], p[1], 512, 3, 0), 0, "D2D");
    for (int i = 0; i < 2; i++) check(cudaMemcpy(host, p[1], 8, 7), 21, "bad copy");
    check(cudaMemcpy2D(p[1], 128, host, 64, 64, 32, 1), 0, "2D");
    /* 3D: 16 x 8 x 4 bytes D2H. */
    struct cudaMemcpy3DParms p3 = {0};
    p3.srcPtr.ptr = p[1];
    p3.dstPtr.ptr = host;
    p3.extent.width = 16;
    p3.extent.height = 8;
    p3.extent.depth = 4;
    p3.kind = 2;
    check(cudaMemcpy3D(&p3), 0, "3D");
    for (int i = 0; i < 3; i++) check(htod((uint64_t)p[3], host, 1000), 0, "cuMemcpyHtoD");

    /* Syncs of known length: 5 x 20 ms device, 2 x 10 ms stream. */
    for (int i = 0; i < 5; i++) check(cudaDeviceSynchronize(), 0, "sync");
    for (int i = 0; i < 2; i++) check(cudaStreamSynchronize(0), 0, "stream sync");
    printf("workload done\n");
    return 0;
}

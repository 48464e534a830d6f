/* A fake libcuda.so.1 (CUDA driver API) exporting the real symbol names, for the tests and the
 * benchmark. Built with -fno-omit-frame-pointer so every function starts with `push %rbp`, as
 * the real library's exported functions do (uprobes on that prologue are cheap). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef void *CUfunction;
typedef void *CUmodule;
typedef void *CUkernel;
typedef void *CUstream;
typedef uint64_t CUdeviceptr;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_INVALID_HANDLE 400

typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* Keeps the compiler from folding the bodies away. */
volatile uint64_t fake_cuda_calls;

CUresult cuInit(unsigned int flags) { fake_cuda_calls++; return flags ? CUDA_ERROR_INVALID_VALUE : 0; }

CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    fake_cuda_calls++;
    *m = (CUmodule)image;
    return CUDA_SUCCESS;
}

/* The handle of a function is a heap copy of its name: distinct per name, stable. */
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    fake_cuda_calls++;
    if (!name || !*name) return CUDA_ERROR_NOT_FOUND;
    *f = strdup(name);
    return CUDA_SUCCESS;
}

CUresult cuLibraryGetKernel(CUkernel *k, void *lib, const char *name) {
    fake_cuda_calls++;
    *k = strdup(name);
    return CUDA_SUCCESS;
}

/* The function handle differs from the kernel handle, as in the real driver. */
CUresult cuKernelGetFunction(CUfunction *f, CUkernel k) {
    fake_cuda_calls++;
    *f = (char *)k + 1;
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params,
                        void **extra) {
    fake_cuda_calls++;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    fake_cuda_calls++;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    fake_cuda_calls++;
    void *m = malloc(bytes);
    if (!m) return 2;
    *p = (CUdeviceptr)m;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) { fake_cuda_calls++; free((void *)p); return CUDA_SUCCESS; }

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    memcpy((void *)dst, src, n);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    memcpy(dst, (void *)src, n);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    memcpy((void *)dst, (void *)src, n);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    memcpy((void *)dst, src, n);
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) { usleep(5000); return CUDA_SUCCESS; }
CUresult cuStreamSynchronize(CUstream s) { usleep(1000); return CUDA_SUCCESS; }

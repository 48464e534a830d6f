/* A fake libcudart.so.12 (CUDA runtime API) exporting the real symbol names. Like the real
 * runtime it reaches the driver through function pointers from dlopen/dlsym, so a launch is
 * one runtime call with a driver call nested inside. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int cudaError_t;
typedef struct { unsigned int x, y, z; } dim3;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef struct {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    void *attrs;
    unsigned int numAttrs;
} cudaLaunchConfig_t;

#define cudaSuccess 0
#define cudaErrorInvalidValue 1
#define cudaErrorMemoryAllocation 2
#define cudaErrorInvalidMemcpyDirection 21
#define cudaErrorInvalidDeviceFunction 98

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
typedef int (*alloc_fn)(uint64_t *, size_t);
typedef int (*free_fn)(uint64_t);

static launch_fn drv_launch;
static alloc_fn drv_alloc;
static free_fn drv_free;

static void load_driver(void) {
    if (drv_launch) return;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) abort();
    drv_launch = (launch_fn)dlsym(h, "cuLaunchKernel");
    drv_alloc = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
    drv_free = (free_fn)dlsym(h, "cuMemFree_v2");
}

/* host stub -> device function name, as __cudaRegisterFunction records them. */
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                            const char *deviceName, int thread_limit, void *tid, void *bid,
                            void *bDim, void *gDim, int *wSize) {
    (void)fatCubinHandle;
}

/* Tests: a launch on this stream stops between the runtime's entry and its driver call, as a
 * launch preempted there would, while the file FAKE_CUDART_HOLD names exists. It says "held"
 * on stdout once inside. */
#define HOLD_STREAM ((cudaStream_t)0x401d)

static void hold(void) {
    const char *path = getenv("FAKE_CUDART_HOLD");
    if (!path) return;
    static const char held[] = "held\n";
    if (write(1, held, sizeof held - 1) < 0) abort();
    while (access(path, F_OK) == 0) usleep(1000);
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
                             size_t shmem, cudaStream_t stream) {
    if (!func) return cudaErrorInvalidDeviceFunction;
    load_driver();
    if (stream == HOLD_STREAM) {
        hold();
        stream = 0;
    }
    int r = drv_launch((void *)func, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                       (unsigned)shmem, stream, args, 0);
    return r ? cudaErrorInvalidDeviceFunction : cudaSuccess;
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args) {
    if (!func) return cudaErrorInvalidDeviceFunction;
    return cudaLaunchKernel(func, config->gridDim, config->blockDim, args,
                            config->dynamicSmemBytes, config->stream);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind) {
    if (kind < 0 || kind > 4) return cudaErrorInvalidMemcpyDirection;
    memcpy(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, cudaStream_t s) {
    if (kind < 0 || kind > 4) return cudaErrorInvalidMemcpyDirection;
    memcpy(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, int kind) {
    if (kind < 0 || kind > 4) return cudaErrorInvalidMemcpyDirection;
    for (size_t r = 0; r < height; r++)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}

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

cudaError_t cudaMemcpy3D(const struct cudaMemcpy3DParms *p) {
    if (p->kind < 0 || p->kind > 4) return cudaErrorInvalidMemcpyDirection;
    size_t n = p->extent.width * p->extent.height * p->extent.depth;
    memcpy(p->dstPtr.ptr, p->srcPtr.ptr, n);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t n) { memset(p, v, n); return cudaSuccess; }

cudaError_t cudaMalloc(void **p, size_t size) {
    load_driver();
    uint64_t d = 0;
    if (drv_alloc(&d, size)) return cudaErrorMemoryAllocation;
    *p = (void *)d;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    load_driver();
    return drv_free((uint64_t)p) ? cudaErrorInvalidValue : cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t size) {
    *p = malloc(size);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }

/* Syncs sleep a known time: 20 ms for the device, 10 ms for a stream. */
cudaError_t cudaDeviceSynchronize(void) { usleep(20000); return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { usleep(10000); return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return e ? cudaSuccess : 400; }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f) { return cudaSuccess; }

/* A stand-in for libcudart.so.12 used by `gputrace demo`: no GPU, but the same exported names,
 * signatures and `push %rbp; mov %rsp,%rbp` prologues as the real runtime (built with
 * -fno-omit-frame-pointer), so gputrace's CUDA uprobes attach and decode arguments exactly as
 * they would on a real job.
 *
 * It simulates one GPU with one in-order stream. Work is queued on a virtual timeline
 * (`gpu_free_at`, CLOCK_MONOTONIC ns):
 *   - a kernel takes 2 us + 0.5 ns per thread (grid x block), so tiny launches are cheap for the
 *     "GPU" while each launch still costs the CPU ~5 us (the driver's work, spun here);
 *   - a synchronous cudaMemcpy waits for the stream, copies the bytes with the CPU (the staging
 *     copy of pageable memory) and then waits out the rest of bytes / 2 GB/s (the DMA);
 *   - cudaMemcpyAsync queues bytes / 12 GB/s (pinned memory, no CPU copy) and returns;
 *   - cudaDeviceSynchronize / cudaStreamSynchronize sleep until the timeline is idle. A real
 *     runtime spins by default; sleeping (cudaDeviceScheduleBlockingSync) keeps the demo from
 *     burning a CPU while it waits.
 * Calls return cudaSuccess (0), or cudaErrorInvalidValue for null arguments.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef struct { unsigned int x, y, z; } dim3;

enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 };
enum { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
       cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };

#define LAUNCH_CPU_NS 5000ULL
#define KERNEL_BASE_NS 2000ULL
#define PAGEABLE_BYTES_PER_US 2000ULL /* 2 GB/s */
#define PINNED_BYTES_PER_US 12000ULL  /* 12 GB/s */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t gpu_free_at;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void spin_ns(uint64_t ns) {
    uint64_t end = now_ns() + ns;
    while (now_ns() < end) {
    }
}

static void sleep_until(uint64_t t) {
    struct timespec ts = { (time_t)(t / 1000000000ULL), (long)(t % 1000000000ULL) };
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

/* Queues `ns` of GPU work after what is queued; returns when it will be done. */
static uint64_t enqueue(uint64_t ns) {
    pthread_mutex_lock(&lock);
    uint64_t start = now_ns();
    if (gpu_free_at > start)
        start = gpu_free_at;
    gpu_free_at = start + ns;
    uint64_t done = gpu_free_at;
    pthread_mutex_unlock(&lock);
    return done;
}

static uint64_t idle_at(void) {
    pthread_mutex_lock(&lock);
    uint64_t t = gpu_free_at;
    pthread_mutex_unlock(&lock);
    return t;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
                             size_t shared_mem, cudaStream_t stream) {
    (void)args; (void)shared_mem; (void)stream;
    if (!func)
        return cudaErrorInvalidValue;
    uint64_t threads = (uint64_t)grid.x * grid.y * grid.z * block.x * block.y * block.z;
    spin_ns(LAUNCH_CPU_NS);
    enqueue(KERNEL_BASE_NS + threads / 2);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    sleep_until(idle_at());
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    (void)stream;
    sleep_until(idle_at());
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind) {
    if ((!dst || !src) && count)
        return cudaErrorInvalidValue;
    (void)kind;
    sleep_until(idle_at());
    uint64_t start = now_ns();
    memmove(dst, src, count);
    sleep_until(start + (uint64_t)count * 1000ULL / PAGEABLE_BYTES_PER_US);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind,
                            cudaStream_t stream) {
    if ((!dst || !src) && count)
        return cudaErrorInvalidValue;
    (void)dst; (void)src; (void)kind; (void)stream;
    /* A DMA engine moves pinned memory without the CPU: only the stream is charged its time
     * (nothing reads the "device" bytes, so none are copied). */
    enqueue((uint64_t)count * 1000ULL / PINNED_BYTES_PER_US);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t size) {
    if (!ptr)
        return cudaErrorInvalidValue;
    spin_ns(20000); /* the driver maps device memory: tens of microseconds */
    *ptr = malloc(size ? size : 1);
    return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void *ptr) {
    spin_ns(10000);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count) {
    if (!count)
        return cudaErrorInvalidValue;
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    return device == 0 ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaGetLastError(void) {
    return cudaSuccess;
}

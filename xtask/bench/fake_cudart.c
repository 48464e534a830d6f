/* A stand-in libcudart.so.12 for the launch benchmark: real symbol names, a `push %rbp`
 * prologue (built with -fno-omit-frame-pointer) like the real library, trivial bodies. */
#include <stddef.h>

typedef struct { unsigned x, y, z; } dim3;
volatile unsigned long calls;

int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem,
                     void *stream) {
    (void)func; (void)grid; (void)block; (void)args; (void)shmem; (void)stream;
    calls++;
    return 0;
}

int cudaDeviceSynchronize(void) { return 0; }

/* For the copy storm: an 8-byte copy, as a scalar read back. Through a buffer on the stack,
 * so that gcc keeps the `push %rbp` prologue it drops from leaf functions with no frame (a
 * probe on another first instruction is emulated, ~15x the cost here). */
int cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, void *stream) {
    volatile char tmp[8];
    size_t n = count < 8 ? count : 8;
    (void)kind; (void)stream;
    for (size_t i = 0; i < n; i++) tmp[i] = ((const char *)src)[i];
    for (size_t i = 0; i < n; i++) ((char *)dst)[i] = tmp[i];
    calls++;
    return 0;
}

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

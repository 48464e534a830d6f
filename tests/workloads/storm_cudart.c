/* A stand-in libcudart for the launch-storm test: the real name, a `push %rbp` prologue
 * (-fno-omit-frame-pointer), a trivial body. */
#include <stddef.h>

typedef struct { unsigned x, y, z; } dim3;
volatile unsigned long storm_calls;

int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem,
                     void *stream) {
    (void)func; (void)grid; (void)block; (void)args; (void)shmem; (void)stream;
    storm_calls++;
    return 0;
}

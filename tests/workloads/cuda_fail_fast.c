/* A CUDA program that fails at once: one cudaMalloc through the libcudart it is linked with,
 * then exit 1 within a millisecond of starting, before a look at its maps can find the
 * library (an nvcc binary on a machine without a driver).
 */
#include <stddef.h>

int cudaMalloc(void **p, size_t n);

int main(void) {
    void *p = 0;
    cudaMalloc(&p, 1 << 20);
    return 1;
}

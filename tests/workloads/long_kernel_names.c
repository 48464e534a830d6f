/* Registers two kernels whose mangled names (305 characters) differ only at their end, past
 * what the kernel side reads of a name, then launches the first 30 times and the second 10
 * times through the fake libcudart it is linked with. Their host stubs have short symbols of
 * their own (nvcc's stubs carry the kernel's mangled name).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct { unsigned int x, y, z; } dim3;
int cudaLaunchKernel(const void *func, dim3 g, dim3 b, void **args, size_t sh, void *s);
void __cudaRegisterFunction(void **, const char *, char *, const char *, int, void *, void *,
                            void *, void *, int *);

__attribute__((noinline)) void long_stub_x(void) { __asm__ volatile(""); }
__attribute__((noinline)) void long_stub_y(void) { __asm__ volatile(""); }

int main(void) {
    static char n1[400], n2[400], id[301];
    memset(id, 'k', 300);
    id[300] = 0;
    id[299] = 'X';
    snprintf(n1, sizeof n1, "_Z300%sPf", id);
    id[299] = 'Y';
    snprintf(n2, sizeof n2, "_Z300%sPf", id);
    __cudaRegisterFunction(0, (const char *)long_stub_x, n1, n1, -1, 0, 0, 0, 0, 0);
    __cudaRegisterFunction(0, (const char *)long_stub_y, n2, n2, -1, 0, 0, 0, 0, 0);
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    for (int i = 0; i < 30; i++)
        cudaLaunchKernel((void *)long_stub_x, g, b, 0, 0, 0);
    for (int i = 0; i < 10; i++)
        cudaLaunchKernel((void *)long_stub_y, g, b, 0, 0, 0);
    printf("done\n");
    /* Alive a moment after its calls, as a job is: its maps are read as it execs. */
    usleep(200000);
    return 0;
}

/* A stand-in libcuda loaded late in a launch storm (`late_library`): `cuLaunchKernel` with a
 * `push %rbp` prologue, and `cuLaunchKernelEx` starting with a breakpoint, which the kernel
 * refuses to probe (a uprobe on a trap instruction: ENOTSUPP). Never called, it only makes the
 * library's launch probes fail as a group. */
#include <stddef.h>

volatile unsigned long late_calls;

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shmem, void *stream, void **params, void **extra) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem;
    (void)stream; (void)params; (void)extra;
    late_calls++;
    return 0;
}

/* In assembly: a compiler that adds `endbr64` at function entries (-fcf-protection, on by
 * default in some distributions' gcc) would put a probeable instruction first. */
__asm__(".text\n"
        ".globl cuLaunchKernelEx\n"
        ".type cuLaunchKernelEx, @function\n"
        "cuLaunchKernelEx:\n"
        "\tint3\n"
        "\tret\n"
        ".size cuLaunchKernelEx, .-cuLaunchKernelEx\n");

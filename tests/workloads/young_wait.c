/* Sleeps MS milliseconds in young_wait() as soon as it starts: a process under a second old
 * when it blocks, so its wait's user stack goes to the young processes' stack maps, held by
 * its thread state until it wakes (then by its time row). The syscall is made right there,
 * so that a frame-pointer walk starts in young_wait() itself.
 *
 *   young_wait MS
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>

__attribute__((noinline)) void young_wait(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"((long)SYS_nanosleep), "D"(&t), "S"(0L)
                     : "rcx", "r11", "memory");
    (void)ret;
}

int main(int argc, char **argv) {
    young_wait(argc > 1 ? atol(argv[1]) : 3000);
    return 0;
}

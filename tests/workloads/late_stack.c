/* A long-running process that runs short programs, then waits somewhere new: the shape of a
 * job that shells out (`nvidia-smi`, a script) and later reaches a code path it had not run
 * (a checkpoint, an evaluation).
 *
 *   late_stack CHILDREN
 *
 * Sleeps 1.2 s (so that its thread is past the tracer's first second), runs CHILDREN
 * `/bin/true` one after the other, reaping each, then sleeps 0.3 s in late_wait(), with the
 * syscall made right there so that a frame-pointer walk starts in late_wait() itself.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) void late_wait(void) {
    struct timespec t = {0, 300000000};
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"((long)SYS_nanosleep), "D"(&t), "S"(0L)
                     : "rcx", "r11", "memory");
    (void)ret;
}

int main(int argc, char **argv) {
    int children = argc > 1 ? atoi(argv[1]) : 300;
    struct timespec first = {1, 200000000};
    nanosleep(&first, NULL);
    for (int i = 0; i < children; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            execl("/bin/true", "true", (char *)NULL);
            _exit(127);
        }
        if (pid > 0)
            waitpid(pid, NULL, 0);
    }
    late_wait();
    return 0;
}

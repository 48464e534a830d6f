/* A syscall storm of known cost: N getppid calls in one thread.
 *
 *   syscall_loop N
 *
 * Prints "ns_per_op <thread CPU ns per call>": the syscalls' kernel time and whatever a
 * tracer's probes add to them are spent in this thread, so the figure traced against the same
 * untraced is what each syscall paid for the tracing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    double t0 = cpu_ns();
    for (long i = 0; i < n; i++)
        syscall(SYS_getppid);
    printf("ns_per_op %.1f\n", (cpu_ns() - t0) / n);
    return 0;
}

/* N getppid() syscalls through syscall(2) (no libc caching): cost per traced syscall. */
#include "common.h"
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    bench_settle(argc, argv, 2);
    double t = bench_now();
    for (long i = 0; i < n; i++) syscall(SYS_getppid);
    bench_report(t, n);
    return 0;
}

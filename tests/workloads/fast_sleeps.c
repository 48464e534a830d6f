// A fast run of one syscall: N nanosleeps of 10 us (~60 us each with the default timer
// slack), each timed by the workload itself through the vDSO clock (no syscall), so that a
// test can hold gputrace's estimate of their total against it. Prints "calls N total_ns T".
// Usage: fast_sleeps N
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000;
    struct timespec d = {0, 10000};
    long long total = 0;
    for (long i = 0; i < n; i++) {
        long long t0 = now_ns();
        nanosleep(&d, NULL);
        total += now_ns() - t0;
    }
    printf("calls %ld total_ns %lld\n", n, total);
    return 0;
}

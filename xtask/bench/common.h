/* Shared by the benchmark workloads: each prints "ns_per_op <value>" on stdout. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static inline void bench_report(double start_ns, long ops) {
    double ns = bench_now() - start_ns;
    printf("ns_per_op %.2f\n", ns / (double)ops);
    fflush(stdout);
}

/* Lets the tracer attach (and find dlopen'd libraries) before the timed part. */
static inline void bench_settle(int argc, char **argv, int idx) {
    int ms = argc > idx ? atoi(argv[idx]) : 0;
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

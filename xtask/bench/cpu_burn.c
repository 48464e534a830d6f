/* Fixed CPU work (no syscalls): slowdown under CPU sampling. Reports ns per 1M iterations. */
#include "common.h"

volatile unsigned long sink;

int main(int argc, char **argv) {
    long millions = argc > 1 ? atol(argv[1]) : 2000;
    bench_settle(argc, argv, 2);
    double t = bench_now();
    for (long m = 0; m < millions; m++)
        for (long i = 0; i < 1000000; i++) sink += i;
    bench_report(t, millions);
    return 0;
}

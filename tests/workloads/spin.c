/* Burns CPU in spin() from its first instruction of main until SECONDS have passed.
 *
 *   spin SECONDS
 *
 * Prints "start <CLOCK_MONOTONIC ns>" first, so a harness can tell when it began to run, and
 * "cpu <ns>" last: the CPU time it used, to compare with the samples a profiler took.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void spin(double seconds) {
    double end = now() + seconds;
    while (now() < end)
        for (int i = 0; i < 1000; i++) sink += i;
}

int main(int argc, char **argv) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    printf("start %lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    fflush(stdout);
    spin(argc > 1 ? atof(argv[1]) : 1.0);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    printf("cpu %lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    return 0;
}

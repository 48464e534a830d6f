/* Burns CPU in spin_after_exec for MS milliseconds (the image exec_before execs).
 *
 *   exec_after MS
 */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void spin_after_exec(double seconds) {
    double end = now() + seconds;
    while (now() < end)
        for (int i = 0; i < 1000; i++) sink *= i;
}

int main(int argc, char **argv) {
    spin_after_exec((argc > 1 ? atoi(argv[1]) : 300) / 1000.0);
    return 0;
}

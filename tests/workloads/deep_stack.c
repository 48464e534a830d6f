/* Recurses DEPTH frames deep and burns CPU at the bottom for SECONDS: a user stack deeper
 * than the kernel keeps (127 frames) at every sample.
 *
 *   deep_stack DEPTH SECONDS
 */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void bottom(double seconds) {
    double end = now() + seconds;
    while (now() < end)
        for (int i = 0; i < 1000; i++) sink += i;
}

__attribute__((noinline)) void descend(int depth, double seconds) {
    if (depth == 0)
        bottom(seconds);
    else
        descend(depth - 1, seconds);
    sink++; /* not a tail call */
}

int main(int argc, char **argv) {
    descend(argc > 1 ? atoi(argv[1]) : 200, argc > 2 ? atof(argv[2]) : 1.0);
    return 0;
}

/* Burns CPU in spin_before_exec for MS milliseconds, then execs PROGRAM ARGS...: CPU samples
 * taken before the exec are of this image, not the next one's.
 *
 *   exec_before MS PROGRAM [ARGS...]
 */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void spin_before_exec(double seconds) {
    double end = now() + seconds;
    while (now() < end)
        for (int i = 0; i < 1000; i++) sink += i;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    spin_before_exec(atoi(argv[1]) / 1000.0);
    execv(argv[2], argv + 2);
    return 1;
}

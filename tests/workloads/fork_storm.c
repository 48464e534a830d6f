/* A fork storm: many short-lived children, the shape of a shell loop or a badly configured
 * worker pool.
 *
 *   fork_storm CHILDREN [SPIN_MS [CHILD_SPIN_MS]]
 *
 * Forks CHILDREN children one after the other; each exits at once (no exec), or after burning
 * CHILD_SPIN_MS of CPU in child_spin() (children the sampler catches). The parent reaps
 * them all, prints "forked N last PID", then burns SPIN_MS of CPU in storm_spin() so the trace has
 * samples of the parent after the storm.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void storm_spin(double seconds) {
    double end = now() + seconds;
    while (now() < end)
        for (int i = 0; i < 1000; i++) sink += i;
}

__attribute__((noinline)) void child_spin(double seconds) { storm_spin(seconds); }

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    int spin_ms = argc > 2 ? atoi(argv[2]) : 300;
    int child_spin_ms = argc > 3 ? atoi(argv[3]) : 0;
    int forked = 0;
    pid_t last = 0;
    for (int i = 0; i < n; i++) {
        pid_t p = fork();
        if (p == 0) {
            if (child_spin_ms > 0)
                child_spin(child_spin_ms / 1000.0);
            _exit(0);
        }
        if (p > 0) {
            forked++;
            last = p;
            waitpid(p, NULL, 0);
        }
    }
    printf("forked %d last %d\n", forked, (int)last);
    fflush(stdout);
    storm_spin(spin_ms / 1000.0);
    return 0;
}

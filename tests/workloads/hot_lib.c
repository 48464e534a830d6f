/* A library the unload test dlopens, burns CPU in, and dlcloses again (tests/e2e/faults.rs). */
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Spins for `seconds` of wall time in this function (its own loop, not a callee's). */
unsigned long hot_spin(double seconds) {
    volatile unsigned long x = 0;
    double end = now() + seconds;
    while (now() < end)
        for (int i = 0; i < 200000; i++)
            x += i;
    return x;
}

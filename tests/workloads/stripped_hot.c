/* Burns CPU for SECONDS in two internal (static) functions of a binary the test strips of its
 * symbol table: no symbol covers the code where the samples fall.
 *
 *   stripped_hot SECONDS
 */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static void burn_a(void) {
    for (int i = 0; i < 100000; i++) sink += i;
}

__attribute__((noinline)) static void burn_b(void) {
    for (int i = 0; i < 100000; i++) sink ^= i;
}

int main(int argc, char **argv) {
    double end = now() + (argc > 1 ? atof(argv[1]) : 1.0);
    while (now() < end) {
        burn_a();
        burn_b();
    }
    return 0;
}

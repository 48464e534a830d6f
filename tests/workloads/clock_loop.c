/* Reads the clock in a loop for SECONDS: nearly all of its CPU time is in the vDSO's
 * clock_gettime, which has no file behind it (a CUDA sync's spin polls the clock as this does).
 *
 *   clock_loop SECONDS
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    struct timespec t, start;
    unsigned long sum = 0;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        for (int i = 0; i < 10000; i++) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            sum += t.tv_nsec;
        }
        if (t.tv_sec - start.tv_sec + (t.tv_nsec - start.tv_nsec) / 1e9 >= seconds)
            break;
    }
    printf("%lu\n", sum);
    return 0;
}

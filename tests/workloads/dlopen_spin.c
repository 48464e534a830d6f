/* Sleeps SLEEP_MS (300 by default), loads the shared library LIBRARY with dlopen and burns CPU
 * in its hot_spin (tests/workloads/hot_lib.c) for SECONDS, then exits: a library loaded
 * mid-trace by a process that ends before the next full read of every process's maps (or, with
 * no sleep, before any read of its own).
 *
 *   dlopen_spin LIBRARY SECONDS [SLEEP_MS]
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    usleep((argc > 3 ? atoi(argv[3]) : 300) * 1000);
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    unsigned long (*spin)(double) = (unsigned long (*)(double))dlsym(h, "hot_spin");
    if (!spin)
        return 1;
    printf("%lu\n", spin(atof(argv[2])));
    return 0;
}

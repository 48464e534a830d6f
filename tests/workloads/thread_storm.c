/* A thread storm: many short-lived threads, one after the other (a thread per request).
 *
 *   thread_storm THREADS CALLS [SPIN_MS]
 *
 * Each thread makes CALLS getppid syscalls and exits; the main thread joins it before starting
 * the next, prints "threads N", then burns SPIN_MS of CPU in storm_spin(). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int calls;
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

static void *worker(void *arg) {
    (void)arg;
    for (int i = 0; i < calls; i++) syscall(SYS_getppid);
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    calls = argc > 2 ? atoi(argv[2]) : 3;
    int spin_ms = argc > 3 ? atoi(argv[3]) : 200;
    int made = 0;
    for (int i = 0; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, NULL) != 0) break;
        pthread_join(t, NULL);
        made++;
    }
    printf("threads %d\n", made);
    fflush(stdout);
    storm_spin(spin_ms / 1000.0);
    return 0;
}

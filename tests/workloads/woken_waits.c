// Threads woken onto a busy CPU: SLEEPERS threads loop on a short spin and a 200 us sleep,
// beside a hog that spins all along, all pinned to one CPU, so most wake-ups wait for it. At
// its end each sleeper writes "sleeper TID RUN_DELAY_NS", the kernel's own sum of the
// thread's runqueue waits (schedstat), for the test to compare gputrace's runqueue time with.
// The sleepers read it only once the hog has stopped: a sleeper preempted by the hog after
// its read (a slice or more) waited where gputrace saw it and the kernel's figure did not
// (0.2-3.4 ms of ~50-70 in a third of the threads here).
// Usage: woken_waits ROUNDS [SLEEPERS]
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile unsigned long sink;
static volatile int done;
static long rounds;
// finished: the sleepers' loops are over; released: the hog has stopped.
static pthread_barrier_t finished, released;

static unsigned long long run_delay(void) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%ld/schedstat", (long)syscall(SYS_gettid));
    unsigned long long cpu = 0, delay = 0;
    FILE *f = fopen(path, "r");
    if (!f || fscanf(f, "%llu %llu", &cpu, &delay) != 2) {
        perror("schedstat");
        exit(1);
    }
    fclose(f);
    return delay;
}

static void *hog(void *arg) {
    (void)arg;
    while (!done) sink++;
    return NULL;
}

static void *sleeper(void *arg) {
    (void)arg;
    for (long i = 0; i < rounds; i++) {
        for (int j = 0; j < 20000; j++) sink++;
        usleep(200);
    }
    pthread_barrier_wait(&finished);
    pthread_barrier_wait(&released);
    // One line per write, so lines of threads ending together do not interleave.
    char line[96];
    int n = snprintf(line, sizeof line, "sleeper %ld %llu\n", (long)syscall(SYS_gettid),
                     run_delay());
    if (write(1, line, n) != n) exit(1);
    return NULL;
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atol(argv[1]) : 2000;
    int n = argc > 2 ? atoi(argv[2]) : 3;
    if (n < 1 || n > 16) return 2;
    // The first CPU this process may use (a cpuset may leave out CPU 0).
    cpu_set_t one;
    if (sched_getaffinity(0, sizeof one, &one)) return 1;
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &one)) cpu++;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    // Before the threads start, so that they all inherit it.
    if (sched_setaffinity(0, sizeof one, &one)) {
        perror("sched_setaffinity");
        return 1;
    }
    pthread_t h, t[16];
    if (pthread_barrier_init(&finished, NULL, n + 1) || pthread_barrier_init(&released, NULL, n + 1))
        return 1;
    if (pthread_create(&h, NULL, hog, NULL)) return 1;
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, sleeper, NULL)) return 1;
    pthread_barrier_wait(&finished);
    done = 1;
    pthread_join(h, NULL);
    pthread_barrier_wait(&released);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    return 0;
}

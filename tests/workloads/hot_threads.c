/* Two known hot functions in two threads, one of them in a child process.
 *
 *   hot_threads SECONDS [START_DELAY_MS]
 *
 * Thread "worker_a" (parent process) burns 70% of each period in hot_a() (its own CPU time);
 * the child process's thread "worker_b" burns 30% of each period in hot_b(). Whatever else runs,
 * the CPU time split between hot_a and hot_b is 70/30 by construction.
 * Built with -fno-omit-frame-pointer so user stacks unwind through our frames.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double seconds;

static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

volatile unsigned long sink;

__attribute__((noinline)) void burn(double cpu_seconds) {
    double until = thread_cpu() + cpu_seconds;
    while (thread_cpu() < until)
        for (int i = 0; i < 1000; i++) sink += i;
}

__attribute__((noinline)) void hot_a(double busy) { burn(busy); }
__attribute__((noinline)) void hot_b(double busy) { burn(busy); }

/* Periods of 20-60 ms with jitter, so they never alias with a 99 Hz sampler. */
static void duty(void (*fn)(double), double share, const char *name) {
    prctl(PR_SET_NAME, name);
    unsigned seed = (unsigned)getpid() ^ (unsigned)(size_t)name;
    double end = now() + seconds;
    while (now() < end) {
        double period = 0.020 + (rand_r(&seed) % 4000) / 100000.0;
        double period_start = now();
        fn(share * period);
        double left = period - (now() - period_start);
        if (left > 0) {
            struct timespec ts = {0, (long)(left * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
}

static void *worker_a(void *arg) {
    (void)arg;
    duty(hot_a, 0.7, "worker_a");
    return NULL;
}

static void *worker_b(void *arg) {
    (void)arg;
    duty(hot_b, 0.3, "worker_b");
    return NULL;
}

int main(int argc, char **argv) {
    seconds = argc > 1 ? atof(argv[1]) : 3.0;
    int delay_ms = argc > 2 ? atoi(argv[2]) : 0;
    if (delay_ms > 0) usleep(delay_ms * 1000);
    pid_t child = fork();
    if (child == 0) {
        pthread_t t;
        pthread_create(&t, NULL, worker_b, NULL);
        pthread_join(t, NULL);
        _exit(0);
    }
    pthread_t t;
    pthread_create(&t, NULL, worker_a, NULL);
    pthread_join(t, NULL);
    waitpid(child, NULL, 0);
    printf("hot_threads done\n");
    return 0;
}

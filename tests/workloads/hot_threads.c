/* Two known hot functions in two threads, one of them in a child process.
 *
 *   hot_threads CPU_SECONDS [START_DELAY_MS]
 *
 * Thread "worker_a" (parent process) burns 70% of CPU_SECONDS of its own CPU time in hot_a();
 * the child process's thread "worker_b" burns 30% in hot_b(). Budgets are in thread CPU time,
 * so the 70/30 split of CPU samples holds whatever else runs on the machine; both are spent in
 * chunks with short sleeps in between, like a real workload. After START_DELAY_MS (time for a
 * tracer to attach by pid) they start; the process exits when both are done.
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

static double budget;

static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
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

/* Spends `total` CPU seconds in fn, 20 ms at a time, with 5 ms sleeps in between. */
static void spend(void (*fn)(double), double total, const char *name) {
    prctl(PR_SET_NAME, name);
    double start = thread_cpu();
    while (thread_cpu() - start < total) {
        double left = total - (thread_cpu() - start);
        fn(left < 0.020 ? left : 0.020);
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
}

static void *worker_a(void *arg) {
    (void)arg;
    spend(hot_a, 0.7 * budget, "worker_a");
    return NULL;
}

static void *worker_b(void *arg) {
    (void)arg;
    spend(hot_b, 0.3 * budget, "worker_b");
    return NULL;
}

int main(int argc, char **argv) {
    budget = argc > 1 ? atof(argv[1]) : 2.0;
    int delay_ms = argc > 2 ? atoi(argv[2]) : 0;
    pid_t child = fork();
    if (child == 0) {
        if (delay_ms > 0) usleep(delay_ms * 1000);
        pthread_t t;
        pthread_create(&t, NULL, worker_b, NULL);
        pthread_join(t, NULL);
        _exit(0);
    }
    if (delay_ms > 0) usleep(delay_ms * 1000);
    pthread_t t;
    pthread_create(&t, NULL, worker_a, NULL);
    pthread_join(t, NULL);
    waitpid(child, NULL, 0);
    printf("hot_threads done\n");
    return 0;
}

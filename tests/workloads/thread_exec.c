/* A worker thread (not the leader) burns CPU for 300 ms, then execs `PROGRAM ARGS...` while
 * the leader sleeps: the kernel gives the exec'ing thread the leader's id (Go's syscall.Exec
 * runs on whatever thread the goroutine is on).
 *
 *   thread_exec PROGRAM [ARGS...]
 */
#include <pthread.h>
#include <time.h>
#include <unistd.h>

static char **argv_exec;
volatile unsigned long sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *worker(void *arg) {
    (void)arg;
    double end = now() + 0.3;
    while (now() < end)
        for (int i = 0; i < 1000; i++) sink += i;
    execv(argv_exec[0], argv_exec);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    argv_exec = argv + 1;
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    sleep(10);
    return 1;
}

/* A process with two dead tasks as a trace finds it: a child that exited at once and is never
 * reaped (a zombie process), and its own leader thread, gone by pthread_exit while a worker
 * thread sleeps on. Lives SECONDS.
 *
 *   zombies SECONDS
 *
 * Prints "zombie <pid>" and "ready" once both are dead.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int seconds;

static void *worker(void *arg) {
    (void)arg;
    sleep(seconds);
    exit(0);
}

int main(int argc, char **argv) {
    seconds = argc > 1 ? atoi(argv[1]) : 3;
    pid_t z = fork();
    if (z == 0)
        _exit(0);
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    usleep(100000);
    printf("zombie %d\nready\n", z);
    fflush(stdout);
    pthread_exit(0);
}

/* Starts THREADS threads that name themselves short_N, sleep 50 ms and end, a few at a time,
 * then sleeps 300 ms: each thread lives and dies between two looks at /proc.
 *
 *   short_named THREADS
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

static void *run(void *arg) {
    char name[16];
    snprintf(name, sizeof name, "short_%ld", (long)arg);
    prctl(PR_SET_NAME, name);
    usleep(50000);
    return 0;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 4;
    for (long i = 0; i < n; i++) {
        pthread_t t;
        pthread_create(&t, 0, run, (void *)i);
        pthread_join(t, 0);
    }
    usleep(300000);
    return 0;
}

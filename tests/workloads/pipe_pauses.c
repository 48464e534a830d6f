/* A fast run of pipe reads with a few long waits in it: a writer thread writes a byte every
 * ~60 us (a 10 us nanosleep with the default timer slack), and every EVERY writes waits PAUSE_MS
 * first; the main thread reads the bytes one by one. The reads come fast, so gputrace times 1
 * in 8 of them, and the few slow ones must still be seen. Prints "pauses N".
 *
 *   pipe_pauses PAUSES [EVERY] [PAUSE_MS]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int fds[2];
static long pauses, every, pause_ms;

static void *writer(void *arg) {
    (void)arg;
    struct timespec gap = {0, 10000};
    struct timespec pause = {pause_ms / 1000, (pause_ms % 1000) * 1000000L};
    /* A first run before any pause: the reads' pacing must have seen them come fast. */
    for (long i = 0; i < (pauses + 1) * every; i++) {
        if (i > 0 && i % every == 0) nanosleep(&pause, NULL);
        else nanosleep(&gap, NULL);
        if (write(fds[1], "x", 1) != 1) break;
    }
    close(fds[1]);
    return NULL;
}

int main(int argc, char **argv) {
    pauses = argc > 1 ? atol(argv[1]) : 5;
    every = argc > 2 ? atol(argv[2]) : 3000;
    pause_ms = argc > 3 ? atol(argv[3]) : 60;
    if (pipe(fds) != 0) return 1;
    pthread_t t;
    if (pthread_create(&t, NULL, writer, NULL)) return 1;
    char c;
    while (read(fds[0], &c, 1) == 1) {
    }
    pthread_join(t, NULL);
    printf("pauses %ld\n", pauses);
    return 0;
}

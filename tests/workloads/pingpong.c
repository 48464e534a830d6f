// Two threads bounce a byte over two pipes ROUNDS times: two blocking reads, two wake-ups
// and four context switches a round. Usage: pingpong ROUNDS.
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

static int a[2], b[2];
static long rounds;

static void *pong(void *arg) {
    (void)arg;
    char c;
    for (long i = 0; i < rounds; i++) {
        if (read(a[0], &c, 1) != 1 || write(b[1], &c, 1) != 1) break;
    }
    return NULL;
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atol(argv[1]) : 100000;
    if (pipe(a) || pipe(b)) return 1;
    pthread_t t;
    if (pthread_create(&t, NULL, pong, NULL)) return 1;
    char c = 'x';
    for (long i = 0; i < rounds; i++) {
        if (write(a[1], &c, 1) != 1 || read(b[0], &c, 1) != 1) break;
    }
    pthread_join(t, NULL);
    return 0;
}

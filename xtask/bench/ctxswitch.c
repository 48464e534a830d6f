/* Two threads ping-pong a byte over two pipes N times: 2N context switches (on one CPU). */
#include "common.h"
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

static int a[2], b[2];
static long n;

static void pin0(void) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(0, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *pong(void *arg) {
    (void)arg;
    pin0();
    char c;
    for (long i = 0; i < n; i++) {
        if (read(a[0], &c, 1) != 1) break;
        if (write(b[1], &c, 1) != 1) break;
    }
    return NULL;
}

int main(int argc, char **argv) {
    n = argc > 1 ? atol(argv[1]) : 100000;
    bench_settle(argc, argv, 2);
    if (pipe(a) || pipe(b)) return 1;
    pin0();
    pthread_t t;
    pthread_create(&t, NULL, pong, NULL);
    char c = 'x';
    double t0 = bench_now();
    for (long i = 0; i < n; i++) {
        if (write(a[1], &c, 1) != 1) break;
        if (read(b[0], &c, 1) != 1) break;
    }
    bench_report(t0, 2 * n);
    pthread_join(t, NULL);
    return 0;
}

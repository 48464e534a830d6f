// A thread that cycles through three waits, from three functions: a read of pipe A, a nap,
// a read of pipe B, a nap. The off-CPU stacks walked at switch-out are reused per wait
// (`ThreadState::walked`): each wait's time must land under its own function.
// Usage: cycling_waits ROUNDS [storm]: with `storm`, another thread makes syscalls as fast as
// it can meanwhile, so that the overhead budget takes the syscall tracepoints off: the waits
// must still keep their own stacks.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int pipe_a[2], pipe_b[2];
static long rounds;
// Written after each wait's call, so that no wait is a tail call (its frame would go).
static volatile long waits;

static void sleep_us(long us) {
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

// libc's read and nanosleep keep no frame pointer, so a walk by frame pointers skips their
// caller: each wait goes through a helper, and the function named for the wait is the
// helper's caller.
__attribute__((noinline)) static void blocking_read(int fd) {
    char c;
    if (read(fd, &c, 1) != 1) exit(1);
    waits++;
}

__attribute__((noinline)) static void sleep_500us(void) {
    struct timespec ts = {0, 500 * 1000};
    nanosleep(&ts, NULL);
    waits++;
}

__attribute__((noinline)) static void wait_on_a(void) {
    blocking_read(pipe_a[0]);
    waits++;
}

__attribute__((noinline)) static void wait_on_b(void) {
    blocking_read(pipe_b[0]);
    waits++;
}

__attribute__((noinline)) static void nap(void) {
    sleep_500us();
    waits++;
}

static volatile int reading = 1;

static void *storm(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "cw_storm");
    while (reading) syscall(SYS_getppid);
    return NULL;
}

static void *writer(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "cw_writer");
    for (long i = 0; i < rounds; i++) {
        sleep_us(1500);
        if (write(pipe_a[1], "a", 1) != 1) exit(1);
        sleep_us(1500);
        if (write(pipe_b[1], "b", 1) != 1) exit(1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atol(argv[1]) : 300;
    if (pipe(pipe_a) || pipe(pipe_b)) return 1;
    pthread_t w, st;
    int storming = argc > 2 && argv[2][0] == 's';
    if (storming) {
        if (pthread_create(&st, NULL, storm, NULL)) return 1;
        // Long enough for the budget to see a block of its syscalls and react.
        sleep_us(300 * 1000);
    }
    if (pthread_create(&w, NULL, writer, NULL)) return 1;
    prctl(PR_SET_NAME, "cw_reader");
    for (long i = 0; i < rounds; i++) {
        wait_on_a();
        nap();
        wait_on_b();
        nap();
    }
    pthread_join(w, NULL);
    reading = 0;
    if (storming) pthread_join(st, NULL);
    printf("done %ld waits %ld\n", rounds, waits);
    return 0;
}

// Syscalls in runs of different lengths, so that a thread's held row (`SysHeld`) is taken,
// written out and taken again: per round, 7 getppid, 1 getuid, 5 getpid, 2 getuid. A second
// thread makes 9 getppid per round and exits holding its row; the main thread then sleeps
// SLEEP_S seconds, alive and holding its own, for a trace that ends first.
// Usage: syscall_runs ROUNDS [SLEEP_S].
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static long rounds;

static void *worker(void *arg) {
    (void)arg;
    for (long i = 0; i < rounds * 9; i++) syscall(SYS_getppid);
    return NULL;
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atol(argv[1]) : 1000;
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL)) return 1;
    for (long i = 0; i < rounds; i++) {
        for (int k = 0; k < 7; k++) syscall(SYS_getppid);
        syscall(SYS_getuid);
        for (int k = 0; k < 5; k++) syscall(SYS_getpid);
        for (int k = 0; k < 2; k++) syscall(SYS_getuid);
    }
    pthread_join(t, NULL);
    if (argc > 2) sleep(atoi(argv[2]));
    return 0;
}

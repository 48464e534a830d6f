/* A large target for attach/report timing: dlopens every library named on the command line,
 * then runs T threads making 100 getppid syscalls every 100 ms (200 threads: ~200k syscalls/s,
 * 1.6M events in a 4 s trace, without starving the machine) until killed. Prints "ready" once everything is loaded and running.
 *   big_target THREADS LIB... */
#include "common.h"
#include <dlfcn.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

static void *spin(void *arg) {
    (void)arg;
    for (;;) {
        for (int i = 0; i < 100; i++) syscall(SYS_getppid);
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int threads = atoi(argv[1]);
    for (int i = 2; i < argc; i++)
        if (!dlopen(argv[i], RTLD_NOW | RTLD_LOCAL)) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        pthread_create(&t, NULL, spin, NULL);
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) pause();
}

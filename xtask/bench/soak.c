/* A long, steady mix of what gputrace aggregates, for the memory soak (`cargo xtask bench
 * --soak`): every millisecond PER_MS getppid calls (two syscall events each), a 1 ms sleep
 * (a switch out, a wakeup, a switch in) and LAUNCHES_PER_MS cudaLaunchKernel calls into the
 * library given (the budget samples them); every 10 ms a cudaDeviceSynchronize; every 100 ms
 * a file opened, read and closed (a new fd generation and name each time); every second a
 * short-lived thread (3,600 an hour: thread states freed at death, rows that stay). Prints "ms_behind <n>" at the end: how far
 * the pacing fell behind its clock.
 *   soak LIB SECONDS PER_MS LAUNCHES_PER_MS */
#include "common.h"
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);
typedef int (*sync_fn)(void);

static void kernel_stub(void) {}

static void *short_lived(void *arg) {
    (void)arg;
    for (int i = 0; i < 8; i++) syscall(SYS_getppid);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    launch_fn launch = (launch_fn)dlsym(h, "cudaLaunchKernel");
    sync_fn sync = (sync_fn)dlsym(h, "cudaDeviceSynchronize");
    if (!launch || !sync) { fprintf(stderr, "missing CUDA symbols\n"); return 1; }
    long seconds = atol(argv[2]), per_ms = atol(argv[3]), launches = atol(argv[4]);
    char path[64];
    snprintf(path, sizeof path, "/tmp/gputrace-soak-%d", getpid());
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    if (fd < 0 || write(fd, "soak\n", 5) != 5) { perror(path); return 1; }
    close(fd);
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    double start = bench_now(), end = start + seconds * 1e9, next = start;
    long tick = 0;
    char buf[16];
    while (bench_now() < end) {
        for (long i = 0; i < per_ms; i++) syscall(SYS_getppid);
        for (long i = 0; i < launches; i++) launch((const void *)kernel_stub, g, b, NULL, 0, NULL);
        if (tick % 10 == 0) sync();
        if (tick % 1000 == 0) {
            pthread_t t;
            if (pthread_create(&t, NULL, short_lived, NULL) == 0) pthread_join(t, NULL);
        }
        if (tick % 100 == 0) {
            int f = open(path, O_RDONLY);
            if (f >= 0) {
                if (read(f, buf, sizeof buf) < 0) perror("read");
                close(f);
            }
        }
        tick++;
        next += 1e6;
        double now = bench_now();
        if (next > now) {
            struct timespec ts = {0, (long)(next - now)};
            nanosleep(&ts, NULL);
        }
    }
    unlink(path);
    double behind = bench_now() - next;
    printf("ms_behind %.0f\nticks %ld\n", behind > 0 ? behind / 1e6 : 0.0, tick);
    return 0;
}

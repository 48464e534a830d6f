// Workload for the trace.json timeline test: one thread ("tl_main") that sleeps 20 ms SLEEPS
// times, waits ~30 ms on a pipe a child feeds, then calls the fake libcudart (dlopen'ed from
// argv[1]): cudaDeviceSynchronize SYNCS times (20 ms each in the fake), a 4 KiB H2D
// cudaMemcpy, REGS quick __cudaRegisterFunction calls (under the timeline's CUDA threshold)
// one failing cudaLaunchKernel (NULL function, grid 64x2x1, block 128x1x1) and a first
// successful launch of "tl_kernel" (slow: it loads the fake libcuda).
// With DIR (on a real block device): writes and reads back a 1 MiB file with O_DIRECT.
// Usage: timeline LIBCUDART [DIR]
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SLEEPS 5
#define SLEEP_NS 20000000L
#define SYNCS 3
#define PIPE_WAIT_US 30000
#define REGS 10
#define DIRECT_BYTES (1 << 20)

typedef int (*sync_fn)(void);
typedef int (*memcpy_fn)(void *, const void *, size_t, int);
typedef struct { unsigned int x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);
typedef void (*reg_fn)(void **, const char *, char *, const char *, int, void *, void *, void *,
                       void *, int *);

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: timeline LIBCUDART\n");
        return 2;
    }
    prctl(PR_SET_NAME, "tl_main");
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    sync_fn sync = (sync_fn)dlsym(h, "cudaDeviceSynchronize");
    memcpy_fn copy = (memcpy_fn)dlsym(h, "cudaMemcpy");
    launch_fn launch = (launch_fn)dlsym(h, "cudaLaunchKernel");
    reg_fn reg = (reg_fn)dlsym(h, "__cudaRegisterFunction");
    if (!sync || !copy || !launch || !reg) return 1;

    // A short first wait, not a sleep (poll): the accounting starts a launched command's
    // thread state at its first switch-out, so the syscall of that switch-out is not known;
    // the measured sleeps come after it. Under load it may last over the 1 ms threshold.
    poll(NULL, 0, 1);

    struct timespec ts = {0, SLEEP_NS};
    for (int i = 0; i < SLEEPS; i++) nanosleep(&ts, NULL);

    int fds[2];
    if (pipe(fds)) return 1;
    pid_t child = fork();
    if (child == 0) {
        usleep(PIPE_WAIT_US);
        if (write(fds[1], "x", 1) != 1) _exit(1);
        _exit(0);
    }
    char c;
    if (read(fds[0], &c, 1) != 1) return 1;
    waitpid(child, NULL, 0);

    for (int i = 0; i < SYNCS; i++)
        if (sync()) return 1;
    static char src[4096], dst[4096];
    memset(src, 7, sizeof src);
    if (copy(dst, src, sizeof src, 1)) return 1;
    static char stub;
    for (int i = 0; i < REGS; i++) reg(NULL, &stub, "tl_kernel", "tl_kernel", -1, 0, 0, 0, 0, 0);
    dim3 grid = {64, 2, 1}, block = {128, 1, 1};
    if (launch(NULL, grid, block, NULL, 0, NULL) != 98) return 1;
    if (launch(&stub, grid, block, NULL, 0, NULL)) return 1;

    if (argc > 2) {
        char path[4096];
        snprintf(path, sizeof path, "%s/timeline-direct.bin", argv[2]);
        void *buf;
        if (posix_memalign(&buf, 4096, DIRECT_BYTES)) return 1;
        memset(buf, 1, DIRECT_BYTES);
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
        if (fd < 0) return 1;
        if (pwrite(fd, buf, DIRECT_BYTES, 0) != DIRECT_BYTES || fsync(fd)) return 1;
        if (pread(fd, buf, DIRECT_BYTES, 0) != DIRECT_BYTES) return 1;
        close(fd);
        unlink(path);
    }
    return 0;
}

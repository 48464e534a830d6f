/* A JIT in miniature: writes a counting loop into anonymous memory, makes it executable
 * (written, then mprotect'ed read+exec, as CPython's perf trampolines and most JITs do), names
 * it in /tmp/perf-PID.map the way `perf` reads JIT code, then runs it for SECONDS.
 *
 * With STALE_MAP set, the JIT runs in a child made with a pid chosen in advance (clone3's
 * set_tid: root only), under which the parent left a perf map first, naming the code's address
 * `stale_name` (an earlier process's file under the same pid). The child appends a line of its
 * own, as CPython does to a file it finds, which makes the file's last write its own: only the
 * file's birth tells it is not the child's.
 *
 *   jit_spin SECONDS
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* mov ecx, 1000000; 1: dec ecx; jnz 1b; ret */
static const unsigned char code[] = {0xb9, 0x40, 0x42, 0x0f, 0x00, 0xff, 0xc9, 0x75, 0xfc, 0xc3};
/* Where the stale map's child puts its code: the address the stale file names. */
#define FIXED_AT 0x7e5a00000000UL

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static unsigned char *jit(unsigned long at) {
    unsigned char *mem = mmap((void *)at, 4096, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    if (mem == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    /* Not at the page's start: a function inside the JIT's region, as they are. */
    memcpy(mem + 64, code, sizeof code);
    if (mprotect(mem, 4096, PROT_READ | PROT_EXEC) != 0) {
        perror("mprotect");
        exit(1);
    }
    return mem;
}

static void run(unsigned char *fn, double secs) {
    void (*f)(void) = (void (*)(void))fn;
    double end = now() + secs;
    while (now() < end) f();
}

struct clone_args_v2 {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
    uint64_t set_tid, set_tid_size;
};

static int stale(double secs) {
    FILE *last = fopen("/proc/sys/kernel/ns_last_pid", "r");
    long base = 0;
    if (!last || fscanf(last, "%ld", &base) != 1) return 1;
    fclose(last);
    /* Past pid_max the pids wrap (a machine that ran a few hundred thousand processes sits
     * near 32,768): clone3 refuses a pid above it. */
    long max = 32768;
    FILE *m = fopen("/proc/sys/kernel/pid_max", "r");
    if (m) {
        if (fscanf(m, "%ld", &max) != 1) max = 32768;
        fclose(m);
    }
    long start = base + 1000;
    if (start + 100 >= max) start = 1000;
    for (pid_t pid = start; pid < start + 100; pid++) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)pid);
        FILE *f = fopen(path, "w");
        if (!f) return 1;
        fprintf(f, "%lx 1000 stale_name\n", FIXED_AT);
        fclose(f);
        /* Well before the child's start, even at whole seconds. */
        sleep(2);
        pid_t tid = pid;
        struct clone_args_v2 a = {0};
        a.exit_signal = SIGCHLD;
        a.set_tid = (uint64_t)(uintptr_t)&tid;
        a.set_tid_size = 1;
        long r = syscall(SYS_clone3, &a, sizeof a);
        if (r == 0) {
            unsigned char *mem = jit(FIXED_AT);
            int fd = open(path, O_WRONLY | O_APPEND);
            if (fd >= 0) {
                dprintf(fd, "%lx 10 own_line\n", (unsigned long)mem + 2048);
                close(fd);
            }
            run(mem + 64, secs);
            _exit(0);
        }
        if (r < 0) {
            unlink(path);
            if (errno == EEXIST) continue; /* the pid was taken meanwhile: another */
            perror("clone3");
            return 1;
        }
        int st;
        waitpid(r, &st, 0);
        unlink(path);
        printf("child %ld\n", r);
        return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
    }
    return 1;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 1.0;
    if (getenv("STALE_MAP")) return stale(secs);
    unsigned char *mem = jit(0);
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    fprintf(f, "%lx 40 not_this_one\n", (unsigned long)mem);
    fprintf(f, "%lx %zx py::jit_hot_loop:/job/train.py\n", (unsigned long)(mem + 64), sizeof code);
    fclose(f);
    run(mem + 64, secs);
    unlink(path);
    return 0;
}

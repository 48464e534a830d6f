// Ground truth for the wall-time accounting test (issue 3). Each thread spends its life in one
// known way; at its end it writes what the kernel itself says it did (schedstat: on-CPU time and
// runqueue wait) and its lifetime, so the test compares against measured truth, not wall-clock
// luck on a noisy machine. Usage: ground_truth DIR (DIR on a real block device, for O_DIRECT).
//
// Threads: spinner (CPU), sleeper (N nanosleeps), futex (condvar wait), direct (O_DIRECT preads
// of a file it created), pipe (reads a pipe a child process feeds slowly), victim + hog (both
// pinned to CPU 0, so each is preempted by the other).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LIFE_NS 1500000000ull
#define SLEEPS 150
#define SLEEP_NS 10000000L
#define PIPE_BYTES 60
#define PIPE_GAP_US 25000
#define DIRECT_FILE_MB 16
#define DIRECT_PASSES 4
#define CHUNK (1 << 20)

static const char *dir;
static FILE *truth;
static pthread_mutex_t truth_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t cv_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int released;
static int pipe_fd[2];
static volatile uint64_t sink;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

// Writes "name tid alive_ns cpu_ns runqueue_ns calls bytes" for the calling thread.
static void report(const char *name, uint64_t born, long calls, long long bytes) {
    uint64_t alive = now_ns() - born;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%ld/schedstat", (long)syscall(SYS_gettid));
    unsigned long long cpu = 0, rq = 0;
    // One readv, so that the read/pread64/clock_nanosleep counts the test checks are exactly
    // the ones the thread's work made.
    char text[128] = {0};
    struct iovec iov = {text, sizeof text - 1};
    int fd = open(path, O_RDONLY);
    if (fd < 0 || readv(fd, &iov, 1) <= 0 || sscanf(text, "%llu %llu", &cpu, &rq) != 2) {
        perror("schedstat");
        exit(2);
    }
    close(fd);
    pthread_mutex_lock(&truth_lock);
    fprintf(truth, "%s %ld %llu %llu %llu %ld %lld\n", name, (long)syscall(SYS_gettid),
            (unsigned long long)alive, cpu, rq, calls, bytes);
    fflush(truth);
    pthread_mutex_unlock(&truth_lock);
}

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
        perror("pin");
        exit(2);
    }
}

static void spin_until(uint64_t end) {
    uint64_t x = 0;
    while (now_ns() < end)
        for (int i = 0; i < 1000; i++) x += i * x + 1;
    sink = x;
}

static void *spinner(void *arg) {
    (void)arg;
    uint64_t born = now_ns();
    pthread_setname_np(pthread_self(), "gt_spinner");
    spin_until(born + LIFE_NS);
    report("spinner", born, 0, 0);
    return NULL;
}

static void *sleeper(void *arg) {
    (void)arg;
    uint64_t born = now_ns();
    pthread_setname_np(pthread_self(), "gt_sleeper");
    struct timespec ts = {0, SLEEP_NS};
    for (int i = 0; i < SLEEPS; i++) nanosleep(&ts, NULL);
    report("sleeper", born, SLEEPS, 0);
    return NULL;
}

static void *futex_waiter(void *arg) {
    (void)arg;
    uint64_t born = now_ns();
    pthread_setname_np(pthread_self(), "gt_futex");
    pthread_mutex_lock(&cv_lock);
    while (!released) pthread_cond_wait(&cv, &cv_lock);
    pthread_mutex_unlock(&cv_lock);
    report("futex", born, 0, 0);
    return NULL;
}

static void *direct_reader(void *arg) {
    const char *path = arg;
    uint64_t born = now_ns();
    pthread_setname_np(pthread_self(), "gt_direct");
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0) {
        perror("open O_DIRECT");
        exit(2);
    }
    void *buf;
    if (posix_memalign(&buf, 4096, CHUNK) != 0) exit(2);
    long calls = 0;
    long long bytes = 0;
    // Whole passes over the file until the thread has lived LIFE_NS: a short-lived thread would
    // make a few ms of exit path a large share.
    for (int pass = 0; pass < DIRECT_PASSES || now_ns() - born < LIFE_NS; pass++)
        for (int i = 0; i < DIRECT_FILE_MB; i++) {
            ssize_t n = pread(fd, buf, CHUNK, (off_t)i * CHUNK);
            if (n != CHUNK) {
                perror("pread");
                exit(2);
            }
            calls++;
            bytes += n;
        }
    close(fd);
    free(buf);
    report("direct", born, calls, bytes);
    return NULL;
}

static void *pipe_reader(void *arg) {
    (void)arg;
    uint64_t born = now_ns();
    pthread_setname_np(pthread_self(), "gt_pipe");
    char c;
    for (int i = 0; i < PIPE_BYTES; i++)
        if (read(pipe_fd[0], &c, 1) != 1) {
            perror("pipe read");
            exit(2);
        }
    report("pipe", born, PIPE_BYTES, PIPE_BYTES);
    return NULL;
}

static void *victim(void *arg) {
    (void)arg;
    pin(0);
    uint64_t born = now_ns();
    pthread_setname_np(pthread_self(), "gt_victim");
    spin_until(born + LIFE_NS);
    report("victim", born, 0, 0);
    return NULL;
}

static void *hog(void *arg) {
    (void)arg;
    pin(0);
    uint64_t born = now_ns();
    pthread_setname_np(pthread_self(), "gt_hog");
    spin_until(born + LIFE_NS);
    report("hog", born, 0, 0);
    return NULL;
}

static void make_file(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        perror("create");
        exit(2);
    }
    char *buf = malloc(CHUNK);
    for (int i = 0; i < CHUNK; i++) buf[i] = (char)(i * 7 + 1);
    for (int i = 0; i < DIRECT_FILE_MB; i++)
        if (write(fd, buf, CHUNK) != CHUNK) {
            perror("write");
            exit(2);
        }
    fsync(fd);
    close(fd);
    free(buf);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    char path[4096], tpath[4096];
    snprintf(path, sizeof path, "%s/direct.dat", dir);
    snprintf(tpath, sizeof tpath, "%s/truth.txt", dir);
    truth = fopen(tpath, "w");
    if (!truth) {
        perror("truth");
        return 2;
    }
    make_file(path);
    if (pipe(pipe_fd) != 0) return 2;
    pid_t child = fork();
    if (child == 0) {
        close(pipe_fd[0]);
        for (int i = 0; i < PIPE_BYTES; i++) {
            usleep(PIPE_GAP_US);
            if (write(pipe_fd[1], "x", 1) != 1) _exit(3);
        }
        _exit(0);
    }
    close(pipe_fd[1]);

    pthread_t t[7];
    pthread_create(&t[0], NULL, spinner, NULL);
    pthread_create(&t[1], NULL, sleeper, NULL);
    pthread_create(&t[2], NULL, futex_waiter, NULL);
    pthread_create(&t[3], NULL, direct_reader, path);
    pthread_create(&t[4], NULL, pipe_reader, NULL);
    pthread_create(&t[5], NULL, victim, NULL);
    pthread_create(&t[6], NULL, hog, NULL);
    for (int i = 0; i < 7; i++)
        if (i != 2) pthread_join(t[i], NULL);
    pthread_mutex_lock(&cv_lock);
    released = 1;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&cv_lock);
    pthread_join(t[2], NULL);
    int status;
    waitpid(child, &status, 0);
    fclose(truth);
    unlink(path);
    return 0;
}

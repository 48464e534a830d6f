/* A long-running process that runs short programs, then waits somewhere new: the shape of a
 * job that shells out (`nvidia-smi`, a script) and later reaches a code path it had not run
 * (a checkpoint, an evaluation).
 *
 *   late_stack CHILDREN [thread|leaderless|fork]
 *
 * Sleeps 1.2 s (so that it is past its first second however it was traced), runs CHILDREN
 * `/bin/true` one after the other, reaping each, then sleeps 0.3 s in late_wait(), with the
 * syscall made right there so that a frame-pointer walk starts in late_wait() itself. With
 * `thread`, late_wait() runs in a new thread (late_thread()), as a job's thread per request or
 * new worker does. With `leaderless`, the main thread starts a thread and leaves by
 * pthread_exit; that thread, once the main one is a zombie, starts late_thread(). With `fork`,
 * late_thread() runs in a forked child that does not exec, as a data loader's worker does.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) void late_wait(void) {
    struct timespec t = {0, 300000000};
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"((long)SYS_nanosleep), "D"(&t), "S"(0L)
                     : "rcx", "r11", "memory");
    (void)ret;
}

__attribute__((noinline)) void *late_thread(void *arg) {
    (void)arg;
    late_wait();
    return NULL;
}

/* Whether thread `tid` of this process is a zombie (or gone). */
static int gone(pid_t tid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *close = strrchr(buf, ')');
    return !close || close[1] == 0 || close[2] == 'Z' || close[2] == 'X';
}

static void *start_late(void *arg) {
    pid_t leader = (pid_t)(long)arg;
    struct timespec ms = {0, 1000000};
    for (int i = 0; i < 5000 && !gone(leader); i++)
        nanosleep(&ms, NULL);
    /* The leader's exit has run its tracepoints by the time it is a zombie; a little more. */
    struct timespec more = {0, 20000000};
    nanosleep(&more, NULL);
    pthread_t t;
    if (pthread_create(&t, NULL, late_thread, NULL) == 0)
        pthread_join(t, NULL);
    return NULL;
}

int main(int argc, char **argv) {
    int children = argc > 1 ? atoi(argv[1]) : 300;
    const char *mode = argc > 2 ? argv[2] : "";
    struct timespec first = {1, 200000000};
    nanosleep(&first, NULL);
    for (int i = 0; i < children; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            execl("/bin/true", "true", (char *)NULL);
            _exit(127);
        }
        if (pid > 0)
            waitpid(pid, NULL, 0);
    }
    if (strcmp(mode, "leaderless") == 0) {
        pthread_t t;
        if (pthread_create(&t, NULL, start_late, (void *)(long)getpid()) != 0)
            return 1;
        pthread_exit(NULL);
    } else if (strcmp(mode, "thread") == 0) {
        pthread_t t;
        if (pthread_create(&t, NULL, late_thread, NULL) != 0)
            return 1;
        pthread_join(t, NULL);
    } else if (strcmp(mode, "fork") == 0) {
        pid_t pid = fork();
        if (pid == 0) {
            late_thread(NULL);
            _exit(0);
        }
        if (pid > 0)
            waitpid(pid, NULL, 0);
    } else {
        late_wait();
    }
    return 0;
}

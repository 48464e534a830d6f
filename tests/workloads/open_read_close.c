/* Writes FILES files of 64 KiB in DIR, then reads each ROUNDS times, opening and closing it
 * every time, faster than gputrace looks at /proc/PID/fd: each file must be named by the path
 * it was opened with. Odd files go through the legacy open syscall where there is one. Then
 * one fd is reused by dup2, dup and fcntl F_DUPFD_CLOEXEC (below). With PAUSE_MS, sleeps that long after every 1,000 opens
 * (a loader's pace, not a storm's).
 *   open_read_close DIR FILES ROUNDS [PAUSE_MS] */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static char buf[65536];

static int open_ro(const char *path, int legacy) {
#ifdef SYS_open
    if (legacy) return (int)syscall(SYS_open, path, O_RDONLY);
#endif
    (void)legacy;
    return openat(AT_FDCWD, path, O_RDONLY);
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    const char *dir = argv[1];
    int files = atoi(argv[2]), rounds = atoi(argv[3]);
    int pause_ms = argc > 4 ? atoi(argv[4]) : 0;
    long opens = 0;
    char path[4096];
    memset(buf, 'x', sizeof buf);
    for (int i = 0; i < files; i++) {
        snprintf(path, sizeof path, "%s/f%d.bin", dir, i);
        int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
        if (fd < 0 || write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) return 1;
        close(fd);
    }
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < files; i++) {
            snprintf(path, sizeof path, "%s/f%d.bin", dir, i);
            int fd = open_ro(path, i % 2);
            if (fd < 0) return 1;
            while (read(fd, buf, sizeof buf) > 0) {
            }
            close(fd);
            if (pause_ms > 0 && ++opens % 1000 == 0) usleep(pause_ms * 1000);
        }
    }
    /* f0 read once more under a new fd, then f1 put on that fd with dup2 and 4 KiB read from
     * it: those 4 KiB are f1's, read through an fd gputrace saw opened on f0. Then 4 KiB more
     * of f1 through a dup of it and 4 KiB through an fcntl F_DUPFD_CLOEXEC copy (DUPS_BYTES
     * in all, f1's too). */
    snprintf(path, sizeof path, "%s/f0.bin", dir);
    int a = open(path, O_RDONLY);
    if (a < 0) return 1;
    while (read(a, buf, sizeof buf) > 0) {
    }
    snprintf(path, sizeof path, "%s/f1.bin", dir);
    int b = open(path, O_RDONLY);
    if (b < 0 || dup2(b, a) != a || pread(a, buf, 4096, 0) != 4096) return 1;
    int c = dup(b);
    if (c < 0 || pread(c, buf, 4096, 0) != 4096) return 1;
    int d = fcntl(b, F_DUPFD_CLOEXEC, 20);
    if (d < 20 || pread(d, buf, 4096, 0) != 4096) return 1;
    close(d);
    close(c);
    close(a);
    close(b);
    return 0;
}

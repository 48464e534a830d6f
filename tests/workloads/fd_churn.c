/* fd_churn CHILDREN DIR: CHILDREN forked children each open and close /dev/null (a close on a
 * (process, fd) never seen before: one FD_GEN entry each), then the parent writes DIR/a.dat
 * (100,000 B) and DIR/b.dat (300,000 B) and reads each 10 times, every read through
 * open/read-to-the-end/close on the same fd number (fds 3 and 4 held open, so fd 5).
 * Prints "a BYTES b BYTES" read. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char buf[1 << 16];

static void make(const char *path, long bytes) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { perror(path); exit(1); }
    memset(buf, 'x', sizeof buf);
    for (long left = bytes; left > 0;) {
        long n = left < (long)sizeof buf ? left : (long)sizeof buf;
        if (write(fd, buf, n) != n) { perror("write"); exit(1); }
        left -= n;
    }
    close(fd);
}

static long slurp(const char *path) {
    int fd = open(path, O_RDONLY);
    long total = 0, n;
    if (fd < 0) { perror(path); exit(1); }
    while ((n = read(fd, buf, sizeof buf)) > 0) total += n;
    close(fd);
    return total;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: fd_churn CHILDREN DIR\n"); return 2; }
    int children = atoi(argv[1]);
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/a.dat", argv[2]);
    snprintf(b, sizeof b, "%s/b.dat", argv[2]);
    make(a, 100000);
    make(b, 300000);
    open("/dev/null", O_RDONLY);
    open("/dev/null", O_RDONLY);
    for (int i = 0; i < children; i++) {
        pid_t c = fork();
        if (c == 0) {
            int fd = open("/dev/null", O_RDONLY);
            close(fd);
            _exit(0);
        }
        if (c < 0) { perror("fork"); return 1; }
        waitpid(c, NULL, 0);
    }
    long ra = 0, rb = 0;
    for (int r = 0; r < 10; r++) {
        ra += slurp(a);
        rb += slurp(b);
    }
    printf("a %ld b %ld\n", ra, rb);
    return 0;
}

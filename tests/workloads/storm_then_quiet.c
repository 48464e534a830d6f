// A syscall storm, then quiet, then a few syscalls: the budget takes the syscall tracepoints
// off the storm and puts them back in a window during the quiet part, so the last syscalls
// are counted exactly. argv[1], argv[2]: two files. The storm reads argv[1] a byte at a time
// (pread, 300,000 calls); then that fd is closed and argv[2] opened under the same number
// while the tracepoints are off (unseen); after 2.5 s of sleep, 1,000 reads of it and 1,000
// getuid calls, then 1 s more with it open (so its name is read from /proc).
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: storm_then_quiet FILE1 FILE2\n");
        return 2;
    }
    char c;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    for (int i = 0; i < 300000; i++) {
        if (pread(fd, &c, 1, 0) != 1) {
            perror("pread");
            return 1;
        }
    }
    sleep_ms(20);
    close(fd);
    int fd2 = open(argv[2], O_RDONLY);
    if (fd2 != fd) {
        fprintf(stderr, "fd %d, not %d\n", fd2, fd);
        return 1;
    }
    sleep_ms(2500);
    for (int i = 0; i < 1000; i++) {
        if (pread(fd2, &c, 1, 0) != 1) {
            perror("pread");
            return 1;
        }
        syscall(SYS_getuid);
    }
    sleep_ms(1000);
    printf("done\n");
    return 0;
}

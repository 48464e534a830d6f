// Two threads read the same sectors of two disks at the same time, as an md mirror's two copies
// of a write or a checksum tool comparing two disks do: each round, both read 4 KiB at one
// offset with O_DIRECT, starting together. A bio's owner must be told by its disk as well as
// its sector, or one disk's request takes the other's owner and the other goes uncounted.
// Usage: mirror_reads DISK_A DISK_B ROUNDS (block devices, or files on them).
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define IO 4096
#define SPAN 256

static pthread_barrier_t start;
static long rounds;

static void *reader(void *path) {
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    void *buf;
    if (posix_memalign(&buf, IO, IO) != 0) {
        exit(1);
    }
    for (long i = 0; i < rounds; i++) {
        pthread_barrier_wait(&start);
        if (pread(fd, buf, IO, (i % SPAN) * IO) != IO) {
            perror("pread");
            exit(1);
        }
    }
    close(fd);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: mirror_reads DISK_A DISK_B ROUNDS\n");
        return 2;
    }
    rounds = atol(argv[3]);
    pthread_barrier_init(&start, NULL, 2);
    pthread_t a, b;
    pthread_create(&a, NULL, reader, argv[1]);
    pthread_create(&b, NULL, reader, argv[2]);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    return 0;
}

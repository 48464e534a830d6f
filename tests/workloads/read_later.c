/* Blocks in a read of a pipe on fd 9 from before a trace starts; a child writes 5000 bytes
 * into it once the file GO exists, and the parent prints what it read.
 *
 *   read_later GO
 *
 * Prints "ready" once both are waiting.
 */
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    int p[2];
    if (pipe(p) || dup2(p[0], 9) < 0)
        return 1;
    close(p[0]);
    pid_t c = fork();
    if (c == 0) {
        close(9);
        while (access(argv[1], F_OK) != 0)
            usleep(10000);
        static char buf[5000];
        memset(buf, 'x', sizeof buf);
        _exit(write(p[1], buf, sizeof buf) == sizeof buf ? 0 : 1);
    }
    close(p[1]);
    printf("ready\n");
    fflush(stdout);
    static char in[8192];
    ssize_t n = read(9, in, sizeof in);
    printf("read %zd\n", n);
    waitpid(c, 0, 0);
    return 0;
}

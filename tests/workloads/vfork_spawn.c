/* Spawns ROUNDS children with vfork, each sleeping MS milliseconds before it execs `true`, and
 * reaps each: the parent waits in vfork for as long as its child sleeps, as a launcher using
 * posix_spawn (Python's subprocess) waits while a child starts.
 *
 *   vfork_spawn ROUNDS MS
 */
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 3;
    long ms = argc > 2 ? atol(argv[2]) : 300;
    for (int i = 0; i < rounds; i++) {
        pid_t p = vfork();
        if (p == 0) {
            struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
            nanosleep(&t, 0);
            execl("/bin/true", "true", (char *)0);
            _exit(1);
        }
        waitpid(p, 0, 0);
    }
    return 0;
}

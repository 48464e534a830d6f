/* A JIT in miniature: writes a counting loop into anonymous memory, makes it executable
 * (written, then mprotect'ed read+exec, as CPython's perf trampolines and most JITs do), names
 * it in /tmp/perf-PID.map the way `perf` reads JIT code, then runs it for SECONDS. With
 * STALE_MAP set it writes no map of its own but leaves one under its pid dated a day back
 * (another process's, from before it started), which must not name its code.
 *
 *   jit_spin SECONDS
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 1.0;
    /* mov ecx, 1000000; 1: dec ecx; jnz 1b; ret */
    static const unsigned char code[] = {0xb9, 0x40, 0x42, 0x0f, 0x00, 0xff,
                                         0xc9, 0x75, 0xfc, 0xc3};
    unsigned char *mem = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    /* Not at the page's start: a function inside the JIT's region, as they are. */
    unsigned char *fn = mem + 64;
    memcpy(fn, code, sizeof code);
    if (mprotect(mem, 4096, PROT_READ | PROT_EXEC) != 0) {
        perror("mprotect");
        return 1;
    }
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    fprintf(f, "%lx 40 not_this_one\n", (unsigned long)mem);
    fprintf(f, "%lx %zx py::jit_hot_loop:/job/train.py\n", (unsigned long)fn, sizeof code);
    fclose(f);
    if (getenv("STALE_MAP")) {
        struct timeval old[2];
        gettimeofday(&old[0], NULL);
        old[0].tv_sec -= 86400;
        old[1] = old[0];
        utimes(path, old);
    }
    void (*run)(void) = (void (*)(void))fn;
    double end = now() + secs;
    while (now() < end) run();
    if (!getenv("KEEP_MAP")) unlink(path);
    return 0;
}

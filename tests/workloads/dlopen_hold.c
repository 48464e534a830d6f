/* Loads the shared library named by argv[1] with dlopen (as PyTorch loads libcudart), says
 * "ready" on stdout, then holds it mapped until stdin closes or SECONDS pass.
 *
 *   dlopen_hold LIBRARY [SECONDS]
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: dlopen_hold LIBRARY [SECONDS]\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    sleep(argc > 2 ? (unsigned)atoi(argv[2]) : 30);
    return 0;
}

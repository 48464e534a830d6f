/* Loads, uses and unloads libraries while traced, as a plugin host or a test harness does:
 *
 *   unload_reload CUDART HOT_SO
 *
 * 1. dlopen CUDART, 100 cudaLaunchKernel; dlopen HOT_SO and spin in its hot_spin for 0.6 s;
 *    dlclose both and check in /proc/self/maps that both are gone (exit 3 if not).
 * 2. Sleep 3 s: gputrace reads the maps again after a library goes.
 * 3. dlopen CUDART again: 50 cudaLaunchKernel and one cudaDeviceSynchronize.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct { unsigned int x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);
typedef int (*sync_fn)(void);
typedef unsigned long (*spin_fn)(double);

/* The host stub the launches name: kernel(). */
void _Z6kernelv(void) { __asm__ volatile(""); }

static void *open_or_die(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(2);
    }
    return h;
}

static void launches(void *cudart, int n) {
    launch_fn launch = (launch_fn)dlsym(cudart, "cudaLaunchKernel");
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    for (int i = 0; i < n; i++)
        launch((const void *)_Z6kernelv, g, b, NULL, 0, NULL);
}

/* Whether a mapping of a file whose name ends with `base` is in this process's maps. */
static int mapped(const char *path) {
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int found = 0;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, base))
            found = 1;
    if (f)
        fclose(f);
    return found;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: unload_reload CUDART HOT_SO\n");
        return 2;
    }
    usleep(300 * 1000); /* gputrace is attached by now: the launches are all seen */
    void *cudart = open_or_die(argv[1]);
    void *hot = open_or_die(argv[2]);
    /* A scan of the maps sees the runtime before its first launch. */
    usleep(1200 * 1000);
    launches(cudart, 100);
    ((spin_fn)dlsym(hot, "hot_spin"))(0.6);
    dlclose(hot);
    dlclose(cudart);
    if (mapped(argv[1]) || mapped(argv[2])) {
        fprintf(stderr, "dlclose left a library mapped\n");
        return 3;
    }
    printf("unloaded\n");
    fflush(stdout);
    sleep(3);
    cudart = open_or_die(argv[1]);
    launches(cudart, 50);
    ((sync_fn)dlsym(cudart, "cudaDeviceSynchronize"))();
    printf("reloaded\n");
    fflush(stdout);
    return 0;
}

/* A fake libnvidia-ml.so.1: one GPU with fixed readings, for the NVML sampling test. */
#include <string.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

static int dev;

nvmlReturn_t nvmlInit_v2(void) { return 0; }
nvmlReturn_t nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(nvmlReturn_t r) { return r ? "fake error" : "success"; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (i != 0) return 2;
    *d = &dev;
    return 0;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    strncpy(name, "Fake GPU 9000", len);
    return 0;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    u->gpu = 42;
    u->memory = 17;
    return 0;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    m->total = 16ULL << 30;
    m->used = 3ULL << 30;
    m->free = m->total - m->used;
    return 0;
}
/* NVML_PCIE_UTIL_TX_BYTES = 0, RX = 1; KB/s. */
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *v) {
    *v = counter == 0 ? 1000 : 2000;
    return 0;
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    *mhz = 1410;
    return 0;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    *mw = 250000;
    return 0;
}
/* NVML_ERROR_NOT_SUPPORTED: per-process utilisation is optional. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, void *s, unsigned int *n,
                                             unsigned long long t) {
    return 3;
}

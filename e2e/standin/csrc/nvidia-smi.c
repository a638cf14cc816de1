/*
 * Stand-in nvidia-smi. Linked against libnvidia-ml.so.1 with no rpath, like the
 * real tool, so inside a container it runs only when the node's driver folder
 * is mounted and on LD_LIBRARY_PATH; everything it prints comes from the NVML
 * library it loaded, so the output names that library's driver version.
 *
 *   nvidia-smi        summary: banner line, then one line per GPU
 *   nvidia-smi -L     one line per GPU, like the real `nvidia-smi -L`
 */
#include "standin.h"

#include <stdio.h>
#include <string.h>

STANDIN_IDENT("nvidia-smi");

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

extern nvmlReturn_t nvmlInit_v2(void);
extern nvmlReturn_t nvmlShutdown(void);
extern const char *nvmlErrorString(nvmlReturn_t result);
extern nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length);
extern nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion);
extern nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount);
extern nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
extern nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
extern nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
extern nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
extern nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor);

/* The real nvidia-smi exits 9 when it cannot talk to the driver. */
#define EXIT_NO_DRIVER 9

static int fail(const char *what, nvmlReturn_t ret) {
    printf("NVIDIA-SMI stand-in has failed: %s: %s\n", what, nvmlErrorString(ret));
    nvmlShutdown();
    return EXIT_NO_DRIVER;
}

int main(int argc, char **argv) {
    int list = argc > 1 && strcmp(argv[1], "-L") == 0;
    char driver[80], name[96], uuid[96];
    int cuda = 0, major = 0, minor = 0;
    unsigned int count = 0, i;
    nvmlDevice_t device;
    nvmlMemory_t memory;
    nvmlReturn_t ret;

    if (argc > 1 && !list) {
        fprintf(stderr, "usage: nvidia-smi [-L]\n(" STANDIN_NOTICE ")\n");
        return 2;
    }
    ret = nvmlInit_v2();
    if (ret != 0) {
        printf("NVIDIA-SMI stand-in has failed because it couldn't communicate with the NVIDIA driver: %s\n",
               nvmlErrorString(ret));
        return EXIT_NO_DRIVER;
    }
    if ((ret = nvmlSystemGetDriverVersion(driver, sizeof(driver))) != 0) {
        return fail("driver version", ret);
    }
    if ((ret = nvmlSystemGetCudaDriverVersion(&cuda)) != 0) {
        return fail("CUDA driver version", ret);
    }
    if ((ret = nvmlDeviceGetCount_v2(&count)) != 0) {
        return fail("device count", ret);
    }
    if (!list) {
        printf("NVIDIA-SMI stand-in | Driver Version: %s | CUDA Version: %d.%d | %s\n", driver,
               cuda / 1000, (cuda % 1000) / 10, STANDIN_PRODUCT);
        printf("%s: no GPU is present and nothing can run on one.\n", STANDIN_NOTICE);
    }
    for (i = 0; i < count; i++) {
        if ((ret = nvmlDeviceGetHandleByIndex_v2(i, &device)) != 0) {
            return fail("device handle", ret);
        }
        if ((ret = nvmlDeviceGetName(device, name, sizeof(name))) != 0) {
            return fail("device name", ret);
        }
        if ((ret = nvmlDeviceGetUUID(device, uuid, sizeof(uuid))) != 0) {
            return fail("device UUID", ret);
        }
        if (list) {
            printf("GPU %u: %s (UUID: %s)\n", i, name, uuid);
            continue;
        }
        if ((ret = nvmlDeviceGetMemoryInfo(device, &memory)) != 0) {
            return fail("device memory", ret);
        }
        if ((ret = nvmlDeviceGetCudaComputeCapability(device, &major, &minor)) != 0) {
            return fail("compute capability", ret);
        }
        printf("GPU %u: %s | %lluMiB | compute capability %d.%d | UUID: %s\n", i, name,
               memory.total >> 20, major, minor, uuid);
    }
    nvmlShutdown();
    return 0;
}

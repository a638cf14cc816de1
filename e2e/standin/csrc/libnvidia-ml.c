/*
 * Stand-in libnvidia-ml.so.<version> (SONAME libnvidia-ml.so.1): the NVML
 * functions that go-nvml resolves at Init and that the node probe and the stub
 * nvidia-smi call, with the ABI of nvml.h, answering for STANDIN_DEVICE_COUNT
 * devices named "Stand-in GPU (not real)".
 *
 * go-nvml binds these functions lazily, at first call; a function missing here
 * kills the calling process with "symbol lookup error", so docs/standin-driver.md
 * lists every export and the probe must stay within that list.
 */
/* dl_iterate_phdr in <link.h>; it is in libc itself, where dladdr needs libdl on old glibc. */
#define _GNU_SOURCE

#include "standin.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

STANDIN_IDENT("libnvidia-ml");

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
} nvmlReturn_t;

struct nvmlDevice_st {
    unsigned int index;
    char uuid[96];
    char serial[32];
    char busId[32];
};
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

/* Equal to nvml.h's NVML_STRUCT_VERSION(Memory, 2). */
#define STANDIN_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24U)))

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

#define NVML_BRAND_UNKNOWN 0
#define NVML_DEVICE_ARCH_AMPERE 7

static struct nvmlDevice_st devices[STANDIN_DEVICE_COUNT];

/*
 * Fault switches: files in this library's own folder, so that a test can break the
 * driver of a node whose probe runs elsewhere (a pod, with the node's root mounted):
 * the file is where the library is, whatever the path it was loaded by.
 *
 * STANDIN_HANG_FILE: every NVML call (but nvmlErrorString) blocks while it exists,
 * as a call into a wedged kernel module never returns; removing it is the GPU reset.
 * STANDIN_GPU_LOST_FILE: device calls answer NVML_ERROR_GPU_IS_LOST, as for a GPU
 * fallen off the bus.
 */
#define STANDIN_HANG_FILE "gpu-injector-standin-hang"
#define STANDIN_GPU_LOST_FILE "gpu-injector-standin-gpu-lost"

struct standin_self {
    const void *addr;
    char dir[PATH_MAX];
    int found;
};

/* dl_iterate_phdr callback: the folder of the object that holds addr. */
static int find_self(struct dl_phdr_info *info, size_t size, void *data) {
    struct standin_self *self = data;
    const char *slash;
    int i;
    (void)size;
    for (i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        ElfW(Addr) start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type != PT_LOAD || (ElfW(Addr))self->addr < start || (ElfW(Addr))self->addr >= start + ph->p_memsz) {
            continue;
        }
        slash = info->dlpi_name != NULL ? strrchr(info->dlpi_name, '/') : NULL;
        if (slash == NULL) {
            snprintf(self->dir, sizeof(self->dir), ".");
        } else {
            snprintf(self->dir, sizeof(self->dir), "%.*s", (int)(slash - info->dlpi_name), info->dlpi_name);
        }
        self->found = 1;
        return 1;
    }
    return 0;
}

static int switch_on(const char *name) {
    struct standin_self self = {.addr = (const void *)&switch_on};
    char path[PATH_MAX + 64];
    dl_iterate_phdr(find_self, &self);
    if (!self.found) {
        return 0;
    }
    snprintf(path, sizeof(path), "%s/%s", self.dir, name);
    return access(path, F_OK) == 0;
}

static void standin_wedge(void) {
    while (switch_on(STANDIN_HANG_FILE)) {
        usleep(100 * 1000);
    }
}

/* Like the real library, Init calls nest and each needs its own Shutdown. */
static int init_count;

/*
 * The real library opens /dev/nvidiactl at Init and answers "Unknown Error"
 * when the container's device cgroup refuses it: a container that sees the
 * host's device nodes but was given none. Where the node exists and may be
 * opened (no driver answers it here: ENXIO), or does not exist at all, the
 * stand-in goes on, as the tests without device nodes need.
 */
static nvmlReturn_t standin_device_access(void) {
    int fd = open("/dev/nvidiactl", O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        return NVML_SUCCESS;
    }
    return errno == EPERM || errno == EACCES ? NVML_ERROR_UNKNOWN : NVML_SUCCESS;
}

static nvmlReturn_t standin_init(void) {
    unsigned int i;
    nvmlReturn_t ret;
    standin_wedge();
    if ((ret = standin_device_access()) != NVML_SUCCESS) {
        return ret;
    }
    for (i = 0; i < STANDIN_DEVICE_COUNT; i++) {
        devices[i].index = i;
        /* 53 54 41 4e 44 2d 49 4e is "STAND-IN" in ASCII. */
        snprintf(devices[i].uuid, sizeof(devices[i].uuid),
                 "GPU-5354414e-442d-494e-0000-%012u", i);
        snprintf(devices[i].serial, sizeof(devices[i].serial), "STAND-IN-%04u", i);
        snprintf(devices[i].busId, sizeof(devices[i].busId), "00000000:%02X:00.0", 0xE0 + i);
    }
    init_count++;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src) {
    if (dst == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (length < strlen(src) + 1) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

static int valid_device(nvmlDevice_t device) {
    return device >= &devices[0] && device < &devices[STANDIN_DEVICE_COUNT];
}

#define REQUIRE_INIT()                       \
    do {                                     \
        standin_wedge();                     \
        if (init_count == 0) {               \
            return NVML_ERROR_UNINITIALIZED; \
        }                                    \
    } while (0)

#define REQUIRE_GPU()                             \
    do {                                          \
        if (switch_on(STANDIN_GPU_LOST_FILE)) {   \
            return NVML_ERROR_GPU_IS_LOST;        \
        }                                         \
    } while (0)

#define REQUIRE_DEVICE(device)                  \
    do {                                        \
        REQUIRE_INIT();                         \
        REQUIRE_GPU();                          \
        if (!valid_device(device)) {            \
            return NVML_ERROR_INVALID_ARGUMENT; \
        }                                       \
    } while (0)

STANDIN_EXPORT const char *gpu_injector_standin_driver_version(void) {
    return STANDIN_DRIVER_VERSION;
}

STANDIN_EXPORT const char *gpu_injector_standin_notice(void) {
    return STANDIN_NOTICE;
}

STANDIN_EXPORT nvmlReturn_t nvmlInit(void) { return standin_init(); }
STANDIN_EXPORT nvmlReturn_t nvmlInit_v2(void) { return standin_init(); }

STANDIN_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return standin_init();
}

STANDIN_EXPORT nvmlReturn_t nvmlShutdown(void) {
    REQUIRE_INIT();
    init_count--;
    return NVML_SUCCESS;
}

STANDIN_EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
        return "Not Supported (" STANDIN_NOTICE ")";
    case NVML_ERROR_NOT_FOUND:
        return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_FUNCTION_NOT_FOUND:
        return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST:
        return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
        return "Argument Version Mismatch";
    default:
        return "Unknown Error";
    }
}

STANDIN_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    REQUIRE_INIT();
    return copy_string(version, length, STANDIN_DRIVER_VERSION);
}

STANDIN_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    char buf[80];
    REQUIRE_INIT();
    /* The real library answers "<CUDA major>.<driver version>", e.g. 12.580.159.04. */
    snprintf(buf, sizeof(buf), "%d.%s", STANDIN_CUDA_DRIVER_VERSION / 1000, STANDIN_DRIVER_VERSION);
    return copy_string(version, length, buf);
}

/* Works without Init, like the real one. */
STANDIN_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    standin_wedge();
    if (cudaDriverVersion == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *cudaDriverVersion = STANDIN_CUDA_DRIVER_VERSION;
    return NVML_SUCCESS;
}

STANDIN_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    REQUIRE_INIT();
    if (deviceCount == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *deviceCount = STANDIN_DEVICE_COUNT;
    return NVML_SUCCESS;
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) {
    return nvmlDeviceGetCount_v2(deviceCount);
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    REQUIRE_INIT();
    REQUIRE_GPU();
    if (device == NULL || index >= STANDIN_DEVICE_COUNT) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *device = &devices[index];
    return NVML_SUCCESS;
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    unsigned int i;
    REQUIRE_INIT();
    REQUIRE_GPU();
    if (uuid == NULL || device == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (i = 0; i < STANDIN_DEVICE_COUNT; i++) {
        if (strcmp(uuid, devices[i].uuid) == 0) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    REQUIRE_DEVICE(device);
    return copy_string(name, length, STANDIN_PRODUCT);
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    REQUIRE_DEVICE(device);
    return copy_string(uuid, length, device->uuid);
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    REQUIRE_DEVICE(device);
    return copy_string(serial, length, device->serial);
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    REQUIRE_DEVICE(device);
    if (index == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *index = device->index;
    return NVML_SUCCESS;
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    REQUIRE_DEVICE(device);
    if (minorNumber == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *minorNumber = device->index;
    return NVML_SUCCESS;
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, int *type) {
    REQUIRE_DEVICE(device);
    if (type == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *type = NVML_BRAND_UNKNOWN;
    return NVML_SUCCESS;
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch) {
    REQUIRE_DEVICE(device);
    if (arch == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *arch = NVML_DEVICE_ARCH_AMPERE;
    return NVML_SUCCESS;
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    REQUIRE_DEVICE(device);
    if (memory == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    memory->total = STANDIN_MEMORY_BYTES;
    memory->free = STANDIN_MEMORY_BYTES;
    memory->used = 0;
    return NVML_SUCCESS;
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    REQUIRE_DEVICE(device);
    if (memory == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (memory->version != STANDIN_MEMORY_V2_VERSION) {
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    memory->total = STANDIN_MEMORY_BYTES;
    memory->reserved = 0;
    memory->free = STANDIN_MEMORY_BYTES;
    memory->used = 0;
    return NVML_SUCCESS;
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    REQUIRE_DEVICE(device);
    if (major == NULL || minor == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *major = STANDIN_CC_MAJOR;
    *minor = STANDIN_CC_MINOR;
    return NVML_SUCCESS;
}

/* MIG is reported supported and disabled, as on an A100 out of the box. */
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                                 unsigned int *pendingMode) {
    REQUIRE_DEVICE(device);
    if (currentMode == NULL || pendingMode == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *currentMode = 0;
    *pendingMode = 0;
    return NVML_SUCCESS;
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    REQUIRE_DEVICE(device);
    if (isMigDevice == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *isMigDevice = 0;
    return NVML_SUCCESS;
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    REQUIRE_DEVICE(device);
    if (pci == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", 0xE0 + device->index);
    snprintf(pci->busId, sizeof(pci->busId), "%s", device->busId);
    pci->bus = 0xE0 + device->index;
    /* Vendor 0xffff is "no device" in PCI; no real GPU carries it. */
    pci->pciDeviceId = 0x0000ffff;
    return NVML_SUCCESS;
}

/*
 * What NVIDIA's device plugin (k8s-device-plugin) calls beyond the above: its
 * health check registers for Xid events and waits on them, and its preferred
 * allocation asks for the topology between each pair of GPUs. The stand-in
 * is a healthy GPU with no NVLink: events are supported, none ever arrives.
 */
#define NVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x0000000000000008ULL
#define NVML_TOPOLOGY_SYSTEM 50

struct nvmlEventSet_st {
    unsigned long long registered;
};
typedef struct nvmlEventSet_st *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

STANDIN_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    REQUIRE_INIT();
    if (set == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *set = calloc(1, sizeof(**set));
    return *set == NULL ? NVML_ERROR_UNKNOWN : NVML_SUCCESS;
}

STANDIN_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    REQUIRE_INIT();
    free(set);
    return NVML_SUCCESS;
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    REQUIRE_DEVICE(device);
    if (eventTypes == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *eventTypes = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
    return NVML_SUCCESS;
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                                     nvmlEventSet_t set) {
    REQUIRE_DEVICE(device);
    if (set == NULL || (eventTypes & ~NVML_EVENT_TYPE_XID_CRITICAL_ERROR) != 0) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    set->registered |= eventTypes;
    return NVML_SUCCESS;
}

/* No event ever arrives: the wait lasts its timeout, as on a healthy GPU. */
STANDIN_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    REQUIRE_INIT();
    if (set == NULL || data == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    usleep((useconds_t)timeoutms * 1000);
    return NVML_ERROR_TIMEOUT;
}

STANDIN_EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

/* The stand-in GPUs share nothing nearer than the system. */
STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                                int *pathInfo) {
    REQUIRE_DEVICE(device1);
    if (!valid_device(device2) || pathInfo == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *pathInfo = NVML_TOPOLOGY_SYSTEM;
    return NVML_SUCCESS;
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *isActive) {
    (void)link;
    (void)isActive;
    REQUIRE_DEVICE(device);
    return NVML_ERROR_NOT_SUPPORTED;
}

STANDIN_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                                nvmlPciInfo_t *pci) {
    (void)link;
    (void)pci;
    REQUIRE_DEVICE(device);
    return NVML_ERROR_NOT_SUPPORTED;
}

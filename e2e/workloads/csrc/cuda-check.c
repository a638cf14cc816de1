/*
 * cuda-check: what a GPU container does first, reduced to the part that
 * depends on the node's driver being injected. It loads libcuda.so.1 the way
 * the CUDA runtime does (by SONAME, through LD_LIBRARY_PATH and the loader's
 * default folders), and reports which file it got and which driver that is:
 *
 *   loaded libcuda.so.1 from /usr/local/nvidia/lib64/libcuda.so.1 driver=384.130 cuda=9000
 *   file: /usr/local/nvidia/lib64/libcuda.so.384.130
 *   stand-in: STAND-IN driver, not a real GPU
 *   cuInit: 100 (no CUDA-capable device is detected (STAND-IN driver, not a real GPU))
 *   devices: /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia0 /dev/nvidiactl
 *   NVIDIA_VISIBLE_DEVICES=GPU-5354414e-442d-494e-0000-000000000000
 *
 * The last two lines are the device plugin's part: the GPU device nodes the
 * container was given (the device plugin's device specs) and the variable it set.
 *
 * Exit status 0 when a libcuda.so.1 was loaded and answered cuDriverGetVersion,
 * 1 otherwise (the first line then holds the loader's error). It runs against a
 * real driver too: "stand-in: no" and the version taken from the file name.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*version_fn)(int *);
typedef int (*init_fn)(unsigned int);
typedef int (*error_string_fn)(int, const char **);
typedef const char *(*string_fn)(void);

static int by_name(const struct dirent **a, const struct dirent **b) {
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int nvidia_node(const struct dirent *e) {
    return strncmp(e->d_name, "nvidia", 6) == 0;
}

/* The device plugin's part, printed whatever happened to libcuda. */
static void print_devices(void) {
    struct dirent **names;
    const char *visible = getenv("NVIDIA_VISIBLE_DEVICES");
    int i, n = scandir("/dev", &names, nvidia_node, by_name);
    printf("devices:");
    for (i = 0; i < n; i++) {
        printf(" /dev/%s", names[i]->d_name);
        free(names[i]);
    }
    if (n > 0) {
        free(names);
    }
    printf("\nNVIDIA_VISIBLE_DEVICES=%s\n", visible ? visible : "");
}

int main(void) {
    const char *ld_library_path = getenv("LD_LIBRARY_PATH");
    char file[PATH_MAX];
    const char *driver = "unknown";
    struct link_map *map = NULL;
    string_fn standin_version, standin_notice;
    version_fn driver_get_version;
    init_fn init;
    error_string_fn error_string;
    const char *init_error = "";
    int cuda = 0, ret;
    void *handle;

    atexit(print_devices);

    setvbuf(stdout, NULL, _IOLBF, 0);
    handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        printf("cannot load libcuda.so.1: %s (LD_LIBRARY_PATH=%s)\n", dlerror(),
               ld_library_path ? ld_library_path : "");
        return 1;
    }
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == NULL) {
        printf("loaded libcuda.so.1 but cannot tell from where: %s\n", dlerror());
        return 1;
    }
    if (realpath(map->l_name, file) == NULL) {
        snprintf(file, sizeof(file), "%s", map->l_name);
    }

    standin_version = (string_fn)dlsym(handle, "gpu_injector_standin_driver_version");
    standin_notice = (string_fn)dlsym(handle, "gpu_injector_standin_notice");
    if (standin_version != NULL) {
        driver = standin_version();
    } else {
        /* A real driver's libcuda is libcuda.so.<driver version>. */
        const char *base = strrchr(file, '/');
        base = base ? base + 1 : file;
        if (strncmp(base, "libcuda.so.", 11) == 0 && base[11] != '\0') {
            driver = base + 11;
        }
    }

    driver_get_version = (version_fn)dlsym(handle, "cuDriverGetVersion");
    if (driver_get_version == NULL || driver_get_version(&cuda) != 0) {
        printf("loaded libcuda.so.1 from %s but cuDriverGetVersion failed\n", map->l_name);
        return 1;
    }
    printf("loaded libcuda.so.1 from %s driver=%s cuda=%d\n", map->l_name, driver, cuda);
    printf("file: %s\n", file);
    printf("stand-in: %s\n", standin_notice ? standin_notice() : "no");

    init = (init_fn)dlsym(handle, "cuInit");
    error_string = (error_string_fn)dlsym(handle, "cuGetErrorString");
    if (init != NULL) {
        ret = init(0);
        if (error_string == NULL || error_string(ret, &init_error) != 0 || init_error == NULL) {
            init_error = "";
        }
        printf("cuInit: %d (%s)\n", ret, init_error);
    }
    return 0;
}

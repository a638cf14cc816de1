/*
 * Stand-in libcuda.so.<version> (SONAME libcuda.so.1).
 *
 * It answers the version questions a container asks first, and refuses the
 * rest the way the real driver does on a machine without a GPU: cuInit says
 * CUDA_ERROR_NO_DEVICE. A program can therefore never compute on it by mistake.
 */
#include "standin.h"

#include <stddef.h>

STANDIN_IDENT("libcuda");

typedef int CUresult;
typedef int CUdevice;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
};

STANDIN_EXPORT const char *gpu_injector_standin_driver_version(void) {
    return STANDIN_DRIVER_VERSION;
}

STANDIN_EXPORT const char *gpu_injector_standin_notice(void) {
    return STANDIN_NOTICE;
}

STANDIN_EXPORT CUresult cuDriverGetVersion(int *driverVersion) {
    if (driverVersion == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *driverVersion = STANDIN_CUDA_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuInit(unsigned int flags) {
    (void)flags;
    return CUDA_ERROR_NO_DEVICE;
}

STANDIN_EXPORT CUresult cuDeviceGetCount(int *count) {
    if (count == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *count = 0;
    return CUDA_ERROR_NOT_INITIALIZED;
}

STANDIN_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    (void)device;
    (void)ordinal;
    return CUDA_ERROR_NOT_INITIALIZED;
}

STANDIN_EXPORT CUresult cuGetErrorName(CUresult error, const char **name) {
    if (name == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (error) {
    case CUDA_SUCCESS:
        *name = "CUDA_SUCCESS";
        return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE:
        *name = "CUDA_ERROR_INVALID_VALUE";
        return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_INITIALIZED:
        *name = "CUDA_ERROR_NOT_INITIALIZED";
        return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE:
        *name = "CUDA_ERROR_NO_DEVICE";
        return CUDA_SUCCESS;
    }
    *name = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

STANDIN_EXPORT CUresult cuGetErrorString(CUresult error, const char **str) {
    if (str == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (error) {
    case CUDA_SUCCESS:
        *str = "no error";
        return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE:
        *str = "invalid argument";
        return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_INITIALIZED:
        *str = "initialization error";
        return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE:
        *str = "no CUDA-capable device is detected (" STANDIN_NOTICE ")";
        return CUDA_SUCCESS;
    }
    *str = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

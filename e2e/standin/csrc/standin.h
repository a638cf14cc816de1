/*
 * Shared by every file of the stand-in NVIDIA driver. The Go package standin
 * compiles these sources with -DSTANDIN_DRIVER_VERSION="..." and
 * -DSTANDIN_CUDA_DRIVER_VERSION=..., so one build answers for one driver version.
 *
 * The stand-in drives no hardware. It exists so that end-to-end tests can prove
 * that a container found the node's driver files through injected mounts.
 */
#ifndef GPU_INJECTOR_STANDIN_H
#define GPU_INJECTOR_STANDIN_H

#ifndef STANDIN_DRIVER_VERSION
#error "build with -DSTANDIN_DRIVER_VERSION=\"<version>\""
#endif
#ifndef STANDIN_CUDA_DRIVER_VERSION
#error "build with -DSTANDIN_CUDA_DRIVER_VERSION=<major*1000+minor*10>"
#endif

#define STANDIN_NOTICE "STAND-IN driver, not a real GPU"
#define STANDIN_PRODUCT "Stand-in GPU (not real)"
#define STANDIN_DEVICE_COUNT 2
#define STANDIN_MEMORY_BYTES (16ULL << 30)
#define STANDIN_CC_MAJOR 8
#define STANDIN_CC_MINOR 0

#define STANDIN_EXPORT __attribute__((visibility("default")))

/*
 * Kept in the .comment section of every object, so `strings` or
 * `readelf -p .comment` on any stand-in file says what it is.
 */
#define STANDIN_IDENT(component)                                                     \
    __asm__(".section .comment\n.string \"gpu-injector " component " " STANDIN_DRIVER_VERSION \
            ": " STANDIN_NOTICE "\"\n.previous")

#endif

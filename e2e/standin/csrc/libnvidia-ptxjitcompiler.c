/*
 * Stand-in libnvidia-ptxjitcompiler.so.<version> (SONAME
 * libnvidia-ptxjitcompiler.so.1). It compiles nothing; it is here because the
 * real driver ships it next to libcuda, so the probe has a second compute
 * library to find and the mount plan has more than one file per folder.
 */
#include "standin.h"

STANDIN_IDENT("libnvidia-ptxjitcompiler");

STANDIN_EXPORT const char *gpu_injector_standin_driver_version(void) {
    return STANDIN_DRIVER_VERSION;
}

STANDIN_EXPORT const char *gpu_injector_standin_notice(void) {
    return STANDIN_NOTICE;
}

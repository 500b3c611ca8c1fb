/* A STAND-IN for HAMi-core's libvgpu.so, for clusters with fake GPUs only (scripts/cluster).
 *
 * HAMi-core intercepts CUDA and NVML calls to enforce a container's GPU memory and SM limits; this
 * file enforces nothing and intercepts nothing. It exists so that the chart's installer init
 * container, the device plugin's mounts and the dynamic loader's /etc/ld.so.preload can be checked
 * end to end on a machine without GPUs: when a process that has HAMI_CORE_STANDIN_REPORT set
 * starts, the loader has preloaded this object, and it says so on stderr. Never install it on a
 * node with real GPUs: the slices there would run unlimited.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void hami_core_standin_loaded(void) {
    if (getenv("HAMI_CORE_STANDIN_REPORT") != NULL) {
        fprintf(stderr, "hami-core stand-in preloaded in pid %d\n", (int)getpid());
    }
}

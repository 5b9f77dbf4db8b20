/* CUDA backend entry points callable from C. Compiled only when configure found CUDA. */
#ifndef MT_KERNELS_CUDA_BACKEND_H
#define MT_KERNELS_CUDA_BACKEND_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes a one-line description of the visible CUDA devices (or why there are none)
 * into buf. Returns the number of devices (0 when none or no driver). */
int mt_cuda_describe(char *buf, size_t n);

/* Runs a tiny kernel (y = a*x + y on n elements) on device 0 and checks the result
 * against the host. Returns 0 on success, -1 with a message in buf otherwise. */
int mt_cuda_selftest(char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif

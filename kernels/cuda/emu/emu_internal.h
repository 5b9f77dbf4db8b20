// The CUDA execution emulator: what its runtime files share (not seen by kernels).
#ifndef MT_KERNELS_CUDA_EMU_INTERNAL_H
#define MT_KERNELS_CUDA_EMU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/cuda/emu/mt_emu.h"

#define MT_EMU_STATIC_SMEM_MAX (48 << 10) // static __shared__ per kernel (nvcc's limit)
#define MT_EMU_SMEM_ARENA (232448 + 4096) // the largest opt-in, plus alignment of the statics

namespace mt_emu {

// Prints the error, the kernel, block and thread running (if any) and aborts.
[[noreturn]] void fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void describe_fault_context(FILE *f);

// emu_runtime.cc
void set_last_error(cudaError_t e);
size_t dynamic_smem_granted(const void *func); // 48 KB unless cudaFuncSetAttribute raised it
int device_smem_optin(void);
void note_stack_guard(const void *p, size_t bytes); // a fault there is a stack overflow
// The live cudaMalloc or cudaMallocHost allocation holding p: its start and requested size.
bool live_allocation(const void *p, uintptr_t *base, size_t *bytes);

// emu_streams.cc
void host_waits_device(void);             // cudaDeviceSynchronize
void forget_allocation(const void *base); // freed: its readers and writer no longer matter
cudaError_t bad_handle(void);             // cudaErrorInvalidResourceHandle, as the last error

} // namespace mt_emu

#endif

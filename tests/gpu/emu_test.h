// What the CUDA emulator's test programs share (emu_checks, emu_tensor_core,
// emu_libraries, emu_gemm, emu_quant): a CUDA call that must succeed, else the program
// exits 1 naming it, and a tally of checks.
#ifndef MT_TESTS_GPU_EMU_TEST_H
#define MT_TESTS_GPU_EMU_TEST_H

#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK_CUDA(call)                                                                               \
    do {                                                                                               \
        const cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess) {                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));     \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

// A check of a program that tallies them (emu_gemm, emu_quant): one line, "ok" or
// "FAIL" and what was checked; main ends with the tally.
inline int emu_checks, emu_failures;
static inline void emu_check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void emu_check(bool ok, const char *fmt, ...)
{
    emu_checks++;
    if (!ok) emu_failures++;
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

#endif

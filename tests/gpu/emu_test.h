// What the CUDA emulator's test programs share (emu_checks, emu_tensor_core,
// emu_libraries): a CUDA call that must succeed, else the program exits 1 naming it.
#ifndef MT_TESTS_GPU_EMU_TEST_H
#define MT_TESTS_GPU_EMU_TEST_H

#include <cuda_runtime.h>
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

#endif

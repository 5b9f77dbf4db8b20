/* moetrain on the CUDA execution emulator (tests/gpu/moetrain-emu): src/main.c as in a
 * CUDA build, linked with libmt_cuda_emu in place of libmt_cuda (kernels/local.mk). */
#include "config.h"
#include "kernels/cuda/emu/moetrain_emu.h"
#include "src/main.c"

/* moetrain --version on the CUDA execution emulator: src/version.c as in a CUDA build. */
#include "config.h"
#include "kernels/cuda/emu/moetrain_emu.h"
#include "src/version.c"

// probe.cu compiled against the CUDA execution emulator (kernels/local.mk)
#include "kernels/cuda/probe.cu"

// cuda_layers.cu compiled against the CUDA execution emulator (kernels/local.mk)
#include "kernels/cuda/cuda_layers.cu"

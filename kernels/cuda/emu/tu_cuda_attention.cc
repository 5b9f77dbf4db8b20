// cuda_attention.cu compiled against the CUDA execution emulator (kernels/local.mk)
#include "kernels/cuda/cuda_attention.cu"

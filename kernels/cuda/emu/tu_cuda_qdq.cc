// cuda_qdq.cu compiled against the CUDA execution emulator (kernels/local.mk)
#include "kernels/cuda/cuda_qdq.cu"

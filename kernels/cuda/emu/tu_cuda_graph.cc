// cuda_graph.cu compiled against the CUDA execution emulator (kernels/local.mk)
#include "kernels/cuda/cuda_graph.cu"

/* What a build configured without nvcc lacks for src/main.c and src/version.c to take
 * their CUDA paths in moetrain-emu (after config.h, which a CUDA build fills in). */
#ifndef MT_KERNELS_CUDA_EMU_MOETRAIN_EMU_H
#define MT_KERNELS_CUDA_EMU_MOETRAIN_EMU_H
#ifndef HAVE_CUDA
#define HAVE_CUDA 1
#define MT_CUDA_ARCHS "sm_90a sm_100a"
#endif
#endif

/* config.h for tests/gpu/moetrain-emu (src/main.c and src/version.c on the CUDA
 * emulator): the build's config.h, then what a build configured without nvcc lacks for
 * their CUDA paths. First on that program's include path (-iquote: before the -I of
 * the build directory); config.h has no include
 * guard, so every inclusion passes here. */
#include_next "config.h"
#ifndef HAVE_CUDA
#define HAVE_CUDA 1
#define MT_CUDA_ARCHS "sm_90 sm_100 compute_100"
/* configure may find NCCL without CUDA, but builds the runtime's NCCL only with CUDA */
#undef HAVE_NCCL
#endif

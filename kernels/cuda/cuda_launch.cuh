// Launch and shared-memory spellings of kernels/cuda, so that the same source compiles
// with nvcc (where they are exactly the CUDA syntax) and with the host C++ compiler
// against the execution emulator (-DMT_CUDA_EMU, kernels/cuda/emu).
//
//   MT_LAUNCH(grid, block, smem, stream, kernel)(args...)  kernel<<<grid, block, smem, stream>>>(args...),
//                                  counted first (an expression statement)
//   MT_SHARED(T, name, [N]...)     __shared__ __align__(16) T name[N]...  (static shared memory)
//   MT_DYNAMIC_SHARED(T, name)     extern __shared__ __align__(16) T name[]  (the launch's dynamic area)
//
// The kernel comes last in MT_LAUNCH so that a template with several arguments needs
// no parentheses.
#ifndef MT_KERNELS_CUDA_LAUNCH_CUH
#define MT_KERNELS_CUDA_LAUNCH_CUH

// Every launch is counted before it is made, in the counter mt_cuda_launch_slot points
// at: the CUDA backend's count of the op running (struct mt_op_counts); a program
// without the backend (the emulator's tests) counts nowhere.
inline long long *mt_cuda_launch_slot = nullptr;
#define MT_CUDA_NOTE_LAUNCH() (mt_cuda_launch_slot ? (void)++*mt_cuda_launch_slot : (void)0)
#ifdef MT_CUDA_EMU
#include "kernels/cuda/emu/mt_emu.h"
#define MT_LAUNCH(grid, block, smem, stream, ...) \
    MT_CUDA_NOTE_LAUNCH(), ::mt_emu::make_launcher(__VA_ARGS__, #__VA_ARGS__, __FILE__, __LINE__, grid, block, smem, stream)
#define MT_SHARED(T, name, dims)                                                                              \
    static char mt_emu_tag_##name;                                                                  \
    T(&name) dims = *reinterpret_cast<T(*) dims>(                                                             \
        ::mt_emu::static_smem(&mt_emu_tag_##name, sizeof(T dims), #name, __FILE__, __LINE__))
#define MT_DYNAMIC_SHARED(T, name) T *const name = static_cast<T *>(::mt_emu::dynamic_smem(__FILE__, __LINE__))
#else
#define MT_LAUNCH(grid, block, smem, stream, ...) MT_CUDA_NOTE_LAUNCH(), __VA_ARGS__<<<grid, block, smem, stream>>>
#define MT_SHARED(T, name, dims) __shared__ __align__(16) T name dims
#define MT_DYNAMIC_SHARED(T, name) extern __shared__ __align__(16) T name[]
#endif

#endif

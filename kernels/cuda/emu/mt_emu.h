// The CUDA execution emulator, device side: what a .cu file of kernels/cuda sees when
// it is compiled by the host C++ compiler (-DMT_CUDA_EMU, force-included first).
//
// The real CUDA headers provide the types and the host API declarations (cudaMalloc,
// cuBLASLt, dim3, float4, __nv_bfloat16 with its host conversions); the emulator
// runtime (emu_runtime.cc, emu_cublaslt.cc) defines the host API, so nothing links
// libcudart or cuBLAS. This header adds the device side: the built-in variables
// (threadIdx, ... of the emulated thread running), barriers and warp collectives as
// rendezvous of the block's threads (each a fiber), mma.sync and ldmatrix from the PTX
// fragment tables, __ldg with its alignment check, the _rn arithmetic, atomics, and
// the launch and shared-memory macros of cuda_launch.cuh. Every check reports the
// kernel, block, thread and source line (doc/cuda-emulator.md).
#ifndef MT_KERNELS_CUDA_EMU_MT_EMU_H
#define MT_KERNELS_CUDA_EMU_MT_EMU_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/emu/emu_streams.h"

namespace mt_emu {

// ---------------------------------------------------------------- the running thread

struct thread_state; // one emulated CUDA thread (a fiber)
struct thread_coords {
    uint3 thread_idx, block_idx;
    dim3 block_dim, grid_dim;
};
// The coordinates of the emulated thread running now; a host thread outside any kernel
// gets an error naming the place.
const thread_coords &coords(const char *file, int line);

// ---------------------------------------------------------------- synchronisation

void syncthreads(const char *file, int line);
void syncwarp(unsigned mask, const char *file, int line);

enum shfl_kind { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR };
uint64_t shfl(shfl_kind kind, unsigned mask, uint64_t bits, int arg, int width, const char *file, int line);
unsigned ballot(unsigned mask, bool pred, const char *file, int line);

template <typename T>
static inline T shfl_t(shfl_kind kind, unsigned mask, T v, int arg, int width, const char *file, int line)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a 1..8-byte value");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = shfl(kind, mask, bits, arg, width, file, line);
    T out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

// ---------------------------------------------------------------- tensor cores

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, d = c in place.
void mma_m16n8k16_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, const char *file, int line);
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16
void ldmatrix_x4(uint32_t r[4], uint32_t smem_addr, bool trans, const char *file, int line);
uint32_t cvta_to_shared(const void *p, const char *file, int line);

// ---------------------------------------------------------------- memory

// Shared memory of the running block: a static variable of the kernel (one per
// declaration site `tag`, laid out once per launch) and the dynamic area.
void *static_smem(const void *tag, size_t bytes, const char *name, const char *file, int line);
void *dynamic_smem(const char *file, int line);
// A vector access of `align` bytes at p: misalignment is an error.
void check_aligned(const void *p, size_t align, const char *what, const char *file, int line);

// ---------------------------------------------------------------- launches

struct launch_site {
    const char *kernel, *file;
    int line;
};
// kernels/cuda's caching allocator tells the emulator the bytes of a cudaMalloc block it
// hands out, and when the block goes back to its cache, so that copies are checked
// against the request, not the size class (under AddressSanitizer kernels too), and a
// use of a cached block is a use after free.
void note_extent(const void *p, size_t bytes, cudaStream_t stream);
void note_cached(const void *p, cudaStream_t stream);

// The emulated cuBLASLt's objects created and not yet destroyed (emu_cublaslt.cc), for
// tests of their owners' teardown.
struct cublaslt_objects {
    long handles, matmul_descs, layouts, preferences;
};
cublaslt_objects cublaslt_live_objects(void);

// Checks the configuration, then issues on the stream the work that runs body(args) once
// per thread of the grid (emu_streams.h); acc: the device memory the arguments point to.
void launch(const launch_site &site, const void *func, void (*body)(void *), std::shared_ptr<void> args, dim3 grid,
            dim3 block, size_t smem, cudaStream_t stream, const std::vector<mem_access> &acc);

// The device memory a kernel argument points to: a pointer to const is read, any other
// pointer read and written; pointers inside a parameter struct are found by scanning it.
template <typename T>
static inline void note_arg(const T &a, std::vector<mem_access> &acc)
{
    if constexpr (std::is_pointer<T>::value)
        acc.push_back(mem_access{(const void *)a, 0, !std::is_const<typename std::remove_pointer<T>::type>::value});
    else if constexpr (!std::is_arithmetic<T>::value && !std::is_enum<T>::value)
        scan_pointers(&a, sizeof a, true, acc);
}

template <typename... P>
struct launcher {
    void (*func)(P...);
    launch_site site;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;

    struct bound {
        void (*func)(P...);
        std::tuple<typename std::decay<P>::type...> args;
    };
    static void body(void *p)
    {
        bound *b = static_cast<bound *>(p);
        std::apply(b->func, b->args); // each thread gets its own copies of the parameters
    }
    template <typename... A>
    void operator()(A &&...a) const
    {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
        auto b = std::make_shared<bound>(bound{func, std::tuple<typename std::decay<P>::type...>(std::forward<A>(a)...)});
        std::vector<mem_access> acc;
        std::apply([&acc](const auto &...x) { (note_arg(x, acc), ...); }, b->args);
        launch(site, reinterpret_cast<const void *>(func), &launcher::body, b, grid, block, smem, stream, acc);
    }
};

template <typename... P>
static inline launcher<P...> make_launcher(void (*f)(P...), const char *name, const char *file, int line, dim3 grid,
                                           dim3 block, size_t smem, cudaStream_t stream)
{
    return launcher<P...>{f, {name, file, line}, grid, block, smem, stream};
}

// ---------------------------------------------------------------- arithmetic

static inline float fadd_rn(float a, float b) { return a + b; }
static inline float fsub_rn(float a, float b) { return a - b; }
static inline float fmul_rn(float a, float b) { return a * b; }
static inline float fdiv_rn(float a, float b) { return a / b; }
static inline float fsqrt_rn(float a) { return sqrtf(a); }
static inline double dadd_rn(double a, double b) { return a + b; }
static inline double dmul_rn(double a, double b) { return a * b; }
static inline unsigned float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

template <typename T>
static inline T ldg(const T *p, const char *file, int line)
{
    check_aligned(p, alignof(T), "__ldg", file, line);
    return *p;
}

// The fibers of one block run on one host thread and switch only at barriers and
// collectives, so a read-modify-write is indivisible by construction. Under
// ThreadSanitizer they are relaxed atomic operations, which TSan does not report as
// racing with each other and which order nothing (as CUDA's atomics order nothing).
#if defined(__SANITIZE_THREAD__)
template <typename T>
using atomic_bits = typename std::conditional<sizeof(T) == 4, uint32_t, uint64_t>::type;
template <typename T, typename F>
static inline T atomic_update(T *p, F f)
{
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomics of 4 or 8 bytes");
    atomic_bits<T> *q = reinterpret_cast<atomic_bits<T> *>(p), seen = __atomic_load_n(q, __ATOMIC_RELAXED), want;
    T old, next;
    do {
        memcpy(&old, &seen, sizeof old);
        next = f(old);
        memcpy(&want, &next, sizeof want);
    } while (!__atomic_compare_exchange_n(q, &seen, want, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
template <typename T>
static inline T atomic_add(T *p, T v)
{
    return atomic_update(p, [v](T o) { return o + v; });
}
template <typename T>
static inline T atomic_max(T *p, T v)
{
    return atomic_update(p, [v](T o) { return v > o ? v : o; });
}
template <typename T>
static inline T atomic_cas(T *p, T cmp, T v)
{
    return atomic_update(p, [cmp, v](T o) { return o == cmp ? v : o; });
}
#else
template <typename T>
static inline T atomic_add(T *p, T v)
{
    const T old = *p;
    *p = old + v;
    return old;
}
template <typename T>
static inline T atomic_max(T *p, T v)
{
    const T old = *p;
    if (v > old) *p = v;
    return old;
}
template <typename T>
static inline T atomic_cas(T *p, T cmp, T v)
{
    const T old = *p;
    if (old == cmp) *p = v;
    return old;
}
#endif

} // namespace mt_emu

// ---------------------------------------------------------------- the CUDA spellings

#define threadIdx (::mt_emu::coords(__FILE__, __LINE__).thread_idx)
#define blockIdx (::mt_emu::coords(__FILE__, __LINE__).block_idx)
#define blockDim (::mt_emu::coords(__FILE__, __LINE__).block_dim)
#define gridDim (::mt_emu::coords(__FILE__, __LINE__).grid_dim)
#define __launch_bounds__(...)

#define __syncthreads() ::mt_emu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) ::mt_emu::syncwarp(0xffffffffu __VA_OPT__(* 0u + (__VA_ARGS__)), __FILE__, __LINE__)
#define __shfl_sync(mask, v, src, ...) \
    ::mt_emu::shfl_t(::mt_emu::SHFL_IDX, mask, v, src, 32 __VA_OPT__(* 0 + (__VA_ARGS__)), __FILE__, __LINE__)
#define __shfl_up_sync(mask, v, d, ...) \
    ::mt_emu::shfl_t(::mt_emu::SHFL_UP, mask, v, d, 32 __VA_OPT__(* 0 + (__VA_ARGS__)), __FILE__, __LINE__)
#define __shfl_down_sync(mask, v, d, ...) \
    ::mt_emu::shfl_t(::mt_emu::SHFL_DOWN, mask, v, d, 32 __VA_OPT__(* 0 + (__VA_ARGS__)), __FILE__, __LINE__)
#define __shfl_xor_sync(mask, v, m, ...) \
    ::mt_emu::shfl_t(::mt_emu::SHFL_XOR, mask, v, m, 32 __VA_OPT__(* 0 + (__VA_ARGS__)), __FILE__, __LINE__)
#define __ballot_sync(mask, pred) ::mt_emu::ballot(mask, (pred) != 0, __FILE__, __LINE__)
#define __cvta_generic_to_shared(p) ::mt_emu::cvta_to_shared(p, __FILE__, __LINE__)
#define __ldg(p) ::mt_emu::ldg(p, __FILE__, __LINE__)

#define __fadd_rn ::mt_emu::fadd_rn
#define __fsub_rn ::mt_emu::fsub_rn
#define __fmul_rn ::mt_emu::fmul_rn
#define __fdiv_rn ::mt_emu::fdiv_rn
#define __fsqrt_rn ::mt_emu::fsqrt_rn
#define __dadd_rn ::mt_emu::dadd_rn
#define __dmul_rn ::mt_emu::dmul_rn
#define __float_as_uint ::mt_emu::float_as_uint
#define __uint_as_float ::mt_emu::uint_as_float
#define atomicAdd ::mt_emu::atomic_add
#define atomicMax ::mt_emu::atomic_max
#define atomicCAS ::mt_emu::atomic_cas

// The typed overloads nvcc declares for kernels (cuda_runtime.h, under __CUDACC__ only).
template <typename... P>
static inline cudaError_t cudaFuncSetAttribute(void (*f)(P...), enum cudaFuncAttribute attr, int value)
{
    return cudaFuncSetAttribute(reinterpret_cast<const void *>(f), attr, value);
}
template <typename... P>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, void (*f)(P...), int block, size_t smem)
{
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, reinterpret_cast<const void *>(f), block, smem);
}

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

// Shared memory only through the macros of cuda_launch.cuh: a bare __shared__ fails.
#undef __shared__
#define __shared__ __shared___is_spelled_MT_SHARED_or_MT_DYNAMIC_SHARED_under_the_emulator

#endif

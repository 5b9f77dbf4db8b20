// CUDA backend internals shared by the .cu files: the backend context, checked calls,
// per-call scratch from the caching allocator, and device helpers (reductions, bf16
// packing, tensor-core mma and ldmatrix wrappers).
#ifndef MT_KERNELS_CUDA_COMMON_CUH
#define MT_KERNELS_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <array>
#include <map>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_launch.cuh"
#include "kernels/cuda/cuda_ops.h"

// A GEMM shape, layout and element types: the key of the cuBLASLt plan cache.
struct mt_gemm_key {
    int ta, tb, M, N, K, lda, ldb, ldc, align; // align: min pointer alignment, bytes (<= 16)
    int ab_type, c_type;                       // cudaDataType_t of A and B (equal), of C and D
    bool operator==(const mt_gemm_key &o) const
    {
        return ta == o.ta && tb == o.tb && M == o.M && N == o.N && K == o.K && lda == o.lda &&
               ldb == o.ldb && ldc == o.ldc && align == o.align && ab_type == o.ab_type && c_type == o.c_type;
    }
};
struct mt_gemm_key_hash {
    size_t operator()(const mt_gemm_key &k) const
    {
        size_t h = 1469598103934665603ull;
        const int v[] = {k.ta, k.tb, k.M, k.N, k.K, k.lda, k.ldb, k.ldc, k.align, k.ab_type, k.c_type};
        for (int x : v) h = (h ^ (size_t)(unsigned)x) * 1099511628211ull;
        return h;
    }
};
struct mt_gemm_plan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    bool fallback;   // CUBLAS_COMPUTE_32F: the heuristic had nothing for gemm_compute
    long long calls; // cublasLtMatmul calls with this plan
};

struct mt_cuda_ctx {
    int device;
    int sm_count;
    size_t smem_optin; // largest dynamic shared memory a block may opt into
    cudaStream_t stream;
    cudaStream_t copy_stream; // copy_async's (MT_STREAM_COPY), ordered by events

    // cuBLASLt: one handle, one workspace allocated up front, plans cached per shape
    // (each plan's descriptor and layouts are destroyed with the context)
    cublasLtHandle_t lt;
    void *lt_ws;
    size_t lt_ws_bytes;
    cublasComputeType_t gemm_compute;
    std::unordered_map<mt_gemm_key, mt_gemm_plan, mt_gemm_key_hash> gemm_plans;
    // the quantised GEMMs (cuda_qdq.cu): cublasLtMatmul calls, those through the epilogue,
    // the grouped GEMM's launches and the groups they multiplied, the scale modes used
    // (bit cublasLtMatmulMatrixScale_t); the matmuls' plans cached per
    // shape, types, scale modes, D's leading dimension and the pointers' alignments
    // (the scale pointers are set on the descriptor at each call)
    struct {
        long long calls, epilogues, grouped, groups;
        long long fused; // producers that emitted their output's quantisation (cuda_layers.cu)
        unsigned modes;
        std::map<std::array<int64_t, 11>, mt_gemm_plan> plans;
    } lowp;

    // caching allocator (cuda_memory.cu); all fields under mu
    std::mutex mu;
    std::multimap<size_t, void *> free_blocks; // rounded size -> block
    std::unordered_map<void *, size_t> live;   // block -> rounded size
    size_t in_use, cached, peak_in_use, reserved;
    long long device_allocs;

    // pinned host staging for scalar results (losses, counts)
    void *host_stage;

    // RoPE cos/sin table for the last (T, D, theta), computed on the host exactly as
    // the CPU reference does, so the rotation is bit-identical
    float *rope_tab;
    int rope_T, rope_D;
    float rope_theta;

    // what the backend made the host do (struct mt_op_counts), charged to the op
    // running (op; MT_OP_COUNT outside one): one thread calls the ops
    mt_op_counts counts;
    int op;
    long long emu_launches0, emu_syncs0; // the emulator's counts when the context was made

    // CUDA graphs (cuda_graph.cu): the graphs by scope key, and the scope being captured
    // (its blocks: allocated in it, held by its graph); launches made while capturing are
    // not launches (capture_sink counts them away)
    std::unordered_map<uint64_t, struct mt_cuda_graph *> graphs;
    bool capturing;
    uint64_t cap_key, cap_sig;
    std::unordered_map<void *, size_t> cap_blocks; // allocated in the scope, not yet freed
    std::unordered_map<void *, size_t> cap_freed;  // allocated and freed in it: the graph's
    const char *cap_error; // a rule of scopes broken during the capture
    long long capture_sink;
    mt_graph_stats graph_stats;
};

static inline mt_cuda_ctx *mt_cuda(void *ctx) { return (mt_cuda_ctx *)ctx; }

// Every graph destroyed, its blocks back in the caching allocator (cuda_graph.cu); the
// context's teardown calls it first.
void mt_cuda_graphs_destroy(mt_cuda_ctx *c);

// Charges what the op does to it: MT_CUDA_OP(ctx, MT_OP_GEMM) at the top of the op's
// entry point (an op that calls another keeps its own charge).
struct mt_cuda_op_scope {
    mt_cuda_ctx *c;
    int prev;
    mt_cuda_op_scope(void *ctx, enum mt_op op) : c(mt_cuda(ctx)), prev(c->op)
    {
        if (prev == MT_OP_COUNT) c->op = op;
        mt_cuda_launch_slot = c->capturing ? &c->capture_sink : &c->counts.launches[c->op];
    }
    ~mt_cuda_op_scope()
    {
        c->op = prev;
        mt_cuda_launch_slot = c->capturing ? &c->capture_sink : &c->counts.launches[c->op];
    }
};
#define MT_CUDA_OP(ctx, op) mt_cuda_op_scope mt_cuda_op_scope_(ctx, op)

// The host is about to wait for the device (a synchronisation, a synchronous copy or
// free): counted, then the call is made.
static inline void mt_cuda_note_sync(mt_cuda_ctx *c) { c->counts.syncs[c->op]++; }
// A cuBLASLt call queued on the stream.
static inline void mt_cuda_note_library_launch(mt_cuda_ctx *c)
{
    if (!c->capturing) c->counts.launches[c->op]++;
}

// Destroys every cached GEMM plan's descriptor and layouts (cuda_gemm.cu); the context's
// teardown calls it once the stream has drained.
void mt_cuda_gemm_plans_destroy(mt_cuda_ctx *c);

// The op table has no error channel: a failed CUDA call inside an op is fatal, with
// the place and a hint (llm.c's cudaCheck). Allocation failure is not: alloc returns NULL.
[[noreturn]] void mt_cuda_fatal(const char *file, int line, const char *call, const char *msg);

#define MT_CUDA_CHECK(call)                                                                \
    do {                                                                                   \
        cudaError_t mt_e_ = (call);                                                        \
        if (mt_e_ != cudaSuccess)                                                          \
            mt_cuda_fatal(__FILE__, __LINE__, #call, cudaGetErrorString(mt_e_));           \
    } while (0)
#define MT_CUBLAS_CHECK(call)                                                              \
    do {                                                                                   \
        cublasStatus_t mt_s_ = (call);                                                     \
        if (mt_s_ != CUBLAS_STATUS_SUCCESS)                                                \
            mt_cuda_fatal(__FILE__, __LINE__, #call, cublasLtGetStatusString(mt_s_));      \
    } while (0)
// After a launch: catches bad configurations without synchronising.
#define MT_CUDA_LAUNCHED() MT_CUDA_CHECK(cudaGetLastError())

// Per-call device scratch from the caching allocator. Freeing right after the launches
// that use it is safe: the block can only be handed out again to work queued later on
// the same stream. Aborts when the device is out of memory.
void *mt_cuda_scratch(mt_cuda_ctx *c, size_t bytes);
static inline void mt_cuda_scratch_free(mt_cuda_ctx *c, void *p) { mt_cuda_free(c, p); }

// Copies n bytes of device memory into the pinned staging buffer and waits: the path
// of every scalar an op returns to the host. n <= MT_CUDA_STAGE_BYTES.
#define MT_CUDA_STAGE_BYTES 4096
const void *mt_cuda_to_host(mt_cuda_ctx *c, const void *dev, size_t n);

static inline unsigned mt_cdiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

// ---------------------------------------------------------------- typed tensors

// A bf16 element of a typed tensor (kernels.h): the high half of an fp32. Its own type,
// so that a kernel template tells it from float.
struct mt_bf16 {
    uint16_t bits;
};
static_assert(sizeof(mt_bf16) == 2 && alignof(mt_bf16) == 2, "mt_bf16 is two bytes");

// Aborts, naming the op and the argument, unless t is fp32 or bf16 (the fp8 dtypes
// are the FP8 recipes', not taken by this backend yet) and, for an op that takes dense
// tensors (every typed op but gemm and convert), unless its rows are contiguous.
void mt_cuda_tensor_check(const char *op, const char *arg, struct mt_tensor t, bool dense);

// Calls f with a null pointer of t's element type, float or mt_bf16: the dispatch from
// a typed tensor to a kernel template (MT_ELEM gives the type back). t was checked.
template <typename F>
static inline void mt_with_elem(enum mt_dtype t, F &&f)
{
    if (t == MT_BF16) f((mt_bf16 *)nullptr);
    else f((float *)nullptr);
}
#define MT_ELEM(tag) typename std::remove_pointer<decltype(tag)>::type

// The same for the three tensors of an elementwise op (out, a, b): f(tag_out, tag_a, tag_b).
template <typename F>
static inline void mt_with_elem3(enum mt_dtype x, enum mt_dtype y, enum mt_dtype z, F &&f)
{
    mt_with_elem(x, [&](auto tx) {
        mt_with_elem(y, [&](auto ty) { mt_with_elem(z, [&](auto tz) { f(tx, ty, tz); }); });
    });
}

// Whether p is aligned for 4-element accesses of its dtype (16 bytes fp32, 8 bf16).
static inline bool mt_aligned4(const void *p, enum mt_dtype t)
{
    return ((uintptr_t)p % (4 * mt_dtype_size(t))) == 0;
}

// ---------------------------------------------------------------- device helpers

// x[i] = i for i < n: the values of a sort by key that must remember where items came from.
__global__ static void mt_iota_kernel(int32_t *x, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = i;
}

#define MT_FULL_MASK 0xffffffffu

__device__ __forceinline__ float mt_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(MT_FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ double mt_warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(MT_FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float mt_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(MT_FULL_MASK, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), returned to every
// thread. scratch holds 32 floats; the fixed tree makes the result deterministic.
__device__ __forceinline__ float mt_block_sum(float v, float *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = mt_warp_sum(v);
    __syncthreads(); // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0f;
    return mt_warp_sum(v);
}
__device__ __forceinline__ float mt_block_max(float v, float *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = mt_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : -INFINITY;
    return mt_warp_max(v);
}

__device__ __forceinline__ float mt_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Element access of typed tensors, as the CPU reference defines it (kernels/cpu/
// cpu_typed.c): a bf16 element widens to fp32 exactly; an fp32 result stored as bf16 is
// rounded to nearest even, a NaN kept a NaN (quietened, sign kept), bit for bit the
// CPU's mt_cpu_bf16. Integer arithmetic, so nvcc and the emulator agree by construction.
__device__ __forceinline__ uint16_t mt_bf16_bits(float x)
{
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u | 0x00400000u) >> 16);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float mt_ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float mt_ld(const mt_bf16 *p, size_t i)
{
    return __uint_as_float((uint32_t)p[i].bits << 16);
}
__device__ __forceinline__ void mt_st(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void mt_st(mt_bf16 *p, size_t i, float v) { p[i].bits = mt_bf16_bits(v); }
// mt_st, returning the element as stored (what mt_ld would read back)
__device__ __forceinline__ float mt_st_get(float *p, size_t i, float v) { return p[i] = v; }
__device__ __forceinline__ float mt_st_get(mt_bf16 *p, size_t i, float v)
{
    const uint16_t b = mt_bf16_bits(v);
    p[i].bits = b;
    return __uint_as_float((uint32_t)b << 16);
}

// Four consecutive elements from element 4 i on (the pointer mt_aligned4). Plain loads:
// an op's output may alias its input.
__device__ __forceinline__ float4 mt_ld4(const float *p, size_t i)
{
    return reinterpret_cast<const float4 *>(p)[i];
}
__device__ __forceinline__ float4 mt_ld4(const mt_bf16 *p, size_t i)
{
    const uint2 u = reinterpret_cast<const uint2 *>(p)[i];
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}
__device__ __forceinline__ void mt_st4(float *p, size_t i, float4 v) { reinterpret_cast<float4 *>(p)[i] = v; }
__device__ __forceinline__ void mt_st4(mt_bf16 *p, size_t i, float4 v)
{
    reinterpret_cast<uint2 *>(p)[i] = make_uint2((uint32_t)mt_bf16_bits(v.x) | (uint32_t)mt_bf16_bits(v.y) << 16,
                                                 (uint32_t)mt_bf16_bits(v.z) | (uint32_t)mt_bf16_bits(v.w) << 16);
}

// Two floats rounded to bf16 (RNE) in one 32-bit register, lo in the low half: the
// operand layout of mma (the lower k index in the lower half).
__device__ __forceinline__ uint32_t mt_pack_bf16(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

__device__ __forceinline__ uint32_t mt_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

// D (16x8 fp32) += A (16x16 bf16, row) * B (16x8 bf16, col). Fragments, with
// g = lane / 4 and t = lane % 4:
//   a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   c0 c1 (g, 2t..2t+1)  c2 c3 (g+8, 2t..2t+1)
__device__ __forceinline__ void mt_mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                            uint32_t b1)
{
#ifdef MT_CUDA_EMU
    ::mt_emu::mma_m16n8k16_bf16(c, a, b0, b1, __FILE__, __LINE__);
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Four 8x8 b16 matrices from shared memory; lane l gives the address of row l % 8 of
// matrix l / 8, and receives (row l / 4, columns 2 (l % 4) .. +1) of each matrix (with
// .trans: of each transposed matrix). "memory" keeps it after the barrier that
// published the data.
__device__ __forceinline__ void mt_ldsm_x4(uint32_t r[4], uint32_t addr)
{
#ifdef MT_CUDA_EMU
    ::mt_emu::ldmatrix_x4(r, addr, false, __FILE__, __LINE__);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
#endif
}
__device__ __forceinline__ void mt_ldsm_x4_t(uint32_t r[4], uint32_t addr)
{
#ifdef MT_CUDA_EMU
    ::mt_emu::ldmatrix_x4(r, addr, true, __FILE__, __LINE__);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
#endif
}

// Operand fragments from bf16 tiles in shared memory (stride in elements, rows padded
// so that the 8 rows of one ldmatrix fall in distinct banks).
//
// A (16 rows m0.., 16 k k0..) stored [m][k] (k contiguous): a0..a3.
__device__ __forceinline__ void mt_frag_a_kmajor(uint32_t a[4], const __nv_bfloat16 *s,
                                                 int stride, int m0, int k0)
{
    const int l = threadIdx.x & 31;
    mt_ldsm_x4(a, mt_smem_addr(s + (m0 + (l & 7) + ((l >> 3) & 1) * 8) * stride + k0 + (l >> 4) * 8));
}
// A stored [k][m] (m contiguous), through the transposing load.
__device__ __forceinline__ void mt_frag_a_mmajor(uint32_t a[4], const __nv_bfloat16 *s,
                                                 int stride, int m0, int k0)
{
    const int l = threadIdx.x & 31;
    mt_ldsm_x4_t(a, mt_smem_addr(s + (k0 + (l & 7) + (l >> 4) * 8) * stride + m0 + ((l >> 3) & 1) * 8));
}
// B for two n8 tiles (n0..n0+15) x 16 k, stored [n][k] (k contiguous):
// b[0], b[1] for n0..n0+7 and b[2], b[3] for n0+8..n0+15.
__device__ __forceinline__ void mt_frag_b_kmajor(uint32_t b[4], const __nv_bfloat16 *s,
                                                 int stride, int n0, int k0)
{
    const int l = threadIdx.x & 31;
    mt_ldsm_x4(b, mt_smem_addr(s + (n0 + (l & 7) + (l >> 4) * 8) * stride + k0 + ((l >> 3) & 1) * 8));
}
// The same from B stored [k][n] (n contiguous).
__device__ __forceinline__ void mt_frag_b_nmajor(uint32_t b[4], const __nv_bfloat16 *s,
                                                 int stride, int n0, int k0)
{
    const int l = threadIdx.x & 31;
    mt_ldsm_x4_t(b, mt_smem_addr(s + (k0 + (l & 7) + ((l >> 3) & 1) * 8) * stride + n0 + (l >> 4) * 8));
}

// Four consecutive floats as bf16 into shared memory (8-byte store).
__device__ __forceinline__ void mt_st_bf16x4(__nv_bfloat16 *dst, float4 v)
{
    uint2 u = make_uint2(mt_pack_bf16(v.x, v.y), mt_pack_bf16(v.z, v.w));
    *reinterpret_cast<uint2 *>(dst) = u;
}

#endif

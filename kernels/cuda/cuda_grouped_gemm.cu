// CUDA backend: grouped GEMM over all local experts in one launch, with the token
// counts per expert read from the device (the dispatch plan's offsets), never copied
// to the host.
//
// Three products (kernels.h, grouped_gemm):
//   forward  C_g (m_g,N) = A_g (m_g,K) W_g^T   W_g (N,K)  rows kernel, B k-major
//   dgrad    C_g (m_g,N) = A_g (m_g,K) W_g     W_g (K,N)  rows kernel, B n-major
//   wgrad    C_g (M,N)   = A_g^T B_g           reduction over the m_g token rows
// The rows kernel is persistent: each CTA reads the offsets, builds the prefix of
// tiles per group in shared memory, and walks the tile list with a grid stride, so the
// grid is sized from the machine, not from the (device-side) row count. The wgrad
// kernel has a fixed tile count per group, one CTA per output tile.
//
// Tile: 128 x 128 x 32, 8 warps of 64 x 32, bf16 mma.sync m16n8k16 with fp32
// accumulators; two CTAs per SM, so at most 128 registers a thread, without spills
// (64 accumulators, 32 for the next k-tile in flight, the fragments of one k16 step;
// the operand loads are written to leave ptxas room for the rest: doc/cuda-emulator.md,
// "register budget"). A, B and C are typed tensors (kernels.h), each fp32 or bf16: the
// loaders are templates on the operands' element types, fp32 operands rounded to bf16
// (RNE) on their way to shared memory, bf16 ones stored there as they are (the next
// k-tile is loaded into registers while the current one is multiplied: four float4 of
// fp32, or four 8-byte groups of bf16, a thread and operand); the epilogue stores C in
// its dtype (bf16: the fp32 result rounded to nearest even). The error analysis is that
// of cuda_gemm.cu: normalised MSE 5.5e-6 on fp32 operands, fp32 accumulation-order
// differences only on bf16 or bf16-exact ones. Operands
// stored with k contiguous are fetched with ldmatrix, those stored with m or n
// contiguous with ldmatrix.trans, so no operand is transposed in memory. Deterministic:
// every output element is one thread's fixed-order sum.
//
// Hopper note: this is the portable tensor-core path (HMMA). A wgmma + TMA version
// would reach a higher fraction of peak; with fp32 operands in memory the expert GEMMs
// of small per-expert batches are bound by reading the fp32 weights anyway.
#include "kernels/cuda/cuda_common.cuh"

#include <stdio.h>

#define GG_BM 128
#define GG_BN 128
#define GG_BK 32
#define GG_PAD 8 // bf16 elements: 16 bytes, so ldmatrix rows fall in distinct banks
#define GG_THREADS 256
#define GG_MAX_GROUPS 1024 // groups per launch of the rows kernel (tile prefix in smem)

// One output tile's problem: X(r, k) is X[r*ld + k] when k-major, X[k*ld + r] otherwise.
// C is bf16 when c_bf16, else fp32.
template <typename TA, typename TB>
struct gg_tile {
    const TA *A;
    const TB *B;
    void *C;
    int lda, ldb, ldc;
    int m_valid, n_valid, k_valid;
    bool c_bf16;
};

// Four consecutive elements of an operand in registers: float4 for fp32, the four bf16
// packed in a uint2 (lower index in the lower half) for bf16.
template <typename T>
struct gg_vec {
    typedef float4 type;
};
template <>
struct gg_vec<mt_bf16> {
    typedef uint2 type;
};

template <bool KMAJ>
struct gg_smem_shape {
    static constexpr int stride = KMAJ ? GG_BK + GG_PAD : 128 + GG_PAD; // elements per smem row
    static constexpr int elems = KMAJ ? 128 * (GG_BK + GG_PAD) : GG_BK * (128 + GG_PAD);
};

// One thread's share of an operand tile (128 rows x 32 k): four float4, at rows
// tr + 32 i and k tk..tk+3 (k-major), or rows tr..tr+3 and k tk + 8 i (otherwise),
// with tr, tk from threadIdx.x. Set up once per output tile: one pointer and two
// counts, so that the k loop carries a few registers, not an address per load.
template <bool KMAJ, typename T>
struct gg_src {
    const T *p; // element (tr, tk) of the operand
    int ld;
    int r_left; // rows from tr to r_valid
    int k_left; // k from tk to k_valid
    __device__ __forceinline__ gg_src(const T *X, int ld_, int r0, int r_valid, int k_valid)
    {
        const int tr = KMAJ ? threadIdx.x >> 3 : (threadIdx.x & 31) * 4;
        const int tk = KMAJ ? (threadIdx.x & 7) * 4 : threadIdx.x >> 5;
        ld = ld_;
        p = X + (KMAJ ? (size_t)(r0 + tr) * ld + tk : (size_t)tk * ld + r0 + tr);
        r_left = r_valid - r0 - tr;
        k_left = k_valid - tk;
    }
};

// *X when ok, else 0: one predicated load. Written as such because nvcc otherwise
// branches around each load, and ptxas then spilled at the 128-register cap (most on
// the element-wise path, 16 loads an operand).
__device__ __forceinline__ float gg_ldg_or_0(const float *X, bool ok)
{
#ifdef MT_CUDA_EMU
    return ok ? __ldg(X) : 0.0f;
#else
    float v;
    asm("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\tmov.b32 %0, 0;\n\t"
        "@p ld.global.nc.f32 %0, [%1];\n\t}"
        : "=f"(v)
        : "l"(X), "r"((int)ok));
    return v;
#endif
}

// The same for four floats (X 16-byte aligned).
__device__ __forceinline__ float4 gg_ldg4_or_0(const float *X, bool ok)
{
#ifdef MT_CUDA_EMU
    return ok ? __ldg(reinterpret_cast<const float4 *>(X)) : make_float4(0.f, 0.f, 0.f, 0.f);
#else
    float4 v;
    asm("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %5, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t"
        "mov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t@p ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];\n\t}"
        : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
        : "l"(X), "r"((int)ok));
    return v;
#endif
}

// The same for one bf16 element (its 16 bits), and for four (X 8-byte aligned).
__device__ __forceinline__ uint32_t gg_ldg_or_0(const mt_bf16 *X, bool ok)
{
#ifdef MT_CUDA_EMU
    return ok ? __ldg(&X->bits) : 0u;
#else
    unsigned short v;
    asm("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\tmov.b16 %0, 0;\n\t@p ld.global.nc.b16 %0, [%1];\n\t}"
        : "=h"(v)
        : "l"(X), "r"((int)ok));
    return v;
#endif
}
__device__ __forceinline__ uint2 gg_ldg4_or_0(const mt_bf16 *X, bool ok)
{
#ifdef MT_CUDA_EMU
    return ok ? __ldg(reinterpret_cast<const uint2 *>(X)) : make_uint2(0u, 0u);
#else
    uint2 v;
    asm("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %3, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t"
        "@p ld.global.nc.v2.b32 {%0, %1}, [%2];\n\t}"
        : "=r"(v.x), "=r"(v.y)
        : "l"(X), "r"((int)ok));
    return v;
#endif
}

__device__ __forceinline__ float4 gg_pack4(float a, float b, float c, float d) { return make_float4(a, b, c, d); }
__device__ __forceinline__ uint2 gg_pack4(uint32_t a, uint32_t b, uint32_t c, uint32_t d)
{
    return make_uint2(a | b << 16, c | d << 16);
}

// Loads the k-tile at k0 into four groups of 4 elements per thread; zeros outside
// (r_valid, k_valid).
template <bool KMAJ, bool VEC, typename T>
__device__ __forceinline__ void gg_load(typename gg_vec<T>::type reg[4], const gg_src<KMAJ, T> &s, int k0)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const T *q = s.p + (KMAJ ? (size_t)(32 * i) * s.ld + k0 : (size_t)(k0 + 8 * i) * s.ld);
        const bool row_in = KMAJ ? 32 * i < s.r_left : true;
        const bool k_in = KMAJ ? true : k0 + 8 * i < s.k_left;
        if constexpr (VEC) {
            // KMAJ: k..k+3 all in or all out (k_valid % 4 == 0); otherwise r..r+3 likewise
            reg[i] = gg_ldg4_or_0(q, row_in && k_in && (KMAJ ? k0 < s.k_left : 0 < s.r_left));
        } else {
            const bool ok = row_in && k_in;
            reg[i] = gg_pack4(gg_ldg_or_0(q, ok && (KMAJ ? k0 < s.k_left : 0 < s.r_left)),
                              gg_ldg_or_0(q + 1, ok && (KMAJ ? k0 + 1 < s.k_left : 1 < s.r_left)),
                              gg_ldg_or_0(q + 2, ok && (KMAJ ? k0 + 2 < s.k_left : 2 < s.r_left)),
                              gg_ldg_or_0(q + 3, ok && (KMAJ ? k0 + 3 < s.k_left : 3 < s.r_left)));
        }
    }
}

// Four elements into shared memory as bf16: fp32 rounded (RNE), bf16 as they are.
__device__ __forceinline__ void gg_st4(__nv_bfloat16 *dst, float4 v) { mt_st_bf16x4(dst, v); }
__device__ __forceinline__ void gg_st4(__nv_bfloat16 *dst, uint2 v) { *reinterpret_cast<uint2 *>(dst) = v; }

template <bool KMAJ, typename V>
__device__ __forceinline__ void gg_store(__nv_bfloat16 *s, const V reg[4])
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int c = threadIdx.x + i * GG_THREADS;
        const int off = KMAJ ? (c >> 3) * gg_smem_shape<true>::stride + (c & 7) * 4
                             : (c >> 5) * gg_smem_shape<false>::stride + (c & 31) * 4;
        gg_st4(s + off, reg[i]);
    }
}

// Two adjacent outputs of C (VEC: col even and the pair 8-byte (fp32) or 4-byte (bf16)
// aligned): alpha acc + beta C, stored in C's dtype.
template <bool VEC, typename TC>
__device__ __forceinline__ void gg_put2(TC *crow, int col, int n_valid, float v0, float v1, float beta)
{
    if (VEC) { // n_valid even: col < n_valid implies col + 1 < n_valid
        if (col >= n_valid) return;
        if (beta != 0.0f) {
            v0 += beta * mt_ld(crow, col);
            v1 += beta * mt_ld(crow, col + 1);
        }
        if constexpr (std::is_same<TC, float>::value)
            *reinterpret_cast<float2 *>(crow + col) = make_float2(v0, v1);
        else
            *reinterpret_cast<uint32_t *>(crow + col) = (uint32_t)mt_bf16_bits(v0) | (uint32_t)mt_bf16_bits(v1) << 16;
    } else {
        if (col < n_valid) mt_st(crow, col, beta != 0.0f ? v0 + beta * mt_ld(crow, col) : v0);
        if (col + 1 < n_valid) mt_st(crow, col + 1, beta != 0.0f ? v1 + beta * mt_ld(crow, col + 1) : v1);
    }
}

// The epilogue of a warp's 64 x 32 outputs: C = alpha acc + beta C over the valid part.
template <bool VEC, typename TC>
__device__ __forceinline__ void gg_epilogue(TC *C, int ldc, int m_valid, int n_valid, int row0, int col0,
                                            const float acc[4][4][4], float alpha, float beta)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = row0 + mi * 16 + g + h * 8;
            if (row >= m_valid) continue;
            TC *crow = C + (size_t)row * ldc;
#pragma unroll
            for (int nj = 0; nj < 4; nj++)
                gg_put2<VEC>(crow, col0 + nj * 8 + 2 * q, n_valid, alpha * acc[mi][nj][2 * h],
                             alpha * acc[mi][nj][2 * h + 1], beta);
        }
}

// One 128 x 128 output tile at (m0, n0): C = alpha A B^T-ish + beta C. sA and sB hold
// two stages each. Ends with a barrier, so the caller may start another tile at once.
template <bool A_K, bool B_K, bool VEC, typename TA, typename TB>
__device__ __forceinline__ void gg_tile_run(const gg_tile<TA, TB> &t, int m0, int n0, float alpha, float beta,
                                            __nv_bfloat16 *sA, __nv_bfloat16 *sB)
{
    constexpr int a_elems = gg_smem_shape<A_K>::elems, b_elems = gg_smem_shape<B_K>::elems;
    constexpr int a_stride = gg_smem_shape<A_K>::stride, b_stride = gg_smem_shape<B_K>::stride;
    const int warp = threadIdx.x >> 5;
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    const gg_src<A_K, TA> srcA(t.A, t.lda, m0, t.m_valid, t.k_valid);
    const gg_src<B_K, TB> srcB(t.B, t.ldb, n0, t.n_valid, t.k_valid);
    typename gg_vec<TA>::type ra[4];
    typename gg_vec<TB>::type rb[4];
    gg_load<A_K, VEC>(ra, srcA, 0);
    gg_load<B_K, VEC>(rb, srcB, 0);
    gg_store<A_K>(sA, ra);
    gg_store<B_K>(sB, rb);
    __syncthreads();

    const int nk = (t.k_valid + GG_BK - 1) / GG_BK;
    for (int kt = 0; kt < nk; kt++) {
        const int cur = kt & 1;
        const bool more = kt + 1 < nk;
        if (more) {
            gg_load<A_K, VEC>(ra, srcA, (kt + 1) * GG_BK);
            gg_load<B_K, VEC>(rb, srcB, (kt + 1) * GG_BK);
        }
        const __nv_bfloat16 *a = sA + cur * a_elems, *b = sB + cur * b_elems;
#pragma unroll
        for (int kk = 0; kk < GG_BK; kk += 16) {
            uint32_t af[4][4], bf[2][4];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                if constexpr (A_K) mt_frag_a_kmajor(af[mi], a, a_stride, wm + mi * 16, kk);
                else mt_frag_a_mmajor(af[mi], a, a_stride, wm + mi * 16, kk);
            }
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                if constexpr (B_K) mt_frag_b_kmajor(bf[nj], b, b_stride, wn + nj * 16, kk);
                else mt_frag_b_nmajor(bf[nj], b, b_stride, wn + nj * 16, kk);
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int nj = 0; nj < 2; nj++) {
                    mt_mma_bf16(acc[mi][2 * nj], af[mi], bf[nj][0], bf[nj][1]);
                    mt_mma_bf16(acc[mi][2 * nj + 1], af[mi], bf[nj][2], bf[nj][3]);
                }
        }
        if (more) {
            gg_store<A_K>(sA + (cur ^ 1) * a_elems, ra);
            gg_store<B_K>(sB + (cur ^ 1) * b_elems, rb);
        }
        __syncthreads();
    }

    if (t.c_bf16)
        gg_epilogue<VEC>(static_cast<mt_bf16 *>(t.C), t.ldc, t.m_valid, t.n_valid, m0 + wm, n0 + wn, acc, alpha,
                         beta);
    else
        gg_epilogue<VEC>(static_cast<float *>(t.C), t.ldc, t.m_valid, t.n_valid, m0 + wm, n0 + wn, acc, alpha, beta);
}

// A, B: the element types of the kernel's TA, TB; C bf16 when c_bf16, else fp32.
struct gg_args {
    const int32_t *offsets; // (G+1), device
    int G, M, N, K;
    float alpha, beta;
    const void *A, *B;
    void *C;
    bool c_bf16;
};

// Element e of an fp32 or bf16 array at p.
static __device__ __forceinline__ void *gg_at(void *p, size_t e, bool bf16)
{
    return static_cast<char *>(p) + e * (bf16 ? 2 : 4);
}

// forward (B_K) and dgrad (!B_K): tiles over the token rows of every group.
template <typename TA, typename TB, bool B_K, bool VEC>
__global__ void __launch_bounds__(GG_THREADS, 2) gg_rows_kernel(gg_args a)
{
    MT_SHARED(int, tile_start, [GG_MAX_GROUPS + 1]);
    MT_SHARED(__nv_bfloat16, sA, [2 * gg_smem_shape<true>::elems]);
    MT_SHARED(__nv_bfloat16, sB, [2 * gg_smem_shape<B_K>::elems]);
    const int tilesN = (a.N + GG_BN - 1) / GG_BN;
    const int lane = threadIdx.x & 31;

    if (threadIdx.x == 0) tile_start[0] = 0;
    for (int g = threadIdx.x; g < a.G; g += GG_THREADS) {
        const int m = a.offsets[g + 1] - a.offsets[g];
        tile_start[g + 1] = (m + GG_BM - 1) / GG_BM * tilesN;
    }
    __syncthreads();
    if (threadIdx.x < 32) { // inclusive scan of tile_start[1..G], 32 groups at a time
        int carry = 0;
        for (int base = 1; base <= a.G; base += 32) {
            const int i = base + lane;
            int v = i <= a.G ? tile_start[i] : 0;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int u = __shfl_up_sync(MT_FULL_MASK, v, o);
                if (lane >= o) v += u;
            }
            v += carry;
            if (i <= a.G) tile_start[i] = v;
            carry = __shfl_sync(MT_FULL_MASK, v, 31);
        }
    }
    __syncthreads();

    const int total = tile_start[a.G];
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        int lo = 0, hi = a.G - 1; // the last group whose first tile is <= tile
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (tile_start[mid] <= tile) lo = mid;
            else hi = mid - 1;
        }
        const int g = lo, local = tile - tile_start[g];
        const int r0 = a.offsets[g];
        gg_tile<TA, TB> t;
        t.A = static_cast<const TA *>(a.A) + (size_t)r0 * a.K;
        t.lda = a.K;
        t.B = static_cast<const TB *>(a.B) + (size_t)g * a.N * a.K;
        t.ldb = B_K ? a.K : a.N;
        t.C = gg_at(a.C, (size_t)r0 * a.N, a.c_bf16);
        t.c_bf16 = a.c_bf16;
        t.ldc = a.N;
        t.m_valid = a.offsets[g + 1] - r0;
        t.n_valid = a.N;
        t.k_valid = a.K;
        gg_tile_run<true, B_K, VEC>(t, (local / tilesN) * GG_BM, (local % tilesN) * GG_BN, a.alpha,
                                    a.beta, sA, sB);
    }
}

// wgrad: C_g (M,N) = alpha A_g^T B_g + beta C_g; blockIdx.y = group.
template <typename TA, typename TB, bool VEC>
__global__ void __launch_bounds__(GG_THREADS, 2) gg_wgrad_kernel(gg_args a)
{
    MT_SHARED(__nv_bfloat16, sA, [2 * gg_smem_shape<false>::elems]);
    MT_SHARED(__nv_bfloat16, sB, [2 * gg_smem_shape<false>::elems]);
    const int tilesN = (a.N + GG_BN - 1) / GG_BN;
    const int g = blockIdx.y;
    const int r0 = a.offsets[g];
    gg_tile<TA, TB> t;
    t.A = static_cast<const TA *>(a.A) + (size_t)r0 * a.M;
    t.lda = a.M;
    t.B = static_cast<const TB *>(a.B) + (size_t)r0 * a.N;
    t.ldb = a.N;
    t.C = gg_at(a.C, (size_t)g * a.M * a.N, a.c_bf16);
    t.c_bf16 = a.c_bf16;
    t.ldc = a.N;
    t.m_valid = a.M;
    t.n_valid = a.N;
    t.k_valid = a.offsets[g + 1] - r0;
    gg_tile_run<false, false, VEC>(t, (blockIdx.x / tilesN) * GG_BM, (blockIdx.x % tilesN) * GG_BN,
                                   a.alpha, a.beta, sA, sB);
}

// Persistent grid: as many CTAs as fit on the device at once.
template <typename TA, typename TB, bool B_K, bool VEC>
static int rows_grid(const mt_cuda_ctx *c)
{
    static int per_sm = 0;
    if (per_sm == 0) {
        MT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gg_rows_kernel<TA, TB, B_K, VEC>,
                                                                    GG_THREADS, 0));
        if (per_sm < 1) per_sm = 1;
    }
    return per_sm * c->sm_count;
}

template <typename TA, typename TB, bool B_K, bool VEC>
static void launch_rows(mt_cuda_ctx *c, const gg_args &a)
{
    const int grid = rows_grid<TA, TB, B_K, VEC>(c);
    MT_LAUNCH(grid, GG_THREADS, 0, c->stream, gg_rows_kernel<TA, TB, B_K, VEC>)(a);
    MT_CUDA_LAUNCHED();
}

extern "C" void mt_cuda_grouped_gemm(void *ctx, bool trans_a, bool trans_b, int num_groups,
                                     const int32_t *offsets, int M, int N, int K, float alpha,
                                     struct mt_tensor A, struct mt_tensor B, float beta, struct mt_tensor C)
{
    MT_CUDA_OP(ctx, MT_OP_GROUPED_GEMM);
    mt_cuda_ctx *c = mt_cuda(ctx);
    mt_cuda_tensor_check("grouped_gemm", "A", A, true), mt_cuda_tensor_check("grouped_gemm", "B", B, true);
    mt_cuda_tensor_check("grouped_gemm", "C", C, true);
    if (C.dtype == MT_BF16 && beta != 0.0f)
        mt_cuda_fatal(__FILE__, __LINE__, "grouped_gemm", "C is bf16 with beta != 0 (a bf16 C takes beta = 0)");
    if (num_groups <= 0 || N <= 0) return;
    if (trans_a && trans_b) mt_cuda_fatal(__FILE__, __LINE__, "grouped_gemm", "trans_a with trans_b is not defined");
    if (trans_a && M <= 0) return;
    // 4-element loads and paired stores: 16-byte aligned fp32, 8-byte aligned bf16;
    // rows of A and k-major W need K % 4, n-major W (dgrad) and the paired stores N % 4
    const bool ptrs = mt_aligned4(A.data, A.dtype) && mt_aligned4(B.data, B.dtype) && mt_aligned4(C.data, C.dtype);
    const bool vec = ptrs && (trans_a ? M : K) % 4 == 0 && N % 4 == 0;
    const bool c_bf16 = C.dtype == MT_BF16;
    const size_t b_es = mt_dtype_size(B.dtype), c_es = mt_dtype_size(C.dtype);
    mt_with_elem(A.dtype, [&](auto at) {
        mt_with_elem(B.dtype, [&](auto bt) {
            using TA = MT_ELEM(at);
            using TB = MT_ELEM(bt);
            if (!trans_a) {
                for (int g0 = 0; g0 < num_groups; g0 += GG_MAX_GROUPS) {
                    const int groups = num_groups - g0 < GG_MAX_GROUPS ? num_groups - g0 : GG_MAX_GROUPS;
                    const gg_args a = {offsets + g0, groups, M, N, K, alpha, beta, A.data,
                                       (const char *)B.data + (size_t)g0 * N * K * b_es, C.data, c_bf16};
                    if (trans_b) vec ? launch_rows<TA, TB, true, true>(c, a) : launch_rows<TA, TB, true, false>(c, a);
                    else vec ? launch_rows<TA, TB, false, true>(c, a) : launch_rows<TA, TB, false, false>(c, a);
                }
                return;
            }
            const unsigned tiles = mt_cdiv(M, GG_BM) * mt_cdiv(N, GG_BN);
            for (int g0 = 0; g0 < num_groups; g0 += 65535) { // groups are grid.y
                const int groups = num_groups - g0 < 65535 ? num_groups - g0 : 65535;
                const gg_args a = {offsets + g0, groups, M, N, K, alpha, beta, A.data, B.data,
                                   (char *)C.data + (size_t)g0 * M * N * c_es, c_bf16};
                dim3 grid(tiles, (unsigned)a.G);
                if (vec) MT_LAUNCH(grid, GG_THREADS, 0, c->stream, gg_wgrad_kernel<TA, TB, true>)(a);
                else MT_LAUNCH(grid, GG_THREADS, 0, c->stream, gg_wgrad_kernel<TA, TB, false>)(a);
                MT_CUDA_LAUNCHED();
            }
        });
    });
}

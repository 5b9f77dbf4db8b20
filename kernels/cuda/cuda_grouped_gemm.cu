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
// "register budget"). fp32 operands are rounded to bf16 (RNE) on their way to shared
// memory (the next k-tile is loaded into registers while the current one is
// multiplied), so the error analysis is that of cuda_gemm.cu: normalised MSE 5.5e-6 on
// fp32 operands, fp32 accumulation-order differences only on bf16-exact ones. Operands
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
struct gg_tile {
    const float *A, *B;
    float *C;
    int lda, ldb, ldc;
    int m_valid, n_valid, k_valid;
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
template <bool KMAJ>
struct gg_src {
    const float *p; // element (tr, tk) of the operand
    int ld;
    int r_left; // rows from tr to r_valid
    int k_left; // k from tk to k_valid
    __device__ __forceinline__ gg_src(const float *X, int ld_, int r0, int r_valid, int k_valid)
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

// Loads the k-tile at k0 into four float4 per thread; zeros outside (r_valid, k_valid).
template <bool KMAJ, bool VEC>
__device__ __forceinline__ void gg_load(float4 reg[4], const gg_src<KMAJ> &s, int k0)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float *q = s.p + (KMAJ ? (size_t)(32 * i) * s.ld + k0 : (size_t)(k0 + 8 * i) * s.ld);
        const bool row_in = KMAJ ? 32 * i < s.r_left : true;
        const bool k_in = KMAJ ? true : k0 + 8 * i < s.k_left;
        if constexpr (VEC) {
            // KMAJ: k..k+3 all in or all out (k_valid % 4 == 0); otherwise r..r+3 likewise
            reg[i] = gg_ldg4_or_0(q, row_in && k_in && (KMAJ ? k0 < s.k_left : 0 < s.r_left));
        } else {
            float v[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const bool in = KMAJ ? k0 + e < s.k_left : e < s.r_left;
                v[e] = gg_ldg_or_0(q + e, row_in && k_in && in);
            }
            reg[i] = make_float4(v[0], v[1], v[2], v[3]);
        }
    }
}

template <bool KMAJ>
__device__ __forceinline__ void gg_store(__nv_bfloat16 *s, const float4 reg[4])
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int c = threadIdx.x + i * GG_THREADS;
        const int off = KMAJ ? (c >> 3) * gg_smem_shape<true>::stride + (c & 7) * 4
                             : (c >> 5) * gg_smem_shape<false>::stride + (c & 31) * 4;
        mt_st_bf16x4(s + off, reg[i]);
    }
}

// One 128 x 128 output tile at (m0, n0): C = alpha A B^T-ish + beta C. sA and sB hold
// two stages each. Ends with a barrier, so the caller may start another tile at once.
template <bool A_K, bool B_K, bool VEC>
__device__ __forceinline__ void gg_tile_run(const gg_tile &t, int m0, int n0, float alpha, float beta,
                                            __nv_bfloat16 *sA, __nv_bfloat16 *sB)
{
    constexpr int a_elems = gg_smem_shape<A_K>::elems, b_elems = gg_smem_shape<B_K>::elems;
    constexpr int a_stride = gg_smem_shape<A_K>::stride, b_stride = gg_smem_shape<B_K>::stride;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    const gg_src<A_K> srcA(t.A, t.lda, m0, t.m_valid, t.k_valid);
    const gg_src<B_K> srcB(t.B, t.ldb, n0, t.n_valid, t.k_valid);
    float4 ra[4], rb[4];
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

    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = m0 + wm + mi * 16 + g + h * 8;
            if (row >= t.m_valid) continue;
            float *crow = t.C + (size_t)row * t.ldc;
#pragma unroll
            for (int nj = 0; nj < 4; nj++) {
                const int col = n0 + wn + nj * 8 + 2 * q;
                const float v0 = alpha * acc[mi][nj][2 * h], v1 = alpha * acc[mi][nj][2 * h + 1];
                if constexpr (VEC) { // n_valid even: col < n_valid implies col + 1 < n_valid
                    if (col >= t.n_valid) continue;
                    float2 *p = reinterpret_cast<float2 *>(crow + col);
                    float2 o = make_float2(v0, v1);
                    if (beta != 0.0f) {
                        const float2 old = *p;
                        o.x += beta * old.x;
                        o.y += beta * old.y;
                    }
                    *p = o;
                } else {
                    if (col < t.n_valid) crow[col] = beta != 0.0f ? v0 + beta * crow[col] : v0;
                    if (col + 1 < t.n_valid) crow[col + 1] = beta != 0.0f ? v1 + beta * crow[col + 1] : v1;
                }
            }
        }
}

struct gg_args {
    const int32_t *offsets; // (G+1), device
    int G, M, N, K;
    float alpha, beta;
    const float *A, *B;
    float *C;
};

// forward (B_K) and dgrad (!B_K): tiles over the token rows of every group.
template <bool B_K, bool VEC>
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
        gg_tile t;
        t.A = a.A + (size_t)r0 * a.K;
        t.lda = a.K;
        t.B = a.B + (size_t)g * a.N * a.K;
        t.ldb = B_K ? a.K : a.N;
        t.C = a.C + (size_t)r0 * a.N;
        t.ldc = a.N;
        t.m_valid = a.offsets[g + 1] - r0;
        t.n_valid = a.N;
        t.k_valid = a.K;
        gg_tile_run<true, B_K, VEC>(t, (local / tilesN) * GG_BM, (local % tilesN) * GG_BN, a.alpha,
                                    a.beta, sA, sB);
    }
}

// wgrad: C_g (M,N) = alpha A_g^T B_g + beta C_g; blockIdx.y = group.
template <bool VEC>
__global__ void __launch_bounds__(GG_THREADS, 2) gg_wgrad_kernel(gg_args a)
{
    MT_SHARED(__nv_bfloat16, sA, [2 * gg_smem_shape<false>::elems]);
    MT_SHARED(__nv_bfloat16, sB, [2 * gg_smem_shape<false>::elems]);
    const int tilesN = (a.N + GG_BN - 1) / GG_BN;
    const int g = blockIdx.y;
    const int r0 = a.offsets[g];
    gg_tile t;
    t.A = a.A + (size_t)r0 * a.M;
    t.lda = a.M;
    t.B = a.B + (size_t)r0 * a.N;
    t.ldb = a.N;
    t.C = a.C + (size_t)g * a.M * a.N;
    t.ldc = a.N;
    t.m_valid = a.M;
    t.n_valid = a.N;
    t.k_valid = a.offsets[g + 1] - r0;
    gg_tile_run<false, false, VEC>(t, (blockIdx.x / tilesN) * GG_BM, (blockIdx.x % tilesN) * GG_BN,
                                   a.alpha, a.beta, sA, sB);
}

// Persistent grid: as many CTAs as fit on the device at once.
template <bool B_K, bool VEC>
static int rows_grid(const mt_cuda_ctx *c)
{
    static int per_sm = 0;
    if (per_sm == 0) {
        MT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gg_rows_kernel<B_K, VEC>,
                                                                    GG_THREADS, 0));
        if (per_sm < 1) per_sm = 1;
    }
    return per_sm * c->sm_count;
}

template <bool B_K, bool VEC>
static void launch_rows(mt_cuda_ctx *c, const gg_args &a)
{
    const int grid = rows_grid<B_K, VEC>(c);
    MT_LAUNCH(grid, GG_THREADS, 0, c->stream, gg_rows_kernel<B_K, VEC>)(a);
    MT_CUDA_LAUNCHED();
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" void mt_cuda_grouped_gemm(void *ctx, bool trans_a, bool trans_b, int num_groups,
                                     const int32_t *offsets, int M, int N, int K, float alpha,
                                     const float *A, const float *B, float beta, float *C)
{
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (num_groups <= 0 || N <= 0) return;
    const bool ptrs = aligned16(A) && aligned16(B) && aligned16(C);
    if (!trans_a) {
        // rows of A and k-major W need K % 4; n-major W (dgrad) and float2 stores need N % 4
        const bool vec = ptrs && K % 4 == 0 && N % 4 == 0;
        for (int g0 = 0; g0 < num_groups; g0 += GG_MAX_GROUPS) {
            const int groups = num_groups - g0 < GG_MAX_GROUPS ? num_groups - g0 : GG_MAX_GROUPS;
            const gg_args a = {offsets + g0, groups, M, N, K, alpha, beta, A, B + (size_t)g0 * N * K, C};
            if (trans_b) vec ? launch_rows<true, true>(c, a) : launch_rows<true, false>(c, a);
            else vec ? launch_rows<false, true>(c, a) : launch_rows<false, false>(c, a);
        }
        return;
    }
    if (trans_b) mt_cuda_fatal(__FILE__, __LINE__, "grouped_gemm", "trans_a with trans_b is not defined");
    if (M <= 0) return;
    const bool vec = ptrs && M % 4 == 0 && N % 4 == 0;
    const unsigned tiles = mt_cdiv(M, GG_BM) * mt_cdiv(N, GG_BN);
    for (int g0 = 0; g0 < num_groups; g0 += 65535) { // groups are grid.y
        const int groups = num_groups - g0 < 65535 ? num_groups - g0 : 65535;
        const gg_args a = {offsets + g0, groups, M, N, K, alpha, beta, A, B, C + (size_t)g0 * M * N};
        dim3 grid(tiles, (unsigned)a.G);
        if (vec) MT_LAUNCH(grid, GG_THREADS, 0, c->stream, gg_wgrad_kernel<true>)(a);
        else MT_LAUNCH(grid, GG_THREADS, 0, c->stream, gg_wgrad_kernel<false>)(a);
        MT_CUDA_LAUNCHED();
    }
}

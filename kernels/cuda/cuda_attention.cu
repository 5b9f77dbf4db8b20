// CUDA backend: fused causal GQA attention, forward and backward, flash-attention style:
// scores live only in registers, one 64 x 64 tile at a time, so memory is O(T) per
// head for any sequence length (32768 and beyond).
//
// Forward (one CTA per 64 query rows of one head, 4 warps of 16 rows): for each key
// tile up to the diagonal, S = Q K^T on bf16 tensor cores (mma.sync m16n8k16, fp32
// accumulators), causal mask on the diagonal tile, online softmax in fp32 (running row
// max m and sum l, O rescaled by exp(m_old - m_new)), then O += P V with P rounded to
// bf16. At the end O /= l and the row's logsumexp lse = m / sqrt(D) + log(l) is saved.
//
// Backward, deterministic (no atomics), in four kernels:
//   delta[t] = <dO[t], O[t]>                           (the softmax-backward row term)
//   dK, dV:   one CTA per chunk of the query tiles of 64 keys of one KV group (below);
//             for each of its query steps and each of the group's query heads it
//             recomputes P^T = exp(K Q^T - lse) and accumulates dV += P^T dO,
//             dK += dS^T Q with dS = P (dP - delta), dP^T = V dO^T
//   reduce:   dK, dV of the key tiles cut into several chunks: the chunks' partial
//             sums, added in chunk order
//   dQ:       one CTA per 64 query rows of one head, over the key tiles up to the
//             diagonal: dQ += dS K
// FlashAttention-2 computes dQ in the dK/dV loop with atomic adds; splitting it out
// costs two extra tile products (S and dP are recomputed) and buys run-to-run equality.
//
// The dK/dV split. Causal masking gives key tile kt the query tiles kt .. nqt-1 (nqt =
// ceil(T / 64)): 64 for the first key tile at T = 4096, 1 for the last. One CTA per
// (key tile, KV group, batch) item made nqt x Hkv x B CTAs whose work differed 64:1.
// Now an item's query tiles are cut into chunks of wq tiles (the last one shorter),
// each chunk a CTA over all the group's query heads: no CTA does more than wq x Hq/Hkv
// tile steps (64 keys x 64 queries of one head). wq depends on the shape alone
// (dkdv_plan: the whole work in about ATT_DKDV_CHUNKS chunks), never on the GPU, so
// every GPU sums in the same order. CTAs go in key-tile order, most query tiles first
// (then batch and group, then chunk): the longest start first. An item of one chunk
// stores dK and dV itself; the chunks of a split item store partial sums in a
// workspace slot each (the CTA's index: split items are the lowest key tiles, their
// CTAs come first), and the reduce kernel adds them in chunk order: no atomics, the
// same bits on every run.
//   B 1, T 4096                            CTAs before  longest  wq  CTAs now  longest
//   qwen3_30b_a3b, TP 2 (Hq 16, Hkv 2)            128      512   5       884       40
//   qwen3_235b_a22b, TP 4 (Hq 16, Hkv 1)           64     1024   3       715       48
// An H100 holds 264 of these CTAs (132 SMs x 2); before, 128 CTAs left half the places
// empty and the kernel lasted as long as the first key tile's 512 steps, where an SM
// averages 33280 / 132 = 252. Workspace at the first layout: 874 slots of 2 x 64 x D
// floats, 54.6 MiB (at most 2048 slots, 128 MiB at D 128). ptxas (nvcc 13.0), dK/dV at
// head_dim 128: 240 registers on sm_90 and 230 on sm_100 before, 216 and 226 now, no
// spills, 43.6 KB of dynamic shared memory as before; the reduce kernel 40 and 32.
// doc/cuda-emulator.md, "Attention backward: the dK/dV split", has the reasoning.
//
// Precision: Q, K, V, dO, P and dS enter the tensor cores as bf16 (RNE), sums are fp32.
// Q, K and V are typed tensors, the kernels templates on their element type (TE): fp32
// ones are rounded on their way to shared memory, bf16 ones copied there as they are
// (att_load); the fp32 instantiations use the registers they did before, the bf16 ones
// as many or fewer but for dK/dV at head_dim 128 on sm_90 (218, 2 more). In the model
// Q, K, V are bf16; P, dO and dS are rounded, relative error at most 2^-8 per element,
// independent from element to element: normalised MSE ~1e-6 on the output and ~7e-6 on
// the gradients. The parity test's bounds follow.
#include "kernels/cuda/cuda_common.cuh"

#include <math.h>
#include <stdio.h>

#define ATT_BR 64 // query rows per CTA (forward, dQ)
#define ATT_BC 64 // keys per tile, and query rows per tile of the dK/dV split
#define ATT_THREADS 128
#define ATT_LOG2E 1.4426950408889634f
// dK/dV: about this many chunks in all, plus one per split item for the remainders:
// 3.9 times the 264 CTAs an H100 holds (2 an SM), so that the longest chunk is a
// quarter to a third of one place's share of the work
#define ATT_DKDV_CHUNKS 1024

template <int DMAX>
struct att_shape {
    static constexpr int stride = DMAX + 8; // bf16 elements per smem row (16-byte pad)
    static constexpr int tile = ATT_BC * stride;
    // query rows per step of the dK/dV kernel: its dK and dV accumulators take 2 DMAX/8
    // x 4 registers a thread (128 at DMAX 128), so there the score tiles are 16 queries:
    // at 32 ptxas sat at the 255 cap (kernels/cuda/ptxas-budget.txt)
    static constexpr int bq = DMAX == 128 ? 16 : 64;
};

// rows (row0 .. row0+nrows-1) of one head into a bf16 tile [row][DMAX]; row t of the
// head is X + t*row_stride; zeros past rows_valid and past D. fp32 elements are rounded
// to bf16 (RNE); bf16 ones are stored as they are.
template <int DMAX>
__device__ __forceinline__ void att_load(__nv_bfloat16 *s, const float *X, int row0, int nrows, int rows_valid,
                                           size_t row_stride, int D, bool vec)
{
    constexpr int CH = DMAX / 4;
    for (int c = threadIdx.x; c < nrows * CH; c += ATT_THREADS) {
        const int r = c / CH, d = (c % CH) * 4, t = row0 + r;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < rows_valid && d < D) {
            const float *src = X + (size_t)t * row_stride + d;
            if (vec) {
                v = __ldg(reinterpret_cast<const float4 *>(src));
            } else {
                v.x = __ldg(src);
                if (d + 1 < D) v.y = __ldg(src + 1);
                if (d + 2 < D) v.z = __ldg(src + 2);
                if (d + 3 < D) v.w = __ldg(src + 3);
            }
        }
        mt_st_bf16x4(s + r * att_shape<DMAX>::stride + d, v);
    }
}
template <int DMAX>
__device__ __forceinline__ void att_load(__nv_bfloat16 *s, const mt_bf16 *X, int row0, int nrows, int rows_valid,
                                           size_t row_stride, int D, bool vec)
{
    constexpr int CH = DMAX / 4;
    for (int c = threadIdx.x; c < nrows * CH; c += ATT_THREADS) {
        const int r = c / CH, d = (c % CH) * 4, t = row0 + r;
        uint2 v = make_uint2(0u, 0u);
        if (t < rows_valid && d < D) {
            const uint16_t *src = &X[(size_t)t * row_stride + d].bits;
            if (vec) {
                v = __ldg(reinterpret_cast<const uint2 *>(src));
            } else {
                v.x = __ldg(src);
                if (d + 1 < D) v.x |= (uint32_t)__ldg(src + 1) << 16;
                if (d + 2 < D) v.y = __ldg(src + 2);
                if (d + 3 < D) v.y |= (uint32_t)__ldg(src + 3) << 16;
            }
        }
        *reinterpret_cast<uint2 *>(s + r * att_shape<DMAX>::stride + d) = v;
    }
}


// A-operand fragment (16 rows x 16 k) from a 16 x 16 block of C fragments c0 (columns
// k0..k0+7) and c1 (k0+8..k0+15), rounded to bf16: the C layout of mma is the A layout.
__device__ __forceinline__ void att_c_to_a(uint32_t a[4], const float c0[4], const float c1[4])
{
    a[0] = mt_pack_bf16(c0[0], c0[1]);
    a[1] = mt_pack_bf16(c0[2], c0[3]);
    a[2] = mt_pack_bf16(c1[0], c1[1]);
    a[3] = mt_pack_bf16(c1[2], c1[3]);
}

template <int NT>
__device__ __forceinline__ void att_zero(float acc[NT][4])
{
#pragma unroll
    for (int i = 0; i < NT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
}

// One warp: acc (16 x 8NT) += A B^T over 16KS k, A the 16 rows of a [row][k] tile from
// a_row0, B the first 8NT rows of a [n][k] tile (bf16 in shared memory, stride ST).
template <int KS, int NT, int ST>
__device__ __forceinline__ void att_mma_abt(float acc[NT][4], const __nv_bfloat16 *sa, int a_row0,
                                            const __nv_bfloat16 *sb)
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t af[4];
        mt_frag_a_kmajor(af, sa, ST, a_row0, kk * 16);
#pragma unroll
        for (int nj = 0; nj < NT / 2; nj++) {
            uint32_t bf[4];
            mt_frag_b_kmajor(bf, sb, ST, nj * 16, kk * 16);
            mt_mma_bf16(acc[2 * nj], af, bf[0], bf[1]);
            mt_mma_bf16(acc[2 * nj + 1], af, bf[2], bf[3]);
        }
    }
}

// One warp: acc (16 x 8NT) += P B, P (16 x 8NP) held as mma C fragments (rounded to
// bf16 here), B the first 8NP rows of a [k][n] tile (bf16 in shared memory, stride ST).
template <int NP, int NT, int ST>
__device__ __forceinline__ void att_mma_pb(float acc[NT][4], const float p[NP][4], const __nv_bfloat16 *sb)
{
#pragma unroll
    for (int kk = 0; kk < NP / 2; kk++) {
        uint32_t pa[4];
        att_c_to_a(pa, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
        for (int dj = 0; dj < NT / 2; dj++) {
            uint32_t bf[4];
            mt_frag_b_nmajor(bf, sb, ST, dj * 16, kk * 16);
            mt_mma_bf16(acc[2 * dj], pa, bf[0], bf[1]);
            mt_mma_bf16(acc[2 * dj + 1], pa, bf[2], bf[3]);
        }
    }
}

// Stores a warp's 16 x DMAX fp32 accumulator rows (row_a = its row g, row_a + 8) times
// mul, columns below D, rows below T. Row t goes to Y + t*row_stride.
template <int DMAX>
__device__ __forceinline__ void att_store_rows(float *Y, size_t row_stride, const float acc[DMAX / 8][4], int row_a,
                                               int T, int D, float mul_a, float mul_b)
{
    const int qd = threadIdx.x & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = row_a + 8 * h;
        if (row >= T) continue;
        float *y = Y + (size_t)row * row_stride;
        const float mul = h ? mul_b : mul_a;
#pragma unroll
        for (int dn = 0; dn < DMAX / 8; dn++) {
            const int d = dn * 8 + 2 * qd;
            if (d < D) y[d] = acc[dn][2 * h] * mul;
            if (d + 1 < D) y[d + 1] = acc[dn][2 * h + 1] * mul;
        }
    }
}

struct att_args {
    const void *q, *k, *v; // of the kernels' element type TE: float or mt_bf16
    const float *dout, *o, *lse, *delta;
    float *out, *lse_out, *dq, *dk, *dv, *delta_out;
    int T, Hq, Hkv, D;
    float scale, scale_log2; // 1/sqrt(D), log2(e)/sqrt(D)
    bool vec; // D % 4 == 0 and rows aligned for 4 elements: float4 (fp32) or 8-byte (bf16) loads
};

// The dK/dV chunks (see the top of this file). An item is (key tile kt, batch b, KV
// group g), items = B x Hkv of them per key tile; its nqt - kt query tiles make
// ceil((nqt - kt) / wq) chunks. CTA order: key tile, then item b * Hkv + g, then chunk.
struct att_split {
    float *ws;  // nslots x (64 x D partial dK, then 64 x D partial dV), fp32
    int items;  // B x Hkv
    int nqt;    // ceil(T / 64)
    int wq;     // query tiles per chunk
    int nslots; // CTAs of the split items (the key tiles below nqt - wq)
};

// sum of ceil(m / wq) over m = 1 .. n: the chunks of one item's last n key tiles
__host__ __device__ __forceinline__ long long att_chunks_tail(int n, int wq)
{
    const long long full = n / wq, rest = n % wq;
    return wq * full * (full + 1) / 2 + rest * (full + 1);
}

// index of the first CTA of key tile kt (all items)
__host__ __device__ __forceinline__ long long att_first_cta(const att_split &sp, int kt)
{
    return sp.items * (att_chunks_tail(sp.nqt, sp.wq) - att_chunks_tail(sp.nqt - kt, sp.wq));
}

__host__ __device__ __forceinline__ int att_chunks_of(const att_split &sp, int kt)
{
    return (sp.nqt - kt + sp.wq - 1) / sp.wq;
}

// ---------------------------------------------------------------- forward

template <int DMAX, typename TE>
__global__ void __launch_bounds__(ATT_THREADS) att_fwd_kernel(att_args a)
{
    constexpr int ST = att_shape<DMAX>::stride;
    MT_DYNAMIC_SHARED(unsigned char, att_smem);
    __nv_bfloat16 *sQ = reinterpret_cast<__nv_bfloat16 *>(att_smem);
    __nv_bfloat16 *sK = sQ + att_shape<DMAX>::tile, *sV = sK + att_shape<DMAX>::tile;
    const int qt = gridDim.x - 1 - blockIdx.x; // longest rows first
    const int h = blockIdx.y, b = blockIdx.z, g = h / (a.Hq / a.Hkv);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, qd = lane & 3;
    const int q0 = qt * ATT_BR, T = a.T;
    const size_t qs = (size_t)a.Hq * a.D, ks = (size_t)a.Hkv * a.D;
    const TE *qb = static_cast<const TE *>(a.q) + (size_t)b * T * qs + (size_t)h * a.D;
    const TE *kb = static_cast<const TE *>(a.k) + (size_t)b * T * ks + (size_t)g * a.D;
    const TE *vb = static_cast<const TE *>(a.v) + (size_t)b * T * ks + (size_t)g * a.D;

    att_load<DMAX>(sQ, qb, q0, ATT_BR, T, qs, a.D, a.vec);
    float o[DMAX / 8][4];
    att_zero<DMAX / 8>(o);
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f; // rows gr and gr + 8
    const int row_a = q0 + warp * 16 + gr, row_b = row_a + 8;

    for (int j = 0; j <= qt; j++) {
        __syncthreads(); // the previous tile's K and V are no longer read
        att_load<DMAX>(sK, kb, j * ATT_BC, ATT_BC, T, ks, a.D, a.vec);
        att_load<DMAX>(sV, vb, j * ATT_BC, ATT_BC, T, ks, a.D, a.vec);
        __syncthreads();

        float s[8][4]; // S = Q K^T, 16 rows x 64 keys per warp
        att_zero<8>(s);
        att_mma_abt<DMAX / 16, 8, ST>(s, sQ, warp * 16, sK);
        if (j == qt) { // diagonal tile: keys after the query are masked
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = j * ATT_BC + nt * 8 + 2 * qd + (e & 1);
                    if (key > (e < 2 ? row_a : row_b)) s[nt][e] = -INFINITY;
                }
        }
        // online softmax; the 4 lanes of a quad hold one row's 64 scores
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(MT_FULL_MASK, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(MT_FULL_MASK, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(MT_FULL_MASK, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(MT_FULL_MASK, mx1, 2));
        // key 0 is in tile 0 and never masked, so every row's max is finite from j = 0
        const float al0 = exp2f((m0 - mx0) * a.scale_log2), al1 = exp2f((m1 - mx1) * a.scale_log2);
        m0 = mx0;
        m1 = mx1;
        l0 *= al0;
        l1 *= al1;
#pragma unroll
        for (int i = 0; i < DMAX / 8; i++) {
            o[i][0] *= al0;
            o[i][1] *= al0;
            o[i][2] *= al1;
            o[i][3] *= al1;
        }
        const float ms0 = mx0 * a.scale_log2, ms1 = mx1 * a.scale_log2;
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            s[nt][0] = exp2f(s[nt][0] * a.scale_log2 - ms0);
            s[nt][1] = exp2f(s[nt][1] * a.scale_log2 - ms0);
            s[nt][2] = exp2f(s[nt][2] * a.scale_log2 - ms1);
            s[nt][3] = exp2f(s[nt][3] * a.scale_log2 - ms1);
            l0 += s[nt][0] + s[nt][1];
            l1 += s[nt][2] + s[nt][3];
        }
        att_mma_pb<8, DMAX / 8, ST>(o, s, sV); // O += P V; V is [key][d] = [k][n]
    }
    l0 += __shfl_xor_sync(MT_FULL_MASK, l0, 1);
    l0 += __shfl_xor_sync(MT_FULL_MASK, l0, 2);
    l1 += __shfl_xor_sync(MT_FULL_MASK, l1, 1);
    l1 += __shfl_xor_sync(MT_FULL_MASK, l1, 2);
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
    float *ob = a.out + (size_t)b * T * qs + (size_t)h * a.D;
    att_store_rows<DMAX>(ob, qs, o, row_a, T, a.D, inv0, inv1);
    if (qd == 0) {
        float *lse = a.lse_out + ((size_t)b * a.Hq + h) * T;
        if (row_a < T) lse[row_a] = m0 * a.scale + logf(l0);
        if (row_b < T) lse[row_b] = m1 * a.scale + logf(l1);
    }
}

// ---------------------------------------------------------------- backward

// delta (B,Hq,T) = rowsum(dO * O), one warp per (b, t, h) row.
__global__ void att_delta_kernel(att_args a, int B)
{
    const size_t row = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= (size_t)B * a.T * a.Hq) return;
    const float *d = a.dout + row * a.D, *o = a.o + row * a.D;
    float acc = 0.0f;
    for (int i = lane; i < a.D; i += 32) acc += d[i] * o[i];
    acc = mt_warp_sum(acc);
    const int h = (int)(row % a.Hq);
    const size_t bt = row / a.Hq;
    const int b = (int)(bt / a.T), t = (int)(bt % a.T);
    if (lane == 0) a.delta_out[((size_t)b * a.Hq + h) * a.T + t] = acc;
}

template <int DMAX, typename TE>
__global__ void __launch_bounds__(ATT_THREADS) att_dkdv_kernel(att_args a, att_split sp)
{
    constexpr int ST = att_shape<DMAX>::stride;
    constexpr int ATT_BQ = att_shape<DMAX>::bq;
    constexpr int NQ = ATT_BQ / 8; // n8 tiles of queries
    MT_DYNAMIC_SHARED(unsigned char, att_smem);
    __nv_bfloat16 *sK = reinterpret_cast<__nv_bfloat16 *>(att_smem);
    __nv_bfloat16 *sV = sK + att_shape<DMAX>::tile;
    __nv_bfloat16 *sQ = sV + att_shape<DMAX>::tile;
    __nv_bfloat16 *sO = sQ + ATT_BQ * ST; // dO
    float *sL = reinterpret_cast<float *>(sO + ATT_BQ * ST), *sD = sL + ATT_BQ;
    // this CTA's key tile: the last whose first CTA is at or below blockIdx.x
    int kt = 0;
    for (int hi = sp.nqt - 1; kt < hi;) {
        const int mid = (kt + hi + 1) / 2;
        if (att_first_cta(sp, mid) <= (long long)blockIdx.x) kt = mid;
        else hi = mid - 1;
    }
    const int nc = att_chunks_of(sp, kt), pos = (int)(blockIdx.x - att_first_cta(sp, kt));
    const int item = pos / nc, c = pos % nc, g = item % a.Hkv, b = item / a.Hkv;
    const int rep = a.Hq / a.Hkv, T = a.T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, qd = lane & 3;
    const int k0 = kt * ATT_BC;
    // this chunk's queries: tiles kt + c wq .. kt + (c + 1) wq - 1, the last chunk to T
    const int q_begin = (kt + c * sp.wq) * ATT_BC, q_end = c == nc - 1 ? T : q_begin + sp.wq * ATT_BC;
    const int nsteps = (q_end - q_begin + ATT_BQ - 1) / ATT_BQ;
    const size_t qs = (size_t)a.Hq * a.D, ks = (size_t)a.Hkv * a.D;
    const size_t kvoff = (size_t)b * T * ks + (size_t)g * a.D;

    att_load<DMAX>(sK, static_cast<const TE *>(a.k) + kvoff, k0, ATT_BC, T, ks, a.D, a.vec);
    att_load<DMAX>(sV, static_cast<const TE *>(a.v) + kvoff, k0, ATT_BC, T, ks, a.D, a.vec);
    float dk[DMAX / 8][4], dv[DMAX / 8][4];
    att_zero<DMAX / 8>(dk);
    att_zero<DMAX / 8>(dv);
    const int key_a = k0 + warp * 16 + gr, key_b = key_a + 8;

    // query steps outside, heads inside: in this order ptxas fits the kernel in fewer
    // registers (216 on sm_90 at head_dim 128, against 242 with the heads outside)
    for (int i = 0, t0 = q_begin; i < nsteps; i++, t0 += ATT_BQ) {
        for (int h = g * rep; h < (g + 1) * rep; h++) {
            const size_t qoff = (size_t)b * T * qs + (size_t)h * a.D;
            const float *lse = a.lse + ((size_t)b * a.Hq + h) * T, *delta = a.delta + ((size_t)b * a.Hq + h) * T;
            __syncthreads(); // the previous step's Q and dO are no longer read
            att_load<DMAX>(sQ, static_cast<const TE *>(a.q) + qoff, t0, ATT_BQ, T, qs, a.D, a.vec);
            att_load<DMAX>(sO, a.dout + qoff, t0, ATT_BQ, T, qs, a.D, a.vec);
            for (int r = threadIdx.x; r < ATT_BQ; r += ATT_THREADS) {
                const bool in = t0 + r < T;
                sL[r] = in ? lse[t0 + r] * ATT_LOG2E : 0.0f;
                sD[r] = in ? delta[t0 + r] : 0.0f;
            }
            __syncthreads();

            float st[NQ][4]; // S^T = K Q^T, 16 keys x BQ queries per warp
            att_zero<NQ>(st);
            att_mma_abt<DMAX / 16, NQ, ST>(st, sK, warp * 16, sQ);
            // P^T = exp(S^T / sqrt(D) - lse[query]); zero where query < key or past T
            const bool edge = t0 < k0 + ATT_BC || t0 + ATT_BQ > T;
#pragma unroll
            for (int n = 0; n < NQ; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = n * 8 + 2 * qd + (e & 1), t = t0 + col;
                    float p = exp2f(st[n][e] * a.scale_log2 - sL[col]);
                    if (edge && (t < (e < 2 ? key_a : key_b) || t >= T)) p = 0.0f;
                    st[n][e] = p;
                }
            att_mma_pb<NQ, DMAX / 8, ST>(dv, st, sO); // dV += P^T dO; dO is [query][d] = [k][n]
            float dp[NQ][4];                          // dP^T = V dO^T, then dS^T in its place
            att_zero<NQ>(dp);
            att_mma_abt<DMAX / 16, NQ, ST>(dp, sV, warp * 16, sO);
#pragma unroll
            for (int n = 0; n < NQ; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) dp[n][e] = st[n][e] * (dp[n][e] - sD[n * 8 + 2 * qd + (e & 1)]);
            att_mma_pb<NQ, DMAX / 8, ST>(dk, dp, sQ); // dK += dS^T Q; Q is [query][d] = [k][n]
        }
    }
    // an item of one chunk stores dK and dV; a chunk of a split item its partial sums,
    // in its workspace slot (rows relative to k0, D floats a row), for the reduce kernel
    float *yk, *yv, mk;
    size_t ys;
    if ((int)blockIdx.x < sp.nslots) {
        yk = sp.ws + (size_t)blockIdx.x * 2 * ATT_BC * a.D;
        yv = yk + (size_t)ATT_BC * a.D;
        ys = a.D;
        mk = 1.0f;
    } else {
        yk = a.dk + kvoff + (size_t)k0 * ks;
        yv = a.dv + kvoff + (size_t)k0 * ks;
        ys = ks;
        mk = a.scale;
    }
    att_store_rows<DMAX>(yk, ys, dk, key_a - k0, T - k0, a.D, mk, mk);
    att_store_rows<DMAX>(yv, ys, dv, key_a - k0, T - k0, a.D, 1.0f, 1.0f);
}

// dK, dV of the split items: the sum of their chunks' partials, in chunk order. One
// thread per (key, d) of 64 keys; grid (ceil(64 D / 256), split items), the split
// items kt * items + item for the key tiles kt below nqt - wq.
__global__ void att_dkdv_reduce_kernel(att_args a, att_split sp)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x, kt = blockIdx.y / sp.items, item = blockIdx.y % sp.items;
    const int row = e / a.D, d = e % a.D, key = kt * ATT_BC + row;
    if (row >= ATT_BC || key >= a.T) return;
    const int nc = att_chunks_of(sp, kt);
    const size_t slot = 2 * (size_t)ATT_BC * a.D;
    const float *p = sp.ws + (size_t)(att_first_cta(sp, kt) + (long long)item * nc) * slot + e;
    float sk = 0.0f, sv = 0.0f;
    for (int c = 0; c < nc; c++) {
        sk += p[c * slot];
        sv += p[c * slot + (size_t)ATT_BC * a.D];
    }
    const int g = item % a.Hkv, b = item / a.Hkv;
    const size_t o = ((size_t)b * a.T + key) * a.Hkv * a.D + (size_t)g * a.D + d;
    a.dk[o] = sk * a.scale;
    a.dv[o] = sv;
}

template <int DMAX, typename TE>
__global__ void __launch_bounds__(ATT_THREADS) att_dq_kernel(att_args a)
{
    constexpr int ST = att_shape<DMAX>::stride;
    MT_DYNAMIC_SHARED(unsigned char, att_smem);
    __nv_bfloat16 *sQ = reinterpret_cast<__nv_bfloat16 *>(att_smem);
    __nv_bfloat16 *sO = sQ + att_shape<DMAX>::tile; // dO
    __nv_bfloat16 *sK = sO + att_shape<DMAX>::tile, *sV = sK + att_shape<DMAX>::tile;
    const int qt = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, g = h / (a.Hq / a.Hkv), T = a.T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, qd = lane & 3;
    const int q0 = qt * ATT_BR;
    const size_t qs = (size_t)a.Hq * a.D, ks = (size_t)a.Hkv * a.D;
    const size_t qoff = (size_t)b * T * qs + (size_t)h * a.D;
    const size_t kvoff = (size_t)b * T * ks + (size_t)g * a.D;
    att_load<DMAX>(sQ, static_cast<const TE *>(a.q) + qoff, q0, ATT_BR, T, qs, a.D, a.vec);
    att_load<DMAX>(sO, a.dout + qoff, q0, ATT_BR, T, qs, a.D, a.vec);
    const int row_a = q0 + warp * 16 + gr, row_b = row_a + 8;
    const float *lse = a.lse + ((size_t)b * a.Hq + h) * T, *delta = a.delta + ((size_t)b * a.Hq + h) * T;
    const float la = row_a < T ? lse[row_a] * ATT_LOG2E : 0.0f, lb = row_b < T ? lse[row_b] * ATT_LOG2E : 0.0f;
    const float da = row_a < T ? delta[row_a] : 0.0f, db = row_b < T ? delta[row_b] : 0.0f;
    float dq[DMAX / 8][4];
    att_zero<DMAX / 8>(dq);

    for (int j = 0; j <= qt; j++) {
        __syncthreads();
        att_load<DMAX>(sK, static_cast<const TE *>(a.k) + kvoff, j * ATT_BC, ATT_BC, T, ks, a.D, a.vec);
        att_load<DMAX>(sV, static_cast<const TE *>(a.v) + kvoff, j * ATT_BC, ATT_BC, T, ks, a.D, a.vec);
        __syncthreads();
        float s[8][4], dp[8][4]; // S = Q K^T, dP = dO V^T: 16 rows x 64 keys per warp
        att_zero<8>(s);
        att_zero<8>(dp);
        att_mma_abt<DMAX / 16, 8, ST>(s, sQ, warp * 16, sK);
        att_mma_abt<DMAX / 16, 8, ST>(dp, sO, warp * 16, sV);
        const bool diag = j == qt;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = j * ATT_BC + nt * 8 + 2 * qd + (e & 1), row = e < 2 ? row_a : row_b;
                float p = exp2f(s[nt][e] * a.scale_log2 - (e < 2 ? la : lb));
                if ((diag && key > row) || row >= T) p = 0.0f;
                dp[nt][e] = p * (dp[nt][e] - (e < 2 ? da : db));
            }
        att_mma_pb<8, DMAX / 8, ST>(dq, dp, sK); // dQ += dS K; K is [key][d] = [k][n]
    }
    att_store_rows<DMAX>(a.dq + qoff, qs, dq, row_a, T, a.D, a.scale, a.scale);
}

// ---------------------------------------------------------------- host side

template <int DMAX>
static size_t fwd_smem() { return 3 * (size_t)att_shape<DMAX>::tile * sizeof(__nv_bfloat16); }
template <int DMAX>
static size_t dq_smem() { return 4 * (size_t)att_shape<DMAX>::tile * sizeof(__nv_bfloat16); }
template <int DMAX>
static size_t dkdv_smem()
{
    constexpr int bq = att_shape<DMAX>::bq;
    return (2 * (size_t)att_shape<DMAX>::tile + 2 * (size_t)bq * att_shape<DMAX>::stride) * sizeof(__nv_bfloat16) +
           2 * bq * sizeof(float);
}

// Raises a kernel's dynamic shared memory limit once, when it needs more than 48 KB.
static void allow_smem(const void *kernel, size_t bytes, bool *done)
{
    if (*done || bytes <= (48u << 10)) return;
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    *done = true;
}

template <int DMAX, typename T>
static void launch_fwd(mt_cuda_ctx *c, const att_args &a, int B)
{
    static bool done = false;
    allow_smem((const void *)att_fwd_kernel<DMAX, T>, fwd_smem<DMAX>(), &done);
    dim3 grid(mt_cdiv(a.T, ATT_BR), a.Hq, B);
    MT_LAUNCH(grid, ATT_THREADS, fwd_smem<DMAX>(), c->stream, att_fwd_kernel<DMAX, T>)(a);
    MT_CUDA_LAUNCHED();
}

// The dK/dV chunks of a shape (the top of this file): wq query tiles per chunk, the
// whole work (B Hkv nqt (nqt + 1) / 2 tile steps of one head) in about ATT_DKDV_CHUNKS
// chunks; the workspace slots are the CTAs of the key tiles below nqt - wq, the ones
// cut into more than one chunk. Sets the CTA count.
static att_split dkdv_plan(int B, int T, int Hkv, long long *ctas)
{
    att_split sp = {};
    sp.items = B * Hkv;
    sp.nqt = (int)mt_cdiv(T, ATT_BC);
    const long long steps = (long long)sp.items * sp.nqt * (sp.nqt + 1) / 2;
    sp.wq = (int)((steps + ATT_DKDV_CHUNKS - 1) / ATT_DKDV_CHUNKS);
    if (sp.wq > sp.nqt) sp.wq = sp.nqt; // one chunk an item
    *ctas = att_first_cta(sp, sp.nqt);
    const long long slots = att_first_cta(sp, sp.nqt - sp.wq);
    if (*ctas > 0x7fffffff) {
        char msg[128];
        snprintf(msg, sizeof msg, "%lld CTAs for dK/dV (B %d, T %d, Hkv %d) exceed the grid's 2^31 - 1", *ctas, B, T,
                 Hkv);
        mt_cuda_fatal(__FILE__, __LINE__, "attention_bwd", msg);
    }
    sp.nslots = (int)slots;
    return sp;
}

template <int DMAX, typename T>
static void launch_bwd(mt_cuda_ctx *c, const att_args &a, int B)
{
    static bool done_kv = false, done_q = false;
    allow_smem((const void *)att_dkdv_kernel<DMAX, T>, dkdv_smem<DMAX>(), &done_kv);
    allow_smem((const void *)att_dq_kernel<DMAX, T>, dq_smem<DMAX>(), &done_q);
    long long ctas;
    att_split sp = dkdv_plan(B, a.T, a.Hkv, &ctas);
    // the partials: nslots x 2 x 64 x D floats (54.6 MiB at the shipped layout), from the
    // caching allocator, so a training step reuses the same block
    const size_t ws_bytes = (size_t)sp.nslots * 2 * ATT_BC * a.D * sizeof(float);
    sp.ws = ws_bytes ? (float *)mt_cuda_scratch(c, ws_bytes) : NULL;
    MT_LAUNCH((unsigned)ctas, ATT_THREADS, dkdv_smem<DMAX>(), c->stream, att_dkdv_kernel<DMAX, T>)(a, sp);
    MT_CUDA_LAUNCHED();
    if (sp.nslots) {
        // at most ATT_DKDV_CHUNKS split items: each has a chunk of wq tiles, and there
        // are no more of those than steps / wq
        dim3 grid_r(mt_cdiv((size_t)ATT_BC * a.D, 256), (sp.nqt - sp.wq) * sp.items);
        MT_LAUNCH(grid_r, 256, 0, c->stream, att_dkdv_reduce_kernel)(a, sp);
        MT_CUDA_LAUNCHED();
        mt_cuda_scratch_free(c, sp.ws);
    }
    dim3 grid_q(mt_cdiv(a.T, ATT_BR), a.Hq, B);
    MT_LAUNCH(grid_q, ATT_THREADS, dq_smem<DMAX>(), c->stream, att_dq_kernel<DMAX, T>)(a);
    MT_CUDA_LAUNCHED();
}

static int dmax_of(int D)
{
    if (D <= 32) return 32;
    if (D <= 64) return 64;
    if (D <= 128) return 128;
    char msg[96];
    snprintf(msg, sizeof msg, "head_dim %d is above the 128 this kernel supports", D);
    mt_cuda_fatal(__FILE__, __LINE__, "attention", msg);
}

// The typed inputs of both passes. q, k and v of one dtype go to the kernels as they
// are (att_load rounds fp32 on its way to shared memory, copies bf16). Of mixed dtypes,
// which the model never passes, the fp32 ones are rounded to bf16 in scratch first:
// the values att_load would have stored, so the result is the same.
struct att_inputs {
    att_args a;
    bool bf16;
    void *tmp[3];
};

static att_inputs make_args(mt_cuda_ctx *c, const char *op, const mt_tensor &q, const mt_tensor &k,
                            const mt_tensor &v, int T, int Hq, int Hkv, int D)
{
    mt_cuda_tensor_check(op, "q", q, true), mt_cuda_tensor_check(op, "k", k, true);
    mt_cuda_tensor_check(op, "v", v, true);
    att_inputs in = {};
    in.bf16 = q.dtype == MT_BF16 || k.dtype == MT_BF16 || v.dtype == MT_BF16;
    const mt_tensor *t[3] = {&q, &k, &v};
    const void *p[3];
    for (int i = 0; i < 3; i++) {
        p[i] = t[i]->data;
        if (in.bf16 && t[i]->dtype == MT_F32) {
            mt_tensor d = mt_tview(NULL, MT_BF16, t[i]->rows, t[i]->cols);
            in.tmp[i] = d.data = mt_cuda_scratch(c, mt_tensor_bytes(d));
            mt_cuda_convert(c, d, *t[i]);
            p[i] = d.data;
        }
    }
    att_args &a = in.a;
    a.q = p[0];
    a.k = p[1];
    a.v = p[2];
    a.T = T;
    a.Hq = Hq;
    a.Hkv = Hkv;
    a.D = D;
    a.scale = 1.0f / sqrtf((float)D);
    a.scale_log2 = a.scale * ATT_LOG2E;
    const enum mt_dtype dt = in.bf16 ? MT_BF16 : MT_F32;
    a.vec = D % 4 == 0 && mt_aligned4(a.q, dt) && mt_aligned4(a.k, dt) && mt_aligned4(a.v, dt);
    return in;
}

static void free_inputs(mt_cuda_ctx *c, const att_inputs &in)
{
    for (void *p : in.tmp)
        if (p) mt_cuda_scratch_free(c, p);
}

template <typename T>
static void attention_fwd(mt_cuda_ctx *c, const att_args &a, int B)
{
    switch (dmax_of(a.D)) {
    case 32: launch_fwd<32, T>(c, a, B); break;
    case 64: launch_fwd<64, T>(c, a, B); break;
    default: launch_fwd<128, T>(c, a, B); break;
    }
}

template <typename T>
static void attention_bwd(mt_cuda_ctx *c, const att_args &a, int B)
{
    switch (dmax_of(a.D)) {
    case 32: launch_bwd<32, T>(c, a, B); break;
    case 64: launch_bwd<64, T>(c, a, B); break;
    default: launch_bwd<128, T>(c, a, B); break;
    }
}

extern "C" void mt_cuda_attention_fwd(void *ctx, float *out, float *lse, struct mt_tensor q, struct mt_tensor k,
                                      struct mt_tensor v, int B, int T, int Hq, int Hkv, int D)
{
    MT_CUDA_OP(ctx, MT_OP_ATTENTION_FWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (B <= 0 || T <= 0 || Hq <= 0 || D <= 0) return;
    att_inputs in = make_args(c, "attention_fwd", q, k, v, T, Hq, Hkv, D);
    in.a.out = out;
    in.a.lse_out = lse;
    if (in.bf16) attention_fwd<mt_bf16>(c, in.a, B);
    else attention_fwd<float>(c, in.a, B);
    free_inputs(c, in);
}

extern "C" void mt_cuda_attention_bwd(void *ctx, float *dq, float *dk, float *dv, const float *dout,
                                      struct mt_tensor q, struct mt_tensor k, struct mt_tensor v, const float *out,
                                      const float *lse, int B, int T, int Hq, int Hkv, int D)
{
    MT_CUDA_OP(ctx, MT_OP_ATTENTION_BWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (B <= 0 || T <= 0 || Hq <= 0 || D <= 0) return;
    att_inputs in = make_args(c, "attention_bwd", q, k, v, T, Hq, Hkv, D);
    att_args &a = in.a;
    const size_t rows = (size_t)B * T * Hq;
    a.lse = lse;
    a.o = out;
    float *delta = (float *)mt_cuda_scratch(c, sizeof(float) * rows);
    a.dout = dout;
    a.delta_out = delta;
    MT_LAUNCH(mt_cdiv(rows, 8), 256, 0, c->stream, att_delta_kernel)(a, B);
    MT_CUDA_LAUNCHED();
    a.delta = delta;
    a.dq = dq;
    a.dk = dk;
    a.dv = dv;
    a.vec = a.vec && ((uintptr_t)dout & 15) == 0;
    if (in.bf16) attention_bwd<mt_bf16>(c, a, B);
    else attention_bwd<float>(c, a, B);
    mt_cuda_scratch_free(c, delta);
    free_inputs(c, in);
}

// CUDA backend: embedding, RMSNorm, RoPE, SwiGLU, add.
//
// Each op is one pass over its tensors (fused forward and backward statistics, 4-element
// accesses where the shapes allow). Typed tensors (kernels.h) are read and written in
// their own dtype by the kernels themselves (templates on the element types, through
// mt_ld/mt_st of cuda_common.cuh): a bf16 input widens exactly, the arithmetic is the
// fp32 arithmetic of fp32 inputs, in the same order, and a bf16 output is its result
// rounded to nearest even, as the CPU reference defines it. Parameter gradients (embedding, RMSNorm weight)
// are reduced without atomics, in an order fixed by the shapes alone, so results are
// the same run to run. The embedding gradient and RoPE are bit-identical to the CPU
// reference: same operations, same order, no contraction into FMA.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_qrow.cuh"

#include <math.h>
#include <stdlib.h>

#include <cub/device/device_radix_sort.cuh>

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// The checks every typed argument of these ops gets (dense, fp32 or bf16).
static void check(const char *op, const char *arg, const mt_tensor &t) { mt_cuda_tensor_check(op, arg, t, true); }

// ---------------------------------------------------------------- embedding

// out (N,C) = wte[tokens]: one block per token row; a token of another vocabulary shard
// (-1) gives a zero row.
template <typename TO, typename TW, bool VEC>
__global__ static void embedding_fwd_kernel(TO *out, const int32_t *tokens, const TW *wte, int C)
{
    const size_t n = blockIdx.x;
    const int tok = tokens[n];
    const TW *src = wte + (size_t)(tok < 0 ? 0 : tok) * C;
    TO *dst = out + n * C;
    if (VEC) {
        for (int c = threadIdx.x; c < C / 4; c += blockDim.x)
            mt_st4(dst, c, tok < 0 ? make_float4(0.f, 0.f, 0.f, 0.f) : mt_ld4(src, c));
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) mt_st(dst, c, tok < 0 ? 0.0f : mt_ld(src, c));
    }
}

extern "C" void mt_cuda_embedding_fwd(void *ctx, struct mt_tensor out, const int32_t *tokens,
                                      struct mt_tensor wte, int N, int C)
{
    MT_CUDA_OP(ctx, MT_OP_EMBEDDING_FWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    check("embedding_fwd", "out", out), check("embedding_fwd", "wte", wte);
    if (N <= 0 || C <= 0) return;
    const bool vec = C % 4 == 0 && mt_aligned4(out.data, out.dtype) && mt_aligned4(wte.data, wte.dtype);
    mt_with_elem(out.dtype, [&](auto o) {
        mt_with_elem(wte.dtype, [&](auto w) {
            using TO = MT_ELEM(o);
            using TW = MT_ELEM(w);
            TO *po = (TO *)out.data;
            const TW *pw = (const TW *)wte.data;
            if (vec) MT_LAUNCH(N, 128, 0, c->stream, embedding_fwd_kernel<TO, TW, true>)(po, tokens, pw, C);
            else MT_LAUNCH(N, 128, 0, c->stream, embedding_fwd_kernel<TO, TW, false>)(po, tokens, pw, C);
        });
    });
    MT_CUDA_LAUNCHED();
}

// After a stable sort of the token ids, each run of equal ids lists its token rows in
// increasing order; the block at the start of a run adds them to the row of dwte in
// that order, which is exactly the CPU's sequence of additions. Negative ids (tokens
// of another vocabulary shard) sort first and are skipped.
__global__ static void embedding_bwd_kernel(float *dwte, const float *dout, const int32_t *sorted_tok,
                                            const int32_t *sorted_row, int N, int C)
{
    const int i = blockIdx.x;
    const int tok = sorted_tok[i];
    if (tok < 0 || (i > 0 && sorted_tok[i - 1] == tok)) return;
    int end = i + 1;
    while (end < N && sorted_tok[end] == tok) end++;
    float *row = dwte + (size_t)tok * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = row[c];
        for (int j = i; j < end; j++) acc += dout[(size_t)sorted_row[j] * C + c];
        row[c] = acc;
    }
}

extern "C" void mt_cuda_embedding_bwd(void *ctx, float *dwte, const float *dout, const int32_t *tokens,
                                      int N, int C)
{
    MT_CUDA_OP(ctx, MT_OP_EMBEDDING_BWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (N <= 0 || C <= 0) return;
    int32_t *buf = (int32_t *)mt_cuda_scratch(c, sizeof(int32_t) * 3 * (size_t)N);
    int32_t *rows_in = buf, *tok_out = buf + N, *rows_out = buf + 2 * (size_t)N;
    MT_LAUNCH(mt_cdiv(N, 256), 256, 0, c->stream, mt_iota_kernel)(rows_in, N);
    MT_CUDA_LAUNCHED();
    size_t temp_bytes = 0;
    MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, tokens, tok_out, rows_in, rows_out, N,
                                                  0, 32, c->stream));
    void *temp = mt_cuda_scratch(c, temp_bytes);
    MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, tok_out, rows_in, rows_out, N,
                                                  0, 32, c->stream));
    MT_LAUNCH(N, 128, 0, c->stream, embedding_bwd_kernel)(dwte, dout, tok_out, rows_out, N, C);
    MT_CUDA_LAUNCHED();
    mt_cuda_scratch_free(c, temp);
    mt_cuda_scratch_free(c, buf);
}

// ---------------------------------------------------------------- RMSNorm

// One warp per row: out = x r w, r = 1 / sqrt(mean(x^2) + eps), in the CPU's order of
// operations ((x r) w); the sum of squares is a lane-strided sum and a warp tree. Q: the
// warp also emits q, the quantisation of its row of out (q_row_warp), from the values
// it stores.
template <typename TO, typename TX, typename TW, bool Q>
__global__ static void rmsnorm_fwd_kernel(TO *out, float *rstd, const TX *x, const TW *w, int N, int C, float eps,
                                          mt_cuda_qrow q)
{
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const TX *xr = x + (size_t)row * C;
    TO *o = out + (size_t)row * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float v = mt_ld(xr, c);
        ss += v * v;
    }
    ss = mt_warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (Q) q_row_warp(q, row, C, [&](int j) { return mt_st_get(o, j, mt_ld(xr, j) * r * mt_ld(w, j)); });
    else
        for (int j = lane; j < C; j += 32) mt_st(o, j, mt_ld(xr, j) * r * mt_ld(w, j));
    if (lane == 0) rstd[row] = r;
}

// rmsnorm_fwd, and with qf (the op of struct mt_quant_ops) the quantisation of out.
static void rmsnorm_fwd(mt_cuda_ctx *c, const mt_cuda_qrow *qf, struct mt_tensor out, float *rstd,
                        struct mt_tensor x, struct mt_tensor w, int N, int C, float eps)
{
    check("rmsnorm_fwd", "out", out), check("rmsnorm_fwd", "x", x), check("rmsnorm_fwd", "w", w);
    if (N <= 0 || C <= 0) return;
    const mt_cuda_qrow q = qf ? *qf : mt_cuda_qrow{};
    mt_with_elem(out.dtype, [&](auto o) {
        mt_with_elem(x.dtype, [&](auto xt) {
            mt_with_elem(w.dtype, [&](auto wt) {
                using TO = MT_ELEM(o);
                using TX = MT_ELEM(xt);
                using TW = MT_ELEM(wt);
                TO *po = (TO *)out.data;
                const TX *px = (const TX *)x.data;
                const TW *pw = (const TW *)w.data;
                if (qf) MT_LAUNCH(mt_cdiv(N, 8), 256, 0, c->stream, rmsnorm_fwd_kernel<TO, TX, TW, true>)(
                    po, rstd, px, pw, N, C, eps, q);
                else MT_LAUNCH(mt_cdiv(N, 8), 256, 0, c->stream, rmsnorm_fwd_kernel<TO, TX, TW, false>)(
                    po, rstd, px, pw, N, C, eps, q);
            });
        });
    });
    MT_CUDA_LAUNCHED();
}

extern "C" void mt_cuda_rmsnorm_fwd(void *ctx, struct mt_tensor out, float *rstd, struct mt_tensor x,
                                    struct mt_tensor w, int N, int C, float eps)
{
    MT_CUDA_OP(ctx, MT_OP_RMSNORM_FWD);
    rmsnorm_fwd(mt_cuda(ctx), nullptr, out, rstd, x, w, N, C, eps);
}

extern "C" void mt_cuda_rmsnorm_fwd_q(void *ctx, const struct mt_quant_spec *s, void *fused, struct mt_tensor out,
                                      float *rstd, struct mt_tensor x, struct mt_tensor w, int N, int C, float eps)
{
    MT_CUDA_OP(ctx, MT_OP_RMSNORM_FWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    const mt_cuda_qrow q = mt_cuda_qrow_place("rmsnorm_fwd", s, fused, N, C, c->stream);
    c->lowp.fused++;
    rmsnorm_fwd(c, &q, out, rstd, x, w, N, C, eps);
}

// dx += r w dy - x r^3 <w dy, x> / C per row; the weight gradient dw[c] = sum_n dy x r
// is summed per chunk of rows into partial (nchunks, C) by the thread that owns column
// c, in row order, then reduced over chunks by rmsnorm_dw_kernel. The chunking depends
// on N only, so the sum order is fixed.
template <typename TX, typename TW>
__global__ static void rmsnorm_bwd_kernel(float *dx, float *partial, const float *dout, const TX *x, const TW *w,
                                          const float *rstd, int N, int C, int rows_per_chunk)
{
    MT_DYNAMIC_SHARED(float, part); // (C): column c belongs to thread c % blockDim.x
    MT_SHARED(float, red, [32]);
    const int n0 = blockIdx.x * rows_per_chunk;
    const int n1 = min(N, n0 + rows_per_chunk);
    for (int c = threadIdx.x; c < C; c += blockDim.x) part[c] = 0.0f;
    for (int n = n0; n < n1; n++) {
        const TX *xn = x + (size_t)n * C;
        const float *dn = dout + (size_t)n * C;
        float *dxn = dx + (size_t)n * C;
        const float r = rstd[n];
        float dot = 0.0f;
        for (int c = threadIdx.x; c < C; c += blockDim.x) dot += mt_ld(w, c) * dn[c] * mt_ld(xn, c);
        dot = mt_block_sum(dot, red);
        const float k = dot * r * r * r / (float)C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            const float xc = mt_ld(xn, c);
            dxn[c] += r * mt_ld(w, c) * dn[c] - k * xc;
            part[c] += dn[c] * xc * r;
        }
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) partial[(size_t)blockIdx.x * C + c] = part[c];
}

// dw[c] += sum over chunks of partial[chunk][c]: 32 columns x 8 chunk slices per block,
// each slice strided, then the 8 slice sums in order.
__global__ static void rmsnorm_dw_kernel(float *dw, const float *partial, int nchunks, int C)
{
    MT_SHARED(float, s, [8][33]);
    const int c = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (c < C)
        for (int k = threadIdx.y; k < nchunks; k += 8) acc += partial[(size_t)k * C + c];
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float sum = 0.0f;
        for (int y = 0; y < 8; y++) sum += s[y][threadIdx.x];
        dw[c] += sum;
    }
}

// The dynamic shared memory rmsnorm_bwd_kernel<TX, TW> may use, raised to the device's
// opt-in limit once per instantiation when a row needs more than the default 48 KB.
template <typename TX, typename TW>
static void rmsnorm_bwd_smem(const mt_cuda_ctx *c, size_t smem)
{
    static size_t smem_set = 48 << 10;
    if (smem <= smem_set) return;
    MT_CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_bwd_kernel<TX, TW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)c->smem_optin));
    smem_set = c->smem_optin;
}

extern "C" void mt_cuda_rmsnorm_bwd(void *ctx, float *dx, float *dw, const float *dout, struct mt_tensor x,
                                    struct mt_tensor w, const float *rstd, int N, int C)
{
    MT_CUDA_OP(ctx, MT_OP_RMSNORM_BWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    check("rmsnorm_bwd", "x", x), check("rmsnorm_bwd", "w", w);
    if (N <= 0 || C <= 0) return;
    const size_t smem = sizeof(float) * (size_t)C;
    if (smem > c->smem_optin)
        mt_cuda_fatal(__FILE__, __LINE__, "rmsnorm_bwd", "row too wide for the per-column partial sums");
    const int rows_per_chunk = (N + 1023) / 1024 > 32 ? (N + 1023) / 1024 : 32; // <= 1024 chunks
    const int nchunks = (N + rows_per_chunk - 1) / rows_per_chunk;
    const int threads = C >= 1024 ? 256 : C >= 256 ? 128 : 32;
    float *partial = (float *)mt_cuda_scratch(c, sizeof(float) * (size_t)nchunks * C);
    mt_with_elem(x.dtype, [&](auto xt) {
        mt_with_elem(w.dtype, [&](auto wt) {
            using TX = MT_ELEM(xt);
            using TW = MT_ELEM(wt);
            rmsnorm_bwd_smem<TX, TW>(c, smem);
            MT_LAUNCH(nchunks, threads, smem, c->stream, rmsnorm_bwd_kernel<TX, TW>)(
                dx, partial, dout, (const TX *)x.data, (const TW *)w.data, rstd, N, C, rows_per_chunk);
        });
    });
    MT_CUDA_LAUNCHED();
    MT_LAUNCH(mt_cdiv(C, 32), dim3(32, 8), 0, c->stream, rmsnorm_dw_kernel)(dw, partial, nchunks, C);
    MT_CUDA_LAUNCHED();
    mt_cuda_scratch_free(c, partial);
}

// ---------------------------------------------------------------- RoPE

// The cos/sin table (T, D/2, 2) of the CPU reference, computed on the host by the same
// code (fp64 inverse frequency rounded to fp32, fp32 angle, libm cosf/sinf) and kept
// on the device for the last (T, D, theta): the model calls RoPE with one shape.
static const float *rope_table(mt_cuda_ctx *c, int T, int D, float theta)
{
    if (c->rope_tab && c->rope_T == T && c->rope_D == D && c->rope_theta == theta) return c->rope_tab;
    const int half = D / 2;
    const size_t n = 2 * (size_t)T * half;
    float *host = (float *)malloc(sizeof(float) * n);
    if (!host) mt_cuda_fatal(__FILE__, __LINE__, "rope", "out of host memory for the cos/sin table");
    for (int i = 0; i < half; i++) {
        float inv = (float)(1.0 / pow((double)theta, (double)(2 * i) / (double)D));
        for (int t = 0; t < T; t++) {
            float ang = (float)t * inv;
            host[((size_t)t * half + i) * 2] = cosf(ang);
            host[((size_t)t * half + i) * 2 + 1] = sinf(ang);
        }
    }
    if (c->rope_tab) mt_cuda_free(c, c->rope_tab);
    c->rope_tab = (float *)mt_cuda_scratch(c, sizeof(float) * n);
    MT_CUDA_CHECK(cudaMemcpyAsync(c->rope_tab, host, sizeof(float) * n, cudaMemcpyHostToDevice, c->stream));
    mt_cuda_note_sync(c);
    MT_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    free(host);
    c->rope_T = T;
    c->rope_D = D;
    c->rope_theta = theta;
    return c->rope_tab;
}

// One thread per (row, i < D/2): the pair (i, i + D/2) rotated by the angle of the
// row's position; sign -1 rotates back (the transpose). out may alias x.
template <typename TO, typename TX>
__global__ static void rope_kernel(TO *out, const TX *x, const float *tab, size_t pairs, int T, int H, int half,
                                   float sign)
{
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= pairs) return;
    const int i = (int)(idx % half);
    const size_t row = idx / half; // (b, t, h)
    const int t = (int)((row / H) % T);
    const float c = tab[((size_t)t * half + i) * 2];
    const float s = sign * tab[((size_t)t * half + i) * 2 + 1];
    const size_t base = row * 2 * half;
    const float x1 = mt_ld(x, base + i), x2 = mt_ld(x, base + i + half);
    mt_st(out, base + i, __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
    mt_st(out, base + i + half, __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

template <typename TO, typename TX>
static void rope(mt_cuda_ctx *c, TO *out, const TX *x, int B, int T, int H, int D, float theta, float sign)
{
    if (B <= 0 || T <= 0 || H <= 0 || D <= 1) return;
    const float *tab = rope_table(c, T, D, theta);
    const size_t pairs = (size_t)B * T * H * (D / 2);
    MT_LAUNCH(mt_cdiv(pairs, 256), 256, 0, c->stream, rope_kernel<TO, TX>)(out, x, tab, pairs, T, H, D / 2, sign);
    MT_CUDA_LAUNCHED();
}

extern "C" void mt_cuda_rope_fwd(void *ctx, struct mt_tensor out, struct mt_tensor x, int B, int T, int H,
                                 int D, float theta)
{
    MT_CUDA_OP(ctx, MT_OP_ROPE_FWD);
    check("rope_fwd", "out", out), check("rope_fwd", "x", x);
    mt_with_elem(out.dtype, [&](auto o) {
        mt_with_elem(x.dtype, [&](auto xt) {
            using TO = MT_ELEM(o);
            using TX = MT_ELEM(xt);
            rope(mt_cuda(ctx), (TO *)out.data, (const TX *)x.data, B, T, H, D, theta, 1.0f);
        });
    });
}

extern "C" void mt_cuda_rope_bwd(void *ctx, float *dx, const float *dout, int B, int T, int H, int D,
                                 float theta)
{
    MT_CUDA_OP(ctx, MT_OP_ROPE_BWD);
    rope(mt_cuda(ctx), dx, dout, B, T, H, D, theta, -1.0f);
}

// ---------------------------------------------------------------- SwiGLU, add

__device__ __forceinline__ float swiglu(float g, float u) { return g * mt_sigmoid(g) * u; }

template <typename TO, typename TG, typename TU, bool VEC>
__global__ static void swiglu_fwd_kernel(TO *out, const TG *gate, const TU *up, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (VEC) {
        if (i >= n / 4) return;
        const float4 g = mt_ld4(gate, i), u = mt_ld4(up, i);
        mt_st4(out, i, make_float4(swiglu(g.x, u.x), swiglu(g.y, u.y), swiglu(g.z, u.z), swiglu(g.w, u.w)));
    } else {
        if (i >= n) return;
        mt_st(out, i, swiglu(mt_ld(gate, i), mt_ld(up, i)));
    }
}

__device__ __forceinline__ void swiglu_grad(float d, float g, float u, float *dg, float *du)
{
    const float s = mt_sigmoid(g);
    *dg = d * u * s * (1.0f + g * (1.0f - s));
    *du = d * (g * s);
}

template <typename TG, typename TU, bool VEC>
__global__ static void swiglu_bwd_kernel(float *dgate, float *dup, const float *dout, const TG *gate, const TU *up,
                                         size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (VEC) {
        if (i >= n / 4) return;
        const float4 d = mt_ld4(dout, i), g = mt_ld4(gate, i), u = mt_ld4(up, i);
        float4 a, b;
        swiglu_grad(d.x, g.x, u.x, &a.x, &b.x);
        swiglu_grad(d.y, g.y, u.y, &a.y, &b.y);
        swiglu_grad(d.z, g.z, u.z, &a.z, &b.z);
        swiglu_grad(d.w, g.w, u.w, &a.w, &b.w);
        mt_st4(dgate, i, a);
        mt_st4(dup, i, b);
    } else {
        if (i >= n) return;
        swiglu_grad(dout[i], mt_ld(gate, i), mt_ld(up, i), dgate + i, dup + i);
    }
}

template <typename TO, typename TA, typename TB, bool VEC>
__global__ static void add_kernel(TO *out, const TA *a, const TB *b, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (VEC) {
        if (i >= n / 4) return;
        const float4 x = mt_ld4(a, i), y = mt_ld4(b, i);
        mt_st4(out, i, make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w));
    } else {
        if (i < n) mt_st(out, i, mt_ld(a, i) + mt_ld(b, i));
    }
}

// One thread per element, or per 4 (VEC) when n is a multiple of 4 and every pointer is
// aligned for it.
static unsigned elementwise_grid(size_t n, bool vec) { return mt_cdiv(vec ? n / 4 : n, 256); }

// swiglu_fwd_kernel's (N, F) rows with the quantisation of out (q_row_warp): a warp a row.
template <typename TO, typename TG, typename TU>
__global__ static void swiglu_fwd_q_kernel(TO *out, const TG *gate, const TU *up, int N, int F, mt_cuda_qrow q)
{
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const size_t r0 = (size_t)row * F;
    q_row_warp(q, row, F, [&](int j) { return mt_st_get(out, r0 + j, swiglu(mt_ld(gate, r0 + j), mt_ld(up, r0 + j))); });
}

extern "C" void mt_cuda_swiglu_fwd_q(void *ctx, const struct mt_quant_spec *s, void *fused, struct mt_tensor out,
                                     struct mt_tensor gate, struct mt_tensor up, int N, int F)
{
    MT_CUDA_OP(ctx, MT_OP_SWIGLU_FWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    check("swiglu_fwd", "out", out), check("swiglu_fwd", "gate", gate), check("swiglu_fwd", "up", up);
    if (N <= 0 || F <= 0) return;
    const mt_cuda_qrow q = mt_cuda_qrow_place("swiglu_fwd", s, fused, N, F, c->stream);
    c->lowp.fused++;
    mt_with_elem3(out.dtype, gate.dtype, up.dtype, [&](auto o, auto g, auto u) {
        using TO = MT_ELEM(o);
        using TG = MT_ELEM(g);
        using TU = MT_ELEM(u);
        MT_LAUNCH(mt_cdiv(N, 8), 256, 0, c->stream, swiglu_fwd_q_kernel<TO, TG, TU>)(
            (TO *)out.data, (const TG *)gate.data, (const TU *)up.data, N, F, q);
    });
    MT_CUDA_LAUNCHED();
}

extern "C" void mt_cuda_swiglu_fwd(void *ctx, struct mt_tensor out, struct mt_tensor gate, struct mt_tensor up,
                                   int N, int F)
{
    MT_CUDA_OP(ctx, MT_OP_SWIGLU_FWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    check("swiglu_fwd", "out", out), check("swiglu_fwd", "gate", gate), check("swiglu_fwd", "up", up);
    const size_t n = (size_t)N * F;
    if (N <= 0 || F <= 0) return;
    const bool vec = n % 4 == 0 && mt_aligned4(out.data, out.dtype) && mt_aligned4(gate.data, gate.dtype) &&
                     mt_aligned4(up.data, up.dtype);
    const unsigned grid = elementwise_grid(n, vec);
    mt_with_elem3(out.dtype, gate.dtype, up.dtype, [&](auto o, auto g, auto u) {
        using TO = MT_ELEM(o);
        using TG = MT_ELEM(g);
        using TU = MT_ELEM(u);
        TO *po = (TO *)out.data;
        const TG *pg = (const TG *)gate.data;
        const TU *pu = (const TU *)up.data;
        if (vec) MT_LAUNCH(grid, 256, 0, c->stream, swiglu_fwd_kernel<TO, TG, TU, true>)(po, pg, pu, n);
        else MT_LAUNCH(grid, 256, 0, c->stream, swiglu_fwd_kernel<TO, TG, TU, false>)(po, pg, pu, n);
    });
    MT_CUDA_LAUNCHED();
}

extern "C" void mt_cuda_swiglu_bwd(void *ctx, float *dgate, float *dup, const float *dout, struct mt_tensor gate,
                                   struct mt_tensor up, int N, int F)
{
    MT_CUDA_OP(ctx, MT_OP_SWIGLU_BWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    check("swiglu_bwd", "gate", gate), check("swiglu_bwd", "up", up);
    const size_t n = (size_t)N * F;
    if (N <= 0 || F <= 0) return;
    const bool vec = n % 4 == 0 && aligned16(dgate) && aligned16(dup) && aligned16(dout) &&
                     mt_aligned4(gate.data, gate.dtype) && mt_aligned4(up.data, up.dtype);
    const unsigned grid = elementwise_grid(n, vec);
    mt_with_elem(gate.dtype, [&](auto g) {
        mt_with_elem(up.dtype, [&](auto u) {
            using TG = MT_ELEM(g);
            using TU = MT_ELEM(u);
            const TG *pg = (const TG *)gate.data;
            const TU *pu = (const TU *)up.data;
            if (vec) MT_LAUNCH(grid, 256, 0, c->stream, swiglu_bwd_kernel<TG, TU, true>)(dgate, dup, dout, pg, pu, n);
            else MT_LAUNCH(grid, 256, 0, c->stream, swiglu_bwd_kernel<TG, TU, false>)(dgate, dup, dout, pg, pu, n);
        });
    });
    MT_CUDA_LAUNCHED();
}

extern "C" void mt_cuda_add(void *ctx, struct mt_tensor out, struct mt_tensor a, struct mt_tensor b, size_t n)
{
    MT_CUDA_OP(ctx, MT_OP_ADD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    check("add", "out", out), check("add", "a", a), check("add", "b", b);
    if (n == 0) return;
    const bool vec = n % 4 == 0 && mt_aligned4(out.data, out.dtype) && mt_aligned4(a.data, a.dtype) &&
                     mt_aligned4(b.data, b.dtype);
    const unsigned grid = elementwise_grid(n, vec);
    mt_with_elem3(out.dtype, a.dtype, b.dtype, [&](auto o, auto at, auto bt) {
        using TO = MT_ELEM(o);
        using TA = MT_ELEM(at);
        using TB = MT_ELEM(bt);
        TO *po = (TO *)out.data;
        const TA *pa = (const TA *)a.data;
        const TB *pb = (const TB *)b.data;
        if (vec) MT_LAUNCH(grid, 256, 0, c->stream, add_kernel<TO, TA, TB, true>)(po, pa, pb, n);
        else MT_LAUNCH(grid, 256, 0, c->stream, add_kernel<TO, TA, TB, false>)(po, pa, pb, n);
    });
    MT_CUDA_LAUNCHED();
}

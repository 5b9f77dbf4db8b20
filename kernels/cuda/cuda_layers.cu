// CUDA backend: embedding, RMSNorm, RoPE, SwiGLU, add.
//
// Each op is one pass over its tensors (fused forward and backward statistics, 16-byte
// accesses where the shapes allow). Parameter gradients (embedding, RMSNorm weight)
// are reduced without atomics, in an order fixed by the shapes alone, so results are
// the same run to run. The embedding gradient and RoPE are bit-identical to the CPU
// reference: same operations, same order, no contraction into FMA.
#include "kernels/cuda/cuda_common.cuh"

#include <math.h>
#include <stdlib.h>

#include <cub/device/device_radix_sort.cuh>

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// ---------------------------------------------------------------- embedding

// out (N,C) = wte[tokens]: one block per token row; a token of another vocabulary shard
// (-1) gives a zero row.
template <bool VEC>
__global__ static void embedding_fwd_kernel(float *out, const int32_t *tokens, const float *wte, int C)
{
    const size_t n = blockIdx.x;
    const int tok = tokens[n];
    const float *src = wte + (size_t)(tok < 0 ? 0 : tok) * C;
    float *dst = out + n * C;
    if (VEC) {
        for (int c = threadIdx.x; c < C / 4; c += blockDim.x)
            reinterpret_cast<float4 *>(dst)[c] =
                tok < 0 ? make_float4(0.f, 0.f, 0.f, 0.f) : __ldg(reinterpret_cast<const float4 *>(src) + c);
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = tok < 0 ? 0.0f : __ldg(src + c);
    }
}

extern "C" void mt_cuda_embedding_fwd(void *ctx, float *out, const int32_t *tokens, const float *wte,
                                      int N, int C)
{
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (N <= 0 || C <= 0) return;
    const bool vec = C % 4 == 0 && aligned16(out) && aligned16(wte);
    if (vec) MT_LAUNCH(N, 128, 0, c->stream, embedding_fwd_kernel<true>)(out, tokens, wte, C);
    else MT_LAUNCH(N, 128, 0, c->stream, embedding_fwd_kernel<false>)(out, tokens, wte, C);
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
// operations ((x r) w); the sum of squares is a lane-strided sum and a warp tree.
__global__ static void rmsnorm_fwd_kernel(float *out, float *rstd, const float *x, const float *w,
                                          int N, int C, float eps)
{
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *xr = x + (size_t)row * C;
    float *o = out + (size_t)row * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) ss += xr[c] * xr[c];
    ss = mt_warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)C + eps);
    for (int c = lane; c < C; c += 32) o[c] = xr[c] * r * w[c];
    if (lane == 0) rstd[row] = r;
}

extern "C" void mt_cuda_rmsnorm_fwd(void *ctx, float *out, float *rstd, const float *x, const float *w,
                                    int N, int C, float eps)
{
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (N <= 0 || C <= 0) return;
    MT_LAUNCH(mt_cdiv(N, 8), 256, 0, c->stream, rmsnorm_fwd_kernel)(out, rstd, x, w, N, C, eps);
    MT_CUDA_LAUNCHED();
}

// dx += r w dy - x r^3 <w dy, x> / C per row; the weight gradient dw[c] = sum_n dy x r
// is summed per chunk of rows into partial (nchunks, C) by the thread that owns column
// c, in row order, then reduced over chunks by rmsnorm_dw_kernel. The chunking depends
// on N only, so the sum order is fixed.
__global__ static void rmsnorm_bwd_kernel(float *dx, float *partial, const float *dout, const float *x,
                                          const float *w, const float *rstd, int N, int C, int rows_per_chunk)
{
    MT_DYNAMIC_SHARED(float, part); // (C): column c belongs to thread c % blockDim.x
    MT_SHARED(float, red, [32]);
    const int n0 = blockIdx.x * rows_per_chunk;
    const int n1 = min(N, n0 + rows_per_chunk);
    for (int c = threadIdx.x; c < C; c += blockDim.x) part[c] = 0.0f;
    for (int n = n0; n < n1; n++) {
        const float *xn = x + (size_t)n * C, *dn = dout + (size_t)n * C;
        float *dxn = dx + (size_t)n * C;
        const float r = rstd[n];
        float dot = 0.0f;
        for (int c = threadIdx.x; c < C; c += blockDim.x) dot += w[c] * dn[c] * xn[c];
        dot = mt_block_sum(dot, red);
        const float k = dot * r * r * r / (float)C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            dxn[c] += r * w[c] * dn[c] - k * xn[c];
            part[c] += dn[c] * xn[c] * r;
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

extern "C" void mt_cuda_rmsnorm_bwd(void *ctx, float *dx, float *dw, const float *dout, const float *x,
                                    const float *w, const float *rstd, int N, int C)
{
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (N <= 0 || C <= 0) return;
    const size_t smem = sizeof(float) * (size_t)C;
    if (smem > c->smem_optin)
        mt_cuda_fatal(__FILE__, __LINE__, "rmsnorm_bwd", "row too wide for the per-column partial sums");
    static size_t smem_set = 48 << 10;
    if (smem > smem_set) {
        MT_CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)c->smem_optin));
        smem_set = c->smem_optin;
    }
    const int rows_per_chunk = (N + 1023) / 1024 > 32 ? (N + 1023) / 1024 : 32; // <= 1024 chunks
    const int nchunks = (N + rows_per_chunk - 1) / rows_per_chunk;
    const int threads = C >= 1024 ? 256 : C >= 256 ? 128 : 32;
    float *partial = (float *)mt_cuda_scratch(c, sizeof(float) * (size_t)nchunks * C);
    MT_LAUNCH(nchunks, threads, smem, c->stream, rmsnorm_bwd_kernel)(dx, partial, dout, x, w, rstd, N, C,
                                                             rows_per_chunk);
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
    MT_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    free(host);
    c->rope_T = T;
    c->rope_D = D;
    c->rope_theta = theta;
    return c->rope_tab;
}

// One thread per (row, i < D/2): the pair (i, i + D/2) rotated by the angle of the
// row's position; sign -1 rotates back (the transpose). out may alias x.
__global__ static void rope_kernel(float *out, const float *x, const float *tab, size_t pairs, int T, int H,
                                   int half, float sign)
{
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= pairs) return;
    const int i = (int)(idx % half);
    const size_t row = idx / half; // (b, t, h)
    const int t = (int)((row / H) % T);
    const float c = tab[((size_t)t * half + i) * 2];
    const float s = sign * tab[((size_t)t * half + i) * 2 + 1];
    const size_t base = row * 2 * half;
    const float x1 = x[base + i], x2 = x[base + i + half];
    out[base + i] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    out[base + i + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

static void rope(mt_cuda_ctx *c, float *out, const float *x, int B, int T, int H, int D, float theta,
                 float sign)
{
    if (B <= 0 || T <= 0 || H <= 0 || D <= 1) return;
    const float *tab = rope_table(c, T, D, theta);
    const size_t pairs = (size_t)B * T * H * (D / 2);
    MT_LAUNCH(mt_cdiv(pairs, 256), 256, 0, c->stream, rope_kernel)(out, x, tab, pairs, T, H, D / 2, sign);
    MT_CUDA_LAUNCHED();
}

extern "C" void mt_cuda_rope_fwd(void *ctx, float *out, const float *x, int B, int T, int H, int D,
                                 float theta)
{
    rope(mt_cuda(ctx), out, x, B, T, H, D, theta, 1.0f);
}

extern "C" void mt_cuda_rope_bwd(void *ctx, float *dx, const float *dout, int B, int T, int H, int D,
                                 float theta)
{
    rope(mt_cuda(ctx), dx, dout, B, T, H, D, theta, -1.0f);
}

// ---------------------------------------------------------------- SwiGLU, add

template <bool VEC>
__global__ static void swiglu_fwd_kernel(float *out, const float *gate, const float *up, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (VEC) {
        if (i >= n / 4) return;
        const float4 g = reinterpret_cast<const float4 *>(gate)[i], u = reinterpret_cast<const float4 *>(up)[i];
        float4 o;
        o.x = g.x * mt_sigmoid(g.x) * u.x;
        o.y = g.y * mt_sigmoid(g.y) * u.y;
        o.z = g.z * mt_sigmoid(g.z) * u.z;
        o.w = g.w * mt_sigmoid(g.w) * u.w;
        reinterpret_cast<float4 *>(out)[i] = o;
    } else {
        if (i >= n) return;
        const float g = gate[i];
        out[i] = g * mt_sigmoid(g) * up[i];
    }
}

__device__ __forceinline__ void swiglu_grad(float d, float g, float u, float *dg, float *du)
{
    const float s = mt_sigmoid(g);
    *dg = d * u * s * (1.0f + g * (1.0f - s));
    *du = d * (g * s);
}

template <bool VEC>
__global__ static void swiglu_bwd_kernel(float *dgate, float *dup, const float *dout, const float *gate,
                                         const float *up, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (VEC) {
        if (i >= n / 4) return;
        const float4 d = reinterpret_cast<const float4 *>(dout)[i];
        const float4 g = reinterpret_cast<const float4 *>(gate)[i], u = reinterpret_cast<const float4 *>(up)[i];
        float4 a, b;
        swiglu_grad(d.x, g.x, u.x, &a.x, &b.x);
        swiglu_grad(d.y, g.y, u.y, &a.y, &b.y);
        swiglu_grad(d.z, g.z, u.z, &a.z, &b.z);
        swiglu_grad(d.w, g.w, u.w, &a.w, &b.w);
        reinterpret_cast<float4 *>(dgate)[i] = a;
        reinterpret_cast<float4 *>(dup)[i] = b;
    } else {
        if (i >= n) return;
        swiglu_grad(dout[i], gate[i], up[i], dgate + i, dup + i);
    }
}

template <bool VEC>
__global__ static void add_kernel(float *out, const float *a, const float *b, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (VEC) {
        if (i >= n / 4) return;
        const float4 x = reinterpret_cast<const float4 *>(a)[i], y = reinterpret_cast<const float4 *>(b)[i];
        reinterpret_cast<float4 *>(out)[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    } else {
        if (i < n) out[i] = a[i] + b[i];
    }
}

extern "C" void mt_cuda_swiglu_fwd(void *ctx, float *out, const float *gate, const float *up, int N, int F)
{
    mt_cuda_ctx *c = mt_cuda(ctx);
    const size_t n = (size_t)N * F;
    if (N <= 0 || F <= 0) return;
    if (n % 4 == 0 && aligned16(out) && aligned16(gate) && aligned16(up))
        MT_LAUNCH(mt_cdiv(n / 4, 256), 256, 0, c->stream, swiglu_fwd_kernel<true>)(out, gate, up, n);
    else
        MT_LAUNCH(mt_cdiv(n, 256), 256, 0, c->stream, swiglu_fwd_kernel<false>)(out, gate, up, n);
    MT_CUDA_LAUNCHED();
}

extern "C" void mt_cuda_swiglu_bwd(void *ctx, float *dgate, float *dup, const float *dout,
                                   const float *gate, const float *up, int N, int F)
{
    mt_cuda_ctx *c = mt_cuda(ctx);
    const size_t n = (size_t)N * F;
    if (N <= 0 || F <= 0) return;
    if (n % 4 == 0 && aligned16(dgate) && aligned16(dup) && aligned16(dout) && aligned16(gate) &&
        aligned16(up))
        MT_LAUNCH(mt_cdiv(n / 4, 256), 256, 0, c->stream, swiglu_bwd_kernel<true>)(dgate, dup, dout, gate, up, n);
    else
        MT_LAUNCH(mt_cdiv(n, 256), 256, 0, c->stream, swiglu_bwd_kernel<false>)(dgate, dup, dout, gate, up, n);
    MT_CUDA_LAUNCHED();
}

extern "C" void mt_cuda_add(void *ctx, float *out, const float *a, const float *b, size_t n)
{
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (n == 0) return;
    if (n % 4 == 0 && aligned16(out) && aligned16(a) && aligned16(b))
        MT_LAUNCH(mt_cdiv(n / 4, 256), 256, 0, c->stream, add_kernel<true>)(out, a, b, n);
    else
        MT_LAUNCH(mt_cdiv(n, 256), 256, 0, c->stream, add_kernel<false>)(out, a, b, n);
    MT_CUDA_LAUNCHED();
}

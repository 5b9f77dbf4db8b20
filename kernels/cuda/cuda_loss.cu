// CUDA backend: cross-entropy over the vocabulary (or a shard of it: columns v0..v0+V-1).
//
// Forward: one block per token row reads the logits once, with an online logsumexp
// (running max and rescaled sum per thread, merged across the block); backward writes
// the gradient in place of the logits, one read and one write per element. The logits
// are never written by the forward, so with the model's in-place backward each
// element crosses memory three times in all (read, read, write).
#include "kernels/cuda/cuda_common.cuh"

#include <math.h>

// (m, s): sum exp(x - m) over the values seen, m their max; merge of two such pairs.
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2)
{
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) {
        m = m2;
        s = s2;
        return;
    }
    if (m2 > m) {
        s = s * expf(m - m2) + s2;
        m = m2;
    } else {
        s += s2 * expf(m2 - m);
    }
}

__device__ __forceinline__ void lse_push(float &m, float &s, float x)
{
    if (x > m) {
        s = (m == -INFINITY ? 0.0f : s * expf(m - x)) + 1.0f;
        m = x;
    } else if (x != -INFINITY) { // exp(-inf) adds nothing, and (-inf) - (-inf) is NaN
        s += expf(x - m);
    }
}

template <bool VEC>
__global__ static void ce_fwd_kernel(float *lse, float *tlogit, const float *logits, const int32_t *targets, int V,
                                     int v0)
{
    MT_SHARED(float, sm, [32]);
    MT_SHARED(float, ss, [32]);
    const size_t n = blockIdx.x;
    const float *l = logits + n * V;
    float m = -INFINITY, s = 0.0f;
    if (VEC) {
        const float4 *l4 = reinterpret_cast<const float4 *>(l);
        for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
            const float4 x = __ldg(l4 + i);
            lse_push(m, s, x.x);
            lse_push(m, s, x.y);
            lse_push(m, s, x.z);
            lse_push(m, s, x.w);
        }
    } else {
        for (int i = threadIdx.x; i < V; i += blockDim.x) lse_push(m, s, __ldg(l + i));
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(MT_FULL_MASK, m, o), s2 = __shfl_xor_sync(MT_FULL_MASK, s, o);
        lse_merge(m, s, m2, s2);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sm[warp] = m;
        ss[warp] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = sm[0], Sx = ss[0];
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) lse_merge(M, Sx, sm[w], ss[w]);
        lse[n] = M + logf(Sx);
        const int tg = targets[n], t = tg - v0;
        tlogit[n] = tg >= 0 && t >= 0 && t < V ? l[t] : 0.0f;
    }
}

extern "C" void mt_cuda_cross_entropy_fwd(void *ctx, float *lse, float *tlogit, const float *logits,
                                          const int32_t *targets, int N, int V, int v0)
{
    MT_CUDA_OP(ctx, MT_OP_CROSS_ENTROPY_FWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (N <= 0 || V <= 0) return;
    if (V % 4 == 0 && ((uintptr_t)logits & 15) == 0)
        MT_LAUNCH(N, 512, 0, c->stream, ce_fwd_kernel<true>)(lse, tlogit, logits, targets, V, v0);
    else
        MT_LAUNCH(N, 512, 0, c->stream, ce_fwd_kernel<false>)(lse, tlogit, logits, targets, V, v0);
    MT_CUDA_LAUNCHED();
}

// d = scale (softmax - onehot(t)), t the target's column in the shard (-1 when outside);
// zero rows where the target is < 0. d may alias the logits.
__device__ __forceinline__ float ce_grad(float x, float lse, int v, int target, int t, float scale)
{
    if (target < 0) return 0.0f;
    const float d = scale * expf(x - lse);
    return v == t ? d - scale : d;
}

template <bool VEC>
__global__ static void ce_bwd_kernel(float *dlogits, const float *logits, const float *lse, const int32_t *targets,
                                     size_t total, int V, int v0, float scale)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (VEC) {
        if (i >= total / 4) return;
        const size_t e = i * 4, n = e / V; // V % 4 == 0: the four share a row
        const int v = (int)(e % V), tg = targets[n], t = tg - v0;
        const float m = lse[n];
        const float4 x = reinterpret_cast<const float4 *>(logits)[i];
        reinterpret_cast<float4 *>(dlogits)[i] =
            make_float4(ce_grad(x.x, m, v, tg, t, scale), ce_grad(x.y, m, v + 1, tg, t, scale),
                        ce_grad(x.z, m, v + 2, tg, t, scale), ce_grad(x.w, m, v + 3, tg, t, scale));
    } else {
        if (i >= total) return;
        const size_t n = i / V;
        const int tg = targets[n];
        dlogits[i] = ce_grad(logits[i], lse[n], (int)(i % V), tg, tg - v0, scale);
    }
}

extern "C" void mt_cuda_cross_entropy_bwd(void *ctx, float *dlogits, const float *logits, const float *lse,
                                          const int32_t *targets, int N, int V, int v0, float scale)
{
    MT_CUDA_OP(ctx, MT_OP_CROSS_ENTROPY_BWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (N <= 0 || V <= 0) return;
    const size_t total = (size_t)N * V;
    if (V % 4 == 0 && ((uintptr_t)logits & 15) == 0 && ((uintptr_t)dlogits & 15) == 0)
        MT_LAUNCH(mt_cdiv(total / 4, 256), 256, 0, c->stream, ce_bwd_kernel<true>)(dlogits, logits, lse, targets, total, V,
                                                                           v0, scale);
    else
        MT_LAUNCH(mt_cdiv(total, 256), 256, 0, c->stream, ce_bwd_kernel<false>)(dlogits, logits, lse, targets, total, V, v0,
                                                                         scale);
    MT_CUDA_LAUNCHED();
}

// One thread per token, the shards in order (the CPU reference's sum).
__global__ static void lse_combine_kernel(float *lse, const float *shard_lse, int R, int N)
{
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float hi = -INFINITY;
    for (int r = 0; r < R; r++) {
        const float x = shard_lse[(size_t)r * N + n];
        hi = x > hi ? x : hi;
    }
    double sum = 0.0;
    for (int r = 0; r < R; r++) sum += exp((double)shard_lse[(size_t)r * N + n] - hi);
    lse[n] = hi + (float)log(sum);
}

extern "C" void mt_cuda_lse_combine(void *ctx, float *lse, const float *shard_lse, int R, int N)
{
    MT_CUDA_OP(ctx, MT_OP_LSE_COMBINE);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (N <= 0) return;
    MT_LAUNCH(mt_cdiv((size_t)N, 256), 256, 0, c->stream, lse_combine_kernel)(lse, shard_lse, R, N);
    MT_CUDA_LAUNCHED();
}

// loss_sum's fixed order (kernels.h), the CPU reference's: one block of
// MT_LOSS_SUM_LANES threads, thread j summing the tokens j, j + lanes, ... in order
// (coalesced), then the lanes pairwise in shared memory, then the total added.
__global__ static void __launch_bounds__(MT_LOSS_SUM_LANES)
    loss_sum_kernel(double *acc, const float *lse, const float *tlogit, const int32_t *targets, int N)
{
    MT_SHARED(double, s, [MT_LOSS_SUM_LANES]);
    const int j = threadIdx.x;
    double v = 0.0;
    for (int n = j; n < N; n += MT_LOSS_SUM_LANES)
        if (targets[n] >= 0) v += lse[n] - tlogit[n];
    s[j] = v;
    __syncthreads();
    for (int w = MT_LOSS_SUM_LANES / 2; w >= 1; w /= 2) {
        if (j < w) s[j] += s[j + w];
        __syncthreads();
    }
    if (j == 0) *acc += s[0];
}

extern "C" void mt_cuda_loss_sum(void *ctx, double *acc, const float *lse, const float *tlogit,
                                 const int32_t *targets, int N)
{
    MT_CUDA_OP(ctx, MT_OP_LOSS_SUM);
    mt_cuda_ctx *c = mt_cuda(ctx);
    MT_LAUNCH(1, MT_LOSS_SUM_LANES, 0, c->stream, loss_sum_kernel)(acc, lse, tlogit, targets, N);
    MT_CUDA_LAUNCHED();
}

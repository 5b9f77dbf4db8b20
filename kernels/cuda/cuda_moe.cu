// CUDA backend: router top-k, load-balancing and z losses, and the token dispatch
// (plan, permute, unpermute) of a dropless or capacity-bounded MoE layer.
//
// Router ops work one warp per token (scores in shared memory, top-k by k rounds of a
// warp arg-max that prefers the lower expert index on ties, as the CPU does). The
// dispatch plan is a stable counting sort on the device: cub's radix sort is stable,
// so sorting slot ids by expert keeps tokens in increasing order inside each expert,
// and sorting by (expert, descending probability) gives the MT_DROP_PROBS order with
// ties broken by the lower slot. Token counts per expert stay on the device; only the
// dropped count (a return value of the op) comes back to the host. Loss scalars are
// summed in double in a fixed order, like the CPU reference. No atomics on floats.
#include "kernels/cuda/cuda_common.cuh"

#include <stdio.h>

#include <cub/device/device_radix_sort.cuh>

#define MOE_WARPS 4 // warps (tokens) per block of the per-token kernels

static void check_router_shape(int E, int k)
{
    if (k < 1 || k > 32 || k > E) {
        char msg[96];
        snprintf(msg, sizeof msg, "topk %d with %d experts (this kernel takes 1 <= topk <= min(32, E))", k, E);
        mt_cuda_fatal(__FILE__, __LINE__, "router", msg);
    }
}

// Shared memory of the per-token kernels: per warp, `floats` floats and E flags.
static size_t warp_smem(mt_cuda_ctx *c, int E, int floats, const void *kernel, size_t *set)
{
    const size_t per_warp = ((size_t)floats * E * sizeof(float) + (size_t)E + 15) / 16 * 16;
    const size_t bytes = per_warp * MOE_WARPS;
    if (bytes > c->smem_optin) mt_cuda_fatal(__FILE__, __LINE__, "router", "too many experts for shared memory");
    if (bytes > *set && bytes > (48u << 10)) {
        MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c->smem_optin));
        *set = c->smem_optin;
    }
    return bytes;
}

__device__ __forceinline__ unsigned char *warp_area(unsigned char *smem, int E, int floats)
{
    const size_t per_warp = ((size_t)floats * E * sizeof(float) + (size_t)E + 15) / 16 * 16;
    return smem + per_warp * (threadIdx.x >> 5);
}

// p (E, shared) = softmax(l), with the CPU's expression p = exp(l - max) * (1 / sum).
__device__ __forceinline__ void warp_softmax(float *p, const float *l, int E)
{
    const int lane = threadIdx.x & 31;
    float mx = -INFINITY, sum = 0.0f;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
    mx = mt_warp_max(mx);
    for (int e = lane; e < E; e += 32) {
        p[e] = expf(l[e] - mx);
        sum += p[e];
    }
    const float inv = 1.0f / mt_warp_sum(sum);
    for (int e = lane; e < E; e += 32) p[e] *= inv;
    __syncwarp();
}

// The untaken expert with the largest key, lower index on ties (every lane gets it).
// Marks it taken.
__device__ __forceinline__ int warp_argmax_take(const float *key, unsigned char *taken, int E)
{
    const int lane = threadIdx.x & 31;
    float v = 0.0f;
    int i = -1;
    for (int e = lane; e < E; e += 32)
        if (!taken[e] && (i < 0 || key[e] > v)) {
            v = key[e];
            i = e;
        }
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(MT_FULL_MASK, v, o);
        const int i2 = __shfl_xor_sync(MT_FULL_MASK, i, o);
        if (i2 >= 0 && (i < 0 || v2 > v || (v2 == v && i2 < i))) {
            v = v2;
            i = i2;
        }
    }
    i = __shfl_sync(MT_FULL_MASK, i, 0); // NaN keys could leave lanes disagreeing
    __syncwarp();
    if (lane == 0) taken[i] = 1;
    __syncwarp();
    return i;
}

// Lane j < k ends with the expert of rank j. taken (E) is cleared first.
__device__ __forceinline__ int warp_topk(const float *key, unsigned char *taken, int E, int k)
{
    const int lane = threadIdx.x & 31;
    for (int e = lane; e < E; e += 32) taken[e] = 0;
    __syncwarp();
    int mine = -1;
    for (int j = 0; j < k; j++) {
        const int i = warp_argmax_take(key, taken, E);
        if (lane == j) mine = i;
    }
    return mine;
}

// Sum over the lanes j < k of v (the other lanes contribute 0).
__device__ __forceinline__ float sum_k(float v, int k)
{
    return mt_warp_sum((threadIdx.x & 31) < k ? v : 0.0f);
}

// ---------------------------------------------------------------- router

__global__ static void router_fwd_kernel(mt_router_args a, const float *logits, const float *bias,
                                         int32_t *topk_idx, float *topk_prob)
{
    MT_DYNAMIC_SHARED(unsigned char, moe_smem);
    const int E = a.num_experts, k = a.topk, lane = threadIdx.x & 31;
    const int n = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (n >= a.num_tokens) return; // whole warps leave together
    float *score = reinterpret_cast<float *>(warp_area(moe_smem, E, 2));
    float *key = score + E;
    unsigned char *taken = reinterpret_cast<unsigned char *>(key + E);
    const float *l = logits + (size_t)n * E;
    if (a.score_fn == MT_SCORE_SOFTMAX && a.pre_softmax)
        warp_softmax(score, l, E);
    else
        for (int e = lane; e < E; e += 32) score[e] = a.score_fn == MT_SCORE_SOFTMAX ? l[e] : mt_sigmoid(l[e]);
    for (int e = lane; e < E; e += 32) key[e] = score[e] + (bias ? bias[e] : 0.0f);
    __syncwarp();
    const int idx = warp_topk(key, taken, E, k);
    float prob = lane < k ? score[idx] : 0.0f;
    if (a.score_fn == MT_SCORE_SOFTMAX && !a.pre_softmax) { // softmax over the k picked logits
        const float mx = mt_warp_max(lane < k ? prob : -INFINITY);
        const float p = lane < k ? expf(prob - mx) : 0.0f;
        prob = p * (1.0f / mt_warp_sum(p));
    } else if (a.score_fn == MT_SCORE_SIGMOID && k > 1) {
        prob /= sum_k(prob, k) + 1e-20f;
    }
    prob *= a.scaling_factor != 0.0f ? a.scaling_factor : 1.0f;
    if (lane < k) {
        topk_idx[(size_t)n * k + lane] = idx;
        topk_prob[(size_t)n * k + lane] = prob;
    }
}

extern "C" void mt_cuda_router_fwd(void *ctx, const struct mt_router_args *a, const float *logits,
                                   const float *expert_bias, int32_t *topk_idx, float *topk_prob)
{
    MT_CUDA_OP(ctx, MT_OP_ROUTER_FWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (a->num_tokens <= 0) return;
    check_router_shape(a->num_experts, a->topk);
    static size_t set = 48u << 10;
    const size_t smem = warp_smem(c, a->num_experts, 2, (const void *)router_fwd_kernel, &set);
    MT_LAUNCH(mt_cdiv(a->num_tokens, MOE_WARPS), 32 * MOE_WARPS, smem, c->stream, router_fwd_kernel)(
        *a, logits, expert_bias, topk_idx, topk_prob);
    MT_CUDA_LAUNCHED();
}

__global__ static void router_bwd_kernel(mt_router_args a, float *dlogits, const float *dprob,
                                         const float *logits, const int32_t *topk_idx)
{
    MT_DYNAMIC_SHARED(unsigned char, moe_smem);
    const int E = a.num_experts, k = a.topk, lane = threadIdx.x & 31;
    const int n = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (n >= a.num_tokens) return;
    const float sf = a.scaling_factor != 0.0f ? a.scaling_factor : 1.0f;
    const float *l = logits + (size_t)n * E;
    float *dl = dlogits + (size_t)n * E;
    const int idx = lane < k ? topk_idx[(size_t)n * k + lane] : 0;
    const float dp = lane < k ? dprob[(size_t)n * k + lane] : 0.0f;
    if (a.score_fn == MT_SCORE_SOFTMAX && a.pre_softmax) {
        // prob_j = sf p[idx_j], p = softmax(l): dl = p (g - <g,p>), g[idx_j] = sf dp_j
        float *p = reinterpret_cast<float *>(warp_area(moe_smem, E, 2));
        float *g = p + E;
        warp_softmax(p, l, E);
        for (int e = lane; e < E; e += 32) g[e] = 0.0f;
        __syncwarp();
        if (lane < k) g[idx] = sf * dp;
        __syncwarp();
        const float dot = sum_k(lane < k ? sf * dp * p[idx] : 0.0f, k);
        for (int e = lane; e < E; e += 32) dl[e] += p[e] * (g[e] - dot);
    } else if (a.score_fn == MT_SCORE_SOFTMAX) {
        // prob = sf softmax(l[idx]) over the k picked
        const float x = lane < k ? l[idx] : -INFINITY;
        const float mx = mt_warp_max(x);
        const float ex = lane < k ? expf(x - mx) : 0.0f;
        const float p = ex * (1.0f / mt_warp_sum(ex));
        const float dot = sum_k(sf * dp * p, k);
        if (lane < k) dl[idx] += p * (sf * dp - dot);
    } else {
        // prob_j = sf s_j / (sum s + 1e-20) (k > 1) or sf s_j, s = sigmoid(l[idx])
        const float s = lane < k ? mt_sigmoid(l[idx]) : 0.0f;
        const float z = sum_k(s, k) + 1e-20f;
        const float dot = sum_k(sf * dp * s / z, k);
        const float ds = k > 1 ? (sf * dp - dot) / z : sf * dp;
        if (lane < k) dl[idx] += ds * s * (1.0f - s);
    }
}

extern "C" void mt_cuda_router_bwd(void *ctx, const struct mt_router_args *a, float *dlogits,
                                   const float *dprob, const float *logits, const int32_t *topk_idx)
{
    MT_CUDA_OP(ctx, MT_OP_ROUTER_BWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (a->num_tokens <= 0) return;
    check_router_shape(a->num_experts, a->topk);
    static size_t set = 48u << 10;
    const size_t smem = warp_smem(c, a->num_experts, 2, (const void *)router_bwd_kernel, &set);
    MT_LAUNCH(mt_cdiv(a->num_tokens, MOE_WARPS), 32 * MOE_WARPS, smem, c->stream, router_bwd_kernel)(
        *a, dlogits, dprob, logits, topk_idx);
    MT_CUDA_LAUNCHED();
}

// ---------------------------------------------------------------- load-balancing loss

// The balancing loss's scores of one token into p (E, shared): softmax, or sigmoid
// normalised by z = sum + 1e-20 (returned; 1 for softmax).
__device__ __forceinline__ float aux_scores(float *p, const float *l, int E, mt_score_fn fn)
{
    if (fn == MT_SCORE_SOFTMAX) {
        warp_softmax(p, l, E);
        return 1.0f;
    }
    const int lane = threadIdx.x & 31;
    float z = 0.0f;
    for (int e = lane; e < E; e += 32) {
        p[e] = mt_sigmoid(l[e]);
        z += p[e];
    }
    z = mt_warp_sum(z) + 1e-20f;
    for (int e = lane; e < E; e += 32) p[e] /= z;
    __syncwarp();
    return z;
}

// Per token: P[n] (E) = scores; with sel, sel[n] (E) = 1 for the top-k of P[n].
__global__ static void aux_scores_kernel(float *P, unsigned char *sel, const float *logits, int N, int E, int k,
                                         mt_score_fn fn)
{
    MT_DYNAMIC_SHARED(unsigned char, moe_smem);
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (n >= N) return;
    float *p = reinterpret_cast<float *>(warp_area(moe_smem, E, 1));
    unsigned char *taken = reinterpret_cast<unsigned char *>(p + E);
    aux_scores(p, logits + (size_t)n * E, E, fn);
    if (sel) warp_topk(p, taken, E, k);
    for (int e = lane; e < E; e += 32) {
        P[(size_t)n * E + e] = p[e];
        if (sel) sel[(size_t)n * E + e] = taken[e];
    }
}

#define AUX_CHUNK 256 // tokens per partial sum

// This call's tokens of sequence s (of the whole): [lo, hi) in call-local indices.
__device__ __forceinline__ void aux_seq_range(const mt_aux_args &a, int s, int *lo, int *hi)
{
    const long long b = (long long)s * a.seq_len - a.first, e = b + a.seq_len;
    *lo = (int)(b < 0 ? 0 : b > a.num_tokens ? a.num_tokens : b);
    *hi = (int)(e < 0 ? 0 : e > a.num_tokens ? a.num_tokens : e);
}

// Partial sums over chunk ci of sequence s's tokens in this call, per expert:
// psum_part[s][ci][e] = sum p (double); with sel, cnt_part[s][ci][e] = selections.
__global__ static void aux_partial_kernel(mt_aux_args a, double *psum_part, int *cnt_part, const float *P,
                                          const unsigned char *sel, int chunks)
{
    const int E = a.num_experts;
    const int e = blockIdx.x * blockDim.x + threadIdx.x, ci = blockIdx.y, s = blockIdx.z;
    if (e >= E) return;
    int lo, hi;
    aux_seq_range(a, s, &lo, &hi);
    const int n0 = lo + ci * AUX_CHUNK, n1 = min(hi, n0 + AUX_CHUNK);
    double ps = 0.0;
    int cnt = 0;
    for (int n = n0; n < n1; n++) {
        ps += P[(size_t)n * E + e];
        if (sel) cnt += sel[(size_t)n * E + e];
    }
    const size_t o = ((size_t)s * chunks + ci) * E + e;
    psum_part[o] = ps;
    if (sel) cnt_part[o] = cnt;
}

// Over the chunks in order: counts[s][e] (float, with cnt_part) or psum[s][e] (double).
__global__ static void aux_reduce_kernel(float *counts, double *psum, const double *psum_part, const int *cnt_part,
                                         int E, int chunks)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x, s = blockIdx.y;
    if (e >= E) return;
    double ps = 0.0;
    int cnt = 0;
    for (int ci = 0; ci < chunks; ci++) {
        const size_t o = ((size_t)s * chunks + ci) * E + e;
        if (cnt_part) cnt += cnt_part[o];
        else ps += psum_part[o];
    }
    if (cnt_part) counts[(size_t)s * E + e] = (float)cnt;
    else psum[(size_t)s * E + e] = ps;
}

// loss = coeff / num_seqs * sum_s E / (S^2 k) sum_e count[s,e] psum[s,e], in the CPU's
// order (one thread).
__global__ static void aux_loss_kernel(double *acc, const float *counts, const double *psum, mt_aux_args a)
{
    const int E = a.num_experts;
    const double S = a.seq_len;
    double total = 0.0;
    for (int s = 0; s < a.num_seqs; s++) {
        double seq = 0.0;
        for (int e = 0; e < E; e++) seq += (double)counts[(size_t)s * E + e] * psum[(size_t)s * E + e];
        total += seq * E / (S * S * a.topk);
    }
    *acc += (float)(a.coeff * total / a.num_seqs);
}

// The shared part of aux_counts and aux_loss_fwd: scores of this call's tokens, and per
// (sequence, expert) either the selection counts (counts != NULL) or the score sums
// (psum). Scratch from the allocator, freed before returning (stream order).
static void aux_sums(mt_cuda_ctx *c, const mt_aux_args *a, const float *logits, float *counts, double *psum)
{
    const int N = a->num_tokens, E = a->num_experts;
    const int per_seq = N < a->seq_len ? N : a->seq_len; // most tokens of one sequence in a call
    const int chunks = per_seq > 0 ? (per_seq + AUX_CHUNK - 1) / AUX_CHUNK : 1;
    const size_t ne = (size_t)N * E, parts = (size_t)a->num_seqs * chunks * E;
    const bool want_counts = counts != NULL;
    // one block: partial psums (double) | P (N,E) floats | partial counts (int) | sel (N,E) bytes
    const size_t off_p = parts * sizeof(double);
    const size_t off_cnt = off_p + (ne * sizeof(float) + 15) / 16 * 16;
    const size_t off_sel = off_cnt + (want_counts ? (parts * sizeof(int) + 15) / 16 * 16 : 0);
    unsigned char *buf = (unsigned char *)mt_cuda_scratch(c, off_sel + (want_counts ? ne : 0));
    double *psum_part = (double *)buf;
    float *P = (float *)(buf + off_p);
    int *cnt_part = want_counts ? (int *)(buf + off_cnt) : NULL;
    unsigned char *sel = want_counts ? buf + off_sel : NULL;
    if (N > 0) {
        static size_t set = 48u << 10;
        const size_t smem = warp_smem(c, E, 1, (const void *)aux_scores_kernel, &set);
        MT_LAUNCH(mt_cdiv(N, MOE_WARPS), 32 * MOE_WARPS, smem, c->stream, aux_scores_kernel)(P, sel, logits, N, E, a->topk,
                                                                                     a->score_fn);
        MT_CUDA_LAUNCHED();
    }
    MT_LAUNCH(dim3(mt_cdiv(E, 128), chunks, a->num_seqs), 128, 0, c->stream, aux_partial_kernel)(*a, psum_part, cnt_part,
                                                                                          P, sel, chunks);
    MT_CUDA_LAUNCHED();
    MT_LAUNCH(dim3(mt_cdiv(E, 128), a->num_seqs), 128, 0, c->stream, aux_reduce_kernel)(counts, psum, psum_part, cnt_part,
                                                                                E, chunks);
    MT_CUDA_LAUNCHED();
    mt_cuda_scratch_free(c, buf);
}

extern "C" void mt_cuda_aux_counts(void *ctx, const struct mt_aux_args *a, float *counts, const float *logits)
{
    MT_CUDA_OP(ctx, MT_OP_AUX_COUNTS);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (a->num_seqs <= 0 || a->num_experts <= 0) return;
    check_router_shape(a->num_experts, a->topk);
    aux_sums(c, a, logits, counts, NULL);
}

extern "C" void mt_cuda_aux_loss_fwd(void *ctx, const struct mt_aux_args *a, double *acc, const float *counts,
                                     const float *logits)
{
    MT_CUDA_OP(ctx, MT_OP_AUX_LOSS_FWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (a->num_seqs <= 0 || a->num_experts <= 0) return; // adds 0
    const size_t nse = (size_t)a->num_seqs * a->num_experts;
    double *psum = (double *)mt_cuda_scratch(c, nse * sizeof(double));
    aux_sums(c, a, logits, NULL, psum);
    MT_LAUNCH(1, 1, 0, c->stream, aux_loss_kernel)(acc, counts, psum, *a);
    MT_CUDA_LAUNCHED();
    mt_cuda_scratch_free(c, psum);
}

__global__ static void aux_bwd_kernel(mt_aux_args a, float *dlogits, const float *counts, const float *logits, float cf)
{
    MT_DYNAMIC_SHARED(unsigned char, moe_smem);
    const int E = a.num_experts, lane = threadIdx.x & 31;
    const int n = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (n >= a.num_tokens) return;
    float *p = reinterpret_cast<float *>(warp_area(moe_smem, E, 1));
    const float *cnt = counts + (size_t)((a.first + n) / a.seq_len) * E;
    float *dl = dlogits + (size_t)n * E;
    const float z = aux_scores(p, logits + (size_t)n * E, E, a.score_fn);
    float dot = 0.0f;
    for (int e = lane; e < E; e += 32) dot += cf * cnt[e] * p[e];
    dot = mt_warp_sum(dot);
    for (int e = lane; e < E; e += 32) {
        if (a.score_fn == MT_SCORE_SOFTMAX) {
            dl[e] += p[e] * (cf * cnt[e] - dot);
        } else { // p = s / z, s = sigmoid(l)
            const float s = p[e] * z;
            dl[e] += (cf * cnt[e] - dot) / z * s * (1.0f - s);
        }
    }
}

extern "C" void mt_cuda_aux_loss_bwd(void *ctx, const struct mt_aux_args *a, float *dlogits, float dloss,
                                     const float *counts, const float *logits)
{
    MT_CUDA_OP(ctx, MT_OP_AUX_LOSS_BWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (a->num_tokens <= 0) return;
    const double S = a->seq_len;
    const float cf = (float)((double)dloss * a->coeff * a->num_experts / (S * S * a->topk * a->num_seqs));
    static size_t set = 48u << 10;
    const size_t smem = warp_smem(c, a->num_experts, 1, (const void *)aux_bwd_kernel, &set);
    MT_LAUNCH(mt_cdiv(a->num_tokens, MOE_WARPS), 32 * MOE_WARPS, smem, c->stream, aux_bwd_kernel)(*a, dlogits, counts,
                                                                                          logits, cf);
    MT_CUDA_LAUNCHED();
}

// ---------------------------------------------------------------- z-loss

// lse (N) per row, one warp a row, in the CPU's expression max + log(sum exp(l - max)).
__global__ static void lse_rows_kernel(float *lse, const float *logits, int N, int E)
{
    const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (n >= N) return;
    const float *l = logits + (size_t)n * E;
    float mx = -INFINITY, sum = 0.0f;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
    mx = mt_warp_max(mx);
    for (int e = lane; e < E; e += 32) sum += expf(l[e] - mx);
    sum = mt_warp_sum(sum);
    if (lane == 0) lse[n] = mx + logf(sum);
}

// acc += coeff * sum lse^2 / N as a float, summed in double by one block in a fixed tree.
__global__ static void z_loss_kernel(double *acc, const float *lse, int N, float coeff)
{
    MT_SHARED(double, part, [32]);
    double mine = 0.0;
    for (int n = threadIdx.x; n < N; n += blockDim.x) mine += (double)lse[n] * lse[n];
    mine = mt_warp_sum_d(mine);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        double sum = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) sum += part[w];
        *acc += (float)(coeff * sum / N);
    }
}

extern "C" void mt_cuda_z_loss_fwd(void *ctx, double *acc, float *lse, const float *logits, int N, int E,
                                   float coeff)
{
    MT_CUDA_OP(ctx, MT_OP_Z_LOSS_FWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (N <= 0) return; // adds 0
    MT_LAUNCH(mt_cdiv(N, 8), 256, 0, c->stream, lse_rows_kernel)(lse, logits, N, E);
    MT_CUDA_LAUNCHED();
    if (!acc) return;
    MT_LAUNCH(1, 1024, 0, c->stream, z_loss_kernel)(acc, lse, N, coeff);
    MT_CUDA_LAUNCHED();
}

__global__ static void z_bwd_kernel(float *dlogits, const float *lse, const float *logits, size_t total, int E, float cf)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const float m = lse[i / E];
    dlogits[i] += cf * m * expf(logits[i] - m);
}

extern "C" void mt_cuda_z_loss_bwd(void *ctx, float *dlogits, float dloss, const float *lse, const float *logits,
                                   int N, int E, float coeff)
{
    MT_CUDA_OP(ctx, MT_OP_Z_LOSS_BWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (N <= 0) return;
    const float cf = dloss * coeff * 2.0f / (float)N;
    const size_t total = (size_t)N * E;
    MT_LAUNCH(mt_cdiv(total, 256), 256, 0, c->stream, z_bwd_kernel)(dlogits, lse, logits, total, E, cf);
    MT_CUDA_LAUNCHED();
}

// ---------------------------------------------------------------- dispatch plan

// Assignments per expert; -1 (no expert) is not counted. Integer adds: exact in any order.
__global__ static void expert_hist_kernel(int *counts, const int32_t *topk_idx, int S)
{
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s < S && topk_idx[s] >= 0) atomicAdd(counts + topk_idx[s], 1);
}

// (expert, descending probability) as one unsigned key: larger probabilities first;
// assignments to no expert (-1) sort last, as expert E.
__global__ static void prob_key_kernel(unsigned long long *key, const int32_t *topk_idx, const float *topk_prob, int S,
                                       int E)
{
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= S) return;
    const int e = topk_idx[s] < 0 ? E : topk_idx[s];
    float p = topk_prob[s];
    if (p == 0.0f) p = 0.0f; // -0 ties with +0, as the CPU's comparison does
    const uint32_t u = __float_as_uint(p);
    const uint32_t asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    key[s] = ((unsigned long long)(uint32_t)e << 32) | (uint32_t)~asc;
}

// Exclusive scan of counts into start (E), one thread: E is at most a few thousand.
__global__ static void expert_starts_kernel(int *start, const int *counts, int E)
{
    int acc = 0;
    for (int e = 0; e < E; e++) {
        start[e] = acc;
        acc += counts[e];
    }
}

// Over the prob-sorted order: a slot whose rank in its expert is >= capacity is dropped.
__global__ static void prob_drop_kernel(unsigned char *drop, const unsigned long long *sorted_key,
                                        const int32_t *sorted_slot, const int *start, int S, int E, int capacity)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= S) return;
    const int e = (int)(sorted_key[i] >> 32);
    drop[sorted_slot[i]] = e < E && i - start[e] >= capacity;
}

// key2 = expert, or E for a slot already dropped or routed nowhere (sorts after every
// expert and gets no row).
__global__ static void expert_key_kernel(int32_t *key, const int32_t *topk_idx, const unsigned char *drop, int S, int E)
{
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s < S) key[s] = topk_idx[s] < 0 || (drop && drop[s]) ? E : topk_idx[s];
}

// Per expert, one thread: kept rows, offsets, segment starts in the expert-sorted order
// (dropped-by-probability slots were moved out of the segments), the dropped count.
__global__ static void plan_offsets_kernel(mt_dispatch_plan plan, int *seg_start, int *kept_out,
                                           int64_t *dropped, int64_t *load, const int *counts, int E, int capacity,
                                           bool pad, bool moved)
{
    long long drop = 0;
    int seg = 0;
    plan.offsets[0] = 0;
    for (int e = 0; e < E; e++) {
        const int kept = capacity > 0 && counts[e] > capacity ? capacity : counts[e];
        plan.kept[e] = kept;
        kept_out[e] = kept;
        if (load) load[e] += kept;
        plan.offsets[e + 1] = plan.offsets[e] + (pad ? capacity : kept);
        seg_start[e] = seg;
        seg += moved ? kept : counts[e];
        drop += counts[e] - kept;
    }
    if (dropped) *dropped += drop;
}

// Places the slot at expert-sorted position i: rank r in its expert's segment, kept
// when r < kept[e] (the earliest tokens: MT_DROP_POSITION, or the survivors of the
// probability cut, still in token order).
__global__ static void plan_place_kernel(mt_dispatch_plan plan, const int32_t *sorted_key, const int32_t *sorted_slot,
                                         const int *seg_start, const int *kept, int S, int E)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= S) return;
    const int e = sorted_key[i], s = sorted_slot[i];
    if (e == E) {
        plan.slot_row[s] = -1;
        return;
    }
    const int r = i - seg_start[e];
    if (r < kept[e]) {
        const int row = plan.offsets[e] + r;
        plan.slot_row[s] = row;
        plan.row_slot[row] = s;
    } else {
        plan.slot_row[s] = -1;
    }
}

// Padding rows (pad: every expert has `capacity` rows) get row_slot -1.
__global__ static void plan_pad_kernel(mt_dispatch_plan plan, const int *kept, int E, int capacity)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)E * capacity) return;
    const int e = (int)(i / capacity), r = (int)(i % capacity);
    if (r >= kept[e]) plan.row_slot[plan.offsets[e] + r] = -1;
}

static int bits_for(unsigned long long x)
{
    int b = 1;
    while (b < 64 && (x >> b) != 0) b++;
    return b;
}

// Stable radix sort of (key, slot) pairs, scratch from the allocator.
template <typename K>
static void sort_pairs(mt_cuda_ctx *c, const K *key_in, K *key_out, const int32_t *val_in, int32_t *val_out, int n,
                       int end_bit)
{
    size_t bytes = 0;
    MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, bytes, key_in, key_out, val_in, val_out, n, 0, end_bit,
                                                  c->stream));
    void *temp = mt_cuda_scratch(c, bytes);
    MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, key_in, key_out, val_in, val_out, n, 0, end_bit,
                                                  c->stream));
    mt_cuda_scratch_free(c, temp);
}

// drop_mask and expert_select stream every slot of the (gathered) routing once: a grid
// of SLOT_THREADS-thread blocks, each thread SLOT_PER_THREAD slots or more (grid-strided),
// up to SLOT_MAX_BLOCKS blocks, so the slots of every MoE layer spread over the SMs
// (the floor of SLOT_PER_THREAD slots a thread keeps a block's zeroing and flushing of
// its counts small against the slots it reads).
// Each block counts in shared memory and adds its counts to the global ones with one
// atomicAdd per counter: integers, so any order of the blocks gives the same sums.
#define SLOT_THREADS 256
#define SLOT_PER_THREAD 4
#define SLOT_MAX_BLOCKS 1024

static unsigned slot_blocks(size_t n)
{
    const size_t b = mt_cdiv(n, (size_t)SLOT_THREADS * SLOT_PER_THREAD);
    return (unsigned)(b < SLOT_MAX_BLOCKS ? b : SLOT_MAX_BLOCKS);
}

// Each thread masks its slots and counts its drops into the block's count, which one
// thread adds onto *dropped (the op adds onto the caller's count: nothing is zeroed).
__global__ static void drop_mask_kernel(int32_t *out, const int32_t *idx, const int32_t *slot_row,
                                        size_t n, int64_t *dropped)
{
    MT_SHARED(unsigned long long, blk, [1]);
    if (threadIdx.x == 0) blk[0] = 0;
    __syncthreads();
    unsigned long long d = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t s = (size_t)blockIdx.x * blockDim.x + threadIdx.x; s < n; s += stride) {
        const bool drop = slot_row[s] < 0;
        out[s] = drop ? -1 : idx[s];
        d += drop;
    }
    if (d) atomicAdd(&blk[0], d);
    __syncthreads();
    if (threadIdx.x == 0 && dropped && blk[0]) atomicAdd((unsigned long long *)dropped, blk[0]);
}

extern "C" void mt_cuda_drop_mask(void *ctx, int32_t *out, const int32_t *idx, const int32_t *slot_row,
                                  size_t n, int64_t *dropped)
{
    MT_CUDA_OP(ctx, MT_OP_DROP_MASK);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (n == 0) return;
    MT_LAUNCH(slot_blocks(n), SLOT_THREADS, 0, c->stream, drop_mask_kernel)(out, idx, slot_row, n, dropped);
    MT_CUDA_LAUNCHED();
}

// Each block counts its slots per expert in a shared histogram, EXPERT_SELECT_HIST
// experts per round, and adds each nonzero count onto selected (zeroed before the
// launch). The routing is renumbered in the first round; a thread visits the same slots
// in every round, so the later rounds reread its own renumbered out (idx may be out).
#define EXPERT_SELECT_HIST 1024
__global__ static void expert_select_kernel(int32_t *out, const int32_t *idx, size_t n, int e0, int count,
                                            int64_t *selected)
{
    MT_SHARED(unsigned long long, hist, [EXPERT_SELECT_HIST]);
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (int b = 0; b == 0 || (selected && b < count); b += EXPERT_SELECT_HIST) {
        const int w = count - b < EXPERT_SELECT_HIST ? count - b : EXPERT_SELECT_HIST;
        for (int i = threadIdx.x; i < w; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (size_t s = first; s < n; s += stride) {
            int32_t e = out[s]; /* renumbered by the first round (idx may be out) */
            if (b == 0) {
                e = idx[s] >= e0 && idx[s] < e0 + count ? idx[s] - e0 : -1;
                out[s] = e;
            }
            if (e >= b && e < b + w) atomicAdd(&hist[e - b], 1ull);
        }
        __syncthreads();
        if (selected)
            for (int i = threadIdx.x; i < w; i += blockDim.x)
                if (hist[i]) atomicAdd((unsigned long long *)&selected[b + i], hist[i]);
        __syncthreads();
    }
}

extern "C" void mt_cuda_expert_select(void *ctx, int32_t *out, const int32_t *idx, size_t n, int e0,
                                      int count, int64_t *selected)
{
    MT_CUDA_OP(ctx, MT_OP_EXPERT_SELECT);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (selected && count > 0)
        MT_CUDA_CHECK(cudaMemsetAsync(selected, 0, sizeof *selected * (size_t)count, c->stream));
    if (n == 0) return;
    MT_LAUNCH(slot_blocks(n), SLOT_THREADS, 0, c->stream, expert_select_kernel)(out, idx, n, e0, count, selected);
    MT_CUDA_LAUNCHED();
}

// One block per MoE layer: thread 0 sums the loads (integers, any order) and, gated,
// decides adamw_dev's gate; every thread then a stride of the experts; the sign's
// product with rate is exact, the add rounded once, as the CPU does it.
__global__ static void expert_bias_kernel(float *bias, const int64_t *load, int E, float rate,
                                          const double *sumsq, const double *loss, int loss_stride, int n_loss)
{
    MT_SHARED(double, mean, [1]);
    MT_SHARED(int, finite, [1]);
    const int64_t *c = load + (size_t)blockIdx.x * E;
    float *b = bias + (size_t)blockIdx.x * E;
    if (threadIdx.x == 0) {
        long long total = 0;
        for (int e = 0; e < E; e++) total += c[e];
        mean[0] = (double)total / E;
        finite[0] = !sumsq || mt_q_step_taken(sumsq, loss, loss_stride, n_loss);
    }
    __syncthreads();
    if (!finite[0]) return;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const double off = mean[0] - (double)c[e];
        b[e] = __fadd_rn(b[e], __fmul_rn(rate, (float)((off > 0) - (off < 0))));
    }
}

extern "C" void mt_cuda_expert_bias_update(void *ctx, float *bias, const int64_t *load, int nmoe, int E,
                                           float rate, const double *sumsq, const double *loss, int loss_stride,
                                           int n_loss)
{
    MT_CUDA_OP(ctx, MT_OP_EXPERT_BIAS_UPDATE);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (nmoe <= 0 || E <= 0) return;
    MT_LAUNCH(nmoe, 128, 0, c->stream, expert_bias_kernel)(bias, load, E, rate, sumsq, loss, loss_stride,
                                                           n_loss);
    MT_CUDA_LAUNCHED();
}

extern "C" void mt_cuda_dispatch_plan(void *ctx, struct mt_dispatch_plan *plan, const int32_t *topk_idx,
                                      const float *topk_prob, int N, int E, int topk, int capacity,
                                      enum mt_drop_policy policy, bool pad, int64_t *dropped, int64_t *load)
{
    MT_CUDA_OP(ctx, MT_OP_DISPATCH_PLAN);
    mt_cuda_ctx *c = mt_cuda(ctx);
    const int S = N * topk;
    const bool by_prob = capacity > 0 && policy == MT_DROP_PROBS;
    // scratch: counts, starts, kept (E ints each) | iota, key2, sorted key2, sorted slots (S ints each)
    // | drop flags (S) | 64-bit keys in and out (2S, by_prob only)
    const size_t e_bytes = (3 * (size_t)E * sizeof(int) + 15) / 16 * 16;
    const size_t s_bytes = ((size_t)S * sizeof(int32_t) + 15) / 16 * 16;
    const size_t flag_bytes = ((size_t)S + 15) / 16 * 16;
    const size_t total = e_bytes + 4 * s_bytes + flag_bytes + (by_prob ? 2 * (size_t)S * 8 : 0);
    unsigned char *buf = (unsigned char *)mt_cuda_scratch(c, total);
    int *counts = (int *)buf, *start = counts + E, *kept = start + E;
    int32_t *iota = (int32_t *)(buf + e_bytes);
    int32_t *key2 = (int32_t *)((unsigned char *)iota + s_bytes);
    int32_t *key2_sorted = (int32_t *)((unsigned char *)key2 + s_bytes);
    int32_t *slot_sorted = (int32_t *)((unsigned char *)key2_sorted + s_bytes);
    unsigned char *drop = (unsigned char *)slot_sorted + s_bytes;
    unsigned long long *key1 = (unsigned long long *)(drop + flag_bytes), *key1_sorted = key1 + S;

    MT_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int) * (size_t)E, c->stream));
    const unsigned gs = mt_cdiv(S > 0 ? S : 1, 256);
    if (S > 0) {
        MT_LAUNCH(gs, 256, 0, c->stream, mt_iota_kernel)(iota, S);
        MT_LAUNCH(gs, 256, 0, c->stream, expert_hist_kernel)(counts, topk_idx, S);
        MT_CUDA_LAUNCHED();
    }
    if (by_prob && S > 0) {
        MT_LAUNCH(gs, 256, 0, c->stream, prob_key_kernel)(key1, topk_idx, topk_prob, S, E);
        MT_LAUNCH(1, 1, 0, c->stream, expert_starts_kernel)(start, counts, E);
        MT_CUDA_LAUNCHED();
        sort_pairs(c, (const unsigned long long *)key1, key1_sorted, iota, slot_sorted, S, 32 + bits_for((unsigned)E));
        MT_LAUNCH(gs, 256, 0, c->stream, prob_drop_kernel)(drop, key1_sorted, slot_sorted, start, S, E, capacity);
        MT_CUDA_LAUNCHED();
    }
    MT_LAUNCH(1, 1, 0, c->stream, plan_offsets_kernel)(*plan, start, kept, dropped, load, counts, E, capacity, pad,
                                                                 by_prob);
    MT_CUDA_LAUNCHED();
    if (S > 0) {
        MT_LAUNCH(gs, 256, 0, c->stream, expert_key_kernel)(key2, topk_idx, by_prob ? drop : NULL, S, E);
        MT_CUDA_LAUNCHED();
        sort_pairs(c, (const int32_t *)key2, key2_sorted, iota, slot_sorted, S, bits_for((unsigned)E));
        MT_LAUNCH(gs, 256, 0, c->stream, plan_place_kernel)(*plan, key2_sorted, slot_sorted, start, kept, S, E);
        MT_CUDA_LAUNCHED();
    }
    if (pad && capacity > 0 && E > 0) {
        MT_LAUNCH(mt_cdiv((size_t)E * capacity, 256), 256, 0, c->stream, plan_pad_kernel)(*plan, kept, E, capacity);
        MT_CUDA_LAUNCHED();
    }
    mt_cuda_scratch_free(c, buf);
}

// ---------------------------------------------------------------- permute, unpermute

// xp (rows,C) = x[row_slot / k], zero rows for padding; one block per row. Typed
// tensors: read and written in their dtypes (mt_ld/mt_st, cuda_common.cuh).
template <typename TO, typename TX>
__global__ static void permute_fwd_kernel(TO *xp, const TX *x, const int32_t *row_slot, int topk, int C, bool vec)
{
    const size_t r = blockIdx.x;
    const int s = row_slot[r];
    TO *dst = xp + r * C;
    const TX *src = s >= 0 ? x + (size_t)(s / topk) * C : NULL;
    if (vec) {
        for (int c = threadIdx.x; c < C / 4; c += blockDim.x)
            mt_st4(dst, c, src ? mt_ld4(src, c) : make_float4(0.f, 0.f, 0.f, 0.f));
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) mt_st(dst, c, src ? mt_ld(src, c) : 0.0f);
    }
}

extern "C" void mt_cuda_permute_fwd(void *ctx, struct mt_tensor xp, struct mt_tensor x, const int32_t *row_slot,
                                    int rows, int topk, int C)
{
    MT_CUDA_OP(ctx, MT_OP_PERMUTE_FWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    mt_cuda_tensor_check("permute_fwd", "xp", xp, true), mt_cuda_tensor_check("permute_fwd", "x", x, true);
    if (rows <= 0 || C <= 0) return;
    const bool vec = C % 4 == 0 && mt_aligned4(xp.data, xp.dtype) && mt_aligned4(x.data, x.dtype);
    mt_with_elem(xp.dtype, [&](auto o) {
        mt_with_elem(x.dtype, [&](auto i) {
            using TO = MT_ELEM(o);
            using TX = MT_ELEM(i);
            MT_LAUNCH(rows, 128, 0, c->stream, permute_fwd_kernel<TO, TX>)((TO *)xp.data, (const TX *)x.data,
                                                                        row_slot, topk, C, vec);
        });
    });
    MT_CUDA_LAUNCHED();
}

// dx (N,C) += dxp rows of the token's kept slots, slots in order (the CPU's order).
__global__ static void permute_bwd_kernel(float *dx, const float *dxp, const int32_t *slot_row, int N, int topk, int C)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    const size_t n = i / C, c = i % C;
    float acc = dx[i];
    for (int j = 0; j < topk; j++) {
        const int r = slot_row[n * topk + j];
        if (r >= 0) acc += dxp[(size_t)r * C + c];
    }
    dx[i] = acc;
}

extern "C" void mt_cuda_permute_bwd(void *ctx, float *dx, const float *dxp, const int32_t *slot_row, int N, int topk,
                                    int C)
{
    MT_CUDA_OP(ctx, MT_OP_PERMUTE_BWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (N <= 0 || C <= 0) return;
    MT_LAUNCH(mt_cdiv((size_t)N * C, 256), 256, 0, c->stream, permute_bwd_kernel)(dx, dxp, slot_row, N, topk, C);
    MT_CUDA_LAUNCHED();
}

// out (N,C) = sum_j prob yp[slot_row], products and sums rounded separately as on the CPU.
template <typename TO, typename TY>
__global__ static void unpermute_fwd_kernel(TO *out, const TY *yp, const int32_t *slot_row, const float *prob, int N,
                                            int topk, int C)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    const size_t n = i / C, c = i % C;
    float acc = 0.0f;
    for (int j = 0; j < topk; j++) {
        const size_t s = n * topk + j;
        const int r = slot_row[s];
        if (r >= 0) acc = __fadd_rn(acc, __fmul_rn(prob[s], mt_ld(yp, (size_t)r * C + c)));
    }
    mt_st(out, i, acc);
}

extern "C" void mt_cuda_unpermute_fwd(void *ctx, struct mt_tensor out, struct mt_tensor yp, const int32_t *slot_row,
                                      const float *prob, int N, int topk, int C)
{
    MT_CUDA_OP(ctx, MT_OP_UNPERMUTE_FWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    mt_cuda_tensor_check("unpermute_fwd", "out", out, true), mt_cuda_tensor_check("unpermute_fwd", "yp", yp, true);
    if (N <= 0 || C <= 0) return;
    mt_with_elem(out.dtype, [&](auto o) {
        mt_with_elem(yp.dtype, [&](auto y) {
            using TO = MT_ELEM(o);
            using TY = MT_ELEM(y);
            MT_LAUNCH(mt_cdiv((size_t)N * C, 256), 256, 0, c->stream, unpermute_fwd_kernel<TO, TY>)(
                (TO *)out.data, (const TY *)yp.data, slot_row, prob, N, topk, C);
        });
    });
    MT_CUDA_LAUNCHED();
}

// One warp per slot: dyp[row] = prob dout[n], dprob = <dout[n], yp[row]> (0 if dropped).
template <typename TY>
__global__ static void unpermute_bwd_kernel(float *dyp, float *dprob, const float *dout, const TY *yp,
                                            const int32_t *slot_row, const float *prob, int N, int topk, int C)
{
    const size_t s = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (s >= (size_t)N * topk) return;
    const int r = slot_row[s];
    if (r < 0) {
        if (lane == 0) dprob[s] = 0.0f;
        return;
    }
    const float *d = dout + (s / topk) * C;
    const TY *y = yp + (size_t)r * C;
    float *dy = dyp + (size_t)r * C;
    const float p = prob[s];
    float dot = 0.0f;
    for (int c = lane; c < C; c += 32) {
        dy[c] = p * d[c];
        dot += d[c] * mt_ld(y, c);
    }
    dot = mt_warp_sum(dot);
    if (lane == 0) dprob[s] = dot;
}

extern "C" void mt_cuda_unpermute_bwd(void *ctx, float *dyp, float *dprob, const float *dout, struct mt_tensor yp,
                                      const int32_t *slot_row, const float *prob, int N, int topk, int C, int rows)
{
    MT_CUDA_OP(ctx, MT_OP_UNPERMUTE_BWD);
    mt_cuda_ctx *c = mt_cuda(ctx);
    mt_cuda_tensor_check("unpermute_bwd", "yp", yp, true);
    if (rows > 0 && C > 0) MT_CUDA_CHECK(cudaMemsetAsync(dyp, 0, sizeof(float) * (size_t)rows * C, c->stream));
    if (N <= 0 || topk <= 0) return;
    const size_t slots = (size_t)N * topk;
    mt_with_elem(yp.dtype, [&](auto y) {
        using TY = MT_ELEM(y);
        MT_LAUNCH(mt_cdiv(slots, 8), 256, 0, c->stream, unpermute_bwd_kernel<TY>)(dyp, dprob, dout, (const TY *)yp.data,
                                                                                slot_row, prob, N, topk, C);
    });
    MT_CUDA_LAUNCHED();
}

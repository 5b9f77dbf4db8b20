/* moetrain: the op table every compute backend fills (doc/architecture.md, section 3).
 *
 * Model and training code call compute only through a `const struct mt_kernels *`:
 * a table of function pointers plus a backend context. kernels/cpu/ is the
 * reference (the definition of truth); kernels/cuda/ fills the same table.
 *
 * Conventions, for every op:
 * - Pointers are backend memory (from alloc); row-major; fp32 unless stated.
 * - Arguments whose element type varies are typed tensors (struct mt_tensor below):
 *   the data pointer with its dtype, shape and row stride. Activations, the working
 *   copy of the weights and what is saved for backward are bf16 in bf16 training;
 *   gradients, statistics (rstd, lse), router scores and losses stay fp32 pointers. A
 *   typed output is written in its own dtype by the op that produces it (bf16: round to
 *   nearest even from the op's fp32 result), so no separate rounding pass exists; a
 *   typed input is read exactly (bf16 and fp32 values are fp32 values). Ops accept
 *   MT_F32 and MT_BF16 for every typed argument unless stated; the fp8 dtypes are
 *   reserved for the FP8 recipes (an op given one it does not take aborts).
 * - Shapes are given in a one-line comment, llm.c style: `// out is (N,C)`.
 *   N is a token count (B*T), C a channel count.
 * - "+=" marks outputs that are accumulated into (gradients of parameters and of
 *   tensors with several consumers); "=" marks outputs that are overwritten.
 * - Results are deterministic run to run: reductions have a fixed order and no
 *   result depends on atomics or on thread scheduling.
 * - Index arrays are int32; -1 means "none" (dropped slot, padding row,
 *   ignored target).
 * - Scalar results stay where the op runs: the loss sum, the balancing and z losses and
 *   dispatch_plan's dropped count and expert loads are added to accumulators in backend
 *   memory, which the caller reads when it needs them (the trainer once per step), so
 *   these ops never make a device backend wait.
 *
 * Adding an op: add its enum value and name, its slot in struct mt_kernel_ops (same
 * position), the CPU reference, the CUDA version, and the parity test. The static
 * assertions below catch a slot or a name that was forgotten. */
#ifndef MT_KERNELS_KERNELS_H
#define MT_KERNELS_KERNELS_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/quant_recipe.h"

/* The partial sums of loss_sum's fixed order (struct mt_ops loss_sum): a power of two. */
#define MT_LOSS_SUM_LANES 256

/* Element types of typed tensors. */
enum mt_dtype {
    MT_F32 = 0,
    MT_BF16 = 1,  /* bfloat16: the high half of an fp32 */
    MT_E4M3 = 2,  /* fp8 (OCP E4M3), with a scale (reserved) */
    MT_E5M2 = 3,  /* fp8 (OCP E5M2), with a scale (reserved) */
};

/* Bytes of one element of dtype. */
static inline size_t mt_dtype_size(enum mt_dtype t) { return t == MT_F32 ? 4 : t == MT_BF16 ? 2 : 1; }

/* A 2-D view of backend memory: rows x cols elements of dtype, row r starting at
 * element r * ld of data (ld >= cols). Tensors of more dimensions are given as the 2-D
 * view an op names in its comment, e.g. (B,T,H,D) as (B*T, H*D). scale: the fp8
 * dequantisation scale (backend memory, one fp32) for the fp8 dtypes; NULL otherwise. */
struct mt_tensor {
    void *data;
    enum mt_dtype dtype;
    int64_t rows, cols, ld;
    const float *scale;
};

/* A dense (ld = cols) view; data may be a pointer to const for an input. */
static inline struct mt_tensor mt_tview(const void *data, enum mt_dtype dtype, int64_t rows,
                                        int64_t cols)
{
    return (struct mt_tensor){(void *)(uintptr_t)data, dtype, rows, cols, cols, NULL};
}

/* A view with row stride ld. */
static inline struct mt_tensor mt_tview_ld(const void *data, enum mt_dtype dtype, int64_t rows,
                                           int64_t cols, int64_t ld)
{
    return (struct mt_tensor){(void *)(uintptr_t)data, dtype, rows, cols, ld, NULL};
}

/* An fp32 view. */
static inline struct mt_tensor mt_f32(const float *data, int64_t rows, int64_t cols)
{
    return mt_tview(data, MT_F32, rows, cols);
}

/* Bytes from the first element to one past the last (0 for an empty view). */
static inline size_t mt_tensor_bytes(struct mt_tensor t)
{
    if (t.rows <= 0 || t.cols <= 0) return 0;
    return ((size_t)(t.rows - 1) * (size_t)t.ld + (size_t)t.cols) * mt_dtype_size(t.dtype);
}

/* Bytes of the elements (rows x cols x element size): what an op reads or writes. */
static inline size_t mt_tensor_payload(struct mt_tensor t)
{
    if (t.rows <= 0 || t.cols <= 0) return 0;
    return (size_t)t.rows * (size_t)t.cols * mt_dtype_size(t.dtype);
}

enum mt_op {
    /* memory and streams */
    MT_OP_ALLOC,
    MT_OP_FREE,
    MT_OP_ALLOC_HOST,
    MT_OP_FREE_HOST,
    MT_OP_MEMSET,
    MT_OP_COPY,
    MT_OP_SYNC,
    /* the copy stream (activation offloading) */
    MT_OP_EVENT_CREATE,
    MT_OP_EVENT_DESTROY,
    MT_OP_EVENT_RECORD,
    MT_OP_EVENT_WAIT,
    MT_OP_COPY_ASYNC,
    /* dense algebra */
    MT_OP_GEMM,
    MT_OP_GROUPED_GEMM,
    /* layers */
    MT_OP_EMBEDDING_FWD,
    MT_OP_EMBEDDING_BWD,
    MT_OP_RMSNORM_FWD,
    MT_OP_RMSNORM_BWD,
    MT_OP_ROPE_FWD,
    MT_OP_ROPE_BWD,
    MT_OP_ATTENTION_FWD,
    MT_OP_ATTENTION_BWD,
    MT_OP_SWIGLU_FWD,
    MT_OP_SWIGLU_BWD,
    MT_OP_ADD,
    /* mixture of experts */
    MT_OP_ROUTER_FWD,
    MT_OP_ROUTER_BWD,
    MT_OP_AUX_COUNTS,
    MT_OP_AUX_LOSS_FWD,
    MT_OP_AUX_LOSS_BWD,
    MT_OP_Z_LOSS_FWD,
    MT_OP_Z_LOSS_BWD,
    MT_OP_DISPATCH_PLAN,
    MT_OP_DROP_MASK,
    MT_OP_EXPERT_SELECT,
    MT_OP_EXPERT_BIAS_UPDATE,
    MT_OP_PERMUTE_FWD,
    MT_OP_PERMUTE_BWD,
    MT_OP_UNPERMUTE_FWD,
    MT_OP_UNPERMUTE_BWD,
    /* loss, optimizer, precision */
    MT_OP_CROSS_ENTROPY_FWD,
    MT_OP_CROSS_ENTROPY_BWD,
    MT_OP_LSE_COMBINE,
    MT_OP_LOSS_SUM,
    MT_OP_ADAMW,
    MT_OP_ADAMW_DEV,
    MT_OP_BF16_ROUND,
    MT_OP_CONVERT,
    MT_OP_SCALE,
    MT_OP_SUMSQ,
    MT_OP_AMAX_HISTORY,
    MT_OP_COUNT
};

/* Whether a step is taken, decided on the device (a captured iteration's,
 * doc/host-overhead.md) as the trainer decides it on the host: *sumsq (the gradients'
 * squared norm) and the n_loss loss sums loss[i * loss_stride], all backend memory, are
 * finite (mt_q_step_taken). */
struct mt_step_gate {
    const double *sumsq, *loss;
    int loss_stride, n_loss;
};

/* AdamW's constants of step t (t >= 1), computed on the host once for a tensor's update
 * (adamw computes them from its arguments so; adamw_dev takes them from backend memory):
 * param = param * decay - step * m / (sqrt(v) / bc2_sqrt + eps). */
struct mt_adamw_consts {
    float step, decay, bc2_sqrt, beta1, beta2, one_m_b1, one_m_b2, eps;
};
static inline struct mt_adamw_consts mt_adamw_consts_of(float lr, float beta1, float beta2, float eps,
                                                        float weight_decay, long long t)
{
    struct mt_adamw_consts k;
    const float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
    k.bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, (double)t));
    k.step = lr / bc1;
    k.decay = 1.0f - lr * weight_decay;
    k.beta1 = beta1;
    k.beta2 = beta2;
    k.one_m_b1 = 1.0f - beta1;
    k.one_m_b2 = 1.0f - beta2;
    k.eps = eps;
    return k;
}

/* A backend's two streams: every op runs on COMPUTE in call order; copy_async runs on
 * COPY, beside it. Events order one against the other. */
enum mt_stream { MT_STREAM_COMPUTE, MT_STREAM_COPY };

/* "gemm", "grouped_gemm", ...: indexed by enum mt_op. */
extern const char *const mt_op_names[MT_OP_COUNT];

/* Router score function (moe%router_score_function). */
enum mt_score_fn { MT_SCORE_SOFTMAX = 0, MT_SCORE_SIGMOID = 1 };

/* Which token-expert assignments survive when an expert is over capacity
 * (moe%token_drop_policy). */
enum mt_drop_policy { MT_DROP_PROBS = 0, MT_DROP_POSITION = 1 };

/* Top-k routing, Megatron's topk_routing_with_score_function:
 *   softmax, pre_softmax:   p = softmax(logits); pick top-k of p (+bias); prob = p[idx]
 *   softmax, !pre_softmax:  pick top-k of logits (+bias); prob = softmax over the k
 *                           logits (= HF norm_topk_prob renormalisation)
 *   sigmoid:                s = sigmoid(logits); pick top-k of s + bias;
 *                           prob = s[idx] / (sum_k s[idx] + 1e-20) when topk > 1, else s[idx]
 * then prob *= scaling_factor (0 means none). Ties pick the lower expert index. The
 * expert bias only changes which experts are picked, never prob. */
struct mt_router_args {
    int num_tokens;
    int num_experts;
    int topk;
    enum mt_score_fn score_fn;
    bool pre_softmax;
    float scaling_factor;
};

/* Megatron's load-balancing loss over the tokens of num_seqs equal sequences of
 * seq_len tokens (num_seqs = 1, seq_len = all tokens: switch_load_balancing_loss_func,
 * 'aux_loss'; num_seqs = B, seq_len = T: sequence_load_balancing_loss_func,
 * 'seq_aux_loss'). A call sees num_tokens of them, starting at token `first` of the
 * whole (a sequence-parallel shard); with p = softmax(logits) (softmax) or
 * sigmoid(logits)/sum(sigmoid) (sigmoid), and count[s,e] the tokens of sequence s
 * whose top-k of p contains e, summed over every shard:
 *   loss = coeff / num_seqs * sum_s E / (seq_len^2 k) * sum_e count[s,e] * sum_{n in s} p[n,e]
 * Each shard's call returns its own tokens' part of the sum; the parts add up to the loss. */
struct mt_aux_args {
    int num_tokens;     /* tokens of this call */
    int num_experts;
    int topk;
    enum mt_score_fn score_fn;
    int num_seqs;       /* sequences of the whole */
    int seq_len;        /* tokens per sequence of the whole */
    long long first;    /* index of this call's first token in the whole */
    float coeff;
};

/* Output of dispatch_plan: where each token-expert assignment ("slot" s = n*topk + j)
 * goes in the expert-sorted ("permuted") row order. Rows of expert e are
 * offsets[e]..offsets[e+1]-1, in increasing token order. */
struct mt_dispatch_plan {
    int32_t *offsets;    /* (E+1) row offsets per expert; offsets[E] = rows */
    int32_t *row_slot;   /* (rows_max) slot feeding each row, -1 for a padding row */
    int32_t *slot_row;   /* (N*topk) row of each slot, -1 when the slot was dropped */
    int64_t *kept;       /* (E) real (non-padding) rows per expert */
};

struct mt_kernel_ops {
    /* ---- memory and streams (CPU: host memory; CUDA: device memory, stream order) ---- */
    void *(*alloc)(void *ctx, size_t bytes);              /* 64-byte aligned; NULL on failure */
    void (*free)(void *ctx, void *p);
    /* Host memory that copy moves to and from the backend at full speed and that the
     * host reads and writes directly (CUDA: page-locked, cudaMallocHost; CPU: plain).
     * Slow to get on a GPU machine (pinning): allocate once and keep it. Freed with
     * free_host only. 64-byte aligned; NULL on failure. */
    void *(*alloc_host)(void *ctx, size_t bytes);
    void (*free_host)(void *ctx, void *p);
    void (*memset)(void *ctx, void *p, int byte, size_t bytes);
    void (*copy)(void *ctx, void *dst, const void *src, size_t bytes); /* any direction */
    void (*sync)(void *ctx);                              /* wait for all queued work */
    /* ---- the copy stream: copies that overlap compute (activation offloading) ----
     * event_record marks the point stream s has reached (what was queued on it so far);
     * event_wait makes stream s wait, on the device (the host does not), until the
     * event's last recorded point has run. An event recorded again marks the new point.
     * The host never waits here; sync waits for COMPUTE only. */
    void *(*event_create)(void *ctx);                     /* NULL on failure */
    void (*event_destroy)(void *ctx, void *ev);
    void (*event_record)(void *ctx, void *ev, enum mt_stream s);
    void (*event_wait)(void *ctx, enum mt_stream s, void *ev);
    /* bytes from src to dst on the COPY stream, one side backend memory and the other
     * alloc_host memory; returns at once. It starts when the COPY stream gets there:
     * wait there (event_wait COPY) for the compute that wrote src or last used dst.
     * Until an event recorded on COPY after it has been waited for on COMPUTE, no op
     * may touch its backend-memory side, and the host neither side. */
    void (*copy_async)(void *ctx, void *dst, const void *src, size_t bytes);

    /* ---- dense algebra ---- */
    /* C (M,N) = alpha * op(A) op(B) + beta * C; op(A) is (M,K), op(B) is (K,N);
     * A is stored (M,K) or, transposed, (K,M); likewise B; the tensors' shapes are the
     * stored ones and their ld the leading dimensions. A, B: fp32 or bf16 (products
     * are formed and summed in fp32); C: fp32, or bf16 with beta = 0. beta = 0 ignores
     * what C held (NaN included). */
    void (*gemm)(void *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                 struct mt_tensor A, struct mt_tensor B, float beta, struct mt_tensor C);
    /* One gemm per group g (an expert); m_g = offsets[g+1] - offsets[g] token rows,
     * taken from the token-sorted tensors at row offsets[g]; per-expert weight slabs
     * are contiguous, slab g at g*(slab size).
     *   !trans_a: C_g (m_g,N) = alpha A_g (m_g,K) op(W_g) + beta C_g, W = B holds slabs
     *             of (N,K) if trans_b (x W^T: Linear forward) else (K,N) (dgrad); M unused.
     *   trans_a:  C_g (M,N) = alpha A_g^T (M,m_g) B_g (m_g,N) + beta C_g, C holds the
     *             (M,N) slabs (weight gradients), A is (rows,M), B is (rows,N); K unused,
     *             trans_b must be false. A group with m_g = 0 leaves C_g = beta C_g.
     * Tensors are dense: A, B and C are viewed as (rows or slabs x slab rows, width);
     * dtypes as for gemm. */
    void (*grouped_gemm)(void *ctx, bool trans_a, bool trans_b, int num_groups,
                         const int32_t *offsets, int M, int N, int K, float alpha,
                         struct mt_tensor A, struct mt_tensor B, float beta, struct mt_tensor C);

    /* ---- layers ---- */
    // out is (N,C) = wte[tokens]; tokens (N) in [0,V) or -1 (a token of another vocabulary
    // shard: a zero row); wte is (V,C)
    void (*embedding_fwd)(void *ctx, struct mt_tensor out, const int32_t *tokens,
                          struct mt_tensor wte, int N, int C);
    // dwte (V,C) += scatter of dout (N,C) by tokens (N); tokens < 0 are skipped
    void (*embedding_bwd)(void *ctx, float *dwte, const float *dout, const int32_t *tokens,
                          int N, int C);
    // out (N,C) = x / sqrt(mean(x^2) + eps) * w; rstd (N) saved; x, w (C). Used per head
    // for QK-norm with N = tokens*heads, C = head_dim.
    void (*rmsnorm_fwd)(void *ctx, struct mt_tensor out, float *rstd, struct mt_tensor x,
                        struct mt_tensor w, int N, int C, float eps);
    // dx (N,C) +=, dw (C) +=; dout, x (N,C); rstd (N) from the forward
    void (*rmsnorm_bwd)(void *ctx, float *dx, float *dw, const float *dout, struct mt_tensor x,
                        struct mt_tensor w, const float *rstd, int N, int C);
    // out (B,T,H,D) = rope(x) (HF rotate-half; angle t * theta^(-2i/D), t = 0..T-1);
    // out may alias x (same dtype); D even
    void (*rope_fwd)(void *ctx, struct mt_tensor out, struct mt_tensor x, int B, int T, int H,
                     int D, float theta);
    // dx (B,T,H,D) = rope^T(dout); dx may alias dout
    void (*rope_bwd)(void *ctx, float *dx, const float *dout, int B, int T, int H, int D,
                     float theta);
    // Causal GQA attention, softmax(q k^T / sqrt(D)) v in fp32, head h uses KV group
    // h / (Hq/Hkv); no T x T tensor is stored. out (B,T,Hq,D); lse (B,Hq,T) = per query
    // row, the logsumexp of the scaled causal scores; q (B,T,Hq,D); k, v (B,T,Hkv,D)
    void (*attention_fwd)(void *ctx, float *out, float *lse, struct mt_tensor q,
                          struct mt_tensor k, struct mt_tensor v, int B, int T, int Hq, int Hkv,
                          int D);
    // dq (B,T,Hq,D) =, dk, dv (B,T,Hkv,D) =; dout (B,T,Hq,D); out and lse exactly as the
    // forward wrote them (the probabilities are recomputed from q, k and lse)
    void (*attention_bwd)(void *ctx, float *dq, float *dk, float *dv, const float *dout,
                          struct mt_tensor q, struct mt_tensor k, struct mt_tensor v,
                          const float *out, const float *lse, int B, int T, int Hq, int Hkv,
                          int D);
    // out (N,F) = silu(gate) * up; gate, up (N,F)
    void (*swiglu_fwd)(void *ctx, struct mt_tensor out, struct mt_tensor gate,
                       struct mt_tensor up, int N, int F);
    // dgate, dup (N,F) =; dout, gate, up (N,F)
    void (*swiglu_bwd)(void *ctx, float *dgate, float *dup, const float *dout,
                       struct mt_tensor gate, struct mt_tensor up, int N, int F);
    // out (n) = a + b, summed in fp32; out may alias a or b (same dtype; residual
    // connections); the tensors are (1,n) views
    void (*add)(void *ctx, struct mt_tensor out, struct mt_tensor a, struct mt_tensor b, size_t n);

    /* ---- mixture of experts ---- */
    // Top-k routing (see struct mt_router_args). logits (N,E); expert_bias (E) or NULL;
    // topk_idx (N,k) = expert ids, best first; topk_prob (N,k) = routing weights
    void (*router_fwd)(void *ctx, const struct mt_router_args *a, const float *logits,
                       const float *expert_bias, int32_t *topk_idx, float *topk_prob);
    // dlogits (N,E) += d topk_prob (N,k) through the score function and normalisation
    // (the selection itself is piecewise constant)
    void (*router_bwd)(void *ctx, const struct mt_router_args *a, float *dlogits,
                       const float *dprob, const float *logits, const int32_t *topk_idx);
    // counts (num_seqs,E) = per sequence, the tokens of this call whose top-k of p contains
    // e (see struct mt_aux_args; tokens of other shards count 0); logits (N,E)
    void (*aux_counts)(void *ctx, const struct mt_aux_args *a, float *counts, const float *logits);
    // acc (1, backend memory) += this call's part of the balancing loss (formed as a
    // float, then widened), given the counts of the whole (summed over shards);
    // logits (N,E), counts (num_seqs,E)
    void (*aux_loss_fwd)(void *ctx, const struct mt_aux_args *a, double *acc,
                         const float *counts, const float *logits);
    // dlogits (N,E) += dloss * d loss / d logits (counts are constants, as in Megatron)
    void (*aux_loss_bwd)(void *ctx, const struct mt_aux_args *a, float *dlogits, float dloss,
                         const float *counts, const float *logits);
    // acc (1, backend memory) += z-loss = coeff * mean_n logsumexp(logits[n])^2 (formed as
    // a float, then widened), or acc NULL: only lse; lse (N) saved
    void (*z_loss_fwd)(void *ctx, double *acc, float *lse, const float *logits, int N, int E,
                       float coeff);
    // dlogits (N,E) += dloss * coeff * 2 lse[n] / N * softmax(logits[n])
    void (*z_loss_bwd)(void *ctx, float *dlogits, float dloss, const float *lse,
                       const float *logits, int N, int E, float coeff);
    // Sorts the N*k assignments by expert (Megatron's permute order: expert-major, tokens
    // ascending); an assignment with topk_idx -1 (dropped or routed elsewhere beforehand)
    // gets no row and is not counted as dropped. capacity <= 0: dropless, rows = N*k. Otherwise an expert keeps at
    // most `capacity` assignments: the highest topk_prob (MT_DROP_PROBS; ties: lower
    // token) or the earliest tokens (MT_DROP_POSITION); with pad, every expert gets
    // exactly `capacity` rows, padding rows have row_slot -1. dropped (1) += the dropped
    // assignments and load (E) += plan->kept, in backend memory; either may be NULL.
    // Non-differentiable bookkeeping.
    void (*dispatch_plan)(void *ctx, struct mt_dispatch_plan *plan, const int32_t *topk_idx,
                          const float *topk_prob, int N, int E, int topk, int capacity,
                          enum mt_drop_policy policy, bool pad, int64_t *dropped,
                          int64_t *load);
    // Capacity decided over a larger group (the TP group's whole micro-batch): out (n) =
    // idx, with -1 where slot_row < 0 (the plan of the whole dropped the assignment);
    // dropped (1, backend memory, or NULL) += those assignments. out may alias idx.
    void (*drop_mask)(void *ctx, int32_t *out, const int32_t *idx, const int32_t *slot_row,
                      size_t n, int64_t *dropped);
    // The routing of a group's tokens seen by the holder of experts e0..e0+count-1:
    // out (n) = idx - e0 where e0 <= idx < e0 + count, else -1 (another rank's expert, or
    // dropped); selected (count, backend memory, or NULL) = how many select each of the
    // count experts (the rows of each, which the host reads to split them). out may
    // alias idx.
    void (*expert_select)(void *ctx, int32_t *out, const int32_t *idx, size_t n, int e0,
                          int count, int64_t *selected);
    // Megatron's get_updated_expert_bias, per MoE layer i of nmoe: bias (nmoe,E) +=
    // rate * sign(mean - load), load (nmoe,E) the step's assignments per expert, mean
    // their mean over the layer's E experts (in fp64); the sign in fp32 (-1, 0 or 1).
    // With sumsq non-NULL the update is gated as adamw_dev's (a captured iteration's):
    // nothing is written when *sumsq or one of the n_loss values loss[i * loss_stride]
    // (doubles) is not finite; sumsq NULL updates unconditionally (loss unread)
    void (*expert_bias_update)(void *ctx, float *bias, const int64_t *load, int nmoe, int E,
                               float rate, const double *sumsq, const double *loss,
                               int loss_stride, int n_loss);
    // xp (rows,C) = x[row_slot / k] (zero for padding rows); x (N,C)
    void (*permute_fwd)(void *ctx, struct mt_tensor xp, struct mt_tensor x,
                        const int32_t *row_slot, int rows, int topk, int C);
    // dx (N,C) += sum over the kept slots of token n of dxp[slot_row]; dxp (rows,C)
    void (*permute_bwd)(void *ctx, float *dx, const float *dxp, const int32_t *slot_row,
                        int N, int topk, int C);
    // out (N,C) = sum_j prob[n,j] * yp[slot_row[n,j]] over kept slots; yp (rows,C);
    // prob, slot_row (N,k)
    void (*unpermute_fwd)(void *ctx, struct mt_tensor out, struct mt_tensor yp,
                          const int32_t *slot_row, const float *prob, int N, int topk, int C);
    // dyp (rows,C) = (padding rows 0); dprob (N,k) = (dropped slots 0); dout (N,C)
    void (*unpermute_bwd)(void *ctx, float *dyp, float *dprob, const float *dout,
                          struct mt_tensor yp, const int32_t *slot_row, const float *prob,
                          int N, int topk, int C, int rows);

    /* ---- loss, optimizer, precision ---- */
    // Cross-entropy over a vocabulary shard: logits (N,V) hold the columns of vocabulary
    // ids v0..v0+V-1 (the whole vocabulary: v0 = 0). lse (N) = logsumexp over these columns;
    // tlogit (N) = logits[n, targets[n] - v0] when the target lies in the shard, else 0.
    // A token's loss is (logsumexp over all shards) - (sum of tlogit over shards); a
    // negative target is ignored (loss 0).
    void (*cross_entropy_fwd)(void *ctx, float *lse, float *tlogit, const float *logits,
                              const int32_t *targets, int N, int V, int v0);
    // dlogits (N,V) = scale * (exp(logits - lse) - onehot(target - v0)), the onehot only when
    // the target lies in the shard; lse (N) is over the whole vocabulary; rows with
    // target < 0 are 0; dlogits may alias logits. Mean over valid tokens: scale = 1 / count.
    void (*cross_entropy_bwd)(void *ctx, float *dlogits, const float *logits, const float *lse,
                              const int32_t *targets, int N, int V, int v0, float scale);
    // Vocabulary-parallel cross-entropy: lse (N) = the logsumexp over the vocabulary of
    // the shards' logsumexps shard_lse (R,N), in shard order with the largest factored
    // out: hi = max_r shard_lse[r,n], lse[n] = hi + (float)log(sum_r exp((double)
    // shard_lse[r,n] - hi)), the sum in fp64 in r order
    void (*lse_combine)(void *ctx, float *lse, const float *shard_lse, int R, int N);
    // acc (1) += sum over n with targets[n] >= 0 of (double)(lse[n] - tlogit[n]) (the
    // difference in fp32), summed in fp64 in a fixed order every backend keeps: lane j
    // of MT_LOSS_SUM_LANES sums the tokens n = j (mod MT_LOSS_SUM_LANES) in n order,
    // then the lanes pairwise (lane j += lane j + w, w = MT_LOSS_SUM_LANES / 2 .. 1), then the
    // total is added: the micro-batch's cross-entropy sum stays in backend memory (acc
    // one double), and a GPU sums it with one block, not one thread
    void (*loss_sum)(void *ctx, double *acc, const float *lse, const float *tlogit,
                     const int32_t *targets, int N);
    // AdamW (torch.optim.AdamW semantics) on n fp32 master values, step t >= 1:
    //   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    //   param *= 1 - lr*wd;  param -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
    void (*adamw)(void *ctx, float *param, const float *grad, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay,
                  float grad_scale, long long t);
    // adamw with its constants *k (mt_adamw_consts_of) in backend memory and its gate
    // decided on the device, so that the step needs no host value (a captured
    // iteration's, doc/host-overhead.md): nothing is written when *sumsq or one of the
    // n_loss values loss[i * loss_stride] (doubles) is not finite; else grad_scale =
    // clip > 0 && sqrt(*sumsq) > clip ? clip / (sqrt(*sumsq) + 1e-6) : 1 in fp64, rounded
    // to float (the trainer's clipping coefficient of the gradient norm), and the update
    // is adamw's with k
    void (*adamw_dev)(void *ctx, float *param, const float *grad, float *m, float *v, size_t n,
                      const struct mt_adamw_consts *k, const double *sumsq, const double *loss,
                      int loss_stride, int n_loss, double clip);
    // out (n) = x rounded to bfloat16 (round to nearest, ties to even; NaN stays NaN,
    // sign kept; +-Inf kept), stored widened to fp32; out may alias x
    void (*bf16_round)(void *ctx, float *out, const float *x, size_t n);
    // dst = src converted element by element (same shape): fp32 -> bf16 rounds to
    // nearest even (as bf16_round), bf16 -> fp32 is exact, same dtype copies
    void (*convert)(void *ctx, struct mt_tensor dst, struct mt_tensor src);
    // x (n) *= s (gradient averaging over data-parallel replicas)
    void (*scale)(void *ctx, float *x, float s, size_t n);
    // acc (1) += sum_i x[i]^2, accumulated in fp64 in a fixed order; acc is backend
    // memory (one double), so that a global norm over many tensors needs one copy to
    // the host, not one per tensor
    void (*sumsq)(void *ctx, double *acc, const float *x, size_t n);
    // Delayed scaling's amax histories (struct mt_amax_history, one per entry), held in
    // backend memory: entry i of n is the operand of role i % 3 (enum mt_q_role) of a
    // GEMM, its history hist (n,len) with the newest at column latest, count entries
    // filled, where pos (backend memory, 2 int32) = {latest, count}, the same for every
    // entry; its scale hscale (n), starting at 1. With amax (n) non-NULL (a step's end),
    // unless gate (or NULL) says the step is not taken (mt_q_step_taken), the step's
    // entry: pos advances (latest = (latest + 1) % len, count = min(count + 1, len)), the
    // amax a = amax[i] (a gradient's divided by grad_unit when > 0: its unit is the
    // unscaled loss) goes to hist[i,latest], the scale becomes mt_q_tensor_scale(w, fmax,
    // margin) of the window max (max_algo; else a itself) when w > 0 and finite, fmax
    // the format maximum of the operands, gmax of the gradients, and amax[i] = 0; so a
    // captured iteration rolls the histories with nothing from the host. Always (amax
    // NULL: pos unread): the encode scale scale (n) = hscale, a gradient's divided by
    // grad_unit when > 0.
    void (*amax_history)(void *ctx, float *hist, float *hscale, float *scale, float *amax,
                         int n, int len, int32_t *pos, bool max_algo, float fmax, float gmax,
                         int margin, float grad_unit, const struct mt_step_gate *gate);
};

/* What a device backend made the host do since it was created, per op (index
 * MT_OP_COUNT: outside any op, e.g. setting the backend up): launches, the kernels and
 * library calls it queued on the device; syncs, the times the host waited for the
 * device (a stream, event or device synchronisation, a synchronous copy, a free that
 * synchronises). doc/host-overhead.md says how to read them. */
struct mt_op_counts {
    long long launches[MT_OP_COUNT + 1];
    long long syncs[MT_OP_COUNT + 1];
};

/* One GEMM operand's quantisation under an FP8/FP4 recipe (doc/fp8.md, "In the model"):
 * the scaling and element format, which dimension its 1-D blocks lie along (the GEMM's
 * reduction dimension for this use of the operand), the rounding, and the state of
 * per-tensor scaling. */
struct mt_quant_spec {
    enum mt_q_scaling scaling;
    enum mt_q_elem elem;
    /* MT_Q_MX, MT_Q_BLOCK_1X128, MT_Q_NVFP4: blocks along the row, or along the column
     * (an operand the GEMM reads transposed: its 1 x 128 tiles become 128 x 1 and its
     * 1-D blocks run down the columns, quantised from the high-precision values) */
    enum mt_q_dim along;
    enum mt_q_round rnd;       /* MT_Q_SR: stochastic, element i drawing (seed, stream, i) */
    uint64_t seed;
    /* backend memory, one uint64, or NULL: the seed there (in place of seed), read when
     * the quantiser runs, so that a captured graph replays with the seed of its replay
     * (NVFP4's key, struct mt_quant_ops random_key) */
    const uint64_t *seed_dev;
    uint32_t stream;
    /* NVFP4 wgrad inputs: the random Hadamard transform along the columns (over rows,
     * the GEMM's reduction) before quantising, signs from (seed, rht_stream); only
     * whole groups of 16 rows are transformed (a tail is left as it is, which keeps
     * the product of two transformed operands equal to the untransformed one) */
    bool rht;
    uint32_t rht_stream;
    /* MT_Q_TENSOR: scale, backend memory, one fp32: the encode scale (delayed scaling);
     * NULL: current scaling, mt_q_tensor_scale(amax of x, fmax, margin) */
    const float *scale;
    int margin;
    /* backend memory, one fp32, or NULL: *amax = max(*amax, amax of x) (delayed
     * scaling's history records the largest over the step's micro-batches) */
    float *amax;
    /* x as a shard of a logical tensor that other ranks hold the rest of (doc/fp8.md,
     * "Parallel layouts"); lrows = 0: x is the whole tensor. The shard is rows
     * row0.. and columns col0.. of a logical (lrows, lcols) tensor, whole blocks of its
     * scaling. tensor_amax, backend memory, one fp32, or NULL: the logical tensor's
     * amax (the shards' amaxes max-reduced), which the per-tensor scales (MT_Q_TENSOR
     * current scaling, NVFP4's fp32 scale) then come from instead of x's; stochastic
     * rounding draws the random byte of each element's index in the logical tensor. */
    int64_t lrows, lcols, row0, col0;
    const float *tensor_amax;
    /* backend memory of work_bytes, or NULL: a device backend's scratch for the codes
     * and scales (mt_quant_scratch_bytes of the operand's elements suffice; with less
     * or none it takes them from its allocator for the call). The CPU backend's qdq
     * keeps its quantised copy in host memory and does not use it; the quantised GEMM
     * (gemm) takes mt_quant_gemm_scratch_bytes of each operand here, where the CPU
     * backend puts the operand's fp32 values. */
    void *work;
    size_t work_bytes;
    /* backend memory, or NULL: the operand's quantised copy that the backend's save
     * wrote from this operand under this spec (struct mt_quant_ops save); the quantised
     * GEMM reads the operand's values from it and takes from x its shape only (x's data
     * is not read, no amax is recorded: save recorded it) */
    const void *saved;
};

/* The FP8/FP4 recipes (&precision fp8_recipe, fp4_recipe; doc/fp8.md), a GEMM operand's
 * role (the activation x, the weight w, the output gradient g) and the GEMM it is used
 * in (forward, dgrad, wgrad). */
enum mt_q_recipe { MT_RECIPE_DELAYED, MT_RECIPE_TENSORWISE, MT_RECIPE_BLOCKWISE, MT_RECIPE_MXFP8,
                   MT_RECIPE_NVFP4 };
enum mt_q_role { MT_Q_X, MT_Q_W, MT_Q_G };
enum mt_q_use { MT_Q_FWD, MT_Q_DGRAD, MT_Q_WGRAD };

/* What recipe r does to an operand of role in use: its scaling, element format (hybrid:
 * E5M2 gradients under delayed and tensorwise scaling), the dimension its blocks run
 * along (the use's reduction dimension: the rows, down which the stored tensor's columns
 * run, for w in dgrad and both wgrad operands), rounding (stochastic for NVFP4's
 * gradients) and NVFP4's Hadamard transform of the wgrad inputs. The caller adds what is
 * its own: delayed scaling's scale, margin and amax, the random streams' seed and
 * numbers, shards, scratch. */
static inline struct mt_quant_spec mt_quant_operand_spec(enum mt_q_recipe r, bool hybrid,
                                                         enum mt_q_role role, enum mt_q_use u)
{
    const bool weight = role == MT_Q_W;
    struct mt_quant_spec q;
    memset(&q, 0, sizeof q);
    q.along = (weight && u == MT_Q_DGRAD) || u == MT_Q_WGRAD ? MT_Q_ALONG_COL : MT_Q_ALONG_ROW;
    q.rnd = MT_Q_RN;
    switch (r) {
    case MT_RECIPE_DELAYED:
    case MT_RECIPE_TENSORWISE:
        q.scaling = MT_Q_TENSOR;
        q.elem = hybrid && role == MT_Q_G ? MT_Q_ELEM_E5M2 : MT_Q_ELEM_E4M3;
        q.along = MT_Q_ALONG_ROW;
        break;
    case MT_RECIPE_BLOCKWISE:
        q.scaling = weight ? MT_Q_BLOCK_128X128 : MT_Q_BLOCK_1X128;
        q.elem = MT_Q_ELEM_E4M3;
        if (weight) q.along = MT_Q_ALONG_ROW;
        break;
    case MT_RECIPE_MXFP8:
        q.scaling = MT_Q_MX;
        q.elem = MT_Q_ELEM_E4M3;
        break;
    case MT_RECIPE_NVFP4:
        q.scaling = weight ? MT_Q_NVFP4_2D : MT_Q_NVFP4;
        q.elem = MT_Q_ELEM_E2M1;
        if (weight) q.along = MT_Q_ALONG_ROW;
        if (role == MT_Q_G) q.rnd = MT_Q_SR;
        q.rht = u == MT_Q_WGRAD;
        break;
    }
    return q;
}

/* Whether an operand quantised under s is quantised as its transpose (cols,rows) along
 * the rows: 1 x 128 tiles and NVFP4's 1 x 16 blocks run along rows only, and s wants
 * them down the columns (the wgrad GEMM's reduction over the tokens). */
static inline bool mt_quant_spec_transposed(const struct mt_quant_spec *s)
{
    return s->along == MT_Q_ALONG_COL && (s->scaling == MT_Q_BLOCK_1X128 || s->scaling == MT_Q_NVFP4);
}

/* The seed s draws its random bits under (kernels/quant.h, struct mt_q_seed). */
static inline struct mt_q_seed mt_quant_spec_seed(const struct mt_quant_spec *s)
{
    struct mt_q_seed r = {s->seed_dev, s->seed};
    return r;
}

/* The FP8/FP4 recipes' operations: optional, NULL where a backend does not run the
 * recipes yet (the model refuses fp8_format/fp4_format on it, naming the CPU backend). */
struct mt_quant_ops {
    // out (rows,cols) fp32 = the values of x's quantisation under s (dequantised:
    // code value x block scale x per-tensor scale); x (rows,cols) fp32 or bf16, dense,
    // not overlapping out. Every backend writes the CPU backend's bits. A device
    // backend needs mt_quant_scratch_bytes(rows * cols) of scratch (s->work, else its
    // allocator's) and does not wait for the device.
    // A GEMM on two such operands is the recipe's low-precision GEMM with fp32
    // accumulation (doc/fp8.md says how it relates to the GPU's scaled FP8 GEMMs).
    void (*qdq)(void *ctx, const struct mt_quant_spec *s, struct mt_tensor out,
                struct mt_tensor x);
    // The recipe's low-precision GEMM: c (m,n) = beta c + op(q_a(a)) op(q_b(b)), fp32
    // accumulation; a stored (m,k) or, trans_a, (k,m); b (k,n) or, trans_b, (n,k); each
    // fp32 or bf16, dense, quantised as stored under its spec (sa, sb: the 1-D blocks of
    // MT_Q_BLOCK_1X128, MT_Q_MX and MT_Q_NVFP4 along k; a shard's place and tensor_amax
    // as qdq takes them). c fp32 (any beta) or bf16 (beta 0), row stride c.ld.
    // Every backend computes the product of qdq's values up to the order of summation
    // (the CPU backend: qdq of both, then its gemm, the reference; the CUDA backend: the
    // quantisers' codes and scales into one cublasLtMatmul with the recipe's scale
    // modes, doc/fp8.md "The GPU's GEMMs"). Scratch: sa->work and sb->work, each
    // mt_quant_gemm_scratch_bytes of its operand's elements (less or none: the
    // backend's allocator for the call). Does not wait for the device.
    void (*gemm)(void *ctx, bool trans_a, bool trans_b, const struct mt_quant_spec *sa,
                 struct mt_tensor a, const struct mt_quant_spec *sb, struct mt_tensor b,
                 float beta, struct mt_tensor c);
    // Optional (NULL: the model keeps the high-precision operands for backward and
    // quantises them there again). save: saved (backend memory of saved_bytes(s, rows,
    // cols)) = x (rows,cols) quantised under s, its codes and scales as the backend's
    // gemm reads them back (spec saved): the same quantisation as qdq's and gemm's of x
    // (amax recorded, shard placed, Hadamard transform), kept in a byte an element (half
    // for E2M1) and its scales, where the high-precision operand took two or four. The
    // model saves its linears' inputs so in forward for the wgrad GEMM of backward
    // (doc/fp8.md, "FP8 copies saved for backward"). Does not wait for the device.
    void (*save)(void *ctx, const struct mt_quant_spec *s, void *saved, struct mt_tensor x);
    size_t (*saved_bytes)(const struct mt_quant_spec *s, int64_t rows, int64_t cols);
    // Optional (NULL: the caller calls gemm for each group): n of gemm's products at
    // once, group g c[g] = beta c[g] + op(q_a(a[g])) op(q_b(b[g])) under sa[g], sb[g]
    // (the routed experts' row ranges, each expert its own operands and scales). Every
    // group's operands of one scaling and format, c's of one dtype, none empty (m, n
    // and k > 0). The same quantisation as gemm's; the products summed in fp32 (the CUDA
    // backend: each group's operands quantised, then one kernel over all the groups'
    // tiles, cuda_qdq.cu "The grouped quantised GEMM"). The specs' work may be NULL
    // (the backend's allocator). Does not wait for the device.
    void (*grouped_gemm)(void *ctx, int n, bool trans_a, bool trans_b, const struct mt_quant_spec *sa,
                         const struct mt_tensor *a, const struct mt_quant_spec *sb,
                         const struct mt_tensor *b, float beta, const struct mt_tensor *c);
    // amax (n), backend memory: each NaN made +Inf, before a MAX reduction of amaxes
    // over ranks, which would drop it (fmaxf(NaN, x) is x, NCCL's max and MPI's keep or
    // drop a NaN by the order of their operands): a NaN in one rank's tensor then
    // reaches every rank as a non-finite amax, which every scale rule takes as it takes
    // a NaN (mt_q_tensor_scale gives 1, mt_q_history_scale keeps the scale). Does not
    // wait for the device.
    void (*amax_nan_to_inf)(void *ctx, float *amax, size_t n);
    // NVFP4's random key, key[MT_Q_KEY_WORDS] of backend memory (kernels/quant.h): a
    // backward pass begins (end false: key[MT_Q_KEY_SEED] = its seed under base, the
    // micro-batch the pass's count x dp + dp_rank), or the iteration ends (end true,
    // unless gate, or NULL, says the step is skipped): mt_q_random_key_step on the
    // backend, so that a captured iteration advances the key on the device. Does not
    // wait for the device.
    void (*random_key)(void *ctx, uint64_t *key, uint64_t base, int dp, int dp_rank, bool end,
                       const struct mt_step_gate *gate);
    // Whether qdq takes a shard of a logical tensor (s->lrows, tensor_amax: its place in
    // the tensor and the tensor's amax) under the FP8 recipes (shards) and under NVFP4
    // (fp4_shards: its stochastic rounding's element indices and fp32 scale in the
    // logical tensor as well); false: only whole tensors, and the model refuses the
    // recipes where tensor or expert-tensor parallelism would split one.
    bool shards;
    bool fp4_shards;
    // Optional (NULL: the model calls struct mt_kernels' op, and the quantised GEMM or
    // save quantises its output from memory): rmsnorm_fwd and swiglu_fwd of struct
    // mt_kernels that also emit, in the same pass over the rows, what out's quantisation
    // under s needs (doc/fp8.md, "Quantisation fused with its producer"); s a spec that
    // mt_quant_fusable accepts. Block scalings: fused = a copy of out (backend memory of
    // saved_bytes(s, N, C)) that gemm reads (spec saved) in place of quantising out, the
    // same codes and scales; per-tensor current scaling: fused = one float of backend
    // memory, out's amax (the one gemm and save find), which they take as tensor_amax.
    // out is written as the op of struct mt_kernels writes it. Does not wait for the device.
    void (*rmsnorm_fwd)(void *ctx, const struct mt_quant_spec *s, void *fused, struct mt_tensor out,
                        float *rstd, struct mt_tensor x, struct mt_tensor w, int N, int C, float eps);
    void (*swiglu_fwd)(void *ctx, const struct mt_quant_spec *s, void *fused, struct mt_tensor out,
                       struct mt_tensor gate, struct mt_tensor up, int N, int F);
};

/* Whether a producer can emit the quantisation of its output under s in its own pass
 * (struct mt_quant_ops rmsnorm_fwd, swiglu_fwd): blocks along the row, local to a row
 * (1 x 128 tiles, MXFP8's 32), E4M3 and nearest rounding; or per-tensor current scaling
 * of a whole tensor (tensorwise: the amax, which must be known before any code). Not
 * delayed scaling (its amax record and history scale), NVFP4 (its per-tensor scale from
 * the amax, and the Hadamard transform) or a shard. */
static inline bool mt_quant_fusable(const struct mt_quant_spec *s)
{
    if (s->rnd != MT_Q_RN || s->rht || s->lrows > 0 || s->amax || s->saved) return false;
    if (s->scaling == MT_Q_TENSOR) return !s->scale && !s->tensor_amax;
    return (s->scaling == MT_Q_BLOCK_1X128 || s->scaling == MT_Q_MX) && s->along == MT_Q_ALONG_ROW &&
           s->elem == MT_Q_ELEM_E4M3;
}

/* CUDA graphs (&cuda_graph, doc/host-overhead.md "CUDA graphs"): a scope of ops, named
 * by a key the caller chooses (module, layer, micro-batch slot, pass), captured once
 * into a graph and replayed after. The caller brackets the scope with begin and end and
 * skips its ops when begin replayed the graph, so a replay costs the host one launch.
 * A scope's signature is what its graph depends on that the key does not say (the
 * pointers and shapes of its buffers, and any host value its kernels take): a scope
 * begun with another signature than its graph's is captured again, never replayed. */
struct mt_graph_stats {
    long long graphs;          /* held now */
    long long captures;        /* made, recaptures included */
    long long recaptures;      /* of a key whose signature changed */
    long long replays;
    size_t bytes;              /* device memory the graphs hold (blocks allocated in them) */
};
struct mt_graph_ops {
    /* Opens scope key. With its graph held under the same signature: launches it, sets
     * *replayed, and the scope is closed (no end). Else, with capture: the ops up to end
     * are captured, not run (end launches them); without: they run as they are (warm-up),
     * and end only closes the scope. Scopes do not nest. */
    int (*begin)(void *ctx, uint64_t key, uint64_t signature, bool capture, bool *replayed,
                 struct mt_err *err);
    /* Closes the scope; a capture becomes a graph, which is launched. MT_ERUNTIME when the
     * capture was invalidated by a call a graph cannot hold (a synchronisation, a host
     * read of device memory, an allocation outside the caching allocator), naming it, or
     * when the scope freed a block it did not allocate. */
    int (*end)(void *ctx, struct mt_err *err);
    void (*stats)(void *ctx, struct mt_graph_stats *out);
    /* Destroys every graph (their blocks go back to the caching allocator). */
    void (*reset)(void *ctx);
};

/* A bound on the scratch one qdq call takes for an operand of elems elements: its
 * codes (at most a byte an element), its scales (at most one fp32 an element, the
 * bound of 1 x 128 tiles on a single column) and a few scalars, 16-byte aligned. */
static inline size_t mt_quant_scratch_bytes(size_t elems) { return 5 * elems + 64; }

/* What one operand of the quantised GEMM (struct mt_quant_ops gemm) takes: its values
 * in fp32 (the CPU's dequantised operand, a device's staging of the high-precision
 * one, 4 bytes an element), its codes (a byte), its block scales (at most 1/4 byte an
 * element with a reduction of 16 or more: 1 x 128 tiles 4 bytes a 128, MXFP8 a byte a
 * 32, NVFP4 a byte a 16) and a device's alignments and scalars (2 KiB). A device backend
 * puts its scales in its GEMM's order and the codes padded to the library's multiples
 * where the staging was; an operand that needs more (a reduction of fewer than 16
 * elements, rows padded beyond the slack) takes the rest from its allocator. */
static inline size_t mt_quant_gemm_scratch_bytes(size_t elems)
{
    return 4 * elems + elems + elems / 2 + 2048;
}

struct mt_kernels {
    const char *name;          /* "cpu", "cuda" */
    void *ctx;                 /* backend state, passed to every op */
    struct mt_kernel_ops op;
    /* The backend's counts so far (see struct mt_op_counts); NULL where there is no
     * device to wait for (the CPU backend). */
    void (*counts)(void *ctx, struct mt_op_counts *out);
    /* The FP8/FP4 recipes (struct mt_quant_ops), or NULL where they do not run. */
    const struct mt_quant_ops *quant;
    /* CUDA graphs (struct mt_graph_ops), or NULL on a backend without them. */
    const struct mt_graph_ops *graph;
};

/* Every op has exactly one slot, in enum order, and one name. */
_Static_assert(sizeof(struct mt_kernel_ops) == MT_OP_COUNT * sizeof(void (*)(void)),
               "struct mt_kernel_ops must have one function pointer per enum mt_op");

/* The C reference backend (kernels/cpu). Never NULL. It runs OpenBLAS single-threaded
 * (process-wide) and parallelises with OpenMP itself (OMP_NUM_THREADS). */
const struct mt_kernels *mt_kernels_cpu(void);

/* The instruction-set level the CPU backend's compute ops run (kernels/cpu/cpu_isa.h,
 * doc/site-install.md): "baseline" (the build's own flags), "x86-64-v3" (AVX2, FMA) or
 * "x86-64-v4" (AVX-512), the highest of those built that the CPU has, unless the
 * environment's MOETRAIN_CPU_ISA names one. Every level gives the same results up to
 * rounding (a sum's order follows the vector width). moetrain's own kernels give the
 * same bits for any thread count; the BLAS need not, so where it computes the GEMMs
 * (below x86-64-v4, or with MOETRAIN_CPU_GEMM=blas) the last bits can follow it.
 * mt_cpu_isa_check returns MT_EINVAL when MOETRAIN_CPU_ISA (or MOETRAIN_CPU_GEMM, below)
 * names no choice, MT_EUNSUPPORTED when this build or this CPU lacks the level it
 * names, with the message; the CLI calls it first, as mt_kernels_cpu stops the process
 * on such a value.
 * mt_cpu_isa_built: the levels built, e.g. "baseline x86-64-v3 x86-64-v4". */
const char *mt_cpu_isa(void);
int mt_cpu_isa_check(struct mt_err *err);
const char *mt_cpu_isa_built(void);
/* The CPU GEMMs (gemm, grouped_gemm; attention's tile products are its own and the
 * BLAS's): moetrain's own AVX-512 kernel on a level built for AVX-512 (x86-64-v4), the
 * BLAS on the others, or the BLAS on every level when the environment has
 * MOETRAIN_CPU_GEMM=blas (auto, empty or unset: the default; mt_cpu_isa_check refuses
 * any other value). mt_cpu_gemm_blas: whether MOETRAIN_CPU_GEMM=blas;
 * mt_cpu_gemm_kernel: "moetrain AVX-512" or "BLAS", as the running level computes them. */
bool mt_cpu_gemm_blas(void);
const char *mt_cpu_gemm_kernel(void);

/* The guard backend (kernels/cpu/cpu_guard.c, `moetrain --backend=guard`): the CPU
 * kernels on emulated device memory. Backend memory is mapped PROT_NONE except while
 * an op (or a collective, through mt_guard_open/close) runs, every op checks that its
 * tensor arguments are backend memory and its host-value arguments are not, so host
 * code that would read or write GPU memory directly faults on any machine, naming the
 * allocation. Results are the CPU backend's, bit for bit. One thread at a time. */
const struct mt_kernels *mt_kernels_guard(void);
/* Whether [p, p+bytes) lies inside one live allocation of the guard backend. */
bool mt_guard_owns(const void *p, size_t bytes);

/* The plan backend (kernels/cpu/cpu_plan.c): allocations (alloc_host's too, counted
 * apart) are address ranges reserved and never backed, memset/copy/copy_async/bf16_round/
 * convert/sync and the events do nothing, any other op faults. Setting
 * the model, optimizer and trainer up on it measures what they would allocate without
 * holding it (moetrain --check's memory report). One per planner, not thread-safe. */
struct mt_kernels *mt_kernels_plan_create(void);
/* Bytes currently allocated (asked for) on a plan backend. */
size_t mt_kernels_plan_live(const struct mt_kernels *k);
void mt_kernels_plan_destroy(struct mt_kernels *k);
/* Makes every guard allocation accessible (nested calls count) / inaccessible again. */
void mt_guard_open(void);
void mt_guard_close(void);

/* Number of non-NULL slots in k (a complete backend has MT_OP_COUNT); when one is
 * missing and missing is not NULL, *missing is the first such op. */
int mt_kernels_count_ops(const struct mt_kernels *k, enum mt_op *missing);

#endif

/* CPU reference backend: the functions that fill struct mt_kernel_ops.
 * Private to kernels/cpu; everything else goes through mt_kernels_cpu(). */
#ifndef MT_KERNELS_CPU_OPS_H
#define MT_KERNELS_CPU_OPS_H

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/kernels.h"

/* bfloat16 round to nearest even of one value, widened back to fp32. NaNs are made
 * quiet first so that dropping the low mantissa bits cannot turn them into Inf. */
static inline float mt_cpu_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    /* both candidates, then a select: a loop of these vectorises */
    uint32_t nan = (u | 0x00400000u) & 0xffff0000u;
    uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    u = (u & 0x7fffffffu) > 0x7f800000u ? nan : rne;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* exp(x) in fp32 with only arithmetic, integer and select operations, so that a loop
 * calling it under `#pragma omp simd` is vectorised (libm's expf is a call per element).
 * x = n ln2 + r, |r| <= ln2/2, n = round(x / ln2); ln2 split in a part with 9
 * significant bits (n * that part is exact for |n| <= 2^15) and the rest, so r carries
 * no cancellation error; exp(r) by its Taylor polynomial of degree 7 in Horner form
 * (truncation below 1e-8 relative); 2^n applied as two exact powers of two 2^(n/2),
 * 2^(n - n/2), so that the last product alone rounds and results below FLT_MIN come
 * out as correctly rounded subnormals. Error against exp in double: at most 1.2 ulp
 * over the normal range (tests/kernels/test_expf.c sweeps it), 1 subnormal ulp below;
 * exp(+-Inf) = Inf, 0; NaN stays NaN; overflow to Inf above 88.7228. */
static inline float mt_cpu_expf(float x)
{
    const float shift = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    x = x < -104.0f ? -104.0f : x;   /* exp(-104) < FLT_TRUE_MIN / 2: 0 */
    x = x > 89.0f ? 89.0f : x;       /* exp(89) > FLT_MAX: Inf */
    float t = x * 1.44269504f + shift;
    uint32_t ut, us;
    memcpy(&ut, &t, sizeof ut);
    memcpy(&us, &shift, sizeof us);
    int32_t n = (int32_t)(ut - us);
    float fn = t - shift;
    float r = x - fn * 0.693359375f;
    r = r - fn * -2.12194440e-4f;
    float p = 1.98412698e-4f; /* 1/7! .. 1/2! */
    p = p * r + 1.38888889e-3f;
    p = p * r + 8.33333333e-3f;
    p = p * r + 4.16666667e-2f;
    p = p * r + 1.66666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t n1 = n >> 1, n2 = n - n1; /* both in [-75, 65]: normal powers of two */
    uint32_t u1 = (uint32_t)(n1 + 127) << 23, u2 = (uint32_t)(n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &u1, sizeof s1);
    memcpy(&s2, &u2, sizeof s2);
    return p * s1 * s2;
}

/* bf16 <-> fp32 of n values: widening is exact, narrowing rounds (mt_cpu_bf16). */
static inline void mt_cpu_widen(float *restrict dst, const uint16_t *restrict src, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, sizeof u);
    }
}

static inline void mt_cpu_narrow(uint16_t *restrict dst, const float *restrict src, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float x = mt_cpu_bf16(src[i]);
        uint32_t u;
        memcpy(&u, &x, sizeof u);
        dst[i] = (uint16_t)(u >> 16);
    }
}

/* n values at src (dtype st) converted into dst (dtype dt), fp32 or bf16; bf16 rounds to
 * nearest even. */
static inline void mt_cpu_convert_span(void *dst, enum mt_dtype dt, const void *src,
                                       enum mt_dtype st, size_t n)
{
    if (st == MT_F32 && dt == MT_BF16)
        mt_cpu_narrow(dst, src, n);
    else if (st == MT_BF16 && dt == MT_F32)
        mt_cpu_widen(dst, src, n);
    else
        memmove(dst, src, n * mt_dtype_size(dt));
}

/* Elements [i, i + n) of fp32 or bf16 tensor t's storage, as fp32: t's own memory when
 * fp32, else widened into buf (n floats). Ops that take typed tensors read and write
 * them a span (a row, a chunk) at a time through these, so a bf16 tensor costs no pass
 * over memory of its own. */
static inline const float *mt_cpu_span_in(struct mt_tensor t, size_t i, size_t n, float *buf)
{
    if (t.dtype == MT_F32) return (const float *)t.data + i;
    mt_cpu_widen(buf, (const uint16_t *)t.data + i, n);
    return buf;
}

/* Where an op writes the fp32 values of span [i, ..) of t: t itself when fp32, else buf,
 * which mt_cpu_span_store rounds into t. */
static inline float *mt_cpu_span_out(struct mt_tensor t, size_t i, float *buf)
{
    return t.dtype == MT_F32 ? (float *)t.data + i : buf;
}

static inline void mt_cpu_span_store(struct mt_tensor t, size_t i, size_t n, const float *v)
{
    if (t.dtype != MT_F32) mt_cpu_narrow((uint16_t *)t.data + i, v, n);
}

/* Scratch that ops use between their start and end: from the pool of cpu_typed.c,
 * kept between calls, so that a training step allocates nothing once the pool has seen
 * its sizes (doc/host-overhead.md). Aborts when out of memory (the op table has no
 * error channel). Taken outside OpenMP regions: a region takes one buffer for all its
 * threads (mt_cpu_scratch_threads) and each thread uses its slice. */
void *mt_cpu_scratch(const char *op, size_t bytes);
void mt_cpu_scratch_give(void *p);

/* Bytes of one thread's slice for slices of `bytes` (64-byte multiples). */
static inline size_t mt_cpu_slice_bytes(size_t bytes) { return (bytes + 63) / 64 * 64; }
/* Scratch of omp_get_max_threads() slices of `bytes`; given back with
 * mt_cpu_scratch_give. */
static inline void *mt_cpu_scratch_threads(const char *op, size_t bytes)
{
    return mt_cpu_scratch(op, mt_cpu_slice_bytes(bytes) * (size_t)omp_get_max_threads());
}
/* The calling thread's slice of base, inside the region. */
static inline void *mt_cpu_slice(void *base, size_t bytes)
{
    return (char *)base + mt_cpu_slice_bytes(bytes) * (size_t)omp_get_thread_num();
}

/* [*lo, *hi) = this OpenMP thread's share of [0, n), in equal contiguous blocks. */
static inline void mt_cpu_split(int n, int *lo, int *hi)
{
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    *lo = (int)((long long)n * id / nt);
    *hi = (int)((long long)n * (id + 1) / nt);
}

static inline float mt_cpu_sigmoid(float x) { return 1.0f / (1.0f + mt_cpu_expf(-x)); }

/* cpu_dense.c */
void mt_cpu_blas_init(void); /* the BLAS single-threaded: OpenMP owns the cores */
/* The compute ops of the op table, of this level's build (cpu_table.c, cpu_isa.h). */
void mt_cpu_fill_ops(struct mt_kernel_ops *o);
void mt_cpu_gemm(void *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
void mt_cpu_grouped_gemm(void *ctx, bool trans_a, bool trans_b, int num_groups,
                         const int32_t *offsets, int M, int N, int K, float alpha,
                         const float *A, const float *B, float beta, float *C);
/* An operand of mt_cpu_gemm_part and mt_cpu_grouped_gemm_thread: fp32, or bf16 when
 * mt_cpu_gemm_bf16(), true where this level's GEMMs run moetrain's own kernel (it widens
 * a bf16 operand, exactly, as it packs it; the BLAS takes fp32 only). */
struct mt_cpu_opnd {
    const void *p;
    bool bf16;
};
static inline size_t mt_cpu_opnd_size(struct mt_cpu_opnd x) { return x.bf16 ? 2 : 4; }
bool mt_cpu_gemm_bf16(void);
/* How mt_cpu_gemm splits C (M,N) over `threads` threads: in parts (1: one call), part i
 * covering rows [*lo, *hi) of C when mt_cpu_gemm_range returns true, else those columns;
 * mt_cpu_gemm_part runs part i. A caller with its own region (cpu_typed.c, converting
 * operands in it) runs the same parts, so the same calls compute every element. */
int mt_cpu_gemm_parts(int M, int N, int K, int threads);
bool mt_cpu_gemm_range(int i, int parts, int M, int N, int *lo, int *hi);
void mt_cpu_gemm_part(int i, int parts, bool trans_a, bool trans_b, int M, int N, int K,
                      float alpha, struct mt_cpu_opnd A, int lda, struct mt_cpu_opnd B, int ldb,
                      float beta, float *C, int ldc);
/* Thread id's share (of a team of `team`) of mt_cpu_grouped_gemm: an equal part of
 * the work (cpu_dense.c); no barrier inside (the shares write disjoint slices of C). */
void mt_cpu_grouped_gemm_thread(int id, int team, bool trans_a, bool trans_b, int num_groups,
                                const int32_t *offsets, int M, int N, int K, float alpha,
                                struct mt_cpu_opnd A, struct mt_cpu_opnd B, float beta, float *C);

/* cpu_layers.c */
void mt_cpu_t_embedding_fwd(void *ctx, struct mt_tensor out, const int32_t *tokens,
                            struct mt_tensor wte, int N, int C);
void mt_cpu_t_rmsnorm_fwd(void *ctx, struct mt_tensor out, float *rstd, struct mt_tensor x,
                          struct mt_tensor w, int N, int C, float eps);
void mt_cpu_t_rmsnorm_bwd(void *ctx, float *dx, float *dw, const float *dout, struct mt_tensor x,
                          struct mt_tensor w, const float *rstd, int N, int C);
void mt_cpu_t_rope_fwd(void *ctx, struct mt_tensor out, struct mt_tensor x, int B, int T, int H,
                       int D, float theta);
void mt_cpu_embedding_bwd(void *ctx, float *dwte, const float *dout, const int32_t *tokens,
                          int N, int C);
void mt_cpu_rope_bwd(void *ctx, float *dx, const float *dout, int B, int T, int H, int D,
                     float theta);
void mt_cpu_attention_fwd(void *ctx, float *out, float *lse, const float *q, const float *k,
                          const float *v, int B, int T, int Hq, int Hkv, int D);
void mt_cpu_attention_bwd(void *ctx, float *dq, float *dk, float *dv, const float *dout,
                          const float *q, const float *k, const float *v, const float *out,
                          const float *lse, int B, int T, int Hq, int Hkv, int D);
/* SwiGLU of n elements on the calling thread (mt_cpu_t_swiglu_* run them per chunk) */
void mt_cpu_swiglu_fwd_span(float *out, const float *gate, const float *up, size_t n);
void mt_cpu_swiglu_bwd_span(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t n);

/* cpu_moe.c */
void mt_cpu_router_fwd(void *ctx, const struct mt_router_args *a, const float *logits,
                       const float *expert_bias, int32_t *topk_idx, float *topk_prob);
void mt_cpu_router_bwd(void *ctx, const struct mt_router_args *a, float *dlogits,
                       const float *dprob, const float *logits, const int32_t *topk_idx);
void mt_cpu_aux_counts(void *ctx, const struct mt_aux_args *a, float *counts, const float *logits);
void mt_cpu_aux_loss_fwd(void *ctx, const struct mt_aux_args *a, double *acc, const float *counts,
                         const float *logits);
void mt_cpu_aux_loss_bwd(void *ctx, const struct mt_aux_args *a, float *dlogits, float dloss,
                         const float *counts, const float *logits);
void mt_cpu_z_loss_fwd(void *ctx, double *acc, float *lse, const float *logits, int N, int E,
                       float coeff);
void mt_cpu_z_loss_bwd(void *ctx, float *dlogits, float dloss, const float *lse,
                       const float *logits, int N, int E, float coeff);
void mt_cpu_drop_mask(void *ctx, int32_t *out, const int32_t *idx, const int32_t *slot_row,
                      size_t n, int64_t *dropped);
void mt_cpu_expert_select(void *ctx, int32_t *out, const int32_t *idx, size_t n, int e0, int count,
                          int64_t *selected);
void mt_cpu_expert_bias_update(void *ctx, float *bias, const int64_t *load, int nmoe, int E,
                               float rate, const double *sumsq, const double *loss,
                               int loss_stride, int n_loss);
void mt_cpu_dispatch_plan(void *ctx, struct mt_dispatch_plan *plan, const int32_t *topk_idx,
                          const float *topk_prob, int N, int E, int topk, int capacity,
                          enum mt_drop_policy policy, bool pad, int64_t *dropped, int64_t *load);
void mt_cpu_permute_bwd(void *ctx, float *dx, const float *dxp, const int32_t *slot_row,
                        int N, int topk, int C);
void mt_cpu_t_permute_fwd(void *ctx, struct mt_tensor xp, struct mt_tensor x,
                          const int32_t *row_slot, int rows, int topk, int C);
void mt_cpu_t_unpermute_fwd(void *ctx, struct mt_tensor out, struct mt_tensor yp,
                            const int32_t *slot_row, const float *prob, int N, int topk, int C);
void mt_cpu_t_unpermute_bwd(void *ctx, float *dyp, float *dprob, const float *dout,
                            struct mt_tensor yp, const int32_t *slot_row, const float *prob,
                            int N, int topk, int C, int rows);

/* cpu_loss.c */
void mt_cpu_cross_entropy_fwd(void *ctx, float *lse, float *tlogit, const float *logits,
                              const int32_t *targets, int N, int V, int v0);
void mt_cpu_cross_entropy_bwd(void *ctx, float *dlogits, const float *logits, const float *lse,
                              const int32_t *targets, int N, int V, int v0, float scale);
void mt_cpu_lse_combine(void *ctx, float *lse, const float *shard_lse, int R, int N);
void mt_cpu_loss_sum(void *ctx, double *acc, const float *lse, const float *tlogit,
                     const int32_t *targets, int N);
void mt_cpu_adamw(void *ctx, float *param, const float *grad, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay,
                  float grad_scale, long long t);
void mt_cpu_adamw_dev(void *ctx, float *param, const float *grad, float *m, float *v, size_t n,
                      const struct mt_adamw_consts *k, const double *sumsq, const double *loss,
                      int loss_stride, int n_loss, double clip);
void mt_cpu_bf16_round(void *ctx, float *out, const float *x, size_t n);
void mt_cpu_scale(void *ctx, float *x, float s, size_t n);
void mt_cpu_sumsq(void *ctx, double *acc, const float *x, size_t n);
/* cpu_qdq.c: struct mt_quant_ops, and delayed scaling's histories (op amax_history) */
void mt_cpu_amax_history(void *ctx, float *hist, float *hscale, float *scale, float *amax, int n,
                         int len, int32_t *pos, bool max_algo, float fmax, float gmax, int margin,
                         float grad_unit, const struct mt_step_gate *gate);
void mt_cpu_qdq(void *ctx, const struct mt_quant_spec *s, struct mt_tensor out, struct mt_tensor x);
void mt_cpu_qgemm(void *ctx, bool trans_a, bool trans_b, const struct mt_quant_spec *sa,
                  struct mt_tensor a, const struct mt_quant_spec *sb, struct mt_tensor b, float beta,
                  struct mt_tensor c);
void mt_cpu_quant_save(void *ctx, const struct mt_quant_spec *s, void *saved, struct mt_tensor x);
size_t mt_cpu_quant_saved_bytes(const struct mt_quant_spec *s, int64_t rows, int64_t cols);
void mt_cpu_amax_nan_to_inf(void *ctx, float *amax, size_t n);
void mt_cpu_random_key(void *ctx, uint64_t *key, uint64_t base, int dp, int dp_rank, bool end,
                       const struct mt_step_gate *gate);

/* cpu_typed.c: the op table's typed entry points (fp32 kernels above behind them) */
void mt_cpu_t_gemm(void *ctx, bool ta, bool tb, int M, int N, int K, float alpha,
                   struct mt_tensor A, struct mt_tensor B, float beta, struct mt_tensor C);
void mt_cpu_t_grouped_gemm(void *ctx, bool ta, bool tb, int G, const int32_t *offsets, int M,
                           int N, int K, float alpha, struct mt_tensor A, struct mt_tensor B,
                           float beta, struct mt_tensor C);
void mt_cpu_t_attention_fwd(void *ctx, float *out, float *lse, struct mt_tensor q,
                            struct mt_tensor k, struct mt_tensor v, int B, int T, int Hq, int Hkv,
                            int D);
void mt_cpu_t_attention_bwd(void *ctx, float *dq, float *dk, float *dv, const float *dout,
                            struct mt_tensor q, struct mt_tensor k, struct mt_tensor v,
                            const float *out, const float *lse, int B, int T, int Hq, int Hkv,
                            int D);
void mt_cpu_t_swiglu_fwd(void *ctx, struct mt_tensor out, struct mt_tensor gate,
                         struct mt_tensor up, int N, int F);
void mt_cpu_t_swiglu_bwd(void *ctx, float *dgate, float *dup, const float *dout,
                         struct mt_tensor gate, struct mt_tensor up, int N, int F);
void mt_cpu_t_add(void *ctx, struct mt_tensor out, struct mt_tensor a, struct mt_tensor b,
                  size_t n);
void mt_cpu_t_convert(void *ctx, struct mt_tensor dst, struct mt_tensor src);
/* Aborts naming op unless t is fp32 or bf16 and dense (ld = cols). */
void mt_cpu_check_dense(const char *op, struct mt_tensor t);

#endif

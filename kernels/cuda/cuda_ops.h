/* CUDA backend: the functions that fill struct mt_kernel_ops, callable from C.
 * Private to kernels/cuda; everything else goes through mt_kernels_cuda().
 * Every tensor pointer is device memory; ctx is a struct mt_cuda_ctx. Typed tensors
 * (struct mt_tensor) are fp32 or bf16; an op given an fp8 one aborts naming it. */
#ifndef MT_KERNELS_CUDA_OPS_H
#define MT_KERNELS_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

/* kernels.h is C11; its _Static_assert is spelled static_assert in C++. */
#if defined(__cplusplus) && !defined(MT_KERNELS_KERNELS_H)
#define _Static_assert static_assert
#include "kernels/kernels.h"
#undef _Static_assert
#else
#include "kernels/kernels.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* cuda_memory.cu: context, caching allocator, memory and stream ops */
int mt_cuda_ctx_create(void **ctx, char *msg, size_t msg_len);
/* Releases everything the context owns (mt_kernels_cuda_destroy); -1 with the first
 * failing call in msg (msg may be NULL), the rest released all the same. */
int mt_cuda_ctx_destroy(void *ctx, char *msg, size_t msg_len);
void *mt_cuda_alloc(void *ctx, size_t bytes);
void mt_cuda_free(void *ctx, void *p);
void *mt_cuda_alloc_host(void *ctx, size_t bytes);
void mt_cuda_free_host(void *ctx, void *p);
void mt_cuda_memset(void *ctx, void *p, int byte, size_t bytes);
void mt_cuda_copy(void *ctx, void *dst, const void *src, size_t bytes);
void mt_cuda_sync(void *ctx);
void *mt_cuda_event_create(void *ctx);
void mt_cuda_event_destroy(void *ctx, void *ev);
void mt_cuda_event_record(void *ctx, void *ev, enum mt_stream s);
void mt_cuda_event_wait(void *ctx, enum mt_stream s, void *ev);
void mt_cuda_copy_async(void *ctx, void *dst, const void *src, size_t bytes);
void mt_cuda_counts(void *ctx, struct mt_op_counts *out);

/* cuda_graph.cu: CUDA graphs (struct mt_graph_ops) */
int mt_cuda_graph_begin(void *ctx, uint64_t key, uint64_t signature, bool capture, bool *replayed,
                        struct mt_err *err);
int mt_cuda_graph_end(void *ctx, struct mt_err *err);
void mt_cuda_graph_stats(void *ctx, struct mt_graph_stats *out);
void mt_cuda_graph_reset(void *ctx);

/* cuda_gemm.cu (cuBLASLt), cuda_grouped_gemm.cu (own tensor-core kernel) */
void mt_cuda_gemm(void *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                  struct mt_tensor A, struct mt_tensor B, float beta, struct mt_tensor C);
void mt_cuda_grouped_gemm(void *ctx, bool trans_a, bool trans_b, int num_groups,
                          const int32_t *offsets, int M, int N, int K, float alpha,
                          struct mt_tensor A, struct mt_tensor B, float beta, struct mt_tensor C);

/* cuda_layers.cu */
void mt_cuda_embedding_fwd(void *ctx, struct mt_tensor out, const int32_t *tokens,
                           struct mt_tensor wte, int N, int C);
void mt_cuda_embedding_bwd(void *ctx, float *dwte, const float *dout, const int32_t *tokens,
                           int N, int C);
void mt_cuda_rmsnorm_fwd(void *ctx, struct mt_tensor out, float *rstd, struct mt_tensor x,
                         struct mt_tensor w, int N, int C, float eps);
void mt_cuda_rmsnorm_bwd(void *ctx, float *dx, float *dw, const float *dout, struct mt_tensor x,
                         struct mt_tensor w, const float *rstd, int N, int C);
void mt_cuda_rope_fwd(void *ctx, struct mt_tensor out, struct mt_tensor x, int B, int T, int H,
                      int D, float theta);
void mt_cuda_rope_bwd(void *ctx, float *dx, const float *dout, int B, int T, int H, int D,
                      float theta);
void mt_cuda_swiglu_fwd(void *ctx, struct mt_tensor out, struct mt_tensor gate,
                        struct mt_tensor up, int N, int F);
void mt_cuda_swiglu_bwd(void *ctx, float *dgate, float *dup, const float *dout,
                        struct mt_tensor gate, struct mt_tensor up, int N, int F);
void mt_cuda_add(void *ctx, struct mt_tensor out, struct mt_tensor a, struct mt_tensor b,
                 size_t n);

/* cuda_attention.cu */
void mt_cuda_attention_fwd(void *ctx, float *out, float *lse, struct mt_tensor q,
                           struct mt_tensor k, struct mt_tensor v, int B, int T, int Hq, int Hkv,
                           int D);
void mt_cuda_attention_bwd(void *ctx, float *dq, float *dk, float *dv, const float *dout,
                           struct mt_tensor q, struct mt_tensor k, struct mt_tensor v,
                           const float *out, const float *lse, int B, int T, int Hq, int Hkv,
                           int D);

/* cuda_moe.cu */
void mt_cuda_router_fwd(void *ctx, const struct mt_router_args *a, const float *logits,
                        const float *expert_bias, int32_t *topk_idx, float *topk_prob);
void mt_cuda_router_bwd(void *ctx, const struct mt_router_args *a, float *dlogits,
                        const float *dprob, const float *logits, const int32_t *topk_idx);
void mt_cuda_aux_counts(void *ctx, const struct mt_aux_args *a, float *counts, const float *logits);
void mt_cuda_aux_loss_fwd(void *ctx, const struct mt_aux_args *a, double *acc, const float *counts,
                          const float *logits);
void mt_cuda_aux_loss_bwd(void *ctx, const struct mt_aux_args *a, float *dlogits, float dloss,
                          const float *counts, const float *logits);
void mt_cuda_z_loss_fwd(void *ctx, double *acc, float *lse, const float *logits, int N, int E,
                        float coeff);
void mt_cuda_z_loss_bwd(void *ctx, float *dlogits, float dloss, const float *lse,
                        const float *logits, int N, int E, float coeff);
void mt_cuda_drop_mask(void *ctx, int32_t *out, const int32_t *idx, const int32_t *slot_row,
                       size_t n, int64_t *dropped);
void mt_cuda_expert_select(void *ctx, int32_t *out, const int32_t *idx, size_t n, int e0, int count,
                           int64_t *selected);
void mt_cuda_expert_bias_update(void *ctx, float *bias, const int64_t *load, int nmoe, int E,
                                float rate, const double *sumsq, const double *loss,
                                int loss_stride, int n_loss);
void mt_cuda_dispatch_plan(void *ctx, struct mt_dispatch_plan *plan, const int32_t *topk_idx,
                           const float *topk_prob, int N, int E, int topk, int capacity,
                           enum mt_drop_policy policy, bool pad, int64_t *dropped, int64_t *load);
void mt_cuda_permute_fwd(void *ctx, struct mt_tensor xp, struct mt_tensor x,
                         const int32_t *row_slot, int rows, int topk, int C);
void mt_cuda_permute_bwd(void *ctx, float *dx, const float *dxp, const int32_t *slot_row,
                         int N, int topk, int C);
void mt_cuda_unpermute_fwd(void *ctx, struct mt_tensor out, struct mt_tensor yp,
                           const int32_t *slot_row, const float *prob, int N, int topk, int C);
void mt_cuda_unpermute_bwd(void *ctx, float *dyp, float *dprob, const float *dout,
                           struct mt_tensor yp, const int32_t *slot_row, const float *prob,
                           int N, int topk, int C, int rows);

/* cuda_loss.cu */
void mt_cuda_cross_entropy_fwd(void *ctx, float *lse, float *tlogit, const float *logits,
                               const int32_t *targets, int N, int V, int v0);
void mt_cuda_cross_entropy_bwd(void *ctx, float *dlogits, const float *logits,
                               const float *lse, const int32_t *targets, int N, int V, int v0,
                               float scale);
void mt_cuda_lse_combine(void *ctx, float *lse, const float *shard_lse, int R, int N);
void mt_cuda_loss_sum(void *ctx, double *acc, const float *lse, const float *tlogit,
                      const int32_t *targets, int N);

/* cuda_optim.cu (and the dtype conversion) */
void mt_cuda_adamw(void *ctx, float *param, const float *grad, float *m, float *v, size_t n,
                   float lr, float beta1, float beta2, float eps, float weight_decay,
                   float grad_scale, long long t);
void mt_cuda_adamw_dev(void *ctx, float *param, const float *grad, float *m, float *v, size_t n,
                       const struct mt_adamw_consts *k, const double *sumsq, const double *loss,
                       int loss_stride, int n_loss, double clip);
void mt_cuda_bf16_round(void *ctx, float *out, const float *x, size_t n);
void mt_cuda_convert(void *ctx, struct mt_tensor dst, struct mt_tensor src);
void mt_cuda_scale(void *ctx, float *x, float s, size_t n);
void mt_cuda_sumsq(void *ctx, double *acc, const float *x, size_t n);

/* cuda_qdq.cu: struct mt_quant_ops, and delayed scaling's histories (op amax_history) */
void mt_cuda_amax_history(void *ctx, float *hist, float *hscale, float *scale, float *amax, int n,
                          int len, int32_t *pos, bool max_algo, float fmax, float gmax, int margin,
                          float grad_unit, const struct mt_step_gate *gate);
void mt_cuda_qdq(void *ctx, const struct mt_quant_spec *s, struct mt_tensor out, struct mt_tensor x);
void mt_cuda_qgemm(void *ctx, bool trans_a, bool trans_b, const struct mt_quant_spec *sa,
                   struct mt_tensor a, const struct mt_quant_spec *sb, struct mt_tensor b, float beta,
                   struct mt_tensor c);
void mt_cuda_quant_save(void *ctx, const struct mt_quant_spec *s, void *saved, struct mt_tensor x);
size_t mt_cuda_quant_saved_bytes(const struct mt_quant_spec *s, int64_t rows, int64_t cols);
void mt_cuda_amax_nan_to_inf(void *ctx, float *amax, size_t n);
void mt_cuda_random_key(void *ctx, uint64_t *key, uint64_t base, int dp, int dp_rank, bool end,
                        const struct mt_step_gate *gate);
void mt_cuda_qgemm_grouped(void *ctx, int n, bool trans_a, bool trans_b, const struct mt_quant_spec *sa,
                           const struct mt_tensor *a, const struct mt_quant_spec *sb, const struct mt_tensor *b,
                           float beta, const struct mt_tensor *c);
/* cuda_layers.cu: rmsnorm_fwd and swiglu_fwd with the quantisation of out (struct
 * mt_quant_ops, fused with the producer; cuda_qdq.cu places what they emit) */
void mt_cuda_rmsnorm_fwd_q(void *ctx, const struct mt_quant_spec *s, void *fused, struct mt_tensor out,
                           float *rstd, struct mt_tensor x, struct mt_tensor w, int N, int C, float eps);
void mt_cuda_swiglu_fwd_q(void *ctx, const struct mt_quant_spec *s, void *fused, struct mt_tensor out,
                          struct mt_tensor gate, struct mt_tensor up, int N, int F);
/* The names of the scale modes set in modes (bit cublasLtMatmulMatrixScale_t), ", "
 * between them, into buf. */
void mt_cuda_lowp_gemm_names(unsigned modes, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif

/* moetrain: the Qwen3-MoE model (Hugging Face Qwen3MoeForCausalLM semantics, with
 * Megatron-Core's router, load balancing, capacity and initialisation).
 *
 * Per layer: RMSNorm -> GQA attention (QK-norm, RoPE, causal) -> residual;
 * RMSNorm -> MoE (router, routed SwiGLU experts, optional shared expert) or a dense
 * SwiGLU MLP -> residual. Then a final RMSNorm, the LM head (or the tied embedding)
 * and the causal LM cross-entropy. Every forward op has a hand-written backward; all
 * compute goes through a struct mt_kernels (kernels/kernels.h).
 *
 * Memory (llm.c style): parameters, gradients, the bf16 working copy, activations and
 * backward scratch are one allocation each, with named views; mt_model_memory()
 * reports every byte.
 *
 * Parallelism (given a struct mt_parallel): tensor parallelism with sequence
 * parallelism (Megatron's column/row-parallel linears, vocabulary-parallel embedding
 * and cross-entropy, SP norms and residuals), expert parallelism and expert tensor
 * parallelism with the 'alltoall' or 'allgather' token dispatcher. A rank holds the
 * shards of its coordinates (struct mt_param_info) and computes exactly what one
 * process computes for them: routing, capacity drops and the balancing losses use the
 * statistics of the whole micro-batch. Data parallelism is the trainer's. The passes
 * are model_pass.c (dense layers, embedding, loss) and model_moe.c (the MoE block).
 *
 * Precision (precision%params_dtype):
 *   fp32: everything fp32; the working weights are the master weights.
 *   bf16: emulated bit-exactly on fp32 storage. The optimizer updates fp32 master
 *         weights; forward and backward read a working copy rounded to bf16 (round to
 *         nearest even), refreshed by mt_model_params_updated(). Activations are
 *         rounded to bf16 where they are stored, as Megatron's bf16 tensors are:
 *         the embedding output, every RMSNorm output (input, post-attention, QK-norm,
 *         final), every linear layer's output (q, k, v, o_proj, MLP and expert
 *         gate/up/down, shared expert, LM-head logits), RoPE outputs, the attention
 *         output, SwiGLU outputs, the MoE combine (unpermute) output, the MoE plus
 *         shared-expert sum, and the residual stream after each addition. Kept in
 *         fp32: router logits, scores and routing weights (router_dtype fp32), the
 *         attention probabilities inside the attention op, softmax/CE/loss
 *         internals, RMSNorm statistics, the expert bias, and all gradients (which
 *         accumulate in fp32; rounding is treated as the identity in backward). */
#ifndef MT_MODEL_MODEL_H
#define MT_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "kernels/kernels.h"
#include "runtime/parallel.h"
#include "util/error.h"

struct mt_model;

/* Which parallel dimension splits a dimension of a parameter tensor. */
enum mt_split_dim { MT_SPLIT_NONE = 0, MT_SPLIT_TP, MT_SPLIT_EP, MT_SPLIT_ETP };

/* Where a rank sits for sharding purposes (one process: sizes 1, ranks 0). */
struct mt_shard_coords {
    int tp, tp_rank, ep, ep_rank, etp, etp_rank;
};

/* One parameter tensor. Names follow Hugging Face (`model.layers.3.self_attn.q_proj.weight`);
 * Linear weights are [out, in]; the routed experts of a layer are stacked:
 * `model.layers.L.mlp.experts.gate_proj` and `.up_proj` are [E, F, H], `.down_proj`
 * is [E, H, F]. shape is the whole tensor; a rank holds the shard local_shape starting
 * at start (dimension d split by split[d] into near-equal contiguous parts, Megatron's
 * layouts: column-parallel q/k/v, gate/up and vocabulary rows over TP, row-parallel
 * o_proj and down_proj columns over TP, experts over EP and their FFN width over ETP).
 * offset and numel count floats of the shard in this rank's params/grads buffers. */
struct mt_param_info {
    const char *name;
    int ndim;
    long long shape[4];
    enum mt_split_dim split[4];
    long long local_shape[4];
    long long start[4];
    size_t offset;
    size_t numel;
    size_t global_numel;
    bool no_weight_decay; /* RMSNorm weights (the model has no biases) */
    bool expert;          /* a routed expert's weight: data parallel over the expert-DP group */
    bool tp_replicated;   /* whole on every TP rank, its gradient there is the part from that
                           * rank's tokens or heads: summed over the TP group (norms, router) */
};

/* The shard of t that the rank at coordinates c holds. */
void mt_param_shard(const struct mt_param_info *t, const struct mt_shard_coords *c,
                    long long local_shape[4], long long start[4]);
/* Copies between a whole tensor (row-major, t->shape) and the shard (local_shape at start,
 * row-major): shard = slice of whole when to_shard, else the slice of whole = shard. */
void mt_param_copy_shard(const struct mt_param_info *t, const long long local_shape[4],
                         const long long start[4], float *whole, float *shard, bool to_shard);

/* Filled by forward(+backward); sums over the call. With tensor parallelism every TP rank
 * sees the whole micro-batch's lm_loss and tokens, while aux_loss, z_loss and
 * dropped_tokens are this rank's share (its sequence-parallel tokens): sum them over
 * the TP group. */
struct mt_model_stats {
    double lm_loss;              /* mean CE over the tokens of this call */
    double aux_loss;             /* load-balancing loss (already times coeff), summed over MoE layers */
    double z_loss;               /* z-loss (times coeff), summed over MoE layers */
    long long tokens;            /* tokens that contributed to lm_loss */
    long long dropped_tokens;    /* token-expert assignments dropped by capacity */
};

/* cfg is already resolved and validated by the config module; the model still
 * rejects what it cannot run (MT_EINVAL / MT_EUNSUPPORTED, naming the key).
 * Activations are sized for up to max_micro_batch sequences of training%seq_length. */
/* The model's own rules on a resolved configuration (routing combinations,
 * supported dtypes, ...), without allocating; mt_model_create applies them too.
 * The CLI calls this for --check and before training starts. */
int mt_model_check_config(const struct mt_config *cfg, struct mt_err *err);

/* par: this process's place in the parallel layout (TP with sequence parallelism, EP,
 * ETP; data parallelism is the trainer's), or NULL for one process. The model then
 * holds its shards and runs its collectives on par's communicators. */
int mt_model_create(const struct mt_config *cfg, const struct mt_kernels *k, int max_micro_batch,
                    const struct mt_parallel *par, struct mt_model **out, struct mt_err *err);
void mt_model_destroy(struct mt_model *m);

size_t mt_model_num_params(const struct mt_model *m);        /* this rank's (its shards) */
size_t mt_model_num_global_params(const struct mt_model *m); /* the whole model's */
void mt_model_shard_coords(const struct mt_model *m, struct mt_shard_coords *c);
int mt_model_num_tensors(const struct mt_model *m);
const struct mt_param_info *mt_model_tensor(const struct mt_model *m, int i);

float *mt_model_params(struct mt_model *m);     /* fp32 master, contiguous */
float *mt_model_grads(struct mt_model *m);      /* same layout */
/* Non-trainable state to checkpoint: the expert biases, [num_moe_layers][num_experts]
 * fp32 (HF: mlp.gate.e_score_correction_bias); *n gets the count (0 when disabled). */
float *mt_model_buffers(struct mt_model *m, size_t *n);

/* Layout-independent init: element j (index into the whole tensor) of tensor i is
 * std_i * mt_rng_normal(mt_rng_key(seed, i), 0, j); RMSNorm weights are 1; o_proj and
 * every down_proj use init_method_std / sqrt(2 num_layers) (Megatron's scaled init).
 * Zeroes the expert biases and counts, refreshes the working copy. */
void mt_model_init(struct mt_model *m, unsigned long long seed);
/* After the optimizer step (or after loading params): refresh the bf16 working copy. */
void mt_model_params_updated(struct mt_model *m);
void mt_model_zero_grad(struct mt_model *m);

/* tokens is (B, T+1) int32 with T = cfg->training.seq_length: inputs tokens[b][0..T-1]
 * in [0, vocab), targets tokens[b][1..T] (a negative target is ignored). Every rank of
 * a TP group passes the same micro-batch (each works on its sequence-parallel part of
 * the B*T tokens: TP rank r on tokens r*B*T/tp ... in batch-major order). Accumulates
 * loss_scale * d(total loss)/d(params) into grads (total = lm + aux + z); loss_scale
 * is e.g. 1/num_micro_batches. Adds the routed-token counts to the expert counts. */
int mt_model_forward_backward(struct mt_model *m, const int32_t *tokens, int B, float loss_scale,
                              struct mt_model_stats *st, struct mt_err *err);
/* Evaluation: the same forward (losses reported), no gradients, no expert counts. */
int mt_model_forward(struct mt_model *m, const int32_t *tokens, int B, struct mt_model_stats *st,
                     struct mt_err *err);

int mt_model_num_moe_layers(const struct mt_model *m);
/* Per MoE layer, tokens routed to each expert since the last reset ([nmoe][num_experts],
 * assignments kept after capacity dropping, padding excluded); used for logging min/max
 * load and the expert-bias update. This rank's tokens only: the trainer sums the counts
 * over all ranks (mt_model_expert_counts_mut) before the bias update. */
const long long *mt_model_expert_counts(const struct mt_model *m);
long long *mt_model_expert_counts_mut(struct mt_model *m);
void mt_model_reset_expert_counts(struct mt_model *m);
/* Megatron's get_updated_expert_bias: bias += router_bias_update_rate *
 * sign(mean count - count), per MoE layer. No-op unless router_enable_expert_bias.
 * Does not reset the counts (call mt_model_reset_expert_counts). */
void mt_model_update_expert_bias(struct mt_model *m);

struct mt_memory_report {
    size_t params;        /* fp32 master weights */
    size_t grads;         /* fp32 gradients */
    size_t working_copy;  /* bf16 working weights (0 in fp32; on CPU stored widened to fp32) */
    size_t activations;   /* what forward saves for backward, for max_micro_batch */
    size_t scratch;       /* backward temporaries */
    size_t buffers;       /* expert biases and routed-token counters */
};
void mt_model_memory(const struct mt_model *m, struct mt_memory_report *r);

/* Megatron's num_floating_point_operations (megatron/training/training.py, standard
 * transformer with SwiGLU, GQA, MoE and shared experts), forward + backward, per token. */
double mt_model_flops_per_token(const struct mt_model *m);

#endif

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
 * statistics of the whole micro-batch. Pipeline parallelism: a rank holds and runs
 * only its stage's model chunks (mt_model_set_stage and the stage passes below); the
 * trainer runs the schedule. Data parallelism is the trainer's. The passes
 * are model_pass.c (dense layers, embedding, loss) and model_moe.c (the MoE block).
 *
 * Precision (precision%params_dtype):
 *   fp32: everything fp32; the working weights are the master weights.
 *   bf16: the optimizer updates fp32 master weights; forward and backward read a
 *         working copy stored in bf16 (round to nearest even), refreshed by
 *         mt_model_params_updated() (the convert op). Activations are stored in bf16,
 *         written so by the op that produces them (the fp32 result rounded to nearest
 *         even as it is stored), as Megatron's bf16 tensors are: the embedding output,
 *         every RMSNorm output (input, post-attention, QK-norm, final), every linear
 *         layer's output (q, k, v, o_proj, MLP and expert gate/up/down, shared expert),
 *         RoPE outputs, the attention output's copy that o_proj reads, SwiGLU outputs,
 *         the MoE combine (unpermute) output, the MoE plus shared-expert sum, and the
 *         residual stream after each addition. Partial sums over TP or ETP are reduced
 *         in fp32 and stored in bf16 after the sum. Kept in fp32: router logits, scores
 *         and routing weights (router_dtype fp32), the LM-head logits (rounded to bf16
 *         values in place: the cross-entropy backward writes its gradient over them),
 *         the attention output and lse the attention op saves for its backward,
 *         softmax/CE/loss internals, RMSNorm statistics, the allgather dispatcher's
 *         expert outputs while they are ETP partial sums, the expert bias, and all
 *         gradients (which accumulate in fp32; rounding is treated as the identity in
 *         backward). The values are those of fp32 storage rounded in place at the same
 *         points, bit for bit (MT_DEBUG_FP32_ACTIVATIONS=1 trains that way, for
 *         tests/parallel/bf16_storage.sh). */
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

/* What the passes tell the trainer as they go (mt_model_set_hooks); either may be NULL.
 * A non-zero return fails the pass with err. */
struct mt_model_hooks {
    /* backward has finished `position`: it adds nothing more to the gradients there */
    int (*grads_done)(void *ctx, int position, struct mt_err *err);
    /* forward is about to read the weights at `position` (also in evaluation) */
    int (*weights_needed)(void *ctx, int position, struct mt_err *err);
    void *ctx;
};

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
    int layer;            /* transformer layer, -1 for the embedding, final norm and LM head */
    /* Pipeline parallelism: a rank holds the tensors of its stage only; the others have
     * numel 0 here (mt_model_tensor_on_stage says where they live). pp_replica: the
     * tied embedding on the last stage (its LM head), a copy of the first stage's kept
     * equal by summing their gradients over the embedding group. */
    bool pp_replica;
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
    long long expert_overflows;  /* MoE layer forwards whose experts received more rows than
                                    moe%expert_buffer_factor planned (memory borrowed) */
    long long expert_rows_max;   /* the most rows such a forward received */
    long long offload_d2h_bytes; /* activation offloading: bytes copied to the host (forward) */
    long long offload_h2d_bytes; /* and back (backward) */
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
 * fp32 (HF: mlp.gate.e_score_correction_bias), then the FP8/FP4 recipes' state (the
 * iteration that keys their random bits, delayed scaling's amax histories); *n gets
 * the count (0 when there is none). */
float *mt_model_buffers(struct mt_model *m, size_t *n);
/* After the buffers were written through mt_model_buffers (a checkpoint load): the
 * routers read the expert biases from a backend-memory copy of that host master. */
void mt_model_buffers_updated(struct mt_model *m);
/* FP8/FP4 (&precision fp8_format, fp4_format; doc/fp8.md): after each optimizer step,
 * delayed scaling's amaxes of the step are reduced (max) over every rank and enter the
 * histories that give the next step's scales (mt_model_lowp_roll, unless rolled: the
 * iteration did, on the device); the iteration that keys the recipes' random bits
 * advances. A collective when delayed scaling runs on several ranks. */
int mt_model_lowp_step(struct mt_model *m, bool rolled, struct mt_err *err);
/* Delayed scaling's histories rolled on the backend with the step's amaxes (reduced over
 * every rank), and NVFP4's random key advanced to the next iteration there, unless gate
 * (or NULL: the step is taken) says the step is skipped: what
 * a captured iteration (&cuda_graph impl = 'full_iteration') runs after its optimizer
 * step, the host then calling mt_model_lowp_step(m, true) for the steps it takes. */
int mt_model_lowp_roll(struct mt_model *m, const struct mt_step_gate *gate, struct mt_err *err);
/* "fp8 delayed", "fp8 blockwise", ..., or NULL when no recipe runs. */
const char *mt_model_lowp_recipe(const struct mt_model *m);
/* The backend the model's memory belongs to (params and grads are its memory). */
const struct mt_kernels *mt_model_kernels(const struct mt_model *m);

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

/* The device-resident step (doc/host-overhead.md). What a forward adds up on the
 * backend (the LM loss, the balancing and z losses, the dropped assignments, the expert
 * loads) stays in backend memory, one record per counted forward, with the optimizer's
 * gradient sum of squares (mt_model_sumsq_acc) beside them. By default each of the
 * passes above reads its record at its end (one wait for the device) into st. After
 * mt_model_defer_stats(max_forwards), they leave them there, st carrying only what the
 * host knows (tokens, expert overflows, offloaded bytes, capacity drops decided over
 * TP), and mt_model_read_stats reads the records of every forward since the last read,
 * in the order they ran, and the sum of squares, in one copy: st[i] gets forward i's
 * lm_loss, aux_loss, z_loss and dropped_tokens, the expert loads go to the counts, and
 * the records are cleared. More than max_forwards forwards between reads is an error. */
int mt_model_defer_stats(struct mt_model *m, int max_forwards, struct mt_err *err);
int mt_model_read_stats(struct mt_model *m, struct mt_model_stats *st, int max, int *n,
                        double *sumsq, struct mt_err *err);
/* One double of backend memory the optimizer sums the squared gradients into. */
double *mt_model_sumsq_acc(struct mt_model *m);

/* Whether tensor i lives on pipeline stage `stage` (0 .. pp-1 of this model's layout;
 * everything with one stage), and whether it is the tied-embedding copy there. */
bool mt_model_tensor_on_stage(const struct mt_model *m, int i, int stage, bool *replica);
/* The tied embedding's tensor index when this rank holds it and pipeline stages share
 * it (first and last stage, untie_embeddings_and_output_weights = .false.), else -1. */
int mt_model_pp_tied_embedding(const struct mt_model *m);

/* ---- pipeline parallelism: this rank runs one stage of the model.
 * mt_model_set_stage (once, after create) restricts the passes to the stage's model
 * chunks: chunk c holds layers [l0[c], l1[c]) (one chunk without a virtual pipeline,
 * virtual_pipeline_model_parallel_size with one). The first stage's chunk 0 embeds the
 * tokens (l0[0] = 0), the last stage's last chunk applies the final norm, the LM head
 * and the loss (its l1 = num_layers). The parameters are the stage's (fixed at create
 * from par's pipeline rank: its layers, the embedding on the first stage, the final
 * norm and LM head on the last, the tied embedding on both); the activations become nslots slots per chunk, mt_model_slot_bytes(chunk) each, one per
 * in-flight micro-batch: a slot keeps what a forward saved until its backward.
 * Between stages travels this rank's (B*T/tp, hidden) part of the residual stream:
 * mt_model_stage_act_numel values of mt_model_act_size bytes (bf16 in bf16 training);
 * its gradient the same number of fp32 values. */
int mt_model_set_stage(struct mt_model *m, int nchunks, const int *l0, const int *l1,
                       bool first_stage, bool last_stage, int nslots, struct mt_err *err);
/* One micro-batch's activations of chunk (the whole model's before set_stage). */
size_t mt_model_slot_bytes(const struct mt_model *m, int chunk);
size_t mt_model_stage_act_numel(const struct mt_model *m, int B);
/* Bytes of one stored activation value (the activation dtype's size). */
size_t mt_model_act_size(const struct mt_model *m);
/* Forward of chunk into slot: x_in is the previous chunk's output (NULL for the
 * first stage's chunk 0: tokens are embedded), x_out receives this chunk's (ignored on
 * the last stage's last chunk, which computes the loss into st). train: keep what
 * backward needs and count routed tokens; loss_scale as for mt_model_forward_backward. */
int mt_model_stage_forward(struct mt_model *m, int chunk, int slot, const int32_t *tokens,
                           int B, const float *x_in, float *x_out, bool train, float loss_scale,
                           struct mt_model_stats *st, struct mt_err *err);
/* Backward of the micro-batch in chunk's slot: dy is the gradient of the chunk's
 * output (NULL for the last stage's last chunk: from the loss), dx receives the
 * gradient of its input (ignored for the first stage's chunk 0). Accumulates into the
 * gradients. */
int mt_model_stage_backward(struct mt_model *m, int chunk, int slot, const float *dy,
                            float *dx, struct mt_model_stats *st, struct mt_err *err);

/* ---- positions, for communication that overlaps the passes (the trainer's &parallel
 * overlap_grad_reduce and overlap_param_gather). Every tensor has a position
 * (mt_model_tensor_position): its layer, -1 for the embedding, num_layers for the
 * final norm and the LM head (and the tied embedding's copy on the last pipeline
 * stage). A forward pass visits the positions it runs in ascending order and calls
 * hooks->weights_needed(p) before it first reads the weights at p; a backward pass
 * visits them in descending order and calls hooks->grads_done(p) once it adds nothing
 * more to the gradients at p. The model knows nothing of what the hooks do; they are
 * called in every pass (every micro-batch; the caller knows which one is the last).
 * hooks NULL removes them. */
int mt_model_tensor_position(const struct mt_model *m, int i);
void mt_model_set_hooks(struct mt_model *m, const struct mt_model_hooks *hooks);

/* &cuda_graph: whether the passes from now on capture the scopes they have no graph of
 * (the trainer sets it once warmup_steps iterations are done); before, they run
 * eagerly. Without graphs it changes nothing. */
void mt_model_set_graph_capture(struct mt_model *m, bool capture);
/* &cuda_graph impl = 'full_iteration': the trainer's iteration as one graph scope, from
 * begin to end (no scope of the passes inside it). sig: what the caller's part of it
 * depends on (micro-batch count and size); the model adds its allocations. With a graph
 * of the same signature it is launched and *run is false: skip to end (the host's part,
 * mt_model_stage_tokens, before begin). Else *run is true, and the iteration runs
 * eagerly (warm-up) or is captured, end then launching it. Without full_iteration,
 * *run is true and both do nothing. */
int mt_model_iteration_begin(struct mt_model *m, uint64_t sig, bool *run, struct mt_err *err);
int mt_model_iteration_end(struct mt_model *m, struct mt_err *err);
/* Fills the next record's token slot from tokens (B sequences of T + 1) ahead of its
 * forward, which is then called with tokens NULL and takes them in order (the upload
 * stays in the forward, reading the slot: a replayed iteration uploads what was staged
 * for it). Needs mt_model_defer_stats. */
int mt_model_stage_tokens(struct mt_model *m, const int32_t *tokens, int B, struct mt_err *err);
/* n copies src[i] (alloc_host memory) -> dst[i] (backend memory) of bytes[i] on the copy
 * stream, after the compute queued so far and before the compute queued next; the host
 * does not wait, and must not write src until a read of device memory has waited for
 * the compute queued after them. */
void mt_model_upload(struct mt_model *m, int n, void *const *dst, const void *const *src,
                     const size_t *bytes);
/* The loss sums of the forwards since the last read in backend memory (the records'
 * cross-entropy sums): *n of them, one every *stride doubles. */
const double *mt_model_loss_sums(struct mt_model *m, int *stride, int *n);
/* The backend's graph counts (struct mt_graph_stats); false when the model captures
 * no scope. */
bool mt_model_graph_stats(const struct mt_model *m, struct mt_graph_stats *out);
/* After params[offset, offset + n) changed: refresh that part of the bf16 working copy
 * (mt_model_params_updated for a part, with the same values). */
void mt_model_params_updated_range(struct mt_model *m, size_t offset, size_t n);

int mt_model_num_moe_layers(const struct mt_model *m);
/* &moe moe_shared_expert_overlap: the expert-parallel all-to-alls that were still in
 * flight after their start while the shared expert ran, since the model was created
 * (0 where every start completes at once: a self comm, the guard backend's memory). */
long long mt_model_a2a_overlapped(const struct mt_model *m);
/* Per MoE layer, tokens routed to each expert since the last reset ([nmoe][num_experts],
 * assignments kept after capacity dropping, padding excluded); used for logging min/max
 * load and the expert-bias update. This rank's tokens only: the trainer sums the counts
 * over all ranks (mt_model_expert_counts_mut) before the bias update. */
const long long *mt_model_expert_counts(const struct mt_model *m);
long long *mt_model_expert_counts_mut(struct mt_model *m);
void mt_model_reset_expert_counts(struct mt_model *m);
/* Megatron's get_updated_expert_bias: bias += router_bias_update_rate *
 * sign(mean count - count), per MoE layer, the counts of every rank. No-op unless
 * router_enable_expert_bias. The host master is updated from mt_model_expert_counts
 * (summed by the trainer); with device, the routers' copy too, on the device from the
 * loads kept there since the last reset (summed over the ranks there): no upload. Does
 * not reset the counts (call mt_model_reset_expert_counts). */
int mt_model_update_expert_bias(struct mt_model *m, bool device, struct mt_err *err);
/* The routers' copy's update inside a captured iteration (&cuda_graph impl =
 * 'full_iteration'), after the step's last forward: the same op on the same loads, gated
 * as the optimizer's adamw_dev on the squared norm and the n_loss loss sums
 * loss[i * loss_stride] in backend memory (nothing written unless all are finite), so
 * that it changes exactly when the host's update (mt_model_update_expert_bias with
 * device false, after the read) changes the master. */
int mt_model_update_expert_bias_dev(struct mt_model *m, const double *loss, int loss_stride,
                                    int n_loss, struct mt_err *err);

/* With host%manual_gc, the expert-side blocks that a step over the planned rows takes
 * from the allocator (moe%expert_buffer_factor) are not freed when the step is done but
 * kept for the next such step (deferred frees); this frees them, as a collection does,
 * and returns their bytes. */
size_t mt_model_release_deferred(struct mt_model *m);

struct mt_memory_report {
    size_t params;        /* fp32 master weights */
    size_t grads;         /* fp32 gradients */
    size_t working_copy;  /* bf16 working weights, 2 bytes each (0 in fp32) */
    size_t activations;   /* what forward saves for backward, for max_micro_batch */
    size_t lowp_copies;   /* FP8/FP4: of one micro-batch's activations, the linears' inputs
                             saved quantised for backward (data and scales) */
    size_t lowp_replaced; /* the high-precision inputs those copies replace (not kept) */
    size_t recompute;     /* the one buffer backward rebuilds what forward did not keep in
                             (&recompute), shared by every layer, slot and chunk */
    size_t scratch;       /* backward temporaries */
    size_t buffers;       /* expert biases and routed-token counters */
    size_t device_buffers; /* the part of buffers in backend memory (expert biases) */
    size_t offload;       /* activation offloading's device buffer: two layers' offloaded
                             tensors, shared by every slot and chunk */
    size_t offload_host;  /* its pinned host blocks: every slot's offloaded tensors */
    size_t offload_per_mb; /* bytes a micro-batch's forward copies out (and backward back) */
};
void mt_model_memory(const struct mt_model *m, struct mt_memory_report *r);

/* Megatron's num_floating_point_operations (megatron/training/training.py, standard
 * transformer with SwiGLU, GQA, MoE and shared experts), forward + backward, per token. */
double mt_model_flops_per_token(const struct mt_model *m);

#endif

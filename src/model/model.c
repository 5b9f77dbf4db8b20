/* Qwen3-MoE model: configuration checks, the parameter table, memory layout,
 * initialisation, expert-bias bookkeeping and FLOP accounting. The passes are in
 * model_pass.c. */
#include "model/model_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/hostmem.h"
#include "util/rng.h"

#define NAME_MAX_LEN 96

/* ------------------------------------------------------------ config checks */

static bool streq(const char *a, const char *b) { return strcmp(a, b) == 0; }

static bool layer_is_moe(const struct mt_config *cfg, int l)
{
    if (cfg->moe.num_experts <= 0) return false;
    if (cfg->moe.layer_freq_len == 0) return true; /* no pattern: every layer */
    return cfg->moe.layer_freq[l] != 0;
}

static int check_model(const struct mt_config *cfg, struct mt_err *err)
{
    const struct mt_config_model *md = &cfg->model;
    const struct mt_config_moe *mo = &cfg->moe;
    if (md->num_layers < 1 || md->num_layers > MT_MAX_LAYERS)
        return mt_err_set(err, MT_EINVAL, "model%%num_layers = %d must be in [1, %d]",
                          md->num_layers, MT_MAX_LAYERS);
    if (md->hidden_size < 1 || md->num_attention_heads < 1 || md->vocab_size < 1)
        return mt_err_set(err, MT_EINVAL,
                          "model%%hidden_size = %d, num_attention_heads = %d and vocab_size = %d must be >= 1",
                          md->hidden_size, md->num_attention_heads, md->vocab_size);
    if (md->num_query_groups < 1 || md->num_attention_heads % md->num_query_groups != 0)
        return mt_err_set(err, MT_EINVAL,
                          "model%%num_query_groups = %d must divide model%%num_attention_heads = %d",
                          md->num_query_groups, md->num_attention_heads);
    if (md->kv_channels < 2 || md->kv_channels % 2 != 0)
        return mt_err_set(err, MT_EINVAL,
                          "model%%kv_channels = %d must be even and >= 2 (RoPE rotates pairs)",
                          md->kv_channels);
    if ((long long)md->num_attention_heads * md->kv_channels > MT_SIZE_MAX)
        return mt_err_set(err, MT_EINVAL,
                          "model%%num_attention_heads (%d) x kv_channels (%d) = %lld, more than "
                          "%d, the largest width moetrain computes with; lower one of them",
                          md->num_attention_heads, md->kv_channels,
                          (long long)md->num_attention_heads * md->kv_channels, MT_SIZE_MAX);
    if (!(md->rotary_base > 0.0))
        return mt_err_set(err, MT_EINVAL, "model%%rotary_base = %g must be > 0", md->rotary_base);
    if (!(md->norm_epsilon >= 0.0))
        return mt_err_set(err, MT_EINVAL, "model%%norm_epsilon = %g must be >= 0", md->norm_epsilon);
    if (!(md->init_method_std >= 0.0))
        return mt_err_set(err, MT_EINVAL, "model%%init_method_std = %g must be >= 0",
                          md->init_method_std);
    if (cfg->training.seq_length < 1 || cfg->training.seq_length > md->max_position_embeddings)
        return mt_err_set(err, MT_EINVAL,
                          "training%%seq_length = %d must be in [1, model%%max_position_embeddings = %d]",
                          cfg->training.seq_length, md->max_position_embeddings);
    if (!streq(cfg->precision.params_dtype, "fp32") && !streq(cfg->precision.params_dtype, "bf16"))
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "precision%%params_dtype = '%s' is not supported (use 'fp32' or 'bf16')",
                          cfg->precision.params_dtype);
    bool any_dense = false, any_moe = false;
    for (int l = 0; l < md->num_layers; l++) {
        if (layer_is_moe(cfg, l)) any_moe = true;
        else any_dense = true;
    }
    if (any_dense && md->ffn_hidden_size < 1)
        return mt_err_set(err, MT_EINVAL, "model%%ffn_hidden_size = %d must be >= 1 (dense MLP layers)",
                          md->ffn_hidden_size);
    if (mo->num_experts < 0)
        return mt_err_set(err, MT_EINVAL, "moe%%num_experts = %d must be >= 0", mo->num_experts);
    if (!any_moe) return MT_OK;
    if (mo->layer_freq_len != 0 && mo->layer_freq_len != md->num_layers)
        return mt_err_set(err, MT_EINVAL, "moe%%layer_freq has %d entries, model%%num_layers = %d",
                          mo->layer_freq_len, md->num_layers);
    if (mo->moe_ffn_hidden_size < 1)
        return mt_err_set(err, MT_EINVAL, "moe%%moe_ffn_hidden_size = %d must be >= 1",
                          mo->moe_ffn_hidden_size);
    if (mo->router_topk < 1 || mo->router_topk > mo->num_experts)
        return mt_err_set(err, MT_EINVAL, "moe%%router_topk = %d must be in [1, moe%%num_experts = %d]",
                          mo->router_topk, mo->num_experts);
    bool sigmoid = streq(mo->router_score_function, "sigmoid");
    if (!sigmoid && !streq(mo->router_score_function, "softmax"))
        return mt_err_set(err, MT_EINVAL,
                          "moe%%router_score_function = '%s' (use 'softmax' or 'sigmoid')",
                          mo->router_score_function);
    if (sigmoid && mo->router_pre_softmax)
        return mt_err_set(err, MT_EINVAL,
                          "moe%%router_pre_softmax = .true. has no effect with router_score_function = 'sigmoid'");
    if (!sigmoid && !mo->router_pre_softmax && mo->router_topk == 1)
        return mt_err_set(err, MT_EINVAL,
                          "moe%%router_topk = 1 with softmax scores needs moe%%router_pre_softmax = .true. "
                          "(a softmax over one expert is constant, as Megatron also rejects)");
    if (!streq(mo->router_dtype, "fp32"))
        return mt_err_set(err, MT_EUNSUPPORTED, "moe%%router_dtype = '%s' is not supported (use 'fp32')",
                          mo->router_dtype);
    if (!(mo->router_topk_scaling_factor >= 0.0))
        return mt_err_set(err, MT_EINVAL, "moe%%router_topk_scaling_factor = %g must be >= 0 (0: none)",
                          mo->router_topk_scaling_factor);
    const char *lb = mo->router_load_balancing_type;
    if (streq(lb, "sinkhorn"))
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "moe%%router_load_balancing_type = 'sinkhorn' is not supported "
                          "(use 'aux_loss', 'seq_aux_loss' or 'none')");
    if (!streq(lb, "aux_loss") && !streq(lb, "seq_aux_loss") && !streq(lb, "none"))
        return mt_err_set(err, MT_EINVAL,
                          "moe%%router_load_balancing_type = '%s' (use 'aux_loss', 'seq_aux_loss' or 'none')", lb);
    if (!(mo->aux_loss_coeff >= 0.0) || !(mo->z_loss_coeff >= 0.0))
        return mt_err_set(err, MT_EINVAL, "moe%%aux_loss_coeff = %g and moe%%z_loss_coeff = %g must be >= 0",
                          mo->aux_loss_coeff, mo->z_loss_coeff);
    if (streq(lb, "none") && mo->aux_loss_coeff > 0.0)
        return mt_err_set(err, MT_EINVAL,
                          "moe%%aux_loss_coeff = %g has no effect with router_load_balancing_type = 'none'",
                          mo->aux_loss_coeff);
    if (mo->router_enable_expert_bias && !sigmoid)
        return mt_err_set(err, MT_EINVAL,
                          "moe%%router_enable_expert_bias needs router_score_function = 'sigmoid' (as in Megatron)");
    if (!(mo->expert_capacity_factor >= 0.0))
        return mt_err_set(err, MT_EINVAL, "moe%%expert_capacity_factor = %g must be >= 0 (0: dropless)",
                          mo->expert_capacity_factor);
    if (mo->pad_expert_input_to_capacity && mo->expert_capacity_factor <= 0.0)
        return mt_err_set(err, MT_EINVAL,
                          "moe%%pad_expert_input_to_capacity needs moe%%expert_capacity_factor > 0");
    if (!streq(mo->token_drop_policy, "probs") && !streq(mo->token_drop_policy, "position"))
        return mt_err_set(err, MT_EINVAL, "moe%%token_drop_policy = '%s' (use 'probs' or 'position')",
                          mo->token_drop_policy);
    if (mo->shared_expert_intermediate_size < 0)
        return mt_err_set(err, MT_EINVAL, "moe%%shared_expert_intermediate_size = %d must be >= 0",
                          mo->shared_expert_intermediate_size);
    if (!streq(mo->token_dispatcher_type, "alltoall") && !streq(mo->token_dispatcher_type, "allgather"))
        return mt_err_set(err, MT_EINVAL, "moe%%token_dispatcher_type = '%s' (use 'alltoall' or 'allgather')",
                          mo->token_dispatcher_type);
    return MT_OK;
}

/* The rules of the parallel layouts the model implements (sizes < 1 mean 1: a config
 * filled by hand for one process). */
static int check_parallel(const struct mt_config *cfg, struct mt_err *err)
{
    const struct mt_config_parallel *pa = &cfg->parallel;
    const int tp = pa->tensor_model_parallel_size > 1 ? pa->tensor_model_parallel_size : 1;
    const int T = cfg->training.seq_length;
    if (tp == 1) return MT_OK;
    if (!pa->sequence_parallel)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "parallel%%tensor_model_parallel_size = %d needs parallel%%sequence_parallel = "
                          ".true. (tensor parallelism is implemented with sequence parallelism; "
                          "Megatron requires it too for MoE models)",
                          tp);
    if (T % tp)
        return mt_err_set(err, MT_EINVAL,
                          "training%%seq_length = %d must be divisible by "
                          "parallel%%tensor_model_parallel_size = %d (sequence parallelism splits it)",
                          T, tp);
    if (cfg->model.vocab_size < tp)
        return mt_err_set(err, MT_EINVAL,
                          "model%%vocab_size = %d is smaller than parallel%%tensor_model_parallel_size = %d",
                          cfg->model.vocab_size, tp);
    if (cfg->moe.num_experts > 0 && cfg->moe.shared_expert_intermediate_size % tp)
        return mt_err_set(err, MT_EINVAL,
                          "moe%%shared_expert_intermediate_size = %d is not divisible by "
                          "parallel%%tensor_model_parallel_size = %d",
                          cfg->moe.shared_expert_intermediate_size, tp);
    return MT_OK;
}

/* Full recompute needs its groups (the config module's rules; a config filled by hand
 * may leave them out). */
static int check_recompute(const struct mt_config *cfg, struct mt_err *err)
{
    const struct mt_config_recompute *r = &cfg->recompute;
    if (strcmp(r->granularity, "full") != 0) return MT_OK;
    if (r->num_layers >= 1 && (streq(r->method, "uniform") || streq(r->method, "block")))
        return MT_OK;
    return mt_err_set(err, MT_EINVAL,
                      "recompute%%granularity = 'full' needs method = 'uniform' or 'block' and "
                      "num_layers >= 1 (method = '%s', num_layers = %d)",
                      r->method, r->num_layers);
}

int mt_model_check_config(const struct mt_config *cfg, struct mt_err *err)
{
    MT_CHECK(check_model(cfg, err));
    MT_CHECK(check_recompute(cfg, err));
    return check_parallel(cfg, err);
}

/* ------------------------------------------------------------ parameter table */

/* Size arithmetic that saturates at SIZE_MAX instead of wrapping: a model or a batch
 * too large to count is then an allocation that cannot be made, never a small one. */
static size_t sat_mul(size_t a, size_t b)
{
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

static size_t sat_add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

/* The backend allocator for sizes a machine can have: a saturated size never reaches
 * it (its rounding up to the alignment would wrap it to a tiny block). */
static void *dev_alloc(const struct mt_kernels *k, size_t bytes)
{
    return bytes <= SIZE_MAX / 2 ? k->op.alloc(k->ctx, bytes) : NULL;
}

static int add_tensor(struct mt_model *m, float std, bool no_wd, int ndim, const long long *shape,
                      const char *fmt, int layer, const char *leaf)
{
    int id = m->ntensors++;
    struct mt_param_info *t = &m->tensors[id];
    char *name = m->names + (size_t)id * NAME_MAX_LEN;
    if (layer >= 0)
        snprintf(name, NAME_MAX_LEN, fmt, layer, leaf);
    else
        snprintf(name, NAME_MAX_LEN, "%s", fmt);
    t->name = name;
    t->ndim = ndim;
    t->global_numel = 1;
    for (int d = 0; d < 4; d++) {
        t->shape[d] = d < ndim ? shape[d] : 0;
        t->split[d] = MT_SPLIT_NONE;
    }
    for (int d = 0; d < ndim; d++) t->global_numel = sat_mul(t->global_numel, (size_t)shape[d]);
    t->no_weight_decay = no_wd;
    t->layer = layer;
    m->std_of[id] = std;
    return id;
}

/* Marks dimension dim of tensor id as split by kind. */
static void split(struct mt_model *m, int id, int dim, enum mt_split_dim kind)
{
    m->tensors[id].split[dim] = kind;
    if (kind == MT_SPLIT_ETP || kind == MT_SPLIT_EP) m->tensors[id].expert = true;
}

/* Part i of n near-equal contiguous parts of size `size`: its start and length. */
static void part_of(long long size, int n, int i, long long *start, long long *len)
{
    long long base = size / n, extra = size % n;
    *start = i * base + (i < extra ? i : extra);
    *len = base + (i < extra ? 1 : 0);
}

void mt_param_shard(const struct mt_param_info *t, const struct mt_shard_coords *c,
                    long long local_shape[4], long long start[4])
{
    for (int d = 0; d < 4; d++) {
        int n = 1, i = 0;
        switch (t->split[d]) {
        case MT_SPLIT_NONE: break;
        case MT_SPLIT_TP: n = c->tp; i = c->tp_rank; break;
        case MT_SPLIT_EP: n = c->ep; i = c->ep_rank; break;
        case MT_SPLIT_ETP: n = c->etp; i = c->etp_rank; break;
        }
        if (d >= t->ndim) {
            local_shape[d] = 0;
            start[d] = 0;
        } else {
            part_of(t->shape[d], n, i, &start[d], &local_shape[d]);
        }
    }
}

/* Calls f(whole_index, shard_index, run) for every contiguous run of a shard: the
 * innermost dimension is contiguous in both. */
static void for_each_run(const struct mt_param_info *t, const long long ls[4],
                         const long long st[4], void (*f)(void *, size_t, size_t, size_t),
                         void *ctx)
{
    const int nd = t->ndim;
    long long outer = 1;
    for (int d = 0; d < nd - 1; d++) outer *= ls[d];
    const long long run = ls[nd - 1];
    for (long long o = 0; o < outer; o++) {
        /* decompose o over the shard's outer dimensions, map to the whole tensor */
        long long rem = o, whole = 0, stride = t->shape[nd - 1];
        for (int d = nd - 2; d >= 0; d--) {
            long long i = rem % ls[d];
            rem /= ls[d];
            whole += (st[d] + i) * stride;
            stride *= t->shape[d];
        }
        whole += st[nd - 1];
        f(ctx, (size_t)whole, (size_t)(o * run), (size_t)run);
    }
}

struct copy_ctx {
    float *whole, *shard;
    bool to_shard;
};

static void copy_run(void *p, size_t whole, size_t shard, size_t n)
{
    struct copy_ctx *c = p;
    if (c->to_shard)
        memcpy(c->shard + shard, c->whole + whole, sizeof(float) * n);
    else
        memcpy(c->whole + whole, c->shard + shard, sizeof(float) * n);
}

void mt_param_copy_shard(const struct mt_param_info *t, const long long local_shape[4],
                         const long long start[4], float *whole, float *shard, bool to_shard)
{
    struct copy_ctx c = {whole, shard, to_shard};
    for_each_run(t, local_shape, start, copy_run, &c);
}

#define SHAPE(...) ((const long long[]){__VA_ARGS__})
#define LAYER_FMT "model.layers.%d.%s"

static void build_tensors(struct mt_model *m)
{
    const float std = (float)m->cfg.model.init_method_std;
    const float out_std = std / sqrtf(2.0f * (float)m->L);
    const long long H = m->H, Q = m->Q, KV = m->KV, D = m->hd;
    m->embed = add_tensor(m, std, false, 2, SHAPE(m->V, H), "model.embed_tokens.weight", -1, NULL);
    split(m, m->embed, 0, MT_SPLIT_TP); /* vocabulary-parallel */
    for (int l = 0; l < m->L; l++) {
        struct mt_layer_tensors *t = &m->lt[l];
        *t = (struct mt_layer_tensors){MT_NO_TENSOR, MT_NO_TENSOR, MT_NO_TENSOR, MT_NO_TENSOR,
                                       MT_NO_TENSOR, MT_NO_TENSOR, MT_NO_TENSOR, MT_NO_TENSOR,
                                       MT_NO_TENSOR, MT_NO_TENSOR, MT_NO_TENSOR, MT_NO_TENSOR,
                                       MT_NO_TENSOR, MT_NO_TENSOR, MT_NO_TENSOR, MT_NO_TENSOR,
                                       MT_NO_TENSOR, MT_NO_TENSOR};
        t->ln1 = add_tensor(m, 0, true, 1, SHAPE(H), LAYER_FMT, l, "input_layernorm.weight");
        t->wq = add_tensor(m, std, false, 2, SHAPE(Q, H), LAYER_FMT, l, "self_attn.q_proj.weight");
        t->wk = add_tensor(m, std, false, 2, SHAPE(KV, H), LAYER_FMT, l, "self_attn.k_proj.weight");
        t->wv = add_tensor(m, std, false, 2, SHAPE(KV, H), LAYER_FMT, l, "self_attn.v_proj.weight");
        t->wo = add_tensor(m, out_std, false, 2, SHAPE(H, Q), LAYER_FMT, l, "self_attn.o_proj.weight");
        split(m, t->wq, 0, MT_SPLIT_TP); /* column-parallel: heads */
        split(m, t->wk, 0, MT_SPLIT_TP); /* KV groups */
        split(m, t->wv, 0, MT_SPLIT_TP);
        split(m, t->wo, 1, MT_SPLIT_TP); /* row-parallel */
        if (m->qk_norm) {
            t->q_norm = add_tensor(m, 0, true, 1, SHAPE(D), LAYER_FMT, l, "self_attn.q_norm.weight");
            t->k_norm = add_tensor(m, 0, true, 1, SHAPE(D), LAYER_FMT, l, "self_attn.k_norm.weight");
        }
        t->ln2 = add_tensor(m, 0, true, 1, SHAPE(H), LAYER_FMT, l, "post_attention_layernorm.weight");
        if (m->moe_of_layer[l] >= 0) {
            const long long E = m->E, Fe = m->Fe, Fs = m->Fs;
            t->router = add_tensor(m, std, false, 2, SHAPE(E, H), LAYER_FMT, l, "mlp.gate.weight");
            t->exp_gate = add_tensor(m, std, false, 3, SHAPE(E, Fe, H), LAYER_FMT, l, "mlp.experts.gate_proj");
            t->exp_up = add_tensor(m, std, false, 3, SHAPE(E, Fe, H), LAYER_FMT, l, "mlp.experts.up_proj");
            t->exp_down = add_tensor(m, out_std, false, 3, SHAPE(E, H, Fe), LAYER_FMT, l,
                                     "mlp.experts.down_proj");
            split(m, t->exp_gate, 0, MT_SPLIT_EP);
            split(m, t->exp_gate, 1, MT_SPLIT_ETP);
            split(m, t->exp_up, 0, MT_SPLIT_EP);
            split(m, t->exp_up, 1, MT_SPLIT_ETP);
            split(m, t->exp_down, 0, MT_SPLIT_EP);
            split(m, t->exp_down, 2, MT_SPLIT_ETP);
            if (Fs > 0) {
                t->sh_gate = add_tensor(m, std, false, 2, SHAPE(Fs, H), LAYER_FMT, l,
                                        "mlp.shared_expert.gate_proj.weight");
                t->sh_up = add_tensor(m, std, false, 2, SHAPE(Fs, H), LAYER_FMT, l,
                                      "mlp.shared_expert.up_proj.weight");
                t->sh_down = add_tensor(m, out_std, false, 2, SHAPE(H, Fs), LAYER_FMT, l,
                                        "mlp.shared_expert.down_proj.weight");
                split(m, t->sh_gate, 0, MT_SPLIT_TP);
                split(m, t->sh_up, 0, MT_SPLIT_TP);
                split(m, t->sh_down, 1, MT_SPLIT_TP);
            }
        } else {
            const long long F = m->F;
            t->gate = add_tensor(m, std, false, 2, SHAPE(F, H), LAYER_FMT, l, "mlp.gate_proj.weight");
            t->up = add_tensor(m, std, false, 2, SHAPE(F, H), LAYER_FMT, l, "mlp.up_proj.weight");
            t->down = add_tensor(m, out_std, false, 2, SHAPE(H, F), LAYER_FMT, l, "mlp.down_proj.weight");
            split(m, t->gate, 0, MT_SPLIT_TP);
            split(m, t->up, 0, MT_SPLIT_TP);
            split(m, t->down, 1, MT_SPLIT_TP);
        }
    }
    m->final_norm = add_tensor(m, 0, true, 1, SHAPE(H), "model.norm.weight", -1, NULL);
    if (m->tied) {
        m->lm_head = m->embed;
    } else {
        m->lm_head = add_tensor(m, std, false, 2, SHAPE(m->V, H), "lm_head.weight", -1, NULL);
        split(m, m->lm_head, 0, MT_SPLIT_TP);
    }
    /* this rank's shards, contiguous in table order (its pipeline stage's tensors) */
    for (int i = 0; i < m->ntensors; i++) {
        struct mt_param_info *t = &m->tensors[i];
        bool whole_on_tp = true;
        for (int d = 0; d < t->ndim; d++) whole_on_tp = whole_on_tp && t->split[d] != MT_SPLIT_TP;
        t->tp_replicated = whole_on_tp && !t->expert;
        mt_param_shard(t, &m->sc, t->local_shape, t->start);
        t->numel = 1;
        for (int d = 0; d < t->ndim; d++) t->numel = sat_mul(t->numel, (size_t)t->local_shape[d]);
        if (!mt_model_tensor_on_stage(m, i, m->pp_rank, &t->pp_replica)) t->numel = 0;
        t->offset = m->nparams;
        m->nparams = sat_add(m->nparams, t->numel);
        m->nparams_global = sat_add(m->nparams_global, t->global_numel);
    }
}

/* ------------------------------------------------------------ memory layout */

/* Bump allocator over one allocation: a first pass with base NULL measures. */
struct arena {
    char *base;
    size_t off;
};

/* n elements of elem bytes, 64-byte aligned; the total saturates at SIZE_MAX. */
static void *take(struct arena *a, size_t n, size_t elem)
{
    size_t at = sat_mul(sat_add(a->off, 63) / 64, 64);
    a->off = sat_add(at, sat_mul(n, elem));
    return a->base ? a->base + at : NULL;
}

#define TAKE_F(a, n) ((float *)take((a), (size_t)(n), sizeof(float)))
#define TAKE_I(a, n) ((int32_t *)take((a), (size_t)(n), sizeof(int32_t)))
/* a stored activation: the model's activation dtype (m in scope) */
#define TAKE_A(a, n) take((a), (size_t)(n), mt_dtype_size(m->adt))

/* Token counts of a micro-batch of Bmax sequences: the whole (N), this rank's part (Nl),
 * and the tokens gathered over the ETP x EP group by the allgather dispatcher (G*Nl). */
static size_t tokens_all(const struct mt_model *m) { return (size_t)m->Bmax * m->T; }
/* The step's scalars (struct mt_step_acc) with n records. */
static size_t step_acc_bytes(const struct mt_model *m, int n)
{
    return sizeof(struct mt_step_acc) + sizeof(int64_t) * (size_t)m->nmoe * m->E +
           sizeof(struct mt_fwd_record) * (size_t)n;
}
/* The all-to-all's staging of its sort maps and offsets. */
static size_t a2a_stage_bytes(const struct mt_model *m)
{
    return sizeof(int32_t) * (2 * (size_t)m->x_rows_max + (size_t)m->E_l + 1);
}
/* The token staging of n records (inputs, targets, shard inputs of Bmax sequences each). */
static size_t token_staging_bytes(const struct mt_model *m, int n)
{
    return sizeof(int32_t) * 3 * (size_t)m->Bmax * m->T * (size_t)n;
}
static size_t tokens_local(const struct mt_model *m) { return tokens_all(m) / (size_t)m->sc.tp; }
static size_t tokens_gathered(const struct mt_model *m)
{
    return m->dispatch == MT_DISPATCH_ALLGATHER ? tokens_local(m) * (size_t)m->xg : 0;
}
static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }

/* The expert-side views of a layer's activations for Rx rows (layout_moe_acts' part
 * that depends on Rx): xs from xs_a (expert_fc1 offloading), gate and up from fc1
 * (moe_act offloading), the SwiGLU output from act (moe_act recompute), the rest from a. */
/* maps: where the all-to-all dispatcher's sort maps go (a rebuild for backward reuses
 * its forward's: the slot keeps them) */
static void layout_expert_views(const struct mt_model *m, struct arena *a, struct arena *xs_a,
                                struct arena *fc1, struct arena *act, struct arena *maps,
                                struct mt_expert_views *v, size_t Rx)
{
    *v = (struct mt_expert_views){0};
    if (m->dispatch != MT_DISPATCH_LOCAL) {
        v->xs = TAKE_A(xs_a, Rx * m->H);
        v->sort_map = TAKE_I(m->dispatch == MT_DISPATCH_ALLTOALL ? maps : a, Rx);
    }
    if (m->dispatch == MT_DISPATCH_ALLTOALL) v->unsort_map = TAKE_I(maps, Rx);
    if (m->dispatch == MT_DISPATCH_ALLGATHER) v->eys = take(a, Rx * m->H, mt_dtype_size(m->eys_dt));
    v->eg = TAKE_A(fc1, Rx * m->Fe_l);
    v->eu = TAKE_A(fc1, Rx * m->Fe_l);
    v->ea = TAKE_A(act, Rx * m->Fe_l);
}

static void get_views(const struct mt_layer_acts *x, struct mt_expert_views *v)
{
    *v = (struct mt_expert_views){x->xs, x->eg, x->eu, x->ea, x->eys, x->sort_map, x->unsort_map};
}

static void set_views(struct mt_layer_acts *x, const struct mt_expert_views *v)
{
    x->xs = v->xs;
    x->eg = v->eg;
    x->eu = v->eu;
    x->ea = v->ea;
    x->eys = v->eys;
    x->sort_map = v->sort_map;
    x->unsort_map = v->unsort_map;
}

/* The scratch of the expert side for Rx rows (layout_scratch's part that depends on
 * Rx; ff: the width the dense layers and shared expert need of d_f*). */
static size_t scratch_ff(const struct mt_model *m, size_t Rx)
{
    size_t ff = 0;
    if (m->nmoe < m->L) ff = tokens_all(m) * m->F_l;
    if (m->nmoe > 0) ff = max_z(max_z(ff, tokens_all(m) * m->Fs_l), Rx * m->Fe_l);
    return ff;
}

static void layout_expert_scratch(const struct mt_model *m, struct arena *a,
                                  struct mt_expert_scratch *s, size_t Rx)
{
    const size_t G = tokens_gathered(m), ff = scratch_ff(m, Rx);
    if (m->nmoe > 0 && m->dispatch != MT_DISPATCH_LOCAL) {
        s->d_x = TAKE_F(a, Rx * m->H);
        s->d_x2 = TAKE_F(a, Rx * m->H);
        s->stage = TAKE_F(a, max_z(Rx, G) * m->H);
        s->stage2 = TAKE_F(a, max_z(Rx, G) * m->H);
    }
    s->d_f1 = TAKE_F(a, ff);
    s->d_f2 = TAKE_F(a, ff);
    s->d_f3 = TAKE_F(a, ff);
}

static void swap_scratch(struct mt_model *m, struct mt_expert_scratch *s)
{
    struct mt_expert_scratch cur = {m->d_x, m->d_x2, m->stage, m->stage2, m->d_f1, m->d_f2,
                                    m->d_f3, m->h_sort, m->h_unsort};
    m->d_x = s->d_x;
    m->d_x2 = s->d_x2;
    m->stage = s->stage;
    m->stage2 = s->stage2;
    m->d_f1 = s->d_f1;
    m->d_f2 = s->d_f2;
    m->d_f3 = s->d_f3;
    m->h_sort = s->h_sort;
    m->h_unsort = s->h_unsort;
    *s = cur;
}

/* Where a layer's tensors go: what its forward keeps for backward into the slot's
 * arena (keep), what its backward rebuilds into the rank's recompute buffer (rc, whose
 * offset restarts with each recompute group: the groups share it; rc_max sizes it). */
struct act_arenas {
    struct arena keep, rc;
    size_t rc_max;
    /* FP8/FP4: the bytes of the copies saved for backward outside the recompute buffer,
     * and of the high-precision inputs they replace there (struct mt_model lp_copies) */
    size_t copies, replaced;
    /* activation offloading: a layer's offloaded tensors go to off, restarted for each
     * layer at the start of its half off_base[l % 2] (NULL: sizing); off_max the largest
     * layer's, chunk_off the chunk's sum */
    struct arena off;
    char *off_base[2];
    size_t off_max, chunk_off;
};

static struct arena *arena_for(struct act_arenas *A, unsigned drop, unsigned flags)
{
    return drop & (flags | MT_RC_LAYER) ? &A->rc : &A->keep;
}

/* Where an offloadable tensor goes: the layer's offload range, or the arena it had. */
static struct arena *arena_off(struct act_arenas *A, unsigned mods, unsigned flag, struct arena *a)
{
    return mods & flag ? &A->off : a;
}

/* FP8/FP4 (mt_lowp_saves, qx): where the high-precision input of a quantised linear
 * goes when backward reads the linear's saved copy instead and nothing else reads it:
 * the recompute buffer, written by forward and not kept (its bytes counted as replaced
 * where a would have kept them). Else a, where it was. */
static struct arena *unkept(struct act_arenas *A, bool qx, struct arena *a, size_t bytes)
{
    if (!qx || a == &A->rc) return a;
    A->replaced = sat_add(A->replaced, bytes);
    return &A->rc;
}

/* The copy of linear ql's (rows, cols) input saved for backward, in a (the arena of the
 * tensors whose forward writes it, so that a recompute that runs the linear again
 * rebuilds it); share: the linear whose copy of the same input it reads where copies
 * are shared, or -1. */
static void take_copy(struct mt_model *m, struct act_arenas *A, struct mt_layer_acts *x,
                      struct arena *a, int ql, int share, size_t rows, size_t cols)
{
    if (share >= 0 && mt_lowp_shares_copies(m)) {
        x->qx[ql] = x->qx[share];
        return;
    }
    const size_t bytes = mt_lowp_copy_bytes(m, (int64_t)rows, (int64_t)cols);
    if (a != &A->rc) A->copies = sat_add(A->copies, bytes);
    x->qx[ql] = take(a, bytes, 1);
}

static void layout_moe_acts(struct mt_model *m, struct act_arenas *A, unsigned drop,
                            unsigned off, bool qx, struct mt_layer_acts *x)
{
    const size_t Nl = tokens_local(m), R = (size_t)m->rows_max, Rx = (size_t)m->x_rows_max;
    const size_t G = tokens_gathered(m), k = (size_t)m->topk;
    struct arena *a = arena_for(A, drop, MT_RC_MOE);
    x->logits = TAKE_F(a, Nl * m->E);
    if (m->balance != MT_BALANCE_NONE && m->aux_coeff > 0.0f)
        x->aux_counts = TAKE_F(a, (size_t)(m->balance == MT_BALANCE_SEQ_AUX ? m->Bmax : 1) * m->E);
    if (m->z_coeff > 0.0f) x->z_lse = TAKE_F(a, Nl);
    x->topk_idx = TAKE_I(a, Nl * k);
    x->topk_prob = TAKE_F(a, Nl * k);
    x->plan.offsets = TAKE_I(a, (size_t)m->E + 1);
    x->plan.row_slot = TAKE_I(a, R);
    x->plan.slot_row = TAKE_I(a, Nl * k);
    x->plan.kept = (int64_t *)take(a, (size_t)m->E, sizeof(int64_t));
    struct arena *xs = arena_off(A, off, MT_OFF_EXPERT_FC1, a);
    if (m->dispatch != MT_DISPATCH_ALLGATHER) {
        x->xp = TAKE_A(m->dispatch == MT_DISPATCH_LOCAL ? xs : a, R * m->H); /* LOCAL: xs */
        x->ey = TAKE_A(a, R * m->H);
    }
    if (m->dispatch != MT_DISPATCH_LOCAL)
        x->x_offsets = TAKE_I(m->dispatch == MT_DISPATCH_ALLTOALL ? &A->keep : a, (size_t)m->E_l + 1);
    if (m->dispatch == MT_DISPATCH_ALLGATHER) {
        x->g_slot_row = TAKE_I(a, G * k);
        x->g_prob = TAKE_F(a, G * k);
    }
    struct mt_expert_views v;
    layout_expert_views(m, a, xs, arena_off(A, off, MT_OFF_MOE_ACT, a),
                        arena_for(A, drop, MT_RC_MOE | MT_RC_MOE_ACT), &A->keep, &v, Rx);
    set_views(x, &v);
    if (m->dispatch == MT_DISPATCH_LOCAL) {
        x->x_offsets = x->plan.offsets;
        x->xs = x->xp;
    }
    if (m->Fs > 0) {
        const size_t N = tokens_all(m);
        struct arena *s = arena_for(A, drop, MT_RC_MOE | MT_RC_SHARED);
        const size_t asz = mt_dtype_size(m->adt);
        x->sg = TAKE_A(s, N * m->Fs_l);
        x->su = TAKE_A(s, N * m->Fs_l);
        x->sa = TAKE_A(unkept(A, qx, s, N * m->Fs_l * asz), N * m->Fs_l);
        if (qx) {
            take_copy(m, A, x, s, MT_QL_SH_GATE, -1, N, m->H);
            take_copy(m, A, x, s, MT_QL_SH_UP, MT_QL_SH_GATE, N, m->H);
            /* shared_experts recompute runs gate, up and SwiGLU again, not down */
            take_copy(m, A, x, arena_for(A, drop, MT_RC_MOE), MT_QL_SH_DOWN, -1, N, m->Fs_l);
        }
    }
}

/* The recompute setting for the layers [l0, l1) of the current chunk: m->drop and,
 * under full recompute, m->rc_first. Full 'uniform': groups of num_layers layers from
 * the chunk's first; 'block': each of the chunk's first num_layers layers its own
 * group (Megatron's transformer block checkpointing, per model chunk). */
static void plan_recompute(struct mt_model *m)
{
    const struct mt_config_recompute *r = &m->cfg.recompute;
    const bool full = strcmp(r->granularity, "full") == 0;
    const bool selective = strcmp(r->granularity, "selective") == 0;
    unsigned sel = 0;
    for (int i = 0; selective && i < r->modules_len; i++) {
        const char *mod = r->modules[i];
        sel |= strcmp(mod, "core_attn") == 0        ? MT_RC_CORE_ATTN
               : strcmp(mod, "layernorm") == 0      ? MT_RC_LN1 | MT_RC_LN2
               : strcmp(mod, "mlp") == 0            ? MT_RC_MLP
               : strcmp(mod, "moe_act") == 0        ? MT_RC_MOE_ACT
               : strcmp(mod, "shared_experts") == 0 ? MT_RC_SHARED
               : strcmp(mod, "moe") == 0            ? MT_RC_MOE
                                                    : 0;
    }
    for (int l = m->l0; l < m->l1; l++) {
        const int i = l - m->l0, n = r->num_layers;
        m->rc_first[l] = -1;
        if (full && strcmp(r->method, "uniform") == 0) m->rc_first[l] = m->l0 + i / n * n;
        if (full && strcmp(r->method, "block") == 0 && i < n) m->rc_first[l] = l;
        const bool moe = m->moe_of_layer[l] >= 0;
        unsigned d = sel & (moe ? ~MT_RC_MLP : ~(MT_RC_MOE | MT_RC_MOE_ACT | MT_RC_SHARED));
        if (moe && m->Fs == 0) d &= ~MT_RC_SHARED;
        m->drop[l] = m->rc_first[l] >= 0 ? MT_RC_LAYER : d;
    }
}

/* Offloaded bytes in whole 64-byte lines (a layer's range, each half of the buffer). */
static size_t offload_half(size_t bytes) { return sat_mul(sat_add(bytes, 63) / 64, 64); }

/* The MT_OFF_* tensors of layer l (activation offloading): those of the modules
 * asked for that the layer saves (what recompute rebuilds is not saved). */
static unsigned plan_offload(const struct mt_model *m, int l)
{
    const unsigned drop = m->drop[l];
    unsigned mods = mt_offload_modules(&m->cfg);
    if (drop == MT_RC_LAYER) return 0;
    if (l == m->l0) mods &= ~MT_OFF_ATTN_NORM; /* the chunk's input stays */
    if (drop & MT_RC_LN1) mods &= ~MT_OFF_QKV;
    if (drop & MT_RC_CORE_ATTN) mods &= ~MT_OFF_ATTN_PROJ;
    /* the routed experts' tensors: MoE layers that keep them (not rebuilt by moe) */
    if (m->moe_of_layer[l] < 0 || (drop & MT_RC_MOE)) mods &= ~(MT_OFF_EXPERT_FC1 | MT_OFF_MOE_ACT);
    return mods;
}

static void layout_acts(struct mt_model *m, struct act_arenas *A)
{
    const size_t N = tokens_all(m), Nl = tokens_local(m);
    const bool tp = m->sc.tp > 1;
    plan_recompute(m);
    A->chunk_off = 0;
    for (int l = m->l0; l < m->l1; l++) {
        struct mt_layer_acts *x = &m->la[l];
        const unsigned drop = m->drop[l];
        /* FP8/FP4: the quantised linears' inputs saved as copies for backward */
        const bool qx = mt_lowp_saves(m, l);
        const size_t asz = mt_dtype_size(m->adt);
        /* a recompute group starts again at the top of the shared buffer, and so do a
         * layer's tensors not kept for its saved copies */
        if (drop == MT_RC_LAYER ? m->rc_first[l] == l : drop != 0 || qx) A->rc.off = 0;
        const unsigned off = m->off.mods[l] = plan_offload(m, l);
        A->off = (struct arena){A->off_base[l % 2], 0};
        /* the residual stream: a full-recompute group keeps only its first input */
        const bool inner = drop == MT_RC_LAYER && m->rc_first[l] != l;
        m->res[l] = TAKE_A(arena_off(A, off, MT_OFF_ATTN_NORM, inner ? &A->rc : &A->keep), Nl * m->H);
        struct arena *a = arena_for(A, drop, 0);
        long long *h_offsets = x->h_offsets, *recv_counts = x->recv_counts; /* host, kept */
        int32_t *hx_offsets = x->hx_offsets;
        memset(x, 0, sizeof *x);
        x->h_offsets = h_offsets;
        x->hx_offsets = hx_offsets;
        x->recv_counts = recv_counts;
        struct arena *ln1 = arena_for(A, drop, MT_RC_LN1);
        /* qkv_linear offloads the projections' input: ln1 gathered (ln1 itself with
         * tp = 1; with TP the local ln1 is not read again after its gather) */
        x->ln1 = TAKE_A(tp ? ln1 : unkept(A, qx, arena_off(A, off, MT_OFF_QKV, ln1), Nl * m->H * asz),
                        Nl * m->H);
        x->ln1_rstd = TAKE_F(a, Nl);
        x->ln1_full = tp ? TAKE_A(unkept(A, qx, arena_off(A, off, MT_OFF_QKV, ln1), N * m->H * asz),
                                  N * m->H)
                         : x->ln1;
        if (qx) { /* offloaded in ln1_full's place by qkv_linear */
            struct arena *c = arena_off(A, off, MT_OFF_QKV, a);
            take_copy(m, A, x, c, MT_QL_Q, -1, N, m->H);
            take_copy(m, A, x, c, MT_QL_K, MT_QL_Q, N, m->H);
            take_copy(m, A, x, c, MT_QL_V, MT_QL_Q, N, m->H);
        }
        struct arena *qkv = arena_off(A, off, MT_OFF_CORE_ATTN, a);
        x->q = TAKE_A(a, N * m->Q_l);
        x->k = TAKE_A(a, N * m->KV_l);
        x->v = TAKE_A(qkv, N * m->KV_l);
        if (m->qk_norm) {
            x->q_rstd = TAKE_F(a, N * m->nh_l);
            x->k_rstd = TAKE_F(a, N * m->ng_l);
        }
        x->qr = TAKE_A(qkv, N * m->Q_l);
        x->kr = TAKE_A(qkv, N * m->KV_l);
        struct arena *core = arena_for(A, drop, MT_RC_CORE_ATTN);
        x->att_lse = TAKE_F(core, N * m->nh_l);
        /* attn_proj offloads o_proj's input: y, which is att_out in fp32 training */
        x->att_out = TAKE_F(m->bf16 ? core : arena_off(A, off, MT_OFF_ATTN_PROJ, core), N * m->Q_l);
        /* (bf16: y is o_proj's input only; fp32: att_out, which attention's backward reads) */
        x->y = m->bf16 ? TAKE_A(unkept(A, qx, arena_off(A, off, MT_OFF_ATTN_PROJ, core), N * m->Q_l * asz),
                                N * m->Q_l)
                       : x->att_out;
        if (qx) take_copy(m, A, x, arena_off(A, off, MT_OFF_ATTN_PROJ, a), MT_QL_O, -1, N, m->Q_l);
        x->res_mid = TAKE_A(arena_off(A, off, MT_OFF_MLP_NORM, a), Nl * m->H);
        bool moe = m->moe_of_layer[l] >= 0;
        /* a dense layer's ln2 is its MLP's input only; a MoE layer's routes tokens */
        const bool qx2 = qx && !moe;
        x->ln2 = TAKE_A(tp ? arena_for(A, drop, MT_RC_LN2)
                           : unkept(A, qx2, arena_for(A, drop, MT_RC_LN2), Nl * m->H * asz),
                        Nl * m->H);
        x->ln2_rstd = TAKE_F(a, Nl);
        if (tp && (!moe || m->Fs > 0))
            x->ln2_full = TAKE_A(unkept(A, qx2, arena_for(A, drop, MT_RC_LN2 | MT_RC_MLP | MT_RC_SHARED |
                                                                     MT_RC_MOE),
                                        N * m->H * asz),
                                 N * m->H);
        else
            x->ln2_full = x->ln2;
        if (!moe) {
            struct arena *f = arena_for(A, drop, MT_RC_MLP);
            x->gate = TAKE_A(f, N * m->F_l);
            x->up = TAKE_A(f, N * m->F_l);
            x->act = TAKE_A(unkept(A, qx, f, N * m->F_l * asz), N * m->F_l);
            if (qx) {
                take_copy(m, A, x, f, MT_QL_GATE, -1, N, m->H);
                take_copy(m, A, x, f, MT_QL_UP, MT_QL_GATE, N, m->H);
                /* mlp recompute runs gate, up and SwiGLU again, not down */
                take_copy(m, A, x, a, MT_QL_DOWN, -1, N, m->F_l);
            }
        } else {
            layout_moe_acts(m, A, drop, off, qx, x);
        }
        if (A->rc.off > A->rc_max) A->rc_max = A->rc.off;
        /* whole 64-byte lines, as the tensors took in the slot's arena */
        m->off.bytes[l] = offload_half(A->off.off);
        m->off.host_at[l] = A->chunk_off;
        A->chunk_off += m->off.bytes[l];
        if (m->off.bytes[l] > A->off_max) A->off_max = m->off.bytes[l];
    }
    m->res[m->l1] = TAKE_A(&A->keep, Nl * m->H);
    struct arena *a = &A->keep;
    if (m->last) {
        m->lnf = TAKE_A(a, Nl * m->H);
        m->lnf_rstd = TAKE_F(a, Nl);
        m->lnf_full = tp ? TAKE_A(a, N * m->H) : m->lnf;
        m->lm_logits = TAKE_F(a, N * m->V_l);
        m->ce_lse = TAKE_F(a, N);
        m->ce_tl = TAKE_F(a, N);
    } else {
        m->lnf = m->lnf_full = NULL;
        m->lnf_rstd = m->lm_logits = m->ce_lse = m->ce_tl = NULL;
    }
    m->inputs = TAKE_I(a, N);
    m->targets = TAKE_I(a, N);
    m->inputs_v = tp ? TAKE_I(a, N) : m->inputs;
}

static void layout_scratch(struct mt_model *m, struct arena *a)
{
    const size_t N = tokens_all(m), Nl = tokens_local(m), G = tokens_gathered(m);
    const size_t R = (size_t)m->rows_max, Rx = (size_t)m->x_rows_max, k = (size_t)m->topk;
    const bool tp = m->sc.tp > 1;
    const bool drop_over_tp = tp && m->nmoe > 0 && m->capacity_factor > 0.0;
    m->tmp = TAKE_F(a, Nl * m->H);
    m->tmp2 = TAKE_F(a, Nl * m->H);
    m->tmpb = m->adt != MT_F32 ? TAKE_A(a, Nl * m->H) : m->tmp;
    m->tmp2b = m->adt != MT_F32 ? TAKE_A(a, Nl * m->H) : m->tmp2;
    m->full = tp ? TAKE_F(a, N * m->H) : m->tmp;
    m->full2 = tp ? TAKE_F(a, N * m->H) : m->tmp2;
    m->d_res = TAKE_F(a, Nl * m->H);
    m->d_ln = TAKE_F(a, Nl * m->H);
    m->dq = TAKE_F(a, N * m->Q_l);
    m->dk = TAKE_F(a, N * m->KV_l);
    m->dv = TAKE_F(a, N * m->KV_l);
    m->dy = TAKE_F(a, N * m->Q_l);
    if (m->qk_norm) {
        m->dq2 = TAKE_F(a, N * m->Q_l);
        m->dk2 = TAKE_F(a, N * m->KV_l);
    }
    if (m->nmoe > 0) {
        m->d_logits = TAKE_F(a, Nl * m->E);
        m->d_prob = TAKE_F(a, Nl * k);
        m->d_rows = TAKE_F(a, R * m->H);
        m->d_rows2 = TAKE_F(a, R * m->H);
        if (m->dispatch == MT_DISPATCH_ALLGATHER) {
            m->g_dprob = TAKE_F(a, G * k);
            m->x_kept = (int64_t *)take(a, 2 * (size_t)m->E_l, sizeof(int64_t));
            m->ag_counts = m->x_kept + m->E_l;
        }
        if (drop_over_tp || m->dispatch == MT_DISPATCH_ALLGATHER) {
            m->idx_full = TAKE_I(a, max_z(N, G) * k);
            m->prob_full = TAKE_F(a, max_z(N, G) * k);
        }
        if (drop_over_tp) {
            m->full_plan.offsets = TAKE_I(a, (size_t)m->E + 1);
            m->full_plan.row_slot = TAKE_I(a, N * k);
            m->full_plan.slot_row = TAKE_I(a, N * k);
            m->full_plan.kept = (int64_t *)take(a, (size_t)m->E, sizeof(int64_t));
        }
        if (drop_over_tp || m->dispatch == MT_DISPATCH_ALLGATHER) m->route_idx = TAKE_I(a, Nl * k);
    }
    struct mt_expert_scratch x = {.h_sort = m->h_sort, .h_unsort = m->h_unsort};
    layout_expert_scratch(m, a, &x, Rx);
    swap_scratch(m, &x);
    if (tp) m->lse_all = TAKE_F(a, (size_t)m->sc.tp * N);
    if (m->shared_overlap) m->sh_dup = TAKE_F(a, N * m->Fs_l);
}

/* Megatron's get_capacity(num_tokens * topk, E, factor) for N tokens. */
static int capacity_for(const struct mt_model *m, long long N)
{
    return (int)ceil((double)(N * m->topk) / m->E * m->capacity_factor);
}

/* Plan rows (R) and expert-side rows (Rx) for Bmax sequences: R is what one rank's
 * tokens fill (N*k, or E*capacity rows when padded); Rx what its experts receive from
 * the G = ETP x EP sources, each sending at most min(k, E_l) rows per token and, with a
 * capacity, at most capacity rows per expert (exactly that many when padded). Dropless,
 * that worst case (every source sending every token here) is G/E_l times what a balanced
 * routing brings (G*Nl*k*E_l/E rows): the buffers hold moe%expert_buffer_factor times
 * the balanced load instead, and a step that brings more borrows the rest
 * (mt_model_expert_rows). Padding for FP8 adds up to pad_align - 1 rows per local expert. */
static int size_rows(struct mt_model *m, struct mt_err *err)
{
    const long long N = (long long)tokens_all(m), Nl = (long long)tokens_local(m);
    const double capd = m->capacity_factor > 0.0
                            ? ceil((double)(N * m->topk) / m->E * m->capacity_factor) : 0;
    if (capd * m->E > MT_SIZE_MAX)
        return mt_err_set(err, MT_EINVAL,
                          "model: moe%%expert_capacity_factor = %g gives %d experts %.0f rows "
                          "each for a micro-batch of %lld tokens, more than %d in all; lower it",
                          m->capacity_factor, m->E, capd, N, MT_SIZE_MAX);
    const long long cap = (long long)capd;
    const long long R = Nl * m->topk, padded = (long long)m->E * cap;
    const long long rows = R > padded ? R : padded;
    long long x_rows = rows, worst = rows;
    m->expected_x_rows = (double)rows;
    if (m->dispatch != MT_DISPATCH_LOCAL) {
        const long long kmin = m->topk < m->E_l ? m->topk : m->E_l;
        long long per_source = Nl * kmin;
        if (cap > 0) {
            long long capped = (long long)m->E_l * cap;
            per_source = m->pad_to_capacity || capped < per_source ? capped : per_source;
        }
        worst = x_rows = per_source * m->xg;
        m->expected_x_rows = (double)m->xg * (double)Nl * m->topk * m->E_l / m->E;
        const double f = m->cfg.moe.expert_buffer_factor;
        if (cap == 0 && f > 0.0) {
            const double want = ceil(f * m->expected_x_rows);
            if (want < (double)x_rows) x_rows = want < 1.0 ? 1 : (long long)want;
        }
        /* moe_router_padding_for_fp8: at most pad_align - 1 zero rows per local expert */
        if (m->pad_align) {
            x_rows += (long long)m->E_l * (m->pad_align - 1);
            worst += (long long)m->E_l * (m->pad_align - 1);
        }
    }
    if (rows > MT_SIZE_MAX || worst > MT_SIZE_MAX)
        return mt_err_set(err, MT_EINVAL,
                          "model: a micro-batch of %lld tokens routes %lld rows to this rank's "
                          "experts (router_topk %d, %d expert-parallel sources), more than %d; "
                          "lower training%%micro_batch_size or seq_length",
                          N, rows > worst ? rows : worst, m->topk, m->xg, MT_SIZE_MAX);
    m->rows_max = (int)rows;
    m->x_rows_max = (int)x_rows;
    m->x_rows_worst = worst;
    return MT_OK;
}

/* ------------------------------------------------------------ expert overflow */

/* An overflow block of bytes: with manual GC the smallest deferred one that holds them,
 * else from the allocator. */
static void *over_alloc(struct mt_model *m, size_t bytes)
{
    int best = -1;
    for (int i = 0; m->cfg.host.manual_gc && i < m->ndeferred; i++)
        if (m->deferred[i].bytes >= bytes &&
            (best < 0 || m->deferred[i].bytes < m->deferred[best].bytes))
            best = i;
    if (best < 0) return m->k->op.alloc(m->k->ctx, bytes);
    void *p = m->deferred[best].p;
    m->deferred[best] = m->deferred[--m->ndeferred];
    return p;
}

/* Gives an overflow block back: with manual GC kept for reuse until a collection
 * (when the list is full, the smallest kept block makes room), else freed. */
static void over_free(struct mt_model *m, void *p, size_t bytes)
{
    const struct mt_kernel_ops *o = &m->k->op;
    if (!m->cfg.host.manual_gc) {
        o->free(m->k->ctx, p);
        return;
    }
    if (m->ndeferred == MT_MODEL_DEFERRED) {
        int small = 0;
        for (int i = 1; i < m->ndeferred; i++)
            if (m->deferred[i].bytes < m->deferred[small].bytes) small = i;
        if (m->deferred[small].bytes >= bytes) {
            o->free(m->k->ctx, p);
            return;
        }
        o->free(m->k->ctx, m->deferred[small].p);
        m->deferred[small] = m->deferred[--m->ndeferred];
    }
    m->deferred[m->ndeferred++] = (struct mt_deferred_block){p, bytes};
}

size_t mt_model_release_deferred(struct mt_model *m)
{
    size_t bytes = 0;
    for (int i = 0; i < m->ndeferred; i++) {
        m->k->op.free(m->k->ctx, m->deferred[i].p);
        bytes += m->deferred[i].bytes;
    }
    m->ndeferred = 0;
    return bytes;
}

void mt_model_expert_release(struct mt_model *m, struct mt_layer_acts *a, bool keep_acts)
{
    if (m->scratch_over) {
        swap_scratch(m, &m->scratch_home);
        over_free(m, m->scratch_over, m->scratch_over_bytes);
        m->scratch_over = NULL;
    }
    if (a && a->over && !keep_acts) {
        set_views(a, &a->home);
        over_free(m, a->over, a->over_bytes);
        a->over = NULL;
    }
}

int mt_model_expert_rows(const struct mt_pass *p, int l, struct mt_layer_acts *a,
                         long long rows, bool fwd)
{
    struct mt_model *m = p->m;
    const struct mt_kernel_ops *o = p->o;
    if (fwd) mt_model_expert_release(m, a, false); /* a slot's previous micro-batch */
    if (rows <= m->x_rows_max) return MT_OK;
    if (rows > m->x_rows_worst || rows > MT_SIZE_MAX)
        return mt_err_set(p->err, MT_ERUNTIME,
                          "model: layer %d: %lld expert rows received, more than routing can "
                          "bring (%lld); a dispatcher bug", l, rows, m->x_rows_worst);
    const size_t R = (size_t)rows;
    size_t acts = 0, scr = 0;
    if (fwd) {
        struct arena v = {NULL, 0};
        struct mt_expert_views views;
        layout_expert_views(m, &v, &v, &v, &v, &v, &views, R);
        acts = v.off;
    }
    struct arena s = {NULL, 0};
    struct mt_expert_scratch sv;
    layout_expert_scratch(m, &s, &sv, R);
    scr = s.off;
    if (fwd) {
        a->over = over_alloc(m, acts);
        a->over_bytes = acts;
    }
    m->scratch_over = !fwd || a->over ? over_alloc(m, scr) : NULL;
    m->scratch_over_bytes = scr;
    if (rows > m->h_over_rows && m->scratch_over) {
        int32_t *h = realloc(m->h_over, sizeof(int32_t) * 2 * R);
        if (h) {
            m->h_over = h;
            m->h_over_rows = rows;
        }
    }
    if ((fwd && !a->over) || !m->scratch_over || m->h_over_rows < rows) {
        if (fwd && a->over) o->free(p->ctx, a->over); /* backward keeps forward's */
        if (fwd) a->over = NULL;
        if (m->scratch_over) o->free(p->ctx, m->scratch_over);
        m->scratch_over = NULL;
        return mt_err_set(p->err, MT_ENOMEM,
                          "model: layer %d: the experts of rank (EP %d, ETP %d, TP %d) received "
                          "%lld rows, more than the %d the buffers hold (moe%%expert_buffer_factor "
                          "= %g x %.0f balanced rows), and the %zu bytes for the rest are not "
                          "available\nhint: raise moe%%expert_buffer_factor to size the buffers "
                          "for this load up front (moetrain --check shows the memory), set "
                          "moe%%expert_capacity_factor to bound the rows (tokens over capacity "
                          "are dropped), or lower training%%micro_batch_size",
                          l, m->sc.ep_rank, m->sc.etp_rank, m->sc.tp_rank, rows, m->x_rows_max,
                          m->cfg.moe.expert_buffer_factor, m->expected_x_rows, acts + scr);
    }
    if (fwd) {
        get_views(a, &a->home);
        struct arena v = {a->over, 0};
        struct mt_expert_views views;
        layout_expert_views(m, &v, &v, &v, &v, &v, &views, R);
        set_views(a, &views);
        if (p->st && !p->recompute) {
            p->st->expert_overflows++;
            if (rows > p->st->expert_rows_max) p->st->expert_rows_max = rows;
        }
    }
    s = (struct arena){m->scratch_over, 0};
    layout_expert_scratch(m, &s, &sv, R);
    sv.h_sort = m->h_over;
    sv.h_unsort = m->h_over + R;
    m->scratch_home = sv;
    swap_scratch(m, &m->scratch_home);
    return MT_OK;
}

/* ------------------------------------------------------------ lifecycle */

/* This rank's coordinates and communicators from par (NULL: one process). */
static int take_layout(struct mt_model *m, const struct mt_parallel *par, struct mt_err *err)
{
    m->sc = (struct mt_shard_coords){1, 0, 1, 0, 1, 0};
    m->xg = 1;
    m->pp = m->vpp = 1;
    m->pp_rank = 0;
    if (!par) return MT_OK;
    if (par->cp > 1)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "model: context_parallel_size = %d is not implemented (use 1)", par->cp);
    m->sc = (struct mt_shard_coords){par->tp, par->tp_rank, par->ep, par->ep_rank, par->etp,
                                     par->etp_rank};
    m->pp = par->pp;
    m->pp_rank = par->pp_rank;
    m->world = par->world_comm;
    m->tp_comm = par->comm[MT_GROUP_TP];
    m->ep_comm = par->comm[MT_GROUP_EP];
    m->etp_comm = par->comm[MT_GROUP_ETP];
    m->xg_comm = par->comm[MT_GROUP_ETP_EP];
    m->xg = par->ep * par->etp;
    return MT_OK;
}

/* Host memory that lives as long as the model: per MoE layer the plan offsets and the
 * rows received from each source, and the routing bookkeeping. */
static int alloc_host(struct mt_model *m, size_t *bytes)
{
    const size_t N = tokens_all(m), G = tokens_gathered(m), k = (size_t)m->topk;
    const size_t E = (size_t)m->E, S = (size_t)m->sc.ep * (size_t)m->E_l;
    const size_t Rx = (size_t)m->x_rows_max, P = (size_t)(m->sc.ep > m->sc.etp ? m->sc.ep : m->sc.etp);
    const size_t nk = max_z(N, G) * k;
    for (int l = 0; l < m->L; l++) {
        if (m->moe_of_layer[l] < 0) continue;
        m->la[l].h_offsets = calloc(E + 1, sizeof(long long));
        m->la[l].hx_offsets = calloc((size_t)m->E_l + 1, sizeof(int32_t));
        m->la[l].recv_counts = calloc((size_t)m->sc.etp * S, sizeof(long long));
        /* what failed, for the message: this layer's three arrays */
        *bytes = sizeof(long long) * (E + 1 + (size_t)m->sc.etp * S) + sizeof(int32_t) * ((size_t)m->E_l + 1);
        if (!m->la[l].h_offsets || !m->la[l].hx_offsets || !m->la[l].recv_counts) return MT_ENOMEM;
    }
    struct arena a = {NULL, 0};
    for (int pass = 0; pass < 2; pass++) {
        m->h_idx = TAKE_I(&a, nk);
        m->h_idx2 = TAKE_I(&a, nk);
        m->h_sort = TAKE_I(&a, Rx);
        m->h_unsort = TAKE_I(&a, Rx);
        m->h_offs = TAKE_I(&a, E + 1);
        m->h_send = (long long *)take(&a, E, sizeof(long long));
        m->h_recv = (long long *)take(&a, S, sizeof(long long));
        m->h_start = (long long *)take(&a, (size_t)m->sc.etp * S, sizeof(long long));
        m->h_cnt = (size_t *)take(&a, 8 * P, sizeof(size_t));
        m->h_force = m->force_balance ? TAKE_F(&a, N * E) : NULL;
        if (pass == 0) {
            *bytes = a.off;
            m->host_scratch = a.off < SIZE_MAX ? malloc(a.off) : NULL;
            if (!m->host_scratch) return MT_ENOMEM;
            mt_hostmem_prefault(m->host_scratch, a.off); /* no page faults in the steps */
            a = (struct arena){m->host_scratch, 0};
        }
    }
    return MT_OK;
}

/* The FP8/FP4 recipes' buffers and state; with them, mt_model_buffers holds the expert
 * biases followed by the recipes' state in one host array. */
static int lowp_setup(struct mt_model *m, const struct mt_parallel *par, struct mt_err *err)
{
    MT_CHECK(mt_lowp_create(m, par, &m->lp_scratch, err));
    const size_t nlp = mt_lowp_nbuffers(m), nb = m->expert_bias_on ? (size_t)m->nmoe * m->E : 0;
    if (!nlp) return MT_OK;
    m->buffers = calloc(nb + nlp, sizeof(float));
    if (!m->buffers) return mt_err_set(err, MT_ENOMEM, "model: out of memory for the FP8/FP4 state");
    if (nb) {
        memcpy(m->buffers, m->expert_bias, sizeof(float) * nb);
        free(m->expert_bias);
        m->expert_bias = m->buffers;
    }
    mt_lowp_save(m, m->buffers + nb); /* what mt_model_buffers_updated loads until written */
    return MT_OK;
}

/* The step's scalars and the token staging (struct mt_model: acc, host_tokens_all). */
static void free_stats(struct mt_model *m)
{
    const struct mt_kernels *k = m->k;
    if (m->acc) k->op.free(k->ctx, m->acc);
    if (m->host_tokens_all) k->op.free_host(k->ctx, m->host_tokens_all);
    free(m->acc_host);
    free(m->rec_valid);
    m->acc = m->acc_host = NULL;
    m->host_tokens_all = m->host_tokens = NULL;
    m->rec_valid = NULL;
    m->rec_B = NULL;
    m->nrec_max = m->nrec = m->nahead = 0;
}

/* (Re)allocates them for n records, cleared. MT_ENOMEM when one cannot be had. */
static int alloc_stats(struct mt_model *m, int n)
{
    const struct mt_kernels *k = m->k;
    free_stats(m);
    m->acc = dev_alloc(k, step_acc_bytes(m, n));
    m->host_tokens_all = k->op.alloc_host(k->ctx, token_staging_bytes(m, n));
    m->acc_host = calloc(1, step_acc_bytes(m, n));
    /* each record's valid targets, then its micro-batch size */
    m->rec_valid = calloc((size_t)n, sizeof(long long) + sizeof(int));
    m->rec_B = m->rec_valid ? (int *)(m->rec_valid + n) : NULL;
    if (!m->acc || !m->host_tokens_all || !m->acc_host || !m->rec_valid) {
        free_stats(m);
        return MT_ENOMEM;
    }
    k->op.memset(k->ctx, m->acc, 0, step_acc_bytes(m, n));
    m->nrec_max = n;
    m->host_tokens = m->host_tokens_all;
    return MT_OK;
}

int mt_model_create(const struct mt_config *cfg, const struct mt_kernels *k, int max_micro_batch,
                    const struct mt_parallel *par, struct mt_model **out, struct mt_err *err)
{
    *out = NULL;
    if (max_micro_batch < 1)
        return mt_err_set(err, MT_EINVAL, "model: max_micro_batch = %d must be >= 1", max_micro_batch);
    MT_CHECK(mt_model_check_config(cfg, err));
    enum mt_op missing;
    if (mt_kernels_count_ops(k, &missing) != MT_OP_COUNT)
        return mt_err_set(err, MT_EUNSUPPORTED, "kernel backend '%s' lacks op '%s'", k->name,
                          mt_op_names[missing]);
    struct mt_model *m = calloc(1, sizeof *m);
    if (!m) return mt_err_set(err, MT_ENOMEM, "model: out of memory");
    int rc = mt_config_check_backend(cfg, k->name, err);
    if (rc == MT_OK) rc = take_layout(m, par, err);
    if (rc) {
        free(m);
        return rc;
    }
    m->cfg = *cfg;
    m->k = k;
    if ((rc = mt_graph_setup(m, err))) {
        free(m);
        return rc;
    }
    m->Bmax = max_micro_batch;
    m->T = cfg->training.seq_length;
    m->L = cfg->model.num_layers;
    m->l0 = 0;
    m->l1 = m->L;
    m->first = m->last = true;
    if (m->pp > 1) {
        if (cfg->parallel.pipeline_model_parallel_size != m->pp) {
            mt_model_destroy(m);
            return mt_err_set(err, MT_EINVAL,
                              "model: pipeline_model_parallel_size = %d but the layout has %d "
                              "stages",
                              cfg->parallel.pipeline_model_parallel_size, m->pp);
        }
        m->vpp = cfg->parallel.virtual_pipeline_model_parallel_size;
    }
    m->H = cfg->model.hidden_size;
    m->nh = cfg->model.num_attention_heads;
    m->ng = cfg->model.num_query_groups;
    m->hd = cfg->model.kv_channels;
    m->Q = m->nh * m->hd;
    m->KV = m->ng * m->hd;
    m->F = cfg->model.ffn_hidden_size;
    m->V = cfg->model.vocab_size;
    m->bf16 = streq(cfg->precision.params_dtype, "bf16");
    /* MT_DEBUG_FP32_ACTIVATIONS=1: bf16 training on fp32-stored activations rounded in
     * place, the reference tests/model/bf16_storage.sh compares bf16 storage with */
    const char *fp32_acts = getenv("MT_DEBUG_FP32_ACTIVATIONS");
    m->round_in_place = m->bf16 && fp32_acts && strcmp(fp32_acts, "1") == 0;
    m->adt = m->bf16 && !m->round_in_place ? MT_BF16 : MT_F32;
    m->wdt = m->bf16 ? MT_BF16 : MT_F32;
    /* the allgather dispatcher keeps the experts' output rows for backward: partial sums
     * over ETP (fp32) with ETP > 1, else stored activations */
    m->eys_dt = m->sc.etp == 1 ? m->adt : MT_F32;
    m->tied = !cfg->model.untie_embeddings_and_output_weights;
    m->qk_norm = cfg->model.qk_layernorm;
    m->eps = (float)cfg->model.norm_epsilon;
    m->theta = (float)cfg->model.rotary_base;
    const int tp = m->sc.tp;
    const long long tokens = (long long)m->T * max_micro_batch;
    if (tokens > MT_SIZE_MAX) {
        mt_model_destroy(m);
        return mt_err_set(err, MT_EINVAL,
                          "model: a micro-batch of %d x training%%seq_length %d = %lld tokens is "
                          "more than %d, the most moetrain computes with; lower "
                          "training%%micro_batch_size or seq_length",
                          max_micro_batch, m->T, tokens, MT_SIZE_MAX);
    }
    if (m->nh % tp || m->ng % tp || m->F % tp || tokens % tp) {
        mt_model_destroy(m);
        return mt_err_set(err, MT_EINVAL,
                          "model: heads %d, KV groups %d, ffn_hidden_size %d and the %lld tokens "
                          "of a micro-batch must divide by tensor_model_parallel_size = %d",
                          cfg->model.num_attention_heads, cfg->model.num_query_groups,
                          cfg->model.ffn_hidden_size, tokens, tp);
    }
    m->nh_l = m->nh / tp;
    m->ng_l = m->ng / tp;
    m->Q_l = m->nh_l * m->hd;
    m->KV_l = m->ng_l * m->hd;
    m->F_l = m->F / tp;
    long long vlen, v0;
    part_of(m->V, tp, m->sc.tp_rank, &v0, &vlen);
    m->v0 = (int)v0;
    m->V_l = (int)vlen;

    /* What an allocation that fails was for and its size, for the message: most come
     * before the parameter table exists. */
    const char *what = NULL;
    size_t bytes = 0;
#define NEED(ok, w, b)                                                                  \
    do {                                                                                \
        if (!(ok)) {                                                                    \
            what = (w);                                                                 \
            bytes = (b);                                                                \
            goto fail;                                                                  \
        }                                                                               \
    } while (0)
    rc = MT_ENOMEM;
    m->moe_of_layer = calloc((size_t)m->L, sizeof(int));
    m->stage_of_layer = calloc((size_t)m->L, sizeof(int));
    m->lt = calloc((size_t)m->L, sizeof *m->lt);
    m->la = calloc((size_t)m->L, sizeof *m->la);
    m->res = calloc((size_t)m->L + 1, sizeof(void *));
    m->drop = calloc((size_t)m->L, sizeof(unsigned));
    m->rc_first = calloc((size_t)m->L, sizeof(int));
    m->off.mods = calloc((size_t)m->L, sizeof(unsigned));
    m->off.bytes = calloc((size_t)m->L * 2, sizeof(size_t));
    if (m->off.bytes) m->off.host_at = m->off.bytes + m->L;
    NEED(m->moe_of_layer && m->stage_of_layer && m->lt && m->la && m->res && m->drop &&
             m->rc_first && m->off.mods && m->off.bytes,
         "per-layer tables",
         (size_t)m->L * (3 * sizeof(int) + sizeof(unsigned) + sizeof *m->lt + sizeof *m->la +
                         sizeof(void *)));
    for (int l = 0; l < m->L; l++) m->moe_of_layer[l] = layer_is_moe(cfg, l) ? m->nmoe++ : -1;
    for (int s = 0; s < m->pp; s++)
        for (int c = 0; c < m->vpp; c++) {
            int first = 0, n = 0;
            mt_config_pp_layers(cfg, s, c, &first, &n);
            for (int l = first; l < first + n && l < m->L; l++) m->stage_of_layer[l] = s;
        }
    m->dispatch = MT_DISPATCH_LOCAL;
    if (m->nmoe > 0) {
        const struct mt_config_moe *mo = &cfg->moe;
        m->E = mo->num_experts;
        m->Fe = mo->moe_ffn_hidden_size;
        m->Fs = mo->shared_expert_intermediate_size;
        m->topk = mo->router_topk;
        if (m->E % m->sc.ep || m->Fe % m->sc.etp || m->Fs % tp) {
            mt_model_destroy(m);
            return mt_err_set(err, MT_EINVAL,
                              "model: num_experts %d must divide by expert_model_parallel_size %d, "
                              "moe_ffn_hidden_size %d by expert_tensor_parallel_size %d, and "
                              "shared_expert_intermediate_size %d by tensor_model_parallel_size %d",
                              mo->num_experts, m->sc.ep, mo->moe_ffn_hidden_size, m->sc.etp,
                              mo->shared_expert_intermediate_size, tp);
        }
        m->E_l = m->E / m->sc.ep;
        m->e0 = m->E_l * m->sc.ep_rank;
        m->Fe_l = m->Fe / m->sc.etp;
        m->Fs_l = m->Fs / tp;
        /* padding the experts' rows lays them out as the all-to-all dispatcher does,
         * which pads on the receiving side (over a group of one without EP and ETP) */
        m->pad_align = mt_config_expert_padding(cfg);
        if (m->xg > 1 || m->pad_align)
            m->dispatch = streq(mo->token_dispatcher_type, "allgather") && m->xg > 1
                              ? MT_DISPATCH_ALLGATHER
                              : MT_DISPATCH_ALLTOALL;
        m->router = (struct mt_router_args){
            .num_tokens = 0, .num_experts = m->E, .topk = m->topk,
            .score_fn = streq(mo->router_score_function, "sigmoid") ? MT_SCORE_SIGMOID : MT_SCORE_SOFTMAX,
            .pre_softmax = mo->router_pre_softmax,
            .scaling_factor = (float)mo->router_topk_scaling_factor};
        m->balance = streq(mo->router_load_balancing_type, "aux_loss")       ? MT_BALANCE_AUX
                     : streq(mo->router_load_balancing_type, "seq_aux_loss") ? MT_BALANCE_SEQ_AUX
                                                                             : MT_BALANCE_NONE;
        m->aux_coeff = (float)mo->aux_loss_coeff;
        m->z_coeff = (float)mo->z_loss_coeff;
        m->capacity_factor = mo->expert_capacity_factor;
        m->pad_to_capacity = mo->pad_expert_input_to_capacity;
        m->shared_overlap = mo->moe_shared_expert_overlap && m->Fs > 0 &&
                            m->dispatch == MT_DISPATCH_ALLTOALL;
        m->drop_policy = streq(mo->token_drop_policy, "position") ? MT_DROP_POSITION : MT_DROP_PROBS;
        m->force_balance = mo->router_force_load_balancing;
        m->expert_bias_on = mo->router_enable_expert_bias;
        m->bias_rate = (float)mo->router_bias_update_rate;
        if ((rc = size_rows(m, err)) != MT_OK) {
            mt_model_destroy(m);
            return rc;
        }
        rc = MT_ENOMEM;
        m->expert_bias = calloc((size_t)m->nmoe * m->E, sizeof(float));
        m->expert_counts = calloc((size_t)m->nmoe * m->E, sizeof(long long));
        NEED(m->expert_bias && m->expert_counts, "expert routing tables",
             (size_t)m->nmoe * m->E * (sizeof(float) + sizeof(long long)));
    }
    NEED(alloc_host(m, &bytes) == MT_OK, "host routing buffers", bytes);

    int max_tensors = 3 + m->L * 16;
    m->tensors = calloc((size_t)max_tensors, sizeof *m->tensors);
    m->names = calloc((size_t)max_tensors, NAME_MAX_LEN);
    m->std_of = calloc((size_t)max_tensors, sizeof(float));
    NEED(m->tensors && m->names && m->std_of, "parameter table",
         (size_t)max_tensors * (sizeof *m->tensors + NAME_MAX_LEN + sizeof(float)));
    build_tensors(m);

    const struct mt_kernel_ops *o = &k->op;
    const size_t param_bytes = sat_mul(sizeof(float), m->nparams);
    m->params = dev_alloc(k, param_bytes);
    NEED(m->params, "parameters", param_bytes);
    m->grads = dev_alloc(k, param_bytes);
    NEED(m->grads, "gradients", param_bytes);
    const size_t work_bytes = sat_mul(mt_dtype_size(m->wdt), m->nparams);
    m->work = m->bf16 ? dev_alloc(k, work_bytes) : m->params;
    NEED(m->work, "bf16 working copy of the parameters", work_bytes);
    if (m->expert_bias_on) {
        m->expert_bias_dev = dev_alloc(k, sizeof(float) * (size_t)m->nmoe * m->E);
        NEED(m->expert_bias_dev, "expert biases", sizeof(float) * (size_t)m->nmoe * m->E);
        if (m->world && m->world->size > 1) {
            m->expert_load_sum = dev_alloc(k, sizeof(int64_t) * (size_t)m->nmoe * m->E);
            NEED(m->expert_load_sum, "expert loads of every rank",
                 sizeof(int64_t) * (size_t)m->nmoe * m->E);
        }
    }
    for (int e = 0; e < 2; e++) {
        m->ev_up[e] = o->event_create(k->ctx);
        NEED(m->ev_up[e], "upload events", 0);
    }
    if (m->dispatch == MT_DISPATCH_ALLTOALL) {
        m->a2a_stage = o->alloc_host(k->ctx, a2a_stage_bytes(m));
        NEED(m->a2a_stage, "the all-to-all's map staging", a2a_stage_bytes(m));
    }
    NEED(alloc_stats(m, 1) == MT_OK, "the step's scalars and token staging",
         step_acc_bytes(m, 1) + token_staging_bytes(m, 1));
    o->memset(k->ctx, m->params, 0, param_bytes);
    o->memset(k->ctx, m->grads, 0, param_bytes);

    /* the recipes' buffers first: the activations' layout asks which copies they save */
    if ((rc = lowp_setup(m, par, err)) != MT_OK) {
        mt_model_destroy(m);
        return rc;
    }
    struct act_arenas a = {.rc_max = 0};
    layout_acts(m, &a);
    m->acts_bytes = a.keep.off;
    m->rc_bytes = a.rc_max;
    m->lp_copies = a.copies;
    m->lp_replaced = a.replaced;
    m->off.half = offload_half(a.off_max);
    const size_t chunk_off = a.chunk_off;
    struct arena s = {NULL, 0};
    layout_scratch(m, &s);
    m->scratch_bytes = s.off;
    /* a pipeline stage gets its activations, recompute and offload buffers from
     * mt_model_set_stage (its slots) */
    if (m->pp > 1) m->acts_bytes = m->rc_bytes = m->off.half = 0;
    m->acts = m->pp > 1 ? NULL : dev_alloc(k, m->acts_bytes);
    NEED(m->acts || m->pp > 1, "activations", m->acts_bytes);
    if (m->rc_bytes) {
        m->rc_mem = dev_alloc(k, m->rc_bytes);
        NEED(m->rc_mem, "recompute buffer", m->rc_bytes);
    }
    if (m->off.half) {
        m->off.mem[0] = dev_alloc(k, m->off.half);
        m->off.mem[1] = dev_alloc(k, m->off.half);
        NEED(m->off.mem[0] && m->off.mem[1], "activation offload buffer", 2 * m->off.half);
    }
    m->scratch = dev_alloc(k, m->scratch_bytes);
    NEED(m->scratch, "scratch buffers", m->scratch_bytes);
#undef NEED
    if (m->acts) {
        a = (struct act_arenas){.keep = {m->acts, 0}, .rc = {m->rc_mem, 0}, .off_base = {m->off.mem[0], m->off.mem[1]}};
        layout_acts(m, &a);
        if ((rc = mt_offload_setup(m, 1, 1, &chunk_off, err)) != MT_OK) {
            mt_model_destroy(m);
            return rc;
        }
    }
    s = (struct arena){m->scratch, 0};
    layout_scratch(m, &s);
    mt_model_params_updated(m);
    *out = m;
    return MT_OK;
fail:;
    char size[64], params[96] = "";
    if (bytes >= SIZE_MAX / 2)
        snprintf(size, sizeof size, "more bytes than a 64-bit size counts");
    else
        snprintf(size, sizeof size, "%zu bytes", bytes);
    if (m->ntensors > 0)
        snprintf(params, sizeof params, ", %zu parameters on this rank", m->nparams);
    mt_model_destroy(m);
    return mt_err_set(err, rc,
                      "model: out of memory allocating the %s (%s; micro-batch of %d x %d "
                      "tokens%s)\nhint: lower training%%micro_batch_size or seq_length, or "
                      "spread the model over more processes (tensor, pipeline or expert "
                      "parallelism)",
                      what, size, max_micro_batch, cfg->training.seq_length, params);
}

/* The overflow blocks of a slot's layers (la: its per-layer activations). */
static void free_overs(struct mt_model *m, struct mt_layer_acts *la)
{
    for (int l = 0; la && l < m->L; l++)
        if (la[l].over) mt_model_expert_release(m, &la[l], false);
}

void mt_model_destroy(struct mt_model *m)
{
    if (!m) return;
    const struct mt_kernel_ops *o = &m->k->op;
    mt_model_expert_release(m, NULL, false);
    free(m->h_over);
    if (m->slots)
        for (int s = 0; s < m->nslots * m->nchunks; s++) free_overs(m, m->slots[s].la);
    else
        free_overs(m, m->la);
    mt_model_release_deferred(m);
    if (m->work && m->work != m->params) o->free(m->k->ctx, m->work);
    if (m->params) o->free(m->k->ctx, m->params);
    if (m->grads) o->free(m->k->ctx, m->grads);
    if (m->expert_bias_dev) o->free(m->k->ctx, m->expert_bias_dev);
    if (m->expert_load_sum) o->free(m->k->ctx, m->expert_load_sum);
    free_stats(m);
    for (int e = 0; e < 2; e++)
        if (m->ev_up[e]) o->event_destroy(m->k->ctx, m->ev_up[e]);
    if (m->a2a_stage) o->free_host(m->k->ctx, m->a2a_stage);
    mt_lowp_destroy(m);
    if (m->buffers != m->expert_bias) free(m->buffers);
    if (m->acts) o->free(m->k->ctx, m->acts);
    if (m->rc_mem) o->free(m->k->ctx, m->rc_mem);
    mt_offload_free(m);
    for (int h = 0; h < 2; h++)
        if (m->off.mem[h]) o->free(m->k->ctx, m->off.mem[h]);
    free(m->off.mods);
    free(m->off.bytes);
    if (m->scratch) o->free(m->k->ctx, m->scratch);
    if (m->slots) {
        m->la = m->slots[0].la;
        m->res = m->slots[0].res;
        for (int s = 0; s < m->nslots * m->nchunks; s++) {
            struct mt_act_slot *x = &m->slots[s];
            if (x->mem) o->free(m->k->ctx, x->mem);
            if (s % m->nslots == 0) continue;
            for (int l = 0; x->la && l < m->L; l++) {
                free(x->la[l].h_offsets);
                free(x->la[l].hx_offsets);
                free(x->la[l].recv_counts);
            }
            free(x->la);
            free(x->res);
        }
        free(m->slots);
    }
    free(m->chunk_l0);
    free(m->slot_bytes);
    for (int l = 0; m->la && l < m->L; l++) {
        free(m->la[l].h_offsets);
        free(m->la[l].hx_offsets);
        free(m->la[l].recv_counts);
    }
    free(m->host_scratch);
    free(m->moe_of_layer);
    free(m->stage_of_layer);
    free(m->drop);
    free(m->rc_first);
    free(m->lt);
    free(m->la);
    free(m->res);
    free(m->expert_bias);
    free(m->expert_counts);
    free(m->tensors);
    free(m->names);
    free(m->std_of);
    free(m);
}

/* ------------------------------------------------------------ pipeline stage */

bool mt_model_tensor_on_stage(const struct mt_model *m, int i, int stage, bool *replica)
{
    const struct mt_param_info *t = &m->tensors[i];
    bool rep = false, on;
    if (m->pp == 1) {
        on = true;
    } else if (t->layer >= 0) {
        on = m->stage_of_layer[t->layer] == stage;
    } else if (i == m->embed) {
        on = stage == 0 || (m->tied && stage == m->pp - 1);
        rep = stage != 0;
    } else { /* final norm, untied LM head */
        on = stage == m->pp - 1;
    }
    if (replica) *replica = on && rep;
    return on;
}

int mt_model_pp_tied_embedding(const struct mt_model *m)
{
    if (m->pp == 1 || !m->tied || (m->pp_rank != 0 && m->pp_rank != m->pp - 1)) return -1;
    return m->embed;
}

int mt_model_tensor_position(const struct mt_model *m, int i)
{
    const struct mt_param_info *t = &m->tensors[i];
    if (t->layer >= 0) return t->layer;
    /* the embedding is finished last, unless held as the last stage's LM head */
    if (i == m->embed && !t->pp_replica) return -1;
    return m->L;
}

void mt_model_set_hooks(struct mt_model *m, const struct mt_model_hooks *hooks)
{
    m->hooks = hooks ? *hooks : (struct mt_model_hooks){0};
}

static void use_chunk(struct mt_model *m, int chunk)
{
    m->l0 = m->chunk_l0[chunk];
    m->l1 = m->chunk_l1[chunk];
    m->first = m->first_stage && chunk == 0;
    m->last = m->last_stage && chunk == m->nchunks - 1;
}

void mt_model_select_slot(struct mt_model *m, int chunk, int slot)
{
    use_chunk(m, chunk);
    m->off.slot = chunk * m->nslots + slot;
    struct mt_act_slot *x = &m->slots[chunk * m->nslots + slot];
    m->res = x->res;
    m->la = x->la;
    m->lnf = x->lnf;
    m->lnf_rstd = x->lnf_rstd;
    m->lnf_full = x->lnf_full;
    m->lm_logits = x->lm_logits;
    m->ce_lse = x->ce_lse;
    m->ce_tl = x->ce_tl;
    m->inputs = x->inputs;
    m->targets = x->targets;
    m->inputs_v = x->inputs_v;
}

int mt_model_set_stage(struct mt_model *m, int nchunks, const int *l0, const int *l1,
                       bool first_stage, bool last_stage, int nslots, struct mt_err *err)
{
    bool ok = !m->staged && nchunks >= 1 && nslots >= 1;
    for (int c = 0; ok && c < nchunks; c++)
        ok = l0[c] >= 0 && l1[c] >= l0[c] && l1[c] <= m->L && (c == 0 || l0[c] >= l1[c - 1]);
    if (ok && first_stage) ok = l0[0] == 0;
    if (ok && last_stage) ok = l1[nchunks - 1] == m->L;
    if (!ok)
        return mt_err_set(err, MT_EINVAL, "model: bad pipeline stage (%d chunks from layer %d, %d slots)",
                          nchunks, nchunks >= 1 ? l0[0] : -1, nslots);
    const struct mt_kernel_ops *o = &m->k->op;
    const int total = nchunks * nslots;
    m->staged = true;
    m->nchunks = nchunks;
    m->first_stage = first_stage;
    m->last_stage = last_stage;
    /* the whole-model activations give way to the stage's slots */
    if (m->acts) o->free(m->k->ctx, m->acts);
    m->acts = NULL;
    m->chunk_l0 = calloc((size_t)nchunks * 2, sizeof(int));
    m->slot_bytes = calloc((size_t)nchunks, sizeof(size_t));
    m->slots = calloc((size_t)total, sizeof *m->slots);
    if (!m->slots || !m->chunk_l0 || !m->slot_bytes)
        return mt_err_set(err, MT_ENOMEM, "model: out of memory for pipeline slots");
    m->chunk_l1 = m->chunk_l0 + nchunks;
    memcpy(m->chunk_l0, l0, sizeof(int) * (size_t)nchunks);
    memcpy(m->chunk_l1, l1, sizeof(int) * (size_t)nchunks);
    m->nslots = nslots;
    const size_t E = (size_t)m->E, S = (size_t)m->sc.ep * (size_t)m->E_l;
    void **res0 = m->res;
    struct mt_layer_acts *la0 = m->la;
    m->acts_bytes = 0;
    /* the recompute buffer serves every chunk and slot: sized for the largest group */
    if (m->rc_mem) o->free(m->k->ctx, m->rc_mem);
    m->rc_mem = NULL;
    m->rc_bytes = 0;
    /* so is the offload buffer (two layers' worth); each slot has its host block */
    mt_offload_free(m);
    for (int h = 0; h < 2; h++) {
        if (m->off.mem[h]) o->free(m->k->ctx, m->off.mem[h]);
        m->off.mem[h] = NULL;
    }
    size_t off_max = 0, *chunk_off = calloc((size_t)nchunks, sizeof(size_t));
    if (!chunk_off) return mt_err_set(err, MT_ENOMEM, "model: out of memory for pipeline slots");
    for (int c = 0; c < nchunks; c++) {
        use_chunk(m, c);
        struct act_arenas a = {.rc_max = 0};
        layout_acts(m, &a);
        m->slot_bytes[c] = a.keep.off;
        m->lp_copies = c ? sat_add(m->lp_copies, a.copies) : a.copies;
        m->lp_replaced = c ? sat_add(m->lp_replaced, a.replaced) : a.replaced;
        if (a.rc_max > m->rc_bytes) m->rc_bytes = a.rc_max;
        if (a.off_max > off_max) off_max = a.off_max;
        chunk_off[c] = a.chunk_off;
    }
    m->off.half = offload_half(off_max);
    if (m->off.half && (!(m->off.mem[0] = dev_alloc(m->k, m->off.half)) ||
                        !(m->off.mem[1] = dev_alloc(m->k, m->off.half)))) {
        free(chunk_off);
        return mt_err_set(err, MT_ENOMEM,
                          "model: out of memory allocating the activation offload buffer (%zu "
                          "bytes)\nhint: lower training%%micro_batch_size or seq_length",
                          2 * m->off.half);
    }
    int rc = mt_offload_setup(m, nchunks, nslots, chunk_off, err);
    free(chunk_off);
    MT_CHECK(rc);
    if (m->rc_bytes && !(m->rc_mem = dev_alloc(m->k, m->rc_bytes)))
        return mt_err_set(err, MT_ENOMEM,
                          "model: out of memory allocating the recompute buffer (%zu bytes)"
                          "\nhint: lower training%%micro_batch_size or seq_length, or "
                          "recompute%%num_layers",
                          m->rc_bytes);
    size_t want = 0; /* the slot being allocated, for the message */
    for (int c = 0; c < nchunks; c++) {
        use_chunk(m, c);
        struct act_arenas a;
        for (int s = 0; s < nslots; s++) {
            struct mt_act_slot *x = &m->slots[c * nslots + s];
            if (s == 0) { /* the model's own arrays serve slot 0 of every chunk */
                x->la = la0;
                x->res = res0;
            } else {
                x->la = calloc((size_t)m->L, sizeof *x->la);
                x->res = calloc((size_t)m->L + 1, sizeof(void *));
                if (!x->la || !x->res) goto oom;
                for (int l = m->l0; l < m->l1; l++) {
                    if (m->moe_of_layer[l] < 0) continue;
                    x->la[l].h_offsets = calloc(E + 1, sizeof(long long));
                    x->la[l].hx_offsets = calloc((size_t)m->E_l + 1, sizeof(int32_t));
                    x->la[l].recv_counts = calloc((size_t)m->sc.etp * S, sizeof(long long));
                    if (!x->la[l].h_offsets || !x->la[l].hx_offsets || !x->la[l].recv_counts)
                        goto oom;
                }
            }
            want = m->slot_bytes[c];
            x->mem = dev_alloc(m->k, want ? want : 1);
            if (!x->mem) goto oom;
            m->res = x->res;
            m->la = x->la;
            a = (struct act_arenas){.keep = {x->mem, 0}, .rc = {m->rc_mem, 0}, .off_base = {m->off.mem[0], m->off.mem[1]}};
            layout_acts(m, &a);
            x->lnf = m->lnf;
            x->lnf_rstd = m->lnf_rstd;
            x->lnf_full = m->lnf_full;
            x->lm_logits = m->lm_logits;
            x->ce_lse = m->ce_lse;
            x->ce_tl = m->ce_tl;
            x->inputs = m->inputs;
            x->targets = m->targets;
            x->inputs_v = m->inputs_v;
            m->acts_bytes += m->slot_bytes[c];
        }
    }
    mt_model_select_slot(m, 0, 0);
    return MT_OK;
oom:
    m->res = res0;
    m->la = la0;
    return mt_err_set(err, MT_ENOMEM,
                      "model: out of memory allocating the activations of %d pipeline slots "
                      "(%zu bytes for the one that failed)\nhint: lower "
                      "training%%micro_batch_size or seq_length, or use more pipeline stages",
                      total, want);
}

size_t mt_model_slot_bytes(const struct mt_model *m, int chunk)
{
    return m->staged ? m->slot_bytes[chunk] : m->acts_bytes;
}

size_t mt_model_act_size(const struct mt_model *m) { return mt_dtype_size(m->adt); }

size_t mt_model_stage_act_numel(const struct mt_model *m, int B)
{
    return (size_t)B * (size_t)m->T / (size_t)m->sc.tp * (size_t)m->H;
}

size_t mt_model_num_params(const struct mt_model *m) { return m->nparams; }
size_t mt_model_num_global_params(const struct mt_model *m) { return m->nparams_global; }
void mt_model_shard_coords(const struct mt_model *m, struct mt_shard_coords *c) { *c = m->sc; }
int mt_model_num_tensors(const struct mt_model *m) { return m->ntensors; }

const struct mt_param_info *mt_model_tensor(const struct mt_model *m, int i)
{
    return i >= 0 && i < m->ntensors ? &m->tensors[i] : NULL;
}

float *mt_model_params(struct mt_model *m) { return m->params; }

struct mt_tensor mt_model_weight(const struct mt_model *m, int tensor)
{
    if (tensor == MT_NO_TENSOR) return mt_tview(NULL, m->wdt, 0, 0);
    const struct mt_param_info *t = &m->tensors[tensor];
    const int64_t cols = t->ndim > 0 ? t->local_shape[t->ndim - 1] : 1;
    const int64_t rows = cols > 0 ? (int64_t)t->numel / cols : 0;
    return mt_tview((const char *)m->work + t->offset * mt_dtype_size(m->wdt), m->wdt, rows, cols);
}
float *mt_model_grads(struct mt_model *m) { return m->grads; }

const struct mt_kernels *mt_model_kernels(const struct mt_model *m) { return m->k; }

float *mt_model_buffers(struct mt_model *m, size_t *n)
{
    const size_t nb = m->expert_bias_on ? (size_t)m->nmoe * m->E : 0;
    if (m->lp) {
        mt_lowp_save(m, m->buffers + nb);
        *n = nb + mt_lowp_nbuffers(m);
        return m->buffers;
    }
    *n = nb;
    return m->expert_bias_on ? m->expert_bias : NULL;
}

/* ------------------------------------------------------------ init and updates */

struct init_ctx {
    float *p;
    float std;
    uint64_t key;
};

static void init_run(void *ctx, size_t whole, size_t shard, size_t n)
{
    const struct init_ctx *c = ctx;
    /* a run is a row of a sharded tensor (an expert's row: hundreds of values): a
     * parallel region per short run costs more than it draws */
#pragma omp parallel for schedule(static) if (n >= 16384)
    for (size_t j = 0; j < n; j++) c->p[shard + j] = c->std * mt_rng_normal(c->key, 0, whole + j);
}

static void expert_bias_to_device(struct mt_model *m);

void mt_model_init(struct mt_model *m, unsigned long long seed)
{
    float *host = malloc(sizeof(float) * m->nparams);
    if (!host) abort(); /* same size as the params buffer that create() already holds */
    for (int i = 0; i < m->ntensors; i++) {
        const struct mt_param_info *t = &m->tensors[i];
        float *p = host + t->offset;
        if (t->no_weight_decay) { /* RMSNorm weights */
            for (size_t j = 0; j < t->numel; j++) p[j] = 1.0f;
            continue;
        }
        if (t->numel == 0) continue; /* on another pipeline stage */
        /* element j of the whole tensor draws counter j, whichever rank holds it */
        struct init_ctx c = {p, m->std_of[i], mt_rng_key(seed, (uint64_t)i)};
        for_each_run(t, t->local_shape, t->start, init_run, &c);
    }
    m->k->op.copy(m->k->ctx, m->params, host, sizeof(float) * m->nparams);
    free(host);
    if (m->nmoe > 0) {
        memset(m->expert_bias, 0, sizeof(float) * (size_t)m->nmoe * m->E);
        mt_model_reset_expert_counts(m);
        expert_bias_to_device(m);
    }
    mt_model_params_updated(m);
}

/* The routers read the expert biases from their backend-memory copy. */
static void expert_bias_to_device(struct mt_model *m)
{
    if (m->expert_bias_dev)
        m->k->op.copy(m->k->ctx, m->expert_bias_dev, m->expert_bias,
                      sizeof(float) * (size_t)m->nmoe * m->E);
}

void mt_model_buffers_updated(struct mt_model *m)
{
    if (m->lp) mt_lowp_load(m, m->buffers + (m->expert_bias_on ? (size_t)m->nmoe * m->E : 0));
    expert_bias_to_device(m);
}

void mt_model_params_updated(struct mt_model *m)
{
    if (m->bf16)
        m->k->op.convert(m->k->ctx, mt_tview(m->work, m->wdt, 1, (int64_t)m->nparams),
                         mt_f32(m->params, 1, (int64_t)m->nparams));
}

void mt_model_params_updated_range(struct mt_model *m, size_t offset, size_t n)
{
    if (m->bf16 && n)
        m->k->op.convert(m->k->ctx,
                         mt_tview((char *)m->work + offset * mt_dtype_size(m->wdt), m->wdt, 1,
                                  (int64_t)n),
                         mt_f32(m->params + offset, 1, (int64_t)n));
}

void mt_model_zero_grad(struct mt_model *m)
{
    m->k->op.memset(m->k->ctx, m->grads, 0, sizeof(float) * m->nparams);
}

int mt_model_forward_backward(struct mt_model *m, const int32_t *tokens, int B, float loss_scale,
                              struct mt_model_stats *st, struct mt_err *err)
{
    return mt_model_run(m, tokens, B, true, loss_scale, st, err);
}

int mt_model_forward(struct mt_model *m, const int32_t *tokens, int B, struct mt_model_stats *st,
                     struct mt_err *err)
{
    return mt_model_run(m, tokens, B, false, 0.0f, st, err);
}

struct mt_fwd_record *mt_model_record(const struct mt_model *m)
{
    return (struct mt_fwd_record *)(m->acc->load + (size_t)m->nmoe * m->E) + m->rec_cur;
}

double *mt_model_sumsq_acc(struct mt_model *m) { return &m->acc->sumsq; }

const double *mt_model_loss_sums(struct mt_model *m, int *stride, int *n)
{
    _Static_assert(sizeof(struct mt_fwd_record) % sizeof(double) == 0 &&
                       offsetof(struct mt_fwd_record, lm_sum) == 0,
                   "a record's loss sum is at a whole number of doubles from the next one's");
    *stride = (int)(sizeof(struct mt_fwd_record) / sizeof(double));
    *n = m->nrec;
    return &((struct mt_fwd_record *)(m->acc->load + (size_t)m->nmoe * m->E))->lm_sum;
}

void mt_model_upload(struct mt_model *m, int n, void *const *dst, const void *const *src,
                     const size_t *bytes)
{
    const struct mt_kernels *k = m->k;
    k->op.event_record(k->ctx, m->ev_up[0], MT_STREAM_COMPUTE);
    k->op.event_wait(k->ctx, MT_STREAM_COPY, m->ev_up[0]);
    for (int i = 0; i < n; i++) k->op.copy_async(k->ctx, dst[i], src[i], bytes[i]);
    k->op.event_record(k->ctx, m->ev_up[1], MT_STREAM_COPY);
    k->op.event_wait(k->ctx, MT_STREAM_COMPUTE, m->ev_up[1]);
}

int mt_model_defer_stats(struct mt_model *m, int max_forwards, struct mt_err *err)
{
    if (max_forwards < 1 || m->nrec > 0)
        return mt_err_set(err, MT_EINVAL,
                          "model: deferring the statistics of %d forwards with %d not read yet",
                          max_forwards, m->nrec);
    if (alloc_stats(m, max_forwards) != MT_OK)
        return mt_err_set(err, MT_ENOMEM,
                          "model: out of memory for the scalars and token staging of %d forwards "
                          "(%zu bytes of backend memory, %zu of host memory)",
                          max_forwards, step_acc_bytes(m, max_forwards),
                          token_staging_bytes(m, max_forwards));
    m->defer = true;
    return MT_OK;
}

int mt_model_read_stats(struct mt_model *m, struct mt_model_stats *st, int max, int *n,
                        double *sumsq, struct mt_err *err)
{
    if (m->nrec > max)
        return mt_err_set(err, MT_EINVAL, "model: %d forwards' statistics to read into %d",
                          m->nrec, max);
    const struct mt_kernels *k = m->k;
    const size_t nl = (size_t)m->nmoe * m->E, bytes = step_acc_bytes(m, m->nrec);
    k->op.copy(k->ctx, m->acc_host, m->acc, bytes); /* the one wait */
    const struct mt_fwd_record *r = (const struct mt_fwd_record *)(m->acc_host->load + nl);
    for (int i = 0; i < m->nrec; i++) {
        memset(&st[i], 0, sizeof st[i]);
        st[i].lm_loss = m->rec_valid[i] > 0 ? r[i].lm_sum / (double)m->rec_valid[i] : 0.0;
        st[i].aux_loss = r[i].aux;
        st[i].z_loss = r[i].z;
        st[i].dropped_tokens = r[i].dropped;
    }
    /* the loads stay summed on the device until mt_model_reset_expert_counts (the
     * expert-bias update reads them there) */
    for (size_t i = 0; i < nl; i++) m->expert_counts[i] = m->acc_host->load[i];
    if (sumsq) *sumsq = m->acc_host->sumsq;
    *n = m->nrec;
    mt_model_reset_records(m);
    return MT_OK;
}

void mt_model_reset_records(struct mt_model *m)
{
    const struct mt_kernels *k = m->k;
    const size_t nl = (size_t)m->nmoe * m->E;
    k->op.memset(k->ctx, &m->acc->sumsq, 0, sizeof m->acc->sumsq);
    if (m->nrec > 0)
        k->op.memset(k->ctx, m->acc->load + nl, 0, sizeof(struct mt_fwd_record) * (size_t)m->nrec);
    m->nrec = m->nahead = 0;
}

int mt_model_num_moe_layers(const struct mt_model *m) { return m->nmoe; }

long long mt_model_a2a_overlapped(const struct mt_model *m) { return m->a2a_overlapped; }

const long long *mt_model_expert_counts(const struct mt_model *m) { return m->expert_counts; }
long long *mt_model_expert_counts_mut(struct mt_model *m) { return m->expert_counts; }

void mt_model_reset_expert_counts(struct mt_model *m)
{
    if (m->nmoe == 0) return;
    const size_t nl = (size_t)m->nmoe * m->E;
    memset(m->expert_counts, 0, sizeof(long long) * nl);
    if (m->acc) m->k->op.memset(m->k->ctx, m->acc->load, 0, sizeof(int64_t) * nl);
}

/* The routers' copy, from the loads on the device (summed over the ranks into a buffer of
 * their own); gated as adamw_dev when sumsq is given. */
static int expert_bias_device(struct mt_model *m, const double *sumsq, const double *loss,
                              int loss_stride, int n_loss, struct mt_err *err)
{
    const size_t nl = (size_t)m->nmoe * m->E;
    const int64_t *load = m->acc->load;
    if (m->expert_load_sum) {
        m->k->op.copy(m->k->ctx, m->expert_load_sum, m->acc->load, sizeof(int64_t) * nl);
        MT_CHECK(mt_all_reduce(m->world, m->expert_load_sum, nl, MT_DT_I64, MT_OP_SUM, err));
        load = m->expert_load_sum;
    }
    m->k->op.expert_bias_update(m->k->ctx, m->expert_bias_dev, load, m->nmoe, m->E, m->bias_rate,
                                sumsq, loss, loss_stride, n_loss);
    return MT_OK;
}

/* Both copies from the same loads by the same op (the CPU's on the host master): equal,
 * bit for bit, with no upload. */
int mt_model_update_expert_bias(struct mt_model *m, bool device, struct mt_err *err)
{
    if (!m->expert_bias_on) return MT_OK;
    _Static_assert(sizeof(long long) == sizeof(int64_t), "expert counts are int64");
    mt_kernels_cpu()->op.expert_bias_update(NULL, m->expert_bias, (const int64_t *)m->expert_counts,
                                            m->nmoe, m->E, m->bias_rate, NULL, NULL, 0, 0);
    return device ? expert_bias_device(m, NULL, NULL, 0, 0, err) : MT_OK;
}

int mt_model_update_expert_bias_dev(struct mt_model *m, const double *loss, int loss_stride,
                                    int n_loss, struct mt_err *err)
{
    if (!m->expert_bias_on) return MT_OK;
    return expert_bias_device(m, &m->acc->sumsq, loss, loss_stride, n_loss, err);
}

void mt_model_memory(const struct mt_model *m, struct mt_memory_report *r)
{
    r->params = sizeof(float) * m->nparams;
    r->grads = sizeof(float) * m->nparams;
    r->working_copy = m->bf16 ? mt_dtype_size(m->wdt) * m->nparams : 0;
    r->activations = m->acts_bytes;
    r->lowp_copies = m->lp_copies;
    r->lowp_replaced = m->lp_replaced;
    r->recompute = m->rc_bytes;
    r->scratch = m->scratch_bytes + m->lp_scratch; /* with the quantised GEMM operands */
    size_t lp_dev = 0, lp = mt_lowp_state_bytes(m, &lp_dev);
    r->device_buffers = (m->expert_bias_dev ? sizeof(float) * (size_t)m->nmoe * m->E : 0) +
                        (m->expert_load_sum ? sizeof(int64_t) * (size_t)m->nmoe * m->E : 0) +
                        (m->acc ? step_acc_bytes(m, m->nrec_max) : 0) + lp_dev;
    r->offload = m->off.mem[0] ? 2 * m->off.half : 0;
    r->offload_host = m->off.host_bytes;
    r->offload_per_mb = m->off.mb_bytes;
    r->buffers = (sizeof(float) + sizeof(long long)) * (size_t)m->nmoe * m->E +
                 (m->acc_host ? step_acc_bytes(m, m->nrec_max) + token_staging_bytes(m, m->nrec_max) +
                                    sizeof(long long) * (size_t)m->nrec_max
                              : 0) +
                 (m->a2a_stage ? a2a_stage_bytes(m) : 0) +
                 r->device_buffers + (lp - lp_dev);
}

double mt_model_flops_per_token(const struct mt_model *m)
{
    /* 3 (forward, wgrad, dgrad) x 2 (FMA) x per-token GEMM sizes; SwiGLU stacks 3
     * matrices per MLP; causal attention counts half of the T x T scores. */
    const double H = m->H, Q = m->Q, KV = m->KV, T = m->T;
    const double dense = (double)(m->L - m->nmoe), moe = m->nmoe;
    const double mlp = H * (m->F * 3.0 * dense + (m->Fe * (double)m->topk * 3.0 + m->Fs * 3.0) * moe);
    const double attn = H * (Q + 2.0 * KV) + Q * T / 2.0 * 2.0 + Q * H;
    return 6.0 * (mlp + attn * m->L + H * m->V);
}

int mt_model_capacity(const struct mt_model *m, long long N)
{
    return m->capacity_factor > 0.0 ? capacity_for(m, N) : 0;
}

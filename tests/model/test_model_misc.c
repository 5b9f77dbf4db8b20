/* The model's contract beyond its gradients: determinism, bf16 emulation, config
 * rejections, the parameter table, layout-independent init, expert counts and bias
 * updates, memory accounting, FLOPs, loss scaling and accumulation, and what the whole
 * iteration's graph is signed with. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/model_internal.h"
#include "tests/model/tiny_config.h"
#include "util/rng.h"

#define B_ 2

static struct mt_model *make(const struct mt_config *cfg)
{
    struct mt_model *m;
    struct mt_err err;
    int rc = mt_model_create(cfg, mt_kernels_cpu(), B_, NULL, &m, &err);
    if (rc != MT_OK) printf("# %s\n", err.msg);
    assert_int_equal(rc, MT_OK);
    mt_model_init(m, 42);
    return m;
}

static int32_t *tokens_for(const struct mt_config *cfg, unsigned seed)
{
    int32_t *t = malloc(sizeof(int32_t) * B_ * (size_t)(cfg->training.seq_length + 1));
    tiny_tokens(t, B_, cfg->training.seq_length, cfg->model.vocab_size, seed);
    return t;
}

static float *fb_grads(struct mt_model *m, const int32_t *tok, float scale, struct mt_model_stats *st)
{
    struct mt_err err;
    mt_model_zero_grad(m);
    assert_int_equal(mt_model_forward_backward(m, tok, B_, scale, st, &err), MT_OK);
    float *g = malloc(sizeof(float) * mt_model_num_params(m));
    memcpy(g, mt_model_grads(m), sizeof(float) * mt_model_num_params(m));
    return g;
}

static bool is_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (u & 0xffffu) == 0;
}

static void test_determinism(void **state)
{
    (void)state;
    for (int bf = 0; bf < 2; bf++) {
        struct mt_config cfg;
        tiny_config(&cfg);
        if (bf) strcpy(cfg.precision.params_dtype, "bf16");
        struct mt_model *m = make(&cfg);
        int32_t *tok = tokens_for(&cfg, 1);
        struct mt_model_stats s1, s2;
        float *g1 = fb_grads(m, tok, 1.0f, &s1);
        float *g2 = fb_grads(m, tok, 1.0f, &s2);
        assert_memory_equal(g1, g2, sizeof(float) * mt_model_num_params(m));
        assert_true(s1.lm_loss == s2.lm_loss && s1.aux_loss == s2.aux_loss && s1.z_loss == s2.z_loss);
        free(g1);
        free(g2);
        free(tok);
        mt_model_destroy(m);
    }
}

/* Element i of a stored tensor of dtype dt, as fp32. */
static float elem(const void *p, enum mt_dtype dt, size_t i)
{
    if (dt == MT_F32) return ((const float *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_bf16(void **state)
{
    (void)state;
    struct mt_config cfg;
    tiny_config(&cfg);
    struct mt_model *m32 = make(&cfg);
    strcpy(cfg.precision.params_dtype, "bf16");
    struct mt_model *m16 = make(&cfg);
    const size_t n = mt_model_num_params(m16);
    /* same master weights, a bf16 working copy */
    assert_memory_equal(mt_model_params(m32), mt_model_params(m16), sizeof(float) * n);
    size_t exact = 0;
    assert_int_equal(m16->wdt, MT_BF16); /* stored as bf16, 2 bytes each */
    for (size_t i = 0; i < n; i++) {
        assert_true(is_bf16(elem(m16->work, m16->wdt, i)));
        exact += elem(m16->work, m16->wdt, i) == m16->params[i];
    }
    assert_true(exact < n / 2); /* the master weights themselves are not bf16 */
    int32_t *tok = tokens_for(&cfg, 2);
    struct mt_model_stats s32, s16;
    float *g32 = fb_grads(m32, tok, 1.0f, &s32);
    float *g16 = fb_grads(m16, tok, 1.0f, &s16);
    printf("# lm loss fp32 %.6f bf16 %.6f\n", s32.lm_loss, s16.lm_loss);
    assert_true(s16.lm_loss != s32.lm_loss);
    assert_true(fabs(s16.lm_loss - s32.lm_loss) < 0.05);
    /* stored activations are bf16; router logits stay fp32 */
    const size_t N = (size_t)B_ * cfg.training.seq_length;
    for (size_t i = 0; i < N * (size_t)m16->H; i++) {
        assert_true(is_bf16(elem(m16->la[0].ln1, m16->adt, i)));
        assert_true(is_bf16(elem(m16->res[1], m16->adt, i)));
        assert_true(is_bf16(elem(m16->la[2].res_mid, m16->adt, i)));
    }
    size_t logits_bf16 = 0;
    for (size_t i = 0; i < N * (size_t)m16->E; i++) logits_bf16 += is_bf16(m16->la[0].logits[i]);
    assert_true(logits_bf16 < N * (size_t)m16->E / 2);
    /* gradients are fp32 and close to the fp32 model's */
    double num = 0, den = 0;
    size_t g_bf16 = 0;
    for (size_t i = 0; i < n; i++) {
        num += (g16[i] - g32[i]) * (double)(g16[i] - g32[i]);
        den += (double)g32[i] * g32[i];
        g_bf16 += is_bf16(g16[i]);
    }
    printf("# bf16 vs fp32 gradient rel diff %.3e\n", sqrt(num / den));
    assert_true(sqrt(num / den) < 0.1);
    assert_true(g_bf16 < n / 2);
    /* the working copy follows the master after params_updated */
    m16->params[0] = 1.00390625f; /* 1 + 2^-8: rounds to 1 (tie to even) */
    assert_true(elem(m16->work, m16->wdt, 0) != 1.0f);
    mt_model_params_updated(m16);
    assert_true(elem(m16->work, m16->wdt, 0) == 1.0f);
    struct mt_memory_report r;
    mt_model_memory(m16, &r);
    assert_int_equal(r.working_copy, sizeof(uint16_t) * n);
    mt_model_memory(m32, &r);
    assert_int_equal(r.working_copy, 0);
    free(g32);
    free(g16);
    free(tok);
    mt_model_destroy(m32);
    mt_model_destroy(m16);
}

struct reject {
    const char *what;
    void (*edit)(struct mt_config *);
    int code;
    const char *key;
};

static void e_topk(struct mt_config *c) { c->moe.router_topk = 5; }
static void e_bias_softmax(struct mt_config *c) { c->moe.router_enable_expert_bias = true; }
static void e_dtype(struct mt_config *c) { strcpy(c->precision.params_dtype, "fp16"); }
static void e_router_dtype(struct mt_config *c) { strcpy(c->moe.router_dtype, "fp64"); }
static void e_sinkhorn(struct mt_config *c) { strcpy(c->moe.router_load_balancing_type, "sinkhorn"); }
static void e_pad(struct mt_config *c) { c->moe.pad_expert_input_to_capacity = true; }
static void e_seq(struct mt_config *c) { c->training.seq_length = 65; }
static void e_groups(struct mt_config *c) { c->model.num_query_groups = 3; }
static void e_top1(struct mt_config *c) { c->moe.router_topk = 1; }
static void e_odd_head(struct mt_config *c) { c->model.kv_channels = 5; }
static void e_policy(struct mt_config *c) { strcpy(c->moe.token_drop_policy, "random"); }
static void e_score(struct mt_config *c) { strcpy(c->moe.router_score_function, "relu"); }
static void e_sig_pre(struct mt_config *c)
{
    strcpy(c->moe.router_score_function, "sigmoid");
    c->moe.router_pre_softmax = true;
}
static void e_none_coeff(struct mt_config *c) { strcpy(c->moe.router_load_balancing_type, "none"); }
static void e_freq(struct mt_config *c) { c->moe.layer_freq_len = 2; }
static void e_dispatcher(struct mt_config *c) { strcpy(c->moe.token_dispatcher_type, "flex"); }
static void e_tp_no_sp(struct mt_config *c) { c->parallel.tensor_model_parallel_size = 2; }
static void e_tp_seq(struct mt_config *c)
{
    c->parallel.tensor_model_parallel_size = 3;
    c->parallel.sequence_parallel = true;
}
static void e_tp_shared(struct mt_config *c)
{
    c->parallel.tensor_model_parallel_size = 4;
    c->parallel.sequence_parallel = true;
}

static void test_config_rejections(void **state)
{
    (void)state;
    const struct reject cases[] = {
        {"topk > experts", e_topk, MT_EINVAL, "router_topk"},
        {"expert bias with softmax", e_bias_softmax, MT_EINVAL, "router_enable_expert_bias"},
        {"fp16 params", e_dtype, MT_EUNSUPPORTED, "params_dtype"},
        {"fp64 router", e_router_dtype, MT_EUNSUPPORTED, "router_dtype"},
        {"sinkhorn", e_sinkhorn, MT_EUNSUPPORTED, "router_load_balancing_type"},
        {"pad without capacity", e_pad, MT_EINVAL, "pad_expert_input_to_capacity"},
        {"seq too long", e_seq, MT_EINVAL, "max_position_embeddings"},
        {"groups", e_groups, MT_EINVAL, "num_query_groups"},
        {"top-1 softmax after top-k", e_top1, MT_EINVAL, "router_pre_softmax"},
        {"odd head dim", e_odd_head, MT_EINVAL, "kv_channels"},
        {"drop policy", e_policy, MT_EINVAL, "token_drop_policy"},
        {"score function", e_score, MT_EINVAL, "router_score_function"},
        {"sigmoid with pre_softmax", e_sig_pre, MT_EINVAL, "router_pre_softmax"},
        {"aux coeff with none", e_none_coeff, MT_EINVAL, "aux_loss_coeff"},
        {"layer_freq length", e_freq, MT_EINVAL, "layer_freq"},
        {"dispatcher", e_dispatcher, MT_EINVAL, "token_dispatcher_type"},
        {"TP without SP", e_tp_no_sp, MT_EUNSUPPORTED, "sequence_parallel"},
        {"sequence over TP", e_tp_seq, MT_EINVAL, "seq_length = 8"},
        {"shared expert over TP", e_tp_shared, MT_EINVAL, "shared_expert_intermediate_size = 10"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct mt_config cfg;
        tiny_config(&cfg);
        cases[i].edit(&cfg);
        struct mt_model *m = (struct mt_model *)1;
        struct mt_err err = {0};
        int rc = mt_model_create(&cfg, mt_kernels_cpu(), 1, NULL, &m, &err);
        printf("# %-26s -> %s\n", cases[i].what, err.msg);
        assert_int_equal(rc, cases[i].code);
        assert_null(m);
        assert_non_null(strstr(err.msg, cases[i].key));
    }
}

static void test_tensor_table(void **state)
{
    (void)state;
    struct mt_config cfg;
    tiny_config(&cfg);
    struct mt_model *m = make(&cfg);
    size_t next = 0;
    bool saw_experts = false, saw_lm_head = false;
    for (int i = 0; i < mt_model_num_tensors(m); i++) {
        const struct mt_param_info *t = mt_model_tensor(m, i);
        assert_int_equal(t->offset, next);
        next += t->numel;
        for (int j = 0; j < i; j++) assert_string_not_equal(t->name, mt_model_tensor(m, j)->name);
        bool norm = strstr(t->name, "norm") != NULL;
        assert_int_equal(t->no_weight_decay, norm);
        if (strcmp(t->name, "model.layers.2.mlp.experts.gate_proj") == 0) {
            saw_experts = true;
            assert_int_equal(t->ndim, 3);
            assert_true(t->shape[0] == 4 && t->shape[1] == 12 && t->shape[2] == 16);
        }
        if (strcmp(t->name, "model.layers.0.self_attn.k_proj.weight") == 0)
            assert_true(t->shape[0] == 12 && t->shape[1] == 16); /* [groups*head_dim, hidden] */
        if (strcmp(t->name, "model.layers.1.mlp.down_proj.weight") == 0)
            assert_true(t->shape[0] == 16 && t->shape[1] == 20);
        saw_lm_head |= strcmp(t->name, "lm_head.weight") == 0;
    }
    assert_int_equal(next, mt_model_num_params(m));
    assert_true(saw_experts && saw_lm_head);
    assert_null(mt_model_tensor(m, mt_model_num_tensors(m)));
    int untied = mt_model_num_tensors(m);
    mt_model_destroy(m);
    cfg.model.untie_embeddings_and_output_weights = false;
    m = make(&cfg);
    assert_int_equal(mt_model_num_tensors(m), untied - 1);
    mt_model_destroy(m);
}

static void test_init(void **state)
{
    (void)state;
    struct mt_config cfg;
    tiny_config(&cfg);
    struct mt_model *m = make(&cfg); /* seed 42 */
    const float std = (float)cfg.model.init_method_std, out = std / sqrtf(6.0f);
    for (int i = 0; i < mt_model_num_tensors(m); i++) {
        const struct mt_param_info *t = mt_model_tensor(m, i);
        const float *p = mt_model_params(m) + t->offset;
        bool scaled = strstr(t->name, "o_proj") || strstr(t->name, "down_proj");
        for (size_t j = 0; j < t->numel; j += 7) {
            float want = t->no_weight_decay ? 1.0f
                                            : (scaled ? out : std) * mt_rng_normal(mt_rng_key(42, (uint64_t)i), 0, j);
            assert_true(p[j] == want);
        }
    }
    mt_model_destroy(m);
}

/* Layout-independent init: every rank's shard of every tensor is the slice of the
 * one-process tensor (shards built without communication: create and init need none),
 * the shards of a tensor tile it exactly once, and the TP-replicated ones are whole. */
static void test_sharded_init(void **state)
{
    (void)state;
    struct mt_config cfg;
    tiny_config(&cfg);
    cfg.parallel.tensor_model_parallel_size = 2;
    cfg.parallel.sequence_parallel = true;
    struct mt_model *whole = make(&cfg); /* seed 42 */
    const struct { int tp, ep, etp; } layouts[] = {{2, 1, 1}, {2, 2, 1}, {1, 2, 2}, {2, 4, 1}};
    for (size_t c = 0; c < sizeof layouts / sizeof layouts[0]; c++) {
        const int tp = layouts[c].tp, ep = layouts[c].ep, etp = layouts[c].etp;
        const int ranks = tp * ep * etp;
        /* coverage[i][j] counts the ranks holding element j of tensor i */
        unsigned char *cover = calloc(mt_model_num_params(whole), 1);
        for (int r = 0; r < ranks; r++) {
            struct mt_parallel par = {.tp = tp, .tp_rank = r % tp, .ep = ep,
                                      .ep_rank = r / tp % ep, .etp = etp,
                                      .etp_rank = r / tp / ep, .dp = 1, .pp = 1, .cp = 1};
            struct mt_model *m;
            struct mt_err err;
            int rc = mt_model_create(&cfg, mt_kernels_cpu(), B_, &par, &m, &err);
            if (rc != MT_OK) printf("# %s\n", err.msg);
            assert_int_equal(rc, MT_OK);
            mt_model_init(m, 42);
            for (int i = 0; i < mt_model_num_tensors(m); i++) {
                const struct mt_param_info *t = mt_model_tensor(m, i), *w = mt_model_tensor(whole, i);
                float *want = malloc(sizeof(float) * t->numel);
                mt_param_copy_shard(w, t->local_shape, t->start, mt_model_params(whole) + w->offset,
                                    want, true);
                assert_memory_equal(want, mt_model_params(m) + t->offset, sizeof(float) * t->numel);
                if (t->tp_replicated) assert_int_equal(t->numel, w->numel);
                /* mark the shard's elements in the whole tensor */
                float *ones = malloc(sizeof(float) * t->numel), *mark = calloc(w->numel, sizeof(float));
                for (size_t j = 0; j < t->numel; j++) ones[j] = 1.0f;
                mt_param_copy_shard(w, t->local_shape, t->start, mark, ones, false);
                for (size_t j = 0; j < w->numel; j++) cover[w->offset + j] += mark[j] != 0.0f;
                free(want);
                free(ones);
                free(mark);
            }
            mt_model_destroy(m);
        }
        /* each element once per replica: TP-replicated tensors on every TP rank, dense
         * ones on every EP x ETP position, experts on every TP position */
        for (int i = 0; i < mt_model_num_tensors(whole); i++) {
            const struct mt_param_info *w = mt_model_tensor(whole, i);
            int replicas = w->expert ? tp : w->tp_replicated ? ranks : ep * etp;
            for (size_t j = 0; j < w->numel; j++) assert_int_equal(cover[w->offset + j], replicas);
        }
        free(cover);
    }
    mt_model_destroy(whole);
}

static void test_counts_and_bias(void **state)
{
    (void)state;
    struct mt_config cfg;
    tiny_config(&cfg);
    strcpy(cfg.moe.router_score_function, "sigmoid");
    cfg.moe.router_enable_expert_bias = true;
    cfg.moe.router_bias_update_rate = 0.25;
    struct mt_model *m = make(&cfg);
    int32_t *tok = tokens_for(&cfg, 4);
    struct mt_model_stats st;
    struct mt_err err;
    const int E = cfg.moe.num_experts, N = B_ * cfg.training.seq_length;
    assert_int_equal(mt_model_num_moe_layers(m), 2);
    assert_int_equal(mt_model_forward_backward(m, tok, B_, 1.0f, &st, &err), MT_OK);
    long long before[8];
    memcpy(before, mt_model_expert_counts(m), sizeof(long long) * 2 * E);
    for (int l = 0; l < 2; l++) {
        long long sum = 0;
        for (int e = 0; e < E; e++) sum += before[l * E + e];
        assert_int_equal(sum, (long long)N * cfg.moe.router_topk);
    }
    assert_int_equal(mt_model_forward(m, tok, B_, &st, &err), MT_OK); /* eval: no counting */
    assert_memory_equal(before, mt_model_expert_counts(m), sizeof(long long) * 2 * E);
    size_t nb;
    float *bias = mt_model_buffers(m, &nb);
    assert_int_equal(nb, 2 * (size_t)E);
    mt_model_update_expert_bias(m, true, &err);
    for (int i = 0; i < 2 * E; i++) {
        double mean = (double)N * cfg.moe.router_topk / E;
        float want = before[i] < mean ? 0.25f : before[i] > mean ? -0.25f : 0.0f;
        assert_true(bias[i] == want);
    }
    mt_model_reset_expert_counts(m);
    for (int i = 0; i < 2 * E; i++) assert_int_equal(mt_model_expert_counts(m)[i], 0);
    free(tok);
    mt_model_destroy(m);
    /* without expert bias: no buffers, update is a no-op */
    tiny_config(&cfg);
    m = make(&cfg);
    assert_null(mt_model_buffers(m, &nb));
    assert_int_equal(nb, 0);
    mt_model_destroy(m);
}

static void test_force_balance(void **state)
{
    (void)state;
    struct mt_config cfg;
    tiny_config(&cfg);
    cfg.moe.router_force_load_balancing = true;
    struct mt_model *m = make(&cfg);
    int32_t *tok = tokens_for(&cfg, 5);
    struct mt_model_stats st;
    struct mt_err err;
    assert_int_equal(mt_model_forward_backward(m, tok, B_, 1.0f, &st, &err), MT_OK);
    const int E = cfg.moe.num_experts;
    const long long want = (long long)B_ * cfg.training.seq_length * cfg.moe.router_topk / E;
    for (int i = 0; i < 2 * E; i++) assert_int_equal(mt_model_expert_counts(m)[i], want);
    free(tok);
    mt_model_destroy(m);
}

static void test_scale_and_accumulate(void **state)
{
    (void)state;
    struct mt_config cfg;
    tiny_config(&cfg);
    struct mt_model *m = make(&cfg);
    int32_t *tok = tokens_for(&cfg, 6);
    struct mt_model_stats st;
    struct mt_err err;
    const size_t n = mt_model_num_params(m);
    float *g1 = fb_grads(m, tok, 1.0f, &st);
    float *gh = fb_grads(m, tok, 0.5f, &st);
    for (size_t i = 0; i < n; i++) assert_true(gh[i] == 0.5f * g1[i]);
    assert_int_equal(mt_model_forward_backward(m, tok, B_, 0.5f, &st, &err), MT_OK);
    /* accumulates (+=); BLAS adds into C block by block, so only up to rounding */
    for (size_t i = 0; i < n; i++)
        assert_true(fabsf(mt_model_grads(m)[i] - g1[i]) <= 1e-6f * fabsf(g1[i]) + 1e-12f);
    /* bad input */
    tok[3] = cfg.model.vocab_size;
    assert_int_equal(mt_model_forward(m, tok, B_, &st, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "token"));
    assert_int_equal(mt_model_forward(m, tok, B_ + 1, &st, &err), MT_EINVAL);
    /* ignored targets do not count */
    tiny_tokens(tok, B_, cfg.training.seq_length, cfg.model.vocab_size, 6);
    tok[cfg.training.seq_length] = -1; /* the last target of sequence 0 (never an input) */
    assert_int_equal(mt_model_forward(m, tok, B_, &st, &err), MT_OK);
    assert_int_equal(st.tokens, (long long)B_ * cfg.training.seq_length - 1);
    free(g1);
    free(gh);
    free(tok);
    mt_model_destroy(m);
}

static void test_memory_and_flops(void **state)
{
    (void)state;
    struct mt_config cfg;
    tiny_config(&cfg);
    struct mt_model *m = make(&cfg);
    struct mt_memory_report r;
    mt_model_memory(m, &r);
    assert_int_equal(r.params, sizeof(float) * mt_model_num_params(m));
    assert_int_equal(r.grads, r.params);
    assert_true(r.activations > r.params && r.scratch > 0);
    /* host expert biases and counts, 2 MoE layers of 4 experts; the step's scalars (the
     * norm's sum of squares, the loads, one forward's record: three sums and the dropped
     * count) in backend memory and their host copy; the token staging of one forward
     * (inputs, targets, shard inputs of B_ x 8 tokens) and its count of valid targets */
    const size_t acc = sizeof(double) + sizeof(int64_t) * 2 * 4 + 3 * sizeof(double) + sizeof(int64_t);
    assert_int_equal(r.device_buffers, acc);
    assert_int_equal(r.buffers, (sizeof(float) + sizeof(long long)) * 2 * 4 + 2 * acc +
                                    3 * sizeof(int32_t) * B_ * 8 + sizeof(long long));
    /* Megatron's formula for the tiny config: 1 dense + 2 MoE layers, T = 8 */
    const double H = 16, Q = 24, KV = 12, T = 8, V = 23;
    double mlp = H * (20 * 3.0 * 1 + (12 * 2 * 3.0 + 10 * 3.0) * 2);
    double attn = 3 * (H * (Q + 2 * KV) + Q * T + Q * H);
    assert_true(fabs(mt_model_flops_per_token(m) - 6 * (mlp + attn + H * V)) < 1e-6);
    mt_model_destroy(m);
}

/* ---- &cuda_graph impl = 'full_iteration' on a recording graph layer: the CPU backend
 * runs every op, a table of (key, signature) stands for the graphs held */
static struct {
    uint64_t key, sig;
    bool held, open;
    struct mt_graph_stats st;
} fake;

static int fake_begin(void *ctx, uint64_t key, uint64_t sig, bool capture, bool *replayed,
                      struct mt_err *err)
{
    (void)ctx, (void)err;
    *replayed = fake.held && fake.key == key && fake.sig == sig;
    if (*replayed) {
        fake.st.replays++;
        return MT_OK;
    }
    if (fake.held && fake.key == key) fake.st.recaptures++;
    if (capture) {
        fake.key = key, fake.sig = sig, fake.open = true;
        fake.held = false;
    }
    return MT_OK;
}

static int fake_end(void *ctx, struct mt_err *err)
{
    (void)ctx, (void)err;
    if (fake.open) fake.held = true, fake.st.captures++;
    fake.open = false;
    return MT_OK;
}

static void fake_stats(void *ctx, struct mt_graph_stats *out) { (void)ctx, *out = fake.st; }
static void fake_reset(void *ctx) { (void)ctx, fake.held = false; }
static const struct mt_graph_ops fake_graph = {fake_begin, fake_end, fake_stats, fake_reset};

/* One step's micro-batches as the trainer runs them under full_iteration; whether the
 * iteration ran (true) or its graph was replayed. */
static bool full_step(struct mt_model *m, const int32_t *tok, int B, int nmb)
{
    struct mt_err err;
    for (int i = 0; i < nmb; i++) assert_int_equal(mt_model_stage_tokens(m, tok, B, &err), MT_OK);
    bool run;
    assert_int_equal(mt_model_iteration_begin(m, (uint64_t)nmb << 32 | (uint64_t)B, &run, &err), MT_OK);
    for (int i = 0; run && i < nmb; i++)
        assert_int_equal(mt_model_forward_backward(m, NULL, B, 1.0f / (float)nmb, NULL, &err), MT_OK);
    assert_int_equal(mt_model_iteration_end(m, &err), MT_OK);
    struct mt_model_stats st[4];
    int n;
    assert_int_equal(mt_model_read_stats(m, st, 4, &n, NULL, &err), MT_OK);
    assert_int_equal(n, nmb);
    return run;
}

/* A replay only where nothing the iteration addresses has changed: a new allocation of
 * the step's scalars and token staging, or another micro-batch size or count, is
 * captured again, never replayed; forwards take the staged micro-batches and no others. */
static void test_full_iteration_signature(void **state)
{
    (void)state;
    struct mt_config cfg;
    tiny_config(&cfg);
    cfg.moe.expert_capacity_factor = 1.0;
    cfg.moe.pad_expert_input_to_capacity = true;
    strcpy(cfg.cuda_graph.impl, "full_iteration");
    struct mt_kernels k = *mt_kernels_cpu();
    k.graph = &fake_graph;
    k.name = "cuda"; /* graphs are accepted by the backend's name; the ops are the CPU's */
    struct mt_model *m;
    struct mt_err err;
    int rc = mt_model_create(&cfg, &k, B_, NULL, &m, &err);
    if (rc != MT_OK) printf("# %s\n", err.msg);
    assert_int_equal(rc, MT_OK);
    mt_model_init(m, 42);
    assert_int_equal(mt_model_defer_stats(m, 2, &err), MT_OK);
    int32_t *tok = tokens_for(&cfg, 5);
    assert_true(full_step(m, tok, B_, 2)); /* warm-up: eager */
    mt_model_set_graph_capture(m, true);
    assert_true(full_step(m, tok, B_, 2)); /* captured */
    assert_false(full_step(m, tok, B_, 2)); /* replayed */
    assert_false(full_step(m, tok, B_, 2));
    assert_true(full_step(m, tok, 1, 2));  /* another micro-batch size */
    assert_true(full_step(m, tok, 1, 1));  /* another count */
    assert_false(full_step(m, tok, 1, 1));
    /* the step's scalars and token staging allocated again, for 3 forwards */
    assert_int_equal(mt_model_defer_stats(m, 3, &err), MT_OK);
    assert_true(full_step(m, tok, 1, 1));
    assert_false(full_step(m, tok, 1, 1));
    assert_int_equal(fake.st.captures, 4);
    assert_int_equal(fake.st.recaptures, 3);
    assert_int_equal(fake.st.replays, 4);
    /* the forwards and the staging agree, or fail */
    assert_int_equal(mt_model_forward_backward(m, NULL, B_, 1.0f, NULL, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "none staged"));
    assert_int_equal(mt_model_stage_tokens(m, tok, B_, &err), MT_OK);
    assert_int_equal(mt_model_forward_backward(m, tok, B_, 1.0f, NULL, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "staged micro-batches wait"));
    assert_int_equal(mt_model_forward_backward(m, NULL, 1, 1.0f, NULL, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "on the staged one of 2 sequences"));
    free(tok);
    mt_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_config_rejections),
        cmocka_unit_test(test_tensor_table),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_sharded_init),
        cmocka_unit_test(test_counts_and_bias),
        cmocka_unit_test(test_force_balance),
        cmocka_unit_test(test_scale_and_accumulate),
        cmocka_unit_test(test_memory_and_flops),
        cmocka_unit_test(test_full_iteration_signature),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

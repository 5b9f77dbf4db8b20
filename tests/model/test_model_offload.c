/* Activation offloading (&recompute fine_grained_activation_offloading): on the guard
 * backend, which checks the copy stream's order (a tensor touched before its copy was
 * waited for aborts), every module alone, all five, and all five with selective
 * recompute give the losses, gradients and expert loads of the CPU backend keeping
 * everything, bit for bit, in fp32 and in bf16 storage; the memory is what the report
 * says, and the copies move its bytes.
 *
 * The runs are those of a pipeline stage holding two micro-batches (two slots, each
 * with its host block: forward A, forward B, backward A, backward B), so B's forward
 * overwrites the device buffer A's forward left, and the buffer is filled with NaN
 * before each backward: a backward that read anything it did not copy back would
 * differ. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/model_internal.h"
#include "tests/model/tiny_config.h"

#define B_ 2

struct setting {
    const char *offload[MT_OFFLOAD_MODULES];
    const char *recompute[MT_RECOMPUTE_MODULES]; /* selective, or none */
};

static const struct setting settings[] = {
    {{"attn_norm"}, {NULL}},
    {{"qkv_linear"}, {NULL}},
    {{"core_attn"}, {NULL}},
    {{"attn_proj"}, {NULL}},
    {{"mlp_norm"}, {NULL}},
    {{"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm"}, {NULL}},
    {{"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm"},
     {"core_attn", "layernorm", "moe_act"}},
};
#define NSETTINGS (sizeof settings / sizeof *settings)

static void apply(struct mt_config *c, const struct setting *s)
{
    c->recompute.fine_grained_activation_offloading = true;
    c->recompute.offload_modules_len = 0;
    for (int i = 0; i < MT_OFFLOAD_MODULES && s->offload[i]; i++)
        strcpy(c->recompute.offload_modules[c->recompute.offload_modules_len++], s->offload[i]);
    c->recompute.modules_len = 0;
    if (!s->recompute[0]) return;
    strcpy(c->recompute.granularity, "selective");
    for (int i = 0; i < MT_RECOMPUTE_MODULES && s->recompute[i]; i++)
        strcpy(c->recompute.modules[c->recompute.modules_len++], s->recompute[i]);
}

static void describe(char *buf, size_t n, const struct setting *s, bool bf16)
{
    int at = snprintf(buf, n, "%s offload", bf16 ? "bf16" : "fp32");
    for (int i = 0; i < MT_OFFLOAD_MODULES && s->offload[i]; i++)
        at += snprintf(buf + at, n - (size_t)at, " %s", s->offload[i]);
    for (int i = 0; i < MT_RECOMPUTE_MODULES && s->recompute[i]; i++)
        at += snprintf(buf + at, n - (size_t)at, "%s%s", i ? " " : ", recompute ", s->recompute[i]);
}

/* One stage of the whole model with two slots on backend k. */
static struct mt_model *make(const struct mt_config *cfg, const struct mt_kernels *k)
{
    struct mt_model *m;
    struct mt_err err;
    int rc = mt_model_create(cfg, k, B_, NULL, &m, &err);
    if (rc == MT_OK) {
        const int l0 = 0, l1 = cfg->model.num_layers;
        rc = mt_model_set_stage(m, 1, &l0, &l1, true, true, 2, &err);
    }
    if (rc != MT_OK) print_error("%s\n", err.msg);
    assert_int_equal(rc, MT_OK);
    return m;
}

struct result {
    struct mt_model_stats fwd[2], bwd[2];
    float *grads;
    long long *counts;
};

/* Fills the offload buffer with NaN, once the copy stream's work is waited for (the
 * guard refuses a memset over a copy in flight, as a device would race). */
static void poison(struct mt_model *m)
{
    const struct mt_kernel_ops *o = &m->k->op;
    void *ev = o->event_create(m->k->ctx);
    o->event_record(m->k->ctx, ev, MT_STREAM_COPY);
    o->event_wait(m->k->ctx, MT_STREAM_COMPUTE, ev);
    o->event_destroy(m->k->ctx, ev);
    for (int h = 0; h < 2; h++) o->memset(m->k->ctx, m->off.mem[h], 0xff, m->off.half);
}

/* Forward A and B, backward A and B (the offload buffer poisoned before each backward). */
static void train(struct mt_model *m, struct result *r)
{
    struct mt_err err;
    const struct mt_config *c = &m->cfg;
    const int T = c->training.seq_length;
    int32_t tok[2][B_ * 64];
    tiny_tokens(tok[0], B_, T, c->model.vocab_size, 7);
    tiny_tokens(tok[1], B_, T, c->model.vocab_size, 8);
    mt_model_init(m, 42);
    mt_model_zero_grad(m);
    for (int s = 0; s < 2; s++)
        assert_int_equal(mt_model_stage_forward(m, 0, s, tok[s], B_, NULL, NULL, true, 0.5f,
                                                &r->fwd[s], &err),
                         MT_OK);
    for (int s = 0; s < 2; s++) {
        if (m->off.mem[0]) poison(m);
        assert_int_equal(mt_model_stage_backward(m, 0, s, NULL, NULL, &r->bwd[s], &err), MT_OK);
    }
    const size_t n = mt_model_num_params(m), E = (size_t)m->nmoe * (size_t)m->E;
    r->grads = malloc(sizeof(float) * n);
    r->counts = malloc(sizeof(long long) * E);
    m->k->op.copy(m->k->ctx, r->grads, mt_model_grads(m), sizeof(float) * n);
    memcpy(r->counts, mt_model_expert_counts(m), sizeof(long long) * E);
}

static void test_bit_identical(void **state)
{
    (void)state;
    for (int bf = 0; bf < 2; bf++) {
        struct mt_config cfg;
        tiny_config(&cfg);
        if (bf) strcpy(cfg.precision.params_dtype, "bf16");
        struct mt_model *ref = make(&cfg, mt_kernels_cpu());
        struct result want;
        train(ref, &want);
        assert_null(ref->off.mem[0]);
        const size_t n = mt_model_num_params(ref), E = (size_t)ref->nmoe * (size_t)ref->E;
        for (size_t i = 0; i < NSETTINGS; i++) {
            char name[256];
            describe(name, sizeof name, &settings[i], bf);
            struct mt_config c = cfg;
            apply(&c, &settings[i]);
            struct mt_model *m = make(&c, mt_kernels_guard());
            struct result got;
            train(m, &got);
            bool same = m->off.mem[0] != NULL;
            for (int s = 0; s < 2; s++) {
                const struct mt_model_stats *a = &got.fwd[s], *b = &want.fwd[s];
                same = same && memcmp(&a->lm_loss, &b->lm_loss, sizeof(double)) == 0 &&
                       memcmp(&a->aux_loss, &b->aux_loss, sizeof(double)) == 0 &&
                       memcmp(&a->z_loss, &b->z_loss, sizeof(double)) == 0 &&
                       a->tokens == b->tokens && a->dropped_tokens == b->dropped_tokens;
                /* each micro-batch's forward copies its layers' tensors out, its
                 * backward copies them back */
                same = same && a->offload_d2h_bytes == (long long)m->off.mb_bytes &&
                       got.bwd[s].offload_h2d_bytes == (long long)m->off.mb_bytes;
            }
            size_t diff = 0;
            for (size_t j = 0; j < n; j++)
                diff += memcmp(&got.grads[j], &want.grads[j], sizeof(float)) != 0;
            same = same && diff == 0 &&
                   memcmp(got.counts, want.counts, sizeof(long long) * E) == 0;
            if (!same)
                print_error("%s: %zu of %zu gradients differ, lm loss %.17g vs %.17g, copied "
                            "%lld out and %lld back of %zu bytes\n",
                            name, diff, n, got.fwd[0].lm_loss, want.fwd[0].lm_loss,
                            got.fwd[0].offload_d2h_bytes, got.bwd[0].offload_h2d_bytes,
                            m->off.mb_bytes);
            else
                print_message("%s: bit-identical (%zu bytes each way per micro-batch)\n", name,
                              m->off.mb_bytes);
            assert_true(same);
            free(got.grads);
            free(got.counts);
            mt_model_destroy(m);
        }
        free(want.grads);
        free(want.counts);
        mt_model_destroy(ref);
    }
}

/* The device memory a setting allocates is what mt_model_memory reports (the plan
 * backend counts it); the pinned host blocks hold each slot's offloaded bytes, which
 * the slots' activations give up, and the two-layer buffer is smaller than that. */
static void test_memory(void **state)
{
    (void)state;
    for (int bf = 0; bf < 2; bf++) {
        struct mt_config cfg;
        tiny_config(&cfg);
        if (bf) strcpy(cfg.precision.params_dtype, "bf16");
        struct mt_kernels *k = mt_kernels_plan_create();
        struct mt_model *ref = make(&cfg, k);
        struct mt_memory_report none;
        mt_model_memory(ref, &none);
        assert_int_equal(none.offload + none.offload_host + none.offload_per_mb, 0);
        for (size_t i = 0; i < NSETTINGS; i++) {
            struct mt_config c = cfg;
            apply(&c, &settings[i]);
            const size_t before = mt_kernels_plan_live(k);
            struct mt_model *m = make(&c, k);
            struct mt_memory_report r;
            mt_model_memory(m, &r);
            assert_int_equal(mt_kernels_plan_live(k) - before,
                             r.params + r.grads + r.working_copy + r.activations + r.recompute +
                                 r.scratch + r.device_buffers + r.offload);
            char name[256];
            describe(name, sizeof name, &settings[i], bf);
            print_message("%s: activations %zu + offload buffer %zu, without %zu; pinned %zu\n",
                          name, r.activations, r.offload, none.activations, r.offload_host);
            assert_int_equal(r.offload_host, 2 * r.offload_per_mb);
            assert_true(r.offload > 0 && r.offload < r.offload_host);
            if (!settings[i].recompute[0])
                assert_int_equal(none.activations - r.activations, r.offload_host);
            mt_model_destroy(m);
        }
        mt_model_destroy(ref);
        mt_kernels_plan_destroy(k);
    }
}

/* The CPU backend refuses it, naming the way that works there. */
static void test_cpu_refuses(void **state)
{
    (void)state;
    struct mt_config c;
    tiny_config(&c);
    apply(&c, &settings[2]);
    struct mt_model *m = NULL;
    struct mt_err err;
    assert_int_equal(mt_model_create(&c, mt_kernels_cpu(), B_, NULL, &m, &err), MT_EUNSUPPORTED);
    assert_null(m);
    assert_non_null(strstr(err.msg, "offloading needs a GPU backend; on the CPU backend use &recompute"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bit_identical),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_cpu_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Activation recompute (&recompute): every setting gives the losses, gradients and
 * expert loads of a model that keeps everything, bit for bit, in fp32 and in bf16
 * storage; the setting's memory is what the report says, and smaller.
 *
 * The runs are those of a pipeline stage holding two micro-batches (two activation
 * slots: forward A, forward B, backward A, backward B), so the forward of B overwrites
 * what A's forward left in the shared recompute buffer, and the buffer is filled with
 * NaN before each backward: a backward that read anything it did not rebuild would
 * differ. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/model/two_slots.h"

#define B_ TWO_SLOTS_B

struct setting {
    const char *granularity, *method;
    int num_layers;
    const char *modules[MT_RECOMPUTE_MODULES];
};

/* tiny_config: layers 0 and 2 MoE with a shared expert, layer 1 dense */
static const struct setting settings[] = {
    {"selective", "none", 0, {"core_attn"}},
    {"selective", "none", 0, {"layernorm"}},
    {"selective", "none", 0, {"mlp"}},
    {"selective", "none", 0, {"moe_act"}},
    {"selective", "none", 0, {"shared_experts"}},
    {"selective", "none", 0, {"moe"}},
    {"selective", "none", 0, {"core_attn", "layernorm", "mlp", "moe_act", "shared_experts"}},
    {"selective", "none", 0, {"layernorm", "moe", "mlp"}},
    {"full", "uniform", 1, {NULL}},
    {"full", "uniform", 2, {NULL}},
    {"full", "uniform", 3, {NULL}},
    {"full", "block", 1, {NULL}},
    {"full", "block", 2, {NULL}},
};
#define NSETTINGS (sizeof settings / sizeof *settings)

static void apply(struct mt_config *c, const struct setting *s)
{
    strcpy(c->recompute.granularity, s->granularity);
    strcpy(c->recompute.method, s->method);
    c->recompute.num_layers = s->num_layers;
    c->recompute.modules_len = 0;
    for (int i = 0; i < MT_RECOMPUTE_MODULES && s->modules[i]; i++)
        strcpy(c->recompute.modules[c->recompute.modules_len++], s->modules[i]);
}

static void describe(char *buf, size_t n, const struct setting *s, bool bf16)
{
    int at = snprintf(buf, n, "%s %s %s %d", bf16 ? "bf16" : "fp32", s->granularity, s->method,
                      s->num_layers);
    for (int i = 0; i < MT_RECOMPUTE_MODULES && s->modules[i]; i++)
        at += snprintf(buf + at, n - (size_t)at, " %s", s->modules[i]);
}

/* The recompute buffer filled with NaN (before each backward). */
static void poison(struct mt_model *m)
{
    if (m->rc_mem) m->k->op.memset(m->k->ctx, m->rc_mem, 0xff, m->rc_bytes);
}

/* One process without stages: mt_model_forward_backward's statistics (forward and
 * backward in one call: a rebuild must not count twice) and gradients. */
static void fb_same(const struct mt_config *ref_cfg, const struct mt_config *cfg, const char *name)
{
    struct mt_model *m[2];
    struct mt_model_stats st[2];
    struct mt_err err;
    int32_t tok[B_ * 64];
    tiny_tokens(tok, B_, cfg->training.seq_length, cfg->model.vocab_size, 9);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(mt_model_create(i ? cfg : ref_cfg, mt_kernels_cpu(), B_, NULL, &m[i], &err),
                         MT_OK);
        mt_model_init(m[i], 42);
        mt_model_zero_grad(m[i]);
        assert_int_equal(mt_model_forward_backward(m[i], tok, B_, 1.0f, &st[i], &err), MT_OK);
    }
    const size_t n = mt_model_num_params(m[0]);
    const bool same = memcmp(&st[0], &st[1], sizeof st[0]) == 0 &&
                      memcmp(mt_model_grads(m[0]), mt_model_grads(m[1]), sizeof(float) * n) == 0;
    if (!same)
        print_error("%s, one process: aux %.17g vs %.17g, z %.17g vs %.17g, dropped %lld vs "
                    "%lld, or the gradients differ\n",
                    name, st[1].aux_loss, st[0].aux_loss, st[1].z_loss, st[0].z_loss,
                    st[1].dropped_tokens, st[0].dropped_tokens);
    assert_true(same);
    mt_model_destroy(m[0]);
    mt_model_destroy(m[1]);
}

static void test_bit_identical(void **state)
{
    (void)state;
    for (int bf = 0; bf < 2; bf++) {
        struct mt_config cfg;
        tiny_config(&cfg);
        if (bf) strcpy(cfg.precision.params_dtype, "bf16");
        struct mt_model *ref = two_slots_model(&cfg, mt_kernels_cpu());
        struct two_slots_result want;
        two_slots_train(ref, poison, &want);
        assert_null(ref->rc_mem);
        for (size_t i = 0; i < NSETTINGS; i++) {
            char name[256];
            describe(name, sizeof name, &settings[i], bf);
            struct mt_config c = cfg;
            apply(&c, &settings[i]);
            struct mt_model *m = two_slots_model(&c, mt_kernels_cpu());
            struct two_slots_result got;
            two_slots_train(m, poison, &got);
            size_t diff = 0;
            const bool same = m->rc_mem != NULL && two_slots_same(m, &got, &want, &diff);
            if (!same)
                print_error("%s: %zu of %zu gradients differ, lm loss %.17g vs %.17g, aux %.17g "
                            "vs %.17g, buffer %zu bytes\n",
                            name, diff, mt_model_num_params(m), got.fwd[0].lm_loss,
                            want.fwd[0].lm_loss, got.fwd[0].aux_loss, want.fwd[0].aux_loss,
                            m->rc_bytes);
            else
                print_message("%s: bit-identical (recompute buffer %zu bytes)\n", name,
                              m->rc_bytes);
            assert_true(same);
            fb_same(&cfg, &c, name);
            two_slots_free(&got);
            mt_model_destroy(m);
        }
        two_slots_free(&want);
        mt_model_destroy(ref);
    }
}

/* The memory a setting allocates is what mt_model_memory reports, category by
 * category (the plan backend counts it), and the activations of the two slots plus
 * the recompute buffer are less than the activations without recompute. */
static void test_memory(void **state)
{
    (void)state;
    for (int bf = 0; bf < 2; bf++) {
        struct mt_config cfg;
        tiny_config(&cfg);
        if (bf) strcpy(cfg.precision.params_dtype, "bf16");
        struct mt_memory_report none;
        for (size_t i = 0; i <= NSETTINGS; i++) {
            struct mt_config c = cfg;
            if (i > 0) apply(&c, &settings[i - 1]);
            struct mt_kernels *k = mt_kernels_plan_create();
            struct mt_model *m = two_slots_model(&c, k);
            struct mt_memory_report r;
            mt_model_memory(m, &r);
            const size_t live = mt_kernels_plan_live(k);
            assert_int_equal(live, r.params + r.grads + r.working_copy + r.activations +
                                       r.recompute + r.scratch + r.device_buffers);
            if (i == 0) {
                none = r;
                assert_int_equal(r.recompute, 0);
            } else {
                char name[256];
                describe(name, sizeof name, &settings[i - 1], bf);
                print_message("%s: activations %zu + recompute %zu, without %zu\n", name,
                              r.activations, r.recompute, none.activations);
                assert_true(r.recompute > 0);
                assert_true(r.activations + r.recompute < none.activations);
                assert_int_equal(r.scratch, none.scratch);
            }
            mt_model_destroy(m);
            mt_kernels_plan_destroy(k);
        }
    }
}

/* The saving of core_attn, exactly: each layer of each slot leaves its attention
 * output (fp32), logsumexp (fp32) and, in bf16 storage, the output's bf16 copy to the
 * buffer, which holds them for one layer. */
static void test_core_attn_bytes(void **state)
{
    (void)state;
    for (int bf = 0; bf < 2; bf++) {
        struct mt_config cfg;
        tiny_config(&cfg);
        if (bf) strcpy(cfg.precision.params_dtype, "bf16");
        struct mt_kernels *k = mt_kernels_plan_create();
        struct mt_model *ref = two_slots_model(&cfg, k);
        struct mt_config c = cfg;
        apply(&c, &settings[0]);
        struct mt_model *m = two_slots_model(&c, k);
        struct mt_memory_report a, b;
        mt_model_memory(ref, &a);
        mt_model_memory(m, &b);
        const size_t N = (size_t)B_ * c.training.seq_length, heads = (size_t)c.model.num_attention_heads;
        const size_t Q = heads * (size_t)c.model.kv_channels;
#define UP(x) (((x) + 63) / 64 * 64)
        const size_t layer = UP(4 * N * heads) + UP(4 * N * Q) + (bf ? UP(2 * N * Q) : 0);
#undef UP
        assert_int_equal(b.recompute, layer);
        assert_int_equal(a.activations - b.activations, 2 * (size_t)c.model.num_layers * layer);
        mt_model_destroy(m);
        mt_model_destroy(ref);
        mt_kernels_plan_destroy(k);
    }
}

/* A configuration filled by hand without the groups of full recompute is refused. */
static void test_rejects(void **state)
{
    (void)state;
    struct mt_config c;
    tiny_config(&c);
    strcpy(c.recompute.granularity, "full");
    strcpy(c.recompute.method, "uniform");
    struct mt_model *m = NULL;
    struct mt_err err;
    assert_int_equal(mt_model_create(&c, mt_kernels_cpu(), B_, NULL, &m, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "num_layers >= 1"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bit_identical),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_core_attn_bytes),
        cmocka_unit_test(test_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

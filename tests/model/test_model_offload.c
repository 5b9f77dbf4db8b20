/* Activation offloading (&recompute fine_grained_activation_offloading): on the guard
 * backend, which checks the copy stream's order (a tensor touched before its copy was
 * waited for aborts), every module alone, all seven, all seven with selective
 * recompute, and the experts' modules with the MoE block recomputed give the losses, gradients and expert loads of the CPU backend keeping
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

#include "tests/model/two_slots.h"

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
    {{"expert_fc1"}, {NULL}},
    {{"moe_act"}, {NULL}},
    {{"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"},
     {NULL}},
    {{"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"},
     {"core_attn", "layernorm", "moe_act"}},
    /* moe rebuilds the experts' tensors: only the attention side is offloaded */
    {{"core_attn", "expert_fc1", "moe_act"}, {"moe"}},
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

/* Fills the offload buffer with NaN, once the copy stream's work is waited for (the
 * guard refuses a memset over a copy in flight, as a device would race). */
static void poison(struct mt_model *m)
{
    if (!m->off.mem[0]) return;
    const struct mt_kernel_ops *o = &m->k->op;
    void *ev = o->event_create(m->k->ctx);
    o->event_record(m->k->ctx, ev, MT_STREAM_COPY);
    o->event_wait(m->k->ctx, MT_STREAM_COMPUTE, ev);
    o->event_destroy(m->k->ctx, ev);
    for (int h = 0; h < 2; h++) o->memset(m->k->ctx, m->off.mem[h], 0xff, m->off.half);
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
        assert_null(ref->off.mem[0]);
        for (size_t i = 0; i < NSETTINGS; i++) {
            char name[256];
            describe(name, sizeof name, &settings[i], bf);
            struct mt_config c = cfg;
            apply(&c, &settings[i]);
            struct mt_model *m = two_slots_model(&c, mt_kernels_guard());
            struct two_slots_result got;
            two_slots_train(m, poison, &got);
            size_t diff = 0;
            bool same = m->off.mem[0] != NULL && two_slots_same(m, &got, &want, &diff);
            /* each micro-batch's forward copies its layers' tensors out, its backward
             * copies them back */
            for (int s = 0; s < 2; s++)
                same = same && got.fwd[s].offload_d2h_bytes == (long long)m->off.mb_bytes &&
                       got.bwd[s].offload_h2d_bytes == (long long)m->off.mb_bytes;
            if (!same)
                print_error("%s: %zu of %zu gradients differ, lm loss %.17g vs %.17g, copied "
                            "%lld out and %lld back of %zu bytes\n",
                            name, diff, mt_model_num_params(m), got.fwd[0].lm_loss,
                            want.fwd[0].lm_loss, got.fwd[0].offload_d2h_bytes,
                            got.bwd[0].offload_h2d_bytes, m->off.mb_bytes);
            else
                print_message("%s: bit-identical (%zu bytes each way per micro-batch)\n", name,
                              m->off.mb_bytes);
            assert_true(same);
            two_slots_free(&got);
            mt_model_destroy(m);
        }
        two_slots_free(&want);
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
        struct mt_model *ref = two_slots_model(&cfg, k);
        struct mt_memory_report none;
        mt_model_memory(ref, &none);
        assert_int_equal(none.offload + none.offload_host + none.offload_per_mb, 0);
        for (size_t i = 0; i < NSETTINGS; i++) {
            struct mt_config c = cfg;
            apply(&c, &settings[i]);
            const size_t before = mt_kernels_plan_live(k);
            struct mt_model *m = two_slots_model(&c, k);
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
    assert_int_equal(mt_model_create(&c, mt_kernels_cpu(), TWO_SLOTS_B, NULL, &m, &err), MT_EUNSUPPORTED);
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

/* Whole-model gradient check: the hand-written backward of every parameter tensor
 * against central finite differences of the total loss (lm + aux + z), in fp32.
 *
 * Per tensor we check the 3 elements with the largest analytic gradient plus 5
 * pseudo-random ones (tests/kernels/fd.h, norm-based relative error). Elements whose
 * perturbation changes a routing decision (top-k set or a capacity drop) are
 * skipped: there the loss is not differentiable.
 *
 * Bound: the loss (~3) carries fp32 roundoff of ~1e-7 relative, ~3e-7 absolute; with
 * h = 1e-3 the central difference has noise ~3e-4 absolute against checked gradients
 * of 2e-2..9e-1 (1e-3..1e-2 relative at worst, far less on the norm), and a
 * truncation error ~h^2 |L'''| ~1e-6 at init_method_std 0.3. A larger h flips too
 * many routing decisions in a model this small. Observed worst ~3e-3; bound 1e-2;
 * a wrong sign, scale or transposition anywhere gives O(1). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/model_internal.h"
#include "tests/kernels/fd.h"
#include "tests/model/tiny_config.h"

#define FD_H 1e-3f
#define FD_TOL 1e-2

struct model_st {
    struct mt_model *m;
    int32_t *tok;
    int B;
    int32_t **idx0, **slot0; /* routing of the unperturbed model, per layer */
};

static double model_loss(void *p)
{
    struct model_st *s = p;
    struct mt_model_stats st;
    struct mt_err err;
    assert_int_equal(mt_model_forward(s->m, s->tok, s->B, &st, &err), MT_OK);
    const size_t nk = (size_t)s->B * s->m->T * s->m->topk;
    for (int l = 0; l < s->m->L; l++) {
        if (!s->idx0[l]) continue;
        if (memcmp(s->idx0[l], s->m->la[l].topk_idx, sizeof(int32_t) * nk) != 0 ||
            memcmp(s->slot0[l], s->m->la[l].plan.slot_row, sizeof(int32_t) * nk) != 0)
            fd_unstable = 1;
    }
    return st.lm_loss + st.aux_loss + st.z_loss;
}

static void check_model(const struct mt_config *cfg, const char *what, bool expect_drops)
{
    struct mt_model *m;
    struct mt_err err;
    const int B = 2, T = cfg->training.seq_length;
    assert_int_equal(mt_model_create(cfg, mt_kernels_cpu(), B, NULL, &m, &err), MT_OK);
    mt_model_init(m, 7);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * (T + 1));
    tiny_tokens(tok, B, T, cfg->model.vocab_size, 3);
    mt_model_zero_grad(m);
    struct mt_model_stats st;
    assert_int_equal(mt_model_forward_backward(m, tok, B, 1.0f, &st, &err), MT_OK);
    printf("# %s: lm %.6f aux %.3e z %.3e tokens %lld dropped %lld\n", what, st.lm_loss,
           st.aux_loss, st.z_loss, st.tokens, st.dropped_tokens);
    if (cfg->moe.aux_loss_coeff > 0) assert_true(st.aux_loss > 0);
    if (cfg->moe.z_loss_coeff > 0) assert_true(st.z_loss > 0);
    assert_true(expect_drops ? st.dropped_tokens > 0 : st.dropped_tokens == 0);
    float *grad = malloc(sizeof(float) * m->nparams);
    memcpy(grad, m->grads, sizeof(float) * m->nparams);

    struct model_st s = {m, tok, B, calloc((size_t)m->L, sizeof(int32_t *)),
                         calloc((size_t)m->L, sizeof(int32_t *))};
    const size_t nk = (size_t)B * T * (m->topk > 0 ? m->topk : 1);
    for (int l = 0; l < m->L; l++) {
        if (m->moe_of_layer[l] < 0) continue;
        s.idx0[l] = malloc(sizeof(int32_t) * nk);
        s.slot0[l] = malloc(sizeof(int32_t) * nk);
        memcpy(s.idx0[l], m->la[l].topk_idx, sizeof(int32_t) * nk);
        memcpy(s.slot0[l], m->la[l].plan.slot_row, sizeof(int32_t) * nk);
    }
    double worst = 0;
    for (int i = 0; i < mt_model_num_tensors(m); i++) {
        const struct mt_param_info *t = mt_model_tensor(m, i);
        float *x = m->params + t->offset;
        const float *g = grad + t->offset;
        size_t idx[8], n = 0;
        for (int r = 0; r < 3; r++) { /* the largest gradients not yet taken */
            size_t best = 0;
            float bv = -1;
            for (size_t j = 0; j < t->numel; j++) {
                bool taken = false;
                for (size_t q = 0; q < n; q++) taken = taken || idx[q] == j;
                if (!taken && fabsf(g[j]) > bv) { bv = fabsf(g[j]); best = j; }
            }
            idx[n++] = best;
        }
        for (int r = 0; r < 5 && n < t->numel; r++) {
            size_t j = (size_t)mt_rng_below(0x3d, (uint64_t)i, (uint64_t)r, t->numel);
            bool taken = false;
            for (size_t q = 0; q < n; q++) taken = taken || idx[q] == j;
            if (!taken) idx[n++] = j;
        }
        int checked;
        double e = fd_rel_error_at(model_loss, &s, x, g, idx, n, FD_H, &checked);
        printf("# %-48s rel err %.2e (%d checked, |g|max %.2e)\n", t->name, e, checked,
               fabsf(g[idx[0]]));
        assert_true(checked >= (expect_drops ? 1 : 3));
        assert_true(e < FD_TOL);
        worst = e > worst ? e : worst;
    }
    printf("# %s: worst %.2e\n", what, worst);
    for (int l = 0; l < m->L; l++) {
        free(s.idx0[l]);
        free(s.slot0[l]);
    }
    free(s.idx0);
    free(s.slot0);
    free(grad);
    free(tok);
    mt_model_destroy(m);
}

static void test_dropless(void **state)
{
    (void)state;
    struct mt_config cfg;
    tiny_config(&cfg); /* aux + z loss, QK-norm, dense + MoE layers, shared expert */
    check_model(&cfg, "dropless softmax", false);
}

static void test_sigmoid_seq_aux_tied(void **state)
{
    (void)state;
    struct mt_config cfg;
    tiny_config(&cfg);
    strcpy(cfg.moe.router_score_function, "sigmoid");
    strcpy(cfg.moe.router_load_balancing_type, "seq_aux_loss");
    cfg.moe.router_topk_scaling_factor = 1.7;
    cfg.model.untie_embeddings_and_output_weights = false;
    cfg.model.qk_layernorm = false;
    check_model(&cfg, "sigmoid seq_aux tied", false);
}

static void test_capacity(void **state)
{
    (void)state;
    struct mt_config cfg;
    tiny_config(&cfg);
    cfg.moe.expert_capacity_factor = 0.75; /* capacity ceil(16*2/4*0.75) = 6 of 8 average */
    cfg.moe.pad_expert_input_to_capacity = true;
    check_model(&cfg, "capacity probs padded", true);
    strcpy(cfg.moe.token_drop_policy, "position");
    cfg.moe.pad_expert_input_to_capacity = false;
    cfg.moe.router_pre_softmax = true;
    check_model(&cfg, "capacity position pre_softmax", true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dropless),
        cmocka_unit_test(test_sigmoid_seq_aux_tied),
        cmocka_unit_test(test_capacity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

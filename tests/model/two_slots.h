/* The harness of the tests that change where activations live (recompute, offloading):
 * a pipeline stage of the whole model holding two micro-batches (two activation slots:
 * forward A, forward B, backward A, backward B), so that B's forward overwrites what
 * A's forward left in the buffers the slots share; a hook runs before each backward
 * (to poison those buffers). */
#ifndef MT_TESTS_TWO_SLOTS_H
#define MT_TESTS_TWO_SLOTS_H

#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "tests/model/tiny_config.h"

#define TWO_SLOTS_B 2

/* One stage of the whole model with two slots on backend k. */
static inline struct mt_model *two_slots_model(const struct mt_config *cfg, const struct mt_kernels *k)
{
    struct mt_model *m;
    struct mt_err err;
    int rc = mt_model_create(cfg, k, TWO_SLOTS_B, NULL, &m, &err);
    if (rc == MT_OK) {
        const int l0 = 0, l1 = cfg->model.num_layers;
        rc = mt_model_set_stage(m, 1, &l0, &l1, true, true, 2, &err);
    }
    if (rc != MT_OK) print_error("%s\n", err.msg);
    assert_int_equal(rc, MT_OK);
    return m;
}

struct two_slots_result {
    struct mt_model_stats fwd[2], bwd[2];
    float *grads;      /* (parameters) */
    long long *counts; /* (MoE layers x experts) */
};

/* Forward A and B, backward A and B, before_backward(m) before each backward. */
static inline void two_slots_train(struct mt_model *m, void (*before_backward)(struct mt_model *),
                                   struct two_slots_result *r)
{
    struct mt_err err;
    const struct mt_config *c = &m->cfg;
    const int T = c->training.seq_length, B = TWO_SLOTS_B;
    int32_t tok[2][TWO_SLOTS_B * 64];
    tiny_tokens(tok[0], B, T, c->model.vocab_size, 7);
    tiny_tokens(tok[1], B, T, c->model.vocab_size, 8);
    mt_model_init(m, 42);
    mt_model_zero_grad(m);
    for (int s = 0; s < 2; s++)
        assert_int_equal(mt_model_stage_forward(m, 0, s, tok[s], B, NULL, NULL, true, 0.5f,
                                                &r->fwd[s], &err),
                         MT_OK);
    for (int s = 0; s < 2; s++) {
        before_backward(m);
        assert_int_equal(mt_model_stage_backward(m, 0, s, NULL, NULL, &r->bwd[s], &err), MT_OK);
    }
    const size_t n = mt_model_num_params(m), E = (size_t)m->nmoe * (size_t)m->E;
    r->grads = malloc(sizeof(float) * n);
    r->counts = malloc(sizeof(long long) * E);
    m->k->op.copy(m->k->ctx, r->grads, mt_model_grads(m), sizeof(float) * n); /* backend memory */
    memcpy(r->counts, mt_model_expert_counts(m), sizeof(long long) * E);
}

/* Whether got equals want bit for bit (the forwards' losses, statistics, expert loads
 * and every gradient of m's size); *diff the gradients that differ. */
static inline bool two_slots_same(const struct mt_model *m, const struct two_slots_result *got,
                                  const struct two_slots_result *want, size_t *diff)
{
    const size_t n = mt_model_num_params(m), E = (size_t)m->nmoe * (size_t)m->E;
    bool same = true;
    for (int s = 0; s < 2; s++) {
        const struct mt_model_stats *a = &got->fwd[s], *b = &want->fwd[s];
        same = same && memcmp(&a->lm_loss, &b->lm_loss, sizeof(double)) == 0 &&
               memcmp(&a->aux_loss, &b->aux_loss, sizeof(double)) == 0 &&
               memcmp(&a->z_loss, &b->z_loss, sizeof(double)) == 0 && a->tokens == b->tokens &&
               a->dropped_tokens == b->dropped_tokens;
    }
    *diff = 0;
    for (size_t j = 0; j < n; j++) *diff += memcmp(&got->grads[j], &want->grads[j], sizeof(float)) != 0;
    return same && *diff == 0 && memcmp(got->counts, want->counts, sizeof(long long) * E) == 0;
}

static inline void two_slots_free(struct two_slots_result *r)
{
    free(r->grads);
    free(r->counts);
}

#endif

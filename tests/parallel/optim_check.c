/* optim_check NML [group%key=value ...]: the distributed optimizer against the plain
 * data-parallel one, under a launcher (tests/parallel/optim.sh runs it with 2 and 4
 * processes). One forward/backward of the model in the layout the namelist and the
 * world give, then the same update three ways: all-reduce (no ZeRO), ZeRO-1 with the
 * default bucket (one bucket here), and ZeRO-1 with 777-element buckets (many buckets,
 * cut through tensors, the group's slices cut through the buckets' ends). With DP = 2
 * the sum of two gradients is the same float in any order, so the three must give
 * bit-identical parameters and moments (exported from the slices), and norms within
 * 1e-12 (a sum of squares in double, grouped differently). ZeRO must hold less state.
 * Exits 0 when every check passed on every process (rank 0 prints "passed"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "runtime/comm.h"
#include "runtime/parallel.h"
#include "train/train.h"

static struct mt_err g_err;

#define CALL(x)                                                                               \
    do {                                                                                      \
        if ((x) != MT_OK) {                                                                   \
            fprintf(stderr, "optim_check: %s:%d: %s\n", __FILE__, __LINE__, g_err.msg);       \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

struct result {
    double norm;
    float *params, *m, *v;
};

/* One reduce + step + second step (moments matter) from the same gradients. */
static void update(struct mt_model *model, const struct mt_parallel *par, bool zero,
                   size_t bucket, const float *p0, const float *g0, struct result *r)
{
    const size_t n = mt_model_num_params(model);
    struct mt_optim *o;
    const struct mt_optim_opts opts = {.distributed = zero, .bucket_elems = bucket};
    CALL(mt_optim_create(model, mt_kernels_cpu(), par, &opts, &o, &g_err));
    memcpy(mt_model_params(model), p0, sizeof(float) * n);
    mt_model_params_updated(model);
    struct mt_config_optimizer c = {.lr = 1e-2, .weight_decay = 0.1, .adam_beta1 = 0.9,
                                    .adam_beta2 = 0.95, .adam_eps = 1e-8};
    for (int step = 1; step <= 2; step++) {
        memcpy(mt_model_grads(model), g0, sizeof(float) * n);
        CALL(mt_optim_reduce_grads(o, &r->norm, &g_err));
        CALL(mt_optim_step(o, &c, 1e-2, 0.5, step, &g_err));
    }
    r->params = malloc(sizeof(float) * n);
    r->m = malloc(sizeof(float) * n);
    r->v = malloc(sizeof(float) * n);
    memcpy(r->params, mt_model_params(model), sizeof(float) * n);
    CALL(mt_optim_export(o, r->m, r->v, &g_err));
    if (zero) {
        struct mt_optim *plain;
        CALL(mt_optim_create(model, mt_kernels_cpu(), par, NULL, &plain, &g_err));
        if (par->dp > 1 && !(mt_optim_memory(o) < mt_optim_memory(plain))) {
            fprintf(stderr, "optim_check: ZeRO holds %zu bytes, the plain optimizer %zu\n",
                    mt_optim_memory(o), mt_optim_memory(plain));
            exit(1);
        }
        mt_optim_destroy(plain);
    }
    /* an import of the exported moments gives them back */
    mt_optim_import(o, r->m, r->v);
    float *m2 = malloc(sizeof(float) * n), *v2 = malloc(sizeof(float) * n);
    CALL(mt_optim_export(o, m2, v2, &g_err));
    if (memcmp(m2, r->m, sizeof(float) * n) || memcmp(v2, r->v, sizeof(float) * n)) {
        fprintf(stderr, "optim_check: import then export changed the moments\n");
        exit(1);
    }
    free(m2);
    free(v2);
    mt_optim_destroy(o);
}

static int same(const char *what, const struct result *a, const struct result *b, size_t n)
{
    int bad = 0;
    if (fabs(a->norm - b->norm) > 1e-12 * a->norm) {
        fprintf(stderr, "optim_check: %s: norm %.17g vs %.17g\n", what, a->norm, b->norm);
        bad = 1;
    }
    if (memcmp(a->params, b->params, sizeof(float) * n) || memcmp(a->m, b->m, sizeof(float) * n) ||
        memcmp(a->v, b->v, sizeof(float) * n)) {
        fprintf(stderr, "optim_check: %s: parameters or moments differ\n", what);
        bad = 1;
    }
    return bad;
}

int main(int argc, char **argv)
{
    struct mt_world *w;
    CALL(mt_world_init(&w, 60.0, &g_err));
    struct mt_config *cfg = malloc(sizeof *cfg);
    mt_config_defaults(cfg);
    struct mt_layout layout;
    CALL(mt_config_load(cfg, 1, argv + 1, argc - 2, argv + 2, &g_err));
    CALL(mt_config_resolve(cfg, w->size, &layout, &g_err));
    struct mt_parallel *par;
    CALL(mt_parallel_init(w, cfg, &layout, NULL, &par, &g_err));
    const int B = cfg->training.micro_batch_size, T = cfg->training.seq_length;
    struct mt_model *model;
    CALL(mt_model_create(cfg, mt_kernels_cpu(), B, par, &model, &g_err));
    mt_model_init(model, 7);
    /* a different micro-batch per DP rank, the same one across a TP group */
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * (T + 1));
    unsigned x = 2654435761u * (unsigned)(par->dp_rank + 1);
    for (int i = 0; i < B * (T + 1); i++) {
        x = x * 1103515245u + 12345u;
        tok[i] = (int32_t)((x >> 16) % (unsigned)cfg->model.vocab_size);
    }
    mt_model_zero_grad(model);
    CALL(mt_model_forward_backward(model, tok, B, 1.0f, NULL, &g_err));
    const size_t n = mt_model_num_params(model);
    float *p0 = malloc(sizeof(float) * n), *g0 = malloc(sizeof(float) * n);
    memcpy(p0, mt_model_params(model), sizeof(float) * n);
    memcpy(g0, mt_model_grads(model), sizeof(float) * n);

    struct result plain, zero, zero_small;
    update(model, par, false, 0, p0, g0, &plain);
    update(model, par, true, 0, p0, g0, &zero);
    update(model, par, true, 777, p0, g0, &zero_small);
    int bad = same("ZeRO-1", &plain, &zero, n) | same("ZeRO-1, 777-element buckets", &plain,
                                                          &zero_small, n);
    CALL(mt_all_reduce(w->comm, &bad, 1, MT_DT_I32, MT_OP_MAX, &g_err));
    if (w->rank == 0 && !bad) printf("passed: %d processes, DP %d, expert DP %d, norm %.9g\n",
                                     w->size, par->dp, par->edp, plain.norm);
    mt_model_destroy(model);
    mt_parallel_destroy(par);
    mt_world_finalize(w);
    free(cfg);
    free(tok);
    free(p0);
    free(g0);
    free(plain.params); free(plain.m); free(plain.v);
    free(zero.params); free(zero.m); free(zero.v);
    free(zero_small.params); free(zero_small.m); free(zero_small.v);
    return bad;
}

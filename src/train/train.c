/* The single-process training loop. */
#include "train/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/data.h"
#include "kernels/kernels.h"
#include "model/model.h"

struct trainer {
    const struct mt_config *cfg;
    const struct mt_layout *layout;
    const struct mt_kernels *k;
    FILE *log;
    struct mt_model *model;
    struct mt_data *data;
    float *adam_m, *adam_v;       /* optimizer state, one value per parameter */
    int32_t *tokens;              /* (micro_batch, seq_length+1) */
    FILE *metrics;
    char *config_text;            /* resolved namelist, stored in checkpoints */
    struct mt_train_state st;
    int nonfinite_streak;
    /* log-interval accumulators */
    double acc_loss, acc_aux, acc_z, acc_gnorm, acc_ms;
    long long acc_iters, acc_dropped;
    long long *acc_counts;        /* [nmoe * num_experts] tokens per expert */
    size_t ncounts;
    double flops_per_token;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int load_batch(struct trainer *t, enum mt_split split, uint64_t first, int B,
                      struct mt_err *err)
{
    const int T1 = t->cfg->training.seq_length + 1;
    uint64_t avail = mt_data_num_samples(t->data, split);
    for (int b = 0; b < B; b++) {
        uint64_t idx = first + (uint64_t)b;
        if (avail == 0)
            return mt_err_set(err, MT_EINVAL,
                              "the %s split has no samples; adjust &data split",
                              split == MT_SPLIT_VALID ? "validation" : "training");
        /* a dataset that offers fewer samples than requested wraps around */
        MT_CHECK(mt_data_get(t->data, split, idx % avail, t->tokens + (size_t)b * T1, err));
    }
    return MT_OK;
}

/* ---- checkpoint view --------------------------------------------------- */

struct view_storage {
    const char **names;
    int *ndims;
    long long (*shapes)[4];
};

static int make_view(struct trainer *t, struct mt_ckpt_view *v, struct view_storage *vs,
                     struct mt_err *err)
{
    int n = mt_model_num_tensors(t->model);
    vs->names = calloc((size_t)n, sizeof *vs->names);
    vs->ndims = calloc((size_t)n, sizeof *vs->ndims);
    vs->shapes = calloc((size_t)n, sizeof *vs->shapes);
    if (!vs->names || !vs->ndims || !vs->shapes)
        return mt_err_set(err, MT_ENOMEM, "out of memory for the checkpoint table");
    for (int i = 0; i < n; i++) {
        const struct mt_param_info *p = mt_model_tensor(t->model, i);
        vs->names[i] = p->name;
        vs->ndims[i] = p->ndim;
        for (int d = 0; d < 4; d++) vs->shapes[i][d] = d < p->ndim ? p->shape[d] : 0;
    }
    v->ntensors = n;
    v->names = vs->names;
    v->ndims = vs->ndims;
    v->shapes = (const long long (*)[4])vs->shapes;
    v->nparams = mt_model_num_params(t->model);
    v->params = mt_model_params(t->model);
    v->adam_m = t->adam_m;
    v->adam_v = t->adam_v;
    v->buffers = mt_model_buffers(t->model, &v->nbuffers);
    return MT_OK;
}

static void free_view(struct view_storage *vs)
{
    free(vs->names);
    free(vs->ndims);
    free(vs->shapes);
}

static int save_checkpoint(struct trainer *t, struct mt_err *err)
{
    struct mt_ckpt_view v;
    struct view_storage vs = { 0 };
    int rc = make_view(t, &v, &vs, err);
    if (rc == MT_OK)
        rc = mt_ckpt_save(t->cfg->checkpoint.save, &v, &t->st, t->config_text,
                          t->cfg->checkpoint.keep_last, err);
    free_view(&vs);
    if (rc == MT_OK)
        fprintf(t->log, "saved checkpoint at iteration %lld to %s/iter_%07lld\n",
                t->st.iteration, t->cfg->checkpoint.save, t->st.iteration);
    return rc;
}

static int load_checkpoint(struct trainer *t, struct mt_err *err)
{
    struct mt_ckpt_view v;
    struct view_storage vs = { 0 };
    bool found = false;
    char where[4200] = "";
    int rc = make_view(t, &v, &vs, err);
    if (rc == MT_OK)
        rc = mt_ckpt_load(t->cfg->checkpoint.load, &v, &t->st, &found, where, sizeof where,
                          err);
    free_view(&vs);
    if (rc != MT_OK) return rc;
    if (found) {
        mt_model_params_updated(t->model);
        fprintf(t->log, "loaded checkpoint %s: iteration %lld, %lld samples consumed\n", where,
                t->st.iteration, t->st.consumed_samples);
    } else {
        fprintf(t->log, "no checkpoint in '%s' yet: starting from initialisation\n",
                t->cfg->checkpoint.load);
    }
    return MT_OK;
}

/* ---- optimizer step ---------------------------------------------------- */

static double grad_norm(struct trainer *t)
{
    const float *g = mt_model_grads(t->model);
    size_t n = mt_model_num_params(t->model);
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return sqrt(s);
}

static void optimizer_step(struct trainer *t, double lr, double clip_coeff)
{
    const struct mt_config_optimizer *o = &t->cfg->optimizer;
    float *p = mt_model_params(t->model);
    float *g = mt_model_grads(t->model);
    t->st.adam_step++;
    int n = mt_model_num_tensors(t->model);
    for (int i = 0; i < n; i++) {
        const struct mt_param_info *pi = mt_model_tensor(t->model, i);
        float wd = pi->no_weight_decay ? 0.0f : (float)o->weight_decay;
        t->k->op.adamw(t->k->ctx, p + pi->offset, g + pi->offset, t->adam_m + pi->offset,
                       t->adam_v + pi->offset, pi->numel, (float)lr, (float)o->adam_beta1,
                       (float)o->adam_beta2, (float)o->adam_eps, wd, (float)clip_coeff,
                       t->st.adam_step);
    }
    mt_model_params_updated(t->model);
}

/* ---- evaluation -------------------------------------------------------- */

static int evaluate(struct trainer *t, enum mt_split split, const char *label,
                    struct mt_err *err)
{
    const struct mt_config_training *tr = &t->cfg->training;
    const int mbs = tr->micro_batch_size, gbs = tr->global_batch_size;
    uint64_t avail = mt_data_num_samples(t->data, split);
    if (tr->eval_iters == 0 || avail == 0) return MT_OK;
    uint64_t base = split == MT_SPLIT_VALID
                        ? (uint64_t)t->st.eval_count * (uint64_t)tr->eval_iters * gbs
                        : 0;
    double sum = 0.0;
    long long tokens = 0;
    double t0 = now_ms();
    for (int it = 0; it < tr->eval_iters; it++) {
        for (int mb = 0; mb < gbs / mbs; mb++) {
            uint64_t first = base + (uint64_t)it * gbs + (uint64_t)mb * mbs;
            MT_CHECK(load_batch(t, split, first, mbs, err));
            struct mt_model_stats s = { 0 };
            MT_CHECK(mt_model_forward(t->model, t->tokens, mbs, &s, err));
            sum += s.lm_loss * (double)s.tokens;
            tokens += s.tokens;
        }
    }
    if (split == MT_SPLIT_VALID) t->st.eval_count++;
    double loss = tokens ? sum / (double)tokens : NAN;
    double ppl = exp(loss < 700 ? loss : 700);
    fprintf(t->log,
            "-----------------------------------------------------------------------------\n"
            " %s loss at iteration %lld | lm loss value: %.6E | lm loss PPL: %.6E | "
            "%.0f ms\n"
            "-----------------------------------------------------------------------------\n",
            label, t->st.iteration, loss, ppl, now_ms() - t0);
    if (t->metrics) {
        fprintf(t->metrics, "{\"iteration\": %lld, \"%s_loss\": %.9g, \"%s_ppl\": %.9g}\n",
                t->st.iteration, split == MT_SPLIT_VALID ? "val" : "test", loss,
                split == MT_SPLIT_VALID ? "val" : "test", ppl);
        fflush(t->metrics);
    }
    return MT_OK;
}

/* ---- logging ----------------------------------------------------------- */

static void accumulate_counts(struct trainer *t)
{
    if (!t->ncounts) return;
    const long long *c = mt_model_expert_counts(t->model);
    for (size_t i = 0; i < t->ncounts; i++) t->acc_counts[i] += c[i];
}

static void log_interval(struct trainer *t, double lr)
{
    const struct mt_config_training *tr = &t->cfg->training;
    double n = (double)t->acc_iters;
    double ms = t->acc_ms / n;
    double tokens = (double)tr->global_batch_size * tr->seq_length;
    double tok_s = tokens / (ms / 1e3);
    double tflops = t->flops_per_token * tok_s / 1e12;
    long long lo = 0, hi = 0;
    if (t->ncounts) {
        lo = hi = t->acc_counts[0];
        for (size_t i = 1; i < t->ncounts; i++) {
            if (t->acc_counts[i] < lo) lo = t->acc_counts[i];
            if (t->acc_counts[i] > hi) hi = t->acc_counts[i];
        }
    }
    /* per expert per MoE layer per iteration */
    double load_lo = (double)lo / n, load_hi = (double)hi / n;
    fprintf(t->log,
            " iteration %8lld/%8d | consumed samples: %12lld | elapsed time per iteration (ms): "
            "%.1f | tokens/s: %.0f | TFLOP/s: %.4f | learning rate: %.6E | global batch size: "
            "%5d | lm loss: %.6E",
            t->st.iteration, tr->train_iters, t->st.consumed_samples, ms, tok_s, tflops, lr,
            tr->global_batch_size, t->acc_loss / n);
    if (t->cfg->moe.num_experts > 0)
        fprintf(t->log, " | load_balancing_loss: %.6E | z_loss: %.6E | expert load min/max: "
                        "%.1f/%.1f",
                t->acc_aux / n, t->acc_z / n, load_lo, load_hi);
    if (t->acc_dropped) fprintf(t->log, " | dropped: %lld", t->acc_dropped);
    fprintf(t->log, " | grad norm: %.4f | number of skipped iterations: %3lld |\n",
            t->acc_gnorm / n, t->st.skipped_iters);
    fflush(t->log);
    if (t->metrics) {
        fprintf(t->metrics,
                "{\"iteration\": %lld, \"consumed_samples\": %lld, \"elapsed_ms\": %.3f, "
                "\"tokens_per_s\": %.1f, \"tflops\": %.6f, \"lr\": %.9g, \"loss\": %.9g, "
                "\"aux_loss\": %.9g, \"z_loss\": %.9g, \"grad_norm\": %.9g, \"skipped\": %lld, "
                "\"dropped_tokens\": %lld, \"expert_load_min\": %.3f, \"expert_load_max\": "
                "%.3f}\n",
                t->st.iteration, t->st.consumed_samples, ms, tok_s, tflops, lr,
                t->acc_loss / n, t->acc_aux / n, t->acc_z / n, t->acc_gnorm / n,
                t->st.skipped_iters, t->acc_dropped, load_lo, load_hi);
        fflush(t->metrics);
    }
    t->acc_loss = t->acc_aux = t->acc_z = t->acc_gnorm = t->acc_ms = 0;
    t->acc_iters = t->acc_dropped = 0;
    if (t->ncounts) memset(t->acc_counts, 0, t->ncounts * sizeof *t->acc_counts);
}

static void log_memory(struct trainer *t)
{
    struct mt_memory_report r;
    mt_model_memory(t->model, &r);
    size_t optim = 2 * mt_model_num_params(t->model) * sizeof(float);
    size_t batch = (size_t)t->cfg->training.micro_batch_size *
                   (size_t)(t->cfg->training.seq_length + 1) * sizeof(int32_t);
    size_t total = r.params + r.grads + r.working_copy + r.activations + r.scratch + r.buffers +
                   optim + batch;
    fprintf(t->log,
            "memory (bytes): parameters %zu | gradients %zu | bf16 working copy %zu | "
            "optimizer state %zu | activations %zu | scratch %zu | buffers %zu | batch %zu | "
            "total %zu (%.2f MiB)\n",
            r.params, r.grads, r.working_copy, optim, r.activations, r.scratch, r.buffers,
            batch, total, total / 1048576.0);
}

/* ---- setup ------------------------------------------------------------- */

static char *config_to_text(const struct mt_config *cfg)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    mt_config_print(cfg, f);
    fclose(f);
    return buf;
}

static int setup(struct trainer *t, struct mt_err *err)
{
    const struct mt_config *c = t->cfg;
    t->k = mt_kernels_cpu();
    MT_CHECK(mt_data_open(c, &t->data, err));
    char desc[1024];
    mt_data_describe(t->data, desc, sizeof desc);
    fprintf(t->log, "%s\n", desc);

    MT_CHECK(mt_model_create(c, t->k, c->training.micro_batch_size, &t->model, err));
    mt_model_init(t->model, (unsigned long long)c->training.seed);
    size_t n = mt_model_num_params(t->model);
    t->adam_m = calloc(n, sizeof(float));
    t->adam_v = calloc(n, sizeof(float));
    t->tokens = malloc(sizeof(int32_t) * (size_t)c->training.micro_batch_size *
                       (size_t)(c->training.seq_length + 1));
    t->ncounts = (size_t)mt_model_num_moe_layers(t->model) * (size_t)c->moe.num_experts;
    t->acc_counts = calloc(t->ncounts ? t->ncounts : 1, sizeof *t->acc_counts);
    t->config_text = config_to_text(c);
    if (!t->adam_m || !t->adam_v || !t->tokens || !t->acc_counts || !t->config_text)
        return mt_err_set(err, MT_ENOMEM, "out of memory for the optimizer state (%zu values)",
                          n);
    t->flops_per_token = mt_model_flops_per_token(t->model);
    fprintf(t->log, "model: %zu parameters in %d tensors; %.3f GFLOP per token "
                    "(forward+backward); backend %s\n",
            n, mt_model_num_tensors(t->model), t->flops_per_token / 1e9, t->k->name);
    if (c->logging.log_memory) log_memory(t);

    if (c->checkpoint.load[0]) MT_CHECK(load_checkpoint(t, err));
    if (c->logging.metrics_file[0]) {
        /* a resumed run appends to the trajectory it continues */
        t->metrics = fopen(c->logging.metrics_file, t->st.iteration > 0 ? "a" : "w");
        if (!t->metrics)
            return mt_err_errno(err, "&logging metrics_file '%s' cannot be opened",
                                c->logging.metrics_file);
    }
    return MT_OK;
}

static void teardown(struct trainer *t)
{
    if (t->metrics) fclose(t->metrics);
    mt_model_destroy(t->model);
    mt_data_close(t->data);
    free(t->adam_m);
    free(t->adam_v);
    free(t->tokens);
    free(t->acc_counts);
    free(t->config_text);
}

/* ---- the loop ---------------------------------------------------------- */

/* One iteration: forward/backward over the micro-batches, then the update
 * unless the loss or gradients are not finite. */
static int train_step(struct trainer *t, double *lr_out, struct mt_err *err)
{
    const struct mt_config *c = t->cfg;
    const int mbs = c->training.micro_batch_size;
    const int nmb = t->layout->num_micro_batches;
    double t0 = now_ms();
    mt_model_zero_grad(t->model);
    mt_model_reset_expert_counts(t->model);
    double loss = 0, aux = 0, z = 0;
    long long dropped = 0;
    for (int mb = 0; mb < nmb; mb++) {
        MT_CHECK(load_batch(t, MT_SPLIT_TRAIN,
                            (uint64_t)t->st.consumed_samples + (uint64_t)mb * mbs, mbs, err));
        struct mt_model_stats s = { 0 };
        MT_CHECK(mt_model_forward_backward(t->model, t->tokens, mbs, 1.0f / (float)nmb, &s,
                                           err));
        loss += s.lm_loss / nmb;
        aux += s.aux_loss / nmb;
        z += s.z_loss / nmb;
        dropped += s.dropped_tokens;
    }
    t->st.consumed_samples += c->training.global_batch_size;
    t->st.iteration++;
    double gnorm = grad_norm(t);
    double lr = mt_lr_at(&c->optimizer, t->st.iteration - 1);
    *lr_out = lr;
    if (!isfinite(loss) || !isfinite(gnorm)) {
        t->st.skipped_iters++;
        fprintf(t->log, "iteration %lld: %s is not finite (loss %g, grad norm %g): step "
                        "skipped\n",
                t->st.iteration, isfinite(loss) ? "the gradient" : "the loss", loss, gnorm);
        if (++t->nonfinite_streak >= MT_MAX_CONSECUTIVE_NONFINITE)
            return mt_err_set(err, MT_ERUNTIME,
                              "%d iterations in a row had a NaN or Inf loss or gradient (last "
                              "at iteration %lld): training stopped. Lower &optimizer lr, "
                              "check the data, or resume from an earlier checkpoint",
                              t->nonfinite_streak, t->st.iteration);
        return MT_OK;
    }
    t->nonfinite_streak = 0;
    double clip = 1.0;
    if (c->optimizer.clip_grad > 0 && gnorm > c->optimizer.clip_grad)
        clip = c->optimizer.clip_grad / (gnorm + 1e-6);
    optimizer_step(t, lr, clip);
    accumulate_counts(t);
    mt_model_update_expert_bias(t->model);
    t->acc_loss += loss;
    t->acc_aux += aux;
    t->acc_z += z;
    t->acc_gnorm += gnorm;
    t->acc_dropped += dropped;
    t->acc_ms += now_ms() - t0;
    t->acc_iters++;
    return MT_OK;
}

int mt_train_run(const struct mt_config *cfg, const struct mt_layout *layout, FILE *log,
                 struct mt_err *err)
{
    if (layout->world_size != 1)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "this moetrain runs one process; world size %d needs the "
                          "distributed runtime",
                          layout->world_size);
    struct trainer t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    t.layout = layout;
    t.log = log;
    int rc = setup(&t, err);
    const struct mt_config_training *tr = &cfg->training;
    const struct mt_config_checkpoint *ck = &cfg->checkpoint;
    long long last_saved = -1;
    bool do_eval_end = true;
    double t_start = now_ms();
    while (rc == MT_OK && t.st.iteration < tr->train_iters) {
        double lr = 0;
        rc = train_step(&t, &lr, err);
        if (rc) break;
        long long it = t.st.iteration;
        if (t.acc_iters && (it % cfg->logging.log_interval == 0 || it == tr->train_iters))
            log_interval(&t, lr);
        do_eval_end = true;
        if (it % tr->eval_interval == 0) {
            rc = evaluate(&t, MT_SPLIT_VALID, "validation", err);
            do_eval_end = false;
        }
        if (rc == MT_OK && ck->save[0] && ck->save_interval > 0 && it % ck->save_interval == 0) {
            rc = save_checkpoint(&t, err);
            last_saved = it;
        }
        if (rc == MT_OK && tr->exit_interval > 0 && it % tr->exit_interval == 0) {
            if (ck->save[0] && last_saved != it) rc = save_checkpoint(&t, err);
            fprintf(log, "exiting at iteration %lld (exit_interval = %d)\n", it,
                    tr->exit_interval);
            teardown(&t);
            return rc;
        }
    }
    if (rc == MT_OK)
        fprintf(log, "training done: %lld iterations in %.1f s\n", t.st.iteration,
                (now_ms() - t_start) / 1e3);
    /* saved before the final evaluation, so that a resumed run reads the
     * validation split from where an uninterrupted run would */
    if (rc == MT_OK && ck->save[0] && last_saved != t.st.iteration)
        rc = save_checkpoint(&t, err);
    if (rc == MT_OK && do_eval_end) rc = evaluate(&t, MT_SPLIT_VALID, "validation", err);
    if (rc == MT_OK) rc = evaluate(&t, MT_SPLIT_TEST, "test", err);
    teardown(&t);
    return rc;
}

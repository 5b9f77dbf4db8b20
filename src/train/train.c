/* The training loop: one process, or one rank of a parallel layout.
 *
 * Data parallelism reads the global batch as Megatron's MegatronPretrainingSampler
 * does: micro-batch m of DP rank d holds samples consumed + (m*dp + d)*mbs onwards, so
 * the global batch is the same set of micro-batches as with one process. Losses and
 * statistics are reduced over the ranks before they are logged; only world rank 0
 * writes the log (log is NULL elsewhere), the metrics file and checkpoints. */
#include "train/train.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/data.h"

struct trainer {
    const struct mt_config *cfg;
    const struct mt_layout *layout;
    const struct mt_kernels *k;
    struct mt_parallel *par;      /* NULL: one process */
    struct mt_comm *dp_comm, *world_comm; /* NULL with one process */
    int dp, dp_rank;
    bool rank0;
    FILE *log;                    /* NULL on ranks other than 0 */
    struct mt_model *model;
    struct mt_data *data;
    struct mt_optim *optim;
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

/* Writes to the log (world rank 0 only). */
__attribute__((format(printf, 2, 3))) static void say(struct trainer *t, const char *fmt, ...)
{
    if (!t->log) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(t->log, fmt, ap);
    va_end(ap);
}

/* In-place sum over c (NULL with one process: nothing to do). */
static int sum_over(struct mt_comm *c, void *x, size_t n, enum mt_dt dt, struct mt_err *err)
{
    return c ? mt_all_reduce(c, x, n, dt, MT_OP_SUM, err) : MT_OK;
}

/* First sample of micro-batch mb of this DP rank, in a batch starting at base. */
static uint64_t micro_batch_start(const struct trainer *t, uint64_t base, int mb)
{
    const int mbs = t->cfg->training.micro_batch_size;
    return base + ((uint64_t)mb * t->dp + (uint64_t)t->dp_rank) * mbs;
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
    v->adam_m = mt_optim_moment(t->optim, 0);
    v->adam_v = mt_optim_moment(t->optim, 1);
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
    const struct mt_config_checkpoint *ck = &t->cfg->checkpoint;
    int rc;
    if (t->par) {
        rc = mt_ckpt_save_dist(ck->save, t->model, t->optim, t->par, &t->st, t->config_text,
                               ck->keep_last, err);
    } else {
        struct mt_ckpt_view v;
        struct view_storage vs = { 0 };
        rc = make_view(t, &v, &vs, err);
        if (rc == MT_OK) rc = mt_ckpt_save(ck->save, &v, &t->st, t->config_text, ck->keep_last, err);
        free_view(&vs);
    }
    if (rc == MT_OK)
        say(t, "saved checkpoint at iteration %lld to %s/iter_%07lld\n", t->st.iteration,
            ck->save, t->st.iteration);
    return rc;
}

static int load_checkpoint(struct trainer *t, struct mt_err *err)
{
    const char *dir = t->cfg->checkpoint.load;
    bool found = false;
    char where[4200] = "";
    if (t->par) {
        MT_CHECK(mt_ckpt_load_dist(dir, t->model, t->optim, t->par, &t->st, &found, where,
                                   sizeof where, err));
    } else {
        struct mt_ckpt_view v;
        struct view_storage vs = { 0 };
        int rc = make_view(t, &v, &vs, err);
        if (rc == MT_OK) rc = mt_ckpt_load(dir, &v, &t->st, &found, where, sizeof where, err);
        free_view(&vs);
        if (rc != MT_OK) return rc;
        if (found) mt_model_params_updated(t->model);
    }
    if (found)
        say(t, "loaded checkpoint %s: iteration %lld, %lld samples consumed\n", where,
            t->st.iteration, t->st.consumed_samples);
    else
        say(t, "no checkpoint in '%s' yet: starting from initialisation\n", dir);
    return MT_OK;
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
    double sum[2] = {0.0, 0.0}; /* loss x tokens, tokens */
    double t0 = now_ms();
    for (int it = 0; it < tr->eval_iters; it++) {
        for (int mb = 0; mb < t->layout->num_micro_batches; mb++) {
            uint64_t first = micro_batch_start(t, base + (uint64_t)it * gbs, mb);
            MT_CHECK(load_batch(t, split, first, mbs, err));
            struct mt_model_stats s = { 0 };
            MT_CHECK(mt_model_forward(t->model, t->tokens, mbs, &s, err));
            sum[0] += s.lm_loss * (double)s.tokens;
            sum[1] += (double)s.tokens;
        }
    }
    MT_CHECK(sum_over(t->dp_comm, sum, 2, MT_DT_F64, err));
    if (split == MT_SPLIT_VALID) t->st.eval_count++;
    double loss = sum[1] > 0 ? sum[0] / sum[1] : NAN;
    double ppl = exp(loss < 700 ? loss : 700);
    say(t,
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
    say(t,
        " iteration %8lld/%8d | consumed samples: %12lld | elapsed time per iteration (ms): "
        "%.1f | tokens/s: %.0f | TFLOP/s: %.4f | learning rate: %.6E | global batch size: "
        "%5d | lm loss: %.6E",
        t->st.iteration, tr->train_iters, t->st.consumed_samples, ms, tok_s, tflops, lr,
        tr->global_batch_size, t->acc_loss / n);
    if (t->cfg->moe.num_experts > 0)
        say(t, " | load_balancing_loss: %.6E | z_loss: %.6E | expert load min/max: %.1f/%.1f",
            t->acc_aux / n, t->acc_z / n, load_lo, load_hi);
    if (t->acc_dropped) say(t, " | dropped: %lld", t->acc_dropped);
    say(t, " | grad norm: %.4f | number of skipped iterations: %3lld |\n", t->acc_gnorm / n,
        t->st.skipped_iters);
    if (t->log) fflush(t->log);
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

/* This rank's bytes (parameters and gradients are its shards). */
static void log_memory(struct trainer *t)
{
    struct mt_memory_report r;
    mt_model_memory(t->model, &r);
    size_t optim = mt_optim_memory(t->optim);
    size_t batch = (size_t)t->cfg->training.micro_batch_size *
                   (size_t)(t->cfg->training.seq_length + 1) * sizeof(int32_t);
    size_t total = r.params + r.grads + r.working_copy + r.activations + r.scratch + r.buffers +
                   optim + batch;
    say(t,
        "memory (bytes%s): parameters %zu | gradients %zu | bf16 working copy %zu | "
        "optimizer state %zu | activations %zu | scratch %zu | buffers %zu | batch %zu | "
        "total %zu (%.2f MiB)\n",
        t->par ? ", rank 0" : "", r.params, r.grads, r.working_copy, optim, r.activations,
        r.scratch, r.buffers, batch, total, total / 1048576.0);
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
    say(t, "%s\n", desc);

    MT_CHECK(mt_model_create(c, t->k, c->training.micro_batch_size, t->par, &t->model, err));
    mt_model_init(t->model, (unsigned long long)c->training.seed);
    MT_CHECK(mt_optim_create(t->model, t->k, t->par, c->parallel.use_distributed_optimizer, 0,
                             &t->optim, err));
    t->tokens = malloc(sizeof(int32_t) * (size_t)c->training.micro_batch_size *
                       (size_t)(c->training.seq_length + 1));
    t->ncounts = (size_t)mt_model_num_moe_layers(t->model) * (size_t)c->moe.num_experts;
    t->acc_counts = calloc(t->ncounts ? t->ncounts : 1, sizeof *t->acc_counts);
    t->config_text = config_to_text(c);
    if (!t->tokens || !t->acc_counts || !t->config_text)
        return mt_err_set(err, MT_ENOMEM, "out of memory for the trainer's buffers");
    t->flops_per_token = mt_model_flops_per_token(t->model);
    say(t, "model: %zu parameters in %d tensors; %.3f GFLOP per token (forward+backward); "
           "backend %s\n",
        mt_model_num_global_params(t->model), mt_model_num_tensors(t->model),
        t->flops_per_token / 1e9, t->k->name);
    if (c->logging.log_memory) log_memory(t);

    if (c->checkpoint.load[0]) MT_CHECK(load_checkpoint(t, err));
    if (c->logging.metrics_file[0] && t->rank0) {
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
    mt_optim_destroy(t->optim);
    mt_model_destroy(t->model);
    mt_data_close(t->data);
    free(t->tokens);
    free(t->acc_counts);
    free(t->config_text);
}

/* ---- the loop ---------------------------------------------------------- */

/* The micro-batches' losses and statistics of the whole global batch, on every rank:
 * the LM loss (whole on each TP rank) summed over DP, the TP ranks' shares of the
 * balancing and z losses and of the drops over all ranks, and the expert counts. */
static int reduce_stats(struct trainer *t, double *loss, double *auxz, long long *dropped,
                        struct mt_err *err)
{
    if (!t->par) return MT_OK;
    MT_CHECK(sum_over(t->dp_comm, loss, 1, MT_DT_F64, err));
    double shares[3] = {auxz[0], auxz[1], (double)*dropped};
    MT_CHECK(sum_over(t->world_comm, shares, 3, MT_DT_F64, err));
    auxz[0] = shares[0];
    auxz[1] = shares[1];
    *dropped = (long long)shares[2];
    if (t->ncounts)
        MT_CHECK(sum_over(t->world_comm, mt_model_expert_counts_mut(t->model), t->ncounts,
                          MT_DT_I64, err));
    return MT_OK;
}

/* One iteration: forward/backward over this rank's micro-batches, then the update
 * unless the loss or gradients are not finite. */
static int train_step(struct trainer *t, double *lr_out, struct mt_err *err)
{
    const struct mt_config *c = t->cfg;
    const int mbs = c->training.micro_batch_size;
    const int nmb = t->layout->num_micro_batches;      /* this DP rank's */
    const double all = (double)nmb * t->dp;             /* the global batch's */
    double t0 = now_ms();
    mt_model_zero_grad(t->model);
    mt_model_reset_expert_counts(t->model);
    double loss = 0, auxz[2] = {0, 0};
    long long dropped = 0;
    for (int mb = 0; mb < nmb; mb++) {
        MT_CHECK(load_batch(t, MT_SPLIT_TRAIN,
                            micro_batch_start(t, (uint64_t)t->st.consumed_samples, mb), mbs, err));
        struct mt_model_stats s = { 0 };
        MT_CHECK(mt_model_forward_backward(t->model, t->tokens, mbs, 1.0f / (float)nmb, &s,
                                           err));
        loss += s.lm_loss / all;
        auxz[0] += s.aux_loss / all;
        auxz[1] += s.z_loss / all;
        dropped += s.dropped_tokens;
    }
    MT_CHECK(reduce_stats(t, &loss, auxz, &dropped, err));
    t->st.consumed_samples += c->training.global_batch_size;
    t->st.iteration++;
    double gnorm;
    MT_CHECK(mt_optim_reduce_grads(t->optim, &gnorm, err));
    double lr = mt_lr_at(&c->optimizer, t->st.iteration - 1);
    *lr_out = lr;
    if (!isfinite(loss) || !isfinite(gnorm)) {
        t->st.skipped_iters++;
        say(t, "iteration %lld: %s is not finite (loss %g, grad norm %g): step skipped\n",
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
    t->st.adam_step++;
    MT_CHECK(mt_optim_step(t->optim, &c->optimizer, lr, clip, t->st.adam_step, err));
    accumulate_counts(t);
    mt_model_update_expert_bias(t->model);
    t->acc_loss += loss;
    t->acc_aux += auxz[0];
    t->acc_z += auxz[1];
    t->acc_gnorm += gnorm;
    t->acc_dropped += dropped;
    t->acc_ms += now_ms() - t0;
    t->acc_iters++;
    return MT_OK;
}

int mt_train_run(const struct mt_config *cfg, const struct mt_layout *layout,
                 struct mt_parallel *par, FILE *log, struct mt_err *err)
{
    if (!par && layout->world_size != 1)
        return mt_err_set(err, MT_EINVAL,
                          "world size %d needs the parallel context of a launched job",
                          layout->world_size);
    if (layout->pp > 1)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "&parallel pipeline_model_parallel_size = %d: pipeline parallelism is "
                          "not implemented in this version of moetrain; use 1",
                          layout->pp);
    if (par && par->world->size == 1) par = NULL; /* one process: no collectives at all */
    struct trainer t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    t.layout = layout;
    t.par = par;
    t.dp_comm = par ? par->comm[MT_GROUP_DP] : NULL;
    t.world_comm = par ? par->world->comm : NULL;
    t.dp = par ? par->dp : 1;
    t.dp_rank = par ? par->dp_rank : 0;
    t.rank0 = !par || par->world->rank == 0;
    t.log = t.rank0 ? log : NULL;
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
            say(&t, "exiting at iteration %lld (exit_interval = %d)\n", it, tr->exit_interval);
            teardown(&t);
            return rc;
        }
    }
    if (rc == MT_OK)
        say(&t, "training done: %lld iterations in %.1f s\n", t.st.iteration,
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

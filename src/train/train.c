/* The training loop: one process, or one rank of a parallel layout.
 *
 * Data parallelism reads the global batch as Megatron's MegatronPretrainingSampler
 * does: micro-batch m of DP rank d holds samples consumed + (m*dp + d)*mbs onwards, so
 * the global batch is the same set of micro-batches as with one process. Losses and
 * statistics are reduced over the ranks before they are logged; only world rank 0
 * writes the log (log is NULL elsewhere), the metrics file and checkpoints. */
#include "train/train.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/data.h"
#include "util/hostmem.h"


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
    bool overlap_logged;          /* the first step's overlap said */
    bool shared_overlap_logged;   /* the first step's moe_shared_expert_overlap said */
    bool last_pass;               /* the backward running is its chunk's last of the step:
                                     the gradients it finishes are complete (overlap) */
    int32_t *tokens;              /* (micro_batch, seq_length+1) */
    FILE *metrics;
    struct mt_ckpt_dir *save_dir; /* world rank 0's, with &checkpoint save set */
    struct mt_ckpt_save *pending; /* an async save written, not yet published */
    struct mt_ckpt_staging staging; /* the host memory async saves copy into */
    char *config_text;            /* resolved namelist, stored in checkpoints */
    struct mt_train_state st;
    int nonfinite_streak;
    /* the device-resident step: what the forwards of a step leave in backend memory,
     * read once (mt_model_read_stats), one record per forward */
    struct mt_model_stats *recs;
    int nrecs;
    /* log-interval accumulators */
    double acc_loss, acc_aux, acc_z, acc_gnorm, acc_ms;
    long long acc_iters, acc_dropped;
    long long acc_overflows;      /* MoE layer forwards beyond the planned expert rows */
    long long acc_offload[2];     /* activation offloading: this rank's bytes to the host, back */
    long long iter_offload[2];    /* the same of the last iteration run by the host, which a
                                   * replayed full_iteration graph copies as it was */
    long long *acc_counts;        /* [nmoe * num_experts] tokens per expert */
    /* host counters (util/hostmem.h): the current step's window opened at win, the
     * interval's sums over host_steps steps */
    struct mt_host_sample win;
    double acc_cpu_s;
    long long acc_minflt, acc_allocs, acc_allocs_mpi, acc_allocs_omp, acc_allocs_blas, host_steps;
    /* a device backend's kernel launches and host synchronisations (struct mt_op_counts):
     * the totals when the window opened, and the interval's */
    long long win_launches, win_syncs, acc_launches, acc_syncs;
    size_t ncounts;
    double flops_per_token;
    /* pipeline parallelism (pp > 1): this rank's stage and its 1F1B schedule */
    struct mt_comm *pp_comm;      /* NULL without pipeline parallelism */
    int pp, vpp, pp_rank, nslots;
    int chunk_l0[MT_MAX_VPP], chunk_l1[MT_MAX_VPP]; /* layers of each model chunk */
    bool first, last;
    size_t act_n;                 /* floats of an activation between stages */
    float *p_x, *p_y, *p_dy, *p_dx;
    int inflight, max_inflight;   /* micro-batch chunks forwarded, not yet backwarded */
    long long inflight_bytes, max_inflight_bytes; /* their activations */
    bool pp_logged;
    /* pipeline messages (interleaved schedule) held at once: now, at most, as a dry run
     * of the schedule predicts; dry: run the schedule without computing (planning) */
    int msgs, msgs_peak, msgs_plan;
    /* the messages, allocated at setup as one block of msgs_plan (msg_block), and the
     * free ones (msg_free_list, msg_nfree); the schedule's queues (q_mem) */
    float *msg_block, **msg_free_list;
    int msg_nfree;
    float **q_mem;
    bool dry;
    /* &parallel overlap_p2p_comm (interleaved schedule): the steady phase's transfers are
     * started before the compute that follows them (with overlap_p2p_comm_warmup_flush,
     * overlap_wf, the warm-up's and the flush's too); how many of them the last step had
     * in flight during a compute pass */
    bool overlap_p2p, overlap_wf;
    long long p2p_ahead;
};

/* The stop a signal handler asked for: the first signal, and how many were asked for.
 * Lock-free atomics: handlers of two signals can run at once on two threads (OpenMP
 * workers take process signals too), and exactly one of them must see itself second. */
static atomic_int stop_signal, stop_count;

int mt_train_request_stop(int sig)
{
    int none = 0;
    atomic_compare_exchange_strong(&stop_signal, &none, sig);
    return atomic_fetch_add(&stop_count, 1);
}

#define TAG_PP_FWD 7201
#define TAG_PP_BWD 7202

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

/* A number for JSON: %.9g, or null for NaN and Inf (which JSON cannot hold). */
static const char *jnum(char buf[32], double x)
{
    if (!isfinite(x)) return "null";
    snprintf(buf, 32, "%.9g", x);
    return buf;
}

/* Writes a line to the metrics file (world rank 0's) and flushes it: a failed write
 * (a full disk) ends the run with an error rather than losing the trajectory. */
__attribute__((format(printf, 3, 4))) static int metrics_put(struct trainer *t,
                                                             struct mt_err *err,
                                                             const char *fmt, ...)
{
    if (!t->metrics) return MT_OK;
    va_list ap;
    va_start(ap, fmt);
    int n = vfprintf(t->metrics, fmt, ap);
    va_end(ap);
    if (n < 0 || fflush(t->metrics) != 0 || ferror(t->metrics))
        return mt_err_errno(err, "&logging metrics_file '%s': writing failed (the run stops "
                            "so that the trajectory is not lost; free space or choose "
                            "another file, then resume from the last checkpoint)",
                            t->cfg->logging.metrics_file);
    return MT_OK;
}

/* A resumed run continues the trajectory in its metrics file: the lines of iterations
 * after the checkpoint it resumes from (written by a run that crashed or was rolled
 * back) are dropped, so that no iteration appears twice. The file is rewritten
 * through a temporary file and a rename. */
static int metrics_truncate_after(const char *path, long long upto, struct mt_err *err)
{
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return MT_OK; /* none, or a pipe */
    FILE *in = fopen(path, "r");
    if (!in) return errno == ENOENT ? MT_OK : mt_err_errno(err, "&logging metrics_file '%s'", path);
    char tmp[MT_STR_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (!out) {
        fclose(in);
        return mt_err_errno(err, "&logging metrics_file: cannot create '%s'", tmp);
    }
    char *line = NULL;
    size_t cap = 0;
    bool ok = true;
    while (getline(&line, &cap, in) > 0) {
        long long it;
        if (sscanf(line, "{\"iteration\": %lld", &it) == 1 && it > upto) continue;
        ok = fputs(line, out) >= 0 && ok;
    }
    free(line);
    ok = !ferror(in) && ok;
    fclose(in);
    ok = fflush(out) == 0 && fsync(fileno(out)) == 0 && ok;
    ok = fclose(out) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        int rc = mt_err_errno(err, "&logging metrics_file '%s': rewriting it for the resumed "
                              "run failed", path);
        unlink(tmp);
        return rc;
    }
    return MT_OK;
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

/* ---- checkpoints ----------------------------------------------------------- */

/* The cost of a save or load, as the log reports it: time, and the host memory the
 * most demanding rank used beyond its training state (counted by the checkpoint code
 * and measured as the rise of its peak resident size) next to its own part and the
 * I/O block. */
static void say_ckpt_cost(struct trainer *t, const char *what, const struct mt_ckpt_stats *cs)
{
    char rise[64] = "unknown";
    if (cs->rss_rise >= 0) snprintf(rise, sizeof rise, "%lld", cs->rss_rise);
    say(t, "checkpoint %s: %.3f s; host memory per rank at most: counted %zu bytes, measured "
           "rise %s bytes (own part %zu bytes, block %zu bytes)\n",
        what, cs->seconds, cs->counted_peak, rise, cs->shard_bytes, cs->block_bytes);
}

/* Publishes the pending async save (a collective): waits for this rank's writer,
 * then every rank agrees and rank 0 publishes. */
static int finish_save(struct trainer *t, struct mt_err *err)
{
    if (!t->pending) return MT_OK;
    const struct mt_config_checkpoint *ck = &t->cfg->checkpoint;
    const long long it = mt_ckpt_save_iteration(t->pending);
    struct mt_ckpt_stats cs = { 0 };
    int rc = mt_ckpt_save_finish(t->pending, &cs, err);
    t->pending = NULL;
    if (rc)
        return mt_err_prefix(err, "the checkpoint of iteration %lld was not saved and the run "
                             "stops (the last published one in '%s' is whole: fix the cause "
                             "and resume from it with checkpoint%%load)", it, ck->save);
    say(t, "saved checkpoint at iteration %lld to %s/iter_%07lld\n", it, ck->save, it);
    say_ckpt_cost(t, "save", &cs);
    if (cs.async)
        say(t, "checkpoint save blocked training for %.3f s (async: snapshot %.3f s, waiting "
               "for the writer %.3f s, publishing %.3f s; written in the background in %.3f s)\n",
            cs.blocked_s, cs.snapshot_s, cs.wait_s, cs.publish_s, cs.write_s);
    else
        say(t, "checkpoint save blocked training for %.3f s (synchronous)\n", cs.blocked_s);
    return MT_OK;
}

/* Saves the state at this iteration: at once, or with checkpoint%async_save started
 * here (after the previous async save is published) and published later. */
static int save_checkpoint(struct trainer *t, struct mt_err *err)
{
    MT_CHECK(finish_save(t, err));
    MT_CHECK(mt_optim_params_wait(t->optim, err)); /* never the parameters before the step */
    const struct mt_config_checkpoint *ck = &t->cfg->checkpoint;
    MT_CHECK(mt_ckpt_save_start(t->save_dir, t->model, t->optim, t->par, t->cfg, &t->st,
                                t->config_text, ck->async_save ? &t->staging : NULL,
                                &t->pending, err));
    return ck->async_save ? MT_OK : finish_save(t, err);
}

/* The initial weights of checkpoint%load_hf (upcycled with moe%use_upcycling). */
static int load_hf(struct trainer *t, struct mt_err *err)
{
    const char *dir = t->cfg->checkpoint.load_hf;
    struct mt_ckpt_stats cs = { 0 };
    MT_CHECK(mt_hf_load(dir, t->cfg, t->model, t->par, &cs, err));
    say(t, "initial weights from the Hugging Face directory %s%s: optimizer state fresh, "
           "iteration 0\n", dir,
        t->cfg->moe.use_upcycling ? ", upcycled (every expert a copy of the dense MLP)" : "");
    say_ckpt_cost(t, "load", &cs);
    return MT_OK;
}

/* checkpoint%load: a resume, or with moe%use_upcycling (and no load_hf) the dense
 * model's checkpoint to upcycle. *found: a checkpoint was there. */
static int load_checkpoint(struct trainer *t, bool *found_out, struct mt_err *err)
{
    const char *dir = t->cfg->checkpoint.load;
    const bool optional = t->cfg->checkpoint.load_optional;
    bool found = false;
    char where[4200] = "";
    struct mt_ckpt_stats cs = { 0 };
    *found_out = false;
    if (t->cfg->moe.use_upcycling && !t->cfg->checkpoint.load_hf[0]) {
        MT_CHECK(mt_ckpt_load_upcycled(dir, optional, t->cfg, t->model, t->par, &found, where,
                                       sizeof where, &cs, err));
        if (found) {
            *found_out = true;
            say(t, "upcycled the dense checkpoint %s: every expert a copy of the dense MLP, "
                   "optimizer state fresh, iteration 0\n", where);
            say_ckpt_cost(t, "load", &cs);
            return MT_OK;
        }
    } else {
        MT_CHECK(mt_ckpt_load_dist(dir, optional, t->model, t->optim, t->par, &t->st, &found,
                                   where, sizeof where, &cs, err));
    }
    *found_out = found;
    if (found) {
        say(t, "loaded checkpoint %s: iteration %lld, %lld samples consumed (saved by %s)\n",
            where, t->st.iteration, t->st.consumed_samples, cs.layout);
        say_ckpt_cost(t, "load", &cs);
    } else {
        say(t, "no checkpoint in '%s' yet (checkpoint%%load_optional): starting from %s\n",
            dir, t->cfg->checkpoint.load_hf[0] ? "checkpoint%load_hf" : "initialisation");
    }
    return MT_OK;
}

/* ---- pipeline schedules ------------------------------------------------ */

struct pp_acc {
    bool staged; /* the step's tokens staged ahead (stage_step_tokens): forwards take none */
    long long dropped, overflows;
    long long offload[2]; /* bytes copied to the host (forwards), back (backwards) */
    int fwd[MT_MAX_VPP], bwd[MT_MAX_VPP]; /* per chunk: micro-batches forwarded, backwarded */
};

/* Megatron's get_model_chunk_id: the chunk of virtual micro-batch k (k may be
 * negative: Python's modulo). */
static int chunk_of(const struct trainer *t, int k, bool forward)
{
    const int group = t->pp * t->vpp;
    int in_group = ((k % group) + group) % group;
    int c = in_group / t->pp;
    return forward ? c : t->vpp - 1 - c;
}

/* In-flight bookkeeping: micro-batch chunks forwarded and not yet backwarded, and the
 * activation bytes they hold. */
static void pp_track(struct trainer *t, int chunk, int dir)
{
    t->inflight += dir;
    t->inflight_bytes += dir * (long long)mt_model_slot_bytes(t->model, chunk);
    if (t->inflight > t->max_inflight) t->max_inflight = t->inflight;
    if (t->inflight_bytes > t->max_inflight_bytes) t->max_inflight_bytes = t->inflight_bytes;
}

/* Forward of chunk's next micro-batch: x_in from the previous chunk (unused for the
 * first stage's chunk 0), output into x_out (unused for the last stage's last chunk). */
static int pp_fwd(struct trainer *t, struct pp_acc *a, int chunk, const float *x_in, float *x_out,
                  int nmb, struct mt_err *err)
{
    const int mbs = t->cfg->training.micro_batch_size, mb = a->fwd[chunk]++;
    if (!a->staged)
        MT_CHECK(load_batch(t, MT_SPLIT_TRAIN,
                            micro_batch_start(t, (uint64_t)t->st.consumed_samples, mb), mbs, err));
    struct mt_model_stats s = { 0 };
    MT_CHECK(mt_model_stage_forward(t->model, chunk, mb % t->nslots, a->staged ? NULL : t->tokens,
                                    mbs, x_in, x_out, true, 1.0f / (float)nmb, &s, err));
    pp_track(t, chunk, +1);
    a->dropped += s.dropped_tokens;
    a->overflows += s.expert_overflows;
    a->offload[0] += s.offload_d2h_bytes;
    return MT_OK;
}

/* Backward of chunk's oldest in-flight micro-batch. */
static int pp_bwd(struct trainer *t, struct pp_acc *a, int chunk, const float *dy, float *dx,
                  struct mt_err *err)
{
    const int mb = a->bwd[chunk]++;
    struct mt_model_stats s = { 0 };
    t->last_pass = mb == t->layout->num_micro_batches - 1;
    int rc = mt_model_stage_backward(t->model, chunk, mb % t->nslots, dy, dx, &s, err);
    t->last_pass = false;
    MT_CHECK(rc);
    a->offload[1] += s.offload_h2d_bytes;
    pp_track(t, chunk, -1);
    return MT_OK;
}

/* Bytes of a message between stages: an activation forward (the model's activation
 * dtype: bf16 in bf16 training), an fp32 gradient backward; sent as bytes. The
 * interleaved schedule's messages (msg_alloc) hold either kind: act_n fp32 values. */
static size_t pp_bytes(const struct trainer *t, int tag)
{
    return t->act_n * (tag == TAG_PP_FWD ? mt_model_act_size(t->model) : sizeof(float));
}

static int pp_send(struct trainer *t, const float *buf, int peer, int tag, struct mt_err *err)
{
    return mt_send(t->pp_comm, buf, pp_bytes(t, tag), MT_DT_U8, peer, tag, err);
}

static int pp_recv(struct trainer *t, float *buf, int peer, int tag, struct mt_err *err)
{
    return mt_recv(t->pp_comm, buf, pp_bytes(t, tag), MT_DT_U8, peer, tag, err);
}

/* Megatron's forward_backward_pipelining_without_interleaving: warmup forwards, then
 * one forward one backward, then the cooldown backwards. Blocking point-to-point
 * calls, ordered so that on every link the activation travels before the gradient
 * (the combined send-forward/receive-backward of stage s meets the combined
 * receive-forward/send-backward of stage s+1 in the same order). */
static int pp_1f1b(struct trainer *t, struct pp_acc *a, int nmb, struct mt_err *err)
{
    const int s = t->pp_rank, prev = s - 1, next = s + 1;
    const int warm = t->pp - s - 1 < nmb ? t->pp - s - 1 : nmb, rem = nmb - warm;
    for (int i = 0; i < warm; i++) {
        if (!t->first) MT_CHECK(pp_recv(t, t->p_x, prev, TAG_PP_FWD, err));
        MT_CHECK(pp_fwd(t, a, 0, t->p_x, t->p_y, nmb, err));
        if (!t->last) MT_CHECK(pp_send(t, t->p_y, next, TAG_PP_FWD, err));
    }
    if (rem > 0 && !t->first) MT_CHECK(pp_recv(t, t->p_x, prev, TAG_PP_FWD, err));
    for (int i = 0; i < rem; i++) {
        MT_CHECK(pp_fwd(t, a, 0, t->p_x, t->p_y, nmb, err));
        if (!t->last) {
            MT_CHECK(pp_send(t, t->p_y, next, TAG_PP_FWD, err));
            MT_CHECK(pp_recv(t, t->p_dy, next, TAG_PP_BWD, err));
        }
        MT_CHECK(pp_bwd(t, a, 0, t->p_dy, t->p_dx, err));
        if (t->first) continue;
        if (i < rem - 1) MT_CHECK(pp_recv(t, t->p_x, prev, TAG_PP_FWD, err));
        MT_CHECK(pp_send(t, t->p_dx, prev, TAG_PP_BWD, err));
    }
    for (int i = 0; i < warm; i++) {
        if (!t->last) MT_CHECK(pp_recv(t, t->p_dy, next, TAG_PP_BWD, err));
        MT_CHECK(pp_bwd(t, a, 0, t->p_dy, t->p_dx, err));
        if (!t->first) MT_CHECK(pp_send(t, t->p_dx, prev, TAG_PP_BWD, err));
    }
    return MT_OK;
}

/* ---- interleaved 1F1B (virtual pipeline) ---- */

/* FIFO of received tensors per chunk (each holds at most the micro-batches of a step). */
struct pp_queue {
    float **q;
    int head, tail;
};

/* overlap_p2p_comm: one direction's batch, started and not yet waited for: the message it
 * sends (freed at the wait) and the one it receives (queued at the wait, into). */
struct il_inflight {
    struct mt_comm_req req;
    float *sent, *recv;
    struct pp_queue *into;
    int n;           /* its transfers */
    long long pass;  /* the compute passes run before its start */
};

struct il_state {
    struct trainer *t;
    struct pp_acc *a;
    int nmb;
    struct pp_queue qx[MT_MAX_VPP], qg[MT_MAX_VPP];
    struct il_inflight fwd, bwd; /* activations forward, gradients back (overlap_p2p) */
    struct il_inflight pre;      /* the warm-up's or the flush's next receive (overlap_wf) */
    long long passes;            /* forward and backward passes run so far */
    long long ahead;             /* transfers in flight during a compute pass */
};

static void q_push(struct pp_queue *q, float *x) { q->q[q->tail++] = x; }
static float *q_pop(struct pp_queue *q) { return q->head < q->tail ? q->q[q->head++] : NULL; }

/* A message between stages in backend memory, so that device backends send it from
 * the device (NCCL): one of the msgs_plan allocated at setup (the schedule's peak, as
 * its dry run counts it), so that a step allocates none; past them (never, unless the
 * schedule and its dry run part) from the backend. */
static float *msg_alloc(struct trainer *t)
{
    static float dry_msg; /* what a dry run passes around */
    float *p = t->dry            ? &dry_msg
               : t->msg_nfree > 0 ? t->msg_free_list[--t->msg_nfree]
                                  : t->k->op.alloc(t->k->ctx, sizeof(float) * t->act_n);
    if (p && ++t->msgs > t->msgs_peak) t->msgs_peak = t->msgs;
    return p;
}

static bool msg_of_block(const struct trainer *t, const float *p)
{
    return t->msg_block && p >= t->msg_block &&
           p < t->msg_block + (size_t)t->msgs_plan * t->act_n;
}

static void msg_free(struct trainer *t, float *p)
{
    if (!p) return;
    t->msgs--;
    if (t->dry) return;
    if (msg_of_block(t, p))
        t->msg_free_list[t->msg_nfree++] = p;
    else
        t->k->op.free(t->k->ctx, p);
}

/* Megatron's send_forward_backward_recv_forward_backward over the pipeline ring: the
 * activation to the next stage, the gradient to the previous one, and what they
 * send back, posted together (mt_p2p_batch). */
static int il_exchange(struct il_state *S, float *out, float *dx, bool recv_prev, bool recv_next,
                       float **x, float **g, struct mt_err *err)
{
    struct trainer *t = S->t;
    const int next = (t->pp_rank + 1) % t->pp, prev = (t->pp_rank + t->pp - 1) % t->pp;
    struct mt_p2p ops[4];
    int n = 0;
    *x = *g = NULL;
    if (recv_prev) *x = msg_alloc(t);
    if (recv_next) *g = msg_alloc(t);
    if ((recv_prev && !*x) || (recv_next && !*g)) {
        msg_free(t, *x);
        msg_free(t, *g);
        return mt_err_set(err, MT_ENOMEM, "out of memory for pipeline messages");
    }
    const size_t fwd = pp_bytes(t, TAG_PP_FWD), bwd = pp_bytes(t, TAG_PP_BWD);
    if (out) ops[n++] = (struct mt_p2p){true, out, fwd, next, TAG_PP_FWD};
    if (recv_prev) ops[n++] = (struct mt_p2p){false, *x, fwd, prev, TAG_PP_FWD};
    if (dx) ops[n++] = (struct mt_p2p){true, dx, bwd, prev, TAG_PP_BWD};
    if (recv_next) ops[n++] = (struct mt_p2p){false, *g, bwd, next, TAG_PP_BWD};
    int rc = n && !t->dry ? mt_p2p_batch(t->pp_comm, ops, n, MT_DT_U8, err) : MT_OK;
    if (rc) {
        msg_free(t, *x);
        msg_free(t, *g);
        *x = *g = NULL;
    }
    return rc;
}

/* overlap_p2p_comm: starts one direction's transfers (or one receive): send (a message
 * of the schedule's, owned by f from now on) to send_peer, and with recv the next message
 * from recv_peer, to be queued into `into` at the wait (il_finish). */
static int il_start(struct il_state *S, struct il_inflight *f, float *send, int send_peer,
                    bool recv, int recv_peer, int tag, struct pp_queue *into, struct mt_err *err)
{
    struct trainer *t = S->t;
    const size_t bytes = pp_bytes(t, tag);
    struct mt_p2p ops[2];
    int n = 0;
    f->sent = send;
    f->recv = recv ? msg_alloc(t) : NULL;
    f->into = into;
    if (recv && !f->recv) {
        msg_free(t, send);
        f->sent = NULL;
        return mt_err_set(err, MT_ENOMEM, "out of memory for pipeline messages");
    }
    if (send) ops[n++] = (struct mt_p2p){true, send, bytes, send_peer, tag};
    if (recv) ops[n++] = (struct mt_p2p){false, f->recv, bytes, recv_peer, tag};
    int rc = n && !t->dry ? mt_p2p_batch_start(t->pp_comm, ops, n, MT_DT_U8, &f->req, err)
                          : MT_OK;
    if (rc) {
        msg_free(t, f->sent);
        msg_free(t, f->recv);
        f->sent = f->recv = NULL;
        return rc;
    }
    f->n = n;
    f->pass = S->passes;
    return MT_OK;
}

/* Waits for f's transfers (if any): its message sent is free again, the one received
 * queued for the compute that uses it. */
static int il_finish(struct il_state *S, struct il_inflight *f, struct mt_err *err)
{
    struct trainer *t = S->t;
    int rc = mt_comm_wait(&f->req, err);
    if (rc) return rc; /* the buffers may still be in use: left to the abort that follows */
    if (S->passes > f->pass) S->ahead += f->n;
    f->n = 0;
    msg_free(t, f->sent);
    if (f->recv) q_push(f->into, f->recv);
    f->sent = f->recv = NULL;
    return MT_OK;
}

/* forward_step_helper: virtual micro-batch k; *out gets the output to send (NULL for
 * the last stage's last chunk). */
static int il_fwd(struct il_state *S, int k, float **out, struct mt_err *err)
{
    struct trainer *t = S->t;
    const int c = chunk_of(t, k, true);
    S->passes++;
    const bool head = t->last && c == t->vpp - 1;
    float *x = t->first && c == 0 ? NULL : q_pop(&S->qx[c]);
    if (!(t->first && c == 0) && !x)
        return mt_err_set(err, MT_ERUNTIME, "pipeline: no input for chunk %d (schedule bug)", c);
    *out = head ? NULL : msg_alloc(t);
    int rc = !head && !*out ? mt_err_set(err, MT_ENOMEM, "out of memory for pipeline messages")
             : t->dry       ? MT_OK
                            : pp_fwd(t, S->a, c, x, *out, S->nmb, err);
    msg_free(t, x);
    return rc;
}

/* backward_step_helper: *dx gets the input gradient to send (NULL for the first
 * stage's chunk 0). */
static int il_bwd(struct il_state *S, int k, float **dx, struct mt_err *err)
{
    struct trainer *t = S->t;
    const int c = chunk_of(t, k, false);
    S->passes++;
    const bool head = t->last && c == t->vpp - 1, embed = t->first && c == 0;
    float *g = head ? NULL : q_pop(&S->qg[c]);
    if (!head && !g)
        return mt_err_set(err, MT_ERUNTIME, "pipeline: no gradient for chunk %d (schedule bug)", c);
    *dx = embed ? NULL : msg_alloc(t);
    int rc = !embed && !*dx ? mt_err_set(err, MT_ENOMEM, "out of memory for pipeline messages")
             : t->dry       ? MT_OK
                            : pp_bwd(t, S->a, c, g, *dx, err);
    msg_free(t, g);
    return rc;
}

/* overlap_p2p_comm_warmup_flush: pass k of the warm-up (a forward, fwd) or of the flush
 * (a backward) with its transfers started ahead, as Megatron's: the pass's input,
 * received ahead (pre), waited for; the receive of the next pass's input (recv, queued
 * for chunk nc) started before the pass; the pass's output sent after it, the previous
 * pass's send waited for only then (it ran beside this pass). The stage whose next input
 * comes round the ring (the first stage's activations, the last stage's gradients)
 * starts that receive after its send, as Megatron's first stage does: a device backend
 * runs a stage's transfers in the order they are started (NCCL: one stream), and that
 * receive started first would wait for the other end of the ring, which waits for this
 * send. */
static int il_pass_ahead(struct il_state *S, bool fwd, int k, bool recv, int nc,
                         struct mt_err *err)
{
    struct trainer *t = S->t;
    const int next = (t->pp_rank + 1) % t->pp, prev = (t->pp_rank + t->pp - 1) % t->pp;
    const int tag = fwd ? TAG_PP_FWD : TAG_PP_BWD, to = fwd ? next : prev,
              from = fwd ? prev : next;
    struct il_inflight *send = fwd ? &S->fwd : &S->bwd;
    struct pp_queue *into = fwd ? &S->qx[nc] : &S->qg[nc];
    const bool round = fwd ? t->first : t->last;
    float *out;
    MT_CHECK(il_finish(S, &S->pre, err));
    if (recv && !round) MT_CHECK(il_start(S, &S->pre, NULL, 0, true, from, tag, into, err));
    MT_CHECK(fwd ? il_fwd(S, k, &out, err) : il_bwd(S, k, &out, err));
    int rc = il_finish(S, send, err);
    if (rc) {
        msg_free(t, out);
        return rc;
    }
    MT_CHECK(il_start(S, send, out, to, false, 0, tag, NULL, err));
    if (recv && round) MT_CHECK(il_start(S, &S->pre, NULL, 0, true, from, tag, into, err));
    return MT_OK;
}

/* The warmup forwards of stage s: Megatron's interleaved schedule. */
static int il_warmup(const struct trainer *t, int nmb, bool *all_warm)
{
    const int total = nmb * t->vpp;
    *all_warm = nmb == t->pp;
    if (*all_warm) return total;
    int w = (t->pp - t->pp_rank - 1) * 2 + (t->vpp - 1) * t->pp;
    return w < total ? w : total;
}

static int il_run(struct il_state *S, struct mt_err *err)
{
    struct trainer *t = S->t;
    const int V = t->vpp, P = t->pp, total = S->nmb * V;
    bool all_warm;
    const int warm = il_warmup(t, S->nmb, &all_warm), rem = total - warm;
    float *x, *g, *out = NULL, *dx = NULL;
    if (!t->first) {
        MT_CHECK(il_exchange(S, NULL, NULL, true, false, &x, &g, err));
        q_push(&S->qx[0], x);
    }
    const int next = (t->pp_rank + 1) % P, prev = (t->pp_rank + P - 1) % P;
    for (int k = 0; k < warm; k++) {
        const int nc = chunk_of(t, k + 1, true);
        bool recv_prev = !(t->first && nc == 0) && k != total - 1;
        bool recv_next = false;
        if (k == warm - 1 && !all_warm) recv_next = !t->last;
        if (t->overlap_wf) { /* the steady phase's first gradient received ahead too */
            MT_CHECK(il_pass_ahead(S, true, k, recv_prev, nc, err));
            if (recv_next)
                MT_CHECK(il_start(S, &S->bwd, NULL, 0, true, next, TAG_PP_BWD, &S->qg[V - 1],
                                  err));
            continue;
        }
        MT_CHECK(il_fwd(S, k, &out, err));
        int rc = il_exchange(S, out, NULL, recv_prev, recv_next, &x, &g, err);
        msg_free(t, out);
        MT_CHECK(rc);
        if (recv_next) q_push(&S->qg[V - 1], g);
        if (recv_prev) q_push(&S->qx[nc], x);
    }
    for (int k = 0; k < rem; k++) {
        const int fk = k + warm, bk = k;
        MT_CHECK(il_finish(S, &S->pre, err)); /* the warm-up's last receive (overlap_wf) */
        MT_CHECK(il_finish(S, &S->fwd, err));
        MT_CHECK(il_fwd(S, fk, &out, err));
        bool recv_prev = true, recv_next = true;
        int nfc, nbc;
        if (t->first) {
            nfc = chunk_of(t, fk - (P - 1), true);
            if (nfc == V - 1) recv_prev = false;
            nfc++;
        } else {
            nfc = chunk_of(t, fk + 1, true);
        }
        if (t->last) {
            nbc = chunk_of(t, bk - (P - 1), false);
            if (nbc == 0) recv_next = false;
            nbc--;
        } else {
            nbc = chunk_of(t, bk + 1, false);
        }
        if (k == rem - 1) recv_prev = false;
        if (t->overlap_p2p) { /* Megatron's overlap_p2p_comm: each direction on its own */
            MT_CHECK(il_start(S, &S->fwd, out, next, recv_prev, prev, TAG_PP_FWD, &S->qx[nfc],
                              err));
            MT_CHECK(il_finish(S, &S->bwd, err));
            MT_CHECK(il_bwd(S, bk, &dx, err));
            MT_CHECK(il_start(S, &S->bwd, dx, prev, recv_next, next, TAG_PP_BWD, &S->qg[nbc],
                              err));
            continue;
        }
        int rc = il_bwd(S, bk, &dx, err);
        if (rc) {
            msg_free(t, out);
            return rc;
        }
        rc = il_exchange(S, out, dx, recv_prev, recv_next, &x, &g, err);
        msg_free(t, out);
        msg_free(t, dx);
        MT_CHECK(rc);
        if (recv_prev) q_push(&S->qx[nfc], x);
        if (recv_next) q_push(&S->qg[nbc], g);
    }
    MT_CHECK(il_finish(S, &S->fwd, err));
    MT_CHECK(il_finish(S, &S->bwd, err));
    if (all_warm && !t->last) {
        MT_CHECK(il_exchange(S, NULL, NULL, false, true, &x, &g, err));
        q_push(&S->qg[V - 1], g);
    }
    for (int k = rem; k < total; k++) {
        const int nbc = chunk_of(t, k + 1, false);
        bool recv_next = !(t->last && nbc == V - 1) && k != total - 1;
        if (t->overlap_wf) {
            MT_CHECK(il_pass_ahead(S, false, k, recv_next, nbc, err));
            continue;
        }
        MT_CHECK(il_bwd(S, k, &dx, err));
        int rc = il_exchange(S, NULL, dx, false, recv_next, &x, &g, err);
        msg_free(t, dx);
        MT_CHECK(rc);
        if (recv_next) q_push(&S->qg[nbc], g);
    }
    return il_finish(S, &S->bwd, err); /* the last send (overlap_wf) */
}

static int pp_interleaved(struct trainer *t, struct pp_acc *a, int nmb,
                          struct mt_err *err)
{
    struct il_state S = {.t = t, .a = a, .nmb = nmb};
    float **mem = t->q_mem; /* vpp x 2 queues of nmb + 1 (setup_stage) */
    for (int c = 0; c < t->vpp; c++) {
        S.qx[c].q = mem + (size_t)(2 * c) * (nmb + 1);
        S.qg[c].q = mem + (size_t)(2 * c + 1) * (nmb + 1);
    }
    int rc = il_run(&S, err);
    t->p2p_ahead = S.ahead;
    for (int c = 0; c < t->vpp; c++) { /* left over only after an error */
        float *x;
        while ((x = q_pop(&S.qx[c]))) msg_free(t, x);
        while ((x = q_pop(&S.qg[c]))) msg_free(t, x);
    }
    return rc;
}

/* The schedule's in-flight micro-batch chunks, without running it: per chunk (into
 * per_chunk[vpp]) and in all; the order of forwards and backwards is fixed by the
 * schedule, so the peak is known in advance. */
static int pp_predict_inflight(const struct trainer *t, int nmb, int *per_chunk)
{
    int cur[MT_MAX_VPP] = {0}, tot = 0, peak = 0;
    for (int c = 0; c < t->vpp; c++) per_chunk[c] = 0;
    const int total = nmb * t->vpp;
    int warm;
    if (t->vpp == 1) {
        warm = t->pp - t->pp_rank - 1 < nmb ? t->pp - t->pp_rank - 1 : nmb;
    } else {
        bool all_warm;
        warm = il_warmup(t, nmb, &all_warm);
    }
    /* forwards 0..warm-1, then (forward warm+k, backward k), then the rest backward */
    int fwd = 0, bwd = 0;
    while (bwd < total) {
        bool do_fwd = fwd < total && (fwd < warm || fwd - warm <= bwd);
        if (do_fwd) {
            int c = chunk_of(t, fwd++, true);
            if (++cur[c] > per_chunk[c]) per_chunk[c] = cur[c];
            if (++tot > peak) peak = tot;
        } else {
            int c = chunk_of(t, bwd++, false);
            cur[c]--;
            tot--;
        }
    }
    return peak;
}

/* Once, after the first step: every stage's layers and peak activation memory (the
 * in-flight micro-batch chunks times their activations), measured and as the
 * schedule predicts. */
static int pp_log(struct trainer *t, struct mt_err *err)
{
    int per_chunk[MT_MAX_VPP];
    const int nmb = t->layout->num_micro_batches;
    enum { NI = 7 + 3 * MT_MAX_VPP, AHEAD = NI - 1 };
    long long mine[NI] = {t->max_inflight, t->max_inflight_bytes,
                          pp_predict_inflight(t, nmb, per_chunk),
                          (long long)mt_model_num_params(t->model), t->msgs_peak, t->msgs_plan};
    mine[AHEAD] = t->p2p_ahead;
    for (int c = 0; c < t->vpp; c++) {
        mine[6 + 3 * c] = t->chunk_l0[c];
        mine[7 + 3 * c] = t->chunk_l1[c];
        mine[8 + 3 * c] = (long long)mt_model_slot_bytes(t->model, c);
    }
    long long *all = calloc((size_t)t->pp * NI, sizeof *all);
    if (!all) return mt_err_set(err, MT_ENOMEM, "out of memory");
    int rc = mt_all_gather(t->pp_comm, mine, all, NI, MT_DT_I64, err);
    for (int s = 0; rc == MT_OK && s < t->pp; s++) {
        const long long *x = all + (size_t)s * NI;
        say(t, "pipeline stage %d (%s, %d micro-batches):", s,
            t->vpp > 1 ? "interleaved 1F1B" : "1F1B", nmb);
        for (int c = 0; c < t->vpp; c++)
            say(t, " chunk %d layers [%lld, %lld) %lld bytes per micro-batch%s", c, x[6 + 3 * c],
                x[7 + 3 * c], x[8 + 3 * c], c + 1 < t->vpp ? ";" : "");
        say(t, " | parameters %lld | peak in-flight micro-batch chunks %lld (schedule: %lld) | "
               "peak activation bytes %lld", x[3], x[0], x[2], x[1]);
        if (t->vpp > 1) say(t, " | peak pipeline messages %lld (planned %lld)", x[4], x[5]);
        if (t->overlap_p2p)
            say(t, " | overlap_p2p_comm: %lld transfers per step in flight during a compute "
                   "pass", x[AHEAD]);
        say(t, "\n");
    }
    free(all);
    return rc;
}

/* ---- evaluation -------------------------------------------------------- */

/* An evaluation forward's loss, read from the backend (one wait: evaluations are not
 * steps). */
static int read_loss(struct trainer *t, struct mt_model_stats *s, struct mt_err *err)
{
    int n;
    MT_CHECK(mt_model_read_stats(t->model, t->recs, t->nrecs, &n, NULL, err));
    s->lm_loss = n > 0 ? t->recs[0].lm_loss : 0.0;
    return MT_OK;
}

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
    MT_CHECK(mt_optim_params_wait(t->optim, err)); /* the step's parameters, whole */
    for (int it = 0; it < tr->eval_iters; it++) {
        for (int mb = 0; mb < t->layout->num_micro_batches; mb++) {
            uint64_t first = micro_batch_start(t, base + (uint64_t)it * gbs, mb);
            MT_CHECK(load_batch(t, split, first, mbs, err));
            struct mt_model_stats s = { 0 };
            if (t->pp_comm) { /* forward through the stages and chunks, one micro-batch at
                                 a time, around the ring for the chunks */
                const int next = (t->pp_rank + 1) % t->pp, prev = (t->pp_rank + t->pp - 1) % t->pp;
                for (int ch = 0; ch < t->vpp; ch++) {
                    struct mt_model_stats cs = { 0 };
                    if (!(t->first && ch == 0))
                        MT_CHECK(pp_recv(t, t->p_x, prev, TAG_PP_FWD, err));
                    MT_CHECK(mt_model_stage_forward(t->model, ch, 0, t->tokens, mbs, t->p_x, t->p_y,
                                                    false, 0.0f, &cs, err));
                    MT_CHECK(read_loss(t, &cs, err));
                    if (!(t->last && ch == t->vpp - 1))
                        MT_CHECK(pp_send(t, t->p_y, next, TAG_PP_FWD, err));
                    s.lm_loss += cs.lm_loss;
                    s.tokens += cs.tokens;
                }
            } else {
                MT_CHECK(mt_model_forward(t->model, t->tokens, mbs, &s, err));
                MT_CHECK(read_loss(t, &s, err));
            }
            sum[0] += s.lm_loss * (double)s.tokens;
            sum[1] += (double)s.tokens;
        }
    }
    MT_CHECK(sum_over(t->dp_comm, sum, 2, MT_DT_F64, err));
    MT_CHECK(sum_over(t->pp_comm, sum, 2, MT_DT_F64, err)); /* the last stage's */
    if (split == MT_SPLIT_VALID) t->st.eval_count++;
    double loss = sum[1] > 0 ? sum[0] / sum[1] : NAN;
    double ppl = exp(loss < 700 ? loss : 700);
    say(t,
        "-----------------------------------------------------------------------------\n"
        " %s loss at iteration %lld | lm loss value: %.6E | lm loss PPL: %.6E | "
        "%.0f ms\n"
        "-----------------------------------------------------------------------------\n",
        label, t->st.iteration, loss, ppl, now_ms() - t0);
    const char *which = split == MT_SPLIT_VALID ? "val" : "test";
    char b1[32], b2[32];
    return metrics_put(t, err, "{\"iteration\": %lld, \"%s_loss\": %s, \"%s_ppl\": %s}\n",
                       t->st.iteration, which, jnum(b1, loss), which, jnum(b2, ppl));
}

/* ---- host counters and manual GC ---------------------------------------- */

/* Opens a window of the step's host counters. */
/* A device backend's kernel launches and host synchronisations so far (0 without). */
static void device_totals(const struct trainer *t, long long *launches, long long *syncs)
{
    *launches = *syncs = 0;
    if (!t->k->counts) return;
    struct mt_op_counts c;
    t->k->counts(t->k->ctx, &c);
    for (int i = 0; i <= MT_OP_COUNT; i++) *launches += c.launches[i], *syncs += c.syncs[i];
}

static void host_open(struct trainer *t)
{
    mt_host_sample(&t->win);
    device_totals(t, &t->win_launches, &t->win_syncs);
}

/* Closes the window: what the process spent since host_open goes to the interval. */
static void host_close(struct trainer *t)
{
    struct mt_host_sample now;
    mt_host_sample(&now);
    t->acc_cpu_s += now.cpu_s - t->win.cpu_s;
    t->acc_minflt += now.minflt - t->win.minflt;
    t->acc_allocs += now.allocs - t->win.allocs;
    t->acc_allocs_mpi += now.allocs_mpi - t->win.allocs_mpi;
    t->acc_allocs_omp += now.allocs_omp - t->win.allocs_omp;
    t->acc_allocs_blas += now.allocs_blas - t->win.allocs_blas;
    long long launches, syncs;
    device_totals(t, &launches, &syncs);
    t->acc_launches += launches - t->win_launches;
    t->acc_syncs += syncs - t->win_syncs;
}

/* What the log says once about the host counters. */
static void say_host_counters(struct trainer *t)
{
    say(t, "host counters per step (the largest over the ranks): CPU time (user + system, "
           "every thread) and minor page faults from getrusage; %s\n",
        mt_host_allocs_counted()
            ? "heap allocations counted by the preloaded counting library, those of the MPI "
              "library and of the OpenMP runtime apart"
            : "heap allocations not counted (they are under the counting library that the "
              "build makes for the tests, tests/util/libmt_alloccount.so, preloaded: "
              "doc/host-overhead.md)");
    if (t->k->counts)
        say(t, "device counters per step: the %s backend's kernel launches (and cuBLASLt "
               "calls) and the times the host waited for the device\n",
            t->k->name);
}

/* The device memory the CUDA graphs hold (&cuda_graph), after the step that captured
 * them: with --log-memory, beside the startup report. */
static void log_graph_memory(struct trainer *t)
{
    struct mt_graph_stats g;
    if (!mt_model_graph_stats(t->model, &g)) return;
    say(t, "memory: CUDA graphs: %lld graphs captured in iteration %lld hold %zu bytes of device "
           "memory (blocks their scopes allocate, theirs from then on; rank 0)\n",
        g.graphs, t->st.iteration, g.bytes);
}

/* Manual GC (host%manual_gc): a collection at a point every rank reaches at the same
 * iteration (a rule on the iteration number: no communication), logged with what it
 * released (rank 0's figures). A full one (the start, the interval, before an
 * evaluation or a save) frees the model's deferred frees (overflow blocks kept for
 * reuse) and trims the heap; the one after an evaluation or a save, like Megatron's
 * collection of the youngest generation there, gives back only what the caches grew
 * during it: trimming there would make the next step fault in what the libraries take
 * again, while the evaluation's or save's own traffic follows a trim before it. */
static void manual_gc(struct trainer *t, const char *when, enum mt_gc_kind kind)
{
    if (!t->cfg->host.manual_gc) return;
    const double t0 = now_ms();
    const size_t deferred =
        t->model && kind == MT_GC_FULL ? mt_model_release_deferred(t->model) : 0;
    struct mt_gc_report r;
    mt_hostmem_collect(kind, &r);
    say(t, "manual GC (%s, iteration %lld): deferred frees %zu bytes, scratch caches released "
           "%zu bytes; heap held from the system %zu -> %zu bytes (released %zu), free in it "
           "%zu -> %zu bytes; %.2f ms (rank 0)\n",
        when, t->st.iteration, deferred, r.caches_released, r.heap_before, r.heap_after,
        r.heap_before > r.heap_after ? r.heap_before - r.heap_after : 0, r.free_before,
        r.free_after, now_ms() - t0);
}

/* An evaluation, with host%manual_gc_eval collections before and after it. */
static int evaluate_gc(struct trainer *t, enum mt_split split, const char *label,
                       struct mt_err *err)
{
    const bool gc = t->cfg->host.manual_gc_eval;
    if (gc) manual_gc(t, "before evaluation", MT_GC_FULL);
    int rc = evaluate(t, split, label, err);
    if (gc && rc == MT_OK) manual_gc(t, "after evaluation", MT_GC_GROWTH);
    return rc;
}

/* A checkpoint save, with host%manual_gc_eval collections before and after it. */
static int save_checkpoint_gc(struct trainer *t, struct mt_err *err)
{
    const bool gc = t->cfg->host.manual_gc_eval;
    if (gc) manual_gc(t, "before the checkpoint save", MT_GC_FULL);
    int rc = save_checkpoint(t, err);
    if (gc && rc == MT_OK) manual_gc(t, "after the checkpoint save", MT_GC_GROWTH);
    return rc;
}

/* ---- logging ----------------------------------------------------------- */

static void accumulate_counts(struct trainer *t)
{
    if (!t->ncounts) return;
    const long long *c = mt_model_expert_counts(t->model);
    for (size_t i = 0; i < t->ncounts; i++) t->acc_counts[i] += c[i];
}

static int log_interval(struct trainer *t, double lr, struct mt_err *err)
{
    const struct mt_config_training *tr = &t->cfg->training;
    host_open(t); /* the log line's own cost goes to the next interval */
    /* host counters per step, the largest over the ranks */
    const double hs = t->host_steps > 0 ? (double)t->host_steps : 1.0;
    /* moetrain's own allocations (not the MPI library's, the OpenMP runtime's or the BLAS
     * library's) are reduced on their own: the largest of them need not be where the
     * largest total is */
    int64_t host[8] = {(int64_t)(t->acc_cpu_s * 1e6), t->acc_minflt,
                       t->acc_allocs - t->acc_allocs_mpi - t->acc_allocs_omp - t->acc_allocs_blas,
                       t->acc_allocs_mpi, t->acc_allocs_omp, t->acc_launches, t->acc_syncs,
                       t->acc_allocs_blas};
    if (t->par) MT_CHECK(mt_all_reduce(t->world_comm, host, 8, MT_DT_I64, MT_OP_MAX, err));
    const double launches = (double)host[5] / hs, syncs = (double)host[6] / hs;
    const double cpu_ms = (double)host[0] / 1e3 / hs, faults = (double)host[1] / hs;
    const double allocs = (double)host[2] / hs, allocs_mpi = (double)host[3] / hs;
    const double allocs_omp = (double)host[4] / hs, allocs_blas = (double)host[7] / hs;
    const bool counted = mt_host_allocs_counted();
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
    const char *recipe = mt_model_lowp_recipe(t->model);
    if (recipe) say(t, " | low precision: %s", recipe);
    if (t->cfg->moe.num_experts > 0)
        say(t, " | load_balancing_loss: %.6E | z_loss: %.6E | expert load min/max: %.1f/%.1f",
            t->acc_aux / n, t->acc_z / n, load_lo, load_hi);
    if (t->acc_dropped) say(t, " | dropped: %lld", t->acc_dropped);
    if (t->acc_overflows)
        say(t, " | expert buffer overflows: %lld (moe%%expert_buffer_factor)", t->acc_overflows);
    if (t->acc_offload[0] || t->acc_offload[1])
        say(t, " | offloaded per step: %.0f bytes to host, %.0f back", t->acc_offload[0] / n,
            t->acc_offload[1] / n);
    say(t, " | grad norm: %.4f | number of skipped iterations: %3lld |", t->acc_gnorm / n,
        t->st.skipped_iters);
    say(t, " host per step: cpu %.1f ms, minor faults %.1f, ", cpu_ms, faults);
    if (t->k->counts) say(t, "kernel launches %.1f, host synchronisations %.1f, ", launches, syncs);
    if (counted)
        say(t, "allocations %.1f (and in the MPI library %.1f, the OpenMP runtime %.1f, the "
               "BLAS library %.1f) |\n",
            allocs, allocs_mpi, allocs_omp, allocs_blas);
    else
        say(t, "allocations not counted |\n");
    struct mt_graph_stats g;
    if (mt_model_graph_stats(t->model, &g))
        say(t, " cuda graphs: %lld held (%zu bytes), %lld captures (%lld recaptures), %lld "
               "replays so far\n",
            g.graphs, g.bytes, g.captures, g.recaptures, g.replays);
    if (t->log) fflush(t->log);
    char ha[32] = "null", hm[32] = "null", ho[32] = "null", hb[32] = "null";
    if (counted) {
        snprintf(ha, sizeof ha, "%.3f", allocs);
        snprintf(hm, sizeof hm, "%.3f", allocs_mpi);
        snprintf(ho, sizeof ho, "%.3f", allocs_omp);
        snprintf(hb, sizeof hb, "%.3f", allocs_blas);
    }
    /* in pieces of a few conversions: with a printf handler registered (libquadmath,
     * which the BLAS's Fortran runtime loads, registers one) glibc formats through its
     * positional path, which allocates for formats of many conversions */
    char line[1024];
    int len = snprintf(line, sizeof line,
                       "{\"iteration\": %lld, \"consumed_samples\": %lld, \"elapsed_ms\": %.3f, "
                       "\"tokens_per_s\": %.1f, \"tflops\": %.6f, \"lr\": %.9g, ",
                       t->st.iteration, t->st.consumed_samples, ms, tok_s, tflops, lr);
    len += snprintf(line + len, sizeof line - (size_t)len,
                    "\"loss\": %.9g, \"aux_loss\": %.9g, \"z_loss\": %.9g, \"grad_norm\": %.9g, "
                    "\"skipped\": %lld, \"dropped_tokens\": %lld, ",
                    t->acc_loss / n, t->acc_aux / n, t->acc_z / n, t->acc_gnorm / n,
                    t->st.skipped_iters, t->acc_dropped);
    len += snprintf(line + len, sizeof line - (size_t)len,
                    "\"expert_load_min\": %.3f, \"expert_load_max\": %.3f, \"host_cpu_ms\": %.3f, "
                    "\"minor_faults\": %.3f, \"allocations\": %s, \"allocations_mpi\": %s, ",
                    load_lo, load_hi, cpu_ms, faults, ha, hm);
    len += snprintf(line + len, sizeof line - (size_t)len, "\"allocations_omp\": %s, ", ho);
    len += snprintf(line + len, sizeof line - (size_t)len, "\"allocations_blas\": %s", hb);
    if (recipe) len += snprintf(line + len, sizeof line - (size_t)len, ", \"low_precision\": \"%s\"", recipe);
    if (t->k->counts)
        len += snprintf(line + len, sizeof line - (size_t)len,
                        ", \"kernel_launches\": %.3f, \"host_syncs\": %.3f", launches, syncs);
    snprintf(line + len, sizeof line - (size_t)len, "}\n");
    int rc = metrics_put(t, err, "%s", line);
    t->acc_loss = t->acc_aux = t->acc_z = t->acc_gnorm = t->acc_ms = 0;
    t->acc_iters = t->acc_dropped = t->acc_overflows = 0;
    t->acc_offload[0] = t->acc_offload[1] = 0;
    if (t->ncounts) memset(t->acc_counts, 0, t->ncounts * sizeof *t->acc_counts);
    t->acc_cpu_s = 0;
    t->acc_minflt = t->acc_allocs = t->acc_allocs_mpi = t->acc_allocs_omp = t->acc_allocs_blas = 0;
    t->host_steps = 0;
    t->acc_launches = t->acc_syncs = 0;
    host_close(t);
    return rc;
}

/* The stage's model chunks, activation slots and pipeline buffers (pp > 1), and the
 * messages the interleaved schedule will hold at once (a dry run of it). */
static int setup_stage(struct trainer *t, struct mt_err *err)
{
    const struct mt_config *c = t->cfg;
    for (int ch = 0; ch < t->vpp; ch++) {
        int n = 0;
        mt_config_pp_layers(c, t->pp_rank, ch, &t->chunk_l0[ch], &n);
        t->chunk_l1[ch] = t->chunk_l0[ch] + n;
    }
    t->first = t->pp_rank == 0;
    t->last = t->pp_rank == t->pp - 1;
    /* a slot per micro-batch a chunk can have in flight: 1F1B, stage s holds at most
     * min(pp - s, micro-batches); the interleaved schedule as it predicts */
    int per_chunk[MT_MAX_VPP];
    pp_predict_inflight(t, t->layout->num_micro_batches, per_chunk);
    t->nslots = 1;
    for (int ch = 0; ch < t->vpp; ch++)
        if (per_chunk[ch] > t->nslots) t->nslots = per_chunk[ch];
    MT_CHECK(mt_model_set_stage(t->model, t->vpp, t->chunk_l0, t->chunk_l1, t->first, t->last,
                                t->nslots, err));
    t->act_n = mt_model_stage_act_numel(t->model, c->training.micro_batch_size);
    /* activations in and out (the activation dtype), gradients in and out (fp32) */
    const size_t ab = pp_bytes(t, TAG_PP_FWD), gb = pp_bytes(t, TAG_PP_BWD);
    char *pb = t->k->op.alloc(t->k->ctx, 2 * ab + 2 * gb);
    if (!pb) return mt_err_set(err, MT_ENOMEM, "out of memory for pipeline buffers");
    t->p_x = (float *)pb;
    t->p_y = (float *)(pb + ab);
    t->p_dy = (float *)(pb + 2 * ab);
    t->p_dx = (float *)(pb + 2 * ab + gb);
    if (t->vpp > 1) {
        const int nmb = t->layout->num_micro_batches;
        t->q_mem = calloc((size_t)t->vpp * 2 * (size_t)(nmb + 1), sizeof *t->q_mem);
        if (!t->q_mem) return mt_err_set(err, MT_ENOMEM, "out of memory for the pipeline schedule");
        struct pp_acc a = { 0 };
        t->dry = true;
        int rc = pp_interleaved(t, &a, nmb, err);
        t->dry = false;
        t->msgs_plan = t->msgs_peak;
        t->msgs = t->msgs_peak = 0;
        MT_CHECK(rc);
        /* the messages the schedule holds at its peak, allocated once */
        const size_t n = (size_t)t->msgs_plan;
        t->msg_free_list = malloc(sizeof *t->msg_free_list * (n ? n : 1));
        t->msg_block = n ? t->k->op.alloc(t->k->ctx, sizeof(float) * t->act_n * n) : NULL;
        if (!t->msg_free_list || (n && !t->msg_block))
            return mt_err_set(err, MT_ENOMEM, "out of memory for pipeline messages");
        for (size_t i = 0; i < n; i++) t->msg_free_list[i] = t->msg_block + i * t->act_n;
        t->msg_nfree = (int)n;
    }
    return MT_OK;
}

/* What setup_stage allocated. */
static void free_stage(struct trainer *t)
{
    if (t->p_x) t->k->op.free(t->k->ctx, t->p_x);
    if (t->msg_block) t->k->op.free(t->k->ctx, t->msg_block);
    free(t->msg_free_list);
    free(t->q_mem);
}

/* ---- memory: what a rank holds, planned and measured ------------------- */

/* This rank's backend memory by category, from the objects that hold it. */
static void memory_of(const struct trainer *t, struct mt_rank_memory *r)
{
    struct mt_memory_report m;
    mt_model_memory(t->model, &m);
    struct mt_optim_bytes o;
    mt_optim_bytes(t->optim, &o);
    memset(r, 0, sizeof *r);
    r->rank = t->par ? t->par->rank : 0;
    r->stage = t->pp_comm ? t->pp_rank : 0;
    const bool bf16 = m.working_copy > 0;
    r->params = bf16 ? m.working_copy : m.params;
    r->master = bf16 ? m.params : 0;
    r->grads = m.grads + o.grad_shards;
    r->optimizer = o.moments;
    r->inflight = t->pp_comm ? t->nslots : 1;
    r->activations = m.activations;
    r->act_per_mb = m.activations / (size_t)r->inflight;
    r->lowp_copies = m.lowp_copies;
    r->lowp_replaced = m.lowp_replaced;
    r->recompute = m.recompute;
    r->pipeline = t->p_x ? 2 * pp_bytes(t, TAG_PP_FWD) +
                               pp_bytes(t, TAG_PP_BWD) * (2 + (size_t)t->msgs_plan)
                         : 0;
    r->comm = o.staging;
    r->workspace = m.scratch;
    r->other = m.device_buffers;
    r->offload = m.offload;
    r->offload_host = m.offload_host;
    r->offload_step = m.offload_per_mb * (size_t)t->layout->num_micro_batches;
    r->total = r->params + r->master + r->grads + r->optimizer + r->activations + r->recompute +
               r->pipeline + r->comm + r->workspace + r->other + r->offload;
}

static int check_vpp(const struct mt_layout *l, struct mt_err *err)
{
    if (l->vpp <= MT_MAX_VPP) return MT_OK;
    return mt_err_set(err, MT_EUNSUPPORTED,
                      "&parallel virtual_pipeline_model_parallel_size = %d: this trainer runs at "
                      "most %d model chunks per pipeline stage",
                      l->vpp, MT_MAX_VPP);
}

/* The optimizer as &parallel configures it. */
static struct mt_optim_opts optim_opts(const struct mt_config *c)
{
    return (struct mt_optim_opts){.distributed = c->parallel.use_distributed_optimizer,
                                  .bucket_elems = (size_t)c->parallel.ddp_bucket_size,
                                  .overlap_grad_reduce = c->parallel.overlap_grad_reduce,
                                  .overlap_param_gather = c->parallel.overlap_param_gather};
}

/* The forwards of a step (micro-batches x model chunks) leave their scalars in backend
 * memory for one read per step (doc/host-overhead.md). */
static int defer_stats(struct trainer *t, struct mt_err *err)
{
    t->nrecs = t->layout->num_micro_batches * (t->pp_comm && t->vpp > 1 ? t->vpp : 1);
    return mt_model_defer_stats(t->model, t->nrecs, err);
}

/* The model's hook before forward reads the weights at a position: their all-gather
 * (overlap_param_gather) is complete. */
static int weights_needed(void *ctx, int position, struct mt_err *err)
{
    struct trainer *t = ctx;
    return mt_optim_params_needed(t->optim, position, err);
}

/* The model's grad hook: in the last backward pass of a chunk, the gradients at the
 * position it finished are complete. */
static int grads_ready(void *ctx, int position, struct mt_err *err)
{
    struct trainer *t = ctx;
    return t->last_pass ? mt_optim_grads_ready(t->optim, position, err) : MT_OK;
}

int mt_train_build_rank(const struct mt_config *cfg, const struct mt_layout *l, int rank,
                        const struct mt_kernels *k, bool init,
                        size_t (*live)(const struct mt_kernels *k), struct mt_rank_memory *r,
                        struct mt_err *err)
{
    MT_CHECK(check_vpp(l, err));
    struct trainer t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    t.layout = l;
    t.k = k;
    /* one process trains without collectives (mt_train_run) */
    int rc = l->world_size > 1 ? mt_parallel_plan(cfg, l, rank, &t.par, err) : MT_OK;
    if (rc == MT_OK && l->pp > 1) {
        t.pp_comm = t.par->comm[MT_GROUP_PP];
        t.pp = l->pp;
        t.vpp = l->vpp;
        t.pp_rank = t.par->pp_rank;
        t.overlap_p2p = cfg->parallel.overlap_p2p_comm;
        t.overlap_wf = cfg->parallel.overlap_p2p_comm_warmup_flush;
    }
    if (rc == MT_OK)
        rc = mt_model_create(cfg, k, cfg->training.micro_batch_size, t.par, &t.model, err);
    if (rc == MT_OK && t.pp_comm) rc = setup_stage(&t, err);
    if (rc == MT_OK) rc = defer_stats(&t, err);
    if (rc == MT_OK && init) mt_model_init(t.model, (unsigned long long)cfg->training.seed);
    const struct mt_optim_opts oo = optim_opts(cfg);
    if (rc == MT_OK) rc = mt_optim_create(t.model, k, t.par, &oo, &t.optim, err);
    if (rc == MT_OK) {
        memory_of(&t, r);
        /* the categories account for every byte held */
        const size_t held = r->total;
        if (held != live(k))
            rc = mt_err_set(err, MT_ERUNTIME,
                            "memory of rank %d on backend %s: the categories sum to %zu bytes but "
                            "%zu are allocated (a bug: a category is missing from the report)",
                            rank, k->name, held, live(k));
    }
    mt_optim_destroy(t.optim);
    mt_model_destroy(t.model);
    free_stage(&t);
    mt_parallel_plan_destroy(t.par);
    return rc;
}

int mt_train_plan_memory(const struct mt_config *cfg, const struct mt_layout *l, int rank,
                         struct mt_rank_memory *r, struct mt_err *err)
{
    struct mt_kernels *k = mt_kernels_plan_create();
    if (!k) return mt_err_set(err, MT_ENOMEM, "memory plan: out of memory");
    int rc = mt_train_build_rank(cfg, l, rank, k, false, mt_kernels_plan_live, r, err);
    mt_kernels_plan_destroy(k);
    return rc;
}

static double gib(size_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

void mt_train_memory_line(char *buf, size_t n, const struct mt_rank_memory *r)
{
    char off[160] = "", lowp[200] = "";
    if (r->offload_host)
        snprintf(off, sizeof off, "offload buffer %zu | ", r->offload);
    /* FP8/FP4: the quantised copies in those activations, and what they save */
    if (r->lowp_copies)
        snprintf(lowp, sizeof lowp, "; of which FP8/FP4 copies %zu in place of %zu of "
                 "high-precision inputs, %lld saved", r->lowp_copies, r->lowp_replaced,
                 (long long)r->lowp_replaced - (long long)r->lowp_copies);
    int w = snprintf(buf, n,
                     "  stage %lld, rank %lld: parameters %zu | master weights %zu | gradients %zu | "
                     "optimizer state %zu | activations %zu (%zu per micro-batch x %lld in flight%s) | "
                     "recompute %zu | pipeline %zu | communication %zu | workspace %zu | other %zu | "
                     "%stotal %zu (%.2f GiB)",
                     r->stage, r->rank, r->params, r->master, r->grads, r->optimizer, r->activations,
                     r->act_per_mb, r->inflight, lowp, r->recompute, r->pipeline, r->comm, r->workspace,
                     r->other, off, r->total, gib(r->total));
    /* activation offloading: what it holds on the host and moves over PCIe / C2C */
    if (r->offload_host && w > 0 && (size_t)w < n)
        snprintf(buf + w, n - (size_t)w,
                 "; offloaded to pinned host memory %zu (%.2f GiB), %zu bytes each way per step",
                 r->offload_host, gib(r->offload_host), r->offload_step);
}

static const char memory_head[] =
    "memory per GPU in bytes, the most loaded rank of each pipeline stage (what moetrain "
    "allocates; add the CUDA context, cuBLASLt's workspace and NCCL's buffers):\n";

/* per_stage[s] = the most loaded of rs[0..n) on stage s (the lowest rank of a tie). */
static void most_loaded(const struct mt_rank_memory *rs, int n, int pp,
                        struct mt_rank_memory *per_stage)
{
    for (int s = 0; s < pp; s++) per_stage[s].rank = -1;
    for (int i = 0; i < n; i++) {
        struct mt_rank_memory *b = &per_stage[rs[i].stage];
        if (b->rank < 0 || rs[i].total > b->total ||
            (rs[i].total == b->total && rs[i].rank < b->rank))
            *b = rs[i];
    }
}

/* Fails when r does not fit precision%gpu_memory_gb, naming what to reduce. */
static int check_fits(const struct mt_config *cfg, const struct mt_rank_memory *r,
                      struct mt_err *err)
{
    const double limit = cfg->precision.gpu_memory_gb;
    if (limit <= 0 || gib(r->total) <= limit) return MT_OK;
    return mt_err_set(err, MT_EINVAL,
                      "rank %lld (pipeline stage %lld) needs %.2f GiB of GPU memory, more than "
                      "precision%%gpu_memory_gb = %g: activations %.2f GiB (%lld micro-batches in "
                      "flight; lower training%%micro_batch_size or seq_length, use more "
                      "pipeline stages or tensor parallelism, recompute them (&recompute "
                      "granularity), or lower moe%%expert_buffer_factor), parameters, master weights and gradients "
                      "%.2f GiB (more tensor, pipeline or expert parallelism), optimizer state "
                      "%.2f GiB (parallel%%use_distributed_optimizer, more data parallelism), "
                      "workspace %.2f GiB",
                      r->rank, r->stage, gib(r->total), limit, gib(r->activations), r->inflight,
                      gib(r->params + r->master + r->grads), gib(r->optimizer),
                      gib(r->workspace));
}

int mt_train_memory_report(const struct mt_config *cfg, const struct mt_layout *l, FILE *out,
                           struct mt_err *err)
{
    /* ranks that differ in what they hold: their stage and their TP, EP and ETP positions
     * (data-parallel replicas hold alike) */
    const int pp = l->pp;
    struct mt_rank_memory *rs = calloc((size_t)l->world_size, sizeof *rs);
    struct mt_rank_memory *best = calloc((size_t)pp, sizeof *best);
    int *seen = calloc((size_t)l->pp * l->tp * l->ep * l->etp, sizeof *seen);
    int rc = rs && best && seen ? MT_OK : mt_err_set(err, MT_ENOMEM, "out of memory");
    int n = 0;
    for (int r = 0; rc == MT_OK && r < l->world_size; r++) {
        struct mt_group_place at[MT_GROUP_COUNT];
        rc = mt_groups_locate(&cfg->parallel, l, r, at, err);
        if (rc) break;
        int key = 0;
        const enum mt_group_kind kinds[] = {MT_GROUP_PP, MT_GROUP_TP, MT_GROUP_EP, MT_GROUP_ETP};
        const int sizes[] = {l->pp, l->tp, l->ep, l->etp};
        for (int i = 0; i < 4; i++) key = key * sizes[i] + at[kinds[i]].position;
        if (seen[key]++) continue;
        rc = mt_train_plan_memory(cfg, l, r, &rs[n], err);
        if (rc == MT_OK) n++;
    }
    if (rc == MT_OK) {
        most_loaded(rs, n, pp, best);
        fputs(memory_head, out);
        char line[768];
        for (int s = 0; s < pp; s++) {
            mt_train_memory_line(line, sizeof line, &best[s]);
            fprintf(out, "%s\n", line);
        }
        for (int s = 0; s < pp && rc == MT_OK; s++) rc = check_fits(cfg, &best[s], err);
    }
    free(rs);
    free(best);
    free(seen);
    return rc;
}

/* --log-memory: every rank's bytes, and world rank 0 prints the report as --check does. */
static int log_memory(struct trainer *t, struct mt_err *err)
{
    enum { NF = sizeof(struct mt_rank_memory) / sizeof(long long) };
    _Static_assert(sizeof(struct mt_rank_memory) % sizeof(long long) == 0, "whole words");
    struct mt_rank_memory mine;
    memory_of(t, &mine);
    const int n = t->par ? t->par->world->size : 1;
    struct mt_rank_memory *all = calloc((size_t)n, sizeof *all);
    struct mt_rank_memory *best = calloc((size_t)(t->pp ? t->pp : 1), sizeof *best);
    int rc = all && best ? MT_OK : mt_err_set(err, MT_ENOMEM, "out of memory");
    if (rc == MT_OK && t->par)
        rc = mt_all_gather(t->world_comm, &mine, all, NF, MT_DT_I64, err);
    else if (rc == MT_OK)
        all[0] = mine;
    if (rc == MT_OK && t->log) {
        most_loaded(all, n, t->pp ? t->pp : 1, best);
        say(t, "%s", memory_head);
        char line[768];
        for (int s = 0; s < (t->pp ? t->pp : 1); s++) {
            mt_train_memory_line(line, sizeof line, &best[s]);
            say(t, "%s\n", line);
        }
    }
    free(all);
    free(best);
    return rc;
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

/* Before anything is allocated, world rank 0 takes the save directory (created, locked,
 * proven writable, cleaned of crashed saves) and finds the checkpoint to load, so that
 * a bad path fails now rather than after hours of training. */
static int open_checkpoint_dirs(struct trainer *t, struct mt_err *err)
{
    const struct mt_config_checkpoint *ck = &t->cfg->checkpoint;
    int rc = MT_OK;
    if (t->rank0 && ck->save[0]) {
        int removed = 0, restored = 0;
        rc = mt_ckpt_dir_open(ck->save, &t->save_dir, &removed, &restored, err);
        if (rc == MT_OK && removed)
            say(t, "checkpoint%%save '%s': removed %d leftover%s of interrupted saves\n", ck->save,
                removed, removed == 1 ? "" : "s");
        if (rc == MT_OK && restored)
            say(t, "checkpoint%%save '%s': put back %d checkpoint%s that an interrupted save was "
                   "replacing\n", ck->save, restored, restored == 1 ? "" : "s");
    }
    if (rc == MT_OK && t->rank0 && ck->load[0]) {
        char where[4200];
        bool found;
        rc = mt_ckpt_locate(ck->load, ck->load_optional, where, sizeof where, &found, err);
    }
    if (t->par) rc = mt_ckpt_agree_on_rank0(t->par, rc, "checking the checkpoint directories", err);
    return rc;
}

/* World rank 0's metrics file: a fresh start writes a new one, a resumed run continues
 * the one it finds (see metrics_truncate_after). */
static int open_metrics(struct trainer *t, struct mt_err *err)
{
    const char *path = t->cfg->logging.metrics_file;
    if (!path[0] || !t->rank0) return MT_OK;
    bool resumed = t->st.iteration > 0;
    if (resumed) MT_CHECK(metrics_truncate_after(path, t->st.iteration, err));
    t->metrics = fopen(path, resumed ? "a" : "w");
    if (!t->metrics) return mt_err_errno(err, "&logging metrics_file '%s' cannot be opened", path);
    return MT_OK;
}

static int setup(struct trainer *t, struct mt_err *err)
{
    const struct mt_config *c = t->cfg;
    MT_CHECK(open_checkpoint_dirs(t, err));
    MT_CHECK(mt_data_open(c, &t->data, err));
    char desc[1024];
    mt_data_describe(t->data, desc, sizeof desc);
    say(t, "%s\n", desc);

    if (c->precision.gpu_memory_gb > 0) { /* fail before allocating */
        struct mt_rank_memory r;
        MT_CHECK(mt_train_plan_memory(c, t->layout, t->par ? t->par->rank : 0, &r, err));
        MT_CHECK(check_fits(c, &r, err));
    }
    MT_CHECK(mt_model_create(c, t->k, c->training.micro_batch_size, t->par, &t->model, err));
    if (t->pp_comm) MT_CHECK(setup_stage(t, err));
    MT_CHECK(defer_stats(t, err));
    t->recs = calloc((size_t)t->nrecs, sizeof *t->recs);
    if (!t->recs) return mt_err_set(err, MT_ENOMEM, "out of memory for the step's statistics");
    mt_model_init(t->model, (unsigned long long)c->training.seed);
    const struct mt_optim_opts oo = optim_opts(c);
    MT_CHECK(mt_optim_create(t->model, t->k, t->par, &oo, &t->optim, err));
    /* overlap: the model tells, position by position, which gradients the last
     * backward of a step has finished (the optimizer starts their buckets) and which
     * weights forward is about to read (the optimizer completes their all-gathers) */
    if (t->par && c->parallel.overlap_grad_reduce)
        mt_model_set_hooks(t->model, &(struct mt_model_hooks){
                                         .grads_done = grads_ready,
                                         .weights_needed = c->parallel.overlap_param_gather
                                                               ? weights_needed
                                                               : NULL,
                                         .ctx = t});
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
    if (c->logging.log_memory) MT_CHECK(log_memory(t, err));

    bool resumed = false;
    if (c->checkpoint.load[0]) MT_CHECK(load_checkpoint(t, &resumed, err));
    if (!resumed && c->checkpoint.load_hf[0]) MT_CHECK(load_hf(t, err));
    return open_metrics(t, err);
}

static void teardown(struct trainer *t)
{
    mt_ckpt_save_cancel(t->pending); /* an error ended the run: nothing is published */
    mt_ckpt_staging_release(&t->staging);
    if (t->metrics) fclose(t->metrics);
    mt_ckpt_dir_close(t->save_dir);
    mt_optim_destroy(t->optim);
    mt_model_destroy(t->model);
    mt_data_close(t->data);
    free(t->tokens);
    free_stage(t);
    free(t->acc_counts);
    free(t->recs);
    free(t->config_text);
}

/* ---- the loop ---------------------------------------------------------- */

/* The micro-batches' losses and statistics of the whole global batch, on every rank:
 * the LM loss (whole on each TP rank) summed over DP, the TP ranks' shares of the
 * balancing and z losses and of the drops over all ranks, and the expert counts. */
static int reduce_stats(struct trainer *t, double *loss, double *auxz, long long *dropped,
                        long long *overflows, struct mt_err *err)
{
    if (!t->par) return MT_OK;
    MT_CHECK(sum_over(t->dp_comm, loss, 1, MT_DT_F64, err));
    MT_CHECK(sum_over(t->pp_comm, loss, 1, MT_DT_F64, err)); /* the last stage's */
    double shares[4] = {auxz[0], auxz[1], (double)*dropped, (double)*overflows};
    MT_CHECK(sum_over(t->world_comm, shares, 4, MT_DT_F64, err));
    auxz[0] = shares[0];
    auxz[1] = shares[1];
    *dropped = (long long)shares[2];
    *overflows = (long long)shares[3];
    if (t->ncounts)
        MT_CHECK(sum_over(t->world_comm, mt_model_expert_counts_mut(t->model), t->ncounts,
                          MT_DT_I64, err));
    return MT_OK;
}

/* The step's one wait for the device: the forwards' losses and drops, the expert loads
 * and the gradient norm, read together (mt_model_read_stats) and added in the order the
 * forwards ran, each micro-batch's share of the global batch (all of them) apart. */
static int read_step(struct trainer *t, double all, double *loss, double *auxz,
                     long long *dropped, double *gnorm, struct mt_err *err)
{
    int n;
    double sumsq;
    MT_CHECK(mt_model_read_stats(t->model, t->recs, t->nrecs, &n, &sumsq, err));
    for (int i = 0; i < n; i++) {
        *loss += t->recs[i].lm_loss / all;
        auxz[0] += t->recs[i].aux_loss / all;
        auxz[1] += t->recs[i].z_loss / all;
        *dropped += t->recs[i].dropped_tokens;
    }
    *gnorm = sqrt(sumsq);
    return MT_OK;
}

/* The step's micro-batches' tokens, staged ahead (mt_model_stage_tokens) in the order
 * the forwards run: virtual micro-batch k is the forward of chunk chunk_of(k), of that
 * chunk's next micro-batch (one chunk without a pipeline or with 1F1B). */
static int stage_step_tokens(struct trainer *t, struct mt_err *err)
{
    const int mbs = t->cfg->training.micro_batch_size;
    const int nmb = t->layout->num_micro_batches, chunks = t->pp_comm ? t->vpp : 1;
    int next[MT_MAX_VPP] = {0};
    for (int k = 0; k < nmb * chunks; k++) {
        const int mb = next[t->pp_comm ? chunk_of(t, k, true) : 0]++;
        MT_CHECK(load_batch(t, MT_SPLIT_TRAIN,
                            micro_batch_start(t, (uint64_t)t->st.consumed_samples, mb), mbs, err));
        MT_CHECK(mt_model_stage_tokens(t->model, t->tokens, mbs, err));
    }
    return MT_OK;
}

/* The micro-batches of a step, forward and backward (under a pipeline, its schedule with
 * the transfers between stages), and the gradients' reduction; with &cuda_graph impl =
 * 'full_iteration' (a->staged) the optimizer step too, and all of it one graph
 * (mt_model_iteration_begin), with what the host gives it written before it: the
 * tokens, AdamW's constants of the step (the learning rate). */
static int run_micro_batches(struct trainer *t, struct pp_acc *a, struct mt_err *err)
{
    const struct mt_config_optimizer *oc = &t->cfg->optimizer;
    const int mbs = t->cfg->training.micro_batch_size;
    const int nmb = t->layout->num_micro_batches;
    if (a->staged) {
        MT_CHECK(stage_step_tokens(t, err));
        MT_CHECK(mt_optim_stage_step(t->optim, oc, mt_lr_at(oc, t->st.iteration), t->st.adam_step + 1, err));
    }
    bool run;
    MT_CHECK(mt_model_iteration_begin(t->model, (uint64_t)nmb << 32 | (uint64_t)mbs, &run, err));
    if (!run) { /* replayed: its host-side results are the zeros of static shapes, and
                 * the offloaded bytes of the iteration it holds */
        a->offload[0] = t->iter_offload[0];
        a->offload[1] = t->iter_offload[1];
        return MT_OK;
    }
    mt_model_zero_grad(t->model);
    if (t->pp_comm)
        MT_CHECK(t->vpp > 1 ? pp_interleaved(t, a, nmb, err) : pp_1f1b(t, a, nmb, err));
    for (int mb = 0; !t->pp_comm && mb < nmb; mb++) {
        if (!a->staged)
            MT_CHECK(load_batch(t, MT_SPLIT_TRAIN,
                                micro_batch_start(t, (uint64_t)t->st.consumed_samples, mb), mbs, err));
        struct mt_model_stats s = { 0 };
        t->last_pass = mb == nmb - 1;
        int rc = mt_model_forward_backward(t->model, a->staged ? NULL : t->tokens, mbs,
                                           1.0f / (float)nmb, &s, err);
        t->last_pass = false;
        MT_CHECK(rc);
        a->dropped += s.dropped_tokens;
        a->overflows += s.expert_overflows;
        a->offload[0] += s.offload_d2h_bytes;
        a->offload[1] += s.offload_h2d_bytes;
    }
    t->iter_offload[0] = a->offload[0];
    t->iter_offload[1] = a->offload[1];
    MT_CHECK(mt_optim_reduce_grads(t->optim, NULL, err));
    if (a->staged) { /* and delayed scaling's histories rolled under the same gate */
        struct mt_step_gate gate;
        MT_CHECK(mt_optim_step_dev(t->optim, oc, &gate, err));
        MT_CHECK(mt_model_lowp_roll(t->model, &gate, err));
    }
    return mt_model_iteration_end(t->model, err);
}

/* One iteration: forward/backward over this rank's micro-batches, then the update
 * unless the loss or gradients are not finite. */
static int train_step(struct trainer *t, double *lr_out, struct mt_err *err)
{
    const struct mt_config *c = t->cfg;
    const int nmb = t->layout->num_micro_batches;      /* this DP rank's */
    /* &cuda_graph impl = 'full_iteration': the step's update decided and run on the
     * device in the iteration (mt_optim_step_dev), as the host decides it below */
    const bool staged = strcmp(c->cuda_graph.impl, "full_iteration") == 0;
    const double all = (double)nmb * t->dp;             /* the global batch's */
    double t0 = now_ms();
    mt_model_reset_expert_counts(t->model);
    double loss = 0, auxz[2] = {0, 0};
    struct pp_acc a = {.staged = staged};
    MT_CHECK(run_micro_batches(t, &a, err));
    long long dropped = a.dropped, overflows = a.overflows;
    const long long *offload = a.offload;
    if (t->pp_comm && !t->pp_logged) {
        MT_CHECK(pp_log(t, err));
        t->pp_logged = true;
    }
    double gnorm;
    MT_CHECK(read_step(t, all, &loss, auxz, &dropped, &gnorm, err));
    MT_CHECK(reduce_stats(t, &loss, auxz, &dropped, &overflows, err));
    t->st.consumed_samples += c->training.global_batch_size;
    t->st.iteration++;
    if (!t->overlap_logged && t->par && c->parallel.overlap_grad_reduce) {
        int early, total;
        mt_optim_overlap_counts(t->optim, &early, &total);
        say(t, "overlap_grad_reduce: %d of %d gradient buckets were started during the "
               "backward of the first step (rank 0), the rest after it\n",
            early, total);
        t->overlap_logged = true;
    }
    if (!t->shared_overlap_logged && c->moe.moe_shared_expert_overlap) {
        say(t, "moe_shared_expert_overlap: %lld expert-parallel all-to-alls were in flight "
               "while the shared expert ran in the first step (rank 0)\n",
            mt_model_a2a_overlapped(t->model));
        t->shared_overlap_logged = true;
    }
    double lr = mt_lr_at(&c->optimizer, t->st.iteration - 1);
    *lr_out = lr;
    if (!isfinite(loss) || !isfinite(gnorm)) {
        t->st.skipped_iters++;
        say(t, "iteration %lld: %s is not finite (loss %g, grad norm %g): step skipped\n",
            t->st.iteration, isfinite(loss) ? "the gradient" : "the loss", loss, gnorm);
        char b1[32], b2[32];
        MT_CHECK(metrics_put(t, err,
                             "{\"iteration\": %lld, \"consumed_samples\": %lld, \"lr\": %.9g, "
                             "\"loss\": %s, \"grad_norm\": %s, \"skipped\": %lld, "
                             "\"step_skipped\": true}\n",
                             t->st.iteration, t->st.consumed_samples, lr, jnum(b1, loss),
                             jnum(b2, gnorm), t->st.skipped_iters));
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
    if (!staged) MT_CHECK(mt_optim_step(t->optim, &c->optimizer, lr, clip, t->st.adam_step, err));
    accumulate_counts(t);
    MT_CHECK(mt_model_update_expert_bias(t->model, !staged, err)); /* staged: in the iteration */
    MT_CHECK(mt_model_lowp_step(t->model, staged, err));
    t->acc_loss += loss;
    t->acc_aux += auxz[0];
    t->acc_z += auxz[1];
    t->acc_gnorm += gnorm;
    t->acc_dropped += dropped;
    t->acc_overflows += overflows;
    t->acc_offload[0] += offload[0];
    t->acc_offload[1] += offload[1];
    t->acc_ms += now_ms() - t0;
    t->acc_iters++;
    return MT_OK;
}

/* At an iteration boundary, every rank learns the same answers (one reduction): whether
 * a stop was requested on any rank (the largest signal number requested anywhere), so
 * no rank stops while the others go on into the next step's collectives; and whether
 * every rank's writer of a pending async save is done, so that it is published now. */
static int agree_at_boundary(struct trainer *t, int *sig, bool *written, struct mt_err *err)
{
    int32_t v[2] = {atomic_load(&stop_signal), t->pending && !mt_ckpt_save_written(t->pending)};
    if (t->par) MT_CHECK(mt_all_reduce(t->world_comm, v, 2, MT_DT_I32, MT_OP_MAX, err));
    *sig = v[0];
    *written = t->pending && v[1] == 0;
    return MT_OK;
}

int mt_train_run(const struct mt_config *cfg, const struct mt_layout *layout,
                 struct mt_parallel *par, const struct mt_kernels *k, FILE *log,
                 int *stopped_by, struct mt_err *err)
{
    if (!par && layout->world_size != 1)
        return mt_err_set(err, MT_EINVAL,
                          "world size %d needs the parallel context of a launched job",
                          layout->world_size);
    MT_CHECK(check_vpp(layout, err));
    if (par && par->world->size == 1) par = NULL; /* one process: no collectives at all */
    struct trainer t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    t.layout = layout;
    t.par = par;
    t.k = k;
    t.dp_comm = par ? par->comm[MT_GROUP_DP] : NULL;
    t.world_comm = par ? par->world_comm : NULL;
    t.dp = par ? par->dp : 1;
    t.dp_rank = par ? par->dp_rank : 0;
    if (par && par->pp > 1) {
        t.pp_comm = par->comm[MT_GROUP_PP];
        t.pp = par->pp;
        t.vpp = layout->vpp;
        t.pp_rank = par->pp_rank;
        t.overlap_p2p = cfg->parallel.overlap_p2p_comm;
        t.overlap_wf = cfg->parallel.overlap_p2p_comm_warmup_flush;
    }
    t.rank0 = !par || par->world->rank == 0;
    t.log = t.rank0 ? log : NULL;
    *stopped_by = 0;
    if (cfg->host.manual_gc) mt_hostmem_hold();
    int rc = setup(&t, err);
    if (rc == MT_OK) {
        say_host_counters(&t);
        manual_gc(&t, "at the start of training", MT_GC_FULL);
    }
    const struct mt_config_training *tr = &cfg->training;
    const struct mt_config_checkpoint *ck = &cfg->checkpoint;
    const long long first_iter = t.st.iteration;
    long long last_saved = -1;
    bool do_eval_end = true;
    double t_start = now_ms();
    const int gc_interval = cfg->host.manual_gc_interval;
    while (rc == MT_OK) {
        bool written = false;
        host_open(&t); /* the step's window: the boundary, the step; not a save's publication */
        rc = agree_at_boundary(&t, stopped_by, &written, err);
        if (rc || *stopped_by || t.st.iteration >= tr->train_iters) break;
        if (written) rc = finish_save(&t, err);
        if (rc) break;
        double lr = 0;
        /* &cuda_graph: eager for warmup_steps iterations of this process, then captured */
        const long long done = t.st.iteration - first_iter;
        mt_model_set_graph_capture(t.model, done >= cfg->cuda_graph.warmup_steps);
        rc = train_step(&t, &lr, err);
        if (rc) break;
        host_close(&t);
        t.host_steps++;
        if (cfg->logging.log_memory && done == cfg->cuda_graph.warmup_steps)
            log_graph_memory(&t);
        long long it = t.st.iteration;
        if (t.acc_iters && (it % cfg->logging.log_interval == 0 || it == tr->train_iters))
            rc = log_interval(&t, lr, err);
        do_eval_end = true;
        if (rc == MT_OK && it % tr->eval_interval == 0) {
            rc = evaluate_gc(&t, MT_SPLIT_VALID, "validation", err);
            do_eval_end = false;
        }
        if (rc == MT_OK && ck->save[0] && ck->save_interval > 0 && it % ck->save_interval == 0) {
            rc = save_checkpoint_gc(&t, err);
            last_saved = it;
        }
        if (rc == MT_OK && gc_interval > 0 && it % gc_interval == 0)
            manual_gc(&t, "after the step", MT_GC_FULL);
        if (rc == MT_OK && tr->exit_interval > 0 && it % tr->exit_interval == 0) {
            if (ck->save[0] && last_saved != it) rc = save_checkpoint_gc(&t, err);
            if (rc == MT_OK) rc = finish_save(&t, err);
            say(&t, "exiting at iteration %lld (exit_interval = %d)\n", it, tr->exit_interval);
            if (rc == MT_OK) rc = mt_optim_params_wait(t.optim, err);
            teardown(&t);
            return rc;
        }
    }
    if (rc == MT_OK && *stopped_by) {
        /* told to stop (a time limit's warning signal, scancel, Ctrl-C): save what was
         * trained since the last save, skip the final evaluations, leave */
        if (ck->save[0] && last_saved != t.st.iteration && t.st.iteration > first_iter)
            rc = save_checkpoint_gc(&t, err);
        if (rc == MT_OK && t.pending)
            say(&t, "stopping: waiting for the background save of iteration %lld\n",
                mt_ckpt_save_iteration(t.pending));
        if (rc == MT_OK) rc = finish_save(&t, err);
        say(&t, "stopping at iteration %lld on signal %d (%s)%s\n", t.st.iteration, *stopped_by,
            strsignal(*stopped_by),
            !ck->save[0] ? ": no checkpoint%save is set, nothing saved" : "");
        if (rc == MT_OK) rc = mt_optim_params_wait(t.optim, err);
        teardown(&t);
        return rc;
    }
    if (rc == MT_OK)
        say(&t, "training done: %lld iterations in %.1f s\n", t.st.iteration,
            (now_ms() - t_start) / 1e3);
    /* saved before the final evaluation, so that a resumed run reads the
     * validation split from where an uninterrupted run would */
    if (rc == MT_OK && ck->save[0] && last_saved != t.st.iteration)
        rc = save_checkpoint_gc(&t, err);
    if (rc == MT_OK && do_eval_end) rc = evaluate_gc(&t, MT_SPLIT_VALID, "validation", err);
    if (rc == MT_OK) rc = evaluate_gc(&t, MT_SPLIT_TEST, "test", err);
    if (rc == MT_OK) rc = finish_save(&t, err); /* an async save written during evaluation */
    if (rc == MT_OK) rc = mt_optim_params_wait(t.optim, err); /* none left in flight */
    teardown(&t);
    return rc;
}

/* Gradient synchronisation and AdamW over the data-parallel groups (see train.h). */
#include "train/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Packed range [begin, end) of a class, padded to a multiple of the group size; rank r
 * owns [begin + r*shard, begin + (r+1)*shard) of it (clipped to end). */
struct bucket {
    size_t begin, end, padded, shard, at; /* at: where its slice starts in the slice arrays */
    int j0, j1;              /* the class's tensors [j0, j1) it holds a part of */
    size_t packed_at;        /* overlap: where its own staging starts in o->packed */
    int unready;             /* this step: its tensors (with elements) not yet final */
    bool started;            /* this step: its reduction was started */
    bool gathering;          /* overlap_param_gather: its updated parameters in flight */
    struct mt_comm_req req;
};

/* The parameters reduced over one data-parallel group, packed in table order. */
struct klass {
    struct mt_comm *comm;
    int size, rank;
    int n;
    int *tensor;             /* model tensor ids */
    size_t *at;              /* packed offset of each */
    size_t total;
    int nbuckets;
    struct bucket *b;
    size_t slices;           /* this rank's slice elements over all buckets (ZeRO) */
    float *grad, *m, *v;     /* ZeRO: the slices */
};

struct mt_optim {
    struct mt_model *model;
    const struct mt_kernels *k;
    const struct mt_parallel *par;
    bool zero;
    double grad_scale;       /* 1/dp: sums over the groups become global-batch means */
    struct klass c[2];       /* dense (DP group), experts (expert-DP group) */
    float *stage, *slice;    /* a padded bucket; one slice */
    size_t stage_n, slice_n;
    float *m_full, *v_full;  /* without ZeRO: the moments of every parameter held */
    float *tp_stage;         /* TP-replicated gradients, packed */
    size_t tp_n;
    double *sumsq;           /* (1) backend memory: the squared norm being summed (the
                                model's, mt_model_sumsq_acc, taken at each reduction: read
                                with its scalars) */
    /* Readiness (see mt_optim_grads_ready): backward positions -1 .. npos-2 */
    bool overlap;            /* &parallel overlap_grad_reduce: buckets start when ready */
    bool overlap_params;     /* &parallel overlap_param_gather: gathers waited at first use */
    int gathers;             /* buckets gathering */
    int tied;                /* the embedding tied across pipeline stages, or -1 */
    int npos;
    bool *pos_done;          /* per position + 1: its tensors are final */
    float *packed;           /* overlap: every bucket's own staging, padded */
    size_t packed_n;
    int early, last_early;   /* buckets started during backward: this step, the last */
    /* mt_optim_stage_step: AdamW's constants of the next step for tensors with and without
     * weight decay, written on the host (page-locked) and uploaded by mt_optim_step_dev */
    struct mt_adamw_consts *consts_host, *consts_dev;
    /* mt_optim_step_dev over several processes: the forwards' loss sums, summed over the
     * world, which decide the skip on every rank as the host's summed loss does
     * (allocated by the first, eager, step): the span of the records that holds them,
     * world_losses_n doubles, copied and all-reduced whole */
    double *world_losses;
    size_t world_losses_n;
};

/* ---- packed ranges ---------------------------------------------------------------------- */

/* f(ctx, tensor, offset in the tensor, offset in [lo,hi), length) for each piece of the
 * packed range [lo, hi) of class c that lies in one tensor. */
typedef void (*seg_fn)(void *ctx, const struct mt_param_info *t, size_t in_tensor,
                       size_t in_range, size_t n);

static void for_each_segment(const struct mt_optim *o, const struct klass *c, size_t lo,
                             size_t hi, seg_fn f, void *ctx)
{
    for (int j = 0; j < c->n; j++) {
        const struct mt_param_info *t = mt_model_tensor(o->model, c->tensor[j]);
        size_t a = c->at[j], b = a + t->numel;
        size_t s = a > lo ? a : lo, e = b < hi ? b : hi;
        if (s < e) f(ctx, t, s - a, s - lo, e - s);
    }
}

struct copy_ctx {
    const struct mt_kernels *k;
    float *model, *packed;
    bool to_packed;
};

static void copy_seg(void *p, const struct mt_param_info *t, size_t in_tensor, size_t in_range,
                     size_t n)
{
    struct copy_ctx *c = p;
    float *mp = c->model + t->offset + in_tensor, *pp = c->packed + in_range;
    c->k->op.copy(c->k->ctx, c->to_packed ? pp : mp, c->to_packed ? mp : pp, sizeof(float) * n);
}

/* packed (hi-lo) <-> the model-layout buffer model, for [lo, hi) of class c. */
static void pack(const struct mt_optim *o, const struct klass *c, float *model, size_t lo,
                 size_t hi, float *packed, bool to_packed)
{
    struct copy_ctx cc = {o->k, model, packed, to_packed};
    for_each_segment(o, c, lo, hi, copy_seg, &cc);
}

/* This rank's slice of bucket b: [lo, hi) (empty when all padding). */
static void slice_of(const struct klass *c, const struct bucket *b, size_t *lo, size_t *hi)
{
    size_t s = b->begin + (size_t)c->rank * b->shard, e = s + b->shard;
    *lo = s < b->end ? s : b->end;
    *hi = e < b->end ? e : b->end;
}

/* ---- lifecycle -------------------------------------------------------------------------- */

static int build_class(struct mt_optim *o, struct klass *c, bool expert, struct mt_comm *comm,
                       size_t bucket_elems, struct mt_err *err)
{
    const int nt = mt_model_num_tensors(o->model);
    c->comm = comm;
    c->size = comm ? comm->size : 1;
    c->rank = comm ? comm->rank : 0;
    c->tensor = calloc((size_t)nt, sizeof(int));
    c->at = calloc((size_t)nt, sizeof(size_t));
    if (!c->tensor || !c->at) return mt_err_set(err, MT_ENOMEM, "optimizer: out of memory");
    for (int i = 0; i < nt; i++) {
        const struct mt_param_info *t = mt_model_tensor(o->model, i);
        if (t->expert != expert) continue;
        c->tensor[c->n] = i;
        c->at[c->n++] = c->total;
        c->total += t->numel;
    }
    size_t cap = bucket_elems ? bucket_elems : MT_OPTIM_BUCKET_ELEMS;
    if (!bucket_elems && cap < (size_t)1000000 * c->size) cap = (size_t)1000000 * c->size;
    /* Cut points: every cap elements of the packed class, restarting at the two ends of
     * an embedding tied across pipeline stages, which gets buckets of its own (as
     * Megatron's shared_embedding): the rest need not wait for its sum over the
     * embedding group. */
    size_t seg[4] = {0, c->total, c->total, c->total};
    int nseg = 1;
    for (int j = 0; j < c->n; j++)
        if (c->tensor[j] == o->tied && mt_model_tensor(o->model, o->tied)->numel) {
            size_t a = c->at[j], e = a + mt_model_tensor(o->model, o->tied)->numel;
            nseg = 0;
            if (a > 0) seg[++nseg] = a;
            seg[++nseg] = e;
            if (e < c->total) seg[++nseg] = c->total;
        }
    c->nbuckets = 0;
    for (int k = 0; k < nseg; k++)
        c->nbuckets += (int)((seg[k + 1] - seg[k] + cap - 1) / cap);
    c->b = calloc((size_t)c->nbuckets + 1, sizeof *c->b);
    if (!c->b) return mt_err_set(err, MT_ENOMEM, "optimizer: out of memory");
    int i = 0;
    for (int k = 0; k < nseg; k++)
        for (size_t at = seg[k]; at < seg[k + 1]; at += cap, i++) {
            struct bucket *b = &c->b[i];
            b->begin = at;
            b->end = at + cap < seg[k + 1] ? at + cap : seg[k + 1];
            b->shard = (b->end - b->begin + (size_t)c->size - 1) / (size_t)c->size;
            b->padded = b->shard * (size_t)c->size;
            b->at = c->slices;
            c->slices += b->shard;
            b->packed_at = o->packed_n;
            o->packed_n += b->padded;
            b->j0 = c->n;
            b->j1 = 0;
            for (int j = 0; j < c->n; j++) {
                size_t ta = c->at[j], te = ta + mt_model_tensor(o->model, c->tensor[j])->numel;
                if (ta < b->end && te > b->begin) {
                    if (j < b->j0) b->j0 = j;
                    b->j1 = j + 1;
                }
            }
            if (b->padded > o->stage_n) o->stage_n = b->padded;
            if (b->shard > o->slice_n) o->slice_n = b->shard;
        }
    return MT_OK;
}

static void reset_readiness(struct mt_optim *o);

static float *alloc_zero(const struct mt_kernels *k, size_t n)
{
    float *p = k->op.alloc(k->ctx, sizeof(float) * (n ? n : 1));
    if (p) k->op.memset(k->ctx, p, 0, sizeof(float) * (n ? n : 1));
    return p;
}

int mt_optim_create(struct mt_model *m, const struct mt_kernels *k, const struct mt_parallel *par,
                    const struct mt_optim_opts *opts, struct mt_optim **out, struct mt_err *err)
{
    *out = NULL;
    struct mt_optim *o = calloc(1, sizeof *o);
    if (!o) return mt_err_set(err, MT_ENOMEM, "optimizer: out of memory");
    const struct mt_optim_opts none = {0};
    if (!opts) opts = &none;
    const size_t bucket_elems = opts->bucket_elems;
    o->model = m;
    o->k = k;
    o->par = par;
    o->zero = par && opts->distributed;
    o->overlap = par && opts->overlap_grad_reduce;
    o->overlap_params = o->overlap && o->zero && opts->overlap_param_gather;
    o->grad_scale = par ? 1.0 / par->dp : 1.0;
    o->tied = mt_model_pp_tied_embedding(m);
    int rc = MT_OK;
    const size_t n = mt_model_num_params(m);
    const int nt = mt_model_num_tensors(m);
    for (int i = 0; i < nt; i++)
        if (mt_model_tensor_position(m, i) + 2 > o->npos) o->npos = mt_model_tensor_position(m, i) + 2;
    o->pos_done = calloc((size_t)o->npos + 1, sizeof *o->pos_done);
    if (!o->pos_done) {
        rc = mt_err_set(err, MT_ENOMEM, "optimizer: out of memory");
        goto fail;
    }
    if (par) {
        MT_CHECK_GOTO(build_class(o, &o->c[0], false, par->comm[MT_GROUP_DP], bucket_elems, err), fail);
        MT_CHECK_GOTO(build_class(o, &o->c[1], true, par->comm[MT_GROUP_EDP], bucket_elems, err), fail);
        for (int i = 0; i < mt_model_num_tensors(m); i++)
            if (mt_model_tensor(m, i)->tp_replicated) o->tp_n += mt_model_tensor(m, i)->numel;
        o->stage = alloc_zero(k, o->stage_n);
        o->slice = alloc_zero(k, o->slice_n);
        o->tp_stage = par->tp > 1 ? alloc_zero(k, o->tp_n) : NULL;
        if (!o->stage || !o->slice || (par->tp > 1 && !o->tp_stage)) goto oom;
        if (o->overlap && !(o->packed = alloc_zero(k, o->packed_n))) goto oom;
        reset_readiness(o);
    }
    if (o->zero) {
        for (int i = 0; i < 2; i++) {
            struct klass *c = &o->c[i];
            c->grad = alloc_zero(k, c->slices);
            c->m = alloc_zero(k, c->slices);
            c->v = alloc_zero(k, c->slices);
            if (!c->grad || !c->m || !c->v) goto oom;
        }
    } else {
        o->m_full = alloc_zero(k, n);
        o->v_full = alloc_zero(k, n);
        if (!o->m_full || !o->v_full) goto oom;
    }
    *out = o;
    return MT_OK;
oom:
    rc = mt_err_set(err, MT_ENOMEM, "out of memory for the optimizer state (%zu values)", n);
fail:
    mt_optim_destroy(o);
    return rc;
}

void mt_optim_destroy(struct mt_optim *o)
{
    if (!o) return;
    const struct mt_kernels *k = o->k;
    for (int i = 0; i < 2; i++) {
        struct klass *c = &o->c[i];
        free(c->tensor);
        free(c->at);
        free(c->b);
        if (c->grad) k->op.free(k->ctx, c->grad);
        if (c->m) k->op.free(k->ctx, c->m);
        if (c->v) k->op.free(k->ctx, c->v);
    }
    if (o->stage) k->op.free(k->ctx, o->stage);
    if (o->slice) k->op.free(k->ctx, o->slice);
    if (o->tp_stage) k->op.free(k->ctx, o->tp_stage);
    if (o->packed) k->op.free(k->ctx, o->packed);
    free(o->pos_done);
    if (o->m_full) k->op.free(k->ctx, o->m_full);
    if (o->v_full) k->op.free(k->ctx, o->v_full);
    if (o->consts_host) k->op.free_host(k->ctx, o->consts_host);
    if (o->consts_dev) k->op.free(k->ctx, o->consts_dev);
    if (o->world_losses) k->op.free(k->ctx, o->world_losses);
    free(o);
}

/* ---- gradients -------------------------------------------------------------------------- */

/* Sums over the TP group the gradients of the TP-replicated tensors at backward
 * position pos (each TP rank computed the part of its tokens or heads), packed in table
 * order into tp_stage. One reduction per position, overlapped or not, so that the sums
 * are the same whichever way. */
static int reduce_over_tp(struct mt_optim *o, int pos, struct mt_err *err)
{
    const struct mt_kernels *k = o->k;
    float *g = mt_model_grads(o->model);
    size_t at = 0;
    for (int pass = 0; pass < 3; pass++) { /* pack, (reduce), unpack */
        if (pass == 1) {
            if (!at) return MT_OK;
            MT_CHECK(mt_all_reduce(o->par->comm[MT_GROUP_TP], o->tp_stage, at, MT_DT_F32,
                                   MT_OP_SUM, err));
            at = 0;
            continue;
        }
        for (int i = 0; i < mt_model_num_tensors(o->model); i++) {
            const struct mt_param_info *t = mt_model_tensor(o->model, i);
            if (!t->tp_replicated || !t->numel || mt_model_tensor_position(o->model, i) != pos)
                continue;
            float *mine = g + t->offset, *packed = o->tp_stage + at;
            k->op.copy(k->ctx, pass == 0 ? packed : mine, pass == 0 ? mine : packed,
                       sizeof(float) * t->numel);
            at += t->numel;
        }
    }
    return MT_OK;
}

/* Whether this rank counts tensor t in the global norm (without ZeRO, for its replicas). */
static bool counts_whole(const struct mt_optim *o, const struct mt_param_info *t)
{
    const struct mt_parallel *p = o->par;
    if (t->pp_replica) return false; /* the first stage counts the tied embedding */
    if (t->expert) return p->edp_rank == 0;
    return p->dp_rank == 0 && (!t->tp_replicated || p->tp_rank == 0);
}

struct norm_ctx {
    const struct mt_optim *o;
    const float *g;
};

static void norm_seg(void *p, const struct mt_param_info *t, size_t in_tensor, size_t in_range,
                     size_t n)
{
    struct norm_ctx *c = p;
    (void)in_tensor;
    if (t->tp_replicated && c->o->par->tp_rank != 0) return;
    if (t->pp_replica) return;
    c->o->k->op.sumsq(c->o->k->ctx, c->o->sumsq, c->g + in_range, n);
}

static int finish_gather(struct mt_optim *o, struct klass *c, struct bucket *b,
                         struct mt_err *err);

/* Where bucket b's reduction stages its gradients: its own part of o->packed when
 * buckets are in flight together (overlap), else the one staging buffer. */
static float *staging_of(const struct mt_optim *o, const struct bucket *b)
{
    return o->overlap ? o->packed + b->packed_at : o->stage;
}

/* Packs bucket b of class c and starts its reduction over c's group: a reduce-scatter
 * into this rank's slice (ZeRO) or an all-reduce in place. */
static int start_bucket(struct mt_optim *o, struct klass *c, struct bucket *b,
                        struct mt_err *err)
{
    const struct mt_kernels *k = o->k;
    float *st = staging_of(o, b);
    if (b->gathering) MT_CHECK(finish_gather(o, c, b, err)); /* the staging is shared */
    b->started = true;
    k->op.memset(k->ctx, st, 0, sizeof(float) * b->padded);
    pack(o, c, mt_model_grads(o->model), b->begin, b->end, st, true);
    if (c->size == 1) return MT_OK;
    if (o->zero)
        return mt_reduce_scatter_start(c->comm, st, c->grad + b->at, b->shard, MT_DT_F32,
                                       MT_OP_SUM, &b->req, err);
    return mt_all_reduce_start(c->comm, st, b->end - b->begin, MT_DT_F32, MT_OP_SUM, &b->req,
                               err);
}

/* After bucket b's reduction: scaled to the global-batch mean; with ZeRO its slice's
 * squares added to the norm, else the sum unpacked into the gradients. Run in bucket
 * order, overlapped or not, so that the norm is summed in one order. */
static int finish_bucket(struct mt_optim *o, struct klass *c, struct bucket *b,
                         struct mt_err *err)
{
    const struct mt_kernels *k = o->k;
    float *st = staging_of(o, b);
    MT_CHECK(mt_comm_wait(&b->req, err));
    if (o->zero) {
        float *mine = c->grad + b->at;
        if (c->size == 1) k->op.copy(k->ctx, mine, st, sizeof(float) * b->shard);
        k->op.scale(k->ctx, mine, (float)o->grad_scale, b->shard);
        size_t lo, hi;
        slice_of(c, b, &lo, &hi);
        struct norm_ctx nc = {o, mine};
        for_each_segment(o, c, lo, hi, norm_seg, &nc);
    } else {
        k->op.scale(k->ctx, st, (float)o->grad_scale, b->end - b->begin);
        pack(o, c, mt_model_grads(o->model), b->begin, b->end, st, false);
    }
    return MT_OK;
}

/* Tensor i is complete: the buckets holding part of it have one tensor less to wait for. */
static void mark_final(struct mt_optim *o, int i)
{
    for (int ci = 0; ci < 2; ci++) {
        struct klass *c = &o->c[ci];
        for (int bi = 0; bi < c->nbuckets; bi++) {
            struct bucket *b = &c->b[bi];
            for (int j = b->j0; j < b->j1; j++)
                if (c->tensor[j] == i) b->unready--;
        }
    }
}

/* Every bucket's count of tensors to wait for, at the start of a step. */
static void reset_readiness(struct mt_optim *o)
{
    memset(o->pos_done, 0, sizeof *o->pos_done * (size_t)o->npos);
    for (int ci = 0; ci < 2; ci++) {
        struct klass *c = &o->c[ci];
        for (int bi = 0; bi < c->nbuckets; bi++) {
            struct bucket *b = &c->b[bi];
            b->unready = 0;
            b->started = false;
            for (int j = b->j0; j < b->j1; j++)
                b->unready += mt_model_tensor(o->model, c->tensor[j])->numel > 0;
        }
    }
}

/* Starts, last bucket first (the order backward completes them), every bucket whose
 * tensors are all final. */
static int start_ready(struct mt_optim *o, struct mt_err *err)
{
    for (int ci = 0; ci < 2; ci++) {
        struct klass *c = &o->c[ci];
        for (int bi = c->nbuckets - 1; bi >= 0; bi--)
            if (!c->b[bi].started && c->b[bi].unready == 0) {
                MT_CHECK(start_bucket(o, c, &c->b[bi], err));
                o->early++;
            }
    }
    return MT_OK;
}

/* Position pos is complete: the TP sum of its replicated tensors, then they are final
 * (the embedding tied across stages waits for its sum over the embedding group, after
 * backward). */
static int position_done(struct mt_optim *o, int pos, struct mt_err *err)
{
    if (pos < -1 || pos + 1 >= o->npos || o->pos_done[pos + 1]) return MT_OK;
    o->pos_done[pos + 1] = true;
    if (o->par->tp > 1) MT_CHECK(reduce_over_tp(o, pos, err));
    for (int i = 0; i < mt_model_num_tensors(o->model); i++)
        if (i != o->tied && mt_model_tensor_position(o->model, i) == pos &&
            mt_model_tensor(o->model, i)->numel)
            mark_final(o, i);
    return MT_OK;
}

int mt_optim_grads_ready(struct mt_optim *o, int position, struct mt_err *err)
{
    if (!o->par || !o->overlap) return MT_OK;
    MT_CHECK(position_done(o, position, err));
    return start_ready(o, err);
}

/* norm (when given) = the square root of the summed squares, read from the backend. */
static int read_norm(const struct mt_optim *o, double *norm)
{
    if (!norm) return MT_OK;
    double s;
    o->k->op.copy(o->k->ctx, &s, o->sumsq, sizeof s);
    *norm = sqrt(s);
    return MT_OK;
}

/* The global gradient norm is summed on the backend (o->sumsq), reduced over the world
 * there, and read once: here when norm is given, else by the caller with the model's
 * scalars (mt_model_read_stats). */
int mt_optim_reduce_grads(struct mt_optim *o, double *norm, struct mt_err *err)
{
    const struct mt_kernels *k = o->k;
    float *g = mt_model_grads(o->model);
    o->sumsq = mt_model_sumsq_acc(o->model);
    k->op.memset(k->ctx, o->sumsq, 0, sizeof(double));
    if (!o->par) { /* one process: the norm of everything, in table order */
        k->op.sumsq(k->ctx, o->sumsq, g, mt_model_num_params(o->model));
        return read_norm(o, norm);
    }
    /* What backward did not report (all of it without overlap), position by position
     * as backward finishes them. */
    for (int pos = o->npos - 2; pos >= -1; pos--) MT_CHECK(position_done(o, pos, err));
    /* Pipeline parallelism with tied embeddings: the first stage's embedding and the
     * last stage's copy (its LM head) each got their part of the gradient; the sum
     * over the embedding group gives both the whole, so their updates stay equal. */
    if (o->tied >= 0) {
        const struct mt_param_info *t = mt_model_tensor(o->model, o->tied);
        MT_CHECK(mt_all_reduce(o->par->comm[MT_GROUP_EMBD], g + t->offset, t->numel, MT_DT_F32,
                               MT_OP_SUM, err));
        if (t->numel) mark_final(o, o->tied);
    }
    /* Overlapped: the buckets not started yet, then every one waited for and finished in
     * bucket order. Not: each started, waited for and finished in turn (one staging). */
    for (int ci = 0; ci < 2; ci++) {
        struct klass *c = &o->c[ci];
        for (int bi = 0; bi < c->nbuckets; bi++) {
            if (!c->b[bi].started) MT_CHECK(start_bucket(o, c, &c->b[bi], err));
            if (!o->overlap) MT_CHECK(finish_bucket(o, c, &c->b[bi], err));
        }
    }
    for (int ci = 0; o->overlap && ci < 2; ci++)
        for (int bi = 0; bi < o->c[ci].nbuckets; bi++)
            MT_CHECK(finish_bucket(o, &o->c[ci], &o->c[ci].b[bi], err));
    o->last_early = o->early;
    o->early = 0;
    reset_readiness(o);
    if (!o->zero) {
        for (int i = 0; i < mt_model_num_tensors(o->model); i++) {
            const struct mt_param_info *t = mt_model_tensor(o->model, i);
            if (counts_whole(o, t)) k->op.sumsq(k->ctx, o->sumsq, g + t->offset, t->numel);
        }
    }
    MT_CHECK(mt_all_reduce(o->par->world_comm, o->sumsq, 1, MT_DT_F64, MT_OP_SUM, err));
    return read_norm(o, norm);
}

/* ---- the step --------------------------------------------------------------------------- */

struct adam_ctx {
    const struct mt_optim *o;
    const struct mt_config_optimizer *c;
    float *p, *g, *m, *v; /* slices, indexed by the range offset */
    float lr, clip;
    long long t;
    /* mt_optim_step_dev: adamw_dev with these losses (lr, clip and t unused), else NULL */
    const double *loss;
    int loss_stride, nloss;
};

static void adam_seg(void *p, const struct mt_param_info *t, size_t in_tensor, size_t in_range,
                     size_t n)
{
    struct adam_ctx *a = p;
    (void)in_tensor;
    const struct mt_config_optimizer *c = a->c;
    const struct mt_kernels *k = a->o->k;
    if (a->loss) {
        k->op.adamw_dev(k->ctx, a->p + in_range, a->g + in_range, a->m + in_range,
                        a->v + in_range, n, a->o->consts_dev + !t->no_weight_decay,
                        mt_model_sumsq_acc(a->o->model), a->loss, a->loss_stride, a->nloss,
                        c->clip_grad);
        return;
    }
    float wd = t->no_weight_decay ? 0.0f : (float)c->weight_decay;
    k->op.adamw(k->ctx, a->p + in_range, a->g + in_range, a->m + in_range, a->v + in_range, n,
                a->lr, (float)c->adam_beta1, (float)c->adam_beta2, (float)c->adam_eps, wd,
                a->clip, a->t);
}

/* ZeRO: this rank's slices of the master weights updated (AdamW as a says, a->p, g, m, v
 * set per bucket here), then every slice gathered into the parameters. */
static int step_slices(struct mt_optim *o, struct adam_ctx a, struct mt_err *err)
{
    float *params = mt_model_params(o->model);
    for (int ci = 0; ci < 2; ci++) {
        struct klass *cl = &o->c[ci];
        for (int bi = 0; bi < cl->nbuckets; bi++) {
            const struct bucket *b = &cl->b[bi];
            size_t lo, hi;
            slice_of(cl, b, &lo, &hi);
            o->k->op.memset(o->k->ctx, o->slice, 0, sizeof(float) * b->shard);
            pack(o, cl, params, lo, hi, o->slice, true);
            a.p = o->slice;
            a.g = cl->grad + b->at;
            a.m = cl->m + b->at;
            a.v = cl->v + b->at;
            for_each_segment(o, cl, lo, hi, adam_seg, &a);
            if (cl->size > 1)
                MT_CHECK(mt_all_gather(cl->comm, o->slice, o->stage, b->shard, MT_DT_F32, err));
            else
                o->k->op.copy(o->k->ctx, o->stage, o->slice, sizeof(float) * b->shard);
            pack(o, cl, params, b->begin, b->end, o->stage, false);
        }
    }
    mt_model_params_updated(o->model);
    return MT_OK;
}

/* overlap_param_gather: each bucket's slice updated in place in its block of the
 * bucket's staging (the same AdamW on the same values as mt_optim_step's other path),
 * whose all-gather is started and left in flight: mt_optim_params_needed or
 * mt_optim_params_wait completes it, unpacks and refreshes the working copy. */
static int step_gathers_started(struct mt_optim *o, const struct mt_config_optimizer *c,
                                double lr, double clip_coeff, long long t, struct mt_err *err)
{
    float *params = mt_model_params(o->model);
    for (int ci = 0; ci < 2; ci++) {
        struct klass *cl = &o->c[ci];
        for (int bi = 0; bi < cl->nbuckets; bi++) {
            struct bucket *b = &cl->b[bi];
            float *st = staging_of(o, b), *mine = st + (size_t)cl->rank * b->shard;
            size_t lo, hi;
            slice_of(cl, b, &lo, &hi);
            o->k->op.memset(o->k->ctx, mine, 0, sizeof(float) * b->shard);
            pack(o, cl, params, lo, hi, mine, true);
            struct adam_ctx a = {.o = o, .c = c, .p = mine, .g = cl->grad + b->at,
                                 .m = cl->m + b->at, .v = cl->v + b->at, .lr = (float)lr,
                                 .clip = (float)clip_coeff, .t = t};
            for_each_segment(o, cl, lo, hi, adam_seg, &a);
            if (cl->size > 1)
                MT_CHECK(mt_all_gather_start(cl->comm, mine, st, b->shard, MT_DT_F32, &b->req,
                                             err));
            b->gathering = true;
            o->gathers++;
        }
    }
    return MT_OK;
}

struct refresh_ctx {
    struct mt_model *m;
};

static void refresh_seg(void *p, const struct mt_param_info *t, size_t in_tensor,
                        size_t in_range, size_t n)
{
    (void)in_range;
    mt_model_params_updated_range(((struct refresh_ctx *)p)->m, t->offset + in_tensor, n);
}

/* Bucket b's gathered parameters into the model, and their working copy refreshed. */
static int finish_gather(struct mt_optim *o, struct klass *c, struct bucket *b,
                         struct mt_err *err)
{
    MT_CHECK(mt_comm_wait(&b->req, err));
    b->gathering = false;
    o->gathers--;
    pack(o, c, mt_model_params(o->model), b->begin, b->end, staging_of(o, b), false);
    struct refresh_ctx rc = {o->model};
    for_each_segment(o, c, b->begin, b->end, refresh_seg, &rc);
    return MT_OK;
}

int mt_optim_params_needed(struct mt_optim *o, int position, struct mt_err *err)
{
    for (int ci = 0; o->gathers && ci < 2; ci++) {
        struct klass *c = &o->c[ci];
        for (int bi = 0; bi < c->nbuckets; bi++) {
            struct bucket *b = &c->b[bi];
            if (!b->gathering) continue;
            for (int j = b->j0; j < b->j1; j++)
                if (mt_model_tensor_position(o->model, c->tensor[j]) == position &&
                    mt_model_tensor(o->model, c->tensor[j])->numel) {
                    MT_CHECK(finish_gather(o, c, b, err));
                    break;
                }
        }
    }
    return MT_OK;
}

int mt_optim_params_wait(struct mt_optim *o, struct mt_err *err)
{
    for (int ci = 0; o->gathers && ci < 2; ci++)
        for (int bi = 0; bi < o->c[ci].nbuckets; bi++)
            if (o->c[ci].b[bi].gathering) MT_CHECK(finish_gather(o, &o->c[ci], &o->c[ci].b[bi], err));
    return MT_OK;
}

int mt_optim_stage_step(struct mt_optim *o, const struct mt_config_optimizer *c, double lr,
                        long long t, struct mt_err *err)
{
    const struct mt_kernels *k = o->k;
    if (o->overlap_params)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "optimizer: the step with its scalars on the device does not leave "
                          "the parameters' all-gathers in flight (overlap_param_gather)");
    if (!o->consts_host) { /* before the first step, never inside a captured one */
        o->consts_host = k->op.alloc_host(k->ctx, 2 * sizeof *o->consts_host);
        o->consts_dev = k->op.alloc(k->ctx, 2 * sizeof *o->consts_dev);
        if (!o->consts_host || !o->consts_dev)
            return mt_err_set(err, MT_ENOMEM, "optimizer: out of memory for AdamW's constants");
    }
    for (int wd = 0; wd < 2; wd++)
        o->consts_host[wd] = mt_adamw_consts_of((float)lr, (float)c->adam_beta1, (float)c->adam_beta2,
                                                (float)c->adam_eps, wd ? (float)c->weight_decay : 0.0f, t);
    return MT_OK;
}

int mt_optim_step_dev(struct mt_optim *o, const struct mt_config_optimizer *c,
                      struct mt_step_gate *gate, struct mt_err *err)
{
    struct mt_model *m = o->model;
    if (!o->consts_dev)
        return mt_err_set(err, MT_EINVAL, "optimizer: mt_optim_step_dev without mt_optim_stage_step");
    void *const dst[1] = {o->consts_dev};
    const void *const src[1] = {o->consts_host};
    const size_t bytes[1] = {2 * sizeof *o->consts_dev};
    mt_model_upload(m, 1, dst, src, bytes);
    int stride, nloss;
    const double *loss = mt_model_loss_sums(m, &stride, &nloss);
    if (o->par) { /* every rank skips when the loss summed over the world is not finite */
        /* the records from the first loss sum to the last, one copy and one all-reduce
         * (a copy per forward would cost the step a launch each); the records' other
         * fields are summed along and not read, the sums keep their stride */
        const size_t n = nloss > 0 ? (size_t)(nloss - 1) * (size_t)stride + 1 : 0;
        if (!o->world_losses) { /* the first step is eager (warmup_steps >= 1) */
            o->world_losses = o->k->op.alloc(o->k->ctx, sizeof(double) * (n ? n : 1));
            o->world_losses_n = n;
            if (!o->world_losses)
                return mt_err_set(err, MT_ENOMEM, "optimizer: out of memory for the losses");
        }
        if (n > o->world_losses_n)
            return mt_err_set(err, MT_EINVAL, "optimizer: %d forwards in a step, room for the "
                              "losses of fewer", nloss);
        if (n) o->k->op.copy(o->k->ctx, o->world_losses, loss, sizeof(double) * n);
        MT_CHECK(mt_all_reduce(o->par->world_comm, o->world_losses, n, MT_DT_F64, MT_OP_SUM, err));
        loss = o->world_losses;
    }
    *gate = (struct mt_step_gate){mt_model_sumsq_acc(m), loss, stride, nloss};
    /* the routers' expert biases, gated as the update below (no upload) */
    MT_CHECK(mt_model_update_expert_bias_dev(m, loss, stride, nloss, err));
    if (o->zero) {
        const struct adam_ctx a = {.o = o, .c = c, .loss = loss, .loss_stride = stride,
                                   .nloss = nloss};
        return step_slices(o, a, err);
    }
    float *params = mt_model_params(m), *grads = mt_model_grads(m);
    for (int i = 0; i < mt_model_num_tensors(m); i++) {
        const struct mt_param_info *pi = mt_model_tensor(m, i);
        o->k->op.adamw_dev(o->k->ctx, params + pi->offset, grads + pi->offset, o->m_full + pi->offset,
                           o->v_full + pi->offset, pi->numel, o->consts_dev + !pi->no_weight_decay,
                           mt_model_sumsq_acc(m), loss, stride, nloss, c->clip_grad);
    }
    mt_model_params_updated(m);
    return MT_OK;
}

int mt_optim_step(struct mt_optim *o, const struct mt_config_optimizer *c, double lr,
                  double clip_coeff, long long t, struct mt_err *err)
{
    struct mt_model *m = o->model;
    float *params = mt_model_params(m), *grads = mt_model_grads(m);
    if (!o->zero) {
        for (int i = 0; i < mt_model_num_tensors(m); i++) {
            const struct mt_param_info *pi = mt_model_tensor(m, i);
            float wd = pi->no_weight_decay ? 0.0f : (float)c->weight_decay;
            o->k->op.adamw(o->k->ctx, params + pi->offset, grads + pi->offset, o->m_full + pi->offset,
                           o->v_full + pi->offset, pi->numel, (float)lr, (float)c->adam_beta1,
                           (float)c->adam_beta2, (float)c->adam_eps, wd, (float)clip_coeff, t);
        }
        mt_model_params_updated(m);
        return MT_OK;
    }
    if (o->overlap_params) return step_gathers_started(o, c, lr, clip_coeff, t, err);
    const struct adam_ctx a = {.o = o, .c = c, .lr = (float)lr, .clip = (float)clip_coeff, .t = t};
    return step_slices(o, a, err);
}

/* ---- state ------------------------------------------------------------------------------ */

int mt_optim_export(struct mt_optim *o, float *m, float *v, struct mt_err *err)
{
    const size_t n = mt_model_num_params(o->model);
    if (!o->zero) {
        o->k->op.copy(o->k->ctx, m, o->m_full, sizeof(float) * n);
        o->k->op.copy(o->k->ctx, v, o->v_full, sizeof(float) * n);
        return MT_OK;
    }
    for (int ci = 0; ci < 2; ci++) {
        struct klass *c = &o->c[ci];
        for (int bi = 0; bi < c->nbuckets; bi++) {
            const struct bucket *b = &c->b[bi];
            for (int which = 0; which < 2; which++) {
                float *mine = (which ? c->v : c->m) + b->at;
                if (c->size > 1)
                    MT_CHECK(mt_all_gather(c->comm, mine, o->stage, b->shard, MT_DT_F32, err));
                else
                    o->k->op.copy(o->k->ctx, o->stage, mine, sizeof(float) * b->shard);
                pack(o, c, which ? v : m, b->begin, b->end, o->stage, false);
            }
        }
    }
    return MT_OK;
}

void mt_optim_import(struct mt_optim *o, const float *m, const float *v)
{
    const size_t n = mt_model_num_params(o->model);
    if (!o->zero) {
        o->k->op.copy(o->k->ctx, o->m_full, m, sizeof(float) * n);
        o->k->op.copy(o->k->ctx, o->v_full, v, sizeof(float) * n);
        return;
    }
    for (int ci = 0; ci < 2; ci++) {
        struct klass *c = &o->c[ci];
        for (int bi = 0; bi < c->nbuckets; bi++) {
            const struct bucket *b = &c->b[bi];
            size_t lo, hi;
            slice_of(c, b, &lo, &hi);
            pack(o, c, (float *)m, lo, hi, c->m + b->at, true);
            pack(o, c, (float *)v, lo, hi, c->v + b->at, true);
        }
    }
}

int mt_optim_pieces(const struct mt_optim *o, struct mt_optim_piece **out, int *count,
                    struct mt_err *err)
{
    *out = NULL;
    *count = 0;
    const int nt = mt_model_num_tensors(o->model);
    size_t cap = (size_t)nt + 1;
    if (o->zero)
        for (int ci = 0; ci < 2; ci++) cap += (size_t)o->c[ci].nbuckets;
    struct mt_optim_piece *p = calloc(cap, sizeof *p);
    if (!p) return mt_err_set(err, MT_ENOMEM, "optimizer: out of memory");
    int n = 0;
    if (!o->zero) {
        for (int i = 0; i < nt; i++) {
            const struct mt_param_info *t = mt_model_tensor(o->model, i);
            if (t->numel)
                p[n++] = (struct mt_optim_piece){i, 0, t->numel, o->m_full + t->offset,
                                                 o->v_full + t->offset};
        }
    } else {
        /* a bucket's slice meets each tensor of the bucket in one contiguous run; the
         * tensors' parts in the buckets number at most tensors + buckets */
        for (int ci = 0; ci < 2; ci++) {
            const struct klass *c = &o->c[ci];
            for (int bi = 0; bi < c->nbuckets; bi++) {
                const struct bucket *b = &c->b[bi];
                size_t lo, hi;
                slice_of(c, b, &lo, &hi);
                for (int j = 0; j < c->n && lo < hi; j++) {
                    const struct mt_param_info *t = mt_model_tensor(o->model, c->tensor[j]);
                    size_t a = c->at[j], e = a + t->numel;
                    size_t s = a > lo ? a : lo, f = e < hi ? e : hi;
                    if (s >= f) continue;
                    p[n++] = (struct mt_optim_piece){c->tensor[j], s - a, f - s,
                                                     c->m + b->at + (s - lo),
                                                     c->v + b->at + (s - lo)};
                }
            }
        }
    }
    *out = p;
    *count = n;
    return MT_OK;
}

bool mt_optim_zero(const struct mt_optim *o) { return o->zero; }

void mt_optim_overlap_counts(const struct mt_optim *o, int *early, int *total)
{
    *early = o->last_early;
    *total = o->c[0].nbuckets + o->c[1].nbuckets;
}

void mt_optim_bytes(const struct mt_optim *o, struct mt_optim_bytes *b)
{
    /* what mt_optim_create allocated (alloc_zero takes 1 value for an empty buffer) */
    size_t staging = 0;
    if (o->par) staging = (o->stage_n ? o->stage_n : 1) + (o->slice_n ? o->slice_n : 1) +
                          (o->tp_stage ? (o->tp_n ? o->tp_n : 1) : 0) +
                          (o->packed ? (o->packed_n ? o->packed_n : 1) : 0);
    size_t slices = 0;
    for (int i = 0; o->zero && i < 2; i++) slices += o->c[i].slices ? o->c[i].slices : 1;
    b->moments = sizeof(float) * (o->zero ? 2 * slices : 2 * mt_model_num_params(o->model));
    b->grad_shards = sizeof(float) * (o->zero ? slices : 0);
    b->staging = sizeof(float) * staging;
}

size_t mt_optim_memory(const struct mt_optim *o)
{
    struct mt_optim_bytes b;
    mt_optim_bytes(o, &b);
    return b.moments + b.grad_shards + b.staging;
}

/* Checkpoints of a run in any layout, in the sharded format (ckpt_shard.h).
 *
 * A save: world rank 0 creates DIR/iter_N.tmp; every rank writes what it owns into
 * its own rank_R.safetensors there and syncs it; the ranks agree that all succeeded;
 * rank 0 gathers the slices' index entries, writes index.json and publishes the
 * directory (checkpoint.c: one rename, then latest). Nothing passes through one rank
 * but the index.
 *
 * What a rank owns: of each tensor, the copy of data-parallel rank 0 (expert-DP rank
 * 0 for routed experts), of a TP-replicated tensor TP rank 0's, of a tied embedding
 * the first stage's; with ZeRO-1 every data-parallel rank owns its slices of the
 * parameters and moments (the moments exist only there).
 *
 * A load: rank 0 finds the checkpoint and reads its index (or verifies a one-process
 * state.bin), every rank gets the index, computes the slices it needs (its shards of
 * the parameters, its moments: whole shards or ZeRO slices, the expert biases) and
 * reads the parts of the stored slices that overlap them, a block at a time. The
 * model and optimizer change only once every rank has read everything. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "train/ckpt_shard.h"
#include "train/train.h"

#define TAG_SLICES 7103

/* Where a process sits: what decides its shards and whether it owns them. */
struct rank_info {
    struct mt_shard_coords sc;
    int dp_rank, edp_rank;
    int stage;                  /* pipeline stage: which tensors it holds */
    int world_rank;
};

static void info_of(const struct mt_parallel *par, struct rank_info *r)
{
    if (!par) {
        *r = (struct rank_info){{1, 0, 1, 0, 1, 0}, 0, 0, 0, 0};
        return;
    }
    r->sc = (struct mt_shard_coords){par->tp, par->tp_rank, par->ep, par->ep_rank, par->etp,
                                     par->etp_rank};
    r->dp_rank = par->dp_rank;
    r->edp_rank = par->edp_rank;
    r->stage = par->pp_rank;
    r->world_rank = par->world->comm->rank;
}

/* Whether this rank's piece of tensor i is the one a save stores (see above). */
static bool owns(const struct mt_model *m, int i, const struct rank_info *r, bool zero)
{
    const struct mt_param_info *t = mt_model_tensor(m, i);
    bool replica;
    if (!mt_model_tensor_on_stage(m, i, r->stage, &replica) || replica) return false;
    if (!t->expert && t->tp_replicated && r->sc.tp_rank != 0) return false;
    if (zero) return true;
    return t->expert ? r->edp_rank == 0 : r->dp_rank == 0;
}

static struct mt_comm *world_of(const struct mt_parallel *par)
{
    return par ? par->world->comm : NULL;
}

int mt_ckpt_agree_on_rank0(const struct mt_parallel *par, int rc, const char *what,
                           struct mt_err *err)
{
    struct mt_comm *world = world_of(par);
    if (!world || world->size == 1) return rc;
    int32_t code = rc;
    struct mt_err berr;
    if (mt_broadcast(world, &code, 1, MT_DT_I32, 0, &berr)) {
        *err = berr;
        return berr.code;
    }
    if (world->rank != 0 && code != MT_OK)
        return mt_err_set(err, code, "%s failed on rank 0 (its message says why)", what);
    return code;
}

/* Every rank's outcome: MT_OK when all succeeded; otherwise a failed rank keeps its
 * message and the others name the first rank that failed. */
static int agree_all(struct mt_comm *world, int rc, const char *what, struct mt_err *err)
{
    if (!world || world->size == 1) return rc;
    int32_t first = rc ? world->rank : world->size;
    struct mt_err berr;
    if (mt_all_reduce(world, &first, 1, MT_DT_I32, MT_OP_MIN, &berr)) {
        if (rc) return rc;
        *err = berr;
        return berr.code;
    }
    if (first == world->size || rc) return rc;
    return mt_err_set(err, MT_EIO, "%s failed on rank %d (its message says why)", what, first);
}

int mt_ckpt_agree_all(const struct mt_parallel *par, int rc, const char *what,
                      struct mt_err *err)
{
    return agree_all(world_of(par), rc, what, err);
}

/* ---- measuring host memory ----------------------------------------------------- */

static long long proc_status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) {
            kb = atoll(line + n);
            break;
        }
    fclose(f);
    return kb;
}

/* Resets the process's peak resident size to its current one (Linux clear_refs 5);
 * returns the current size in bytes, or -1 where that cannot be done. */
static long long rss_mark(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    bool ok = fputs("5", f) >= 0;
    ok = fclose(f) == 0 && ok;
    long long kb = proc_status_kb("VmRSS:");
    return ok && kb >= 0 ? kb * 1024 : -1;
}

/* How far the peak resident size rose above mark (bytes; -1 unknown). */
static long long rss_rise(long long mark)
{
    long long kb = mark < 0 ? -1 : proc_status_kb("VmHWM:");
    if (kb < 0) return -1;
    return kb * 1024 > mark ? kb * 1024 - mark : 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The figures of every rank, reduced: the largest of each (a collective). rise: the
 * rank's measured rise of its peak resident size (-1: unknown); the times of an async
 * save are in stats already. */
static void finish_stats(struct mt_comm *world, struct mt_ckpt_stats *stats, double t0,
                         long long rise, size_t shard_bytes)
{
    int64_t v[3] = {(int64_t)mt_shard_mem_peak(), rise, (int64_t)shard_bytes};
    double t[5] = {stats->snapshot_s, stats->wait_s, stats->publish_s, stats->write_s,
                   stats->blocked_s};
    struct mt_err ignored;
    if (world && world->size > 1) {
        mt_all_reduce(world, v, 3, MT_DT_I64, MT_OP_MAX, &ignored);
        mt_all_reduce(world, t, 5, MT_DT_F64, MT_OP_MAX, &ignored);
    }
    stats->seconds = now_s() - t0;
    stats->counted_peak = (size_t)v[0];
    stats->rss_rise = v[1];
    stats->shard_bytes = (size_t)v[2];
    stats->block_bytes = mt_shard_block_bytes();
    stats->snapshot_s = t[0];
    stats->wait_s = t[1];
    stats->publish_s = t[2];
    stats->write_s = t[3];
    stats->blocked_s = t[4];
}

/* ---- the pieces a rank stores or needs -------------------------------------------- */

static void piece_of(const struct mt_param_info *t, const struct rank_info *r,
                     const char *prefix, size_t lo, size_t hi, float *data, bool backend,
                     struct mt_shard_piece *p)
{
    snprintf(p->name, sizeof p->name, "%s%s", prefix, t->name);
    p->ndim = t->ndim;
    long long ls[4] = {0}, st[4] = {0};
    mt_param_shard(t, &r->sc, ls, st);
    for (int d = 0; d < 4; d++) {
        p->start[d] = d < t->ndim ? st[d] : 0;
        p->shape[d] = d < t->ndim ? ls[d] : 0;
    }
    p->lo = lo;
    p->hi = hi;
    p->data = data;
    p->backend = backend;
}

static int alloc_pieces(size_t n, struct mt_shard_piece **p, struct mt_err *err)
{
    *p = calloc(n ? n : 1, sizeof **p);
    if (!*p) return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    return MT_OK;
}

/* The model's table as a checkpoint view (names and global shapes). */
static int model_table(struct mt_model *m, struct mt_ckpt_view *v, struct mt_err *err)
{
    const int n = mt_model_num_tensors(m);
    memset(v, 0, sizeof *v);
    const char **names = calloc((size_t)n + 1, sizeof *names);
    int *ndims = calloc((size_t)n + 1, sizeof *ndims);
    long long (*shapes)[4] = calloc((size_t)n + 1, sizeof *shapes);
    if (!names || !ndims || !shapes) {
        free(names);
        free(ndims);
        free(shapes);
        return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    }
    for (int i = 0; i < n; i++) {
        const struct mt_param_info *t = mt_model_tensor(m, i);
        names[i] = t->name;
        ndims[i] = t->ndim;
        for (int d = 0; d < 4; d++) shapes[i][d] = d < t->ndim ? t->shape[d] : 0;
    }
    v->ntensors = n;
    v->names = names;
    v->ndims = ndims;
    v->shapes = (const long long (*)[4])shapes;
    v->nparams = mt_model_num_global_params(m);
    mt_model_buffers(m, &v->nbuffers);
    return MT_OK;
}

static void model_table_free(struct mt_ckpt_view *v)
{
    free((void *)v->names);
    free((void *)v->ndims);
    free((void *)v->shapes);
}

/* ---- saving --------------------------------------------------------------------- */

/* The layout for the index (par NULL: one process; vpp from the configuration, 0 for 1). */
static void layout_json(const struct mt_parallel *par, int vpp, bool zero, char *out, size_t len)
{
    int world = par ? par->world->comm->size : 1;
    snprintf(out, len,
             "{\"world\": %d, \"tp\": %d, \"pp\": %d, \"vpp\": %d, \"ep\": %d, \"etp\": %d, "
             "\"dp\": %d, \"edp\": %d, \"zero1\": %s}",
             world, par ? par->tp : 1, par ? par->pp : 1, vpp > 0 ? vpp : 1,
             par ? par->ep : 1, par ? par->etp : 1, par ? par->dp : 1, par ? par->edp : 1,
             zero ? "true" : "false");
}

/* The pieces this rank stores (backend memory): its parameters and moments, and on
 * world rank 0 the expert biases (host memory). *bytes gets their size. */
static int plan_own(struct mt_model *m, struct mt_optim *o, const struct rank_info *r,
                    struct mt_shard_piece **out, int *count, size_t *bytes, struct mt_err *err)
{
    struct mt_optim_piece *op = NULL;
    int nop = 0;
    MT_CHECK(mt_optim_pieces(o, &op, &nop, err));
    struct mt_shard_piece *p = NULL;
    int rc = alloc_pieces(3 * (size_t)nop + 1, &p, err);
    int n = 0;
    const bool zero = mt_optim_zero(o);
    float *params = mt_model_params(m);
    for (int j = 0; rc == MT_OK && j < nop; j++) {
        const struct mt_param_info *t = mt_model_tensor(m, op[j].tensor);
        if (!owns(m, op[j].tensor, r, zero)) continue;
        size_t lo = op[j].at, hi = op[j].at + op[j].n;
        piece_of(t, r, "", lo, hi, params + t->offset + lo, true, &p[n++]);
        piece_of(t, r, MT_SHARD_PREFIX_M, lo, hi, op[j].m, true, &p[n++]);
        piece_of(t, r, MT_SHARD_PREFIX_V, lo, hi, op[j].v, true, &p[n++]);
    }
    size_t nb = 0;
    float *bias = mt_model_buffers(m, &nb);
    const long long nbl = (long long)nb;
    if (rc == MT_OK && nb && r->world_rank == 0)
        mt_shard_whole_piece(&p[n++], "", MT_SHARD_BIAS, 1, &nbl, bias);
    free(op);
    if (rc) {
        free(p);
        return rc;
    }
    *bytes = 0;
    for (int i = 0; i < n; i++) *bytes += sizeof(float) * (p[i].hi - p[i].lo);
    *out = p;
    *count = n;
    return MT_OK;
}

/* Rank 0 collects every rank's index entries, in rank order (a collective). */
static int gather_slices(struct mt_comm *world, char **text, size_t *len, struct mt_err *err)
{
    if (!world || world->size == 1) return MT_OK;
    const int P = world->size;
    int64_t mine = (int64_t)*len, *lens = malloc(sizeof(int64_t) * (size_t)P);
    if (!lens) return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    int rc = mt_all_gather(world, &mine, lens, 1, MT_DT_I64, err);
    if (rc == MT_OK && world->rank != 0 && mine)
        rc = mt_send(world, *text, (size_t)mine, MT_DT_U8, 0, TAG_SLICES, err);
    if (rc == MT_OK && world->rank == 0) {
        size_t total = 0;
        for (int r = 0; r < P; r++) total += (size_t)lens[r];
        char *all = malloc(total + 1);
        if (!all) rc = mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
        size_t at = 0;
        if (rc == MT_OK && mine) memcpy(all, *text, (size_t)mine);
        at += (size_t)mine;
        for (int r = 1; rc == MT_OK && r < P; r++) {
            if (lens[r]) rc = mt_recv(world, all + at, (size_t)lens[r], MT_DT_U8, r, TAG_SLICES,
                                      err);
            at += (size_t)lens[r];
        }
        if (rc == MT_OK) {
            free(*text);
            *text = all;
            *len = total;
        } else {
            free(all);
        }
    }
    free(lens);
    return rc;
}

/* A save between its start at a step boundary and its publication. The rank's file
 * is written from the training state (synchronous) or from a host snapshot by a writer
 * thread (async); the writer makes no MPI call (the library is initialised
 * MPI_THREAD_FUNNELED): every collective is the main thread's, in start and finish. */
struct mt_ckpt_save {
    const struct mt_ckpt_dir *dir;
    const struct mt_parallel *par;
    struct mt_model *m;
    struct mt_train_state st;
    const char *config_text;
    int keep_last;
    char layout[512];
    char tmp_dir[4300];
    struct rank_info me;
    struct mt_shard_piece *p;   /* what this rank writes */
    int n;
    size_t shard_bytes;
    struct mt_ckpt_staging *staging; /* async: the host copy the pieces point into */
    /* the write's outcome (the writer thread's until done) */
    char *slices;
    size_t slices_len;
    int rc;
    struct mt_err err;
    bool threaded;
    pthread_t thread;
    atomic_bool done;
    /* measurements */
    double t0, t_started, t_written, snapshot_s;
    long long mark, rss_rise;
};

static void write_file(struct mt_ckpt_save *s)
{
    FILE *f = open_memstream(&s->slices, &s->slices_len);
    if (!f) s->rc = mt_err_set(&s->err, MT_ENOMEM, "checkpoint: out of memory");
    if (s->rc == MT_OK && s->n) {
        char file[64];
        snprintf(file, sizeof file, "rank_%05d.safetensors", s->me.world_rank);
        s->rc = mt_shard_write(s->tmp_dir, file, s->p, s->n, mt_model_kernels(s->m),
                               mt_shard_block_bytes(), f, &s->err);
    }
    if (f && fclose(f) != 0 && s->rc == MT_OK)
        s->rc = mt_err_set(&s->err, MT_ENOMEM, "checkpoint: out of memory");
    s->t_written = now_s();
    atomic_store(&s->done, true);
}

static void *writer(void *arg)
{
    write_file(arg);
    return NULL;
}

void mt_ckpt_staging_release(struct mt_ckpt_staging *st)
{
    if (!st || !st->p) return;
    st->k->op.free_host(st->k->ctx, st->p);
    mt_shard_mem_released(st->bytes);
    st->p = NULL;
    st->bytes = 0;
}

/* Copies the pieces into the staging memory (taken now, or grown, if it is smaller than
 * the rank's part) and points them there. */
static int take_snapshot(struct mt_ckpt_save *s)
{
    struct mt_ckpt_staging *st = s->staging;
    const struct mt_kernels *k = mt_model_kernels(s->m);
    if (st->p && (st->bytes < s->shard_bytes || st->k != k)) mt_ckpt_staging_release(st);
    if (!st->p) {
        st->k = k;
        st->p = k->op.alloc_host(k->ctx, s->shard_bytes);
        if (!st->p)
            return mt_err_set(&s->err, MT_ENOMEM,
                              "checkpoint: no host memory for the %zu-byte snapshot of an "
                              "async save (checkpoint%%async_save keeps the rank's own part "
                              "in %shost memory; set it to .false.)",
                              s->shard_bytes, strcmp(k->name, "cuda") == 0 ? "page-locked " : "");
        st->bytes = s->shard_bytes;
        mt_shard_mem_held(st->bytes);
    }
    float *snapshot = st->p;
    size_t at = 0;
    for (int i = 0; i < s->n; i++) {
        const size_t n = s->p[i].hi - s->p[i].lo;
        if (s->p[i].backend) k->op.copy(k->ctx, snapshot + at, s->p[i].data, sizeof(float) * n);
        else memcpy(snapshot + at, s->p[i].data, sizeof(float) * n);
        s->p[i].data = snapshot + at;
        s->p[i].backend = false;
        at += n;
    }
    return MT_OK;
}

static void save_free(struct mt_ckpt_save *s)
{
    free(s->p);
    free(s->slices);
    free(s);
}

int mt_ckpt_save_start(const struct mt_ckpt_dir *dir, struct mt_model *m, struct mt_optim *o,
                       const struct mt_parallel *par, const struct mt_config *cfg,
                       const struct mt_train_state *st, const char *config_text,
                       struct mt_ckpt_staging *staging, struct mt_ckpt_save **out,
                       struct mt_err *err)
{
    const bool async = staging != NULL;
    *out = NULL;
    struct mt_ckpt_save *s = calloc(1, sizeof *s);
    int rc = s ? MT_OK : mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    MT_CHECK(agree_all(world_of(par), rc, "starting the checkpoint", err));
    s->t0 = now_s();
    mt_shard_mem_reset();
    s->mark = rss_mark();
    s->dir = dir;
    s->par = par;
    s->m = m;
    s->st = *st;
    s->config_text = config_text;
    s->keep_last = cfg->checkpoint.keep_last;
    s->staging = staging;
    layout_json(par, cfg->parallel.virtual_pipeline_model_parallel_size, mt_optim_zero(o),
                s->layout, sizeof s->layout);
    info_of(par, &s->me);
    atomic_init(&s->done, false);
    if (s->me.world_rank == 0)
        rc = mt_ckpt_begin(dir, st->iteration, s->tmp_dir, sizeof s->tmp_dir, err);
    rc = mt_ckpt_agree_on_rank0(par, rc, "creating the checkpoint directory", err);
    if (rc) {
        free(s);
        return rc;
    }
    snprintf(s->tmp_dir, sizeof s->tmp_dir, "%s/iter_%07lld.tmp", cfg->checkpoint.save,
             st->iteration);
    /* from here a failure is this rank's outcome, agreed on in finish */
    struct stat sb;
    if (stat(s->tmp_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        s->rc = mt_err_set(&s->err, MT_EIO,
                           "checkpoint: rank %d does not see '%s', which rank 0 created: "
                           "checkpoint%%save must be a directory that every node shares",
                           s->me.world_rank, s->tmp_dir);
    if (s->rc == MT_OK) s->rc = plan_own(m, o, &s->me, &s->p, &s->n, &s->shard_bytes, &s->err);
    if (s->rc == MT_OK && async) s->rc = take_snapshot(s);
    s->snapshot_s = now_s() - s->t0;
    s->t_started = now_s();
    if (s->rc == MT_OK && async) {
        s->rss_rise = rss_rise(s->mark); /* training goes on: measured over the snapshot */
        s->threaded = pthread_create(&s->thread, NULL, writer, s) == 0;
        if (!s->threaded) write_file(s); /* no thread to be had: written now */
    } else if (s->rc == MT_OK) {
        write_file(s);
    } else {
        s->t_written = now_s();
        atomic_store(&s->done, true);
    }
    *out = s;
    return MT_OK;
}

bool mt_ckpt_save_written(const struct mt_ckpt_save *s) { return atomic_load(&s->done); }

long long mt_ckpt_save_iteration(const struct mt_ckpt_save *s) { return s->st.iteration; }

int mt_ckpt_save_finish(struct mt_ckpt_save *s, struct mt_ckpt_stats *stats, struct mt_err *err)
{
    struct mt_comm *world = world_of(s->par);
    const double t_wait = now_s();
    if (s->threaded) pthread_join(s->thread, NULL);
    const double wait_s = now_s() - t_wait;
    const bool async = s->staging != NULL;
    int rc = s->rc;
    if (rc) *err = s->err;
    rc = agree_all(world, rc, "writing the checkpoint", err);
    if (rc == MT_OK) rc = gather_slices(world, &s->slices, &s->slices_len, err);
    if (s->me.world_rank == 0 && rc == MT_OK) {
        struct mt_ckpt_view table;
        rc = model_table(s->m, &table, err);
        if (rc == MT_OK) {
            rc = mt_shard_write_index(s->tmp_dir, &table, &s->st, s->layout,
                                      mt_shard_block_bytes(), s->slices, s->slices_len, err);
            model_table_free(&table);
        }
        if (rc == MT_OK)
            rc = mt_ckpt_publish(s->dir, s->st.iteration, s->config_text, s->keep_last, err);
        else
            mt_ckpt_abort(s->dir, s->st.iteration);
    } else if (s->me.world_rank == 0) {
        mt_ckpt_abort(s->dir, s->st.iteration);
    }
    rc = mt_ckpt_agree_on_rank0(s->par, rc, "saving the checkpoint", err);
    if (rc == MT_OK && stats) {
        const double end = now_s();
        stats->async = async;
        stats->write_s = s->t_written - s->t_started;
        stats->wait_s = wait_s;
        stats->publish_s = end - t_wait - wait_s;
        stats->snapshot_s = s->snapshot_s;
        stats->blocked_s = async ? s->snapshot_s + (end - t_wait) : end - s->t0;
        finish_stats(world, stats, s->t0, async ? s->rss_rise : rss_rise(s->mark),
                     s->shard_bytes);
    }
    save_free(s);
    return rc;
}

void mt_ckpt_save_cancel(struct mt_ckpt_save *s)
{
    if (!s) return;
    if (s->threaded) pthread_join(s->thread, NULL);
    if (s->me.world_rank == 0) mt_ckpt_abort(s->dir, s->st.iteration);
    save_free(s);
}

int mt_ckpt_save_dist(const struct mt_ckpt_dir *dir, struct mt_model *m, struct mt_optim *o,
                      const struct mt_parallel *par, const struct mt_config *cfg,
                      const struct mt_train_state *st, const char *config_text,
                      struct mt_ckpt_stats *stats, struct mt_err *err)
{
    struct mt_ckpt_save *s;
    MT_CHECK(mt_ckpt_save_start(dir, m, o, par, cfg, st, config_text, NULL, &s, err));
    return mt_ckpt_save_finish(s, stats, err);
}

int mt_ckpt_save_whole(const struct mt_ckpt_dir *dir, const struct mt_ckpt_view *v,
                       const struct mt_train_state *s, const char *config_text,
                       struct mt_err *err)
{
    char tmp_dir[4300];
    struct mt_shard_piece *p;
    MT_CHECK(alloc_pieces(3 * (size_t)v->ntensors + 1, &p, err));
    static const char *const prefixes[3] = {"", MT_SHARD_PREFIX_M, MT_SHARD_PREFIX_V};
    float *arrays[3] = {v->params, v->adam_m, v->adam_v};
    int n = 0;
    size_t at = 0;
    for (int i = 0; i < v->ntensors; i++) {
        for (int k = 0; k < 3; k++)
            mt_shard_whole_piece(&p[n++], prefixes[k], v->names[i], v->ndims[i], v->shapes[i],
                                 arrays[k] + at);
        at += p[n - 1].hi;
    }
    const long long nb = (long long)v->nbuffers;
    if (nb) mt_shard_whole_piece(&p[n++], "", MT_SHARD_BIAS, 1, &nb, v->buffers);
    char *slices = NULL, layout[512];
    size_t slices_len = 0;
    int rc = mt_ckpt_begin(dir, s->iteration, tmp_dir, sizeof tmp_dir, err);
    if (rc) {
        free(p);
        return rc;
    }
    FILE *f = open_memstream(&slices, &slices_len);
    if (!f) rc = mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    if (rc == MT_OK)
        rc = mt_shard_write(tmp_dir, "rank_00000.safetensors", p, n, NULL,
                            mt_shard_block_bytes(), f, err);
    if (f && fclose(f) != 0 && rc == MT_OK)
        rc = mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    layout_json(NULL, 1, false, layout, sizeof layout);
    if (rc == MT_OK)
        rc = mt_shard_write_index(tmp_dir, v, s, layout, mt_shard_block_bytes(), slices,
                                  slices_len, err);
    if (rc == MT_OK) rc = mt_ckpt_publish(dir, s->iteration, config_text, 0, err);
    else mt_ckpt_abort(dir, s->iteration);
    free(slices);
    free(p);
    return rc;
}

/* ---- loading -------------------------------------------------------------------- */

/* The host copies a load fills before anything changes: this rank's parameters (every
 * tensor it holds), its moments (its optimizer pieces) and the expert biases. */
struct staging {
    float *params, *m, *v, *bias;
    size_t np, nm, nb;
    struct mt_optim_piece *op;
    int nop;
};

static void staging_free(struct staging *g)
{
    mt_shard_free(g->params, sizeof(float) * g->np);
    mt_shard_free(g->m, sizeof(float) * g->nm);
    mt_shard_free(g->v, sizeof(float) * g->nm);
    mt_shard_free(g->bias, sizeof(float) * g->nb);
    free(g->op);
}

/* Builds the targets of this rank's load into staging g. */
static int plan_load(struct mt_model *m, struct mt_optim *o, const struct rank_info *r,
                     struct staging *g, struct mt_shard_piece **out, int *count,
                     struct mt_err *err)
{
    memset(g, 0, sizeof *g);
    MT_CHECK(mt_optim_pieces(o, &g->op, &g->nop, err));
    g->np = mt_model_num_params(m);
    for (int j = 0; j < g->nop; j++) g->nm += g->op[j].n;
    mt_model_buffers(m, &g->nb);
    g->params = mt_shard_malloc(sizeof(float) * g->np);
    g->m = mt_shard_malloc(sizeof(float) * g->nm);
    g->v = mt_shard_malloc(sizeof(float) * g->nm);
    g->bias = mt_shard_malloc(sizeof(float) * g->nb);
    if (!g->params || !g->m || !g->v || !g->bias)
        return mt_err_set(err, MT_ENOMEM,
                          "checkpoint: no host memory to load this rank's %zu parameters and "
                          "%zu moments",
                          g->np, 2 * g->nm);
    const int nt = mt_model_num_tensors(m);
    struct mt_shard_piece *p;
    MT_CHECK(alloc_pieces((size_t)nt + 2 * (size_t)g->nop + 1, &p, err));
    int n = 0;
    for (int i = 0; i < nt; i++) {
        const struct mt_param_info *t = mt_model_tensor(m, i);
        if (t->numel) piece_of(t, r, "", 0, t->numel, g->params + t->offset, false, &p[n++]);
    }
    size_t at = 0;
    for (int j = 0; j < g->nop; j++) {
        const struct mt_param_info *t = mt_model_tensor(m, g->op[j].tensor);
        size_t lo = g->op[j].at, hi = lo + g->op[j].n;
        piece_of(t, r, MT_SHARD_PREFIX_M, lo, hi, g->m + at, false, &p[n++]);
        piece_of(t, r, MT_SHARD_PREFIX_V, lo, hi, g->v + at, false, &p[n++]);
        at += g->op[j].n;
    }
    const long long nbl = (long long)g->nb;
    if (g->nb) mt_shard_whole_piece(&p[n++], "", MT_SHARD_BIAS, 1, &nbl, g->bias);
    *out = p;
    *count = n;
    return MT_OK;
}

/* Puts the staged values into the model and optimizer. */
static void apply_load(struct mt_model *m, const struct staging *g)
{
    const struct mt_kernels *k = mt_model_kernels(m);
    k->op.copy(k->ctx, mt_model_params(m), g->params, sizeof(float) * g->np);
    size_t at = 0;
    for (int j = 0; j < g->nop; j++) {
        k->op.copy(k->ctx, g->op[j].m, g->m + at, sizeof(float) * g->op[j].n);
        k->op.copy(k->ctx, g->op[j].v, g->v + at, sizeof(float) * g->op[j].n);
        at += g->op[j].n;
    }
    size_t nb;
    float *bias = mt_model_buffers(m, &nb);
    if (nb) memcpy(bias, g->bias, sizeof(float) * nb);
    mt_model_params_updated(m);
    mt_model_buffers_updated(m);
}

/* Rank 0's findings, sent to every rank: the directory and the index text (a length
 * of -1: a one-process state.bin). */
static int share_index(struct mt_comm *world, char *iter_dir, size_t dir_len, char **text,
                       size_t *len, struct mt_err *err)
{
    if (!world || world->size == 1) return MT_OK;
    int64_t lens[2] = {(int64_t)strlen(iter_dir), *text ? (int64_t)*len : -1};
    MT_CHECK(mt_broadcast(world, lens, 2, MT_DT_I64, 0, err));
    if ((size_t)lens[0] >= dir_len)
        return mt_err_set(err, MT_EINVAL, "checkpoint: the path is too long");
    MT_CHECK(mt_broadcast(world, iter_dir, (size_t)lens[0] + 1, MT_DT_U8, 0, err));
    if (lens[1] < 0) return MT_OK;
    if (world->rank != 0) {
        *text = malloc((size_t)lens[1] + 1);
        if (!*text) return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
        *len = (size_t)lens[1];
    }
    if (*len) MT_CHECK(mt_broadcast(world, *text, *len, MT_DT_U8, 0, err));
    return MT_OK;
}

/* Rank 0 finds the checkpoint in dir (mt_ckpt_locate) and reads its index; every rank
 * gets it and opens it (*ix NULL when *found is false). iter_dir: len bytes. */
static int open_located(const char *dir, bool optional, const struct mt_parallel *par,
                        char *iter_dir, size_t len_dir, bool *found,
                        struct mt_shard_index **ix, struct mt_err *err)
{
    struct mt_comm *world = world_of(par);
    *found = false;
    *ix = NULL;
    iter_dir[0] = '\0';
    char *text = NULL;
    size_t len = 0;
    bool have = false;
    int rc = MT_OK;
    if (!world || world->rank == 0) {
        rc = mt_ckpt_locate(dir, optional, iter_dir, len_dir, &have, err);
        if (rc == MT_OK && have) rc = mt_shard_index_text(iter_dir, &text, &len, err);
    }
    rc = mt_ckpt_agree_on_rank0(par, rc, "loading the checkpoint", err);
    int32_t flag = have;
    if (rc == MT_OK && world && world->size > 1)
        rc = mt_broadcast(world, &flag, 1, MT_DT_I32, 0, err);
    if (rc || !flag) {
        free(text);
        return rc;
    }
    rc = share_index(world, iter_dir, len_dir, &text, &len, err);
    if (rc == MT_OK) rc = mt_shard_index_open(iter_dir, text, len, ix, err);
    free(text);
    if (rc == MT_OK) *found = true;
    return rc;
}

int mt_ckpt_load_dist(const char *dir, bool optional, struct mt_model *m, struct mt_optim *o,
                      const struct mt_parallel *par, struct mt_train_state *s, bool *found,
                      char *loaded, size_t loaded_len, struct mt_ckpt_stats *stats,
                      struct mt_err *err)
{
    struct mt_comm *world = world_of(par);
    const double t0 = now_s();
    mt_shard_mem_reset();
    const long long mark = rss_mark();
    struct rank_info me;
    info_of(par, &me);
    char iter_dir[4200] = "";
    struct mt_shard_index *ix = NULL;
    int rc = open_located(dir, optional, par, iter_dir, sizeof iter_dir, found, &ix, err);
    if (rc || !*found) return rc;
    *found = false;
    struct mt_ckpt_view table = { 0 };
    struct staging g = { 0 };
    struct mt_shard_piece *targets = NULL;
    int ntargets = 0;
    if (rc == MT_OK) rc = model_table(m, &table, err);
    if (rc == MT_OK) {
        rc = mt_shard_index_check(ix, &table, err);
        model_table_free(&table);
    }
    if (rc == MT_OK) rc = plan_load(m, o, &me, &g, &targets, &ntargets, err);
    if (rc == MT_OK) rc = mt_shard_read(ix, targets, ntargets, err);
    rc = agree_all(world, rc, "loading the checkpoint", err);
    if (rc == MT_OK) {
        apply_load(m, &g);
        *s = *mt_shard_index_state(ix);
        *found = true;
        if (loaded) snprintf(loaded, loaded_len, "%s", iter_dir);
        if (stats) snprintf(stats->layout, sizeof stats->layout, "%s", mt_shard_index_layout(ix));
    }
    size_t own = sizeof(float) * (g.np + 2 * g.nm + g.nb);
    staging_free(&g);
    free(targets);
    mt_shard_index_free(ix);
    if (rc == MT_OK && stats) finish_stats(world, stats, t0, rss_rise(mark), own);
    return rc;
}

/* ---- initial weights: parameters only (load_hf, upcycling) ----------------------- */

int mt_ckpt_tensor_index(const struct mt_model *m, const char *name)
{
    const int n = mt_model_num_tensors(m);
    for (int i = 0; i < n; i++)
        if (!strcmp(mt_model_tensor(m, i)->name, name)) return i;
    return -1;
}

static bool is_router(const char *name)
{
    size_t n = strlen(name), k = strlen(".mlp.gate.weight");
    return n > k && !strcmp(name + n - k, ".mlp.gate.weight");
}

int mt_ckpt_upcycle_index(struct mt_shard_index *ix, const struct mt_model *m,
                          const struct mt_config *cfg, const char *what, struct mt_err *err)
{
    static const char *const kinds[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int i = 0; i < mt_shard_index_count(ix); i++) {
        const char *n = mt_shard_index_tensor(ix, i, NULL, NULL);
        if (!strncmp(n, "model.layers.", 13) && strstr(n, ".mlp.experts."))
            return mt_err_set(err, MT_EINVAL,
                              "moe%%use_upcycling: %s already holds routed experts ('%s'): "
                              "upcycling starts from a dense model's checkpoint (to resume an "
                              "upcycled run, remove moe%%use_upcycling)",
                              what, n);
    }
    for (int l = 0; l < cfg->model.num_layers; l++) {
        if (cfg->moe.num_experts <= 0 || !cfg->moe.layer_freq[l]) continue;
        for (int k = 0; k < 3; k++) {
            char from[160], to[160];
            snprintf(from, sizeof from, "model.layers.%d.mlp.%s.weight", l, kinds[k]);
            snprintf(to, sizeof to, "model.layers.%d.mlp.experts.%s", l, kinds[k]);
            const int ti = mt_ckpt_tensor_index(m, to);
            int fi = -1, nd = 0;
            long long shape[4] = {0};
            for (int i = 0; i < mt_shard_index_count(ix) && fi < 0; i++)
                if (!strcmp(mt_shard_index_tensor(ix, i, NULL, NULL), from)) fi = i;
            if (fi < 0)
                return mt_err_set(err, MT_EINVAL,
                                  "moe%%use_upcycling: %s has no tensor '%s', the dense MLP of "
                                  "layer %d to copy into its experts (model%%num_layers and "
                                  "moe%%layer_freq must describe the dense model's layers)",
                                  what, from, l);
            mt_shard_index_tensor(ix, fi, &nd, shape);
            const struct mt_param_info *t = mt_model_tensor(m, ti);
            bool same = ti >= 0 && nd == t->ndim - 1;
            for (int d = 0; same && d < nd; d++) same = shape[d] == t->shape[d + 1];
            if (!same) {
                char a[80], b[80];
                mt_shard_dims_text(nd, shape, a, sizeof a);
                mt_shard_dims_text(t->ndim - 1, t->shape + 1, b, sizeof b);
                return mt_err_set(err, MT_EINVAL,
                                  "moe%%use_upcycling: the dense MLP '%s' is %s in %s but an "
                                  "expert's is %s: each expert starts as a copy of the dense "
                                  "MLP (Megatron's default upcycling), so moe%%moe_ffn_hidden_size "
                                  "= %d must equal the dense model's FFN width and model%%"
                                  "hidden_size = %d its hidden size",
                                  from, a, what, b, cfg->moe.moe_ffn_hidden_size,
                                  cfg->model.hidden_size);
            }
            MT_CHECK(mt_shard_index_replicate(ix, from, to, t->shape[0], err));
        }
    }
    return mt_shard_index_seal(ix, err);
}

int mt_ckpt_check_params(const struct mt_shard_index *ix, const struct mt_model *m,
                         bool routers_may_lack, const char *what, struct mt_err *err)
{
    const int n = mt_model_num_tensors(m);
    for (int i = 0; i < n; i++) {
        const struct mt_param_info *t = mt_model_tensor(m, i);
        const int j = mt_shard_index_find(ix, t->name);
        if (j < 0) {
            if (routers_may_lack && is_router(t->name)) continue;
            return mt_err_set(err, MT_EINVAL, "%s has no tensor '%s' that this model has",
                              what, t->name);
        }
        int nd;
        long long shape[4];
        mt_shard_index_tensor(ix, j, &nd, shape);
        bool same = nd == t->ndim;
        for (int d = 0; same && d < nd; d++) same = shape[d] == t->shape[d];
        if (!same) {
            char a[80], b[80];
            mt_shard_dims_text(nd, shape, a, sizeof a);
            mt_shard_dims_text(t->ndim, t->shape, b, sizeof b);
            return mt_err_set(err, MT_EINVAL, "%s: tensor '%s' is %s there but %s in this model",
                              what, t->name, a, b);
        }
    }
    for (int j = 0; j < mt_shard_index_count(ix); j++) {
        const char *name = mt_shard_index_tensor(ix, j, NULL, NULL);
        if (!strncmp(name, "optimizer.", 10) || !strcmp(name, MT_SHARD_BIAS)) continue;
        if (mt_ckpt_tensor_index(m, name) < 0)
            return mt_err_set(err, MT_EINVAL, "%s holds tensor '%s', which this model does not have",
                              what, name);
    }
    return MT_OK;
}

int mt_ckpt_load_params(struct mt_shard_index *ix, struct mt_model *m,
                        const struct mt_parallel *par, struct mt_ckpt_stats *stats,
                        struct mt_err *err)
{
    struct mt_comm *world = world_of(par);
    const double t0 = now_s();
    const long long mark = rss_mark();
    struct rank_info me;
    info_of(par, &me);
    const struct mt_kernels *k = mt_model_kernels(m);
    const size_t np = mt_model_num_params(m);
    const int nt = mt_model_num_tensors(m);
    float *staging = mt_shard_malloc(sizeof(float) * np);
    struct mt_shard_piece *p = NULL;
    int n = 0, rc = MT_OK;
    if (!staging)
        rc = mt_err_set(err, MT_ENOMEM, "checkpoint: no host memory to load this rank's %zu "
                        "parameters", np);
    if (rc == MT_OK) rc = alloc_pieces((size_t)nt, &p, err);
    if (rc == MT_OK) {
        /* what the source lacks (the routers of an upcycled model) keeps its init */
        k->op.copy(k->ctx, staging, mt_model_params(m), sizeof(float) * np);
        for (int i = 0; i < nt; i++) {
            const struct mt_param_info *t = mt_model_tensor(m, i);
            if (t->numel && mt_shard_index_find(ix, t->name) >= 0)
                piece_of(t, &me, "", 0, t->numel, staging + t->offset, false, &p[n++]);
        }
        rc = mt_shard_read(ix, p, n, err);
    }
    rc = agree_all(world, rc, "loading the initial weights", err);
    if (rc == MT_OK) {
        k->op.copy(k->ctx, mt_model_params(m), staging, sizeof(float) * np);
        mt_model_params_updated(m);
        if (stats) snprintf(stats->layout, sizeof stats->layout, "%s", mt_shard_index_layout(ix));
    }
    mt_shard_free(staging, sizeof(float) * np);
    free(p);
    if (rc == MT_OK && stats) finish_stats(world, stats, t0, rss_rise(mark), sizeof(float) * np);
    return rc;
}

int mt_ckpt_load_upcycled(const char *dir, bool optional, const struct mt_config *cfg,
                          struct mt_model *m, const struct mt_parallel *par, bool *found,
                          char *loaded, size_t loaded_len, struct mt_ckpt_stats *stats,
                          struct mt_err *err)
{
    mt_shard_mem_reset();
    char iter_dir[4200] = "", what[4300];
    struct mt_shard_index *ix = NULL;
    MT_CHECK(open_located(dir, optional, par, iter_dir, sizeof iter_dir, found, &ix, err));
    if (!*found) return MT_OK;
    snprintf(what, sizeof what, "checkpoint '%s'", iter_dir);
    int rc = mt_ckpt_upcycle_index(ix, m, cfg, what, err);
    if (rc == MT_OK) rc = mt_ckpt_check_params(ix, m, true, what, err);
    if (rc == MT_OK) rc = mt_ckpt_load_params(ix, m, par, stats, err);
    if (rc == MT_OK && loaded) snprintf(loaded, loaded_len, "%s", iter_dir);
    mt_shard_index_free(ix);
    return rc;
}

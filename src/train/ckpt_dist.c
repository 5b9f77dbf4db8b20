/* Distributed checkpoints in the one-process format (see train.h): world rank 0
 * assembles the whole tensors from the shards and writes them; a load goes the other
 * way. Rank 0 learns what every process holds from its coordinates, so a checkpoint
 * written by any layout loads into any other. */
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

#define TAG_INFO 7101
#define TAG_DATA 7102

/* Where a process sits: what decides its shards and whether it owns them. */
struct rank_info {
    struct mt_shard_coords sc;
    int dp_rank, edp_rank;
    int stage;                  /* pipeline stage: which tensors it holds */
};
#define INFO_INTS 9

static void info_of(const struct mt_parallel *par, struct rank_info *r)
{
    r->sc = (struct mt_shard_coords){par->tp, par->tp_rank, par->ep, par->ep_rank, par->etp,
                                     par->etp_rank};
    r->dp_rank = par->dp_rank;
    r->edp_rank = par->edp_rank;
    r->stage = par->pp_rank;
}

static void info_pack(const struct rank_info *r, int32_t out[INFO_INTS])
{
    const int32_t v[INFO_INTS] = {r->sc.tp, r->sc.tp_rank, r->sc.ep, r->sc.ep_rank, r->sc.etp,
                                  r->sc.etp_rank, r->dp_rank, r->edp_rank, r->stage};
    memcpy(out, v, sizeof v);
}

static void info_unpack(const int32_t in[INFO_INTS], struct rank_info *r)
{
    r->sc = (struct mt_shard_coords){in[0], in[1], in[2], in[3], in[4], in[5]};
    r->dp_rank = in[6];
    r->edp_rank = in[7];
    r->stage = in[8];
}

/* Whether the rank holds tensor i (its pipeline stage's), and whether as the tied
 * embedding's copy. */
static bool holds(const struct mt_model *m, int i, const struct rank_info *r, bool *replica)
{
    return mt_model_tensor_on_stage(m, i, r->stage, replica);
}

/* The one copy of a tensor's shard that a save takes: data-parallel rank 0's, and for a
 * tensor whole on every TP rank, TP rank 0's; of the tied embedding, the first
 * pipeline stage's. */
static bool owns(const struct mt_model *m, int i, const struct rank_info *r)
{
    const struct mt_param_info *t = mt_model_tensor(m, i);
    bool replica;
    if (!holds(m, i, r, &replica) || replica) return false;
    if (t->expert) return r->edp_rank == 0;
    return r->dp_rank == 0 && (!t->tp_replicated || r->sc.tp_rank == 0);
}

static size_t shard_numel(const struct mt_param_info *t, const struct rank_info *r,
                          long long ls[4], long long st[4])
{
    mt_param_shard(t, &r->sc, ls, st);
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)ls[d];
    return n;
}

/* The whole model's arrays on rank 0, in the one-process layout. */
struct whole {
    size_t *at;                 /* per tensor: offset in the arrays */
    float *p, *m, *v;
    const char **names;
    int *ndims;
    long long (*shapes)[4];
};

static void whole_free(struct whole *w)
{
    free(w->at);
    free(w->p);
    free(w->m);
    free(w->v);
    free(w->names);
    free(w->ndims);
    free(w->shapes);
}

static int whole_alloc(struct mt_model *m, struct whole *w, struct mt_ckpt_view *v,
                       struct mt_err *err)
{
    const int n = mt_model_num_tensors(m);
    const size_t total = mt_model_num_global_params(m);
    memset(w, 0, sizeof *w);
    w->at = calloc((size_t)n, sizeof *w->at);
    w->p = malloc(sizeof(float) * (total ? total : 1));
    w->m = malloc(sizeof(float) * (total ? total : 1));
    w->v = malloc(sizeof(float) * (total ? total : 1));
    w->names = calloc((size_t)n, sizeof *w->names);
    w->ndims = calloc((size_t)n, sizeof *w->ndims);
    w->shapes = calloc((size_t)n, sizeof *w->shapes);
    if (!w->at || !w->p || !w->m || !w->v || !w->names || !w->ndims || !w->shapes) {
        whole_free(w);
        return mt_err_set(err, MT_ENOMEM,
                          "checkpoint: rank 0 has no memory for the whole model (%zu values x 3)",
                          total);
    }
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const struct mt_param_info *t = mt_model_tensor(m, i);
        w->at[i] = at;
        at += t->global_numel;
        w->names[i] = t->name;
        w->ndims[i] = t->ndim;
        memcpy(w->shapes[i], t->shape, sizeof w->shapes[i]);
    }
    v->ntensors = n;
    v->names = w->names;
    v->ndims = w->ndims;
    v->shapes = (const long long (*)[4])w->shapes;
    v->nparams = total;
    v->params = w->p;
    v->adam_m = w->m;
    v->adam_v = w->v;
    v->buffers = mt_model_buffers(m, &v->nbuffers);
    return MT_OK;
}

/* Copies between the whole arrays and a rank's shards, packed tensor after tensor
 * (params, m, v of each) for the tensors selected (owned ones, or all). */
static size_t exchange(struct mt_model *m, struct whole *w, const struct rank_info *r,
                       bool only_owned, float *packed, bool to_packed)
{
    size_t at = 0;
    for (int i = 0; i < mt_model_num_tensors(m); i++) {
        const struct mt_param_info *t = mt_model_tensor(m, i);
        if (only_owned ? !owns(m, i, r) : !holds(m, i, r, NULL)) continue;
        long long ls[4], st[4];
        size_t n = shard_numel(t, r, ls, st);
        if (packed) {
            float *whole[3] = {w->p + w->at[i], w->m + w->at[i], w->v + w->at[i]};
            for (int k = 0; k < 3; k++)
                mt_param_copy_shard(t, ls, st, whole[k], packed + at + k * n, to_packed);
        }
        at += 3 * n;
    }
    return at;
}

/* This rank's own arrays packed the same way: params, m, v per tensor. */
static void own_pack(struct mt_model *m, const float *mo, const float *vo, const struct rank_info *r,
                     bool only_owned, float *packed, bool to_packed)
{
    float *p = mt_model_params(m); /* backend memory; mo, vo and packed are host memory */
    const struct mt_kernels *k = mt_model_kernels(m);
    size_t at = 0;
    for (int i = 0; i < mt_model_num_tensors(m); i++) {
        const struct mt_param_info *t = mt_model_tensor(m, i);
        if (only_owned ? !owns(m, i, r) : !holds(m, i, r, NULL)) continue;
        const size_t n = t->numel, bytes = sizeof(float) * n;
        if (to_packed)
            k->op.copy(k->ctx, packed + at, p + t->offset, bytes);
        else
            k->op.copy(k->ctx, p + t->offset, packed + at, bytes);
        float *mine[2] = {(float *)mo + t->offset, (float *)vo + t->offset};
        for (int j = 0; j < 2; j++) {
            if (to_packed)
                memcpy(packed + at + (j + 1) * n, mine[j], bytes);
            else
                memcpy(mine[j], packed + at + (j + 1) * n, bytes);
        }
        at += 3 * n;
    }
}

static int alloc_moments(struct mt_model *m, float **mo, float **vo, struct mt_err *err)
{
    const size_t n = mt_model_num_params(m);
    *mo = malloc(sizeof(float) * (n ? n : 1));
    *vo = malloc(sizeof(float) * (n ? n : 1));
    if (*mo && *vo) return MT_OK;
    free(*mo);
    free(*vo);
    return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory for %zu moments", n);
}

int mt_ckpt_agree_on_rank0(const struct mt_parallel *par, int rc, const char *what,
                          struct mt_err *err)
{
    struct mt_comm *world = par->world->comm;
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

int mt_ckpt_save_dist(const struct mt_ckpt_dir *dir, struct mt_model *m, struct mt_optim *o,
                      const struct mt_parallel *par, const struct mt_train_state *s,
                      const char *config_text, int keep_last, struct mt_err *err)
{
    struct mt_comm *world = par->world->comm;
    float *mo, *vo;
    MT_CHECK(alloc_moments(m, &mo, &vo, err));
    int rc = mt_optim_export(o, mo, vo, err);
    struct rank_info me;
    info_of(par, &me);
    float *buf = NULL;
    if (rc == MT_OK && world->rank != 0) {
        int32_t info[INFO_INTS];
        info_pack(&me, info);
        size_t n = exchange(m, NULL, &me, true, NULL, true);
        buf = malloc(sizeof(float) * (n ? n : 1));
        if (!buf) rc = mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
        if (rc == MT_OK) {
            own_pack(m, mo, vo, &me, true, buf, true);
            rc = mt_send(world, info, INFO_INTS, MT_DT_I32, 0, TAG_INFO, err);
        }
        if (rc == MT_OK && n) rc = mt_send(world, buf, n, MT_DT_F32, 0, TAG_DATA, err);
    } else if (rc == MT_OK) {
        struct whole w;
        struct mt_ckpt_view v;
        rc = whole_alloc(m, &w, &v, err);
        if (rc == MT_OK) {
            size_t n = exchange(m, NULL, &me, true, NULL, true);
            buf = malloc(sizeof(float) * (n ? n : 1));
            if (!buf) rc = mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
            if (rc == MT_OK) {
                own_pack(m, mo, vo, &me, true, buf, true);
                exchange(m, &w, &me, true, buf, false);
            }
            for (int r = 1; rc == MT_OK && r < world->size; r++) {
                int32_t info[INFO_INTS];
                struct rank_info them;
                rc = mt_recv(world, info, INFO_INTS, MT_DT_I32, r, TAG_INFO, err);
                if (rc) break;
                info_unpack(info, &them);
                size_t nr = exchange(m, NULL, &them, true, NULL, true);
                if (!nr) continue;
                float *got = malloc(sizeof(float) * nr);
                if (!got) {
                    rc = mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
                    break;
                }
                rc = mt_recv(world, got, nr, MT_DT_F32, r, TAG_DATA, err);
                if (rc == MT_OK) exchange(m, &w, &them, true, got, false);
                free(got);
            }
            if (rc == MT_OK) rc = mt_ckpt_save(dir, &v, s, config_text, keep_last, err);
            whole_free(&w);
        }
    }
    free(buf);
    free(mo);
    free(vo);
    if (rc != MT_OK && world->rank != 0) return rc; /* a failed send: the comm's message */
    return mt_ckpt_agree_on_rank0(par, rc, "saving the checkpoint", err);
}

int mt_ckpt_load_dist(const char *dir, bool optional, struct mt_model *m, struct mt_optim *o,
                      const struct mt_parallel *par, struct mt_train_state *s, bool *found,
                      char *loaded_path, size_t loaded_path_len, struct mt_err *err)
{
    struct mt_comm *world = par->world->comm;
    const int P = world->size;
    struct whole w;
    struct mt_ckpt_view v;
    int rc = MT_OK;
    bool have = false;
    *found = false;
    if (world->rank == 0) {
        rc = whole_alloc(m, &w, &v, err);
        if (rc == MT_OK) {
            rc = mt_ckpt_load(dir, optional, &v, s, &have, loaded_path, loaded_path_len, err);
            if (rc) whole_free(&w);
        }
    }
    MT_CHECK(mt_ckpt_agree_on_rank0(par, rc, "loading the checkpoint", err));
    int32_t flag = have;
    MT_CHECK(mt_broadcast(world, &flag, 1, MT_DT_I32, 0, err));
    if (!flag) {
        if (world->rank == 0) whole_free(&w);
        return MT_OK;
    }
    long long st[5] = {s->iteration, s->consumed_samples, s->eval_count, s->skipped_iters,
                       s->adam_step};
    size_t nbuf;
    float *bufs = mt_model_buffers(m, &nbuf);
    rc = mt_broadcast(world, st, 5, MT_DT_I64, 0, err);
    if (rc == MT_OK && nbuf) rc = mt_broadcast(world, bufs, nbuf, MT_DT_F32, 0, err);
    *s = (struct mt_train_state){st[0], st[1], st[2], st[3], st[4]};

    /* every process's coordinates, then rank 0 sends each its shards */
    struct rank_info me;
    info_of(par, &me);
    int32_t *infos = malloc(sizeof(int32_t) * INFO_INTS * (size_t)P), mine[INFO_INTS];
    float *mo = NULL, *vo = NULL, *buf = NULL;
    if (!infos) rc = mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    if (rc == MT_OK) rc = alloc_moments(m, &mo, &vo, err);
    info_pack(&me, mine);
    if (rc == MT_OK) rc = mt_all_gather(world, mine, infos, INFO_INTS, MT_DT_I32, err);
    const size_t n = exchange(m, NULL, &me, false, NULL, true);
    if (rc == MT_OK && !(buf = malloc(sizeof(float) * (n ? n : 1))))
        rc = mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    if (world->rank == 0) {
        for (int r = 1; rc == MT_OK && r < P; r++) {
            struct rank_info them;
            info_unpack(infos + (size_t)r * INFO_INTS, &them);
            size_t nr = exchange(m, NULL, &them, false, NULL, true);
            float *out = malloc(sizeof(float) * (nr ? nr : 1));
            if (!out) {
                rc = mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
                break;
            }
            exchange(m, &w, &them, false, out, true);
            if (nr) rc = mt_send(world, out, nr, MT_DT_F32, r, TAG_DATA, err);
            free(out);
        }
        if (rc == MT_OK) exchange(m, &w, &me, false, buf, true);
        whole_free(&w);
    } else if (rc == MT_OK && n) {
        rc = mt_recv(world, buf, n, MT_DT_F32, 0, TAG_DATA, err);
    }
    if (rc == MT_OK) {
        own_pack(m, mo, vo, &me, false, buf, false);
        mt_optim_import(o, mo, vo);
        mt_model_params_updated(m);
        mt_model_buffers_updated(m);
        *found = true;
    }
    free(infos);
    free(mo);
    free(vo);
    free(buf);
    return rc;
}

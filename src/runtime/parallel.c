/* moetrain: this process's communicators for every parallel group. */
#include "runtime/parallel.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Checks that logical_of_process is a permutation of 0..n-1. */
static int check_permutation(const int *map, int n, struct mt_err *err)
{
    unsigned char *seen = calloc((size_t)n, 1);
    if (!seen) return mt_err_set(err, MT_ENOMEM, "out of memory for %d ranks", n);
    int rc = MT_OK;
    for (int p = 0; p < n && rc == MT_OK; p++) {
        if (map[p] < 0 || map[p] >= n || seen[map[p]])
            rc = mt_err_set(err, MT_EINVAL,
                            "placement gives process %d logical rank %d: not a permutation "
                            "of 0..%d",
                            p, map[p], n - 1);
        else
            seen[map[p]] = 1;
    }
    free(seen);
    return rc;
}

int mt_parallel_alloc(const struct mt_config *cfg, const struct mt_layout *l, int rank,
                      bool lists, struct mt_parallel **out, struct mt_err *err)
{
    struct mt_parallel *p = calloc(1, sizeof *p);
    if (!p) return mt_err_set(err, MT_ENOMEM, "out of memory");
    int rc = mt_groups_locate(&cfg->parallel, l, rank, p->place, err);
    if (rc == MT_OK && lists) rc = mt_groups_build(&cfg->parallel, l, &p->layout, err);
    if (rc) {
        free(p);
        return rc;
    }
    p->rank = rank;
    p->tp = l->tp;
    p->cp = l->cp;
    p->dp = l->dp;
    p->pp = l->pp;
    p->ep = l->ep;
    p->etp = l->etp;
    p->edp = l->edp;
    int *const coord[MT_GROUP_COUNT] = {
        [MT_GROUP_TP] = &p->tp_rank, [MT_GROUP_CP] = &p->cp_rank,   [MT_GROUP_DP] = &p->dp_rank,
        [MT_GROUP_PP] = &p->pp_rank, [MT_GROUP_EP] = &p->ep_rank,   [MT_GROUP_ETP] = &p->etp_rank,
        [MT_GROUP_EDP] = &p->edp_rank,
    };
    for (int k = 0; k < MT_GROUP_COUNT; k++)
        if (coord[k]) *coord[k] = p->place[k].group >= 0 ? p->place[k].position : 0;
    *out = p;
    return MT_OK;
}

int mt_parallel_init(struct mt_world *w, const struct mt_config *cfg, const struct mt_layout *l,
                     const int *logical_of_process, struct mt_parallel **out, struct mt_err *err)
{
    *out = NULL;
    if (l->world_size != w->size)
        return mt_err_set(err, MT_EINVAL,
                          "the layout was resolved for %d processes but the job has %d",
                          l->world_size, w->size);
    if (logical_of_process) MT_CHECK(check_permutation(logical_of_process, w->size, err));
    struct mt_parallel *p;
    MT_CHECK(mt_parallel_alloc(cfg, l, logical_of_process ? logical_of_process[w->rank] : w->rank,
                               true, &p, err));
    int rc = MT_OK;
    p->world = w;
    p->world_comm = w->comm;
    if (logical_of_process) {
        p->logical_of_process = malloc(sizeof(int) * (size_t)w->size);
        if (!p->logical_of_process) {
            rc = mt_err_set(err, MT_ENOMEM, "out of memory");
            goto fail;
        }
        memcpy(p->logical_of_process, logical_of_process, sizeof(int) * (size_t)w->size);
    }
    for (int k = 0; k < MT_GROUP_COUNT; k++) {
        int group, pos;
        mt_groups_find(&p->layout, (enum mt_group_kind)k, p->rank, &group, &pos);
        const struct mt_group_list *gl = &p->layout.groups[k];
        char name[32];
        if (group >= 0) {
            snprintf(name, sizeof name, "%s[%d]", mt_group_names[k], group);
        } else {
            /* In no group of this kind (the middle pipeline stages have no
             * embedding group): a group of its own, so calls are no-ops. */
            snprintf(name, sizeof name, "%s[none]", mt_group_names[k]);
            group = gl->ngroups + p->rank;
            pos = 0;
        }
        /* Processes of one group share a color; the position in the group
         * (logical order) becomes the rank in the comm. */
        MT_CHECK_GOTO(mt_world_split(w, group, pos, name, &p->comm[k], err), fail);
        int size = group < gl->ngroups ? gl->size : 1;
        if (p->comm[k]->rank != pos || p->comm[k]->size != size) {
            rc = mt_err_set(err, MT_ERUNTIME,
                            "communicator %s: rank %d of %d, the layout says %d of %d", name,
                            p->comm[k]->rank, p->comm[k]->size, pos, size);
            goto fail;
        }
    }
    *out = p;
    return MT_OK;
fail:
    mt_parallel_destroy(p);
    return rc;
}

/* Which group kinds carry device memory. A dual comm sends a call to its device
 * transport only when the call's buffers are device memory (comm_dual.c), so a kind
 * needs one only if some caller passes it device buffers; with the CUDA backend those
 * are the tensors, gradients and optimizer state (k->op.alloc), while scalars, counts
 * and statistics are host memory. A kind marked false gets no NCCL communicator, and a
 * device-memory call on it fails naming the group (tests/runtime/parallel_check.c). */
static const bool on_device[MT_GROUP_COUNT] = {
    /* tp: the sequence-parallel all-gathers and reduce-scatters of activations, the
     * vocabulary-parallel cross-entropy's gather and sum, the routing gather for
     * capacity dropping and the sequence-aux counts (src/model), and the sum of the
     * TP-replicated parameters' gradients (src/train/optim.c) */
    [MT_GROUP_TP] = true,
    /* cp: nothing calls it (context parallelism is not implemented: cp = 1) */
    [MT_GROUP_CP] = false,
    /* dp: the dense gradients' reduce-scatter or all-reduce and the distributed
     * optimizer's all-gather of parameters (optim.c); its loss sums (train.c) are host
     * doubles */
    [MT_GROUP_DP] = true,
    /* dp-cp: nothing calls it (gradients are reduced over dp; with cp = 1 the same
     * ranks) */
    [MT_GROUP_DP_CP] = false,
    /* pp: activations and their gradients between stages (train.c: send, recv, p2p
     * batches); its loss sums and the stage report's all-gather are host memory */
    [MT_GROUP_PP] = true,
    /* tp-cp: a placement constraint only (src/topo: inside one NVLink domain) */
    [MT_GROUP_TP_CP] = false,
    /* mp: nothing calls it */
    [MT_GROUP_MP] = false,
    /* embedding: the tied embedding's gradient sum between the first and last
     * pipeline stages (optim.c) */
    [MT_GROUP_EMBD] = true,
    /* ep: the token all-to-alls of the all-to-all dispatcher (src/model/model_moe.c),
     * called even with ep = 1 when etp > 1; its count exchange is host memory */
    [MT_GROUP_EP] = true,
    /* etp: the all-to-alls of token rows between expert-TP peers; its count all-gather
     * is host memory */
    [MT_GROUP_ETP] = true,
    /* etp-ep: the all-gather dispatcher's gathers of tokens and routing and its
     * reduce-scatters */
    [MT_GROUP_ETP_EP] = true,
    /* edp: the expert gradients' reduce-scatter or all-reduce and the distributed
     * optimizer's all-gather (optim.c) */
    [MT_GROUP_EDP] = true,
};
/* The world comm carries device memory too: the gradient norm's sum (optim.c). */

bool mt_group_kind_on_device(enum mt_group_kind k)
{
    return (unsigned)k < MT_GROUP_COUNT && on_device[k];
}

/* Each rank's group and position for every kind (-1: in none). */
struct group_index {
    int world;
    int *group[MT_GROUP_COUNT], *pos[MT_GROUP_COUNT];
};

static void index_free(struct group_index *x)
{
    for (int k = 0; k < MT_GROUP_COUNT; k++) {
        free(x->group[k]);
        free(x->pos[k]);
    }
}

static int index_build(const struct mt_rank_layout *rl, struct group_index *x, struct mt_err *err)
{
    memset(x, 0, sizeof *x);
    x->world = rl->world;
    for (int k = 0; k < MT_GROUP_COUNT; k++) {
        x->group[k] = malloc(sizeof(int) * (size_t)rl->world);
        x->pos[k] = malloc(sizeof(int) * (size_t)rl->world);
        if (!x->group[k] || !x->pos[k]) {
            index_free(x);
            return mt_err_set(err, MT_ENOMEM, "out of memory for %d ranks", rl->world);
        }
        for (int r = 0; r < rl->world; r++) x->group[k][r] = x->pos[k][r] = -1;
        const struct mt_group_list *gl = &rl->groups[k];
        for (int i = 0; i < gl->ngroups * gl->size; i++) {
            int r = gl->ranks[i];
            if (r >= 0 && r < rl->world) {
                x->group[k][r] = i / gl->size;
                x->pos[k][r] = i % gl->size;
            }
        }
    }
    return MT_OK;
}

/* Rank r's group of kind k, or NULL. */
static const int *members(const struct mt_rank_layout *rl, const struct group_index *x, int k,
                          int r)
{
    int g = x->group[k][r];
    return g < 0 ? NULL : rl->groups[k].ranks + (size_t)g * rl->groups[k].size;
}

/* Whether a group of n ranks lists the processes in their world order (then it is the
 * world's communicator: same ranks, same numbering). */
static bool is_world(const int *m, int n, int world, const int *logical_of_process)
{
    if (n != world) return false;
    for (int i = 0; i < n; i++)
        if (m[i] != (logical_of_process ? logical_of_process[i] : i)) return false;
    return true;
}

static void plan_rank(const struct mt_rank_layout *rl, const struct group_index *x,
                      const int *logical_of_process, int rank, struct mt_device_plan *out)
{
    memset(out, 0, sizeof *out);
    out->ncomms = 1; /* the world's */
    for (int k = 0; k < MT_GROUP_COUNT; k++) {
        out->same_as[k] = -1;
        out->color[k] = -1;
        const int *m = members(rl, x, k, rank);
        const int n = rl->groups[k].size;
        out->size[k] = m ? n : 1;
        if (!on_device[k]) {
            out->how[k] = MT_DEVICE_NONE;
            continue;
        }
        if (!m) {
            out->how[k] = MT_DEVICE_ABSENT;
            continue;
        }
        out->how[k] = MT_DEVICE_SHARED;
        if (is_world(m, n, rl->world, logical_of_process)) continue; /* same_as -1 */
        for (int j = 0; j < k && out->same_as[k] < 0; j++) {
            const int *o = members(rl, x, j, rank);
            if (out->how[j] == MT_DEVICE_OWN && o && rl->groups[j].size == n &&
                !memcmp(o, m, sizeof(int) * (size_t)n))
                out->same_as[k] = j;
        }
        if (out->same_as[k] >= 0) continue;
        out->how[k] = MT_DEVICE_OWN;
        out->color[k] = x->group[k][rank];
        out->key[k] = x->pos[k][rank];
        out->ncomms++;
    }
}

/* Which kinds the job splits for: those where some rank's group is its own. */
static void plan_splits(const struct mt_rank_layout *rl, const struct group_index *x,
                        const int *logical_of_process, bool split[MT_GROUP_COUNT])
{
    memset(split, 0, sizeof(bool) * MT_GROUP_COUNT);
    /* A group's members all decide alike (groups of one kind are disjoint: if mine
     * equals my group of another kind, it is each member's group of that kind), so
     * the first member of each group speaks for it. */
    for (int k = 0; k < MT_GROUP_COUNT; k++) {
        const struct mt_group_list *gl = &rl->groups[k];
        for (int g = 0; g < gl->ngroups && !split[k]; g++) {
            struct mt_device_plan p;
            plan_rank(rl, x, logical_of_process, gl->ranks[(size_t)g * gl->size], &p);
            split[k] = p.how[k] == MT_DEVICE_OWN;
        }
    }
}

static int device_plan(const struct mt_rank_layout *rl, const int *logical_of_process, int rank,
                       struct mt_device_plan *out, struct mt_err *err)
{
    struct group_index x;
    MT_CHECK(index_build(rl, &x, err));
    plan_rank(rl, &x, logical_of_process, rank, out);
    plan_splits(rl, &x, logical_of_process, out->split);
    index_free(&x);
    return MT_OK;
}

void mt_parallel_device_plan(const struct mt_rank_layout *rl, const int *logical_of_process,
                             int rank, struct mt_device_plan *out)
{
    struct mt_err err;
    if (device_plan(rl, logical_of_process, rank, out, &err) != MT_OK) {
        memset(out, 0, sizeof *out); /* out of memory: no plan */
        out->ncomms = -1;
    }
}

/* Appends to buf (of len) at *at. */
static void append(char *buf, size_t len, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t len, size_t *at, const char *fmt, ...)
{
    if (*at >= len) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *at, len - *at, fmt, ap);
    va_end(ap);
    if (n > 0) *at += (size_t)n;
}

void mt_parallel_device_summary(const struct mt_rank_layout *rl, const int *logical_of_process,
                                int rank, char *buf, size_t len)
{
    size_t at = 0;
    if (len) buf[0] = '\0';
    struct group_index x;
    struct mt_err err;
    if (index_build(rl, &x, &err) != MT_OK) {
        append(buf, len, &at, "NCCL communicators: (%s)", err.msg);
        return;
    }
    struct mt_device_plan p;
    plan_rank(rl, &x, logical_of_process, rank, &p);
    plan_splits(rl, &x, logical_of_process, p.split);
    int lo = p.ncomms, hi = p.ncomms, nsplit = 0;
    for (int r = 0; r < rl->world; r++) {
        struct mt_device_plan q;
        plan_rank(rl, &x, logical_of_process, r, &q);
        lo = q.ncomms < lo ? q.ncomms : lo;
        hi = q.ncomms > hi ? q.ncomms : hi;
    }
    for (int k = 0; k < MT_GROUP_COUNT; k++) nsplit += p.split[k];
    index_free(&x);
    append(buf, len, &at, "NCCL communicators: %d on this process (world", p.ncomms);
    const char *sep = " + ";
    for (int k = 0; k < MT_GROUP_COUNT; k++)
        if (p.how[k] == MT_DEVICE_OWN) {
            append(buf, len, &at, "%s%s%s", sep, mt_group_names[k],
                   p.size[k] == 1 ? " (1 rank)" : "");
            sep = ", ";
        }
    sep = "; shared: ";
    for (int k = 0; k < MT_GROUP_COUNT; k++)
        if (p.how[k] == MT_DEVICE_SHARED) {
            append(buf, len, &at, "%s%s = %s", sep, mt_group_names[k],
                   p.same_as[k] < 0 ? "world" : mt_group_names[p.same_as[k]]);
            sep = ", ";
        }
    sep = "; in no group: ";
    for (int k = 0; k < MT_GROUP_COUNT; k++)
        if (p.how[k] == MT_DEVICE_ABSENT) {
            append(buf, len, &at, "%s%s", sep, mt_group_names[k]);
            sep = ", ";
        }
    sep = "; host only: ";
    for (int k = 0; k < MT_GROUP_COUNT; k++)
        if (p.how[k] == MT_DEVICE_NONE) {
            append(buf, len, &at, "%s%s", sep, mt_group_names[k]);
            sep = ", ";
        }
    if (lo == hi)
        append(buf, len, &at, "); %d on every process", lo);
    else
        append(buf, len, &at, "); %d to %d per process", lo, hi);
    append(buf, len, &at, ", split from the world's by %d ncclCommSplit call%s", nsplit,
           nsplit == 1 ? "" : "s");
}

int mt_parallel_use_device(struct mt_parallel *p, const struct mt_device_memory *dm, bool nccl,
                           void *stream, struct mt_err *err)
{
    if (p->world_comm != p->world->comm) return MT_OK; /* done already */
    struct mt_device_plan plan;
    MT_CHECK(device_plan(&p->layout, p->logical_of_process, p->rank, &plan, err));
    /* The world's device transport, then every kind's: NCCL communicators split from
     * the world's (every process calls ncclCommSplit for a kind that any rank splits
     * for, in kind order), or the host comms themselves (the guard backend). */
    struct mt_comm *world = p->world->comm;
    if (nccl) {
        MT_CHECK(mt_comm_nccl_create(p->world->comm, &world, err));
        p->nccl[p->nnccl++] = world;
        if (stream) MT_CHECK(mt_comm_nccl_set_stream(world, stream, err));
    }
    struct mt_comm *dev[MT_GROUP_COUNT] = { 0 };
    for (int k = 0; k < MT_GROUP_COUNT; k++) {
        switch (plan.how[k]) {
        case MT_DEVICE_NONE:
        case MT_DEVICE_ABSENT: break;
        case MT_DEVICE_SHARED:
            dev[k] = !nccl ? p->comm[k] : plan.same_as[k] < 0 ? world : dev[plan.same_as[k]];
            break;
        case MT_DEVICE_OWN: dev[k] = p->comm[k]; break;
        }
        if (!nccl || !plan.split[k]) continue;
        /* collective over the world: a rank whose group is not its own passes no colour */
        bool own = plan.how[k] == MT_DEVICE_OWN;
        struct mt_comm *c = NULL;
        MT_CHECK(mt_comm_nccl_split(world, own ? plan.color[k] : -1, own ? plan.key[k] : 0,
                                    p->comm[k]->name, plan.key[k], plan.size[k], &c, err));
        if (!own) continue;
        p->nccl[p->nnccl++] = c;
        dev[k] = c;
        if (stream) MT_CHECK(mt_comm_nccl_set_stream(c, stream, err));
    }
    struct mt_comm *w;
    MT_CHECK(mt_comm_dual_create(p->world->comm, world, false, dm, &w, err));
    p->world_comm = w;
    p->world_device = world;
    for (int k = 0; k < MT_GROUP_COUNT; k++) {
        struct mt_comm *d;
        MT_CHECK(mt_comm_dual_create(p->comm[k], dev[k], false, dm, &d, err));
        p->host[k] = p->comm[k];
        p->comm[k] = d;
        p->device_of[k] = dev[k];
    }
    return MT_OK;
}

void mt_parallel_destroy(struct mt_parallel *p)
{
    if (!p) return;
    /* the dual comms, the host comms, then the NCCL communicators they borrowed:
     * those split from the world's first, the world's last */
    if (p->world_comm && p->world_comm != p->world->comm) mt_comm_destroy(p->world_comm);
    for (int k = 0; k < MT_GROUP_COUNT; k++) {
        mt_comm_destroy(p->comm[k]);
        if (p->host[k]) mt_comm_destroy(p->host[k]);
    }
    for (int i = p->nnccl - 1; i >= 0; i--) mt_comm_destroy(p->nccl[i]);
    mt_groups_free(&p->layout);
    free(p->logical_of_process);
    free(p);
}

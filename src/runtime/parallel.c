/* moetrain: this process's communicators for every parallel group. */
#include "runtime/parallel.h"

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

int mt_parallel_init(struct mt_world *w, const struct mt_config *cfg, const struct mt_layout *l,
                     const int *logical_of_process, struct mt_parallel **out, struct mt_err *err)
{
    *out = NULL;
    if (l->world_size != w->size)
        return mt_err_set(err, MT_EINVAL,
                          "the layout was resolved for %d processes but the job has %d",
                          l->world_size, w->size);
    if (logical_of_process) MT_CHECK(check_permutation(logical_of_process, w->size, err));
    struct mt_parallel *p = calloc(1, sizeof *p);
    if (!p) return mt_err_set(err, MT_ENOMEM, "out of memory");
    int rc = mt_groups_build(&cfg->parallel, l, &p->layout, err);
    if (rc) {
        free(p);
        return rc;
    }
    p->world = w;
    p->world_comm = w->comm;
    p->rank = logical_of_process ? logical_of_process[w->rank] : w->rank;
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
        if (coord[k]) *coord[k] = pos;
    }
    *out = p;
    return MT_OK;
fail:
    mt_parallel_destroy(p);
    return rc;
}

/* A dual comm over host: device traffic to NCCL over the same processes, or to host
 * itself with dm's hooks around each call. */
static int wrap(struct mt_comm *host, const struct mt_device_memory *dm, bool nccl, void *stream,
                struct mt_comm **out, struct mt_err *err)
{
    struct mt_comm *device = host;
    if (nccl) {
        MT_CHECK(mt_comm_nccl_create(host, &device, err));
        if (stream) {
            int rc = mt_comm_nccl_set_stream(device, stream, err);
            if (rc) {
                mt_comm_destroy(device);
                return rc;
            }
        }
    }
    int rc = mt_comm_dual_create(host, device, nccl, dm, out, err);
    if (rc && nccl) mt_comm_destroy(device);
    return rc;
}

int mt_parallel_use_device(struct mt_parallel *p, const struct mt_device_memory *dm, bool nccl,
                           void *stream, struct mt_err *err)
{
    if (p->world_comm != p->world->comm) return MT_OK; /* done already */
    struct mt_comm *w;
    MT_CHECK(wrap(p->world->comm, dm, nccl, stream, &w, err));
    p->world_comm = w;
    for (int k = 0; k < MT_GROUP_COUNT; k++) {
        struct mt_comm *d;
        MT_CHECK(wrap(p->comm[k], dm, nccl, stream, &d, err));
        p->host[k] = p->comm[k];
        p->comm[k] = d;
    }
    return MT_OK;
}

void mt_parallel_destroy(struct mt_parallel *p)
{
    if (!p) return;
    if (p->world_comm && p->world_comm != p->world->comm) mt_comm_destroy(p->world_comm);
    for (int k = 0; k < MT_GROUP_COUNT; k++) {
        mt_comm_destroy(p->comm[k]);
        if (p->host[k]) mt_comm_destroy(p->host[k]);
    }
    mt_groups_free(&p->layout);
    free(p);
}

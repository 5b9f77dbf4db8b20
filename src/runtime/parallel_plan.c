/* moetrain: a rank's place in the layout without a job (planning, moetrain --check). */
#include "runtime/parallel.h"

#include <stdio.h>
#include <stdlib.h>

#include "runtime/comm_internal.h"

/* Communicators of a plan know their rank and size and carry nothing: setting a model
 * and optimizer up communicates nothing, and a call would be a bug to report. They have
 * no nonblocking starts: mt_all_reduce_start and the others run the blocking calls
 * below, which refuse alike. */
static int refuse(struct mt_comm *c, struct mt_err *err)
{
    return mt_err_set(err, MT_ERUNTIME, "communicator %s of a memory plan was asked to "
                                          "communicate (planning sets up, never runs)", c->name);
}

static int plan_all_reduce(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt,
                           enum mt_redop op, struct mt_err *err)
{
    (void)buf, (void)count, (void)dt, (void)op;
    return refuse(c, err);
}

static int plan_reduce_scatter(struct mt_comm *c, const void *send, void *recv, size_t count,
                               enum mt_dt dt, enum mt_redop op, struct mt_err *err)
{
    (void)send, (void)recv, (void)count, (void)dt, (void)op;
    return refuse(c, err);
}

static int plan_all_gather(struct mt_comm *c, const void *send, void *recv, size_t count,
                           enum mt_dt dt, struct mt_err *err)
{
    (void)send, (void)recv, (void)count, (void)dt;
    return refuse(c, err);
}

static int plan_all_to_all_v(struct mt_comm *c, const void *send, const size_t *sc,
                             const size_t *sd, void *recv, const size_t *rc, const size_t *rd,
                             enum mt_dt dt, struct mt_err *err)
{
    (void)send, (void)sc, (void)sd, (void)recv, (void)rc, (void)rd, (void)dt;
    return refuse(c, err);
}

static int plan_broadcast(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int root,
                          struct mt_err *err)
{
    (void)buf, (void)count, (void)dt, (void)root;
    return refuse(c, err);
}

static int plan_send(struct mt_comm *c, const void *buf, size_t count, enum mt_dt dt, int peer,
                     int tag, struct mt_err *err)
{
    (void)buf, (void)count, (void)dt, (void)peer, (void)tag;
    return refuse(c, err);
}

static int plan_recv(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int peer, int tag,
                     struct mt_err *err)
{
    (void)buf, (void)count, (void)dt, (void)peer, (void)tag;
    return refuse(c, err);
}

static int plan_barrier(struct mt_comm *c, struct mt_err *err) { return refuse(c, err); }

static void plan_destroy(struct mt_comm *c) { mt_comm_free(c); }

static const struct mt_comm_ops plan_ops = {
    .all_reduce = plan_all_reduce,
    .reduce_scatter = plan_reduce_scatter,
    .all_gather = plan_all_gather,
    .all_to_all_v = plan_all_to_all_v,
    .broadcast = plan_broadcast,
    .send = plan_send,
    .recv = plan_recv,
    .barrier = plan_barrier,
    .destroy = plan_destroy,
};

int mt_parallel_plan(const struct mt_config *cfg, const struct mt_layout *l, int rank,
                     struct mt_parallel **out, struct mt_err *err)
{
    *out = NULL;
    if (rank < 0 || rank >= l->world_size)
        return mt_err_set(err, MT_EINVAL, "rank %d is not in a world of %d", rank, l->world_size);
    struct mt_parallel *p;
    MT_CHECK(mt_parallel_alloc(cfg, l, rank, false, &p, err));
    int rc = MT_OK;
    for (int k = 0; k < MT_GROUP_COUNT && rc == MT_OK; k++) {
        const struct mt_group_place *at = &p->place[k];
        char name[32];
        snprintf(name, sizeof name, "plan:%s", mt_group_names[k]);
        rc = mt_comm_alloc(&plan_ops, at->group >= 0 ? at->position : 0,
                           at->group >= 0 ? at->size : 1, name, 0.0, rank,
                           sizeof(struct mt_comm_common), &p->comm[k], err);
    }
    if (rc == MT_OK)
        rc = mt_comm_alloc(&plan_ops, rank, l->world_size, "plan:world", 0.0, rank,
                           sizeof(struct mt_comm_common), &p->world_comm, err);
    if (rc) {
        mt_parallel_plan_destroy(p);
        return rc;
    }
    *out = p;
    return MT_OK;
}

void mt_parallel_plan_destroy(struct mt_parallel *p)
{
    if (!p) return;
    for (int k = 0; k < MT_GROUP_COUNT; k++)
        if (p->comm[k]) mt_comm_destroy(p->comm[k]);
    if (p->world_comm) mt_comm_destroy(p->world_comm);
    mt_groups_free(&p->layout);
    free(p);
}

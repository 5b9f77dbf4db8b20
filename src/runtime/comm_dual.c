/* moetrain: the dual comm. One group, two transports: each call goes to the device
 * comm (NCCL with the CUDA backend) when its buffers are device memory, to the host
 * comm (MPI, self) when they are host memory. Tensor traffic thus always takes the
 * device path, and host-side bookkeeping (a few scalars, counts) the host one. A group
 * that carries no device traffic has no device comm: a call on device memory fails. */
#include "runtime/comm_internal.h"


struct dual_impl {
    struct mt_comm_common common;
    struct mt_comm *host, *device;
    bool own_device;
    struct mt_device_memory dm;
};

static struct dual_impl *dual(struct mt_comm *c) { return c->impl; }

/* Counts the buffers set (NULL ones are ignored) and those in device memory. */
static void classify(const struct dual_impl *d, const void *p, int *nset, int *ndev)
{
    if (!p) return;
    (*nset)++;
    if (d->dm.is_device(d->dm.arg, p)) (*ndev)++;
}

/* Which comm takes a call whose nset buffers hold ndev in device memory: the device
 * comm when all are, the host comm when none is; NULL with an error when mixed. */
static struct mt_comm *pick(struct mt_comm *c, const char *call, int nset, int ndev,
                            struct mt_err *err)
{
    struct dual_impl *d = dual(c);
    if (ndev && ndev != nset) {
        mt_err_set(err, MT_EINVAL,
                   "%s on %s: buffers in both host and device memory (an internal error: a "
                   "collective's buffers must all live on one side)",
                   call, c->name);
        return NULL;
    }
    if (ndev && !d->device) {
        mt_err_set(err, MT_EUNSUPPORTED,
                   "%s on %s: its buffers are device memory, but this group has no device "
                   "transport (an internal error: moetrain gives NCCL communicators only to "
                   "the group kinds that carry device traffic; add %s's kind to the table "
                   "in src/runtime/parallel.c, or pass host memory)",
                   call, c->name, c->name);
        return NULL;
    }
    return ndev ? d->device : d->host;
}

static struct mt_comm *route(struct mt_comm *c, const char *call, const void *const *bufs, int n,
                             struct mt_err *err)
{
    int nset = 0, ndev = 0;
    for (int i = 0; i < n; i++) classify(dual(c), bufs[i], &nset, &ndev);
    return pick(c, call, nset, ndev, err);
}

#define ROUTED(call, expr, ...)                                                            \
    do {                                                                                   \
        const void *b_[] = { __VA_ARGS__ };                                                \
        struct mt_comm *to = route(c, call, b_, (int)(sizeof b_ / sizeof b_[0]), err);    \
        if (!to) return err->code;                                                         \
        struct dual_impl *d_ = dual(c);                                                    \
        bool dev_ = to == d_->device;                                                      \
        if (dev_ && d_->dm.enter) d_->dm.enter(d_->dm.arg);                                \
        int rc_ = (expr);                                                                  \
        if (dev_ && d_->dm.leave) d_->dm.leave(d_->dm.arg);                                \
        return rc_;                                                                        \
    } while (0)

static int d_all_reduce(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt,
                        enum mt_redop op, struct mt_err *err)
{
    ROUTED("all_reduce", to->ops->all_reduce(to, buf, count, dt, op, err), buf);
}

static int d_reduce_scatter(struct mt_comm *c, const void *send, void *recv, size_t count,
                            enum mt_dt dt, enum mt_redop op, struct mt_err *err)
{
    ROUTED("reduce_scatter", to->ops->reduce_scatter(to, send, recv, count, dt, op, err), send,
           recv);
}

static int d_all_gather(struct mt_comm *c, const void *send, void *recv, size_t count,
                        enum mt_dt dt, struct mt_err *err)
{
    ROUTED("all_gather", to->ops->all_gather(to, send, recv, count, dt, err), send, recv);
}

static int d_all_to_all_v(struct mt_comm *c, const void *send, const size_t *send_counts,
                          const size_t *send_displs, void *recv, const size_t *recv_counts,
                          const size_t *recv_displs, enum mt_dt dt, struct mt_err *err)
{
    ROUTED("all_to_all_v",
           to->ops->all_to_all_v(to, send, send_counts, send_displs, recv, recv_counts,
                                 recv_displs, dt, err),
           send, recv);
}

static int d_broadcast(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int root,
                       struct mt_err *err)
{
    ROUTED("broadcast", to->ops->broadcast(to, buf, count, dt, root, err), buf);
}

static int d_send(struct mt_comm *c, const void *buf, size_t count, enum mt_dt dt, int peer,
                  int tag, struct mt_err *err)
{
    ROUTED("send", to->ops->send(to, buf, count, dt, peer, tag, err), buf);
}

static int d_recv(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int peer, int tag,
                  struct mt_err *err)
{
    ROUTED("recv", to->ops->recv(to, buf, count, dt, peer, tag, err), buf);
}

static int d_p2p_batch(struct mt_comm *c, const struct mt_p2p *ops, int n, enum mt_dt dt,
                       struct mt_err *err)
{
    struct dual_impl *d = dual(c);
    int nset = 0, ndev = 0;
    for (int i = 0; i < n; i++) classify(d, ops[i].buf, &nset, &ndev);
    struct mt_comm *to = pick(c, "p2p_batch", nset, ndev, err);
    if (!to) return err->code;
    bool dev = to == d->device;
    if (dev && d->dm.enter) d->dm.enter(d->dm.arg);
    int rc = mt_p2p_batch(to, ops, n, dt, err);
    if (dev && d->dm.leave) d->dm.leave(d->dm.arg);
    return rc;
}

/* As d_p2p_batch; started on the comm it routes to, which completes it, except where
 * the device transport needs dm.enter/leave around it (see STARTED below): done now. */
static int d_p2p_batch_start(struct mt_comm *c, const struct mt_p2p *ops, int n, enum mt_dt dt,
                             struct mt_comm_req *req, struct mt_err *err)
{
    struct dual_impl *d = dual(c);
    int nset = 0, ndev = 0;
    for (int i = 0; i < n; i++) classify(d, ops[i].buf, &nset, &ndev);
    struct mt_comm *to = pick(c, "p2p_batch", nset, ndev, err);
    if (!to) return err->code;
    if (to != d->device || !d->dm.enter) return mt_p2p_batch_start(to, ops, n, dt, req, err);
    d->dm.enter(d->dm.arg);
    int rc = mt_p2p_batch(to, ops, n, dt, err);
    if (d->dm.leave) d->dm.leave(d->dm.arg);
    return rc;
}

/* A start on device memory goes to the device comm, whose request it becomes; where
 * the device transport needs dm.enter/leave around it (the host comm moving the guard
 * backend's emulated device memory, mapped only during a call), the collective cannot
 * stay in flight after the call: it completes at the start. Host memory: the host
 * comm's start. */
#define STARTED(call, start, blocking, ...)                                                \
    do {                                                                                   \
        const void *b_[] = { __VA_ARGS__ };                                                \
        struct mt_comm *to = route(c, call, b_, (int)(sizeof b_ / sizeof b_[0]), err);    \
        if (!to) return err->code;                                                         \
        struct dual_impl *d_ = dual(c);                                                    \
        if (to != d_->device || !d_->dm.enter) return (start);                             \
        d_->dm.enter(d_->dm.arg);                                                          \
        int rc_ = (blocking);                                                              \
        if (d_->dm.leave) d_->dm.leave(d_->dm.arg);                                        \
        return rc_;                                                                        \
    } while (0)

static int d_all_reduce_start(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt,
                              enum mt_redop op, struct mt_comm_req *req, struct mt_err *err)
{
    STARTED("all_reduce", mt_all_reduce_start(to, buf, count, dt, op, req, err),
            mt_all_reduce(to, buf, count, dt, op, err), buf);
}

static int d_reduce_scatter_start(struct mt_comm *c, const void *send, void *recv, size_t count,
                                  enum mt_dt dt, enum mt_redop op, struct mt_comm_req *req,
                                  struct mt_err *err)
{
    STARTED("reduce_scatter", mt_reduce_scatter_start(to, send, recv, count, dt, op, req, err),
            mt_reduce_scatter(to, send, recv, count, dt, op, err), send, recv);
}

static int d_all_gather_start(struct mt_comm *c, const void *send, void *recv, size_t count,
                              enum mt_dt dt, struct mt_comm_req *req, struct mt_err *err)
{
    STARTED("all_gather", mt_all_gather_start(to, send, recv, count, dt, req, err),
            mt_all_gather(to, send, recv, count, dt, err), send, recv);
}

static int d_all_to_all_v_start(struct mt_comm *c, const void *send, const size_t *send_counts,
                                const size_t *send_displs, void *recv, const size_t *recv_counts,
                                const size_t *recv_displs, enum mt_dt dt,
                                struct mt_comm_req *req, struct mt_err *err)
{
    STARTED("all_to_all_v",
            mt_all_to_all_v_start(to, send, send_counts, send_displs, recv, recv_counts,
                                  recv_displs, dt, req, err),
            mt_all_to_all_v(to, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                            dt, err),
            send, recv);
}

static int d_barrier(struct mt_comm *c, struct mt_err *err)
{
    return mt_barrier(dual(c)->host, err);
}

static void d_destroy(struct mt_comm *c)
{
    struct dual_impl *d = dual(c);
    if (d->own_device && d->device) mt_comm_destroy(d->device);
    mt_comm_free(c);
}

static const struct mt_comm_ops dual_ops = {
    .all_reduce = d_all_reduce,
    .reduce_scatter = d_reduce_scatter,
    .all_gather = d_all_gather,
    .all_to_all_v = d_all_to_all_v,
    .broadcast = d_broadcast,
    .send = d_send,
    .recv = d_recv,
    .barrier = d_barrier,
    .destroy = d_destroy,
    .p2p_batch = d_p2p_batch,
    .all_reduce_start = d_all_reduce_start,
    .reduce_scatter_start = d_reduce_scatter_start,
    .all_gather_start = d_all_gather_start,
    .wait = NULL, /* requests belong to the comm a start routed to */
    .p2p_batch_start = d_p2p_batch_start,
    .all_to_all_v_start = d_all_to_all_v_start,
};

int mt_comm_dual_create(struct mt_comm *host, struct mt_comm *device, bool own_device,
                        const struct mt_device_memory *dm, struct mt_comm **out,
                        struct mt_err *err)
{
    if (device && (host->rank != device->rank || host->size != device->size))
        return mt_err_set(err, MT_ERUNTIME,
                          "communicator %s: host (rank %d of %d) and device (rank %d of %d) "
                          "transports disagree",
                          host->name, host->rank, host->size, device->rank, device->size);
    struct mt_comm *c;
    int world_rank = ((struct mt_comm_common *)host->impl)->world_rank;
    MT_CHECK(mt_comm_alloc(&dual_ops, host->rank, host->size, host->name, host->timeout_s,
                           world_rank, sizeof(struct dual_impl), &c, err));
    struct dual_impl *d = dual(c);
    d->host = host;
    d->device = device;
    d->own_device = own_device;
    d->dm = *dm;
    *out = c;
    return MT_OK;
}

/* moetrain: the comm wrappers, what backends share, and the self backend. */
#include "runtime/comm_internal.h"

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

size_t mt_dt_size(enum mt_dt dt)
{
    switch (dt) {
    case MT_DT_F32: return 4;
    case MT_DT_F64: return 8;
    case MT_DT_I32: return 4;
    case MT_DT_I64: return 8;
    case MT_DT_U8: return 1;
    case MT_DT_BF16: return 2;
    }
    return 0;
}

/* ---- shared by the backends ------------------------------------------------------------ */

int mt_comm_alloc(const struct mt_comm_ops *ops, int rank, int size, const char *name,
                  double timeout_s, int world_rank, size_t impl_size, struct mt_comm **out,
                  struct mt_err *err)
{
    struct mt_comm *c = calloc(1, sizeof *c);
    void *impl = calloc(1, impl_size);
    if (!c || !impl) {
        free(c);
        free(impl);
        return mt_err_set(err, MT_ENOMEM, "out of memory for communicator %s", name);
    }
    c->ops = ops;
    c->rank = rank;
    c->size = size;
    snprintf(c->name, sizeof c->name, "%s", name);
    c->timeout_s = timeout_s;
    c->impl = impl;
    ((struct mt_comm_common *)impl)->world_rank = world_rank;
    *out = c;
    return MT_OK;
}

void mt_comm_free(struct mt_comm *c)
{
    if (!c) return;
    free(c->impl);
    free(c);
}

double mt_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct mt_deadline mt_deadline_start(double timeout_s)
{
    struct mt_deadline d = { .start = mt_now_s(), .end = 0, .polls = 0 };
    if (timeout_s > 0) d.end = d.start + timeout_s;
    return d;
}

bool mt_deadline_passed(const struct mt_deadline *d)
{
    return d->end > 0 && mt_now_s() >= d->end;
}

void mt_deadline_pause(struct mt_deadline *d)
{
    /* ~the first thousand polls spin (latency of small collectives), the next
     * yield to oversubscribed peers, later ones sleep 50 us between polls. */
    d->polls++;
    if (d->polls < 1000) return;
    if (d->polls < 20000) {
        sched_yield();
        return;
    }
    struct timespec ts = { 0, 50 * 1000 };
    nanosleep(&ts, NULL);
}

int mt_comm_timeout_error(struct mt_comm *c, const char *op, const struct mt_deadline *d,
                          struct mt_err *err)
{
    struct mt_comm_common *cc = mt_comm_common(c);
    cc->broken = true;
    return mt_err_set(err, MT_ERUNTIME,
                      "%s on %s timed out: rank %d of %d (world rank %d) waited %.1f s "
                      "(&parallel distributed_timeout_minutes = %g); a peer process died, "
                      "hangs, or is not calling the same collective",
                      op, c->name, c->rank, c->size, cc->world_rank, mt_now_s() - d->start,
                      c->timeout_s / 60.0);
}

int mt_comm_check_usable(struct mt_comm *c, const char *op, struct mt_err *err)
{
    if (mt_comm_common(c)->broken)
        return mt_err_set(err, MT_ERUNTIME,
                          "%s on %s: the communicator failed earlier (timeout or library "
                          "error) and cannot be used again",
                          op, c->name);
    return MT_OK;
}

/* ---- wrappers: checks every backend would repeat, then the vtable ----------------------- */

static int check_call(struct mt_comm *c, const char *op, enum mt_dt dt, struct mt_err *err)
{
    if (!c) return mt_err_set(err, MT_EINVAL, "%s: no communicator", op);
    if (mt_dt_size(dt) == 0)
        return mt_err_set(err, MT_EINVAL, "%s on %s: invalid data type %d", op, c->name, (int)dt);
    return mt_comm_check_usable(c, op, err);
}

static int check_reducible(struct mt_comm *c, const char *op, enum mt_dt dt, struct mt_err *err)
{
    if (dt == MT_DT_BF16)
        return mt_err_set(err, MT_EINVAL, "%s on %s: bf16 data is moved, not reduced (reduce in fp32)",
                          op, c->name);
    return MT_OK;
}

static int check_peer(struct mt_comm *c, const char *op, const char *what, int peer,
                      struct mt_err *err)
{
    if (peer < 0 || peer >= c->size)
        return mt_err_set(err, MT_EINVAL, "%s on %s: %s %d is not a rank of this group (size %d)",
                          op, c->name, what, peer, c->size);
    return MT_OK;
}

int mt_all_reduce(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, enum mt_redop op,
                  struct mt_err *err)
{
    MT_CHECK(check_call(c, "all_reduce", dt, err));
    MT_CHECK(check_reducible(c, "all_reduce", dt, err));
    return c->ops->all_reduce(c, buf, count, dt, op, err);
}

int mt_reduce_scatter(struct mt_comm *c, const void *send, void *recv, size_t count,
                      enum mt_dt dt, enum mt_redop op, struct mt_err *err)
{
    MT_CHECK(check_call(c, "reduce_scatter", dt, err));
    MT_CHECK(check_reducible(c, "reduce_scatter", dt, err));
    return c->ops->reduce_scatter(c, send, recv, count, dt, op, err);
}

int mt_all_gather(struct mt_comm *c, const void *send, void *recv, size_t count, enum mt_dt dt,
                  struct mt_err *err)
{
    MT_CHECK(check_call(c, "all_gather", dt, err));
    return c->ops->all_gather(c, send, recv, count, dt, err);
}

int mt_all_to_all_v(struct mt_comm *c, const void *send, const size_t *send_counts,
                    const size_t *send_displs, void *recv, const size_t *recv_counts,
                    const size_t *recv_displs, enum mt_dt dt, struct mt_err *err)
{
    MT_CHECK(check_call(c, "all_to_all_v", dt, err));
    return c->ops->all_to_all_v(c, send, send_counts, send_displs, recv, recv_counts,
                                recv_displs, dt, err);
}

int mt_broadcast(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int root,
                 struct mt_err *err)
{
    MT_CHECK(check_call(c, "broadcast", dt, err));
    MT_CHECK(check_peer(c, "broadcast", "root", root, err));
    return c->ops->broadcast(c, buf, count, dt, root, err);
}

int mt_send(struct mt_comm *c, const void *buf, size_t count, enum mt_dt dt, int peer, int tag,
            struct mt_err *err)
{
    MT_CHECK(check_call(c, "send", dt, err));
    MT_CHECK(check_peer(c, "send", "peer", peer, err));
    return c->ops->send(c, buf, count, dt, peer, tag, err);
}

int mt_recv(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int peer, int tag,
            struct mt_err *err)
{
    MT_CHECK(check_call(c, "recv", dt, err));
    MT_CHECK(check_peer(c, "recv", "peer", peer, err));
    return c->ops->recv(c, buf, count, dt, peer, tag, err);
}

int mt_p2p_batch(struct mt_comm *c, const struct mt_p2p *ops, int n, enum mt_dt dt,
                 struct mt_err *err)
{
    MT_CHECK(check_call(c, "p2p batch", dt, err));
    for (int i = 0; i < n; i++)
        MT_CHECK(check_peer(c, ops[i].send ? "send" : "recv", "peer", ops[i].peer, err));
    if (c->ops->p2p_batch) return c->ops->p2p_batch(c, ops, n, dt, err);
    for (int pass = 0; pass < 2; pass++) /* sends first */
        for (int i = 0; i < n; i++) {
            const struct mt_p2p *x = &ops[i];
            if (x->send != (pass == 0)) continue;
            MT_CHECK(x->send ? c->ops->send(c, x->buf, x->count, dt, x->peer, x->tag, err)
                             : c->ops->recv(c, x->buf, x->count, dt, x->peer, x->tag, err));
        }
    return MT_OK;
}

int mt_barrier(struct mt_comm *c, struct mt_err *err)
{
    MT_CHECK(check_call(c, "barrier", MT_DT_U8, err));
    return c->ops->barrier(c, err);
}

/* ---- nonblocking collectives ------------------------------------------------------------ */

/* Refuses a request that still holds a collective (it would be lost), and readies it. */
static int take_request(struct mt_comm *c, const char *op, struct mt_comm_req *req,
                        struct mt_err *err)
{
    if (!req) return mt_err_set(err, MT_EINVAL, "%s on %s: no request", op, c->name);
    if (mt_comm_pending(req))
        return mt_err_set(err, MT_EINVAL,
                          "%s on %s: the request still holds a %s on %s that was not waited "
                          "for (an internal error: wait before reusing a request)",
                          op, c->name, req->op, req->comm->name);
    memset(req, 0, sizeof *req);
    req->op = op;
    return MT_OK;
}

/* After a backend's start, which leaves req->comm set to the comm that completes the
 * collective (NULL when done already): a start that failed holds nothing. */
static int started(struct mt_comm_req *req, int rc)
{
    if (rc != MT_OK) req->comm = NULL;
    return rc;
}

int mt_all_reduce_start(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt,
                        enum mt_redop op, struct mt_comm_req *req, struct mt_err *err)
{
    MT_CHECK(check_call(c, "all_reduce", dt, err));
    MT_CHECK(check_reducible(c, "all_reduce", dt, err));
    MT_CHECK(take_request(c, "all_reduce", req, err));
    if (!c->ops->all_reduce_start) return c->ops->all_reduce(c, buf, count, dt, op, err);
    return started(req, c->ops->all_reduce_start(c, buf, count, dt, op, req, err));
}

int mt_reduce_scatter_start(struct mt_comm *c, const void *send, void *recv, size_t count,
                            enum mt_dt dt, enum mt_redop op, struct mt_comm_req *req,
                            struct mt_err *err)
{
    MT_CHECK(check_call(c, "reduce_scatter", dt, err));
    MT_CHECK(check_reducible(c, "reduce_scatter", dt, err));
    MT_CHECK(take_request(c, "reduce_scatter", req, err));
    if (!c->ops->reduce_scatter_start)
        return c->ops->reduce_scatter(c, send, recv, count, dt, op, err);
    return started(req,
                   c->ops->reduce_scatter_start(c, send, recv, count, dt, op, req, err));
}

int mt_all_gather_start(struct mt_comm *c, const void *send, void *recv, size_t count,
                        enum mt_dt dt, struct mt_comm_req *req, struct mt_err *err)
{
    MT_CHECK(check_call(c, "all_gather", dt, err));
    MT_CHECK(take_request(c, "all_gather", req, err));
    if (!c->ops->all_gather_start) return c->ops->all_gather(c, send, recv, count, dt, err);
    return started(req, c->ops->all_gather_start(c, send, recv, count, dt, req, err));
}

int mt_p2p_batch_start(struct mt_comm *c, const struct mt_p2p *ops, int n, enum mt_dt dt,
                       struct mt_comm_req *req, struct mt_err *err)
{
    MT_CHECK(check_call(c, "p2p batch", dt, err));
    for (int i = 0; i < n; i++)
        MT_CHECK(check_peer(c, ops[i].send ? "send" : "recv", "peer", ops[i].peer, err));
    if (n > MT_P2P_START_MAX)
        return mt_err_set(err, MT_EINVAL, "p2p batch on %s: %d transfers started, at most %d",
                          c->name, n, MT_P2P_START_MAX);
    MT_CHECK(take_request(c, "p2p batch", req, err));
    if (!c->ops->p2p_batch_start) return mt_p2p_batch(c, ops, n, dt, err);
    req->nops = n;
    req->dt = dt;
    memcpy(req->ops, ops, sizeof *ops * (size_t)n);
    return started(req, c->ops->p2p_batch_start(c, ops, n, dt, req, err));
}

int mt_all_to_all_v_start(struct mt_comm *c, const void *send, const size_t *send_counts,
                          const size_t *send_displs, void *recv, const size_t *recv_counts,
                          const size_t *recv_displs, enum mt_dt dt, struct mt_comm_req *req,
                          struct mt_err *err)
{
    MT_CHECK(check_call(c, "all_to_all_v", dt, err));
    MT_CHECK(take_request(c, "all_to_all_v", req, err));
    if (!c->ops->all_to_all_v_start)
        return c->ops->all_to_all_v(c, send, send_counts, send_displs, recv, recv_counts,
                                    recv_displs, dt, err);
    return started(req, c->ops->all_to_all_v_start(c, send, send_counts, send_displs, recv,
                                                   recv_counts, recv_displs, dt, req, err));
}

int mt_comm_wait(struct mt_comm_req *req, struct mt_err *err)
{
    if (!req || !mt_comm_pending(req)) return MT_OK;
    struct mt_comm *c = req->comm;
    int rc = mt_comm_check_usable(c, req->op, err);
    if (rc == MT_OK) rc = c->ops->wait(c, req, err);
    req->comm = NULL;
    return rc;
}

void mt_comm_destroy(struct mt_comm *c)
{
    if (c) c->ops->destroy(c);
}

/* ---- self: a group of one process ------------------------------------------------------ */

/* Messages sent to oneself wait here for the matching recv (MPI allows a
 * process to send to itself; a ring algorithm of size 1 does). */
struct self_msg {
    struct self_msg *next;
    int tag;
    size_t bytes;
    unsigned char data[];
};

struct self_impl {
    struct mt_comm_common common;
    struct self_msg *queue;
};

static void copy(void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src) memmove(dst, src, bytes);
}

static int self_all_reduce(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt,
                           enum mt_redop op, struct mt_err *err)
{
    return MT_OK;
}

static int self_reduce_scatter(struct mt_comm *c, const void *send, void *recv, size_t count,
                               enum mt_dt dt, enum mt_redop op, struct mt_err *err)
{
    copy(recv, send, count * mt_dt_size(dt));
    return MT_OK;
}

static int self_all_gather(struct mt_comm *c, const void *send, void *recv, size_t count,
                           enum mt_dt dt, struct mt_err *err)
{
    copy(recv, send, count * mt_dt_size(dt));
    return MT_OK;
}

static int self_all_to_all_v(struct mt_comm *c, const void *send, const size_t *send_counts,
                             const size_t *send_displs, void *recv, const size_t *recv_counts,
                             const size_t *recv_displs, enum mt_dt dt, struct mt_err *err)
{
    if (send_counts[0] != recv_counts[0])
        return mt_err_set(err, MT_EINVAL,
                          "all_to_all_v on %s: rank 0 sends %zu elements to itself but "
                          "expects to receive %zu",
                          c->name, send_counts[0], recv_counts[0]);
    size_t sz = mt_dt_size(dt);
    copy((char *)recv + recv_displs[0] * sz, (const char *)send + send_displs[0] * sz,
         send_counts[0] * sz);
    return MT_OK;
}

static int self_broadcast(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int root,
                          struct mt_err *err)
{
    return MT_OK;
}

static int self_send(struct mt_comm *c, const void *buf, size_t count, enum mt_dt dt, int peer,
                     int tag, struct mt_err *err)
{
    struct self_impl *s = c->impl;
    size_t bytes = count * mt_dt_size(dt);
    struct self_msg *m = malloc(sizeof *m + bytes);
    if (!m) return mt_err_set(err, MT_ENOMEM, "send on %s: out of memory (%zu bytes)", c->name,
                              bytes);
    m->next = NULL;
    m->tag = tag;
    m->bytes = bytes;
    copy(m->data, buf, bytes);
    struct self_msg **tail = &s->queue;
    while (*tail) tail = &(*tail)->next;
    *tail = m;
    return MT_OK;
}

static int self_recv(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int peer, int tag,
                     struct mt_err *err)
{
    struct self_impl *s = c->impl;
    for (struct self_msg **p = &s->queue; *p; p = &(*p)->next) {
        struct self_msg *m = *p;
        if (m->tag != tag) continue;
        size_t bytes = count * mt_dt_size(dt);
        if (m->bytes != bytes)
            return mt_err_set(err, MT_EINVAL,
                              "recv on %s: expected %zu bytes with tag %d, the message has %zu",
                              c->name, bytes, tag, m->bytes);
        copy(buf, m->data, bytes);
        *p = m->next;
        free(m);
        return MT_OK;
    }
    /* One process: nobody else can send it, so waiting would be forever. */
    return mt_err_set(err, MT_EINVAL, "recv on %s (1 process): no message with tag %d was sent",
                      c->name, tag);
}

static int self_barrier(struct mt_comm *c, struct mt_err *err)
{
    return MT_OK;
}

/* One process: a collective is done when it starts; nothing is left for the wait. */
static int self_all_reduce_start(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt,
                                 enum mt_redop op, struct mt_comm_req *req, struct mt_err *err)
{
    return self_all_reduce(c, buf, count, dt, op, err);
}

static int self_reduce_scatter_start(struct mt_comm *c, const void *send, void *recv,
                                     size_t count, enum mt_dt dt, enum mt_redop op,
                                     struct mt_comm_req *req, struct mt_err *err)
{
    return self_reduce_scatter(c, send, recv, count, dt, op, err);
}

static int self_all_gather_start(struct mt_comm *c, const void *send, void *recv, size_t count,
                                 enum mt_dt dt, struct mt_comm_req *req, struct mt_err *err)
{
    return self_all_gather(c, send, recv, count, dt, err);
}

static int self_all_to_all_v_start(struct mt_comm *c, const void *send,
                                   const size_t *send_counts, const size_t *send_displs,
                                   void *recv, const size_t *recv_counts,
                                   const size_t *recv_displs, enum mt_dt dt,
                                   struct mt_comm_req *req, struct mt_err *err)
{
    return self_all_to_all_v(c, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                             dt, err);
}

static int self_wait(struct mt_comm *c, struct mt_comm_req *req, struct mt_err *err)
{
    return MT_OK;
}

static void self_destroy(struct mt_comm *c)
{
    struct self_impl *s = c->impl;
    while (s->queue) {
        struct self_msg *m = s->queue;
        s->queue = m->next;
        free(m);
    }
    mt_comm_free(c);
}

static const struct mt_comm_ops self_ops = {
    .all_reduce = self_all_reduce,
    .reduce_scatter = self_reduce_scatter,
    .all_gather = self_all_gather,
    .all_to_all_v = self_all_to_all_v,
    .broadcast = self_broadcast,
    .send = self_send,
    .recv = self_recv,
    .barrier = self_barrier,
    .destroy = self_destroy,
    .all_reduce_start = self_all_reduce_start,
    .reduce_scatter_start = self_reduce_scatter_start,
    .all_gather_start = self_all_gather_start,
    .wait = self_wait,
    .all_to_all_v_start = self_all_to_all_v_start,
};

int mt_comm_self_create_at(const char *name, double timeout_s, int world_rank,
                           struct mt_comm **out, struct mt_err *err)
{
    return mt_comm_alloc(&self_ops, 0, 1, name, timeout_s, world_rank, sizeof(struct self_impl),
                         out, err);
}

int mt_comm_self_create(const char *name, double timeout_s, struct mt_comm **out,
                        struct mt_err *err)
{
    return mt_comm_self_create_at(name, timeout_s, 0, out, err);
}

#if !defined(HAVE_NCCL) || !defined(HAVE_CUDA) /* configure builds NCCL only with CUDA */
int mt_comm_nccl_create(struct mt_comm *host, struct mt_comm **out, struct mt_err *err)
{
    return mt_err_set(err, MT_EUNSUPPORTED,
                      "communicator %s: this moetrain was built without NCCL (configure found "
                      "no nccl.h / libnccl; see ./configure --with-nccl)",
                      host ? host->name : "?");
}

int mt_comm_nccl_set_stream(struct mt_comm *c, void *stream, struct mt_err *err)
{
    return mt_err_set(err, MT_EUNSUPPORTED, "this moetrain was built without NCCL");
}

int mt_comm_nccl_split(struct mt_comm *parent, int color, int key, const char *name, int rank,
                       int size, struct mt_comm **out, struct mt_err *err)
{
    *out = NULL;
    return mt_err_set(err, MT_EUNSUPPORTED,
                      "communicator %s: this moetrain was built without NCCL", name);
}
#endif

/* moetrain: the MPI backend (CPU buffers, several processes).
 *
 * Every call starts a nonblocking MPI operation and polls it with MPI_Test
 * until it completes or the comm's timeout passes (timeout_s <= 0: MPI_Wait).
 * On expiry the call returns MT_ERUNTIME naming the collective, the group, the
 * rank and the wait; the request stays pending (MPI cannot cancel a
 * collective), so the comm is marked broken and the caller must abort.
 * MPI counts are ints: all_reduce, broadcast, send and recv go in pieces of
 * 2^30 elements; the other calls refuse counts or displacements past INT_MAX.
 * The nonblocking starts (mt_all_reduce_start, ...) keep the MPI_Request in the
 * caller's struct mt_comm_req; the wait tests it as above, the timeout counted from
 * the wait's start. */
#include "runtime/comm_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mpi_impl {
    struct mt_comm_common common;
    MPI_Comm comm;
    bool a2a_started; /* a started all_to_all_v holds the second half of counts */
    int counts[];  /* 8 x size: all_to_all_v's int counts and displacements, kept with the
                      comm so that a call allocates nothing; the second 4 x size those of
                      a started one, which MPI reads until it completes */
};

#define PIECE ((size_t)1 << 30)

static MPI_Comm handle(struct mt_comm *c)
{
    return ((struct mpi_impl *)c->impl)->comm;
}

static MPI_Datatype mpi_type(enum mt_dt dt)
{
    switch (dt) {
    case MT_DT_F32: return MPI_FLOAT;
    case MT_DT_F64: return MPI_DOUBLE;
    case MT_DT_I32: return MPI_INT32_T;
    case MT_DT_I64: return MPI_INT64_T;
    case MT_DT_U8: return MPI_UINT8_T;
    case MT_DT_BF16: return MPI_UINT16_T; /* moved only */
    }
    return MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(enum mt_redop op)
{
    switch (op) {
    case MT_OP_SUM: return MPI_SUM;
    case MT_OP_MAX: return MPI_MAX;
    case MT_OP_MIN: return MPI_MIN;
    }
    return MPI_OP_NULL;
}

int mt_mpi_error(int mpirc, struct mt_err *err, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mpirc, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len] = '\0';
    return mt_err_set(err, MT_ERUNTIME, "%s: MPI error %d: %s", what, mpirc, msg);
}

static int call_error(struct mt_comm *c, const char *op, int mpirc, struct mt_err *err)
{
    char what[96];
    snprintf(what, sizeof what, "%s on %s (rank %d of %d)", op, c->name, c->rank, c->size);
    mt_comm_common(c)->broken = true;
    return mt_mpi_error(mpirc, err, what);
}

/* Completes the request a call just started (started = the start's return
 * code) within the call's deadline. */
static int finish(struct mt_comm *c, const char *op, int started, MPI_Request *req,
                  MPI_Status *status, struct mt_deadline *d, struct mt_err *err)
{
    if (started != MPI_SUCCESS) return call_error(c, op, started, err);
    MPI_Status ignored;
    if (!status) status = &ignored;
    if (d->end <= 0) {
        int rc = MPI_Wait(req, status);
        return rc == MPI_SUCCESS ? MT_OK : call_error(c, op, rc, err);
    }
    for (;;) {
        int done = 0;
        int rc = MPI_Test(req, &done, status);
        if (rc != MPI_SUCCESS) return call_error(c, op, rc, err);
        if (done) return MT_OK;
        if (mt_deadline_passed(d)) return mt_comm_timeout_error(c, op, d, err);
        mt_deadline_pause(d);
    }
}

static int check_int(struct mt_comm *c, const char *op, const char *what, int index, size_t n,
                     struct mt_err *err)
{
    if (n <= INT_MAX) return MT_OK;
    return mt_err_set(err, MT_EUNSUPPORTED,
                      "%s on %s: %s[%d] = %zu elements exceeds MPI's limit of %d; split the "
                      "exchange into smaller pieces",
                      op, c->name, what, index, n, INT_MAX);
}

static int piece_of(size_t count, size_t off)
{
    return (int)(count - off < PIECE ? count - off : PIECE);
}

static int mpi_all_reduce(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt,
                          enum mt_redop op, struct mt_err *err)
{
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    char *p = buf;
    size_t sz = mt_dt_size(dt);
    for (size_t off = 0; off == 0 || off < count; off += PIECE) {
        MPI_Request req;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, p + off * sz, piece_of(count, off), mpi_type(dt),
                                mpi_op(op), handle(c), &req);
        MT_CHECK(finish(c, "all_reduce", rc, &req, NULL, &d, err));
    }
    return MT_OK;
}

static int mpi_reduce_scatter(struct mt_comm *c, const void *send, void *recv, size_t count,
                              enum mt_dt dt, enum mt_redop op, struct mt_err *err)
{
    MT_CHECK(check_int(c, "reduce_scatter", "count", 0, count, err));
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    /* send == recv: the input is the whole buffer, the result lands at its start. */
    const void *in = send == recv ? MPI_IN_PLACE : send;
    MPI_Request req;
    int rc = MPI_Ireduce_scatter_block(in, recv, (int)count, mpi_type(dt), mpi_op(op), handle(c),
                                       &req);
    return finish(c, "reduce_scatter", rc, &req, NULL, &d, err);
}

static int mpi_all_gather(struct mt_comm *c, const void *send, void *recv, size_t count,
                          enum mt_dt dt, struct mt_err *err)
{
    MT_CHECK(check_int(c, "all_gather", "count", 0, count, err));
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    /* send already in place at this rank's block of recv: MPI_IN_PLACE. */
    size_t sz = mt_dt_size(dt);
    const void *in = send == (char *)recv + (size_t)c->rank * count * sz ? MPI_IN_PLACE : send;
    MPI_Request req;
    int rc = MPI_Iallgather(in, (int)count, mpi_type(dt), recv, (int)count, mpi_type(dt),
                            handle(c), &req);
    return finish(c, "all_gather", rc, &req, NULL, &d, err);
}

/* The int counts and displacements of an all_to_all_v into v (4 x size: send counts,
 * send displacements, receive counts, receive displacements). */
static int a2a_ints(struct mt_comm *c, int *v, const size_t *send_counts,
                    const size_t *send_displs, const size_t *recv_counts,
                    const size_t *recv_displs, struct mt_err *err)
{
    const char *op = "all_to_all_v";
    const int n = c->size;
    for (int i = 0; i < n; i++) {
        MT_CHECK(check_int(c, op, "send_counts", i, send_counts[i], err));
        MT_CHECK(check_int(c, op, "send_displs", i, send_displs[i], err));
        MT_CHECK(check_int(c, op, "recv_counts", i, recv_counts[i], err));
        MT_CHECK(check_int(c, op, "recv_displs", i, recv_displs[i], err));
        v[i] = (int)send_counts[i];
        v[n + i] = (int)send_displs[i];
        v[2 * n + i] = (int)recv_counts[i];
        v[3 * n + i] = (int)recv_displs[i];
    }
    return MT_OK;
}

static int mpi_all_to_all_v(struct mt_comm *c, const void *send, const size_t *send_counts,
                            const size_t *send_displs, void *recv, const size_t *recv_counts,
                            const size_t *recv_displs, enum mt_dt dt, struct mt_err *err)
{
    const int n = c->size;
    int *v = ((struct mpi_impl *)c->impl)->counts;
    MT_CHECK(a2a_ints(c, v, send_counts, send_displs, recv_counts, recv_displs, err));
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    MPI_Request req;
    int started = MPI_Ialltoallv(send, v, v + n, mpi_type(dt), recv, v + 2 * n, v + 3 * n,
                                 mpi_type(dt), handle(c), &req);
    return finish(c, "all_to_all_v", started, &req, NULL, &d, err);
}

static int mpi_broadcast(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int root,
                         struct mt_err *err)
{
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    char *p = buf;
    size_t sz = mt_dt_size(dt);
    for (size_t off = 0; off == 0 || off < count; off += PIECE) {
        MPI_Request req;
        int rc = MPI_Ibcast(p + off * sz, piece_of(count, off), mpi_type(dt), root, handle(c),
                            &req);
        MT_CHECK(finish(c, "broadcast", rc, &req, NULL, &d, err));
    }
    return MT_OK;
}

static int mpi_send(struct mt_comm *c, const void *buf, size_t count, enum mt_dt dt, int peer,
                    int tag, struct mt_err *err)
{
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    const char *p = buf;
    size_t sz = mt_dt_size(dt);
    for (size_t off = 0; off == 0 || off < count; off += PIECE) {
        MPI_Request req;
        int rc = MPI_Isend(p + off * sz, piece_of(count, off), mpi_type(dt), peer, tag, handle(c),
                           &req);
        MT_CHECK(finish(c, "send", rc, &req, NULL, &d, err));
    }
    return MT_OK;
}

static int mpi_recv(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int peer, int tag,
                    struct mt_err *err)
{
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    char *p = buf;
    size_t sz = mt_dt_size(dt);
    for (size_t off = 0; off == 0 || off < count; off += PIECE) {
        int want = piece_of(count, off), got = 0;
        MPI_Request req;
        MPI_Status st;
        int rc = MPI_Irecv(p + off * sz, want, mpi_type(dt), peer, tag, handle(c), &req);
        MT_CHECK(finish(c, "recv", rc, &req, &st, &d, err));
        MPI_Get_count(&st, mpi_type(dt), &got);
        if (got != want)
            return mt_err_set(err, MT_EINVAL,
                              "recv on %s: expected %d elements from rank %d with tag %d, the "
                              "message has %d",
                              c->name, want, peer, tag, got);
    }
    return MT_OK;
}

#define P2P_BATCH_MAX 8

/* Posts every transfer of a batch (MPI_Isend, MPI_Irecv) into req[0..n). */
static int p2p_post(struct mt_comm *c, const struct mt_p2p *ops, int n, enum mt_dt dt,
                    MPI_Request *req, struct mt_err *err)
{
    for (int i = 0; i < n; i++) {
        const struct mt_p2p *x = &ops[i];
        MT_CHECK(check_int(c, "p2p batch", "count", i, x->count, err));
        int rc = x->send ? MPI_Isend(x->buf, (int)x->count, mpi_type(dt), x->peer, x->tag,
                                     handle(c), &req[i])
                         : MPI_Irecv(x->buf, (int)x->count, mpi_type(dt), x->peer, x->tag,
                                     handle(c), &req[i]);
        if (rc != MPI_SUCCESS) return call_error(c, "p2p batch", rc, err);
    }
    return MT_OK;
}

/* Tests the posted transfers until all are done (within d), then checks what arrived. */
static int p2p_complete(struct mt_comm *c, const struct mt_p2p *ops, int n, enum mt_dt dt,
                        MPI_Request *req, struct mt_deadline *d, struct mt_err *err)
{
    MPI_Status st[P2P_BATCH_MAX];
    for (;;) {
        int done = 0;
        int rc = MPI_Testall(n, req, &done, st);
        if (rc != MPI_SUCCESS) return call_error(c, "p2p batch", rc, err);
        if (done) break;
        if (d->end > 0 && mt_deadline_passed(d))
            return mt_comm_timeout_error(c, "p2p batch", d, err);
        mt_deadline_pause(d);
    }
    for (int i = 0; i < n; i++) {
        int got = 0;
        if (ops[i].send) continue;
        MPI_Get_count(&st[i], mpi_type(dt), &got);
        if ((size_t)got != ops[i].count)
            return mt_err_set(err, MT_EINVAL,
                              "recv on %s: expected %zu elements from rank %d with tag %d, the "
                              "message has %d",
                              c->name, ops[i].count, ops[i].peer, ops[i].tag, got);
    }
    return MT_OK;
}

static int mpi_p2p_batch(struct mt_comm *c, const struct mt_p2p *ops, int n, enum mt_dt dt,
                         struct mt_err *err)
{
    if (n > P2P_BATCH_MAX)
        return mt_err_set(err, MT_EINVAL, "p2p batch on %s: %d transfers, at most %d", c->name, n,
                          P2P_BATCH_MAX);
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    MPI_Request req[P2P_BATCH_MAX];
    MT_CHECK(p2p_post(c, ops, n, dt, req, err));
    return p2p_complete(c, ops, n, dt, req, &d, err);
}

static int mpi_barrier(struct mt_comm *c, struct mt_err *err)
{
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    MPI_Request req;
    int rc = MPI_Ibarrier(handle(c), &req);
    return finish(c, "barrier", rc, &req, NULL, &d, err);
}

/* ---- nonblocking: the request's MPI_Request lives in req->h --------------------------- */

_Static_assert(sizeof(MPI_Request) <= sizeof(((struct mt_comm_req *)0)->h),
               "an MPI_Request must fit in struct mt_comm_req's handle");

static MPI_Request *request_of(struct mt_comm_req *req)
{
    return (MPI_Request *)(void *)req->h.bytes;
}

_Static_assert(MT_P2P_START_MAX * sizeof(MPI_Request) <= sizeof(((struct mt_comm_req *)0)->h),
               "a started batch's MPI_Requests must fit in struct mt_comm_req's handle");
_Static_assert(MT_P2P_START_MAX <= P2P_BATCH_MAX, "a started batch is a batch");

/* After an MPI start returned rc: pending on c, or failed (the comm is then broken). */
static int pending(struct mt_comm *c, struct mt_comm_req *req, int rc, struct mt_err *err)
{
    if (rc != MPI_SUCCESS) return call_error(c, req->op, rc, err);
    req->comm = c;
    return MT_OK;
}

static int mpi_all_reduce_start(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt,
                                enum mt_redop op, struct mt_comm_req *req, struct mt_err *err)
{
    MT_CHECK(check_int(c, "all_reduce", "count", 0, count, err));
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, mpi_type(dt), mpi_op(op), handle(c),
                            request_of(req));
    return pending(c, req, rc, err);
}

static int mpi_reduce_scatter_start(struct mt_comm *c, const void *send, void *recv, size_t count,
                                    enum mt_dt dt, enum mt_redop op, struct mt_comm_req *req,
                                    struct mt_err *err)
{
    MT_CHECK(check_int(c, "reduce_scatter", "count", 0, count, err));
    const void *in = send == recv ? MPI_IN_PLACE : send; /* as mpi_reduce_scatter */
    int rc = MPI_Ireduce_scatter_block(in, recv, (int)count, mpi_type(dt), mpi_op(op), handle(c),
                                       request_of(req));
    return pending(c, req, rc, err);
}

static int mpi_all_gather_start(struct mt_comm *c, const void *send, void *recv, size_t count,
                                enum mt_dt dt, struct mt_comm_req *req, struct mt_err *err)
{
    MT_CHECK(check_int(c, "all_gather", "count", 0, count, err));
    size_t sz = mt_dt_size(dt);
    const void *in = send == (char *)recv + (size_t)c->rank * count * sz ? MPI_IN_PLACE : send;
    int rc = MPI_Iallgather(in, (int)count, mpi_type(dt), recv, (int)count, mpi_type(dt),
                            handle(c), request_of(req));
    return pending(c, req, rc, err);
}

/* The batch's requests, one per transfer, side by side in req->h. */
static int mpi_p2p_batch_start(struct mt_comm *c, const struct mt_p2p *ops, int n, enum mt_dt dt,
                               struct mt_comm_req *req, struct mt_err *err)
{
    MT_CHECK(p2p_post(c, ops, n, dt, request_of(req), err));
    req->comm = c;
    return MT_OK;
}

static int mpi_all_to_all_v_start(struct mt_comm *c, const void *send,
                                  const size_t *send_counts, const size_t *send_displs,
                                  void *recv, const size_t *recv_counts,
                                  const size_t *recv_displs, enum mt_dt dt,
                                  struct mt_comm_req *req, struct mt_err *err)
{
    struct mpi_impl *mi = c->impl;
    const int n = c->size;
    if (mi->a2a_started)
        return mt_err_set(err, MT_EINVAL,
                          "all_to_all_v on %s: started while another started all_to_all_v is "
                          "pending (an internal error: wait for the first)",
                          c->name);
    int *v = mi->counts + 4 * n;
    MT_CHECK(a2a_ints(c, v, send_counts, send_displs, recv_counts, recv_displs, err));
    int rc = MPI_Ialltoallv(send, v, v + n, mpi_type(dt), recv, v + 2 * n, v + 3 * n,
                            mpi_type(dt), handle(c), request_of(req));
    MT_CHECK(pending(c, req, rc, err));
    mi->a2a_started = true;
    return MT_OK;
}

/* Tests the request until done, bounded by the timeout from now (the collective may
 * have been started long before: the bound is on how long the caller blocks). */
static int mpi_wait(struct mt_comm *c, struct mt_comm_req *req, struct mt_err *err)
{
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    if (req->op && !strcmp(req->op, "all_to_all_v")) /* its counts are free again */
        ((struct mpi_impl *)c->impl)->a2a_started = false;
    if (req->nops > 0) /* a started p2p batch (its dt: bytes or elements, as posted) */
        return p2p_complete(c, req->ops, req->nops, req->dt, request_of(req), &d, err);
    return finish(c, req->op, MPI_SUCCESS, request_of(req), NULL, &d, err);
}

static void mpi_destroy(struct mt_comm *c)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    MPI_Comm comm = handle(c);
    /* A broken comm may have pending requests; freeing it could wait on them. */
    if (!finalized && !mt_comm_common(c)->broken && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    mt_comm_free(c);
}

static const struct mt_comm_ops mpi_ops = {
    .all_reduce = mpi_all_reduce,
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .all_to_all_v = mpi_all_to_all_v,
    .broadcast = mpi_broadcast,
    .send = mpi_send,
    .recv = mpi_recv,
    .barrier = mpi_barrier,
    .destroy = mpi_destroy,
    .p2p_batch = mpi_p2p_batch,
    .all_reduce_start = mpi_all_reduce_start,
    .reduce_scatter_start = mpi_reduce_scatter_start,
    .all_gather_start = mpi_all_gather_start,
    .wait = mpi_wait,
    .p2p_batch_start = mpi_p2p_batch_start,
    .all_to_all_v_start = mpi_all_to_all_v_start,
};

int mt_comm_mpi_create(MPI_Comm comm, const char *name, double timeout_s, int world_rank,
                       struct mt_comm **out, struct mt_err *err)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    MT_CHECK(mt_comm_alloc(&mpi_ops, rank, size, name, timeout_s, world_rank,
                           sizeof(struct mpi_impl) + sizeof(int) * 8 * (size_t)size, out, err));
    ((struct mpi_impl *)(*out)->impl)->comm = comm;
    return MT_OK;
}

MPI_Comm mt_comm_mpi_handle(const struct mt_comm *c)
{
    return c->ops == &mpi_ops ? ((const struct mpi_impl *)c->impl)->comm : MPI_COMM_NULL;
}

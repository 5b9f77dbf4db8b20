/* moetrain: the NCCL backend (device buffers, one GPU per process).
 *
 * The NCCL communicator is nonblocking (ncclConfig_t.blocking = 0), so no call
 * can hang the host: after each enqueue the comm's state is polled with
 * ncclCommGetAsyncError, then the stream with cudaStreamQuery, both until the
 * comm's timeout. On expiry ncclCommAbort ends the communicator (its kernels
 * stop waiting for peers) and the call returns MT_ERUNTIME like every other
 * timeout. Each call completes before it returns, as with the other backends.
 * Communication runs on the comm's own stream; mt_comm_nccl_set_stream names the
 * caller's compute stream, and each call is then ordered after the compute work
 * queued so far (an event the comm stream waits for) and before the compute work
 * queued after it (an event the compute stream waits for), without a host-side
 * synchronisation of the compute stream. The nonblocking starts (mt_all_reduce_start,
 * ...) return once the collective is enqueued, with an event recorded after it on the
 * comm stream; the wait makes the compute stream wait for that event, so compute work
 * queued between start and wait runs beside the collective and nothing waits on the
 * host; mt_p2p_batch_start and mt_all_to_all_v_start likewise. all_to_all_v and p2p_batch are
 * grouped ncclSend/ncclRecv; barrier is an all_reduce of one int.
 *
 * Communicators of parallel groups are split from one parent (mt_comm_nccl_split,
 * ncclCommSplit) rather than created each from a unique id of its own. Every comm made
 * here sets ncclConfig_t.splitShare = 1, which NCCL reads on the parent of a split: the
 * child then shares the parent's internal resources (its proxy thread and streams, the
 * per-channel peer connections and their buffers, the network plugin's state, NVLS
 * buffers when the child has as many ranks per node as the parent, and the abort flag)
 * instead of allocating its own. The price: operations of communicators that share
 * resources are serialised, never overlap (moetrain's calls each complete before they
 * return anyway), and ncclCommAbort of one of them (a timeout here) aborts them all,
 * which is what a timeout leads to anyway (the job ends). */
#include "runtime/comm_internal.h"
#include "runtime/nccl_dl.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* nccl.h declares a few functions as f() rather than f(void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

struct nccl_impl {
    struct mt_comm_common common;
    ncclComm_t comm;
    cudaStream_t own, stream; /* own: created here; stream: where calls go (own) */
    cudaStream_t order;       /* the compute stream calls are ordered with, or NULL */
    cudaEvent_t ready, done;  /* compute -> comm, comm -> compute */
    int *scratch;             /* one device int for barrier */
    /* Nonblocking collectives: one event per pending request, recorded on the comm
     * stream after its collective; made when more are pending than ever before. */
    cudaEvent_t *events;
    bool *busy;
    int nevents;
};

static struct nccl_impl *impl_of(struct mt_comm *c)
{
    return c->impl;
}

static ncclDataType_t nccl_type(enum mt_dt dt)
{
    switch (dt) {
    case MT_DT_F32: return ncclFloat32;
    case MT_DT_F64: return ncclFloat64;
    case MT_DT_I32: return ncclInt32;
    case MT_DT_I64: return ncclInt64;
    case MT_DT_U8: return ncclUint8;
    case MT_DT_BF16: return ncclBfloat16;
    }
    return ncclUint8;
}

static ncclRedOp_t nccl_op(enum mt_redop op)
{
    switch (op) {
    case MT_OP_SUM: return ncclSum;
    case MT_OP_MAX: return ncclMax;
    case MT_OP_MIN: return ncclMin;
    }
    return ncclSum;
}

static int nccl_error(struct mt_comm *c, const char *op, ncclResult_t r, struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    const char *last = n->comm ? ncclGetLastError(n->comm) : NULL;
    n->common.broken = true;
    return mt_err_set(err, MT_ERUNTIME, "%s on %s (rank %d of %d): NCCL error: %s%s%s", op,
                      c->name, c->rank, c->size, ncclGetErrorString(r), last && *last ? ": " : "",
                      last ? last : "");
}

static int cuda_error(struct mt_comm *c, const char *op, cudaError_t e, struct mt_err *err)
{
    impl_of(c)->common.broken = true;
    return mt_err_set(err, MT_ERUNTIME, "%s on %s (rank %d of %d): CUDA error: %s", op, c->name,
                      c->rank, c->size, cudaGetErrorString(e));
}

static int expire(struct mt_comm *c, const char *op, const struct mt_deadline *d,
                  struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    ncclCommAbort(n->comm);
    n->comm = NULL;
    return mt_comm_timeout_error(c, op, d, err);
}

/* Waits until the communicator has left ncclInProgress (a nonblocking init
 * or enqueue finished). */
static int wait_comm(struct mt_comm *c, const char *op, struct mt_deadline *d, struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    for (;;) {
        ncclResult_t state;
        ncclResult_t r = ncclCommGetAsyncError(n->comm, &state);
        if (r != ncclSuccess) return nccl_error(c, op, r, err);
        if (state == ncclSuccess) return MT_OK;
        if (state != ncclInProgress) return nccl_error(c, op, state, err);
        if (mt_deadline_passed(d)) return expire(c, op, d, err);
        mt_deadline_pause(d);
    }
}

/* Before a call: the comm stream waits for the compute work queued so far. */
static int order_before(struct mt_comm *c, const char *op, struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    if (!n->order) return MT_OK;
    cudaError_t e = cudaEventRecord(n->ready, n->order);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(n->stream, n->ready, 0);
    return e == cudaSuccess ? MT_OK : cuda_error(c, op, e, err);
}

/* Completes a call whose enqueue returned started. */
static int finish(struct mt_comm *c, const char *op, ncclResult_t started, struct mt_deadline *d,
                  struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    if (started != ncclSuccess && started != ncclInProgress) return nccl_error(c, op, started, err);
    MT_CHECK(wait_comm(c, op, d, err));
    if (n->order) { /* later compute work follows the call on the device, too */
        cudaError_t e = cudaEventRecord(n->done, n->stream);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(n->order, n->done, 0);
        if (e != cudaSuccess) return cuda_error(c, op, e, err);
        /* inside a CUDA graph scope the comm stream joined the compute stream's capture:
         * the call is captured, runs at each launch of the graph, and the host has
         * nothing to wait for (&cuda_graph modules = 'moe', doc/host-overhead.md) */
        enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        e = cudaStreamIsCapturing(n->stream, &st);
        if (e != cudaSuccess) return cuda_error(c, op, e, err);
        if (st != cudaStreamCaptureStatusNone) return MT_OK;
    }
    for (;;) {
        cudaError_t e = cudaStreamQuery(n->stream);
        if (e == cudaSuccess) return MT_OK;
        if (e != cudaErrorNotReady) return cuda_error(c, op, e, err);
        ncclResult_t state;
        if (ncclCommGetAsyncError(n->comm, &state) == ncclSuccess && state != ncclSuccess &&
            state != ncclInProgress)
            return nccl_error(c, op, state, err);
        if (mt_deadline_passed(d)) return expire(c, op, d, err);
        mt_deadline_pause(d);
    }
}

static int nccl_all_reduce(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt,
                           enum mt_redop op, struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    MT_CHECK(order_before(c, __func__, err));
    return finish(c, "all_reduce",
                  ncclAllReduce(buf, buf, count, nccl_type(dt), nccl_op(op), n->comm, n->stream),
                  &d, err);
}

static int nccl_reduce_scatter(struct mt_comm *c, const void *send, void *recv, size_t count,
                               enum mt_dt dt, enum mt_redop op, struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    MT_CHECK(order_before(c, __func__, err));
    return finish(c, "reduce_scatter",
                  ncclReduceScatter(send, recv, count, nccl_type(dt), nccl_op(op), n->comm,
                                    n->stream),
                  &d, err);
}

static int nccl_all_gather(struct mt_comm *c, const void *send, void *recv, size_t count,
                           enum mt_dt dt, struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    MT_CHECK(order_before(c, __func__, err));
    return finish(c, "all_gather",
                  ncclAllGather(send, recv, count, nccl_type(dt), n->comm, n->stream), &d, err);
}

/* The grouped sends and receives of an all_to_all_v, enqueued on the comm stream. */
static ncclResult_t a2a_enqueue(struct mt_comm *c, const void *send, const size_t *send_counts,
                                const size_t *send_displs, void *recv, const size_t *recv_counts,
                                const size_t *recv_displs, enum mt_dt dt)
{
    struct nccl_impl *n = impl_of(c);
    size_t sz = mt_dt_size(dt);
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < c->size && r == ncclSuccess; p++) {
        if (send_counts[p])
            r = ncclSend((const char *)send + send_displs[p] * sz, send_counts[p], nccl_type(dt),
                         p, n->comm, n->stream);
        if (r == ncclSuccess && recv_counts[p])
            r = ncclRecv((char *)recv + recv_displs[p] * sz, recv_counts[p], nccl_type(dt), p,
                         n->comm, n->stream);
    }
    ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
}

static int nccl_all_to_all_v(struct mt_comm *c, const void *send, const size_t *send_counts,
                             const size_t *send_displs, void *recv, const size_t *recv_counts,
                             const size_t *recv_displs, enum mt_dt dt, struct mt_err *err)
{
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    MT_CHECK(order_before(c, __func__, err));
    return finish(c, "all_to_all_v",
                  a2a_enqueue(c, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                              dt),
                  &d, err);
}

static int nccl_broadcast(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int root,
                          struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    MT_CHECK(order_before(c, __func__, err));
    return finish(c, "broadcast",
                  ncclBroadcast(buf, buf, count, nccl_type(dt), root, n->comm, n->stream), &d,
                  err);
}

static int nccl_send(struct mt_comm *c, const void *buf, size_t count, enum mt_dt dt, int peer,
                     int tag, struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    MT_CHECK(order_before(c, __func__, err));
    return finish(c, "send", ncclSend(buf, count, nccl_type(dt), peer, n->comm, n->stream), &d,
                  err);
}

static int nccl_recv(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int peer, int tag,
                     struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    MT_CHECK(order_before(c, __func__, err));
    return finish(c, "recv", ncclRecv(buf, count, nccl_type(dt), peer, n->comm, n->stream), &d,
                  err);
}

/* The smallest tag of ops[0..nops) above *tag (any tag when first); false
 * when none is left. */
static bool next_tag(const struct mt_p2p *ops, int nops, bool first, int *tag)
{
    bool found = false;
    int best = 0;
    for (int i = 0; i < nops; i++)
        if ((first || ops[i].tag > *tag) && (!found || ops[i].tag < best)) {
            best = ops[i].tag;
            found = true;
        }
    *tag = best;
    return found;
}

/* Megatron's batch_isend_irecv: every transfer inside one NCCL group, so that
 * peers exchanging in both directions (the interleaved pipeline schedule)
 * progress together instead of each blocking in its first send. NCCL has no
 * tags: it pairs the sends to a peer with that peer's receives in the order
 * they are posted. Posting in ascending tag order (ties in the caller's order,
 * MPI's non-overtaking rule) makes a batch match by tag as with MPI, whatever
 * order each side lists its transfers in. Empty transfers are skipped on both
 * sides alike. */
static ncclResult_t p2p_enqueue(struct mt_comm *c, const struct mt_p2p *ops, int nops,
                                enum mt_dt dt)
{
    struct nccl_impl *n = impl_of(c);
    ncclResult_t r = ncclGroupStart();
    int tag = 0;
    for (bool first = true; r == ncclSuccess && next_tag(ops, nops, first, &tag); first = false)
        for (int i = 0; i < nops && r == ncclSuccess; i++) {
            const struct mt_p2p *x = &ops[i];
            if (x->tag != tag || !x->count) continue;
            r = x->send ? ncclSend(x->buf, x->count, nccl_type(dt), x->peer, n->comm, n->stream)
                        : ncclRecv(x->buf, x->count, nccl_type(dt), x->peer, n->comm, n->stream);
        }
    ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
}

static int nccl_p2p_batch(struct mt_comm *c, const struct mt_p2p *ops, int nops, enum mt_dt dt,
                          struct mt_err *err)
{
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    MT_CHECK(order_before(c, __func__, err));
    return finish(c, "p2p batch", p2p_enqueue(c, ops, nops, dt), &d, err);
}

static int nccl_barrier(struct mt_comm *c, struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    MT_CHECK(order_before(c, __func__, err));
    return finish(c, "barrier",
                  ncclAllReduce(n->scratch, n->scratch, 1, ncclInt32, ncclSum, n->comm,
                                n->stream),
                  &d, err);
}

/* ---- nonblocking collectives ------------------------------------------------------------ */

/* A free event slot for a request (a new event when all are busy). */
static int take_event(struct mt_comm *c, const char *op, int *slot, struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    for (int i = 0; i < n->nevents; i++)
        if (!n->busy[i]) {
            n->busy[i] = true;
            *slot = i;
            return MT_OK;
        }
    cudaEvent_t *ev = realloc(n->events, sizeof *ev * (size_t)(n->nevents + 1));
    if (ev) n->events = ev;
    bool *busy = ev ? realloc(n->busy, sizeof *busy * (size_t)(n->nevents + 1)) : NULL;
    if (busy) n->busy = busy;
    if (!ev || !busy)
        return mt_err_set(err, MT_ENOMEM, "%s on %s: out of memory for a request", op, c->name);
    cudaError_t e = cudaEventCreateWithFlags(&n->events[n->nevents], cudaEventDisableTiming);
    if (e != cudaSuccess) return cuda_error(c, op, e, err);
    n->busy[n->nevents] = true;
    *slot = n->nevents++;
    return MT_OK;
}

/* After the enqueue of a started collective: the enqueue is complete (host side,
 * ncclInProgress left), the request's event marks its end on the comm stream. */
static int start_finish(struct mt_comm *c, struct mt_comm_req *req, ncclResult_t started,
                        struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    const char *op = req->op;
    if (started != ncclSuccess && started != ncclInProgress) return nccl_error(c, op, started, err);
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    MT_CHECK(wait_comm(c, op, &d, err));
    int slot = -1;
    MT_CHECK(take_event(c, op, &slot, err));
    cudaError_t e = cudaEventRecord(n->events[slot], n->stream);
    if (e != cudaSuccess) {
        n->busy[slot] = false;
        return cuda_error(c, op, e, err);
    }
    req->h.i = slot;
    req->comm = c;
    return MT_OK;
}

static int nccl_all_reduce_start(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt,
                                 enum mt_redop op, struct mt_comm_req *req, struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    MT_CHECK(order_before(c, req->op, err));
    return start_finish(c, req,
                        ncclAllReduce(buf, buf, count, nccl_type(dt), nccl_op(op), n->comm,
                                      n->stream),
                        err);
}

static int nccl_reduce_scatter_start(struct mt_comm *c, const void *send, void *recv,
                                     size_t count, enum mt_dt dt, enum mt_redop op,
                                     struct mt_comm_req *req, struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    MT_CHECK(order_before(c, req->op, err));
    return start_finish(c, req,
                        ncclReduceScatter(send, recv, count, nccl_type(dt), nccl_op(op), n->comm,
                                          n->stream),
                        err);
}

static int nccl_all_gather_start(struct mt_comm *c, const void *send, void *recv, size_t count,
                                 enum mt_dt dt, struct mt_comm_req *req, struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    MT_CHECK(order_before(c, req->op, err));
    return start_finish(c, req,
                        ncclAllGather(send, recv, count, nccl_type(dt), n->comm, n->stream), err);
}

static int nccl_p2p_batch_start(struct mt_comm *c, const struct mt_p2p *ops, int nops,
                                enum mt_dt dt, struct mt_comm_req *req, struct mt_err *err)
{
    MT_CHECK(order_before(c, req->op, err));
    return start_finish(c, req, p2p_enqueue(c, ops, nops, dt), err);
}

static int nccl_all_to_all_v_start(struct mt_comm *c, const void *send,
                                   const size_t *send_counts, const size_t *send_displs,
                                   void *recv, const size_t *recv_counts,
                                   const size_t *recv_displs, enum mt_dt dt,
                                   struct mt_comm_req *req, struct mt_err *err)
{
    MT_CHECK(order_before(c, req->op, err));
    return start_finish(c, req,
                        a2a_enqueue(c, send, send_counts, send_displs, recv, recv_counts,
                                    recv_displs, dt),
                        err);
}

/* With a compute stream: it waits for the request's event on the device, and the host
 * goes on at once (an error NCCL already knows of is reported; a hang shows at the next
 * call that waits on the host). Without: the host polls the event within the timeout. */
static int nccl_wait(struct mt_comm *c, struct mt_comm_req *req, struct mt_err *err)
{
    struct nccl_impl *n = impl_of(c);
    const char *op = req->op;
    const int slot = (int)req->h.i;
    cudaEvent_t ev = n->events[slot];
    int rc = MT_OK;
    ncclResult_t state;
    if (n->order) {
        cudaError_t e = cudaStreamWaitEvent(n->order, ev, 0);
        if (e != cudaSuccess) rc = cuda_error(c, op, e, err);
        else if (ncclCommGetAsyncError(n->comm, &state) == ncclSuccess && state != ncclSuccess &&
                 state != ncclInProgress)
            rc = nccl_error(c, op, state, err);
        n->busy[slot] = false;
        return rc;
    }
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
            rc = cuda_error(c, op, e, err);
            break;
        }
        if (ncclCommGetAsyncError(n->comm, &state) == ncclSuccess && state != ncclSuccess &&
            state != ncclInProgress) {
            rc = nccl_error(c, op, state, err);
            break;
        }
        if (mt_deadline_passed(&d)) {
            rc = expire(c, op, &d, err);
            break;
        }
        mt_deadline_pause(&d);
    }
    n->busy[slot] = false;
    return rc;
}

static void nccl_destroy(struct mt_comm *c)
{
    struct nccl_impl *n = impl_of(c);
    for (int i = 0; i < n->nevents; i++) cudaEventDestroy(n->events[i]);
    free(n->events);
    free(n->busy);
    if (n->comm) {
        if (n->common.broken)
            ncclCommAbort(n->comm);
        else
            ncclCommDestroy(n->comm);
    }
    if (n->scratch) cudaFree(n->scratch);
    if (n->own) cudaStreamDestroy(n->own);
    if (n->ready) cudaEventDestroy(n->ready);
    if (n->done) cudaEventDestroy(n->done);
    mt_comm_free(c);
}

static const struct mt_comm_ops nccl_ops = {
    .all_reduce = nccl_all_reduce,
    .reduce_scatter = nccl_reduce_scatter,
    .all_gather = nccl_all_gather,
    .all_to_all_v = nccl_all_to_all_v,
    .broadcast = nccl_broadcast,
    .send = nccl_send,
    .recv = nccl_recv,
    .barrier = nccl_barrier,
    .destroy = nccl_destroy,
    .p2p_batch = nccl_p2p_batch,
    .all_reduce_start = nccl_all_reduce_start,
    .reduce_scatter_start = nccl_reduce_scatter_start,
    .all_gather_start = nccl_all_gather_start,
    .wait = nccl_wait,
    .p2p_batch_start = nccl_p2p_batch_start,
    .all_to_all_v_start = nccl_all_to_all_v_start,
};

/* A comm of rank of size, named name, with its own stream and barrier scratch; its NCCL
 * communicator is set by the caller. */
static int alloc_comm(const char *name, int rank, int size, double timeout_s, int world_rank,
                      struct mt_comm **out, struct mt_err *err)
{
    struct mt_comm *c;
    MT_CHECK(mt_comm_alloc(&nccl_ops, rank, size, name, timeout_s, world_rank,
                           sizeof(struct nccl_impl), &c, err));
    struct nccl_impl *n = impl_of(c);
    cudaError_t e = cudaStreamCreateWithFlags(&n->own, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc((void **)&n->scratch, sizeof(int));
    if (e == cudaSuccess) e = cudaMemset(n->scratch, 0, sizeof(int));
    if (e != cudaSuccess) {
        int rc = cuda_error(c, "NCCL init", e, err);
        nccl_destroy(c);
        return rc;
    }
    n->stream = n->own;
    *out = c;
    return MT_OK;
}

/* The configuration of every communicator made here: nonblocking (see the top), and
 * splitShare = 1, which NCCL reads on the parent when it is split (mt_comm_nccl_split):
 * children then share the parent's resources. */
static ncclConfig_t comm_config(void)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.splitShare = 1;
    return config;
}

int mt_comm_nccl_create(struct mt_comm *host, struct mt_comm **out, struct mt_err *err)
{
    *out = NULL;
    /* Rank 0 makes the id; the others learn it, or that rank 0 failed. */
    struct {
        int32_t ok;
        ncclUniqueId id;
    } msg;
    memset(&msg, 0, sizeof msg);
    /* NCCL is loaded at run time; a process that cannot load it still takes part in
     * the broadcast, so that no peer waits for it. */
    struct mt_err load_err = { 0 };
    const int loaded = mt_nccl_load(&load_err);
    ncclResult_t idrc = ncclSystemError;
    if (host->rank == 0 && loaded == MT_OK) {
        idrc = ncclGetUniqueId(&msg.id);
        msg.ok = idrc == ncclSuccess;
    }
    MT_CHECK(mt_broadcast(host, &msg, sizeof msg, MT_DT_U8, 0, err));
    if (loaded != MT_OK)
        return mt_err_set(err, load_err.code, "NCCL communicator %s: %s", host->name,
                          load_err.msg);
    if (!msg.ok)
        return mt_err_set(err, MT_ERUNTIME, "NCCL communicator %s: ncclGetUniqueId failed on "
                                            "rank 0%s%s",
                          host->name, host->rank == 0 ? ": " : "",
                          host->rank == 0 ? ncclGetErrorString(idrc) : "");
    struct mt_comm *c;
    MT_CHECK(alloc_comm(host->name, host->rank, host->size, host->timeout_s,
                        mt_comm_common(host)->world_rank, &c, err));
    struct nccl_impl *n = impl_of(c);
    int rc = MT_OK;
    ncclConfig_t config = comm_config();
    struct mt_deadline d = mt_deadline_start(c->timeout_s);
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, host->size, msg.id, host->rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = nccl_error(c, "ncclCommInitRank", r, err);
        goto fail;
    }
    MT_CHECK_GOTO(wait_comm(c, "ncclCommInitRank", &d, err), fail);
    *out = c;
    return MT_OK;
fail:
    nccl_destroy(c);
    return rc;
}

int mt_comm_nccl_split(struct mt_comm *parent, int color, int key, const char *name, int rank,
                       int size, struct mt_comm **out, struct mt_err *err)
{
    *out = NULL;
    if (!parent || parent->ops != &nccl_ops)
        return mt_err_set(err, MT_EINVAL, "ncclCommSplit for %s: the parent %s is not an NCCL "
                                          "communicator",
                          name, parent ? parent->name : "?");
    struct nccl_impl *pn = impl_of(parent);
    MT_CHECK(mt_comm_check_usable(parent, "ncclCommSplit", err));
    struct mt_comm *c = NULL;
    if (color >= 0)
        MT_CHECK(alloc_comm(name, rank, size, parent->timeout_s,
                            mt_comm_common(parent)->world_rank, &c, err));
    /* A nonblocking split fills the new handle when it completes: into the new comm's
     * impl, which outlives the wait (a rank without a colour gets none). */
    ncclComm_t scratch = NULL, *newcomm = c ? &impl_of(c)->comm : &scratch;
    ncclConfig_t config = comm_config(); /* NULL would inherit the parent's: the same */
    struct mt_deadline d = mt_deadline_start(parent->timeout_s);
    ncclResult_t r = ncclCommSplit(pn->comm, color >= 0 ? color : NCCL_SPLIT_NOCOLOR, key,
                                   newcomm, &config);
    int rc = MT_OK;
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = nccl_error(parent, "ncclCommSplit", r, err);
        goto fail;
    }
    /* The split is an operation of the parent (its state says when it is done), then
     * the new communicator's own initialisation. */
    MT_CHECK_GOTO(wait_comm(parent, "ncclCommSplit", &d, err), fail);
    if (!c) {
        if (scratch)
            rc = mt_err_set(err, MT_ERUNTIME, "ncclCommSplit for %s: NCCL made a communicator "
                                              "for a rank without a colour",
                            name);
        return rc;
    }
    if (!impl_of(c)->comm) {
        rc = mt_err_set(err, MT_ERUNTIME,
                        "ncclCommSplit for %s: no communicator for colour %d key %d", name,
                        color, key);
        goto fail;
    }
    MT_CHECK_GOTO(wait_comm(c, "ncclCommSplit", &d, err), fail);
    int nrank = -1, nsize = -1;
    r = ncclCommUserRank(impl_of(c)->comm, &nrank);
    if (r == ncclSuccess) r = ncclCommCount(impl_of(c)->comm, &nsize);
    if (r != ncclSuccess) {
        rc = nccl_error(c, "ncclCommSplit", r, err);
        goto fail;
    }
    if (nrank != rank || nsize != size) {
        rc = mt_err_set(err, MT_ERUNTIME,
                        "ncclCommSplit for %s: NCCL made rank %d of %d, the layout says %d of %d",
                        name, nrank, nsize, rank, size);
        goto fail;
    }
    *out = c;
    return MT_OK;
fail:
    if (c) {
        impl_of(c)->common.broken = true; /* abort, not destroy: the peers may be gone */
        nccl_destroy(c);
    }
    return rc;
}

int mt_comm_nccl_set_stream(struct mt_comm *c, void *stream, struct mt_err *err)
{
    if (!c || c->ops != &nccl_ops)
        return mt_err_set(err, MT_EINVAL, "communicator %s is not an NCCL communicator",
                          c ? c->name : "?");
    struct nccl_impl *n = impl_of(c);
    if (stream && !n->ready) {
        cudaError_t e = cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming);
        if (e != cudaSuccess) return cuda_error(c, "set_stream", e, err);
    }
    n->order = (cudaStream_t)stream;
    return MT_OK;
}

/* moetrain: processes, communicators and collectives (src/runtime).
 *
 * A struct mt_comm is one group of processes with a vtable of collectives
 * (ggml-style backend abstraction): MPI (CPU multi-rank), NCCL (GPU buffers;
 * its unique id travels over the PMIx modex) and self (one process). Every
 * collective is bounded by the world's timeout: a peer that dies or hangs makes
 * the call fail with a message naming the collective, the group and the
 * seconds waited, never hang forever. Library code returns that error; the CLI
 * then calls mt_world_abort so that every process exits non-zero. */
#ifndef MT_RUNTIME_COMM_H
#define MT_RUNTIME_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "util/error.h"

/* MT_DT_BF16 is moved, never reduced (moetrain reduces in fp32). */
enum mt_dt { MT_DT_F32, MT_DT_F64, MT_DT_I32, MT_DT_I64, MT_DT_U8, MT_DT_BF16 };
enum mt_redop { MT_OP_SUM, MT_OP_MAX, MT_OP_MIN };

size_t mt_dt_size(enum mt_dt dt);

struct mt_comm;

/* One transfer of a batch of point-to-point calls (mt_p2p_batch). */
struct mt_p2p {
    bool send;            /* else receive */
    void *buf;
    size_t count;
    int peer, tag;
};

/* A collective started and not yet waited for (mt_all_reduce_start and the others
 * below). The caller owns the storage and keeps it, and the buffers the collective
 * reads and writes, untouched until mt_comm_wait; a request is reused after its wait.
 * Zero-initialise it before the first use. */
#define MT_P2P_START_MAX 4 /* transfers of one started batch (mt_p2p_batch_start) */

struct mt_comm_req {
    struct mt_comm *comm;  /* the comm that completes it; NULL: nothing pending */
    const char *op;        /* the collective, for messages */
    union {                /* the backend's handle: an MPI_Request (one per transfer of a
                              started batch), an event's slot */
        void *p;
        long long i;
        unsigned char bytes[16 * MT_P2P_START_MAX];
    } h;
    int nops;              /* a started p2p batch: its transfers and their type, checked
                              at the wait */
    struct mt_p2p ops[MT_P2P_START_MAX];
    enum mt_dt dt;
};

struct mt_comm_ops {
    /* In place on buf (count elements), every rank ends with the reduction. */
    int (*all_reduce)(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt,
                      enum mt_redop op, struct mt_err *err);
    /* send holds size*count elements; rank r receives the reduction of block r. */
    int (*reduce_scatter)(struct mt_comm *c, const void *send, void *recv, size_t count,
                          enum mt_dt dt, enum mt_redop op, struct mt_err *err);
    /* Each rank contributes count elements; recv holds size*count in rank order. */
    int (*all_gather)(struct mt_comm *c, const void *send, void *recv, size_t count,
                      enum mt_dt dt, struct mt_err *err);
    /* Counts and displacements in elements, one per rank of c. */
    int (*all_to_all_v)(struct mt_comm *c, const void *send, const size_t *send_counts,
                        const size_t *send_displs, void *recv, const size_t *recv_counts,
                        const size_t *recv_displs, enum mt_dt dt, struct mt_err *err);
    int (*broadcast)(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int root,
                     struct mt_err *err);
    /* Point to point by rank within c; tag distinguishes concurrent messages. */
    int (*send)(struct mt_comm *c, const void *buf, size_t count, enum mt_dt dt, int peer,
                int tag, struct mt_err *err);
    int (*recv)(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int peer, int tag,
                struct mt_err *err);
    int (*barrier)(struct mt_comm *c, struct mt_err *err);
    void (*destroy)(struct mt_comm *c);
    /* Optional (NULL: mt_p2p_batch runs the transfers one after another, sends
     * first): n sends and receives posted together, complete together. */
    int (*p2p_batch)(struct mt_comm *c, const struct mt_p2p *ops, int n, enum mt_dt dt,
                     struct mt_err *err);
    /* Optional, the three starts or none (NULL: the start runs the blocking call above
     * and nothing is left to wait for): the collectives above started without waiting;
     * a start leaves req->comm set to the comm whose wait completes the collective
     * (bounded by its timeout), or NULL when it completed it already. wait is NULL
     * only for a comm whose starts hand every request to another comm (dual). */
    int (*all_reduce_start)(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt,
                            enum mt_redop op, struct mt_comm_req *req, struct mt_err *err);
    int (*reduce_scatter_start)(struct mt_comm *c, const void *send, void *recv, size_t count,
                                enum mt_dt dt, enum mt_redop op, struct mt_comm_req *req,
                                struct mt_err *err);
    int (*all_gather_start)(struct mt_comm *c, const void *send, void *recv, size_t count,
                            enum mt_dt dt, struct mt_comm_req *req, struct mt_err *err);
    int (*wait)(struct mt_comm *c, struct mt_comm_req *req, struct mt_err *err);
    /* Optional (NULL: mt_p2p_batch_start runs the blocking batch): p2p_batch started
     * without waiting, completed by wait like the collectives' starts. */
    int (*p2p_batch_start)(struct mt_comm *c, const struct mt_p2p *ops, int n, enum mt_dt dt,
                           struct mt_comm_req *req, struct mt_err *err);
    /* Optional (NULL: mt_all_to_all_v_start runs the blocking all_to_all_v):
     * all_to_all_v started without waiting, completed by wait. The counts and
     * displacements may be reused once it returns (a backend that needs them later
     * keeps a copy). */
    int (*all_to_all_v_start)(struct mt_comm *c, const void *send, const size_t *send_counts,
                              const size_t *send_displs, void *recv, const size_t *recv_counts,
                              const size_t *recv_displs, enum mt_dt dt, struct mt_comm_req *req,
                              struct mt_err *err);
};

struct mt_comm {
    const struct mt_comm_ops *ops;
    int rank, size;
    char name[32];        /* group kind and index, e.g. "tp[3]", for messages */
    double timeout_s;     /* bound on every call */
    void *impl;           /* backend state */
};

/* Convenience wrappers: mt_all_reduce(c, ...) calls c->ops->all_reduce(c, ...), and so on. */
int mt_all_reduce(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, enum mt_redop op,
                  struct mt_err *err);
int mt_reduce_scatter(struct mt_comm *c, const void *send, void *recv, size_t count,
                      enum mt_dt dt, enum mt_redop op, struct mt_err *err);
int mt_all_gather(struct mt_comm *c, const void *send, void *recv, size_t count, enum mt_dt dt,
                  struct mt_err *err);
int mt_all_to_all_v(struct mt_comm *c, const void *send, const size_t *send_counts,
                    const size_t *send_displs, void *recv, const size_t *recv_counts,
                    const size_t *recv_displs, enum mt_dt dt, struct mt_err *err);
int mt_broadcast(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int root,
                 struct mt_err *err);
int mt_send(struct mt_comm *c, const void *buf, size_t count, enum mt_dt dt, int peer, int tag,
            struct mt_err *err);
int mt_recv(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt, int peer, int tag,
            struct mt_err *err);
/* Megatron's batch_isend_irecv: every transfer of ops[0..n) is started, then all
 * are waited for (bounded by the comm's timeout), so that peers exchanging in both
 * directions at once cannot deadlock on the order of their calls. */
int mt_p2p_batch(struct mt_comm *c, const struct mt_p2p *ops, int n, enum mt_dt dt,
                 struct mt_err *err);
int mt_barrier(struct mt_comm *c, struct mt_err *err);
void mt_comm_destroy(struct mt_comm *c);

/* Nonblocking collectives (Megatron's async_op=True): the same arguments and results
 * as the blocking calls, started now and completed by mt_comm_wait(req). Every rank of
 * c starts the collectives of c in the same order (as with blocking calls); several
 * may be pending at once, on one comm or several, and be waited for in any order.
 * MPI: MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather, tested until done
 * within the comm's timeout, counted from the wait's start (the timeout message
 * names the collective, the group and the seconds). Self: done at once. NCCL:
 * enqueued on the comm's stream after the compute work queued so far (an event, no
 * host synchronisation); the wait makes the compute stream wait for the collective
 * (another event): it returns at once, later compute work follows the collective on
 * the device (without a compute stream set, the wait polls the event within the
 * timeout). all_reduce_start takes at most INT_MAX elements. A request that fails to
 * start holds nothing to wait for. */
int mt_all_reduce_start(struct mt_comm *c, void *buf, size_t count, enum mt_dt dt,
                        enum mt_redop op, struct mt_comm_req *req, struct mt_err *err);
int mt_reduce_scatter_start(struct mt_comm *c, const void *send, void *recv, size_t count,
                            enum mt_dt dt, enum mt_redop op, struct mt_comm_req *req,
                            struct mt_err *err);
int mt_all_gather_start(struct mt_comm *c, const void *send, void *recv, size_t count,
                        enum mt_dt dt, struct mt_comm_req *req, struct mt_err *err);
/* mt_p2p_batch started (Megatron's batch_isend_irecv without its wait; at most
 * MT_P2P_START_MAX transfers) and completed by mt_comm_wait(req), which waits for all
 * of them; the buffers stay untouched until then. Successive batches between two ranks
 * match in the order they are started, by tag within a batch, as mt_p2p_batch. MPI:
 * MPI_Isend/MPI_Irecv kept as requests in req, tested at the wait within the comm's
 * timeout (counted from the wait's start; the message names "p2p batch", the group and
 * the seconds), received sizes checked there. NCCL: the grouped sends and receives
 * enqueued on the comm's stream after the compute work queued so far, the wait a
 * stream wait, as the collectives' starts. Self: done at the start. */
int mt_p2p_batch_start(struct mt_comm *c, const struct mt_p2p *ops, int n, enum mt_dt dt,
                       struct mt_comm_req *req, struct mt_err *err);
/* mt_all_to_all_v started (the MoE dispatcher's all-to-all overlapped with the shared
 * expert, &moe moe_shared_expert_overlap) and completed by mt_comm_wait(req); send and
 * recv stay untouched until then, the count and displacement arrays may be reused as
 * soon as it returns. At most one started all_to_all_v per comm is pending at a time.
 * MPI: MPI_Ialltoallv (its int counts kept with the comm until the wait), tested at the
 * wait within the comm's timeout. NCCL: the grouped ncclSend/ncclRecv enqueued on the
 * comm's stream after the compute work queued so far, the wait a stream wait, as the
 * collectives' starts. Self: done at the start. */
int mt_all_to_all_v_start(struct mt_comm *c, const void *send, const size_t *send_counts,
                          const size_t *send_displs, void *recv, const size_t *recv_counts,
                          const size_t *recv_displs, enum mt_dt dt, struct mt_comm_req *req,
                          struct mt_err *err);
/* Completes req (nothing to do when nothing is pending); req is free again after. */
int mt_comm_wait(struct mt_comm_req *req, struct mt_err *err);
/* Whether req holds a started collective not yet waited for. */
static inline bool mt_comm_pending(const struct mt_comm_req *req) { return req->comm != NULL; }

/* A group of one process: reductions leave buf as it is, gathers and scatters
 * copy, a send to oneself waits for the matching recv (a recv with nothing
 * sent fails at once). */
int mt_comm_self_create(const char *name, double timeout_s, struct mt_comm **out,
                        struct mt_err *err);

/* NCCL over the processes of host (an MPI or self comm of one group: rank 0
 * makes the unique id, host broadcasts it); collective over host. Uses the
 * current CUDA device (cudaSetDevice first). Buffers are device memory; each
 * blocking call is enqueued on the comm's stream and waited for, bounded by
 * host->timeout_s: on expiry the NCCL comm is aborted (ncclCommAbort) and the
 * call fails like any timeout. send/recv ignore tag (NCCL matches in order);
 * mt_p2p_batch matches by tag within a batch (posted in tag order).
 * A build without NCCL returns MT_EUNSUPPORTED. */
int mt_comm_nccl_create(struct mt_comm *host, struct mt_comm **out, struct mt_err *err);
/* ncclCommSplit of parent (an NCCL comm from mt_comm_nccl_create), collective over all
 * of parent's ranks: those passing the same color >= 0 form one communicator, ordered
 * by key, then parent rank; *out is it, named name, with its own stream (NULL for a
 * rank passing color < 0: NCCL_SPLIT_NOCOLOR). rank and size are what the caller
 * expects this rank's place in it to be; NCCL's answer is checked against them. The
 * child shares the parent's NCCL resources (splitShare, set on every comm made here).
 * Bounded by parent->timeout_s. */
int mt_comm_nccl_split(struct mt_comm *parent, int color, int key, const char *name, int rank,
                       int size, struct mt_comm **out, struct mt_err *err);
/* Orders c's calls with stream (a cudaStream_t, the compute stream; NULL: none):
 * each call runs on the comm's own stream after the work queued on stream so far
 * and before the work queued on it afterwards (CUDA events, no host-side sync). */
int mt_comm_nccl_set_stream(struct mt_comm *c, void *stream, struct mt_err *err);

/* How a comm tells device memory from host memory (a compute backend's). */
struct mt_device_memory {
    void *arg;
    bool (*is_device)(void *arg, const void *p);
    void (*enter)(void *arg); /* before a call on device buffers (may be NULL) */
    void (*leave)(void *arg); /* after it (may be NULL) */
};

/* A comm over the processes of host that routes each call by its buffers: device
 * memory to device (NCCL over the same processes, with the CUDA backend), host
 * memory to host; a call mixing both fails. barrier goes to host. host is borrowed,
 * device is destroyed with the dual comm when own_device. Both must have the same
 * rank and size. device may be NULL (a group that carries no device traffic): a call
 * on device memory then fails with MT_EUNSUPPORTED, naming the call and the group. */
int mt_comm_dual_create(struct mt_comm *host, struct mt_comm *device, bool own_device,
                        const struct mt_device_memory *dm, struct mt_comm **out,
                        struct mt_err *err);

/* The processes of this job, as the launcher describes them. */
struct mt_world {
    int rank, size;             /* job rank and size */
    int local_rank, local_size; /* on this node */
    int node_id, num_nodes;
    char hostname[256];         /* the launcher's name for the node (PMIx hostname) */
    char launcher[32];          /* "pmix (mpirun)", "pmix (slurm)", "pmix" (another
                                   PMIx launcher), "none" (started plainly) */
    double timeout_s;           /* &parallel distributed_timeout_minutes, in seconds */
    struct mt_comm *comm;       /* all processes */
    void *impl;
};

/* Starts the runtime: PMIx when a launcher provides it (srun --mpi=pmix,
 * mpirun), else one process. The world comm is MPI with several processes,
 * self with one. Errors: several tasks started without PMIx, a build without
 * PMIx/MPI, PMIx and MPI disagreeing on the world (see world.c for the
 * environment variables read). Those first two are the same on every process
 * (MT_EUNSUPPORTED): print them once, on mt_world_launcher_rank() == 0.
 *
 * Timeout semantics: timeout_s (0: unbounded) bounds each call separately:
 * every collective and send/recv of every comm created from this world, each
 * modex fence, and the handshake of mt_world_split. A call that passes it
 * returns MT_ERUNTIME naming the call, the group ("tp[3]"), the rank and the
 * seconds waited, and leaves its comm broken (MPI cannot cancel a collective):
 * the caller then reports and calls mt_world_abort. Not bounded: PMIx_Init and
 * MPI_Init (the launcher's job), MPI_Finalize. */
int mt_world_init(struct mt_world **out, double timeout_s, struct mt_err *err);

/* The bound on later calls (e.g. once the config is read): the world comm and
 * comms split afterwards. */
void mt_world_set_timeout(struct mt_world *w, double timeout_s);

/* This process's rank as its launcher's environment says, before (or
 * without) mt_world_init; 0 when no launcher says. */
int mt_world_launcher_rank(void);

/* Collective over all processes, on a private comm (it never matches other
 * calls): each passes its outcome, mine (NULL or code MT_OK: success). Sets
 * *nfailed to the number of processes that failed, and *report to whether
 * this process should print its message: the lowest failing rank does, and
 * any other failing rank whose message differs from that one, so an error
 * every process hits is printed once. Bounded by timeout_s (a failing
 * process may pass a short one: peers stuck in a collective never arrive). */
int mt_world_agree(struct mt_world *w, const struct mt_err *mine, double timeout_s,
                   int *nfailed, bool *report, struct mt_err *err);

/* Exchanges a blob per process through the PMIx modex (Put/Commit/Fence/Get):
 * all[r * len .. ) receives rank r's blob; every rank passes the same len and
 * calls it the same number of times (key only names it in messages). */
int mt_world_exchange(struct mt_world *w, const char *key, const void *mine, size_t len,
                      void *all, struct mt_err *err);

/* Collective over all processes: creates the communicator of the processes
 * that pass the same color (>= 0), ordered by key, then world rank
 * (MPI_Comm_split semantics); a group of one is a self comm. */
int mt_world_split(struct mt_world *w, int color, int key, const char *name,
                   struct mt_comm **out, struct mt_err *err);

/* Ends every process of the job with status 1 (after an error on any rank):
 * MPI_Abort with several processes, PMIx_Abort under a launcher, else exit. */
_Noreturn void mt_world_abort(struct mt_world *w);

/* Ends the runtime after success (MPI_Finalize, PMIx_Finalize); destroy the
 * comms split from w first. Not after a timeout: abort then. */
void mt_world_finalize(struct mt_world *w);

#endif

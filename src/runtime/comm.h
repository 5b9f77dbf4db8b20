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

enum mt_dt { MT_DT_F32, MT_DT_F64, MT_DT_I32, MT_DT_I64, MT_DT_U8 };
enum mt_redop { MT_OP_SUM, MT_OP_MAX, MT_OP_MIN };

size_t mt_dt_size(enum mt_dt dt);

struct mt_comm;

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
};

struct mt_comm {
    const struct mt_comm_ops *ops;
    int rank, size;
    char name[32];        /* group kind and index, e.g. "tp[3]", for messages */
    double timeout_s;     /* bound on every call */
    void *impl;           /* backend state */
};

/* Convenience wrappers: c->ops->xxx(c, ...). */
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
int mt_barrier(struct mt_comm *c, struct mt_err *err);
void mt_comm_destroy(struct mt_comm *c);

/* The processes of this job, as the launcher describes them. */
struct mt_world {
    int rank, size;             /* job rank and size */
    int local_rank, local_size; /* on this node */
    int node_id, num_nodes;
    char hostname[256];         /* the launcher's name for the node (PMIx hostname) */
    char launcher[32];          /* "pmix (mpirun)", "pmix (slurm)", "none" */
    double timeout_s;           /* parallel%collective_timeout */
    struct mt_comm *comm;       /* all processes */
    void *impl;
};

/* Starts the runtime: PMIx when a launcher provides it (srun --mpi=pmix,
 * mpirun), else one process. backend: "mpi" or "self" (one process only).
 * Errors: a launcher without PMIx, world sizes that disagree, ... */
int mt_world_init(struct mt_world **out, double timeout_s, struct mt_err *err);

/* Exchanges a blob per process through the PMIx modex (Put/Commit/Fence/Get):
 * all[r * len .. ) receives rank r's blob; every rank passes the same len. */
int mt_world_exchange(struct mt_world *w, const char *key, const void *mine, size_t len,
                      void *all, struct mt_err *err);

/* Collective over all processes: creates the communicator of the processes
 * that pass the same color, ordered by key (MPI_Comm_split semantics). */
int mt_world_split(struct mt_world *w, int color, int key, const char *name,
                   struct mt_comm **out, struct mt_err *err);

/* Ends every process of the job with status 1 (after an error on any rank). */
_Noreturn void mt_world_abort(struct mt_world *w);

void mt_world_finalize(struct mt_world *w);

#endif

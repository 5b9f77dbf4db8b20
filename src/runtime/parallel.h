/* moetrain: this process's place in the parallel layout, and its communicators.
 *
 * Built once at startup from the world, the resolved config and the placement
 * (which logical rank each process plays; identity unless topology placement
 * says otherwise). Model and training code reach every collective through the
 * communicators here. With one process every communicator is a self comm. */
#ifndef MT_RUNTIME_PARALLEL_H
#define MT_RUNTIME_PARALLEL_H

#include "config/config.h"
#include "runtime/comm.h"
#include "runtime/groups.h"

struct mt_parallel {
    struct mt_world *world;
    struct mt_rank_layout layout;   /* every group, in logical ranks */
    int rank;                       /* this process's logical rank */
    /* coordinates: position of this rank in its group of each kind */
    int tp_rank, cp_rank, dp_rank, pp_rank, ep_rank, etp_rank, edp_rank;
    int tp, cp, dp, pp, ep, etp, edp;
    struct mt_comm *comm[MT_GROUP_COUNT]; /* this rank's group of each kind (named
                                             "tp[3]"; a rank in no group of a kind,
                                             e.g. embedding in a middle pipeline
                                             stage, has a self comm "embedding[none]") */
    struct mt_comm *world_comm;     /* every process: world->comm, or its dual */
    struct mt_comm *host[MT_GROUP_COUNT]; /* after mt_parallel_use_device: the host
                                             transport under each dual comm[k] */
};

/* logical_of_process[p] = logical rank played by process p (NULL: identity). */
int mt_parallel_init(struct mt_world *w, const struct mt_config *cfg, const struct mt_layout *l,
                     const int *logical_of_process, struct mt_parallel **out,
                     struct mt_err *err);
void mt_parallel_destroy(struct mt_parallel *p);

/* The place of logical rank `rank` in layout l without a job (src/runtime/
 * parallel_plan.c): coordinates and group sizes as mt_parallel_init gives them, and
 * communicators that know their rank and size but refuse to communicate. For planning
 * (moetrain --check sets a rank's model and optimizer up on the plan backend); free it
 * with mt_parallel_plan_destroy. world is NULL. */
int mt_parallel_plan(const struct mt_config *cfg, const struct mt_layout *l, int rank,
                     struct mt_parallel **out, struct mt_err *err);
void mt_parallel_plan_destroy(struct mt_parallel *p);

/* Makes comm[k] and world_comm route calls on device memory (as dm tells it) to a
 * device transport: with nccl, an NCCL communicator over the same processes
 * (collective over every process; its calls enqueued on stream, a cudaStream_t, when
 * not NULL); without, the host comm itself with dm->enter/leave around each call (the
 * guard backend's emulated device memory). Calls on host memory keep the host comms. */
int mt_parallel_use_device(struct mt_parallel *p, const struct mt_device_memory *dm, bool nccl,
                           void *stream, struct mt_err *err);

#endif

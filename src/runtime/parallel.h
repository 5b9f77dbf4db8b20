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
    struct mt_rank_layout layout;   /* every group, in logical ranks (none in a plan) */
    struct mt_group_place place[MT_GROUP_COUNT]; /* this rank's group of each kind */
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
    /* After mt_parallel_use_device: the device transport under each dual comm[k] and
     * world_comm (borrowed; NULL: none, see struct mt_device_plan), and the NCCL
     * communicators this process owns (world's first, then those split from it). */
    struct mt_comm *device_of[MT_GROUP_COUNT], *world_device;
    struct mt_comm *nccl[MT_GROUP_COUNT + 1];
    int nnccl;
    int *logical_of_process;        /* the placement (NULL: identity) */
};

/* Which group kinds carry device traffic, and how this rank's groups reach the device:
 * the NCCL communicators mt_parallel_use_device makes (a pure function of the layout,
 * the same on every process for a given rank, so --check can count them too).
 * Communicators are split from the world's (ncclCommSplit: color = the group's index,
 * key = the position in it); two kinds whose groups list the same ranks in the same
 * order share one. */
enum mt_device_transport {
    MT_DEVICE_NONE,   /* the kind carries no device traffic: host-memory calls only, a
                         device-memory call fails */
    MT_DEVICE_ABSENT, /* a device kind, but this rank is in no group of it (embedding in
                         a middle pipeline stage): as NONE (nothing calls it there) */
    MT_DEVICE_OWN,    /* a communicator of its own, split from the world's */
    MT_DEVICE_SHARED, /* the communicator of an identical group: same_as */
};

struct mt_device_plan {
    enum mt_device_transport how[MT_GROUP_COUNT];
    int same_as[MT_GROUP_COUNT]; /* MT_DEVICE_SHARED: the kind whose communicator it
                                    uses (one of its own), or -1: the world's */
    int color[MT_GROUP_COUNT], key[MT_GROUP_COUNT], size[MT_GROUP_COUNT];
    bool split[MT_GROUP_COUNT]; /* whether the job calls ncclCommSplit for this kind:
                                   some rank's group of it is OWN (the same answer on
                                   every rank; ranks that are not OWN pass no colour) */
    int ncomms;                  /* NCCL communicators of this rank, the world's included */
};

/* Whether group kind k ever carries device memory (the table in parallel.c). */
bool mt_group_kind_on_device(enum mt_group_kind k);

/* The plan of logical rank `rank` (logical_of_process: the placement, NULL: identity; a
 * group is the world's communicator only when its order is the processes' order). */
void mt_parallel_device_plan(const struct mt_rank_layout *rl, const int *logical_of_process,
                             int rank, struct mt_device_plan *out);

/* One line (no newline) for the log: the NCCL communicators of logical rank `rank`,
 * named, what shares and what has none, and their range over the job's processes, e.g.
 * "NCCL communicators: 5 on this process (world + tp, pp, ep, edp; shared: dp = world,
 * etp-ep = ep; ...)". */
void mt_parallel_device_summary(const struct mt_rank_layout *rl, const int *logical_of_process,
                                int rank, char *buf, size_t len);

/* logical_of_process[p] = logical rank played by process p (NULL: identity). */
int mt_parallel_init(struct mt_world *w, const struct mt_config *cfg, const struct mt_layout *l,
                     const int *logical_of_process, struct mt_parallel **out,
                     struct mt_err *err);
void mt_parallel_destroy(struct mt_parallel *p);

/* A struct mt_parallel for logical rank `rank` of l: its place in each kind's groups,
 * group sizes and coordinates (position in its group of each kind, 0 in none), and with
 * lists every group's ranks in p->layout (a job's processes need them; a planned rank
 * does not, and they cost O(world)); no communicators yet (mt_parallel_init and
 * mt_parallel_plan add theirs). */
int mt_parallel_alloc(const struct mt_config *cfg, const struct mt_layout *l, int rank,
                      bool lists, struct mt_parallel **out, struct mt_err *err);

/* The place of logical rank `rank` in layout l without a job (src/runtime/
 * parallel_plan.c): coordinates and group sizes as mt_parallel_init gives them, and
 * communicators that know their rank and size but refuse to communicate. For planning
 * (moetrain --check sets a rank's model and optimizer up on the plan backend); free it
 * with mt_parallel_plan_destroy. world is NULL. */
int mt_parallel_plan(const struct mt_config *cfg, const struct mt_layout *l, int rank,
                     struct mt_parallel **out, struct mt_err *err);
void mt_parallel_plan_destroy(struct mt_parallel *p);

/* Makes comm[k] and world_comm route calls on device memory (as dm tells it) to a
 * device transport, as mt_parallel_device_plan says: with nccl, NCCL communicators over
 * the same processes, one for the world (ncclCommInitRankConfig) and the others split
 * from it, identical groups sharing one (collective over every process; calls enqueued
 * on stream, a cudaStream_t, when not NULL); without, the host comm itself with
 * dm->enter/leave around each call (the guard backend's emulated device memory). Kinds
 * without a device transport fail device-memory calls. Calls on host memory keep the
 * host comms. */
int mt_parallel_use_device(struct mt_parallel *p, const struct mt_device_memory *dm, bool nccl,
                           void *stream, struct mt_err *err);

#endif

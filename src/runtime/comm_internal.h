/* moetrain: what the comm backends share (src/runtime only).
 *
 * Every backend's impl starts with struct mt_comm_common, so messages can name
 * the world rank and a comm that timed out refuses further calls. */
#ifndef MT_RUNTIME_COMM_INTERNAL_H
#define MT_RUNTIME_COMM_INTERNAL_H

#include "config.h"

#include <stdbool.h>

#include "runtime/comm.h"

#ifdef HAVE_MPI
#include <mpi.h>
#endif

struct mt_comm_common {
    int world_rank;
    /* Set when a call timed out or failed inside the library: requests may
     * still be pending, so the only safe next step is mt_world_abort. */
    bool broken;
};

/* Allocates a comm with ops, rank, size, name and timeout; impl must start
 * with struct mt_comm_common (impl_size bytes, zeroed). */
int mt_comm_alloc(const struct mt_comm_ops *ops, int rank, int size, const char *name,
                  double timeout_s, int world_rank, size_t impl_size, struct mt_comm **out,
                  struct mt_err *err);
/* Frees what mt_comm_alloc allocated. */
void mt_comm_free(struct mt_comm *c);

static inline struct mt_comm_common *mt_comm_common(struct mt_comm *c)
{
    return (struct mt_comm_common *)c->impl;
}

/* Monotonic clock in seconds. */
double mt_now_s(void);

/* A deadline for one call: end <= 0 means unbounded. */
struct mt_deadline {
    double start, end;
    unsigned polls;
};
struct mt_deadline mt_deadline_start(double timeout_s);
bool mt_deadline_passed(const struct mt_deadline *d);
/* Between two polls of a pending operation: spins first, then yields the
 * core, then sleeps briefly (ranks are often oversubscribed on CPU runs). */
void mt_deadline_pause(struct mt_deadline *d);

/* The timeout message: names the collective, the group, the rank, the wait. */
int mt_comm_timeout_error(struct mt_comm *c, const char *op, const struct mt_deadline *d,
                          struct mt_err *err);
/* Refuses a call on a comm that is broken. */
int mt_comm_check_usable(struct mt_comm *c, const char *op, struct mt_err *err);

/* A self comm that knows which world rank holds it. */
int mt_comm_self_create_at(const char *name, double timeout_s, int world_rank,
                           struct mt_comm **out, struct mt_err *err);

#ifdef HAVE_MPI
/* Wraps an MPI communicator (ownership passes to the comm, freed by destroy). */
int mt_comm_mpi_create(MPI_Comm comm, const char *name, double timeout_s, int world_rank,
                       struct mt_comm **out, struct mt_err *err);
/* The MPI communicator behind an MPI comm (MPI_COMM_NULL for other backends). */
MPI_Comm mt_comm_mpi_handle(const struct mt_comm *c);
/* Turns an MPI error code into err: "<what>: <MPI error string>". */
int mt_mpi_error(int mpirc, struct mt_err *err, const char *what);
#endif

#endif

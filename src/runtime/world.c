/* moetrain: the processes of the job (bootstrap, modex, split, abort).
 *
 * A launcher that provides PMIx (srun --mpi=pmix, OpenMPI's mpirun) is
 * detected by PMIX_NAMESPACE/PMIX_RANK in the environment: PMIx_Init gives
 * the job rank and size, the local rank and size, the node id, the number of
 * nodes and the node's name. With more than one process MPI is initialised
 * too (MPI and PMIx share the launcher's PMIx server) and carries the CPU
 * collectives; MPI's world must match PMIx's job.
 *
 * Environment read here (the launchers set it; nothing for users to set):
 *   PMIX_NAMESPACE, PMIX_RANK      a PMIx launcher started this process
 *   OMPI_COMM_WORLD_SIZE           the launcher is OpenMPI's mpirun
 *   SLURM_STEP_ID                  the launcher is srun
 *   SLURM_STEP_NUM_TASKS, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE, PMI_SIZE
 *                                  several tasks without PMIx: refused (also
 *                                  moetrain run directly in a batch script or
 *                                  salloc shell of several tasks: use srun)
 *   PMIX_RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK
 *                                  mt_world_launcher_rank (before init)
 * Without any of them the process is a world of one. */
#include "runtime/comm_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef HAVE_PMIX
#include <pmix.h>
#endif

struct world_impl {
#ifdef HAVE_PMIX
    bool pmix;             /* PMIx_Init succeeded */
    pmix_proc_t me;
#endif
    bool mpi_owned;        /* this code called MPI_Init, so it calls MPI_Finalize */
    unsigned long exchanges; /* makes every modex key unique */
    struct mt_comm *agree; /* private comm of mt_world_agree: never matches other calls */
};

static long env_long(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v) return -1;
    char *end;
    long n = strtol(v, &end, 10);
    return *end ? -1 : n;
}

int mt_world_launcher_rank(void)
{
    static const char *const vars[] = { "PMIX_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
                                        "PMI_RANK" };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        long r = env_long(vars[i]);
        if (r >= 0) return (int)r;
    }
    return 0;
}

static bool have_pmix_env(void)
{
    return getenv("PMIX_NAMESPACE") && getenv("PMIX_RANK");
}

/* Several tasks but no PMIx: each would run alone as rank 0 of 1. */
static int refuse_launch_without_pmix(struct mt_err *err)
{
    const char *fix = "start moetrain with `srun --mpi=pmix ...` (Slurm) or OpenMPI's "
                      "`mpirun -np N ...`";
    long n;
    if ((n = env_long("SLURM_STEP_NUM_TASKS")) > 1 ||
        (getenv("SLURM_STEP_ID") && (n = env_long("SLURM_NTASKS")) > 1))
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "srun started %ld tasks without PMIx (srun --mpi=none, or a "
                          "MpiDefault without pmix), so every task would train alone: %s",
                          n, fix);
    if ((n = env_long("OMPI_COMM_WORLD_SIZE")) > 1)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "mpirun started %ld processes but gave them no PMIx environment "
                          "(PMIX_NAMESPACE is unset): %s",
                          n, fix);
    if ((n = env_long("PMI_SIZE")) > 1)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "a PMI-1/PMI-2 launcher (MPICH's mpiexec, srun --mpi=pmi2) started %ld "
                          "processes; moetrain bootstraps with PMIx: %s",
                          n, fix);
    if ((n = env_long("SLURM_NTASKS")) > 1)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "this is a Slurm job of %ld tasks but moetrain was not started by srun "
                          "(it would train as one process): %s",
                          n, fix);
    return MT_OK;
}

#ifdef HAVE_PMIX
static const char *launcher_name(void)
{
    if (getenv("OMPI_COMM_WORLD_SIZE")) return "pmix (mpirun)";
    if (getenv("SLURM_STEP_ID")) return "pmix (slurm)";
    return "pmix";
}
#endif

/* ---- PMIx ------------------------------------------------------------------------------ */

#ifdef HAVE_PMIX
static int pmix_error(pmix_status_t rc, struct mt_err *err, const char *what)
{
    return mt_err_set(err, MT_ERUNTIME, "%s: PMIx error %d: %s", what, (int)rc,
                      PMIx_Error_string(rc));
}

/* Job information the launcher may or may not provide (PMIX_OPTIONAL: answer
 * from what the server already gave, do not ask around). */
static pmix_status_t get_job_value(const struct world_impl *wi, pmix_rank_t rank,
                                   const char *key, pmix_value_t **val)
{
    pmix_proc_t p;
    PMIX_PROC_CONSTRUCT(&p);
    PMIX_LOAD_PROCID(&p, wi->me.nspace, rank);
    pmix_info_t info;
    bool yes = true;
    PMIX_INFO_LOAD(&info, PMIX_OPTIONAL, &yes, PMIX_BOOL);
    pmix_status_t rc = PMIx_Get(&p, key, &info, 1, val);
    PMIX_INFO_DESTRUCT(&info);
    return rc;
}

static bool get_job_int(const struct world_impl *wi, pmix_rank_t rank, const char *key,
                        long *out)
{
    pmix_value_t *v = NULL;
    if (get_job_value(wi, rank, key, &v) != PMIX_SUCCESS || !v) return false;
    bool ok = true;
    switch (v->type) {
    case PMIX_UINT8: *out = v->data.uint8; break;
    case PMIX_UINT16: *out = v->data.uint16; break;
    case PMIX_UINT32: *out = (long)v->data.uint32; break;
    case PMIX_UINT64: *out = (long)v->data.uint64; break;
    case PMIX_INT: *out = v->data.integer; break;
    case PMIX_INT32: *out = v->data.int32; break;
    case PMIX_INT64: *out = (long)v->data.int64; break;
    case PMIX_SIZE: *out = (long)v->data.size; break;
    case PMIX_PROC_RANK: *out = (long)v->data.rank; break;
    default: ok = false;
    }
    PMIX_VALUE_RELEASE(v);
    return ok;
}

static bool get_job_string(const struct world_impl *wi, pmix_rank_t rank, const char *key,
                           char *out, size_t len)
{
    pmix_value_t *v = NULL;
    if (get_job_value(wi, rank, key, &v) != PMIX_SUCCESS || !v) return false;
    bool ok = v->type == PMIX_STRING && v->data.string;
    if (ok) snprintf(out, len, "%s", v->data.string);
    PMIX_VALUE_RELEASE(v);
    return ok;
}

static int pmix_exchange(struct mt_world *w, const char *key, const void *mine, size_t len,
                         void *all, struct mt_err *err)
{
    struct world_impl *wi = w->impl;
    char k[PMIX_MAX_KEYLEN + 1];
    snprintf(k, sizeof k, "mt.%lu.%s", wi->exchanges++, key);
    char what[PMIX_MAX_KEYLEN + 64];
    snprintf(what, sizeof what, "exchange '%s' over the PMIx modex", key);

    pmix_value_t v;
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_BYTE_OBJECT;
    v.data.bo.bytes = (char *)mine; /* PMIx_Put copies it */
    v.data.bo.size = len;
    pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, k, &v);
    if (rc != PMIX_SUCCESS) return pmix_error(rc, err, what);
    rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS) return pmix_error(rc, err, what);

    pmix_proc_t everyone;
    PMIX_PROC_CONSTRUCT(&everyone);
    PMIX_LOAD_PROCID(&everyone, wi->me.nspace, PMIX_RANK_WILDCARD);
    pmix_info_t info[2];
    size_t ninfo = 1;
    bool yes = true;
    PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
    int secs = w->timeout_s > 0 ? (int)ceil(w->timeout_s) : 0;
    if (secs > 0) PMIX_INFO_LOAD(&info[ninfo++], PMIX_TIMEOUT, &secs, PMIX_INT);
    double t0 = mt_now_s();
    rc = PMIx_Fence(&everyone, 1, info, ninfo);
    for (size_t i = 0; i < ninfo; i++) PMIX_INFO_DESTRUCT(&info[i]);
    if (rc == PMIX_ERR_TIMEOUT)
        return mt_err_set(err, MT_ERUNTIME,
                          "%s timed out: rank %d of %d waited %.1f s in PMIx_Fence "
                          "(&parallel distributed_timeout_minutes = %g); a process died or "
                          "hangs",
                          what, w->rank, w->size, mt_now_s() - t0, w->timeout_s / 60.0);
    if (rc != PMIX_SUCCESS) return pmix_error(rc, err, what);

    for (int r = 0; r < w->size; r++) {
        pmix_proc_t p;
        PMIX_PROC_CONSTRUCT(&p);
        PMIX_LOAD_PROCID(&p, wi->me.nspace, (pmix_rank_t)r);
        pmix_value_t *got = NULL;
        rc = PMIx_Get(&p, k, NULL, 0, &got);
        if (rc != PMIX_SUCCESS || !got) return pmix_error(rc, err, what);
        int bad = got->type != PMIX_BYTE_OBJECT || got->data.bo.size != len;
        size_t got_len = got->type == PMIX_BYTE_OBJECT ? got->data.bo.size : 0;
        if (!bad && len) memcpy((char *)all + (size_t)r * len, got->data.bo.bytes, len);
        PMIX_VALUE_RELEASE(got);
        if (bad)
            return mt_err_set(err, MT_EINVAL, "%s: rank %d passed %zu bytes, rank %d passed %zu",
                              what, r, got_len, w->rank, len);
    }
    return MT_OK;
}

static int pmix_bootstrap(struct mt_world *w, struct mt_err *err)
{
    struct world_impl *wi = w->impl;
    pmix_status_t rc = PMIx_Init(&wi->me, NULL, 0);
    if (rc != PMIX_SUCCESS)
        return pmix_error(rc, err, "PMIx_Init (the launcher set PMIX_NAMESPACE but its PMIx "
                                   "server cannot be reached)");
    wi->pmix = true;
    w->rank = (int)wi->me.rank;
    long v;
    if (!get_job_int(wi, PMIX_RANK_WILDCARD, PMIX_JOB_SIZE, &v) || v < 1)
        return mt_err_set(err, MT_ERUNTIME, "the PMIx launcher does not give the job size "
                                            "(PMIX_JOB_SIZE)");
    w->size = (int)v;
    if (!get_job_string(wi, wi->me.rank, PMIX_HOSTNAME, w->hostname, sizeof w->hostname) &&
        gethostname(w->hostname, sizeof w->hostname) != 0)
        snprintf(w->hostname, sizeof w->hostname, "unknown");
    w->hostname[sizeof w->hostname - 1] = '\0';
    /* Job information every PMIx launcher gives (PMIx standard, job and
     * node levels); without it placement would be guesswork. */
    long lr, ls, nid, nn;
    if (!get_job_int(wi, wi->me.rank, PMIX_LOCAL_RANK, &lr) ||
        !get_job_int(wi, PMIX_RANK_WILDCARD, PMIX_LOCAL_SIZE, &ls) ||
        !get_job_int(wi, wi->me.rank, PMIX_NODEID, &nid) ||
        !get_job_int(wi, PMIX_RANK_WILDCARD, PMIX_NUM_NODES, &nn))
        return mt_err_set(err, MT_ERUNTIME,
                          "the PMIx launcher does not give this process's local rank, local "
                          "size, node id and number of nodes (PMIX_LOCAL_RANK, PMIX_LOCAL_SIZE, "
                          "PMIX_NODEID, PMIX_NUM_NODES)");
    w->local_rank = (int)lr;
    w->local_size = (int)ls;
    w->node_id = (int)nid;
    w->num_nodes = (int)nn;
    return MT_OK;
}
#endif

/* ---- MPI ------------------------------------------------------------------------------- */

#ifdef HAVE_MPI
static int mpi_bootstrap(struct mt_world *w, struct mt_err *err)
{
    struct world_impl *wi = w->impl;
    int inited = 0, rc;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided;
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) return mt_mpi_error(rc, err, "MPI_Init_thread");
        wi->mpi_owned = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int size, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (size != w->size || rank != w->rank)
        return mt_err_set(err, MT_ERUNTIME,
                          "PMIx says this is rank %d of %d, MPI says rank %d of %d: the MPI "
                          "library moetrain links is not the one the launcher speaks to (check "
                          "that mpirun and moetrain come from the same OpenMPI, or that Slurm's "
                          "PMIx and OpenMPI's agree)",
                          w->rank, w->size, rank, size);
    MPI_Comm world, agree;
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &world)) != MPI_SUCCESS)
        return mt_mpi_error(rc, err, "MPI_Comm_dup");
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &agree)) != MPI_SUCCESS) {
        MPI_Comm_free(&world);
        return mt_mpi_error(rc, err, "MPI_Comm_dup");
    }
    if ((rc = mt_comm_mpi_create(world, "world", w->timeout_s, w->rank, &w->comm, err))) {
        MPI_Comm_free(&world);
        MPI_Comm_free(&agree);
        return rc;
    }
    if ((rc = mt_comm_mpi_create(agree, "world-agree", w->timeout_s, w->rank, &wi->agree,
                                 err))) {
        MPI_Comm_free(&agree);
        return rc;
    }
    return MT_OK;
}
#endif

static int self_comms(struct mt_world *w, struct mt_err *err)
{
    struct world_impl *wi = w->impl;
    MT_CHECK(mt_comm_self_create_at("world", w->timeout_s, w->rank, &w->comm, err));
    return mt_comm_self_create_at("world-agree", w->timeout_s, w->rank, &wi->agree, err);
}

int mt_world_init(struct mt_world **out, double timeout_s, struct mt_err *err)
{
    *out = NULL;
    struct mt_world *w = calloc(1, sizeof *w);
    struct world_impl *wi = calloc(1, sizeof *wi);
    if (!w || !wi) {
        free(w);
        free(wi);
        return mt_err_set(err, MT_ENOMEM, "out of memory for the world");
    }
    w->impl = wi;
    w->size = w->local_size = w->num_nodes = 1;
    w->timeout_s = timeout_s;
    int rc = MT_OK;
    if (!have_pmix_env()) {
        MT_CHECK_GOTO(refuse_launch_without_pmix(err), fail);
        snprintf(w->launcher, sizeof w->launcher, "none");
        if (gethostname(w->hostname, sizeof w->hostname) != 0)
            snprintf(w->hostname, sizeof w->hostname, "localhost");
        w->hostname[sizeof w->hostname - 1] = '\0';
        MT_CHECK_GOTO(self_comms(w, err), fail);
        *out = w;
        return MT_OK;
    }
#ifdef HAVE_PMIX
    snprintf(w->launcher, sizeof w->launcher, "%s", launcher_name());
    MT_CHECK_GOTO(pmix_bootstrap(w, err), fail);
    if (w->size == 1) {
        MT_CHECK_GOTO(self_comms(w, err), fail);
    } else {
#ifdef HAVE_MPI
        MT_CHECK_GOTO(mpi_bootstrap(w, err), fail);
#else
        rc = mt_err_set(err, MT_EUNSUPPORTED,
                        "%d processes need MPI for their collectives, and this moetrain was "
                        "built without it (configure --with-mpi)",
                        w->size);
        goto fail;
#endif
    }
    *out = w;
    return MT_OK;
#else
    rc = mt_err_set(err, MT_EUNSUPPORTED,
                    "a PMIx launcher started this process (PMIX_NAMESPACE is set) but this "
                    "moetrain was built without PMIx (configure --with-pmix)");
#endif
fail:
    mt_world_finalize(w);
    return rc;
}

void mt_world_set_timeout(struct mt_world *w, double timeout_s)
{
    w->timeout_s = timeout_s;
    if (w->comm) w->comm->timeout_s = timeout_s;
}

int mt_world_exchange(struct mt_world *w, const char *key, const void *mine, size_t len,
                      void *all, struct mt_err *err)
{
    if (w->size == 1) {
        if (len) memmove(all, mine, len);
        return MT_OK;
    }
#ifdef HAVE_PMIX
    return pmix_exchange(w, key, mine, len, all, err);
#else
    return mt_err_set(err, MT_EUNSUPPORTED, "exchange '%s': built without PMIx", key);
#endif
}

#ifdef HAVE_MPI
/* Orders the members of a split by (key, world rank), as MPI_Comm_split does. */
static void sort_members(int *members, int n, const int64_t *pairs)
{
    for (int i = 1; i < n; i++) {
        int m = members[i], j = i;
        while (j > 0 && (pairs[2 * members[j - 1] + 1] > pairs[2 * m + 1] ||
                         (pairs[2 * members[j - 1] + 1] == pairs[2 * m + 1] &&
                          members[j - 1] > m))) {
            members[j] = members[j - 1];
            j--;
        }
        members[j] = m;
    }
}
#endif

int mt_world_split(struct mt_world *w, int color, int key, const char *name,
                   struct mt_comm **out, struct mt_err *err)
{
    *out = NULL;
    if (color < 0)
        return mt_err_set(err, MT_EINVAL, "split %s: color %d must be >= 0", name, color);
    if (w->size == 1) return mt_comm_self_create_at(name, w->timeout_s, w->rank, out, err);
#ifdef HAVE_MPI
    /* A bounded all_gather first: every process has reached the split when it
     * completes, so the blocking MPI_Comm_create_group below cannot hang on a
     * dead peer that never arrived. It also tells each process its group. */
    int rc = MT_OK;
    int64_t mine[2] = { color, key };
    int64_t *pairs = malloc(sizeof(int64_t) * 2 * (size_t)w->size);
    int *members = malloc(sizeof(int) * (size_t)w->size);
    MPI_Group wg = MPI_GROUP_NULL, g = MPI_GROUP_NULL;
    if (!pairs || !members) {
        rc = mt_err_set(err, MT_ENOMEM, "split %s: out of memory", name);
        goto out;
    }
    if ((rc = mt_all_gather(w->comm, mine, pairs, 2, MT_DT_I64, err))) {
        mt_err_prefix(err, "split %s", name);
        goto out;
    }
    int n = 0;
    for (int r = 0; r < w->size; r++)
        if (pairs[2 * r] == color) members[n++] = r;
    sort_members(members, n, pairs);
    if (n == 1) {
        rc = mt_comm_self_create_at(name, w->timeout_s, w->rank, out, err);
        goto out;
    }
    MPI_Comm world = mt_comm_mpi_handle(w->comm), nc = MPI_COMM_NULL;
    int mrc = MPI_Comm_group(world, &wg);
    if (mrc == MPI_SUCCESS) mrc = MPI_Group_incl(wg, n, members, &g);
    if (mrc == MPI_SUCCESS) mrc = MPI_Comm_create_group(world, g, 0, &nc);
    if (mrc != MPI_SUCCESS) {
        char what[64];
        snprintf(what, sizeof what, "split %s", name);
        rc = mt_mpi_error(mrc, err, what);
        goto out;
    }
    if ((rc = mt_comm_mpi_create(nc, name, w->timeout_s, w->rank, out, err))) {
        MPI_Comm_free(&nc);
        goto out;
    }
out:
    if (g != MPI_GROUP_NULL) MPI_Group_free(&g);
    if (wg != MPI_GROUP_NULL) MPI_Group_free(&wg);
    free(pairs);
    free(members);
    return rc;
#else
    return mt_err_set(err, MT_EUNSUPPORTED, "split %s: built without MPI", name);
#endif
}

int mt_world_agree(struct mt_world *w, const struct mt_err *mine, double timeout_s,
                   int *nfailed, bool *report, struct mt_err *err)
{
    struct world_impl *wi = w->impl;
    int32_t failed = mine && mine->code != MT_OK;
    *nfailed = failed;
    *report = failed;
    if (w->size == 1) return MT_OK;
    struct mt_comm *c = wi->agree;
    c->timeout_s = timeout_s;
    int32_t *all = malloc(sizeof(int32_t) * (size_t)w->size);
    char *msg = calloc(1, MT_ERR_MSG_MAX);
    int rc = MT_OK, first = -1;
    if (!all || !msg) {
        rc = mt_err_set(err, MT_ENOMEM, "out of memory");
        goto out;
    }
    MT_CHECK_GOTO(mt_all_gather(c, &failed, all, 1, MT_DT_I32, err), out);
    *nfailed = 0;
    for (int r = w->size - 1; r >= 0; r--)
        if (all[r]) {
            (*nfailed)++;
            first = r;
        }
    if (first < 0) goto out;
    if (w->rank == first) snprintf(msg, MT_ERR_MSG_MAX, "%s", mine->msg);
    MT_CHECK_GOTO(mt_broadcast(c, msg, MT_ERR_MSG_MAX, MT_DT_U8, first, err), out);
    *report = failed && (w->rank == first || strcmp(msg, mine->msg) != 0);
out:
    if (rc) mt_err_prefix(err, "agreeing on the outcome of every process");
    free(all);
    free(msg);
    return rc;
}

_Noreturn void mt_world_abort(struct mt_world *w)
{
    fflush(stdout);
    fflush(stderr);
    bool launched = false;
#ifdef HAVE_MPI
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
#ifdef HAVE_PMIX
    struct world_impl *wi = w ? w->impl : NULL;
    if (wi && wi->pmix) {
        launched = true;
        PMIx_Abort(1, "moetrain: an error on one process ends the job", NULL, 0);
    }
#endif
    /* A launcher's abort may return before it kills us: leave without running
     * exit handlers that could wait on peers. */
    if (launched) _exit(1);
    exit(1);
}

void mt_world_finalize(struct mt_world *w)
{
    if (!w) return;
    struct world_impl *wi = w->impl;
    mt_comm_destroy(w->comm);
    if (wi) mt_comm_destroy(wi->agree);
#ifdef HAVE_MPI
    if (wi && wi->mpi_owned) MPI_Finalize();
#endif
#ifdef HAVE_PMIX
    if (wi && wi->pmix) PMIx_Finalize(NULL, 0);
#endif
    free(wi);
    free(w);
}

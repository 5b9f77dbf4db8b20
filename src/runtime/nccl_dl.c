/* NCCL loaded at run time (nccl_dl.h). Each NCCL function comm_nccl.c calls is defined
 * here with nccl.h's prototype and forwards to the library, loaded on the first call
 * (mt_comm_nccl_create calls mt_nccl_load first, for the message). The definitions
 * are hidden, so the executable does not export them and NCCL's calls between its own
 * functions never land here. */
#include "config.h"

#include <pthread.h>

#include <cuda_runtime.h>
#pragma GCC visibility push(hidden)
/* nccl.h declares a few functions as f() rather than f(void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#pragma GCC visibility pop

#include "runtime/nccl_dl.h"
#include "util/dynlib.h"
#include "util/error.h"

#define MT_STR_(x) #x
#define MT_STR(x) MT_STR_(x)
#define NCCL_SONAME "libnccl.so." MT_STR(NCCL_MAJOR)

/* Every NCCL function moetrain calls: X(return type, name, parameters, arguments) */
#define NCCL_FUNCTIONS(X)                                                                  \
    X(ncclResult_t, ncclGetVersion, (int *version), (version))                             \
    X(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * id), (id))                            \
    X(ncclResult_t, ncclCommInitRankConfig,                                                \
      (ncclComm_t * comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config),    \
      (comm, nranks, id, rank, config))                                                    \
    X(ncclResult_t, ncclCommSplit,                                                         \
      (ncclComm_t comm, int color, int key, ncclComm_t * newcomm, ncclConfig_t * config),  \
      (comm, color, key, newcomm, config))                                                 \
    X(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int *count), (comm, count))     \
    X(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int *rank), (comm, rank))    \
    X(ncclResult_t, ncclCommAbort, (ncclComm_t comm), (comm))                              \
    X(ncclResult_t, ncclCommDestroy, (ncclComm_t comm), (comm))                            \
    X(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t * state),        \
      (comm, state))                                                                       \
    X(const char *, ncclGetErrorString, (ncclResult_t r), (r))                             \
    X(const char *, ncclGetLastError, (ncclComm_t comm), (comm))                           \
    X(ncclResult_t, ncclGroupStart, (void), ())                                            \
    X(ncclResult_t, ncclGroupEnd, (void), ())                                              \
    X(ncclResult_t, ncclAllReduce,                                                         \
      (const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,      \
       ncclComm_t comm, cudaStream_t stream),                                              \
      (send, recv, count, dt, op, comm, stream))                                           \
    X(ncclResult_t, ncclAllGather,                                                         \
      (const void *send, void *recv, size_t count, ncclDataType_t dt, ncclComm_t comm,     \
       cudaStream_t stream),                                                               \
      (send, recv, count, dt, comm, stream))                                               \
    X(ncclResult_t, ncclReduceScatter,                                                     \
      (const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,      \
       ncclComm_t comm, cudaStream_t stream),                                              \
      (send, recv, count, dt, op, comm, stream))                                           \
    X(ncclResult_t, ncclBroadcast,                                                         \
      (const void *send, void *recv, size_t count, ncclDataType_t dt, int root,            \
       ncclComm_t comm, cudaStream_t stream),                                              \
      (send, recv, count, dt, root, comm, stream))                                         \
    X(ncclResult_t, ncclSend,                                                              \
      (const void *send, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,       \
       cudaStream_t stream),                                                               \
      (send, count, dt, peer, comm, stream))                                               \
    X(ncclResult_t, ncclRecv,                                                              \
      (void *recv, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,             \
       cudaStream_t stream),                                                               \
      (recv, count, dt, peer, comm, stream))

#define X_INDEX(ret, name, params, args) I_##name,
enum { NCCL_FUNCTIONS(X_INDEX) N_NCCL };
#define X_SYM(ret, name, params, args) [I_##name] = { #name, NULL },
static struct mt_dynlib_sym nccl_syms[N_NCCL] = { NCCL_FUNCTIONS(X_SYM) };

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int load_rc;
static struct mt_err load_err;

static void load_nccl(void)
{
    load_rc = mt_dynlib_load(NCCL_SONAME, "NCCL", MT_NCCL_LIBDIRS,
                             "Load the site's NCCL (or CUDA) module, or add the directory "
                             "that holds " NCCL_SONAME " to LD_LIBRARY_PATH",
                             nccl_syms, N_NCCL, &load_err);
}

int mt_nccl_load(struct mt_err *err)
{
    pthread_once(&once, load_nccl);
    return load_rc == MT_OK ? MT_OK : mt_err_set(err, load_err.code, "%s", load_err.msg);
}

/* What a call returns when NCCL could not be loaded. */
#define NCCL_FAILED(ret) _Generic((ret)0, const char *: "NCCL is not loaded", \
                                  default: ncclSystemError)
#define X_DEFINE(ret, name, params, args)                                         \
    ret name params                                                               \
    {                                                                             \
        if (mt_nccl_load(NULL) != MT_OK) return (ret)NCCL_FAILED(ret);            \
        return ((__typeof__(&name))nccl_syms[I_##name].addr) args;                \
    }
NCCL_FUNCTIONS(X_DEFINE)

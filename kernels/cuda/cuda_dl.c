/* cuBLASLt and the NVIDIA driver, loaded at run time: the moetrain executable names
 * no CUDA library (cudart is linked statically and opens the driver itself on the
 * first CUDA call), so --version, --check, topo and the CPU backend run on nodes
 * without CUDA (doc/site-install.md). Each cuBLASLt function the kernels call is
 * defined here with cublasLt.h's prototype and forwards to the library, loaded on the
 * first call (or by mt_cuda_load_libraries, which reports why it cannot be). The
 * definitions are hidden: the executable does not export them, so the library's own
 * calls between its functions never land here. */
#include "config.h"

#include <pthread.h>
#include <stdio.h>

#include <cuda_runtime.h>

#pragma GCC visibility push(hidden)
/* cublasLt.h declares a few functions as f() rather than f(void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop
#pragma GCC visibility pop

#include "kernels/cuda/cuda_backend.h"
#include "util/dynlib.h"
#include "util/error.h"

#define MT_STR_(x) #x
#define MT_STR(x) MT_STR_(x)
#define CUBLASLT_SONAME "libcublasLt.so." MT_STR(CUBLAS_VER_MAJOR)

/* Every cuBLASLt function moetrain calls: X(return type, name, parameters, arguments) */
#define CUBLASLT_FUNCTIONS(X)                                                              \
    X(cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * h), (h))                         \
    X(cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t h), (h))                          \
    X(const char *, cublasLtGetStatusString, (cublasStatus_t s), (s))                      \
    X(size_t, cublasLtGetVersion, (void), ())                                              \
    X(cublasStatus_t, cublasLtMatmul,                                                      \
      (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,    \
       cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc,          \
       const void *beta, const void *C, cublasLtMatrixLayout_t Cdesc, void *D,             \
       cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo, void *workspace,    \
       size_t workspace_size, cudaStream_t stream),                                        \
      (h, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,      \
       workspace_size, stream))                                                            \
    X(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,                                      \
      (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,        \
       cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc,                         \
       cublasLtMatrixLayout_t Ddesc, cublasLtMatmulPreference_t pref, int requested,       \
       cublasLtMatmulHeuristicResult_t results[], int *returned),                          \
      (h, desc, Adesc, Bdesc, Cdesc, Ddesc, pref, requested, results, returned))           \
    X(cublasStatus_t, cublasLtMatmulDescCreate,                                            \
      (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale),    \
      (desc, compute, scale))                                                              \
    X(cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))      \
    X(cublasStatus_t, cublasLtMatmulDescSetAttribute,                                      \
      (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void *buf,    \
       size_t size),                                                                       \
      (desc, attr, buf, size))                                                             \
    X(cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * p),    \
      (p))                                                                                 \
    X(cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t p),     \
      (p))                                                                                 \
    X(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,                                \
      (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,            \
       const void *buf, size_t size),                                                      \
      (p, attr, buf, size))                                                                \
    X(cublasStatus_t, cublasLtMatrixLayoutCreate,                                          \
      (cublasLtMatrixLayout_t * l, cudaDataType type, uint64_t rows, uint64_t cols,        \
       int64_t ld),                                                                        \
      (l, type, rows, cols, ld))                                                           \
    X(cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t l), (l))

#define X_INDEX(ret, name, params, args) I_##name,
enum { CUBLASLT_FUNCTIONS(X_INDEX) N_CUBLASLT };
#define X_SYM(ret, name, params, args) [I_##name] = { #name, NULL },
static struct mt_dynlib_sym lt_syms[N_CUBLASLT] = { CUBLASLT_FUNCTIONS(X_SYM) };

static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static int lt_rc;
static struct mt_err lt_err;

static void load_cublaslt(void)
{
    lt_rc = mt_dynlib_load(CUBLASLT_SONAME, "cuBLASLt of the CUDA toolkit", MT_CUDA_LIBDIRS,
                           "Load the site's CUDA module, or add the directory that holds "
                           CUBLASLT_SONAME " to LD_LIBRARY_PATH",
                           lt_syms, N_CUBLASLT, &lt_err);
}

static bool lt_ready(void)
{
    pthread_once(&lt_once, load_cublaslt);
    return lt_rc == MT_OK;
}

/* What a call returns when the library could not be loaded. */
#define LT_FAILED(ret) _Generic((ret)0, const char *: "cuBLASLt is not loaded", \
                                size_t: (size_t)0, default: CUBLAS_STATUS_NOT_INITIALIZED)
#define X_DEFINE(ret, name, params, args)                                         \
    ret name params                                                               \
    {                                                                             \
        if (!lt_ready()) return (ret)LT_FAILED(ret);                              \
        return ((__typeof__(&name))lt_syms[I_##name].addr) args;                  \
    }
CUBLASLT_FUNCTIONS(X_DEFINE)

/* The NVIDIA driver's library: cudart (static) opens it on the first CUDA call and
 * reports only "driver version is insufficient" when it is missing. */
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static int drv_rc;
static struct mt_err drv_err;

static void load_driver(void)
{
    drv_rc = mt_dynlib_load("libcuda.so.1", "the NVIDIA driver's CUDA library", "",
                            "This node has no NVIDIA driver: run on a GPU node, or use "
                            "--backend cpu",
                            NULL, 0, &drv_err);
}

static int driver_ready(struct mt_err *err)
{
    pthread_once(&drv_once, load_driver);
    return drv_rc == MT_OK ? MT_OK : mt_err_set(err, drv_err.code, "%s", drv_err.msg);
}

int mt_cuda_load_libraries(struct mt_err *err)
{
    if (!lt_ready()) return mt_err_set(err, lt_err.code, "%s", lt_err.msg);
    return driver_ready(err);
}

size_t mt_cublaslt_version(struct mt_err *err)
{
    if (!lt_ready()) {
        mt_err_set(err, lt_err.code, "%s", lt_err.msg);
        return 0;
    }
    return cublasLtGetVersion();
}

int mt_cuda_driver_version(struct mt_err *err)
{
    int v = 0;
    if (driver_ready(err) != MT_OK) return 0;
    cudaError_t e = cudaDriverGetVersion(&v);
    if (e != cudaSuccess) {
        mt_err_set(err, MT_EUNSUPPORTED, "cudaDriverGetVersion: %s", cudaGetErrorString(e));
        return 0;
    }
    return v;
}

/* moetrain --version (version.h). The build-time versions come from the headers
 * configure found; the run-time ones from the libraries this process has loaded (hwloc,
 * PMIx, MPI, the BLAS: linked) or can load (cuBLASLt, NCCL, the NVIDIA driver: opened here, as a
 * GPU run would open them, and only reported when they cannot be). */
#include "config.h"

#include "version.h"

#include <string.h>

#include <hwloc.h>
#ifdef HAVE_PMIX
#include <pmix.h>
#endif
#ifdef HAVE_MPI
#include <mpi.h>
#endif
#ifdef HAVE_CUDA
#include <cublas_api.h>
#include <cuda_runtime.h>
#include "kernels/cuda/cuda_backend.h"
#endif
/* NCCL is used only with CUDA (configure may find it in a build without CUDA) */
#if defined(HAVE_CUDA) && defined(HAVE_NCCL)
#define MT_VERSION_NCCL 1
#endif
#ifdef MT_VERSION_NCCL
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include "runtime/nccl_dl.h"
#endif

#include "kernels/cpu/cpu_blas.h"
#include "kernels/kernels.h"
#include "src/revision.h"
#include "util/error.h"

#if defined(__clang__)
#define MT_CC_NAME "clang " __clang_version__
#elif defined(__GNUC__)
#define MT_CC_NAME "gcc " __VERSION__
#else
#define MT_CC_NAME "an unknown C compiler"
#endif

static void row(FILE *out, const char *lib, const char *built, const char *found)
{
    fprintf(out, "  %-13s %-22s %s\n", lib, built, found);
}

#ifdef HAVE_CUDA
/* "not loadable: <the loader's message up to its fix>" */
static const char *not_loadable(char *buf, size_t n, const struct mt_err *err)
{
    const char *end = strstr(err->msg, ". ");
    size_t len = end ? (size_t)(end - err->msg) : strcspn(err->msg, "\n");
    snprintf(buf, n, "not loadable: %.*s", (int)len, err->msg);
    return buf;
}
#endif

static void hwloc_row(FILE *out)
{
    char b[32], r[32];
    const unsigned v = hwloc_get_api_version();
    snprintf(b, sizeof b, "API %u.%u.%u", HWLOC_API_VERSION >> 16, (HWLOC_API_VERSION >> 8) & 0xff,
             HWLOC_API_VERSION & 0xff);
    snprintf(r, sizeof r, "API %u.%u.%u", v >> 16, (v >> 8) & 0xff, v & 0xff);
    row(out, "hwloc", b, r);
}

/* The BLAS of the CPU backend and the kernels it picked for this CPU (OpenBLAS: at load
 * time, or OPENBLAS_CORETYPE's), which set its GEMM rate. */
static void blas_row(FILE *out)
{
    char r[256];
    mt_cpu_blas_describe(r, sizeof r);
#if defined(MT_BLAS_MKL)
    row(out, "BLAS", "Intel oneMKL", r);
#elif defined(MT_BLAS_BLIS)
    row(out, "BLAS", "BLIS", r);
#else
    char b[32]; /* OPENBLAS_VERSION is " OpenBLAS 0.3.21 " */
    const char *v = OPENBLAS_VERSION;
    snprintf(b, sizeof b, "%s", v + strspn(v, " "));
    for (size_t len = strlen(b); len > 0 && b[len - 1] == ' ';) b[--len] = '\0';
    row(out, "BLAS", b, r);
#endif
}

static void pmix_row(FILE *out)
{
#ifdef HAVE_PMIX
    char b[32];
    snprintf(b, sizeof b, "%ld.%ld.%ld", (long)PMIX_VERSION_MAJOR, (long)PMIX_VERSION_MINOR,
             (long)PMIX_VERSION_RELEASE);
    row(out, "PMIx", b, PMIx_Get_version());
#else
    row(out, "PMIx", "-", "-");
#endif
}

static void mpi_row(FILE *out)
{
#ifdef HAVE_MPI
    char b[64], lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
#ifdef OPEN_MPI
    snprintf(b, sizeof b, "Open MPI %d.%d.%d", OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION,
             OMPI_RELEASE_VERSION);
#else
    snprintf(b, sizeof b, "MPI %d.%d", MPI_VERSION, MPI_SUBVERSION);
#endif
    /* callable before MPI_Init; the first clause names the library and its version */
    if (MPI_Get_library_version(lib, &len) != MPI_SUCCESS) snprintf(lib, sizeof lib, "?");
    lib[strcspn(lib, ",\n")] = '\0';
    row(out, "MPI", b, lib);
#else
    row(out, "MPI", "-", "-");
#endif
}

static void cuda_rows(FILE *out)
{
#ifdef HAVE_CUDA
    char b[64], r[512];
    struct mt_err err = { 0 };
    int rt = 0;
    cudaRuntimeGetVersion(&rt);
    snprintf(b, sizeof b, "%d.%d", CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    snprintf(r, sizeof r, "%d.%d (linked statically)", rt / 1000, rt % 1000 / 10);
    row(out, "CUDA runtime", b, r);
    int drv = mt_cuda_driver_version(&err);
    if (drv > 0)
        snprintf(r, sizeof r, "supports CUDA %d.%d", drv / 1000, drv % 1000 / 10);
    else
        not_loadable(r, sizeof r, &err);
    row(out, "CUDA driver", "-", r);
    snprintf(b, sizeof b, "%d.%d.%d", CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, CUBLAS_VER_PATCH);
    size_t lt = mt_cublaslt_version(&err);
    if (lt > 0)
        snprintf(r, sizeof r, "%zu.%zu.%zu", lt / 10000, lt / 100 % 100, lt % 100);
    else
        not_loadable(r, sizeof r, &err);
    row(out, "cuBLASLt", b, r);
#else
    row(out, "CUDA runtime", "-", "-");
    row(out, "cuBLASLt", "-", "-");
#endif
#ifdef MT_VERSION_NCCL
    int nv = 0;
    snprintf(b, sizeof b, "%d.%d.%d", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    if (mt_nccl_load(&err) == MT_OK && ncclGetVersion(&nv) == ncclSuccess)
        snprintf(r, sizeof r, "%d.%d.%d", nv / 10000, nv / 100 % 100, nv % 100);
    else
        not_loadable(r, sizeof r, &err);
    row(out, "NCCL", b, r);
#else
    row(out, "NCCL", "-", "-");
#endif
}

void mt_print_version(FILE *out)
{
    fprintf(out, "%s\n", PACKAGE_STRING);
    fprintf(out, "source: %s\n", MT_REVISION);
    fprintf(out, "compiler: %s", MT_CC_NAME);
#ifdef MT_NVCC_VERSION
    fprintf(out, "; nvcc %s", MT_NVCC_VERSION);
#endif
    fprintf(out, "\nconfigure: %s\n", MT_CONFIGURE_ARGS[0] ? MT_CONFIGURE_ARGS : "(no arguments)");
#if defined(MT_BLAS_MKL)
    fprintf(out, "backends: cpu (Intel oneMKL");
#elif defined(MT_BLAS_BLIS)
    fprintf(out, "backends: cpu (BLIS");
#else
    fprintf(out, "backends: cpu (OpenBLAS");
#endif
#ifdef _OPENMP
    fprintf(out, ", OpenMP");
#endif
    struct mt_err isa_err = { 0 };
    if (mt_cpu_isa_check(&isa_err) == MT_OK)
        fprintf(out, "; GEMMs: %s; CPU kernels: %s, running %s)", mt_cpu_gemm_kernel(),
                mt_cpu_isa_built(), mt_cpu_isa());
    else
        fprintf(out, "; CPU kernels: %s)", isa_err.msg);
#ifdef HAVE_CUDA
    fprintf(out, ", cuda (%s", MT_CUDA_ARCHS);
#ifdef MT_VERSION_NCCL
    fprintf(out, ", NCCL");
#endif
    fprintf(out, ")");
#endif
    fprintf(out, "\nruntime: self");
#ifdef HAVE_MPI
    fprintf(out, ", MPI");
#endif
#ifdef HAVE_PMIX
    fprintf(out, ", PMIx");
#endif
    fprintf(out, "\ntopology: hwloc");
#ifdef HAVE_NUMA
    fprintf(out, ", libnuma");
#endif
    fprintf(out, "\nlibraries:\n");
    row(out, "", "built with", "found at run time");
    hwloc_row(out);
    blas_row(out);
    pmix_row(out);
    mpi_row(out);
    cuda_rows(out);
#ifdef HAVE_CUDA
    /* without the driver, cudart says only "driver version is insufficient" */
    struct mt_err err = { 0 };
    char buf[256];
    if (mt_cuda_driver_version(&err) > 0)
        mt_cuda_describe(buf, sizeof buf);
    else
        snprintf(buf, sizeof buf, "none (no NVIDIA driver: libcuda.so.1 cannot be loaded)");
    fprintf(out, "devices: %s\n", buf);
#endif
}

/* The CBLAS the build chose (configure --with-blas, m4/mt_blas.m4): its header, and
 * the vendor's own calls (thread count, identification) behind one name each. */
#ifndef MT_KERNELS_CPU_BLAS_H
#define MT_KERNELS_CPU_BLAS_H

#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#if defined(MT_BLAS_MKL)
#include <mkl.h>
#elif defined(MT_BLAS_BLIS)
#include <blis.h>
#include <cblas.h>
#else
#include <cblas.h>
#endif

/* The BLAS runs single-threaded: OpenMP owns the cores (cpu_dense.c). */
static inline void mt_cpu_blas_single_thread(void)
{
#if defined(MT_BLAS_MKL)
    mkl_set_num_threads(1);
#elif defined(MT_BLAS_BLIS)
    bli_thread_set_num_threads(1);
#else
    openblas_set_num_threads(1);
#endif
}

/* buf = which BLAS runs and with which kernels, e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH
 * NO_AFFINITY Zen MAX_THREADS=64; kernels: Zen". OpenBLAS built for several CPUs
 * picks its kernels at load time, or as OPENBLAS_CORETYPE says (doc/site-install.md). */
static inline void mt_cpu_blas_describe(char *buf, size_t n)
{
#if defined(MT_BLAS_MKL)
    char v[198];
    mkl_get_version_string(v, (int)sizeof v);
    snprintf(buf, n, "%s", v);
#elif defined(MT_BLAS_BLIS)
    snprintf(buf, n, "BLIS %s; kernels: %s", bli_info_get_version_str(),
             bli_arch_string(bli_arch_query_id()));
#else
    const char *forced = getenv("OPENBLAS_CORETYPE");
    snprintf(buf, n, "%s; kernels: %s%s%s%s", openblas_get_config(), openblas_get_corename(),
             forced ? " (OPENBLAS_CORETYPE=" : "", forced ? forced : "", forced ? ")" : "");
#endif
}

#endif

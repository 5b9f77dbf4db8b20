/* CPU reference backend: GEMM and grouped GEMM through CBLAS (OpenBLAS, BLIS or MKL:
 * configure --with-blas).
 *
 * The BLAS runs single-threaded and the parallelism is ours: C is split into row (or
 * column) blocks, one OpenMP thread per block, each block one sgemm over the full K.
 * Two thread pools that spin while the other works (OpenBLAS's and OpenMP's) slow
 * each other down several times over; one pool does not. Every element of C is
 * computed by one call with the whole reduction, so results do not depend on the
 * number of threads. */
#include "kernels/cpu/cpu_ops.h"

#include <omp.h>

#include "kernels/cpu/cpu_blas.h"

/* Below this many multiply-adds one call on one thread is faster than splitting. */
#define GEMM_SPLIT_MIN_FMA (1 << 18)

void mt_cpu_blas_init(void) { mt_cpu_blas_single_thread(); }

void mt_cpu_gemm(void *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    (void)ctx;
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* nothing to multiply: C = beta C, where beta = 0 clears */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
    const enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    const enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    const int nt = omp_get_max_threads();
    if (nt <= 1 || (double)M * N * K < GEMM_SPLIT_MIN_FMA || omp_in_parallel()) {
        cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* split the larger of M and N; block i covers [i*len/nt, (i+1)*len/nt) */
    const bool by_rows = M >= N;
    const int len = by_rows ? M : N;
    const int parts = nt < len ? nt : len;
#pragma omp parallel for schedule(static) num_threads(parts)
    for (int i = 0; i < parts; i++) {
        int lo = (int)((long long)len * i / parts), hi = (int)((long long)len * (i + 1) / parts);
        if (by_rows) { /* rows lo..hi of op(A) and C */
            const float *Ai = trans_a ? A + lo : A + (size_t)lo * lda;
            cblas_sgemm(CblasRowMajor, ta, tb, hi - lo, N, K, alpha, Ai, lda, B, ldb, beta,
                        C + (size_t)lo * ldc, ldc);
        } else { /* columns lo..hi of op(B) and C */
            const float *Bi = trans_b ? B + (size_t)lo * ldb : B + lo;
            cblas_sgemm(CblasRowMajor, ta, tb, M, hi - lo, K, alpha, A, lda, Bi, ldb, beta,
                        C + lo, ldc);
        }
    }
}

void mt_cpu_grouped_gemm(void *ctx, bool trans_a, bool trans_b, int num_groups,
                         const int32_t *offsets, int M, int N, int K, float alpha,
                         const float *A, const float *B, float beta, float *C)
{
    for (int g = 0; g < num_groups; g++) {
        int r0 = offsets[g], m = offsets[g + 1] - offsets[g];
        if (!trans_a) {
            if (m == 0) continue;
            const float *W = B + (size_t)g * N * K;
            mt_cpu_gemm(ctx, false, trans_b, m, N, K, alpha, A + (size_t)r0 * K, K, W,
                        trans_b ? K : N, beta, C + (size_t)r0 * N, N);
        } else {
            /* weight gradient: C_g (M,N) = A_g^T B_g with the token rows as reduction */
            mt_cpu_gemm(ctx, true, false, M, N, m, alpha, A + (size_t)r0 * M, M,
                        B + (size_t)r0 * N, N, beta, C + (size_t)g * M * N, N);
        }
    }
}

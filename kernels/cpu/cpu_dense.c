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

/* C = beta C for an empty reduction (K = 0); beta = 0 clears, NaN included; beta = 1
 * (a weight gradient accumulated for an expert no token chose) leaves C as it is. */
static void gemm_scale(int M, int N, float beta, float *C, int ldc)
{
    if (beta == 1.0f) return;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
}

int mt_cpu_gemm_parts(int M, int N, int K, int threads)
{
    if (threads <= 1 || M <= 0 || N <= 0 || K <= 0 || (double)M * N * K < GEMM_SPLIT_MIN_FMA)
        return 1;
    const int len = M >= N ? M : N;
    return threads < len ? threads : len;
}

bool mt_cpu_gemm_range(int i, int parts, int M, int N, int *lo, int *hi)
{
    /* split the larger of M and N; block i covers [i*len/parts, (i+1)*len/parts) */
    const bool by_rows = M >= N;
    const int len = by_rows ? M : N;
    *lo = (int)((long long)len * i / parts);
    *hi = (int)((long long)len * (i + 1) / parts);
    return by_rows;
}

void mt_cpu_gemm_part(int i, int parts, bool trans_a, bool trans_b, int M, int N, int K,
                      float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                      float *C, int ldc)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (i == 0) gemm_scale(M, N, beta, C, ldc);
        return;
    }
    const enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    const enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    int lo, hi;
    if (mt_cpu_gemm_range(i, parts, M, N, &lo, &hi)) { /* rows lo..hi of op(A) and C */
        const float *Ai = trans_a ? A + lo : A + (size_t)lo * lda;
        cblas_sgemm(CblasRowMajor, ta, tb, hi - lo, N, K, alpha, Ai, lda, B, ldb, beta,
                    C + (size_t)lo * ldc, ldc);
    } else { /* columns lo..hi of op(B) and C */
        const float *Bi = trans_b ? B + (size_t)lo * ldb : B + lo;
        cblas_sgemm(CblasRowMajor, ta, tb, M, hi - lo, K, alpha, A, lda, Bi, ldb, beta, C + lo,
                    ldc);
    }
}

void mt_cpu_gemm(void *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    (void)ctx;
    const int parts = omp_in_parallel() ? 1 : mt_cpu_gemm_parts(M, N, K, omp_get_max_threads());
    if (parts == 1) {
        mt_cpu_gemm_part(0, 1, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(parts)
    for (int i = 0; i < parts; i++)
        mt_cpu_gemm_part(i, parts, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
                         ldc);
}

/* Group g's GEMM (as mt_cpu_grouped_gemm) split in parts over threads threads, and its
 * part i: what one thread runs of it. */
static int group_parts(bool trans_a, const int32_t *offsets, int g, int M, int N, int K,
                       int threads)
{
    const int m = offsets[g + 1] - offsets[g];
    return trans_a ? mt_cpu_gemm_parts(M, N, m, threads) : mt_cpu_gemm_parts(m, N, K, threads);
}

static void group_part(int i, int parts, bool trans_a, bool trans_b, const int32_t *offsets,
                       int g, int M, int N, int K, float alpha, const float *A, const float *B,
                       float beta, float *C)
{
    const int r0 = offsets[g], m = offsets[g + 1] - offsets[g];
    if (!trans_a) {
        mt_cpu_gemm_part(i, parts, false, trans_b, m, N, K, alpha, A + (size_t)r0 * K, K,
                         B + (size_t)g * N * K, trans_b ? K : N, beta, C + (size_t)r0 * N, N);
    } else {
        /* weight gradient: C_g (M,N) = A_g^T B_g with the token rows as reduction */
        mt_cpu_gemm_part(i, parts, true, false, M, N, m, alpha, A + (size_t)r0 * M, M,
                         B + (size_t)r0 * N, N, beta, C + (size_t)g * M * N, N);
    }
}

/* Groups may go whole to threads (one call each, no operand packed by two threads for
 * one group) when that leaves the work balanced: each group in order to the thread with
 * the least work so far, the lowest id on a tie, a group's work its rows (+1, so that
 * empty ones spread too: a weight gradient's still scales its C). Balanced: no thread
 * above an even share by more than 1/WHOLE_SLACK. Returns whether they go whole, and
 * sets owner[g] then (threads <= WHOLE_MAX_THREADS, num_groups <= WHOLE_MAX_GROUPS). */
#define WHOLE_MAX_THREADS 64
#define WHOLE_MAX_GROUPS 1024
#define WHOLE_SLACK 8

static bool whole_groups(const int32_t *offsets, int num_groups, int threads,
                         unsigned short *owner)
{
    if (threads > WHOLE_MAX_THREADS || num_groups > WHOLE_MAX_GROUPS || num_groups < threads)
        return false;
    long long load[WHOLE_MAX_THREADS] = {0}, total = 0, most = 0;
    for (int g = 0; g < num_groups; g++) {
        int t = 0;
        for (int u = 1; u < threads; u++)
            if (load[u] < load[t]) t = u;
        const long long w = (long long)(offsets[g + 1] - offsets[g]) + 1;
        load[t] += w;
        total += w;
        most = load[t] > most ? load[t] : most;
        owner[g] = (unsigned short)t;
    }
    return most * threads * WHOLE_SLACK <= total * (WHOLE_SLACK + 1);
}

void mt_cpu_grouped_gemm_thread(int id, int team, int threads, bool trans_a, bool trans_b,
                                int num_groups, const int32_t *offsets, int M, int N, int K,
                                float alpha, const float *A, const float *B, float beta, float *C)
{
    unsigned short owner[WHOLE_MAX_GROUPS];
    if (team > 1 && whole_groups(offsets, num_groups, team, owner)) {
        for (int g = 0; g < num_groups; g++)
            if (owner[g] == id)
                group_part(0, 1, trans_a, trans_b, offsets, g, M, N, K, alpha, A, B, beta, C);
        return;
    }
    /* else a group too small to split goes whole to one thread, round robin, and the
     * others are split over the team */
    for (int g = 0; g < num_groups; g++) {
        const int parts = group_parts(trans_a, offsets, g, M, N, K, threads);
        if (parts == 1) {
            if (g % team == id)
                group_part(0, 1, trans_a, trans_b, offsets, g, M, N, K, alpha, A, B, beta, C);
            continue;
        }
        for (int i = id; i < parts; i += team)
            group_part(i, parts, trans_a, trans_b, offsets, g, M, N, K, alpha, A, B, beta, C);
    }
}

void mt_cpu_grouped_gemm(void *ctx, bool trans_a, bool trans_b, int num_groups,
                         const int32_t *offsets, int M, int N, int K, float alpha,
                         const float *A, const float *B, float beta, float *C)
{
    (void)ctx;
    const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (threads == 1) {
        mt_cpu_grouped_gemm_thread(0, 1, 1, trans_a, trans_b, num_groups, offsets, M, N, K,
                                   alpha, A, B, beta, C);
        return;
    }
    /* one region for all groups: they write disjoint slices of C */
#pragma omp parallel num_threads(threads)
    mt_cpu_grouped_gemm_thread(omp_get_thread_num(), omp_get_num_threads(), threads, trans_a,
                               trans_b, num_groups, offsets, M, N, K, alpha, A, B, beta, C);
}

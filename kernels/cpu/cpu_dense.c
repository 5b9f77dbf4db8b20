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

/* Rows [lo, hi) of group g's C: its token rows (C (m,N) = A_g op(B_g)), or for a
 * weight gradient (trans_a) rows of C_g (M,N) = A_g^T B_g, the group's token rows the
 * reduction, whole in every call. */
static void group_rows(bool trans_a, bool trans_b, const int32_t *offsets, int g, int lo,
                       int hi, int M, int N, int K, float alpha, const float *A, const float *B,
                       float beta, float *C)
{
    const int r0 = offsets[g], m = offsets[g + 1] - offsets[g];
    if (!trans_a) {
        mt_cpu_gemm_part(0, 1, false, trans_b, hi - lo, N, K, alpha, A + (size_t)(r0 + lo) * K,
                         K, B + (size_t)g * N * K, trans_b ? K : N, beta,
                         C + (size_t)(r0 + lo) * N, N);
    } else {
        mt_cpu_gemm_part(0, 1, true, false, hi - lo, N, m, alpha, A + (size_t)r0 * M + lo, M,
                         B + (size_t)r0 * N, N, beta, C + ((size_t)g * M + lo) * N, N);
    }
}

/* The groups' work laid end to end, group g as rows of C each costing the same: its
 * token rows at K each after a fixed cost of GROUP_CALL rows (a call packs the group's
 * weight whatever its rows: measured, a call of a few rows takes as long as one of some
 * 100 more), or (trans_a) the M rows of C_g at the group's token count + 1 each (+1: an
 * empty group's C is still scaled by beta; its operands' packing grows with the tokens
 * as its arithmetic does). Thread id of a team owns the rows whose work starts in
 * [id W / team, (id + 1) W / team), W the total: equal shares, the groups in order, at
 * most team - 1 of them cut in two (a cut on a multiple of GROUP_CUT rows), so that a
 * weight is packed by one thread but for those. With one thread every group is one
 * call; a cut group's rows are computed as a dense GEMM's row blocks are
 * (mt_cpu_gemm_part), each with its whole reduction. */
#define GROUP_CALL 64
#define GROUP_CUT 16

static int group_cut(long long at, long long start, long long cost, int rows)
{
    if (at <= start) return 0;
    long long r = (at - start + cost - 1) / cost;
    if (r >= rows) return rows;
    r = (r + GROUP_CUT / 2) / GROUP_CUT * GROUP_CUT;
    return r < rows ? (int)r : rows;
}

void mt_cpu_grouped_gemm_thread(int id, int team, bool trans_a, bool trans_b, int num_groups,
                                const int32_t *offsets, int M, int N, int K, float alpha,
                                const float *A, const float *B, float beta, float *C)
{
    if (N <= 0 || (trans_a ? M <= 0 : K < 0)) return;
    const long long row_cost = K > 0 ? K : 1;
    long long total = 0;
    for (int g = 0; g < num_groups; g++) {
        const long long m = offsets[g + 1] - offsets[g];
        total += trans_a ? (long long)M * (m + 1) : (m > 0 ? GROUP_CALL + m : 0) * row_cost;
    }
    const long long from = total * id / team, to = total * (id + 1) / team;
    long long start = 0;
    for (int g = 0; g < num_groups && start < to; g++) {
        const long long m = offsets[g + 1] - offsets[g];
        const long long cost = trans_a ? m + 1 : row_cost;
        const int rows = trans_a ? M : (int)m;
        if (!trans_a && m > 0) start += GROUP_CALL * row_cost;
        const int lo = group_cut(from, start, cost, rows), hi = group_cut(to, start, cost, rows);
        if (hi > lo)
            group_rows(trans_a, trans_b, offsets, g, lo, hi, M, N, K, alpha, A, B, beta, C);
        start += cost * rows;
    }
}

void mt_cpu_grouped_gemm(void *ctx, bool trans_a, bool trans_b, int num_groups,
                         const int32_t *offsets, int M, int N, int K, float alpha,
                         const float *A, const float *B, float beta, float *C)
{
    (void)ctx;
    const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (threads == 1) {
        mt_cpu_grouped_gemm_thread(0, 1, trans_a, trans_b, num_groups, offsets, M, N, K, alpha,
                                   A, B, beta, C);
        return;
    }
    /* one region for all groups: they write disjoint slices of C */
#pragma omp parallel num_threads(threads)
    mt_cpu_grouped_gemm_thread(omp_get_thread_num(), omp_get_num_threads(), trans_a, trans_b,
                               num_groups, offsets, M, N, K, alpha, A, B, beta, C);
}

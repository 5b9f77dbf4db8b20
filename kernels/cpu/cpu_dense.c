/* CPU reference backend: GEMM and grouped GEMM through CBLAS (OpenBLAS, BLIS or MKL:
 * configure --with-blas), or, in the x86-64-v4 build, through moetrain's own AVX-512
 * kernel (below; MOETRAIN_CPU_GEMM=blas takes the BLAS there too).
 *
 * The BLAS runs single-threaded and the parallelism is ours: C is split into row (or
 * column) blocks, one OpenMP thread per block, each block one call over the full K.
 * Two thread pools that spin while the other works (OpenBLAS's and OpenMP's) slow
 * each other down several times over; one pool does not. With moetrain's kernel an
 * element of C gets the same bits whichever block computes it, so results do not
 * depend on the number of threads. A BLAS does not promise that: OpenBLAS takes
 * another path for a block than for the whole at some sizes (test_gemm_values in
 * tests/kernels/test_ops_fd.c reports where), so through it the last bits of a result
 * can follow the thread count. */
#include "kernels/cpu/cpu_ops.h"

#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_blas.h"

/* Below this many multiply-adds one call on one thread is faster than splitting. */
#define GEMM_SPLIT_MIN_FMA (1 << 18)

/* C = beta C: for an empty reduction (K = 0; beta = 0 clears, NaN included; beta = 1,
 * a weight gradient accumulated for an expert no token chose, leaves C as it is), and
 * before moetrain's kernel adds to C for a beta other than 0 and 1. */
static void gemm_scale(int M, int N, float beta, float *C, int ldc)
{
    if (beta == 1.0f) return;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
}

#if defined(__AVX512F__)
#include <immintrin.h>
#define OWN_GEMM 1

/* moetrain's sgemm for AVX-512 (row-major, C = alpha op(A) op(B) + beta C), blocked as
 * BLAS libraries are: op(B) packed in KC x NC blocks of NR-column panels, op(A) in
 * MC x KC blocks of MR-row panels, a 12 x 32 register tile (24 accumulators) per
 * micro-kernel call (doc/site-install.md has the training step's figures beside the
 * BLAS's, MOETRAIN_CPU_GEMM=blas, from bench/cpu_step.sh). An element of C is alpha
 * times each KC-long block's FMA chain (k in order), added to C block after block: the
 * same whatever rows or columns a call covers, so row and column splits give the same
 * bits. */
#define SG_MR 12
#define SG_NR 32
#define SG_KC 256
#define SG_MC 96
#define SG_NC 2048
#define SG_PF 64 /* packing prefetches a row this many floats ahead */
#define SG_PF_ROWS 8 /* or this many rows ahead */
/* Ap (SG_MC x SG_KC and 16 floats of slack: a whole number of cache lines), then Bp */
#define SG_AP_FLOATS ((size_t)SG_MC * SG_KC + 16)
#define SG_PACK_FLOATS (SG_AP_FLOATS + (size_t)SG_KC * SG_NC)

/* Each thread's packing buffers (SG_PACK_FLOATS), allocated at its first GEMM and freed
 * when the thread ends (OpenMP's threads usually live as long as the process; a team
 * of another size may start new ones). NULL when they cannot be had. */
static pthread_key_t sg_key;
static bool sg_key_ok;
static pthread_once_t sg_key_once = PTHREAD_ONCE_INIT;
static void sg_key_make(void) { sg_key_ok = pthread_key_create(&sg_key, free) == 0; }

static float *sg_buffers(void)
{
    pthread_once(&sg_key_once, sg_key_make);
    if (!sg_key_ok) return NULL;
    float *p = pthread_getspecific(sg_key);
    if (!p) {
        p = aligned_alloc(64, sizeof(float) * SG_PACK_FLOATS);
        if (p && pthread_setspecific(sg_key, p) != 0) {
            free(p);
            p = NULL;
        }
    }
    return p;
}

/* a prefetch of the line holding element i of x, which may lie past the operand's end
 * (a prefetch does not fault; the address is an integer's, not a pointer's) */
static inline void sg_prefetch(struct mt_cpu_opnd x, size_t i)
{
    _mm_prefetch((const char *)((uintptr_t)x.p + mt_cpu_opnd_size(x) * i), _MM_HINT_T0);
}

/* the first n (clamped to 0..16) of 16 lanes */
static inline __mmask16 sg_mask(int n)
{
    return (__mmask16)(n >= 16 ? 0xffff : n <= 0 ? 0 : (1u << n) - 1);
}

/* elements i.. of x in the lanes m (16: all), the others zero, as fp32 */
static inline __m512 sg_load(struct mt_cpu_opnd x, size_t i, __mmask16 m)
{
    if (!x.bf16) return _mm512_maskz_loadu_ps(m, (const float *)x.p + i);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)x.p + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline float sg_at(struct mt_cpu_opnd x, size_t i)
{
    float f;
    if (!x.bf16) return ((const float *)x.p)[i];
    mt_cpu_widen(&f, (const uint16_t *)x.p + i, 1);
    return f;
}

/* r[0..15] (16 rows of 16) transposed in place */
static inline __attribute__((always_inline)) void sg_transpose16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) {
            t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
            t[8 * i + 4 + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
    }
}

/* Ap: op(A) rows [0, mc) x k [0, kc) from element a0 of A (op(A)'s element (0, 0)), as
 * panels of SG_MR rows, each kc x SG_MR (a k's SG_MR values together), rows past mc
 * zero. Ap has room for 16 floats past its end (a k's 12 values are stored as a vector
 * of 16). */
static void sg_pack_a(float *restrict Ap, struct mt_cpu_opnd A, size_t a0, int lda, bool trans_a,
                      int mc, int kc)
{
    for (int i0 = 0; i0 < mc; i0 += SG_MR, Ap += (size_t)SG_MR * kc) {
        const int mr = mc - i0 < SG_MR ? mc - i0 : SG_MR;
        const __mmask16 m = sg_mask(mr);
        if (trans_a) { /* op(A)(i, k) = A[a0 + k lda + i]: a k's rows are contiguous */
            for (int k = 0; k < kc; k++) {
                const size_t at = a0 + (size_t)k * lda + i0;
                sg_prefetch(A, at + (size_t)SG_PF_ROWS * lda);
                _mm512_storeu_ps(Ap + (size_t)k * SG_MR, sg_load(A, at, m));
            }
            continue;
        }
        /* op(A)(i, k) = A[a0 + i lda + k]: 16 k of the panel's rows, transposed */
        int k0 = 0;
        for (; k0 + 16 <= kc; k0 += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) {
                if (i >= mr) {
                    r[i] = _mm512_setzero_ps();
                    continue;
                }
                const size_t at = a0 + (size_t)(i0 + i) * lda + k0;
                sg_prefetch(A, at + SG_PF);
                r[i] = sg_load(A, at, 0xffff);
            }
            sg_transpose16(r);
            for (int k = 0; k < 16; k++) _mm512_storeu_ps(Ap + (size_t)(k0 + k) * SG_MR, r[k]);
        }
        for (; k0 < kc; k0++)
            for (int r = 0; r < SG_MR; r++)
                Ap[(size_t)k0 * SG_MR + r] =
                    r < mr ? sg_at(A, a0 + (size_t)(i0 + r) * lda + k0) : 0.0f;
    }
}

/* Bp: op(B) k [0, kc) x columns [0, nc) from element b0 of B (op(B)'s element (0, 0)),
 * as panels of SG_NR columns, each kc x SG_NR, columns past nc zero. */
static void sg_pack_b(float *restrict Bp, struct mt_cpu_opnd B, size_t b0, int ldb, bool trans_b,
                      int nc, int kc)
{
    for (int j0 = 0; j0 < nc; j0 += SG_NR, Bp += (size_t)SG_NR * kc) {
        const int nr = nc - j0 < SG_NR ? nc - j0 : SG_NR;
        if (!trans_b) { /* op(B)(k, j) = B[b0 + k ldb + j]: rows of a panel are contiguous */
            const __mmask16 m0 = sg_mask(nr), m1 = sg_mask(nr - 16);
            for (int k = 0; k < kc; k++) {
                const size_t at = b0 + (size_t)k * ldb + j0;
                sg_prefetch(B, at + (size_t)SG_PF_ROWS * ldb);
                sg_prefetch(B, at + (size_t)SG_PF_ROWS * ldb + 16);
                _mm512_store_ps(Bp + (size_t)k * SG_NR, sg_load(B, at, m0));
                _mm512_store_ps(Bp + (size_t)k * SG_NR + 16, sg_load(B, at + 16, m1));
            }
        } else if (nr == SG_NR) { /* op(B)(k, j) = B[b0 + j ldb + k]: 16 x 16 transposes */
            int k0 = 0;
            for (; k0 + 16 <= kc; k0 += 16)
                for (int h = 0; h < 2; h++) {
                    __m512 r[16];
                    for (int j = 0; j < 16; j++) {
                        const size_t at = b0 + (size_t)(j0 + 16 * h + j) * ldb + k0;
                        sg_prefetch(B, at + SG_PF);
                        r[j] = sg_load(B, at, 0xffff);
                    }
                    sg_transpose16(r);
                    for (int k = 0; k < 16; k++)
                        _mm512_store_ps(Bp + (size_t)(k0 + k) * SG_NR + 16 * h, r[k]);
                }
            for (; k0 < kc; k0++)
                for (int j = 0; j < SG_NR; j++)
                    Bp[(size_t)k0 * SG_NR + j] = sg_at(B, b0 + (size_t)(j0 + j) * ldb + k0);
        } else {
            for (int k = 0; k < kc; k++)
                for (int j = 0; j < SG_NR; j++)
                    Bp[(size_t)k * SG_NR + j] =
                        j < nr ? sg_at(B, b0 + (size_t)(j0 + j) * ldb + k) : 0.0f;
        }
    }
}

/* The 12 x 32 tile: C (mr x nr of it, row stride ldc) = alpha Ap Bp (overwrite) or
 * C + alpha Ap Bp (add). */
static void sg_tile(int kc, const float *restrict ap, const float *restrict bp, float *C,
                    int ldc, int mr, int nr, float alpha, bool add)
{
    __m512 c[SG_MR][2];
#pragma GCC unroll 12
    for (int i = 0; i < SG_MR; i++) c[i][0] = c[i][1] = _mm512_setzero_ps();
    for (int i = 0; i < mr; i++) { /* C's lines on their way while the FMAs run */
        _mm_prefetch((const char *)(C + (size_t)i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(C + (size_t)i * ldc + 16), _MM_HINT_T0);
    }
    for (int k = 0; k < kc; k++, ap += SG_MR, bp += SG_NR) {
        const __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16);
#pragma GCC unroll 12
        for (int i = 0; i < SG_MR; i++) {
            const __m512 a = _mm512_set1_ps(ap[i]);
            c[i][0] = _mm512_fmadd_ps(a, b0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(a, b1, c[i][1]);
        }
    }
    const __m512 al = _mm512_set1_ps(alpha);
    const __mmask16 m0 = sg_mask(nr), m1 = sg_mask(nr - 16);
#pragma GCC unroll 12
    for (int i = 0; i < SG_MR; i++) { /* unrolled: the accumulators stay in registers */
        if (i == mr) break;
        float *p = C + (size_t)i * ldc;
        __m512 v0 = _mm512_mul_ps(al, c[i][0]), v1 = _mm512_mul_ps(al, c[i][1]);
        if (add) {
            v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, p), v0);
            v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, p + 16), v1);
        }
        _mm512_mask_storeu_ps(p, m0, v0);
        _mm512_mask_storeu_ps(p + 16, m1, v1);
    }
}

/* C (M x N) = alpha op(A) op(B) + beta C, K > 0; false when the packing buffers cannot
 * be had (the caller takes the BLAS instead) */
static bool sg_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                    struct mt_cpu_opnd A, size_t a0, int lda, struct mt_cpu_opnd B, size_t b0,
                    int ldb, float beta, float *C, int ldc)
{
    float *const Ap = sg_buffers();
    if (!Ap) return false;
    float *const Bp = Ap + SG_AP_FLOATS;
    if (beta != 0.0f) gemm_scale(M, N, beta, C, ldc);
    for (int j0 = 0; j0 < N; j0 += SG_NC) {
        const int nc = N - j0 < SG_NC ? N - j0 : SG_NC;
        for (int k0 = 0; k0 < K; k0 += SG_KC) {
            const int kc = K - k0 < SG_KC ? K - k0 : SG_KC;
            const bool add = k0 > 0 || beta != 0.0f;
            sg_pack_b(Bp, B, b0 + (trans_b ? (size_t)j0 * ldb + k0 : (size_t)k0 * ldb + j0), ldb,
                      trans_b, nc, kc);
            for (int i0 = 0; i0 < M; i0 += SG_MC) {
                const int mc = M - i0 < SG_MC ? M - i0 : SG_MC;
                sg_pack_a(Ap, A, a0 + (trans_a ? (size_t)k0 * lda + i0 : (size_t)i0 * lda + k0),
                          lda, trans_a, mc, kc);
                for (int jr = 0; jr < nc; jr += SG_NR)
                    for (int ir = 0; ir < mc; ir += SG_MR)
                        sg_tile(kc, Ap + (size_t)ir * kc, Bp + (size_t)jr * kc,
                                C + (size_t)(i0 + ir) * ldc + j0 + jr, ldc,
                                mc - ir < SG_MR ? mc - ir : SG_MR,
                                nc - jr < SG_NR ? nc - jr : SG_NR, alpha, add);
            }
        }
    }
    return true;
}
#endif

void mt_cpu_blas_init(void) { mt_cpu_blas_single_thread(); }

bool mt_cpu_gemm_bf16(void)
{
#ifdef OWN_GEMM
    return !mt_cpu_gemm_blas();
#else
    return false;
#endif
}

/* C = alpha op(A) op(B) + beta C, K > 0, on the calling thread; op(A)'s element (0, 0)
 * is A's element a0, op(B)'s B's b0 */
static void gemm_call(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                      struct mt_cpu_opnd A, size_t a0, int lda, struct mt_cpu_opnd B, size_t b0,
                      int ldb, float beta, float *C, int ldc)
{
#ifdef OWN_GEMM
    if (!mt_cpu_gemm_blas() &&
        sg_gemm(trans_a, trans_b, M, N, K, alpha, A, a0, lda, B, b0, ldb, beta, C, ldc))
        return;
#endif
    if (A.bf16 || B.bf16) { /* the caller asked mt_cpu_gemm_bf16: the buffers were not had */
        fprintf(stderr, "moetrain: out of memory for the CPU GEMM's packing buffers\n");
        abort();
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, (const float *)A.p + a0,
                lda, (const float *)B.p + b0, ldb, beta, C, ldc);
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
                      float alpha, struct mt_cpu_opnd A, int lda, struct mt_cpu_opnd B, int ldb,
                      float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (i == 0) gemm_scale(M, N, beta, C, ldc);
        return;
    }
    int lo, hi;
    if (mt_cpu_gemm_range(i, parts, M, N, &lo, &hi)) { /* rows lo..hi of op(A) and C */
        gemm_call(trans_a, trans_b, hi - lo, N, K, alpha, A,
                  trans_a ? (size_t)lo : (size_t)lo * lda, lda, B, 0, ldb, beta,
                  C + (size_t)lo * ldc, ldc);
    } else { /* columns lo..hi of op(B) and C */
        gemm_call(trans_a, trans_b, M, hi - lo, K, alpha, A, 0, lda, B,
                  trans_b ? (size_t)lo * ldb : (size_t)lo, ldb, beta, C + lo, ldc);
    }
}

static struct mt_cpu_opnd f32(const float *p) { return (struct mt_cpu_opnd){p, false}; }

/* x from its element i on */
static struct mt_cpu_opnd opnd_at(struct mt_cpu_opnd x, size_t i)
{
    x.p = (const char *)x.p + mt_cpu_opnd_size(x) * i;
    return x;
}

void mt_cpu_gemm(void *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    (void)ctx;
    const int parts = omp_in_parallel() ? 1 : mt_cpu_gemm_parts(M, N, K, omp_get_max_threads());
    if (parts == 1) {
        mt_cpu_gemm_part(0, 1, trans_a, trans_b, M, N, K, alpha, f32(A), lda, f32(B), ldb, beta,
                         C, ldc);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(parts)
    for (int i = 0; i < parts; i++)
        mt_cpu_gemm_part(i, parts, trans_a, trans_b, M, N, K, alpha, f32(A), lda, f32(B), ldb,
                         beta, C, ldc);
}

/* Rows [lo, hi) of group g's C: its token rows (C (m,N) = A_g op(B_g)), or for a
 * weight gradient (trans_a) rows of C_g (M,N) = A_g^T B_g, the group's token rows the
 * reduction, whole in every call. */
static void group_rows(bool trans_a, bool trans_b, const int32_t *offsets, int g, int lo,
                       int hi, int M, int N, int K, float alpha, struct mt_cpu_opnd A,
                       struct mt_cpu_opnd B, float beta, float *C)
{
    const int r0 = offsets[g], m = offsets[g + 1] - offsets[g];
    if (!trans_a) {
        mt_cpu_gemm_part(0, 1, false, trans_b, hi - lo, N, K, alpha,
                         opnd_at(A, (size_t)(r0 + lo) * K), K, opnd_at(B, (size_t)g * N * K),
                         trans_b ? K : N, beta, C + (size_t)(r0 + lo) * N, N);
    } else {
        mt_cpu_gemm_part(0, 1, true, false, hi - lo, N, m, alpha,
                         opnd_at(A, (size_t)r0 * M + lo), M, opnd_at(B, (size_t)r0 * N), N,
                         beta, C + ((size_t)g * M + lo) * N, N);
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
                                struct mt_cpu_opnd A, struct mt_cpu_opnd B, float beta, float *C)
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
                                   f32(A), f32(B), beta, C);
        return;
    }
    /* one region for all groups: they write disjoint slices of C */
#pragma omp parallel num_threads(threads)
    mt_cpu_grouped_gemm_thread(omp_get_thread_num(), omp_get_num_threads(), trans_a, trans_b,
                               num_groups, offsets, M, N, K, alpha, f32(A), f32(B), beta, C);
}

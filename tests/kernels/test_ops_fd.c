/* Every op's backward against central finite differences (tests/kernels/fd.h), on
 * small random shapes that are never square or symmetric, so a transposed or
 * mis-strided gradient cannot pass by accident.
 *
 * Error bounds (norm-based relative error, see fd.h). The forward runs in fp32 and the
 * loss is summed in double, so a central difference with step h carries
 *   roundoff   ~ eps32 * |L| / h   (eps32 = 6e-8; |L| = O(1..10) here)
 *   truncation ~ h^2 * |L'''| / 6.
 * Ops linear in the checked input (gemm, grouped_gemm, embedding, rope, permute,
 * unpermute) have no truncation error: h = 1e-2 gives ~1e-5, bound 1e-3.
 * Smooth nonlinear ops (rmsnorm, attention, swiglu, router, losses) use h = 1e-3:
 * roundoff ~1e-4 relative and truncation ~1e-6, bound 5e-3. The balancing and z
 * losses return a single fp32 scalar of O(0.1) with small gradients, so their roundoff
 * is relatively larger: h = 1e-2 (truncation ~1e-4), same bound. A wrong sign, a
 * missing term or a transposition gives errors of order 1. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <omp.h>

#include "kernels/kernels.h"
#include "tests/kernels/fd.h"

#define TOL_LINEAR 1e-3
#define TOL_SMOOTH 5e-3
#define H_LINEAR 1e-2f
#define H_SMOOTH 1e-3f
#define H_LOSS 1e-2f
#define SAMPLES 60

static const struct mt_kernels *K;
static struct mt_kernel_ops O;

/* fp32 views for the typed arguments */
static struct mt_tensor T(const float *p, int64_t rows, int64_t cols) { return mt_f32(p, rows, cols); }
static struct mt_tensor TL(const float *p, int64_t rows, int64_t cols, int64_t ld)
{
    return mt_tview_ld(p, MT_F32, rows, cols, ld);
}

static float *fnew(size_t n, float scale, uint64_t stream)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    assert_non_null(p);
    if (scale != 0.0f) fd_randn(p, n, scale, stream);
    return p;
}

static void check(const char *what, fd_loss_fn f, void *st, float *x, const float *g, size_t n,
                  float h, double tol)
{
    int checked = 0;
    double err = fd_rel_error(f, st, x, g, n, h, SAMPLES, &checked);
    printf("# %-40s rel err %.2e over %d elements (bound %.0e)\n", what, err, checked, tol);
    assert_true(checked > 0);
    assert_true(err < tol);
}

/* ------------------------------------------------------------------ gemm */
struct gemm_st {
    bool ta, tb;
    int M, N, K;
    float *A, *B, *C, *W, alpha, beta, *C0;
};

static double gemm_loss(void *p)
{
    struct gemm_st *s = p;
    memcpy(s->C, s->C0, sizeof(float) * (size_t)s->M * s->N);
    O.gemm(K->ctx, s->ta, s->tb, s->M, s->N, s->K, s->alpha,
           s->ta ? T(s->A, s->K, s->M) : T(s->A, s->M, s->K),
           s->tb ? T(s->B, s->N, s->K) : T(s->B, s->K, s->N), s->beta, T(s->C, s->M, s->N));
    return fd_dot(s->W, s->C, (size_t)s->M * s->N);
}

static void test_gemm(void **state)
{
    (void)state;
    for (int mode = 0; mode < 4; mode++) {
        struct gemm_st s = {.ta = mode & 1, .tb = mode & 2, .M = 5, .N = 7, .K = 3,
                            .alpha = 0.7f, .beta = 0.3f};
        s.A = fnew(15, 1, 1);
        s.B = fnew(21, 1, 2);
        s.C0 = fnew(35, 1, 3);
        s.C = fnew(35, 0, 0);
        s.W = fnew(35, 1, 4);
        /* backward of C = alpha op(A) op(B): dop(A) = alpha dC op(B)^T, dop(B) = alpha op(A)^T dC,
         * written with gemm itself in the layout A and B are stored in */
        float *dA = fnew(15, 0, 0), *dB = fnew(21, 0, 0);
        if (!s.ta) /* A (M,K): dA = dC op(B)^T */
            O.gemm(K->ctx, false, !s.tb, 5, 3, 7, s.alpha, T(s.W, 5, 7),
                   s.tb ? TL(s.B, 7, 3, 3) : T(s.B, 3, 7), 0, T(dA, 5, 3));
        else /* A (K,M): dA = op(B) dC^T */
            O.gemm(K->ctx, s.tb, true, 3, 5, 7, s.alpha, s.tb ? T(s.B, 7, 3) : T(s.B, 3, 7),
                   T(s.W, 5, 7), 0, T(dA, 3, 5));
        if (!s.tb) /* B (K,N): dB = op(A)^T dC */
            O.gemm(K->ctx, !s.ta, false, 3, 7, 5, s.alpha, s.ta ? T(s.A, 3, 5) : T(s.A, 5, 3),
                   T(s.W, 5, 7), 0, T(dB, 3, 7));
        else /* B (N,K): dB = dC^T op(A) */
            O.gemm(K->ctx, true, s.ta, 7, 3, 5, s.alpha, T(s.W, 5, 7),
                   s.ta ? T(s.A, 3, 5) : T(s.A, 5, 3), 0, T(dB, 7, 3));
        check("gemm dA", gemm_loss, &s, s.A, dA, 15, H_LINEAR, TOL_LINEAR);
        check("gemm dB", gemm_loss, &s, s.B, dB, 21, H_LINEAR, TOL_LINEAR);
        /* dC_in = beta W */
        float *dC0 = fnew(35, 0, 0);
        for (int i = 0; i < 35; i++) dC0[i] = s.beta * s.W[i];
        check("gemm dC(beta)", gemm_loss, &s, s.C0, dC0, 35, H_LINEAR, TOL_LINEAR);
        free(s.A); free(s.B); free(s.C0); free(s.C); free(s.W); free(dA); free(dB); free(dC0);
    }
}

/* gemm's values against a double-precision product, on shapes around the blocking of
 * the x86-64-v4 build's own kernel (a 12 x 32 register tile, K in blocks of 256, N in
 * blocks of 2048) and of any BLAS: edges of one row or column, K = 1 and K past two
 * blocks, N past one block; both transposes; strided operands (leading dimensions
 * larger than the rows, the padding poisoned with NaN and C's left as it was); alpha
 * and beta of 1 and not; beta = 0 on a C of NaN (BLAS semantics: C is not read). With
 * moetrain's own kernel, 1, 2 and 3 threads (the larger shapes split C in row or column
 * blocks) give the same bits; through a BLAS they need not (OpenBLAS takes another
 * path for a part than for the whole at some sizes), which is only reported.
 * The bound is fp32 rounding of a K-term sum: 2 K eps32 sum |a b|, plus |beta C| eps32. */
static void test_gemm_values(void **state)
{
    (void)state;
    static const int shapes[][3] = {{1, 1, 1},   {13, 33, 17},  {12, 32, 256}, {25, 70, 257},
                                    {97, 31, 300}, {200, 65, 513}, {5, 2100, 40}, {130, 40, 5},
                                    {300, 96, 64}};
    static const float ab[][2] = {{1.0f, 0.0f}, {0.75f, 1.0f}, {1.0f, -0.5f}};
    const int saved = omp_get_max_threads();
    const int pad = 3;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int mode = 0; mode < 4; mode++)
            for (size_t c = 0; c < sizeof ab / sizeof ab[0]; c++) {
                const int M = shapes[sh][0], N = shapes[sh][1], Kd = shapes[sh][2];
                const bool ta = mode & 1, tb = mode & 2;
                const float alpha = ab[c][0], beta = ab[c][1];
                /* stored A: (K, M) when ta else (M, K); B: (N, K) when tb else (K, N) */
                const int ar = ta ? Kd : M, ac = ta ? M : Kd, br = tb ? N : Kd, bc = tb ? Kd : N;
                const int lda = ac + pad, ldb = bc + pad, ldc = N + pad;
                float *A = fnew((size_t)ar * lda, 1, 40 + sh);
                float *B = fnew((size_t)br * ldb, 1, 50 + sh);
                float *C0 = fnew((size_t)M * ldc, 1, 60 + sh);
                for (int i = 0; i < ar; i++)
                    for (int j = ac; j < lda; j++) A[(size_t)i * lda + j] = NAN;
                for (int i = 0; i < br; i++)
                    for (int j = bc; j < ldb; j++) B[(size_t)i * ldb + j] = NAN;
                if (beta == 0.0f)
                    for (size_t i = 0; i < (size_t)M * ldc; i++) C0[i] = NAN;
                float *C[3];
                for (int t = 0; t < 3; t++) {
                    C[t] = fnew((size_t)M * ldc, 0, 0);
                    memcpy(C[t], C0, sizeof(float) * (size_t)M * ldc);
                    omp_set_num_threads(t + 1);
                    O.gemm(K->ctx, ta, tb, M, N, Kd, alpha, TL(A, ar, ac, lda), TL(B, br, bc, ldb),
                           beta, TL(C[t], M, N, ldc));
                }
                omp_set_num_threads(saved);
                double worst = 0;
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        double ref = 0, mag = 0;
                        for (int k = 0; k < Kd; k++) {
                            const double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                            const double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                            ref += a * b;
                            mag += fabs(a * b);
                        }
                        const double c0 = beta == 0.0f ? 0.0 : C0[(size_t)i * ldc + j];
                        ref = alpha * ref + beta * c0;
                        const double bound = 2.0 * Kd * 6e-8 * fabs(alpha) * mag +
                                             6e-8 * fabs(beta * c0) + 1e-30;
                        const double e = fabs(C[0][(size_t)i * ldc + j] - ref) / bound;
                        if (!(e <= worst)) worst = e; /* NaN included */
                    }
                if (!(worst <= 1.0))
                    printf("# gemm M=%d N=%d K=%d ta=%d tb=%d alpha=%g beta=%g: error %.2f of "
                           "the bound\n", M, N, Kd, ta, tb, alpha, beta, worst);
                assert_true(worst <= 1.0);
                for (int i = 0; i < M; i++) /* C's padding as it was */
                    assert_true(memcmp(C[0] + (size_t)i * ldc + N, C0 + (size_t)i * ldc + N,
                                       sizeof(float) * pad) == 0);
                for (int t = 1; t < 3; t++)
                    if (memcmp(C[0], C[t], sizeof(float) * (size_t)M * ldc) != 0) {
                        printf("# gemm M=%d N=%d K=%d ta=%d tb=%d alpha=%g beta=%g: %d threads "
                               "differ from one (%s)\n", M, N, Kd, ta, tb, alpha, beta, t + 1,
                               mt_cpu_gemm_kernel());
                        assert_true(strcmp(mt_cpu_gemm_kernel(), "BLAS") == 0);
                    }
                for (int t = 0; t < 3; t++) free(C[t]);
                free(A);
                free(B);
                free(C0);
            }
}

/* n values of x made bf16 (their top 16 bits) into h, and the same values into x */
static void to_bf16(uint16_t *h, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        h[i] = (uint16_t)(u >> 16);
        u = (uint32_t)h[i] << 16;
        memcpy(&x[i], &u, sizeof u);
    }
}

/* bf16 operands give the bits their fp32 values give (bf16 widens exactly, whether the
 * GEMM kernel reads bf16 as it packs or the operands are widened first): gemm with A, B
 * or both bf16, strided (ld past the columns), both transposes, and grouped_gemm with a
 * bf16 weight (forward) and bf16 activations (weight gradient). */
static void test_gemm_bf16_operands(void **state)
{
    (void)state;
    static const int shapes[][3] = {{13, 33, 17}, {25, 70, 257}, {200, 65, 513}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int mode = 0; mode < 4; mode++)
            for (int which = 1; which < 4; which++) { /* 1: A bf16, 2: B, 3: both */
                const int M = shapes[sh][0], N = shapes[sh][1], Kd = shapes[sh][2];
                const bool ta = mode & 1, tb = mode & 2;
                const int ar = ta ? Kd : M, ac = ta ? M : Kd, br = tb ? N : Kd, bc = tb ? Kd : N;
                const int lda = ac + 5, ldb = bc + 3;
                float *A = fnew((size_t)ar * lda, 1, 70 + sh);
                float *B = fnew((size_t)br * ldb, 1, 80 + sh);
                uint16_t *Ah = calloc((size_t)ar * lda, 2), *Bh = calloc((size_t)br * ldb, 2);
                assert_non_null(Ah);
                assert_non_null(Bh);
                to_bf16(Ah, A, (size_t)ar * lda);
                to_bf16(Bh, B, (size_t)br * ldb);
                float *C32 = fnew((size_t)M * N, 0, 0), *C16 = fnew((size_t)M * N, 0, 0);
                O.gemm(K->ctx, ta, tb, M, N, Kd, 0.5f, TL(A, ar, ac, lda), TL(B, br, bc, ldb), 0.0f,
                       T(C32, M, N));
                const struct mt_tensor a16 = mt_tview_ld(Ah, MT_BF16, ar, ac, lda);
                const struct mt_tensor b16 = mt_tview_ld(Bh, MT_BF16, br, bc, ldb);
                O.gemm(K->ctx, ta, tb, M, N, Kd, 0.5f, which & 1 ? a16 : TL(A, ar, ac, lda),
                       which & 2 ? b16 : TL(B, br, bc, ldb), 0.0f, T(C16, M, N));
                assert_true(memcmp(C32, C16, sizeof(float) * (size_t)M * N) == 0);
                free(A), free(B), free(Ah), free(Bh), free(C32), free(C16);
            }
    enum { G = 5, GN = 48, GK = 300 };
    const int32_t off[G + 1] = {0, 70, 70, 150, 301, 320};
    const int rows = off[G];
    float *X = fnew((size_t)rows * GK, 1, 90), *W = fnew((size_t)G * GN * GK, 1, 91);
    uint16_t *Xh = calloc((size_t)rows * GK, 2), *Wh = calloc((size_t)G * GN * GK, 2);
    assert_non_null(Xh);
    assert_non_null(Wh);
    to_bf16(Xh, X, (size_t)rows * GK);
    to_bf16(Wh, W, (size_t)G * GN * GK);
    float *Y32 = fnew((size_t)rows * GN, 0, 0), *Y16 = fnew((size_t)rows * GN, 0, 0);
    O.grouped_gemm(K->ctx, false, true, G, off, 0, GN, GK, 1.0f, T(X, rows, GK),
                   T(W, (int64_t)G * GN, GK), 0.0f, T(Y32, rows, GN));
    O.grouped_gemm(K->ctx, false, true, G, off, 0, GN, GK, 1.0f, T(X, rows, GK),
                   mt_tview(Wh, MT_BF16, (int64_t)G * GN, GK), 0.0f, T(Y16, rows, GN));
    assert_true(memcmp(Y32, Y16, sizeof(float) * (size_t)rows * GN) == 0);
    float *D32 = fnew((size_t)G * GN * GK, 1, 92), *D16 = fnew((size_t)G * GN * GK, 0, 0);
    memcpy(D16, D32, sizeof(float) * (size_t)G * GN * GK);
    O.grouped_gemm(K->ctx, true, false, G, off, GN, GK, 0, 1.0f, T(Y32, rows, GN), T(X, rows, GK),
                   1.0f, T(D32, (int64_t)G * GN, GK));
    O.grouped_gemm(K->ctx, true, false, G, off, GN, GK, 0, 1.0f, T(Y32, rows, GN),
                   mt_tview(Xh, MT_BF16, rows, GK), 1.0f, T(D16, (int64_t)G * GN, GK));
    assert_true(memcmp(D32, D16, sizeof(float) * (size_t)G * GN * GK) == 0);
    free(X), free(W), free(Xh), free(Wh), free(Y32), free(Y16), free(D32), free(D16);
}

/* ---------------------------------------------------------- grouped gemm */
struct gg_st {
    int G, N, K, rows;
    int32_t off[5];
    float *X, *Wt, *Y, *Wo;
};

static double gg_loss(void *p)
{
    struct gg_st *s = p;
    O.grouped_gemm(K->ctx, false, true, s->G, s->off, 0, s->N, s->K, 1.0f, T(s->X, s->rows, s->K),
                   T(s->Wt, (int64_t)s->G * s->N, s->K), 0.0f, T(s->Y, s->rows, s->N));
    return fd_dot(s->Wo, s->Y, (size_t)s->rows * s->N);
}

static void test_grouped_gemm(void **state)
{
    (void)state;
    /* 4 experts with 3, 0, 5, 1 rows (one empty group); slabs (N,K) = (6,4) */
    struct gg_st s = {.G = 4, .N = 6, .K = 4, .rows = 9, .off = {0, 3, 3, 8, 9}};
    s.X = fnew(9 * 4, 1, 10);
    s.Wt = fnew(4 * 6 * 4, 1, 11);
    s.Y = fnew(9 * 6, 0, 0);
    s.Wo = fnew(9 * 6, 1, 12);
    float *dX = fnew(9 * 4, 0, 0), *dW = fnew(4 * 6 * 4, 1, 13), *dW0 = fnew(4 * 6 * 4, 0, 0);
    memcpy(dW0, dW, sizeof(float) * 96);
    /* dgrad: dX_g (m,K) = dY_g (m,N) W_g (N,K) */
    O.grouped_gemm(K->ctx, false, false, s.G, s.off, 0, s.K, s.N, 1.0f, T(s.Wo, s.rows, s.N),
                   T(s.Wt, (int64_t)s.G * s.N, s.K), 0.0f, T(dX, s.rows, s.K));
    /* wgrad accumulates: dW_g (N,K) += dY_g^T X_g */
    O.grouped_gemm(K->ctx, true, false, s.G, s.off, s.N, s.K, 0, 1.0f, T(s.Wo, s.rows, s.N),
                   T(s.X, s.rows, s.K), 1.0f, T(dW, (int64_t)s.G * s.N, s.K));
    for (int i = 0; i < 96; i++) dW[i] -= dW0[i];
    /* the empty expert's slab got no gradient and kept its accumulator */
    for (int i = 24; i < 48; i++) assert_true(dW[i] == 0.0f);
    check("grouped_gemm dX", gg_loss, &s, s.X, dX, 36, H_LINEAR, TOL_LINEAR);
    check("grouped_gemm dW", gg_loss, &s, s.Wt, dW, 96, H_LINEAR, TOL_LINEAR);
    free(s.X); free(s.Wt); free(s.Y); free(s.Wo); free(dX); free(dW); free(dW0);
}

/* Expert-sized groups (one empty) on 1, 2 and 3 threads: the same bits, forward and
 * weight gradient (more threads cut some groups in row blocks, each block one call with
 * the whole reduction, as one thread computes those rows), with moetrain's GEMM kernel;
 * through a BLAS, which need not give a block the bits it gives the whole
 * (test_gemm_values), a difference is reported. */
static void test_grouped_gemm_threads(void **state)
{
    (void)state;
    enum { G = 8, N = 192, Kd = 160, TEAMS = 3 };
    const int32_t off[G + 1] = {0, 200, 380, 640, 640, 860, 1100, 1290, 1500};
    const int rows = off[G];
    float *X = fnew((size_t)rows * Kd, 1, 30), *W = fnew((size_t)G * N * Kd, 1, 31);
    float *Y[TEAMS], *dW[TEAMS];
    const int saved = omp_get_max_threads();
    for (int t = 0; t < TEAMS; t++) {
        omp_set_num_threads(t + 1);
        Y[t] = fnew((size_t)rows * N, 0, 0);
        dW[t] = fnew((size_t)G * N * Kd, 1, 32);
        O.grouped_gemm(K->ctx, false, true, G, off, 0, N, Kd, 1.0f, T(X, rows, Kd),
                       T(W, (int64_t)G * N, Kd), 0.0f, T(Y[t], rows, N));
        O.grouped_gemm(K->ctx, true, false, G, off, N, Kd, 0, 1.0f, T(Y[t], rows, N),
                       T(X, rows, Kd), 1.0f, T(dW[t], (int64_t)G * N, Kd));
    }
    omp_set_num_threads(saved);
    for (int t = 1; t < TEAMS; t++)
        if (memcmp(Y[0], Y[t], sizeof(float) * (size_t)rows * N) != 0 ||
            memcmp(dW[0], dW[t], sizeof(float) * (size_t)G * N * Kd) != 0) {
            printf("# grouped gemm: %d threads differ from one (%s)\n", t + 1,
                   mt_cpu_gemm_kernel());
            assert_true(strcmp(mt_cpu_gemm_kernel(), "BLAS") == 0);
        }
    for (int t = 0; t < TEAMS; t++) {
        free(Y[t]);
        free(dW[t]);
    }
    free(X);
    free(W);
}

/* ------------------------------------------------------------- embedding */
struct emb_st {
    int N, C;
    int32_t tok[7];
    float *wte, *out, *w;
};

static double emb_loss(void *p)
{
    struct emb_st *s = p;
    O.embedding_fwd(K->ctx, T(s->out, s->N, s->C), s->tok, T(s->wte, 9, s->C), s->N, s->C);
    return fd_dot(s->w, s->out, (size_t)s->N * s->C);
}

static void test_embedding(void **state)
{
    (void)state;
    /* -1: a token of another vocabulary shard (zero row, no gradient) */
    struct emb_st s = {.N = 7, .C = 5, .tok = {3, 0, -1, 8, 1, 3, 0}};
    s.wte = fnew(9 * 5, 1, 20);
    s.out = fnew(35, 1, 22);
    s.w = fnew(35, 1, 21);
    float *dwte = fnew(45, 0, 0);
    O.embedding_bwd(K->ctx, dwte, s.w, s.tok, s.N, s.C);
    check("embedding dwte", emb_loss, &s, s.wte, dwte, 45, H_LINEAR, TOL_LINEAR);
    for (int c = 0; c < 5; c++) assert_true(s.out[2 * 5 + c] == 0.0f);
    free(s.wte); free(s.out); free(s.w); free(dwte);
}

/* --------------------------------------------------------------- rmsnorm */
struct rms_st {
    int N, C;
    float *x, *wt, *out, *rstd, *w;
};

static double rms_loss(void *p)
{
    struct rms_st *s = p;
    O.rmsnorm_fwd(K->ctx, T(s->out, s->N, s->C), s->rstd, T(s->x, s->N, s->C), T(s->wt, 1, s->C),
                  s->N, s->C, 1e-6f);
    return fd_dot(s->w, s->out, (size_t)s->N * s->C);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    int shapes[][2] = {{6, 5}, {3, 16}};
    for (int i = 0; i < 2; i++) {
        struct rms_st s = {.N = shapes[i][0], .C = shapes[i][1]};
        size_t n = (size_t)s.N * s.C;
        s.x = fnew(n, 1, 30);
        s.wt = fnew((size_t)s.C, 0.5f, 31);
        for (int c = 0; c < s.C; c++) s.wt[c] += 1.0f;
        s.out = fnew(n, 0, 0);
        s.rstd = fnew((size_t)s.N, 0, 0);
        s.w = fnew(n, 1, 32);
        float *dx = fnew(n, 0, 0), *dw = fnew((size_t)s.C, 0, 0);
        rms_loss(&s);
        O.rmsnorm_bwd(K->ctx, dx, dw, s.w, T(s.x, s.N, s.C), T(s.wt, 1, s.C), s.rstd, s.N, s.C);
        check("rmsnorm dx", rms_loss, &s, s.x, dx, n, H_SMOOTH, TOL_SMOOTH);
        check("rmsnorm dw", rms_loss, &s, s.wt, dw, (size_t)s.C, H_SMOOTH, TOL_SMOOTH);
        free(s.x); free(s.wt); free(s.out); free(s.rstd); free(s.w); free(dx); free(dw);
    }
}

/* ------------------------------------------------------------------ rope */
struct rope_st {
    int B, T, H, D;
    float *x, *out, *w;
};

static double rope_loss(void *p)
{
    struct rope_st *s = p;
    const int64_t rows = (int64_t)s->B * s->T, cols = (int64_t)s->H * s->D;
    O.rope_fwd(K->ctx, T(s->out, rows, cols), T(s->x, rows, cols), s->B, s->T, s->H, s->D, 100.0f);
    return fd_dot(s->w, s->out, (size_t)s->B * s->T * s->H * s->D);
}

static void test_rope(void **state)
{
    (void)state;
    struct rope_st s = {.B = 2, .T = 5, .H = 3, .D = 6};
    size_t n = 2 * 5 * 3 * 6;
    s.x = fnew(n, 1, 40);
    s.out = fnew(n, 0, 0);
    s.w = fnew(n, 1, 41);
    float *dx = fnew(n, 0, 0);
    memcpy(dx, s.w, sizeof(float) * n);
    O.rope_bwd(K->ctx, dx, dx, s.B, s.T, s.H, s.D, 100.0f); /* in place, as documented */
    check("rope dx", rope_loss, &s, s.x, dx, n, H_LINEAR, TOL_LINEAR);
    /* position 0 is the identity; rotate-half pairs element i with i + D/2 */
    rope_loss(&s);
    for (int i = 0; i < 18; i++) assert_true(s.out[i] == s.x[i]);
    float xt[6] = {1, 0, 0, 0, 0, 0}, ot[6];
    float *big = fnew(2 * 6, 0, 0);
    memcpy(big + 6, xt, sizeof xt); /* T = 2, position 1 */
    O.rope_fwd(K->ctx, T(big, 2, 6), T(big, 2, 6), 1, 2, 1, 6, 100.0f);
    memcpy(ot, big + 6, sizeof ot);
    assert_true(fabsf(ot[0] - cosf(1.0f)) < 1e-6f && fabsf(ot[3] - sinf(1.0f)) < 1e-6f);
    free(s.x); free(s.out); free(s.w); free(dx); free(big);
}

/* ------------------------------------------------------------- attention */
struct att_st {
    int B, T, Hq, Hkv, D;
    float *q, *k, *v, *out, *lse, *w;
};

static double att_loss(void *p)
{
    struct att_st *s = p;
    const int64_t N = (int64_t)s->B * s->T;
    O.attention_fwd(K->ctx, s->out, s->lse, T(s->q, N, (int64_t)s->Hq * s->D),
                    T(s->k, N, (int64_t)s->Hkv * s->D), T(s->v, N, (int64_t)s->Hkv * s->D), s->B,
                    s->T, s->Hq, s->Hkv, s->D);
    return fd_dot(s->w, s->out, (size_t)s->B * s->T * s->Hq * s->D);
}

/* lse (B,Hq,T) against the logsumexp of the scaled causal scores, in double */
static void check_attention_lse(const struct att_st *s)
{
    const int rep = s->Hq / s->Hkv;
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->Hq; h++)
            for (int t = 0; t < s->T; t++) {
                const float *qt = s->q + (((size_t)b * s->T + t) * s->Hq + h) * s->D;
                double sum = 0.0;
                for (int u = 0; u <= t; u++) {
                    const float *ku = s->k + (((size_t)b * s->T + u) * s->Hkv + h / rep) * s->D;
                    double dot = 0.0;
                    for (int d = 0; d < s->D; d++) dot += (double)qt[d] * ku[d];
                    sum += exp(dot / sqrt((double)s->D));
                }
                double got = s->lse[((size_t)b * s->Hq + h) * s->T + t];
                assert_true(fabs(got - log(sum)) < 1e-5 * (1.0 + fabs(log(sum))));
            }
}

static void test_attention(void **state)
{
    (void)state;
    /* GQA with 2 groups of 2, head_dim 3; MQA (3 heads, 1 group) with D 4; MHA */
    int shapes[][5] = {{2, 5, 4, 2, 3}, {1, 4, 3, 1, 4}, {2, 3, 2, 2, 5}};
    for (int i = 0; i < 3; i++) {
        struct att_st s = {shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4],
                           0, 0, 0, 0, 0, 0};
        size_t nq = (size_t)s.B * s.T * s.Hq * s.D, nk = (size_t)s.B * s.T * s.Hkv * s.D;
        s.q = fnew(nq, 1, 50);
        s.k = fnew(nk, 1, 51);
        s.v = fnew(nk, 1, 52);
        s.out = fnew(nq, 0, 0);
        s.lse = fnew((size_t)s.B * s.Hq * s.T, 0, 0);
        s.w = fnew(nq, 1, 53);
        float *dq = fnew(nq, 1, 0), *dk = fnew(nk, 1, 0), *dv = fnew(nk, 1, 0);
        att_loss(&s); /* out and lse at the unperturbed point, for the backward */
        const int64_t N = (int64_t)s.B * s.T;
        O.attention_bwd(K->ctx, dq, dk, dv, s.w, T(s.q, N, (int64_t)s.Hq * s.D),
                        T(s.k, N, (int64_t)s.Hkv * s.D), T(s.v, N, (int64_t)s.Hkv * s.D), s.out,
                        s.lse, s.B, s.T, s.Hq, s.Hkv, s.D);
        check("attention dq", att_loss, &s, s.q, dq, nq, H_SMOOTH, TOL_SMOOTH);
        check("attention dk", att_loss, &s, s.k, dk, nk, H_SMOOTH, TOL_SMOOTH);
        check("attention dv", att_loss, &s, s.v, dv, nk, H_SMOOTH, TOL_SMOOTH);
        /* causal: the first query sees only the first key, so out = v[0] of its group */
        att_loss(&s);
        for (int d = 0; d < s.D; d++) assert_true(fabsf(s.out[d] - s.v[d]) < 1e-6f);
        check_attention_lse(&s);
        free(s.q); free(s.k); free(s.v); free(s.out); free(s.lse); free(s.w);
        free(dq); free(dk); free(dv);
    }
}

/* ---------------------------------------------------------------- swiglu */
struct swi_st {
    int N, F;
    float *g, *u, *out, *w;
};

static double swi_loss(void *p)
{
    struct swi_st *s = p;
    O.swiglu_fwd(K->ctx, T(s->out, s->N, s->F), T(s->g, s->N, s->F), T(s->u, s->N, s->F), s->N,
                 s->F);
    return fd_dot(s->w, s->out, (size_t)s->N * s->F);
}

static void test_swiglu(void **state)
{
    (void)state;
    struct swi_st s = {.N = 4, .F = 7};
    s.g = fnew(28, 2, 60);
    s.u = fnew(28, 1, 61);
    s.out = fnew(28, 0, 0);
    s.w = fnew(28, 1, 62);
    float *dg = fnew(28, 0, 0), *du = fnew(28, 0, 0);
    O.swiglu_bwd(K->ctx, dg, du, s.w, T(s.g, s.N, s.F), T(s.u, s.N, s.F), s.N, s.F);
    check("swiglu dgate", swi_loss, &s, s.g, dg, 28, H_SMOOTH, TOL_SMOOTH);
    check("swiglu dup", swi_loss, &s, s.u, du, 28, H_SMOOTH, TOL_SMOOTH);
    free(s.g); free(s.u); free(s.out); free(s.w); free(dg); free(du);
}

/* ---------------------------------------------------------------- router */
struct router_st {
    struct mt_router_args a;
    float *logits, *bias, *prob, *w;
    int32_t *idx, *idx0;
};

static double router_loss(void *p)
{
    struct router_st *s = p;
    size_t nk = (size_t)s->a.num_tokens * s->a.topk;
    O.router_fwd(K->ctx, &s->a, s->logits, s->bias, s->idx, s->prob);
    if (memcmp(s->idx, s->idx0, sizeof(int32_t) * nk) != 0) fd_unstable = 1;
    return fd_dot(s->w, s->prob, nk);
}

static void test_router(void **state)
{
    (void)state;
    struct { enum mt_score_fn fn; bool pre; int k; float sf; bool bias; } cases[] = {
        {MT_SCORE_SOFTMAX, true, 2, 0.0f, false},
        {MT_SCORE_SOFTMAX, false, 3, 2.5f, false},
        {MT_SCORE_SOFTMAX, true, 1, 1.0f, false},
        {MT_SCORE_SIGMOID, false, 2, 0.0f, true},
        {MT_SCORE_SIGMOID, false, 1, 1.5f, true},
        {MT_SCORE_SIGMOID, false, 3, 0.0f, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int N = 6, E = 5, k = cases[c].k;
        struct router_st s = {.a = {N, E, k, cases[c].fn, cases[c].pre, cases[c].sf}};
        s.logits = fnew((size_t)N * E, 1.5f, 70 + c);
        s.bias = cases[c].bias ? fnew((size_t)E, 0.3f, 80) : NULL;
        s.prob = fnew((size_t)N * k, 0, 0);
        s.w = fnew((size_t)N * k, 1, 81);
        s.idx = calloc((size_t)N * k, sizeof(int32_t));
        s.idx0 = calloc((size_t)N * k, sizeof(int32_t));
        O.router_fwd(K->ctx, &s.a, s.logits, s.bias, s.idx0, s.prob);
        /* selection is by score (+ bias), best first */
        for (int n = 0; n < N; n++)
            for (int j = 1; j < k; j++) {
                const float *l = s.logits + n * E;
                int a0 = s.idx0[n * k + j - 1], a1 = s.idx0[n * k + j];
                float b0 = s.bias ? s.bias[a0] : 0, b1 = s.bias ? s.bias[a1] : 0;
                float k0 = cases[c].fn == MT_SCORE_SIGMOID ? 1 / (1 + expf(-l[a0])) + b0 : l[a0];
                float k1 = cases[c].fn == MT_SCORE_SIGMOID ? 1 / (1 + expf(-l[a1])) + b1 : l[a1];
                assert_true(k0 >= k1);
            }
        float *dl = fnew((size_t)N * E, 0, 0);
        O.router_bwd(K->ctx, &s.a, dl, s.w, s.logits, s.idx0);
        char name[64];
        snprintf(name, sizeof name, "router case %zu dlogits", c);
        check(name, router_loss, &s, s.logits, dl, (size_t)N * E, H_SMOOTH, TOL_SMOOTH);
        free(s.logits); free(s.bias); free(s.prob); free(s.w); free(s.idx); free(s.idx0); free(dl);
    }
}

/* ------------------------------------------------------- aux and z losses */
/* The ops add their loss to an accumulator; from 0, it holds the loss. */
static float aux_fwd(const struct mt_aux_args *a, const float *counts, const float *logits)
{
    double acc = 0.0;
    O.aux_loss_fwd(K->ctx, a, &acc, counts, logits);
    return (float)acc;
}

struct aux_st {
    struct mt_aux_args a;
    float *logits, *counts, *counts0;
};

static double aux_loss(void *p)
{
    struct aux_st *s = p;
    O.aux_counts(K->ctx, &s->a, s->counts, s->logits);
    float loss = aux_fwd(&s->a, s->counts0, s->logits);
    if (memcmp(s->counts, s->counts0, sizeof(float) * (size_t)s->a.num_seqs * s->a.num_experts))
        fd_unstable = 1;
    return loss;
}

static void test_aux_loss(void **state)
{
    (void)state;
    for (int c = 0; c < 4; c++) {
        const int nseq = c & 1 ? 2 : 1;
        struct aux_st s = {.a = {.num_tokens = 8, .num_experts = 6, .topk = 2,
                                 .score_fn = c & 2 ? MT_SCORE_SIGMOID : MT_SCORE_SOFTMAX,
                                 .num_seqs = nseq, .seq_len = 8 / nseq, .first = 0,
                                 .coeff = 0.3f}};
        s.logits = fnew(48, 1.5f, 90 + c);
        s.counts = fnew((size_t)nseq * 6, 0, 0);
        s.counts0 = fnew((size_t)nseq * 6, 0, 0);
        O.aux_counts(K->ctx, &s.a, s.counts0, s.logits);
        /* every token picks k experts in its sequence */
        for (int q = 0; q < nseq; q++) {
            float tot = 0;
            for (int e = 0; e < 6; e++) tot += s.counts0[q * 6 + e];
            assert_true(tot == (float)(8 / nseq * 2));
        }
        float *dl = fnew(48, 0, 0);
        O.aux_loss_bwd(K->ctx, &s.a, dl, 1.0f, s.counts0, s.logits);
        char name[64];
        snprintf(name, sizeof name, "aux_loss %s seqs=%d", c & 2 ? "sigmoid" : "softmax", nseq);
        check(name, aux_loss, &s, s.logits, dl, 48, H_LOSS, TOL_SMOOTH);

        /* sequence-parallel shards of 3, 2 and 3 tokens (cutting through the sequences):
         * their counts add up to the whole's, their losses and gradients to the whole's */
        const int cuts[4] = {0, 3, 5, 8};
        float total = 0.0f, whole;
        float *sum_counts = fnew((size_t)nseq * 6, 0, 0), *part = fnew((size_t)nseq * 6, 0, 0);
        float *dl_parts = fnew(48, 0, 0);
        for (int q = 0; q < 3; q++) {
            struct mt_aux_args a = s.a;
            a.num_tokens = cuts[q + 1] - cuts[q];
            a.first = cuts[q];
            const float *lq = s.logits + cuts[q] * 6;
            O.aux_counts(K->ctx, &a, part, lq);
            for (int i = 0; i < nseq * 6; i++) sum_counts[i] += part[i];
            total += aux_fwd(&a, s.counts0, lq);
            O.aux_loss_bwd(K->ctx, &a, dl_parts + cuts[q] * 6, 1.0f, s.counts0, lq);
        }
        whole = aux_fwd(&s.a, s.counts0, s.logits);
        assert_memory_equal(sum_counts, s.counts0, sizeof(float) * (size_t)nseq * 6);
        assert_true(fabsf(total - whole) <= 1e-6f * fabsf(whole));
        assert_memory_equal(dl_parts, dl, sizeof(float) * 48);
        free(s.logits); free(s.counts); free(s.counts0); free(dl);
        free(sum_counts); free(part); free(dl_parts);
    }
    /* uniform scores and perfectly balanced counts give loss = coeff (Switch's optimum) */
    float lg[8 * 4] = {0}, cnt[4], loss;
    for (int n = 0; n < 8; n++) lg[n * 4 + (n % 4)] = 1e-4f; /* top-1 spreads evenly */
    struct mt_aux_args a = {.num_tokens = 8, .num_experts = 4, .topk = 1,
                            .score_fn = MT_SCORE_SOFTMAX, .num_seqs = 1, .seq_len = 8,
                            .first = 0, .coeff = 0.5f};
    O.aux_counts(K->ctx, &a, cnt, lg);
    loss = aux_fwd(&a, cnt, lg);
    assert_true(fabsf(loss - 0.5f) < 1e-4f);
    /* the accumulator adds: twice the same call, twice the loss (exactly: a float doubled) */
    double acc = 1.0;
    O.aux_loss_fwd(K->ctx, &a, &acc, cnt, lg);
    O.aux_loss_fwd(K->ctx, &a, &acc, cnt, lg);
    assert_true(acc == 1.0 + 2.0 * (double)loss);
}

struct z_st {
    int N, E;
    float *logits, *lse;
};

static double z_loss(void *p)
{
    struct z_st *s = p;
    double acc = 0.0;
    O.z_loss_fwd(K->ctx, &acc, s->lse, s->logits, s->N, s->E, 0.01f);
    return (float)acc;
}

static void test_z_loss(void **state)
{
    (void)state;
    struct z_st s = {.N = 7, .E = 5};
    s.logits = fnew(35, 2, 95);
    s.lse = fnew(7, 0, 0);
    /* without an accumulator, only lse: the same lse */
    float *lse0 = fnew(7, 0, 0);
    O.z_loss_fwd(K->ctx, NULL, lse0, s.logits, s.N, s.E, 0.01f);
    z_loss(&s);
    assert_memory_equal(lse0, s.lse, sizeof(float) * 7);
    free(lse0);
    float *dl = fnew(35, 0, 0);
    O.z_loss_bwd(K->ctx, dl, 1.0f, s.lse, s.logits, s.N, s.E, 0.01f);
    check("z_loss dlogits", z_loss, &s, s.logits, dl, 35, H_LOSS, TOL_SMOOTH);
    free(s.logits); free(s.lse); free(dl);
}

/* ------------------------------------------- dispatch: plan, permute, unpermute */
static void plan_alloc(struct mt_dispatch_plan *p, int N, int E, int k, int rows_max)
{
    p->offsets = calloc((size_t)E + 1, sizeof(int32_t));
    p->row_slot = calloc((size_t)rows_max, sizeof(int32_t));
    p->slot_row = calloc((size_t)N * k, sizeof(int32_t));
    p->kept = calloc((size_t)E, sizeof(int64_t));
}

static void plan_free(struct mt_dispatch_plan *p)
{
    free(p->offsets); free(p->row_slot); free(p->slot_row); free(p->kept);
}

/* dispatch_plan's dropped count (it adds it to an accumulator from 0) */
static long long plan_dropped(struct mt_dispatch_plan *p, const int32_t *idx, const float *prob,
                              int N, int E, int k, int cap, enum mt_drop_policy pol, bool pad)
{
    int64_t d = 0;
    O.dispatch_plan(K->ctx, p, idx, prob, N, E, k, cap, pol, pad, &d, NULL);
    return d;
}

static void test_dispatch_plan(void **state)
{
    (void)state;
    /* 5 tokens, 3 experts, top-2. Expert 0 is picked by tokens 0,1,3,4. */
    const int32_t idx[10] = {0, 1, 0, 2, 1, 2, 2, 0, 0, 1};
    const float prob[10] = {.3f, .7f, .9f, .1f, .6f, .4f, .5f, .5f, .8f, .2f};
    struct mt_dispatch_plan p;
    plan_alloc(&p, 5, 3, 2, 12); /* up to 3 experts x capacity 4 rows */
    /* dropless: rows expert-major, tokens ascending */
    assert_int_equal(plan_dropped(&p, idx, prob, 5, 3, 2, 0, MT_DROP_PROBS, false), 0);
    const int32_t want_rows[10] = {0, 2, 7, 8, 1, 4, 9, 3, 5, 6};
    assert_memory_equal(p.row_slot, want_rows, sizeof want_rows);
    assert_int_equal(p.offsets[1], 4);
    assert_int_equal(p.offsets[3], 10);
    for (int s = 0; s < 10; s++) assert_int_equal(p.row_slot[p.slot_row[s]], s);
    /* capacity 2, probs: expert 0 (tokens 0 .3, 1 .9, 3 .5, 4 .8) keeps tokens 1 and 4 */
    long long dropped = plan_dropped(&p, idx, prob, 5, 3, 2, 2, MT_DROP_PROBS, false);
    /* expert 1 (tokens 0 .7, 2 .6, 4 .2) keeps 0, 2; expert 2 (1 .1, 2 .4, 3 .5) keeps 2, 3 */
    assert_int_equal(dropped, 4);
    const int32_t want_probs[6] = {2, 8, 1, 4, 5, 6};
    assert_memory_equal(p.row_slot, want_probs, sizeof want_probs);
    assert_int_equal(p.slot_row[0], -1);
    assert_int_equal(p.slot_row[9], -1);
    /* capacity 2, position: earliest tokens win */
    dropped = plan_dropped(&p, idx, prob, 5, 3, 2, 2, MT_DROP_POSITION, false);
    assert_int_equal(dropped, 4);
    const int32_t want_pos[6] = {0, 2, 1, 4, 3, 5};
    assert_memory_equal(p.row_slot, want_pos, sizeof want_pos);
    /* capacity 3 with padding: every expert gets 3 rows, expert 0 drops token 4 (pos) */
    dropped = plan_dropped(&p, idx, prob, 5, 3, 2, 3, MT_DROP_POSITION, true);
    assert_int_equal(dropped, 1);
    const int32_t want_pad[9] = {0, 2, 7, 1, 4, 9, 3, 5, 6};
    assert_memory_equal(p.row_slot, want_pad, sizeof want_pad);
    /* capacity 4 with padding: expert 1 and 2 get a padding row */
    dropped = plan_dropped(&p, idx, prob, 5, 3, 2, 4, MT_DROP_PROBS, true);
    assert_int_equal(dropped, 0);
    assert_int_equal(p.offsets[3], 12);
    assert_int_equal(p.row_slot[7], -1);
    assert_int_equal(p.row_slot[11], -1);
    assert_int_equal(p.kept[1], 3);
    /* -1 (decided elsewhere): no row, not counted as dropped */
    const int32_t idx_none[10] = {0, -1, -1, 2, 1, 2, 2, 0, -1, 1};
    assert_int_equal(plan_dropped(&p, idx_none, prob, 5, 3, 2, 2, MT_DROP_PROBS, false), 1);
    assert_int_equal(p.offsets[3], 6);
    assert_int_equal(p.slot_row[1], -1);
    assert_int_equal(p.slot_row[8], -1);
    assert_int_equal(p.kept[0], 2);
    assert_int_equal(p.kept[1], 2);
    assert_int_equal(p.kept[2], 2);
    /* the accumulators add: dropped and, per expert, the kept rows */
    int64_t dropped_acc = 5, load[3] = {1, 2, 3};
    O.dispatch_plan(K->ctx, &p, idx, prob, 5, 3, 2, 2, MT_DROP_PROBS, false, &dropped_acc, load);
    O.dispatch_plan(K->ctx, &p, idx_none, prob, 5, 3, 2, 2, MT_DROP_PROBS, false, &dropped_acc,
                    load);
    assert_int_equal(dropped_acc, 5 + 4 + 1);
    assert_int_equal(load[0], 1 + 2 + 2);
    assert_int_equal(load[1], 2 + 2 + 2);
    assert_int_equal(load[2], 3 + 2 + 2);
    plan_free(&p);
}

/* permute -> per-row nonsymmetric map -> unpermute, with the plan fixed */
struct disp_st {
    int N, E, k, C, rows;
    struct mt_dispatch_plan p;
    float *x, *prob, *xp, *yp, *scale, *out, *w;
};

static double disp_loss(void *ps)
{
    struct disp_st *s = ps;
    O.permute_fwd(K->ctx, T(s->xp, s->rows, s->C), T(s->x, s->N, s->C), s->p.row_slot, s->rows,
                  s->k, s->C);
    for (int r = 0; r < s->rows; r++)
        for (int c = 0; c < s->C; c++)
            s->yp[r * s->C + c] = s->xp[r * s->C + c] * s->scale[r * s->C + c] + s->xp[r * s->C];
    O.unpermute_fwd(K->ctx, T(s->out, s->N, s->C), T(s->yp, s->rows, s->C), s->p.slot_row, s->prob,
                    s->N, s->k, s->C);
    return fd_dot(s->w, s->out, (size_t)s->N * s->C);
}

static void test_permute_unpermute(void **state)
{
    (void)state;
    struct { int cap; enum mt_drop_policy pol; bool pad; } cases[] = {
        {0, MT_DROP_PROBS, false}, {3, MT_DROP_PROBS, false}, {3, MT_DROP_POSITION, true},
        {5, MT_DROP_PROBS, true},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct disp_st s = {.N = 7, .E = 4, .k = 2, .C = 3};
        int32_t *idx = calloc(14, sizeof(int32_t));
        s.prob = fnew(14, 0, 0);
        for (int n = 0; n < 7; n++) { /* experts (n, n+1) mod 4 ... skewed towards 0 */
            idx[n * 2] = n % 2 ? 0 : n % 4;
            idx[n * 2 + 1] = (idx[n * 2] + 1 + n % 3) % 4;
            s.prob[n * 2] = 0.6f + 0.01f * n;
            s.prob[n * 2 + 1] = 0.4f - 0.02f * n;
        }
        int rows_max = 14 > 4 * cases[c].cap ? 14 : 4 * cases[c].cap;
        plan_alloc(&s.p, 7, 4, 2, rows_max);
        long long dropped = plan_dropped(&s.p, idx, s.prob, 7, 4, 2, cases[c].cap, cases[c].pol,
                                         cases[c].pad);
        if (cases[c].cap == 3) assert_true(dropped > 0);
        s.rows = s.p.offsets[4];
        s.x = fnew(21, 1, 100);
        s.xp = fnew((size_t)s.rows * 3, 0, 0);
        s.yp = fnew((size_t)s.rows * 3, 0, 0);
        s.scale = fnew((size_t)s.rows * 3, 1, 101);
        s.out = fnew(21, 0, 0);
        s.w = fnew(21, 1, 102);
        disp_loss(&s);
        /* backward by hand through the row map, then permute_bwd */
        float *dyp = fnew((size_t)s.rows * 3, 0, 0), *dprob = fnew(14, 0, 0);
        float *dxp = fnew((size_t)s.rows * 3, 0, 0), *dx = fnew(21, 0, 0);
        O.unpermute_bwd(K->ctx, dyp, dprob, s.w, T(s.yp, s.rows, 3), s.p.slot_row, s.prob, 7, 2, 3,
                        s.rows);
        for (int r = 0; r < s.rows; r++)
            for (int cc = 0; cc < 3; cc++) {
                dxp[r * 3 + cc] += dyp[r * 3 + cc] * s.scale[r * 3 + cc];
                dxp[r * 3] += dyp[r * 3 + cc];
            }
        O.permute_bwd(K->ctx, dx, dxp, s.p.slot_row, 7, 2, 3);
        for (int r = 0; r < s.rows; r++)
            if (s.p.row_slot[r] < 0)
                for (int cc = 0; cc < 3; cc++) assert_true(dyp[r * 3 + cc] == 0.0f);
        check("permute+unpermute dx", disp_loss, &s, s.x, dx, 21, H_LINEAR, TOL_LINEAR);
        check("unpermute dprob", disp_loss, &s, s.prob, dprob, 14, H_LINEAR, TOL_LINEAR);
        free(idx); free(s.prob); free(s.x); free(s.xp); free(s.yp); free(s.scale); free(s.out);
        free(s.w); free(dyp); free(dprob); free(dxp); free(dx);
        plan_free(&s.p);
    }
}

/* ---------------------------------------------------------- cross entropy */
struct ce_st {
    int N, V;
    int32_t tgt[6];
    float *logits, *tl, *lse;
};

static double ce_loss(void *p)
{
    struct ce_st *s = p;
    O.cross_entropy_fwd(K->ctx, s->lse, s->tl, s->logits, s->tgt, s->N, s->V, 0);
    double sum = 0;
    for (int n = 0; n < s->N; n++)
        if (s->tgt[n] >= 0) sum += s->lse[n] - s->tl[n];
    return sum / 5.0; /* 5 valid targets */
}

static void test_cross_entropy(void **state)
{
    (void)state;
    struct ce_st s = {.N = 6, .V = 9, .tgt = {3, 8, -1, 0, 3, 5}};
    s.logits = fnew(54, 2, 110);
    s.tl = fnew(6, 0, 0);
    s.lse = fnew(6, 0, 0);
    ce_loss(&s);
    assert_true(s.tl[2] == 0.0f);
    float *dl = fnew(54, 0, 0), *inplace = fnew(54, 0, 0);
    O.cross_entropy_bwd(K->ctx, dl, s.logits, s.lse, s.tgt, s.N, s.V, 0, 1.0f / 5.0f);
    memcpy(inplace, s.logits, sizeof(float) * 54);
    O.cross_entropy_bwd(K->ctx, inplace, inplace, s.lse, s.tgt, s.N, s.V, 0, 1.0f / 5.0f);
    assert_memory_equal(dl, inplace, sizeof(float) * 54);
    check("cross_entropy dlogits", ce_loss, &s, s.logits, dl, 54, H_SMOOTH, TOL_SMOOTH);

    /* vocabulary shards of 4 and 5 columns: target logits found once, the logsumexps
     * combine to the whole's, and the gradients are the column slices of the whole's */
    float a[6 * 4], b[6 * 5], lse_a[6], lse_b[6], tl_a[6], tl_b[6], da[6 * 4], db[6 * 5];
    for (int n = 0; n < 6; n++) {
        memcpy(a + n * 4, s.logits + n * 9, sizeof(float) * 4);
        memcpy(b + n * 5, s.logits + n * 9 + 4, sizeof(float) * 5);
    }
    O.cross_entropy_fwd(K->ctx, lse_a, tl_a, a, s.tgt, 6, 4, 0);
    O.cross_entropy_fwd(K->ctx, lse_b, tl_b, b, s.tgt, 6, 5, 4);
    for (int n = 0; n < 6; n++) {
        assert_true(tl_a[n] + tl_b[n] == s.tl[n]);
        float hi = lse_a[n] > lse_b[n] ? lse_a[n] : lse_b[n];
        float lse = hi + logf(expf(lse_a[n] - hi) + expf(lse_b[n] - hi));
        assert_true(fabsf(lse - s.lse[n]) < 1e-5f * (1.0f + fabsf(s.lse[n])));
    }
    O.cross_entropy_bwd(K->ctx, da, a, s.lse, s.tgt, 6, 4, 0, 1.0f / 5.0f);
    O.cross_entropy_bwd(K->ctx, db, b, s.lse, s.tgt, 6, 5, 4, 1.0f / 5.0f);
    for (int n = 0; n < 6; n++) {
        assert_memory_equal(da + n * 4, dl + n * 9, sizeof(float) * 4);
        assert_memory_equal(db + n * 5, dl + n * 9 + 4, sizeof(float) * 5);
    }
    free(s.logits); free(s.tl); free(s.lse); free(dl); free(inplace);
}

/* ----------------------------------------------------------------- adamw */
static void test_adamw(void **state)
{
    (void)state;
    /* three steps against the torch.optim.AdamW update written in double */
    float p[5], m[5] = {0}, v[5] = {0}, g[5];
    double pd[5], md[5] = {0}, vd[5] = {0};
    fd_randn(p, 5, 1, 120);
    for (int i = 0; i < 5; i++) pd[i] = p[i];
    const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
    for (int t = 1; t <= 3; t++) {
        fd_randn(g, 5, 1, 121 + t);
        O.adamw(K->ctx, p, g, m, v, 5, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd,
                (float)gs, t);
        for (int i = 0; i < 5; i++) {
            double gi = g[i] * gs;
            md[i] = b1 * md[i] + (1 - b1) * gi;
            vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
            pd[i] *= 1 - lr * wd;
            pd[i] -= lr / (1 - pow(b1, t)) * md[i] / (sqrt(vd[i]) / sqrt(1 - pow(b2, t)) + eps);
        }
    }
    for (int i = 0; i < 5; i++) assert_true(fabs(p[i] - pd[i]) < 1e-6 * (1 + fabs(pd[i])));
}

/* scale multiplies in fp32; sumsq accumulates in fp64 onto what acc held. */
static void test_scale_sumsq(void **state)
{
    (void)state;
    float x[5] = {1.0f, -2.0f, 0.5f, 3.0f, 1e-3f};
    O.scale(K->ctx, x, 2.0f, 5);
    assert_true(x[0] == 2.0f && x[1] == -4.0f && x[2] == 1.0f && x[3] == 6.0f && x[4] == 2e-3f);
    double whole = 0.0, pieces = 0.0;
    O.sumsq(K->ctx, &whole, x, 5);
    assert_true(fabs(whole - (4.0 + 16.0 + 1.0 + 36.0 + 4e-6)) < 1e-12);
    O.sumsq(K->ctx, &pieces, x, 2);
    assert_true(pieces == 20.0);
    O.sumsq(K->ctx, &pieces, x + 2, 3);
    assert_true(fabs(pieces - whole) < 1e-12);
    const double before = pieces;
    O.sumsq(K->ctx, &pieces, x, 0);
    assert_true(pieces == before);
}

/* sumsq over millions of values (the gradient norm's): the same bits on any number of
 * threads (its order is fixed, its blocks summed in parallel), and the sum to fp64
 * accuracy. */
static void test_sumsq_threads(void **state)
{
    (void)state;
    const size_t n = 5 * 1000 * 1000 + 77;
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    long double ref = 0.0L;
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)((double)((i * 2654435761u) % 1000003u) / 1000003.0 - 0.5) *
               (i % 7 == 0 ? 1e3f : 1e-2f);
        ref += (long double)x[i] * x[i];
    }
    const int saved = omp_get_max_threads();
    double got[3];
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        got[t] = 1.0;
        O.sumsq(K->ctx, &got[t], x, n);
    }
    omp_set_num_threads(saved);
    assert_true(memcmp(&got[0], &got[1], sizeof got[0]) == 0);
    assert_true(memcmp(&got[0], &got[2], sizeof got[0]) == 0);
    assert_true(fabsl((long double)got[0] - (1.0L + ref)) < 1e-12L * ref);
    free(x);
}

/* rmsnorm_bwd on 1, 2 and 3 threads: the same bits in dx and in dw, whose sum over
 * rows runs over fixed blocks of rows (the rows not a multiple of a block). */
static void test_rmsnorm_bwd_threads(void **state)
{
    (void)state;
    enum { N = 1003, C = 48, TEAMS = 3 };
    float *x = fnew((size_t)N * C, 1, 40), *wt = fnew(C, 1, 41), *dy = fnew((size_t)N * C, 1, 42);
    float *y = fnew((size_t)N * C, 0, 0), *rstd = fnew(N, 0, 0);
    O.rmsnorm_fwd(K->ctx, T(y, N, C), rstd, T(x, N, C), T(wt, 1, C), N, C, 1e-6f);
    float *dx[TEAMS], *dw[TEAMS];
    const int saved = omp_get_max_threads();
    for (int t = 0; t < TEAMS; t++) {
        omp_set_num_threads(t + 1);
        dx[t] = fnew((size_t)N * C, 1, 43);
        dw[t] = fnew(C, 1, 44);
        O.rmsnorm_bwd(K->ctx, dx[t], dw[t], dy, T(x, N, C), T(wt, 1, C), rstd, N, C);
    }
    omp_set_num_threads(saved);
    for (int t = 1; t < TEAMS; t++) {
        assert_true(memcmp(dx[0], dx[t], sizeof(float) * (size_t)N * C) == 0);
        assert_true(memcmp(dw[0], dw[t], sizeof(float) * C) == 0);
    }
    for (int t = 0; t < TEAMS; t++) {
        free(dx[t]);
        free(dw[t]);
    }
    free(x); free(wt); free(dy); free(y); free(rstd);
}

/* memset and copy from 1 MiB up run in blocks over the threads: on 1, 2 and 3 threads,
 * an odd size, the bytes around the range untouched; an overlapping copy is memmove's. */
static void test_bulk_fill_copy(void **state)
{
    (void)state;
    const size_t n = (3u << 20) + 5, pad = 64;
    unsigned char *src = malloc(n), *dst = malloc(n + 2 * pad), *ref = malloc(n + 2 * pad);
    assert_true(src && dst && ref);
    for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 131u + 7u);
    const int saved = omp_get_max_threads();
    for (int t = 1; t <= 3; t++) {
        omp_set_num_threads(t);
        memset(dst, 0xee, n + 2 * pad);
        O.memset(K->ctx, dst + pad, 0x5a, n);
        memset(ref, 0xee, n + 2 * pad);
        memset(ref + pad, 0x5a, n);
        assert_memory_equal(dst, ref, n + 2 * pad);
        O.copy(K->ctx, dst + pad, src, n);
        memcpy(ref + pad, src, n);
        assert_memory_equal(dst, ref, n + 2 * pad);
        /* overlapping: move the range up by 3 bytes */
        O.copy(K->ctx, dst + pad + 3, dst + pad, n - 3);
        memmove(ref + pad + 3, ref + pad, n - 3);
        assert_memory_equal(dst, ref, n + 2 * pad);
    }
    omp_set_num_threads(saved);
    free(src);
    free(dst);
    free(ref);
}

/* lse_combine: one shard is itself; shards of a split vocabulary combine into the
 * logsumexp of the whole (the cross-entropy of the whole row against its halves).
 * loss_sum: lse - target logit over the valid targets, added to what acc held. */
static void test_loss_combine_sum(void **state)
{
    (void)state;
    float one[3] = {1.5f, -2.0f, 40.0f}, out[3];
    O.lse_combine(K->ctx, out, one, 1, 3);
    for (int n = 0; n < 3; n++) assert_true(out[n] == one[n]);
    enum { N = 2, V = 6 };
    const float logits[N * V] = {0.1f, 2.0f, -1.0f, 0.5f, 3.0f, -0.25f,
                                 -4.0f, 1.0f, 0.0f, 7.5f, -3.0f, 2.5f};
    const int32_t tg[N] = {4, -1};
    float lse[N], tl[N], half[2 * N], tlh[N];
    O.cross_entropy_fwd(K->ctx, lse, tl, logits, tg, N, V, 0);
    float lo[N * 3], hi[N * 3]; /* the two shards of 3 columns */
    for (int n = 0; n < N; n++)
        for (int v = 0; v < 3; v++) lo[n * 3 + v] = logits[n * V + v], hi[n * 3 + v] = logits[n * V + 3 + v];
    O.cross_entropy_fwd(K->ctx, half, tlh, lo, tg, N, 3, 0);
    O.cross_entropy_fwd(K->ctx, half + N, tlh, hi, tg, N, 3, 3);
    O.lse_combine(K->ctx, out, half, 2, N);
    for (int n = 0; n < N; n++) assert_true(fabsf(out[n] - lse[n]) < 1e-5f * (1.0f + fabsf(lse[n])));
    double acc = 0.5;
    O.loss_sum(K->ctx, &acc, lse, tl, tg, N);
    assert_true(acc == 0.5 + (double)(lse[0] - tl[0])); /* the ignored target adds nothing */
}

static void test_table_complete(void **state)
{
    (void)state;
    enum mt_op missing = MT_OP_COUNT;
    assert_int_equal(mt_kernels_count_ops(K, &missing), MT_OP_COUNT);
    for (int i = 0; i < MT_OP_COUNT; i++) {
        assert_non_null(mt_op_names[i]);
        for (int j = 0; j < i; j++) assert_string_not_equal(mt_op_names[i], mt_op_names[j]);
    }
    assert_string_equal(mt_op_names[MT_OP_GEMM], "gemm");
    assert_string_equal(mt_op_names[MT_OP_BF16_ROUND], "bf16_round");
}

int main(void)
{
    K = mt_kernels_cpu();
    O = K->op;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_complete),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_gemm_values),
        cmocka_unit_test(test_gemm_bf16_operands),
        cmocka_unit_test(test_grouped_gemm),
        cmocka_unit_test(test_grouped_gemm_threads),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_router),
        cmocka_unit_test(test_aux_loss),
        cmocka_unit_test(test_z_loss),
        cmocka_unit_test(test_dispatch_plan),
        cmocka_unit_test(test_permute_unpermute),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_scale_sumsq),
        cmocka_unit_test(test_sumsq_threads),
        cmocka_unit_test(test_rmsnorm_bwd_threads),
        cmocka_unit_test(test_bulk_fill_copy),
        cmocka_unit_test(test_loss_combine_sum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

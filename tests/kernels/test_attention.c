/* The CPU backend's blocked attention and its vectorised exp:
 * - mt_cpu_expf against exp in double over the whole fp32 range, and its special values;
 * - attention forward and backward against a direct double-precision evaluation, on
 *   shapes that span several 64-row blocks with a ragged last one (GQA, MQA, MHA);
 * - bit-identical results for 1, 2 and 3 OpenMP threads;
 * - 8192 tokens: linear memory (the peak RSS must not grow by a T x T matrix), finite
 *   results, and causality: the first 1024 rows of out and dq equal, bit for bit, a run
 *   on the first 1024 tokens alone.
 * Bounds: fp32 against double with sums over at most a few hundred terms gives
 * norm-relative errors ~1e-7; the bound 1e-5 leaves room for any BLAS's order of
 * summation, while a wrong block boundary, mask or rescaling gives errors ~1e-2 .. 1. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <cmocka.h>
#include <omp.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/quant.h"
#include "tests/kernels/fd.h"

#define TOL_ATT 1e-5
#define EXPF_MAX_ULP 2.0

static const struct mt_kernels *K;

static float *fnew(size_t n, float scale, uint64_t stream)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    assert_non_null(p);
    if (scale != 0.0f) fd_randn(p, n, scale, stream);
    return p;
}

/* ------------------------------------------------------------------- expf */

/* The kernels' loops call mt_cpu_expf under omp simd; so does this one (compiled with
 * the kernels' flags, tests/kernels/local.mk), so that the vector code is what is
 * checked. */
static void expf_many(float *restrict y, const float *restrict x, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) y[i] = mt_cpu_expf(x[i]);
}

/* Error of y against exp(x) in units of the last place of the exact result (the
 * subnormal spacing 2^-149 below FLT_MIN). */
static double ulp_error(float y, float x)
{
    double e = exp((double)x);
    int ex;
    frexp(e, &ex);
    double ulp = e < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ex - 24);
    return fabs((double)y - e) / ulp;
}

static void test_expf(void **state)
{
    (void)state;
    /* every 127th fp32 bit pattern of [0, 88.72] (exp(88.7229) > FLT_MAX) and of
     * [-104, 0] (exp(-104) < half the least subnormal): every binade, subnormal inputs
     * and results, mantissas of every kind */
    enum { CHUNK = 1 << 16 };
    float *x = malloc(sizeof(float) * CHUNK), *y = malloc(sizeof(float) * CHUNK);
    assert_non_null(x);
    assert_non_null(y);
    double worst = 0.0;
    float worst_x = 0.0f;
    size_t count = 0, n = 0;
    for (int sign = 0; sign < 2; sign++) {
        const uint32_t top = mt_q_bits(sign ? 104.0f : 88.72f);
        for (uint32_t u = 0; u <= top; u += 127) {
            x[n++] = mt_q_float(u | (uint32_t)sign << 31);
            if (n == CHUNK || u + 127 > top) {
                expf_many(y, x, n);
                for (size_t i = 0; i < n; i++) {
                    double err = ulp_error(y[i], x[i]);
                    if (err > worst) worst = err, worst_x = x[i];
                }
                count += n;
                n = 0;
            }
        }
    }
    printf("# mt_cpu_expf: max error %.3f ulp at x = %.9g over %zu values (bound %.1f)\n",
           worst, worst_x, count, EXPF_MAX_ULP);
    assert_true(worst <= EXPF_MAX_ULP);
    /* the ends: exp(0) = 1 exactly, Inf, 0, NaN, overflow, underflow to 0 */
    const float sx[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 88.7229f, 1000.0f, -104.5f, -1e30f};
    float sy[9];
    expf_many(sy, sx, 9);
    assert_true(sy[0] == 1.0f && sy[1] == 1.0f);
    assert_true(isinf(sy[2]) && sy[2] > 0 && sy[3] == 0.0f);
    assert_true(isnan(sy[4]));
    assert_true(isinf(sy[5]) && isinf(sy[6]));
    assert_true(sy[7] == 0.0f && sy[8] == 0.0f);
    /* the largest finite result and a subnormal one */
    expf_many(sy, (const float[]){88.72f, -100.0f}, 2);
    assert_true(isfinite(sy[0]) && ulp_error(sy[0], 88.72f) <= EXPF_MAX_ULP);
    assert_true(sy[1] > 0.0f && ulp_error(sy[1], -100.0f) <= 1.0);
    free(x);
    free(y);
}

/* -------------------------------------------------------------- attention */
struct att {
    int B, T, Hq, Hkv, D;
    size_t nq, nk, nl;
    float *q, *k, *v, *dout;          /* inputs */
    float *out, *lse, *dq, *dk, *dv;  /* outputs */
};

static void att_init(struct att *a, int B, int T, int Hq, int Hkv, int D, uint64_t seed)
{
    *a = (struct att){.B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .D = D};
    a->nq = (size_t)B * T * Hq * D;
    a->nk = (size_t)B * T * Hkv * D;
    a->nl = (size_t)B * Hq * T;
    a->q = fnew(a->nq, 1, seed);
    a->k = fnew(a->nk, 1, seed + 1);
    a->v = fnew(a->nk, 1, seed + 2);
    a->dout = fnew(a->nq, 1, seed + 3);
    a->out = fnew(a->nq, 0, 0);
    a->lse = fnew(a->nl, 0, 0);
    a->dq = fnew(a->nq, 0, 0);
    a->dk = fnew(a->nk, 0, 0);
    a->dv = fnew(a->nk, 0, 0);
}

static void att_free(struct att *a)
{
    free(a->q); free(a->k); free(a->v); free(a->dout);
    free(a->out); free(a->lse); free(a->dq); free(a->dk); free(a->dv);
}

static void att_run(struct att *a)
{
    const int64_t N = (int64_t)a->B * a->T;
    const struct mt_tensor q = mt_f32(a->q, N, (int64_t)a->Hq * a->D);
    const struct mt_tensor k = mt_f32(a->k, N, (int64_t)a->Hkv * a->D);
    const struct mt_tensor v = mt_f32(a->v, N, (int64_t)a->Hkv * a->D);
    K->op.attention_fwd(K->ctx, a->out, a->lse, q, k, v, a->B, a->T, a->Hq, a->Hkv, a->D);
    K->op.attention_bwd(K->ctx, a->dq, a->dk, a->dv, a->dout, q, k, v, a->out, a->lse, a->B, a->T,
                        a->Hq, a->Hkv, a->D);
}

/* ||got - ref|| / ||ref|| */
static double rel_err(const float *got, const double *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0.0 ? den : 1.0));
}

/* Causal GQA attention and its gradients, directly in double: for each query row the
 * scores of keys 0..t, their softmax P, out = P V; dV += P dO, dP = dO V^T,
 * dS = P (dP - sum P dP), dQ = scale dS K, dK += scale dS Q. */
static void att_reference(const struct att *a, double *out, double *lse, double *dq, double *dk,
                          double *dv)
{
    const int T = a->T, D = a->D, rep = a->Hq / a->Hkv;
    const double scale = 1.0 / sqrt((double)D);
    double *p = malloc(sizeof(double) * (size_t)T), *dp = malloc(sizeof(double) * (size_t)T);
    assert_non_null(p);
    assert_non_null(dp);
    memset(dk, 0, sizeof(double) * a->nk);
    memset(dv, 0, sizeof(double) * a->nk);
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < a->Hq; h++)
            for (int t = 0; t < T; t++) {
                const size_t qr = (((size_t)b * T + t) * a->Hq + h) * D;
                double mx = -INFINITY, sum = 0.0, pdp = 0.0;
                for (int u = 0; u <= t; u++) {
                    const float *ku = a->k + (((size_t)b * T + u) * a->Hkv + h / rep) * D;
                    double s = 0.0;
                    for (int d = 0; d < D; d++) s += (double)a->q[qr + d] * ku[d];
                    p[u] = s * scale;
                    mx = p[u] > mx ? p[u] : mx;
                }
                for (int u = 0; u <= t; u++) sum += (p[u] = exp(p[u] - mx));
                lse[((size_t)b * a->Hq + h) * T + t] = mx + log(sum);
                for (int d = 0; d < D; d++) out[qr + d] = dq[qr + d] = 0.0;
                for (int u = 0; u <= t; u++) {
                    const size_t kr = (((size_t)b * T + u) * a->Hkv + h / rep) * D;
                    p[u] /= sum;
                    dp[u] = 0.0;
                    for (int d = 0; d < D; d++) {
                        out[qr + d] += p[u] * a->v[kr + d];
                        dv[kr + d] += p[u] * a->dout[qr + d];
                        dp[u] += (double)a->dout[qr + d] * a->v[kr + d];
                    }
                    pdp += p[u] * dp[u];
                }
                for (int u = 0; u <= t; u++) {
                    const size_t kr = (((size_t)b * T + u) * a->Hkv + h / rep) * D;
                    double ds = p[u] * (dp[u] - pdp) * scale;
                    for (int d = 0; d < D; d++) {
                        dq[qr + d] += ds * a->k[kr + d];
                        dk[kr + d] += ds * a->q[qr + d];
                    }
                }
            }
    free(p);
    free(dp);
}

static void test_attention_reference(void **state)
{
    (void)state;
    /* 3 blocks with a ragged last one (GQA 2:1), 2 blocks + 1 row (MQA), one short block
     * (MHA), exactly 2 blocks with head_dim 64; head_dim 40 and 128 (the tile kernel's
     * masked third vector, and its two column panels) */
    const int shapes[][5] = {{2, 150, 4, 2, 24}, {1, 129, 3, 1, 8}, {2, 37, 2, 2, 5},
                             {1, 128, 2, 1, 64}, {1, 70, 2, 2, 40}, {1, 100, 2, 1, 128}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        struct att a;
        att_init(&a, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4], 70 + 4 * i);
        att_run(&a);
        double *out = malloc(sizeof(double) * a.nq), *lse = malloc(sizeof(double) * a.nl);
        double *dq = malloc(sizeof(double) * a.nq), *dk = malloc(sizeof(double) * a.nk);
        double *dv = malloc(sizeof(double) * a.nk);
        assert_true(out && lse && dq && dk && dv);
        att_reference(&a, out, lse, dq, dk, dv);
        const double e[5] = {rel_err(a.out, out, a.nq), rel_err(a.lse, lse, a.nl),
                             rel_err(a.dq, dq, a.nq), rel_err(a.dk, dk, a.nk),
                             rel_err(a.dv, dv, a.nk)};
        printf("# attention B=%d T=%d Hq=%d Hkv=%d D=%d: rel err out %.1e lse %.1e dq %.1e "
               "dk %.1e dv %.1e (bound %.0e)\n", a.B, a.T, a.Hq, a.Hkv, a.D, e[0], e[1], e[2],
               e[3], e[4], TOL_ATT);
        for (int j = 0; j < 5; j++) assert_true(e[j] < TOL_ATT);
        free(out); free(lse); free(dq); free(dk); free(dv);
        att_free(&a);
    }
}

/* Also the two backward schemes against each other: 2 batches x 2 KV groups are one pass
 * for 1 and 2 threads, the dK/dV and dQ passes for 3 (mt_cpu_attention_bwd). */
static void test_attention_threads(void **state)
{
    (void)state;
    const int saved = omp_get_max_threads();
    struct att r[3];
    for (int n = 0; n < 3; n++) {
        omp_set_num_threads(n + 1);
        att_init(&r[n], 2, 200, 6, 2, 16, 90);
        att_run(&r[n]);
    }
    omp_set_num_threads(saved);
    for (int n = 1; n < 3; n++) {
        printf("# attention with %d threads against 1: bitwise\n", n + 1);
        assert_memory_equal(r[n].out, r[0].out, sizeof(float) * r[0].nq);
        assert_memory_equal(r[n].lse, r[0].lse, sizeof(float) * r[0].nl);
        assert_memory_equal(r[n].dq, r[0].dq, sizeof(float) * r[0].nq);
        assert_memory_equal(r[n].dk, r[0].dk, sizeof(float) * r[0].nk);
        assert_memory_equal(r[n].dv, r[0].dv, sizeof(float) * r[0].nk);
    }
    for (int n = 0; n < 3; n++) att_free(&r[n]);
}

static long peak_rss_kb(void)
{
    struct rusage ru;
    assert_int_equal(getrusage(RUSAGE_SELF, &ru), 0);
    return ru.ru_maxrss;
}

static bool finite_all(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

static void test_attention_long(void **state)
{
    (void)state;
    const int T = 8192, P = 1024;
    struct att a, p;
    att_init(&a, 1, T, 2, 1, 16, 110);
    const long before = peak_rss_kb();
    att_run(&a);
    const long grew = peak_rss_kb() - before;
    const long txt_kb = (long)((size_t)T * T * sizeof(float) / 1024);
    printf("# attention T=%d: peak RSS grew by %ld KB (a T x T matrix: %ld KB)\n", T, grew, txt_kb);
    assert_true(grew < txt_kb / 8);
    assert_true(finite_all(a.out, a.nq) && finite_all(a.lse, a.nl) && finite_all(a.dq, a.nq) &&
                finite_all(a.dk, a.nk) && finite_all(a.dv, a.nk));
    /* B = 1: the first P tokens are the leading rows of every tensor */
    att_init(&p, 1, P, 2, 1, 16, 110);
    memcpy(p.q, a.q, sizeof(float) * p.nq);
    memcpy(p.k, a.k, sizeof(float) * p.nk);
    memcpy(p.v, a.v, sizeof(float) * p.nk);
    memcpy(p.dout, a.dout, sizeof(float) * p.nq);
    att_run(&p);
    assert_memory_equal(p.out, a.out, sizeof(float) * p.nq);
    assert_memory_equal(p.dq, a.dq, sizeof(float) * p.nq);
    for (int h = 0; h < 2; h++)
        assert_memory_equal(p.lse + (size_t)h * P, a.lse + (size_t)h * T, sizeof(float) * P);
    att_free(&a);
    att_free(&p);
}

int main(void)
{
    K = mt_kernels_cpu();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expf),
        cmocka_unit_test(test_attention_reference),
        cmocka_unit_test(test_attention_threads),
        cmocka_unit_test(test_attention_long),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Every op of the CUDA backend against the CPU reference (mt_kernels_cpu) on random
 * inputs, several shapes per op (GQA, head_dim 128, topk 8, odd sizes that take the
 * unvectorised paths, empty expert groups), plus run-to-run determinism (bitwise) of
 * the ops whose reductions could be scheduled differently, and a 32k-token attention
 * run that checks O(T) memory and causal prefix invariance. Exits 77 without a device.
 *
 * Error measure: normalised MSE, sum (gpu - cpu)^2 / sum cpu^2, over a whole output.
 * Bounds, from what each op does differently from the reference:
 * - fp32 math in another order (reductions in trees instead of loops, expf/logf of
 *   CUDA's libm, within 2 ulp): relative errors ~1e-7 per element, nmse ~1e-13; bound
 *   1e-10 (1e-9 for sums over thousands of rows). A wrong index, sign or term gives
 *   nmse of order 1e-2 .. 1.
 * - Tensor-core GEMMs (cuBLASLt FAST_16BF, the grouped kernel, attention): operands are
 *   rounded to bf16, sums are fp32. Round-to-nearest-even leaves a relative error of at
 *   most half a bf16 ulp (2^-8), variance 2.7e-6 for normal data; a product of two
 *   rounded operands 5.5e-6, and a sum of such terms with random signs keeps that
 *   ratio: nmse = 5.5e-6 for fp32 operands, whatever K (numpy, the same rounding);
 *   bound 1.5e-5. A truncating conversion gives 3.8e-5 and fails, on purpose. With
 *   bf16-exact operands (the model's forward: weights and stored activations are
 *   rounded) only the accumulation differs: bound 1e-8.
 * - Attention forward: q, k, v are bf16-exact as in the model; P is rounded to bf16
 *   before P V (one rounded operand): nmse ~1e-6; bound 1e-5. Backward: dO (fp32 in the
 *   model) and dS are rounded too, P enters twice: nmse ~7e-6; bound 3e-5. (The ~ values
 *   are those of an emulation of these kernels' fragment arithmetic in numpy.) The lse
 *   is summed from unrounded fp32 P of bf16-exact q, k: bound 1e-8.
 * - Ops that do the same fp32 operations in the same order (embedding, RoPE, permute,
 *   unpermute forward, add, AdamW, bf16 rounding, the dispatch plan's integers) must be
 *   bit-identical, and are compared bytewise.
 *
 * The ops with typed tensors run again with bf16 arguments (the section "typed tensors:
 * bf16" has its bounds), and with an fp8 one, which must abort.
 *
 * MT_PARITY_BACKEND=cpu runs the harness with the CPU backend in the device's place
 * (every comparison must then be exact): a check of this program without a GPU.
 * MT_PARITY_QUICK=1 runs one shape per op family (the first listed, or the one named
 * at its list), without the long attention run: every kernel at least once, for the
 * CUDA emulator under ThreadSanitizer (doc/cuda-emulator.md), which is slow. */
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_THREAD__) && defined(_OPENMP)
#include <omp.h>
#endif

#include "kernels/cuda/cuda_backend.h"
#include "kernels/kernels.h"
#include "util/error.h"
#include "util/rng.h"

#define NMSE_FP32 1e-10
#define NMSE_FP32_SUM 1e-9
#define NMSE_BF16_EXACT 1e-8
#define NMSE_BF16 1.5e-5
#define NMSE_ATT_FWD 1e-5
#define NMSE_ATT_BWD 3e-5

static const struct mt_kernels *C, *G; /* reference, under test */
static bool selftest;
static bool quick; /* MT_PARITY_QUICK: one shape per family */
static int checks, failures;
static uint64_t next_stream = 1;

/* ------------------------------------------------------------------ helpers */

static void *xmalloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test_parity: out of host memory\n");
        exit(1);
    }
    return p;
}

static float *hrandn(size_t n, float scale)
{
    float *x = xmalloc(sizeof(float) * n);
    uint64_t s = next_stream++;
    for (size_t i = 0; i < n; i++) x[i] = scale * mt_rng_normal(0x9a71ULL, s, i);
    return x;
}

static void *hdup(const void *x, size_t bytes)
{
    void *p = xmalloc(bytes);
    memcpy(p, x, bytes);
    return p;
}

static void round_bf16(float *x, size_t n) { C->op.bf16_round(C->ctx, x, x, n); }

static void *dalloc(size_t bytes)
{
    void *p = G->op.alloc(G->ctx, bytes ? bytes : 4);
    if (!p) {
        fprintf(stderr, "test_parity: device allocation of %zu bytes failed\n", bytes);
        exit(1);
    }
    return p;
}

static void *dup_to_dev(const void *h, size_t bytes)
{
    void *d = dalloc(bytes);
    if (bytes) G->op.copy(G->ctx, d, h, bytes);
    return d;
}

static void *dev_to_host(const void *d, size_t bytes)
{
    void *h = xmalloc(bytes);
    if (bytes) G->op.copy(G->ctx, h, d, bytes);
    return h;
}

static void dfree(void *d) { G->op.free(G->ctx, d); }

/* An fp32 view with row stride ld. */
static struct mt_tensor F32LD(const float *p, int rows, int cols, int ld)
{
    return mt_tview_ld(p, MT_F32, rows, cols, ld);
}

static double nmse(const float *ref, const float *got, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) != isnan(ref[i])) return INFINITY;
        if (isnan(ref[i])) continue;
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0.0 ? num / den : num;
}

static void result(bool ok, const char *what, const char *detail)
{
    checks++;
    if (!ok) failures++;
    printf("%s %-58s %s\n", ok ? "ok  " : "FAIL", what, detail);
    fflush(stdout);
}

static void expect_close(const char *what, const float *ref, const float *got, size_t n, double bound)
{
    double e = nmse(ref, got, n);
    char d[96];
    snprintf(d, sizeof d, "nmse %.2e (bound %.0e)", e, bound);
    result(e <= bound, what, d);
}

/* Device result against a host reference, freeing the download. */
static void expect_close_dev(const char *what, const float *ref, const float *dev, size_t n, double bound)
{
    float *got = dev_to_host(dev, sizeof(float) * n);
    expect_close(what, ref, got, n, bound);
    free(got);
}

static void expect_bytes(const char *what, const void *ref, const void *got, size_t bytes)
{
    const unsigned char *a = ref, *b = got;
    size_t i = 0;
    while (i < bytes && a[i] == b[i]) i++;
    char d[96];
    if (i == bytes) snprintf(d, sizeof d, "bit-identical (%zu bytes)", bytes);
    else snprintf(d, sizeof d, "first difference at byte %zu of %zu", i, bytes);
    result(i == bytes, what, d);
}

static void expect_bytes_dev(const char *what, const void *ref, const void *dev, size_t bytes)
{
    void *got = dev_to_host(dev, bytes);
    expect_bytes(what, ref, got, bytes);
    free(got);
}

static void expect_true(const char *what, bool ok, const char *detail) { result(ok, what, detail); }

/* ------------------------------------------------------------------ memory */

static void test_memory(void)
{
    const size_t sizes[] = {1, 1000, 1 << 20, (5 << 20) + 3};
    for (int i = 0; i < 4; i++) {
        size_t n = sizes[i];
        unsigned char *h = xmalloc(n), *back;
        for (size_t j = 0; j < n; j++) h[j] = (unsigned char)(j * 131 + 7);
        void *d1 = dalloc(n), *d2 = dalloc(n);
        char what[96];
        snprintf(what, sizeof what, "alloc %zu bytes: 64-byte aligned", n);
        expect_true(what, ((uintptr_t)d1 & 63) == 0 && ((uintptr_t)d2 & 63) == 0, "");
        G->op.copy(G->ctx, d1, h, n);    /* host -> device */
        G->op.copy(G->ctx, d2, d1, n);   /* device -> device */
        back = dev_to_host(d2, n);       /* device -> host */
        snprintf(what, sizeof what, "copy %zu bytes host->dev->dev->host", n);
        expect_bytes(what, h, back, n);
        G->op.memset(G->ctx, d2, 0xab, n / 2);
        memset(h, 0xab, n / 2);
        free(back);
        back = dev_to_host(d2, n);
        snprintf(what, sizeof what, "memset %zu of %zu bytes", n / 2, n);
        expect_bytes(what, h, back, n);
        free(back);
        free(h);
        dfree(d1);
        dfree(d2);
    }
    if (selftest) return;
    /* the caching allocator: a repeated pattern of allocations reaches a steady state */
    struct mt_cuda_mem_stats s0, s1;
    for (int round = 0; round < 3; round++) {
        if (round == 1) mt_cuda_mem_stats(G, &s0);
        void *p[4];
        for (int i = 0; i < 4; i++) p[i] = dalloc(sizes[i] * 3);
        for (int i = 0; i < 4; i++) dfree(p[i]);
    }
    mt_cuda_mem_stats(G, &s1);
    char d[128];
    snprintf(d, sizeof d, "cudaMalloc calls %lld -> %lld; cached %zu bytes", s0.device_allocs, s1.device_allocs,
             s1.cached);
    expect_true("caching allocator: no cudaMalloc once warm", s1.device_allocs == s0.device_allocs, d);
}

/* ------------------------------------------------------------------ gemm */

static void gemm_case(bool ta, bool tb, int M, int N, int K, int pad, bool exact_bf16, bool nan_c)
{
    const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = hrandn(na, 1.0f), *B = hrandn(nb, 1.0f), *C0 = hrandn(nc, 1.0f);
    if (exact_bf16) {
        round_bf16(A, na);
        round_bf16(B, nb);
    }
    const float alpha = 0.75f, beta = nan_c ? 0.0f : 0.5f;
    if (nan_c)
        for (size_t i = 0; i < nc; i++) C0[i] = NAN;
    float *ref = hdup(C0, sizeof(float) * nc);
    const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    C->op.gemm(C->ctx, ta, tb, M, N, K, alpha, F32LD(A, ar, ac, lda), F32LD(B, br, bc, ldb), beta,
               F32LD(ref, M, N, ldc));
    float *dA = dup_to_dev(A, sizeof(float) * na), *dB = dup_to_dev(B, sizeof(float) * nb);
    float *dC = dup_to_dev(C0, sizeof(float) * nc);
    G->op.gemm(G->ctx, ta, tb, M, N, K, alpha, F32LD(dA, ar, ac, lda), F32LD(dB, br, bc, ldb), beta,
               F32LD(dC, M, N, ldc));
    float *got = dev_to_host(dC, sizeof(float) * nc);
    bool pad_kept = true; /* columns N..ldc-1 of C are outside the product: untouched */
    for (int i = 0; i < M && pad; i++)
        for (int j = N; j < ldc; j++) {
            size_t o = (size_t)i * ldc + j;
            pad_kept = pad_kept && !memcmp(&got[o], &C0[o], sizeof(float));
            got[o] = ref[o] = 0.0f;
        }
    char what[128];
    snprintf(what, sizeof what, "gemm %c%c M=%d N=%d K=%d%s%s%s", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K,
             pad ? " ld+pad" : "", exact_bf16 ? " bf16-exact" : " fp32", nan_c ? " beta=0 over NaN" : "");
    expect_close(what, ref, got, nc, K == 0 ? 0.0 : exact_bf16 ? NMSE_BF16_EXACT : NMSE_BF16);
    if (pad) expect_true("gemm: C outside the leading-dimension padding untouched", pad_kept, "");
    if ((double)M * N * K >= (1 << 24)) { /* determinism on the large shape */
        float *first = dev_to_host(dC, sizeof(float) * nc);
        G->op.copy(G->ctx, dC, C0, sizeof(float) * nc);
        G->op.gemm(G->ctx, ta, tb, M, N, K, alpha, F32LD(dA, ar, ac, lda), F32LD(dB, br, bc, ldb), beta,
                   F32LD(dC, M, N, ldc));
        snprintf(what, sizeof what, "gemm %c%c M=%d N=%d K=%d: two runs", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K);
        expect_bytes_dev(what, first, dC, sizeof(float) * nc);
        free(first);
    }
    free(A);
    free(B);
    free(C0);
    free(ref);
    free(got);
    dfree(dA);
    dfree(dB);
    dfree(dC);
}

static void test_gemm(void)
{
    static const int shapes[][3] = {{64, 48, 32}, {37, 53, 29}, {1, 300, 64}, {130, 7, 3}, {256, 512, 1024}};
    for (int s = 0; s < (quick ? 1 : 5); s++)
        for (int mode = 0; mode < 4; mode++)
            for (int ex = 0; ex < 2; ex++)
                gemm_case(mode & 1, mode & 2, shapes[s][0], shapes[s][1], shapes[s][2], 0, ex, false);
    if (quick) return;
    gemm_case(false, true, 96, 80, 64, 0, true, true); /* beta = 0 ignores NaN in C */
    gemm_case(true, false, 33, 40, 50, 5, false, false); /* leading dimensions above the sizes */
    gemm_case(false, false, 20, 30, 0, 0, false, false); /* K = 0: C = beta C */
    gemm_case(false, false, 20, 30, 0, 0, false, true);
}

/* ------------------------------------------------------------------ grouped gemm */

/* The typed view of grouped_gemm's operand X ('A', 'B' or 'C') at p in mode 0 forward
 * (x W^T), 1 dgrad (x W), 2 wgrad (A^T B): dense, (token rows or slabs x slab rows,
 * width). */
static struct mt_tensor grouped_view(int mode, char X, const void *p, enum mt_dtype t, int G_, int rows, int M, int N,
                                     int K)
{
    if (X == 'A') return mt_tview(p, t, rows, mode == 2 ? M : K);
    if (X == 'B') return mode == 2 ? mt_tview(p, t, rows, N) : mode == 0 ? mt_tview(p, t, (int64_t)G_ * N, K)
                                                                         : mt_tview(p, t, (int64_t)G_ * K, N);
    return mode == 2 ? mt_tview(p, t, (int64_t)G_ * M, N) : mt_tview(p, t, rows, N);
}

/* mode 0 forward (x W^T), 1 dgrad (x W), 2 wgrad (A^T B). */
static void grouped_case(int mode, int G_, const int32_t *counts, int M, int N, int K, bool exact_bf16)
{
    int32_t *offs = xmalloc(sizeof(int32_t) * (G_ + 1));
    offs[0] = 0;
    for (int g = 0; g < G_; g++) offs[g + 1] = offs[g] + counts[g];
    const int rows = offs[G_];
    size_t na, nb, nc;
    if (mode < 2) {
        na = (size_t)rows * K;
        nb = (size_t)G_ * N * K;
        nc = (size_t)rows * N;
    } else {
        na = (size_t)rows * M;
        nb = (size_t)rows * N;
        nc = (size_t)G_ * M * N;
    }
    float *A = hrandn(na, 1.0f), *B = hrandn(nb, 1.0f), *C0 = hrandn(nc, 1.0f);
    if (exact_bf16) {
        round_bf16(A, na);
        round_bf16(B, nb);
    }
    const float beta = mode == 0 ? 0.0f : 1.0f;
    if (mode == 0)
        for (size_t i = 0; i < nc; i++) C0[i] = NAN; /* beta = 0 must ignore C */
    float *ref = hdup(C0, sizeof(float) * nc);
    const bool ta = mode == 2, tb = mode == 0;
    C->op.grouped_gemm(C->ctx, ta, tb, G_, offs, M, N, K, 1.0f, grouped_view(mode, 'A', A, MT_F32, G_, rows, M, N, K),
                       grouped_view(mode, 'B', B, MT_F32, G_, rows, M, N, K), beta,
                       grouped_view(mode, 'C', ref, MT_F32, G_, rows, M, N, K));
    int32_t *doffs = dup_to_dev(offs, sizeof(int32_t) * (G_ + 1));
    float *dA = dup_to_dev(A, sizeof(float) * na), *dB = dup_to_dev(B, sizeof(float) * nb);
    float *dC = dup_to_dev(C0, sizeof(float) * nc);
    G->op.grouped_gemm(G->ctx, ta, tb, G_, doffs, M, N, K, 1.0f, grouped_view(mode, 'A', dA, MT_F32, G_, rows, M, N, K),
                       grouped_view(mode, 'B', dB, MT_F32, G_, rows, M, N, K), beta,
                       grouped_view(mode, 'C', dC, MT_F32, G_, rows, M, N, K));
    static const char *names[] = {"fwd xW^T", "dgrad xW", "wgrad A^TB"};
    char what[128];
    snprintf(what, sizeof what, "grouped_gemm %s G=%d rows=%d M=%d N=%d K=%d%s", names[mode], G_, rows, M, N, K,
             exact_bf16 ? " bf16-exact" : " fp32");
    expect_close_dev(what, ref, dC, nc, exact_bf16 ? NMSE_BF16_EXACT : NMSE_BF16);
    if (nc >= (1u << 20)) { /* determinism on the large shapes */
        float *first = dev_to_host(dC, sizeof(float) * nc);
        G->op.copy(G->ctx, dC, C0, sizeof(float) * nc);
        G->op.grouped_gemm(G->ctx, ta, tb, G_, doffs, M, N, K, 1.0f,
                           grouped_view(mode, 'A', dA, MT_F32, G_, rows, M, N, K),
                           grouped_view(mode, 'B', dB, MT_F32, G_, rows, M, N, K), beta,
                           grouped_view(mode, 'C', dC, MT_F32, G_, rows, M, N, K));
        snprintf(what, sizeof what, "grouped_gemm %s G=%d: two runs", names[mode], G_);
        expect_bytes_dev(what, first, dC, sizeof(float) * nc);
        free(first);
    }
    free(offs);
    free(A);
    free(B);
    free(C0);
    free(ref);
    dfree(doffs);
    dfree(dA);
    dfree(dB);
    dfree(dC);
}

static void test_grouped_gemm(void)
{
    static const int32_t small[8] = {5, 0, 130, 64, 1, 0, 257, 33}; /* empty groups, partial tiles */
    int32_t big[16], many[1500];
    for (int g = 0; g < 16; g++) big[g] = 150 + 13 * g;
    for (int g = 0; g < 1500; g++) many[g] = (int32_t)mt_rng_below(7, 1, (uint64_t)g, 3); /* > 1024 groups */
    for (int mode = 0; mode < 3; mode++) {
        for (int ex = 0; ex < 2; ex++) grouped_case(mode, 8, small, 96, 128, 64, ex);
        if (quick) continue;
        grouped_case(mode, 8, small, 30, 50, 30, false);    /* sizes off multiples of 4 */
        grouped_case(mode, 16, big, 384, 256, 256, true);   /* Qwen-like slabs, larger */
        grouped_case(mode, 16, big, 384, 256, 256, false);
        grouped_case(mode, 1500, many, 16, 24, 16, true);
    }
}

/* ------------------------------------------------------------------ layers */

static void test_embedding(void)
{
    static const int shapes[][3] = {{300, 50, 64}, {257, 13, 30}}; /* N, V, C */
    for (int s = 0; s < (quick ? 1 : 2); s++) {
        const int N = shapes[s][0], V = shapes[s][1], Cc = shapes[s][2];
        int32_t *tok = xmalloc(sizeof(int32_t) * N);
        for (int n = 0; n < N; n++) /* every 9th token belongs to another vocabulary shard: -1 */
            tok[n] = n % 9 == 4 ? -1 : (int32_t)mt_rng_below(3, (uint64_t)s, (uint64_t)n, (uint64_t)V);
        float *wte = hrandn((size_t)V * Cc, 1.0f), *dout = hrandn((size_t)N * Cc, 1.0f);
        float *dw0 = hrandn((size_t)V * Cc, 1.0f);
        float *out = xmalloc(sizeof(float) * N * Cc), *dw = hdup(dw0, sizeof(float) * V * Cc);
        C->op.embedding_fwd(C->ctx, mt_f32(out, N, Cc), tok, mt_f32(wte, V, Cc), N, Cc);
        C->op.embedding_bwd(C->ctx, dw, dout, tok, N, Cc);
        int32_t *dtok = dup_to_dev(tok, sizeof(int32_t) * N);
        float *dwte = dup_to_dev(wte, sizeof(float) * V * Cc), *ddout = dup_to_dev(dout, sizeof(float) * N * Cc);
        float *dout_ = dalloc(sizeof(float) * N * Cc), *ddw = dup_to_dev(dw0, sizeof(float) * V * Cc);
        G->op.embedding_fwd(G->ctx, mt_f32(dout_, N, Cc), dtok, mt_f32(dwte, V, Cc), N, Cc);
        G->op.embedding_bwd(G->ctx, ddw, ddout, dtok, N, Cc);
        char what[96];
        snprintf(what, sizeof what, "embedding_fwd N=%d V=%d C=%d (-1: zero rows)", N, V, Cc);
        expect_bytes_dev(what, out, dout_, sizeof(float) * N * Cc);
        snprintf(what, sizeof what, "embedding_bwd N=%d V=%d C=%d (+=, repeated ids, -1)", N, V, Cc);
        expect_bytes_dev(what, dw, ddw, sizeof(float) * V * Cc);
        free(tok);
        free(wte);
        free(dout);
        free(dw0);
        free(out);
        free(dw);
        dfree(dtok);
        dfree(dwte);
        dfree(ddout);
        dfree(dout_);
        dfree(ddw);
    }
}

static void test_rmsnorm(void)
{
    static const int shapes[][2] = {{64, 256}, {300, 128}, {5000, 64}, {33, 4097}, {7, 2048}};
    for (int s = 0; s < (quick ? 1 : 5); s++) {
        const int N = shapes[s][0], Cc = shapes[s][1];
        const size_t nx = (size_t)N * Cc;
        float *x = hrandn(nx, 1.0f), *w = hrandn(Cc, 0.1f), *dout = hrandn(nx, 1.0f);
        for (int c = 0; c < Cc; c++) w[c] += 1.0f;
        float *dx0 = hrandn(nx, 1.0f), *dw0 = hrandn(Cc, 1.0f);
        float *out = xmalloc(sizeof(float) * nx), *rstd = xmalloc(sizeof(float) * N);
        float *dx = hdup(dx0, sizeof(float) * nx), *dw = hdup(dw0, sizeof(float) * Cc);
        C->op.rmsnorm_fwd(C->ctx, mt_f32(out, N, Cc), rstd, mt_f32(x, N, Cc), mt_f32(w, 1, Cc), N, Cc, 1e-6f);
        C->op.rmsnorm_bwd(C->ctx, dx, dw, dout, mt_f32(x, N, Cc), mt_f32(w, 1, Cc), rstd, N, Cc);
        float *d_x = dup_to_dev(x, sizeof(float) * nx), *d_w = dup_to_dev(w, sizeof(float) * Cc);
        float *d_out = dalloc(sizeof(float) * nx), *d_rstd = dalloc(sizeof(float) * N);
        float *d_dout = dup_to_dev(dout, sizeof(float) * nx);
        float *d_dx = dup_to_dev(dx0, sizeof(float) * nx), *d_dw = dup_to_dev(dw0, sizeof(float) * Cc);
        G->op.rmsnorm_fwd(G->ctx, mt_f32(d_out, N, Cc), d_rstd, mt_f32(d_x, N, Cc), mt_f32(d_w, 1, Cc), N, Cc, 1e-6f);
        /* the backward takes the reference's rstd, so it is checked on its own */
        G->op.copy(G->ctx, d_rstd, rstd, sizeof(float) * N);
        G->op.rmsnorm_bwd(G->ctx, d_dx, d_dw, d_dout, mt_f32(d_x, N, Cc), mt_f32(d_w, 1, Cc), d_rstd, N, Cc);
        char what[96];
        snprintf(what, sizeof what, "rmsnorm_fwd out N=%d C=%d", N, Cc);
        float *got_out = dev_to_host(d_out, sizeof(float) * nx);
        expect_close(what, out, got_out, nx, NMSE_FP32);
        snprintf(what, sizeof what, "rmsnorm_bwd dx N=%d C=%d (+=)", N, Cc);
        expect_close_dev(what, dx, d_dx, nx, NMSE_FP32);
        snprintf(what, sizeof what, "rmsnorm_bwd dw N=%d C=%d (+=)", N, Cc);
        float *got_dw = dev_to_host(d_dw, sizeof(float) * Cc);
        expect_close(what, dw, got_dw, Cc, NMSE_FP32_SUM);
        G->op.copy(G->ctx, d_dw, dw0, sizeof(float) * Cc);
        G->op.copy(G->ctx, d_dx, dx0, sizeof(float) * nx);
        G->op.rmsnorm_bwd(G->ctx, d_dx, d_dw, d_dout, mt_f32(d_x, N, Cc), mt_f32(d_w, 1, Cc), d_rstd, N, Cc);
        snprintf(what, sizeof what, "rmsnorm_bwd dw N=%d C=%d: two runs", N, Cc);
        expect_bytes_dev(what, got_dw, d_dw, sizeof(float) * Cc);
        free(x);
        free(w);
        free(dout);
        free(dx0);
        free(dw0);
        free(out);
        free(rstd);
        free(dx);
        free(dw);
        free(got_out);
        free(got_dw);
        dfree(d_x);
        dfree(d_w);
        dfree(d_out);
        dfree(d_rstd);
        dfree(d_dout);
        dfree(d_dx);
        dfree(d_dw);
    }
}

static void test_rope(void)
{
    static const int shapes[][4] = {{2, 37, 3, 64}, {1, 300, 4, 128}, {3, 5, 2, 6}};
    static const float thetas[] = {1e6f, 1e4f, 1e4f};
    for (int s = 0; s < (quick ? 1 : 3); s++) {
        const int B = shapes[s][0], T = shapes[s][1], H = shapes[s][2], D = shapes[s][3];
        const size_t n = (size_t)B * T * H * D;
        float *x = hrandn(n, 1.0f), *fwd = xmalloc(sizeof(float) * n), *bwd = xmalloc(sizeof(float) * n);
        C->op.rope_fwd(C->ctx, mt_f32(fwd, B * T, H * D), mt_f32(x, B * T, H * D), B, T, H, D, thetas[s]);
        C->op.rope_bwd(C->ctx, bwd, x, B, T, H, D, thetas[s]);
        float *dx = dup_to_dev(x, sizeof(float) * n), *dy = dalloc(sizeof(float) * n);
        char what[96];
        G->op.rope_fwd(G->ctx, mt_f32(dy, B * T, H * D), mt_f32(dx, B * T, H * D), B, T, H, D, thetas[s]);
        snprintf(what, sizeof what, "rope_fwd B=%d T=%d H=%d D=%d", B, T, H, D);
        expect_bytes_dev(what, fwd, dy, sizeof(float) * n);
        G->op.rope_bwd(G->ctx, dx, dx, B, T, H, D, thetas[s]); /* in place */
        snprintf(what, sizeof what, "rope_bwd B=%d T=%d H=%d D=%d (in place)", B, T, H, D);
        expect_bytes_dev(what, bwd, dx, sizeof(float) * n);
        free(x);
        free(fwd);
        free(bwd);
        dfree(dx);
        dfree(dy);
    }
}

struct att_shape {
    int B, T, Hq, Hkv, D;
};

/* fp32 views of attention's q (B*T, Hq*D) and k, v (B*T, Hkv*D) in a function with a
 * struct att_shape a */
#define QV(p) mt_f32(p, (int64_t)a.B * a.T, (int64_t)a.Hq * a.D)
#define KV(p) mt_f32(p, (int64_t)a.B * a.T, (int64_t)a.Hkv * a.D)

static void attention_case(struct att_shape a)
{
    const size_t nq = (size_t)a.B * a.T * a.Hq * a.D, nkv = (size_t)a.B * a.T * a.Hkv * a.D;
    const size_t nlse = (size_t)a.B * a.Hq * a.T;
    float *q = hrandn(nq, 1.0f), *k = hrandn(nkv, 1.0f), *v = hrandn(nkv, 1.0f), *dout = hrandn(nq, 1.0f);
    round_bf16(q, nq); /* as in the model: projections are stored in bf16 */
    round_bf16(k, nkv);
    round_bf16(v, nkv);
    float *out = xmalloc(sizeof(float) * nq), *lse = xmalloc(sizeof(float) * nlse);
    float *dq = xmalloc(sizeof(float) * nq), *dk = xmalloc(sizeof(float) * nkv), *dv = xmalloc(sizeof(float) * nkv);
    C->op.attention_fwd(C->ctx, out, lse, QV(q), KV(k), KV(v), a.B, a.T, a.Hq, a.Hkv, a.D);
    C->op.attention_bwd(C->ctx, dq, dk, dv, dout, QV(q), KV(k), KV(v), out, lse, a.B, a.T, a.Hq, a.Hkv, a.D);
    float *d_q = dup_to_dev(q, sizeof(float) * nq), *d_k = dup_to_dev(k, sizeof(float) * nkv);
    float *d_v = dup_to_dev(v, sizeof(float) * nkv), *d_do = dup_to_dev(dout, sizeof(float) * nq);
    float *d_out = dalloc(sizeof(float) * nq), *d_lse = dalloc(sizeof(float) * nlse);
    float *d_dq = dalloc(sizeof(float) * nq), *d_dk = dalloc(sizeof(float) * nkv), *d_dv = dalloc(sizeof(float) * nkv);
    G->op.attention_fwd(G->ctx, d_out, d_lse, QV(d_q), KV(d_k), KV(d_v), a.B, a.T, a.Hq, a.Hkv, a.D);
    G->op.attention_bwd(G->ctx, d_dq, d_dk, d_dv, d_do, QV(d_q), KV(d_k), KV(d_v), d_out, d_lse, a.B, a.T, a.Hq,
                        a.Hkv, a.D);
    char sh[80], what[128];
    snprintf(sh, sizeof sh, "B=%d T=%d Hq=%d Hkv=%d D=%d", a.B, a.T, a.Hq, a.Hkv, a.D);
    float *o1 = dev_to_host(d_out, sizeof(float) * nq), *q1 = dev_to_host(d_dq, sizeof(float) * nq);
    float *k1 = dev_to_host(d_dk, sizeof(float) * nkv), *v1 = dev_to_host(d_dv, sizeof(float) * nkv);
    snprintf(what, sizeof what, "attention_fwd out %s", sh);
    expect_close(what, out, o1, nq, NMSE_ATT_FWD);
    snprintf(what, sizeof what, "attention_fwd lse %s", sh);
    expect_close_dev(what, lse, d_lse, nlse, NMSE_BF16_EXACT);
    snprintf(what, sizeof what, "attention_bwd dq %s", sh);
    expect_close(what, dq, q1, nq, NMSE_ATT_BWD);
    snprintf(what, sizeof what, "attention_bwd dk %s", sh);
    expect_close(what, dk, k1, nkv, NMSE_ATT_BWD);
    snprintf(what, sizeof what, "attention_bwd dv %s", sh);
    expect_close(what, dv, v1, nkv, NMSE_ATT_BWD);
    /* determinism: a second forward and backward, bit for bit */
    G->op.attention_fwd(G->ctx, d_out, d_lse, QV(d_q), KV(d_k), KV(d_v), a.B, a.T, a.Hq, a.Hkv, a.D);
    G->op.attention_bwd(G->ctx, d_dq, d_dk, d_dv, d_do, QV(d_q), KV(d_k), KV(d_v), d_out, d_lse, a.B, a.T, a.Hq,
                        a.Hkv, a.D);
    snprintf(what, sizeof what, "attention fwd+bwd %s: two runs", sh);
    float *o2 = dev_to_host(d_out, sizeof(float) * nq), *q2 = dev_to_host(d_dq, sizeof(float) * nq);
    float *k2 = dev_to_host(d_dk, sizeof(float) * nkv), *v2 = dev_to_host(d_dv, sizeof(float) * nkv);
    bool same = !memcmp(o1, o2, sizeof(float) * nq) && !memcmp(q1, q2, sizeof(float) * nq) &&
                !memcmp(k1, k2, sizeof(float) * nkv) && !memcmp(v1, v2, sizeof(float) * nkv);
    expect_true(what, same, same ? "bit-identical" : "runs differ");
    free(q);
    free(k);
    free(v);
    free(dout);
    free(out);
    free(lse);
    free(dq);
    free(dk);
    free(dv);
    free(o1);
    free(q1);
    free(k1);
    free(v1);
    free(o2);
    free(q2);
    free(k2);
    free(v2);
    dfree(d_q);
    dfree(d_k);
    dfree(d_v);
    dfree(d_do);
    dfree(d_out);
    dfree(d_lse);
    dfree(d_dq);
    dfree(d_dk);
    dfree(d_dv);
}

static bool all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

/* 32768 tokens on the device alone (the CPU reference takes O(T^2) time): the backend
 * must run in O(T) memory besides its (B,Hq,T) lse. Causality makes the first P rows of
 * out and dq independent of everything after them: they must equal, bit for bit, a run
 * on the first P tokens alone (whose agreement with the CPU is checked above). */
static void attention_long(void)
{
    /* MT_PARITY_LONG_T sets T (the emulator's run takes 4096, a quarter as the prefix) */
    const char *lt = getenv("MT_PARITY_LONG_T");
    const int T = lt && atoi(lt) >= 256 ? atoi(lt) : 32768, P = T >= 32768 ? 1024 : T / 4;
    const int B = 1, Hq = 4, Hkv = 1, D = 128;
    const struct att_shape a = {B, T, Hq, Hkv, D};
    const size_t nq = (size_t)B * T * Hq * D, nkv = (size_t)B * T * Hkv * D;
    const size_t nlse = (size_t)B * Hq * T;
    float *q = hrandn(nq, 1.0f), *k = hrandn(nkv, 1.0f), *v = hrandn(nkv, 1.0f), *dout = hrandn(nq, 1.0f);
    round_bf16(q, nq);
    round_bf16(k, nkv);
    round_bf16(v, nkv);
    float *d_q = dup_to_dev(q, sizeof(float) * nq), *d_k = dup_to_dev(k, sizeof(float) * nkv);
    float *d_v = dup_to_dev(v, sizeof(float) * nkv), *d_do = dup_to_dev(dout, sizeof(float) * nq);
    float *d_out = dalloc(sizeof(float) * nq), *d_lse = dalloc(sizeof(float) * nlse);
    float *d_dq = dalloc(sizeof(float) * nq), *d_dk = dalloc(sizeof(float) * nkv), *d_dv = dalloc(sizeof(float) * nkv);
    G->op.attention_fwd(G->ctx, d_out, d_lse, QV(d_q), KV(d_k), KV(d_v), B, T, Hq, Hkv, D);
    G->op.attention_bwd(G->ctx, d_dq, d_dk, d_dv, d_do, QV(d_q), KV(d_k), KV(d_v), d_out, d_lse, B, T, Hq, Hkv, D);
    float *out = dev_to_host(d_out, sizeof(float) * nq), *dq = dev_to_host(d_dq, sizeof(float) * nq);
    float *dk = dev_to_host(d_dk, sizeof(float) * nkv), *dv = dev_to_host(d_dv, sizeof(float) * nkv);
    bool finite = all_finite(out, nq) && all_finite(dq, nq) && all_finite(dk, nkv) && all_finite(dv, nkv);
    char what[96];
    snprintf(what, sizeof what, "attention T=%d Hq=4 Hkv=1 D=128: fwd+bwd finite", T);
    expect_true(what, finite, "");
    /* the first P tokens alone (B = 1: they are the leading rows of every tensor) */
    const size_t pq = (size_t)P * Hq * D;
    float *p_out = dalloc(sizeof(float) * pq), *p_lse = dalloc(sizeof(float) * (size_t)Hq * P);
    float *p_dq = dalloc(sizeof(float) * pq);
    float *p_dk = dalloc(sizeof(float) * (size_t)P * Hkv * D), *p_dv = dalloc(sizeof(float) * (size_t)P * Hkv * D);
    /* the views of the first P tokens */
    const struct mt_tensor pq_ = mt_f32(d_q, P, Hq * D), pk_ = mt_f32(d_k, P, Hkv * D), pv_ = mt_f32(d_v, P, Hkv * D);
    G->op.attention_fwd(G->ctx, p_out, p_lse, pq_, pk_, pv_, B, P, Hq, Hkv, D);
    G->op.attention_bwd(G->ctx, p_dq, p_dk, p_dv, d_do, pq_, pk_, pv_, p_out, p_lse, B, P, Hq, Hkv, D);
    snprintf(what, sizeof what, "attention T=%d: out[:%d] equals a %d-token run", T, P, P);
    expect_bytes_dev(what, out, p_out, sizeof(float) * pq);
    snprintf(what, sizeof what, "attention T=%d: dq[:%d] equals a %d-token run", T, P, P);
    expect_bytes_dev(what, dq, p_dq, sizeof(float) * pq);
    free(q);
    free(k);
    free(v);
    free(dout);
    free(out);
    free(dq);
    free(dk);
    free(dv);
    dfree(d_q);
    dfree(d_k);
    dfree(d_v);
    dfree(d_do);
    dfree(d_out);
    dfree(d_lse);
    dfree(d_dq);
    dfree(d_dk);
    dfree(d_dv);
    dfree(p_out);
    dfree(p_lse);
    dfree(p_dq);
    dfree(p_dk);
    dfree(p_dv);
}

static void test_attention(void)
{
    static const struct att_shape shapes[] = {
        {2, 100, 4, 2, 64},   /* GQA 2:1, partial last tile */
        {1, 256, 8, 2, 128},  /* GQA 4:1, head_dim 128 */
        {1, 64, 2, 2, 32},    /* one tile, MHA */
        {1, 40, 2, 1, 64},    /* one partial tile, MQA */
        {2, 77, 6, 3, 40},    /* head_dim padded inside the kernel (40 -> 64) */
        {1, 50, 2, 2, 18},    /* head_dim not a multiple of 4: scalar loads */
        {1, 1024, 4, 1, 128}, /* 16 tiles, GQA 4:1 */
        /* 8 (batch, KV group) items x 136 key-query tile pairs, past the dK/dV split's
         * 1024 chunks: chunks of 2 query tiles, the last one of 1 for every odd key tile */
        {2, 1000, 8, 4, 32},
    };
    for (size_t i = 0; i < (quick ? 1 : sizeof shapes / sizeof shapes[0]); i++) attention_case(shapes[i]);
    if (!selftest && !quick) attention_long();
}

static void test_swiglu_add(void)
{
    static const int shapes[][2] = {{1000, 64}, {33, 17}};
    for (int s = 0; s < (quick ? 1 : 2); s++) {
        const int N = shapes[s][0], F = shapes[s][1];
        const size_t n = (size_t)N * F;
        float *g = hrandn(n, 2.0f), *u = hrandn(n, 1.0f), *d = hrandn(n, 1.0f);
        float *out = xmalloc(sizeof(float) * n), *dg = xmalloc(sizeof(float) * n), *du = xmalloc(sizeof(float) * n);
        float *sum = xmalloc(sizeof(float) * n);
        C->op.swiglu_fwd(C->ctx, mt_f32(out, N, F), mt_f32(g, N, F), mt_f32(u, N, F), N, F);
        C->op.swiglu_bwd(C->ctx, dg, du, d, mt_f32(g, N, F), mt_f32(u, N, F), N, F);
        C->op.add(C->ctx, mt_f32(sum, 1, n), mt_f32(g, 1, n), mt_f32(u, 1, n), n);
        float *d_g = dup_to_dev(g, sizeof(float) * n), *d_u = dup_to_dev(u, sizeof(float) * n);
        float *d_d = dup_to_dev(d, sizeof(float) * n), *d_out = dalloc(sizeof(float) * n);
        float *d_dg = dalloc(sizeof(float) * n), *d_du = dalloc(sizeof(float) * n);
        G->op.swiglu_fwd(G->ctx, mt_f32(d_out, N, F), mt_f32(d_g, N, F), mt_f32(d_u, N, F), N, F);
        G->op.swiglu_bwd(G->ctx, d_dg, d_du, d_d, mt_f32(d_g, N, F), mt_f32(d_u, N, F), N, F);
        char what[96];
        snprintf(what, sizeof what, "swiglu_fwd N=%d F=%d", N, F);
        expect_close_dev(what, out, d_out, n, NMSE_FP32);
        snprintf(what, sizeof what, "swiglu_bwd dgate N=%d F=%d", N, F);
        expect_close_dev(what, dg, d_dg, n, NMSE_FP32);
        snprintf(what, sizeof what, "swiglu_bwd dup N=%d F=%d", N, F);
        expect_close_dev(what, du, d_du, n, NMSE_FP32);
        G->op.add(G->ctx, mt_f32(d_g, 1, n), mt_f32(d_g, 1, n), mt_f32(d_u, 1, n), n); /* out aliases a */
        snprintf(what, sizeof what, "add n=%zu (in place)", n);
        expect_bytes_dev(what, sum, d_g, sizeof(float) * n);
        free(g);
        free(u);
        free(d);
        free(out);
        free(dg);
        free(du);
        free(sum);
        dfree(d_g);
        dfree(d_u);
        dfree(d_d);
        dfree(d_out);
        dfree(d_dg);
        dfree(d_du);
    }
}

/* ------------------------------------------------------------------ typed tensors: bf16 */

/* The ops with typed tensors (kernels.h) given bf16 arguments, CUDA against the CPU with
 * the same bf16 arguments. Both read a bf16 input exactly, compute in fp32 as for fp32
 * inputs and round a bf16 output to nearest even, so the bounds are those of the fp32
 * cases above:
 * - ops bit-identical in fp32 stay bit-identical (the same fp32 result, rounded the same
 *   way), compared bytewise;
 * - elementwise and row ops whose fp32 results differ in the last bits (rmsnorm,
 *   swiglu) may round those to neighbouring bf16 values when they straddle a rounding
 *   boundary: their bf16 outputs must be at most 1 bf16 ulp apart (expect_tt_ulp);
 * - products (gemm, grouped_gemm) whose fp32 results differ by the accumulation order
 *   keep their nmse bounds, on the widened bf16 outputs: a flipped rounding adds up to
 *   2^-8 relative error on the elements whose fp32 results straddle a rounding boundary
 *   (nmse 2e-10 to 3.4e-9 at K = 1024 on the emulator, against the bound 1e-8), and a
 *   near-cancelling sum, small against its terms, may differ by more than 1 ulp of
 *   itself, so ulps are no measure there.
 * fp32 outputs of bf16 inputs keep the fp32 cases' bounds. The tensor-core kernels
 * (grouped_gemm, attention) see the same bf16 operands whether an input arrives as bf16
 * or as bf16-exact fp32, so there the device results must also equal the fp32 run's
 * bit for bit. */

/* A tensor of n elements in dtype t, on the host (the CPU reference's side, h) and on
 * the device (d). */
struct tt {
    enum mt_dtype t;
    size_t n;
    void *h, *d;
};

static size_t tt_bytes(const struct tt *x) { return x->n * mt_dtype_size(x->t); }

/* The values x (fp32) in dtype t on both sides: bf16 rounds them (the CPU's convert). */
static struct tt tt_in(const float *x, size_t n, enum mt_dtype t)
{
    struct tt r = {t, n, xmalloc(n * mt_dtype_size(t)), NULL};
    C->op.convert(C->ctx, mt_tview(r.h, t, 1, (int64_t)n), mt_f32(x, 1, (int64_t)n));
    r.d = dup_to_dev(r.h, tt_bytes(&r));
    return r;
}

/* An output of n elements in dtype t: NaN on both sides (bf16 NaN 0x7fc0), so that an
 * element an op should write and does not shows. */
static struct tt tt_out(size_t n, enum mt_dtype t)
{
    float *nan = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    struct tt r = tt_in(nan, n, t);
    free(nan);
    return r;
}

/* x's host (tt_h) and device (tt_d) data as a rows x cols view */
static struct mt_tensor tt_h(const struct tt *x, int64_t rows, int64_t cols)
{
    return mt_tview(x->h, x->t, rows, cols);
}
static struct mt_tensor tt_d(const struct tt *x, int64_t rows, int64_t cols)
{
    return mt_tview(x->d, x->t, rows, cols);
}

static void tt_free(struct tt *x)
{
    free(x->h);
    dfree(x->d);
}

/* n elements of dtype t at host p, widened to fp32 (exactly). */
static float *widen(const void *p, enum mt_dtype t, size_t n)
{
    float *w = xmalloc(sizeof(float) * n);
    C->op.convert(C->ctx, mt_f32(w, 1, (int64_t)n), mt_tview(p, t, 1, (int64_t)n));
    return w;
}

static const char *dt_name(enum mt_dtype t) { return t == MT_BF16 ? "bf16" : "fp32"; }

/* The device's x against the CPU's, bytewise. */
static void expect_tt_bytes(const char *what, const struct tt *x) { expect_bytes_dev(what, x->h, x->d, tt_bytes(x)); }

/* The device's x against the CPU's by nmse of the fp32 (or widened bf16) values. */
static void expect_tt_close(const char *what, const struct tt *x, double bound)
{
    void *got = dev_to_host(x->d, tt_bytes(x));
    float *r = widen(x->h, x->t, x->n), *g = widen(got, x->t, x->n);
    expect_close(what, r, g, x->n, bound);
    free(got);
    free(r);
    free(g);
}

/* bf16 bits as an integer that orders like the values (+0 and -0 both 0). */
static int32_t bf16_order(uint16_t b) { return (b & 0x8000) ? -(int32_t)(b & 0x7fff) : (int32_t)b; }

/* fp32: nmse within bound, as the fp32 case; bf16: every element at most 1 bf16 ulp from
 * the CPU's (NaN where the CPU has NaN). */
static void expect_tt_ulp(const char *what, const struct tt *x, double bound)
{
    if (x->t == MT_F32) {
        expect_close_dev(what, x->h, x->d, x->n, bound);
        return;
    }
    uint16_t *got = dev_to_host(x->d, tt_bytes(x));
    const uint16_t *ref = x->h;
    size_t off = 0, worst_i = 0;
    int32_t worst = 0;
    for (size_t i = 0; i < x->n; i++) {
        const bool rn = (ref[i] & 0x7fff) > 0x7f80, gn = (got[i] & 0x7fff) > 0x7f80;
        int32_t dist = rn || gn ? (rn && gn ? 0 : 1 << 20) : abs(bf16_order(ref[i]) - bf16_order(got[i]));
        if (dist > 0) off++;
        if (dist > worst) worst = dist, worst_i = i;
    }
    char d[128];
    snprintf(d, sizeof d, "%zu of %zu one ulp apart, at most %d ulp (element %zu; bound 1)", off, x->n, (int)worst,
             worst_i);
    result(worst <= 1, what, d);
    free(got);
}

/* ---- convert */

static void test_convert(void)
{
    /* fp32 -> bf16 over the special values and random bits of test_bf16_round, then back */
    static const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x7f7fffffu, 0x7f800000u,
                                       0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x00008000u};
    const size_t ns = sizeof special / sizeof special[0], n = ns + 50000;
    uint32_t *bits = xmalloc(sizeof(uint32_t) * n);
    memcpy(bits, special, sizeof special);
    for (size_t i = ns; i < n; i++) {
        uint32_t w[4];
        mt_rng_philox(0xc0c0, 0, i, w);
        bits[i] = w[0];
    }
    struct tt x = tt_in((const float *)bits, n, MT_F32), y = tt_out(n, MT_BF16), z = tt_out(n, MT_F32);
    C->op.convert(C->ctx, tt_h(&y, 1, n), tt_h(&x, 1, n));
    G->op.convert(G->ctx, tt_d(&y, 1, n), tt_d(&x, 1, n));
    expect_tt_bytes("convert fp32 -> bf16: ties, overflow, NaN, random bits", &y);
    G->op.copy(G->ctx, y.d, y.h, tt_bytes(&y)); /* the same input on both sides */
    C->op.convert(C->ctx, tt_h(&z, 1, n), tt_h(&y, 1, n));
    G->op.convert(G->ctx, tt_d(&z, 1, n), tt_d(&y, 1, n));
    expect_tt_bytes("convert bf16 -> fp32 (exact)", &z);
    /* strided views on both sides: 37 x 50 of rows 64 (bf16) and 53 (fp32) elements; the
     * padding between rows is left as it was */
    const int R = 37, Cc = 50, lds = 64, ldd = 53;
    float *src = hrandn((size_t)R * lds, 1.0f);
    struct tt s32 = tt_in(src, (size_t)R * lds, MT_F32), s16 = tt_in(src, (size_t)R * lds, MT_BF16);
    struct tt d16 = tt_out((size_t)R * ldd, MT_BF16), d32 = tt_out((size_t)R * ldd, MT_F32);
    struct tt c16 = tt_out((size_t)R * ldd, MT_BF16), c32 = tt_out((size_t)R * ldd, MT_F32);
    const struct {
        struct tt *dst, *src;
        const char *what;
    } cases[] = {{&d16, &s32, "convert fp32 -> bf16 37x50, ld 64 -> 53"},
                 {&d32, &s16, "convert bf16 -> fp32 37x50, ld 64 -> 53"},
                 {&c16, &s16, "convert bf16 -> bf16 (copy) 37x50, ld 64 -> 53"},
                 {&c32, &s32, "convert fp32 -> fp32 (copy) 37x50, ld 64 -> 53"}};
    for (int i = 0; i < 4; i++) {
        const struct tt *dt = cases[i].dst, *st = cases[i].src;
        C->op.convert(C->ctx, mt_tview_ld(dt->h, dt->t, R, Cc, ldd), mt_tview_ld(st->h, st->t, R, Cc, lds));
        G->op.convert(G->ctx, mt_tview_ld(dt->d, dt->t, R, Cc, ldd), mt_tview_ld(st->d, st->t, R, Cc, lds));
        expect_tt_bytes(cases[i].what, dt);
    }
    free(bits);
    free(src);
    struct tt *all[] = {&x, &y, &z, &s32, &s16, &d16, &d32, &c16, &c32};
    for (int i = 0; i < 9; i++) tt_free(all[i]);
}

/* ---- gemm */

/* C (dtype tc) = alpha op(A) op(B) (+ beta C when C is fp32), A of dtype t_a, B of t_b.
 * Operands are bf16-exact unless fp32_random: then the fp32 ones are not, and the GPU
 * rounds them (NMSE_BF16), as in the fp32 cases. */
static void gemm_typed_case(bool ta, bool tb, int M, int N, int K, enum mt_dtype t_a, enum mt_dtype t_b,
                            enum mt_dtype tc, bool fp32_random)
{
    const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    float *A = hrandn(na, 1.0f), *B = hrandn(nb, 1.0f), *C0 = hrandn(nc, 1.0f);
    if (!fp32_random || t_a == MT_BF16) round_bf16(A, na);
    if (!fp32_random || t_b == MT_BF16) round_bf16(B, nb);
    const float alpha = 0.75f, beta = tc == MT_BF16 ? 0.0f : 0.5f;
    struct tt a = tt_in(A, na, t_a), b = tt_in(B, nb, t_b), c = tt_in(C0, nc, tc);
    const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    C->op.gemm(C->ctx, ta, tb, M, N, K, alpha, tt_h(&a, ar, ac), tt_h(&b, br, bc), beta, tt_h(&c, M, N));
    G->op.gemm(G->ctx, ta, tb, M, N, K, alpha, tt_d(&a, ar, ac), tt_d(&b, br, bc), beta, tt_d(&c, M, N));
    char what[128];
    snprintf(what, sizeof what, "gemm %c%c M=%d N=%d K=%d A %s%s B %s C %s%s", ta ? 'T' : 'N', tb ? 'T' : 'N', M,
             N, K, dt_name(t_a), fp32_random && t_a == MT_F32 ? " (not bf16-exact)" : "", dt_name(t_b), dt_name(tc),
             beta != 0.0f ? " beta=0.5" : "");
    const bool rounded = fp32_random && (t_a == MT_F32 || t_b == MT_F32);
    expect_tt_close(what, &c, rounded ? NMSE_BF16 : NMSE_BF16_EXACT);
    free(A);
    free(B);
    free(C0);
    tt_free(&a);
    tt_free(&b);
    tt_free(&c);
}

static void test_gemm_bf16(void)
{
    static const int shapes[][3] = {{64, 48, 32}, {37, 53, 29}, {256, 512, 1024}};
    for (int s = 0; s < (quick ? 1 : 3); s++)
        for (int mode = 0; mode < 4; mode++) {
            const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            /* the model's products: forward bf16 x bf16 -> bf16; dgrad and wgrad fp32
             * gradient x bf16 -> fp32 (beta = 0.5: the accumulation) */
            gemm_typed_case(mode & 1, mode & 2, M, N, K, MT_BF16, MT_BF16, MT_BF16, false);
            gemm_typed_case(mode & 1, mode & 2, M, N, K, MT_BF16, MT_BF16, MT_F32, false);
            gemm_typed_case(mode & 1, mode & 2, M, N, K, MT_F32, MT_BF16, MT_F32, true);
            gemm_typed_case(mode & 1, mode & 2, M, N, K, MT_BF16, MT_F32, MT_F32, true);
            gemm_typed_case(mode & 1, mode & 2, M, N, K, MT_F32, MT_F32, MT_BF16, false);
        }
}

/* ---- grouped gemm */

/* The grouped products with A of dtype t_a, B of t_b, C of tc (bf16 C: beta = 0);
 * bf16-exact operands unless an fp32 one is random (fp32_random). With fp32 C and
 * bf16-exact operands the device must also give, bit for bit, the result of the same
 * values passed as fp32. */
static void grouped_typed_case(int mode, int G_, const int32_t *counts, int M, int N, int K, enum mt_dtype t_a,
                               enum mt_dtype t_b, enum mt_dtype tc, bool fp32_random)
{
    int32_t *offs = xmalloc(sizeof(int32_t) * (G_ + 1));
    offs[0] = 0;
    for (int g = 0; g < G_; g++) offs[g + 1] = offs[g] + counts[g];
    const int rows = offs[G_];
    const size_t na = (size_t)rows * (mode == 2 ? M : K), nb = mode == 2 ? (size_t)rows * N : (size_t)G_ * N * K;
    const size_t nc = mode == 2 ? (size_t)G_ * M * N : (size_t)rows * N;
    float *A = hrandn(na, 1.0f), *B = hrandn(nb, 1.0f), *C0 = hrandn(nc, 1.0f);
    if (!fp32_random || t_a == MT_BF16) round_bf16(A, na);
    if (!fp32_random || t_b == MT_BF16) round_bf16(B, nb);
    const float beta = tc == MT_BF16 || mode == 0 ? 0.0f : 1.0f;
    const bool ta = mode == 2, tb = mode == 0;
    struct tt a = tt_in(A, na, t_a), b = tt_in(B, nb, t_b), c = tt_in(C0, nc, tc);
    int32_t *doffs = dup_to_dev(offs, sizeof(int32_t) * (G_ + 1));
    C->op.grouped_gemm(C->ctx, ta, tb, G_, offs, M, N, K, 1.0f, grouped_view(mode, 'A', a.h, t_a, G_, rows, M, N, K),
                       grouped_view(mode, 'B', b.h, t_b, G_, rows, M, N, K), beta,
                       grouped_view(mode, 'C', c.h, tc, G_, rows, M, N, K));
    G->op.grouped_gemm(G->ctx, ta, tb, G_, doffs, M, N, K, 1.0f, grouped_view(mode, 'A', a.d, t_a, G_, rows, M, N, K),
                       grouped_view(mode, 'B', b.d, t_b, G_, rows, M, N, K), beta,
                       grouped_view(mode, 'C', c.d, tc, G_, rows, M, N, K));
    static const char *names[] = {"fwd xW^T", "dgrad xW", "wgrad A^TB"};
    char what[160];
    snprintf(what, sizeof what, "grouped_gemm %s G=%d rows=%d M=%d N=%d K=%d A %s%s B %s C %s", names[mode], G_, rows,
             M, N, K, dt_name(t_a), fp32_random && t_a == MT_F32 ? " (not bf16-exact)" : "", dt_name(t_b),
             dt_name(tc));
    const bool rounded = fp32_random && (t_a == MT_F32 || t_b == MT_F32);
    expect_tt_close(what, &c, rounded ? NMSE_BF16 : NMSE_BF16_EXACT);
    if (!rounded && tc == MT_F32 && !selftest) { /* the same values as fp32: the same bits */
        struct tt a32 = tt_in(A, na, MT_F32), b32 = tt_in(B, nb, MT_F32), c32 = tt_in(C0, nc, MT_F32);
        G->op.grouped_gemm(G->ctx, ta, tb, G_, doffs, M, N, K, 1.0f,
                           grouped_view(mode, 'A', a32.d, MT_F32, G_, rows, M, N, K),
                           grouped_view(mode, 'B', b32.d, MT_F32, G_, rows, M, N, K), beta,
                           grouped_view(mode, 'C', c32.d, MT_F32, G_, rows, M, N, K));
        void *want = dev_to_host(c32.d, sizeof(float) * nc);
        snprintf(what, sizeof what, "grouped_gemm %s G=%d: %s/%s operands = fp32 operands", names[mode], G_,
                 dt_name(t_a), dt_name(t_b));
        expect_bytes_dev(what, want, c.d, sizeof(float) * nc);
        free(want);
        tt_free(&a32);
        tt_free(&b32);
        tt_free(&c32);
    }
    free(offs);
    free(A);
    free(B);
    free(C0);
    dfree(doffs);
    tt_free(&a);
    tt_free(&b);
    tt_free(&c);
}

static void test_grouped_gemm_bf16(void)
{
    static const int32_t small[8] = {5, 0, 130, 64, 1, 0, 257, 33};
    for (int mode = 0; mode < 3; mode++) {
        /* the model's: forward bf16 x bf16 -> bf16; dgrad and wgrad fp32 x bf16 -> fp32 */
        if (mode == 0) grouped_typed_case(0, 8, small, 96, 128, 64, MT_BF16, MT_BF16, MT_BF16, false);
        else grouped_typed_case(mode, 8, small, 96, 128, 64, MT_F32, MT_BF16, MT_F32, true);
        grouped_typed_case(mode, 8, small, 96, 128, 64, MT_BF16, MT_BF16, MT_F32, false);
        if (quick) continue;
        grouped_typed_case(mode, 8, small, 96, 128, 64, MT_BF16, MT_F32, MT_F32, false);
        grouped_typed_case(mode, 8, small, 96, 128, 64, MT_F32, MT_F32, MT_BF16, false);
        /* sizes off multiples of 4: the element-wise loaders and stores */
        grouped_typed_case(mode, 8, small, 30, 50, 30, MT_BF16, MT_BF16, MT_F32, false);
        grouped_typed_case(mode, 8, small, 30, 50, 30, MT_BF16, MT_F32, MT_BF16, false);
        grouped_typed_case(mode, 8, small, 30, 50, 30, MT_F32, MT_BF16, MT_F32, true);
    }
}

/* ---- layers */

static void test_layers_bf16(void)
{
    const enum mt_dtype B16 = MT_BF16, F32 = MT_F32;
    /* embedding: bf16 table into bf16 and fp32 rows, fp32 table into bf16 rows */
    for (int s = 0; s < 2; s++) {
        const int N = s ? 257 : 300, V = s ? 13 : 50, Cc = s ? 30 : 64;
        int32_t *tok = xmalloc(sizeof(int32_t) * N);
        for (int n = 0; n < N; n++) tok[n] = n % 9 == 4 ? -1 : (int32_t)mt_rng_below(3, 7, (uint64_t)n, (uint64_t)V);
        int32_t *dtok = dup_to_dev(tok, sizeof(int32_t) * N);
        float *wte = hrandn((size_t)V * Cc, 1.0f);
        static const enum mt_dtype combos[][2] = {{MT_BF16, MT_BF16}, {MT_BF16, MT_F32}, {MT_F32, MT_BF16}};
        for (int i = 0; i < 3; i++) {
            struct tt w = tt_in(wte, (size_t)V * Cc, combos[i][1]), o = tt_out((size_t)N * Cc, combos[i][0]);
            C->op.embedding_fwd(C->ctx, tt_h(&o, N, Cc), tok, tt_h(&w, V, Cc), N, Cc);
            G->op.embedding_fwd(G->ctx, tt_d(&o, N, Cc), dtok, tt_d(&w, V, Cc), N, Cc);
            char what[96];
            snprintf(what, sizeof what, "embedding_fwd N=%d C=%d out %s wte %s", N, Cc, dt_name(o.t), dt_name(w.t));
            expect_tt_bytes(what, &o);
            tt_free(&w);
            tt_free(&o);
        }
        free(tok);
        free(wte);
        dfree(dtok);
    }
    /* rmsnorm: bf16 x and w (the model's), forward into bf16; w fp32 with x bf16 */
    static const int rshapes[][2] = {{64, 256}, {33, 4097}, {300, 128}};
    for (int s = 0; s < (quick ? 1 : 3); s++) {
        const int N = rshapes[s][0], Cc = rshapes[s][1];
        const size_t nx = (size_t)N * Cc;
        float *x = hrandn(nx, 1.0f), *w = hrandn(Cc, 0.1f), *dout = hrandn(nx, 1.0f), *dx0 = hrandn(nx, 1.0f);
        float *dw0 = hrandn(Cc, 1.0f);
        for (int c = 0; c < Cc; c++) w[c] += 1.0f;
        for (int wt = 0; wt < 2; wt++) {
            struct tt tx = tt_in(x, nx, B16), tw = tt_in(w, Cc, wt ? F32 : B16), o = tt_out(nx, B16);
            struct tt rstd = tt_out(N, F32), dx = tt_in(dx0, nx, F32), dw = tt_in(dw0, Cc, F32);
            struct tt dd = tt_in(dout, nx, F32);
            C->op.rmsnorm_fwd(C->ctx, tt_h(&o, N, Cc), rstd.h, tt_h(&tx, N, Cc), tt_h(&tw, 1, Cc), N, Cc, 1e-6f);
            G->op.rmsnorm_fwd(G->ctx, tt_d(&o, N, Cc), rstd.d, tt_d(&tx, N, Cc), tt_d(&tw, 1, Cc), N, Cc, 1e-6f);
            char what[96];
            snprintf(what, sizeof what, "rmsnorm_fwd out bf16 N=%d C=%d x bf16 w %s", N, Cc, dt_name(tw.t));
            expect_tt_ulp(what, &o, NMSE_FP32);
            snprintf(what, sizeof what, "rmsnorm_fwd rstd N=%d C=%d x bf16", N, Cc);
            expect_tt_close(what, &rstd, NMSE_FP32);
            G->op.copy(G->ctx, rstd.d, rstd.h, sizeof(float) * N); /* the backward on the reference's rstd */
            C->op.rmsnorm_bwd(C->ctx, dx.h, dw.h, dd.h, tt_h(&tx, N, Cc), tt_h(&tw, 1, Cc), rstd.h, N, Cc);
            G->op.rmsnorm_bwd(G->ctx, dx.d, dw.d, dd.d, tt_d(&tx, N, Cc), tt_d(&tw, 1, Cc), rstd.d, N, Cc);
            snprintf(what, sizeof what, "rmsnorm_bwd dx N=%d C=%d x bf16 w %s (+=)", N, Cc, dt_name(tw.t));
            expect_tt_close(what, &dx, NMSE_FP32);
            snprintf(what, sizeof what, "rmsnorm_bwd dw N=%d C=%d x bf16 w %s (+=)", N, Cc, dt_name(tw.t));
            expect_tt_close(what, &dw, NMSE_FP32_SUM);
            struct tt *all[] = {&tx, &tw, &o, &rstd, &dx, &dw, &dd};
            for (int i = 0; i < 7; i++) tt_free(all[i]);
        }
        free(x);
        free(w);
        free(dout);
        free(dx0);
        free(dw0);
    }
    /* rope forward: bf16 in, bf16 out, in place (q and k in the model) and not */
    static const int pshapes[][4] = {{2, 37, 3, 64}, {3, 5, 2, 6}};
    for (int s = 0; s < 2; s++) {
        const int B = pshapes[s][0], T = pshapes[s][1], H = pshapes[s][2], D = pshapes[s][3];
        const size_t n = (size_t)B * T * H * D;
        float *x = hrandn(n, 1.0f);
        struct tt tx = tt_in(x, n, B16), o = tt_out(n, B16), o32 = tt_out(n, F32);
        C->op.rope_fwd(C->ctx, tt_h(&o, B * T, H * D), tt_h(&tx, B * T, H * D), B, T, H, D, 1e4f);
        G->op.rope_fwd(G->ctx, tt_d(&o, B * T, H * D), tt_d(&tx, B * T, H * D), B, T, H, D, 1e4f);
        char what[96];
        snprintf(what, sizeof what, "rope_fwd bf16 B=%d T=%d H=%d D=%d", B, T, H, D);
        expect_tt_bytes(what, &o);
        C->op.rope_fwd(C->ctx, tt_h(&o32, B * T, H * D), tt_h(&tx, B * T, H * D), B, T, H, D, 1e4f);
        G->op.rope_fwd(G->ctx, tt_d(&o32, B * T, H * D), tt_d(&tx, B * T, H * D), B, T, H, D, 1e4f);
        snprintf(what, sizeof what, "rope_fwd bf16 -> fp32 B=%d T=%d H=%d D=%d", B, T, H, D);
        expect_tt_bytes(what, &o32);
        G->op.rope_fwd(G->ctx, tt_d(&tx, B * T, H * D), tt_d(&tx, B * T, H * D), B, T, H, D, 1e4f);
        snprintf(what, sizeof what, "rope_fwd bf16 B=%d T=%d H=%d D=%d (in place)", B, T, H, D);
        expect_bytes_dev(what, o.h, tx.d, tt_bytes(&tx));
        free(x);
        tt_free(&tx);
        tt_free(&o);
        tt_free(&o32);
    }
    /* swiglu and add: the vector path and the scalar one (odd sizes) */
    static const int sshapes[][2] = {{1000, 64}, {33, 17}};
    for (int s = 0; s < 2; s++) {
        const int N = sshapes[s][0], F = sshapes[s][1];
        const size_t n = (size_t)N * F;
        float *g = hrandn(n, 2.0f), *u = hrandn(n, 1.0f), *d = hrandn(n, 1.0f);
        struct tt tg = tt_in(g, n, B16), tu = tt_in(u, n, B16), o = tt_out(n, B16), tu32 = tt_in(u, n, F32);
        struct tt dg = tt_out(n, F32), du = tt_out(n, F32), dd = tt_in(d, n, F32), sum = tt_out(n, B16);
        char what[96];
        C->op.swiglu_fwd(C->ctx, tt_h(&o, N, F), tt_h(&tg, N, F), tt_h(&tu, N, F), N, F);
        G->op.swiglu_fwd(G->ctx, tt_d(&o, N, F), tt_d(&tg, N, F), tt_d(&tu, N, F), N, F);
        snprintf(what, sizeof what, "swiglu_fwd bf16 N=%d F=%d", N, F);
        expect_tt_ulp(what, &o, NMSE_FP32);
        C->op.swiglu_bwd(C->ctx, dg.h, du.h, dd.h, tt_h(&tg, N, F), tt_h(&tu, N, F), N, F);
        G->op.swiglu_bwd(G->ctx, dg.d, du.d, dd.d, tt_d(&tg, N, F), tt_d(&tu, N, F), N, F);
        snprintf(what, sizeof what, "swiglu_bwd dgate N=%d F=%d gate, up bf16", N, F);
        expect_tt_close(what, &dg, NMSE_FP32);
        snprintf(what, sizeof what, "swiglu_bwd dup N=%d F=%d gate, up bf16", N, F);
        expect_tt_close(what, &du, NMSE_FP32);
        /* the residual: bf16 stream += fp32 branch output, in place; and bf16 + bf16 */
        C->op.add(C->ctx, tt_h(&sum, 1, n), tt_h(&tg, 1, n), tt_h(&tu, 1, n), n);
        G->op.add(G->ctx, tt_d(&sum, 1, n), tt_d(&tg, 1, n), tt_d(&tu, 1, n), n);
        snprintf(what, sizeof what, "add bf16 = bf16 + bf16 n=%zu", n);
        expect_tt_bytes(what, &sum);
        C->op.add(C->ctx, tt_h(&tg, 1, n), tt_h(&tg, 1, n), tt_h(&tu32, 1, n), n);
        G->op.add(G->ctx, tt_d(&tg, 1, n), tt_d(&tg, 1, n), tt_d(&tu32, 1, n), n);
        snprintf(what, sizeof what, "add bf16 += fp32 n=%zu (in place)", n);
        expect_tt_bytes(what, &tg);
        free(g);
        free(u);
        free(d);
        struct tt *all[] = {&tg, &tu, &o, &tu32, &dg, &du, &dd, &sum};
        for (int i = 0; i < 8; i++) tt_free(all[i]);
    }
}

/* ---- attention */

/* q, k, v as bf16 (the model's): the CPU's results with the fp32 cases' bounds, and the
 * device's equal, bit for bit, to its run on the same values as fp32. */
static void attention_bf16_case(struct att_shape a)
{
    const size_t nq = (size_t)a.B * a.T * a.Hq * a.D, nkv = (size_t)a.B * a.T * a.Hkv * a.D;
    const size_t nlse = (size_t)a.B * a.Hq * a.T;
    const int64_t rows = (int64_t)a.B * a.T, qc = (int64_t)a.Hq * a.D, kc = (int64_t)a.Hkv * a.D;
    float *q = hrandn(nq, 1.0f), *k = hrandn(nkv, 1.0f), *v = hrandn(nkv, 1.0f), *dout = hrandn(nq, 1.0f);
    round_bf16(q, nq);
    round_bf16(k, nkv);
    round_bf16(v, nkv);
    struct tt tq = tt_in(q, nq, MT_BF16), tk = tt_in(k, nkv, MT_BF16), tv = tt_in(v, nkv, MT_BF16);
    struct tt q32 = tt_in(q, nq, MT_F32), k32 = tt_in(k, nkv, MT_F32), v32 = tt_in(v, nkv, MT_F32);
    struct tt dd = tt_in(dout, nq, MT_F32), out = tt_out(nq, MT_F32), lse = tt_out(nlse, MT_F32);
    struct tt dq = tt_out(nq, MT_F32), dk = tt_out(nkv, MT_F32), dv = tt_out(nkv, MT_F32);
    C->op.attention_fwd(C->ctx, out.h, lse.h, tt_h(&tq, rows, qc), tt_h(&tk, rows, kc), tt_h(&tv, rows, kc), a.B,
                        a.T, a.Hq, a.Hkv, a.D);
    C->op.attention_bwd(C->ctx, dq.h, dk.h, dv.h, dd.h, tt_h(&tq, rows, qc), tt_h(&tk, rows, kc), tt_h(&tv, rows, kc),
                        out.h, lse.h, a.B, a.T, a.Hq, a.Hkv, a.D);
    G->op.attention_fwd(G->ctx, out.d, lse.d, tt_d(&tq, rows, qc), tt_d(&tk, rows, kc), tt_d(&tv, rows, kc), a.B,
                        a.T, a.Hq, a.Hkv, a.D);
    G->op.attention_bwd(G->ctx, dq.d, dk.d, dv.d, dd.d, tt_d(&tq, rows, qc), tt_d(&tk, rows, kc), tt_d(&tv, rows, kc),
                        out.d, lse.d, a.B, a.T, a.Hq, a.Hkv, a.D);
    char sh[80], what[128];
    snprintf(sh, sizeof sh, "B=%d T=%d Hq=%d Hkv=%d D=%d q,k,v bf16", a.B, a.T, a.Hq, a.Hkv, a.D);
    const struct {
        struct tt *x;
        const char *name;
        double bound;
    } outs[] = {{&out, "attention_fwd out", NMSE_ATT_FWD}, {&lse, "attention_fwd lse", NMSE_BF16_EXACT},
                {&dq, "attention_bwd dq", NMSE_ATT_BWD},   {&dk, "attention_bwd dk", NMSE_ATT_BWD},
                {&dv, "attention_bwd dv", NMSE_ATT_BWD}};
    for (int i = 0; i < 5; i++) {
        snprintf(what, sizeof what, "%s %s", outs[i].name, sh);
        expect_tt_close(what, outs[i].x, outs[i].bound);
    }
    if (!selftest) { /* the same values as fp32 on the device */
        float *want[5];
        for (int i = 0; i < 5; i++) want[i] = dev_to_host(outs[i].x->d, tt_bytes(outs[i].x));
        G->op.attention_fwd(G->ctx, out.d, lse.d, tt_d(&q32, rows, qc), tt_d(&k32, rows, kc), tt_d(&v32, rows, kc),
                            a.B, a.T, a.Hq, a.Hkv, a.D);
        G->op.attention_bwd(G->ctx, dq.d, dk.d, dv.d, dd.d, tt_d(&q32, rows, qc), tt_d(&k32, rows, kc),
                            tt_d(&v32, rows, kc), out.d, lse.d, a.B, a.T, a.Hq, a.Hkv, a.D);
        bool same = true;
        for (int i = 0; i < 5; i++) {
            float *got = dev_to_host(outs[i].x->d, tt_bytes(outs[i].x));
            same = same && !memcmp(want[i], got, tt_bytes(outs[i].x));
            free(got);
            free(want[i]);
        }
        snprintf(what, sizeof what, "attention fwd+bwd %s = fp32 q,k,v", sh);
        expect_true(what, same, same ? "bit-identical" : "differ");
    }
    free(q);
    free(k);
    free(v);
    free(dout);
    struct tt *all[] = {&tq, &tk, &tv, &q32, &k32, &v32, &dd, &out, &lse, &dq, &dk, &dv};
    for (int i = 0; i < 12; i++) tt_free(all[i]);
}

static void test_attention_bf16(void)
{
    static const struct att_shape shapes[] = {
        {2, 100, 4, 2, 64},  /* GQA, partial tile: 8-byte loads */
        {1, 256, 8, 2, 128}, /* head_dim 128 */
        {1, 50, 2, 2, 18},   /* head_dim not a multiple of 4: element loads */
    };
    for (size_t i = 0; i < (quick ? 1 : sizeof shapes / sizeof shapes[0]); i++) attention_bf16_case(shapes[i]);
}

/* ---- permute, unpermute: on a reference dispatch plan (dispatch_case) */

static void permute_bf16(const int32_t *row_slot, const int32_t *slot_row, const int32_t *d_rs, const int32_t *d_sr,
                         const float *prob, const float *d_prob, int N, int k, int rows, int Cc, const char *sh)
{
    const size_t nx = (size_t)N * Cc, np = (size_t)rows * Cc;
    float *x = hrandn(nx, 1.0f), *yp = hrandn(np, 1.0f), *dout = hrandn(nx, 1.0f);
    struct tt tx = tt_in(x, nx, MT_BF16), xp = tt_out(np, MT_BF16), typ = tt_in(yp, np, MT_BF16);
    struct tt out = tt_out(nx, MT_BF16), dd = tt_in(dout, nx, MT_F32), dyp = tt_out(np, MT_F32);
    struct tt dprob = tt_out((size_t)N * k, MT_F32);
    char what[160];
    C->op.permute_fwd(C->ctx, tt_h(&xp, rows, Cc), tt_h(&tx, N, Cc), row_slot, rows, k, Cc);
    G->op.permute_fwd(G->ctx, tt_d(&xp, rows, Cc), tt_d(&tx, N, Cc), d_rs, rows, k, Cc);
    snprintf(what, sizeof what, "permute_fwd bf16 C=%d %s", Cc, sh);
    expect_tt_bytes(what, &xp);
    C->op.unpermute_fwd(C->ctx, tt_h(&out, N, Cc), tt_h(&typ, rows, Cc), slot_row, prob, N, k, Cc);
    G->op.unpermute_fwd(G->ctx, tt_d(&out, N, Cc), tt_d(&typ, rows, Cc), d_sr, d_prob, N, k, Cc);
    snprintf(what, sizeof what, "unpermute_fwd bf16 C=%d %s", Cc, sh);
    expect_tt_bytes(what, &out);
    C->op.unpermute_bwd(C->ctx, dyp.h, dprob.h, dd.h, tt_h(&typ, rows, Cc), slot_row, prob, N, k, Cc, rows);
    G->op.unpermute_bwd(G->ctx, dyp.d, dprob.d, dd.d, tt_d(&typ, rows, Cc), d_sr, d_prob, N, k, Cc, rows);
    snprintf(what, sizeof what, "unpermute_bwd dyp, yp bf16 C=%d %s", Cc, sh);
    expect_tt_bytes(what, &dyp);
    snprintf(what, sizeof what, "unpermute_bwd dprob, yp bf16 C=%d %s", Cc, sh);
    expect_tt_close(what, &dprob, NMSE_FP32);
    free(x);
    free(yp);
    free(dout);
    struct tt *all[] = {&tx, &xp, &typ, &out, &dd, &dyp, &dprob};
    for (int i = 0; i < 7; i++) tt_free(all[i]);
}

/* ---- fp8 arguments are refused */

static void *fp8_buf; /* 64 bytes of device memory for the children below */

static void fp8_convert(void)
{
    G->op.convert(G->ctx, mt_tview(fp8_buf, MT_E4M3, 1, 4), mt_tview(fp8_buf, MT_F32, 1, 4));
}
static void fp8_gemm(void)
{
    G->op.gemm(G->ctx, false, false, 2, 2, 2, 1.0f, mt_tview(fp8_buf, MT_E5M2, 2, 2), mt_tview(fp8_buf, MT_BF16, 2, 2),
               0.0f, mt_tview(fp8_buf, MT_F32, 2, 2));
}
static void fp8_add(void)
{
    G->op.add(G->ctx, mt_tview(fp8_buf, MT_E4M3, 1, 4), mt_tview(fp8_buf, MT_F32, 1, 4),
              mt_tview(fp8_buf, MT_F32, 1, 4), 4);
}

/* Runs f in a child with stderr captured; its wait status, its stderr in msg. */
static int in_child(void (*f)(void), char *msg, size_t len)
{
    int fd[2];
    if (pipe(fd) != 0) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        signal(SIGABRT, SIG_DFL);
        f();
        _exit(0);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t n;
    while (got + 1 < len && (n = read(fd[0], msg + got, len - 1 - got)) > 0) got += (size_t)n;
    msg[got] = '\0';
    close(fd[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return status;
}

/* An op given an fp8 tensor aborts, naming the op and the dtype (the device backend; the
 * CPU reference's message is its own). */
static void test_fp8_refused(void)
{
    fp8_buf = dalloc(64);
    const struct {
        void (*f)(void);
        const char *op;
    } cases[] = {{fp8_convert, "convert"}, {fp8_gemm, "gemm"}, {fp8_add, "add"}};
    for (int i = 0; i < 3; i++) {
        char msg[1024], what[96], d[160];
        const int st = in_child(cases[i].f, msg, sizeof msg);
        const bool aborted = st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
        const bool named = selftest || (strstr(msg, cases[i].op) && strstr(msg, "fp8"));
        snprintf(what, sizeof what, "%s with an fp8 tensor aborts", cases[i].op);
        snprintf(d, sizeof d, "%s; stderr: %.100s", aborted ? "SIGABRT" : "did not abort", msg);
        for (char *p = d; *p; p++)
            if (*p == '\n') *p = ' ';
        expect_true(what, aborted && named, d);
    }
    dfree(fp8_buf);
}

/* ------------------------------------------------------------------ mixture of experts */

struct router_case {
    int N, E, k;
    enum mt_score_fn fn;
    bool pre, bias;
    float sf;
};

static void router_case(struct router_case r)
{
    struct mt_router_args a = {r.N, r.E, r.k, r.fn, r.pre, r.sf};
    const size_t nl = (size_t)r.N * r.E, nk = (size_t)r.N * r.k;
    float *logits = hrandn(nl, 2.0f), *bias = r.bias ? hrandn(r.E, 0.1f) : NULL;
    int32_t *idx = xmalloc(sizeof(int32_t) * nk);
    float *prob = xmalloc(sizeof(float) * nk), *dprob = hrandn(nk, 1.0f), *dl0 = hrandn(nl, 1.0f);
    float *dl = hdup(dl0, sizeof(float) * nl);
    C->op.router_fwd(C->ctx, &a, logits, bias, idx, prob);
    C->op.router_bwd(C->ctx, &a, dl, dprob, logits, idx);
    float *d_l = dup_to_dev(logits, sizeof(float) * nl), *d_b = bias ? dup_to_dev(bias, sizeof(float) * r.E) : NULL;
    int32_t *d_idx = dalloc(sizeof(int32_t) * nk);
    float *d_prob = dalloc(sizeof(float) * nk), *d_dp = dup_to_dev(dprob, sizeof(float) * nk);
    float *d_dl = dup_to_dev(dl0, sizeof(float) * nl);
    G->op.router_fwd(G->ctx, &a, d_l, d_b, d_idx, d_prob);
    char sh[96], what[128];
    snprintf(sh, sizeof sh, "N=%d E=%d k=%d %s%s%s sf=%g", r.N, r.E, r.k, r.fn == MT_SCORE_SOFTMAX ? "softmax" : "sigmoid",
             r.fn == MT_SCORE_SOFTMAX ? (r.pre ? " pre" : " post") : "", r.bias ? " bias" : "", (double)r.sf);
    snprintf(what, sizeof what, "router_fwd idx %s", sh);
    expect_bytes_dev(what, idx, d_idx, sizeof(int32_t) * nk);
    snprintf(what, sizeof what, "router_fwd prob %s", sh);
    expect_close_dev(what, prob, d_prob, nk, NMSE_FP32);
    G->op.copy(G->ctx, d_idx, idx, sizeof(int32_t) * nk); /* the backward on the reference's choice */
    G->op.router_bwd(G->ctx, &a, d_dl, d_dp, d_l, d_idx);
    snprintf(what, sizeof what, "router_bwd dlogits %s (+=)", sh);
    expect_close_dev(what, dl, d_dl, nl, NMSE_FP32);
    free(logits);
    free(bias);
    free(idx);
    free(prob);
    free(dprob);
    free(dl0);
    free(dl);
    dfree(d_l);
    if (d_b) dfree(d_b);
    dfree(d_idx);
    dfree(d_prob);
    dfree(d_dp);
    dfree(d_dl);
}

static void test_router(void)
{
    static const struct router_case cases[] = {
        {257, 128, 8, MT_SCORE_SOFTMAX, false, false, 0.0f},
        {257, 128, 8, MT_SCORE_SOFTMAX, true, false, 2.5f},
        {100, 64, 1, MT_SCORE_SOFTMAX, true, false, 0.0f},
        {300, 160, 6, MT_SCORE_SIGMOID, false, true, 2.5f},
        {64, 32, 1, MT_SCORE_SIGMOID, false, true, 0.0f},
        {64, 128, 8, MT_SCORE_SIGMOID, false, false, 0.0f},
        {40, 8, 2, MT_SCORE_SOFTMAX, false, true, 0.0f},
    };
    for (size_t i = 0; i < (quick ? 1 : sizeof cases / sizeof cases[0]); i++) router_case(cases[i]);
}

/* One call of the balancing-loss ops on num_tokens tokens starting at token `first` of
 * num_seqs sequences of seq_len tokens (a sequence-parallel shard when it is not the
 * whole); the counts passed to the loss are the whole's, as the model sums them. */
static void aux_case(int num_seqs, int seq_len, long long first, int ntok, int E, int k, enum mt_score_fn fn)
{
    struct mt_aux_args a = {ntok, E, k, fn, num_seqs, seq_len, first, 0.01f};
    const size_t nl = (size_t)ntok * E, nc = (size_t)num_seqs * E;
    float *logits = hrandn(nl, 1.5f), *dl0 = hrandn(nl, 1.0f), *dl = hdup(dl0, sizeof(float) * nl);
    float *counts = xmalloc(sizeof(float) * nc), *whole = hrandn(nc, 0.0f);
    double loss = 0.0, gloss = 0.0; /* the ops add to these: from 0, the loss */
    for (size_t i = 0; i < nc; i++) whole[i] = (float)mt_rng_below(13, 0, i, (uint64_t)seq_len * k / E + 2);
    C->op.aux_counts(C->ctx, &a, counts, logits);
    C->op.aux_loss_fwd(C->ctx, &a, &loss, whole, logits);
    C->op.aux_loss_bwd(C->ctx, &a, dl, 0.7f, whole, logits);
    float *d_l = dup_to_dev(logits, sizeof(float) * nl), *d_c = dalloc(sizeof(float) * nc);
    float *d_w = dup_to_dev(whole, sizeof(float) * nc), *d_dl = dup_to_dev(dl0, sizeof(float) * nl);
    G->op.aux_counts(G->ctx, &a, d_c, d_l);
    double *d_acc = dup_to_dev(&gloss, sizeof gloss);
    G->op.aux_loss_fwd(G->ctx, &a, d_acc, d_w, d_l);
    G->op.copy(G->ctx, &gloss, d_acc, sizeof gloss);
    dfree(d_acc);
    G->op.aux_loss_bwd(G->ctx, &a, d_dl, 0.7f, d_w, d_l);
    char sh[96], what[160], d[96];
    snprintf(sh, sizeof sh, "seqs=%d len=%d first=%lld N=%d E=%d k=%d %s", num_seqs, seq_len, first, ntok, E, k,
             fn == MT_SCORE_SIGMOID ? "sigmoid" : "softmax");
    snprintf(what, sizeof what, "aux_counts %s", sh);
    expect_bytes_dev(what, counts, d_c, sizeof(float) * nc);
    double rel = fabs(gloss - loss) / fabs(loss);
    snprintf(what, sizeof what, "aux_loss_fwd %s", sh);
    snprintf(d, sizeof d, "%.7g vs %.7g, relative %.1e (bound 1e-5)", gloss, loss, rel);
    expect_true(what, rel <= 1e-5, d);
    snprintf(what, sizeof what, "aux_loss_bwd dlogits %s (+=)", sh);
    expect_close_dev(what, dl, d_dl, nl, NMSE_FP32);
    free(logits);
    free(dl0);
    free(dl);
    free(counts);
    free(whole);
    dfree(d_l);
    dfree(d_c);
    dfree(d_w);
    dfree(d_dl);
}

static void test_balancing_losses(void)
{
    for (int fn = 0; fn < 2; fn++) {
        enum mt_score_fn f = (enum mt_score_fn)fn;
        aux_case(1, 256, 0, 256, 64, 8, f);  /* aux_loss, the whole batch */
        aux_case(4, 64, 0, 256, 64, 8, f);   /* seq_aux_loss, 4 sequences */
        if (quick) continue;
        aux_case(3, 100, 0, 300, 24, 2, f);
        aux_case(4, 300, 450, 300, 32, 4, f); /* a shard starting inside sequence 1 */
        aux_case(1, 2000, 1000, 600, 128, 8, f);
    }
    /* z-loss */
    const int N = 300, E = 64;
    const size_t nl = (size_t)N * E;
    float *logits = hrandn(nl, 3.0f), *dl0 = hrandn(nl, 1.0f), *dl = hdup(dl0, sizeof(float) * nl);
    float *lse = xmalloc(sizeof(float) * N);
    double z = 0.0, gz = 0.0;
    C->op.z_loss_fwd(C->ctx, &z, lse, logits, N, E, 1e-3f);
    C->op.z_loss_bwd(C->ctx, dl, 0.7f, lse, logits, N, E, 1e-3f);
    float *d_l = dup_to_dev(logits, sizeof(float) * nl), *d_lse = dalloc(sizeof(float) * N);
    float *d_dl = dup_to_dev(dl0, sizeof(float) * nl);
    double *d_z = dup_to_dev(&gz, sizeof gz);
    G->op.z_loss_fwd(G->ctx, d_z, d_lse, d_l, N, E, 1e-3f);
    G->op.copy(G->ctx, &gz, d_z, sizeof gz);
    dfree(d_z);
    char d[96];
    double rel = fabs(gz - z) / fabs(z);
    snprintf(d, sizeof d, "%.7g vs %.7g, relative %.1e (bound 1e-6)", gz, z, rel);
    expect_true("z_loss_fwd loss N=300 E=64", rel <= 1e-6, d);
    expect_close_dev("z_loss_fwd lse N=300 E=64", lse, d_lse, N, NMSE_FP32);
    G->op.copy(G->ctx, d_lse, lse, sizeof(float) * N);
    G->op.z_loss_bwd(G->ctx, d_dl, 0.7f, d_lse, d_l, N, E, 1e-3f);
    expect_close_dev("z_loss_bwd dlogits N=300 E=64 (+=)", dl, d_dl, nl, NMSE_FP32);
    free(logits);
    free(dl0);
    free(dl);
    free(lse);
    dfree(d_l);
    dfree(d_lse);
    dfree(d_dl);
}

struct plan_host {
    int E, rows_max, S;
    int32_t *offsets, *row_slot, *slot_row;
    int64_t *kept;
};

static void plan_host_alloc(struct plan_host *p, int N, int E, int k, int cap, bool pad)
{
    p->E = E;
    p->S = N * k;
    p->rows_max = pad && cap > 0 ? E * cap : N * k;
    p->offsets = xmalloc(sizeof(int32_t) * (E + 1));
    p->row_slot = xmalloc(sizeof(int32_t) * (p->rows_max + 1));
    p->slot_row = xmalloc(sizeof(int32_t) * (p->S + 1));
    p->kept = xmalloc(sizeof(int64_t) * E);
}

static void plan_host_free(struct plan_host *p)
{
    free(p->offsets);
    free(p->row_slot);
    free(p->slot_row);
    free(p->kept);
}

/* Routing of N tokens over E experts: the CPU router on random logits, or a skewed
 * assignment (most tokens on the first experts), with probabilities on a coarse grid
 * so that the probability drop policy meets ties. */
static void make_routing(int N, int E, int k, bool skew, int32_t *idx, float *prob)
{
    if (skew) {
        for (int n = 0; n < N; n++)
            for (int j = 0; j < k; j++) idx[(size_t)n * k + j] = (j + (n % 5 ? 0 : n)) % E;
    } else {
        struct mt_router_args a = {N, E, k, MT_SCORE_SOFTMAX, true, 0.0f};
        float *logits = hrandn((size_t)N * E, 1.0f);
        C->op.router_fwd(C->ctx, &a, logits, NULL, idx, prob);
        free(logits);
    }
    for (size_t s = 0; s < (size_t)N * k; s++) prob[s] = (float)mt_rng_below(11, 0, s, 4) * 0.25f;
}

/* Marks every 13th assignment as routed nowhere (-1): no row, not counted as dropped. */
static void unroute_some(int32_t *idx, size_t S)
{
    for (size_t s = 5; s < S; s += 13) idx[s] = -1;
}

static void dispatch_case(int N, int E, int k, int cap, enum mt_drop_policy pol, bool pad, bool skew,
                          bool unrouted, bool also_permute)
{
    int32_t *idx = xmalloc(sizeof(int32_t) * N * k);
    float *prob = xmalloc(sizeof(float) * N * k);
    make_routing(N, E, k, skew, idx, prob);
    if (unrouted) unroute_some(idx, (size_t)N * k);
    struct plan_host h;
    plan_host_alloc(&h, N, E, k, cap, pad);
    struct mt_dispatch_plan cp = {h.offsets, h.row_slot, h.slot_row, h.kept};
    int64_t dropped = 0, *load = xmalloc(sizeof(int64_t) * E);
    for (int e = 0; e < E; e++) load[e] = e; /* the ops add to it */
    C->op.dispatch_plan(C->ctx, &cp, idx, prob, N, E, k, cap, pol, pad, &dropped, load);
    const int rows = h.offsets[E];
    int32_t *d_idx = dup_to_dev(idx, sizeof(int32_t) * N * k);
    float *d_prob = dup_to_dev(prob, sizeof(float) * N * k);
    struct mt_dispatch_plan gp = {dalloc(sizeof(int32_t) * (E + 1)), dalloc(sizeof(int32_t) * (h.rows_max + 1)),
                                  dalloc(sizeof(int32_t) * (h.S + 1)), dalloc(sizeof(int64_t) * E)};
    char sh[128], what[160], d[64];
    snprintf(sh, sizeof sh, "N=%d E=%d k=%d cap=%d %s%s%s%s", N, E, k, cap, pol == MT_DROP_PROBS ? "probs" : "position",
             pad ? " pad" : "", skew ? " skewed" : "", unrouted ? " some -1" : "");
    for (int run = 0; run < 2; run++) { /* the second run checks determinism */
        /* dropped and load accumulators in one allocation, from what the CPU's started at */
        int64_t gd = 0, *d_acc = dalloc(sizeof(int64_t) * (E + 1));
        int64_t *init = xmalloc(sizeof(int64_t) * (E + 1));
        init[0] = 0;
        for (int e = 0; e < E; e++) init[1 + e] = e;
        G->op.copy(G->ctx, d_acc, init, sizeof(int64_t) * (E + 1));
        G->op.dispatch_plan(G->ctx, &gp, d_idx, d_prob, N, E, k, cap, pol, pad, d_acc, d_acc + 1);
        G->op.copy(G->ctx, init, d_acc, sizeof(int64_t) * (E + 1));
        gd = init[0];
        snprintf(what, sizeof what, "dispatch_plan%s dropped %s", run ? " (again)" : "", sh);
        snprintf(d, sizeof d, "%lld vs %lld", (long long)gd, (long long)dropped);
        expect_true(what, gd == dropped, d);
        snprintf(what, sizeof what, "dispatch_plan%s load (+= kept) %s", run ? " (again)" : "", sh);
        expect_true(what, !memcmp(init + 1, load, sizeof(int64_t) * E), "");
        free(init);
        dfree(d_acc);
        snprintf(what, sizeof what, "dispatch_plan%s offsets, kept %s", run ? " (again)" : "", sh);
        int32_t *go = dev_to_host(gp.offsets, sizeof(int32_t) * (E + 1));
        int64_t *gk = dev_to_host(gp.kept, sizeof(int64_t) * E);
        bool same = !memcmp(go, h.offsets, sizeof(int32_t) * (E + 1)) && !memcmp(gk, h.kept, sizeof(int64_t) * E);
        expect_true(what, same, same ? "identical" : "differ");
        free(go);
        free(gk);
        snprintf(what, sizeof what, "dispatch_plan%s row_slot %s", run ? " (again)" : "", sh);
        expect_bytes_dev(what, h.row_slot, gp.row_slot, sizeof(int32_t) * rows);
        snprintf(what, sizeof what, "dispatch_plan%s slot_row %s", run ? " (again)" : "", sh);
        expect_bytes_dev(what, h.slot_row, gp.slot_row, sizeof(int32_t) * h.S);
    }
    if (also_permute) { /* permute and unpermute on this (reference) plan */
        static const int widths[] = {64, 30};
        int32_t *d_rs = dup_to_dev(h.row_slot, sizeof(int32_t) * (rows + 1));
        int32_t *d_sr = dup_to_dev(h.slot_row, sizeof(int32_t) * h.S);
        for (int w = 0; w < 2; w++) {
            const int Cc = widths[w];
            const size_t nx = (size_t)N * Cc, np = (size_t)rows * Cc;
            float *x = hrandn(nx, 1.0f), *xp = xmalloc(sizeof(float) * (np + 1));
            float *dxp = hrandn(np + 1, 1.0f), *dx0 = hrandn(nx, 1.0f), *dx = hdup(dx0, sizeof(float) * nx);
            float *yp = hrandn(np + 1, 1.0f), *out = xmalloc(sizeof(float) * nx), *dout = hrandn(nx, 1.0f);
            float *dyp = xmalloc(sizeof(float) * (np + 1)), *dprob = xmalloc(sizeof(float) * N * k);
            C->op.permute_fwd(C->ctx, mt_f32(xp, rows, Cc), mt_f32(x, N, Cc), h.row_slot, rows, k, Cc);
            C->op.permute_bwd(C->ctx, dx, dxp, h.slot_row, N, k, Cc);
            C->op.unpermute_fwd(C->ctx, mt_f32(out, N, Cc), mt_f32(yp, rows, Cc), h.slot_row, prob, N, k, Cc);
            C->op.unpermute_bwd(C->ctx, dyp, dprob, dout, mt_f32(yp, rows, Cc), h.slot_row, prob, N, k, Cc, rows);
            float *d_x = dup_to_dev(x, sizeof(float) * nx), *d_xp = dalloc(sizeof(float) * (np + 1));
            float *d_dxp = dup_to_dev(dxp, sizeof(float) * (np + 1)), *d_dx = dup_to_dev(dx0, sizeof(float) * nx);
            float *d_yp = dup_to_dev(yp, sizeof(float) * (np + 1)), *d_out = dalloc(sizeof(float) * nx);
            float *d_dout = dup_to_dev(dout, sizeof(float) * nx), *d_dyp = dalloc(sizeof(float) * (np + 1));
            float *d_dprob = dalloc(sizeof(float) * N * k);
            G->op.permute_fwd(G->ctx, mt_f32(d_xp, rows, Cc), mt_f32(d_x, N, Cc), d_rs, rows, k, Cc);
            G->op.permute_bwd(G->ctx, d_dx, d_dxp, d_sr, N, k, Cc);
            G->op.unpermute_fwd(G->ctx, mt_f32(d_out, N, Cc), mt_f32(d_yp, rows, Cc), d_sr, d_prob, N, k, Cc);
            G->op.unpermute_bwd(G->ctx, d_dyp, d_dprob, d_dout, mt_f32(d_yp, rows, Cc), d_sr, d_prob, N, k, Cc, rows);
            snprintf(what, sizeof what, "permute_fwd C=%d %s", Cc, sh);
            expect_bytes_dev(what, xp, d_xp, sizeof(float) * np);
            snprintf(what, sizeof what, "permute_bwd C=%d %s (+=)", Cc, sh);
            expect_bytes_dev(what, dx, d_dx, sizeof(float) * nx);
            snprintf(what, sizeof what, "unpermute_fwd C=%d %s", Cc, sh);
            expect_bytes_dev(what, out, d_out, sizeof(float) * nx);
            snprintf(what, sizeof what, "unpermute_bwd dyp C=%d %s", Cc, sh);
            expect_bytes_dev(what, dyp, d_dyp, sizeof(float) * np);
            snprintf(what, sizeof what, "unpermute_bwd dprob C=%d %s", Cc, sh);
            expect_close_dev(what, dprob, d_dprob, (size_t)N * k, NMSE_FP32);
            permute_bf16(h.row_slot, h.slot_row, d_rs, d_sr, prob, d_prob, N, k, rows, Cc, sh);
            free(x);
            free(xp);
            free(dxp);
            free(dx0);
            free(dx);
            free(yp);
            free(out);
            free(dout);
            free(dyp);
            free(dprob);
            dfree(d_x);
            dfree(d_xp);
            dfree(d_dxp);
            dfree(d_dx);
            dfree(d_yp);
            dfree(d_out);
            dfree(d_dout);
            dfree(d_dyp);
            dfree(d_dprob);
        }
        dfree(d_rs);
        dfree(d_sr);
    }
    free(idx);
    free(prob);
    free(load);
    plan_host_free(&h);
    dfree(d_idx);
    dfree(d_prob);
    dfree(gp.offsets);
    dfree(gp.row_slot);
    dfree(gp.slot_row);
    dfree(gp.kept);
}

static void test_dispatch(void)
{
    dispatch_case(257, 16, 4, 0, MT_DROP_PROBS, false, false, false, true);     /* dropless */
    dispatch_case(257, 16, 4, 40, MT_DROP_PROBS, false, false, false, true);    /* drops by probability, ties */
    dispatch_case(257, 16, 4, 40, MT_DROP_POSITION, true, false, false, false); /* drops by position, padded */
    if (quick) return;
    dispatch_case(257, 16, 4, 70, MT_DROP_PROBS, true, false, false, true);     /* padded, few drops */
    dispatch_case(500, 12, 3, 90, MT_DROP_PROBS, false, true, false, true);     /* skewed: heavy drops */
    dispatch_case(500, 12, 3, 90, MT_DROP_POSITION, false, true, true, false);
    dispatch_case(300, 16, 4, 0, MT_DROP_PROBS, false, false, true, true);      /* routed nowhere: -1 */
    dispatch_case(300, 16, 4, 60, MT_DROP_PROBS, true, true, true, true);
    dispatch_case(4096, 128, 8, 0, MT_DROP_PROBS, false, false, false, false);  /* Qwen3-like, dropless */
}

/* ------------------------------------------------------------------ loss, optimizer, bf16 */

/* Cross-entropy over a vocabulary of Vall columns, of which the call sees V columns
 * from v0 (the whole when v0 = 0 and V = Vall). */
static void ce_case(int N, int Vall, int V, int v0)
{
    const size_t nl = (size_t)N * V;
    float *logits = hrandn(nl, 3.0f);
    int32_t *tg = xmalloc(sizeof(int32_t) * N);
    int valid = 0;
    for (int n = 0; n < N; n++) {
        tg[n] = n % 7 == 3 ? -1 : (int32_t)mt_rng_below(5, (uint64_t)Vall, (uint64_t)n, (uint64_t)Vall);
        valid += tg[n] >= 0;
    }
    const float scale = 1.0f / (float)valid;
    float *lse = xmalloc(sizeof(float) * N), *tl = xmalloc(sizeof(float) * N), *dl = xmalloc(sizeof(float) * nl);
    C->op.cross_entropy_fwd(C->ctx, lse, tl, logits, tg, N, V, v0);
    C->op.cross_entropy_bwd(C->ctx, dl, logits, lse, tg, N, V, v0, scale);
    float *d_l = dup_to_dev(logits, sizeof(float) * nl), *d_tl = dalloc(sizeof(float) * N);
    float *d_lse = dalloc(sizeof(float) * N), *d_dl = dalloc(sizeof(float) * nl);
    int32_t *d_tg = dup_to_dev(tg, sizeof(int32_t) * N);
    G->op.cross_entropy_fwd(G->ctx, d_lse, d_tl, d_l, d_tg, N, V, v0);
    char sh[64], what[128];
    snprintf(sh, sizeof sh, "N=%d V=%d of %d from %d", N, V, Vall, v0);
    snprintf(what, sizeof what, "cross_entropy_fwd lse %s", sh);
    expect_close_dev(what, lse, d_lse, N, NMSE_FP32);
    snprintf(what, sizeof what, "cross_entropy_fwd target logit %s", sh);
    expect_bytes_dev(what, tl, d_tl, sizeof(float) * N);
    G->op.copy(G->ctx, d_lse, lse, sizeof(float) * N);
    G->op.cross_entropy_bwd(G->ctx, d_dl, d_l, d_lse, d_tg, N, V, v0, scale);
    snprintf(what, sizeof what, "cross_entropy_bwd %s", sh);
    expect_close_dev(what, dl, d_dl, nl, NMSE_FP32);
    G->op.cross_entropy_bwd(G->ctx, d_l, d_l, d_lse, d_tg, N, V, v0, scale);
    snprintf(what, sizeof what, "cross_entropy_bwd %s (in place)", sh);
    expect_close_dev(what, dl, d_l, nl, NMSE_FP32);
    free(logits);
    free(tg);
    free(lse);
    free(tl);
    free(dl);
    dfree(d_l);
    dfree(d_tl);
    dfree(d_lse);
    dfree(d_dl);
    dfree(d_tg);
}

static void test_cross_entropy(void)
{
    ce_case(64, 1000, 1000, 0);
    if (quick) return;
    ce_case(37, 1001, 1001, 0);  /* V not a multiple of 4: scalar path */
    ce_case(50, 1000, 500, 500); /* the second half of a sharded vocabulary */
    ce_case(50, 1001, 333, 333);
}

/* lse_combine: the shards' logsumexps combined per token in shard order (fp64 exp and
 * log, rounded to fp32: within fp32 rounding of the reference). loss_sum: the same
 * fp64 sums of fp32 differences in the same fixed order (lanes of strided tokens, then
 * pairwise), added to what acc held: the same bits. */
static void test_loss_ops(void)
{
    const int N = 77;
    for (int R = 1; R <= 4; R *= 2) {
        float *sh = hrandn((size_t)R * N, 4.0f), *want = xmalloc(sizeof(float) * N);
        C->op.lse_combine(C->ctx, want, sh, R, N);
        float *d_sh = dup_to_dev(sh, sizeof(float) * R * N), *d_lse = dalloc(sizeof(float) * N);
        G->op.lse_combine(G->ctx, d_lse, d_sh, R, N);
        char what[64];
        snprintf(what, sizeof what, "lse_combine R=%d N=%d", R, N);
        expect_close_dev(what, want, d_lse, N, NMSE_FP32);
        free(sh);
        free(want);
        dfree(d_sh);
        dfree(d_lse);
    }
    /* fewer tokens than the lanes, and several strides ending in a part of one */
    for (int M = N; M <= 1337; M += 1337 - N) {
        float *lse = hrandn(M, 3.0f), *tl = hrandn(M, 3.0f);
        int32_t *tg = xmalloc(sizeof(int32_t) * M);
        for (int n = 0; n < M; n++) tg[n] = n % 5 == 2 ? -1 : n;
        /* magnitudes 2^-30 .. 2^29, so that the fp64 sums round and their order shows */
        for (int n = 0; n < M; n++) lse[n] = ldexpf(lse[n], n * 7 % 60 - 30);
        double want = 0.25;
        C->op.loss_sum(C->ctx, &want, lse, tl, tg, M);
        double got = 0.25, *d_acc = dup_to_dev(&got, sizeof got);
        float *d_lse = dup_to_dev(lse, sizeof(float) * M), *d_tl = dup_to_dev(tl, sizeof(float) * M);
        int32_t *d_tg = dup_to_dev(tg, sizeof(int32_t) * M);
        G->op.loss_sum(G->ctx, d_acc, d_lse, d_tl, d_tg, M);
        expect_bytes_dev("loss_sum onto 0.25", &want, d_acc, sizeof want);
        free(lse);
        free(tl);
        free(tg);
        dfree(d_acc);
        dfree(d_lse);
        dfree(d_tl);
        dfree(d_tg);
    }
}

/* drop_mask: the same masked routing (in place) and the same count of drops, added onto
 * 5. n over one block (1000), over many blocks, whose counts are added together (70001),
 * and no slots. */
static void drop_mask_case(size_t n)
{
    int32_t *idx = xmalloc(sizeof(int32_t) * n), *slot = xmalloc(sizeof(int32_t) * n);
    int32_t *want = xmalloc(sizeof(int32_t) * n);
    for (size_t s = 0; s < n; s++) {
        idx[s] = (int32_t)(s % 16);
        slot[s] = s % 3 == 1 || s % 11 == 4 ? -1 : (int32_t)s;
    }
    int64_t dw = 5, dg = 5;
    C->op.drop_mask(C->ctx, want, idx, slot, n, &dw);
    int32_t *d_idx = dup_to_dev(idx, sizeof(int32_t) * n), *d_slot = dup_to_dev(slot, sizeof(int32_t) * n);
    int64_t *d_d = dup_to_dev(&dg, sizeof dg);
    G->op.drop_mask(G->ctx, d_idx, d_idx, d_slot, n, d_d);
    char what[96];
    snprintf(what, sizeof what, "drop_mask n=%zu (in place)", n);
    expect_bytes_dev(what, want, d_idx, sizeof(int32_t) * n);
    snprintf(what, sizeof what, "drop_mask n=%zu count onto 5", n);
    expect_bytes_dev(what, &dw, d_d, sizeof dw);
    free(idx);
    free(slot);
    free(want);
    dfree(d_idx);
    dfree(d_slot);
    dfree(d_d);
}

static void test_drop_mask(void)
{
    drop_mask_case(70001); /* quick: many blocks */
    if (quick) return;
    drop_mask_case(1000);
    drop_mask_case(0);
}

/* expert_select: the same renumbered routing (in place) and the same count per expert
 * (over counts of -1: every one written) of the experts e0..e0+count-1 among nexp. */
static void expert_select_case(size_t n, int e0, int count, int nexp)
{
    int32_t *idx = xmalloc(sizeof(int32_t) * n), *want = xmalloc(sizeof(int32_t) * n);
    for (size_t s = 0; s < n; s++) idx[s] = s % 7 == 3 ? -1 : (int32_t)((s * 5 + s / 16) % (size_t)nexp);
    int64_t *cw = xmalloc(sizeof(int64_t) * count), *cg = xmalloc(sizeof(int64_t) * count);
    for (int e = 0; e < count; e++) cg[e] = -1;
    C->op.expert_select(C->ctx, want, idx, n, e0, count, cw);
    int32_t *d_idx = dup_to_dev(idx, sizeof(int32_t) * n);
    int64_t *d_c = dup_to_dev(cg, sizeof(int64_t) * count);
    G->op.expert_select(G->ctx, d_idx, d_idx, n, e0, count, d_c);
    char what[128];
    snprintf(what, sizeof what, "expert_select n=%zu experts %d..%d (in place)", n, e0, e0 + count - 1);
    expect_bytes_dev(what, want, d_idx, sizeof(int32_t) * n);
    snprintf(what, sizeof what, "expert_select n=%zu experts %d..%d counts", n, e0, e0 + count - 1);
    expect_bytes_dev(what, cw, d_c, sizeof(int64_t) * count);
    if (n > 0) {
        int64_t total = 0;
        bool uneven = false;
        for (int e = 0; e < count; e++) total += cw[e], uneven = uneven || cw[e] != cw[0];
        snprintf(what, sizeof what, "expert_select n=%zu selects some, not all, unevenly", n);
        expect_true(what, total > 0 && total < (int64_t)n && uneven, "0 < count < n, counts not all equal");
    }
    free(idx);
    free(want);
    free(cw);
    free(cg);
    dfree(d_idx);
    dfree(d_c);
}

static void test_expert_select(void)
{
    expert_select_case(70001, 100, 1500, 1700); /* quick: many blocks, two rounds of experts */
    if (quick) return;
    expert_select_case(1000, 4, 6, 16);        /* one block */
    expert_select_case(70001, 4, 6, 16);       /* many blocks */
    expert_select_case(0, 4, 6, 16);           /* no slots: counts zero */
    expert_select_case(1000, 100, 1500, 1700); /* one block, two rounds */
}

/* expert_bias_update: the same biases after steps of loads above, below and at the mean
 * (an odd total: a fractional mean); then gated as adamw_dev (a captured iteration's
 * update): a finite squared norm and loss sum update, a non-finite loss sum writes
 * nothing on either. */
static void test_expert_bias_update(void)
{
    enum { NMOE = 3, E = 37 };
    float bias[NMOE * E];
    int64_t load[NMOE * E];
    for (int i = 0; i < NMOE * E; i++) {
        bias[i] = 0.01f * (float)(i % 5) - 0.02f;
        load[i] = i % E == 0 ? 1 : (int64_t)(i * 7 % 11);
    }
    for (int e = 0; e < E; e++) load[2 * E + e] = 4; /* all at the mean: sign 0 */
    float *d_b = dup_to_dev(bias, sizeof bias);
    int64_t *d_l = dup_to_dev(load, sizeof load);
    for (int step = 0; step < 3; step++) {
        C->op.expert_bias_update(C->ctx, bias, load, NMOE, E, 1e-3f, NULL, NULL, 0, 0);
        G->op.expert_bias_update(G->ctx, d_b, d_l, NMOE, E, 1e-3f, NULL, NULL, 0, 0);
    }
    expect_bytes_dev("expert_bias_update", bias, d_b, sizeof bias);
    const double gate[3] = {4.0, 1.5, NAN}; /* the squared norm, two loss sums */
    double *d_g = dup_to_dev(gate, sizeof gate);
    const float start[1] = {bias[1]};
    C->op.expert_bias_update(C->ctx, bias, load, NMOE, E, 1e-3f, &gate[0], &gate[1], 1, 1);
    G->op.expert_bias_update(G->ctx, d_b, d_l, NMOE, E, 1e-3f, &d_g[0], &d_g[1], 1, 1);
    expect_bytes_dev("expert_bias_update gated, finite", bias, d_b, sizeof bias);
    result(bias[1] != start[0], "expert_bias_update gated, finite: updated", "");
    float kept[NMOE * E];
    memcpy(kept, bias, sizeof bias);
    C->op.expert_bias_update(C->ctx, bias, load, NMOE, E, 1e-3f, &gate[0], &gate[1], 1, 2);
    G->op.expert_bias_update(G->ctx, d_b, d_l, NMOE, E, 1e-3f, &d_g[0], &d_g[1], 1, 2);
    expect_bytes("expert_bias_update gated, a loss not finite (CPU)", kept, bias, sizeof bias);
    expect_bytes_dev("expert_bias_update gated, a loss not finite", kept, d_b, sizeof bias);
    dfree(d_g);
    dfree(d_b);
    dfree(d_l);
}

/* amax_history: the same histories, scales and encode scales over more steps than the
 * window, with gradients in their own unit, a zero amax (the scale kept) and a NaN; the
 * position advanced on the device as the window's step says, and a step that its gate
 * skips (a loss not finite) changing nothing: the histories, the amaxes and the position
 * kept, on both backends. */
static void test_amax_history(void)
{
    enum { N = 9, LEN = 4 };
    float hist[N * LEN] = {0}, hs[N], sc[N], amax[N];
    int32_t pos[2];
    for (int i = 0; i < N; i++) hs[i] = 1.0f;
    float *d_h = dup_to_dev(hist, sizeof hist), *d_hs = dup_to_dev(hs, sizeof hs);
    float *d_sc = dup_to_dev(hs, sizeof hs), *d_a = dup_to_dev(hs, sizeof hs);
    int32_t *d_pos = dup_to_dev(hs, sizeof pos);
    const double sumsq = 2.0, losses[2][3] = {{1.0, -7.0, 3.0}, {1.0, -7.0, NAN}};
    double *d_gate = dup_to_dev(losses, sizeof losses), *d_sumsq = dup_to_dev(&sumsq, sizeof sumsq);
    for (int algo = 0; algo < 2; algo++) {
        pos[0] = LEN - 1, pos[1] = 0; /* an empty history (mt_amax_history_init) */
        G->op.copy(G->ctx, d_pos, pos, sizeof pos);
        for (int step = 0; step < 7; step++) {
            for (int i = 0; i < N; i++)
                amax[i] = i == 4 ? 0.0f : i == 7 && step == 2 ? NAN : 0.37f * (float)(1 + (i * 3 + step * 5) % 7);
            G->op.copy(G->ctx, d_a, amax, sizeof amax);
            /* odd steps gated: the losses at 0, 2 (every other step: the second row, NaN) */
            const int skip = step % 2;
            const struct mt_step_gate cg = {&sumsq, losses[skip], 2, 2}, gg = {d_sumsq, d_gate + 3 * skip, 2, 2};
            C->op.amax_history(C->ctx, hist, hs, sc, amax, N, LEN, pos, algo == 0, MT_E4M3_MAX,
                               MT_E5M2_MAX, 1, 0.25f, step ? &cg : NULL);
            G->op.amax_history(G->ctx, d_h, d_hs, d_sc, d_a, N, LEN, d_pos, algo == 0, MT_E4M3_MAX,
                               MT_E5M2_MAX, 1, 0.25f, step ? &gg : NULL);
        }
        const int taken = 4; /* steps 0, 2, 4, 6 */
        expect_true("amax_history: the position of the steps taken",
                    pos[0] == (taken - 1) % LEN && pos[1] == (taken < LEN ? taken : LEN),
                    "latest = taken - 1 mod len, count = min(taken, len)");
        expect_bytes_dev("amax_history: position", pos, d_pos, sizeof pos);
    }
    expect_bytes_dev("amax_history: history", hist, d_h, sizeof hist);
    expect_bytes_dev("amax_history: scales", hs, d_hs, sizeof hs);
    expect_bytes_dev("amax_history: encode scales", sc, d_sc, sizeof sc);
    expect_bytes_dev("amax_history: amaxes reset", amax, d_a, sizeof amax);
    /* a new unit only: the encode scales again, nothing recorded */
    C->op.amax_history(C->ctx, hist, hs, sc, NULL, N, LEN, NULL, true, MT_E4M3_MAX, MT_E5M2_MAX, 1, 0.125f, NULL);
    G->op.amax_history(G->ctx, d_h, d_hs, d_sc, NULL, N, LEN, NULL, true, MT_E4M3_MAX, MT_E5M2_MAX, 1, 0.125f, NULL);
    expect_bytes_dev("amax_history: encode scales of a new unit", sc, d_sc, sizeof sc);
    expect_true("amax_history: a gradient's unit, a zero amax's scale kept",
                sc[2] == hs[2] / 0.125f && sc[1] == hs[1] && hs[4] == 1.0f && hs[1] != 1.0f,
                "scale = hscale / unit, a zero amax's hscale 1");
    dfree(d_h);
    dfree(d_hs);
    dfree(d_sc);
    dfree(d_a);
    dfree(d_pos);
    dfree(d_gate);
    dfree(d_sumsq);
}

static void test_adamw(void)
{
    const size_t n = 10001;
    static const long long steps[] = {1, 1000};
    for (int s = 0; s < (quick ? 1 : 2); s++) {
        float *p = hrandn(n, 1.0f), *g = hrandn(n, 0.1f), *m = hrandn(n, 0.01f), *v = hrandn(n, 0.01f);
        for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i];
        float *dp = dup_to_dev(p, sizeof(float) * n), *dg = dup_to_dev(g, sizeof(float) * n);
        float *dm = dup_to_dev(m, sizeof(float) * n), *dv = dup_to_dev(v, sizeof(float) * n);
        C->op.adamw(C->ctx, p, g, m, v, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, steps[s]);
        G->op.adamw(G->ctx, dp, dg, dm, dv, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, steps[s]);
        char what[96];
        snprintf(what, sizeof what, "adamw n=%zu t=%lld: param", n, steps[s]);
        expect_bytes_dev(what, p, dp, sizeof(float) * n);
        snprintf(what, sizeof what, "adamw n=%zu t=%lld: m", n, steps[s]);
        expect_bytes_dev(what, m, dm, sizeof(float) * n);
        snprintf(what, sizeof what, "adamw n=%zu t=%lld: v", n, steps[s]);
        expect_bytes_dev(what, v, dv, sizeof(float) * n);
        free(p);
        free(g);
        free(m);
        free(v);
        dfree(dp);
        dfree(dg);
        dfree(dm);
        dfree(dv);
    }
}

/* adamw_dev against the CPU's, and against adamw with the clipping coefficient the
 * trainer computes: a norm under the threshold (scale 1), one over it (clipped), and a
 * NaN among the loss sums (nothing written) */
static void test_adamw_dev(void)
{
    const size_t n = 4099;
    const double clip = 1.0;
    static const double sumsqs[] = {0.25, 9.0, 9.0};
    for (int s = 0; s < 3; s++) {
        float *p = hrandn(n, 1.0f), *g = hrandn(n, 0.1f), *m = hrandn(n, 0.01f), *v = hrandn(n, 0.01f);
        for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i];
        float *p0 = malloc(sizeof(float) * n), *m0 = malloc(sizeof(float) * n), *v0 = malloc(sizeof(float) * n);
        memcpy(p0, p, sizeof(float) * n);
        memcpy(m0, m, sizeof(float) * n);
        memcpy(v0, v, sizeof(float) * n);
        float *dp = dup_to_dev(p, sizeof(float) * n), *dg = dup_to_dev(g, sizeof(float) * n);
        float *dm = dup_to_dev(m, sizeof(float) * n), *dv = dup_to_dev(v, sizeof(float) * n);
        const struct mt_adamw_consts k = mt_adamw_consts_of(3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 7);
        const double loss[4] = {1.5, -1.0, s == 2 ? NAN : 2.5, -1.0}; /* stride 2: 1.5, 2.5 */
        const double sumsq = sumsqs[s];
        struct mt_adamw_consts *dk = dup_to_dev(&k, sizeof k);
        double *dsumsq = dup_to_dev(&sumsq, sizeof sumsq), *dloss = dup_to_dev(loss, sizeof loss);
        C->op.adamw_dev(C->ctx, p, g, m, v, n, &k, &sumsq, loss, 2, 2, clip);
        G->op.adamw_dev(G->ctx, dp, dg, dm, dv, n, dk, dsumsq, dloss, 2, 2, clip);
        char what[96];
        snprintf(what, sizeof what, "adamw_dev case %d: param", s);
        expect_bytes_dev(what, p, dp, sizeof(float) * n);
        snprintf(what, sizeof what, "adamw_dev case %d: m", s);
        expect_bytes_dev(what, m, dm, sizeof(float) * n);
        snprintf(what, sizeof what, "adamw_dev case %d: v", s);
        expect_bytes_dev(what, v, dv, sizeof(float) * n);
        /* the host's decision: adamw with the trainer's coefficient, or nothing */
        if (s < 2) {
            const double norm = sqrt(sumsq);
            const double scale = norm > clip ? clip / (norm + 1e-6) : 1.0;
            C->op.adamw(C->ctx, p0, g, m0, v0, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, (float)scale, 7);
        }
        snprintf(what, sizeof what, "adamw_dev case %d against adamw on the host's decision", s);
        expect_true(what, memcmp(p0, p, sizeof(float) * n) == 0 && memcmp(m0, m, sizeof(float) * n) == 0 &&
                              memcmp(v0, v, sizeof(float) * n) == 0,
                    s == 2 ? "skipped: nothing written" : "the same update");
        free(p), free(g), free(m), free(v), free(p0), free(m0), free(v0);
        dfree(dp), dfree(dg), dfree(dm), dfree(dv), dfree(dk), dfree(dsumsq), dfree(dloss);
    }
}

static void test_bf16_round(void)
{
    static const uint32_t special[] = {
        0x3f800000u, 0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u,
        0xbf818000u, 0xbf808000u, 0x3fffffffu, 0x00018000u, 0x00008000u, 0x7f7fffffu, 0x7f7f7fffu,
        0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0xff812345u, 0x00000001u,
        0x807fffffu, 0x7f7f8000u, 0xff7f8000u,
    };
    const size_t ns = sizeof special / sizeof special[0], n = ns + 200000;
    uint32_t *bits = xmalloc(sizeof(uint32_t) * n);
    memcpy(bits, special, sizeof special);
    for (size_t i = ns; i < n; i++) { /* every exponent, random mantissas and signs */
        uint32_t w[4];
        mt_rng_philox(0xbf16, 0, i, w);
        bits[i] = w[0];
    }
    float *x = xmalloc(sizeof(float) * n), *ref = xmalloc(sizeof(float) * n);
    memcpy(x, bits, sizeof(float) * n);
    C->op.bf16_round(C->ctx, ref, x, n);
    float *dx = dup_to_dev(x, sizeof(float) * n), *dy = dalloc(sizeof(float) * n);
    G->op.bf16_round(G->ctx, dy, dx, n);
    expect_bytes_dev("bf16_round: ties, subnormals, overflow, NaN, random bits", ref, dy, sizeof(float) * n);
    G->op.bf16_round(G->ctx, dx, dx, n);
    expect_bytes_dev("bf16_round in place", ref, dx, sizeof(float) * n);
    free(bits);
    free(x);
    free(ref);
    dfree(dx);
    dfree(dy);
}

/* scale: the same fp32 product, bytewise. sumsq: fp64 sums in another order (a tree
 * instead of a loop) differ by a few fp64 ulp of the total: relative bound 1e-12, and
 * two pieces accumulate into one value like the whole does. */
static void test_scale_sumsq(void)
{
    const size_t sizes[] = {1, 1000, 1 << 20, 3000017};
    for (size_t si = 0; si < (quick ? 2 : sizeof sizes / sizeof sizes[0]); si++) {
        const size_t n = sizes[si];
        float *x = hrandn(n, 3.0f), *ref = hdup(x, sizeof(float) * n);
        C->op.scale(C->ctx, ref, 0.125f + (float)si, n);
        float *dx = dup_to_dev(x, sizeof(float) * n);
        G->op.scale(G->ctx, dx, 0.125f + (float)si, n);
        char what[96];
        snprintf(what, sizeof what, "scale n=%zu", n);
        expect_bytes_dev(what, ref, dx, sizeof(float) * n);

        double want = 0.0;
        C->op.sumsq(C->ctx, &want, x, n);
        double zero = 0.0, *dacc = dup_to_dev(&zero, sizeof zero);
        G->op.sumsq(G->ctx, dacc, dx, n / 3); /* the model-side pattern: pieces, one sum */
        G->op.sumsq(G->ctx, dacc, dx + n / 3, n - n / 3);
        G->op.copy(G->ctx, &zero, dacc, sizeof zero);
        /* dx was scaled in place: compare against the scaled input's sum */
        double ref2 = 0.0;
        C->op.sumsq(C->ctx, &ref2, ref, n);
        const double rel = fabs(zero - ref2) / (ref2 > 0.0 ? ref2 : 1.0);
        char d[96];
        snprintf(d, sizeof d, "relative error %.2e (bound 1e-12)", rel);
        snprintf(what, sizeof what, "sumsq n=%zu in two pieces", n);
        result(rel <= 1e-12 && want > 0.0, what, d);
        /* determinism: the same call twice gives the same bits */
        double a[2];
        for (int r = 0; r < 2; r++) {
            double z = 0.0;
            G->op.copy(G->ctx, dacc, &z, sizeof z);
            G->op.sumsq(G->ctx, dacc, dx, n);
            G->op.copy(G->ctx, &a[r], dacc, sizeof a[r]);
        }
        snprintf(what, sizeof what, "sumsq n=%zu deterministic", n);
        expect_true(what, memcmp(&a[0], &a[1], sizeof a[0]) == 0, "");
        free(x);
        free(ref);
        dfree(dx);
        dfree(dacc);
    }
}

/* ------------------------------------------------------------------ main */

int main(void)
{
#if defined(__SANITIZE_THREAD__) && defined(_OPENMP)
    /* libgomp is not built for ThreadSanitizer, which would report its threads' work
     * in the CPU reference as racing: one thread */
    omp_set_num_threads(1);
#endif
    C = mt_kernels_cpu();
    const char *which = getenv("MT_PARITY_BACKEND");
    selftest = which && !strcmp(which, "cpu");
    const char *q = getenv("MT_PARITY_QUICK");
    quick = q && strcmp(q, "0") != 0;
    if (quick) printf("# MT_PARITY_QUICK: one shape per op family\n");
    if (selftest) {
        G = C;
        printf("# MT_PARITY_BACKEND=cpu: the CPU backend plays the device (harness check)\n");
    } else {
        char desc[256];
        if (mt_cuda_describe(desc, sizeof desc) == 0) {
            printf("SKIP: %s\n", desc);
            return 77;
        }
        struct mt_err err;
        mt_err_clear(&err);
        G = mt_kernels_cuda(&err);
        if (!G) {
            fprintf(stderr, "FAIL: %s\n", err.msg);
            return 1;
        }
        printf("# %s\n", desc);
    }
    enum mt_op missing = MT_OP_COUNT;
    int nops = mt_kernels_count_ops(G, &missing);
    expect_true("op table complete", nops == MT_OP_COUNT, nops == MT_OP_COUNT ? "" : mt_op_names[missing]);

    test_memory();
    test_gemm();
    test_grouped_gemm();
    test_embedding();
    test_rmsnorm();
    test_rope();
    test_attention();
    test_swiglu_add();
    test_convert();
    test_gemm_bf16();
    test_grouped_gemm_bf16();
    test_layers_bf16();
    test_attention_bf16();
    test_fp8_refused();
    test_router();
    test_balancing_losses();
    test_dispatch();
    test_drop_mask();
    test_expert_select();
    test_expert_bias_update();
    test_amax_history();
    test_cross_entropy();
    test_loss_ops();
    test_adamw();
    test_adamw_dev();
    test_bf16_round();
    test_scale_sumsq();
    if (!selftest) {
        /* figures: how many of the dense GEMMs ran without tensor cores (each such shape
         * was named on stderr); then the teardown, which under LeakSanitizer shows that
         * the GEMM plans and the cuBLASLt handle are destroyed */
        struct mt_cuda_gemm_stats gs;
        mt_cuda_gemm_stats(G, &gs);
        printf("# dense GEMMs: %lld shapes, %lld cuBLASLt calls asking for %s; on %s: %lld shapes, %lld calls\n",
               gs.shapes, gs.calls, gs.compute, gs.fallback_compute, gs.fallback_shapes, gs.fallback_calls);
        struct mt_err err;
        mt_err_clear(&err);
        expect_true("backend teardown", mt_kernels_cuda_destroy(&err) == MT_OK, err.msg);
    }

    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}

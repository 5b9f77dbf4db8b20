/* The CPU backend's typed entry points: the fp32 reference kernels behind the op
 * table's typed tensors (kernels/kernels.h).
 *
 * The reference computes in fp32 and defines where bf16 rounding happens: a bf16
 * input is widened to fp32 (exactly) into scratch, the fp32 kernel runs, and a bf16
 * output is rounded to nearest even from the kernel's fp32 result as it is stored
 * (mt_cpu_bf16, the value bf16_round gives). So a bf16 tensor holds exactly the
 * values the fp32-stored, bf16-rounded tensors of earlier versions held, and bf16
 * training is bit-identical to them (tests/model/bf16_storage.sh). fp32 tensors pass
 * through untouched.
 *
 * Scratch comes from a small pool of buffers kept between calls (grown, freed at exit),
 * so a step allocates nothing once the pool has seen its sizes; a grown buffer is
 * touched once (prefaulted) so that later steps take no page faults in it. Manual GC
 * (util/hostmem.h) shrinks it: its mark records each buffer's capacity, its release
 * gives back what a buffer grew beyond (evaluation's sizes, a one-off). */
#include "kernels/cpu/cpu_ops.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/hostmem.h"

/* ---- scratch -------------------------------------------------------------------- */

#define POOL 16

static struct {
    float *p;
    size_t cap;
    size_t mark;  /* the capacity manual GC keeps (the last mark) */
    bool busy;
} pool[POOL];
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

static _Noreturn void fail(const char *op, const char *what)
{
    fprintf(stderr, "moetrain: cpu backend: %s: %s\n", op, what);
    abort();
}

static void free_pool(void)
{
    for (int i = 0; i < POOL; i++) {
        free(pool[i].p);
        pool[i].p = NULL;
        pool[i].cap = 0;
    }
}

static float *grow(size_t n)
{
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (p) mt_hostmem_prefault(p, n * sizeof(float));
    return p;
}

static void mark_pool(void)
{
    pthread_mutex_lock(&pool_lock);
    for (int i = 0; i < POOL; i++) pool[i].mark = pool[i].cap;
    pthread_mutex_unlock(&pool_lock);
}

/* Buffers grown beyond their mark go back to it (freed, or reallocated at the marked
 * capacity); a busy one (an op running on another thread) is left alone. */
static size_t release_pool(void)
{
    size_t freed = 0;
    pthread_mutex_lock(&pool_lock);
    for (int i = 0; i < POOL; i++) {
        if (pool[i].busy || pool[i].cap <= pool[i].mark) continue;
        freed += (pool[i].cap - pool[i].mark) * sizeof(float);
        free(pool[i].p);
        pool[i].p = pool[i].mark ? grow(pool[i].mark) : NULL;
        pool[i].cap = pool[i].p ? pool[i].mark : 0;
    }
    pthread_mutex_unlock(&pool_lock);
    return freed;
}

static const struct mt_host_cache pool_cache = {
    .name = "cpu scratch", .mark = mark_pool, .release = release_pool,
};

static void register_pool(void)
{
    atexit(free_pool);
    mt_hostmem_add_cache(&pool_cache);
}

/* n floats of scratch: the smallest free buffer that holds them, else the largest
 * free one grown. */
static float *take(const char *op, size_t n)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_pool);
    if (!n) n = 1;
    float *got = NULL;
    pthread_mutex_lock(&pool_lock);
    int fit = -1, big = -1;
    for (int i = 0; i < POOL; i++) {
        if (pool[i].busy) continue;
        if (pool[i].cap >= n && (fit < 0 || pool[i].cap < pool[fit].cap)) fit = i;
        if (big < 0 || pool[i].cap > pool[big].cap) big = i;
    }
    int i = fit >= 0 ? fit : big;
    if (i >= 0 && pool[i].cap < n) {
        free(pool[i].p);
        pool[i].p = grow(n);
        pool[i].cap = pool[i].p ? n : 0;
    }
    if (i >= 0 && pool[i].p) {
        pool[i].busy = true;
        got = pool[i].p;
    }
    pthread_mutex_unlock(&pool_lock);
    if (!got) fail(op, "out of memory for scratch, or every scratch buffer in use");
    return got;
}

static void give(float *p)
{
    if (!p) return;
    pthread_mutex_lock(&pool_lock);
    for (int i = 0; i < POOL; i++)
        if (pool[i].p == p) pool[i].busy = false;
    pthread_mutex_unlock(&pool_lock);
}

void *mt_cpu_scratch(const char *op, size_t bytes)
{
    return take(op, (bytes + sizeof(float) - 1) / sizeof(float));
}

void mt_cpu_scratch_give(void *p) { give(p); }

/* ---- conversions ---------------------------------------------------------------- */

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float x)
{
    x = mt_cpu_bf16(x);
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)(u >> 16);
}

static void check_dtype(const char *op, struct mt_tensor t)
{
    if (t.dtype != MT_F32 && t.dtype != MT_BF16) fail(op, "takes fp32 or bf16 tensors only");
}

/* Rows [r0, r1) of src converted into dst (same shape; bf16 rounds to nearest even). */
static void convert_rows(struct mt_tensor dst, struct mt_tensor src, size_t r0, size_t r1)
{
    const size_t cols = dst.cols > 0 ? (size_t)dst.cols : 0;
    for (size_t r = r0; r < r1; r++) {
        const size_t si = r * (size_t)src.ld, di = r * (size_t)dst.ld;
        if (src.dtype == MT_F32 && dst.dtype == MT_BF16) {
            const float *s = (const float *)src.data + si;
            uint16_t *d = (uint16_t *)dst.data + di;
#pragma omp simd
            for (size_t c = 0; c < cols; c++) d[c] = f32_to_bf16(s[c]);
        } else if (src.dtype == MT_BF16 && dst.dtype == MT_F32) {
            const uint16_t *s = (const uint16_t *)src.data + si;
            float *d = (float *)dst.data + di;
#pragma omp simd
            for (size_t c = 0; c < cols; c++) d[c] = bf16_to_f32(s[c]);
        } else {
            const size_t e = mt_dtype_size(dst.dtype);
            memmove((char *)dst.data + di * e, (const char *)src.data + si * e, cols * e);
        }
    }
}

/* src converted into dst: over the OpenMP threads in equal blocks of rows when large,
 * else on the calling thread with no parallel region at all (a region whose if clause
 * is false still makes a team of one, which libgomp allocates at every call). */
static void convert(struct mt_tensor dst, struct mt_tensor src)
{
    const size_t rows = dst.rows > 0 ? (size_t)dst.rows : 0, cols = dst.cols > 0 ? (size_t)dst.cols : 0;
    if (rows * cols <= 65536) {
        convert_rows(dst, src, 0, rows);
        return;
    }
#pragma omp parallel
    {
        const size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
        convert_rows(dst, src, rows * id / nt, rows * (id + 1) / nt);
    }
}

/* An fp32 view of input t: t itself when fp32 (with its ld), else a dense widened copy
 * in scratch (*tmp, to give back). */
static const float *in32(const char *op, struct mt_tensor t, float **tmp, int64_t *ld)
{
    check_dtype(op, t);
    *tmp = NULL;
    if (ld) *ld = t.ld;
    if (!ld && t.ld != t.cols && t.rows > 1) fail(op, "takes dense tensors (ld = cols)");
    if (t.dtype == MT_F32) return t.data;
    const size_t rows = t.rows > 0 ? (size_t)t.rows : 0, cols = t.cols > 0 ? (size_t)t.cols : 0;
    float *w = take(op, rows * cols);
    convert(mt_tview(w, MT_F32, (int64_t)rows, (int64_t)cols), t);
    if (ld) *ld = t.cols;
    *tmp = w;
    return w;
}

/* Where the fp32 result for output t goes: t itself when fp32, else scratch (*tmp). */
static float *out32(const char *op, struct mt_tensor t, float **tmp, int64_t *ld)
{
    check_dtype(op, t);
    *tmp = NULL;
    if (ld) *ld = t.ld;
    if (!ld && t.ld != t.cols && t.rows > 1) fail(op, "takes dense tensors (ld = cols)");
    if (t.dtype == MT_F32) return t.data;
    const size_t rows = t.rows > 0 ? (size_t)t.rows : 0, cols = t.cols > 0 ? (size_t)t.cols : 0;
    *tmp = take(op, rows * cols);
    if (ld) *ld = t.cols;
    return *tmp;
}

/* Stores the fp32 result tmp (dense) into bf16 output t, rounding; gives tmp back. */
static void store(struct mt_tensor t, float *tmp)
{
    if (!tmp) return;
    convert(t, mt_tview(tmp, MT_F32, t.rows > 0 ? t.rows : 0, t.cols > 0 ? t.cols : 0));
    give(tmp);
}

void mt_cpu_t_convert(void *ctx, struct mt_tensor dst, struct mt_tensor src)
{
    (void)ctx;
    check_dtype("convert", dst);
    check_dtype("convert", src);
    if (dst.rows != src.rows || dst.cols != src.cols) fail("convert", "shapes differ");
    convert(dst, src);
}

/* ---- the ops -------------------------------------------------------------------- */

void mt_cpu_t_gemm(void *ctx, bool ta, bool tb, int M, int N, int K, float alpha,
                          struct mt_tensor A, struct mt_tensor B, float beta, struct mt_tensor C)
{
    if (C.dtype == MT_BF16 && beta != 0.0f) fail("gemm", "a bf16 C takes beta = 0");
    float *ta_, *tb_, *tc;
    int64_t lda, ldb, ldc;
    const float *a = in32("gemm", A, &ta_, &lda), *b = in32("gemm", B, &tb_, &ldb);
    float *c = out32("gemm", C, &tc, &ldc);
    mt_cpu_gemm(ctx, ta, tb, M, N, K, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
    store(C, tc);
    give(ta_);
    give(tb_);
}

void mt_cpu_t_grouped_gemm(void *ctx, bool ta, bool tb, int G, const int32_t *offsets, int M,
                                  int N, int K, float alpha, struct mt_tensor A,
                                  struct mt_tensor B, float beta, struct mt_tensor C)
{
    if (C.dtype == MT_BF16 && beta != 0.0f) fail("grouped_gemm", "a bf16 C takes beta = 0");
    float *ta_, *tb_, *tc;
    const float *a = in32("grouped_gemm", A, &ta_, NULL), *b = in32("grouped_gemm", B, &tb_, NULL);
    float *c = out32("grouped_gemm", C, &tc, NULL);
    mt_cpu_grouped_gemm(ctx, ta, tb, G, offsets, M, N, K, alpha, a, b, beta, c);
    store(C, tc);
    give(ta_);
    give(tb_);
}

void mt_cpu_t_embedding_fwd(void *ctx, struct mt_tensor out, const int32_t *tokens,
                                   struct mt_tensor wte, int N, int C)
{
    float *tw, *to;
    const float *w = in32("embedding_fwd", wte, &tw, NULL);
    float *o = out32("embedding_fwd", out, &to, NULL);
    mt_cpu_embedding_fwd(ctx, o, tokens, w, N, C);
    store(out, to);
    give(tw);
}

void mt_cpu_t_rmsnorm_fwd(void *ctx, struct mt_tensor out, float *rstd, struct mt_tensor x,
                                 struct mt_tensor w, int N, int C, float eps)
{
    float *tx, *tw, *to;
    const float *xx = in32("rmsnorm_fwd", x, &tx, NULL), *ww = in32("rmsnorm_fwd", w, &tw, NULL);
    float *o = out32("rmsnorm_fwd", out, &to, NULL);
    mt_cpu_rmsnorm_fwd(ctx, o, rstd, xx, ww, N, C, eps);
    store(out, to);
    give(tx);
    give(tw);
}

void mt_cpu_t_rmsnorm_bwd(void *ctx, float *dx, float *dw, const float *dout,
                                 struct mt_tensor x, struct mt_tensor w, const float *rstd, int N,
                                 int C)
{
    float *tx, *tw;
    const float *xx = in32("rmsnorm_bwd", x, &tx, NULL), *ww = in32("rmsnorm_bwd", w, &tw, NULL);
    mt_cpu_rmsnorm_bwd(ctx, dx, dw, dout, xx, ww, rstd, N, C);
    give(tx);
    give(tw);
}

void mt_cpu_t_rope_fwd(void *ctx, struct mt_tensor out, struct mt_tensor x, int B, int T,
                              int H, int D, float theta)
{
    float *tx, *to;
    const float *xx = in32("rope_fwd", x, &tx, NULL);
    float *o = out32("rope_fwd", out, &to, NULL);
    mt_cpu_rope_fwd(ctx, o, xx, B, T, H, D, theta);
    store(out, to);
    give(tx);
}

void mt_cpu_t_attention_fwd(void *ctx, float *out, float *lse, struct mt_tensor q,
                                   struct mt_tensor k, struct mt_tensor v, int B, int T, int Hq,
                                   int Hkv, int D)
{
    float *tq, *tk, *tv;
    const float *qq = in32("attention_fwd", q, &tq, NULL), *kk = in32("attention_fwd", k, &tk, NULL);
    const float *vv = in32("attention_fwd", v, &tv, NULL);
    mt_cpu_attention_fwd(ctx, out, lse, qq, kk, vv, B, T, Hq, Hkv, D);
    give(tq);
    give(tk);
    give(tv);
}

void mt_cpu_t_attention_bwd(void *ctx, float *dq, float *dk, float *dv, const float *dout,
                                   struct mt_tensor q, struct mt_tensor k, struct mt_tensor v,
                                   const float *out, const float *lse, int B, int T, int Hq,
                                   int Hkv, int D)
{
    float *tq, *tk, *tv;
    const float *qq = in32("attention_bwd", q, &tq, NULL), *kk = in32("attention_bwd", k, &tk, NULL);
    const float *vv = in32("attention_bwd", v, &tv, NULL);
    mt_cpu_attention_bwd(ctx, dq, dk, dv, dout, qq, kk, vv, out, lse, B, T, Hq, Hkv, D);
    give(tq);
    give(tk);
    give(tv);
}

void mt_cpu_t_swiglu_fwd(void *ctx, struct mt_tensor out, struct mt_tensor gate,
                                struct mt_tensor up, int N, int F)
{
    float *tg, *tu, *to;
    const float *g = in32("swiglu_fwd", gate, &tg, NULL), *u = in32("swiglu_fwd", up, &tu, NULL);
    float *o = out32("swiglu_fwd", out, &to, NULL);
    mt_cpu_swiglu_fwd(ctx, o, g, u, N, F);
    store(out, to);
    give(tg);
    give(tu);
}

void mt_cpu_t_swiglu_bwd(void *ctx, float *dgate, float *dup, const float *dout,
                                struct mt_tensor gate, struct mt_tensor up, int N, int F)
{
    float *tg, *tu;
    const float *g = in32("swiglu_bwd", gate, &tg, NULL), *u = in32("swiglu_bwd", up, &tu, NULL);
    mt_cpu_swiglu_bwd(ctx, dgate, dup, dout, g, u, N, F);
    give(tg);
    give(tu);
}

void mt_cpu_t_add(void *ctx, struct mt_tensor out, struct mt_tensor a, struct mt_tensor b,
                         size_t n)
{
    float *ta_, *tb_, *to;
    const float *aa = in32("add", a, &ta_, NULL), *bb = in32("add", b, &tb_, NULL);
    float *o = out32("add", out, &to, NULL);
    mt_cpu_add(ctx, o, aa, bb, n);
    store(out, to);
    give(ta_);
    give(tb_);
}

void mt_cpu_t_permute_fwd(void *ctx, struct mt_tensor xp, struct mt_tensor x,
                                 const int32_t *row_slot, int rows, int topk, int C)
{
    float *tx, *to;
    const float *xx = in32("permute_fwd", x, &tx, NULL);
    float *o = out32("permute_fwd", xp, &to, NULL);
    mt_cpu_permute_fwd(ctx, o, xx, row_slot, rows, topk, C);
    store(xp, to);
    give(tx);
}

void mt_cpu_t_unpermute_fwd(void *ctx, struct mt_tensor out, struct mt_tensor yp,
                                   const int32_t *slot_row, const float *prob, int N, int topk,
                                   int C)
{
    float *ty, *to;
    const float *y = in32("unpermute_fwd", yp, &ty, NULL);
    float *o = out32("unpermute_fwd", out, &to, NULL);
    mt_cpu_unpermute_fwd(ctx, o, y, slot_row, prob, N, topk, C);
    store(out, to);
    give(ty);
}

void mt_cpu_t_unpermute_bwd(void *ctx, float *dyp, float *dprob, const float *dout,
                                   struct mt_tensor yp, const int32_t *slot_row, const float *prob,
                                   int N, int topk, int C, int rows)
{
    float *ty;
    const float *y = in32("unpermute_bwd", yp, &ty, NULL);
    mt_cpu_unpermute_bwd(ctx, dyp, dprob, dout, y, slot_row, prob, N, topk, C, rows);
    give(ty);
}

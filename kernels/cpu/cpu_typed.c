/* The CPU backend's typed entry points (kernels/kernels.h): GEMMs, SwiGLU, add and
 * attention here, the row ops (RMSNorm, RoPE, embedding, permute, unpermute) in their
 * files; and the scratch pool all ops share.
 *
 * The reference computes in fp32 and defines where bf16 rounding happens: a bf16
 * input is widened to fp32 (exactly), the fp32 arithmetic runs, and a bf16 output is
 * rounded to nearest even from its fp32 result as it is stored (mt_cpu_bf16, the value
 * bf16_round gives). Elementwise and row ops do this a chunk or a row at a time in a
 * buffer of the thread's (mt_cpu_span_in/out/store); GEMMs, whose BLAS takes fp32,
 * widen whole operands into scratch and round C in the GEMM's own parallel region;
 * attention widens q, k and v into scratch. So a bf16 tensor holds exactly the
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

static void check_dtype(const char *op, struct mt_tensor t)
{
    if (t.dtype != MT_F32 && t.dtype != MT_BF16) fail(op, "takes fp32 or bf16 tensors only");
}

/* Rows [r0, r1) and columns [c0, c1) of src converted into dst (same shape). */
static void convert_block(struct mt_tensor dst, struct mt_tensor src, size_t r0, size_t r1,
                          size_t c0, size_t c1)
{
    const size_t de = mt_dtype_size(dst.dtype), se = mt_dtype_size(src.dtype);
    for (size_t r = r0; r < r1 && c1 > c0; r++)
        mt_cpu_convert_span((char *)dst.data + (r * (size_t)dst.ld + c0) * de, dst.dtype,
                            (const char *)src.data + (r * (size_t)src.ld + c0) * se, src.dtype,
                            c1 - c0);
}

static size_t rows_of(struct mt_tensor t) { return t.rows > 0 ? (size_t)t.rows : 0; }
static size_t cols_of(struct mt_tensor t) { return t.cols > 0 ? (size_t)t.cols : 0; }

/* Thread id's share (of a team of `team`) of src into dst: equal blocks of rows, or of
 * columns when there are fewer rows than threads (a flat 1 x n tensor: the working copy
 * of the weights). */
static void convert_share(struct mt_tensor dst, struct mt_tensor src, int id, int team)
{
    const size_t rows = rows_of(dst), cols = cols_of(dst), n = (size_t)team, i = (size_t)id;
    if (rows < n)
        convert_block(dst, src, 0, rows, cols * i / n, cols * (i + 1) / n);
    else
        convert_block(dst, src, rows * i / n, rows * (i + 1) / n, 0, cols);
}

/* src converted into dst: over the OpenMP threads in equal blocks of rows when large,
 * else on the calling thread with no parallel region at all (a region whose if clause
 * is false still makes a team of one, which libgomp allocates at every call). */
static void convert(struct mt_tensor dst, struct mt_tensor src)
{
    if (rows_of(dst) * cols_of(dst) <= 65536) {
        convert_share(dst, src, 0, 1);
        return;
    }
#pragma omp parallel
    convert_share(dst, src, omp_get_thread_num(), omp_get_num_threads());
}

void mt_cpu_check_dense(const char *op, struct mt_tensor t)
{
    check_dtype(op, t);
    if (t.ld != t.cols && t.rows > 1) fail(op, "takes dense tensors (ld = cols)");
}

void mt_cpu_t_convert(void *ctx, struct mt_tensor dst, struct mt_tensor src)
{
    (void)ctx;
    check_dtype("convert", dst);
    check_dtype("convert", src);
    if (dst.rows != src.rows || dst.cols != src.cols) fail("convert", "shapes differ");
    convert(dst, src);
}

/* ---- GEMMs ---------------------------------------------------------------------- */

/* A typed GEMM's operands: a bf16 A or B as it is where moetrain's GEMM kernel runs
 * (mt_cpu_gemm_bf16: it widens them as it packs them), else widened into scratch (dense);
 * a bf16 C computed into scratch (dense) and rounded into C. The widening and the
 * rounding run in the GEMM's own parallel region, each thread its share, so that a bf16
 * operand adds neither a region nor a serial pass. */
struct gemm_io {
    const char *op;
    struct mt_tensor A, B, C;
    struct mt_cpu_opnd a, b;
    float *c;
    int64_t lda, ldb, ldc;
    float *ta, *tb, *tc; /* scratch, NULL for a tensor used as it is */
};

/* t's scratch (NULL: none), its leading dimension in *ld; an operand (A, B: `operand`)
 * in bf16 takes none where the GEMM kernel reads bf16 */
static float *io_scratch(const char *op, struct mt_tensor t, bool operand, int64_t *ld)
{
    check_dtype(op, t);
    *ld = t.ld;
    if (t.dtype == MT_F32 || (operand && mt_cpu_gemm_bf16())) return NULL;
    *ld = t.cols;
    return take(op, rows_of(t) * cols_of(t));
}

static struct mt_cpu_opnd io_opnd(const float *scratch, struct mt_tensor t)
{
    if (scratch) return (struct mt_cpu_opnd){scratch, false};
    return (struct mt_cpu_opnd){t.data, t.dtype != MT_F32};
}

static struct gemm_io io_take(const char *op, struct mt_tensor A, struct mt_tensor B,
                              struct mt_tensor C, bool dense)
{
    if (dense) {
        mt_cpu_check_dense(op, A);
        mt_cpu_check_dense(op, B);
        mt_cpu_check_dense(op, C);
    }
    struct gemm_io io = {.op = op, .A = A, .B = B, .C = C};
    io.ta = io_scratch(op, A, true, &io.lda);
    io.tb = io_scratch(op, B, true, &io.ldb);
    io.tc = io_scratch(op, C, false, &io.ldc);
    io.a = io_opnd(io.ta, A);
    io.b = io_opnd(io.tb, B);
    io.c = io.tc ? io.tc : C.data;
    return io;
}

static struct mt_tensor io_view(float *p, struct mt_tensor t)
{
    return mt_tview(p, MT_F32, (int64_t)rows_of(t), (int64_t)cols_of(t));
}

/* Thread id's share of widening A and B; true when there was any (a barrier is due
 * before the GEMM reads them). */

static void io_give(const struct gemm_io *io)
{
    give(io->ta);
    give(io->tb);
    give(io->tc);
}

/* A typed GEMM call: mt_cpu_t_gemm's arguments, or mt_cpu_t_grouped_gemm's (G > 0). */
struct gemm_call {
    bool ta, tb;
    int G;
    const int32_t *offsets;
    int M, N, K;
    float alpha, beta;
    int parts; /* gemm: mt_cpu_gemm's parts; grouped: the threads it runs on */
};

/* Thread id's share of widening A and B; true when there was any (a barrier is due
 * before the GEMM reads them). A grouped GEMM's weight slabs (B, !trans_a) are widened
 * only for groups with rows: an expert no token chose is not read. */
static bool io_widen(const struct gemm_io *io, const struct gemm_call *g, int id, int team)
{
    if (io->ta) convert_share(io_view(io->ta, io->A), io->A, id, team);
    if (!io->tb) return io->ta;
    const size_t rows = rows_of(io->B), cols = cols_of(io->B), n = (size_t)team;
    if (g->G <= 0 || g->ta || rows % (size_t)g->G) {
        convert_share(io_view(io->tb, io->B), io->B, id, team);
        return true;
    }
    const size_t slab = rows / (size_t)g->G, r0 = rows * (size_t)id / n,
                 r1 = rows * (size_t)(id + 1) / n;
    for (int e = 0; e < g->G; e++) {
        const size_t s0 = (size_t)e * slab, s1 = s0 + slab;
        const size_t lo = r0 > s0 ? r0 : s0, hi = r1 < s1 ? r1 : s1;
        if (g->offsets[e + 1] > g->offsets[e] && lo < hi)
            convert_block(io_view(io->tb, io->B), io->B, lo, hi, 0, cols);
    }
    return true;
}

/* Thread id's share (of a team of `team`) of a GEMM with operands to widen or round:
 * widen its share of A and B, a barrier, its parts of the GEMM; each part's block of a
 * bf16 C rounded as soon as it is computed (gemm), or after a barrier, the thread's rows
 * of C (grouped: a thread's groups are not a block). */
static void gemm_thread(const struct gemm_io *io, const struct gemm_call *g, int id, int team)
{
    if (io_widen(io, g, id, team) && team > 1) {
#pragma omp barrier
    }
    if (g->G > 0) {
        mt_cpu_grouped_gemm_thread(id, team, g->ta, g->tb, g->G, g->offsets, g->M,
                                   g->N, g->K, g->alpha, io->a, io->b, g->beta, io->c);
        if (io->tc) {
            if (team > 1) {
#pragma omp barrier
            }
            convert_share(io->C, io_view(io->tc, io->C), id, team);
        }
        return;
    }
    for (int i = id; i < g->parts; i += team) {
        mt_cpu_gemm_part(i, g->parts, g->ta, g->tb, g->M, g->N, g->K, g->alpha, io->a,
                         (int)io->lda, io->b, (int)io->ldb, g->beta, io->c, (int)io->ldc);
        int lo, hi;
        if (!io->tc || g->M <= 0 || g->N <= 0) continue;
        if (mt_cpu_gemm_range(i, g->parts, g->M, g->N, &lo, &hi))
            convert_block(io->C, io_view(io->tc, io->C), (size_t)lo, (size_t)hi, 0, (size_t)g->N);
        else
            convert_block(io->C, io_view(io->tc, io->C), 0, (size_t)g->M, (size_t)lo, (size_t)hi);
    }
}

/* The GEMM on `threads` threads; on the calling thread alone, with no region at all,
 * when one (see convert). */
static void gemm_run(const struct gemm_io *io, const struct gemm_call *g, int threads)
{
    if (threads <= 1) {
        gemm_thread(io, g, 0, 1);
    } else {
#pragma omp parallel num_threads(threads)
        gemm_thread(io, g, omp_get_thread_num(), omp_get_num_threads());
    }
    io_give(io);
}

void mt_cpu_t_gemm(void *ctx, bool ta, bool tb, int M, int N, int K, float alpha,
                   struct mt_tensor A, struct mt_tensor B, float beta, struct mt_tensor C)
{
    if (C.dtype == MT_BF16 && beta != 0.0f) fail("gemm", "a bf16 C takes beta = 0");
    const struct gemm_io io = io_take("gemm", A, B, C, false);
    if (!io.a.bf16 && !io.b.bf16 && !io.ta && !io.tb && !io.tc) { /* all fp32 */
        mt_cpu_gemm(ctx, ta, tb, M, N, K, alpha, io.a.p, (int)io.lda, io.b.p, (int)io.ldb,
                    beta, io.c, (int)io.ldc);
        return;
    }
    const int parts = omp_in_parallel() ? 1 : mt_cpu_gemm_parts(M, N, K, omp_get_max_threads());
    const struct gemm_call g = {ta, tb, 0, NULL, M, N, K, alpha, beta, parts};
    gemm_run(&io, &g, parts);
}

void mt_cpu_t_grouped_gemm(void *ctx, bool ta, bool tb, int G, const int32_t *offsets, int M,
                           int N, int K, float alpha, struct mt_tensor A, struct mt_tensor B,
                           float beta, struct mt_tensor C)
{
    if (C.dtype == MT_BF16 && beta != 0.0f) fail("grouped_gemm", "a bf16 C takes beta = 0");
    const struct gemm_io io = io_take("grouped_gemm", A, B, C, true);
    if (!io.a.bf16 && !io.b.bf16 && !io.ta && !io.tb && !io.tc) { /* all fp32 */
        mt_cpu_grouped_gemm(ctx, ta, tb, G, offsets, M, N, K, alpha, io.a.p, io.b.p, beta, io.c);
        return;
    }
    if (G <= 0) { /* no group: C is not written */
        io_give(&io);
        return;
    }
    const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    const struct gemm_call g = {ta, tb, G, offsets, M, N, K, alpha, beta, threads};
    gemm_run(&io, &g, threads);
}

/* ---- elementwise ops, in chunks ------------------------------------------------- */

/* Elementwise ops run over chunks of CHUNK elements, a chunk's bf16 operands widened
 * into (and its bf16 output rounded from) buffers on the thread's stack. */
#define CHUNK 1024

void mt_cpu_t_swiglu_fwd(void *ctx, struct mt_tensor out, struct mt_tensor gate,
                         struct mt_tensor up, int N, int F)
{
    (void)ctx;
    const size_t n = (size_t)N * (size_t)F, chunks = (n + CHUNK - 1) / CHUNK;
    mt_cpu_check_dense("swiglu_fwd", out);
    mt_cpu_check_dense("swiglu_fwd", gate);
    mt_cpu_check_dense("swiglu_fwd", up);
#pragma omp parallel for schedule(static)
    for (size_t ch = 0; ch < chunks; ch++) {
        float bg[CHUNK], bu[CHUNK], bo[CHUNK];
        const size_t i = ch * CHUNK, m = n - i < CHUNK ? n - i : CHUNK;
        float *o = mt_cpu_span_out(out, i, bo);
        mt_cpu_swiglu_fwd_span(o, mt_cpu_span_in(gate, i, m, bg), mt_cpu_span_in(up, i, m, bu), m);
        mt_cpu_span_store(out, i, m, o);
    }
}

void mt_cpu_t_swiglu_bwd(void *ctx, float *dgate, float *dup, const float *dout,
                         struct mt_tensor gate, struct mt_tensor up, int N, int F)
{
    (void)ctx;
    const size_t n = (size_t)N * (size_t)F, chunks = (n + CHUNK - 1) / CHUNK;
    mt_cpu_check_dense("swiglu_bwd", gate);
    mt_cpu_check_dense("swiglu_bwd", up);
#pragma omp parallel for schedule(static)
    for (size_t ch = 0; ch < chunks; ch++) {
        float bg[CHUNK], bu[CHUNK];
        const size_t i = ch * CHUNK, m = n - i < CHUNK ? n - i : CHUNK;
        mt_cpu_swiglu_bwd_span(dgate + i, dup + i, dout + i, mt_cpu_span_in(gate, i, m, bg),
                               mt_cpu_span_in(up, i, m, bu), m);
    }
}

void mt_cpu_t_add(void *ctx, struct mt_tensor out, struct mt_tensor a, struct mt_tensor b,
                  size_t n)
{
    (void)ctx;
    const size_t chunks = (n + CHUNK - 1) / CHUNK;
    mt_cpu_check_dense("add", out);
    mt_cpu_check_dense("add", a);
    mt_cpu_check_dense("add", b);
#pragma omp parallel for schedule(static)
    for (size_t ch = 0; ch < chunks; ch++) {
        float ba[CHUNK], bb[CHUNK], bo[CHUNK];
        const size_t i = ch * CHUNK, m = n - i < CHUNK ? n - i : CHUNK;
        const float *restrict x = mt_cpu_span_in(a, i, m, ba);
        const float *restrict y = mt_cpu_span_in(b, i, m, bb);
        float *restrict o = mt_cpu_span_out(out, i, bo);
#pragma omp simd
        for (size_t j = 0; j < m; j++) o[j] = x[j] + y[j];
        mt_cpu_span_store(out, i, m, o);
    }
}

/* ---- attention: q, k, v widened whole ---------------------------------------- */

/* Attention's tile GEMMs read q, k and v through BLAS, in fp32: the bf16 ones are
 * widened into scratch first, the three in one parallel region. */
struct qkv32 {
    const float *p[3];
    float *tmp[3];
};

static struct qkv32 qkv_widen(const char *op, struct mt_tensor q, struct mt_tensor k,
                              struct mt_tensor v)
{
    const struct mt_tensor t[3] = {q, k, v};
    struct qkv32 r;
    size_t total = 0;
    for (int i = 0; i < 3; i++) {
        mt_cpu_check_dense(op, t[i]);
        r.tmp[i] = t[i].dtype == MT_F32 ? NULL : take(op, rows_of(t[i]) * cols_of(t[i]));
        r.p[i] = r.tmp[i] ? r.tmp[i] : t[i].data;
        total += r.tmp[i] ? rows_of(t[i]) * cols_of(t[i]) : 0;
    }
    if (total == 0) return r;
    if (total <= 65536) { /* no region for a small one (see convert) */
        for (int i = 0; i < 3; i++)
            if (r.tmp[i]) convert_share(io_view(r.tmp[i], t[i]), t[i], 0, 1);
        return r;
    }
#pragma omp parallel
    {
        const int id = omp_get_thread_num(), team = omp_get_num_threads();
        for (int i = 0; i < 3; i++)
            if (r.tmp[i]) convert_share(io_view(r.tmp[i], t[i]), t[i], id, team);
    }
    return r;
}

static void qkv_give(const struct qkv32 *r)
{
    for (int i = 0; i < 3; i++) give(r->tmp[i]);
}

void mt_cpu_t_attention_fwd(void *ctx, float *out, float *lse, struct mt_tensor q,
                            struct mt_tensor k, struct mt_tensor v, int B, int T, int Hq, int Hkv,
                            int D)
{
    const struct qkv32 w = qkv_widen("attention_fwd", q, k, v);
    mt_cpu_attention_fwd(ctx, out, lse, w.p[0], w.p[1], w.p[2], B, T, Hq, Hkv, D);
    qkv_give(&w);
}

void mt_cpu_t_attention_bwd(void *ctx, float *dq, float *dk, float *dv, const float *dout,
                            struct mt_tensor q, struct mt_tensor k, struct mt_tensor v,
                            const float *out, const float *lse, int B, int T, int Hq, int Hkv,
                            int D)
{
    const struct qkv32 w = qkv_widen("attention_bwd", q, k, v);
    mt_cpu_attention_bwd(ctx, dq, dk, dv, dout, w.p[0], w.p[1], w.p[2], out, lse, B, T, Hq, Hkv, D);
    qkv_give(&w);
}

/* CPU reference backend: embedding, RMSNorm, RoPE, attention, SwiGLU, add.
 * Loops are parallel over independent rows; parameter-gradient reductions are
 * parallel over columns with the rows summed in order, so results do not depend
 * on the number of threads. */
#include "kernels/cpu/cpu_ops.h"

#include <stdlib.h>

#include "kernels/cpu/cpu_blas.h"

void mt_cpu_t_embedding_fwd(void *ctx, struct mt_tensor out, const int32_t *tokens,
                            struct mt_tensor wte, int N, int C)
{
    (void)ctx;
    mt_cpu_check_dense("embedding_fwd", out);
    mt_cpu_check_dense("embedding_fwd", wte);
    const size_t de = mt_dtype_size(out.dtype), se = mt_dtype_size(wte.dtype);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        char *dst = (char *)out.data + (size_t)n * C * de;
        if (tokens[n] < 0)
            memset(dst, 0, de * (size_t)C); /* +0 in fp32 and in bf16 */
        else
            mt_cpu_convert_span(dst, out.dtype, (const char *)wte.data + (size_t)tokens[n] * C * se,
                                wte.dtype, (size_t)C);
    }
}

void mt_cpu_embedding_bwd(void *ctx, float *dwte, const float *dout, const int32_t *tokens,
                          int N, int C)
{
    (void)ctx;
    /* a thread owns a block of columns and walks the tokens in order, so each element
     * sums its tokens in the same order for any thread count, reading rows contiguously */
#pragma omp parallel
    {
        int c0, c1;
        mt_cpu_split(C, &c0, &c1);
        for (int n = 0; n < N; n++) {
            if (tokens[n] < 0) continue;
            float *restrict dst = dwte + (size_t)tokens[n] * C;
            const float *restrict src = dout + (size_t)n * C;
#pragma omp simd
            for (int c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
}

/* RMSNorm's typed operands are read and written a row at a time, a bf16 row widened into
 * (or rounded from) a buffer of the thread's; a bf16 weight is widened once per thread. */
void mt_cpu_t_rmsnorm_fwd(void *ctx, struct mt_tensor out, float *rstd, struct mt_tensor x,
                          struct mt_tensor w, int N, int C, float eps)
{
    (void)ctx;
    mt_cpu_check_dense("rmsnorm_fwd", out);
    mt_cpu_check_dense("rmsnorm_fwd", x);
    mt_cpu_check_dense("rmsnorm_fwd", w);
    const size_t row = sizeof(float) * (size_t)C;
    void *bufs = mt_cpu_scratch_threads("rmsnorm_fwd", 3 * row);
#pragma omp parallel
    {
        float *wbuf = mt_cpu_slice(bufs, 3 * row), *xbuf = wbuf + C, *obuf = xbuf + C;
        const float *restrict wc = mt_cpu_span_in(w, 0, (size_t)C, wbuf);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *restrict xn = mt_cpu_span_in(x, (size_t)n * C, (size_t)C, xbuf);
            float *restrict on = mt_cpu_span_out(out, (size_t)n * C, obuf);
            float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
            for (int c = 0; c < C; c++) ss += xn[c] * xn[c];
            float r = 1.0f / sqrtf(ss / (float)C + eps);
#pragma omp simd
            for (int c = 0; c < C; c++) on[c] = xn[c] * r * wc[c];
            mt_cpu_span_store(out, (size_t)n * C, (size_t)C, on);
            rstd[n] = r;
        }
    }
    mt_cpu_scratch_give(bufs);
}

/* dw's sum over the rows in blocks of RMS_DW_ROWS rows, whatever the thread count:
 * each block's rows in order (in the pass that computes dx, so x and dy are read once),
 * then the blocks' sums in order. */
#define RMS_DW_ROWS 128

void mt_cpu_t_rmsnorm_bwd(void *ctx, float *dx, float *dw, const float *dout, struct mt_tensor x,
                          struct mt_tensor w, const float *rstd, int N, int C)
{
    (void)ctx;
    mt_cpu_check_dense("rmsnorm_bwd", x);
    mt_cpu_check_dense("rmsnorm_bwd", w);
    if (N <= 0 || C <= 0) return;
    const size_t row = sizeof(float) * (size_t)C;
    const int blocks = (N + RMS_DW_ROWS - 1) / RMS_DW_ROWS;
    float *part = mt_cpu_scratch("rmsnorm_bwd", row * (size_t)blocks);
    /* per thread: the weight and a row of x */
    void *bufs = mt_cpu_scratch_threads("rmsnorm_bwd", 2 * row);
    /* y = x r w with r = (mean x^2 + eps)^-1/2:
     * dx = r (w dy) - x r^3 (sum_c w dy x) / C,  dw = sum_rows dy x r */
#pragma omp parallel
    {
        float *wbuf = mt_cpu_slice(bufs, 2 * row), *xbuf = wbuf + C;
        const float *restrict wc = mt_cpu_span_in(w, 0, (size_t)C, wbuf);
#pragma omp for schedule(static)
        for (int blk = 0; blk < blocks; blk++) {
            float *restrict acc = part + (size_t)blk * C;
            memset(acc, 0, row);
            const int n1 = (blk + 1) * RMS_DW_ROWS < N ? (blk + 1) * RMS_DW_ROWS : N;
            for (int n = blk * RMS_DW_ROWS; n < n1; n++) {
                const float *restrict xn = mt_cpu_span_in(x, (size_t)n * C, (size_t)C, xbuf);
                const float *restrict dn = dout + (size_t)n * C;
                float *restrict dxn = dx + (size_t)n * C;
                float r = rstd[n], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int c = 0; c < C; c++) dot += wc[c] * dn[c] * xn[c];
                float k = dot * r * r * r / (float)C;
#pragma omp simd
                for (int c = 0; c < C; c++) {
                    dxn[c] += r * wc[c] * dn[c] - k * xn[c];
                    acc[c] += dn[c] * xn[c] * r;
                }
            }
        }
        int c0, c1;
        mt_cpu_split(C, &c0, &c1);
        for (int c = c0; c < c1; c++) {
            float sum = 0.0f;
            for (int blk = 0; blk < blocks; blk++) sum += part[(size_t)blk * C + c];
            dw[c] += sum;
        }
    }
    mt_cpu_scratch_give(bufs);
    mt_cpu_scratch_give(part);
}

/* cos/sin of t * theta^(-2i/D) for t < T, i < D/2, as HF computes them in fp32:
 * inv_freq = 1 / theta^(2i/D) rounded to fp32, angle = fp32(t) * inv_freq in fp32. */
static float *rope_table(int T, int D, float theta)
{
    int half = D / 2;
    float *tab = mt_cpu_scratch("rope", sizeof(float) * 2 * (size_t)T * (size_t)half);
    for (int i = 0; i < half; i++) {
        float inv = (float)(1.0 / pow((double)theta, (double)(2 * i) / (double)D));
        for (int t = 0; t < T; t++) {
            float ang = (float)t * inv;
            tab[((size_t)t * half + i) * 2] = cosf(ang);
            tab[((size_t)t * half + i) * 2 + 1] = sinf(ang);
        }
    }
    return tab;
}

/* sign = +1: out = x cos + rotate_half(x) sin (forward); -1: the transpose (backward).
 * A bf16 head row is widened into (or rounded from) a buffer of the thread's. */
static void rope_apply(struct mt_tensor out, struct mt_tensor x, int B, int T, int H, int D,
                       float theta, float sign)
{
    int half = D / 2;
    float *tab = rope_table(T, D, theta);
    const size_t row = sizeof(float) * (size_t)D;
    void *bufs = mt_cpu_scratch_threads("rope", 2 * row);
#pragma omp parallel
    {
        float *xbuf = mt_cpu_slice(bufs, 2 * row), *obuf = xbuf + D;
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++) {
                    size_t base = (((size_t)b * T + t) * H + h) * D;
                    const float *restrict xr = mt_cpu_span_in(x, base, (size_t)D, xbuf);
                    float *restrict o = mt_cpu_span_out(out, base, obuf);
#pragma omp simd
                    for (int i = 0; i < half; i++) {
                        float c = tab[((size_t)t * half + i) * 2];
                        float s = sign * tab[((size_t)t * half + i) * 2 + 1];
                        float x1 = xr[i], x2 = xr[i + half];
                        o[i] = x1 * c - x2 * s;
                        o[i + half] = x2 * c + x1 * s;
                    }
                    mt_cpu_span_store(out, base, (size_t)D, o);
                }
    }
    mt_cpu_scratch_give(bufs);
    mt_cpu_scratch_give(tab);
}

void mt_cpu_t_rope_fwd(void *ctx, struct mt_tensor out, struct mt_tensor x, int B, int T, int H,
                       int D, float theta)
{
    (void)ctx;
    mt_cpu_check_dense("rope_fwd", out);
    mt_cpu_check_dense("rope_fwd", x);
    rope_apply(out, x, B, T, H, D, theta, 1.0f);
}

void mt_cpu_rope_bwd(void *ctx, float *dx, const float *dout, int B, int T, int H, int D,
                     float theta)
{
    (void)ctx;
    const int64_t n = (int64_t)B * T * H * D;
    rope_apply(mt_f32(dx, 1, n), mt_f32(dout, 1, n), B, T, H, D, theta, -1.0f);
}

/* Attention, flash style: queries and keys in blocks of ATT_BLOCK rows; the scores of a
 * block pair, S = scale Q K^T, and the products with them (P V, P^T dO, dO V^T, dS^T Q,
 * dS K) are GEMMs on strided views of q, k, v (one head's rows are Hq*D or Hkv*D
 * apart), so BLAS does the arithmetic; the softmax runs over one ATT_BLOCK x ATT_BLOCK
 * tile at a time with a vectorised exp. Memory: one tile per thread and, backward, one
 * float per query row (delta), so linear in T.
 *
 * Determinism: every output row is written by one task, which visits its block pairs
 * in a fixed order with BLAS single-threaded; so the bits depend neither on the number
 * of threads nor on which thread runs a task.
 * - forward: a task per (batch, head, query block), the online softmax over key blocks
 *   0..diagonal: running max m, sum l, and out rescaled by exp(m_old - m_new);
 * - backward, dK and dV: a task per (batch, KV group, key block), over the group's heads
 *   in order and the query blocks from the diagonal on;
 * - backward, dQ: a task per (batch, head, query block), over key blocks 0..diagonal.
 * The two backward passes each recompute P = exp(S - lse) and dP = dO V^T of their tiles
 * (7 tile GEMMs in all against 5 for a single pass), which keeps every sum in one task
 * without a T x T buffer or a reduction across tasks. When there are (batch, KV group)
 * pairs enough to keep every thread busy, a task per pair does both in one pass, each
 * sum in the same order as above (5 tile GEMMs, the same bits). */
#define ATT_BLOCK 64

struct att_shape {
    int B, T, Hq, Hkv, D, rep;
    float scale;
    size_t ldq, ldk; /* floats between consecutive tokens of one head of q, of k */
    /* with the tile kernel (ATT_TILE_KERNEL): k and v transposed, (B,Hkv,D,T) */
    const float *kt, *vt;
};

static struct att_shape att_shape(int B, int T, int Hq, int Hkv, int D)
{
    return (struct att_shape){B, T, Hq, Hkv, D, Hq / Hkv, 1.0f / sqrtf((float)D),
                              (size_t)Hq * D, (size_t)Hkv * D, NULL, NULL};
}

/* Row t of head h in a (B,T,Hq,D) tensor, of group g in a (B,T,Hkv,D) tensor. */
static size_t att_qrow(const struct att_shape *a, int b, int t, int h)
{
    return (((size_t)b * a->T + t) * a->Hq + h) * a->D;
}

static size_t att_krow(const struct att_shape *a, int b, int t, int g)
{
    return (((size_t)b * a->T + t) * a->Hkv + g) * a->D;
}

static int att_rows(int T, int blk) { return T - blk * ATT_BLOCK < ATT_BLOCK ? T - blk * ATT_BLOCK : ATT_BLOCK; }

/* The score-shaped tile products (S = scale Q K^T, dP = dO V^T: a reduction over the
 * head dimension only) are BLAS's least efficient shape (about half its rate here).
 * With AVX-512 (the x86-64-v4 level) they run in a kernel of their own instead: k and
 * v transposed once per call to (B,Hkv,D,T), each output row the sum over d in order,
 * one FMA per term, 4 rows x 64 columns in 16 registers. Other levels call BLAS. */
#if defined(__AVX512F__)
#include <immintrin.h>
#define ATT_TILE_KERNEL 1

/* S (nq,nk; row stride ATT_BLOCK) = scale A Bt, A (nq,D; row stride lda), Bt (D,nk;
 * row stride ldb), nk <= ATT_BLOCK */
static void att_tile_nt(float *S, const float *A, size_t lda, const float *Bt, size_t ldb,
                        int nq, int nk, int D, float scale)
{
    const __mmask16 m0 = nk >= 16 ? 0xffff : (__mmask16)((1u << nk) - 1),
                    m1 = nk >= 32 ? 0xffff : nk <= 16 ? 0 : (__mmask16)((1u << (nk - 16)) - 1),
                    m2 = nk >= 48 ? 0xffff : nk <= 32 ? 0 : (__mmask16)((1u << (nk - 32)) - 1),
                    m3 = nk >= 64 ? 0xffff : nk <= 48 ? 0 : (__mmask16)((1u << (nk - 48)) - 1);
    const __m512 sc = _mm512_set1_ps(scale);
    /* written out: a loop over an array of vectors is kept in memory at -O2 */
#define ATT_ROW_DECL(i) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = c##i##0, \
                               c##i##2 = c##i##0, c##i##3 = c##i##0
#define ATT_ROW_FMA(i, a)                                                                  \
    do {                                                                                   \
        const __m512 ai = _mm512_set1_ps(a);                                               \
        c##i##0 = _mm512_fmadd_ps(ai, b0, c##i##0), c##i##1 = _mm512_fmadd_ps(ai, b1, c##i##1); \
        c##i##2 = _mm512_fmadd_ps(ai, b2, c##i##2), c##i##3 = _mm512_fmadd_ps(ai, b3, c##i##3); \
    } while (0)
#define ATT_ROW_STORE(i, r)                                                                \
    do {                                                                                   \
        float *s_ = S + (size_t)(r) * ATT_BLOCK;                                           \
        _mm512_mask_storeu_ps(s_, m0, _mm512_mul_ps(c##i##0, sc));                         \
        _mm512_mask_storeu_ps(s_ + 16, m1, _mm512_mul_ps(c##i##1, sc));                    \
        _mm512_mask_storeu_ps(s_ + 32, m2, _mm512_mul_ps(c##i##2, sc));                    \
        _mm512_mask_storeu_ps(s_ + 48, m3, _mm512_mul_ps(c##i##3, sc));                    \
    } while (0)
#define ATT_LOAD_B(d)                                                                      \
    const float *bt = Bt + (size_t)(d) * ldb;                                              \
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, bt), b1 = _mm512_maskz_loadu_ps(m1, bt + 16), \
                 b2 = _mm512_maskz_loadu_ps(m2, bt + 32), b3 = _mm512_maskz_loadu_ps(m3, bt + 48)
    int r = 0;
    for (; r + 4 <= nq; r += 4) {
        ATT_ROW_DECL(0);
        ATT_ROW_DECL(1);
        ATT_ROW_DECL(2);
        ATT_ROW_DECL(3);
        const float *a0 = A + (size_t)r * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
        for (int d = 0; d < D; d++) {
            ATT_LOAD_B(d);
            ATT_ROW_FMA(0, a0[d]);
            ATT_ROW_FMA(1, a1[d]);
            ATT_ROW_FMA(2, a2[d]);
            ATT_ROW_FMA(3, a3[d]);
        }
        ATT_ROW_STORE(0, r);
        ATT_ROW_STORE(1, r + 1);
        ATT_ROW_STORE(2, r + 2);
        ATT_ROW_STORE(3, r + 3);
    }
    for (; r < nq; r++) {
        ATT_ROW_DECL(0);
        const float *a0 = A + (size_t)r * lda;
        for (int d = 0; d < D; d++) {
            ATT_LOAD_B(d);
            ATT_ROW_FMA(0, a0[d]);
        }
        ATT_ROW_STORE(0, r);
    }
#undef ATT_ROW_DECL
#undef ATT_ROW_FMA
#undef ATT_ROW_STORE
#undef ATT_LOAD_B
}

/* x (B,T,Hkv,D) transposed into xt (B,Hkv,D,T), in blocks of ATT_BLOCK tokens */
static void att_transpose(float *xt, const float *x, const struct att_shape *a)
{
    const int nblk = (a->T + ATT_BLOCK - 1) / ATT_BLOCK;
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < a->B; b++)
        for (int g = 0; g < a->Hkv; g++)
            for (int tb = 0; tb < nblk; tb++) {
                const int t0 = tb * ATT_BLOCK, nt = att_rows(a->T, tb);
                float *o = xt + ((size_t)b * a->Hkv + g) * a->D * a->T + t0;
                const float *xb = x + att_krow(a, b, t0, g);
                /* the block's rows (ATT_BLOCK x D) stay in L1 while each d is gathered,
                 * the writes contiguous */
                for (int d = 0; d < a->D; d++)
                    for (int t = 0; t < nt; t++) o[(size_t)d * a->T + t] = xb[(size_t)t * a->ldk + d];
            }
}

/* group g of batch b's transposed rows j0.. */
static const float *att_trow(const struct att_shape *a, const float *xt, int b, int g, int j0)
{
    return xt + ((size_t)b * a->Hkv + g) * a->D * a->T + j0;
}
#endif

/* S (nq,nk; row stride ATT_BLOCK) = scale Q K^T for query rows i0.. of head h and key
 * rows j0.. of its group. */
static void att_scores(const struct att_shape *a, float *S, const float *q, const float *k,
                       int b, int h, int i0, int nq, int j0, int nk)
{
#ifdef ATT_TILE_KERNEL
    if (a->kt) {
        att_tile_nt(S, q + att_qrow(a, b, i0, h), a->ldq, att_trow(a, a->kt, b, h / a->rep, j0),
                    (size_t)a->T, nq, nk, a->D, a->scale);
        return;
    }
#endif
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, a->D, a->scale,
                q + att_qrow(a, b, i0, h), (int)a->ldq, k + att_krow(a, b, j0, h / a->rep),
                (int)a->ldk, 0.0f, S, ATT_BLOCK);
}

/* Keys past the query (j0 + c > i0 + r) get -Inf; only the diagonal tile has any. */
static void att_mask(float *S, int i0, int nq, int j0, int nk)
{
    if (j0 + nk - 1 <= i0) return;
    for (int r = 0; r < nq; r++)
        for (int c = i0 + r - j0 + 1; c < nk; c++) S[(size_t)r * ATT_BLOCK + c] = -INFINITY;
}

/* A row of a score tile in ATT_LANES lanes of a fixed width, whatever the vector width
 * the compiler uses: lane i takes the columns i, i + ATT_LANES, ..., the lanes combined
 * in one fixed order, so that the sums have the same bits at every CPU kernel level
 * (a vectorised reduction's order would follow the vector width). */
#define ATT_LANES 16

static float att_lanes_sum(const float *acc)
{
    float h[ATT_LANES / 2];
    for (int i = 0; i < ATT_LANES / 2; i++) h[i] = acc[i] + acc[i + ATT_LANES / 2];
    for (int w = ATT_LANES / 4; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) h[i] += h[i + w];
    return h[0];
}

/* max(init, x[0..n)) */
static float att_row_max(const float *x, int n, float init)
{
    float acc[ATT_LANES];
    for (int i = 0; i < ATT_LANES; i++) acc[i] = init;
    int c = 0;
    for (; c + ATT_LANES <= n; c += ATT_LANES)
#pragma omp simd
        for (int i = 0; i < ATT_LANES; i++) acc[i] = x[c + i] > acc[i] ? x[c + i] : acc[i];
    for (int i = 0; c + i < n; i++) acc[i] = x[c + i] > acc[i] ? x[c + i] : acc[i];
    float mx = acc[0];
    for (int i = 1; i < ATT_LANES; i++) mx = acc[i] > mx ? acc[i] : mx;
    return mx;
}

/* x = exp(x - mx) over x[0..n); returns their sum */
static float att_row_exp(float *x, int n, float mx)
{
    float acc[ATT_LANES] = {0};
    int c = 0;
    for (; c + ATT_LANES <= n; c += ATT_LANES)
#pragma omp simd
        for (int i = 0; i < ATT_LANES; i++) {
            x[c + i] = mt_cpu_expf(x[c + i] - mx);
            acc[i] += x[c + i];
        }
    for (int i = 0; c + i < n; i++) {
        x[c + i] = mt_cpu_expf(x[c + i] - mx);
        acc[i] += x[c + i];
    }
    return att_lanes_sum(acc);
}

/* Bytes of n score tiles. */
static size_t att_tile_bytes(int n) { return sizeof(float) * (size_t)n * ATT_BLOCK * ATT_BLOCK; }

void mt_cpu_attention_fwd(void *ctx, float *out, float *lse, const float *q, const float *k,
                          const float *v, int B, int T, int Hq, int Hkv, int D)
{
    (void)ctx;
    if (B <= 0 || T <= 0 || Hq <= 0 || D <= 0) return;
    struct att_shape a = att_shape(B, T, Hq, Hkv, D);
    const int nblk = (T + ATT_BLOCK - 1) / ATT_BLOCK;
#ifdef ATT_TILE_KERNEL
    float *kt = mt_cpu_scratch("attention_fwd", sizeof(float) * (size_t)B * T * Hkv * D);
    att_transpose(kt, k, &a);
    a.kt = kt;
#endif
    void *tiles = mt_cpu_scratch_threads("attention_fwd", att_tile_bytes(1));
#pragma omp parallel
    {
        float *S = mt_cpu_slice(tiles, att_tile_bytes(1));
        float m[ATT_BLOCK], l[ATT_BLOCK];
        /* the largest query blocks first, so that the small ones fill in at the end */
#pragma omp for collapse(3) schedule(dynamic, 1)
        for (int qb = nblk - 1; qb >= 0; qb--)
            for (int b = 0; b < B; b++)
                for (int h = 0; h < Hq; h++) {
                    const int i0 = qb * ATT_BLOCK, nq = att_rows(T, qb);
                    float *O = out + att_qrow(&a, b, i0, h);
                    for (int r = 0; r < nq; r++) m[r] = -INFINITY, l[r] = 0.0f;
                    for (int kb = 0; kb <= qb; kb++) {
                        const int j0 = kb * ATT_BLOCK, nk = att_rows(T, kb);
                        att_scores(&a, S, q, k, b, h, i0, nq, j0, nk);
                        att_mask(S, i0, nq, j0, nk);
                        for (int r = 0; r < nq; r++) {
                            float *Sr = S + (size_t)r * ATT_BLOCK;
                            const float mx = att_row_max(Sr, nk, m[r]);
                            const float sum = att_row_exp(Sr, nk, mx);
                            /* rescale what the earlier key blocks left (nothing for kb 0) */
                            float alpha = kb == 0 ? 0.0f : mt_cpu_expf(m[r] - mx);
                            l[r] = l[r] * alpha + sum;
                            m[r] = mx;
                            if (kb > 0) {
                                float *Or = O + (size_t)r * a.ldq;
#pragma omp simd
                                for (int d = 0; d < D; d++) Or[d] *= alpha;
                            }
                        }
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, 1.0f, S,
                                    ATT_BLOCK, v + att_krow(&a, b, j0, h / a.rep), (int)a.ldk,
                                    kb == 0 ? 0.0f : 1.0f, O, (int)a.ldq);
                    }
                    for (int r = 0; r < nq; r++) {
                        float *Or = O + (size_t)r * a.ldq, inv = 1.0f / l[r];
#pragma omp simd
                        for (int d = 0; d < D; d++) Or[d] *= inv;
                        lse[((size_t)b * Hq + h) * T + i0 + r] = m[r] + logf(l[r]);
                    }
                }
    }
    mt_cpu_scratch_give(tiles);
#ifdef ATT_TILE_KERNEL
    mt_cpu_scratch_give(kt);
#endif
}

/* For the tile (query block at i0 of head h, key block at j0): P = exp(S - lse) (0 past
 * the diagonal) into P, and dS = P (dO V^T - delta) into dS; both (nq,nk), row stride
 * ATT_BLOCK. lse and delta are the head's rows (T). */
static void att_tile_grads(const struct att_shape *a, float *P, float *dS, const float *q,
                           const float *k, const float *v, const float *dout, const float *lse,
                           const float *delta, int b, int h, int i0, int nq, int j0, int nk)
{
    att_scores(a, P, q, k, b, h, i0, nq, j0, nk);
    att_mask(P, i0, nq, j0, nk);
#ifdef ATT_TILE_KERNEL
    if (a->vt)
        att_tile_nt(dS, dout + att_qrow(a, b, i0, h), a->ldq,
                    att_trow(a, a->vt, b, h / a->rep, j0), (size_t)a->T, nq, nk, a->D, 1.0f);
    else
#endif
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, a->D, 1.0f,
                    dout + att_qrow(a, b, i0, h), (int)a->ldq,
                    v + att_krow(a, b, j0, h / a->rep), (int)a->ldk, 0.0f, dS, ATT_BLOCK);
    for (int r = 0; r < nq; r++) {
        float *Pr = P + (size_t)r * ATT_BLOCK, *dSr = dS + (size_t)r * ATT_BLOCK;
        const float lr = lse[i0 + r], dr = delta[i0 + r];
#pragma omp simd
        for (int c = 0; c < nk; c++) {
            Pr[c] = mt_cpu_expf(Pr[c] - lr);
            dSr[c] = Pr[c] * (dSr[c] - dr);
        }
    }
}

/* dV, dK of key block kb of group g += those of the tile (query block qb of head h):
 * dV += P^T dO, dK += scale dS^T Q (the scale folded in); beta 0 for the first tile. */
static void att_tile_dkv(const struct att_shape *a, const float *P, const float *dS,
                         const float *q, const float *dout, float *dk, float *dv, int b, int h,
                         int qb, int kb, bool first)
{
    const int i0 = qb * ATT_BLOCK, nq = att_rows(a->T, qb), j0 = kb * ATT_BLOCK,
              nk = att_rows(a->T, kb), g = h / a->rep;
    const size_t qrow = att_qrow(a, b, i0, h), krow = att_krow(a, b, j0, g);
    const float beta = first ? 0.0f : 1.0f;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, a->D, nq, 1.0f, P, ATT_BLOCK,
                dout + qrow, (int)a->ldq, beta, dv + krow, (int)a->ldk);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, a->D, nq, a->scale, dS, ATT_BLOCK,
                q + qrow, (int)a->ldq, beta, dk + krow, (int)a->ldk);
}

/* dQ of query block qb of head h += scale dS K of key block kb (beta 0 for kb 0). */
static void att_tile_dq(const struct att_shape *a, const float *dS, const float *k, float *dq,
                        int b, int h, int qb, int kb)
{
    const int i0 = qb * ATT_BLOCK, nq = att_rows(a->T, qb), j0 = kb * ATT_BLOCK,
              nk = att_rows(a->T, kb);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, a->D, nk, a->scale, dS, ATT_BLOCK,
                k + att_krow(a, b, j0, h / a->rep), (int)a->ldk, kb == 0 ? 0.0f : 1.0f,
                dq + att_qrow(a, b, i0, h), (int)a->ldq);
}

void mt_cpu_attention_bwd(void *ctx, float *dq, float *dk, float *dv, const float *dout,
                          const float *q, const float *k, const float *v, const float *out,
                          const float *lse, int B, int T, int Hq, int Hkv, int D)
{
    (void)ctx;
    if (B <= 0 || T <= 0 || Hq <= 0 || D <= 0) return;
    struct att_shape a = att_shape(B, T, Hq, Hkv, D);
    const int nblk = (T + ATT_BLOCK - 1) / ATT_BLOCK;
#ifdef ATT_TILE_KERNEL
    const size_t kv = (size_t)B * T * Hkv * D;
    float *kvt = mt_cpu_scratch("attention_bwd", sizeof(float) * 2 * kv);
    att_transpose(kvt, k, &a);
    att_transpose(kvt + kv, v, &a);
    a.kt = kvt;
    a.vt = kvt + kv;
#endif
    /* With a task per (batch, KV group) for every thread twice over, one pass does all:
     * the task walks its heads, key blocks and query blocks (h, kb, qb >= kb), so every
     * dK, dV row sums its tiles in the order of the dK/dV pass below and every dQ row in
     * that of the dQ pass (kb ascending): the same bits, 5 tile GEMMs instead of 7. */
    const bool one_pass = B * Hkv >= 2 * omp_get_max_threads();
    /* delta (B,Hq,T) = rowsum(dout * out) = sum_s P dP, the softmax's backward term */
    float *delta = mt_cpu_scratch("attention_bwd", sizeof(float) * (size_t)B * Hq * T);
    void *tiles = mt_cpu_scratch_threads("attention_bwd", att_tile_bytes(2));
#pragma omp parallel
    {
        float *P = mt_cpu_slice(tiles, att_tile_bytes(2)), *dS = P + ATT_BLOCK * ATT_BLOCK;
#pragma omp for collapse(3) schedule(static)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < Hq; h++) {
                    const float *o = out + att_qrow(&a, b, t, h), *d = dout + att_qrow(&a, b, t, h);
                    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                    for (int c = 0; c < D; c++) acc += o[c] * d[c];
                    delta[((size_t)b * Hq + h) * T + t] = acc;
                }
        if (one_pass) {
#pragma omp for collapse(2) schedule(dynamic, 1)
            for (int b = 0; b < B; b++)
                for (int g = 0; g < Hkv; g++)
                    for (int h = g * a.rep; h < (g + 1) * a.rep; h++) {
                        const float *lh = lse + ((size_t)b * Hq + h) * T;
                        const float *dh = delta + ((size_t)b * Hq + h) * T;
                        for (int kb = 0; kb < nblk; kb++)
                            for (int qb = kb; qb < nblk; qb++) {
                                att_tile_grads(&a, P, dS, q, k, v, dout, lh, dh, b, h,
                                               qb * ATT_BLOCK, att_rows(T, qb), kb * ATT_BLOCK,
                                               att_rows(T, kb));
                                att_tile_dkv(&a, P, dS, q, dout, dk, dv, b, h, qb, kb,
                                             h == g * a.rep && qb == kb);
                                att_tile_dq(&a, dS, k, dq, b, h, qb, kb);
                            }
                    }
        } else {
            /* dK, dV: key block kb sees query blocks kb.. */
#pragma omp for collapse(3) schedule(dynamic, 1)
            for (int kb = 0; kb < nblk; kb++)
                for (int b = 0; b < B; b++)
                    for (int g = 0; g < Hkv; g++)
                        for (int h = g * a.rep; h < (g + 1) * a.rep; h++) {
                            const float *lh = lse + ((size_t)b * Hq + h) * T;
                            const float *dh = delta + ((size_t)b * Hq + h) * T;
                            for (int qb = kb; qb < nblk; qb++) {
                                att_tile_grads(&a, P, dS, q, k, v, dout, lh, dh, b, h,
                                               qb * ATT_BLOCK, att_rows(T, qb), kb * ATT_BLOCK,
                                               att_rows(T, kb));
                                att_tile_dkv(&a, P, dS, q, dout, dk, dv, b, h, qb, kb,
                                             h == g * a.rep && qb == kb);
                            }
                        }
            /* dQ: query block qb sees key blocks 0..qb */
#pragma omp for collapse(3) schedule(dynamic, 1)
            for (int qb = nblk - 1; qb >= 0; qb--)
                for (int b = 0; b < B; b++)
                    for (int h = 0; h < Hq; h++) {
                        const float *lh = lse + ((size_t)b * Hq + h) * T;
                        const float *dh = delta + ((size_t)b * Hq + h) * T;
                        for (int kb = 0; kb <= qb; kb++) {
                            att_tile_grads(&a, P, dS, q, k, v, dout, lh, dh, b, h,
                                           qb * ATT_BLOCK, att_rows(T, qb), kb * ATT_BLOCK,
                                           att_rows(T, kb));
                            att_tile_dq(&a, dS, k, dq, b, h, qb, kb);
                        }
                    }
        }
    }
    mt_cpu_scratch_give(tiles);
    mt_cpu_scratch_give(delta);
#ifdef ATT_TILE_KERNEL
    mt_cpu_scratch_give(kvt);
#endif
}

void mt_cpu_swiglu_fwd_span(float *restrict out, const float *restrict gate,
                            const float *restrict up, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g * mt_cpu_sigmoid(g) * up[i];
    }
}

void mt_cpu_swiglu_bwd_span(float *restrict dgate, float *restrict dup,
                            const float *restrict dout, const float *restrict gate,
                            const float *restrict up, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], s = mt_cpu_sigmoid(g), d = dout[i];
        float silu = g * s;
        dgate[i] = d * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] = d * silu;
    }
}

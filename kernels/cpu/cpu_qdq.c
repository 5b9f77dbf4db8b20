/* The FP8/FP4 recipes' operand quantisation in the model (struct mt_quant_ops,
 * doc/fp8.md "In the model"): the quantisers of cpu_quant.c applied to a GEMM operand,
 * and the values they keep written back in fp32 for the ordinary GEMM. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

static void die(const char *what, const struct mt_err *err)
{
    fprintf(stderr, "moetrain: cpu backend: qdq: %s: %s\n", what, err->msg);
    abort();
}

static float elem_max(enum mt_q_elem e)
{
    return e == MT_Q_ELEM_E4M3 ? MT_E4M3_MAX : e == MT_Q_ELEM_E5M2 ? MT_E5M2_MAX : MT_E2M1_MAX;
}

static void quantise(const struct mt_quant_spec *s, struct mt_qtensor *q, const float *x,
                     float amax, struct mt_err *err)
{
    int rc = MT_OK;
    switch (s->scaling) {
    case MT_Q_TENSOR: {
        float scale = s->scale ? *s->scale : mt_q_tensor_scale(amax, elem_max(s->elem), s->margin);
        rc = mt_quant_tensorwise(q, x, q->cols, scale, s->rnd, mt_q_seed_value(mt_quant_spec_seed(s)),
                                 s->stream, err);
        break;
    }
    case MT_Q_BLOCK_1X128:
    case MT_Q_BLOCK_128X128: rc = mt_quant_blockwise(q, x, q->cols, 1, err); break;
    case MT_Q_MX: rc = mt_quant_mxfp8(q, x, q->cols, err); break;
    case MT_Q_NVFP4:
    case MT_Q_NVFP4_2D: rc = mt_quant_nvfp4(q, x, q->cols, s->rnd, mt_q_seed_value(mt_quant_spec_seed(s)), s->stream, err);
        break;
    }
    if (rc) die("quantise", err);
}

/* The shape of the quantised tensor an (R, C) operand is stored as under s: its
 * transpose for tiles that run along rows only (mt_quant_spec_transposed). */
static void stored_shape(const struct mt_quant_spec *s, struct mt_qtensor *q, int64_t R, int64_t C)
{
    const bool tr = mt_quant_spec_transposed(s);
    mt_qtensor_shape(q, s->scaling, s->elem, s->scaling == MT_Q_MX ? s->along : MT_Q_ALONG_ROW,
                     tr ? C : R, tr ? R : C);
}

/* q (stored_shape, its arrays allocated or a packed view) = the (R, C) fp32 tensor w
 * quantised under s; amax: what the per-tensor scales come from. */
static void quantise_dense(const struct mt_quant_spec *s, struct mt_qtensor *q, const float *w,
                           int64_t R, int64_t C, float amax)
{
    struct mt_err err = { 0 };
    float *t = NULL;
    const float *src = w;
    if (mt_quant_spec_transposed(s)) {
        t = mt_cpu_scratch("qdq", sizeof(float) * (size_t)R * (size_t)C);
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) t[c * R + r] = w[r * C + c];
        src = t;
    }
    quantise(s, q, src, amax, &err);
    if (t) mt_cpu_scratch_give(t);
}

/* w (R, C) fp32 = the values q (stored_shape) holds. */
static void dequantise_dense(const struct mt_quant_spec *s, const struct mt_qtensor *q, float *w,
                             int64_t R, int64_t C)
{
    struct mt_err err = { 0 };
    if (!mt_quant_spec_transposed(s)) {
        if (mt_dequant(q, w, C, &err)) die("dequantise", &err);
        return;
    }
    float *t = mt_cpu_scratch("qdq", sizeof(float) * (size_t)R * (size_t)C);
    if (mt_dequant(q, t, R, &err)) die("dequantise", &err);
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) w[r * C + c] = t[c * R + r];
    mt_cpu_scratch_give(t);
}

/* Quantises the (R, C) fp32 tensor w in place to the values its quantisation holds;
 * amax: what the per-tensor scales come from. */
static void qdq_dense(const struct mt_quant_spec *s, float *w, int64_t R, int64_t C, float amax)
{
    struct mt_err err = { 0 };
    struct mt_qtensor q, shape;
    stored_shape(s, &shape, R, C);
    if (mt_qtensor_init(&q, shape.scaling, shape.elem, shape.along, shape.rows, shape.cols, &err))
        die("quantised tensor", &err);
    quantise_dense(s, &q, w, R, C, amax);
    dequantise_dense(s, &q, w, R, C);
    mt_qtensor_free(&q);
}

/* NVFP4 on a shard: quantised inside a zero tensor of the logical shape, so that
 * stochastic rounding draws each element's logical index; the per-tensor scale comes
 * from the tensor's amax (mt_quant_nvfp4 takes it from what it quantises), planted in
 * an element outside the shard: a block of its own, since the shard is whole blocks. */
static void qdq_nvfp4_shard(const struct mt_quant_spec *s, float *w, int64_t R, int64_t C)
{
    const int64_t LR = s->lrows, LC = s->lcols;
    float *L = mt_cpu_scratch("qdq", sizeof(float) * (size_t)LR * (size_t)LC);
    memset(L, 0, sizeof(float) * (size_t)LR * (size_t)LC);
    for (int64_t r = 0; r < R; r++)
        memcpy(L + (s->row0 + r) * LC + s->col0, w + r * C, sizeof(float) * (size_t)C);
    if (s->tensor_amax) {
        const int64_t pr = LR > R ? (s->row0 ? 0 : R) : 0, pc = LR > R ? 0 : (s->col0 ? 0 : C);
        L[pr * LC + pc] = *s->tensor_amax;
    }
    qdq_dense(s, L, LR, LC, 0.0f);
    for (int64_t r = 0; r < R; r++)
        memcpy(w + r * C, L + (s->row0 + r) * LC + s->col0, sizeof(float) * (size_t)C);
    mt_cpu_scratch_give(L);
}

/* out (R, C) fp32 = x in fp32, Hadamard-transformed where s says, its amax recorded
 * where s says; returns that amax. The arguments checked. */
static float prepare(const struct mt_quant_spec *s, struct mt_tensor out, struct mt_tensor x)
{
    const int64_t R = x.rows, C = x.cols;
    struct mt_err err = { 0 };
    if (out.dtype != MT_F32 || out.rows != R || out.cols != C || out.ld != C || x.ld != C ||
        (x.dtype != MT_F32 && x.dtype != MT_BF16)) {
        mt_err_set(&err, MT_EINVAL, "out (%lld,%lld) must be dense fp32 of x's shape (%lld,%lld), "
                   "x dense fp32 or bf16", (long long)out.rows, (long long)out.cols,
                   (long long)R, (long long)C);
        die("arguments", &err);
    }
    const bool shard = s->lrows > 0 && (s->lrows > R || s->lcols > C);
    if (s->lrows > 0 && (s->lrows < s->row0 + R || s->lcols < s->col0 + C || s->row0 < 0 ||
                         s->col0 < 0 || (shard && s->lrows > R && s->lcols > C))) {
        mt_err_set(&err, MT_EINVAL, "the shard (%lld,%lld) at (%lld,%lld) does not lie along one "
                   "dimension of the logical (%lld,%lld) tensor", (long long)R, (long long)C,
                   (long long)s->row0, (long long)s->col0, (long long)s->lrows,
                   (long long)s->lcols);
        die("arguments", &err);
    }
    if (s->tensor_amax && !shard && (s->scaling == MT_Q_NVFP4 || s->scaling == MT_Q_NVFP4_2D)) {
        mt_err_set(&err, MT_EINVAL, "an NVFP4 tensor amax needs the shard's place in its tensor");
        die("arguments", &err);
    }
    if (R <= 0 || C <= 0) return 0.0f;
    const size_t n = (size_t)R * (size_t)C;
    float *w = out.data; /* the work happens in out: x in fp32, then its quantised values */
    if (x.dtype == MT_F32) {
        if (x.data != out.data) memmove(w, x.data, sizeof(float) * n);
    } else {
        const uint16_t *b = x.data;
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)b[i] << 16;
            memcpy(&w[i], &u, sizeof u);
        }
    }
    if (s->rht && R >= 16 &&
        mt_q_rht(w, R / 16 * 16, C, C, MT_Q_ALONG_COL, mt_q_seed_value(mt_quant_spec_seed(s)), s->rht_stream, &err))
        die("Hadamard transform", &err);
    const float amax = mt_q_amax(w, R, C, C);
    if (s->amax && !(amax <= *s->amax)) *s->amax = amax; /* a NaN is recorded */
    return amax;
}

/* Whether s quantises x as a shard of a larger tensor. */
static bool is_shard(const struct mt_quant_spec *s, struct mt_tensor x)
{
    return s->lrows > 0 && (s->lrows > x.rows || s->lcols > x.cols);
}

void mt_cpu_qdq(void *ctx, const struct mt_quant_spec *s, struct mt_tensor out, struct mt_tensor x)
{
    (void)ctx;
    const float amax = prepare(s, out, x);
    if (x.rows <= 0 || x.cols <= 0) return;
    if (is_shard(s, x) && (s->scaling == MT_Q_NVFP4 || s->scaling == MT_Q_NVFP4_2D))
        qdq_nvfp4_shard(s, out.data, x.rows, x.cols);
    else
        qdq_dense(s, out.data, x.rows, x.cols, s->tensor_amax ? *s->tensor_amax : amax);
}

void mt_cpu_random_key(void *ctx, uint64_t *key, uint64_t base, int dp, int dp_rank, bool end,
                       const struct mt_step_gate *gate)
{
    (void)ctx;
    if (end && gate && !mt_q_step_taken(gate->sumsq, gate->loss, gate->loss_stride, gate->n_loss)) return;
    mt_q_random_key_step(key, base, dp, dp_rank, end);
}

void mt_cpu_amax_nan_to_inf(void *ctx, float *amax, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        if (amax[i] != amax[i]) amax[i] = INFINITY;
}

size_t mt_cpu_quant_saved_bytes(const struct mt_quant_spec *s, int64_t rows, int64_t cols)
{
    struct mt_qtensor q;
    stored_shape(s, &q, rows, cols);
    return mt_qtensor_packed_bytes(&q);
}

void mt_cpu_quant_save(void *ctx, const struct mt_quant_spec *s, void *saved, struct mt_tensor x)
{
    (void)ctx;
    const int64_t R = x.rows, C = x.cols;
    if (R <= 0 || C <= 0) return;
    if (is_shard(s, x) && (s->scaling == MT_Q_NVFP4 || s->scaling == MT_Q_NVFP4_2D)) {
        struct mt_err err = { 0 };
        mt_err_set(&err, MT_EUNSUPPORTED, "an NVFP4 shard is quantised in its logical tensor, "
                   "which save does not keep");
        die("save", &err);
    }
    float *w = mt_cpu_scratch("quantised copy", sizeof(float) * (size_t)R * (size_t)C);
    const float amax = prepare(s, mt_f32(w, R, C), x);
    struct mt_qtensor q;
    stored_shape(s, &q, R, C);
    mt_qtensor_pack_view(&q, saved);
    quantise_dense(s, &q, w, R, C, s->tensor_amax ? *s->tensor_amax : amax);
    mt_qtensor_pack_global(&q, saved);
    mt_cpu_scratch_give(w);
}

/* One operand of the quantised GEMM: its quantised values in fp32, in s->work when it
 * holds them, else in scratch (*taken, given back after the product). */
static struct mt_tensor operand_values(const struct mt_quant_spec *s, struct mt_tensor x, void **taken)
{
    const size_t bytes = sizeof(float) * (size_t)x.rows * (size_t)x.cols;
    float *v = s->work && s->work_bytes >= bytes ? s->work : NULL;
    *taken = NULL;
    if (!v) v = *taken = mt_cpu_scratch("quantised gemm", bytes);
    const struct mt_tensor out = mt_f32(v, x.rows, x.cols);
    if (!s->saved) {
        mt_cpu_qdq(NULL, s, out, x);
        return out;
    }
    if (x.rows <= 0 || x.cols <= 0) return out;
    struct mt_qtensor q; /* the copy save kept: its values are qdq's of x */
    stored_shape(s, &q, x.rows, x.cols);
    mt_qtensor_pack_view(&q, (void *)s->saved);
    dequantise_dense(s, &q, v, x.rows, x.cols);
    return out;
}

/* x (rows, cols) as a dense (cols, rows) copy in scratch. */
static float *transposed(const float *x, int64_t rows, int64_t cols)
{
    float *t = mt_cpu_scratch("quantised gemm", sizeof(float) * (size_t)rows * (size_t)cols);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) t[c * rows + r] = x[r * cols + c];
    return t;
}

/* The blockwise recipe's GEMM (doc/fp8.md, "Blockwise accumulation"): on the quantised
 * values qa, qb (fp32, as stored), each run of 128 k from k = 0 (one scale of each
 * operand: its 1 x 128 tile or 128 x 128 block) is summed exactly, rounded to fp32 and
 * added to an fp32 accumulator in k order; then c = acc (+ beta c). The run's sum is
 * exact in double: its products are of E4M3 codes (4 significant bits each) times one
 * power-of-two scale pair, at most 36 binades apart, 128 of them: 51 bits. So any order
 * of the run gives the one sum, which is Hopper's promotion as cuBLASLt's VEC128_32F
 * and BLK128x128_32F modes define it (the emulator's narrow_matmul, mt_q_gemm's
 * split_accum). */
static void split_gemm(bool trans_a, bool trans_b, struct mt_tensor qa, struct mt_tensor qb,
                       int64_t k, float beta, struct mt_tensor c)
{
    const int64_t m = c.rows, n = c.cols;
    /* both operands with k contiguous: a as (m, k), b as (n, k) */
    float *ta = trans_a ? transposed(qa.data, qa.rows, qa.cols) : NULL;
    float *tb = trans_b ? NULL : transposed(qb.data, qb.rows, qb.cols);
    const float *A = ta ? ta : qa.data, *B = tb ? tb : qb.data;
    float *out = c.dtype == MT_F32 ? NULL : mt_cpu_scratch("quantised gemm",
                                                           sizeof(float) * (size_t)(m * n));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            const float *x = A + i * k, *y = B + j * k;
            float acc = 0.0f;
            for (int64_t k0 = 0; k0 < k; k0 += 128) {
                const int64_t k1 = k0 + 128 < k ? k0 + 128 : k;
                double s[4] = { 0.0, 0.0, 0.0, 0.0 }; /* exact: any grouping */
                int64_t l = k0;
                for (; l + 4 <= k1; l += 4)
                    for (int u = 0; u < 4; u++) s[u] += (double)x[l + u] * (double)y[l + u];
                for (; l < k1; l++) s[0] += (double)x[l] * (double)y[l];
                acc += (float)((s[0] + s[1]) + (s[2] + s[3]));
            }
            if (out) {
                out[i * n + j] = acc;
            } else {
                float *cij = (float *)c.data + i * c.ld + j;
                *cij = beta != 0.0f ? acc + beta * *cij : acc;
            }
        }
    if (out) {
        for (int64_t i = 0; i < m; i++)
            mt_cpu_narrow((uint16_t *)c.data + i * c.ld, out + i * n, (size_t)n);
        mt_cpu_scratch_give(out);
    }
    if (ta) mt_cpu_scratch_give(ta);
    if (tb) mt_cpu_scratch_give(tb);
}

static bool blockwise(const struct mt_quant_spec *s)
{
    return s->scaling == MT_Q_BLOCK_1X128 || s->scaling == MT_Q_BLOCK_128X128;
}

void mt_cpu_qgemm(void *ctx, bool trans_a, bool trans_b, const struct mt_quant_spec *sa,
                  struct mt_tensor a, const struct mt_quant_spec *sb, struct mt_tensor b, float beta,
                  struct mt_tensor c)
{
    const int64_t k = trans_a ? a.rows : a.cols;
    if ((trans_a ? a.cols : a.rows) != c.rows || (trans_b ? b.rows : b.cols) != c.cols ||
        (trans_b ? b.cols : b.rows) != k) {
        struct mt_err err = { 0 };
        mt_err_set(&err, MT_EINVAL, "op(a) (%lld,%lld) op(b) (%lld,%lld) does not give c (%lld,%lld)",
                   (long long)(trans_a ? a.cols : a.rows), (long long)k,
                   (long long)(trans_b ? b.cols : b.rows), (long long)(trans_b ? b.rows : b.cols),
                   (long long)c.rows, (long long)c.cols);
        die("gemm arguments", &err);
    }
    void *ta, *tb;
    const struct mt_tensor qa = operand_values(sa, a, &ta), qb = operand_values(sb, b, &tb);
    if (blockwise(sa) != blockwise(sb)) {
        struct mt_err err = { 0 };
        mt_err_set(&err, MT_EINVAL, "a blockwise operand times a %s one: a GEMM takes two "
                   "operands of one recipe", blockwise(sa) ? mt_q_scaling_name(sb->scaling)
                                                             : mt_q_scaling_name(sa->scaling));
        die("gemm arguments", &err);
    }
    if (blockwise(sa)) {
        if (c.dtype == MT_BF16 && beta != 0.0f) {
            struct mt_err err = { 0 };
            mt_err_set(&err, MT_EINVAL, "a bf16 c takes beta = 0");
            die("gemm arguments", &err);
        }
        split_gemm(trans_a, trans_b, qa, qb, k, beta, c);
    } else {
        mt_cpu_t_gemm(ctx, trans_a, trans_b, (int)c.rows, (int)c.cols, (int)k, 1.0f, qa, qb, beta, c);
    }
    if (ta) mt_cpu_scratch_give(ta);
    if (tb) mt_cpu_scratch_give(tb);
}

void mt_cpu_amax_history(void *ctx, float *hist, float *hscale, float *scale, float *amax, int n,
                         int len, int32_t *pos, bool max_algo, float fmax, float gmax, int margin,
                         float grad_unit, const struct mt_step_gate *gate)
{
    (void)ctx;
    if (amax && gate && !mt_q_step_taken(gate->sumsq, gate->loss, gate->loss_stride, gate->n_loss)) return;
    int latest = 0, count = 0;
    if (amax) {
        latest = pos[0] = (pos[0] + 1) % len;
        count = pos[1] = pos[1] < len ? pos[1] + 1 : len;
    }
    for (int i = 0; i < n; i++) {
        const bool grad = i % 3 == MT_Q_G && grad_unit > 0.0f;
        if (amax) {
            float a = amax[i];
            if (grad) a /= grad_unit;
            float *h = hist + (size_t)i * (size_t)len;
            h[latest] = a;
            hscale[i] = mt_q_history_scale(h, count, a, max_algo, i % 3 == MT_Q_G ? gmax : fmax, margin,
                                       hscale[i]);
            amax[i] = 0.0f;
        }
        scale[i] = grad ? hscale[i] / grad_unit : hscale[i];
    }
}

/* The FP8/FP4 recipes' operand quantisation in the model (struct mt_quant_ops,
 * doc/fp8.md "In the model"): the quantisers of cpu_quant.c applied to a GEMM operand,
 * and the values they keep written back in fp32 for the ordinary GEMM. */
#include <stdio.h>
#include <stdlib.h>

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

/* Whether the scaling's 1-D tiles along a column are made by quantising the transpose
 * (the quantisers of 1 x 128 tiles and of NVFP4's 16-element blocks run along rows). */
static bool via_transpose(const struct mt_quant_spec *s)
{
    return s->along == MT_Q_ALONG_COL &&
           (s->scaling == MT_Q_BLOCK_1X128 || s->scaling == MT_Q_NVFP4);
}

static void quantise(const struct mt_quant_spec *s, struct mt_qtensor *q, const float *x,
                     float amax, struct mt_err *err)
{
    int rc = MT_OK;
    switch (s->scaling) {
    case MT_Q_TENSOR: {
        float scale = s->scale ? *s->scale : mt_q_tensor_scale(amax, elem_max(s->elem), s->margin);
        rc = mt_quant_tensorwise(q, x, q->cols, scale, s->rnd, s->seed, s->stream, err);
        break;
    }
    case MT_Q_BLOCK_1X128:
    case MT_Q_BLOCK_128X128: rc = mt_quant_blockwise(q, x, q->cols, 1, err); break;
    case MT_Q_MX: rc = mt_quant_mxfp8(q, x, q->cols, err); break;
    case MT_Q_NVFP4:
    case MT_Q_NVFP4_2D: rc = mt_quant_nvfp4(q, x, q->cols, s->rnd, s->seed, s->stream, err); break;
    }
    if (rc) die("quantise", err);
}

void mt_cpu_qdq(void *ctx, const struct mt_quant_spec *s, struct mt_tensor out, struct mt_tensor x)
{
    (void)ctx;
    const int64_t R = x.rows, C = x.cols;
    struct mt_err err = { 0 };
    if (out.dtype != MT_F32 || out.rows != R || out.cols != C || out.ld != C || x.ld != C ||
        (x.dtype != MT_F32 && x.dtype != MT_BF16)) {
        mt_err_set(&err, MT_EINVAL, "out (%lld,%lld) must be dense fp32 of x's shape (%lld,%lld), "
                   "x dense fp32 or bf16", (long long)out.rows, (long long)out.cols,
                   (long long)R, (long long)C);
        die("arguments", &err);
    }
    if (R <= 0 || C <= 0) return;
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
    if (s->rht && R >= 16 && mt_q_rht(w, R / 16 * 16, C, C, MT_Q_ALONG_COL, s->seed, s->rht_stream, &err))
        die("Hadamard transform", &err);
    const bool tr = via_transpose(s);
    float *t = NULL, *src = w;
    int64_t qr = R, qc = C;
    if (tr) {
        t = mt_cpu_scratch("qdq", sizeof(float) * n);
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) t[c * R + r] = w[r * C + c];
        src = t;
        qr = C;
        qc = R;
    }
    const float amax = mt_q_amax(src, qr, qc, qc);
    if (s->amax && !(amax <= *s->amax)) *s->amax = amax; /* a NaN is recorded */
    struct mt_qtensor q;
    if (mt_qtensor_init(&q, s->scaling, s->elem, s->scaling == MT_Q_MX ? s->along : MT_Q_ALONG_ROW,
                        qr, qc, &err))
        die("quantised tensor", &err);
    quantise(s, &q, src, amax, &err);
    if (mt_dequant(&q, src, qc, &err)) die("dequantise", &err);
    mt_qtensor_free(&q);
    if (tr) {
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) w[r * C + c] = t[c * R + r];
        mt_cpu_scratch_give(t);
    }
}

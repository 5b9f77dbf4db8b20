/* The FP8/FP4 recipes' quantisers, dequantisers and reference GEMM on the CPU
 * (kernels/quant_recipe.h; the codecs are kernels/quant.h). Loops are plain and
 * sequential: this is the definition the GPU path is compared with. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant_recipe.h"

static int is_blockwise(enum mt_q_scaling s)
{
    return s == MT_Q_BLOCK_1X128 || s == MT_Q_BLOCK_128X128;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int64_t row_bytes(const struct mt_qtensor *q)
{
    return q->elem == MT_Q_ELEM_E2M1 ? (q->cols + 1) / 2 : q->cols;
}

void mt_qtensor_shape(struct mt_qtensor *q, enum mt_q_scaling scaling, enum mt_q_elem elem,
                      enum mt_q_dim along, int64_t rows, int64_t cols)
{
    memset(q, 0, sizeof *q);
    q->scaling = scaling;
    q->elem = elem;
    q->along = along;
    q->rows = rows;
    q->cols = cols;
    q->global = 1.0f;
    switch (scaling) {
    case MT_Q_TENSOR: q->srows = q->scols = 1; break;
    case MT_Q_BLOCK_1X128: q->srows = rows; q->scols = cdiv(cols, 128); break;
    case MT_Q_BLOCK_128X128: q->srows = cdiv(rows, 128); q->scols = cdiv(cols, 128); break;
    case MT_Q_MX:
        q->srows = along == MT_Q_ALONG_ROW ? rows : cdiv(rows, 32);
        q->scols = along == MT_Q_ALONG_ROW ? cdiv(cols, 32) : cols;
        break;
    case MT_Q_NVFP4:
    case MT_Q_NVFP4_2D: q->srows = rows; q->scols = cdiv(cols, 16); break;
    }
}

/* Whether the scales are bytes (UE8M0, UE4M3), else fp32. */
static int scales_are_bytes(enum mt_q_scaling s) { return s == MT_Q_MX || mt_q_is_nvfp4(s); }

size_t mt_qtensor_data_bytes(const struct mt_qtensor *q) { return (size_t)(q->rows * row_bytes(q)); }

size_t mt_qtensor_scale_bytes(const struct mt_qtensor *q)
{
    return (size_t)(q->srows * q->scols) * (scales_are_bytes(q->scaling) ? 1 : sizeof(float));
}

/* The packed layout: the global scale in a 16-byte header, the scales, the data (each
 * part 16-byte aligned). */
static size_t align16(size_t n) { return (n + 15) / 16 * 16; }

size_t mt_qtensor_packed_bytes(const struct mt_qtensor *q)
{
    return 16 + align16(mt_qtensor_scale_bytes(q)) + mt_qtensor_data_bytes(q);
}

void mt_qtensor_pack_view(struct mt_qtensor *q, void *buf)
{
    char *b = buf;
    memcpy(&q->global, b, sizeof(float));
    if (scales_are_bytes(q->scaling))
        q->scale8 = (uint8_t *)(b + 16);
    else
        q->scale = (float *)(void *)(b + 16);
    q->data = (uint8_t *)(b + 16 + align16(mt_qtensor_scale_bytes(q)));
}

void mt_qtensor_pack_global(const struct mt_qtensor *q, void *buf) { memcpy(buf, &q->global, sizeof(float)); }

int mt_qtensor_init(struct mt_qtensor *q, enum mt_q_scaling scaling, enum mt_q_elem elem,
                    enum mt_q_dim along, int64_t rows, int64_t cols, struct mt_err *err)
{
    memset(q, 0, sizeof *q);
    if (rows <= 0 || cols <= 0)
        return mt_err_set(err, MT_EINVAL, "quantised tensor: shape (%lld, %lld) is empty",
                          (long long)rows, (long long)cols);
    int fp4 = elem == MT_Q_ELEM_E2M1;
    if (mt_q_is_nvfp4(scaling) != fp4 || (scaling == MT_Q_MX && elem != MT_Q_ELEM_E4M3))
        return mt_err_set(err, MT_EINVAL,
                          "quantised tensor: %s scaling takes %s elements",
                          mt_q_scaling_name(scaling),
                          mt_q_is_nvfp4(scaling) ? "E2M1" : scaling == MT_Q_MX ? "E4M3" : "E4M3 or E5M2");
    if (along == MT_Q_ALONG_COL && scaling != MT_Q_MX)
        return mt_err_set(err, MT_EINVAL,
                          "quantised tensor: %s scaling has blocks along the row only; "
                          "transpose the tensor first", mt_q_scaling_name(scaling));
    mt_qtensor_shape(q, scaling, elem, along, rows, cols);
    size_t nscale = (size_t)(q->srows * q->scols);
    q->data = calloc(mt_qtensor_data_bytes(q), 1);
    if (scales_are_bytes(scaling))
        q->scale8 = calloc(nscale, 1);
    else
        q->scale = calloc(nscale, sizeof(float));
    if (!q->data || (!q->scale8 && !q->scale)) {
        mt_qtensor_free(q);
        return mt_err_set(err, MT_ENOMEM, "quantised tensor: out of memory for (%lld, %lld)",
                          (long long)rows, (long long)cols);
    }
    return MT_OK;
}

void mt_qtensor_free(struct mt_qtensor *q)
{
    free(q->data);
    free(q->scale);
    free(q->scale8);
    q->data = NULL;
    q->scale = NULL;
    q->scale8 = NULL;
}

static float amax_of(float m, float x)
{
    float a = fabsf(x);
    if (isnan(m) || isnan(a)) return NAN;
    return a > m ? a : m;
}

float mt_q_amax(const float *x, int64_t rows, int64_t cols, int64_t ld)
{
    float m = 0.0f;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) m = amax_of(m, x[r * ld + c]);
    return m;
}

/* Rounds v to q's element format and stores it at (r, c). */
static void put(struct mt_qtensor *q, int64_t r, int64_t c, float v, enum mt_q_round rnd,
                uint32_t rbits)
{
    if (q->elem == MT_Q_ELEM_E2M1) {
        uint8_t *b = &q->data[r * row_bytes(q) + c / 2];
        uint8_t n = mt_e2m1_from_float(v, rnd, rbits);
        *b = (uint8_t)(c & 1 ? (*b & 0x0f) | (n << 4) : (*b & 0xf0) | n);
    } else if (q->elem == MT_Q_ELEM_E4M3) {
        q->data[r * q->cols + c] = mt_e4m3_from_float(v, 1, rnd, rbits);
    } else {
        q->data[r * q->cols + c] = mt_e5m2_from_float(v, 1, rnd, rbits);
    }
}

/* The code value (unscaled) of the element at (r, c). */
static float code_value(const struct mt_qtensor *q, int64_t r, int64_t c)
{
    if (q->elem == MT_Q_ELEM_E2M1) {
        uint8_t b = q->data[r * row_bytes(q) + c / 2];
        return mt_e2m1_to_float((uint8_t)(c & 1 ? b >> 4 : b & 0x0f));
    }
    uint8_t b = q->data[r * q->cols + c];
    return q->elem == MT_Q_ELEM_E4M3 ? mt_e4m3_to_float(b) : mt_e5m2_to_float(b);
}

/* The block scale (decode) of the element at (r, c); 1 for MT_Q_TENSOR, whose scale is
 * per tensor (tensor_scale). */
static float block_scale(const struct mt_qtensor *q, int64_t r, int64_t c)
{
    switch (q->scaling) {
    case MT_Q_TENSOR: return 1.0f;
    case MT_Q_BLOCK_1X128: return q->scale[r * q->scols + c / 128];
    case MT_Q_BLOCK_128X128: return q->scale[(r / 128) * q->scols + c / 128];
    case MT_Q_MX:
        return mt_e8m0_to_float(q->along == MT_Q_ALONG_ROW ? q->scale8[r * q->scols + c / 32]
                                                           : q->scale8[(r / 32) * q->scols + c]);
    case MT_Q_NVFP4:
    case MT_Q_NVFP4_2D: return mt_e4m3_to_float(q->scale8[r * q->scols + c / 16]);
    }
    return NAN;
}

static float tensor_scale(const struct mt_qtensor *q)
{
    return q->scaling == MT_Q_TENSOR ? q->scale[0] : mt_q_is_nvfp4(q->scaling) ? q->global : 1.0f;
}

/* Whether a quantiser of scalings a or b may fill q from a source with row stride ld. */
static int check_kind(const struct mt_qtensor *q, enum mt_q_scaling a, enum mt_q_scaling b,
                      int64_t ld, const char *fn, struct mt_err *err)
{
    if (!q->data)
        return mt_err_set(err, MT_EINVAL, "%s: the tensor has no storage (mt_qtensor_init)", fn);
    if (q->scaling != a && q->scaling != b)
        return mt_err_set(err, MT_EINVAL, "%s: the tensor was set up for %s scaling",
                          fn, mt_q_scaling_name(q->scaling));
    if (ld < q->cols)
        return mt_err_set(err, MT_EINVAL, "%s: row stride %lld is less than the %lld columns",
                          fn, (long long)ld, (long long)q->cols);
    return MT_OK;
}

int mt_quant_tensorwise(struct mt_qtensor *q, const float *x, int64_t ld, float scale,
                        enum mt_q_round rnd, uint64_t seed, uint32_t stream,
                        struct mt_err *err)
{
    int rc = check_kind(q, MT_Q_TENSOR, MT_Q_TENSOR, ld, "mt_quant_tensorwise", err);
    if (rc) return rc;
    if (!(scale > 0.0f) || !isfinite(scale))
        return mt_err_set(err, MT_EINVAL, "mt_quant_tensorwise: scale %g is not a positive "
                          "finite number (mt_q_tensor_scale gives one)", (double)scale);
    for (int64_t r = 0; r < q->rows; r++)
        for (int64_t c = 0; c < q->cols; c++) {
            uint64_t i = (uint64_t)(r * q->cols + c);
            uint32_t rb = rnd == MT_Q_SR ? mt_q_random_byte(seed, stream, i) : 0;
            put(q, r, c, x[r * ld + c] * scale, rnd, rb);
        }
    q->scale[0] = 1.0f / scale;
    return MT_OK;
}

int mt_amax_history_init(struct mt_amax_history *h, int len, enum mt_amax_algo algo,
                         float fmax, int margin, struct mt_err *err)
{
    memset(h, 0, sizeof *h);
    if (len < 1)
        return mt_err_set(err, MT_EINVAL, "amax history: length %d; it needs at least 1", len);
    if (!(fmax > 0.0f))
        return mt_err_set(err, MT_EINVAL, "amax history: format maximum %g is not positive",
                          (double)fmax);
    h->amax = calloc((size_t)len, sizeof(float));
    if (!h->amax) return mt_err_set(err, MT_ENOMEM, "amax history: out of memory");
    h->len = len;
    h->algo = algo;
    h->fmax = fmax;
    h->margin = margin;
    h->latest = len - 1;
    h->scale = 1.0f;
    return MT_OK;
}

void mt_amax_history_free(struct mt_amax_history *h)
{
    free(h->amax);
    h->amax = NULL;
}

void mt_amax_history_update(struct mt_amax_history *h, float amax)
{
    h->latest = (h->latest + 1) % h->len;
    h->amax[h->latest] = amax;
    if (h->count < h->len) h->count++;
    h->scale = mt_q_history_scale(h->amax, h->count, amax, h->algo == MT_AMAX_MAX, h->fmax, h->margin,
                                  h->scale);
}

float mt_amax_history_scale(const struct mt_amax_history *h) { return h->scale; }

int mt_quant_blockwise(struct mt_qtensor *q, const float *x, int64_t ld, int pow2,
                       struct mt_err *err)
{
    int rc = check_kind(q, MT_Q_BLOCK_1X128, MT_Q_BLOCK_128X128, ld, "mt_quant_blockwise", err);
    if (rc) return rc;
    float fmax = q->elem == MT_Q_ELEM_E4M3 ? MT_E4M3_MAX : MT_E5M2_MAX;
    int64_t bh = q->scaling == MT_Q_BLOCK_1X128 ? 1 : 128;
    for (int64_t br = 0; br < q->srows; br++)
        for (int64_t bc = 0; bc < q->scols; bc++) {
            int64_t r0 = br * bh, r1 = r0 + bh < q->rows ? r0 + bh : q->rows;
            int64_t c0 = bc * 128, c1 = c0 + 128 < q->cols ? c0 + 128 : q->cols;
            float amax = 0.0f;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) amax = amax_of(amax, x[r * ld + c]);
            float s = mt_q_block_scale(amax, fmax, pow2);
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) put(q, r, c, x[r * ld + c] * s, MT_Q_RN, 0);
            q->scale[br * q->scols + bc] = 1.0f / s;
        }
    return MT_OK;
}

int mt_quant_mxfp8(struct mt_qtensor *q, const float *x, int64_t ld, struct mt_err *err)
{
    int rc = check_kind(q, MT_Q_MX, MT_Q_MX, ld, "mt_quant_mxfp8", err);
    if (rc) return rc;
    int col = q->along == MT_Q_ALONG_COL;
    for (int64_t sr = 0; sr < q->srows; sr++)
        for (int64_t sc = 0; sc < q->scols; sc++) {
            /* the block: 32 elements from (r0, c0) along the row or the column */
            int64_t r0 = col ? sr * 32 : sr, c0 = col ? sc : sc * 32;
            int64_t n = col ? q->rows - r0 : q->cols - c0;
            if (n > 32) n = 32;
            float amax = 0.0f;
            for (int64_t i = 0; i < n; i++)
                amax = amax_of(amax, col ? x[(r0 + i) * ld + c0] : x[r0 * ld + c0 + i]);
            uint8_t s = mt_q_mx_scale(amax);
            float m = mt_q_mx_element_scale(s);
            for (int64_t i = 0; i < n; i++) {
                int64_t r = col ? r0 + i : r0, c = col ? c0 : c0 + i;
                put(q, r, c, x[r * ld + c] * m, MT_Q_RN, 0);
            }
            q->scale8[sr * q->scols + sc] = s;
        }
    return MT_OK;
}

int mt_quant_nvfp4(struct mt_qtensor *q, const float *x, int64_t ld, enum mt_q_round rnd,
                   uint64_t seed, uint32_t stream, struct mt_err *err)
{
    int rc = check_kind(q, MT_Q_NVFP4, MT_Q_NVFP4_2D, ld, "mt_quant_nvfp4", err);
    if (rc) return rc;
    float genc = mt_q_nvfp4_global_scale(mt_q_amax(x, q->rows, q->cols, ld));
    int64_t bh = q->scaling == MT_Q_NVFP4_2D ? 16 : 1;
    for (int64_t r0 = 0; r0 < q->rows; r0 += bh)
        for (int64_t bc = 0; bc < q->scols; bc++) {
            int64_t r1 = r0 + bh < q->rows ? r0 + bh : q->rows;
            int64_t c0 = bc * 16, c1 = c0 + 16 < q->cols ? c0 + 16 : q->cols;
            float amax = 0.0f;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) amax = amax_of(amax, x[r * ld + c]);
            uint8_t s = mt_q_nvfp4_block_scale(amax, genc);
            float m = mt_q_nvfp4_element_scale(s, genc);
            for (int64_t r = r0; r < r1; r++) {
                q->scale8[r * q->scols + bc] = s;
                for (int64_t c = c0; c < c1; c++) {
                    uint64_t i = (uint64_t)(r * q->cols + c);
                    uint32_t rb = rnd == MT_Q_SR ? mt_q_random_byte(seed, stream, i) : 0;
                    put(q, r, c, x[r * ld + c] * m, rnd, rb);
                }
            }
        }
    q->global = 1.0f / genc;
    return MT_OK;
}

int mt_dequant(const struct mt_qtensor *q, float *out, int64_t ld, struct mt_err *err)
{
    if (!q->data)
        return mt_err_set(err, MT_EINVAL, "mt_dequant: the tensor has no storage (mt_qtensor_init)");
    if (ld < q->cols)
        return mt_err_set(err, MT_EINVAL, "mt_dequant: row stride %lld is less than the %lld "
                          "columns", (long long)ld, (long long)q->cols);
    float g = tensor_scale(q);
    for (int64_t r = 0; r < q->rows; r++)
        for (int64_t c = 0; c < q->cols; c++) {
            out[r * ld + c] = code_value(q, r, c) * block_scale(q, r, c) * g;
        }
    return MT_OK;
}

void mt_q_rht_matrix(float q[256], uint64_t seed, uint32_t stream)
{
    uint32_t signs = mt_q_hadamard_signs(seed, stream);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            int neg = __builtin_parity((unsigned)(i & j)) ^ (int)((signs >> i) & 1u);
            q[i * 16 + j] = neg ? -0.25f : 0.25f;
        }
}

int mt_q_rht(float *x, int64_t rows, int64_t cols, int64_t ld, enum mt_q_dim dim,
             uint64_t seed, uint32_t stream, struct mt_err *err)
{
    int64_t extent = dim == MT_Q_ALONG_ROW ? cols : rows;
    if (extent % 16)
        return mt_err_set(err, MT_EINVAL,
                          "random Hadamard transform: the %s count %lld is not a multiple of 16 "
                          "(pad the GEMM's reduction dimension to 16)",
                          dim == MT_Q_ALONG_ROW ? "column" : "row", (long long)extent);
    float h[256];
    mt_q_rht_matrix(h, seed, stream);
    int64_t lines = dim == MT_Q_ALONG_ROW ? rows : cols;
    /* element e of a line's chunk starting at s: stride 1 along a row, ld along a column */
    int64_t step = dim == MT_Q_ALONG_ROW ? 1 : ld;
    for (int64_t l = 0; l < lines; l++)
        for (int64_t s = 0; s < extent; s += 16) {
            float *v = dim == MT_Q_ALONG_ROW ? &x[l * ld + s] : &x[s * ld + l];
            float in[16];
            for (int i = 0; i < 16; i++) in[i] = v[i * step];
            for (int j = 0; j < 16; j++) {
                float acc = 0.0f;
                for (int i = 0; i < 16; i++) acc += in[i] * h[i * 16 + j];
                v[j * step] = acc;
            }
        }
    return MT_OK;
}

/* The family a scaling multiplies with. */
static int family(enum mt_q_scaling s)
{
    return is_blockwise(s) ? 1 : s == MT_Q_MX ? 2 : mt_q_is_nvfp4(s) ? 3 : 0;
}

/* Whether the 1-D blocks of q lie along the reduction of a GEMM that reads q with the
 * reduction along its rows (k_along_rows: q stored (k, x)) or along its columns. */
static int blocks_along_k(const struct mt_qtensor *q, int k_along_rows)
{
    switch (q->scaling) {
    case MT_Q_TENSOR:
    case MT_Q_BLOCK_128X128:
    case MT_Q_NVFP4_2D: return 1;
    case MT_Q_BLOCK_1X128:
    case MT_Q_NVFP4: return !k_along_rows;
    case MT_Q_MX: return (q->along == MT_Q_ALONG_COL) == k_along_rows;
    }
    return 0;
}

int mt_q_gemm(const struct mt_qtensor *a, int trans_a, const struct mt_qtensor *b,
              int trans_b, float *c, int64_t ldc, int split_accum, struct mt_err *err)
{
    int64_t m = trans_a ? a->cols : a->rows, k = trans_a ? a->rows : a->cols;
    int64_t kb = trans_b ? b->cols : b->rows, n = trans_b ? b->rows : b->cols;
    if (k != kb)
        return mt_err_set(err, MT_EINVAL, "mt_q_gemm: op(a) is (%lld, %lld) but op(b) is "
                          "(%lld, %lld): the reduction extents differ", (long long)m,
                          (long long)k, (long long)kb, (long long)n);
    if (family(a->scaling) != family(b->scaling))
        return mt_err_set(err, MT_EINVAL, "mt_q_gemm: a is %s and b is %s scaled; a GEMM "
                          "takes two operands of one recipe", mt_q_scaling_name(a->scaling),
                          mt_q_scaling_name(b->scaling));
    if (!blocks_along_k(a, trans_a) || !blocks_along_k(b, !trans_b))
        return mt_err_set(err, MT_EINVAL, "mt_q_gemm: the blocks of %s (%s) do not lie along "
                          "the reduction; quantise it along its other dimension",
                          !blocks_along_k(a, trans_a) ? "a" : "b",
                          mt_q_scaling_name(!blocks_along_k(a, trans_a) ? a->scaling : b->scaling));
    if (split_accum && !is_blockwise(a->scaling))
        return mt_err_set(err, MT_EINVAL, "mt_q_gemm: split accumulation is the blockwise "
                          "recipe's; a is %s scaled", mt_q_scaling_name(a->scaling));
    float ga = tensor_scale(a), gb = tensor_scale(b);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float acc = 0.0f;
            double part = 0.0; /* a run's code products: exact (quant_recipe.h) */
            for (int64_t l = 0; l < k; l++) {
                int64_t ar = trans_a ? l : i, ac = trans_a ? i : l;
                int64_t br = trans_b ? j : l, bc = trans_b ? l : j;
                float va = code_value(a, ar, ac), vb = code_value(b, br, bc);
                if (split_accum) {
                    part += (double)va * (double)vb;
                    if (l % 128 == 127 || l == k - 1) {
                        acc += (float)part * (block_scale(a, ar, ac) * block_scale(b, br, bc));
                        part = 0.0;
                    }
                } else {
                    acc += (va * block_scale(a, ar, ac)) * (vb * block_scale(b, br, bc));
                }
            }
            c[i * ldc + j] = acc * ga * gb;
        }
    return MT_OK;
}

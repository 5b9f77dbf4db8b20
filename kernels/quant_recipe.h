/* moetrain: the FP8 and FP4 recipes' tensor quantisers, the CPU reference
 * (kernels/cpu/cpu_quant.c; doc/fp8.md). The scalar codecs and the scale rules are
 * kernels/quant.h, shared with the GPU kernels, so both compute the same bits.
 *
 * A quantised tensor (struct mt_qtensor) is what a low-precision GEMM reads: the data
 * and its scales. Shapes are those of the high-precision tensor it came from, (rows,
 * cols), row-major, cols contiguous.
 *
 * Data: one byte per element (E4M3 or E5M2), at data[r * cols + c]. E2M1 packs two
 *   elements a byte, a row taking (cols + 1) / 2 bytes: column c of row r is in byte
 *   r * ((cols + 1) / 2) + c / 2, the low nibble for an even c (an odd cols leaves the
 *   last high nibble zero).
 * Scales: a row-major (srows, scols) matrix, each entry the scale of one block; what
 *   multiplies an element's code value to give its value (a decode scale):
 *   MT_Q_TENSOR        scale[0], fp32: tensorwise (current) and delayed scaling.
 *   MT_Q_BLOCK_1X128   scale, fp32, (rows, ceil(cols/128)): 1 x 128 tiles along the
 *                      row (activations and gradients, DeepSeek-V3); the last tile of a
 *                      row is shorter when 128 does not divide cols.
 *   MT_Q_BLOCK_128X128 scale, fp32, (ceil(rows/128), ceil(cols/128)): 128 x 128 blocks
 *                      (weights); edge blocks are partial.
 *   MT_Q_MX            scale8, UE8M0: blocks of 32 along the `along` dimension;
 *                      (rows, ceil(cols/32)) along the row, (ceil(rows/32), cols) along
 *                      the column. Data stays (rows, cols) row-major either way: an
 *                      operand that the backward pass reads transposed is quantised a
 *                      second time along its other dimension, not transposed after
 *                      quantisation (the blocks must lie along the GEMM's reduction).
 *   MT_Q_NVFP4         scale8, UE4M3, (rows, ceil(cols/16)): 16 elements along the row,
 *                      and `global`, the fp32 per-tensor decode scale.
 *   MT_Q_NVFP4_2D      the same layout, each 16 x 16 block (weights) having one scale,
 *                      repeated on its 16 rows, so that the tensor and its transpose
 *                      quantise alike.
 *   The GPU GEMMs take the per-tensor scales as they are and the data in this layout
 *   (K-contiguous for an operand whose blocks lie along its rows); a block-scale
 *   matrix goes to them in the order their scale mode reads it, which the GPU path
 *   arranges from this one (the interleaved tiles of the block-scaled GEMMs for UE8M0
 *   and UE4M3 scales) and checks against it.
 *
 * The quantisers read x, a (q->rows, q->cols) fp32 view with row stride ld.
 *
 * Errors: MT_EINVAL with a message naming the argument (shapes, a recipe that does not
 * take the element format, blocks that do not lie along a GEMM's reduction). */
#ifndef MT_KERNELS_QUANT_RECIPE_H
#define MT_KERNELS_QUANT_RECIPE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/quant.h"
#include "util/error.h"

enum mt_q_elem { MT_Q_ELEM_E4M3, MT_Q_ELEM_E5M2, MT_Q_ELEM_E2M1 };

enum mt_q_scaling {
    MT_Q_TENSOR,
    MT_Q_BLOCK_1X128,
    MT_Q_BLOCK_128X128,
    MT_Q_MX,
    MT_Q_NVFP4,
    MT_Q_NVFP4_2D,
};

/* The dimension 1-D blocks run along (MT_Q_MX): along a row (the contiguous one) or
 * along a column. */
enum mt_q_dim { MT_Q_ALONG_ROW, MT_Q_ALONG_COL };

struct mt_qtensor {
    enum mt_q_scaling scaling;
    enum mt_q_elem elem;
    enum mt_q_dim along;
    int64_t rows, cols;
    uint8_t *data;
    int64_t srows, scols;
    float *scale;    /* fp32 scales: MT_Q_TENSOR and the blockwise scalings */
    uint8_t *scale8; /* UE8M0 (MT_Q_MX) or UE4M3 (NVFP4) scales */
    float global;    /* NVFP4: the per-tensor decode scale */
};

/* The scaling's name in messages ("blockwise 1x128", "nvfp4 16x16", ...). */
static inline const char *mt_q_scaling_name(enum mt_q_scaling s)
{
    switch (s) {
    case MT_Q_TENSOR: return "tensorwise";
    case MT_Q_BLOCK_1X128: return "blockwise 1x128";
    case MT_Q_BLOCK_128X128: return "blockwise 128x128";
    case MT_Q_MX: return "mxfp8";
    case MT_Q_NVFP4: return "nvfp4";
    case MT_Q_NVFP4_2D: return "nvfp4 16x16";
    }
    return "?";
}

/* NVFP4's two scalings (1 x 16 and 16 x 16 blocks): E2M1 data, UE4M3 block scales and
 * a per-tensor scale. */
static inline int mt_q_is_nvfp4(enum mt_q_scaling s) { return s == MT_Q_NVFP4 || s == MT_Q_NVFP4_2D; }

/* Allocates q's data and scales for a (rows, cols) tensor: E4M3 or E5M2 for
 * MT_Q_TENSOR and the blockwise scalings, E4M3 for MT_Q_MX, E2M1 for NVFP4. along
 * matters for MT_Q_MX only (the others take MT_Q_ALONG_ROW). */
int mt_qtensor_init(struct mt_qtensor *q, enum mt_q_scaling scaling, enum mt_q_elem elem,
                    enum mt_q_dim along, int64_t rows, int64_t cols, struct mt_err *err);
void mt_qtensor_free(struct mt_qtensor *q);
/* What mt_qtensor_init sets but the arrays (NULL), without its checks: q's shape and
 * its scale matrix's. */
void mt_qtensor_shape(struct mt_qtensor *q, enum mt_q_scaling scaling, enum mt_q_elem elem,
                      enum mt_q_dim along, int64_t rows, int64_t cols);
/* The bytes of q's data, and of its scales (fp32, or a byte each for MT_Q_MX and NVFP4). */
size_t mt_qtensor_data_bytes(const struct mt_qtensor *q);
size_t mt_qtensor_scale_bytes(const struct mt_qtensor *q);
/* A quantised tensor packed in one buffer (a copy kept for later, struct mt_quant_ops
 * save): its global scale in a 16-byte header, its scales, its data, each part 16-byte
 * aligned; mt_qtensor_packed_bytes of a shaped q. mt_qtensor_pack_view points the arrays
 * of a shaped q into buf and reads its global scale from the header;
 * mt_qtensor_pack_global writes it there (after quantising into the view). */
size_t mt_qtensor_packed_bytes(const struct mt_qtensor *q);
void mt_qtensor_pack_view(struct mt_qtensor *q, void *buf);
void mt_qtensor_pack_global(const struct mt_qtensor *q, void *buf);

/* Largest |x| of a (rows, cols) fp32 view with row stride ld; NaN if one is NaN. */
float mt_q_amax(const float *x, int64_t rows, int64_t cols, int64_t ld);

/* Tensorwise and delayed scaling: q (MT_Q_TENSOR) = x * scale rounded to q's element
 * format (saturating; stochastically with seed and stream when rnd is MT_Q_SR, element
 * i = r * cols + c drawing mt_q_random_byte(seed, stream, i)); q->scale[0] = 1 / scale.
 * scale is the encode scale: mt_q_tensor_scale(mt_q_amax(x), fmax, margin) for
 * current scaling, mt_amax_history_scale for delayed. */
int mt_quant_tensorwise(struct mt_qtensor *q, const float *x, int64_t ld, float scale,
                        enum mt_q_round rnd, uint64_t seed, uint32_t stream,
                        struct mt_err *err);

/* Delayed scaling's amax history (Transformer Engine's DelayedScaling): the amaxes of
 * the last len steps, and the encode scale they give for the next step:
 * fmax / amax / 2^margin, amax the largest of the window (MT_AMAX_MAX) or the latest
 * (MT_AMAX_MOST_RECENT). The scale starts at 1 and is kept when the amax it would come
 * from is zero or not finite. */
enum mt_amax_algo { MT_AMAX_MAX, MT_AMAX_MOST_RECENT };
struct mt_amax_history {
    int len, count, latest; /* latest: index of the newest entry of amax */
    enum mt_amax_algo algo;
    float fmax;
    int margin;
    float *amax;
    float scale;
};
int mt_amax_history_init(struct mt_amax_history *h, int len, enum mt_amax_algo algo,
                         float fmax, int margin, struct mt_err *err);
void mt_amax_history_free(struct mt_amax_history *h);
/* Records the amax of the step just run and recomputes the scale. */
void mt_amax_history_update(struct mt_amax_history *h, float amax);
/* The encode scale for the next step. */
float mt_amax_history_scale(const struct mt_amax_history *h);

/* Blockwise (DeepSeek-V3): q (MT_Q_BLOCK_1X128 or MT_Q_BLOCK_128X128) = x times each
 * block's encode scale mt_q_block_scale(block amax, fmax, pow2), rounded to nearest,
 * saturating; q->scale holds the inverses. */
int mt_quant_blockwise(struct mt_qtensor *q, const float *x, int64_t ld, int pow2,
                       struct mt_err *err);

/* MXFP8: q (MT_Q_MX, E4M3) with blocks of 32 along q->along, UE8M0 scales
 * mt_q_mx_scale(block amax), elements x * 2^-scale rounded to nearest, saturating. */
int mt_quant_mxfp8(struct mt_qtensor *q, const float *x, int64_t ld, struct mt_err *err);

/* NVFP4: q (MT_Q_NVFP4 or MT_Q_NVFP4_2D) with the per-tensor encode scale
 * genc = mt_q_nvfp4_global_scale(amax of x), block scales
 * mt_q_nvfp4_block_scale(block amax, genc), elements x * mt_q_nvfp4_element_scale
 * rounded to E2M1 (nearest, or stochastically as mt_quant_tensorwise describes);
 * q->global = 1 / genc. */
int mt_quant_nvfp4(struct mt_qtensor *q, const float *x, int64_t ld, enum mt_q_round rnd,
                   uint64_t seed, uint32_t stream, struct mt_err *err);

/* The value of every element: code value * block scale (* global for NVFP4), in fp32,
 * into a (rows, cols) view with row stride ld. */
int mt_dequant(const struct mt_qtensor *q, float *out, int64_t ld, struct mt_err *err);

/* The random Hadamard transform of NVFP4's weight-gradient GEMM: every 16 consecutive
 * elements v along dim (a row's or a column's) become v Q, Q = (1/4) diag(s) H, H the
 * 16 x 16 Sylvester Hadamard matrix (H[i][j] = (-1)^popcount(i & j)) and s the signs
 * mt_q_hadamard_signs(seed, stream), bit i the sign of input i: the signs flip the
 * inputs before the Hadamard mixing. (On the outputs, H diag(s), they would cancel in
 * the product of two transformed operands, every quantiser here being symmetric in
 * sign, leaving the fixed Hadamard transform.) Q is orthogonal, so applying it to both
 * operands along the reduction dimension leaves their product unchanged (to rounding).
 * In place on a (rows, cols) fp32 view; the dimension's extent must be a multiple of 16. */
int mt_q_rht(float *x, int64_t rows, int64_t cols, int64_t ld, enum mt_q_dim dim,
             uint64_t seed, uint32_t stream, struct mt_err *err);
/* Q itself, row-major 16 x 16. */
void mt_q_rht_matrix(float q[256], uint64_t seed, uint32_t stream);

/* The reference GEMM on quantised operands: c (m, n) = op(a) op(b), op(a) (m, k) and
 * op(b) (k, n), op a transpose when trans_a / trans_b is set (a stored (k, m), b stored
 * (n, k)); fp32 accumulation in k order. Both operands of one family: MT_Q_TENSOR with
 * MT_Q_TENSOR, blockwise with blockwise, MT_Q_MX with MT_Q_MX, NVFP4 with NVFP4; the
 * 1-D blocks of each operand must lie along k. Products are of code values times their
 * block scales (exact for MX and NVFP4); tensor scales multiply the finished sum
 * (c = acc * scale_a * scale_b; NVFP4 likewise with the globals). Blockwise with
 * split_accum set: each run of 128 k (a scale block) is summed alone, exactly (the
 * products of E4M3 codes have 8 significant bits and lie within 36 binades: 128 of them
 * sum exactly in double), rounded to fp32 and added to the fp32 accumulator times
 * (scale_a * scale_b), as DeepSeek-V3 promotes partial sums on Hopper and cuBLASLt's
 * VEC128_32F / BLK128x128_32F modes define the product (doc/fp8.md, "Blockwise
 * accumulation"); without it, the products of dequantised values are summed in fp32. */
int mt_q_gemm(const struct mt_qtensor *a, int trans_a, const struct mt_qtensor *b,
              int trans_b, float *c, int64_t ldc, int split_accum, struct mt_err *err);

#endif

// CUDA backend: the FP8/FP4 recipes in the model (struct mt_quant_ops; doc/fp8.md "In
// the model" and "On the GPU"): qdq, the device quantisers of cuda_quant.cu applied to
// a GEMM operand and the values they keep written back in fp32 (kernels/cpu/cpu_qdq.c's
// steps, bit for bit), and the quantised GEMM, the same quantisers' codes and scales
// multiplied by one cuBLASLt FP8/FP4 matmul (below, "The quantised GEMM").
//
// The steps, all queued on the compute stream (nothing waits for the device):
//   load      x (fp32 or bf16) into out as fp32, transposed when the scaling's tiles run
//             down the columns and its quantiser runs along rows (1 x 128 tiles and
//             NVFP4's 1 x 16 blocks: the CPU quantises the transpose too)
//   Hadamard  NVFP4's wgrad operands: whole groups of 16 rows, along the columns
//   amax      where the spec records it (delayed scaling) or the scale comes from it
//             (tensorwise): the operand's amax, max-ed into *s->amax on the device
//   quantise  cuda_quant.cu's quantiser of the scaling, from out into scratch
//   dequant   code x block scale x per-tensor scale, each product rounded as the CPU's
//             mt_dequant rounds it, into out (transposed back where it was loaded so)
// Shards (tensor and expert-tensor parallelism; doc/fp8.md "Parallel layouts"): x may be
// rows row0.. or columns col0.. of a logical (lrows, lcols) tensor that other ranks hold
// the rest of. A shard quantises as the logical tensor's part: the per-tensor scale of
// current scaling comes from s->tensor_amax (the shards' amaxes, max-reduced by the
// model) instead of x's amax, NVFP4's fp32 scale from the larger of the two (what the
// CPU's qdq finds with that amax planted beside the shard); the blocks of the block
// scalings are the logical tensor's when the shard starts and ends on block
// boundaries, which qdq_check_shard demands (config.c refuses widths that would not);
// NVFP4's stochastic rounding draws each element's random byte by its index in the
// logical tensor (its transpose where the CPU quantises the transpose): the NVFP4
// quantiser takes the shard's place (struct mt_cuda_q_place) and reads the shard alone,
// where the CPU quantises a zero tensor of the logical shape. NVFP4's Hadamard
// transform (the wgrad operands, blocks down the columns) runs over the shard's own
// groups of 16 rows, as on the CPU: the logical tensor's, since a row shard of blocks
// down the columns starts and ends on 16 rows (the same check; the model splits those
// operands along their columns only). No FP8 recipe rounds stochastically: an FP8
// shard rounded so is refused (its quantisers take no place).
//
// The codes, scales and scalars live in one block of scratch, at most
// mt_quant_scratch_bytes(rows * cols) (kernels/kernels.h): the spec's work buffer (the
// model's, counted as workspace), else a block of the caching allocator for the call. Launches are charged to MT_OP_CONVERT: qdq is a
// precision conversion and has no slot of its own in the op enum.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_quant.h"
#include "kernels/cuda/cuda_qrow.cuh"

#include <stdio.h>

#include <vector>

#define QDQ_THREADS 256

// out (rows_pad, C) = x (R, C) as fp32, zero rows from R to rows_pad: element i of out
// (a thread an element, x read and out written along their rows).
template <typename T>
__device__ __forceinline__ void qdq_load_elem(int64_t i, float *out, const T *x, int64_t R, int64_t C,
                                              int64_t rows_pad)
{
    if (i >= rows_pad * C) return;
    out[i] = i / C >= R ? 0.0f : mt_ld(x, (size_t)i);
}

template <typename T>
__global__ static void qdq_load_kernel(float *out, const T *x, int64_t R, int64_t C, int64_t rows_pad)
{
    qdq_load_elem((int64_t)blockIdx.x * blockDim.x + threadIdx.x, out, x, R, C, rows_pad);
}

// out (rows_pad, R) = the transpose of x (R, C) as fp32, zero rows from C to rows_pad
// (>= C): a block of QDQ_TILE x 8 threads moves QDQ_TILE x QDQ_TILE tiles through shared
// memory tile, so that x is read and out written along their rows (a thread an element
// of out would read x down its columns, a warp 32 rows apart, on every wgrad and dgrad
// operand). x's rows (the tokens: any count) on the grid's x, out's rows on its y.
#define QDQ_TILE 32
template <typename T>
__device__ __forceinline__ void qdq_load_t_tiles(float (*tile)[QDQ_TILE + 1], float *out, const T *x, int64_t R,
                                                 int64_t C, int64_t rows_pad)
{
    const int64_t r0 = (int64_t)blockIdx.x * QDQ_TILE;
    for (int64_t c0 = (int64_t)blockIdx.y * QDQ_TILE; c0 < rows_pad; c0 += (int64_t)gridDim.y * QDQ_TILE) {
        for (int k = threadIdx.y; k < QDQ_TILE; k += blockDim.y) {
            const int64_t r = r0 + k, c = c0 + threadIdx.x;
            tile[k][threadIdx.x] = r < R && c < C ? mt_ld(x, (size_t)(r * C + c)) : 0.0f;
        }
        __syncthreads();
        for (int k = threadIdx.y; k < QDQ_TILE; k += blockDim.y) {
            const int64_t o = c0 + k, col = r0 + threadIdx.x;
            if (o < rows_pad && col < R) out[o * R + col] = tile[threadIdx.x][k];
        }
        __syncthreads();
    }
}

template <typename T>
__global__ static void qdq_load_t_kernel(float *out, const T *x, int64_t R, int64_t C, int64_t rows_pad)
{
    MT_SHARED(float, tile, [QDQ_TILE][QDQ_TILE + 1]);
    qdq_load_t_tiles(tile, out, x, R, C, rows_pad);
}

// The grid of qdq_load_t_kernel for x's R rows and out's rows_pad rows.
static dim3 qdq_load_t_grid(int64_t R, int64_t rows_pad)
{
    const unsigned ty = mt_cdiv((size_t)rows_pad, QDQ_TILE);
    return dim3(mt_cdiv((size_t)R, QDQ_TILE), ty < 65535 ? ty : 65535);
}

// out (rows_pad, qc) = x (R, C) as fp32, as it is or, tr, transposed (qc = R), zero
// rows after x's.
static void qdq_load(mt_cuda_ctx *c, float *out, struct mt_tensor x, bool tr, int64_t rows_pad)
{
    mt_with_elem(x.dtype, [&](auto tag) {
        const MT_ELEM(tag) *xp = (const MT_ELEM(tag) *)x.data;
        if (!tr) {
            MT_LAUNCH(mt_cdiv((size_t)(rows_pad * x.cols), QDQ_THREADS), QDQ_THREADS, 0, c->stream,
                      qdq_load_kernel<MT_ELEM(tag)>)(out, xp, x.rows, x.cols, rows_pad);
            return;
        }
        MT_LAUNCH(qdq_load_t_grid(x.rows, rows_pad), dim3(QDQ_TILE, 8), 0, c->stream,
                  qdq_load_t_kernel<MT_ELEM(tag)>)(out, xp, x.rows, x.cols, rows_pad);
    });
    MT_CUDA_LAUNCHED();
}

// Delayed scaling's record: *dst = max(*dst, *amax), a NaN amax recorded (cpu_qdq.c).
__global__ static void qdq_record_amax_kernel(float *dst, const float *amax)
{
    const float a = *amax;
    if (!(a <= *dst)) *dst = a;
}

// Each NaN of amax (n) made +Inf (struct mt_quant_ops amax_nan_to_inf).
__global__ static void qdq_nan_to_inf_kernel(float *amax, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && amax[i] != amax[i]) amax[i] = mt_q_float(0x7f800000u);
}

extern "C" void mt_cuda_amax_nan_to_inf(void *ctx, float *amax, size_t n)
{
    MT_CUDA_OP(ctx, MT_OP_CONVERT);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (n == 0) return;
    MT_LAUNCH(mt_cdiv(n, QDQ_THREADS), QDQ_THREADS, 0, c->stream, qdq_nan_to_inf_kernel)(amax, n);
    MT_CUDA_LAUNCHED();
}

// The value of element (r, c) of q, cpu_quant.c's mt_dequant: (code value x block
// scale) x per-tensor scale, two fp32 products rounded apart; written at
// out[r * ors + c * ocs] (ors = 1, ocs = q.rows to transpose back).
__global__ static void qdq_dequant_kernel(float *out, struct mt_cuda_qtensor q, int64_t ors, int64_t ocs)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= q.rows * q.cols) return;
    const int64_t r = i / q.cols, c = i % q.cols;
    float code, bs = 1.0f, g = 1.0f;
    if (q.elem == MT_Q_ELEM_E2M1) {
        const uint8_t b = q.data[r * ((q.cols + 1) / 2) + c / 2];
        code = mt_e2m1_to_float((uint8_t)(c & 1 ? b >> 4 : b & 0x0f));
    } else {
        const uint8_t b = q.data[i];
        code = q.elem == MT_Q_ELEM_E4M3 ? mt_e4m3_to_float(b) : mt_e5m2_to_float(b);
    }
    switch (q.scaling) {
    case MT_Q_TENSOR: g = q.scale[0]; break;
    case MT_Q_BLOCK_1X128: bs = q.scale[r * q.scols + c / 128]; break;
    case MT_Q_BLOCK_128X128: bs = q.scale[(r / 128) * q.scols + c / 128]; break;
    case MT_Q_MX:
        bs = mt_e8m0_to_float(q.along == MT_Q_ALONG_ROW ? q.scale8[r * q.scols + c / 32]
                                                        : q.scale8[(r / 32) * q.scols + c]);
        break;
    case MT_Q_NVFP4:
    case MT_Q_NVFP4_2D:
        bs = mt_e4m3_to_float(q.scale8[r * q.scols + c / 16]);
        g = *q.global;
        break;
    }
    out[r * ors + c * ocs] = __fmul_rn(__fmul_rn(code, bs), g);
}

[[noreturn]] static void qdq_fail(const char *op, const char *what, const struct mt_err *err)
{
    char call[64];
    snprintf(call, sizeof call, "%s: %s", op, what);
    mt_cuda_fatal(__FILE__, __LINE__, call, err->msg);
}

static size_t qdq_align16(size_t n) { return (n + 15) / 16 * 16; }

// The layout of x's quantisation under s when x is loaded as it is or, tr, transposed,
// with rows_pad rows: its blocks along the rows of what is loaded, except MXFP8 along
// the columns of an untransposed x (qdq of a dgrad weight).
static struct mt_cuda_qtensor qdq_layout(const char *op, const struct mt_quant_spec *s, int64_t rows_pad, int64_t qc,
                                         bool tr)
{
    struct mt_cuda_qtensor q;
    struct mt_err err = {};
    const enum mt_q_dim along = s->scaling == MT_Q_MX && !tr ? s->along : MT_Q_ALONG_ROW;
    if (mt_cuda_qtensor_layout(&q, s->scaling, s->elem, along, rows_pad, qc, &err)) qdq_fail(op, "quantised tensor", &err);
    return q;
}

// The elements of x (rows, columns) that one block of s's scaling covers.
static void qdq_block_extent(const struct mt_quant_spec *s, int64_t *br, int64_t *bc)
{
    const bool col = s->along == MT_Q_ALONG_COL;
    *br = *bc = 1;
    switch (s->scaling) {
    case MT_Q_TENSOR: break;
    case MT_Q_BLOCK_1X128: *(col ? br : bc) = 128; break;
    case MT_Q_BLOCK_128X128: *br = *bc = 128; break;
    case MT_Q_MX: *(col ? br : bc) = 32; break;
    case MT_Q_NVFP4: *(col ? br : bc) = 16; break;
    case MT_Q_NVFP4_2D: *br = *bc = 16; break;
    }
}

// A shard (s->lrows > 0, the top of this file, "Shards") that this backend quantises as
// its part of the logical tensor: along one dimension of it, on block boundaries (its
// start, and its end unless that is the tensor's), stochastically rounded under NVFP4
// only; anything else is fatal, naming what (as the CPU's qdq refuses an NVFP4 tensor
// amax without a shard). Returns whether x is a part of a larger logical tensor.
static bool qdq_check_shard(const char *op, const struct mt_quant_spec *s, int64_t R, int64_t C)
{
    char msg[300];
    const int64_t LR = s->lrows, LC = s->lcols;
    if (LR > 0 && (LR < s->row0 + R || LC < s->col0 + C || s->row0 < 0 || s->col0 < 0 || (LR > R && LC > C))) {
        snprintf(msg, sizeof msg, "the shard (%lld,%lld) at (%lld,%lld) does not lie along one dimension of the "
                 "logical (%lld,%lld) tensor", (long long)R, (long long)C, (long long)s->row0, (long long)s->col0,
                 (long long)LR, (long long)LC);
        mt_cuda_fatal(__FILE__, __LINE__, op, msg);
    }
    const bool shard = LR > 0 && (LR > R || LC > C);
    if (!shard && s->tensor_amax && mt_q_is_nvfp4(s->scaling))
        mt_cuda_fatal(__FILE__, __LINE__, op, "an NVFP4 tensor amax needs the shard's place in its tensor");
    if (LR <= 0) return false;
    if (s->rnd == MT_Q_SR && !mt_q_is_nvfp4(s->scaling)) {
        snprintf(msg, sizeof msg, "a shard of a %s tensor rounded stochastically: the CUDA backend draws a shard's "
                 "random bits by its place in the logical tensor under NVFP4 only", mt_q_scaling_name(s->scaling));
        mt_cuda_fatal(__FILE__, __LINE__, op, msg);
    }
    int64_t br, bc;
    qdq_block_extent(s, &br, &bc);
    if (s->row0 % br || s->col0 % bc || (s->row0 + R < LR && R % br) || (s->col0 + C < LC && C % bc)) {
        snprintf(msg, sizeof msg, "the shard (%lld,%lld) at (%lld,%lld) of the logical (%lld,%lld) tensor is not "
                 "whole %lld x %lld blocks of its %s scaling", (long long)R, (long long)C, (long long)s->row0,
                 (long long)s->col0, (long long)LR, (long long)LC, (long long)br, (long long)bc,
                 mt_q_scaling_name(s->scaling));
        mt_cuda_fatal(__FILE__, __LINE__, op, msg);
    }
    return shard;
}

// Steps 1 to 4 (the top of this file) for x (R, C) under s: x into w as fp32, as it is
// or, tr, transposed (qr = tr ? C : R rows of qc), then zero rows up to q->rows; the
// Hadamard transform; the amax (recorded, or the tensorwise scale's); the quantiser
// into q, whose buffers the caller placed. scalars: three device floats (the amax, the
// tensorwise scale and q->global). A shard's current scale comes from s->tensor_amax,
// an NVFP4 shard's quantiser takes its place (the top of this file, "Shards").
static void qdq_quantise(mt_cuda_ctx *c, const char *op, const struct mt_quant_spec *s, struct mt_tensor x, bool tr,
                         float *w, const struct mt_cuda_qtensor *q, float *scalars)
{
    const int64_t R = x.rows, C = x.cols, qr = tr ? C : R, qc = tr ? R : C;
    struct mt_err err = {};
    const bool shard = qdq_check_shard(op, s, R, C);
    // the shard's place in what is quantised: the logical tensor, or its transpose
    const struct mt_cuda_q_place place = tr ? mt_cuda_q_place{s->col0, s->row0, s->lrows, s->tensor_amax}
                                            : mt_cuda_q_place{s->row0, s->col0, s->lcols, s->tensor_amax};
    qdq_load(c, w, x, tr, q->rows);
    if (s->rht && R >= 16) {
        // along the columns of (R, C): along the rows of the transpose (C, R)
        const int rc = tr ? mt_cuda_q_rht(w, C, R / 16 * 16, R, MT_Q_ALONG_ROW, mt_quant_spec_seed(s), s->rht_stream, c->stream, &err)
                          : mt_cuda_q_rht(w, R / 16 * 16, C, C, MT_Q_ALONG_COL, mt_quant_spec_seed(s), s->rht_stream, c->stream, &err);
        if (rc) qdq_fail(op, "Hadamard transform", &err);
    }
    float *amax = scalars, *tscale = scalars + 1;
    const bool current = s->scaling == MT_Q_TENSOR && !s->scale;
    if (s->amax || (current && !s->tensor_amax)) {
        if (mt_cuda_q_amax(amax, w, qr, qc, qc, c->stream, &err)) qdq_fail(op, "amax", &err);
        if (s->amax) {
            MT_LAUNCH(1, 1, 0, c->stream, qdq_record_amax_kernel)(s->amax, amax);
            MT_CUDA_LAUNCHED();
        }
    }
    int rc = MT_OK;
    switch (s->scaling) {
    case MT_Q_TENSOR:
        if (current) {
            const float fmax = s->elem == MT_Q_ELEM_E4M3 ? MT_E4M3_MAX : MT_E5M2_MAX;
            if (mt_cuda_q_tensor_scale(tscale, s->tensor_amax ? s->tensor_amax : amax, fmax, s->margin, c->stream,
                                       &err))
                qdq_fail(op, "scale", &err);
        }
        rc = mt_cuda_quant_tensorwise(q, w, qc, current ? tscale : s->scale, s->rnd, mt_quant_spec_seed(s), s->stream, c->stream,
                                      &err);
        break;
    case MT_Q_BLOCK_1X128:
    case MT_Q_BLOCK_128X128: rc = mt_cuda_quant_blockwise(q, w, qc, 1, c->stream, &err); break;
    case MT_Q_MX: rc = mt_cuda_quant_mxfp8(q, w, qc, c->stream, &err); break;
    case MT_Q_NVFP4:
    case MT_Q_NVFP4_2D: rc = mt_cuda_quant_nvfp4(q, w, qc, s->rnd, mt_quant_spec_seed(s), s->stream, shard ? &place : nullptr, c->stream, &err);
        break;
    }
    if (rc) qdq_fail(op, "quantise", &err);
}

extern "C" void mt_cuda_qdq(void *ctx, const struct mt_quant_spec *s, struct mt_tensor out, struct mt_tensor x)
{
    MT_CUDA_OP(ctx, MT_OP_CONVERT);
    mt_cuda_ctx *c = mt_cuda(ctx);
    const int64_t R = x.rows, C = x.cols;
    mt_cuda_tensor_check("qdq", "x", x, true);
    if (out.dtype != MT_F32 || out.rows != R || out.cols != C || (R > 1 && out.ld != C)) {
        char msg[200];
        snprintf(msg, sizeof msg, "out (%lld,%lld) must be dense fp32 of x's shape (%lld,%lld)", (long long)out.rows,
                 (long long)out.cols, (long long)R, (long long)C);
        mt_cuda_fatal(__FILE__, __LINE__, "qdq", msg);
    }
    if (R <= 0 || C <= 0) return;
    const size_t n = (size_t)R * (size_t)C;
    if ((const char *)x.data < (const char *)out.data + 4 * n &&
        (const char *)out.data < (const char *)x.data + n * mt_dtype_size(x.dtype))
        mt_cuda_fatal(__FILE__, __LINE__, "qdq", "out overlaps x: qdq writes out while it reads x");
    float *w = (float *)out.data;
    // the tiles of 1 x 128 and NVFP4's 1 x 16 blocks down the columns: the transpose's rows
    const bool tr = s->along == MT_Q_ALONG_COL && (s->scaling == MT_Q_BLOCK_1X128 || s->scaling == MT_Q_NVFP4);
    const int64_t qr = tr ? C : R, qc = tr ? R : C;
    struct mt_cuda_qtensor q = qdq_layout("qdq", s, qr, qc, tr);
    // scratch: codes, scales, then three floats (amax, the tensorwise scale, NVFP4's global)
    const size_t at_scale = qdq_align16(q.data_bytes), at_scalars = at_scale + qdq_align16(q.scale_bytes);
    const size_t need = at_scalars + 16;
    const bool own = !(s->work && s->work_bytes >= need);
    char *ws = own ? (char *)mt_cuda_scratch(c, need) : (char *)s->work;
    q.data = (uint8_t *)ws;
    if (s->scaling == MT_Q_MX || mt_q_is_nvfp4(s->scaling)) q.scale8 = (uint8_t *)(ws + at_scale);
    else q.scale = (float *)(ws + at_scale);
    float *scalars = (float *)(ws + at_scalars);
    q.global = scalars + 2;
    qdq_quantise(c, "qdq", s, x, tr, w, &q, scalars);
    // element (r, c) of q is (c, r) of out when it was loaded transposed
    MT_LAUNCH(mt_cdiv(n, QDQ_THREADS), QDQ_THREADS, 0, c->stream, qdq_dequant_kernel)(w, q, tr ? 1 : qc,
                                                                                      tr ? qr : 1);
    MT_CUDA_LAUNCHED();
    if (own) mt_cuda_scratch_free(c, ws);
}

// ---------------------------------------------------------------- copies saved for backward
//
// save (struct mt_quant_ops save; doc/fp8.md "FP8 copies saved for backward"): x
// quantised under s by the steps above into one block the size of the CPU backend's
// packed copy (mt_qtensor_packed_bytes): 16 bytes of scalars (NVFP4's per-tensor decode
// scale, then the amax and tensorwise scale of the quantisation), the quantiser's scales
// from byte 16, the codes after them, 16-byte aligned. The copy is what the quantised
// GEMM's quantiser would write for the operand it stands for: with blocks down the
// columns (s->along == MT_Q_ALONG_COL, the wgrad GEMM's x) as the transpose (cols,
// rows) with its blocks along the rows, the tokens contiguous; otherwise (per-tensor
// scaling, the forward GEMM's x) as x is. qgemm_quantise then reads it in place of
// quantising the operand (qgemm_read_saved): as it is when the GEMM reads the operand
// so; transposed, a byte a code, when the GEMM reads a per-tensor copy the other way
// (the wgrad GEMM); with zero rows (and their scales) added when cuBLASLt wants rows
// padded. No value is quantised again, so every product is the unsaved path's.

static bool qsave_transposed(const struct mt_quant_spec *s) { return s->along == MT_Q_ALONG_COL; }

// The copy of x (R, C) under s: its quantised tensor, with its arrays in saved (NULL:
// the shape only), and *bytes, its size.
static struct mt_cuda_qtensor qsave_layout(const char *op, const struct mt_quant_spec *s, int64_t R, int64_t C,
                                           const void *saved, size_t *bytes)
{
    const bool tr = qsave_transposed(s);
    struct mt_cuda_qtensor q = qdq_layout(op, s, tr ? C : R, tr ? R : C, tr);
    const size_t at_data = 16 + qdq_align16(q.scale_bytes);
    *bytes = at_data + q.data_bytes;
    if (saved) {
        char *b = (char *)saved;
        q.global = (float *)b;
        if (s->scaling == MT_Q_MX || mt_q_is_nvfp4(s->scaling)) q.scale8 = (uint8_t *)(b + 16);
        else q.scale = (float *)(b + 16);
        q.data = (uint8_t *)(b + at_data);
    }
    return q;
}

extern "C" size_t mt_cuda_quant_saved_bytes(const struct mt_quant_spec *s, int64_t rows, int64_t cols)
{
    if (rows <= 0 || cols <= 0) return 16;
    size_t bytes;
    qsave_layout("saved bytes", s, rows, cols, nullptr, &bytes);
    return bytes;
}

extern "C" void mt_cuda_quant_save(void *ctx, const struct mt_quant_spec *s, void *saved, struct mt_tensor x)
{
    MT_CUDA_OP(ctx, MT_OP_CONVERT);
    mt_cuda_ctx *c = mt_cuda(ctx);
    mt_cuda_tensor_check("save", "x", x, true);
    const int64_t R = x.rows, C = x.cols;
    if (R <= 0 || C <= 0) return;
    if (!saved) mt_cuda_fatal(__FILE__, __LINE__, "save", "saved is NULL (saved_bytes of backend memory)");
    const bool tr = qsave_transposed(s);
    if (s->rnd == MT_Q_SR && tr && !mt_quant_spec_transposed(s))
        mt_cuda_fatal(__FILE__, __LINE__, "save", "stochastic rounding of a copy kept transposed (its element "
                      "indices would not be the CPU's)");
    size_t bytes;
    struct mt_cuda_qtensor q = qsave_layout("save", s, R, C, saved, &bytes);
    // the staging of x in fp32 (steps 1 to 3): the spec's work, else the allocator's
    const size_t staging = sizeof(float) * (size_t)(R * C);
    const bool own = !(s->work && s->work_bytes >= staging);
    float *w = own ? (float *)mt_cuda_scratch(c, staging) : (float *)s->work;
    qdq_quantise(c, "save", s, x, tr, w, &q, q.global + 1);
    if (own) mt_cuda_scratch_free(c, w);
}

// ---------------------------------------------------------------- fused with the producer
//
// A producer that quantises its output in its own pass (struct mt_quant_ops rmsnorm_fwd,
// swiglu_fwd; cuda_layers.cu, q_row_warp) writes a block scaling's codes and scales
// where save would have put them in a copy of the operand under s (qsave_layout: the
// blocks along the rows of an untransposed copy), which the quantised GEMM then reads
// (qgemm_read_saved); under per-tensor current scaling, the amax only, which the
// quantiser takes as the tensor's (spec tensor_amax) instead of finding it again.
mt_cuda_qrow mt_cuda_qrow_place(const char *op, const struct mt_quant_spec *s, void *fused, int64_t rows,
                                int64_t cols, cudaStream_t stream)
{
    if (!mt_quant_fusable(s)) {
        char msg[200];
        snprintf(msg, sizeof msg, "the %s quantisation (blocks along the %s) is not one a producer emits "
                 "(mt_quant_fusable)", mt_q_scaling_name(s->scaling), s->along == MT_Q_ALONG_ROW ? "rows" : "columns");
        mt_cuda_fatal(__FILE__, __LINE__, op, msg);
    }
    if (!fused) mt_cuda_fatal(__FILE__, __LINE__, op, "fused is NULL");
    mt_cuda_qrow q = {};
    q.scaling = s->scaling;
    if (s->scaling == MT_Q_TENSOR) {
        q.amax = (uint32_t *)fused;
        MT_CUDA_CHECK(cudaMemsetAsync(fused, 0, sizeof(float), stream));
        return q;
    }
    size_t bytes;
    const struct mt_cuda_qtensor t = qsave_layout(op, s, rows, cols, fused, &bytes);
    q.data = t.data, q.scale = t.scale, q.scale8 = t.scale8, q.scols = t.scols;
    return q;
}

// dst (rows, cols) = src (src_rows, cols), the rows after src_rows filled with fill (the
// copy's codes and scales with the zero rows cuBLASLt's padding adds). A thread an
// element of dst.
template <typename T>
__global__ static void qsave_pad_rows_kernel(T *dst, const T *src, int64_t src_rows, int64_t rows, int64_t cols,
                                             T fill)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    dst[i] = i / cols < src_rows ? src[i] : fill;
}

// dst (rows, k) = the transpose of src (k, cols) of one-byte codes, zero rows from cols
// to rows (a per-tensor copy read the other way). A thread a byte of dst.
__global__ static void qsave_transpose_kernel(uint8_t *dst, const uint8_t *src, int64_t k, int64_t cols, int64_t rows)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * k) return;
    const int64_t r = i / k, j = i % k;
    dst[i] = r < cols ? src[j * cols + r] : 0;
}

template <typename T>
static void qsave_pad_rows(mt_cuda_ctx *c, T *dst, const T *src, int64_t src_rows, int64_t rows, int64_t cols, T fill)
{
    MT_LAUNCH(mt_cdiv((size_t)(rows * cols), QDQ_THREADS), QDQ_THREADS, 0, c->stream, qsave_pad_rows_kernel<T>)(
        dst, src, src_rows, rows, cols, fill);
    MT_CUDA_LAUNCHED();
}

// q (the quantised GEMM's operand: its layout, its arrays placed in scratch) = the copy
// s->saved of x, read as the operand is loaded (tr): its arrays pointed at the copy's
// where they are the same, else the copy's codes transposed or its rows padded into q's
// scratch (the top of this section). x's data is not read.
static void qgemm_read_saved(mt_cuda_ctx *c, const struct mt_quant_spec *s, struct mt_tensor x, bool tr,
                             struct mt_cuda_qtensor *q)
{
    size_t bytes;
    const struct mt_cuda_qtensor sq = qsave_layout("quantised gemm", s, x.rows, x.cols, s->saved, &bytes);
    q->global = sq.global;
    if (qsave_transposed(s) != tr) {
        if (s->scaling != MT_Q_TENSOR) {
            char msg[200];
            snprintf(msg, sizeof msg, "the saved copy's %s blocks lie along the other dimension of x than this "
                     "GEMM's reduction", mt_q_scaling_name(s->scaling));
            mt_cuda_fatal(__FILE__, __LINE__, "quantised gemm", msg);
        }
        MT_LAUNCH(mt_cdiv((size_t)(q->rows * q->cols), QDQ_THREADS), QDQ_THREADS, 0, c->stream,
                  qsave_transpose_kernel)(q->data, sq.data, q->cols, sq.cols, q->rows);
        MT_CUDA_LAUNCHED();
        q->scale = sq.scale;
        return;
    }
    if (q->rows == sq.rows) {
        q->data = sq.data, q->scale = sq.scale, q->scale8 = sq.scale8;
        return;
    }
    // rows padded: zero codes, and the scales the quantiser gives a row of zeros
    const int64_t row_bytes = (int64_t)(sq.data_bytes / (size_t)sq.rows);
    qsave_pad_rows<uint8_t>(c, q->data, sq.data, sq.rows, q->rows, row_bytes, 0);
    switch (s->scaling) {
    case MT_Q_TENSOR: q->scale = sq.scale; break;
    case MT_Q_BLOCK_1X128:
        qsave_pad_rows<float>(c, q->scale, sq.scale, sq.srows, q->srows, q->scols,
                              1.0f / mt_q_block_scale(0.0f, MT_E4M3_MAX, 1));
        break;
    case MT_Q_BLOCK_128X128: // zero rows inside the last block change none of its scales
        qsave_pad_rows<float>(c, q->scale, sq.scale, sq.srows, q->srows, q->scols, 1.0f);
        break;
    case MT_Q_MX: qsave_pad_rows<uint8_t>(c, q->scale8, sq.scale8, sq.srows, q->srows, q->scols, mt_q_mx_scale(0.0f)); break;
    case MT_Q_NVFP4:
    case MT_Q_NVFP4_2D:
        qsave_pad_rows<uint8_t>(c, q->scale8, sq.scale8, sq.srows, q->srows, q->scols, mt_q_nvfp4_block_scale(0.0f, 1.0f));
        break;
    }
}

// ---------------------------------------------------------------- the quantised GEMM
//
// c (m,n) = beta c + op(q_a(a)) op(q_b(b)) (struct mt_quant_ops gemm) as cuBLASLt's
// FP8/FP4 matmul, in the one layout every device takes ("TN": both operands with the
// reduction k contiguous). Row-major c (m,n) is column-major D (n x m) = A^T B with
// A = b's quantisation as (n, k) rows and B = a's as (m, k): an operand stored with k
// along its columns (a untransposed, b transposed) is loaded as it is, the other
// transposed before it is quantised (as the CPU quantises the transpose of a 1 x 128 or
// NVFP4 operand along its columns; for the other scalings the codes are the same either
// way, nearest rounding not depending on the element's index). Each operand: steps 1
// to 4 above into its spec's work (staging, codes, scales), then its block scales in
// the order its scale mode reads (mt_cuda_q_cublaslt_scales). Scale modes: SCALAR_32F
// for tensorwise and delayed (the decode scales the quantiser stored), VEC128_32F and
// BLK128x128_32F for blockwise on 9.0, VEC32_UE8M0 for MXFP8 (10.x), VEC16_UE4M3 for
// NVFP4 (10.0), whose per-tensor decode scales stay on the device and multiply D in
// the epilogue below. Blockwise elsewhere (Blackwell: cuBLASLt has its modes on 9.0
// only) runs as VEC32_UE8M0: its scales are powers of two (the model quantises with
// pow2), so each 1 x 128 tile or 128 x 128 block is four 32-element blocks of one
// UE8M0 scale, the same codes and the same products.
//
// Shapes cuBLASLt refuses are padded, never sent to a dequantised GEMM: k to a multiple
// of 16 elements (FP8) or 32 (FP4), the codes copied into rows of that width with zeros
// after them (the quantisation itself sees the operand's own shape, so stochastic
// rounding's element indices and the blocks are the CPU's); n to a multiple of 4 fp32
// (8 bf16) elements for D's rows, and m and n to multiples of 4 for the blockwise
// modes, as zero rows of the operand. Then, and for NVFP4 or a c whose pointer or rows
// are not 16-byte aligned, D goes to fp32 scratch and the epilogue writes
// c = beta c + g D (g NVFP4's two per-tensor scales, else 1); otherwise cuBLASLt writes
// c itself with beta.

// Codes of rows rows of src_bytes bytes into rows of dst_bytes (>= src_bytes), zeros
// after them. A thread a byte of dst.
__global__ static void qgemm_pad_codes_kernel(uint8_t *dst, const uint8_t *src, int64_t rows, int64_t src_bytes,
                                              int64_t dst_bytes)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * dst_bytes) return;
    const int64_t r = i / dst_bytes, b = i % dst_bytes;
    dst[i] = b < src_bytes ? src[r * src_bytes + b] : 0;
}

// c (m,n) = beta c + g D, D (>= m rows, >= n columns) fp32 row stride ldd, or none (0);
// g = *ga * *gb (NVFP4's per-tensor decode scales) or 1. beta = 0 does not read c.
template <typename TC>
__global__ static void qgemm_epilogue_kernel(TC *c, int64_t ldc, const float *d, int64_t ldd, int64_t m, int64_t n,
                                             float beta, const float *ga, const float *gb)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m * n) return;
    const int64_t r = i / n, j = i % n;
    float v = d ? d[r * ldd + j] : 0.0f;
    if (ga) v = __fmul_rn(v, __fmul_rn(*ga, *gb));
    const size_t e = (size_t)(r * ldc + j);
    mt_st(c, e, beta == 0.0f ? v : __fadd_rn(__fmul_rn(beta, mt_ld(c, e)), v));
}

// The UE8M0 scales (rows, s32 = ceil(k / 32)) of blockwise decode scales that are powers
// of two: each 32-element block takes its 1 x 128 tile's (blk2d: its 128 x 128 block's)
// scale, whose exponent is the code. A thread a scale.
__global__ static void qgemm_blocks_ue8m0_kernel(uint8_t *s8, const float *scale, int64_t rows, int64_t s32,
                                                 int64_t s128, int blk2d)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * s32) return;
    const int64_t r = i / s32, j = i % s32;
    s8[i] = mt_e8m0_from_float(scale[(blk2d ? r / 128 : r) * s128 + j / 4], 1, 0);
}

// Whether the device has cuBLASLt's 1 x 128 and 128 x 128 scale modes (9.0 only).
static bool qgemm_hopper(const mt_cuda_ctx *c)
{
    int major = 0, minor = 0;
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->device));
    return major == 9 && minor == 0;
}

static size_t qgemm_align256(size_t n) { return (n + 255) / 256 * 256; }
static int64_t qgemm_round(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

static cudaDataType_t qgemm_type(enum mt_q_elem e)
{
    return e == MT_Q_ELEM_E4M3 ? CUDA_R_8F_E4M3 : e == MT_Q_ELEM_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_4F_E2M1;
}

// One operand quantised for the matmul: (rows, k) codes with k contiguous, the codes'
// row stride kpad, and what cuBLASLt reads of its scales.
struct qgemm_operand {
    struct mt_cuda_qtensor q;
    const uint8_t *codes; // (rows, kpad): q.data, or its padded copy
    const void *scales;   // the arranged block scales, or the scalar decode scale
    int32_t mode;         // cublasLtMatmulMatrixScale_t
    char *own;            // scratch of the allocator, freed after the matmul
    float *staging;       // the fp32 staging of x (the scratch's start)
};

// Quantises x (R, C) under s as `rows` rows of k (x transposed when tr), k padded to
// kpad in the codes; lt: for cuBLASLt (its scale mode and its order of the block scales,
// blockwise as UE8M0 off Hopper), else the codes (rows, k) and the quantiser's own
// scales as they are (the grouped GEMM below reads those; kpad must be k). s->saved:
// the copy save made of x, read instead of quantising x (qgemm_read_saved; no amax
// recorded, x's data not read). batch (with lt false and no saved copy): the operand
// laid out and its scratch placed, nothing queued; the caller quantises it with the
// other groups' (qgg_quantise).
static qgemm_operand qgemm_quantise(mt_cuda_ctx *c, const char *arg, const struct mt_quant_spec *s,
                                    struct mt_tensor x, bool tr, int64_t rows, int64_t kpad, bool lt,
                                    bool batch = false)
{
    const int64_t k = tr ? x.rows : x.cols;
    const bool one_d = s->scaling == MT_Q_BLOCK_1X128 || s->scaling == MT_Q_MX || s->scaling == MT_Q_NVFP4;
    char msg[240];
    if (one_d && s->along != (tr ? MT_Q_ALONG_COL : MT_Q_ALONG_ROW)) {
        snprintf(msg, sizeof msg, "%s: the %s blocks lie along its %s, not along the GEMM's reduction", arg,
                 mt_q_scaling_name(s->scaling), s->along == MT_Q_ALONG_ROW ? "rows" : "columns");
        mt_cuda_fatal(__FILE__, __LINE__, "quantised gemm", msg);
    }
    // the CPU draws a stochastically rounded element's bits by its index in what it
    // quantises: the transpose only for 1 x 128 tiles and NVFP4 blocks down the columns
    if (s->rnd == MT_Q_SR && tr && !(s->scaling == MT_Q_BLOCK_1X128 || s->scaling == MT_Q_NVFP4)) {
        snprintf(msg, sizeof msg, "%s: stochastic rounding of a %s operand read transposed (its element indices "
                 "would not be the CPU's)", arg, mt_q_scaling_name(s->scaling));
        mt_cuda_fatal(__FILE__, __LINE__, "quantised gemm", msg);
    }
    qgemm_operand o = {};
    o.q = qdq_layout("quantised gemm", s, rows, k, tr);
    struct mt_err err = {};
    const bool tensor = s->scaling == MT_Q_TENSOR;
    const bool blk2d = s->scaling == MT_Q_BLOCK_128X128;
    const bool as_mx = lt && (blk2d || s->scaling == MT_Q_BLOCK_1X128) && !qgemm_hopper(c);
    // blockwise as MXFP8: the view of its codes with UE8M0 scales
    struct mt_cuda_qtensor mx = o.q;
    mx.scaling = MT_Q_MX;
    mx.along = MT_Q_ALONG_ROW;
    mx.srows = rows;
    mx.scols = (k + 31) / 32;
    mx.scale = nullptr;
    const size_t s8_bytes = as_mx ? (size_t)(mx.srows * mx.scols) : 0;
    size_t lt_bytes = 0;
    if (lt && !tensor && mt_cuda_q_cublaslt_scale_mode(as_mx ? &mx : &o.q, &o.mode, &lt_bytes, &err))
        qdq_fail("quantised gemm", "scale mode", &err);
    const bool fp4 = o.q.elem == MT_Q_ELEM_E2M1;
    const size_t row_bytes = (size_t)(fp4 ? (k + 1) / 2 : k), pad_row_bytes = (size_t)(fp4 ? kpad / 2 : kpad);
    // scratch: the fp32 staging, then codes, scales, scalars and UE8M0 scales; once the
    // quantiser has read the staging, the arranged scales and the padded codes take its
    // place (the stream orders the kernels). A saved copy (s->saved) needs no staging;
    // the codes and scales are where the copy is read transposed or with rows added.
    const bool padded = kpad != k;
    const size_t at_lt = 0, at_pad = qgemm_align256(lt_bytes);
    const size_t after = at_pad + (padded ? pad_row_bytes * (size_t)rows : 0);
    const size_t staging = s->saved ? 0 : qgemm_align256(sizeof(float) * (size_t)(rows * k));
    const size_t at_codes = staging > after ? staging : qgemm_align256(after);
    const size_t at_scale = at_codes + qgemm_align256(o.q.data_bytes);
    const size_t at_scalars = at_scale + qgemm_align256(o.q.scale_bytes);
    const size_t at_s8 = at_scalars + 256;
    const size_t need = at_s8 + s8_bytes;
    char *ws = s->work && s->work_bytes >= need && (uintptr_t)s->work % 256 == 0 ? (char *)s->work : nullptr;
    if (!ws) ws = o.own = (char *)mt_cuda_scratch(c, need);
    o.q.data = (uint8_t *)(ws + at_codes);
    if (s->scaling == MT_Q_MX || mt_q_is_nvfp4(s->scaling)) o.q.scale8 = (uint8_t *)(ws + at_scale);
    else o.q.scale = (float *)(ws + at_scale);
    float *scalars = (float *)(ws + at_scalars);
    o.q.global = scalars + 2;
    o.staging = (float *)ws;
    if (s->saved) qgemm_read_saved(c, s, x, tr, &o.q);
    else if (!batch) qdq_quantise(c, "quantised gemm", s, x, tr, (float *)ws, &o.q, scalars);
    if (!lt) {
        o.scales = o.q.scale ? (const void *)o.q.scale : (const void *)o.q.scale8;
    } else if (tensor) {
        o.mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
        o.scales = o.q.scale; // the decode scale the quantiser stored
    } else {
        if (as_mx) {
            mx.data = o.q.data;
            mx.scale8 = (uint8_t *)(ws + at_s8);
            MT_LAUNCH(mt_cdiv(s8_bytes, QDQ_THREADS), QDQ_THREADS, 0, c->stream, qgemm_blocks_ue8m0_kernel)(
                mx.scale8, o.q.scale, rows, mx.scols, o.q.scols, (int)blk2d);
            MT_CUDA_LAUNCHED();
        }
        if (mt_cuda_q_cublaslt_scales(ws + at_lt, as_mx ? &mx : &o.q, c->stream, &err))
            qdq_fail("quantised gemm", "scales", &err);
        o.scales = ws + at_lt;
    }
    o.codes = o.q.data;
    if (padded) {
        uint8_t *dst = (uint8_t *)(ws + at_pad);
        MT_LAUNCH(mt_cdiv(pad_row_bytes * (size_t)rows, QDQ_THREADS), QDQ_THREADS, 0, c->stream,
                  qgemm_pad_codes_kernel)(dst, o.q.data, rows, (int64_t)row_bytes, (int64_t)pad_row_bytes);
        MT_CUDA_LAUNCHED();
        o.codes = dst;
    }
    return o;
}

// An operand of a product without rows (m or n = 0): quantised only for its amax, where
// its spec records one (delayed scaling) and it has elements, then dropped.
static void qgemm_record_amax(mt_cuda_ctx *c, const char *arg, const struct mt_quant_spec *s, struct mt_tensor x,
                              bool tr, int64_t rows, int64_t k)
{
    if (!s->amax || s->saved || rows <= 0 || k <= 0) return;
    const qgemm_operand o = qgemm_quantise(c, arg, s, x, tr, rows, k, false);
    if (o.own) mt_cuda_scratch_free(c, o.own);
}

// The largest power of two up to 256 that divides p.
static uint32_t qgemm_alignment(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a) a >>= 1;
    return a;
}

// The cuBLASLt scale mode's name (the end-of-run summary).
static const char *qgemm_mode_name(int32_t mode)
{
    switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: return "SCALAR_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3: return "VEC16_UE4M3";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0: return "VEC32_UE8M0";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return "VEC128_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return "BLK128x128_32F";
    }
    return "?";
}

// The cached plan of a quantised GEMM: key (M, N, K, ldd, A's, B's and D's types, A's
// and B's scale modes, A's | B's << 16 and D's pointer alignments), descriptor and
// layouts "TN" (A (K x M) and B (K x N) column-major with ld K, D (M x N) with ld ldd,
// C = D), the heuristic's algorithm for them (asked with this call's scale pointers,
// sa and sb, which each call sets again). A shape cuBLASLt has no algorithm for is
// fatal, naming it: the recipe does not run on this GPU.
static mt_gemm_plan &qgemm_plan(mt_cuda_ctx *c, const std::array<int64_t, 11> &k, const void *sa, const void *sb)
{
    auto it = c->lowp.plans.find(k);
    if (it != c->lowp.plans.end()) return it->second;
    const int64_t M = k[0], N = k[1], K = k[2], ldd = k[3];
    const int32_t mode_a = (int32_t)k[7], mode_b = (int32_t)k[8];
    mt_gemm_plan p = {};
    MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof mode_a));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof mode_b));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, (cudaDataType_t)k[4], (uint64_t)K, (uint64_t)M, K));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, (cudaDataType_t)k[5], (uint64_t)K, (uint64_t)N, K));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, (cudaDataType_t)k[6], (uint64_t)M, (uint64_t)N, ldd));
    cublasLtMatmulPreference_t pref;
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &c->lt_ws_bytes, sizeof c->lt_ws_bytes));
    const uint32_t align[4] = {(uint32_t)(k[9] & 0xffff), (uint32_t)(k[9] >> 16), (uint32_t)k[10], (uint32_t)k[10]};
    const cublasLtMatmulPreferenceAttributes_t aligns[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align[i], sizeof align[i]));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, p.desc, p.a, p.b, p.c, p.c, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found < 1) {
        char msg[300];
        snprintf(msg, sizeof msg, "cuBLASLt has no FP8/FP4 matmul for M=%lld N=%lld K=%lld with scale modes %s x %s "
                 "(%s); the recipe does not run on this GPU", (long long)M, (long long)N, (long long)K,
                 qgemm_mode_name(mode_a), qgemm_mode_name(mode_b), cublasLtGetStatusString(st));
        mt_cuda_fatal(__FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", msg);
    }
    p.algo = res.algo;
    return c->lowp.plans.emplace(k, p).first->second;
}

extern "C" void mt_cuda_qgemm(void *ctx, bool trans_a, bool trans_b, const struct mt_quant_spec *sa,
                              struct mt_tensor a, const struct mt_quant_spec *sb, struct mt_tensor b, float beta,
                              struct mt_tensor cc)
{
    MT_CUDA_OP(ctx, MT_OP_GEMM);
    mt_cuda_ctx *c = mt_cuda(ctx);
    mt_cuda_tensor_check("quantised gemm", "a", a, true), mt_cuda_tensor_check("quantised gemm", "b", b, true);
    mt_cuda_tensor_check("quantised gemm", "c", cc, false);
    const int64_t m = cc.rows, n = cc.cols, k = trans_a ? a.rows : a.cols;
    if ((trans_a ? a.cols : a.rows) != m || (trans_b ? b.rows : b.cols) != n || (trans_b ? b.cols : b.rows) != k) {
        char msg[200];
        snprintf(msg, sizeof msg, "op(a) (%lld,%lld) op(b) (%lld,%lld) does not give c (%lld,%lld)",
                 (long long)(trans_a ? a.cols : a.rows), (long long)k, (long long)(trans_b ? b.cols : b.rows),
                 (long long)(trans_b ? b.rows : b.cols), (long long)m, (long long)n);
        mt_cuda_fatal(__FILE__, __LINE__, "quantised gemm", msg);
    }
    if (cc.dtype == MT_BF16 && beta != 0.0f)
        mt_cuda_fatal(__FILE__, __LINE__, "quantised gemm", "c is bf16 with beta != 0 (a bf16 c takes beta = 0)");
    if (m <= 0 || n <= 0) { // no product, but the other operand's amax is recorded as the CPU's qdq records it
        qgemm_record_amax(c, "b", sb, b, !trans_b, n, k);
        qgemm_record_amax(c, "a", sa, a, trans_a, m, k);
        return;
    }
    if (k <= 0) { // nothing to multiply: c = beta c
        mt_with_elem(cc.dtype, [&](auto tag) {
            using TC = MT_ELEM(tag);
            MT_LAUNCH(mt_cdiv((size_t)(m * n), QDQ_THREADS), QDQ_THREADS, 0, c->stream, qgemm_epilogue_kernel<TC>)(
                (TC *)cc.data, cc.ld, nullptr, 0, m, n, beta, nullptr, nullptr);
        });
        MT_CUDA_LAUNCHED();
        return;
    }
    const bool fp4 = sa->elem == MT_Q_ELEM_E2M1;
    const bool blocks128 = sa->scaling == MT_Q_BLOCK_1X128 || sa->scaling == MT_Q_BLOCK_128X128;
    const bool bf16 = cc.dtype == MT_BF16;
    const int64_t kpad = qgemm_round(k, fp4 ? 32 : 16);
    const int64_t mpad = blocks128 ? qgemm_round(m, 4) : m, npad = qgemm_round(n, bf16 ? 8 : 4);
    // A = b's quantisation (npad rows), B = a's (mpad rows), both with k contiguous
    qgemm_operand qb = qgemm_quantise(c, "b", sb, b, !trans_b, npad, kpad, true);
    qgemm_operand qa = qgemm_quantise(c, "a", sa, a, trans_a, mpad, kpad, true);
    const size_t esz = mt_dtype_size(cc.dtype);
    const bool nvfp4 = fp4;
    const bool direct = !nvfp4 && mpad == m && npad == n && ((size_t)cc.ld * esz) % 16 == 0 &&
                        qgemm_alignment(cc.data) >= 16;
    float *d = direct ? nullptr : (float *)mt_cuda_scratch(c, sizeof(float) * (size_t)(mpad * npad));
    const cudaDataType_t dt = direct && bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const int64_t ldd = direct ? cc.ld : npad;
    void *dp = direct ? cc.data : (void *)d;
    const float alpha = 1.0f, lt_beta = direct ? beta : 0.0f;

    const int64_t aligns = qgemm_alignment(qb.codes) | (int64_t)qgemm_alignment(qa.codes) << 16;
    mt_gemm_plan &p = qgemm_plan(c, {npad, mpad, kpad, ldd, qgemm_type(qb.q.elem), qgemm_type(qa.q.elem), dt, qb.mode,
                                     qa.mode, aligns, qgemm_alignment(dp)},
                                 qb.scales, qa.scales);
    p.calls++;
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &qb.scales,
                                                   sizeof qb.scales));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &qa.scales,
                                                   sizeof qa.scales));
    mt_cuda_note_library_launch(c);
    MT_CUBLAS_CHECK(cublasLtMatmul(c->lt, p.desc, &alpha, qb.codes, p.a, qa.codes, p.b, &lt_beta, dp, p.c, dp, p.c,
                                   &p.algo, c->lt_ws, c->lt_ws_bytes, c->stream));
    c->lowp.calls++;
    if (!direct) c->lowp.epilogues++;
    c->lowp.modes |= 1u << qb.mode | 1u << qa.mode;
    if (!direct) {
        mt_with_elem(cc.dtype, [&](auto tag) {
            using TC = MT_ELEM(tag);
            MT_LAUNCH(mt_cdiv((size_t)(m * n), QDQ_THREADS), QDQ_THREADS, 0, c->stream, qgemm_epilogue_kernel<TC>)(
                (TC *)cc.data, cc.ld, d, npad, m, n, beta, nvfp4 ? qa.q.global : nullptr,
                nvfp4 ? qb.q.global : nullptr);
        });
        MT_CUDA_LAUNCHED();
        mt_cuda_scratch_free(c, d);
    }
    if (qa.own) mt_cuda_scratch_free(c, qa.own);
    if (qb.own) mt_cuda_scratch_free(c, qb.own);
}

// ---------------------------------------------------------------- the grouped quantised GEMM
//
// n quantised GEMMs of one form at once (struct mt_quant_ops grouped_gemm; the routed
// experts' row ranges, doc/fp8.md "On the GPU"): each group's operands quantised as
// mt_cuda_qgemm quantises them (the same codes), all the groups' of a side in one
// launch a step (qgg_quantise), with their scales as the quantiser wrote them, then
// one launch of qgg_kernel over every group's output tiles, reading the codes and
// scales itself (cuBLASLt has no grouped FP8 matmul with block scales: CUDA 13's
// cublasLt.h batches only matrices of one shape). Its arithmetic is cuBLASLt's with fp32 accumulation: per block of the
// reduction (the scaling's 16, 32 or 128 elements; all of k for per-tensor scales) the
// products of the code values summed in fp32 in k order (each product is exact: FP8 and
// FP4 values have at most 4 significant bits), times the two block scales, added to the
// fp32 total; then times the per-tensor decode scales. The emulated cuBLASLt sums each
// block exactly (fp64), so the two agree to the fp32 rounding of the sums
// (tests/gpu/emu_quant.cc "grouped").

#define QGG_TILE 16
#define QGG_MAX 64 // groups a launch: the descriptors travel as the kernel's parameter

struct qgg_operand {
    const uint8_t *codes; // (rows, k), k contiguous; E2M1: two a byte, (k + 1) / 2 a row
    const float *scale;   // MT_Q_TENSOR (the decode scale), 1 x 128, 128 x 128
    const uint8_t *scale8; // MXFP8 (UE8M0), NVFP4 (UE4M3)
    const float *global;  // NVFP4's per-tensor decode scale
    int64_t scols;        // the scales' row stride
};
struct qgg_group {
    qgg_operand a, b; // a (m, k), b (n, k)
    void *c;          // (m, n), row stride ldc
    int64_t m, n, k, ldc, tile0;
};
struct qgg_args {
    int n;
    enum mt_q_scaling sa, sb;
    enum mt_q_elem ea, eb;
    float beta;
    qgg_group g[QGG_MAX];
};

// The code value of element (r, j) of an operand of e.
__device__ __forceinline__ float qgg_code(const qgg_operand &o, enum mt_q_elem e, int64_t k, int64_t r, int64_t j)
{
    if (e == MT_Q_ELEM_E2M1) {
        const uint8_t b = o.codes[r * ((k + 1) / 2) + j / 2];
        return mt_e2m1_to_float((uint8_t)(j & 1 ? b >> 4 : b & 0x0f));
    }
    const uint8_t b = o.codes[r * k + j];
    return e == MT_Q_ELEM_E4M3 ? mt_e4m3_to_float(b) : mt_e5m2_to_float(b);
}

// The block scale of row r at reduction index j (1 for per-tensor scales).
__device__ __forceinline__ float qgg_block_scale(const qgg_operand &o, enum mt_q_scaling s, int64_t r, int64_t j)
{
    switch (s) {
    case MT_Q_TENSOR: return 1.0f;
    case MT_Q_BLOCK_1X128: return o.scale[r * o.scols + j / 128];
    case MT_Q_BLOCK_128X128: return o.scale[(r / 128) * o.scols + j / 128];
    case MT_Q_MX: return mt_e8m0_to_float(o.scale8[r * o.scols + j / 32]);
    case MT_Q_NVFP4:
    case MT_Q_NVFP4_2D: return mt_e4m3_to_float(o.scale8[r * o.scols + j / 16]);
    }
    return 1.0f;
}

// The per-tensor decode scale.
__device__ __forceinline__ float qgg_tensor_scale(const qgg_operand &o, enum mt_q_scaling s)
{
    return s == MT_Q_TENSOR ? *o.scale : s == MT_Q_NVFP4 || s == MT_Q_NVFP4_2D ? *o.global : 1.0f;
}

// Elements of k under one block scale: the scalings' blocks along the reduction (all of
// k for per-tensor scales, marked 0).
__device__ __forceinline__ int qgg_block(enum mt_q_scaling s)
{
    return s == MT_Q_TENSOR ? 0 : s == MT_Q_MX ? 32 : s == MT_Q_NVFP4 || s == MT_Q_NVFP4_2D ? 16 : 128;
}

// A block of QGG_TILE^2 threads a QGG_TILE x QGG_TILE tile of one group's c, the groups'
// tiles numbered from tile0 on; a thread one element: c = beta c + g total (the top of
// this section).
template <typename TC>
__global__ static void __launch_bounds__(QGG_TILE *QGG_TILE) qgg_kernel(const __grid_constant__ qgg_args args)
{
    MT_SHARED(float, sa, [QGG_TILE][QGG_TILE + 1]);
    MT_SHARED(float, sb, [QGG_TILE][QGG_TILE + 1]);
    const int64_t t = blockIdx.x;
    int gi = 0;
    while (gi + 1 < args.n && args.g[gi + 1].tile0 <= t) gi++;
    const qgg_group &G = args.g[gi];
    const int64_t tiles_n = (G.n + QGG_TILE - 1) / QGG_TILE;
    const int64_t r0 = (t - G.tile0) / tiles_n * QGG_TILE, c0 = (t - G.tile0) % tiles_n * QGG_TILE;
    const int ty = threadIdx.x / QGG_TILE, tx = threadIdx.x % QGG_TILE;
    const int64_t row = r0 + ty, col = c0 + tx;
    // the block scales' extent along k: the smaller of the two operands' (they nest)
    const int ba = qgg_block(args.sa), bb = qgg_block(args.sb);
    const int64_t blk = ba && bb ? (ba < bb ? ba : bb) : ba ? ba : bb ? bb : G.k;
    float part = 0.0f, total = 0.0f;
    for (int64_t k0 = 0; k0 < G.k; k0 += QGG_TILE) {
        const int64_t j = k0 + tx, ra = r0 + ty, rb = c0 + ty;
        sa[ty][tx] = ra < G.m && j < G.k ? qgg_code(G.a, args.ea, G.k, ra, j) : 0.0f;
        sb[ty][tx] = rb < G.n && j < G.k ? qgg_code(G.b, args.eb, G.k, rb, j) : 0.0f;
        __syncthreads();
        for (int kk = 0; kk < QGG_TILE; kk++) part = __fadd_rn(part, __fmul_rn(sa[ty][kk], sb[tx][kk]));
        __syncthreads();
        const int64_t next = k0 + QGG_TILE;
        if (next >= G.k || next % blk == 0) {
            if (row < G.m && col < G.n) {
                const int64_t kb = next - 1 < G.k ? next - 1 : G.k - 1;
                const float s = __fmul_rn(qgg_block_scale(G.a, args.sa, row, kb), qgg_block_scale(G.b, args.sb, col, kb));
                total = __fadd_rn(total, __fmul_rn(part, s));
            }
            part = 0.0f;
        }
    }
    if (row >= G.m || col >= G.n) return;
    const float v = __fmul_rn(total, __fmul_rn(qgg_tensor_scale(G.a, args.sa), qgg_tensor_scale(G.b, args.sb)));
    TC *cp = (TC *)G.c;
    const size_t e = (size_t)(row * G.ldc + col);
    mt_st(cp, e, args.beta == 0.0f ? v : __fadd_rn(__fmul_rn(args.beta, mt_ld(cp, e)), v));
}

// The groups' operands of one side quantised together, one launch a step whatever the
// number of groups (the routed experts' GEMMs are launch-bound; doc/fp8.md "The grouped
// expert GEMM"): every group's x loaded into its staging (qgg_load_kernel), NVFP4's
// Hadamard transforms (mt_cuda_q_batch_rht), their amaxes where the recipe needs them
// (mt_cuda_q_batch_amax), then every group's codes and scales and delayed scaling's
// records (mt_cuda_q_batch_quantise: current scaling's scale and NVFP4's per-tensor
// scale computed there from the group's amax, a shard's joined with its tensor amax):
// exactly what qgemm_quantise writes for each (the same device code of cuda_quant.cu),
// into the same scratch. Per group, as qgemm_quantise does it, where the batch cannot
// serve: a saved copy read back (its codes are there already), groups of different
// source dtypes or MXFP8 block directions (one launch loads one dtype, quantises in one
// direction).
struct qgg_load {
    const void *x; // (R, C), as it is or transposed (rows of the load: C or R)
    float *w;      // the staging, (rows, the other extent)
    int64_t R, C, rows;
};
struct qgg_load_args {
    qgg_load g[QGG_MAX];
};

// qdq_load's kernels for every group, the group blockIdx.z: qdq_load_elem, or, transposed,
// qdq_load_t_tiles on the grid of the largest group (a smaller group's blocks past its
// tiles leave at once, the whole block, before any barrier).
template <typename T>
__global__ static void qgg_load_kernel(const __grid_constant__ qgg_load_args a)
{
    const qgg_load &g = a.g[blockIdx.z];
    qdq_load_elem((int64_t)blockIdx.x * blockDim.x + threadIdx.x, g.w, (const T *)g.x, g.R, g.C, g.rows);
}
template <typename T>
__global__ static void qgg_load_t_kernel(const __grid_constant__ qgg_load_args a)
{
    MT_SHARED(float, tile, [QDQ_TILE][QDQ_TILE + 1]);
    const qgg_load &g = a.g[blockIdx.z];
    if ((int64_t)blockIdx.x * QDQ_TILE >= g.R || (int64_t)blockIdx.y * QDQ_TILE >= g.rows) return;
    qdq_load_t_tiles(tile, g.w, (const T *)g.x, g.R, g.C, g.rows);
}

static bool qgg_batches(const struct mt_quant_spec *s, const struct mt_tensor *x, int n)
{
    for (int i = 0; i < n; i++)
        if (s[i].saved || x[i].dtype != x[0].dtype || (s[0].scaling == MT_Q_MX && s[i].along != s[0].along))
            return false;
    return true;
}

// The n groups' operands x[i] under s[i] (x transposed when tr) as rows[i] rows of k[i]
// into held (the grouped kernel's operands: lt false), in one batch where it serves,
// else each as qgemm_quantise does it.
static void qgg_quantise(mt_cuda_ctx *c, const char *arg, const struct mt_quant_spec *s, const struct mt_tensor *x,
                         int n, bool tr, const int64_t *rows, const int64_t *k, std::vector<qgemm_operand> &held)
{
    if (!qgg_batches(s, x, n)) {
        for (int i = 0; i < n; i++) held.push_back(qgemm_quantise(c, arg, &s[i], x[i], tr, rows[i], k[i], false));
        return;
    }
    struct mt_err err = {};
    static thread_local mt_cuda_q_batch b; // 13 KB: off the stack
    static thread_local qgg_load_args la;
    b = mt_cuda_q_batch{};
    la = qgg_load_args{};
    b.n = n;
    b.scaling = s[0].scaling, b.elem = s[0].elem;
    int64_t most = 0, most_r = 0, most_rows = 0; // the largest group's elements, x rows, staging rows
    for (int i = 0; i < n; i++) {
        const bool shard = qdq_check_shard("quantised gemm", &s[i], x[i].rows, x[i].cols);
        const qgemm_operand &o = held.emplace_back(qgemm_quantise(c, arg, &s[i], x[i], tr, rows[i], k[i], false, true));
        if (i == 0) b.along = o.q.along;
        la.g[i] = qgg_load{x[i].data, o.staging, x[i].rows, x[i].cols, o.q.rows};
        most = o.q.rows * o.q.cols > most ? o.q.rows * o.q.cols : most;
        most_r = x[i].rows > most_r ? x[i].rows : most_r;
        most_rows = o.q.rows > most_rows ? o.q.rows : most_rows;
        mt_cuda_q_item &t = b.t[i];
        t.x = o.staging, t.ld = o.q.cols, t.q = o.q;
        t.record = s[i].amax;
        t.scale = s[i].scaling == MT_Q_TENSOR ? s[i].scale : nullptr;
        t.tensor_amax = s[i].tensor_amax;
        t.margin = s[i].margin, t.rnd = s[i].rnd, t.seed = mt_quant_spec_seed(&s[i]), t.stream_id = s[i].stream;
        // NVFP4: its place in what is quantised (qdq_quantise's), its Hadamard transform
        // along x's columns (the rows of its transpose)
        t.place = !shard ? mt_cuda_q_place{0, 0, o.q.cols, nullptr}
                  : tr   ? mt_cuda_q_place{s[i].col0, s[i].row0, s[i].lrows, nullptr}
                         : mt_cuda_q_place{s[i].row0, s[i].col0, s[i].lcols, nullptr};
        if (s[i].rht && x[i].rows >= 16) {
            t.rht = 1 + (tr ? MT_Q_ALONG_ROW : MT_Q_ALONG_COL);
            t.rht_stream = s[i].rht_stream;
        }
    }
    mt_with_elem(x[0].dtype, [&](auto tag) {
        if (!tr) {
            MT_LAUNCH(dim3(mt_cdiv((size_t)most, QDQ_THREADS), 1, (unsigned)n), QDQ_THREADS, 0, c->stream,
                      qgg_load_kernel<MT_ELEM(tag)>)(la);
            return;
        }
        const dim3 grid = qdq_load_t_grid(most_r, most_rows);
        MT_LAUNCH(dim3(grid.x, grid.y, (unsigned)n), dim3(QDQ_TILE, 8), 0, c->stream,
                  qgg_load_t_kernel<MT_ELEM(tag)>)(la);
    });
    MT_CUDA_LAUNCHED();
    b.amax = (float *)mt_cuda_scratch(c, sizeof(float) * (size_t)n);
    if (mt_cuda_q_batch_rht(&b, c->stream, &err)) qdq_fail("grouped quantised gemm", "Hadamard transform", &err);
    if (mt_cuda_q_batch_needs_amax(&b) && mt_cuda_q_batch_amax(&b, c->stream, &err))
        qdq_fail("grouped quantised gemm", "amax", &err);
    if (mt_cuda_q_batch_quantise(&b, 1, c->stream, &err)) qdq_fail("grouped quantised gemm", "quantise", &err);
    mt_cuda_scratch_free(c, b.amax);
}

// What the grouped kernel reads of an operand qgemm_quantise made (lt false).
static qgg_operand qgg_of(const qgemm_operand &o)
{
    qgg_operand g = {};
    g.codes = o.codes;
    g.scale = o.q.scale;
    g.scale8 = o.q.scale8;
    g.global = o.q.global;
    g.scols = o.q.scols;
    return g;
}

extern "C" void mt_cuda_qgemm_grouped(void *ctx, int n, bool trans_a, bool trans_b, const struct mt_quant_spec *sa,
                                      const struct mt_tensor *a, const struct mt_quant_spec *sb,
                                      const struct mt_tensor *b, float beta, const struct mt_tensor *cc)
{
    MT_CUDA_OP(ctx, MT_OP_GEMM);
    mt_cuda_ctx *c = mt_cuda(ctx);
    char msg[300];
    for (int g0 = 0; g0 < n; g0 += QGG_MAX) {
        const int ng = n - g0 < QGG_MAX ? n - g0 : QGG_MAX;
        qgg_args args = {};
        std::vector<qgemm_operand> held_b, held_a;
        int64_t tiles = 0, rows_a[QGG_MAX], rows_b[QGG_MAX], ks[QGG_MAX];
        enum mt_dtype ct = cc[g0].dtype;
        for (int i = g0; i < g0 + ng; i++) {
            mt_cuda_tensor_check("grouped quantised gemm", "a", a[i], true);
            mt_cuda_tensor_check("grouped quantised gemm", "b", b[i], true);
            mt_cuda_tensor_check("grouped quantised gemm", "c", cc[i], false);
            const int64_t m = cc[i].rows, nn = cc[i].cols, k = trans_a ? a[i].rows : a[i].cols;
            if ((trans_a ? a[i].cols : a[i].rows) != m || (trans_b ? b[i].rows : b[i].cols) != nn ||
                (trans_b ? b[i].cols : b[i].rows) != k) {
                snprintf(msg, sizeof msg, "group %d: op(a) (%lld,%lld) op(b) (%lld,%lld) does not give c (%lld,%lld)",
                         i, (long long)(trans_a ? a[i].cols : a[i].rows), (long long)k,
                         (long long)(trans_b ? b[i].cols : b[i].rows), (long long)(trans_b ? b[i].rows : b[i].cols),
                         (long long)m, (long long)nn);
                mt_cuda_fatal(__FILE__, __LINE__, "grouped quantised gemm", msg);
            }
            if (sa[i].scaling != sa[g0].scaling || sb[i].scaling != sb[g0].scaling || sa[i].elem != sa[g0].elem ||
                sb[i].elem != sb[g0].elem || cc[i].dtype != ct) {
                snprintf(msg, sizeof msg, "group %d: its operands' scalings or formats or c's dtype are not group "
                         "%d's (one launch multiplies operands of one kind)", i, g0);
                mt_cuda_fatal(__FILE__, __LINE__, "grouped quantised gemm", msg);
            }
            if (ct == MT_BF16 && beta != 0.0f)
                mt_cuda_fatal(__FILE__, __LINE__, "grouped quantised gemm", "c is bf16 with beta != 0");
            if (m <= 0 || nn <= 0 || k <= 0) {
                snprintf(msg, sizeof msg, "group %d: an empty product (%lld,%lld) x %lld (the caller leaves it out)",
                         i, (long long)m, (long long)nn, (long long)k);
                mt_cuda_fatal(__FILE__, __LINE__, "grouped quantised gemm", msg);
            }
            rows_a[i - g0] = m, rows_b[i - g0] = nn, ks[i - g0] = k;
            qgg_group &G = args.g[i - g0];
            G.c = cc[i].data;
            G.m = m, G.n = nn, G.k = k, G.ldc = cc[i].ld, G.tile0 = tiles;
            tiles += (m + QGG_TILE - 1) / QGG_TILE * ((nn + QGG_TILE - 1) / QGG_TILE);
        }
        // b's quantisations (n, k), then a's (m, k), as mt_cuda_qgemm orders them
        qgg_quantise(c, "b", sb + g0, b + g0, ng, !trans_b, rows_b, ks, held_b);
        qgg_quantise(c, "a", sa + g0, a + g0, ng, trans_a, rows_a, ks, held_a);
        for (int i = 0; i < ng; i++) args.g[i].b = qgg_of(held_b[(size_t)i]), args.g[i].a = qgg_of(held_a[(size_t)i]);
        args.n = ng;
        args.sa = sa[g0].scaling, args.sb = sb[g0].scaling;
        args.ea = sa[g0].elem, args.eb = sb[g0].elem;
        args.beta = beta;
        mt_with_elem(ct, [&](auto tag) {
            using TC = MT_ELEM(tag);
            MT_LAUNCH((size_t)tiles, QGG_TILE * QGG_TILE, 0, c->stream, qgg_kernel<TC>)(args);
        });
        MT_CUDA_LAUNCHED();
        c->lowp.grouped++;
        c->lowp.groups += ng;
        for (const std::vector<qgemm_operand> *h : {&held_b, &held_a})
            for (const qgemm_operand &o : *h)
                if (o.own) mt_cuda_scratch_free(c, o.own);
    }
}

extern "C" void mt_cuda_lowp_gemm_names(unsigned modes, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int32_t mode = 0; mode < 32 && len < n; mode++)
        if (modes >> mode & 1u)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "", qgemm_mode_name(mode));
}

// Delayed scaling's histories (op amax_history): one thread per entry, cpu_qdq.c's loop
// body, the division rounded as the CPU's. Every thread reads the position pos (and the
// step's gate) and takes the step's entry from it; amax_history_advance_kernel moves pos
// on after this kernel, so that no thread reads it while another writes it. In a
// captured iteration both are nodes of the graph: the position lives on the device and
// advances there, never a kernel parameter frozen at the capture.
__global__ static void amax_history_kernel(float *hist, float *hscale, float *scale, float *amax, int n, int len,
                                           const int32_t *pos, bool max_algo, float fmax, float gmax, int margin,
                                           float grad_unit, struct mt_step_gate gate, bool gated)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (amax && gated && !mt_q_step_taken(gate.sumsq, gate.loss, gate.loss_stride, gate.n_loss)) return;
    const bool grad = i % 3 == MT_Q_G && grad_unit > 0.0f;
    if (amax) {
        const int latest = (pos[0] + 1) % len, count = pos[1] < len ? pos[1] + 1 : len;
        float a = amax[i];
        if (grad) a = __fdiv_rn(a, grad_unit);
        float *h = hist + (size_t)i * (size_t)len;
        h[latest] = a;
        hscale[i] = mt_q_history_scale(h, count, a, max_algo, i % 3 == MT_Q_G ? gmax : fmax, margin,
                                       hscale[i]);
        amax[i] = 0.0f;
    }
    scale[i] = grad ? __fdiv_rn(hscale[i], grad_unit) : hscale[i];
}

// The histories' position after amax_history_kernel's entry (one thread).
__global__ static void amax_history_advance_kernel(int32_t *pos, int len, struct mt_step_gate gate, bool gated)
{
    if (gated && !mt_q_step_taken(gate.sumsq, gate.loss, gate.loss_stride, gate.n_loss)) return;
    pos[0] = (pos[0] + 1) % len;
    pos[1] = pos[1] < len ? pos[1] + 1 : len;
}

extern "C" void mt_cuda_amax_history(void *ctx, float *hist, float *hscale, float *scale, float *amax, int n,
                                     int len, int32_t *pos, bool max_algo, float fmax, float gmax, int margin,
                                     float grad_unit, const struct mt_step_gate *gate)
{
    MT_CUDA_OP(ctx, MT_OP_AMAX_HISTORY);
    mt_cuda_ctx *c = mt_cuda(ctx);
    const struct mt_step_gate g = gate ? *gate : mt_step_gate{};
    if (n > 0) {
        MT_LAUNCH(mt_cdiv((size_t)n, 128), 128, 0, c->stream, amax_history_kernel)(
            hist, hscale, scale, amax, n, len, pos, max_algo, fmax, gmax, margin, grad_unit, g, gate != nullptr);
        MT_CUDA_LAUNCHED();
    }
    if (amax) {
        MT_LAUNCH(1, 1, 0, c->stream, amax_history_advance_kernel)(pos, len, g, gate != nullptr);
        MT_CUDA_LAUNCHED();
    }
}

// NVFP4's random key (op random_key): one thread, mt_q_random_key_step on the device, so
// that the quantisers read the seed of the pass that runs and a captured iteration
// advances the key in its replay, never a kernel parameter frozen at the capture.
__global__ static void random_key_kernel(uint64_t *key, uint64_t base, int dp, int dp_rank, bool end,
                                         struct mt_step_gate gate, bool gated)
{
    if (end && gated && !mt_q_step_taken(gate.sumsq, gate.loss, gate.loss_stride, gate.n_loss)) return;
    mt_q_random_key_step(key, base, dp, dp_rank, end);
}

extern "C" void mt_cuda_random_key(void *ctx, uint64_t *key, uint64_t base, int dp, int dp_rank, bool end,
                                   const struct mt_step_gate *gate)
{
    MT_CUDA_OP(ctx, MT_OP_CONVERT);
    mt_cuda_ctx *c = mt_cuda(ctx);
    const struct mt_step_gate g = gate ? *gate : mt_step_gate{};
    MT_LAUNCH(1, 1, 0, c->stream, random_key_kernel)(key, base, dp, dp_rank, end, g, gate != nullptr);
    MT_CUDA_LAUNCHED();
}

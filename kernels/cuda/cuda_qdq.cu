// CUDA backend: the FP8/FP4 recipes' operand quantisation in the model (struct
// mt_quant_ops qdq; doc/fp8.md "In the model" and "On the GPU"). The device quantisers
// of cuda_quant.cu applied to a GEMM operand, and the values they keep written back in
// fp32 for the ordinary GEMM: kernels/cpu/cpu_qdq.c's steps, bit for bit.
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
// The codes, scales and scalars live in one block of scratch, at most
// mt_quant_scratch_bytes(rows * cols) (kernels/kernels.h): the spec's work buffer (the
// model's, counted as workspace), else a block of the caching allocator for the call. Launches are charged to MT_OP_CONVERT: qdq is a
// precision conversion and has no slot of its own in the op enum.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_quant.h"

#include <stdio.h>

#define QDQ_THREADS 256

// out = x as fp32, (R, C) as it is or, transposed, (C, R).
template <typename T>
__global__ static void qdq_load_kernel(float *out, const T *x, int64_t R, int64_t C, int transpose)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= R * C) return;
    const int64_t r = i / C, c = i % C;
    out[transpose ? c * R + r : i] = mt_ld(x, (size_t)i);
}

// Delayed scaling's record: *dst = max(*dst, *amax), a NaN amax recorded (cpu_qdq.c).
__global__ static void qdq_record_amax_kernel(float *dst, const float *amax)
{
    const float a = *amax;
    if (!(a <= *dst)) *dst = a;
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

[[noreturn]] static void qdq_fail(const char *what, const struct mt_err *err)
{
    char call[64];
    snprintf(call, sizeof call, "qdq: %s", what);
    mt_cuda_fatal(__FILE__, __LINE__, call, err->msg);
}

static size_t qdq_align16(size_t n) { return (n + 15) / 16 * 16; }

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
    struct mt_err err = {};
    mt_with_elem(x.dtype, [&](auto tag) {
        MT_LAUNCH(mt_cdiv(n, QDQ_THREADS), QDQ_THREADS, 0, c->stream, qdq_load_kernel<MT_ELEM(tag)>)(
            w, (const MT_ELEM(tag) *)x.data, R, C, (int)tr);
    });
    MT_CUDA_LAUNCHED();
    if (s->rht && R >= 16) {
        // along the columns of (R, C): along the rows of the transpose (C, R)
        const int rc = tr ? mt_cuda_q_rht(w, C, R / 16 * 16, R, MT_Q_ALONG_ROW, s->seed, s->rht_stream, c->stream, &err)
                          : mt_cuda_q_rht(w, R / 16 * 16, C, C, MT_Q_ALONG_COL, s->seed, s->rht_stream, c->stream, &err);
        if (rc) qdq_fail("Hadamard transform", &err);
    }
    struct mt_cuda_qtensor q;
    if (mt_cuda_qtensor_layout(&q, s->scaling, s->elem, s->scaling == MT_Q_MX ? s->along : MT_Q_ALONG_ROW, qr, qc,
                               &err))
        qdq_fail("quantised tensor", &err);
    // scratch: codes, scales, then three floats (amax, the tensorwise scale, NVFP4's global)
    const size_t at_scale = qdq_align16(q.data_bytes), at_scalars = at_scale + qdq_align16(q.scale_bytes);
    const size_t need = at_scalars + 16;
    const bool own = !(s->work && s->work_bytes >= need);
    char *ws = own ? (char *)mt_cuda_scratch(c, need) : (char *)s->work;
    q.data = (uint8_t *)ws;
    if (s->scaling == MT_Q_MX || mt_q_is_nvfp4(s->scaling)) q.scale8 = (uint8_t *)(ws + at_scale);
    else q.scale = (float *)(ws + at_scale);
    float *amax = (float *)(ws + at_scalars), *tscale = amax + 1;
    q.global = amax + 2;
    const bool current = s->scaling == MT_Q_TENSOR && !s->scale;
    if (s->amax || current) {
        if (mt_cuda_q_amax(amax, w, qr, qc, qc, c->stream, &err)) qdq_fail("amax", &err);
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
            if (mt_cuda_q_tensor_scale(tscale, amax, fmax, s->margin, c->stream, &err)) qdq_fail("scale", &err);
        }
        rc = mt_cuda_quant_tensorwise(&q, w, qc, current ? tscale : s->scale, s->rnd, s->seed, s->stream, c->stream,
                                      &err);
        break;
    case MT_Q_BLOCK_1X128:
    case MT_Q_BLOCK_128X128: rc = mt_cuda_quant_blockwise(&q, w, qc, 1, c->stream, &err); break;
    case MT_Q_MX: rc = mt_cuda_quant_mxfp8(&q, w, qc, c->stream, &err); break;
    case MT_Q_NVFP4:
    case MT_Q_NVFP4_2D: rc = mt_cuda_quant_nvfp4(&q, w, qc, s->rnd, s->seed, s->stream, c->stream, &err); break;
    }
    if (rc) qdq_fail("quantise", &err);
    // element (r, c) of q is (c, r) of out when it was loaded transposed
    MT_LAUNCH(mt_cdiv(n, QDQ_THREADS), QDQ_THREADS, 0, c->stream, qdq_dequant_kernel)(w, q, tr ? 1 : qc,
                                                                                      tr ? qr : 1);
    MT_CUDA_LAUNCHED();
    if (own) mt_cuda_scratch_free(c, ws);
}

// CUDA backend: the FP8/FP4 recipes' quantisers, the random Hadamard transform and the
// ordering of block scales for cuBLASLt (kernels/cuda/cuda_quant.h; doc/fp8.md).
//
// Bit-identical to kernels/cpu/cpu_quant.c by construction: the codecs and the scale
// rules are kernels/quant.h's (integer arithmetic on bit patterns), the only fp32
// arithmetic is one multiply before each rounding and one reciprocal per scale, as the
// CPU does them (the _rn intrinsics keep nvcc from contracting anything into an FMA),
// and every amax is a maximum of magnitudes' bit patterns, exact in any order. Each
// block of a recipe is handled by one thread, one warp or one thread block, which
// computes its amax, its scale and its elements from its own data alone.
#include "kernels/cuda/cuda_quant.h"

#include "kernels/cuda/cuda_launch.cuh"
#include "kernels/cuda/cuda_qrow.cuh"

#include <cuda_runtime.h>

#include <stdio.h>

#define MT_Q_THREADS 256
#define MT_Q_AMAX_MAX_BLOCKS 1024

// ---------------------------------------------------------------- device helpers

// Over the block (blockDim.x a multiple of 32), to every thread; scratch holds 32 words.
__device__ __forceinline__ uint32_t q_block_umax(uint32_t v, uint32_t *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = q_warp_umax(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0u;
    return q_warp_umax(v);
}

static int q_launched(const char *kernel, struct mt_err *err)
{
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return MT_OK;
    return mt_err_set(err, MT_ERUNTIME, "%s: the launch failed: %s", kernel, cudaGetErrorString(e));
}

static unsigned q_cdiv(int64_t a, int64_t b) { return (unsigned)((a + b - 1) / b); }

// The blocks of an amax launch over n elements (a grid-stride loop beyond).
static unsigned q_amax_blocks(int64_t n)
{
    const unsigned blocks = q_cdiv(n, MT_Q_THREADS);
    return blocks > MT_Q_AMAX_MAX_BLOCKS ? MT_Q_AMAX_MAX_BLOCKS : blocks;
}

// ---------------------------------------------------------------- layout

extern "C" int mt_cuda_qtensor_layout(struct mt_cuda_qtensor *q, enum mt_q_scaling scaling, enum mt_q_elem elem,
                                      enum mt_q_dim along, int64_t rows, int64_t cols, struct mt_err *err)
{
    *q = mt_cuda_qtensor{};
    if (rows <= 0 || cols <= 0)
        return mt_err_set(err, MT_EINVAL, "quantised device tensor: shape (%lld, %lld) is empty", (long long)rows,
                          (long long)cols);
    const bool fp4 = elem == MT_Q_ELEM_E2M1;
    if (mt_q_is_nvfp4(scaling) != fp4 || (scaling == MT_Q_MX && elem != MT_Q_ELEM_E4M3))
        return mt_err_set(err, MT_EINVAL, "quantised device tensor: %s scaling takes %s elements",
                          mt_q_scaling_name(scaling),
                          mt_q_is_nvfp4(scaling) ? "E2M1" : scaling == MT_Q_MX ? "E4M3" : "E4M3 or E5M2");
    if (along == MT_Q_ALONG_COL && scaling != MT_Q_MX)
        return mt_err_set(err, MT_EINVAL,
                          "quantised device tensor: %s scaling has blocks along the row only; transpose the "
                          "tensor first",
                          mt_q_scaling_name(scaling));
    q->scaling = scaling;
    q->elem = elem;
    q->along = along;
    q->rows = rows;
    q->cols = cols;
    switch (scaling) {
    case MT_Q_TENSOR: q->srows = q->scols = 1; break;
    case MT_Q_BLOCK_1X128: q->srows = rows; q->scols = (cols + 127) / 128; break;
    case MT_Q_BLOCK_128X128: q->srows = (rows + 127) / 128; q->scols = (cols + 127) / 128; break;
    case MT_Q_MX:
        q->srows = along == MT_Q_ALONG_ROW ? rows : (rows + 31) / 32;
        q->scols = along == MT_Q_ALONG_ROW ? (cols + 31) / 32 : cols;
        break;
    case MT_Q_NVFP4:
    case MT_Q_NVFP4_2D: q->srows = rows; q->scols = (cols + 15) / 16; break;
    }
    q->data_bytes = (size_t)(rows * (fp4 ? (cols + 1) / 2 : cols));
    const size_t n = (size_t)(q->srows * q->scols);
    q->scale_bytes = scaling == MT_Q_MX || mt_q_is_nvfp4(scaling) ? n : n * sizeof(float);
    return MT_OK;
}

// Whether a quantiser of scalings a or b may fill q (its buffers set) from stride ld.
static int q_check(const struct mt_cuda_qtensor *q, enum mt_q_scaling a, enum mt_q_scaling b, int64_t ld,
                   const char *fn, struct mt_err *err)
{
    if (q->scaling != a && q->scaling != b)
        return mt_err_set(err, MT_EINVAL, "%s: the tensor was laid out for %s scaling", fn,
                          mt_q_scaling_name(q->scaling));
    const bool fp32_scales = q->scaling == MT_Q_TENSOR || q->scaling == MT_Q_BLOCK_1X128 ||
                             q->scaling == MT_Q_BLOCK_128X128;
    if (!q->data || (fp32_scales ? !q->scale : !q->scale8) || (mt_q_is_nvfp4(q->scaling) && !q->global))
        return mt_err_set(err, MT_EINVAL, "%s: the tensor's device buffers are not all set (data, %s%s)", fn,
                          fp32_scales ? "scale" : "scale8", mt_q_is_nvfp4(q->scaling) ? ", global" : "");
    if (ld < q->cols)
        return mt_err_set(err, MT_EINVAL, "%s: row stride %lld is less than the %lld columns", fn, (long long)ld,
                          (long long)q->cols);
    return MT_OK;
}

// ---------------------------------------------------------------- amax

// A block's part of x's amax, its threads' elements i, i + stride, ... from the first
// ones: max-ed into *amax (zero before the first block).
__device__ __forceinline__ void q_amax_part(uint32_t *amax, const float *x, int64_t rows, int64_t cols, int64_t ld,
                                            int64_t first, int64_t stride, uint32_t *scratch)
{
    const int64_t n = rows * cols;
    uint32_t m = 0;
    for (int64_t i = first; i < n; i += stride) m = q_umax(m, q_mag_bits(x[(i / cols) * ld + i % cols]));
    m = q_block_umax(m, scratch);
    if (threadIdx.x == 0) atomicMax(amax, m);
}

__global__ static void q_amax_kernel(uint32_t *amax, const float *x, int64_t rows, int64_t cols, int64_t ld)
{
    MT_SHARED(uint32_t, scratch, [32]);
    q_amax_part(amax, x, rows, cols, ld, (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
                (int64_t)gridDim.x * blockDim.x, scratch);
}

extern "C" int mt_cuda_q_amax(float *amax, const float *x, int64_t rows, int64_t cols, int64_t ld,
                              cudaStream_t stream, struct mt_err *err)
{
    if (rows <= 0 || cols <= 0 || ld < cols)
        return mt_err_set(err, MT_EINVAL, "mt_cuda_q_amax: a (%lld, %lld) view with row stride %lld is not a "
                          "tensor", (long long)rows, (long long)cols, (long long)ld);
    cudaError_t e = cudaMemsetAsync(amax, 0, sizeof(float), stream);
    if (e != cudaSuccess)
        return mt_err_set(err, MT_ERUNTIME, "mt_cuda_q_amax: cudaMemsetAsync: %s", cudaGetErrorString(e));
    MT_LAUNCH(q_amax_blocks(rows * cols), MT_Q_THREADS, 0, stream, q_amax_kernel)((uint32_t *)amax, x, rows, cols, ld);
    return q_launched("q_amax_kernel", err);
}

// ---------------------------------------------------------------- tensorwise and delayed

__global__ static void q_tensor_scale_kernel(float *scale, const float *amax, float fmax, int margin)
{
    *scale = mt_q_tensor_scale(*amax, fmax, margin);
}

extern "C" int mt_cuda_q_tensor_scale(float *scale, const float *amax, float fmax, int margin, cudaStream_t stream,
                                      struct mt_err *err)
{
    if (!(fmax > 0.0f))
        return mt_err_set(err, MT_EINVAL, "mt_cuda_q_tensor_scale: format maximum %g is not positive", (double)fmax);
    MT_LAUNCH(1, 1, 0, stream, q_tensor_scale_kernel)(scale, amax, fmax, margin);
    return q_launched("q_tensor_scale_kernel", err);
}

// Element i of a tensorwise quantisation with encode scale s (element 0 writes the
// decode scale).
__device__ __forceinline__ void q_tensorwise_elem(int64_t i, uint8_t *data, float *dscale, const float *x,
                                                  int64_t rows, int64_t cols, int64_t ld, float s, enum mt_q_elem elem,
                                                  enum mt_q_round rnd, uint64_t seed, uint32_t stream_id)
{
    if (i == 0) *dscale = __fdiv_rn(1.0f, s);
    if (i >= rows * cols) return;
    const int64_t r = i / cols, c = i % cols;
    const uint32_t rb = rnd == MT_Q_SR ? mt_q_random_byte(seed, stream_id, (uint64_t)i) : 0;
    data[i] = q_fp8(__fmul_rn(x[r * ld + c], s), elem, rnd, rb);
}

__global__ static void q_tensorwise_kernel(uint8_t *data, float *dscale, const float *x, int64_t rows, int64_t cols,
                                           int64_t ld, const float *scale, enum mt_q_elem elem, enum mt_q_round rnd,
                                           struct mt_q_seed seed, uint32_t stream_id)
{
    q_tensorwise_elem((int64_t)blockIdx.x * blockDim.x + threadIdx.x, data, dscale, x, rows, cols, ld, *scale, elem,
                      rnd, rnd == MT_Q_SR ? mt_q_seed_value(seed) : 0, stream_id);
}

extern "C" int mt_cuda_quant_tensorwise(const struct mt_cuda_qtensor *q, const float *x, int64_t ld,
                                        const float *scale, enum mt_q_round rnd, struct mt_q_seed seed, uint32_t stream_id,
                                        cudaStream_t stream, struct mt_err *err)
{
    int rc = q_check(q, MT_Q_TENSOR, MT_Q_TENSOR, ld, "mt_cuda_quant_tensorwise", err);
    if (rc) return rc;
    MT_LAUNCH(q_cdiv(q->rows * q->cols, MT_Q_THREADS), MT_Q_THREADS, 0, stream, q_tensorwise_kernel)(
        q->data, q->scale, x, q->rows, q->cols, ld, scale, q->elem, rnd, seed, stream_id);
    return q_launched("q_tensorwise_kernel", err);
}

__global__ static void q_history_kernel(float *hist, float *scale, const float *amax, int latest, int count,
                                        enum mt_amax_algo algo, float fmax, int margin)
{
    hist[latest] = *amax;
    *scale = mt_q_history_scale(hist, count, *amax, algo == MT_AMAX_MAX, fmax, margin, *scale);
}

__global__ static void q_history_init_kernel(float *hist, float *scale, int len)
{
    for (int i = 0; i < len; i++) hist[i] = 0.0f;
    *scale = 1.0f;
}

extern "C" int mt_cuda_amax_history_init(struct mt_cuda_amax_history *h, int len, enum mt_amax_algo algo,
                                         float fmax, int margin, cudaStream_t stream, struct mt_err *err)
{
    *h = mt_cuda_amax_history{};
    if (len < 1) return mt_err_set(err, MT_EINVAL, "amax history: length %d; it needs at least 1", len);
    if (!(fmax > 0.0f))
        return mt_err_set(err, MT_EINVAL, "amax history: format maximum %g is not positive", (double)fmax);
    void *p = nullptr;
    if (cudaMalloc(&p, sizeof(float) * ((size_t)len + 1)) != cudaSuccess)
        return mt_err_set(err, MT_ENOMEM, "amax history: no device memory for %d entries", len);
    h->amax = (float *)p;
    h->scale = h->amax + len;
    h->len = len;
    h->algo = algo;
    h->fmax = fmax;
    h->margin = margin;
    h->latest = len - 1;
    MT_LAUNCH(1, 1, 0, stream, q_history_init_kernel)(h->amax, h->scale, len);
    return q_launched("q_history_init_kernel", err);
}

extern "C" void mt_cuda_amax_history_free(struct mt_cuda_amax_history *h)
{
    if (h->amax) cudaFree(h->amax);
    h->amax = h->scale = nullptr;
}

extern "C" int mt_cuda_amax_history_update(struct mt_cuda_amax_history *h, const float *amax, cudaStream_t stream,
                                           struct mt_err *err)
{
    if (!h->amax) return mt_err_set(err, MT_EINVAL, "mt_cuda_amax_history_update: the history has no storage");
    h->latest = (h->latest + 1) % h->len;
    if (h->count < h->len) h->count++;
    MT_LAUNCH(1, 1, 0, stream, q_history_kernel)(h->amax, h->scale, amax, h->latest, h->count, h->algo, h->fmax,
                                                 h->margin);
    return q_launched("q_history_kernel", err);
}

// ---------------------------------------------------------------- blockwise

// One thread block of 128 threads per tile or block (bc, br); thread t owns column
// c0 + t of it (of each of its rows for 128 x 128).
__device__ __forceinline__ void q_blockwise_block(int64_t bc, int64_t br, uint8_t *data, float *dscale,
                                                  const float *x, int64_t rows, int64_t cols, int64_t ld,
                                                  int64_t scols, int bh, enum mt_q_elem elem, int pow2,
                                                  uint32_t *scratch)
{
    const int64_t r0 = br * bh, r1 = r0 + bh < rows ? r0 + bh : rows;
    const int64_t c = bc * 128 + threadIdx.x;
    const bool in = c < cols;
    uint32_t m = 0;
    if (in)
        for (int64_t r = r0; r < r1; r++) m = q_umax(m, q_mag_bits(x[r * ld + c]));
    const float amax = mt_q_float(q_block_umax(m, scratch));
    const float s = mt_q_block_scale(amax, elem == MT_Q_ELEM_E4M3 ? MT_E4M3_MAX : MT_E5M2_MAX, pow2);
    if (in)
        for (int64_t r = r0; r < r1; r++) data[r * cols + c] = q_fp8(__fmul_rn(x[r * ld + c], s), elem, MT_Q_RN, 0);
    if (threadIdx.x == 0) dscale[br * scols + bc] = __fdiv_rn(1.0f, s);
}

__global__ static void __launch_bounds__(128) q_blockwise_kernel(uint8_t *data, float *dscale, const float *x,
                                                                 int64_t rows, int64_t cols, int64_t ld,
                                                                 int64_t scols, int bh, enum mt_q_elem elem,
                                                                 int pow2)
{
    MT_SHARED(uint32_t, scratch, [32]);
    q_blockwise_block(blockIdx.x, blockIdx.y, data, dscale, x, rows, cols, ld, scols, bh, elem, pow2, scratch);
}

extern "C" int mt_cuda_quant_blockwise(const struct mt_cuda_qtensor *q, const float *x, int64_t ld, int pow2,
                                       cudaStream_t stream, struct mt_err *err)
{
    int rc = q_check(q, MT_Q_BLOCK_1X128, MT_Q_BLOCK_128X128, ld, "mt_cuda_quant_blockwise", err);
    if (rc) return rc;
    if (q->srows > 65535)
        return mt_err_set(err, MT_EINVAL, "mt_cuda_quant_blockwise: %lld scale rows exceed the grid's 65535",
                          (long long)q->srows);
    const int bh = q->scaling == MT_Q_BLOCK_1X128 ? 1 : 128;
    MT_LAUNCH(dim3((unsigned)q->scols, (unsigned)q->srows), 128, 0, stream, q_blockwise_kernel)(
        q->data, q->scale, x, q->rows, q->cols, ld, q->scols, bh, q->elem, pow2);
    return q_launched("q_blockwise_kernel", err);
}

// ---------------------------------------------------------------- MXFP8

// Along the row: one warp per block of 32 (the w-th), lane l owns column c0 + l.
__device__ __forceinline__ void q_mx_rows_warp(int64_t w, uint8_t *data, uint8_t *scale8, const float *x,
                                               int64_t rows, int64_t cols, int64_t ld, int64_t scols)
{
    const int lane = threadIdx.x & 31;
    if (w >= rows * scols) return; // whole warps: blockDim.x is a multiple of 32
    const int64_t r = w / scols, sc = w % scols, c = sc * 32 + lane;
    const bool in = c < cols;
    const uint8_t s = q_mx_block_warp(in ? x[r * ld + c] : 0.0f, in, data + r * cols + c);
    if (lane == 0) scale8[r * scols + sc] = s;
}

__global__ static void q_mx_rows_kernel(uint8_t *data, uint8_t *scale8, const float *x, int64_t rows, int64_t cols,
                                        int64_t ld, int64_t scols)
{
    q_mx_rows_warp(((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, data, scale8, x, rows, cols, ld, scols);
}

// Along the column: one thread per block of 32 rows (the sr-th) of column c,
// neighbouring threads on neighbouring columns (coalesced).
__device__ __forceinline__ void q_mx_cols_thread(int64_t c, int64_t sr, uint8_t *data, uint8_t *scale8,
                                                 const float *x, int64_t rows, int64_t cols, int64_t ld)
{
    if (c >= cols) return;
    const int64_t r0 = sr * 32, r1 = r0 + 32 < rows ? r0 + 32 : rows;
    uint32_t m = 0;
    for (int64_t r = r0; r < r1; r++) m = q_umax(m, q_mag_bits(x[r * ld + c]));
    const uint8_t s = mt_q_mx_scale(mt_q_float(m));
    const float e = mt_q_mx_element_scale(s);
    for (int64_t r = r0; r < r1; r++) data[r * cols + c] = mt_e4m3_from_float(__fmul_rn(x[r * ld + c], e), 1, MT_Q_RN, 0);
    scale8[sr * cols + c] = s;
}

__global__ static void q_mx_cols_kernel(uint8_t *data, uint8_t *scale8, const float *x, int64_t rows, int64_t cols,
                                        int64_t ld)
{
    q_mx_cols_thread((int64_t)blockIdx.x * blockDim.x + threadIdx.x, blockIdx.y, data, scale8, x, rows, cols, ld);
}

extern "C" int mt_cuda_quant_mxfp8(const struct mt_cuda_qtensor *q, const float *x, int64_t ld, cudaStream_t stream,
                                   struct mt_err *err)
{
    int rc = q_check(q, MT_Q_MX, MT_Q_MX, ld, "mt_cuda_quant_mxfp8", err);
    if (rc) return rc;
    if (q->along == MT_Q_ALONG_ROW) {
        MT_LAUNCH(q_cdiv(q->rows * q->scols * 32, MT_Q_THREADS), MT_Q_THREADS, 0, stream, q_mx_rows_kernel)(
            q->data, q->scale8, x, q->rows, q->cols, ld, q->scols);
        return q_launched("q_mx_rows_kernel", err);
    }
    if (q->srows > 65535)
        return mt_err_set(err, MT_EINVAL, "mt_cuda_quant_mxfp8: %lld blocks of 32 rows exceed the grid's 65535",
                          (long long)q->srows);
    MT_LAUNCH(dim3(q_cdiv(q->cols, 128), (unsigned)q->srows), 128, 0, stream, q_mx_cols_kernel)(
        q->data, q->scale8, x, q->rows, q->cols, ld);
    return q_launched("q_mx_cols_kernel", err);
}

// ---------------------------------------------------------------- NVFP4

// One thread per block: 16 elements of a row, or 16 x 16 (bh = 16), whose 8-byte row
// pieces it owns whole (blocks start at even columns). *amax holds the tensor's amax.
// Element (r, c) draws the random byte of index (row0 + r) * icols + col0 + c (its
// place in the logical tensor, struct mt_cuda_q_place; 0, 0, cols for a whole one).
// (Block t of the tensor whose amax is amax.)
__device__ __forceinline__ void q_nvfp4_block(int64_t t, uint8_t *data, uint8_t *scale8, float amax, const float *x,
                                              int64_t rows, int64_t cols, int64_t ld, int64_t scols, int bh,
                                              enum mt_q_round rnd, uint64_t seed, uint32_t stream_id, int64_t row0,
                                              int64_t col0, int64_t icols)
{
    const int64_t groups = (rows + bh - 1) / bh;
    if (t >= groups * scols) return;
    const int64_t r0 = t / scols * bh, bc = t % scols, r1 = r0 + bh < rows ? r0 + bh : rows;
    const int64_t c0 = bc * 16, c1 = c0 + 16 < cols ? c0 + 16 : cols, rbytes = (cols + 1) / 2;
    const float genc = mt_q_nvfp4_global_scale(amax);
    uint32_t m = 0;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) m = q_umax(m, q_mag_bits(x[r * ld + c]));
    const uint8_t s = mt_q_nvfp4_block_scale(mt_q_float(m), genc);
    const float e = mt_q_nvfp4_element_scale(s, genc);
    for (int64_t r = r0; r < r1; r++) {
        scale8[r * scols + bc] = s;
        for (int64_t c = c0; c < c1; c += 2) {
            uint8_t byte = 0;
            for (int64_t k = c; k < c + 2 && k < c1; k++) {
                const uint64_t i = (uint64_t)((row0 + r) * icols + col0 + k);
                const uint32_t rb = rnd == MT_Q_SR ? mt_q_random_byte(seed, stream_id, i) : 0;
                byte |= (uint8_t)(mt_e2m1_from_float(__fmul_rn(x[r * ld + k], e), rnd, rb) << (4 * (k & 1)));
            }
            data[r * rbytes + c / 2] = byte;
        }
    }
}

__global__ static void q_nvfp4_kernel(uint8_t *data, uint8_t *scale8, const float *amax, const float *x, int64_t rows,
                                      int64_t cols, int64_t ld, int64_t scols, int bh, enum mt_q_round rnd,
                                      struct mt_q_seed seed, uint32_t stream_id, int64_t row0, int64_t col0,
                                      int64_t icols)
{
    q_nvfp4_block((int64_t)blockIdx.x * blockDim.x + threadIdx.x, data, scale8, *amax, x, rows, cols, ld, scols, bh,
                  rnd, rnd == MT_Q_SR ? mt_q_seed_value(seed) : 0, stream_id, row0, col0, icols);
}

// The per-tensor decode scale, from the amax the quantiser read (same place).
__device__ __forceinline__ float q_nvfp4_decode(float amax) { return __fdiv_rn(1.0f, mt_q_nvfp4_global_scale(amax)); }
__global__ static void q_nvfp4_global_kernel(float *global) { *global = q_nvfp4_decode(*global); }

// *amax = the larger of *amax and *other, as magnitudes' bit patterns (a NaN in either
// the result): the amax of a part joined with its logical tensor's.
__device__ __forceinline__ float q_amax_join(float amax, float other)
{
    return mt_q_float(q_umax(q_mag_bits(amax), q_mag_bits(other)));
}
__global__ static void q_amax_join_kernel(float *amax, const float *other) { *amax = q_amax_join(*amax, *other); }

extern "C" int mt_cuda_quant_nvfp4(const struct mt_cuda_qtensor *q, const float *x, int64_t ld, enum mt_q_round rnd,
                                   struct mt_q_seed seed, uint32_t stream_id, const struct mt_cuda_q_place *place,
                                   cudaStream_t stream, struct mt_err *err)
{
    int rc = q_check(q, MT_Q_NVFP4, MT_Q_NVFP4_2D, ld, "mt_cuda_quant_nvfp4", err);
    if (rc) return rc;
    const struct mt_cuda_q_place whole = {0, 0, q->cols, nullptr}, *pl = place ? place : &whole;
    if (pl->row0 < 0 || pl->col0 < 0 || pl->lcols < pl->col0 + q->cols)
        return mt_err_set(err, MT_EINVAL, "mt_cuda_quant_nvfp4: a (%lld, %lld) tensor at (%lld, %lld) does not lie in "
                          "logical rows of %lld columns", (long long)q->rows, (long long)q->cols,
                          (long long)pl->row0, (long long)pl->col0, (long long)pl->lcols);
    rc = mt_cuda_q_amax(q->global, x, q->rows, q->cols, ld, stream, err);
    if (rc) return rc;
    if (pl->tensor_amax) {
        MT_LAUNCH(1, 1, 0, stream, q_amax_join_kernel)(q->global, pl->tensor_amax);
        rc = q_launched("q_amax_join_kernel", err);
        if (rc) return rc;
    }
    const int bh = q->scaling == MT_Q_NVFP4_2D ? 16 : 1;
    const int64_t threads = (q->rows + bh - 1) / bh * q->scols;
    MT_LAUNCH(q_cdiv(threads, 128), 128, 0, stream, q_nvfp4_kernel)(q->data, q->scale8, q->global, x, q->rows,
                                                                    q->cols, ld, q->scols, bh, rnd, seed, stream_id,
                                                                    pl->row0, pl->col0, pl->lcols);
    rc = q_launched("q_nvfp4_kernel", err);
    if (rc) return rc;
    MT_LAUNCH(1, 1, 0, stream, q_nvfp4_global_kernel)(q->global);
    return q_launched("q_nvfp4_global_kernel", err);
}

// ---------------------------------------------------------------- random Hadamard transform

// One thread per 16 consecutive elements along dim; out_j = sum_i in_i Q_ij in i order,
// each product and sum rounded on its own as on the CPU. Q_ij = +-1/4: the sign is the
// parity of i & j (Sylvester's H) flipped by bit i of signs (the sign of input i).
// (Thread t's 16 elements.)
__device__ __forceinline__ void q_rht_chunk(int64_t t, float *x, int64_t lines, int64_t chunks, int64_t ld,
                                            int along_row, uint32_t signs)
{
    if (t >= lines * chunks) return;
    const int64_t l = t / chunks, s = t % chunks * 16, step = along_row ? 1 : ld;
    float *v = along_row ? &x[l * ld + s] : &x[s * ld + l];
    float in[16];
    for (int i = 0; i < 16; i++) in[i] = v[i * step];
    for (int j = 0; j < 16; j++) {
        float acc = 0.0f;
        for (int i = 0; i < 16; i++) {
            uint32_t p = (uint32_t)(i & j);
            p ^= p >> 2;
            p ^= p >> 1;
            const bool neg = ((p ^ (signs >> i)) & 1u) != 0;
            acc = __fadd_rn(acc, __fmul_rn(in[i], neg ? -0.25f : 0.25f));
        }
        v[j * step] = acc;
    }
}

__global__ static void q_rht_kernel(float *x, int64_t lines, int64_t chunks, int64_t ld, int along_row,
                                    struct mt_q_seed seed, uint32_t stream_id)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= lines * chunks) return;
    q_rht_chunk(t, x, lines, chunks, ld, along_row, mt_q_hadamard_signs(mt_q_seed_value(seed), stream_id));
}

extern "C" int mt_cuda_q_rht(float *x, int64_t rows, int64_t cols, int64_t ld, enum mt_q_dim dim, struct mt_q_seed seed,
                             uint32_t stream_id, cudaStream_t stream, struct mt_err *err)
{
    const int64_t extent = dim == MT_Q_ALONG_ROW ? cols : rows;
    if (rows <= 0 || cols <= 0 || ld < cols)
        return mt_err_set(err, MT_EINVAL, "random Hadamard transform: a (%lld, %lld) view with row stride %lld "
                          "is not a tensor", (long long)rows, (long long)cols, (long long)ld);
    if (extent % 16)
        return mt_err_set(err, MT_EINVAL,
                          "random Hadamard transform: the %s count %lld is not a multiple of 16 (pad the GEMM's "
                          "reduction dimension to 16)",
                          dim == MT_Q_ALONG_ROW ? "column" : "row", (long long)extent);
    const int64_t lines = dim == MT_Q_ALONG_ROW ? rows : cols, chunks = extent / 16;
    MT_LAUNCH(q_cdiv(lines * chunks, 128), 128, 0, stream, q_rht_kernel)(x, lines, chunks, ld,
                                                                         dim == MT_Q_ALONG_ROW, seed,
                                                                         stream_id);
    return q_launched("q_rht_kernel", err);
}

// ---------------------------------------------------------------- batches
//
// The quantisers above over a batch of tensors (struct mt_cuda_q_batch), the batch's
// tensor blockIdx.z (blockIdx.y for the amax): the same per-element, per-block and
// per-warp code as one tensor's launch, over a grid as large as the largest tensor's,
// the blocks past a smaller tensor's end doing nothing.

__global__ static void q_batch_amax_kernel(const __grid_constant__ mt_cuda_q_batch b)
{
    MT_SHARED(uint32_t, scratch, [32]);
    const mt_cuda_q_item &t = b.t[blockIdx.y];
    q_amax_part((uint32_t *)&b.amax[blockIdx.y], t.x, t.q.rows, t.q.cols, t.ld,
                (int64_t)blockIdx.x * blockDim.x + threadIdx.x, (int64_t)gridDim.x * blockDim.x, scratch);
}

// Delayed scaling's records, one tensor after the other (a tensor's record may be
// another's), as qdq's record of each makes them: a NaN amax recorded.
__device__ __forceinline__ void q_batch_record(const mt_cuda_q_batch &b)
{
    for (int i = 0; i < b.n; i++)
        if (b.t[i].record) {
            const float a = b.amax[i];
            if (!(a <= *b.t[i].record)) *b.t[i].record = a;
        }
}

// A kernel a scaling S (b.scaling), so that each takes the registers of its own
// quantiser only.
template <enum mt_q_scaling S>
__global__ static void __launch_bounds__(MT_Q_THREADS)
    q_batch_quantise_kernel(const __grid_constant__ mt_cuda_q_batch b, int pow2)
{
    MT_SHARED(uint32_t, scratch, [32]);
    const int g = blockIdx.z;
    const mt_cuda_q_item &t = b.t[g];
    const mt_cuda_qtensor &q = t.q;
    if (g == 0 && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) q_batch_record(b);
    switch (S) {
    case MT_Q_TENSOR: {
        const float fmax = b.elem == MT_Q_ELEM_E4M3 ? MT_E4M3_MAX : MT_E5M2_MAX;
        const float s = t.scale ? *t.scale
                                : mt_q_tensor_scale(t.tensor_amax ? *t.tensor_amax : b.amax[g], fmax, t.margin);
        q_tensorwise_elem((int64_t)blockIdx.x * blockDim.x + threadIdx.x, q.data, q.scale, t.x, q.rows, q.cols, t.ld,
                          s, b.elem, t.rnd, t.rnd == MT_Q_SR ? mt_q_seed_value(t.seed) : 0, t.stream_id);
        break;
    }
    case MT_Q_BLOCK_1X128:
    case MT_Q_BLOCK_128X128:
        // 128 threads a tile or block, as q_blockwise_kernel
        if (blockIdx.x >= q.scols || blockIdx.y >= q.srows) return;
        q_blockwise_block(blockIdx.x, blockIdx.y, q.data, q.scale, t.x, q.rows, q.cols, t.ld, q.scols,
                          S == MT_Q_BLOCK_1X128 ? 1 : 128, b.elem, pow2, scratch);
        break;
    case MT_Q_MX:
        if (b.along == MT_Q_ALONG_ROW)
            q_mx_rows_warp(((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, q.data, q.scale8, t.x, q.rows,
                           q.cols, t.ld, q.scols);
        else if (blockIdx.y < q.srows) // 128 threads a block, as q_mx_cols_kernel
            q_mx_cols_thread((int64_t)blockIdx.x * blockDim.x + threadIdx.x, blockIdx.y, q.data, q.scale8, t.x,
                             q.rows, q.cols, t.ld);
        break;
    case MT_Q_NVFP4:
    case MT_Q_NVFP4_2D: {
        // 128 threads, a block of 16 (16 x 16) a thread, as q_nvfp4_kernel; the decode
        // scale as q_nvfp4_global_kernel writes it
        const float amax = t.tensor_amax ? q_amax_join(b.amax[g], *t.tensor_amax) : b.amax[g];
        if (blockIdx.x == 0 && threadIdx.x == 0) *q.global = q_nvfp4_decode(amax);
        q_nvfp4_block((int64_t)blockIdx.x * blockDim.x + threadIdx.x, q.data, q.scale8, amax, t.x, q.rows, q.cols,
                      t.ld, q.scols, S == MT_Q_NVFP4_2D ? 16 : 1, t.rnd,
                      t.rnd == MT_Q_SR ? mt_q_seed_value(t.seed) : 0, t.stream_id, t.place.row0,
                      t.place.col0, t.place.lcols);
        break;
    }
    }
}

// mt_cuda_q_rht of each tensor that has one: thread blockIdx.x * blockDim.x +
// threadIdx.x of its launch, the tensor blockIdx.y.
__global__ static void q_batch_rht_kernel(const __grid_constant__ mt_cuda_q_batch b)
{
    const mt_cuda_q_item &t = b.t[blockIdx.y];
    if (!t.rht) return;
    const bool row = t.rht - 1 == MT_Q_ALONG_ROW;
    const int64_t lines = row ? t.q.rows : t.q.cols, chunks = (row ? t.q.cols : t.q.rows) / 16;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= lines * chunks) return;
    q_rht_chunk(i, (float *)t.x, lines, chunks, t.ld, row, mt_q_hadamard_signs(mt_q_seed_value(t.seed), t.rht_stream));
}

static int q_batch_check(const struct mt_cuda_q_batch *b, const char *fn, struct mt_err *err)
{
    if (b->n < 1 || b->n > MT_CUDA_Q_BATCH_MAX)
        return mt_err_set(err, MT_EINVAL, "%s: %d tensors (a batch holds 1 to %d)", fn, b->n, MT_CUDA_Q_BATCH_MAX);
    if (!b->amax) return mt_err_set(err, MT_EINVAL, "%s: the batch's amax array is not set", fn);
    for (int i = 0; i < b->n; i++) {
        const struct mt_cuda_q_item *t = &b->t[i];
        if (t->q.scaling != b->scaling || t->q.elem != b->elem || (b->scaling == MT_Q_MX && t->q.along != b->along))
            return mt_err_set(err, MT_EINVAL, "%s: tensor %d was laid out for another scaling, format or block "
                              "direction than the batch's", fn, i);
        const int rc = q_check(&t->q, b->scaling, b->scaling, t->ld, fn, err);
        if (rc) return rc;
        if (!t->x) return mt_err_set(err, MT_EINVAL, "%s: tensor %d has no input", fn, i);
        if (mt_q_is_nvfp4(b->scaling) &&
            (t->place.row0 < 0 || t->place.col0 < 0 || t->place.lcols < t->place.col0 + t->q.cols))
            return mt_err_set(err, MT_EINVAL, "%s: tensor %d (%lld, %lld) at (%lld, %lld) does not lie in logical "
                              "rows of %lld columns", fn, i, (long long)t->q.rows, (long long)t->q.cols,
                              (long long)t->place.row0, (long long)t->place.col0, (long long)t->place.lcols);
        if (t->q.srows > 65535)
            return mt_err_set(err, MT_EINVAL, "%s: tensor %d's %lld scale rows exceed the grid's 65535", fn, i,
                              (long long)t->q.srows);
    }
    return MT_OK;
}

extern "C" int mt_cuda_q_batch_needs_amax(const struct mt_cuda_q_batch *b)
{
    if (mt_q_is_nvfp4(b->scaling)) return 1;
    for (int i = 0; i < b->n; i++)
        if (b->t[i].record || (b->scaling == MT_Q_TENSOR && !b->t[i].scale && !b->t[i].tensor_amax)) return 1;
    return 0;
}

extern "C" int mt_cuda_q_batch_rht(const struct mt_cuda_q_batch *b, cudaStream_t stream, struct mt_err *err)
{
    int rc = q_batch_check(b, "mt_cuda_q_batch_rht", err);
    if (rc) return rc;
    int64_t most = 0;
    for (int i = 0; i < b->n; i++) {
        const struct mt_cuda_q_item *t = &b->t[i];
        if (!t->rht) continue;
        if (!mt_q_is_nvfp4(b->scaling) || (t->rht != 1 + MT_Q_ALONG_ROW && t->rht != 1 + MT_Q_ALONG_COL) ||
            t->ld != t->q.cols)
            return mt_err_set(err, MT_EINVAL, "mt_cuda_q_batch_rht: tensor %d: a Hadamard transform is NVFP4's, "
                              "along the rows or the columns of a dense tensor", i);
        most = t->q.rows * t->q.cols / 16 > most ? t->q.rows * t->q.cols / 16 : most;
    }
    if (!most) return MT_OK;
    MT_LAUNCH(dim3(q_cdiv(most, 128), (unsigned)b->n), 128, 0, stream, q_batch_rht_kernel)(*b);
    return q_launched("q_batch_rht_kernel", err);
}

extern "C" int mt_cuda_q_batch_amax(const struct mt_cuda_q_batch *b, cudaStream_t stream, struct mt_err *err)
{
    int rc = q_batch_check(b, "mt_cuda_q_batch_amax", err);
    if (rc) return rc;
    cudaError_t e = cudaMemsetAsync(b->amax, 0, sizeof(float) * (size_t)b->n, stream);
    if (e != cudaSuccess)
        return mt_err_set(err, MT_ERUNTIME, "mt_cuda_q_batch_amax: cudaMemsetAsync: %s", cudaGetErrorString(e));
    int64_t most = 0;
    for (int i = 0; i < b->n; i++)
        if (b->t[i].q.rows * b->t[i].q.cols > most) most = b->t[i].q.rows * b->t[i].q.cols;
    MT_LAUNCH(dim3(q_amax_blocks(most), (unsigned)b->n), MT_Q_THREADS, 0, stream, q_batch_amax_kernel)(*b);
    return q_launched("q_batch_amax_kernel", err);
}

extern "C" int mt_cuda_q_batch_quantise(const struct mt_cuda_q_batch *b, int pow2, cudaStream_t stream,
                                        struct mt_err *err)
{
    int rc = q_batch_check(b, "mt_cuda_q_batch_quantise", err);
    if (rc) return rc;
    // the grid of the largest tensor: x, y as one tensor's launch; z the tensor
    int64_t gx = 1, gy = 1, threads = MT_Q_THREADS;
    for (int i = 0; i < b->n; i++) {
        const struct mt_cuda_qtensor *q = &b->t[i].q;
        int64_t x = 1, y = 1;
        switch (b->scaling) {
        case MT_Q_TENSOR: x = q_cdiv(q->rows * q->cols, MT_Q_THREADS); break;
        case MT_Q_BLOCK_1X128:
        case MT_Q_BLOCK_128X128: x = q->scols, y = q->srows, threads = 128; break;
        case MT_Q_MX:
            if (b->along == MT_Q_ALONG_ROW) x = q_cdiv(q->rows * q->scols * 32, MT_Q_THREADS);
            else x = q_cdiv(q->cols, 128), y = q->srows, threads = 128;
            break;
        case MT_Q_NVFP4:
        case MT_Q_NVFP4_2D: {
            const int bh = b->scaling == MT_Q_NVFP4_2D ? 16 : 1;
            x = q_cdiv((q->rows + bh - 1) / bh * q->scols, 128), threads = 128;
            break;
        }
        }
        gx = x > gx ? x : gx, gy = y > gy ? y : gy;
    }
    const dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)b->n);
    switch (b->scaling) {
    case MT_Q_TENSOR:
        MT_LAUNCH(grid, (unsigned)threads, 0, stream, q_batch_quantise_kernel<MT_Q_TENSOR>)(*b, pow2);
        break;
    case MT_Q_BLOCK_1X128:
        MT_LAUNCH(grid, (unsigned)threads, 0, stream, q_batch_quantise_kernel<MT_Q_BLOCK_1X128>)(*b, pow2);
        break;
    case MT_Q_BLOCK_128X128:
        MT_LAUNCH(grid, (unsigned)threads, 0, stream, q_batch_quantise_kernel<MT_Q_BLOCK_128X128>)(*b, pow2);
        break;
    case MT_Q_MX: MT_LAUNCH(grid, (unsigned)threads, 0, stream, q_batch_quantise_kernel<MT_Q_MX>)(*b, pow2); break;
    case MT_Q_NVFP4:
        MT_LAUNCH(grid, (unsigned)threads, 0, stream, q_batch_quantise_kernel<MT_Q_NVFP4>)(*b, pow2);
        break;
    case MT_Q_NVFP4_2D:
        MT_LAUNCH(grid, (unsigned)threads, 0, stream, q_batch_quantise_kernel<MT_Q_NVFP4_2D>)(*b, pow2);
        break;
    }
    return q_launched("q_batch_quantise_kernel", err);
}

// ---------------------------------------------------------------- scales for cuBLASLt

// cuBLASLt's modes (cublasLtMatmulMatrixScale_t), by value, so that this file needs no
// cuBLASLt header: checked against it in tests/gpu/emu_quant.cc.
enum { Q_LT_VEC16_UE4M3 = 1, Q_LT_VEC32_UE8M0 = 2, Q_LT_VEC128_32F = 4, Q_LT_BLK128X128_32F = 5 };

// The tiled layout of 1-D block scales (VEC32_UE8M0, VEC16_UE4M3), read backwards: the
// byte at offset o of the tiled tensor, whose rows hold sf_inner_dim scales (a multiple
// of 4), is scale (outer, inner) of the operand, or padding (zero). The scale matrix is
// src (its rows: outer_n, inner_n scales each), or its transpose when transposed.
__global__ static void q_tiled_kernel(uint8_t *out, const uint8_t *src, int64_t outer_n, int64_t inner_n,
                                      int64_t sf_inner_dim, int64_t bytes, int transposed)
{
    const int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= bytes) return;
    const int64_t tile = o / 512, w = o % 512, tiles_per_row = sf_inner_dim / 4;
    const int64_t outer = tile / tiles_per_row * 128 + (w % 16) / 4 * 32 + w / 16;
    const int64_t inner = tile % tiles_per_row * 4 + w % 4;
    uint8_t v = 0;
    if (outer < outer_n && inner < inner_n) v = transposed ? src[inner * outer_n + outer] : src[outer * inner_n + inner];
    out[o] = v;
}

// VEC128_32F: out[b * rows + r] = scale[r * scols + b].
__global__ static void q_vec128_kernel(float *out, const float *scale, int64_t rows, int64_t scols)
{
    const int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= rows * scols) return;
    out[o] = scale[(o % rows) * scols + o / rows];
}

// BLK128x128_32F: out[p * l4 + b] = scale[p * scols + b], zero for b >= scols.
__global__ static void q_blk128_kernel(float *out, const float *scale, int64_t srows, int64_t scols, int64_t l4)
{
    const int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= srows * l4) return;
    const int64_t p = o / l4, b = o % l4;
    out[o] = b < scols ? scale[p * scols + b] : 0.0f;
}

extern "C" int mt_cuda_q_cublaslt_scale_mode(const struct mt_cuda_qtensor *q, int32_t *mode, size_t *bytes,
                                             struct mt_err *err)
{
    const bool col = q->scaling == MT_Q_MX && q->along == MT_Q_ALONG_COL;
    const int64_t outer = col ? q->cols : q->rows, inner = col ? q->srows : q->scols;
    const int64_t l4 = (q->scols + 3) / 4 * 4;
    switch (q->scaling) {
    case MT_Q_TENSOR:
        return mt_err_set(err, MT_EINVAL, "cuBLASLt scales: a tensorwise tensor has no block scales (pass its "
                          "scale as the scalar mode's pointer)");
    case MT_Q_BLOCK_1X128:
        if (q->rows % 4)
            return mt_err_set(err, MT_EINVAL, "cuBLASLt scales: VEC128_32F needs the operand's M or N (%lld rows) "
                              "to be a multiple of 4", (long long)q->rows);
        *mode = Q_LT_VEC128_32F;
        *bytes = (size_t)(q->rows * q->scols) * sizeof(float);
        return MT_OK;
    case MT_Q_BLOCK_128X128:
        *mode = Q_LT_BLK128X128_32F;
        *bytes = (size_t)(q->srows * l4) * sizeof(float);
        return MT_OK;
    case MT_Q_MX:
    case MT_Q_NVFP4:
    case MT_Q_NVFP4_2D:
        *mode = q->scaling == MT_Q_MX ? Q_LT_VEC32_UE8M0 : Q_LT_VEC16_UE4M3;
        *bytes = (size_t)((outer + 127) / 128 * 128 * ((inner + 3) / 4 * 4));
        return MT_OK;
    }
    return mt_err_set(err, MT_EINVAL, "cuBLASLt scales: unknown scaling %d", (int)q->scaling);
}

extern "C" int mt_cuda_q_cublaslt_scales(void *out, const struct mt_cuda_qtensor *q, cudaStream_t stream,
                                         struct mt_err *err)
{
    int32_t mode;
    size_t bytes;
    int rc = mt_cuda_q_cublaslt_scale_mode(q, &mode, &bytes, err);
    if (rc) return rc;
    if ((uintptr_t)out % 16)
        return mt_err_set(err, MT_EINVAL, "cuBLASLt scales: the output at %p is not 16-byte aligned (cuBLASLt "
                          "requires it of scale tensors)", out);
    if (mode == Q_LT_VEC128_32F) {
        MT_LAUNCH(q_cdiv(q->rows * q->scols, MT_Q_THREADS), MT_Q_THREADS, 0, stream, q_vec128_kernel)(
            (float *)out, q->scale, q->rows, q->scols);
        return q_launched("q_vec128_kernel", err);
    }
    if (mode == Q_LT_BLK128X128_32F) {
        const int64_t l4 = (q->scols + 3) / 4 * 4;
        MT_LAUNCH(q_cdiv(q->srows * l4, MT_Q_THREADS), MT_Q_THREADS, 0, stream, q_blk128_kernel)(
            (float *)out, q->scale, q->srows, q->scols, l4);
        return q_launched("q_blk128_kernel", err);
    }
    const bool col = q->scaling == MT_Q_MX && q->along == MT_Q_ALONG_COL;
    const int64_t outer = col ? q->cols : q->rows, inner = col ? q->srows : q->scols;
    MT_LAUNCH(q_cdiv((int64_t)bytes, MT_Q_THREADS), MT_Q_THREADS, 0, stream, q_tiled_kernel)(
        (uint8_t *)out, q->scale8, outer, inner, (inner + 3) / 4 * 4, (int64_t)bytes, (int)col);
    return q_launched("q_tiled_kernel", err);
}

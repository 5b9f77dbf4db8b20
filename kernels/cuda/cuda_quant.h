/* moetrain: the FP8/FP4 recipes' quantisers on the GPU (kernels/cuda/cuda_quant.cu;
 * doc/fp8.md, "On the GPU").
 *
 * Every quantiser writes exactly the bytes and scales its CPU reference
 * (kernels/cpu/cpu_quant.c, kernels/quant_recipe.h) writes for the same input: the same
 * layout, the codecs and scale rules of kernels/quant.h (shared by both), the same
 * stochastic-rounding bytes (element i = r * cols + c draws mt_q_random_byte(seed,
 * stream, i); an NVFP4 part of a logical tensor, its index there: struct
 * mt_cuda_q_place), the same amax (NaN if any element is NaN). tests/gpu/emu_quant checks it
 * byte for byte under the CUDA emulator.
 *
 * Nothing here waits for the device: every function queues its work on the stream it is
 * given, and the scalars a recipe computes from the data (amax, the tensorwise scale,
 * NVFP4's per-tensor scale, the delayed-scaling history) stay in device memory. The
 * arguments are checked on the host (MT_EINVAL naming the argument); a launch the
 * runtime refuses is MT_ERUNTIME naming the kernel.
 *
 * Pointers are device memory unless said otherwise. x is a (rows, cols) fp32 view with
 * row stride ld, as the CPU quantisers read it. */
#ifndef MT_KERNELS_CUDA_QUANT_H
#define MT_KERNELS_CUDA_QUANT_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/quant_recipe.h"

/* A quantised tensor in device memory: struct mt_qtensor's layout (kernels/
 * quant_recipe.h), except that NVFP4's per-tensor decode scale is a device float
 * (global), which a kernel computes from the data's amax. The caller allocates the
 * buffers: mt_cuda_qtensor_layout gives their sizes. */
struct mt_cuda_qtensor {
    enum mt_q_scaling scaling;
    enum mt_q_elem elem;
    enum mt_q_dim along;
    int64_t rows, cols;
    int64_t srows, scols;
    size_t data_bytes, scale_bytes; /* scale_bytes: of scale (fp32) or scale8 (bytes) */
    uint8_t *data;
    float *scale;    /* MT_Q_TENSOR and the blockwise scalings */
    uint8_t *scale8; /* MT_Q_MX (UE8M0) and NVFP4 (UE4M3) */
    float *global;   /* NVFP4: one float */
};

/* Fills q's shape, scale shape and buffer sizes for a (rows, cols) tensor of this
 * scaling, element format and block direction (the combinations mt_qtensor_init takes);
 * the pointers are set to NULL. */
int mt_cuda_qtensor_layout(struct mt_cuda_qtensor *q, enum mt_q_scaling scaling, enum mt_q_elem elem,
                           enum mt_q_dim along, int64_t rows, int64_t cols, struct mt_err *err);

/* *amax = the largest |x| (mt_q_amax): a reduction of integer maxima of the magnitudes'
 * bit patterns, exact and independent of the order; NaN (0x7fc00000) if one is NaN. */
int mt_cuda_q_amax(float *amax, const float *x, int64_t rows, int64_t cols, int64_t ld, cudaStream_t stream,
                   struct mt_err *err);

/* Tensorwise (current) scaling: *scale = mt_q_tensor_scale(*amax, fmax, margin). */
int mt_cuda_q_tensor_scale(float *scale, const float *amax, float fmax, int margin, cudaStream_t stream,
                           struct mt_err *err);

/* Tensorwise and delayed scaling: mt_quant_tensorwise with the encode scale read from
 * device memory (*scale, from mt_cuda_q_tensor_scale or a history's scale). */
int mt_cuda_quant_tensorwise(const struct mt_cuda_qtensor *q, const float *x, int64_t ld, const float *scale,
                             enum mt_q_round rnd, struct mt_q_seed seed, uint32_t stream_id, cudaStream_t stream,
                             struct mt_err *err);

/* Delayed scaling's amax history (struct mt_amax_history) with the amaxes and the scale
 * in device memory; len, count and latest advance on the host with each update, as
 * they do on the CPU, so no update waits for the device. */
struct mt_cuda_amax_history {
    int len, count, latest;
    enum mt_amax_algo algo;
    float fmax;
    int margin;
    float *amax;  /* len floats, zero at the start */
    float *scale; /* one float, 1 at the start */
};
int mt_cuda_amax_history_init(struct mt_cuda_amax_history *h, int len, enum mt_amax_algo algo, float fmax,
                              int margin, cudaStream_t stream, struct mt_err *err);
void mt_cuda_amax_history_free(struct mt_cuda_amax_history *h);
/* Records *amax (the step's, from mt_cuda_q_amax) and recomputes *h->scale. */
int mt_cuda_amax_history_update(struct mt_cuda_amax_history *h, const float *amax, cudaStream_t stream,
                                struct mt_err *err);

/* Where a tensor lies in a logical tensor it is a part of (a shard of tensor or
 * expert-tensor parallelism, in the orientation it is quantised in; doc/fp8.md
 * "Parallel layouts"): its element (r, c) is element (row0 + r, col0 + c) of the
 * logical tensor, whose rows are lcols long, and draws that element's random bits,
 * mt_q_random_byte(seed, stream, (row0 + r) * lcols + col0 + c); tensor_amax, one
 * device float or NULL: the logical tensor's amax, which the per-tensor scale comes
 * from (the larger of it and the part's own, as the CPU's qdq finds it with the amax
 * planted beside the shard in a zero tensor of the logical shape). The part's blocks
 * are the logical tensor's when row0 and col0 fall on block boundaries (the caller's
 * to ensure). A NULL place: the tensor is the whole. */
struct mt_cuda_q_place {
    int64_t row0, col0, lcols;
    const float *tensor_amax;
};

/* Blockwise (1 x 128 and 128 x 128), MXFP8 (along q->along) and NVFP4 (16 and 16 x 16):
 * mt_quant_blockwise, mt_quant_mxfp8, mt_quant_nvfp4; NVFP4 of a part of a logical
 * tensor with its place (else NULL). */
int mt_cuda_quant_blockwise(const struct mt_cuda_qtensor *q, const float *x, int64_t ld, int pow2,
                            cudaStream_t stream, struct mt_err *err);
int mt_cuda_quant_mxfp8(const struct mt_cuda_qtensor *q, const float *x, int64_t ld, cudaStream_t stream,
                        struct mt_err *err);
int mt_cuda_quant_nvfp4(const struct mt_cuda_qtensor *q, const float *x, int64_t ld, enum mt_q_round rnd,
                        struct mt_q_seed seed, uint32_t stream_id, const struct mt_cuda_q_place *place,
                        cudaStream_t stream, struct mt_err *err);

/* A batch of tensors quantised together, one launch a stage whatever their number (the
 * routed experts' operands of the grouped quantised GEMM, cuda_qdq.cu): every tensor of
 * one scaling, element format and block direction, each with its own buffers, shape,
 * place and scale state, each quantised exactly as its own calls of the functions
 * above quantise it (the same codes, scales, amax and records). A tensor of the batch: */
#define MT_CUDA_Q_BATCH_MAX 64
struct mt_cuda_q_item {
    const float *x;           /* (q.rows, q.cols) fp32, row stride ld */
    int64_t ld;
    struct mt_cuda_qtensor q; /* its layout and buffers (q.scaling etc. the batch's) */
    float *record;            /* delayed scaling's amax record: max-ed with its amax, or NULL */
    const float *scale;       /* tensorwise: the encode scale (delayed), else NULL: current
                               * scaling's, mt_q_tensor_scale of tensor_amax */
    const float *tensor_amax; /* current scaling: the amax its scale comes from (the logical
                               * tensor's), else NULL: its own (mt_cuda_q_batch_amax's);
                               * NVFP4: joined with its own (struct mt_cuda_q_place) */
    struct mt_cuda_q_place place; /* NVFP4: its place (0, 0, q.cols for a whole tensor;
                                   * place.tensor_amax unused) */
    int rht;                  /* NVFP4: 0, or 1 + the mt_q_dim of its Hadamard transform
                               * (mt_cuda_q_rht of x, (q.rows, q.cols / 16 * 16) along
                               * the rows or (q.rows / 16 * 16, q.cols) along the columns) */
    uint32_t rht_stream;      /* the signs' stream: mt_q_hadamard_signs(seed, rht_stream) */
    int margin;
    enum mt_q_round rnd;      /* stochastic rounding's seed (and the signs') and stream */
    struct mt_q_seed seed;
    uint32_t stream_id;
};
struct mt_cuda_q_batch {
    int n; /* at most MT_CUDA_Q_BATCH_MAX */
    enum mt_q_scaling scaling;
    enum mt_q_elem elem;
    enum mt_q_dim along;
    float *amax; /* n device floats: the tensors' own amaxes (mt_cuda_q_batch_amax) */
    struct mt_cuda_q_item t[MT_CUDA_Q_BATCH_MAX];
};
/* The Hadamard transforms of the tensors that have one (rht), in place: one launch. */
int mt_cuda_q_batch_rht(const struct mt_cuda_q_batch *b, cudaStream_t stream, struct mt_err *err);
/* Whether the batch needs its tensors' own amaxes: an amax record, a current scale
 * without a tensor amax, NVFP4. */
int mt_cuda_q_batch_needs_amax(const struct mt_cuda_q_batch *b);
/* b->amax[i] = the amax of tensor i (mt_cuda_q_amax): one memset and one launch. */
int mt_cuda_q_batch_amax(const struct mt_cuda_q_batch *b, cudaStream_t stream, struct mt_err *err);
/* Every tensor quantised (mt_cuda_quant_tensorwise with its scale, current scaling's
 * computed from its amax as mt_cuda_q_tensor_scale does; mt_cuda_quant_blockwise with
 * pow2; mt_cuda_quant_mxfp8; mt_cuda_quant_nvfp4 at its place, q.global its per-tensor
 * decode scale), and the amax records made in the batch's order (as calls
 * one tensor after the other make them): one launch, after mt_cuda_q_batch_amax where
 * the batch needs it. */
int mt_cuda_q_batch_quantise(const struct mt_cuda_q_batch *b, int pow2, cudaStream_t stream, struct mt_err *err);

/* NVFP4's random Hadamard transform, in place: mt_q_rht (each thread draws the signs from
 * the seed as it runs: one Philox draw a 16-element chunk). */
int mt_cuda_q_rht(float *x, int64_t rows, int64_t cols, int64_t ld, enum mt_q_dim dim, struct mt_q_seed seed,
                  uint32_t stream_id, cudaStream_t stream, struct mt_err *err);

/* Block scales in the order cuBLASLt's block-scaled GEMMs read them, for q used as the A
 * or B operand of a "TN" GEMM or, quantised along its columns (MT_Q_MX, MT_Q_ALONG_COL),
 * as an operand whose reduction runs along its rows:
 *   MT_Q_BLOCK_1X128    CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: fp32, outer-major,
 *                       scale (outer o, block b) at b * rows + o; rows a multiple of 4
 *   MT_Q_BLOCK_128X128  CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: fp32, K-major with
 *                       the column stride L4 = ceil(scols / 4) * 4, zero padded
 *   MT_Q_MX             CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 and
 *   MT_Q_NVFP4(_2D)     CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3: the tiled layout, 128
 *                       outer x 4 inner scales a 512-byte tile, tiles row-major, the
 *                       scales padded with zeros to whole tiles
 * (outer: the operand's M or N index, inner: its block index along K.) MT_Q_TENSOR has
 * no block scales (its scale is the scalar mode's pointer). */
int mt_cuda_q_cublaslt_scale_mode(const struct mt_cuda_qtensor *q, int32_t *mode, size_t *bytes,
                                  struct mt_err *err);
int mt_cuda_q_cublaslt_scales(void *out, const struct mt_cuda_qtensor *q, cudaStream_t stream, struct mt_err *err);

#ifdef __cplusplus
}
#endif

#endif

// CUDA backend: the device helpers of the quantisers (cuda_quant.cu) that a producer
// kernel also runs when it emits the quantisation of its output in its own pass
// (cuda_layers.cu: RMSNorm and SwiGLU; doc/fp8.md, "Quantisation fused with its
// producer"). One definition of the magnitudes' order, a block's scale and its codes, so
// that a fused producer writes exactly the bytes the quantiser writes from memory.
#ifndef MT_KERNELS_CUDA_QROW_CUH
#define MT_KERNELS_CUDA_QROW_CUH

#include "kernels/cuda/cuda_quant.h"

#include <cuda_runtime.h>
#include <stdint.h>

// |x| as bits, a NaN made the canonical 0x7fc00000: bits of magnitudes compare as the
// magnitudes do, and a NaN is above every other, so the largest is the CPU's amax.
__device__ __forceinline__ uint32_t q_mag_bits(float x)
{
    const uint32_t m = mt_q_bits(x) & 0x7fffffffu;
    return m > 0x7f800000u ? MT_Q_NAN : m;
}
__device__ __forceinline__ uint32_t q_umax(uint32_t a, uint32_t b) { return a > b ? a : b; }
__device__ __forceinline__ uint32_t q_warp_umax(uint32_t v)
{
    for (int o = 16; o > 0; o >>= 1) v = q_umax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// One E4M3 or E5M2 element, saturating (cpu_quant.c's put).
__device__ __forceinline__ uint8_t q_fp8(float v, enum mt_q_elem elem, enum mt_q_round rnd, uint32_t rbits)
{
    return elem == MT_Q_ELEM_E4M3 ? mt_e4m3_from_float(v, 1, rnd, rbits) : mt_e5m2_from_float(v, 1, rnd, rbits);
}

// One block of 32 E4M3 elements along a row, a lane an element (v; in: the element
// exists): its UE8M0 scale (returned to every lane) and the lane's code into *code.
__device__ __forceinline__ uint8_t q_mx_block_warp(float v, bool in, uint8_t *code)
{
    const uint8_t s = mt_q_mx_scale(mt_q_float(q_warp_umax(in ? q_mag_bits(v) : 0u)));
    if (in) *code = mt_e4m3_from_float(__fmul_rn(v, mt_q_mx_element_scale(s)), 1, MT_Q_RN, 0);
    return s;
}

// What a producer emits for the quantisation of its (rows, cols) output (struct
// mt_quant_ops rmsnorm_fwd, swiglu_fwd): under MT_Q_TENSOR the amax (bits of a float,
// zero before the producer runs), under the row-local block scalings the codes (rows,
// cols) and the decode scales, fp32 (1 x 128 tiles) or UE8M0 (MXFP8's 32), as
// mt_cuda_quant_blockwise (pow2) and mt_cuda_quant_mxfp8 along the rows write them.
struct mt_cuda_qrow {
    enum mt_q_scaling scaling; // MT_Q_TENSOR, MT_Q_BLOCK_1X128 or MT_Q_MX (along the rows)
    uint32_t *amax;
    uint8_t *data;
    float *scale;
    uint8_t *scale8;
    int64_t scols;
};

struct mt_quant_spec;
// What the producer of the (rows, cols) tensor emits for its quantisation under s
// (mt_quant_fusable; else fatal, naming op) into fused: the copy's codes and scales where
// the quantised GEMM reads a copy that save wrote under s (block scalings), or the amax,
// one float, zeroed on stream (MT_Q_TENSOR). cuda_qdq.cu.
mt_cuda_qrow mt_cuda_qrow_place(const char *op, const struct mt_quant_spec *s, void *fused, int64_t rows,
                                int64_t cols, cudaStream_t stream);

// A warp's row `row` of C elements, value(c) the element the producer stores at column
// c (as stored: rounded to out's dtype) and writes; each column's value is asked for
// once, by lane c % 32 (1 x 128 tiles: the tile's four columns of the lane in a row).
// The amax, scales and codes are the quantisers' (cuda_quant.cu): the same maximum of
// magnitudes' bit patterns over the same elements, the same scale rule, the same codes.
template <typename F>
__device__ __forceinline__ void q_row_warp(const mt_cuda_qrow &q, int64_t row, int C, F value)
{
    const int lane = threadIdx.x & 31;
    switch (q.scaling) {
    case MT_Q_TENSOR: {
        uint32_t m = 0;
        for (int c = lane; c < C; c += 32) m = q_umax(m, q_mag_bits(value(c)));
        m = q_warp_umax(m);
        if (lane == 0) atomicMax(q.amax, m);
        break;
    }
    case MT_Q_BLOCK_1X128:
        for (int c0 = 0; c0 < C; c0 += 128) {
            float v[4];
            uint32_t m = 0;
            for (int t = 0; t < 4; t++) {
                const int c = c0 + 32 * t + lane;
                v[t] = c < C ? value(c) : 0.0f;
                if (c < C) m = q_umax(m, q_mag_bits(v[t]));
            }
            const float s = mt_q_block_scale(mt_q_float(q_warp_umax(m)), MT_E4M3_MAX, 1);
            for (int t = 0; t < 4; t++) {
                const int c = c0 + 32 * t + lane;
                if (c < C) q.data[row * C + c] = q_fp8(__fmul_rn(v[t], s), MT_Q_ELEM_E4M3, MT_Q_RN, 0);
            }
            if (lane == 0) q.scale[row * q.scols + c0 / 128] = __fdiv_rn(1.0f, s);
        }
        break;
    default: // MT_Q_MX
        for (int c0 = 0; c0 < C; c0 += 32) {
            const int c = c0 + lane;
            const bool in = c < C;
            const float v = in ? value(c) : 0.0f;
            const uint8_t s = q_mx_block_warp(v, in, q.data + row * C + c);
            if (lane == 0) q.scale8[row * q.scols + c0 / 32] = s;
        }
        break;
    }
}

#endif

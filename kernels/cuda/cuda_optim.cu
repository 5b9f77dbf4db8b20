// CUDA backend: AdamW, bf16 rounding and dtype conversion, elementwise.
//
// Both are bit-identical to the CPU reference: AdamW performs the same fp32 operations
// in the same order with every product and sum rounded on its own (the _rn intrinsics
// keep nvcc from contracting them into FMAs, which the CPU build, ISO C on x86-64,
// never does), and its step-dependent constants are computed on the host by the same
// expressions (mt_adamw_consts_of); bf16 rounding is round-to-nearest-even through cuda_bf16.h, with NaNs
// quieted and sign kept exactly as the CPU does.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/quant.h"

#include <math.h>
#include <stdio.h>

__device__ __forceinline__ void adamw_at(size_t i, float *param, const float *grad, float *m, float *v,
                                         const mt_adamw_consts &k, float grad_scale)
{
    const float g = __fmul_rn(grad[i], grad_scale);
    const float mi = __fadd_rn(__fmul_rn(k.beta1, m[i]), __fmul_rn(k.one_m_b1, g));
    const float vi = __fadd_rn(__fmul_rn(k.beta2, v[i]), __fmul_rn(__fmul_rn(k.one_m_b2, g), g));
    m[i] = mi;
    v[i] = vi;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
    param[i] = __fsub_rn(__fmul_rn(param[i], k.decay), __fdiv_rn(__fmul_rn(k.step, mi), denom));
}

__global__ static void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n, mt_adamw_consts k,
                                    float grad_scale)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) adamw_at(i, param, grad, m, v, k, grad_scale);
}

extern "C" void mt_cuda_adamw(void *ctx, float *param, const float *grad, float *m, float *v, size_t n, float lr,
                              float beta1, float beta2, float eps, float weight_decay, float grad_scale, long long t)
{
    MT_CUDA_OP(ctx, MT_OP_ADAMW);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (n == 0) return;
    const mt_adamw_consts k = mt_adamw_consts_of(lr, beta1, beta2, eps, weight_decay, t);
    MT_LAUNCH(mt_cdiv(n, 256), 256, 0, c->stream, adamw_kernel)(param, grad, m, v, n, k, grad_scale);
    MT_CUDA_LAUNCHED();
}

// Thread 0 of each block decides the gate from the few scalars (the squared norm, one
// loss sum per micro-batch) and hands it to the block in shared memory: one thread's fp64
// sqrt and quotient and n_loss loads a block, not every thread's (fp64 is slow on most
// GPUs, and the update itself is a few loads and stores an element). sqrt, the sum and
// the quotient in fp64 are correctly rounded on the device as on the host, and there is
// no product to contract.
__global__ static void adamw_dev_kernel(float *param, const float *grad, float *m, float *v, size_t n,
                                        const mt_adamw_consts *k, const double *sumsq, const double *loss,
                                        int loss_stride, int n_loss, double clip)
{
    MT_SHARED(float, grad_scale, [1]);
    MT_SHARED(int, finite, [1]);
    if (threadIdx.x == 0) {
        const double norm = sqrt(*sumsq);
        finite[0] = mt_q_step_taken(sumsq, loss, loss_stride, n_loss);
        grad_scale[0] = clip > 0 && norm > clip ? (float)(clip / (norm + 1e-6)) : 1.0f;
    }
    __syncthreads();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !finite[0]) return;
    adamw_at(i, param, grad, m, v, *k, grad_scale[0]);
}

extern "C" void mt_cuda_adamw_dev(void *ctx, float *param, const float *grad, float *m, float *v, size_t n,
                                  const mt_adamw_consts *k, const double *sumsq, const double *loss, int loss_stride,
                                  int n_loss, double clip)
{
    MT_CUDA_OP(ctx, MT_OP_ADAMW_DEV);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (n == 0) return;
    MT_LAUNCH(mt_cdiv(n, 256), 256, 0, c->stream, adamw_dev_kernel)(param, grad, m, v, n, k, sumsq, loss, loss_stride,
                                                                    n_loss, clip);
    MT_CUDA_LAUNCHED();
}

__device__ __forceinline__ float bf16_round(float x)
{
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float((u | 0x00400000u) & 0xffff0000u); // quiet NaN
    return __bfloat162float(__float2bfloat16_rn(x));
}

__global__ static void bf16_round_kernel(float *out, const float *x, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = bf16_round(x[i]);
}

extern "C" void mt_cuda_bf16_round(void *ctx, float *out, const float *x, size_t n)
{
    MT_CUDA_OP(ctx, MT_OP_BF16_ROUND);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (n == 0) return;
    MT_LAUNCH(mt_cdiv(n, 256), 256, 0, c->stream, bf16_round_kernel)(out, x, n);
    MT_CUDA_LAUNCHED();
}

__global__ static void scale_kernel(float *x, float s, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(x[i], s);
}

extern "C" void mt_cuda_scale(void *ctx, float *x, float s, size_t n)
{
    MT_CUDA_OP(ctx, MT_OP_SCALE);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (n == 0 || s == 1.0f) return;
    MT_LAUNCH(mt_cdiv(n, 256), 256, 0, c->stream, scale_kernel)(x, s, n);
    MT_CUDA_LAUNCHED();
}

// Sum of squares in fp64, deterministic: the partition depends on n alone (not on
// the device), each block sums a fixed strided set through a fixed tree, and one block
// adds the partials in block order.
#define MT_SUMSQ_THREADS 256
#define MT_SUMSQ_MAX_BLOCKS 1024

__device__ __forceinline__ double sumsq_block(double v, double *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = mt_warp_sum_d(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0;
    return mt_warp_sum_d(v);
}

__global__ static void sumsq_partial_kernel(double *part, const float *x, size_t n)
{
    MT_SHARED(double, sh, [32]);
    double a = 0.0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const double v = (double)x[i];
        a = __dadd_rn(a, __dmul_rn(v, v));
    }
    a = sumsq_block(a, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = a;
}

__global__ static void sumsq_final_kernel(double *acc, const double *part, int nparts)
{
    MT_SHARED(double, sh, [32]);
    double a = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) a += part[i];
    a = sumsq_block(a, sh);
    if (threadIdx.x == 0) *acc += a;
}

extern "C" void mt_cuda_sumsq(void *ctx, double *acc, const float *x, size_t n)
{
    MT_CUDA_OP(ctx, MT_OP_SUMSQ);
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (n == 0) return;
    size_t blocks = (n + 8 * MT_SUMSQ_THREADS - 1) / (8 * MT_SUMSQ_THREADS);
    if (blocks > MT_SUMSQ_MAX_BLOCKS) blocks = MT_SUMSQ_MAX_BLOCKS;
    double *part = (double *)mt_cuda_scratch(c, sizeof(double) * blocks);
    MT_LAUNCH((unsigned)blocks, MT_SUMSQ_THREADS, 0, c->stream, sumsq_partial_kernel)(part, x, n);
    MT_CUDA_LAUNCHED();
    MT_LAUNCH(1, MT_SUMSQ_THREADS, 0, c->stream, sumsq_final_kernel)(acc, part, (int)blocks);
    MT_CUDA_LAUNCHED();
    mt_cuda_scratch_free(c, part);
}

// ---------------------------------------------------------------- dtype conversion

// dst = src element by element over rows x cols with row strides: fp32 -> bf16 rounds
// (mt_st), bf16 -> fp32 is exact, the same dtype copies the bits (as the CPU's memmove).
template <typename TD, typename TS>
__global__ static void convert_kernel(TD *dst, const TS *src, int64_t rows, int64_t cols, int64_t ldd, int64_t lds)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * cols) return;
    const size_t r = i / cols, col = i % cols;
    if constexpr (std::is_same<TD, TS>::value) dst[r * ldd + col] = src[r * lds + col];
    else mt_st(dst, r * ldd + col, mt_ld(src, r * lds + col));
}

extern "C" void mt_cuda_convert(void *ctx, struct mt_tensor dst, struct mt_tensor src)
{
    MT_CUDA_OP(ctx, MT_OP_CONVERT);
    mt_cuda_ctx *c = mt_cuda(ctx);
    mt_cuda_tensor_check("convert", "dst", dst, false);
    mt_cuda_tensor_check("convert", "src", src, false);
    if (dst.rows != src.rows || dst.cols != src.cols) {
        char msg[160];
        snprintf(msg, sizeof msg, "dst is %lld x %lld, src %lld x %lld: the shapes must agree", (long long)dst.rows,
                 (long long)dst.cols, (long long)src.rows, (long long)src.cols);
        mt_cuda_fatal(__FILE__, __LINE__, "convert", msg);
    }
    if (dst.rows <= 0 || dst.cols <= 0) return;
    const size_t n = (size_t)dst.rows * dst.cols;
    mt_with_elem(dst.dtype, [&](auto d) {
        mt_with_elem(src.dtype, [&](auto s) {
            MT_LAUNCH(mt_cdiv(n, 256), 256, 0, c->stream, convert_kernel<MT_ELEM(d), MT_ELEM(s)>)(
                (MT_ELEM(d) *)dst.data, (const MT_ELEM(s) *)src.data, dst.rows, dst.cols, dst.ld, src.ld);
        });
    });
    MT_CUDA_LAUNCHED();
}

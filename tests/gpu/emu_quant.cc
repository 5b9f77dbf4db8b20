// The FP8/FP4 recipes on the GPU path, under the CUDA emulator (doc/fp8.md, "On the GPU"):
//
//   quant   every device quantiser of kernels/cuda/cuda_quant.cu against its CPU
//           reference (kernels/cpu/cpu_quant.c) byte for byte: data, scales, the
//           per-tensor scales, amax, the delayed-scaling history, the random Hadamard
//           transform; random tensors with edge values (zeros, fp32 subnormals, values
//           past every format's range, infinities, NaN), shapes with partial blocks.
//   order   the block scales arranged for cuBLASLt against a host re-implementation of
//           the layouts cuBLASLt documents (indices to offset; the kernel goes from the
//           offset back to the indices), padding included.
//   qdq     the CUDA backend's qdq op (kernels/cuda/cuda_qdq.cu, what the model's
//           quantised linears call) against the CPU backend's (kernels/cpu/cpu_qdq.c)
//           bit for bit: every recipe's operand specs, blocks along rows and columns,
//           fp32 and bf16 inputs, delayed scaling's scale and amax record, NVFP4's
//           stochastic rounding and Hadamard transform; shapes with partial blocks.
//   gemm    the emulated cuBLASLt's FP8 and FP4 matmuls (each recipe's scale modes) on the
//           device quantisers' output against mt_q_gemm, the CPU reference GEMM, within
//           (K + 4) 2^-24 sum_k |a_k b_k| (the two sum in different orders and precisions:
//           fp32 in K order on the CPU, fp64 rounded once in the emulator), and what the
//           library refuses, with its status. Run twice: on the emulated H100 (tensorwide
//           and blockwise) and, with MT_EMU_DEVICE=gb200, on the GB200 (MXFP8, NVFP4).
//   qgemm   the CUDA backend's quantised GEMM op (struct mt_quant_ops gemm: the device
//           quantisers into one cuBLASLt FP8/FP4 matmul, kernels/cuda/cuda_qdq.cu) against
//           the CPU backend's (qdq of both operands, then its fp32 GEMM) for each recipe's
//           forward, dgrad and wgrad with the model's operand specs, within
//           (K + 4) 2^-24 sum_k |a_k b_k| (+ a bf16 c's ulp, + NVFP4's per-tensor
//           scales' rounding): shapes that need padding (tokens not a multiple of 4 or 16,
//           rows of D not a multiple of 4), fp32 and bf16 operands and c, beta 0 and 1,
//           delayed scaling's scale and amax record; every call one cuBLASLt FP8/FP4
//           matmul (the backend's count), none a dequantised GEMM. qgemm-h100 runs
//           delayed, tensorwise and blockwise; qgemm-gb200 MXFP8, NVFP4 and blockwise
//           (as VEC32_UE8M0: Blackwell has no 1 x 128 or 128 x 128 mode), and NVFP4's
//           forward and wgrad with an operand a tensor-parallel shard.
//
//   grouped the CUDA backend's grouped quantised GEMM (struct mt_quant_ops grouped_gemm,
//           the routed experts' GEMMs of a use in one launch) against the per-expert loop
//           of its quantised GEMM, each recipe's forward, dgrad and wgrad: within
//           (K + 4) 2^-24 sum_k |a_k b_k| (the grouped kernel sums in fp32, the emulated
//           cuBLASLt exactly), one grouped kernel and fewer launches than the loop;
//           as many launches for 16 experts as for 4 (the operands of all the groups
//           quantised in one launch a stage).
//   saved   the CUDA backend's copies saved for backward (save, saved_bytes): the CPU's
//           size, the quantised GEMM reading the copy bit for bit the one quantising x,
//           within the qgemm bound of the CPU backend's GEMM reading its copy.
//   fused   the producers that emit their output's quantisation (struct mt_quant_ops
//           rmsnorm_fwd, swiglu_fwd): their output the plain op's, the codes and scales
//           the CPU's (its save) and the backend's save's, the tensorwise amax the CPU's,
//           the forward GEMM reading them bit for bit the GEMM quantising the output.
//   qdq also quantises halves of a tensor split as tensor parallelism splits it, each
//           with its place and the tensor's amax, under every recipe but delayed (NVFP4
//           with stochastic rounding and the Hadamard transform): the CPU's bits, the
//           whole tensor's.
//
// Usage: emu_quant quant|order|qdq|gemm-h100|gemm-gb200|qgemm-h100|qgemm-gb200|grouped-h100|grouped-gb200|
//        saved-h100|saved-gb200|fused-h100|fused-gb200
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

// kernels.h is C (the CPU backend's qdq is called too): its declarations in extern "C",
// its _Static_assert spelled as C++ does
#define _Static_assert static_assert
extern "C" {
#include "kernels/kernels.h"
}
#undef _Static_assert
#include "kernels/cuda/cuda_quant.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/gpu/emu_test.h"


static void must(int rc, const struct mt_err &err, const char *what)
{
    if (rc) {
        fprintf(stderr, "emu_quant: %s: %s\n", what, err.msg);
        exit(1);
    }
}

static void *dev_alloc(size_t bytes)
{
    void *p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}
template <typename T>
static T *dev_copy(const T *h, size_t n)
{
    T *p = static_cast<T *>(dev_alloc(n * sizeof(T)));
    CHECK_CUDA(cudaMemcpy(p, h, n * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}
template <typename T>
static std::vector<T> host_copy(const T *d, size_t n)
{
    std::vector<T> h(n);
    CHECK_CUDA(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
static uint32_t bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

// ---------------------------------------------------------------- inputs

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd_u64(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double rnd_unit(void) { return (double)(rnd_u64() >> 11) / 9007199254740992.0; }

// What a tensor holds besides random values of spread magnitudes.
enum edges { PLAIN, EDGES, WITH_INF, WITH_NAN, ZEROS };
static const char *edges_name[] = {"plain", "edges", "inf", "nan", "zeros"};

// A (rows, cols) tensor with row stride ld (the padding NaN, never to be read).
static std::vector<float> make_tensor(int64_t rows, int64_t cols, int64_t ld, enum edges e)
{
    std::vector<float> x((size_t)(rows * ld), NAN);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float v;
            if (e == ZEROS) {
                v = (rnd_u64() & 1) ? 0.0f : -0.0f;
            } else {
                // magnitudes from 2^-24 to 2^24 around a per-row level, both signs
                const int level = (int)(r % 7) * 4 - 12;
                v = (float)ldexp(1.0 + rnd_unit(), level + (int)(rnd_u64() % 9) - 4);
                if (rnd_u64() & 1) v = -v;
                if (e != PLAIN) {
                    const uint64_t k = rnd_u64() % 64;
                    if (k == 0) v = 0.0f;
                    else if (k == 1) v = -0.0f;
                    else if (k == 2) v = 1e-40f;               // fp32 subnormal
                    else if (k == 3) v = -3e38f;               // past every format's range
                    else if (k == 4) v = 464.0f;               // E4M3's overflow tie
                    else if (k == 5 && e == WITH_INF) v = -INFINITY;
                    else if (k == 6 && e == WITH_NAN) v = NAN;
                }
            }
            x[(size_t)(r * ld + c)] = v;
        }
    return x;
}

struct shape {
    int64_t rows, cols;
};
static const shape shapes[] = {{1, 1}, {3, 5}, {40, 96}, {33, 64}, {130, 300}, {17, 160}};

// ---------------------------------------------------------------- quantisers

// A CPU tensor and its device twin of one layout.
struct pair {
    struct mt_qtensor h;
    struct mt_cuda_qtensor d;
};
static pair make_pair(enum mt_q_scaling s, enum mt_q_elem e, enum mt_q_dim along, int64_t rows, int64_t cols)
{
    pair p;
    struct mt_err err;
    must(mt_qtensor_init(&p.h, s, e, along, rows, cols, &err), err, "mt_qtensor_init");
    must(mt_cuda_qtensor_layout(&p.d, s, e, along, rows, cols, &err), err, "mt_cuda_qtensor_layout");
    p.d.data = static_cast<uint8_t *>(dev_alloc(p.d.data_bytes));
    if (s == MT_Q_MX || s == MT_Q_NVFP4 || s == MT_Q_NVFP4_2D)
        p.d.scale8 = static_cast<uint8_t *>(dev_alloc(p.d.scale_bytes));
    else
        p.d.scale = static_cast<float *>(dev_alloc(p.d.scale_bytes));
    if (s == MT_Q_NVFP4 || s == MT_Q_NVFP4_2D) p.d.global = static_cast<float *>(dev_alloc(sizeof(float)));
    return p;
}
static void free_pair(pair &p)
{
    mt_qtensor_free(&p.h);
    CHECK_CUDA(cudaFree(p.d.data));
    if (p.d.scale) CHECK_CUDA(cudaFree(p.d.scale));
    if (p.d.scale8) CHECK_CUDA(cudaFree(p.d.scale8));
    if (p.d.global) CHECK_CUDA(cudaFree(p.d.global));
}

// Whether the device tensor holds the CPU tensor's bytes: data, scales, global. Names
// the first difference.
static bool same_bytes(const pair &p, char *why, size_t n)
{
    const std::vector<uint8_t> data = host_copy(p.d.data, p.d.data_bytes);
    for (size_t i = 0; i < p.d.data_bytes; i++)
        if (data[i] != p.h.data[i]) {
            snprintf(why, n, "data byte %zu: device 0x%02x, CPU 0x%02x", i, data[i], p.h.data[i]);
            return false;
        }
    const size_t ns = (size_t)(p.h.srows * p.h.scols);
    if (p.d.scale8) {
        const std::vector<uint8_t> s = host_copy(p.d.scale8, ns);
        for (size_t i = 0; i < ns; i++)
            if (s[i] != p.h.scale8[i]) {
                snprintf(why, n, "scale8 %zu: device 0x%02x, CPU 0x%02x", i, s[i], p.h.scale8[i]);
                return false;
            }
    } else {
        const std::vector<float> s = host_copy(p.d.scale, ns);
        for (size_t i = 0; i < ns; i++)
            if (bits(s[i]) != bits(p.h.scale[i])) {
                snprintf(why, n, "scale %zu: device %a, CPU %a", i, (double)s[i], (double)p.h.scale[i]);
                return false;
            }
    }
    if (p.d.global) {
        const float g = host_copy(p.d.global, 1)[0];
        if (bits(g) != bits(p.h.global)) {
            snprintf(why, n, "global: device %a, CPU %a", (double)g, (double)p.h.global);
            return false;
        }
    }
    snprintf(why, n, "identical");
    return true;
}

static void quant_one_tensor(const shape &sh, enum edges e)
{
    struct mt_err err;
    const int64_t rows = sh.rows, cols = sh.cols, ld = cols + 3;
    const std::vector<float> x = make_tensor(rows, cols, ld, e);
    float *dx = dev_copy(x.data(), x.size());
    char why[160];
    const char *en = edges_name[e];

    // amax and the tensorwise scale
    float *damax = static_cast<float *>(dev_alloc(sizeof(float))), *dscale = static_cast<float *>(dev_alloc(4));
    must(mt_cuda_q_amax(damax, dx, rows, cols, ld, nullptr, &err), err, "mt_cuda_q_amax");
    const float amax = mt_q_amax(x.data(), rows, cols, ld), gamax = host_copy(damax, 1)[0];
    emu_check(bits(gamax) == bits(amax), "amax %lldx%lld %s: device %a, CPU %a", (long long)rows, (long long)cols, en,
          (double)gamax, (double)amax);
    for (int fmt = 0; fmt < 2; fmt++) {
        const enum mt_q_elem el = fmt ? MT_Q_ELEM_E5M2 : MT_Q_ELEM_E4M3;
        const float fmax = fmt ? MT_E5M2_MAX : MT_E4M3_MAX;
        for (int margin = 0; margin < 2; margin++) {
            must(mt_cuda_q_tensor_scale(dscale, damax, fmax, margin, nullptr, &err), err, "tensor scale");
            const float s = mt_q_tensor_scale(amax, fmax, margin), gs = host_copy(dscale, 1)[0];
            emu_check(bits(gs) == bits(s), "tensorwise scale %s %s margin %d: device %a, CPU %a", en,
                  fmt ? "E5M2" : "E4M3", margin, (double)gs, (double)s);
            for (int sr = 0; sr < 2; sr++) {
                pair p = make_pair(MT_Q_TENSOR, el, MT_Q_ALONG_ROW, rows, cols);
                const enum mt_q_round rnd = sr ? MT_Q_SR : MT_Q_RN;
                must(mt_quant_tensorwise(&p.h, x.data(), ld, s, rnd, 77, 5, &err), err, "mt_quant_tensorwise");
                must(mt_cuda_quant_tensorwise(&p.d, dx, ld, dscale, rnd, mt_q_seed{nullptr, 77}, 5, nullptr, &err), err, "tensorwise");
                const bool ok = same_bytes(p, why, sizeof why);
                emu_check(ok, "tensorwise %lldx%lld %s %s margin %d %s: %s", (long long)rows, (long long)cols, en,
                      fmt ? "E5M2" : "E4M3", margin, sr ? "SR" : "RN", why);
                free_pair(p);
            }
        }
        for (int s = 0; s < 2; s++)
            for (int pow2 = 0; pow2 < 2; pow2++) {
                pair p = make_pair(s ? MT_Q_BLOCK_128X128 : MT_Q_BLOCK_1X128, el, MT_Q_ALONG_ROW, rows, cols);
                must(mt_quant_blockwise(&p.h, x.data(), ld, pow2, &err), err, "mt_quant_blockwise");
                must(mt_cuda_quant_blockwise(&p.d, dx, ld, pow2, nullptr, &err), err, "blockwise");
                const bool ok = same_bytes(p, why, sizeof why);
                emu_check(ok, "blockwise %s %lldx%lld %s %s pow2 %d: %s", s ? "128x128" : "1x128", (long long)rows,
                      (long long)cols, en, fmt ? "E5M2" : "E4M3", pow2, why);
                free_pair(p);
            }
    }
    for (int col = 0; col < 2; col++) {
        pair p = make_pair(MT_Q_MX, MT_Q_ELEM_E4M3, col ? MT_Q_ALONG_COL : MT_Q_ALONG_ROW, rows, cols);
        must(mt_quant_mxfp8(&p.h, x.data(), ld, &err), err, "mt_quant_mxfp8");
        must(mt_cuda_quant_mxfp8(&p.d, dx, ld, nullptr, &err), err, "mxfp8");
        const bool ok = same_bytes(p, why, sizeof why);
        emu_check(ok, "mxfp8 along %s %lldx%lld %s: %s", col ? "columns" : "rows", (long long)rows, (long long)cols, en,
              why);
        free_pair(p);
    }
    for (int two = 0; two < 2; two++)
        for (int sr = 0; sr < 2; sr++) {
            pair p = make_pair(two ? MT_Q_NVFP4_2D : MT_Q_NVFP4, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, rows, cols);
            const enum mt_q_round rnd = sr ? MT_Q_SR : MT_Q_RN;
            must(mt_quant_nvfp4(&p.h, x.data(), ld, rnd, 0x1234567890ull, 9, &err), err, "mt_quant_nvfp4");
            // stochastic rounding reads its seed from device memory, as the model's
            // backward passes do (struct mt_quant_spec seed_dev)
            const uint64_t seed = 0x1234567890ull;
            uint64_t *dseed = nullptr;
            if (sr) {
                CHECK_CUDA(cudaMalloc((void **)&dseed, sizeof seed));
                CHECK_CUDA(cudaMemcpy(dseed, &seed, sizeof seed, cudaMemcpyHostToDevice));
            }
            must(mt_cuda_quant_nvfp4(&p.d, dx, ld, rnd, mt_q_seed{dseed, sr ? 0 : seed}, 9, nullptr, nullptr, &err),
                 err, "nvfp4");
            if (dseed) CHECK_CUDA(cudaFree(dseed));
            const bool ok = same_bytes(p, why, sizeof why);
            emu_check(ok, "nvfp4 %s %lldx%lld %s %s: %s", two ? "16x16" : "1x16", (long long)rows, (long long)cols, en,
                  sr ? "SR" : "RN", why);
            free_pair(p);
        }
    CHECK_CUDA(cudaFree(damax));
    CHECK_CUDA(cudaFree(dscale));
    CHECK_CUDA(cudaFree(dx));
}

// The delayed-scaling history: each update's scale, bit for bit, for amaxes that
// include zero, NaN and infinity (which keep the scale) and a window that forgets.
static void quant_history(void)
{
    // after the NaN, smaller amaxes: a window holding the NaN keeps the scale
    const float amaxes[] = {3.0f, 0.0f, 100.0f, NAN, 0.5f, 0.25f, INFINITY, 2.0f, 7.0f, 1e-30f};
    for (int algo = 0; algo < 2; algo++)
        for (int len = 1; len <= 3; len += 2) {
            struct mt_err err;
            struct mt_amax_history h;
            struct mt_cuda_amax_history g;
            const enum mt_amax_algo a = algo ? MT_AMAX_MOST_RECENT : MT_AMAX_MAX;
            must(mt_amax_history_init(&h, len, a, MT_E4M3_MAX, 1, &err), err, "mt_amax_history_init");
            must(mt_cuda_amax_history_init(&g, len, a, MT_E4M3_MAX, 1, nullptr, &err), err, "history init");
            float *dv = static_cast<float *>(dev_alloc(sizeof(float)));
            int bad = 0;
            for (float v : amaxes) {
                CHECK_CUDA(cudaMemcpy(dv, &v, sizeof v, cudaMemcpyHostToDevice));
                mt_amax_history_update(&h, v);
                must(mt_cuda_amax_history_update(&g, dv, nullptr, &err), err, "history update");
                bad += bits(host_copy(g.scale, 1)[0]) != bits(mt_amax_history_scale(&h));
            }
            emu_check(!bad, "delayed history %s len %d: %zu updates, every scale as on the CPU (%d differ)",
                  algo ? "most_recent" : "max", len, sizeof amaxes / sizeof amaxes[0], bad);
            CHECK_CUDA(cudaFree(dv));
            mt_cuda_amax_history_free(&g);
            mt_amax_history_free(&h);
        }
}

static void quant_rht(void)
{
    const shape rs[] = {{16, 48}, {48, 16}, {32, 64}};
    for (const shape &sh : rs)
        for (int col = 0; col < 2; col++) {
            struct mt_err err;
            const int64_t ld = sh.cols + 1;
            std::vector<float> x = make_tensor(sh.rows, sh.cols, ld, EDGES);
            float *dx = dev_copy(x.data(), x.size());
            const enum mt_q_dim dim = col ? MT_Q_ALONG_COL : MT_Q_ALONG_ROW;
            must(mt_q_rht(x.data(), sh.rows, sh.cols, ld, dim, 42, 3, &err), err, "mt_q_rht");
            // the signs' seed in device memory along the columns (the model's wgrad)
            const uint64_t seed = 42;
            uint64_t *dseed = nullptr;
            if (col) {
                CHECK_CUDA(cudaMalloc((void **)&dseed, sizeof seed));
                CHECK_CUDA(cudaMemcpy(dseed, &seed, sizeof seed, cudaMemcpyHostToDevice));
            }
            must(mt_cuda_q_rht(dx, sh.rows, sh.cols, ld, dim, mt_q_seed{dseed, col ? 0 : seed}, 3, nullptr, &err), err,
                 "rht");
            if (dseed) CHECK_CUDA(cudaFree(dseed));
            const std::vector<float> g = host_copy(dx, x.size());
            int bad = 0;
            for (size_t i = 0; i < x.size(); i++) bad += bits(g[i]) != bits(x[i]);
            emu_check(!bad, "random Hadamard transform %lldx%lld along %s: every element as on the CPU (%d differ)",
                  (long long)sh.rows, (long long)sh.cols, col ? "columns" : "rows", bad);
            CHECK_CUDA(cudaFree(dx));
        }
    struct mt_err err;
    float *dx = static_cast<float *>(dev_alloc(4 * 20 * sizeof(float)));
    emu_check(mt_cuda_q_rht(dx, 4, 20, 20, MT_Q_ALONG_ROW, mt_q_seed{nullptr, 1}, 1, nullptr, &err) == MT_EINVAL && strstr(err.msg, "20"),
          "random Hadamard transform refuses 20 columns: %s", err.msg);
    CHECK_CUDA(cudaFree(dx));
}

static void run_quant(void)
{
    for (const shape &sh : shapes)
        for (int e = PLAIN; e <= ZEROS; e++) quant_one_tensor(sh, (enum edges)e);
    quant_history();
    quant_rht();
}

// ---------------------------------------------------------------- qdq

// One operand spec of the model's recipes (model_lowp.c's spec()), with a name.
struct qdq_case {
    const char *name;
    struct mt_quant_spec s;
    bool delayed; // s.scale and s.amax set (device and host twins made per run)
};

static std::vector<qdq_case> qdq_cases(void)
{
    std::vector<qdq_case> v;
    auto add = [&](const char *name, enum mt_q_scaling sc, enum mt_q_elem el, enum mt_q_dim along,
                   enum mt_q_round rnd, bool rht, int margin, bool delayed) {
        qdq_case c = {};
        c.name = name;
        c.s.scaling = sc;
        c.s.elem = el;
        c.s.along = along;
        c.s.rnd = rnd;
        c.s.seed = 0x1234567890abcdefull;
        c.s.stream = 77;
        c.s.rht = rht;
        c.s.rht_stream = 5;
        c.s.margin = margin;
        c.delayed = delayed;
        v.push_back(c);
    };
    add("tensorwise E4M3", MT_Q_TENSOR, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, MT_Q_RN, false, 0, false);
    add("tensorwise E5M2 margin 1", MT_Q_TENSOR, MT_Q_ELEM_E5M2, MT_Q_ALONG_ROW, MT_Q_RN, false, 1, false);
    add("delayed E4M3 (scale, amax record)", MT_Q_TENSOR, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, MT_Q_RN, false, 0, true);
    add("delayed E5M2 (scale, amax record)", MT_Q_TENSOR, MT_Q_ELEM_E5M2, MT_Q_ALONG_ROW, MT_Q_RN, false, 0, true);
    add("blockwise 1x128 along rows", MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, MT_Q_RN, false, 0, false);
    add("blockwise 1x128 along columns", MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_COL, MT_Q_RN, false, 0, false);
    add("blockwise 128x128", MT_Q_BLOCK_128X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, MT_Q_RN, false, 0, false);
    add("mxfp8 along rows", MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, MT_Q_RN, false, 0, false);
    add("mxfp8 along columns", MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_COL, MT_Q_RN, false, 0, false);
    add("nvfp4 1x16 along rows", MT_Q_NVFP4, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, MT_Q_RN, false, 0, false);
    add("nvfp4 1x16 along rows, stochastic", MT_Q_NVFP4, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, MT_Q_SR, false, 0, false);
    add("nvfp4 along columns, Hadamard (wgrad x)", MT_Q_NVFP4, MT_Q_ELEM_E2M1, MT_Q_ALONG_COL, MT_Q_RN, true, 0, false);
    add("nvfp4 along columns, Hadamard, stochastic (wgrad dy)", MT_Q_NVFP4, MT_Q_ELEM_E2M1, MT_Q_ALONG_COL, MT_Q_SR,
        true, 0, false);
    add("nvfp4 16x16 (weights)", MT_Q_NVFP4_2D, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, MT_Q_RN, false, 0, false);
    return v;
}

// x as bf16 bits: the high halves, rounded to nearest even (NaN kept NaN)
static std::vector<uint16_t> to_bf16(const std::vector<float> &x)
{
    std::vector<uint16_t> b(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        const uint32_t u = bits(x[i]);
        b[i] = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u | 0x00400000u) >> 16)
                                               : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return b;
}

static void qdq_one(const struct mt_kernels *gpu, const struct mt_kernels *cpu, const qdq_case &qc, const shape &sh,
                    enum edges e, bool bf16)
{
    const int64_t R = sh.rows, C = sh.cols;
    const size_t n = (size_t)(R * C);
    const std::vector<float> x = make_tensor(R, C, C, e);
    const std::vector<uint16_t> xb = to_bf16(x);
    const enum mt_dtype dt = bf16 ? MT_BF16 : MT_F32;
    const void *hx = bf16 ? (const void *)xb.data() : (const void *)x.data();
    const size_t xbytes = n * (bf16 ? 2 : 4);
    // CPU
    std::vector<float> hout(n);
    float hscale = 3.5f, hamax = 0.75f; // the delayed scale; an amax recorded before
    struct mt_quant_spec hs = qc.s;
    if (qc.delayed) hs.scale = &hscale, hs.amax = &hamax;
    cpu->quant->qdq(cpu->ctx, &hs, mt_f32(hout.data(), R, C), mt_tview(hx, dt, R, C));
    // GPU
    void *dx = gpu->op.alloc(gpu->ctx, xbytes);
    float *dout = static_cast<float *>(gpu->op.alloc(gpu->ctx, n * sizeof(float)));
    float *dsa = static_cast<float *>(gpu->op.alloc(gpu->ctx, 2 * sizeof(float)));
    const float sa[2] = {3.5f, 0.75f};
    gpu->op.copy(gpu->ctx, dx, hx, xbytes); // the backend's copies: ordered on its stream
    gpu->op.copy(gpu->ctx, dsa, sa, sizeof sa);
    struct mt_quant_spec ds = qc.s;
    if (qc.delayed) ds.scale = dsa, ds.amax = dsa + 1;
    // the bf16 runs pass a work buffer of the bound (as the model does); the fp32 ones
    // leave the scratch to the backend's allocator
    if (bf16) {
        ds.work_bytes = mt_quant_scratch_bytes(n);
        ds.work = gpu->op.alloc(gpu->ctx, ds.work_bytes);
    }
    gpu->quant->qdq(gpu->ctx, &ds, mt_f32(dout, R, C), mt_tview(dx, dt, R, C));
    std::vector<float> g(n), gsa(2);
    gpu->op.copy(gpu->ctx, g.data(), dout, n * sizeof(float));
    gpu->op.copy(gpu->ctx, gsa.data(), dsa, 2 * sizeof(float));
    int bad = 0;
    size_t first = 0;
    for (size_t i = 0; i < n; i++)
        if (bits(g[i]) != bits(hout[i]) && !bad++) first = i;
    if (qc.delayed && bits(gsa[1]) != bits(hamax)) bad++;
    char why[160] = "";
    if (bad && first < n)
        snprintf(why, sizeof why, "; first at %zu: %a, the CPU %a", first, (double)g[first], (double)hout[first]);
    emu_check(!bad, "qdq %s, %lldx%lld %s %s: every value%s as on the CPU (%d differ%s)", qc.name, (long long)R,
              (long long)C, edges_name[e], bf16 ? "bf16, work buffer" : "fp32", qc.delayed ? " and the amax recorded" : "", bad,
              why);
    gpu->op.free(gpu->ctx, dx);
    gpu->op.free(gpu->ctx, dout);
    gpu->op.free(gpu->ctx, dsa);
    if (ds.work) gpu->op.free(gpu->ctx, ds.work);
}

// A shard of a logical (LR, LC) tensor, split in two along the rows (rows) or the
// columns, as tensor parallelism splits one (doc/fp8.md "Parallel layouts"): each half
// quantised by the CUDA backend's qdq with its place and the tensor's amax (struct
// mt_quant_spec lrows.., tensor_amax) gives the CPU backend's bits for the same half,
// and those are the whole tensor's quantisation there (the CPU's qdq of the whole):
// NVFP4's stochastic rounding by the elements' indices in the whole tensor, its fp32
// scale from the whole's amax (after the Hadamard transform, which the qdq of the whole
// records, as the model's probe of each shard does before the group's max).
static void qdq_shard(const struct mt_kernels *gpu, const struct mt_kernels *cpu, const qdq_case &qc, int64_t LR,
                      int64_t LC, bool rows)
{
    const std::vector<float> x = make_tensor(LR, LC, LC, PLAIN);
    const size_t nl = (size_t)(LR * LC);
    std::vector<float> whole(nl);
    float amax = 0.0f;
    struct mt_quant_spec ws = qc.s;
    ws.amax = &amax;
    cpu->quant->qdq(cpu->ctx, &ws, mt_f32(whole.data(), LR, LC), mt_f32(x.data(), LR, LC));
    float *damax = static_cast<float *>(gpu->op.alloc(gpu->ctx, sizeof(float)));
    gpu->op.copy(gpu->ctx, damax, &amax, sizeof amax);
    const int64_t R = rows ? LR / 2 : LR, C = rows ? LC : LC / 2;
    const size_t n = (size_t)(R * C);
    void *dx = gpu->op.alloc(gpu->ctx, n * sizeof(float));
    float *dout = static_cast<float *>(gpu->op.alloc(gpu->ctx, n * sizeof(float)));
    int bad_cpu = 0, bad_whole = 0;
    for (int half = 0; half < 2; half++) {
        std::vector<float> xs(n), hout(n), g(n);
        const int64_t r0 = rows ? half * R : 0, c0 = rows ? 0 : half * C;
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) xs[(size_t)(r * C + c)] = x[(size_t)((r0 + r) * LC + c0 + c)];
        struct mt_quant_spec hs = qc.s;
        hs.lrows = LR, hs.lcols = LC, hs.row0 = r0, hs.col0 = c0;
        struct mt_quant_spec ds = hs;
        // the shard's per-tensor scale from the tensor's amax (current scaling, NVFP4)
        if (qc.s.scaling == MT_Q_TENSOR || mt_q_is_nvfp4(qc.s.scaling)) hs.tensor_amax = &amax, ds.tensor_amax = damax;
        cpu->quant->qdq(cpu->ctx, &hs, mt_f32(hout.data(), R, C), mt_f32(xs.data(), R, C));
        gpu->op.copy(gpu->ctx, dx, xs.data(), n * sizeof(float));
        gpu->quant->qdq(gpu->ctx, &ds, mt_f32(dout, R, C), mt_f32(static_cast<const float *>(dx), R, C));
        gpu->op.copy(gpu->ctx, g.data(), dout, n * sizeof(float));
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) {
                const size_t i = (size_t)(r * C + c);
                bad_cpu += bits(g[i]) != bits(hout[i]);
                bad_whole += bits(g[i]) != bits(whole[(size_t)((r0 + r) * LC + c0 + c)]);
            }
    }
    emu_check(!bad_cpu && !bad_whole, "qdq %s, halves of %lldx%lld split along the %s: every value as on the CPU "
              "(%d differ) and as in the whole tensor's quantisation (%d differ)", qc.name, (long long)LR,
              (long long)LC, rows ? "rows" : "columns", bad_cpu, bad_whole);
    for (void *p : {dx, (void *)dout, (void *)damax}) gpu->op.free(gpu->ctx, p);
}

// amax_nan_to_inf on 300 amaxes (two blocks of the launch), NaNs of both signs and
// payloads, infinity, zero, the largest finite and ordinary values among them: the CPU
// backend's bits.
static void amax_nan_to_inf_case(const struct mt_kernels *gpu, const struct mt_kernels *cpu)
{
    const uint32_t special[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7f800000u, 0u, 0x7f7fffffu};
    std::vector<float> h(300);
    for (size_t i = 0; i < h.size(); i++) h[i] = (float)rnd_unit() * 100.0f;
    for (size_t i = 0; i < h.size(); i += 7) memcpy(&h[i], &special[(i / 7) % 6], sizeof(float));
    float *d = dev_copy(h.data(), h.size());
    cpu->quant->amax_nan_to_inf(cpu->ctx, h.data(), h.size());
    gpu->quant->amax_nan_to_inf(gpu->ctx, d, h.size());
    gpu->op.sync(gpu->ctx);
    const std::vector<float> g = host_copy(d, h.size());
    size_t bad = 0;
    for (size_t i = 0; i < h.size(); i++) bad += bits(g[i]) != bits(h[i]) || h[i] != h[i];
    emu_check(bad == 0, "amax_nan_to_inf: %zu of %zu amaxes differ from the CPU's or stay NaN", bad, h.size());
    CHECK_CUDA(cudaFree(d));
}

// The CUDA backend (the emulated device), and its teardown; either failing ends the test.
static const struct mt_kernels *cuda_backend(void)
{
    struct mt_err err;
    mt_err_clear(&err);
    const struct mt_kernels *gpu = mt_kernels_cuda(&err);
    if (!gpu) {
        fprintf(stderr, "emu_quant: %s\n", err.msg);
        exit(1);
    }
    return gpu;
}
static void cuda_backend_done(void)
{
    struct mt_err err;
    mt_err_clear(&err);
    if (mt_kernels_cuda_destroy(&err)) {
        fprintf(stderr, "emu_quant: %s\n", err.msg);
        exit(1);
    }
}

static void run_qdq(void)
{
    const struct mt_kernels *gpu = cuda_backend();
    const struct mt_kernels *cpu = mt_kernels_cpu();
    // shapes: a single element, partial 16-, 32- and 128-blocks along both dimensions,
    // Hadamard groups of 16 rows with a tail (40 = 2 x 16 + 8)
    static const shape qs[] = {{1, 1}, {3, 5}, {40, 96}, {130, 36}, {17, 160}};
    const std::vector<qdq_case> cases = qdq_cases();
    for (const qdq_case &qc : cases)
        for (const shape &sh : qs) {
            qdq_one(gpu, cpu, qc, sh, EDGES, false);
            qdq_one(gpu, cpu, qc, sh, PLAIN, true);
        }
    // NaN and infinity reach the scales and the recorded amax
    for (const qdq_case &qc : cases) {
        qdq_one(gpu, cpu, qc, shapes[2], WITH_NAN, false);
        qdq_one(gpu, cpu, qc, shapes[2], WITH_INF, false);
    }
    // tensor-parallel shards of every recipe but delayed scaling (whose scale is the
    // history's, the same for any part); halves of whole blocks, a partial block along
    // the other dimension
    for (const qdq_case &qc : cases) {
        if (qc.delayed) continue;
        qdq_shard(gpu, cpu, qc, 256, 200, true);
        qdq_shard(gpu, cpu, qc, 72, 256, false);
    }
    amax_nan_to_inf_case(gpu, cpu);
    cuda_backend_done();
}

// ---------------------------------------------------------------- scale order

// The offset cuBLASLt's documentation gives the 1-D block scale (outer, inner) of a
// tensor with sf_inner_dim scales a row: the tile's (128 x 4 scales, row-major over the
// tiles) and the place in it.
static size_t doc_tiled_offset(int64_t outer, int64_t inner, int64_t sf_inner_dim)
{
    const int64_t tile = (inner / 4 * 4 + outer / 128 * sf_inner_dim) * 128;
    return (size_t)(tile + (outer % 32) * 16 + (outer % 128) / 32 * 4 + inner % 4);
}

static void order_one(enum mt_q_scaling s, enum mt_q_dim along, int64_t rows, int64_t cols)
{
    struct mt_err err;
    const enum mt_q_elem el = s == MT_Q_NVFP4 || s == MT_Q_NVFP4_2D ? MT_Q_ELEM_E2M1 : MT_Q_ELEM_E4M3;
    pair p = make_pair(s, el, along, rows, cols);
    const int64_t ld = cols;
    const std::vector<float> x = make_tensor(rows, cols, ld, PLAIN);
    float *dx = dev_copy(x.data(), x.size());
    if (s == MT_Q_MX) must(mt_cuda_quant_mxfp8(&p.d, dx, ld, nullptr, &err), err, "mxfp8");
    else if (el == MT_Q_ELEM_E2M1) must(mt_cuda_quant_nvfp4(&p.d, dx, ld, MT_Q_RN, mt_q_seed{nullptr, 0}, 0, nullptr, nullptr, &err), err, "nvfp4");
    else must(mt_cuda_quant_blockwise(&p.d, dx, ld, 0, nullptr, &err), err, "blockwise");
    int32_t mode;
    size_t bytes;
    must(mt_cuda_q_cublaslt_scale_mode(&p.d, &mode, &bytes, &err), err, "scale mode");
    void *out = dev_alloc(bytes);
    CHECK_CUDA(cudaMemset(out, 0x5a, bytes)); // padding must be written as zero
    must(mt_cuda_q_cublaslt_scales(out, &p.d, nullptr, &err), err, "cublaslt scales");
    const std::vector<uint8_t> got = host_copy(static_cast<const uint8_t *>(out), bytes);
    std::vector<uint8_t> want(bytes, 0);
    const char *name = "";
    int want_mode = -1;
    if (s == MT_Q_BLOCK_1X128) {
        name = "VEC128_32F";
        want_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        const std::vector<float> sc = host_copy(p.d.scale, (size_t)(p.d.srows * p.d.scols));
        float *w = reinterpret_cast<float *>(want.data());
        for (int64_t o = 0; o < rows; o++) // M-major: o + b * M
            for (int64_t b = 0; b < p.d.scols; b++) w[o + b * rows] = sc[(size_t)(o * p.d.scols + b)];
    } else if (s == MT_Q_BLOCK_128X128) {
        name = "BLK128x128_32F";
        want_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        const std::vector<float> sc = host_copy(p.d.scale, (size_t)(p.d.srows * p.d.scols));
        const int64_t l4 = (p.d.scols + 3) / 4 * 4;
        float *w = reinterpret_cast<float *>(want.data());
        for (int64_t o = 0; o < p.d.srows; o++) // K-major, column stride L4
            for (int64_t b = 0; b < p.d.scols; b++) w[b + o * l4] = sc[(size_t)(o * p.d.scols + b)];
    } else {
        name = s == MT_Q_MX ? "VEC32_UE8M0" : "VEC16_UE4M3";
        want_mode = s == MT_Q_MX ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 : CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
        const std::vector<uint8_t> sc = host_copy(p.d.scale8, (size_t)(p.d.srows * p.d.scols));
        const bool col = along == MT_Q_ALONG_COL;
        const int64_t outer_n = col ? cols : rows, inner_n = col ? p.d.srows : p.d.scols;
        const int64_t dim = (inner_n + 3) / 4 * 4;
        emu_check(bytes == (size_t)((outer_n + 127) / 128 * 128 * dim), "%s %lldx%lld: %zu bytes, whole 128x4 tiles",
              name, (long long)rows, (long long)cols, bytes);
        for (int64_t o = 0; o < outer_n; o++)
            for (int64_t b = 0; b < inner_n; b++)
                want[doc_tiled_offset(o, b, dim)] = col ? sc[(size_t)(b * cols + o)] : sc[(size_t)(o * inner_n + b)];
    }
    size_t diff = bytes;
    for (size_t i = 0; i < bytes && diff == bytes; i++)
        if (got[i] != want[i]) diff = i;
    emu_check(mode == want_mode && diff == bytes, "%s scales of a %lldx%lld %s tensor%s, %zu bytes: %s", name,
          (long long)rows, (long long)cols, s == MT_Q_MX ? "mxfp8" : el == MT_Q_ELEM_E2M1 ? "nvfp4" : "blockwise",
          along == MT_Q_ALONG_COL ? " (along columns)" : "", bytes,
          diff == bytes ? "every byte where the documented layout puts it, padding zero" : "they differ");
    if (diff != bytes) printf("     first difference at byte %zu: 0x%02x, want 0x%02x\n", diff, got[diff], want[diff]);
    CHECK_CUDA(cudaFree(out));
    CHECK_CUDA(cudaFree(dx));
    free_pair(p);
}

static void run_order(void)
{
    order_one(MT_Q_MX, MT_Q_ALONG_ROW, 300, 416);  // 3 tile rows, 13 blocks: 4 tiles a row
    order_one(MT_Q_MX, MT_Q_ALONG_ROW, 5, 64);     // one partial tile
    order_one(MT_Q_MX, MT_Q_ALONG_COL, 96, 200);   // 3 blocks along the rows, 200 outer
    order_one(MT_Q_NVFP4, MT_Q_ALONG_ROW, 130, 272);
    order_one(MT_Q_NVFP4_2D, MT_Q_ALONG_ROW, 260, 96);
    order_one(MT_Q_BLOCK_1X128, MT_Q_ALONG_ROW, 36, 300);
    order_one(MT_Q_BLOCK_128X128, MT_Q_ALONG_ROW, 300, 700);
    struct mt_err err;
    struct mt_cuda_qtensor q;
    int32_t mode;
    size_t bytes;
    must(mt_cuda_qtensor_layout(&q, MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, 30, 128, &err), err, "layout");
    emu_check(mt_cuda_q_cublaslt_scale_mode(&q, &mode, &bytes, &err) == MT_EINVAL && strstr(err.msg, "multiple of 4"),
          "VEC128_32F scales of 30 rows refused: %s", err.msg);
}

// ---------------------------------------------------------------- cuBLASLt

static cublasLtHandle_t lt;

// One quantised operand on the device, with its CPU twin and the scales cuBLASLt reads.
struct operand {
    pair p;
    void *scales; // arranged block scales, or the device scalar (tensorwise)
    int32_t mode;
};

static operand quantise(enum mt_q_scaling s, enum mt_q_elem el, enum mt_q_dim along, int64_t rows, int64_t cols,
                        enum mt_q_round rnd)
{
    struct mt_err err;
    operand o;
    o.p = make_pair(s, el, along, rows, cols);
    const std::vector<float> x = make_tensor(rows, cols, cols, PLAIN);
    float *dx = dev_copy(x.data(), x.size());
    switch (s) {
    case MT_Q_TENSOR: {
        float *amax = static_cast<float *>(dev_alloc(4)), *sc = static_cast<float *>(dev_alloc(4));
        must(mt_cuda_q_amax(amax, dx, rows, cols, cols, nullptr, &err), err, "amax");
        must(mt_cuda_q_tensor_scale(sc, amax, el == MT_Q_ELEM_E4M3 ? MT_E4M3_MAX : MT_E5M2_MAX, 0, nullptr, &err), err,
             "tensor scale");
        must(mt_cuda_quant_tensorwise(&o.p.d, dx, cols, sc, rnd, mt_q_seed{nullptr, 1}, 2, nullptr, &err), err, "tensorwise");
        must(mt_quant_tensorwise(&o.p.h, x.data(), cols, host_copy(sc, 1)[0], rnd, 1, 2, &err), err, "tensorwise");
        CHECK_CUDA(cudaFree(amax));
        CHECK_CUDA(cudaFree(sc));
        break;
    }
    case MT_Q_BLOCK_1X128:
    case MT_Q_BLOCK_128X128:
        must(mt_cuda_quant_blockwise(&o.p.d, dx, cols, 1, nullptr, &err), err, "blockwise");
        must(mt_quant_blockwise(&o.p.h, x.data(), cols, 1, &err), err, "blockwise");
        break;
    case MT_Q_MX:
        must(mt_cuda_quant_mxfp8(&o.p.d, dx, cols, nullptr, &err), err, "mxfp8");
        must(mt_quant_mxfp8(&o.p.h, x.data(), cols, &err), err, "mxfp8");
        break;
    case MT_Q_NVFP4:
    case MT_Q_NVFP4_2D:
        must(mt_cuda_quant_nvfp4(&o.p.d, dx, cols, rnd, mt_q_seed{nullptr, 5}, 6, nullptr, nullptr, &err), err, "nvfp4");
        must(mt_quant_nvfp4(&o.p.h, x.data(), cols, rnd, 5, 6, &err), err, "nvfp4");
        break;
    }
    CHECK_CUDA(cudaFree(dx));
    if (s == MT_Q_TENSOR) {
        o.mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
        o.scales = o.p.d.scale; // the decode scale the quantiser stored
    } else {
        size_t bytes;
        must(mt_cuda_q_cublaslt_scale_mode(&o.p.d, &o.mode, &bytes, &err), err, "scale mode");
        o.scales = dev_alloc(bytes);
        must(mt_cuda_q_cublaslt_scales(o.scales, &o.p.d, nullptr, &err), err, "cublaslt scales");
    }
    return o;
}
static void free_operand(operand &o)
{
    if (o.scales != o.p.d.scale) CHECK_CUDA(cudaFree(o.scales));
    free_pair(o.p);
}

static cudaDataType_t lt_type(enum mt_q_elem e)
{
    return e == MT_Q_ELEM_E4M3 ? CUDA_R_8F_E4M3 : e == MT_Q_ELEM_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_4F_E2M1;
}

// A matmul request: op(A) is (M, K), op(B) (K, N), D (M, N) column-major, ld M.
struct request {
    const operand *a, *b;
    bool ta, tb;
    int64_t M, N, K, lda, ldb;
    cudaDataType_t d_type;
    float alpha;
    const float *d_scale; // device, or NULL
    float *amax_d;        // device, or NULL
    int32_t mode_a, mode_b;
    float beta = 0.0f;              // with C: fp32 (M, N) column-major, ld M, on the host
    const float *c = nullptr;
    const float *c_scale = nullptr; // device, or NULL
};

// Returns the status of the heuristic, or of cublasLtMatmul when the heuristic found one;
// D (as fp32 values, or FP8 codes in d8) in d.
static cublasStatus_t lt_matmul(const request &r, std::vector<float> *d, std::vector<uint8_t> *d8)
{
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t opa = r.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = r.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &r.mode_a, sizeof r.mode_a);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &r.mode_b, sizeof r.mode_b);
    const void *sa = r.a->scales, *sb = r.b->scales;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
    if (r.d_scale) cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &r.d_scale, sizeof(void *));
    if (r.amax_d) cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &r.amax_d, sizeof(void *));
    if (r.c_scale) cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, &r.c_scale, sizeof(void *));
    const cudaDataType_t ta = lt_type(r.a->p.h.elem), tb = lt_type(r.b->p.h.elem);
    const cudaDataType_t c_type = r.d_type == CUDA_R_32F ? CUDA_R_32F : CUDA_R_16BF;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatrixLayoutCreate(&la, ta, r.ta ? r.K : r.M, r.ta ? r.M : r.K, r.lda);
    cublasLtMatrixLayoutCreate(&lb, tb, r.tb ? r.N : r.K, r.tb ? r.K : r.N, r.ldb);
    cublasLtMatrixLayoutCreate(&lc, c_type, r.M, r.N, r.M);
    cublasLtMatrixLayoutCreate(&ld, r.d_type, r.M, r.N, r.M);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 1, &res, &found);
    const size_t esz = r.d_type == CUDA_R_32F ? 4 : r.d_type == CUDA_R_16BF ? 2 : 1;
    const size_t n = (size_t)(r.M * r.N);
    void *dd = dev_alloc(n * esz), *dc = r.c ? dev_copy(r.c, n) : dd; // an fp32 C (only with an fp32 D)
    if (st == CUBLAS_STATUS_SUCCESS && found) {
        st = cublasLtMatmul(lt, desc, &r.alpha, r.a->p.d.data, la, r.b->p.d.data, lb, &r.beta, dc, lc, dd, ld,
                            &res.algo, nullptr, 0, nullptr);
        if (st == CUBLAS_STATUS_SUCCESS && d && r.d_type == CUDA_R_16BF) {
            const std::vector<uint16_t> h = host_copy(static_cast<const uint16_t *>(dd), n);
            d->resize(n);
            for (size_t i = 0; i < n; i++) {
                const uint32_t u = (uint32_t)h[i] << 16;
                memcpy(&(*d)[i], &u, 4);
            }
        } else if (st == CUBLAS_STATUS_SUCCESS && d) {
            *d = host_copy(static_cast<const float *>(dd), n);
        }
        if (st == CUBLAS_STATUS_SUCCESS && d8) *d8 = host_copy(static_cast<const uint8_t *>(dd), n);
    }
    if (dc != dd) CHECK_CUDA(cudaFree(dc));
    CHECK_CUDA(cudaFree(dd));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    return st;
}

// The reference of D (column-major, ld M): C (row-major) = op(a) op(b) of the CPU twins,
// and sum_k |a_k b_k| of the dequantised operands for the bound. ref_ta/ref_tb: how
// mt_q_gemm reads the CPU tensors to give D's transpose or D itself (below).
struct reference {
    std::vector<float> d;
    std::vector<double> mag;
};
static reference cpu_reference(const request &r, int ref_ta, int ref_tb, bool swap, int split)
{
    // mt_q_gemm(x, ref_ta, y, ref_tb) is (rows, cols) row-major; swap: it is D^T's
    // column-major (the GEMM of the TN layout computed as row-major C = B^T A^T).
    const struct mt_qtensor *x = swap ? &r.b->p.h : &r.a->p.h, *y = swap ? &r.a->p.h : &r.b->p.h;
    const int64_t rows = swap ? r.N : r.M, cols = swap ? r.M : r.N;
    std::vector<float> c((size_t)(rows * cols));
    struct mt_err err;
    must(mt_q_gemm(x, ref_ta, y, ref_tb, c.data(), cols, split, &err), err, "mt_q_gemm");
    std::vector<float> dx((size_t)(x->rows * x->cols)), dy((size_t)(y->rows * y->cols));
    must(mt_dequant(x, dx.data(), x->cols, &err), err, "mt_dequant");
    must(mt_dequant(y, dy.data(), y->cols, &err), err, "mt_dequant");
    reference ref;
    ref.d.resize((size_t)(r.M * r.N));
    ref.mag.resize((size_t)(r.M * r.N));
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            double m = 0;
            for (int64_t k = 0; k < r.K; k++) {
                const double xv = dx[(size_t)(ref_ta ? k * x->cols + i : i * x->cols + k)];
                const double yv = dy[(size_t)(ref_tb ? j * y->cols + k : k * y->cols + j)];
                m += fabs(xv * yv);
            }
            // D column-major (M, N): row-major C is D^T (swap) or D
            const size_t o = swap ? (size_t)(i * r.M + j) : (size_t)(j * r.M + i);
            ref.d[o] = c[(size_t)(i * cols + j)] * r.alpha;
            ref.mag[o] = m * fabs((double)r.alpha);
        }
    return ref;
}

// D within (K + 4) 2^-24 sum|a b| of the reference everywhere.
static void gemm_case(const char *what, const request &r, int ref_ta, int ref_tb, bool swap, int split)
{
    std::vector<float> d;
    const cublasStatus_t st = lt_matmul(r, &d, nullptr);
    if (st != CUBLAS_STATUS_SUCCESS) {
        emu_check(false, "%s: cuBLASLt status %d", what, (int)st);
        return;
    }
    const reference ref = cpu_reference(r, ref_ta, ref_tb, swap, split);
    double worst = 0;
    int bad = 0;
    for (size_t i = 0; i < d.size(); i++) {
        // + beta scale_C C (exact here: small integers times 2 times 1/2), and a bf16 D's
        // rounding: half an ulp, at most 2^-8 of the value
        const double want = ref.d[i] + (r.c ? (double)r.beta * 2.0 * r.c[i] : 0.0);
        const double bound = (double)(r.K + 4) * ldexp(ref.mag[i], -24) +
                             (r.d_type == CUDA_R_16BF ? ldexp(fabs(want), -8) : 0.0);
        const double e = fabs((double)d[i] - want);
        if (!(e <= bound)) bad++;
        if (ref.mag[i] > 0 && e / ref.mag[i] > worst) worst = e / ref.mag[i];
    }
    emu_check(!bad, "%s: M %lld N %lld K %lld, |D - mt_q_gemm| <= (K + 4) 2^-24 sum|ab|%s everywhere (%d outside; "
              "largest error %.2g sum|ab|)", what, (long long)r.M, (long long)r.N, (long long)r.K,
              r.d_type == CUDA_R_16BF ? " + bf16's half ulp" : "", bad, worst);
}

static void refused(const char *what, const request &r, cublasStatus_t want)
{
    const cublasStatus_t st = lt_matmul(r, nullptr, nullptr);
    emu_check(st == want, "%s: refused with status %d (want %d)", what, (int)st, (int)want);
}

static request tn(const operand &a, const operand &b, int64_t M, int64_t N, int64_t K)
{
    return request{&a, &b, true, false, M, N, K, K, K, CUDA_R_32F, 1.0f, nullptr, nullptr, a.mode, b.mode};
}

// Hopper: tensorwide and blockwise, TN only; FP8 output with its scale and amax.
static void run_gemm_h100(void)
{
    const int64_t T = 48, N = 64, K = 96;
    // Y (T, N) = X (T, K) W^T, W (N, K): in cuBLASLt's column-major terms D (N, T) = W^T' X', A = W, B = X
    operand x = quantise(MT_Q_TENSOR, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, T, K, MT_Q_RN);
    operand w = quantise(MT_Q_TENSOR, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, N, K, MT_Q_RN);
    operand g = quantise(MT_Q_TENSOR, MT_Q_ELEM_E5M2, MT_Q_ALONG_ROW, T, K, MT_Q_SR);
    gemm_case("tensorwide E4M3 x E4M3 (TN, fp32 D)", tn(w, x, N, T, K), 0, 1, true, 0);
    gemm_case("tensorwide E4M3 x E5M2 (TN, fp32 D, E5M2 stochastically rounded)", tn(w, g, N, T, K), 0, 1, true, 0);
    {
        // beta scale_C C: C small integers, scale_C 2, beta 1/2
        request r = tn(w, x, N, T, K);
        std::vector<float> c((size_t)(N * T));
        for (size_t i = 0; i < c.size(); i++) c[i] = (float)((int)(rnd_u64() % 17) - 8);
        const float two = 2.0f;
        float *cs = dev_copy(&two, 1);
        r.beta = 0.5f;
        r.c = c.data();
        r.c_scale = cs;
        gemm_case("tensorwide with beta 1/2 and a C scale of 2", r, 0, 1, true, 0);
        CHECK_CUDA(cudaFree(cs));
    }

    // FP8 D with a D scale and the amax of D
    {
        request r = tn(w, x, N, T, K);
        const reference ref = cpu_reference(r, 0, 1, true, 0);
        double ref_amax = 0, amax_bound = 0;
        for (size_t i = 0; i < ref.d.size(); i++)
            if (fabs(ref.d[i]) > ref_amax) ref_amax = fabs(ref.d[i]), amax_bound = (K + 4) * ldexp(ref.mag[i], -24);
        // a power of two that takes the amax to [256, 512): the largest values saturate
        const float dscale_h = (float)ldexp(1.0, 8 - ilogb(ref_amax));
        float *dscale = dev_copy(&dscale_h, 1), *amax = static_cast<float *>(dev_alloc(4));
        r.d_type = CUDA_R_8F_E4M3;
        r.d_scale = dscale;
        r.amax_d = amax;
        std::vector<uint8_t> d8;
        const cublasStatus_t st = lt_matmul(r, nullptr, &d8);
        int bad = 0;
        for (size_t i = 0; st == CUBLAS_STATUS_SUCCESS && i < d8.size(); i++) {
            const double bound = (double)(K + 4) * ldexp(ref.mag[i], -24);
            const double v = mt_e4m3_to_float(d8[i]), want = fmax(-448.0, fmin(448.0, ref.d[i] * dscale_h));
            // the code is the reference's value scaled and rounded to E4M3 (half an ulp:
            // 2^-4 relative above 2^-6, 2^-10 absolute below), saturating at 448
            const double tol = fmax(fabs(want) * 0.0625, ldexp(1.0, -10)) + bound * dscale_h;
            if (!(fabs(v - want) <= tol)) bad++;
        }
        const float got_amax = host_copy(amax, 1)[0];
        emu_check(st == CUBLAS_STATUS_SUCCESS && !bad && fabs(got_amax - ref_amax) <= amax_bound,
              "tensorwide, E4M3 D scaled by 2^%d with the amax of D: status %d, %d codes off, amax %g (reference %g)",
              ilogb(dscale_h), (int)st, bad, (double)got_amax, ref_amax);
        CHECK_CUDA(cudaFree(dscale));
        CHECK_CUDA(cudaFree(amax));
    }

    // blockwise: 1 x 128 activations, 128 x 128 weights, K with a partial block, N a
    // partial 128-row block of the weight; both operand orders (forward: weight as A)
    const int64_t Tb = 36, Nb = 136, Kb = 320;
    operand xb = quantise(MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, Tb, Kb, MT_Q_RN);
    operand wb = quantise(MT_Q_BLOCK_128X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, Nb, Kb, MT_Q_RN);
    gemm_case("blockwise A BLK128x128_32F (weight) x B VEC128_32F (activation), split accumulation",
              tn(wb, xb, Nb, Tb, Kb), 0, 1, true, 1);
    gemm_case("blockwise A VEC128_32F (activation) x B BLK128x128_32F (weight), split accumulation",
              tn(xb, wb, Tb, Nb, Kb), 0, 1, false, 1);
    operand xb2 = quantise(MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, 40, Kb, MT_Q_RN);
    gemm_case("blockwise VEC128_32F x VEC128_32F", tn(xb, xb2, Tb, 40, Kb), 0, 1, false, 1);
    request bf = tn(wb, xb, Nb, Tb, Kb);
    bf.d_type = CUDA_R_16BF;
    gemm_case("blockwise with a bf16 D", bf, 0, 1, true, 1);

    // what the library refuses on Hopper
    request nt = tn(w, x, N, T, K);
    nt.ta = false;
    nt.lda = N;
    refused("FP8 in the NN layout on compute capability 9.0", nt, CUBLAS_STATUS_NOT_SUPPORTED);
    operand wb2 = quantise(MT_Q_BLOCK_128X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, 128, Kb, MT_Q_RN);
    refused("BLK128x128_32F for both A and B", tn(wb, wb2, Nb, 128, Kb), CUBLAS_STATUS_NOT_SUPPORTED);
    operand g2 = quantise(MT_Q_TENSOR, MT_Q_ELEM_E5M2, MT_Q_ALONG_ROW, N, K, MT_Q_RN);
    refused("E5M2 x E5M2", tn(g2, g, N, T, K), CUBLAS_STATUS_NOT_SUPPORTED);
    request mixed = tn(wb, x, Nb, T, Kb);
    mixed.K = K;
    mixed.lda = Kb;
    refused("BLK128x128_32F with a scalar-scaled B", mixed, CUBLAS_STATUS_NOT_SUPPORTED);
    operand mx = quantise(MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, N, K, MT_Q_RN);
    operand mx2 = quantise(MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, T, K, MT_Q_RN);
    refused("VEC32_UE8M0 (MXFP8) on compute capability 9.0", tn(mx, mx2, N, T, K), CUBLAS_STATUS_NOT_SUPPORTED);
    operand f4 = quantise(MT_Q_NVFP4, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, N, K, MT_Q_RN);
    operand f4b = quantise(MT_Q_NVFP4, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, T, K, MT_Q_RN);
    refused("FP4 on compute capability 9.0", tn(f4, f4b, N, T, K), CUBLAS_STATUS_NOT_SUPPORTED);
    operand odd = quantise(MT_Q_TENSOR, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, N, 40, MT_Q_RN);
    operand odd2 = quantise(MT_Q_TENSOR, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, T, 40, MT_Q_RN);
    refused("K = 40 (rows of A not a multiple of 16 bytes)", tn(odd, odd2, N, T, 40), CUBLAS_STATUS_NOT_SUPPORTED);
    request bdscale = tn(w, x, N, T, K);
    const float one = 1.0f;
    float *dscale = dev_copy(&one, 1);
    bdscale.d_scale = dscale;
    refused("a D scale with an fp32 D", bdscale, CUBLAS_STATUS_INVALID_VALUE);
    CHECK_CUDA(cudaFree(dscale));
    for (operand *o : {&x, &w, &g, &xb, &wb, &xb2, &wb2, &g2, &mx, &mx2, &f4, &f4b, &odd, &odd2}) free_operand(*o);
}

// Blackwell: MXFP8 (including the NT layout of a weight gradient, whose operands are
// quantised along their columns) and NVFP4 (TN only).
static void run_gemm_gb200(void)
{
    const int64_t T = 64, N = 160, K = 96;
    operand x = quantise(MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, T, K, MT_Q_RN);
    operand w = quantise(MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, N, K, MT_Q_RN);
    gemm_case("mxfp8 VEC32_UE8M0 forward (TN: weight as A), 160 rows: two 128-row scale tiles",
              tn(w, x, N, T, K), 0, 1, true, 0);
    // K is what FP8 rows take (a multiple of 16 elements), not a multiple of the 32-block:
    // the last block is partial (its scale covers the 16 elements there are), as the
    // quantisers make it and the scale layout (ceil(K / 32) blocks) holds it
    operand xp = quantise(MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, T, 48, MT_Q_RN);
    operand wp = quantise(MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, N, 48, MT_Q_RN);
    gemm_case("mxfp8 K = 48: a partial last 32-block", tn(wp, xp, N, T, 48), 0, 1, true, 0);
    // weight gradient dW (N, K) = dY^T X, the reduction over T: dY (T, N) and X (T, K)
    // quantised along their columns; column-major dW^T (K, N) = X^T dY: A = X (op N,
    // column-major K x T), B = dY (op T, column-major N x T)
    operand xc = quantise(MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_COL, T, K, MT_Q_RN);
    operand dy = quantise(MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_COL, T, N, MT_Q_RN);
    request wg{&xc, &dy, false, true, K, N, T, K, N, CUDA_R_32F, 1.0f, nullptr, nullptr, xc.mode, dy.mode};
    gemm_case("mxfp8 weight gradient (NT, operands quantised along their columns)", wg, 1, 0, false, 0);
    // tensorwide FP8 is not TN-only on compute capability 10.0
    operand xt = quantise(MT_Q_TENSOR, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, T, K, MT_Q_RN);
    operand wt = quantise(MT_Q_TENSOR, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, K, N, MT_Q_RN);
    request nn{&wt, &xt, false, false, N, T, K, N, K, CUDA_R_32F, 1.0f, nullptr, nullptr, wt.mode, xt.mode};
    gemm_case("tensorwide E4M3 in the NN layout on compute capability 10.0", nn, 0, 0, true, 0);

    // NVFP4: 16 x 16 weight blocks, 1 x 16 activation blocks stochastically rounded; the
    // per-tensor scales go in alpha
    operand w4 = quantise(MT_Q_NVFP4_2D, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, N, K, MT_Q_RN);
    operand x4 = quantise(MT_Q_NVFP4, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, T, K, MT_Q_SR);
    request r4 = tn(w4, x4, N, T, K);
    r4.alpha = host_copy(w4.p.d.global, 1)[0] * host_copy(x4.p.d.global, 1)[0];
    {
        // mt_q_gemm applies the globals itself: compare with alpha folded out of the reference
        std::vector<float> d;
        const cublasStatus_t st = lt_matmul(r4, &d, nullptr);
        request unit = r4;
        unit.alpha = 1.0f;
        const reference ref = cpu_reference(unit, 0, 1, true, 0);
        int bad = 0;
        for (size_t i = 0; st == CUBLAS_STATUS_SUCCESS && i < d.size(); i++) {
            const double bound = (double)(K + 4) * ldexp(ref.mag[i], -24);
            if (!(fabs((double)d[i] - ref.d[i]) <= bound + fabs(ref.d[i]) * ldexp(1.0, -23))) bad++;
        }
        emu_check(st == CUBLAS_STATUS_SUCCESS && !bad,
              "nvfp4 VEC16_UE4M3 (16x16 weight, stochastically rounded activation), per-tensor scales in alpha: "
              "status %d, %d outside (K + 4) 2^-24 sum|ab| (+ alpha's rounding)", (int)st, bad);
    }

    // what the library refuses on Blackwell
    request nt4 = r4;
    nt4.ta = false;
    nt4.lda = N;
    refused("FP4 outside the TN layout", nt4, CUBLAS_STATUS_NOT_SUPPORTED);
    operand xb = quantise(MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, T, 128, MT_Q_RN);
    operand wb = quantise(MT_Q_BLOCK_128X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, N, 128, MT_Q_RN);
    refused("VEC128_32F x BLK128x128_32F on compute capability 10.0", tn(wb, xb, N, T, 128),
            CUBLAS_STATUS_NOT_SUPPORTED);
    request mixed = tn(w, xt, N, T, K);
    refused("VEC32_UE8M0 with a scalar-scaled B", mixed, CUBLAS_STATUS_NOT_SUPPORTED);
    request nosc = tn(w, x, N, T, K);
    operand none = x;
    none.scales = nullptr;
    nosc.b = &none;
    refused("VEC32_UE8M0 without B's scale pointer", nosc, CUBLAS_STATUS_INVALID_VALUE);
    operand xo = quantise(MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, T, 40, MT_Q_RN);
    operand wo = quantise(MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, N, 40, MT_Q_RN);
    refused("mxfp8 K = 40 (rows of A not a multiple of 16 bytes)", tn(wo, xo, N, T, 40), CUBLAS_STATUS_NOT_SUPPORTED);
    for (operand *o : {&x, &w, &xp, &wp, &xc, &dy, &xt, &wt, &w4, &x4, &xb, &wb, &xo, &wo}) free_operand(*o);
}

// ---------------------------------------------------------------- the quantised GEMM op

enum recipe { DELAYED = MT_RECIPE_DELAYED, TENSORWISE = MT_RECIPE_TENSORWISE, BLOCKWISE = MT_RECIPE_BLOCKWISE,
              MXFP8 = MT_RECIPE_MXFP8, NVFP4 = MT_RECIPE_NVFP4 };
static const char *recipe_name[] = {"delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4"};
enum role { RX = MT_Q_X, RW = MT_Q_W, RG = MT_Q_G };
enum use { FWD = MT_Q_FWD, DGRAD = MT_Q_DGRAD, WGRAD = MT_Q_WGRAD };
static const char *use_name[] = {"forward", "dgrad", "wgrad"};

// The model's spec of an operand (mt_quant_operand_spec, as src/model/model_lowp.c takes
// it); 'hybrid' E5M2 gradients for delayed and tensorwise; NVFP4's random streams fixed.
static struct mt_quant_spec model_spec(enum recipe r, enum role role, enum use u)
{
    struct mt_quant_spec q = mt_quant_operand_spec((enum mt_q_recipe)r, true, (enum mt_q_role)role,
                                                   (enum mt_q_use)u);
    if (r == NVFP4) {
        q.rht_stream = 9;
        q.seed = 0xfeedfacecafebeefull;
        q.stream = (uint32_t)(role * 3 + u);
    }
    return q;
}

// One operand on both backends: the host values (fp32 or bf16 bits), the device copy.
struct qg_operand {
    int64_t rows, cols;
    std::vector<float> x;
    std::vector<uint16_t> xb;
    bool bf16;
    void *dev;
    const void *host() const { return bf16 ? (const void *)xb.data() : (const void *)x.data(); }
    size_t bytes() const { return (size_t)(rows * cols) * (bf16 ? 2 : 4); }
};
static qg_operand qg_make(const struct mt_kernels *gpu, int64_t rows, int64_t cols, bool bf16)
{
    qg_operand o;
    o.rows = rows, o.cols = cols, o.bf16 = bf16;
    o.x = make_tensor(rows, cols, cols, PLAIN);
    if (bf16) {
        o.xb = to_bf16(o.x);
        for (size_t i = 0; i < o.x.size(); i++) {
            const uint32_t u = (uint32_t)o.xb[i] << 16;
            memcpy(&o.x[i], &u, 4);
        }
    }
    o.dev = gpu->op.alloc(gpu->ctx, o.bytes());
    gpu->op.copy(gpu->ctx, o.dev, o.host(), o.bytes());
    return o;
}

// Element i of a c read back from the device: fp32, or bf16 bits.
static double c_value(const std::vector<char> &v, size_t i, bool bf16)
{
    if (!bf16) return (double)reinterpret_cast<const float *>(v.data())[i];
    const uint32_t w = (uint32_t)reinterpret_cast<const uint16_t *>(v.data())[i] << 16;
    float f;
    memcpy(&f, &w, 4);
    return (double)f;
}

// What two quantised GEMMs' element may differ by: the reference GEMM's
// (K + 4) 2^-24 sum_k |a_k b_k|, beta c's rounding, a bf16 c's ulp (both round), NVFP4's
// per-tensor scales' rounding.
static double qgemm_bound(int64_t k, double mag, float beta, float c0, bool cbf16, bool nvfp4, double want,
                          double got)
{
    return (double)(k + 4) * ldexp(mag, -24) + fabs((double)beta * c0) * ldexp(1.0, -23) +
           (cbf16 ? ldexp(fmax(fabs(want), fabs(got)), -7) : 0.0) + (nvfp4 ? ldexp(fabs(want), -22) : 0.0);
}

// A case: c (m,n) = beta c + op(a) op(b) of use u, tokens N, the weight (dout, din).
// shard: a is the second half of a logical tensor split along its columns (a
// row-parallel x, a column-parallel dy, as tensor parallelism splits them), placed there
// with a tensor amax of three times its own largest |element|.
static void qgemm_case(const struct mt_kernels *gpu, const struct mt_kernels *cpu, enum recipe r, enum use u,
                       int64_t N, int64_t dout, int64_t din, bool bf16, float beta, double *worst, bool shard = false)
{
    const bool delayed = r == DELAYED;
    // the operands as the model stores them: x (N, din), W (dout, din), dy (N, dout)
    enum role ra, rb;
    bool ta, tb;
    int64_t ar, ac, br, bc, m, n, k;
    switch (u) {
    case FWD: ra = RX, rb = RW, ta = false, tb = true, ar = N, ac = din, br = dout, bc = din, m = N, n = dout, k = din; break;
    case DGRAD: ra = RG, rb = RW, ta = false, tb = false, ar = N, ac = dout, br = dout, bc = din, m = N, n = din, k = dout; break;
    default: ra = RG, rb = RX, ta = true, tb = false, ar = N, ac = dout, br = N, bc = din, m = dout, n = din, k = N; break;
    }
    const bool cbf16 = bf16 && u == FWD; // the forward writes the activation dtype
    qg_operand a = qg_make(gpu, ar, ac, bf16 && ra != RG), b = qg_make(gpu, br, bc, bf16 && rb != RG);
    struct mt_quant_spec sa = model_spec(r, ra, u), sb = model_spec(r, rb, u);
    // delayed: encode scales from a history and the amax record (device and host twins)
    float hs[4] = {2.5f, 0.25f, 3.0f, 0.5f};
    float *ds = static_cast<float *>(gpu->op.alloc(gpu->ctx, sizeof hs));
    gpu->op.copy(gpu->ctx, ds, hs, sizeof hs);
    float tamax = 0.0f;
    for (float v : a.x) tamax = fmaxf(tamax, 3.0f * fabsf(v));
    float *dtamax = static_cast<float *>(gpu->op.alloc(gpu->ctx, sizeof tamax));
    gpu->op.copy(gpu->ctx, dtamax, &tamax, sizeof tamax);
    if (shard) sa.lrows = ar, sa.lcols = 2 * ac, sa.col0 = ac, sa.tensor_amax = dtamax;
    struct mt_quant_spec ha = sa, hb = sb;
    if (shard) ha.tensor_amax = &tamax;
    if (delayed) {
        sa.scale = ds, sa.amax = ds + 1, sb.scale = ds + 2, sb.amax = ds + 3;
        ha.scale = hs, ha.amax = hs + 1, hb.scale = hs + 2, hb.amax = hs + 3;
    }
    // the model's work buffers on the bf16 runs, the backend's allocator on the others
    if (bf16) {
        sa.work_bytes = mt_quant_gemm_scratch_bytes((size_t)(ar * ac));
        sb.work_bytes = mt_quant_gemm_scratch_bytes((size_t)(br * bc));
        sa.work = gpu->op.alloc(gpu->ctx, sa.work_bytes);
        sb.work = gpu->op.alloc(gpu->ctx, sb.work_bytes);
    }
    // c: beta c with c small integers (exact), or whatever is there with beta 0
    const size_t nc = (size_t)(m * n), cb = nc * (cbf16 ? 2 : 4);
    std::vector<float> c0(nc);
    for (size_t i = 0; i < nc; i++) c0[i] = (float)((int)(rnd_u64() % 17) - 8);
    const std::vector<uint16_t> c0b = to_bf16(c0);
    const void *c0h = cbf16 ? (const void *)c0b.data() : (const void *)c0.data();
    const enum mt_dtype cdt = cbf16 ? MT_BF16 : MT_F32;
    std::vector<char> hc(cb);
    memcpy(hc.data(), c0h, cb);
    cpu->quant->gemm(cpu->ctx, ta, tb, &ha, mt_tview(a.host(), a.bf16 ? MT_BF16 : MT_F32, ar, ac), &hb,
                     mt_tview(b.host(), b.bf16 ? MT_BF16 : MT_F32, br, bc), beta, mt_tview(hc.data(), cdt, m, n));
    void *dc = gpu->op.alloc(gpu->ctx, cb);
    gpu->op.copy(gpu->ctx, dc, c0h, cb);
    struct mt_cuda_gemm_stats st0, st1;
    mt_cuda_gemm_stats(gpu, &st0);
    gpu->quant->gemm(gpu->ctx, ta, tb, &sa, mt_tview(a.dev, a.bf16 ? MT_BF16 : MT_F32, ar, ac), &sb,
                     mt_tview(b.dev, b.bf16 ? MT_BF16 : MT_F32, br, bc), beta, mt_tview(dc, cdt, m, n));
    mt_cuda_gemm_stats(gpu, &st1);
    std::vector<char> gc(cb);
    gpu->op.copy(gpu->ctx, gc.data(), dc, cb);
    float gs[4];
    gpu->op.copy(gpu->ctx, gs, ds, sizeof gs);
    // the dequantised operands (the CPU's qdq, amax not recorded again) for sum |a b|
    std::vector<float> qa((size_t)(ar * ac)), qb((size_t)(br * bc));
    struct mt_quant_spec pa = ha, pb = hb;
    pa.amax = pb.amax = nullptr;
    cpu->quant->qdq(cpu->ctx, &pa, mt_f32(qa.data(), ar, ac), mt_tview(a.host(), a.bf16 ? MT_BF16 : MT_F32, ar, ac));
    cpu->quant->qdq(cpu->ctx, &pb, mt_f32(qb.data(), br, bc), mt_tview(b.host(), b.bf16 ? MT_BF16 : MT_F32, br, bc));
    int bad = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double mag = 0;
            for (int64_t kk = 0; kk < k; kk++) {
                const double av = qa[(size_t)(ta ? kk * ac + i : i * ac + kk)];
                const double bv = qb[(size_t)(tb ? j * bc + kk : kk * bc + j)];
                mag += fabs(av * bv);
            }
            const size_t e = (size_t)(i * n + j);
            const double want = c_value(hc, e, cbf16), got = c_value(gc, e, cbf16);
            const double bound = qgemm_bound(k, mag, beta, c0[e], cbf16, r == NVFP4, want, got);
            const double err = fabs(got - want);
            if (!(err <= bound)) bad++;
            if (!cbf16 && mag > 0 && err / mag > *worst) *worst = err / mag;
        }
    const bool amax_ok = !delayed || (bits(gs[1]) == bits(hs[1]) && bits(gs[3]) == bits(hs[3]));
    const long long calls = st1.lowp_calls - st0.lowp_calls, dense = st1.calls - st0.calls;
    emu_check(!bad && amax_ok && calls == 1 && dense == 0,
              "quantised gemm %s %s%s: m %lld n %lld k %lld, %s, beta %g: within (K + 4) 2^-24 sum|ab|%s%s of the "
              "CPU (%d outside)%s; %lld cuBLASLt FP8/FP4 matmul%s, %lld dense GEMMs (want 1 and 0)",
              recipe_name[r], use_name[u], shard ? " (a: a column shard)" : "", (long long)m, (long long)n, (long long)k,
              bf16 ? "bf16 activations and weights, work buffers" : "fp32", (double)beta,
              cbf16 ? " + a bf16 ulp (both round)" : "", r == NVFP4 ? " + the per-tensor scales' rounding" : "", bad,
              delayed ? (amax_ok ? ", amaxes recorded as on the CPU" : ", amaxes NOT recorded as on the CPU") : "",
              calls, calls == 1 ? "" : "es", dense);
    for (void *p : {a.dev, b.dev, dc, (void *)ds, (void *)dtamax}) gpu->op.free(gpu->ctx, p);
    if (sa.work) gpu->op.free(gpu->ctx, sa.work);
    if (sb.work) gpu->op.free(gpu->ctx, sb.work);
}

// The grouped quantised GEMM (struct mt_quant_ops grouped_gemm) against the per-expert
// loop of the quantised GEMM it replaces (the model's routed experts, model_lowp.c): for
// use u, experts of `rows` tokens each (contiguous rows of x and dy, slabs of W and of
// its gradient), one call against one gemm an expert, from the same c. Within
// (K + 4) 2^-24 sum_k |a_k b_k| of each other (+ a bf16 c's ulp, + NVFP4's per-tensor
// scales' rounding): the grouped kernel sums each block's products in fp32, the emulated
// cuBLASLt exactly. Delayed scaling's amax records equal; the grouped call one launch of
// its kernel and no cuBLASLt matmul, and fewer launches than the loop (printed).
// Returns the grouped call's launches.
static long long qgrouped_case(const struct mt_kernels *gpu, const struct mt_kernels *cpu, enum recipe r, enum use u,
                          const std::vector<int64_t> &rows, int64_t dout, int64_t din, bool bf16, float beta,
                          double *worst)
{
    const int E = (int)rows.size();
    int64_t N = 0;
    for (int64_t t : rows) N += t;
    const bool delayed = r == DELAYED;
    enum role ra, rb;
    bool ta, tb;
    switch (u) {
    case FWD: ra = RX, rb = RW, ta = false, tb = true; break;
    case DGRAD: ra = RG, rb = RW, ta = false, tb = false; break;
    default: ra = RG, rb = RX, ta = true, tb = false; break;
    }
    // the model's buffers: x (N, din), dy (N, dout), W and dW (E dout, din), out (N, dout), dx (N, din)
    const int64_t acols = ra == RX ? din : dout;
    const int64_t brows = rb == RW ? (int64_t)E * dout : N, bcols = din;
    const int64_t crows = u == WGRAD ? (int64_t)E * dout : N, ccols = u == FWD ? dout : din;
    const bool cbf16 = bf16 && u == FWD;
    qg_operand a = qg_make(gpu, N, acols, bf16 && ra != RG), b = qg_make(gpu, brows, bcols, bf16 && rb != RG);
    const size_t nc = (size_t)(crows * ccols), cb = nc * (cbf16 ? 2 : 4);
    std::vector<float> c0(nc);
    for (size_t i = 0; i < nc; i++) c0[i] = (float)((int)(rnd_u64() % 17) - 8);
    const std::vector<uint16_t> c0b = to_bf16(c0);
    const void *c0h = cbf16 ? (const void *)c0b.data() : (const void *)c0.data();
    const enum mt_dtype cdt = cbf16 ? MT_BF16 : MT_F32, adt = a.bf16 ? MT_BF16 : MT_F32, bdt = b.bf16 ? MT_BF16 : MT_F32;
    void *dl = gpu->op.alloc(gpu->ctx, cb), *dg = gpu->op.alloc(gpu->ctx, cb);
    gpu->op.copy(gpu->ctx, dl, c0h, cb);
    gpu->op.copy(gpu->ctx, dg, c0h, cb);
    // delayed: the encode scales, then an amax record pair an expert for each run
    std::vector<float> hs(2 + 4 * (size_t)E, 0.0f);
    hs[0] = 2.5f, hs[1] = 3.0f;
    float *ds = static_cast<float *>(gpu->op.alloc(gpu->ctx, sizeof(float) * hs.size()));
    gpu->op.copy(gpu->ctx, ds, hs.data(), sizeof(float) * hs.size());
    const size_t ea = (size_t)(a.bf16 ? 2 : 4), eb = (size_t)(b.bf16 ? 2 : 4), ec = cbf16 ? 2 : 4;
    std::vector<struct mt_quant_spec> sa(E), sb(E), pa(E), pb(E);
    std::vector<struct mt_tensor> ta_(E), tb_(E), tl(E), tg(E), ha(E), hb(E);
    int64_t r0 = 0;
    for (int e = 0; e < E; e++) {
        const int64_t t = rows[e];
        ta_[e] = mt_tview((char *)a.dev + ea * (size_t)(r0 * acols), adt, t, acols);
        ha[e] = mt_tview((const char *)a.host() + ea * (size_t)(r0 * acols), adt, t, acols);
        const int64_t b0 = rb == RW ? e * dout : r0, bn = rb == RW ? dout : t;
        tb_[e] = mt_tview((char *)b.dev + eb * (size_t)(b0 * bcols), bdt, bn, bcols);
        hb[e] = mt_tview((const char *)b.host() + eb * (size_t)(b0 * bcols), bdt, bn, bcols);
        const int64_t c_0 = u == WGRAD ? e * dout : r0, cn = u == WGRAD ? dout : t;
        tl[e] = mt_tview((char *)dl + ec * (size_t)(c_0 * ccols), cdt, cn, ccols);
        tg[e] = mt_tview((char *)dg + ec * (size_t)(c_0 * ccols), cdt, cn, ccols);
        sa[e] = model_spec(r, ra, u), sb[e] = model_spec(r, rb, u);
        pa[e] = sa[e], pb[e] = sb[e];
        if (delayed) {
            sa[e].scale = ds, sb[e].scale = ds + 1;
            pa[e].scale = &hs[0], pb[e].scale = &hs[1];
        }
        r0 += t;
    }
    // the loop, then the grouped call; each with its own amax records
    struct mt_op_counts k0, k1, k2;
    struct mt_cuda_gemm_stats st1, st2;
    gpu->counts(gpu->ctx, &k0);
    for (int e = 0; e < E; e++) {
        struct mt_quant_spec qa = sa[e], qb = sb[e];
        if (delayed) qa.amax = ds + 2 + 2 * e, qb.amax = ds + 3 + 2 * e;
        gpu->quant->gemm(gpu->ctx, ta, tb, &qa, ta_[e], &qb, tb_[e], beta, tl[e]);
    }
    gpu->counts(gpu->ctx, &k1);
    mt_cuda_gemm_stats(gpu, &st1);
    std::vector<struct mt_quant_spec> ga = sa, gb = sb;
    if (delayed)
        for (int e = 0; e < E; e++) ga[e].amax = ds + 2 + 2 * E + 2 * e, gb[e].amax = ds + 3 + 2 * E + 2 * e;
    gpu->quant->grouped_gemm(gpu->ctx, E, ta, tb, ga.data(), ta_.data(), gb.data(), tb_.data(), beta, tg.data());
    gpu->counts(gpu->ctx, &k2);
    mt_cuda_gemm_stats(gpu, &st2);
    std::vector<char> hl(cb), hg(cb);
    gpu->op.copy(gpu->ctx, hl.data(), dl, cb);
    gpu->op.copy(gpu->ctx, hg.data(), dg, cb);
    gpu->op.copy(gpu->ctx, hs.data(), ds, sizeof(float) * hs.size());
    int bad = 0;
    for (int e = 0; e < E; e++) {
        // the dequantised operands (the CPU's qdq) for sum |a b|
        const int64_t ar = ha[e].rows, br = hb[e].rows;
        std::vector<float> qa((size_t)(ar * acols)), qb((size_t)(br * bcols));
        cpu->quant->qdq(cpu->ctx, &pa[e], mt_f32(qa.data(), ar, acols), ha[e]);
        cpu->quant->qdq(cpu->ctx, &pb[e], mt_f32(qb.data(), br, bcols), hb[e]);
        const int64_t m = tl[e].rows, n = ccols, k = ta ? ar : acols;
        const size_t base = (size_t)((char *)tl[e].data - (char *)dl) / ec;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double mag = 0;
                for (int64_t kk = 0; kk < k; kk++)
                    mag += fabs((double)qa[(size_t)(ta ? kk * acols + i : i * acols + kk)] *
                                qb[(size_t)(tb ? j * bcols + kk : kk * bcols + j)]);
                const size_t at = base + (size_t)(i * n + j);
                const double want = c_value(hl, at, cbf16), got = c_value(hg, at, cbf16);
                const double bound = qgemm_bound(k, mag, beta, c0[at], cbf16, r == NVFP4, want, got);
                const double err = fabs(got - want);
                if (!(err <= bound)) bad++;
                if (!cbf16 && mag > 0 && err / mag > *worst) *worst = err / mag;
            }
    }
    bool amax_ok = true;
    if (delayed)
        for (int e = 0; e < 2 * E; e++) amax_ok = amax_ok && bits(hs[2 + (size_t)e]) == bits(hs[2 + 2 * (size_t)E + e]);
    const long long loop = k1.launches[MT_OP_GEMM] - k0.launches[MT_OP_GEMM];
    const long long grouped = k2.launches[MT_OP_GEMM] - k1.launches[MT_OP_GEMM];
    const long long kernels = st2.lowp_grouped - st1.lowp_grouped, mm = st2.lowp_calls - st1.lowp_calls;
    emu_check(!bad && amax_ok && kernels == 1 && mm == 0 && grouped < loop,
              "grouped quantised gemm %s %s: %d experts, %lld tokens, W (%lld,%lld), %s, beta %g: within (K + 4) "
              "2^-24 sum|ab| of the per-expert loop (%d outside)%s; %lld grouped kernel and %lld cuBLASLt matmuls "
              "(want 1 and 0); %lld launches against the loop's %lld",
              recipe_name[r], use_name[u], E, (long long)N, (long long)dout, (long long)din,
              bf16 ? "bf16 activations and weights" : "fp32", (double)beta, bad,
              delayed ? (amax_ok ? ", amaxes recorded as by the loop" : ", amaxes NOT recorded as by the loop") : "",
              kernels, mm, grouped, loop);
    for (void *p : {a.dev, b.dev, dl, dg, (void *)ds}) gpu->op.free(gpu->ctx, p);
    return grouped;
}

static void run_qgrouped(bool h100)
{
    const struct mt_kernels *gpu = cuda_backend();
    const struct mt_kernels *cpu = mt_kernels_cpu();
    const std::vector<enum recipe> mine =
        h100 ? std::vector<enum recipe>{DELAYED, TENSORWISE, BLOCKWISE} : std::vector<enum recipe>{MXFP8, NVFP4};
    // experts' tokens not multiples of 4 or 16 (the wgrad's k), one of a single token;
    // a weight with a partial 128-block (din 160) and D rows not a multiple of 4 (dout 30)
    const std::vector<int64_t> rows = {37, 1, 64, 19};
    // four times the experts: the operands are quantised in one launch a stage for all
    // the groups (cuda_qdq.cu qgg_quantise), so the launches stay those of four
    std::vector<int64_t> rows16;
    for (int i = 0; i < 4; i++) rows16.insert(rows16.end(), rows.begin(), rows.end());
    double worst = 0;
    for (const enum recipe r : mine)
        for (int u = FWD; u <= WGRAD; u++) {
            const float beta = u == FWD ? 0.0f : 1.0f;
            const long long l4 = qgrouped_case(gpu, cpu, r, (enum use)u, rows, 64, 160, false, beta, &worst);
            qgrouped_case(gpu, cpu, r, (enum use)u, rows, 30, 64, true, beta, &worst);
            const long long l16 = qgrouped_case(gpu, cpu, r, (enum use)u, rows16, 30, 64, false, beta, &worst);
            emu_check(l4 == l16, "grouped quantised gemm %s %s: %lld launches for 4 experts, %lld for 16 (want "
                      "the same: one launch a quantisation stage for all the groups)", recipe_name[r], use_name[u],
                      l4, l16);
        }
    printf("largest |grouped - loop| / sum|ab| of an fp32 c: %.3g\n", worst);
    cuda_backend_done();
}

// A product without tokens (delayed scaling, tokens 0): for forward and dgrad, m = 0 and
// the weight (dout, din) is still an operand the CPU backend quantises, its amax
// recorded; for wgrad, k = 0 and c = beta c, nothing recorded. The CUDA backend records
// what the CPU's does and leaves c as the CPU's.
static void qgemm_empty_case(const struct mt_kernels *gpu, const struct mt_kernels *cpu, enum use u, int64_t dout,
                             int64_t din)
{
    enum role ra, rb;
    bool ta, tb;
    int64_t ar, ac, br, bc, m, n;
    switch (u) {
    case FWD: ra = RX, rb = RW, ta = false, tb = true, ar = 0, ac = din, br = dout, bc = din, m = 0, n = dout; break;
    case DGRAD: ra = RG, rb = RW, ta = false, tb = false, ar = 0, ac = dout, br = dout, bc = din, m = 0, n = din; break;
    default: ra = RG, rb = RX, ta = true, tb = false, ar = 0, ac = dout, br = 0, bc = din, m = dout, n = din; break;
    }
    qg_operand a = qg_make(gpu, ar > 0 ? ar : 1, ac, false), b = qg_make(gpu, br > 0 ? br : 1, bc, false);
    struct mt_quant_spec sa = model_spec(DELAYED, ra, u), sb = model_spec(DELAYED, rb, u);
    float hs[4] = {2.5f, 0.0f, 3.0f, 0.0f}; // encode scales, amax records from 0
    float *ds = static_cast<float *>(gpu->op.alloc(gpu->ctx, sizeof hs));
    gpu->op.copy(gpu->ctx, ds, hs, sizeof hs);
    struct mt_quant_spec ha = sa, hb = sb;
    sa.scale = ds, sa.amax = ds + 1, sb.scale = ds + 2, sb.amax = ds + 3;
    ha.scale = hs, ha.amax = hs + 1, hb.scale = hs + 2, hb.amax = hs + 3;
    const size_t nc = (size_t)(m * n), cb = (nc > 0 ? nc : 1) * 4;
    std::vector<float> hc(nc > 0 ? nc : 1, 3.0f), gc(hc.size());
    void *dc = gpu->op.alloc(gpu->ctx, cb);
    gpu->op.copy(gpu->ctx, dc, hc.data(), cb);
    cpu->quant->gemm(cpu->ctx, ta, tb, &ha, mt_f32(a.x.data(), ar, ac), &hb, mt_f32(b.x.data(), br, bc), 0.5f,
                     mt_f32(hc.data(), m, n));
    gpu->quant->gemm(gpu->ctx, ta, tb, &sa, mt_tview(a.dev, MT_F32, ar, ac), &sb, mt_tview(b.dev, MT_F32, br, bc),
                     0.5f, mt_f32((float *)dc, m, n));
    float gs[4];
    gpu->op.copy(gpu->ctx, gs, ds, sizeof gs);
    gpu->op.copy(gpu->ctx, gc.data(), dc, cb);
    const bool amax_ok = bits(gs[1]) == bits(hs[1]) && bits(gs[3]) == bits(hs[3]);
    const bool c_ok = !memcmp(gc.data(), hc.data(), cb);
    emu_check(amax_ok && c_ok,
              "quantised gemm delayed %s without tokens: m %lld n %lld k %lld: amax records %g %g (the CPU's %g %g), "
              "c %s the CPU's", use_name[u], (long long)m, (long long)n, (long long)(u == WGRAD ? 0 : ac),
              (double)gs[1], (double)gs[3], (double)hs[1], (double)hs[3], c_ok ? "equal to" : "NOT equal to");
    for (void *p : {a.dev, b.dev, dc, (void *)ds}) gpu->op.free(gpu->ctx, p);
}

static void run_qgemm(bool h100)
{
    const struct mt_kernels *gpu = cuda_backend();
    const struct mt_kernels *cpu = mt_kernels_cpu();
    if (h100)
        for (int u = FWD; u <= WGRAD; u++) qgemm_empty_case(gpu, cpu, (enum use)u, 30, 64);
    // (tokens, dout, din): tokens not a multiple of 4 or 16 (an expert's rows; the
    // wgrad's k), D rows not a multiple of 4 (dout 30), partial 128-blocks both ways
    // (dout 136, din 320), partial 16- and 32-blocks along the dgrad's k (dout 136, 30)
    static const int64_t shapes3[][3] = {{37, 64, 96}, {64, 136, 320}, {21, 30, 64}};
    const std::vector<enum recipe> mine =
        h100 ? std::vector<enum recipe>{DELAYED, TENSORWISE, BLOCKWISE} : std::vector<enum recipe>{MXFP8, NVFP4, BLOCKWISE};
    double worst = 0;
    for (const enum recipe r : mine) {
        for (const auto &sh : shapes3)
            for (int u = FWD; u <= WGRAD; u++) {
                const float beta = u == WGRAD ? 1.0f : u == DGRAD && sh[0] % 2 ? 1.0f : 0.0f;
                qgemm_case(gpu, cpu, r, (enum use)u, sh[0], sh[1], sh[2], false, beta, &worst);
                qgemm_case(gpu, cpu, r, (enum use)u, sh[0], sh[1], sh[2], true, beta, &worst);
            }
    }
    // NVFP4 on a tensor-parallel shard (the GEMM quantises it as qdq does, "qdq"): the
    // forward's x and the wgrad's dy (stochastic, Hadamard, read transposed with its
    // tokens padded to the FP4 GEMM's 32) as column shards
    if (!h100)
        for (const auto &sh : shapes3) {
            qgemm_case(gpu, cpu, NVFP4, FWD, sh[0], sh[1], sh[2], false, 0.0f, &worst, true);
            qgemm_case(gpu, cpu, NVFP4, WGRAD, sh[0], sh[1], sh[2], true, 1.0f, &worst, true);
        }
    printf("largest |cuda - cpu| / sum|ab| of an fp32 c: %.3g\n", worst);
    cuda_backend_done();
}

// The copies saved for backward (struct mt_quant_ops save, saved_bytes; the model's
// dense linears): the CUDA backend's copy of x under the spec the model saves it with
// (per-tensor scaling: the forward's, read by the forward and, transposed, by the wgrad
// GEMM; the block recipes: the wgrad's) takes the CPU's saved_bytes; the quantised GEMM
// reading it (x's device data NaN: not read) writes the bits of the GEMM that quantises
// x itself, and is within the qgemm bound of the CPU backend's GEMM reading the CPU's
// copy. Shapes: tokens not a multiple of 16 (the wgrad's k padded), din 30 (cuBLASLt's
// rows padded: the copy read with zero rows added).
static void saved_case(const struct mt_kernels *gpu, const struct mt_kernels *cpu, enum recipe r, enum use u,
                       int64_t N, int64_t dout, int64_t din, bool bf16)
{
    const bool wgrad = u == WGRAD;
    const enum use cu = r == DELAYED || r == TENSORWISE ? FWD : WGRAD; // the copy's use (model_lowp.c copy_use)
    // forward: out (N, dout) = x W^T; wgrad: dW (dout, din) = dy^T x
    const int64_t m = wgrad ? dout : N, n = wgrad ? din : dout, k = wgrad ? N : din;
    qg_operand x = qg_make(gpu, N, din, bf16), o = wgrad ? qg_make(gpu, N, dout, false) : qg_make(gpu, dout, din, bf16);
    struct mt_quant_spec sx = model_spec(r, RX, u), so = model_spec(r, wgrad ? RG : RW, u);
    const struct mt_quant_spec cs = model_spec(r, RX, cu);
    const enum mt_dtype xdt = bf16 ? MT_BF16 : MT_F32;
    const size_t gb = gpu->quant->saved_bytes(&cs, N, din), cb = cpu->quant->saved_bytes(&cs, N, din);
    void *dcopy = gpu->op.alloc(gpu->ctx, gb);
    std::vector<char> hcopy(cb);
    gpu->quant->save(gpu->ctx, &cs, dcopy, mt_tview(x.dev, xdt, N, din));
    cpu->quant->save(cpu->ctx, &cs, hcopy.data(), mt_tview(x.host(), xdt, N, din));
    // the GEMM quantising x, then the one reading the copy, x's device data NaN
    const size_t nc = (size_t)(m * n);
    void *dc = gpu->op.alloc(gpu->ctx, 4 * nc), *dc2 = gpu->op.alloc(gpu->ctx, 4 * nc);
    const struct mt_tensor xt = mt_tview(x.dev, xdt, N, din);
    const struct mt_tensor ot = mt_tview(o.dev, o.bf16 ? MT_BF16 : MT_F32, o.rows, o.cols);
    if (wgrad) gpu->quant->gemm(gpu->ctx, true, false, &so, ot, &sx, xt, 0.0f, mt_f32((float *)dc, m, n));
    else gpu->quant->gemm(gpu->ctx, false, true, &sx, xt, &so, ot, 0.0f, mt_f32((float *)dc, m, n));
    gpu->op.memset(gpu->ctx, x.dev, 0xff, x.bytes());
    struct mt_quant_spec ss = sx;
    ss.saved = dcopy;
    if (wgrad) gpu->quant->gemm(gpu->ctx, true, false, &so, ot, &ss, xt, 0.0f, mt_f32((float *)dc2, m, n));
    else gpu->quant->gemm(gpu->ctx, false, true, &ss, xt, &so, ot, 0.0f, mt_f32((float *)dc2, m, n));
    std::vector<float> c1(nc), c2(nc), hc(nc);
    gpu->op.copy(gpu->ctx, c1.data(), dc, 4 * nc);
    gpu->op.copy(gpu->ctx, c2.data(), dc2, 4 * nc);
    int differ = 0;
    for (size_t i = 0; i < nc; i++) differ += bits(c1[i]) != bits(c2[i]);
    // the CPU's GEMM reading its copy (x NaN there too), and sum |a b| of qdq's values
    std::vector<float> nan_x(x.x.size(), NAN), qx(x.x.size()), qo(o.x.size());
    struct mt_quant_spec hs = sx;
    hs.saved = hcopy.data();
    const struct mt_tensor hx = mt_f32(nan_x.data(), N, din), ho = mt_tview(o.host(), o.bf16 ? MT_BF16 : MT_F32, o.rows, o.cols);
    if (wgrad) cpu->quant->gemm(cpu->ctx, true, false, &so, ho, &hs, hx, 0.0f, mt_f32(hc.data(), m, n));
    else cpu->quant->gemm(cpu->ctx, false, true, &hs, hx, &so, ho, 0.0f, mt_f32(hc.data(), m, n));
    cpu->quant->qdq(cpu->ctx, &sx, mt_f32(qx.data(), N, din), mt_tview(x.host(), xdt, N, din));
    cpu->quant->qdq(cpu->ctx, &so, mt_f32(qo.data(), o.rows, o.cols), ho);
    int bad = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double mag = 0;
            for (int64_t kk = 0; kk < k; kk++)
                mag += wgrad ? fabs((double)qo[(size_t)(kk * dout + i)] * qx[(size_t)(kk * din + j)])
                             : fabs((double)qx[(size_t)(i * din + kk)] * qo[(size_t)(j * din + kk)]);
            const size_t e = (size_t)(i * n + j);
            if (!(fabs((double)c2[e] - hc[e]) <= qgemm_bound(k, mag, 0.0f, 0.0f, false, r == NVFP4, hc[e], c2[e])))
                bad++;
        }
    emu_check(gb == cb && !differ && !bad,
              "saved copy %s, %s GEMM reading it: m %lld n %lld k %lld, %s x: %zu bytes (the CPU's %zu); the bits of "
              "the GEMM quantising x (%d differ); within (K + 4) 2^-24 sum|ab| of the CPU's GEMM on its copy "
              "(%d outside)", recipe_name[r], use_name[u], (long long)m, (long long)n, (long long)k,
              bf16 ? "bf16" : "fp32", gb, cb, differ, bad);
    for (void *p : {x.dev, o.dev, dc, dc2, dcopy}) gpu->op.free(gpu->ctx, p);
}

static void run_saved(bool h100)
{
    const struct mt_kernels *gpu = cuda_backend();
    const struct mt_kernels *cpu = mt_kernels_cpu();
    const std::vector<enum recipe> mine =
        h100 ? std::vector<enum recipe>{DELAYED, TENSORWISE, BLOCKWISE} : std::vector<enum recipe>{MXFP8, NVFP4, BLOCKWISE};
    static const int64_t shapes3[][3] = {{37, 64, 96}, {64, 136, 320}, {21, 40, 30}};
    for (const enum recipe r : mine)
        for (const auto &sh : shapes3) {
            saved_case(gpu, cpu, r, WGRAD, sh[0], sh[1], sh[2], false);
            saved_case(gpu, cpu, r, WGRAD, sh[0], sh[1], sh[2], true);
            if (r == DELAYED || r == TENSORWISE) saved_case(gpu, cpu, r, FWD, sh[0], sh[1], sh[2], true);
        }
    cuda_backend_done();
}

// Quantisation fused with its producer (struct mt_quant_ops rmsnorm_fwd, swiglu_fwd;
// doc/fp8.md, "Quantisation fused with its producer"), for the forward input of a
// recipe whose x the producers quantise (mt_quant_fusable), on (N, C) with partial 32-
// and 128-blocks, fp32 and bf16 outputs: out bit for bit the op's of struct mt_kernels;
// the block copy byte for byte the CPU backend's save of that out (the CPU recipe) and
// the CUDA backend's save of it, the tensorwise amax the CPU's of out and the one save
// records; the quantised GEMM reading what the producer emitted bit for bit the GEMM
// quantising out from memory.
static void fused_case(const struct mt_kernels *gpu, const struct mt_kernels *cpu, enum recipe r, bool swiglu,
                       int64_t N, int64_t C, bool bf16, int64_t dout)
{
    struct mt_quant_spec sx = model_spec(r, RX, FWD);
    const bool tensor = sx.scaling == MT_Q_TENSOR;
    emu_check(mt_quant_fusable(&sx), "%s forward x: a producer can emit its quantisation", recipe_name[r]);
    const enum mt_dtype odt = bf16 ? MT_BF16 : MT_F32;
    const size_t n = (size_t)(N * C), obytes = n * (bf16 ? 2 : 4);
    qg_operand a = qg_make(gpu, N, C, bf16), b = qg_make(gpu, N, C, bf16), w = qg_make(gpu, 1, C, false);
    void *out1 = gpu->op.alloc(gpu->ctx, obytes), *out2 = gpu->op.alloc(gpu->ctx, obytes);
    float *rstd = static_cast<float *>(gpu->op.alloc(gpu->ctx, sizeof(float) * (size_t)N));
    const size_t cb = gpu->quant->saved_bytes(&sx, N, C);
    void *fused = gpu->op.alloc(gpu->ctx, tensor ? sizeof(float) : cb), *dcopy = gpu->op.alloc(gpu->ctx, cb);
    const struct mt_tensor o1 = mt_tview(out1, odt, N, C), o2 = mt_tview(out2, odt, N, C);
    const struct mt_tensor ta = mt_tview(a.dev, a.bf16 ? MT_BF16 : MT_F32, N, C);
    const struct mt_tensor tb = mt_tview(b.dev, b.bf16 ? MT_BF16 : MT_F32, N, C);
    const struct mt_tensor tw = mt_f32(static_cast<float *>(w.dev), 1, C);
    if (swiglu) {
        gpu->op.swiglu_fwd(gpu->ctx, o1, ta, tb, (int)N, (int)C);
        gpu->quant->swiglu_fwd(gpu->ctx, &sx, fused, o2, ta, tb, (int)N, (int)C);
    } else {
        gpu->op.rmsnorm_fwd(gpu->ctx, o1, rstd, ta, tw, (int)N, (int)C, 1e-5f);
        gpu->quant->rmsnorm_fwd(gpu->ctx, &sx, fused, o2, rstd, ta, tw, (int)N, (int)C, 1e-5f);
    }
    std::vector<char> h1(obytes), h2(obytes), hf(tensor ? sizeof(float) : cb), hs(cb), hcpu(cb);
    gpu->op.copy(gpu->ctx, h1.data(), out1, obytes);
    gpu->op.copy(gpu->ctx, h2.data(), out2, obytes);
    gpu->op.copy(gpu->ctx, hf.data(), fused, hf.size());
    gpu->quant->save(gpu->ctx, &sx, dcopy, o1);
    gpu->op.copy(gpu->ctx, hs.data(), dcopy, cb);
    cpu->quant->save(cpu->ctx, &sx, hcpu.data(), mt_tview(h1.data(), odt, N, C));
    const bool out_same = !memcmp(h1.data(), h2.data(), obytes);
    int differ_cpu = 0, differ_save = 0;
    if (tensor) {
        // the amax of out (fp32 values of what is stored), as the CPU recipe finds it
        std::vector<float> v(n);
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            if (bf16) u = (uint32_t)((const uint16_t *)h1.data())[i] << 16;
            else memcpy(&u, h1.data() + 4 * i, 4);
            memcpy(&v[i], &u, 4);
        }
        const float want = mt_q_amax(v.data(), N, C, C);
        differ_cpu = memcmp(hf.data(), &want, 4) != 0;
        differ_save = memcmp(hf.data(), hs.data() + 4, 4) != 0; // the amax save recorded
    } else {
        // the scales from byte 16, the codes at the end (not the alignment between)
        const size_t sb = (size_t)N * (sx.scaling == MT_Q_MX ? (size_t)(C + 31) / 32 : 4 * (size_t)((C + 127) / 128));
        for (size_t i = 16; i < cb; i++)
            if (i < 16 + sb || i >= cb - n) differ_cpu += hf[i] != hcpu[i], differ_save += hf[i] != hs[i];
    }
    // the forward GEMM, out (N, C) x W (dout, C)^T: quantising out, and reading what the
    // producer emitted (out's device data NaN there)
    struct mt_quant_spec sw = model_spec(r, RW, FWD), sf = sx;
    qg_operand wt = qg_make(gpu, dout, C, false);
    const struct mt_tensor twt = mt_f32(static_cast<float *>(wt.dev), dout, C);
    const size_t nc = (size_t)(N * dout);
    void *c1 = gpu->op.alloc(gpu->ctx, 4 * nc), *c2 = gpu->op.alloc(gpu->ctx, 4 * nc);
    gpu->quant->gemm(gpu->ctx, false, true, &sx, o1, &sw, twt, 0.0f, mt_f32(static_cast<float *>(c1), N, dout));
    if (tensor) sf.tensor_amax = static_cast<const float *>(fused);
    else {
        sf.saved = fused;
        gpu->op.memset(gpu->ctx, out2, 0xff, obytes);
    }
    gpu->quant->gemm(gpu->ctx, false, true, &sf, o2, &sw, twt, 0.0f, mt_f32(static_cast<float *>(c2), N, dout));
    std::vector<char> hc1(4 * nc), hc2(4 * nc);
    gpu->op.copy(gpu->ctx, hc1.data(), c1, 4 * nc);
    gpu->op.copy(gpu->ctx, hc2.data(), c2, 4 * nc);
    int differ_gemm = 0;
    for (size_t i = 0; i < 4 * nc; i += 4) differ_gemm += memcmp(hc1.data() + i, hc2.data() + i, 4) != 0;
    emu_check(out_same && !differ_cpu && !differ_save && !differ_gemm,
              "%s fused with %s, %lldx%lld %s out: out bit for bit the unfused op's; %s the CPU recipe's (%d differ) "
              "and save's (%d differ); the forward GEMM reading it bit for bit the one quantising out (%d of %zu "
              "differ)", recipe_name[r], swiglu ? "SwiGLU" : "RMSNorm", (long long)N, (long long)C,
              bf16 ? "bf16" : "fp32", tensor ? "the amax" : "codes and scales", differ_cpu, differ_save, differ_gemm,
              nc);
    for (void *p : {a.dev, b.dev, w.dev, wt.dev, out1, out2, (void *)rstd, fused, dcopy, c1, c2})
        gpu->op.free(gpu->ctx, p);
}

static void run_fused(bool h100)
{
    const struct mt_kernels *gpu = cuda_backend();
    const struct mt_kernels *cpu = mt_kernels_cpu();
    const std::vector<enum recipe> mine =
        h100 ? std::vector<enum recipe>{TENSORWISE, BLOCKWISE} : std::vector<enum recipe>{MXFP8, BLOCKWISE};
    // (N, C, dout): partial 32- and 128-blocks along the rows (300 = 2 x 128 + 44 =
    // 9 x 32 + 12), tokens not a multiple of 4 (the blockwise GEMM's padded rows)
    static const int64_t sh[][3] = {{37, 96, 64}, {21, 300, 40}, {64, 160, 32}};
    for (const enum recipe r : mine)
        for (const auto &x : sh)
            for (int swiglu = 0; swiglu < 2; swiglu++) {
                fused_case(gpu, cpu, r, swiglu, x[0], x[1], false, x[2]);
                fused_case(gpu, cpu, r, swiglu, x[0], x[1], true, x[2]);
            }
    // what a producer cannot emit is refused by the predicate the model asks
    struct mt_quant_spec d = model_spec(DELAYED, RX, FWD), g = model_spec(BLOCKWISE, RX, WGRAD);
    const struct mt_quant_spec f4 = model_spec(NVFP4, RX, FWD);
    const float one = 1.0f;
    d.scale = &one;
    emu_check(!mt_quant_fusable(&d) && !mt_quant_fusable(&g) && !mt_quant_fusable(&f4),
              "delayed scaling, blocks along the tokens and NVFP4 are not fused");
    cuda_backend_done();
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "quant")) run_quant();
    else if (!strcmp(mode, "order")) run_order();
    else if (!strcmp(mode, "qdq")) run_qdq();
    else if (!strcmp(mode, "qgemm-h100")) run_qgemm(true);
    else if (!strcmp(mode, "qgemm-gb200")) run_qgemm(false);
    else if (!strcmp(mode, "grouped-h100")) run_qgrouped(true);
    else if (!strcmp(mode, "grouped-gb200")) run_qgrouped(false);
    else if (!strcmp(mode, "saved-h100")) run_saved(true);
    else if (!strcmp(mode, "saved-gb200")) run_saved(false);
    else if (!strcmp(mode, "fused-h100")) run_fused(true);
    else if (!strcmp(mode, "fused-gb200")) run_fused(false);
    else if (!strncmp(mode, "gemm-", 5)) {
        if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 1;
        int dev = 0;
        cudaDeviceProp prop;
        CHECK_CUDA(cudaGetDevice(&dev));
        CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
        const bool h100 = !strcmp(mode, "gemm-h100");
        if ((h100 ? 9 : 10) != prop.major) {
            fprintf(stderr, "emu_quant: %s on a device of compute capability %d.%d (MT_EMU_DEVICE=%s)\n", mode,
                    prop.major, prop.minor, h100 ? "h100" : "gb200");
            return 1;
        }
        if (h100) run_gemm_h100();
        else run_gemm_gb200();
        cublasLtDestroy(lt);
    } else {
        fprintf(stderr, "usage: emu_quant quant|order|qdq|gemm-h100|gemm-gb200|qgemm-h100|qgemm-gb200|grouped-h100|"
                "grouped-gb200|saved-h100|saved-gb200|fused-h100|fused-gb200\n");
        return 2;
    }
    printf("%d checks, %d failed\n", emu_checks, emu_failures);
    return emu_failures ? 1 : 0;
}

/* GPU op benchmark: the compute-bound ops of one Qwen3-30B-A3B layer (and its LM head)
 * through the CUDA backend's op table, as TFLOP/s and as a fraction of the GPU's dense
 * bf16 tensor-core peak (multiprocessors x clock x bf16 FLOP per clock, from the device).
 *
 * Shapes (Qwen3-30B-A3B): hidden 2048, 32 query heads and 4 KV groups of 128, 128
 * experts of width 768, top-8, vocabulary 151936; one micro batch of 4096 tokens, and
 * attention also at 32768 tokens. Each op runs a few times to warm up, then `reps`
 * times back to back; the time is the host wall clock around those reps and one sync.
 * FLOPs are the useful ones: 2 M N K per GEMM; causal attention forward 2 B Hq T^2 D
 * (half of the square, two products), backward 2.5x that (FlashAttention's convention;
 * this backend's deterministic backward does 3.5x, so its hardware rate is 1.4x the
 * figure shown). Prints one line per op; exits 77 without a CUDA device.
 *
 * usage: bench/gpu_ops [reps]   (default 20) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/kernels.h"
#include "util/error.h"
#include "util/rng.h"

static const struct mt_kernels *K;
static double peak_tflops;
static int reps = 20;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Device buffer of n floats of normal(0, scale) values, bf16-exact as model tensors are:
 * one 4M-value block drawn once, scaled and repeated (timing needs realistic values,
 * not independent ones, and the LM-head tensors hold ~10^9 of them). */
static float *drandn(size_t n, float scale)
{
    enum { CHUNK = 1 << 22 };
    static float *block;
    static size_t shift; /* a different rotation of the block per tensor */
    float *d = K->op.alloc(K->ctx, sizeof(float) * n), *h = malloc(sizeof(float) * CHUNK);
    if (!block) {
        block = malloc(sizeof(float) * CHUNK);
        for (size_t i = 0; block && i < CHUNK; i++) block[i] = mt_rng_normal(0xbe4c, 1, i);
    }
    if (!d || !h || !block) {
        fprintf(stderr, "gpu_ops: out of memory for %zu floats\n", n);
        exit(1);
    }
    shift += 7919;
    for (size_t i = 0; i < CHUNK; i++) h[i] = scale * block[(i + shift) % CHUNK];
    mt_kernels_cpu()->op.bf16_round(NULL, h, h, CHUNK);
    for (size_t off = 0; off < n; off += CHUNK)
        K->op.copy(K->ctx, d + off, h, sizeof(float) * (n - off < CHUNK ? n - off : CHUNK));
    free(h);
    return d;
}

static float *dzeros(size_t n)
{
    float *d = K->op.alloc(K->ctx, sizeof(float) * n);
    if (!d) {
        fprintf(stderr, "gpu_ops: out of device memory for %zu floats\n", n);
        exit(1);
    }
    K->op.memset(K->ctx, d, 0, sizeof(float) * n);
    return d;
}

static void report(const char *name, const char *shape, double flops, double seconds)
{
    double tf = flops / seconds / 1e12;
    printf("%-22s %-44s %9.3f ms %8.1f TFLOP/s %5.1f%% of peak\n", name, shape, 1e3 * seconds, tf,
           peak_tflops > 0 ? 100.0 * tf / peak_tflops : 0.0);
    fflush(stdout);
}

/* ------------------------------------------------------------------ dense GEMM */

struct gemm_bench {
    const char *name;
    bool ta, tb;
    int M, N, Kd;
};

static void bench_gemm(const struct gemm_bench *g)
{
    const size_t na = (size_t)g->M * g->Kd, nb = (size_t)g->Kd * g->N, nc = (size_t)g->M * g->N;
    float *A = drandn(na, 1.0f), *B = drandn(nb, 0.02f), *C = dzeros(nc);
    const struct mt_tensor tA = g->ta ? mt_f32(A, g->Kd, g->M) : mt_f32(A, g->M, g->Kd);
    const struct mt_tensor tB = g->tb ? mt_f32(B, g->N, g->Kd) : mt_f32(B, g->Kd, g->N);
    for (int i = 0; i < 3; i++)
        K->op.gemm(K->ctx, g->ta, g->tb, g->M, g->N, g->Kd, 1.0f, tA, tB, 0.0f, mt_f32(C, g->M, g->N));
    K->op.sync(K->ctx);
    double t0 = now();
    for (int i = 0; i < reps; i++)
        K->op.gemm(K->ctx, g->ta, g->tb, g->M, g->N, g->Kd, 1.0f, tA, tB, 0.0f, mt_f32(C, g->M, g->N));
    K->op.sync(K->ctx);
    double t = (now() - t0) / reps;
    char shape[96];
    snprintf(shape, sizeof shape, "%c%c M=%d N=%d K=%d", g->ta ? 'T' : 'N', g->tb ? 'T' : 'N', g->M, g->N, g->Kd);
    report(g->name, shape, 2.0 * g->M * g->N * g->Kd, t);
    K->op.free(K->ctx, A);
    K->op.free(K->ctx, B);
    K->op.free(K->ctx, C);
}

/* ------------------------------------------------------------------ grouped GEMM */

/* One expert projection over E experts with `rows` routed rows, uniform or skewed
 * (half the rows on an eighth of the experts), in the three products of training. */
static void bench_grouped(int E, int rows, int out, int in, bool skew)
{
    int32_t *offs = malloc(sizeof(int32_t) * (E + 1));
    offs[0] = 0;
    int hot = E / 8 > 0 ? E / 8 : 1, left = rows;
    for (int e = 0; e < E; e++) {
        int m = skew ? (e < hot ? rows / 2 / hot : (rows - rows / 2) / (E - hot)) : rows / E;
        if (e == E - 1) m = left;
        offs[e + 1] = offs[e] + m;
        left -= m;
    }
    int32_t *d_offs = K->op.alloc(K->ctx, sizeof(int32_t) * (E + 1));
    K->op.copy(K->ctx, d_offs, offs, sizeof(int32_t) * (E + 1));
    float *x = drandn((size_t)rows * in, 1.0f), *w = drandn((size_t)E * out * in, 0.02f);
    float *y = drandn((size_t)rows * out, 1.0f), *dw = dzeros((size_t)E * out * in);
    float *dx = dzeros((size_t)rows * in);
    const struct mt_tensor tx = mt_f32(x, rows, in), ty = mt_f32(y, rows, out), tdx = mt_f32(dx, rows, in);
    const struct mt_tensor tw = mt_f32(w, (int64_t)E * out, in), tdw = mt_f32(dw, (int64_t)E * out, in);
    const double flops = 2.0 * rows * out * in;
    static const char *names[] = {"grouped fwd", "grouped dgrad", "grouped wgrad"};
    char shape[96];
    snprintf(shape, sizeof shape, "E=%d rows=%d %dx%d%s", E, rows, out, in, skew ? " skewed" : "");
    for (int mode = 0; mode < 3; mode++) {
        double t0 = 0.0;
        for (int i = 0; i < reps + 3; i++) {
            if (i == 3) { /* three warm-up runs, then the timed ones */
                K->op.sync(K->ctx);
                t0 = now();
            }
            if (mode == 0)
                K->op.grouped_gemm(K->ctx, false, true, E, d_offs, 0, out, in, 1.0f, tx, tw, 0.0f, ty);
            else if (mode == 1)
                K->op.grouped_gemm(K->ctx, false, false, E, d_offs, 0, in, out, 1.0f, ty, tw, 0.0f, tdx);
            else K->op.grouped_gemm(K->ctx, true, false, E, d_offs, out, in, 0, 1.0f, ty, tx, 1.0f, tdw);
        }
        K->op.sync(K->ctx);
        report(names[mode], shape, flops, (now() - t0) / reps);
    }
    free(offs);
    K->op.free(K->ctx, d_offs);
    K->op.free(K->ctx, x);
    K->op.free(K->ctx, w);
    K->op.free(K->ctx, y);
    K->op.free(K->ctx, dw);
    K->op.free(K->ctx, dx);
}

/* ------------------------------------------------------------------ attention */

static void bench_attention(int B, int T, int Hq, int Hkv, int D)
{
    const size_t nq = (size_t)B * T * Hq * D, nkv = (size_t)B * T * Hkv * D;
    float *q = drandn(nq, 1.0f), *k = drandn(nkv, 1.0f), *v = drandn(nkv, 1.0f), *dout = drandn(nq, 1.0f);
    float *out = dzeros(nq), *lse = dzeros((size_t)B * Hq * T);
    float *dq = dzeros(nq), *dk = dzeros(nkv), *dv = dzeros(nkv);
    const struct mt_tensor tq = mt_f32(q, (int64_t)B * T, (int64_t)Hq * D);
    const struct mt_tensor tk = mt_f32(k, (int64_t)B * T, (int64_t)Hkv * D);
    const struct mt_tensor tv = mt_f32(v, (int64_t)B * T, (int64_t)Hkv * D);
    const double fwd_flops = 2.0 * B * Hq * (double)T * T * D;
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d T=%d Hq=%d Hkv=%d D=%d causal", B, T, Hq, Hkv, D);
    for (int i = 0; i < 2; i++) K->op.attention_fwd(K->ctx, out, lse, tq, tk, tv, B, T, Hq, Hkv, D);
    K->op.sync(K->ctx);
    double t0 = now();
    for (int i = 0; i < reps; i++) K->op.attention_fwd(K->ctx, out, lse, tq, tk, tv, B, T, Hq, Hkv, D);
    K->op.sync(K->ctx);
    report("attention fwd", shape, fwd_flops, (now() - t0) / reps);
    for (int i = 0; i < 2; i++)
        K->op.attention_bwd(K->ctx, dq, dk, dv, dout, tq, tk, tv, out, lse, B, T, Hq, Hkv, D);
    K->op.sync(K->ctx);
    t0 = now();
    for (int i = 0; i < reps; i++)
        K->op.attention_bwd(K->ctx, dq, dk, dv, dout, tq, tk, tv, out, lse, B, T, Hq, Hkv, D);
    K->op.sync(K->ctx);
    report("attention bwd", shape, 2.5 * fwd_flops, (now() - t0) / reps);
    float *bufs[] = {q, k, v, dout, out, lse, dq, dk, dv};
    for (int i = 0; i < 9; i++) K->op.free(K->ctx, bufs[i]);
}

int main(int argc, char **argv)
{
    if (argc > 1) reps = atoi(argv[1]) > 0 ? atoi(argv[1]) : reps;
    char desc[256];
    if (mt_cuda_describe(desc, sizeof desc) == 0) {
        printf("gpu_ops: %s\n", desc);
        return 77;
    }
    struct mt_err err;
    mt_err_clear(&err);
    K = mt_kernels_cuda(&err);
    if (!K) {
        fprintf(stderr, "gpu_ops: %s\n", err.msg);
        return 1;
    }
    struct mt_cuda_device_info info;
    mt_cuda_device_info(&info);
    peak_tflops = info.bf16_dense_tflops;
    const char *compute = getenv("MT_CUDA_GEMM_COMPUTE");
    printf("# %s: %d SMs at %.2f GHz, %.0f GiB; dense bf16 peak %.0f TFLOP/s (SMs x clock x FLOP/clk)\n",
           info.name, info.sm_count, info.clock_ghz, info.mem_gib, peak_tflops);
    printf("# GEMM compute: %s (MT_CUDA_GEMM_COMPUTE); %d reps per op\n", compute ? compute : "bf16", reps);

    const int N = 4096, H = 2048, Q = 32 * 128, KV = 4 * 128, V = 151936, E = 128, k = 8, Fe = 768;
    const struct gemm_bench gemms[] = {
        {"q proj fwd", false, true, N, Q, H},
        {"kv proj fwd", false, true, N, KV, H},
        {"o proj fwd", false, true, N, H, Q},
        {"o proj dgrad", false, false, N, Q, H},
        {"o proj wgrad", true, false, H, Q, N},
        {"router fwd", false, true, N, E, H},
        {"lm head fwd", false, true, N, V, H},
        {"lm head dgrad", false, false, N, H, V},
        {"lm head wgrad", true, false, V, H, N},
    };
    for (size_t i = 0; i < sizeof gemms / sizeof gemms[0]; i++) bench_gemm(&gemms[i]);
    bench_grouped(E, N * k, Fe, H, false); /* gate or up projection */
    bench_grouped(E, N * k, H, Fe, false); /* down projection */
    bench_grouped(E, N * k, Fe, H, true);
    bench_attention(1, 4096, 32, 4, 128);
    bench_attention(1, 32768, 32, 4, 128);

    struct mt_cuda_mem_stats ms;
    mt_cuda_mem_stats(K, &ms);
    printf("# device memory: peak in use %.2f GiB, reserved %.2f GiB, %lld cudaMalloc calls\n",
           ms.peak_in_use / 1073741824.0, ms.reserved / 1073741824.0, ms.device_allocs);
    struct mt_cuda_gemm_stats gs;
    mt_cuda_gemm_stats(K, &gs);
    printf("# dense GEMMs: %lld shapes, %lld calls; on the %s fallback: %lld shapes, %lld calls\n",
           gs.shapes, gs.calls, gs.fallback_compute ? gs.fallback_compute : "fp32",
           gs.fallback_shapes, gs.fallback_calls);
    if (mt_kernels_cuda_destroy(&err)) {
        fprintf(stderr, "gpu_ops: %s\n", err.msg);
        return 1;
    }
    return 0;
}

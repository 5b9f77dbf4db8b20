// The CUDA backend's dense GEMM path on the emulator (emu_gemm.sh runs it): the
// fallback from the tensor-core compute type to CUBLAS_COMPUTE_32F, its counts, and the
// teardown of the backend (GEMM plans, cuBLASLt handle) with a second backend after it.
//
//   emu_gemm fallback       with MT_EMU_CUBLASLT_TENSOR_CORE_ALIGN=16: the emulated
//                           heuristic refuses 32F_FAST_16BF for two of the three shapes
//   emu_gemm tensor-cores   without it: every shape on 32F_FAST_16BF
//
// The operands make the compute type visible without depending on rounding order:
// A's elements are n or n + 2^-9 (n = 1, 2, 3), which bf16 rounds to n, B's small
// integers; every product and sum is exact in fp32, so a result is exactly the sum with
// A as given (32F) or with A rounded (32F_FAST_16BF), whatever the order of the sums.
// emu_gemm.sh checks the warnings on stderr (one per fallback shape, not per call).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/emu/mt_emu.h"
#include "tests/gpu/emu_test.h"
extern "C" {
#include "util/error.h" // a C header without its own extern "C"
}


// One GEMM shape in moetrain's row-major convention (kernels.h): op(A) (M,K), op(B)
// (K,N), C (M,N); a_offset floats shift A's pointer (4: 4-byte aligned).
struct shape {
    const char *name;
    bool ta, tb;
    int M, N, K, lda, ldb, ldc, a_offset;
};

static float a_at(int i, int k) { return (float)(1 + (i + 2 * k) % 3) + ((i + k) % 2 ? 0x1p-9f : 0.0f); }
static float b_at(int k, int j) { return (float)((3 * k + j) % 5 - 2); }

// C = A B on the device through the op table, calls times; true when every element is
// the exact sum with A as given (exact) or rounded to its integer part (!exact).
static bool run(const struct mt_kernels *k, const shape &s, int calls, bool exact)
{
    const size_t na = (size_t)(s.ta ? s.K : s.M) * s.lda, nb = (size_t)(s.tb ? s.N : s.K) * s.ldb;
    const size_t nc = (size_t)s.M * s.ldc;
    std::vector<float> A(na, NAN), B(nb, NAN), C(nc);
    for (int i = 0; i < s.M; i++)
        for (int kk = 0; kk < s.K; kk++) A[s.ta ? (size_t)kk * s.lda + i : (size_t)i * s.lda + kk] = a_at(i, kk);
    for (int kk = 0; kk < s.K; kk++)
        for (int j = 0; j < s.N; j++) B[s.tb ? (size_t)j * s.ldb + kk : (size_t)kk * s.ldb + j] = b_at(kk, j);
    float *dA = (float *)k->op.alloc(k->ctx, sizeof(float) * (na + s.a_offset));
    float *dB = (float *)k->op.alloc(k->ctx, sizeof(float) * nb);
    float *dC = (float *)k->op.alloc(k->ctx, sizeof(float) * nc);
    if (!dA || !dB || !dC) {
        fprintf(stderr, "emu_gemm: alloc failed\n");
        exit(1);
    }
    k->op.copy(k->ctx, dA + s.a_offset, A.data(), sizeof(float) * na);
    k->op.copy(k->ctx, dB, B.data(), sizeof(float) * nb);
    for (int c = 0; c < calls; c++)
        k->op.gemm(k->ctx, s.ta, s.tb, s.M, s.N, s.K, 1.0f,
                   mt_tview_ld(dA + s.a_offset, MT_F32, s.ta ? s.K : s.M, s.ta ? s.M : s.K, s.lda),
                   mt_tview_ld(dB, MT_F32, s.tb ? s.N : s.K, s.tb ? s.K : s.N, s.ldb), 0.0f,
                   mt_tview_ld(dC, MT_F32, s.M, s.N, s.ldc));
    k->op.copy(k->ctx, C.data(), dC, sizeof(float) * nc);
    k->op.free(k->ctx, dA);
    k->op.free(k->ctx, dB);
    k->op.free(k->ctx, dC);
    int bad = 0;
    for (int i = 0; i < s.M; i++)
        for (int j = 0; j < s.N; j++) {
            double want = 0;
            for (int kk = 0; kk < s.K; kk++) {
                const float a = a_at(i, kk);
                want += (double)(exact ? a : floorf(a)) * b_at(kk, j);
            }
            bad += C[(size_t)i * s.ldc + j] != (float)want;
        }
    return bad == 0;
}

static bool live_objects_are(long handles, long descs, long layouts, long prefs)
{
    const mt_emu::cublaslt_objects o = mt_emu::cublaslt_live_objects();
    printf("     cuBLASLt objects alive: %ld handle(s), %ld matmul descriptor(s), %ld layout(s), %ld preference(s)\n",
           o.handles, o.matmul_descs, o.layouts, o.preferences);
    return o.handles == handles && o.matmul_descs == descs && o.layouts == layouts && o.preferences == prefs;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "fallback") && strcmp(mode, "tensor-cores")) {
        fprintf(stderr, "usage: emu_gemm fallback|tensor-cores\n");
        return 2;
    }
    const bool fallback = !strcmp(mode, "fallback");
    const shape shapes[] = {
        {"aligned (16-byte leading dimensions and pointers)", false, false, 8, 8, 16, 16, 8, 8, 0},
        {"K = lda = 13 (52-byte rows of A)", false, false, 8, 8, 13, 13, 8, 8, 0},
        {"A and B transposed, A 4 bytes off", true, true, 8, 8, 16, 8, 16, 8, 1},
    };
    const int calls = 3;

    struct mt_err err;
    mt_err_clear(&err);
    const struct mt_kernels *k = mt_kernels_cuda(&err);
    if (!k) {
        fprintf(stderr, "emu_gemm: %s\n", err.msg);
        return 1;
    }
    for (int i = 0; i < 3; i++) {
        const bool on_fallback = fallback && i > 0;
        emu_check(run(k, shapes[i], calls, on_fallback), "%s, %d calls: %s", shapes[i].name, calls,
              on_fallback ? "computed in fp32 (A not rounded)" : "computed with A rounded to bf16");
    }
    struct mt_cuda_gemm_stats s;
    mt_cuda_gemm_stats(k, &s);
    printf("     stats: %lld shapes, %lld calls asking for %s; on %s: %lld shapes, %lld calls\n", s.shapes, s.calls,
           s.compute ? s.compute : "(null)", s.fallback_compute ? s.fallback_compute : "(null)", s.fallback_shapes,
           s.fallback_calls);
    emu_check(s.compute && !strcmp(s.compute, "CUBLAS_COMPUTE_32F_FAST_16BF") && s.fallback_compute &&
              !strcmp(s.fallback_compute, "CUBLAS_COMPUTE_32F"),
          "stats name the compute type asked for and the fallback");
    emu_check(s.shapes == 3 && s.calls == 3 * calls, "stats: 3 shapes, %d calls", 3 * calls);
    emu_check(s.fallback_shapes == (fallback ? 2 : 0) && s.fallback_calls == (fallback ? 2 * calls : 0),
          "stats: %d shapes, %d calls on the fallback", fallback ? 2 : 0, fallback ? 2 * calls : 0);
    // one handle; per plan a matmul descriptor and three layouts (a refused attempt
    // destroyed its own); the heuristic's preferences are gone once it answered
    emu_check(live_objects_are(1, 3, 9, 0), "before teardown: 1 handle, 3 plans (3 descriptors, 9 layouts)");

    void *held = k->op.alloc(k->ctx, 1000); // still handed out at teardown: released too
    emu_check(held != nullptr, "a block held across the teardown");
    emu_check(mt_kernels_cuda_destroy(&err) == MT_OK, "mt_kernels_cuda_destroy: %s", err.code ? err.msg : "MT_OK");
    emu_check(live_objects_are(0, 0, 0, 0), "after teardown: no cuBLASLt object alive (plans and handle destroyed)");
    mt_cuda_gemm_stats(k, &s);
    emu_check(!s.compute && s.shapes == 0 && s.calls == 0, "stats of a destroyed backend: none");
    emu_check(mt_kernels_cuda_destroy(&err) == MT_OK, "a second teardown has nothing to do");

    // a backend built again after the teardown starts afresh
    const struct mt_kernels *k2 = mt_kernels_cuda(&err);
    emu_check(k2 != nullptr, "mt_kernels_cuda after the teardown: %s", k2 ? "a new backend" : err.msg);
    if (k2) {
        emu_check(run(k2, shapes[0], 1, false), "the new backend: %s, computed with A rounded to bf16", shapes[0].name);
        mt_cuda_gemm_stats(k2, &s);
        emu_check(s.shapes == 1 && s.calls == 1 && s.fallback_shapes == 0, "the new backend's stats: 1 shape, 1 call");
        emu_check(live_objects_are(1, 1, 3, 0), "the new backend: 1 handle, 1 plan");
        emu_check(mt_kernels_cuda_destroy(&err) == MT_OK, "the new backend's teardown: %s",
              err.code ? err.msg : "MT_OK");
        emu_check(live_objects_are(0, 0, 0, 0), "after it: no cuBLASLt object alive");
    }
    printf("%d checks, %d failed\n", emu_checks, emu_failures);
    return emu_failures ? 1 : 0;
}

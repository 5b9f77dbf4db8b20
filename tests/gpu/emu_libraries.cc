// The CUDA emulator's cuBLASLt and cub, written from their documentation, against
// hand-computed cases: every operand layout (N/T), leading dimensions above the row
// count, alpha and beta, the compute types' operand rounding (32F, 32F_FAST_16BF:
// nearest-even to bf16, 32F_FAST_TF32: nearest with ties away to tf32), bf16 matrices
// (exact operands, a bf16 D rounded to nearest even, the combinations cuBLASLt lacks
// refused), beta = 0
// leaving C unread, the preference's alignment enforced; cub::DeviceRadixSort::SortPairs
// as a stable sort over a bit range with the temporary-storage protocol.
#include <cublasLt.h>
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/emu_test.h"

#define CHECK_LT(call)                                                                                     \
    do {                                                                                                   \
        const cublasStatus_t s_ = (call);                                                                  \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                 \
            fprintf(stderr, "emu_libraries: %s:%d: %s: status %d\n", __FILE__, __LINE__, #call, (int)s_); \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

static int checks, failures;
static void check(bool ok, const char *what)
{
    checks++;
    if (!ok) failures++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

template <typename T>
static T *dev(const T *h, size_t n)
{
    void *p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
    if (h) CHECK_CUDA(cudaMemcpy(p, h, n * sizeof(T), cudaMemcpyHostToDevice));
    return static_cast<T *>(p);
}

// ---------------------------------------------------------------- cuBLASLt

static cublasLtHandle_t lt;

// D = alpha op(A) op(B) + beta C, column-major fp32, with D in C's place when d == NULL.
// Returns the status of cublasLtMatmul; the result in out (ldc x n).
static cublasStatus_t matmul(cublasComputeType_t ct, bool ta, bool tb, int m, int n, int k, float alpha,
                             const float *A, int lda, const float *B, int ldb, float beta, const float *C, int ldc,
                             float *out, uint32_t align = 16, size_t a_offset = 0)
{
    cublasLtMatmulDesc_t desc;
    CHECK_LT(cublasLtMatmulDescCreate(&desc, ct, CUDA_R_32F));
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, ta ? k : m, ta ? m : k, lda));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, tb ? n : k, tb ? k : n, ldb));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, ldc));
    cublasLtMatmulPreference_t pref;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    const cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (auto attr : aligns) CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &res, &found));
    const size_t na = (size_t)lda * (ta ? m : k), nb = (size_t)ldb * (tb ? k : n), nc = (size_t)ldc * n;
    float *dA = dev<float>(nullptr, na + a_offset), *dB = dev(B, nb), *dC = dev<float>(nullptr, nc);
    CHECK_CUDA(cudaMemcpy(dA + a_offset, A, na * sizeof(float), cudaMemcpyHostToDevice));
    if (C) CHECK_CUDA(cudaMemcpy(dC, C, nc * sizeof(float), cudaMemcpyHostToDevice)); // else NaN: fresh memory
    const cublasStatus_t st = found ? cublasLtMatmul(lt, desc, &alpha, dA + a_offset, la, dB, lb, &beta, dC, lc, dC,
                                                     lc, &res.algo, nullptr, 0, nullptr)
                                    : CUBLAS_STATUS_NOT_SUPPORTED;
    CHECK_CUDA(cudaMemcpy(out, dC, nc * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaFree(dA));
    CHECK_CUDA(cudaFree(dB));
    CHECK_CUDA(cudaFree(dC));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    return st;
}

// A = [1 2 3; 4 5 6] (2x3), B = [1 0; 0 1; 2 -1] (3x2): A B = [7 -1; 16 -1], stored
// as each op needs (N: the matrix column-major with ld rows; T: its transpose so
// stored), ld = rows + 1 with a NaN in the padding (never read).
static void gemm_layouts(void)
{
    const float Am[2][3] = {{1, 2, 3}, {4, 5, 6}}, Bm[3][2] = {{1, 0}, {0, 1}, {2, -1}};
    const float want[2][2] = {{7, -1}, {16, -1}};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            // N: A column-major 2x3, ld 3; T: A^T (3x2) column-major, ld 4
            const int lda = ta ? 4 : 3, ldb = tb ? 3 : 4, ldc = 3;
            float A[16], B[16], C[6], out[6];
            for (float &x : A) x = NAN;
            for (float &x : B) x = NAN;
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 3; j++) A[ta ? j + i * lda : i + j * lda] = Am[i][j];
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 2; j++) B[tb ? j + i * ldb : i + j * ldb] = Bm[i][j];
            // C = [1 1; 1 1], alpha 2, beta -1: D = 2 A B - 1
            for (float &x : C) x = 1.0f;
            C[2] = C[5] = NAN; // the padding row of C (and D): neither read nor written
            const cublasStatus_t st =
                matmul(CUBLAS_COMPUTE_32F, ta, tb, 2, 2, 3, 2.0f, A, lda, B, ldb, -1.0f, C, ldc, out);
            int bad = st != CUBLAS_STATUS_SUCCESS;
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++) bad += out[i + j * ldc] != 2 * want[i][j] - 1;
            bad += !isnan(out[2]) || !isnan(out[5]); // the padding of D untouched
            char what[128];
            snprintf(what, sizeof what, "cublasLtMatmul %c%c, lda %d ldb %d ldc 3, alpha 2 beta -1: 2 A B - 1",
                     ta ? 'T' : 'N', tb ? 'T' : 'N', lda, ldb);
            check(!bad, what);
        }
}

// beta = 0: C is not read (it holds NaN, as fresh device memory does).
static void gemm_beta_zero(void)
{
    const float A[4] = {1, 2, 3, 4}, B[4] = {1, 0, 0, 1};
    float out[4];
    const cublasStatus_t st = matmul(CUBLAS_COMPUTE_32F, false, false, 2, 2, 2, 1.0f, A, 2, B, 2, 0.0f, nullptr, 2, out);
    check(st == CUBLAS_STATUS_SUCCESS && out[0] == 1 && out[1] == 2 && out[2] == 3 && out[3] == 4,
          "cublasLtMatmul beta 0 over a NaN C: C is not read");
}

// One product per compute type, 1 x 1 x 1 with b = 1: D is a as the compute type
// rounds it.
static void gemm_rounding(void)
{
    struct {
        cublasComputeType_t ct;
        float a, want;
        const char *what;
    } cases[] = {
        {CUBLAS_COMPUTE_32F, 1.0f + 0x1p-9f, 1.0f + 0x1p-9f, "32F: fp32 operands"},
        // bf16 keeps 7 fraction bits: 1 + 2^-8 is a tie, to even (1); 1 + 3 x 2^-9 rounds up
        {CUBLAS_COMPUTE_32F_FAST_16BF, 1.0f + 0x1p-8f, 1.0f, "32F_FAST_16BF: 1 + 2^-8 ties to even, 1"},
        {CUBLAS_COMPUTE_32F_FAST_16BF, 1.0f + 0x3p-9f, 1.0f + 0x1p-7f, "32F_FAST_16BF: 1 + 3 2^-9 rounds to 1 + 2^-7"},
        // tf32 keeps 10: 1 + 2^-11 is a tie, away from zero (1 + 2^-10)
        {CUBLAS_COMPUTE_32F_FAST_TF32, 1.0f + 0x1p-11f, 1.0f + 0x1p-10f, "32F_FAST_TF32: 1 + 2^-11 ties away, 1 + 2^-10"},
        {CUBLAS_COMPUTE_32F_FAST_TF32, -1.0f - 0x1p-11f, -1.0f - 0x1p-10f, "32F_FAST_TF32: -1 - 2^-11 ties away, -1 - 2^-10"},
        {CUBLAS_COMPUTE_32F_FAST_TF32, 1.0f + 0x1p-12f, 1.0f, "32F_FAST_TF32: 1 + 2^-12 rounds to 1"},
    };
    for (const auto &c : cases) {
        const float b = 1.0f;
        float out[1];
        const cublasStatus_t st = matmul(c.ct, false, false, 1, 1, 1, 1.0f, &c.a, 1, &b, 1, 0.0f, nullptr, 1, out);
        char what[160];
        snprintf(what, sizeof what, "cublasLtMatmul compute %s (got %a)", c.what, (double)out[0]);
        check(st == CUBLAS_STATUS_SUCCESS && out[0] == c.want, what);
    }
}

// ---------------------------------------------------------------- cuBLASLt, bf16 matrices

static uint16_t bf16_of(float x) // x bf16-exact
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)(u >> 16);
}
static float f32_of(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

// The heuristic's answer and, when it has an algorithm, D = alpha A B + beta C for
// column-major m x k A and k x n B (ld = rows), C and D m x n (D in C's place when C
// and D share a type), each of its own type; bytes in and out as the types store them.
static cublasStatus_t matmul_typed(cublasComputeType_t ct, cudaDataType_t ta, cudaDataType_t tb, cudaDataType_t tc,
                                   cudaDataType_t td, int m, int n, int k, float alpha, const void *A, const void *B,
                                   float beta, const void *C, void *out)
{
    auto size = [](cudaDataType_t t) -> size_t { return t == CUDA_R_16BF ? 2 : 4; };
    cublasLtMatmulDesc_t desc;
    CHECK_LT(cublasLtMatmulDescCreate(&desc, ct, CUDA_R_32F));
    cublasLtMatrixLayout_t la, lb, lc, ld;
    CHECK_LT(cublasLtMatrixLayoutCreate(&la, ta, m, k, m));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb, tb, k, n, k));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lc, tc, m, n, m));
    CHECK_LT(cublasLtMatrixLayoutCreate(&ld, td, m, n, m));
    cublasLtMatmulPreference_t pref;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 1, &res, &found);
    if (st == CUBLAS_STATUS_SUCCESS && found) {
        const size_t na = size(ta) * m * k, nb = size(tb) * k * n, nc = size(tc) * m * n, nd = size(td) * m * n;
        unsigned char *dA = dev<unsigned char>((const unsigned char *)A, na);
        unsigned char *dB = dev<unsigned char>((const unsigned char *)B, nb);
        unsigned char *dC = dev<unsigned char>((const unsigned char *)C, nc), *dD = dev<unsigned char>(nullptr, nd);
        st = cublasLtMatmul(lt, desc, &alpha, dA, la, dB, lb, &beta, dC, lc, dD, ld, &res.algo, nullptr, 0, nullptr);
        CHECK_CUDA(cudaMemcpy(out, dD, nd, cudaMemcpyDeviceToHost));
        for (unsigned char *p : {dA, dB, dC, dD}) CHECK_CUDA(cudaFree(p));
    } else if (st == CUBLAS_STATUS_SUCCESS) {
        st = CUBLAS_STATUS_NOT_SUPPORTED;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    for (cublasLtMatrixLayout_t l : {la, lb, lc, ld}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(desc);
    return st;
}

// bf16 A and B under 32F: read exactly, into an fp32 D (2 A B - 1 with the matrices of
// gemm_layouts) and into a bf16 D rounded to nearest even (1 + 2^-8 ties to 1, 1 + 3
// 2^-9 rounds to 1 + 2^-7; beta 0 over a NaN C); and the type combinations cuBLASLt
// does not have, refused.
static void gemm_bf16(void)
{
    const float Am[2][3] = {{1, 2, 3}, {4, 5, 6}}, Bm[3][2] = {{1, 0}, {0, 1}, {2, -1}};
    uint16_t A[6], B[6];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) A[i + 2 * j] = bf16_of(Am[i][j]), B[j + 3 * i] = bf16_of(Bm[j][i]);
    const float C[4] = {1, 1, 1, 1};
    float D[4];
    cublasStatus_t st = matmul_typed(CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F, 2, 2, 3,
                                     2.0f, A, B, -1.0f, C, D);
    check(st == CUBLAS_STATUS_SUCCESS && D[0] == 13 && D[1] == 31 && D[2] == -3 && D[3] == -3,
          "cublasLtMatmul bf16 A, B, fp32 C, D under 32F: 2 A B - 1");

    // 1 x 1 x 2 products a . b with a = (1, 1): b = (1, 2^-8) and (1, 3 2^-9), bf16 D
    const uint16_t a2[2] = {bf16_of(1.0f), bf16_of(1.0f)};
    const struct {
        float b1, want;
        const char *what;
    } cases[] = {{0x1p-8f, 1.0f, "cublasLtMatmul bf16 D: 1 + 2^-8 ties to even, 1"},
                 {0x3p-9f, 1.0f + 0x1p-7f, "cublasLtMatmul bf16 D: 1 + 3 2^-9 rounds to 1 + 2^-7"}};
    for (const auto &c : cases) {
        const uint16_t b2[2] = {bf16_of(1.0f), bf16_of(c.b1)}, nan_c = 0x7fc0;
        uint16_t d = 0;
        st = matmul_typed(CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, 1, 1, 2, 1.0f, a2,
                          b2, 0.0f, &nan_c, &d);
        check(st == CUBLAS_STATUS_SUCCESS && f32_of(d) == c.want, c.what);
    }

    const struct {
        cublasComputeType_t ct;
        cudaDataType_t a, b, c, d;
        const char *what;
    } refused[] = {
        {CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, "bf16 A with fp32 B refused"},
        {CUBLAS_COMPUTE_32F_FAST_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F,
         "bf16 A, B under 32F_FAST_16BF refused"},
        {CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, "fp32 A, B with bf16 C, D refused"},
        {CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, CUDA_R_16BF, "fp32 C with bf16 D refused"},
    };
    for (const auto &r : refused) {
        float out[4];
        st = matmul_typed(r.ct, r.a, r.b, r.c, r.d, 2, 2, 3, 1.0f, A, B, 0.0f, C, out);
        char what[128];
        snprintf(what, sizeof what, "cublasLtMatmul %s (CUBLAS_STATUS_NOT_SUPPORTED)", r.what);
        check(st == CUBLAS_STATUS_NOT_SUPPORTED, what);
    }
}

// The preference asks for 16-byte pointers: A 4 bytes off is refused, not computed.
static void gemm_alignment(void)
{
    const float A[4] = {1, 2, 3, 4}, B[4] = {1, 0, 0, 1}, C[4] = {9, 9, 9, 9};
    float out[4];
    const cublasStatus_t st = matmul(CUBLAS_COMPUTE_32F, false, false, 2, 2, 2, 1.0f, A, 2, B, 2, 0.0f, C, 2, out, 16, 1);
    check(st == CUBLAS_STATUS_INVALID_VALUE && out[0] == 9,
          "cublasLtMatmul refuses an A less aligned than the preference's 16 bytes (D untouched)");
}

// ---------------------------------------------------------------- cub

// Keys with ties, values their positions: a stable sort keeps equal keys in input
// order. Signed keys order as numbers; a bit range [0, 4) sorts by the low 4 bits only.
static void radix_sort(void)
{
    const int n = 8;
    const int32_t keys[n] = {3, -1, 3, 0, -7, 3, 18, -1};
    const int32_t vals[n] = {0, 1, 2, 3, 4, 5, 6, 7};
    int32_t *dk = dev(keys, n), *dv = dev(vals, n), *ok = dev<int32_t>(nullptr, n), *ov = dev<int32_t>(nullptr, n);
    size_t bytes = 0;
    CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, bytes, dk, ok, dv, ov, n));
    check(bytes > 0, "SortPairs with no storage returns the bytes it needs");
    void *temp = nullptr;
    CHECK_CUDA(cudaMalloc(&temp, bytes));
    size_t small = bytes - 1;
    check(cub::DeviceRadixSort::SortPairs(temp, small, dk, ok, dv, ov, n) == cudaErrorInvalidValue,
          "SortPairs with a byte less than it asked for fails");
    CHECK_CUDA(cub::DeviceRadixSort::SortPairs(temp, bytes, dk, ok, dv, ov, n));
    int32_t hk[n], hv[n];
    CHECK_CUDA(cudaMemcpy(hk, ok, sizeof hk, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hv, ov, sizeof hv, cudaMemcpyDeviceToHost));
    const int32_t wk[n] = {-7, -1, -1, 0, 3, 3, 3, 18}, wv[n] = {4, 1, 7, 3, 0, 2, 5, 6};
    check(!memcmp(hk, wk, sizeof wk) && !memcmp(hv, wv, sizeof wv),
          "SortPairs: signed keys in numeric order, equal keys in input order (stable)");
    // low 4 bits: 3->3, -1->15, 0->0, -7->9, 18->2
    CHECK_CUDA(cub::DeviceRadixSort::SortPairs(temp, bytes, dk, ok, dv, ov, n, 0, 4));
    CHECK_CUDA(cudaMemcpy(hk, ok, sizeof hk, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hv, ov, sizeof hv, cudaMemcpyDeviceToHost));
    const int32_t wk4[n] = {0, 18, 3, 3, 3, -7, -1, -1}, wv4[n] = {3, 6, 0, 2, 5, 4, 1, 7};
    check(!memcmp(hk, wk4, sizeof wk4) && !memcmp(hv, wv4, sizeof wv4),
          "SortPairs over bits [0, 4): by the low 4 bits only, stable");
    CHECK_CUDA(cudaFree(temp));
    CHECK_CUDA(cudaFree(dk));
    CHECK_CUDA(cudaFree(dv));
    CHECK_CUDA(cudaFree(ok));
    CHECK_CUDA(cudaFree(ov));
}

int main(void)
{
    CHECK_LT(cublasLtCreate(&lt));
    gemm_layouts();
    gemm_beta_zero();
    gemm_rounding();
    gemm_bf16();
    gemm_alignment();
    radix_sort();
    cublasLtDestroy(lt);
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}

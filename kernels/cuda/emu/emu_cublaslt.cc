// The CUDA execution emulator: the part of cuBLASLt that kernels/cuda uses, written
// from the cuBLASLt documentation.
//
// D = alpha op(A) op(B) + beta C, column-major, with any leading dimension >= rows,
// op = N or T. Types, the rows of cuBLASLt's table of supported combinations that
// kernels/cuda uses (scale type CUDA_R_32F throughout):
//   compute                         A, B          C, D
//   CUBLAS_COMPUTE_32F              CUDA_R_32F    CUDA_R_32F
//   CUBLAS_COMPUTE_32F              CUDA_R_16BF   CUDA_R_16BF or CUDA_R_32F
//   CUBLAS_COMPUTE_32F_FAST_16BF    CUDA_R_32F    CUDA_R_32F
//   CUBLAS_COMPUTE_32F_FAST_TF32    CUDA_R_32F    CUDA_R_32F
// A and B of different types, C and D of different types, or bf16 with a FAST compute
// type are refused (CUBLAS_STATUS_NOT_SUPPORTED) as the library refuses them.
// 32F_FAST_16BF rounds fp32 A and B to bf16 (nearest-even), 32F_FAST_TF32 to tf32 (10
// mantissa bits, nearest with ties away from zero as cvt.rna.tf32.f32); bf16 operands
// are read exactly. Products are summed in fp64 and rounded once to fp32 (cuBLAS does
// not specify its order), then D = alpha sum + beta C in fp32; a bf16 D is that value
// rounded to nearest even (a NaN stays a NaN). With beta == 0, C is not read (it may
// hold NaN). The heuristic returns one algorithm that records the preference's minimum
// pointer alignment (256 bytes when unset, as documented); cublasLtMatmul refuses
// pointers less aligned than that.
//
// Live objects. Handles, matmul descriptors, matrix layouts and preferences are each a
// heap object, counted while alive (mt_emu::cublaslt_live_objects): a test of their
// owner's teardown asserts the counts fall back to zero, and LeakSanitizer reports any
// that is dropped without its Destroy.
//
// Test knob MT_EMU_CUBLASLT_TENSOR_CORE_ALIGN=BYTES. The real heuristic's choices are
// not emulated: without the knob it offers an algorithm for every supported problem.
// With it, the heuristic offers none (CUBLAS_STATUS_NOT_SUPPORTED, no result) for the
// tensor-core compute types (32F_FAST_16BF, 32F_FAST_TF32) unless every matrix's
// leading dimension and rows (its contiguous extent) and the preference's minimum
// pointer alignments are multiples of BYTES: the conditions cuBLAS documents for the
// best tensor-core performance, with 16. It exists to make a caller's fallback path
// happen on purpose (tests/gpu/emu_gemm); 32F is never refused.
#include "kernels/cuda/emu/emu_internal.h"
#include "kernels/cuda/emu/emu_streams.h"

#include <cublasLt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <new>
#include <vector>

namespace {

struct matmul_desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t ta, tb;
};
struct layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct preference {
    uint64_t workspace;
    uint32_t align[4]; // A, B, C, D
};
struct algo {
    uint32_t magic;
    uint32_t align[4];
};
const uint32_t algo_magic = 0x6d74656d; // "mtem"

static_assert(sizeof(matmul_desc) <= sizeof(cublasLtMatmulDescOpaque_t), "descriptor fits");
static_assert(sizeof(layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout fits");
static_assert(sizeof(preference) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "preference fits");
static_assert(sizeof(algo) <= sizeof(cublasLtMatmulAlgo_t), "algorithm fits");

std::atomic<long> live_handles, live_descs, live_layouts, live_prefs;

template <typename T, typename O>
T *as(O *o)
{
    return reinterpret_cast<T *>(o->data);
}

float round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

// The bits of x rounded to bf16, nearest-even; a NaN quietened (sign kept), never
// truncated into an infinity.
uint16_t bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u | 0x00400000u) >> 16);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float from_bf16(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

size_t type_size(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

float round_tf32(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    u += 0x1000u; // half of the 13 dropped bits: nearest, ties away from zero
    u &= 0xffffe000u;
    memcpy(&x, &u, 4);
    return x;
}

bool report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool report(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "moetrain CUDA emulator: cuBLASLt: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return false;
}

} // namespace

extern "C" {

const char *cublasLtGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    default: return "CUBLAS_STATUS_(emulator: unexpected)";
    }
}

// A handle holds nothing here; it is an object of its own so that it can be counted.
struct emu_handle {
    char unused;
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    emu_handle *e = new (std::nothrow) emu_handle();
    if (!e) return CUBLAS_STATUS_ALLOC_FAILED;
    *h = reinterpret_cast<cublasLtHandle_t>(e);
    live_handles++;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete reinterpret_cast<emu_handle *>(h);
    live_handles--;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale)
{
    *d = new (std::nothrow) cublasLtMatmulDescOpaque_t();
    if (!*d) return CUBLAS_STATUS_ALLOC_FAILED;
    *as<matmul_desc>(*d) = matmul_desc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N};
    live_descs++;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    if (d) live_descs--;
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t n)
{
    matmul_desc *m = as<matmul_desc>(d);
    if ((attr == CUBLASLT_MATMUL_DESC_TRANSA || attr == CUBLASLT_MATMUL_DESC_TRANSB) && n == sizeof(int32_t)) {
        int32_t v;
        memcpy(&v, buf, sizeof v);
        if (v != CUBLAS_OP_N && v != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? m->ta : m->tb) = (cublasOperation_t)v;
        return CUBLAS_STATUS_SUCCESS;
    }
    report("matmul descriptor attribute %d is not emulated", (int)attr);
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld)
{
    if (ld < (int64_t)rows || ld < 1) {
        report("matrix layout %llu x %llu with leading dimension %lld (< rows)", (unsigned long long)rows,
               (unsigned long long)cols, (long long)ld);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *l = new (std::nothrow) cublasLtMatrixLayoutOpaque_t();
    if (!*l) return CUBLAS_STATUS_ALLOC_FAILED;
    *as<layout>(*l) = layout{type, rows, cols, ld};
    live_layouts++;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    if (l) live_layouts--;
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    *p = new (std::nothrow) cublasLtMatmulPreferenceOpaque_t();
    if (!*p) return CUBLAS_STATUS_ALLOC_FAILED;
    *as<preference>(*p) = preference{0, {256, 256, 256, 256}};
    live_prefs++;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    if (p) live_prefs--;
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t n)
{
    preference *q = as<preference>(p);
    uint32_t v32;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        if (n != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&q->workspace, buf, n);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        if (n != sizeof v32) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&v32, buf, n);
        q->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = v32;
        return CUBLAS_STATUS_SUCCESS;
    default: report("preference attribute %d is not emulated", (int)attr); return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

// D = alpha op(A) op(B) + beta C, when the work runs on its stream (below); A and B of
// type ab, C and D of type cd
static void matmul(const matmul_desc &m, cudaDataType_t ab, cudaDataType_t cd, float alpha, float beta,
                   const void *A_p, const void *B_p, const void *C_p, void *D_p, const int64_t ld[4], uint64_t M,
                   uint64_t N, uint64_t K);

static bool supported(const matmul_desc &m, const layout *ls[4])
{
    if (m.compute != CUBLAS_COMPUTE_32F && m.compute != CUBLAS_COMPUTE_32F_FAST_16BF &&
        m.compute != CUBLAS_COMPUTE_32F_FAST_TF32)
        return report("compute type %d is not emulated (32F, 32F_FAST_16BF, 32F_FAST_TF32 are)", (int)m.compute);
    if (m.scale != CUDA_R_32F) return report("scale type %d is not emulated (CUDA_R_32F is)", (int)m.scale);
    for (int i = 0; i < 4; i++)
        if (ls[i]->type != CUDA_R_32F && ls[i]->type != CUDA_R_16BF)
            return report("matrix type %d is not emulated (CUDA_R_32F and CUDA_R_16BF are)", (int)ls[i]->type);
    const cudaDataType_t ab = ls[0]->type, cd = ls[2]->type;
    if (ls[1]->type != ab || ls[3]->type != cd)
        return report("A and B (types %d, %d) or C and D (%d, %d) differ in type: cuBLASLt has no such combination",
                      (int)ab, (int)ls[1]->type, (int)cd, (int)ls[3]->type);
    if (ab == CUDA_R_16BF && m.compute != CUBLAS_COMPUTE_32F)
        return report("bf16 A and B take CUBLAS_COMPUTE_32F (compute type %d is for fp32 operands)", (int)m.compute);
    if (ab == CUDA_R_32F && cd != CUDA_R_32F)
        return report("fp32 A and B take an fp32 C and D (type %d given)", (int)cd);
    return true;
}

// Shapes: op(A) m x k, op(B) k x n, C and D m x n.
static bool shapes(const matmul_desc &m, const layout *ls[4], uint64_t *M, uint64_t *N, uint64_t *K)
{
    const layout &a = *ls[0], &b = *ls[1], &c = *ls[2], &d = *ls[3];
    *M = m.ta == CUBLAS_OP_N ? a.rows : a.cols;
    *K = m.ta == CUBLAS_OP_N ? a.cols : a.rows;
    const uint64_t kb = m.tb == CUBLAS_OP_N ? b.rows : b.cols;
    *N = m.tb == CUBLAS_OP_N ? b.cols : b.rows;
    if (kb != *K || c.rows != *M || c.cols != *N || d.rows != *M || d.cols != *N)
        return report("inconsistent shapes: op(A) %llu x %llu, op(B) %llu x %llu, C %llu x %llu, D %llu x %llu",
                      (unsigned long long)*M, (unsigned long long)*K, (unsigned long long)kb, (unsigned long long)*N,
                      (unsigned long long)c.rows, (unsigned long long)c.cols, (unsigned long long)d.rows,
                      (unsigned long long)d.cols);
    return true;
}

// MT_EMU_CUBLASLT_TENSOR_CORE_ALIGN (above), read once: 0 when unset.
static uint32_t tensor_core_align_knob(void)
{
    static const uint32_t bytes = [] {
        const char *e = getenv("MT_EMU_CUBLASLT_TENSOR_CORE_ALIGN");
        if (!e || !*e) return 0u;
        char *end;
        const long v = strtol(e, &end, 10);
        if (*end || v < 4 || v > 256 || (v & (v - 1)))
            mt_emu::fail(nullptr, 0, "MT_EMU_CUBLASLT_TENSOR_CORE_ALIGN='%s' is not a power of two from 4 to 256 "
                                     "(bytes; 16 is what cuBLAS documents for tensor cores)", e);
        return (uint32_t)v;
    }();
    return bytes;
}

// Whether the knob lets the heuristic offer an algorithm for this problem.
static bool tensor_core_knob_allows(const matmul_desc &m, const layout *ls[4], const preference &pref)
{
    const uint32_t x = tensor_core_align_knob();
    if (!x || m.compute == CUBLAS_COMPUTE_32F) return true;
    for (int i = 0; i < 4; i++) {
        const uint64_t elem = type_size(ls[i]->type);
        if ((ls[i]->rows * elem) % x || ((uint64_t)ls[i]->ld * elem) % x || pref.align[i] % x) return false;
    }
    return true;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t A,
                                              cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                                              cublasLtMatrixLayout_t D, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t *res, int *found)
{
    *found = 0;
    const matmul_desc &m = *as<matmul_desc>(op);
    const layout *ls[4] = {as<layout>(A), as<layout>(B), as<layout>(C), as<layout>(D)};
    uint64_t M, N, K;
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    if (!supported(m, ls)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!shapes(m, ls, &M, &N, &K)) return CUBLAS_STATUS_INVALID_VALUE;
    if (!tensor_core_knob_allows(m, ls, *as<preference>(pref))) return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(res, 0, sizeof *res);
    algo *g = reinterpret_cast<algo *>(res->algo.data);
    g->magic = algo_magic;
    memcpy(g->align, as<preference>(pref)->align, sizeof g->align);
    res->workspaceSize = 0;
    res->state = CUBLAS_STATUS_SUCCESS;
    res->wavesCount = 1.0f;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t op, const void *alpha_p, const void *A_p,
                              cublasLtMatrixLayout_t Adesc, const void *B_p, cublasLtMatrixLayout_t Bdesc,
                              const void *beta_p, const void *C_p, cublasLtMatrixLayout_t Cdesc, void *D_p,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo_p, void *ws, size_t ws_bytes,
                              cudaStream_t stream)
{
    mt_emu::note_launch();
    (void)ws;
    (void)ws_bytes;
    const matmul_desc &m = *as<matmul_desc>(op);
    const layout *ls[4] = {as<layout>(Adesc), as<layout>(Bdesc), as<layout>(Cdesc), as<layout>(Ddesc)};
    uint64_t M, N, K;
    if (!supported(m, ls)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!shapes(m, ls, &M, &N, &K)) return CUBLAS_STATUS_INVALID_VALUE;
    if (!algo_p) return report("no algorithm given (the emulator does not pick one)"), CUBLAS_STATUS_INVALID_VALUE;
    const algo *g = reinterpret_cast<const algo *>(algo_p->data);
    if (g->magic != algo_magic) return report("the algorithm does not come from the heuristic"), CUBLAS_STATUS_INVALID_VALUE;
    const void *ptrs[4] = {A_p, B_p, C_p, D_p};
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)ptrs[i] % g->align[i])
            return report("matrix %c at %p is less aligned than the %u bytes the algorithm was chosen for",
                          "ABCD"[i], ptrs[i], g->align[i]),
                   CUBLAS_STATUS_INVALID_VALUE;
    // alpha and beta are read now (host pointer mode); the operands when the work runs
    const float alpha = *static_cast<const float *>(alpha_p), beta = *static_cast<const float *>(beta_p);
    const mt_emu::mem_access acc[4] = {{A_p, 0, false}, {B_p, 0, false}, {beta != 0.0f ? C_p : nullptr, 0, false},
                                   {D_p, 0, true}};
    const matmul_desc md = m;
    const int64_t ld[4] = {ls[0]->ld, ls[1]->ld, ls[2]->ld, ls[3]->ld};
    const cudaDataType_t ab = ls[0]->type, cd = ls[2]->type;
    mt_emu::stream_work(stream, "cublasLtMatmul", nullptr, 0, acc, 4, [=] {
        matmul(md, ab, cd, alpha, beta, A_p, B_p, C_p, D_p, ld, M, N, K);
    });
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"

mt_emu::cublaslt_objects mt_emu::cublaslt_live_objects(void)
{
    return cublaslt_objects{live_handles.load(), live_descs.load(), live_layouts.load(), live_prefs.load()};
}

// Element i of a matrix of type t (CUDA_R_32F or CUDA_R_16BF), as fp32: exact.
static float element(const void *p, cudaDataType_t t, int64_t i)
{
    return t == CUDA_R_16BF ? from_bf16(static_cast<const uint16_t *>(p)[i]) : static_cast<const float *>(p)[i];
}

static void matmul(const matmul_desc &m, cudaDataType_t ab, cudaDataType_t cd, float alpha, float beta,
                   const void *A_p, const void *B_p, const void *C_p, void *D_p, const int64_t ld[4], uint64_t M,
                   uint64_t N, uint64_t K)
{
    const int64_t lda = ld[0], ldb = ld[1], ldc = ld[2], ldd = ld[3];
    float (*rnd)(float) = m.compute == CUBLAS_COMPUTE_32F_FAST_16BF  ? round_bf16
                          : m.compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? round_tf32
                                                                      : nullptr;
    // op(A) as rows and op(B) as columns, each contiguous in k and rounded once
    std::vector<double> ar(M * K), bc(N * K);
    for (uint64_t i = 0; i < M; i++)
        for (uint64_t k = 0; k < K; k++) {
            const float a = element(A_p, ab, m.ta == CUBLAS_OP_N ? i + k * lda : k + i * lda);
            ar[i * K + k] = rnd ? rnd(a) : a;
        }
    for (uint64_t j = 0; j < N; j++)
        for (uint64_t k = 0; k < K; k++) {
            const float b = element(B_p, ab, m.tb == CUBLAS_OP_N ? k + j * ldb : j + k * ldb);
            bc[j * K + k] = rnd ? rnd(b) : b;
        }
    for (uint64_t j = 0; j < N; j++)
        for (uint64_t i = 0; i < M; i++) {
            const double *a = &ar[i * K], *b = &bc[j * K];
            double s = 0.0;
            for (uint64_t k = 0; k < K; k++) s += a[k] * b[k];
            float d = alpha * (float)s;
            if (beta != 0.0f) d += beta * element(C_p, cd, i + j * ldc);
            if (cd == CUDA_R_16BF) static_cast<uint16_t *>(D_p)[i + j * ldd] = bf16_bits(d);
            else static_cast<float *>(D_p)[i + j * ldd] = d;
        }
}

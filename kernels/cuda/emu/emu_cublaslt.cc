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
// Narrow precision (FP8, FP4; the documentation's "Narrow Precision Data Types Usage" and
// the FP8 and FP4 requirements of cublasLtMatmul): A and B of CUDA_R_8F_E4M3 or _E5M2 (not
// both E5M2) or both CUDA_R_4F_E2M1 (two a byte, the lower index in the low nibble), under
// CUBLAS_COMPUTE_32F with scale type CUDA_R_32F; C and D both fp32, both bf16, or (FP8
// only) a bf16 C with an E4M3 D (E5M2 when an operand is E5M2). The scale modes
// (CUBLASLT_MATMUL_DESC_A/B/C/D_SCALE_MODE) and what each device takes: SCALAR_32F
// (tensorwide, the default: D = scale_D (alpha scale_A scale_B op(A) op(B) + beta scale_C
// C), with the amax of the result before scale_D on request), VEC128_32F and
// BLK128x128_32F on compute capability 9.0 (A and B in any pair but BLK x BLK; M and N
// multiples of 4; no FP8 D), VEC32_UE8M0 (FP8) and VEC16_UE4M3 (FP4) for both A and B on
// 10.0 and later, the scales in the layouts the documentation gives (narrow_scale below).
// FP8 on 8.9, 9.0 and 12.x and FP4 everywhere take the "TN" layout; every matrix's rows
// and leading dimension in bytes and the pointer alignments must be multiples of 16.
// What the library lacks is CUBLAS_STATUS_NOT_SUPPORTED from the heuristic (and from
// cublasLtMatmul); a scale or amax pointer on a matmul of no narrow operand, a D scale
// for a D that is not FP8, a block mode without its scale pointer, or a scale tensor not
// 16-byte aligned is CUBLAS_STATUS_INVALID_VALUE. Not emulated (refused, naming it):
// OUTER_VEC_32F, the per-batch and D_OUT modes, fp16 C and D, block-scaled outputs, the
// amax of D with block modes, a C scale on a dense (bf16, fp32) matmul. How the products are summed: narrow_matmul.
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
#include "kernels/quant.h"

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
    // narrow precision (FP8, FP4): the scale pointers and modes of A, B, C, D, amax of D
    const void *scale_ptr[4];
    int32_t scale_mode[4];
    void *amax_d;
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

// ---------------------------------------------------------------- narrow precision (FP8, FP4)

static bool is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
static bool is_narrow(cudaDataType_t t) { return is_fp8(t) || t == CUDA_R_4F_E2M1; }
static bool narrow_problem(const layout *ls[4]) { return is_narrow(ls[0]->type) || is_narrow(ls[1]->type); }
static bool block_mode(int32_t v) { return v != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F; }
// Bits of an element of the types this file knows.
static uint64_t type_bits(cudaDataType_t t)
{
    return t == CUDA_R_4F_E2M1 ? 4 : is_fp8(t) ? 8 : t == CUDA_R_16BF ? 16 : 32;
}
static const char *mode_name(int32_t v)
{
    switch (v) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: return "SCALAR_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3: return "VEC16_UE4M3";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0: return "VEC32_UE8M0";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return "VEC128_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return "BLK128x128_32F";
    }
    return "?";
}

// The compute capability of the current device (10 * major + minor).
static int device_cc(void)
{
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return 10 * major + minor;
}

// A dense (bf16, fp32) problem given scales: cuBLASLt refuses it at cublasLtMatmul
// ("If set for an unsupported matrix data, scale, and compute type combination"), except
// C's tensorwide scale, which it allows for any C type and this emulator does not.
static cublasStatus_t dense_scales(const matmul_desc &m)
{
    if (m.scale_ptr[2])
        return report("a C scale on a matmul of no FP8 or FP4 operand is not emulated"), CUBLAS_STATUS_NOT_SUPPORTED;
    if (m.scale_ptr[0] || m.scale_ptr[1] || m.scale_ptr[3] || m.amax_d)
        return report("A, B or D scale or the amax of D given for a matmul of no FP8 or FP4 operand"),
               CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < 4; i++)
        if (block_mode(m.scale_mode[i]))
            return report("scale mode %s for %c of a matmul of no FP8 or FP4 operand", mode_name(m.scale_mode[i]),
                          "ABCD"[i]),
                   CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

// Whether cuBLASLt runs this FP8 or FP4 problem on the current device, from its
// documentation (cublasLtMatmul: the requirements of tensor- and block-scaled FP8 and of
// block-scaled FP4 kernels and their type tables; "Scaling Mode Support Overview" and
// the sections on each mode). What it lacks is CUBLAS_STATUS_NOT_SUPPORTED (the heuristic
// has no algorithm for it), a scale given where it has no meaning CUBLAS_STATUS_INVALID_VALUE.
static cublasStatus_t narrow_supported(const matmul_desc &m, const layout *ls[4], uint64_t M, uint64_t N)
{
    const cublasStatus_t no = CUBLAS_STATUS_NOT_SUPPORTED;
    const cudaDataType_t a = ls[0]->type, b = ls[1]->type, c = ls[2]->type, d = ls[3]->type;
    const int cc = device_cc();
    const int32_t ma = m.scale_mode[0], mb = m.scale_mode[1];
    if (m.compute != CUBLAS_COMPUTE_32F || m.scale != CUDA_R_32F)
        return report("FP8 and FP4 matmuls take CUBLAS_COMPUTE_32F and scale type CUDA_R_32F (%d, %d given)",
                      (int)m.compute, (int)m.scale),
               no;
    const bool fp4 = a == CUDA_R_4F_E2M1;
    if (fp4 ? b != CUDA_R_4F_E2M1 : !(is_fp8(a) && is_fp8(b)) || (a == CUDA_R_8F_E5M2 && b == CUDA_R_8F_E5M2))
        return report("A and B of types %d and %d: cuBLASLt multiplies E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3 "
                      "or E2M1 x E2M1",
                      (int)a, (int)b),
               no;
    const bool e5m2 = a == CUDA_R_8F_E5M2 || b == CUDA_R_8F_E5M2;
    const bool cd_ok = (c == CUDA_R_32F && d == CUDA_R_32F) || (c == CUDA_R_16BF && d == CUDA_R_16BF) ||
                       (!fp4 && c == CUDA_R_16BF && (d == CUDA_R_8F_E4M3 || (e5m2 && d == CUDA_R_8F_E5M2)));
    if (!cd_ok)
        return report("C and D of types %d and %d with %s A and B: not in cuBLASLt's table, or not emulated "
                      "(32F/32F, 16BF/16BF, and for FP8 16BF with an FP8 D, are)",
                      (int)c, (int)d, fp4 ? "FP4" : "FP8"),
               no;
    if (cc < (fp4 ? 100 : 89))
        return report("%s matmuls need compute capability %s; the device has %d.%d", fp4 ? "FP4" : "FP8",
                      fp4 ? "10.0" : "8.9", cc / 10, cc % 10),
               no;
    const bool tn_only = fp4 || cc == 89 || cc == 90 || cc / 10 == 12;
    if (tn_only && (m.ta != CUBLAS_OP_T || m.tb != CUBLAS_OP_N))
        return report("%s matmuls on compute capability %d.%d take the \"TN\" layout (A transposed, B not); "
                      "%c%c given",
                      fp4 ? "FP4" : "FP8", cc / 10, cc % 10, m.ta == CUBLAS_OP_T ? 'T' : 'N',
                      m.tb == CUBLAS_OP_T ? 'T' : 'N'),
               no;
    if (block_mode(m.scale_mode[2]) || block_mode(m.scale_mode[3]))
        return report("C and D take the scalar scale mode here (block-scaled outputs are not emulated)"), no;
    const bool hopper_blocks = ma == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ||
                               ma == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    if (fp4) {
        if (ma != CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 || mb != CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3)
            return report("FP4 A and B take scale mode VEC16_UE4M3 (%s, %s given)", mode_name(ma), mode_name(mb)), no;
    } else if (ma == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F || mb == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) {
        if (ma != mb)
            return report("scale modes %s and %s: a scalar mode is not mixed with a block mode", mode_name(ma),
                          mode_name(mb)),
                   no;
    } else if (ma == CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 || mb == CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0) {
        if (ma != mb)
            return report("scale modes %s and %s: VEC32_UE8M0 is for both FP8 operands", mode_name(ma), mode_name(mb)),
                   no;
        if (cc < 100)
            return report("scale mode VEC32_UE8M0 needs compute capability 10.0 or later; the device has %d.%d",
                          cc / 10, cc % 10),
                   no;
    } else if (hopper_blocks && (mb == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ||
                                 mb == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F)) {
        if (ma == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F && mb == ma)
            return report("scale modes BLK128x128_32F for both A and B: not a supported combination"), no;
        if (cc != 90)
            return report("scale modes %s and %s need compute capability 9.0; the device has %d.%d", mode_name(ma),
                          mode_name(mb), cc / 10, cc % 10),
                   no;
        if (is_fp8(d)) return report("an FP8 D with scale modes VEC128_32F or BLK128x128_32F"), no;
        if (M % 4 || N % 4)
            return report("scale modes VEC128_32F and BLK128x128_32F need M and N multiples of 4 (%llu, %llu)",
                          (unsigned long long)M, (unsigned long long)N),
                   no;
    } else {
        return report("scale modes %s and %s for FP8 A and B", mode_name(ma), mode_name(mb)), no;
    }
    if (block_mode(ma) && m.amax_d)
        return report("the amax of D with block scale modes is not emulated (the tensorwide mode's is)"), no;
    if (m.scale_ptr[3] && !is_fp8(d))
        return report("a D scale for a D of type %d: scales are for narrow-precision tensors", (int)d),
               CUBLAS_STATUS_INVALID_VALUE;
    if (block_mode(ma) && (!m.scale_ptr[0] || !m.scale_ptr[1]))
        return report("scale mode %s without the %s scale pointer", mode_name(ma), m.scale_ptr[0] ? "B" : "A"),
               CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

// "All matrix dimensions must meet the optimal requirements listed in Tensor Core Usage
// (i.e. pointers and matrix dimension must support 16-byte alignment)": each matrix's
// rows (its contiguous extent) and leading dimension in bytes, and the preference's
// pointer alignments, multiples of 16.
static bool narrow_aligned(const layout *ls[4], const preference &pref)
{
    for (int i = 0; i < 4; i++) {
        const uint64_t bits = type_bits(ls[i]->type);
        if ((ls[i]->rows * bits) % 128 || ((uint64_t)ls[i]->ld * bits) % 128 || pref.align[i] % 16)
            return report("FP8/FP4 matmul: matrix %c (%llu rows, leading dimension %lld, pointer alignment %u) is "
                          "not 16-byte aligned in rows, leading dimension and pointer",
                          "ABCD"[i], (unsigned long long)ls[i]->rows, (long long)ls[i]->ld, pref.align[i]);
    }
    return true;
}

// The scale tensors' starting addresses "must be 16B aligned" for the block modes.
static cublasStatus_t narrow_scale_pointers(const matmul_desc &m)
{
    for (int i = 0; i < 2; i++)
        if (block_mode(m.scale_mode[i]) && (uintptr_t)m.scale_ptr[i] % 16)
            return report("the %c scale tensor at %p is not 16-byte aligned", "AB"[i], m.scale_ptr[i]),
                   CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

struct narrow_problem_args {
    matmul_desc m;
    cudaDataType_t type[4];
    int64_t ld[4];
    uint64_t M, N, K;
    float alpha, beta;
    const void *A, *B, *C;
    void *D;
};
static void narrow_matmul(const narrow_problem_args &p);

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
    *as<matmul_desc>(*d) = matmul_desc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, {}, {}, nullptr};
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
    if (attr >= CUBLASLT_MATMUL_DESC_A_SCALE_POINTER && attr <= CUBLASLT_MATMUL_DESC_AMAX_D_POINTER &&
        n == sizeof(void *)) {
        const void *p;
        memcpy(&p, buf, sizeof p);
        if (attr == CUBLASLT_MATMUL_DESC_AMAX_D_POINTER) m->amax_d = const_cast<void *>(p);
        else m->scale_ptr[attr - CUBLASLT_MATMUL_DESC_A_SCALE_POINTER] = p;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr >= CUBLASLT_MATMUL_DESC_A_SCALE_MODE && attr <= CUBLASLT_MATMUL_DESC_D_SCALE_MODE &&
        n == sizeof(int32_t)) {
        int32_t v;
        memcpy(&v, buf, sizeof v);
        if (v < 0 || v >= CUBLASLT_MATMUL_MATRIX_SCALE_END) return CUBLAS_STATUS_INVALID_VALUE;
        if (v == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F || v > CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F)
            return report("scale mode %d is not emulated (SCALAR_32F, VEC16_UE4M3, VEC32_UE8M0, VEC128_32F and "
                          "BLK128x128_32F are)", (int)v),
                   CUBLAS_STATUS_NOT_SUPPORTED;
        m->scale_mode[attr - CUBLASLT_MATMUL_DESC_A_SCALE_MODE] = v;
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
    if (narrow_problem(ls)) {
        if (!shapes(m, ls, &M, &N, &K)) return CUBLAS_STATUS_INVALID_VALUE;
        const cublasStatus_t st = narrow_supported(m, ls, M, N);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
        if (!narrow_aligned(ls, *as<preference>(pref))) return CUBLAS_STATUS_NOT_SUPPORTED;
    } else {
        if (!supported(m, ls)) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (!shapes(m, ls, &M, &N, &K)) return CUBLAS_STATUS_INVALID_VALUE;
        const cublasStatus_t st = dense_scales(m);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
        if (!tensor_core_knob_allows(m, ls, *as<preference>(pref))) return CUBLAS_STATUS_NOT_SUPPORTED;
    }
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
    if (!mt_emu::capturing(stream)) mt_emu::note_launch(); // captured: launched with its graph
    (void)ws;
    (void)ws_bytes;
    const matmul_desc &m = *as<matmul_desc>(op);
    const layout *ls[4] = {as<layout>(Adesc), as<layout>(Bdesc), as<layout>(Cdesc), as<layout>(Ddesc)};
    uint64_t M, N, K;
    const bool narrow = narrow_problem(ls);
    if (!narrow && !supported(m, ls)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!shapes(m, ls, &M, &N, &K)) return CUBLAS_STATUS_INVALID_VALUE;
    const cublasStatus_t st = narrow ? narrow_supported(m, ls, M, N) : dense_scales(m);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (narrow && narrow_scale_pointers(m) != CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_INVALID_VALUE;
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
    if (narrow) {
        const narrow_problem_args p{m, {ls[0]->type, ls[1]->type, ls[2]->type, ls[3]->type},
                                    {ls[0]->ld, ls[1]->ld, ls[2]->ld, ls[3]->ld}, M, N, K, alpha, beta, A_p, B_p,
                                    C_p, D_p};
        const mt_emu::mem_access nacc[9] = {{A_p, 0, false},          {B_p, 0, false},
                                            {beta != 0.0f ? C_p : nullptr, 0, false}, {D_p, 0, true},
                                            {m.scale_ptr[0], 0, false}, {m.scale_ptr[1], 0, false},
                                            {m.scale_ptr[2], 0, false}, {m.scale_ptr[3], 0, false},
                                            {m.amax_d, 0, true}};
        mt_emu::stream_work(stream, "cublasLtMatmul", nullptr, 0, nacc, 9, [=] { narrow_matmul(p); });
        return CUBLAS_STATUS_SUCCESS;
    }
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

// ---------------------------------------------------------------- narrow-precision matmul

// The code value (unscaled) of element i of an FP8 or FP4 matrix; FP4 packs two elements
// a byte, the lower index in the low nibble.
static double narrow_element(const void *p, cudaDataType_t t, uint64_t i)
{
    const uint8_t *b = static_cast<const uint8_t *>(p);
    if (t == CUDA_R_4F_E2M1) return mt_e2m1_to_float((uint8_t)(b[i / 2] >> (4 * (i & 1))));
    return t == CUDA_R_8F_E4M3 ? mt_e4m3_to_float(b[i]) : mt_e5m2_to_float(b[i]);
}

// Elements of K that share one block scale under the operands' mode (all K: scalar).
static uint64_t narrow_block(const narrow_problem_args &p)
{
    switch (p.m.scale_mode[0]) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3: return 16;
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0: return 32;
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F:
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return 128;
    }
    return p.K;
}

// The block scale of operand x (0: A, 1: B) at outer index o (A's row m, B's column n)
// and reduction index k, read where the documented layout of its mode puts it:
//   VEC32_UE8M0, VEC16_UE4M3  tiles of 128 outer x 4 blocks (512 bytes), row-major over
//       the tiles, sf_inner_dim = the blocks along K rounded up to 4 scales a row; in a
//       tile, (outer % 32) * 16 + (outer % 128 / 32) * 4 + inner % 4
//   VEC128_32F                outer-major: o + (k / 128) * M (or N)
//   BLK128x128_32F            K-major, the column stride L4 = ceil(K / 128) rounded up to 4:
//                             k / 128 + (o / 128) * L4
// UE4M3 scales ignore their sign bit.
static double narrow_scale(const narrow_problem_args &p, int x, uint64_t o, uint64_t k)
{
    const void *s = p.m.scale_ptr[x];
    const uint64_t outer_n = x ? p.N : p.M;
    switch (p.m.scale_mode[x]) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3:
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0: {
        const bool mx = p.m.scale_mode[x] == CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
        const uint64_t blk = mx ? 32 : 16, inner = k / blk, sf_inner_dim = ((p.K + blk - 1) / blk + 3) / 4 * 4;
        const uint64_t off = (inner / 4 * 4 + o / 128 * sf_inner_dim) * 128 + (o % 32) * 16 + (o % 128) / 32 * 4 +
                             inner % 4;
        const uint8_t c = static_cast<const uint8_t *>(s)[off];
        return mx ? mt_e8m0_to_float(c) : mt_e4m3_to_float(c & 0x7fu);
    }
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return static_cast<const float *>(s)[o + k / 128 * outer_n];
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: {
        const uint64_t l4 = ((p.K + 127) / 128 + 3) / 4 * 4;
        return static_cast<const float *>(s)[k / 128 + o / 128 * l4];
    }
    }
    return s ? *static_cast<const float *>(s) : 1.0; // SCALAR_32F; no pointer: 1
}

// D = scale_D (alpha scale_A scale_B op(A) op(B) + beta scale_C C) for the tensorwide mode,
// D = alpha sum over K-blocks of (scale_A scale_B sum of the block's products) + beta C
// for the block modes. Each block's products of code values are summed exactly in fp64
// (FP8 and FP4 products have few significant bits). Hopper's VEC128_32F and
// BLK128x128_32F: the block's sum rounded to fp32, times the two fp32 scales' fp32
// product, added to an fp32 accumulator in K order (the promotion of each 128-deep
// partial sum to fp32 CUDA-core registers that the fp32 block scales require:
// doc/fp8.md, "Blockwise accumulation"); the other modes: times the two block scales
// and the total kept exact (their scaled products are exact in fp32 anyway). Then the
// total rounded once to fp32 with alpha (and the scalar scales); then beta C in fp32. The
// amax of D is that of the fp32 values before scale_D. An FP8 D is rounded to nearest
// even and saturated to the format's largest finite value (cuBLASLt does not document
// its overflow behaviour; saturation is what PTX's cvt.rn.satfinite gives).
static void narrow_matmul(const narrow_problem_args &p)
{
    const matmul_desc &m = p.m;
    const uint64_t blk = narrow_block(p);
    const bool scalar = !block_mode(m.scale_mode[0]);
    const double sab = scalar ? narrow_scale(p, 0, 0, 0) * narrow_scale(p, 1, 0, 0) : 1.0;
    const bool promote = m.scale_mode[0] == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ||
                         m.scale_mode[0] == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const float sc = m.scale_ptr[2] ? *static_cast<const float *>(m.scale_ptr[2]) : 1.0f;
    const float sd = m.scale_ptr[3] ? *static_cast<const float *>(m.scale_ptr[3]) : 1.0f;
    float amax = 0.0f;
    for (uint64_t j = 0; j < p.N; j++)
        for (uint64_t i = 0; i < p.M; i++) {
            double total = 0.0;
            float acc = 0.0f; // promote: the fp32 accumulator
            for (uint64_t k0 = 0; k0 < p.K; k0 += blk) {
                double part = 0.0;
                for (uint64_t k = k0; k < k0 + blk && k < p.K; k++) {
                    const uint64_t ia = m.ta == CUBLAS_OP_T ? k + i * p.ld[0] : i + k * p.ld[0];
                    const uint64_t ib = m.tb == CUBLAS_OP_N ? k + j * p.ld[1] : j + k * p.ld[1];
                    part += narrow_element(p.A, p.type[0], ia) * narrow_element(p.B, p.type[1], ib);
                }
                if (promote)
                    acc += (float)part * ((float)narrow_scale(p, 0, i, k0) * (float)narrow_scale(p, 1, j, k0));
                else
                    total += scalar ? part : part * (narrow_scale(p, 0, i, k0) * narrow_scale(p, 1, j, k0));
            }
            if (promote) total = acc;
            float d = (float)((double)p.alpha * sab * total);
            if (p.beta != 0.0f) d += p.beta * (sc * element(p.C, p.type[2], i + j * p.ld[2]));
            const float mag = fabsf(d);
            amax = (mag != mag || amax != amax) ? mt_q_float(MT_Q_NAN) : mag > amax ? mag : amax;
            const uint64_t o = i + j * p.ld[3];
            switch (p.type[3]) {
            case CUDA_R_16BF: static_cast<uint16_t *>(p.D)[o] = bf16_bits(d); break;
            case CUDA_R_8F_E4M3: static_cast<uint8_t *>(p.D)[o] = mt_e4m3_from_float(d * sd, 1, MT_Q_RN, 0); break;
            case CUDA_R_8F_E5M2: static_cast<uint8_t *>(p.D)[o] = mt_e5m2_from_float(d * sd, 1, MT_Q_RN, 0); break;
            default: static_cast<float *>(p.D)[o] = d;
            }
        }
    if (m.amax_d) *static_cast<float *>(m.amax_d) = amax;
}

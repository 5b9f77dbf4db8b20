// CUDA backend: dense GEMM through cuBLASLt.
//
// Row-major C (M,N) = alpha op(A) op(B) + beta C is the column-major product
// C^T (N,M) = op(B)^T op(A)^T, so cuBLASLt sees B first and A second, each with its own
// transpose flag and leading dimension unchanged.
//
// Element types. A, B and C are typed tensors (kernels.h), fp32 or bf16, and cuBLASLt
// reads and writes them as they are where its table of type combinations allows: A
// and B of one type, C and D of one type; bf16 A and B (CUDA_R_16BF) take
// CUBLAS_COMPUTE_32F (fp32 accumulation on the tensor cores) with C and D bf16 or fp32,
// a bf16 D being the fp32 result rounded to nearest even; fp32 A and B take any of the
// fp32 compute types (below) with C and D fp32. The combinations the table lacks are
// formed in scratch from the caching allocator, one conversion each (the convert op):
// A and B of different types meet at bf16 under CUBLAS_COMPUTE_32F_FAST_16BF (the
// fp32 one rounded to nearest even: what that compute type does to it anyway, so the
// result is the same) and at fp32 under the other compute types (the bf16 one widened,
// exactly); fp32 A and B with a bf16 C write D to fp32 scratch, rounded into C. In the
// model, forward products are bf16 x bf16 and need none; the backward's fp32 gradient
// times a bf16 weight or activation takes one.
//
// Precision. With fp32 operands the compute type is
// CUBLAS_COMPUTE_32F_FAST_16BF by default (MT_CUDA_GEMM_COMPUTE, cuda_memory.cu): the
// library rounds A and B to bf16 on the fly and accumulates in fp32 on the tensor
// cores. Rounding to nearest leaves each operand a relative error of at most half a
// bf16 ulp (2^-8), variance 2.7e-6 on normal data; a product of two rounded operands
// 5.5e-6, independent from term to term, so the normalised MSE of a result is 5.5e-6
// whatever K. In the model, forward operands are already bf16 (parameters and stored
// activations are rounded), so there the rounding is exact and only the fp32
// accumulation order differs from the CPU; gradients flowing backward are fp32 and take
// the bf16 rounding, as in Megatron's bf16 training. MT_CUDA_GEMM_COMPUTE=tf32 cuts the
// error ~64-fold for half the tensor-core rate.
//
// One workspace (32 MiB) is allocated with the context; the matmul descriptor, the
// layouts and the heuristic's algorithm are cached per shape (M, N, K, transposes,
// leading dimensions, pointer alignment, element types), so a call in the training
// loop is one hash lookup and one cublasLtMatmul. The plans live as long as the context:
// mt_kernels_cuda_destroy (cuda_backend.h) destroys their descriptors and layouts with
// the cuBLASLt handle, the workspace, the allocator's memory and the stream.
//
// No silent slow path. When cuBLASLt's heuristic offers no algorithm for a shape under
// the requested compute type, the shape runs with CUBLAS_COMPUTE_32F: the same result
// up to rounding (fp32 operands), but without tensor cores, an order of magnitude
// less peak throughput. That fallback is printed on stderr once per shape (device,
// M, N, K, transposes, leading dimensions, pointer alignment, the compute type asked
// for and the one used, the dimensions that are not multiples of 16 bytes, and the
// fix: pad them) and counted per call; mt_cuda_gemm_stats returns the counts, which
// moetrain prints at the end of a training run. Without any algorithm at all, the
// call is fatal.
#include "kernels/cuda/cuda_common.cuh"

#include <stdio.h>
#include <string.h>

static int pointer_alignment(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    int a = 16;
    while (a > 4 && (u % (uintptr_t)a) != 0) a >>= 1;
    return a;
}

// The heuristic's best algorithm for k under compute type ct; false when it has none.
static bool find_plan(mt_cuda_ctx *c, const mt_gemm_key &k, cublasComputeType_t ct, mt_gemm_plan *p)
{
    const cublasOperation_t opa = k.tb ? CUBLAS_OP_T : CUBLAS_OP_N; // cuBLAS "A" is our B
    const cublasOperation_t opb = k.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cudaDataType_t ab = (cudaDataType_t)k.ab_type, ct_d = (cudaDataType_t)k.c_type;
    MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, ct, CUDA_R_32F));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    // column-major shapes as stored: our B is (N,K) col-major when !tb, else (K,N)
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab, k.tb ? k.K : k.N, k.tb ? k.N : k.K, k.ldb));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab, k.ta ? k.M : k.K, k.ta ? k.K : k.M, k.lda));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, ct_d, k.N, k.M, k.ldc));
    cublasLtMatmulPreference_t pref;
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &c->lt_ws_bytes, sizeof c->lt_ws_bytes));
    const uint32_t align = (uint32_t)k.align;
    const cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (auto attr : aligns) MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found < 1) {
        cublasLtMatmulDescDestroy(p->desc);
        cublasLtMatrixLayoutDestroy(p->a);
        cublasLtMatrixLayoutDestroy(p->b);
        cublasLtMatrixLayoutDestroy(p->c);
        return false;
    }
    p->algo = res.algo;
    return true;
}

static const char *compute_name(cublasComputeType_t ct)
{
    switch (ct) {
    case CUBLAS_COMPUTE_32F: return "CUBLAS_COMPUTE_32F";
    case CUBLAS_COMPUTE_32F_FAST_16BF: return "CUBLAS_COMPUTE_32F_FAST_16BF";
    case CUBLAS_COMPUTE_32F_FAST_TF32: return "CUBLAS_COMPUTE_32F_FAST_TF32";
    default: return "(another compute type)";
    }
}

// The dimensions of k (in floats) that miss the 16 bytes cuBLAS asks of tensor-core
// operands: every leading dimension and the contiguous extent of each matrix
// (row-major: A's rows hold ta ? M : K floats, B's tb ? K : N, C's N).
static void misaligned_dims(const mt_gemm_key &k, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    auto add = [&](const char *name, int floats) {
        if (floats % 4 != 0 && len < n)
            len += (size_t)snprintf(buf + len, n - len, "%s%s %d (%d bytes)", len ? ", " : "", name, floats,
                                    floats * 4);
    };
    add("lda", k.lda);
    add("ldb", k.ldb);
    add("ldc", k.ldc);
    if (k.ta) add("M", k.M);
    if (!k.ta || k.tb) add("K", k.K);
    add("N", k.N);
}

static void report_fallback(const mt_cuda_ctx *c, const mt_gemm_key &k)
{
    fprintf(stderr,
            "moetrain: warning: CUDA device %d: cuBLASLt has no algorithm with %s for the GEMM M=%d N=%d K=%d "
            "(A %s, lda %d; B %s, ldb %d; ldc %d; pointers %d-byte aligned): it runs with %s, without tensor "
            "cores (an order of magnitude slower); reported once per shape, every call counted in the "
            "end-of-run summary\n",
            c->device, compute_name(c->gemm_compute), k.M, k.N, k.K, k.ta ? "transposed" : "not transposed", k.lda,
            k.tb ? "transposed" : "not transposed", k.ldb, k.ldc, k.align, compute_name(CUBLAS_COMPUTE_32F));
    char dims[256];
    misaligned_dims(k, dims, sizeof dims);
    const bool ptrs = k.align < 16;
    if (dims[0])
        fprintf(stderr,
                "HINT: not multiples of 16 bytes: %s; pad them to a multiple of 4 floats (8 or 16 suit "
                "tensor-core tiles best)%s\n",
                dims, ptrs ? ", and start each matrix 16-byte aligned" : "");
    else if (ptrs)
        fprintf(stderr,
                "HINT: the pointers are only %d-byte aligned: start each matrix 16-byte aligned (at an offset of "
                "a multiple of 4 floats into its buffer)\n",
                k.align);
    else
        fprintf(stderr, "HINT: every dimension and pointer of this GEMM is 16-byte aligned; this cuBLASLt "
                        "offers no tensor-core algorithm for it (try MT_CUDA_GEMM_COMPUTE=tf32)\n");
}

// The compute type of a plan: bf16 operands take CUBLAS_COMPUTE_32F (the only one
// cuBLASLt pairs with them), fp32 ones the context's.
static cublasComputeType_t plan_compute(const mt_cuda_ctx *c, const mt_gemm_key &k)
{
    return k.ab_type == CUDA_R_16BF ? CUBLAS_COMPUTE_32F : c->gemm_compute;
}

// The cached plan of a shape. A shape the requested compute type has no algorithm for
// runs in plain fp32, reported once here and counted by the caller.
static mt_gemm_plan &gemm_plan(mt_cuda_ctx *c, const mt_gemm_key &k)
{
    auto it = c->gemm_plans.find(k);
    if (it != c->gemm_plans.end()) return it->second;
    mt_gemm_plan p = {};
    const cublasComputeType_t ct = plan_compute(c, k);
    if (!find_plan(c, k, ct, &p)) {
        if (ct == CUBLAS_COMPUTE_32F || !find_plan(c, k, CUBLAS_COMPUTE_32F, &p)) {
            char msg[160];
            snprintf(msg, sizeof msg, "no cuBLASLt algorithm for M=%d N=%d K=%d ta=%d tb=%d (%s operands, %s C)", k.M,
                     k.N, k.K, k.ta, k.tb, k.ab_type == CUDA_R_16BF ? "bf16" : "fp32",
                     k.c_type == CUDA_R_16BF ? "bf16" : "fp32");
            mt_cuda_fatal(__FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", msg);
        }
        p.fallback = true;
        report_fallback(c, k);
    }
    return c->gemm_plans.emplace(k, p).first->second;
}

void mt_cuda_gemm_plans_destroy(mt_cuda_ctx *c)
{
    for (auto &kv : c->gemm_plans) {
        cublasLtMatmulDescDestroy(kv.second.desc);
        cublasLtMatrixLayoutDestroy(kv.second.a);
        cublasLtMatrixLayoutDestroy(kv.second.b);
        cublasLtMatrixLayoutDestroy(kv.second.c);
    }
    c->gemm_plans.clear();
    for (auto &kv : c->lowp.plans) {
        cublasLtMatmulDescDestroy(kv.second.desc);
        cublasLtMatrixLayoutDestroy(kv.second.a);
        cublasLtMatrixLayoutDestroy(kv.second.b);
        cublasLtMatrixLayoutDestroy(kv.second.c);
    }
    c->lowp.plans.clear();
}

extern "C" void mt_cuda_gemm_stats(const struct mt_kernels *k, struct mt_cuda_gemm_stats *s)
{
    memset(s, 0, sizeof *s);
    const mt_cuda_ctx *c = mt_cuda(k->ctx);
    if (!c) return;
    s->compute = compute_name(c->gemm_compute);
    s->fallback_compute = compute_name(CUBLAS_COMPUTE_32F);
    s->lowp_calls = c->lowp.calls;
    s->lowp_epilogues = c->lowp.epilogues;
    s->lowp_grouped = c->lowp.grouped;
    s->lowp_groups = c->lowp.groups;
    s->lowp_fused = c->lowp.fused;
    mt_cuda_lowp_gemm_names(c->lowp.modes, s->lowp_modes, sizeof s->lowp_modes);
    for (const auto &kv : c->gemm_plans) {
        s->shapes++;
        s->calls += kv.second.calls;
        if (kv.second.fallback) {
            s->fallback_shapes++;
            s->fallback_calls += kv.second.calls;
        }
    }
}

// C (M,N) = beta C over ldc-strided rows, beta = 0 writing zeros: the K = 0 product.
template <typename TC>
__global__ static void scale_rows_kernel(TC *C, int M, int N, int64_t ldc, float beta)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)M * N) return;
    const size_t e = (i / N) * ldc + i % N;
    mt_st(C, e, beta == 0.0f ? 0.0f : beta * mt_ld(C, e));
}

// A dense copy of t in dtype to, in scratch (*tmp, to free after the matmul).
static mt_tensor converted(mt_cuda_ctx *c, const mt_tensor &t, enum mt_dtype to, void **tmp)
{
    mt_tensor d = mt_tview(NULL, to, t.rows, t.cols);
    *tmp = d.data = mt_cuda_scratch(c, mt_tensor_bytes(d));
    mt_cuda_convert(c, d, t);
    return d;
}

extern "C" void mt_cuda_gemm(void *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                             struct mt_tensor A, struct mt_tensor B, float beta, struct mt_tensor C)
{
    MT_CUDA_OP(ctx, MT_OP_GEMM);
    mt_cuda_ctx *c = mt_cuda(ctx);
    mt_cuda_tensor_check("gemm", "A", A, false), mt_cuda_tensor_check("gemm", "B", B, false);
    mt_cuda_tensor_check("gemm", "C", C, false);
    if (C.dtype == MT_BF16 && beta != 0.0f)
        mt_cuda_fatal(__FILE__, __LINE__, "gemm", "C is bf16 with beta != 0 (a bf16 C takes beta = 0)");
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        mt_with_elem(C.dtype, [&](auto ct) {
            using TC = MT_ELEM(ct);
            MT_LAUNCH(mt_cdiv((size_t)M * N, 256), 256, 0, c->stream, scale_rows_kernel<TC>)((TC *)C.data, M, N, C.ld,
                                                                                          beta);
        });
        MT_CUDA_LAUNCHED();
        return;
    }
    // the operand type cuBLASLt gets (the top of this file), and the scratch that forms it
    const enum mt_dtype ab = A.dtype == B.dtype                                  ? A.dtype
                             : c->gemm_compute == CUBLAS_COMPUTE_32F_FAST_16BF ? MT_BF16
                                                                               : MT_F32;
    void *tmp_a = NULL, *tmp_b = NULL, *tmp_d = NULL;
    const mt_tensor a = A.dtype == ab ? A : converted(c, A, ab, &tmp_a);
    const mt_tensor b = B.dtype == ab ? B : converted(c, B, ab, &tmp_b);
    mt_tensor d = C;
    if (ab == MT_F32 && C.dtype == MT_BF16) {
        d = mt_tview(NULL, MT_F32, C.rows, C.cols);
        tmp_d = d.data = mt_cuda_scratch(c, mt_tensor_bytes(d));
    }
    int align = pointer_alignment(a.data);
    if (pointer_alignment(b.data) < align) align = pointer_alignment(b.data);
    if (pointer_alignment(d.data) < align) align = pointer_alignment(d.data);
    const mt_gemm_key key = {trans_a, trans_b, M, N, K, (int)a.ld, (int)b.ld, (int)d.ld, align,
                             ab == MT_BF16 ? CUDA_R_16BF : CUDA_R_32F, d.dtype == MT_BF16 ? CUDA_R_16BF : CUDA_R_32F};
    mt_gemm_plan &p = gemm_plan(c, key);
    p.calls++;
    mt_cuda_note_library_launch(c);
    MT_CUBLAS_CHECK(cublasLtMatmul(c->lt, p.desc, &alpha, b.data, p.a, a.data, p.b, &beta, d.data, p.c, d.data, p.c,
                                   &p.algo, c->lt_ws, c->lt_ws_bytes, c->stream));
    if (tmp_d) mt_cuda_convert(c, C, d);
    if (tmp_a) mt_cuda_scratch_free(c, tmp_a);
    if (tmp_b) mt_cuda_scratch_free(c, tmp_b);
    if (tmp_d) mt_cuda_scratch_free(c, tmp_d);
}

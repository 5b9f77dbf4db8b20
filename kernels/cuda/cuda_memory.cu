// CUDA backend: the context (streams, cuBLASLt handle and workspace), its creation and
// teardown, the caching device allocator, and the memory and stream ops of the table.
//
// Allocator: sizes are rounded to a class (powers of two up to 1 MiB, then multiples of
// 2 MiB); a freed block goes to a free list of its class and the next request of that
// class takes it back, so a training loop that repeats its allocations reaches a
// steady state with no cudaMalloc. One compute stream makes reuse safe without events:
// a block freed on the host can only be handed out to work queued after the work that
// used it. When cudaMalloc fails, the cached blocks are released and it is tried once
// more; cudaFree synchronises the device, so nothing queued still uses them.
#include "kernels/cuda/cuda_common.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MT_CUDA_LT_WORKSPACE (32u << 20) // cuBLAS's advice for Hopper and Blackwell

[[noreturn]] void mt_cuda_fatal(const char *file, int line, const char *call, const char *msg)
{
    fprintf(stderr,
            "moetrain: CUDA error at %s:%d: %s: %s\n"
            "HINT: rerun with CUDA_LAUNCH_BLOCKING=1 to find the failing kernel; "
            "'moetrain --version' lists the GPU architectures this build supports\n",
            file, line, call, msg);
    abort();
}

void mt_cuda_tensor_check(const char *op, const char *arg, struct mt_tensor t, bool dense)
{
    char msg[200];
    if (t.dtype == MT_E4M3 || t.dtype == MT_E5M2)
        snprintf(msg, sizeof msg, "%s is an fp8 tensor (%s): the CUDA backend takes fp32 and bf16 tensors; fp8 "
                 "belongs to the FP8 recipes, which quantise fp32 or bf16 operands through qdq", arg,
                 t.dtype == MT_E4M3 ? "E4M3" : "E5M2");
    else if (t.dtype != MT_F32 && t.dtype != MT_BF16)
        snprintf(msg, sizeof msg, "%s has dtype %d, which is not an enum mt_dtype", arg, (int)t.dtype);
    else if (dense && t.rows > 1 && t.ld != t.cols)
        snprintf(msg, sizeof msg, "%s is a strided view (%lld x %lld, ld %lld): this op takes dense tensors", arg,
                 (long long)t.rows, (long long)t.cols, (long long)t.ld);
    else
        return;
    mt_cuda_fatal(__FILE__, __LINE__, op, msg);
}

static size_t size_class(size_t bytes)
{
    if (bytes <= (1u << 20)) {
        size_t c = 512;
        while (c < bytes) c <<= 1;
        return c;
    }
    const size_t two_mib = 2u << 20;
    return (bytes + two_mib - 1) / two_mib * two_mib;
}

// Returns every cached block to the driver. Caller holds c->mu.
static void release_cached(mt_cuda_ctx *c)
{
    for (auto &kv : c->free_blocks) {
        mt_cuda_note_sync(c);
        cudaFree(kv.second);
        c->reserved -= kv.first;
    }
    c->free_blocks.clear();
    c->cached = 0;
}

extern "C" void *mt_cuda_alloc(void *ctx, size_t bytes)
{
    MT_CUDA_OP(ctx, MT_OP_ALLOC);
    mt_cuda_ctx *c = mt_cuda(ctx);
    const size_t sz = size_class(bytes);
    std::lock_guard<std::mutex> lock(c->mu);
    void *p = NULL;
    auto it = c->free_blocks.find(sz);
    if (it != c->free_blocks.end()) {
        p = it->second;
        c->free_blocks.erase(it);
        c->cached -= sz;
    } else if (c->capturing) {
        // a graph scope's new block: cudaMalloc is not stream work, so the capture is told
        // to let it through (the block then belongs to the graph); nothing cached is
        // released (cudaFree waits for the device, which a capture cannot)
        cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        MT_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
        const cudaError_t r = cudaMalloc(&p, sz);
        MT_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
        if (r != cudaSuccess) {
            (void)cudaGetLastError();
            return NULL;
        }
        c->reserved += sz;
        c->device_allocs++;
    } else {
        if (cudaMalloc(&p, sz) != cudaSuccess) {
            (void)cudaGetLastError(); // out of memory is not sticky: clear it
            release_cached(c);
            if (cudaMalloc(&p, sz) != cudaSuccess) {
                (void)cudaGetLastError();
                return NULL;
            }
        }
        c->reserved += sz;
        c->device_allocs++;
    }
    if (c->capturing) c->cap_blocks[p] = sz;
    c->live[p] = sz;
#ifdef MT_CUDA_EMU
    ::mt_emu::note_extent(p, bytes, c->stream); // the request, not the size class, is checked
#endif
    c->in_use += sz;
    if (c->in_use > c->peak_in_use) c->peak_in_use = c->in_use;
    return p;
}

extern "C" void mt_cuda_free(void *ctx, void *p)
{
    MT_CUDA_OP(ctx, MT_OP_FREE);
    if (!p) return;
    mt_cuda_ctx *c = mt_cuda(ctx);
    std::lock_guard<std::mutex> lock(c->mu);
    auto it = c->live.find(p);
    if (it == c->live.end())
        mt_cuda_fatal(__FILE__, __LINE__, "free", "pointer was not returned by alloc (or freed twice)");
    const size_t sz = it->second;
    if (c->capturing) {
        // a block allocated in the scope stays with its graph (each replay uses it, and
        // nothing else may); one allocated before it would be freed at capture only, and
        // never again by the replays
        auto b = c->cap_blocks.find(p);
        if (b == c->cap_blocks.end()) {
            if (!c->cap_error)
                c->cap_error = "the scope freed a block allocated before it (its replays would not free it)";
        } else {
            c->cap_freed.emplace(p, sz);
            c->cap_blocks.erase(b);
        }
        return;
    }
    c->live.erase(it);
#ifdef MT_CUDA_EMU
    ::mt_emu::note_cached(p, c->stream); // a use before the block is handed out again is a use after free
#endif
    c->in_use -= sz;
    c->free_blocks.emplace(sz, p);
    c->cached += sz;
}

// Page-locked host memory, not cached: the callers keep it (pinning is slow).
extern "C" void *mt_cuda_alloc_host(void *ctx, size_t bytes)
{
    MT_CUDA_OP(ctx, MT_OP_ALLOC_HOST);
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError(); // out of pinnable memory is not sticky
        return NULL;
    }
    return p;
}

extern "C" void mt_cuda_free_host(void *ctx, void *p)
{
    MT_CUDA_OP(ctx, MT_OP_FREE_HOST);
    if (!p) return;
    mt_cuda_note_sync(mt_cuda(ctx));
    MT_CUDA_CHECK(cudaFreeHost(p));
}

void *mt_cuda_scratch(mt_cuda_ctx *c, size_t bytes)
{
    void *p = mt_cuda_alloc(c, bytes);
    if (!p) {
        char msg[128];
        snprintf(msg, sizeof msg, "out of device memory for %zu bytes of scratch", bytes);
        mt_cuda_fatal(__FILE__, __LINE__, "scratch", msg);
    }
    return p;
}

const void *mt_cuda_to_host(mt_cuda_ctx *c, const void *dev, size_t n)
{
    MT_CUDA_CHECK(cudaMemcpyAsync(c->host_stage, dev, n, cudaMemcpyDeviceToHost, c->stream));
    mt_cuda_note_sync(c);
    MT_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return c->host_stage;
}

extern "C" void mt_cuda_memset(void *ctx, void *p, int byte, size_t bytes)
{
    MT_CUDA_OP(ctx, MT_OP_MEMSET);
    if (bytes == 0) return;
    MT_CUDA_CHECK(cudaMemsetAsync(p, byte, bytes, mt_cuda(ctx)->stream));
}

// Host memory of either kind (pageable or pinned): a copy touching it completes before
// copy returns, so the caller may read or reuse its buffer at once.
static bool is_host_memory(const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
    }
    return a.type == cudaMemoryTypeHost || a.type == cudaMemoryTypeUnregistered;
}

extern "C" void mt_cuda_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    MT_CUDA_OP(ctx, MT_OP_COPY);
    if (bytes == 0 || dst == src) return;
    mt_cuda_ctx *c = mt_cuda(ctx);
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->stream));
    if (is_host_memory(dst) || is_host_memory(src)) {
        mt_cuda_note_sync(c);
        MT_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    }
}

// The copy stream: a second non-blocking stream; events order it against the compute
// stream on the device, and nothing here makes the host wait.
static cudaStream_t stream_of(mt_cuda_ctx *c, enum mt_stream s)
{
    return s == MT_STREAM_COPY ? c->copy_stream : c->stream;
}

extern "C" void *mt_cuda_event_create(void *ctx)
{
    MT_CUDA_OP(ctx, MT_OP_EVENT_CREATE);
    cudaEvent_t e = NULL;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return e;
}

extern "C" void mt_cuda_event_destroy(void *ctx, void *ev)
{
    MT_CUDA_OP(ctx, MT_OP_EVENT_DESTROY);
    if (ev) MT_CUDA_CHECK(cudaEventDestroy((cudaEvent_t)ev));
}

extern "C" void mt_cuda_event_record(void *ctx, void *ev, enum mt_stream s)
{
    MT_CUDA_OP(ctx, MT_OP_EVENT_RECORD);
    MT_CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, stream_of(mt_cuda(ctx), s)));
}

extern "C" void mt_cuda_event_wait(void *ctx, enum mt_stream s, void *ev)
{
    MT_CUDA_OP(ctx, MT_OP_EVENT_WAIT);
    MT_CUDA_CHECK(cudaStreamWaitEvent(stream_of(mt_cuda(ctx), s), (cudaEvent_t)ev, 0));
}

// Pinned host memory on one side (alloc_host), so the copy is asynchronous.
extern "C" void mt_cuda_copy_async(void *ctx, void *dst, const void *src, size_t bytes)
{
    MT_CUDA_OP(ctx, MT_OP_COPY_ASYNC);
    if (bytes == 0) return;
    mt_cuda_ctx *c = mt_cuda(ctx);
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->copy_stream));
}

extern "C" int mt_cuda_select_device(int device, char *msg, size_t msg_len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && (device < 0 || device >= n)) {
        snprintf(msg, msg_len, "CUDA device %d does not exist (%d visible)", device, n);
        return -1;
    }
    if (e == cudaSuccess) e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        snprintf(msg, msg_len, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
        return -1;
    }
    // refused here with the reason rather than at the first kernel ("no kernel image")
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) == cudaSuccess &&
        mt_cuda_image_for(mt_cuda_archs(), p.major, p.minor, NULL, 0) == MT_CUDA_IMAGE_NONE) {
        snprintf(msg, msg_len,
                 "CUDA device %d (%s) is sm_%d%d; this moetrain holds GPU code for %s only, none of which it "
                 "runs (rebuild with ./configure --with-cuda-arch, e.g. adding sm_%d%d)",
                 device, p.name, p.major, p.minor, mt_cuda_archs(), p.major, p.minor);
        return -1;
    }
    (void)cudaGetLastError();
    return 0;
}

extern "C" bool mt_cuda_is_device_memory(const void *p) { return p && !is_host_memory(p); }

extern "C" void *mt_cuda_stream(const struct mt_kernels *k) { return mt_cuda(k->ctx)->stream; }

extern "C" void mt_cuda_counts(void *ctx, struct mt_op_counts *out) { *out = mt_cuda(ctx)->counts; }

extern "C" bool mt_cuda_emulated_counts(const struct mt_kernels *k, long long *launches, long long *syncs)
{
#ifdef MT_CUDA_EMU
    const mt_cuda_ctx *c = mt_cuda(k->ctx);
    mt_emu_counts(launches, syncs);
    *launches -= c->emu_launches0;
    *syncs -= c->emu_syncs0;
    return true;
#else
    (void)k, (void)launches, (void)syncs;
    return false;
#endif
}

extern "C" void mt_cuda_sync(void *ctx)
{
    MT_CUDA_OP(ctx, MT_OP_SYNC);
    mt_cuda_note_sync(mt_cuda(ctx));
    MT_CUDA_CHECK(cudaStreamSynchronize(mt_cuda(ctx)->stream));
}

// GEMM compute type, read once from MT_CUDA_GEMM_COMPUTE (bf16, the default; tf32;
// fp32): bf16 and tf32 run on tensor cores from fp32 operands, fp32 is the exact
// (slow) reference for checking a suspicious result.
static int gemm_compute_from_env(cublasComputeType_t *out, char *msg, size_t msg_len)
{
    const char *s = getenv("MT_CUDA_GEMM_COMPUTE");
    if (!s || !*s || !strcmp(s, "bf16")) *out = CUBLAS_COMPUTE_32F_FAST_16BF;
    else if (!strcmp(s, "tf32")) *out = CUBLAS_COMPUTE_32F_FAST_TF32;
    else if (!strcmp(s, "fp32")) *out = CUBLAS_COMPUTE_32F;
    else {
        snprintf(msg, msg_len, "MT_CUDA_GEMM_COMPUTE='%s' is not one of bf16, tf32, fp32", s);
        return -1;
    }
    return 0;
}

extern "C" int mt_cuda_ctx_create(void **out, char *msg, size_t msg_len)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        snprintf(msg, msg_len, "no CUDA device (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        (void)cudaGetLastError();
        return -1;
    }
    mt_cuda_ctx *c = new mt_cuda_ctx();
    c->in_use = c->cached = c->peak_in_use = c->reserved = 0;
    c->device_allocs = 0;
    c->lt_ws = c->host_stage = NULL;
    c->rope_tab = NULL;
    c->rope_T = c->rope_D = 0;
    c->rope_theta = 0.0f;
    c->stream = c->copy_stream = NULL;
    c->lt = NULL;
    c->counts = mt_op_counts{};
    c->op = MT_OP_COUNT;
    mt_cuda_launch_slot = &c->counts.launches[MT_OP_COUNT];
#ifdef MT_CUDA_EMU
    mt_emu_counts(&c->emu_launches0, &c->emu_syncs0);
#endif
    if (gemm_compute_from_env(&c->gemm_compute, msg, msg_len)) {
        delete c;
        return -1;
    }
    int smem = 0;
#define TRY(call)                                                                          \
    do {                                                                                   \
        cudaError_t te_ = (call);                                                          \
        if (te_ != cudaSuccess) {                                                          \
            snprintf(msg, msg_len, "%s: %s", #call, cudaGetErrorString(te_));              \
            goto fail;                                                                     \
        }                                                                                  \
    } while (0)
    TRY(cudaGetDevice(&c->device));
    TRY(cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, c->device));
    TRY(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device));
    c->smem_optin = (size_t)smem;
    TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    TRY(cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking));
    TRY(cudaMallocHost(&c->host_stage, MT_CUDA_STAGE_BYTES));
    TRY(cudaMalloc(&c->lt_ws, MT_CUDA_LT_WORKSPACE));
#undef TRY
    c->lt_ws_bytes = MT_CUDA_LT_WORKSPACE;
    c->reserved += MT_CUDA_LT_WORKSPACE;
    c->device_allocs++;
    {
        cublasStatus_t s = cublasLtCreate(&c->lt);
        if (s != CUBLAS_STATUS_SUCCESS) {
            snprintf(msg, msg_len, "cublasLtCreate: %s", cublasLtGetStatusString(s));
            goto fail;
        }
    }
    *out = c;
    return 0;
fail:
    (void)cudaGetLastError();
    mt_cuda_ctx_destroy(c, NULL, 0);
    return -1;
}

// Everything the context owns, in the reverse order of creation; a field still NULL
// (a creation that failed half-way) is skipped.
extern "C" int mt_cuda_ctx_destroy(void *ctx, char *msg, size_t msg_len)
{
    mt_cuda_ctx *c = mt_cuda(ctx);
    int rc = 0;
    auto note = [&](const char *call, const char *why) {
        if (rc == 0 && msg && msg_len) snprintf(msg, msg_len, "%s: %s", call, why);
        rc = -1;
    };
    auto cuda = [&](const char *call, cudaError_t e) {
        if (e != cudaSuccess) note(call, cudaGetErrorString(e));
    };
    // work still queued reads the plans, the workspace and the blocks
    if (c->stream) cuda("cudaStreamSynchronize", cudaStreamSynchronize(c->stream));
    if (c->copy_stream) cuda("cudaStreamSynchronize", cudaStreamSynchronize(c->copy_stream));
    mt_cuda_graphs_destroy(c);
    mt_cuda_gemm_plans_destroy(c);
    if (c->lt) {
        const cublasStatus_t s = cublasLtDestroy(c->lt);
        if (s != CUBLAS_STATUS_SUCCESS) note("cublasLtDestroy", cublasLtGetStatusString(s));
    }
    {
        std::lock_guard<std::mutex> lock(c->mu);
        for (auto &kv : c->live) cuda("cudaFree (a block still in use)", cudaFree(kv.first));
        c->live.clear();
        release_cached(c);
    }
    if (c->lt_ws) cuda("cudaFree (cuBLASLt workspace)", cudaFree(c->lt_ws));
    if (c->host_stage) cuda("cudaFreeHost", cudaFreeHost(c->host_stage));
    if (c->copy_stream) cuda("cudaStreamDestroy", cudaStreamDestroy(c->copy_stream));
    if (c->stream) cuda("cudaStreamDestroy", cudaStreamDestroy(c->stream));
    (void)cudaGetLastError();
    delete c;
    return rc;
}

extern "C" void mt_cuda_mem_stats(const struct mt_kernels *k, struct mt_cuda_mem_stats *s)
{
    mt_cuda_ctx *c = mt_cuda(k->ctx);
    std::lock_guard<std::mutex> lock(c->mu);
    s->in_use = c->in_use;
    s->cached = c->cached;
    s->peak_in_use = c->peak_in_use;
    s->reserved = c->reserved;
    s->device_allocs = c->device_allocs;
}

// Dense bf16 tensor-core multiply-adds x 2 per SM per clock.
static int bf16_flops_per_clock_per_sm(int major)
{
    switch (major) {
    case 8: return 2048;  // A100
    case 9: return 4096;  // H100, H200
    case 10: return 8192; // B200, GB200
    default: return 0;
    }
}

extern "C" int mt_cuda_device_info(struct mt_cuda_device_info *info)
{
    memset(info, 0, sizeof *info);
    int dev = 0, khz = 0;
    cudaDeviceProp p;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->sm_count = p.multiProcessorCount;
    info->clock_ghz = khz / 1e6;
    info->bf16_dense_tflops =
        info->sm_count * info->clock_ghz * bf16_flops_per_clock_per_sm(p.major) / 1e3;
    info->mem_gib = (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0);
    return 0;
}

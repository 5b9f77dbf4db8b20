/* The guard backend: the CPU reference kernels on emulated device memory.
 *
 * A device backend's memory cannot be read or written by host code; a model or
 * trainer that does so works on the CPU backend and crashes (or silently reads
 * garbage) on a GPU. This backend makes such code fail on any machine:
 * - alloc maps whole pages and keeps them PROT_NONE; host code touching them
 *   outside an op faults, and the fault handler names the allocation and offset;
 * - every op checks that each tensor argument lies in a live allocation (backend
 *   memory) and that each host-value argument (a loss) does not, opens every
 *   allocation for the duration of the op, and closes them after;
 * - copy accepts any direction, as cudaMemcpyDefault does, and checks that a
 *   device-side range lies inside one allocation.
 * Collectives on backend memory go through mt_guard_open/mt_guard_close (the
 * runtime's device-memory hooks), the way NCCL reads device buffers.
 * The copy stream (copy_async, events) runs at once too, so results never depend on
 * its order; what a device needs is checked instead: a copy_async comes after the copy
 * stream waited for everything queued on the compute stream, and until the compute
 * stream waits for an event recorded on the copy stream after it, no op, copy, memset
 * or free touches the copy's backend-memory side (a tensor read before its reload was
 * waited for is an error, naming the copy).
 *
 * The FP8/FP4 recipes' qdq is the CPU's under the same checks.
 * Results are those of the CPU backend, bit for bit. Not thread-safe (one thread
 * calls the ops, as with a CUDA stream); OpenMP threads inside an op are fine. */
#include "kernels/cpu/cpu_ops.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

struct region {
    char *base;
    size_t bytes, mapped; /* requested, mapped (whole pages) */
    long long serial;     /* allocation number, for messages */
};

static struct {
    struct region *r;
    int n, cap;
    int open_depth;
    long long serial;
    size_t page;
} G;

static const struct mt_kernels *cpu;

/* What a device would have made the host do (struct mt_op_counts): every op a launch;
 * a synchronisation for sync and a copy to or from host memory (the ops' scalar results
 * stay in backend memory). */
static struct mt_op_counts COUNTS;

/* Host memory (alloc_host): plain host memory the host may touch, recorded so that
 * free_host of anything else, or free of it, is reported (as cudaFreeHost and cudaFree
 * report a mix-up). */
static struct {
    void **p;
    int n, cap;
} HOSTMEM;

/* The two streams' order (kernels.h, copy_async): marks count what was queued on each;
 * an event holds its stream and mark; pending holds the copies the compute stream has
 * not waited for. */
struct guard_event {
    enum mt_stream s;
    long long mark;
    bool recorded;
};

static struct {
    long long compute_ops; /* ops, copies and memsets queued on the compute stream */
    long long copies;      /* copy_async calls */
    long long copy_saw;    /* compute ops the copy stream has waited for */
    struct pending_copy {
        const char *dev; /* its backend-memory side */
        size_t bytes;
        long long no;    /* copy_async number, from 1 */
    } *pending;
    int n, cap;
} CS;

/* ---- regions ------------------------------------------------------------------ */

static struct region *find(const void *p)
{
    const char *c = p;
    for (int i = 0; i < G.n; i++)
        if (c >= G.r[i].base && c < G.r[i].base + G.r[i].mapped) return &G.r[i];
    return NULL;
}

bool mt_guard_owns(const void *p, size_t bytes)
{
    const struct region *r = p ? find(p) : NULL;
    return r && (size_t)((const char *)p - r->base) + bytes <= r->bytes;
}

static void protect_all(int prot)
{
    for (int i = 0; i < G.n; i++)
        if (mprotect(G.r[i].base, G.r[i].mapped, prot) != 0) {
            perror("moetrain: guard backend: mprotect");
            abort();
        }
}

void mt_guard_open(void)
{
    if (G.open_depth++ == 0) protect_all(PROT_READ | PROT_WRITE);
}

void mt_guard_close(void)
{
    if (--G.open_depth == 0) protect_all(PROT_NONE);
}

static void segv_handler(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    const struct region *r = find(si->si_addr);
    char msg[256];
    int n;
    if (r)
        n = snprintf(msg, sizeof msg,
                     "moetrain: guard backend: host code touched backend memory at %p, byte %zu "
                     "of allocation #%lld (%zu bytes), outside an op\n",
                     si->si_addr, (size_t)((char *)si->si_addr - r->base), r->serial, r->bytes);
    else
        n = snprintf(msg, sizeof msg, "moetrain: guard backend: segmentation fault at %p\n",
                     si->si_addr);
    if (n > 0) {
        ssize_t w = write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        (void)w;
    }
    signal(sig, SIG_DFL); /* the faulting access repeats and ends the process */
}

static _Noreturn void misuse(const char *op, const char *arg, const void *p, const char *what)
{
    fprintf(stderr, "moetrain: guard backend: %s: argument '%s' (%p) %s\n", op, arg, p, what);
    abort();
}

/* [p, p+bytes) overlaps a copy_async the compute stream has not waited for. */
static void unsettled(const char *op, const char *arg, const void *p, size_t bytes)
{
    const char *c = p;
    for (int i = 0; i < CS.n; i++) {
        const struct pending_copy *q = &CS.pending[i];
        if (c < q->dev + q->bytes && q->dev < c + bytes) {
            char what[320];
            snprintf(what, sizeof what,
                     "lies in the %zu bytes copy_async #%lld moves, which the compute stream has "
                     "not waited for (event_record on the copy stream after the copy, then "
                     "event_wait on the compute stream, before using them)",
                     q->bytes, q->no);
            misuse(op, arg, p, what);
        }
    }
}

/* A tensor argument: NULL (an optional tensor, or an empty one) or backend memory. */
static void dev(const char *op, const char *arg, const void *p)
{
    if (p && !find(p)) misuse(op, arg, p, "is host memory; the op takes backend memory");
    if (p) unsettled(op, arg, p, 1);
}

/* A host argument (an argument struct the op reads on the host). */
static void host(const char *op, const char *arg, const void *p)
{
    if (p && find(p)) misuse(op, arg, p, "is backend memory; the op reads it on the host");
}

static void range(const char *op, const char *arg, const void *p, size_t bytes)
{
    const struct region *r = find(p);
    if (r && (size_t)((const char *)p - r->base) + bytes > r->bytes)
        misuse(op, arg, p, "runs past the end of its allocation");
}

/* A typed tensor argument: backend memory holding its whole view, a consistent view
 * (ld >= cols), fp32 or bf16 (the fp8 dtypes are the FP8 recipes'), and the shape the
 * op's size arguments give (rows x cols; -1 leaves a dimension unchecked). */
static void tensor(const char *op, const char *arg, struct mt_tensor t, int64_t rows, int64_t cols)
{
    if (t.dtype != MT_F32 && t.dtype != MT_BF16)
        misuse(op, arg, t.data, "has a dtype this op does not take");
    if (t.rows < 0 || t.cols < 0 || t.ld < t.cols)
        misuse(op, arg, t.data, "is not a valid view (rows, cols >= 0, ld >= cols)");
    if ((rows >= 0 && t.rows != rows) || (cols >= 0 && t.cols != cols)) {
        char what[160];
        snprintf(what, sizeof what, "is %lld x %lld where the op's sizes say %lld x %lld",
                 (long long)t.rows, (long long)t.cols, (long long)rows, (long long)cols);
        misuse(op, arg, t.data, what);
    }
    size_t bytes = mt_tensor_bytes(t);
    if (!bytes) return;
    dev(op, arg, t.data);
    range(op, arg, t.data, bytes);
    unsettled(op, arg, t.data, bytes);
}

/* ---- memory ------------------------------------------------------------------- */

static void *g_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    if (!G.page) G.page = (size_t)sysconf(_SC_PAGESIZE);
    struct sigaction cur;
    if (sigaction(SIGSEGV, NULL, &cur) == 0 && cur.sa_sigaction != segv_handler) {
        /* (again when someone else installed theirs since) */
        struct sigaction sa = { 0 };
        sa.sa_sigaction = segv_handler;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, NULL);
    }
    if (G.n == G.cap) {
        int cap = G.cap ? 2 * G.cap : 64;
        struct region *r = realloc(G.r, sizeof *r * (size_t)cap);
        if (!r) return NULL;
        G.r = r;
        G.cap = cap;
    }
    size_t mapped = (bytes + G.page - 1) / G.page * G.page;
    if (!mapped) mapped = G.page;
    void *p = mmap(NULL, mapped, G.open_depth ? PROT_READ | PROT_WRITE : PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    G.r[G.n++] = (struct region){ p, bytes, mapped, ++G.serial };
    return p;
}

static void g_free(void *ctx, void *p)
{
    (void)ctx;
    if (!p) return;
    for (int i = 0; i < G.n; i++)
        if (G.r[i].base == p) {
            unsettled("free", "p", p, G.r[i].bytes);
            munmap(G.r[i].base, G.r[i].mapped);
            G.r[i] = G.r[--G.n];
            return;
        }
    for (int i = 0; i < HOSTMEM.n; i++)
        if (HOSTMEM.p[i] == p) misuse("free", "p", p, "is host memory from alloc_host; free it with free_host");
    misuse("free", "p", p, "was not returned by alloc");
}

static void *g_alloc_host(void *ctx, size_t bytes)
{
    if (HOSTMEM.n == HOSTMEM.cap) {
        int cap = HOSTMEM.cap ? 2 * HOSTMEM.cap : 16;
        void **p = realloc(HOSTMEM.p, sizeof *p * (size_t)cap);
        if (!p) return NULL;
        HOSTMEM.p = p;
        HOSTMEM.cap = cap;
    }
    void *p = cpu->op.alloc_host(ctx, bytes);
    if (p) HOSTMEM.p[HOSTMEM.n++] = p;
    return p;
}

static void g_free_host(void *ctx, void *p)
{
    if (!p) return;
    for (int i = 0; i < HOSTMEM.n; i++)
        if (HOSTMEM.p[i] == p) {
            cpu->op.free_host(ctx, p);
            HOSTMEM.p[i] = HOSTMEM.p[--HOSTMEM.n];
            return;
        }
    misuse("free_host", "p", p, find(p) ? "is backend memory from alloc; free it with free"
                                         : "was not returned by alloc_host");
}

static void g_memset(void *ctx, void *p, int byte, size_t bytes)
{
    if (!bytes) return;
    dev("memset", "p", p);
    range("memset", "p", p, bytes);
    unsettled("memset", "p", p, bytes);
    CS.compute_ops++;
    mt_guard_open();
    cpu->op.memset(ctx, p, byte, bytes);
    mt_guard_close();
}

static void g_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    if (!find(dst) || !find(src)) COUNTS.syncs[MT_OP_COPY]++;
    range("copy", "dst", dst, bytes);
    range("copy", "src", src, bytes);
    if (find(dst)) unsettled("copy", "dst", dst, bytes);
    if (find(src)) unsettled("copy", "src", src, bytes);
    CS.compute_ops++;
    mt_guard_open();
    cpu->op.copy(ctx, dst, src, bytes);
    mt_guard_close();
}

static void g_sync(void *ctx)
{
    COUNTS.syncs[MT_OP_SYNC]++;
    cpu->op.sync(ctx);
}

static void *g_event_create(void *ctx)
{
    (void)ctx;
    return calloc(1, sizeof(struct guard_event));
}

static void g_event_destroy(void *ctx, void *ev)
{
    (void)ctx;
    free(ev);
}

static void g_event_record(void *ctx, void *ev, enum mt_stream s)
{
    (void)ctx;
    host("event_record", "ev", ev);
    struct guard_event *e = ev;
    *e = (struct guard_event){s, s == MT_STREAM_COMPUTE ? CS.compute_ops : CS.copies, true};
}

static void g_event_wait(void *ctx, enum mt_stream s, void *ev)
{
    (void)ctx;
    host("event_wait", "ev", ev);
    const struct guard_event *e = ev;
    if (!e->recorded) misuse("event_wait", "ev", ev, "was never recorded");
    if (e->s == s) return; /* a stream is in order with itself */
    if (s == MT_STREAM_COPY) {
        if (e->mark > CS.copy_saw) CS.copy_saw = e->mark;
        return;
    }
    for (int i = 0; i < CS.n;) /* the compute stream now follows copies 1..mark */
        if (CS.pending[i].no <= e->mark) CS.pending[i] = CS.pending[--CS.n];
        else i++;
}

static void g_copy_async(void *ctx, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    const bool to_host = find(src) != NULL;
    const char *d = to_host ? src : dst;
    if (!find(d) || find(to_host ? dst : src))
        misuse("copy_async", to_host ? "src" : "dst", d,
               "and the other side: copy_async moves between backend memory and alloc_host memory");
    range("copy_async", to_host ? "src" : "dst", d, bytes);
    if (CS.copy_saw < CS.compute_ops) {
        char what[240];
        snprintf(what, sizeof what,
                 "is copied on the copy stream, which has not waited for the last %lld op(s) "
                 "queued on the compute stream (event_record on compute, event_wait on copy first)",
                 CS.compute_ops - CS.copy_saw);
        misuse("copy_async", to_host ? "src" : "dst", d, what);
    }
    if (CS.n == CS.cap) {
        int cap = CS.cap ? 2 * CS.cap : 64;
        struct pending_copy *q = realloc(CS.pending, sizeof *q * (size_t)cap);
        if (!q) misuse("copy_async", "dst", dst, "cannot be tracked: out of host memory");
        CS.pending = q;
        CS.cap = cap;
    }
    CS.pending[CS.n++] = (struct pending_copy){d, bytes, ++CS.copies};
    mt_guard_open();
    cpu->op.copy(ctx, dst, src, bytes);
    mt_guard_close();
}

static void g_counts(void *ctx, struct mt_op_counts *out)
{
    (void)ctx;
    *out = COUNTS;
}

/* ---- ops: check, open, run the reference, close --------------------------------- */

/* A launch of op (one kernel, as the CPU reference runs it), counted. */
#define RUN(op, call)                                                                      \
    do {                                                                                   \
        COUNTS.launches[op]++;                                                             \
        CS.compute_ops++;                                                                  \
        mt_guard_open();                                                                   \
        call;                                                                              \
        mt_guard_close();                                                                  \
    } while (0)

static void g_gemm(void *ctx, bool ta, bool tb, int M, int N, int K, float alpha,
                   struct mt_tensor A, struct mt_tensor B, float beta, struct mt_tensor C)
{
    tensor("gemm", "A", A, ta ? K : M, ta ? M : K), tensor("gemm", "B", B, tb ? N : K, tb ? K : N);
    tensor("gemm", "C", C, M, N);
    if (C.dtype != MT_F32 && beta != 0.0f) misuse("gemm", "C", C.data, "is bf16 with beta != 0");
    RUN(MT_OP_GEMM, cpu->op.gemm(ctx, ta, tb, M, N, K, alpha, A, B, beta, C));
}

static void g_grouped_gemm(void *ctx, bool ta, bool tb, int G_, const int32_t *offsets, int M,
                           int N, int K, float alpha, struct mt_tensor A, struct mt_tensor B,
                           float beta, struct mt_tensor C)
{
    dev("grouped_gemm", "offsets", offsets);
    tensor("grouped_gemm", "A", A, -1, ta ? M : K), tensor("grouped_gemm", "B", B, -1, -1);
    tensor("grouped_gemm", "C", C, ta ? (int64_t)G_ * M : -1, N);
    if (C.dtype != MT_F32 && beta != 0.0f)
        misuse("grouped_gemm", "C", C.data, "is bf16 with beta != 0");
    RUN(MT_OP_GROUPED_GEMM, cpu->op.grouped_gemm(ctx, ta, tb, G_, offsets, M, N, K, alpha, A, B, beta, C));
}

static void g_embedding_fwd(void *ctx, struct mt_tensor out, const int32_t *tokens,
                            struct mt_tensor wte, int N, int C)
{
    tensor("embedding_fwd", "out", out, N, C), dev("embedding_fwd", "tokens", tokens);
    tensor("embedding_fwd", "wte", wte, -1, C);
    RUN(MT_OP_EMBEDDING_FWD, cpu->op.embedding_fwd(ctx, out, tokens, wte, N, C));
}

static void g_embedding_bwd(void *ctx, float *dwte, const float *dout, const int32_t *tokens,
                            int N, int C)
{
    dev("embedding_bwd", "dwte", dwte), dev("embedding_bwd", "dout", dout);
    dev("embedding_bwd", "tokens", tokens);
    RUN(MT_OP_EMBEDDING_BWD, cpu->op.embedding_bwd(ctx, dwte, dout, tokens, N, C));
}

static void g_rmsnorm_fwd(void *ctx, struct mt_tensor out, float *rstd, struct mt_tensor x,
                          struct mt_tensor w, int N, int C, float eps)
{
    tensor("rmsnorm_fwd", "out", out, N, C), dev("rmsnorm_fwd", "rstd", rstd);
    tensor("rmsnorm_fwd", "x", x, N, C), tensor("rmsnorm_fwd", "w", w, 1, C);
    RUN(MT_OP_RMSNORM_FWD, cpu->op.rmsnorm_fwd(ctx, out, rstd, x, w, N, C, eps));
}

static void g_rmsnorm_bwd(void *ctx, float *dx, float *dw, const float *dout, struct mt_tensor x,
                          struct mt_tensor w, const float *rstd, int N, int C)
{
    dev("rmsnorm_bwd", "dx", dx), dev("rmsnorm_bwd", "dw", dw);
    dev("rmsnorm_bwd", "dout", dout), tensor("rmsnorm_bwd", "x", x, N, C);
    tensor("rmsnorm_bwd", "w", w, 1, C), dev("rmsnorm_bwd", "rstd", rstd);
    RUN(MT_OP_RMSNORM_BWD, cpu->op.rmsnorm_bwd(ctx, dx, dw, dout, x, w, rstd, N, C));
}

static void g_rope_fwd(void *ctx, struct mt_tensor out, struct mt_tensor x, int B, int T, int H,
                       int D, float theta)
{
    tensor("rope_fwd", "out", out, (int64_t)B * T, (int64_t)H * D);
    tensor("rope_fwd", "x", x, (int64_t)B * T, (int64_t)H * D);
    RUN(MT_OP_ROPE_FWD, cpu->op.rope_fwd(ctx, out, x, B, T, H, D, theta));
}

static void g_rope_bwd(void *ctx, float *dx, const float *dout, int B, int T, int H, int D,
                       float theta)
{
    dev("rope_bwd", "dx", dx), dev("rope_bwd", "dout", dout);
    RUN(MT_OP_ROPE_BWD, cpu->op.rope_bwd(ctx, dx, dout, B, T, H, D, theta));
}

static void g_attention_fwd(void *ctx, float *out, float *lse, struct mt_tensor q,
                            struct mt_tensor k, struct mt_tensor v, int B, int T, int Hq, int Hkv,
                            int D)
{
    const int64_t N = (int64_t)B * T;
    dev("attention_fwd", "out", out), dev("attention_fwd", "lse", lse);
    tensor("attention_fwd", "q", q, N, (int64_t)Hq * D);
    tensor("attention_fwd", "k", k, N, (int64_t)Hkv * D);
    tensor("attention_fwd", "v", v, N, (int64_t)Hkv * D);
    RUN(MT_OP_ATTENTION_FWD, cpu->op.attention_fwd(ctx, out, lse, q, k, v, B, T, Hq, Hkv, D));
}

static void g_attention_bwd(void *ctx, float *dq, float *dk, float *dv, const float *dout,
                            struct mt_tensor q, struct mt_tensor k, struct mt_tensor v,
                            const float *out, const float *lse, int B, int T, int Hq, int Hkv,
                            int D)
{
    const int64_t N = (int64_t)B * T;
    dev("attention_bwd", "dq", dq), dev("attention_bwd", "dk", dk);
    dev("attention_bwd", "dv", dv), dev("attention_bwd", "dout", dout);
    tensor("attention_bwd", "q", q, N, (int64_t)Hq * D);
    tensor("attention_bwd", "k", k, N, (int64_t)Hkv * D);
    tensor("attention_bwd", "v", v, N, (int64_t)Hkv * D);
    dev("attention_bwd", "out", out), dev("attention_bwd", "lse", lse);
    RUN(MT_OP_ATTENTION_BWD, cpu->op.attention_bwd(ctx, dq, dk, dv, dout, q, k, v, out, lse, B, T, Hq, Hkv, D));
}

static void g_swiglu_fwd(void *ctx, struct mt_tensor out, struct mt_tensor gate,
                         struct mt_tensor up, int N, int F)
{
    tensor("swiglu_fwd", "out", out, N, F), tensor("swiglu_fwd", "gate", gate, N, F);
    tensor("swiglu_fwd", "up", up, N, F);
    RUN(MT_OP_SWIGLU_FWD, cpu->op.swiglu_fwd(ctx, out, gate, up, N, F));
}

static void g_swiglu_bwd(void *ctx, float *dgate, float *dup, const float *dout,
                         struct mt_tensor gate, struct mt_tensor up, int N, int F)
{
    dev("swiglu_bwd", "dgate", dgate), dev("swiglu_bwd", "dup", dup);
    dev("swiglu_bwd", "dout", dout), tensor("swiglu_bwd", "gate", gate, N, F);
    tensor("swiglu_bwd", "up", up, N, F);
    RUN(MT_OP_SWIGLU_BWD, cpu->op.swiglu_bwd(ctx, dgate, dup, dout, gate, up, N, F));
}

static void g_add(void *ctx, struct mt_tensor out, struct mt_tensor a, struct mt_tensor b, size_t n)
{
    tensor("add", "out", out, 1, (int64_t)n), tensor("add", "a", a, 1, (int64_t)n);
    tensor("add", "b", b, 1, (int64_t)n);
    RUN(MT_OP_ADD, cpu->op.add(ctx, out, a, b, n));
}

static void g_router_fwd(void *ctx, const struct mt_router_args *a, const float *logits,
                         const float *expert_bias, int32_t *topk_idx, float *topk_prob)
{
    host("router_fwd", "a", a);
    dev("router_fwd", "logits", logits), dev("router_fwd", "expert_bias", expert_bias);
    dev("router_fwd", "topk_idx", topk_idx), dev("router_fwd", "topk_prob", topk_prob);
    RUN(MT_OP_ROUTER_FWD, cpu->op.router_fwd(ctx, a, logits, expert_bias, topk_idx, topk_prob));
}

static void g_router_bwd(void *ctx, const struct mt_router_args *a, float *dlogits,
                         const float *dprob, const float *logits, const int32_t *topk_idx)
{
    host("router_bwd", "a", a);
    dev("router_bwd", "dlogits", dlogits), dev("router_bwd", "dprob", dprob);
    dev("router_bwd", "logits", logits), dev("router_bwd", "topk_idx", topk_idx);
    RUN(MT_OP_ROUTER_BWD, cpu->op.router_bwd(ctx, a, dlogits, dprob, logits, topk_idx));
}

static void g_aux_counts(void *ctx, const struct mt_aux_args *a, float *counts,
                         const float *logits)
{
    host("aux_counts", "a", a);
    dev("aux_counts", "counts", counts), dev("aux_counts", "logits", logits);
    RUN(MT_OP_AUX_COUNTS, cpu->op.aux_counts(ctx, a, counts, logits));
}

static void g_aux_loss_fwd(void *ctx, const struct mt_aux_args *a, double *acc,
                           const float *counts, const float *logits)
{
    host("aux_loss_fwd", "a", a);
    if (!acc) misuse("aux_loss_fwd", "acc", acc, "is NULL; the op adds its loss there");
    dev("aux_loss_fwd", "acc", acc), range("aux_loss_fwd", "acc", acc, sizeof *acc);
    dev("aux_loss_fwd", "counts", counts), dev("aux_loss_fwd", "logits", logits);
    RUN(MT_OP_AUX_LOSS_FWD, cpu->op.aux_loss_fwd(ctx, a, acc, counts, logits));
}

static void g_aux_loss_bwd(void *ctx, const struct mt_aux_args *a, float *dlogits, float dloss,
                           const float *counts, const float *logits)
{
    host("aux_loss_bwd", "a", a);
    dev("aux_loss_bwd", "dlogits", dlogits), dev("aux_loss_bwd", "counts", counts);
    dev("aux_loss_bwd", "logits", logits);
    RUN(MT_OP_AUX_LOSS_BWD, cpu->op.aux_loss_bwd(ctx, a, dlogits, dloss, counts, logits));
}

static void g_z_loss_fwd(void *ctx, double *acc, float *lse, const float *logits, int N, int E,
                         float coeff)
{
    dev("z_loss_fwd", "acc", acc);
    if (acc) range("z_loss_fwd", "acc", acc, sizeof *acc);
    dev("z_loss_fwd", "lse", lse), dev("z_loss_fwd", "logits", logits);
    RUN(MT_OP_Z_LOSS_FWD, cpu->op.z_loss_fwd(ctx, acc, lse, logits, N, E, coeff));
}

static void g_z_loss_bwd(void *ctx, float *dlogits, float dloss, const float *lse,
                         const float *logits, int N, int E, float coeff)
{
    dev("z_loss_bwd", "dlogits", dlogits), dev("z_loss_bwd", "lse", lse);
    dev("z_loss_bwd", "logits", logits);
    RUN(MT_OP_Z_LOSS_BWD, cpu->op.z_loss_bwd(ctx, dlogits, dloss, lse, logits, N, E, coeff));
}

static void g_dispatch_plan(void *ctx, struct mt_dispatch_plan *plan, const int32_t *topk_idx,
                            const float *topk_prob, int N, int E, int topk, int capacity,
                            enum mt_drop_policy policy, bool pad, int64_t *dropped,
                            int64_t *load)
{
    host("dispatch_plan", "plan", plan);
    dev("dispatch_plan", "plan->offsets", plan->offsets);
    dev("dispatch_plan", "plan->row_slot", plan->row_slot);
    dev("dispatch_plan", "plan->slot_row", plan->slot_row);
    dev("dispatch_plan", "plan->kept", plan->kept);
    dev("dispatch_plan", "topk_idx", topk_idx), dev("dispatch_plan", "topk_prob", topk_prob);
    dev("dispatch_plan", "dropped", dropped), dev("dispatch_plan", "load", load);
    if (dropped) range("dispatch_plan", "dropped", dropped, sizeof *dropped);
    if (load) range("dispatch_plan", "load", load, sizeof *load * (size_t)(E > 0 ? E : 0));
    RUN(MT_OP_DISPATCH_PLAN, cpu->op.dispatch_plan(ctx, plan, topk_idx, topk_prob, N, E, topk,
                                                   capacity, policy, pad, dropped, load));
}

static void g_expert_select(void *ctx, int32_t *out, const int32_t *idx, size_t n, int e0,
                            int count, int64_t *selected)
{
    dev("expert_select", "out", out), dev("expert_select", "idx", idx);
    dev("expert_select", "selected", selected);
    if (selected) range("expert_select", "selected", selected, sizeof *selected * (size_t)count);
    RUN(MT_OP_EXPERT_SELECT, cpu->op.expert_select(ctx, out, idx, n, e0, count, selected));
}

static void g_expert_bias_update(void *ctx, float *bias, const int64_t *load, int nmoe, int E,
                                 float rate, const double *sumsq, const double *loss,
                                 int loss_stride, int n_loss)
{
    dev("expert_bias_update", "bias", bias), dev("expert_bias_update", "load", load);
    if (sumsq) dev("expert_bias_update", "sumsq", sumsq);
    if (sumsq && n_loss > 0) dev("expert_bias_update", "loss", loss);
    RUN(MT_OP_EXPERT_BIAS_UPDATE, cpu->op.expert_bias_update(ctx, bias, load, nmoe, E, rate, sumsq,
                                                             loss, loss_stride, n_loss));
}

static void g_drop_mask(void *ctx, int32_t *out, const int32_t *idx, const int32_t *slot_row,
                        size_t n, int64_t *dropped)
{
    dev("drop_mask", "out", out), dev("drop_mask", "idx", idx);
    dev("drop_mask", "slot_row", slot_row), dev("drop_mask", "dropped", dropped);
    RUN(MT_OP_DROP_MASK, cpu->op.drop_mask(ctx, out, idx, slot_row, n, dropped));
}

static void g_permute_fwd(void *ctx, struct mt_tensor xp, struct mt_tensor x,
                          const int32_t *row_slot, int rows, int topk, int C)
{
    tensor("permute_fwd", "xp", xp, rows, C), tensor("permute_fwd", "x", x, -1, C);
    dev("permute_fwd", "row_slot", row_slot);
    RUN(MT_OP_PERMUTE_FWD, cpu->op.permute_fwd(ctx, xp, x, row_slot, rows, topk, C));
}

static void g_permute_bwd(void *ctx, float *dx, const float *dxp, const int32_t *slot_row, int N,
                          int topk, int C)
{
    dev("permute_bwd", "dx", dx), dev("permute_bwd", "dxp", dxp);
    dev("permute_bwd", "slot_row", slot_row);
    RUN(MT_OP_PERMUTE_BWD, cpu->op.permute_bwd(ctx, dx, dxp, slot_row, N, topk, C));
}

static void g_unpermute_fwd(void *ctx, struct mt_tensor out, struct mt_tensor yp,
                            const int32_t *slot_row, const float *prob, int N, int topk, int C)
{
    tensor("unpermute_fwd", "out", out, N, C), tensor("unpermute_fwd", "yp", yp, -1, C);
    dev("unpermute_fwd", "slot_row", slot_row), dev("unpermute_fwd", "prob", prob);
    RUN(MT_OP_UNPERMUTE_FWD, cpu->op.unpermute_fwd(ctx, out, yp, slot_row, prob, N, topk, C));
}

static void g_unpermute_bwd(void *ctx, float *dyp, float *dprob, const float *dout,
                            struct mt_tensor yp, const int32_t *slot_row, const float *prob, int N,
                            int topk, int C, int rows)
{
    dev("unpermute_bwd", "dyp", dyp), dev("unpermute_bwd", "dprob", dprob);
    dev("unpermute_bwd", "dout", dout), tensor("unpermute_bwd", "yp", yp, rows, C);
    dev("unpermute_bwd", "slot_row", slot_row), dev("unpermute_bwd", "prob", prob);
    RUN(MT_OP_UNPERMUTE_BWD, cpu->op.unpermute_bwd(ctx, dyp, dprob, dout, yp, slot_row, prob, N, topk, C, rows));
}

static void g_cross_entropy_fwd(void *ctx, float *lse, float *tlogit, const float *logits,
                                const int32_t *targets, int N, int V, int v0)
{
    dev("cross_entropy_fwd", "lse", lse), dev("cross_entropy_fwd", "tlogit", tlogit);
    dev("cross_entropy_fwd", "logits", logits), dev("cross_entropy_fwd", "targets", targets);
    RUN(MT_OP_CROSS_ENTROPY_FWD, cpu->op.cross_entropy_fwd(ctx, lse, tlogit, logits, targets, N, V, v0));
}

static void g_cross_entropy_bwd(void *ctx, float *dlogits, const float *logits, const float *lse,
                                const int32_t *targets, int N, int V, int v0, float scale)
{
    dev("cross_entropy_bwd", "dlogits", dlogits), dev("cross_entropy_bwd", "logits", logits);
    dev("cross_entropy_bwd", "lse", lse), dev("cross_entropy_bwd", "targets", targets);
    RUN(MT_OP_CROSS_ENTROPY_BWD, cpu->op.cross_entropy_bwd(ctx, dlogits, logits, lse, targets, N, V, v0, scale));
}

static void g_lse_combine(void *ctx, float *lse, const float *shard_lse, int R, int N)
{
    dev("lse_combine", "lse", lse), dev("lse_combine", "shard_lse", shard_lse);
    RUN(MT_OP_LSE_COMBINE, cpu->op.lse_combine(ctx, lse, shard_lse, R, N));
}

static void g_loss_sum(void *ctx, double *acc, const float *lse, const float *tlogit,
                       const int32_t *targets, int N)
{
    dev("loss_sum", "acc", acc), dev("loss_sum", "lse", lse);
    dev("loss_sum", "tlogit", tlogit), dev("loss_sum", "targets", targets);
    RUN(MT_OP_LOSS_SUM, cpu->op.loss_sum(ctx, acc, lse, tlogit, targets, N));
}

static void g_adamw(void *ctx, float *param, const float *grad, float *m, float *v, size_t n,
                    float lr, float beta1, float beta2, float eps, float weight_decay,
                    float grad_scale, long long t)
{
    dev("adamw", "param", param), dev("adamw", "grad", grad);
    dev("adamw", "m", m), dev("adamw", "v", v);
    RUN(MT_OP_ADAMW, cpu->op.adamw(ctx, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale,
                      t));
}

static void g_adamw_dev(void *ctx, float *param, const float *grad, float *m, float *v, size_t n,
                        const struct mt_adamw_consts *k, const double *sumsq, const double *loss,
                        int loss_stride, int n_loss, double clip)
{
    dev("adamw_dev", "param", param), dev("adamw_dev", "grad", grad);
    dev("adamw_dev", "m", m), dev("adamw_dev", "v", v);
    dev("adamw_dev", "k", k), dev("adamw_dev", "sumsq", sumsq);
    if (n_loss > 0) dev("adamw_dev", "loss", loss);
    RUN(MT_OP_ADAMW_DEV, cpu->op.adamw_dev(ctx, param, grad, m, v, n, k, sumsq, loss, loss_stride, n_loss, clip));
}

static void g_bf16_round(void *ctx, float *out, const float *x, size_t n)
{
    dev("bf16_round", "out", out), dev("bf16_round", "x", x);
    RUN(MT_OP_BF16_ROUND, cpu->op.bf16_round(ctx, out, x, n));
}

static void g_convert(void *ctx, struct mt_tensor dst, struct mt_tensor src)
{
    tensor("convert", "dst", dst, -1, -1), tensor("convert", "src", src, dst.rows, dst.cols);
    RUN(MT_OP_CONVERT, cpu->op.convert(ctx, dst, src));
}

/* The FP8/FP4 recipes' qdq (struct mt_quant_ops), counted with convert's launches as
 * the CUDA backend counts it. The spec is read on the host; its scale and amax are
 * backend memory, as a device reads and writes them. */
static void g_qdq(void *ctx, const struct mt_quant_spec *s, struct mt_tensor out, struct mt_tensor x)
{
    host("qdq", "spec", s);
    tensor("qdq", "x", x, -1, -1), tensor("qdq", "out", out, x.rows, x.cols);
    if (out.dtype != MT_F32) misuse("qdq", "out", out.data, "is not fp32");
    const size_t ob = mt_tensor_bytes(out), xb = mt_tensor_bytes(x);
    if (ob && xb && (const char *)x.data < (const char *)out.data + ob &&
        (const char *)out.data < (const char *)x.data + xb)
        misuse("qdq", "out", out.data, "overlaps x");
    dev("qdq", "spec->scale", s->scale), dev("qdq", "spec->amax", s->amax);
    if (s->scale) range("qdq", "spec->scale", s->scale, sizeof(float));
    if (s->amax) range("qdq", "spec->amax", s->amax, sizeof(float));
    dev("qdq", "spec->seed_dev", s->seed_dev);
    dev("qdq", "spec->work", s->work);
    if (s->work) range("qdq", "spec->work", s->work, s->work_bytes);
    RUN(MT_OP_CONVERT, cpu->quant->qdq(ctx, s, out, x));
}

/* An operand's spec of the quantised GEMM: read on the host, its scale, amax, tensor
 * amax and work backend memory. */
static void qgemm_spec(const char *arg, const struct mt_quant_spec *s)
{
    host("quantised gemm", arg, s);
    dev("quantised gemm", "spec->scale", s->scale), dev("quantised gemm", "spec->amax", s->amax);
    dev("quantised gemm", "spec->tensor_amax", s->tensor_amax);
    if (s->scale) range("quantised gemm", "spec->scale", s->scale, sizeof(float));
    if (s->amax) range("quantised gemm", "spec->amax", s->amax, sizeof(float));
    dev("quantised gemm", "spec->seed_dev", s->seed_dev);
    dev("quantised gemm", "spec->work", s->work);
    if (s->work) range("quantised gemm", "spec->work", s->work, s->work_bytes);
    dev("quantised gemm", "spec->saved", s->saved);
}

/* The quantised GEMM, counted as one GEMM launch (the CUDA backend charges its
 * quantisers and its matmul to gemm). */
static void g_qgemm(void *ctx, bool ta, bool tb, const struct mt_quant_spec *sa, struct mt_tensor a,
                    const struct mt_quant_spec *sb, struct mt_tensor b, float beta, struct mt_tensor c)
{
    const int64_t k = ta ? a.rows : a.cols;
    qgemm_spec("sa", sa), qgemm_spec("sb", sb);
    tensor("quantised gemm", "a", a, ta ? k : c.rows, ta ? c.rows : k);
    tensor("quantised gemm", "b", b, tb ? c.cols : k, tb ? k : c.cols);
    tensor("quantised gemm", "c", c, -1, -1);
    if (a.ld != a.cols || b.ld != b.cols) misuse("quantised gemm", "a", a.data, "or b is not dense");
    if (c.dtype != MT_F32 && beta != 0.0f) misuse("quantised gemm", "c", c.data, "is bf16 with beta != 0");
    RUN(MT_OP_GEMM, cpu->quant->gemm(ctx, ta, tb, sa, a, sb, b, beta, c));
}

/* The copy kept for backward, counted with convert's launches as qdq is; saved is
 * backend memory of saved_bytes. */
static void g_save(void *ctx, const struct mt_quant_spec *s, void *saved, struct mt_tensor x)
{
    host("save", "spec", s);
    tensor("save", "x", x, -1, -1);
    dev("save", "spec->scale", s->scale), dev("save", "spec->amax", s->amax);
    dev("save", "spec->tensor_amax", s->tensor_amax);
    dev("save", "spec->seed_dev", s->seed_dev);
    dev("save", "saved", saved);
    range("save", "saved", saved, cpu->quant->saved_bytes(s, x.rows, x.cols));
    RUN(MT_OP_CONVERT, cpu->quant->save(ctx, s, saved, x));
}

static void g_amax_nan_to_inf(void *ctx, float *amax, size_t n)
{
    dev("amax_nan_to_inf", "amax", amax);
    range("amax_nan_to_inf", "amax", amax, sizeof(float) * n);
    RUN(MT_OP_CONVERT, cpu->quant->amax_nan_to_inf(ctx, amax, n));
}

static void g_random_key(void *ctx, uint64_t *key, uint64_t base, int dp, int dp_rank, bool end,
                         const struct mt_step_gate *gate)
{
    dev("random_key", "key", key);
    range("random_key", "key", key, sizeof(uint64_t) * MT_Q_KEY_WORDS);
    if (gate) dev("random_key", "gate->sumsq", gate->sumsq);
    if (gate && gate->n_loss > 0) dev("random_key", "gate->loss", gate->loss);
    RUN(MT_OP_CONVERT, cpu->quant->random_key(ctx, key, base, dp, dp_rank, end, gate));
}

static const struct mt_quant_ops guard_quant_ops = { .qdq = g_qdq, .gemm = g_qgemm, .save = g_save,
                                                     .saved_bytes = mt_cpu_quant_saved_bytes,
                                                     .amax_nan_to_inf = g_amax_nan_to_inf,
                                                     .random_key = g_random_key,
                                                     .shards = true, .fp4_shards = true };

static void g_scale(void *ctx, float *x, float s, size_t n)
{
    dev("scale", "x", x);
    RUN(MT_OP_SCALE, cpu->op.scale(ctx, x, s, n));
}

static void g_amax_history(void *ctx, float *hist, float *hscale, float *scale, float *amax, int n,
                           int len, int32_t *pos, bool max_algo, float fmax, float gmax, int margin,
                           float grad_unit, const struct mt_step_gate *gate)
{
    dev("amax_history", "hist", hist), dev("amax_history", "hscale", hscale);
    dev("amax_history", "scale", scale), dev("amax_history", "amax", amax);
    if (amax) dev("amax_history", "pos", pos);
    if (amax && gate) dev("amax_history", "gate sumsq", gate->sumsq);
    if (amax && gate && gate->n_loss > 0) dev("amax_history", "gate loss", gate->loss);
    RUN(MT_OP_AMAX_HISTORY, cpu->op.amax_history(ctx, hist, hscale, scale, amax, n, len, pos,
                                                 max_algo, fmax, gmax, margin, grad_unit, gate));
}

static void g_sumsq(void *ctx, double *acc, const float *x, size_t n)
{
    dev("sumsq", "acc", acc), dev("sumsq", "x", x);
    RUN(MT_OP_SUMSQ, cpu->op.sumsq(ctx, acc, x, n));
}

static const struct mt_kernels guard_kernels = {
    .name = "guard",
    .ctx = NULL,
    .op = {
        .alloc = g_alloc,
        .free = g_free,
        .alloc_host = g_alloc_host,
        .free_host = g_free_host,
        .memset = g_memset,
        .copy = g_copy,
        .sync = g_sync,
        .event_create = g_event_create,
        .event_destroy = g_event_destroy,
        .event_record = g_event_record,
        .event_wait = g_event_wait,
        .copy_async = g_copy_async,
        .gemm = g_gemm,
        .grouped_gemm = g_grouped_gemm,
        .embedding_fwd = g_embedding_fwd,
        .embedding_bwd = g_embedding_bwd,
        .rmsnorm_fwd = g_rmsnorm_fwd,
        .rmsnorm_bwd = g_rmsnorm_bwd,
        .rope_fwd = g_rope_fwd,
        .rope_bwd = g_rope_bwd,
        .attention_fwd = g_attention_fwd,
        .attention_bwd = g_attention_bwd,
        .swiglu_fwd = g_swiglu_fwd,
        .swiglu_bwd = g_swiglu_bwd,
        .add = g_add,
        .router_fwd = g_router_fwd,
        .router_bwd = g_router_bwd,
        .aux_counts = g_aux_counts,
        .aux_loss_fwd = g_aux_loss_fwd,
        .aux_loss_bwd = g_aux_loss_bwd,
        .z_loss_fwd = g_z_loss_fwd,
        .z_loss_bwd = g_z_loss_bwd,
        .dispatch_plan = g_dispatch_plan,
        .drop_mask = g_drop_mask,
        .expert_select = g_expert_select,
        .expert_bias_update = g_expert_bias_update,
        .permute_fwd = g_permute_fwd,
        .permute_bwd = g_permute_bwd,
        .unpermute_fwd = g_unpermute_fwd,
        .unpermute_bwd = g_unpermute_bwd,
        .cross_entropy_fwd = g_cross_entropy_fwd,
        .cross_entropy_bwd = g_cross_entropy_bwd,
        .lse_combine = g_lse_combine,
        .loss_sum = g_loss_sum,
        .adamw = g_adamw,
        .adamw_dev = g_adamw_dev,
        .bf16_round = g_bf16_round,
        .convert = g_convert,
        .scale = g_scale,
        .sumsq = g_sumsq,
        .amax_history = g_amax_history,
    },
    .counts = g_counts,
    .quant = &guard_quant_ops,
};

const struct mt_kernels *mt_kernels_guard(void)
{
    cpu = mt_kernels_cpu();
    return &guard_kernels;
}

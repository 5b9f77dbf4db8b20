/* CPU reference backend: the op table, its names, and host memory. */
#include "kernels/cpu/cpu_ops.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "config.h"
#include "util/error.h"
#include "util/hostmem.h"

const char *const mt_op_names[] = {
    "alloc", "free", "alloc_host", "free_host", "memset", "copy", "sync",
    "event_create", "event_destroy", "event_record", "event_wait", "copy_async",
    "gemm", "grouped_gemm",
    "embedding_fwd", "embedding_bwd", "rmsnorm_fwd", "rmsnorm_bwd", "rope_fwd", "rope_bwd",
    "attention_fwd", "attention_bwd", "swiglu_fwd", "swiglu_bwd", "add",
    "router_fwd", "router_bwd", "aux_counts", "aux_loss_fwd", "aux_loss_bwd", "z_loss_fwd", "z_loss_bwd",
    "dispatch_plan", "drop_mask", "expert_select", "expert_bias_update", "permute_fwd", "permute_bwd", "unpermute_fwd", "unpermute_bwd",
    "cross_entropy_fwd", "cross_entropy_bwd", "lse_combine", "loss_sum", "adamw", "adamw_dev", "bf16_round", "convert", "scale", "sumsq",
    "amax_history",
};
_Static_assert(sizeof mt_op_names / sizeof mt_op_names[0] == MT_OP_COUNT,
               "mt_op_names must name every enum mt_op");

/* Touched once here, so that a training step takes no page fault in memory it uses for
 * the first time (a buffer only some steps reach). */
static void *cpu_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (p) mt_hostmem_prefault(p, rounded);
    return p;
}

static void cpu_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

/* A fill or copy of BULK_SPLIT bytes or more is split over the OpenMP threads, in
 * blocks of whole cache lines: one core moves a fraction of the memory bandwidth, and
 * the others would wait for it (a step zeroes its whole gradient buffer). Overlapping
 * copies (memmove's case) stay on one thread. */
#define BULK_SPLIT ((size_t)1 << 20)

static int bulk_parts(size_t bytes)
{
    if (bytes < BULK_SPLIT || omp_in_parallel()) return 1;
    const int threads = omp_get_max_threads();
    return threads > 1 ? threads : 1;
}

static void bulk_range(size_t bytes, int i, int parts, size_t *lo, size_t *hi)
{
    const size_t lines = (bytes + 63) / 64;
    *lo = lines * (size_t)i / (size_t)parts * 64;
    *hi = i + 1 == parts ? bytes : lines * (size_t)(i + 1) / (size_t)parts * 64;
}

static void cpu_memset(void *ctx, void *p, int byte, size_t bytes)
{
    (void)ctx;
    const int parts = bulk_parts(bytes);
    if (parts == 1) {
        if (bytes) memset(p, byte, bytes);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(parts)
    for (int i = 0; i < parts; i++) {
        size_t lo, hi;
        bulk_range(bytes, i, parts, &lo, &hi);
        memset((char *)p + lo, byte, hi - lo);
    }
}

static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    if (!bytes || dst == src) return;
    const char *s = src;
    char *d = dst;
    const uintptr_t us = (uintptr_t)src, ud = (uintptr_t)dst;
    const int parts = us + bytes <= ud || ud + bytes <= us ? bulk_parts(bytes) : 1;
    if (parts == 1) {
        memmove(dst, src, bytes);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(parts)
    for (int i = 0; i < parts; i++) {
        size_t lo, hi;
        bulk_range(bytes, i, parts, &lo, &hi);
        memcpy(d + lo, s + lo, hi - lo);
    }
}

static void cpu_sync(void *ctx) { (void)ctx; }

/* One thread runs everything in call order: the copy stream is the compute stream, an
 * event is a handle with nothing to wait for, copy_async a copy. */
static void *cpu_event_create(void *ctx)
{
    (void)ctx;
    return malloc(1);
}

static void cpu_event_destroy(void *ctx, void *ev)
{
    (void)ctx;
    free(ev);
}

static void cpu_event_record(void *ctx, void *ev, enum mt_stream s) { (void)ctx, (void)ev, (void)s; }

static void cpu_event_wait(void *ctx, enum mt_stream s, void *ev) { (void)ctx, (void)s, (void)ev; }

static const struct mt_quant_ops cpu_quant_ops = { .qdq = mt_cpu_qdq, .gemm = mt_cpu_qgemm,
                                                   .save = mt_cpu_quant_save,
                                                   .saved_bytes = mt_cpu_quant_saved_bytes,
                                                   .amax_nan_to_inf = mt_cpu_amax_nan_to_inf,
                                                   .random_key = mt_cpu_random_key,
                                                   .shards = true, .fp4_shards = true };

static struct mt_kernels cpu_kernels = {
    .name = "cpu",
    .ctx = NULL,
    .quant = &cpu_quant_ops,
    .op = {
        .alloc = cpu_alloc,
        .free = cpu_free,
        .alloc_host = cpu_alloc,
        .free_host = cpu_free,
        .memset = cpu_memset,
        .copy = cpu_copy,
        .sync = cpu_sync,
        .event_create = cpu_event_create,
        .event_destroy = cpu_event_destroy,
        .event_record = cpu_event_record,
        .event_wait = cpu_event_wait,
        .copy_async = cpu_copy,
    },
};

/* ---- the instruction-set level of the compute ops (cpu_isa.h) -------------------- */

void mt_cpu_fill_ops_v3(struct mt_kernel_ops *o);
void mt_cpu_fill_ops_v4(struct mt_kernel_ops *o);
bool mt_cpu_gemm_bf16_v3(void);
bool mt_cpu_gemm_bf16_v4(void);

enum { ISA_BASELINE, ISA_V3, ISA_V4, ISA_COUNT };
static const char *const isa_names[ISA_COUNT] = {"baseline", "x86-64-v3", "x86-64-v4"};
static void (*const isa_fill[ISA_COUNT])(struct mt_kernel_ops *) = {
    mt_cpu_fill_ops,
#ifdef MT_CPU_ISA_V3
    mt_cpu_fill_ops_v3,
#else
    NULL,
#endif
#ifdef MT_CPU_ISA_V4
    mt_cpu_fill_ops_v4,
#else
    NULL,
#endif
};

/* whether level i's GEMMs run moetrain's own kernel (cpu_dense.c) */
static bool (*const isa_own_gemm[ISA_COUNT])(void) = {
    mt_cpu_gemm_bf16,
#ifdef MT_CPU_ISA_V3
    mt_cpu_gemm_bf16_v3,
#else
    NULL,
#endif
#ifdef MT_CPU_ISA_V4
    mt_cpu_gemm_bf16_v4,
#else
    NULL,
#endif
};

/* Whether this CPU (and its operating system, which must save the wider registers)
 * runs level i's instructions. */
static bool isa_runs(int i)
{
    if (i == ISA_BASELINE) return true;
#if defined(__x86_64__) && (defined(MT_CPU_ISA_V3) || defined(MT_CPU_ISA_V4))
    __builtin_cpu_init();
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
    return i == ISA_V3 ? __builtin_cpu_supports("x86-64-v3") : __builtin_cpu_supports("x86-64-v4");
#else /* the level's defining features that every compiler names */
    const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
    return i == ISA_V3 ? v3
                       : v3 && __builtin_cpu_supports("avx512f") &&
                             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512cd") &&
                             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
#else
    return false;
#endif
}

static char isa_built[64];
static int isa_pick = -1;
static bool gemm_blas;

/* The level to run: MOETRAIN_CPU_ISA's, else the highest built and runnable; an error
 * code (< 0, err set) for a value that names no level, or one not built or not runnable
 * here. */
static int isa_choose(struct mt_err *err)
{
    const char *want = getenv("MOETRAIN_CPU_ISA");
    isa_built[0] = '\0';
    for (int i = 0; i < ISA_COUNT; i++)
        if (isa_fill[i])
            snprintf(isa_built + strlen(isa_built), sizeof isa_built - strlen(isa_built), "%s%s",
                     i ? " " : "", isa_names[i]);
    if (!want || !*want || strcmp(want, "auto") == 0) {
        int best = ISA_BASELINE;
        for (int i = 1; i < ISA_COUNT; i++)
            if (isa_fill[i] && isa_runs(i)) best = i;
        return best;
    }
    for (int i = 0; i < ISA_COUNT; i++) {
        if (strcmp(want, isa_names[i]) != 0) continue;
        if (!isa_fill[i]) {
            return mt_err_set(err, MT_EUNSUPPORTED,
                              "MOETRAIN_CPU_ISA=%s: this build has the CPU kernels for %s "
                              "only (configure's summary says why); unset it, or name one "
                              "of those", want, isa_built);
        }
        if (!isa_runs(i)) {
            return mt_err_set(err, MT_EUNSUPPORTED,
                              "MOETRAIN_CPU_ISA=%s: this CPU lacks that level's instructions; "
                              "unset it (the highest level the CPU has is picked), or name a "
                              "lower one of %s", want, isa_built);
        }
        return i;
    }
    return mt_err_set(err, MT_EINVAL,
                      "MOETRAIN_CPU_ISA=%s names no CPU kernel level; use auto (or unset it) "
                      "or one of %s", want, isa_built);
}

/* MOETRAIN_CPU_GEMM: unset, empty or auto (the level's GEMM: moetrain's own kernel on
 * x86-64-v4, the BLAS below it) or blas (the BLAS on every level); an error code for
 * anything else */
static int gemm_choose(bool *blas, struct mt_err *err)
{
    const char *g = getenv("MOETRAIN_CPU_GEMM");
    *blas = g && strcmp(g, "blas") == 0;
    if (!g || !*g || *blas || strcmp(g, "auto") == 0) return MT_OK;
    return mt_err_set(err, MT_EINVAL,
                      "MOETRAIN_CPU_GEMM=%s: use auto (or unset it: moetrain's own kernel on "
                      "x86-64-v4, the BLAS below it) or blas (the BLAS on every level)", g);
}

int mt_cpu_isa_check(struct mt_err *err)
{
    bool blas;
    const int i = isa_choose(err);
    return i < 0 ? i : gemm_choose(&blas, err);
}

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

static void isa_init(void)
{
    struct mt_err err = {0};
    isa_pick = isa_choose(&err);
    if (isa_pick >= 0 && gemm_choose(&gemm_blas, &err) != MT_OK) isa_pick = -1;
    if (isa_pick < 0) {
        fprintf(stderr, "moetrain: %s\n", err.msg);
        abort();
    }
    isa_fill[isa_pick](&cpu_kernels.op);
}

const char *mt_cpu_isa(void)
{
    pthread_once(&isa_once, isa_init);
    return isa_names[isa_pick];
}

bool mt_cpu_gemm_blas(void)
{
    pthread_once(&isa_once, isa_init);
    return gemm_blas;
}

const char *mt_cpu_gemm_kernel(void)
{
    pthread_once(&isa_once, isa_init);
    return isa_own_gemm[isa_pick]() ? "moetrain AVX-512" : "BLAS";
}

const char *mt_cpu_isa_built(void)
{
    pthread_once(&isa_once, isa_init);
    return isa_built;
}

const struct mt_kernels *mt_kernels_cpu(void)
{
    pthread_once(&isa_once, isa_init);
    mt_cpu_blas_init();
    return &cpu_kernels;
}

/* One case per op and no default: -Wswitch (in -Wall) flags an op added to the enum
 * but not here. */
static bool op_present(const struct mt_kernel_ops *o, enum mt_op op)
{
    switch (op) {
    case MT_OP_ALLOC: return o->alloc != NULL;
    case MT_OP_FREE: return o->free != NULL;
    case MT_OP_ALLOC_HOST: return o->alloc_host != NULL;
    case MT_OP_FREE_HOST: return o->free_host != NULL;
    case MT_OP_MEMSET: return o->memset != NULL;
    case MT_OP_COPY: return o->copy != NULL;
    case MT_OP_SYNC: return o->sync != NULL;
    case MT_OP_EVENT_CREATE: return o->event_create != NULL;
    case MT_OP_EVENT_DESTROY: return o->event_destroy != NULL;
    case MT_OP_EVENT_RECORD: return o->event_record != NULL;
    case MT_OP_EVENT_WAIT: return o->event_wait != NULL;
    case MT_OP_COPY_ASYNC: return o->copy_async != NULL;
    case MT_OP_GEMM: return o->gemm != NULL;
    case MT_OP_GROUPED_GEMM: return o->grouped_gemm != NULL;
    case MT_OP_EMBEDDING_FWD: return o->embedding_fwd != NULL;
    case MT_OP_EMBEDDING_BWD: return o->embedding_bwd != NULL;
    case MT_OP_RMSNORM_FWD: return o->rmsnorm_fwd != NULL;
    case MT_OP_RMSNORM_BWD: return o->rmsnorm_bwd != NULL;
    case MT_OP_ROPE_FWD: return o->rope_fwd != NULL;
    case MT_OP_ROPE_BWD: return o->rope_bwd != NULL;
    case MT_OP_ATTENTION_FWD: return o->attention_fwd != NULL;
    case MT_OP_ATTENTION_BWD: return o->attention_bwd != NULL;
    case MT_OP_SWIGLU_FWD: return o->swiglu_fwd != NULL;
    case MT_OP_SWIGLU_BWD: return o->swiglu_bwd != NULL;
    case MT_OP_ADD: return o->add != NULL;
    case MT_OP_ROUTER_FWD: return o->router_fwd != NULL;
    case MT_OP_ROUTER_BWD: return o->router_bwd != NULL;
    case MT_OP_AUX_COUNTS: return o->aux_counts != NULL;
    case MT_OP_AUX_LOSS_FWD: return o->aux_loss_fwd != NULL;
    case MT_OP_AUX_LOSS_BWD: return o->aux_loss_bwd != NULL;
    case MT_OP_Z_LOSS_FWD: return o->z_loss_fwd != NULL;
    case MT_OP_Z_LOSS_BWD: return o->z_loss_bwd != NULL;
    case MT_OP_DISPATCH_PLAN: return o->dispatch_plan != NULL;
    case MT_OP_DROP_MASK: return o->drop_mask != NULL;
    case MT_OP_EXPERT_SELECT: return o->expert_select != NULL;
    case MT_OP_EXPERT_BIAS_UPDATE: return o->expert_bias_update != NULL;
    case MT_OP_PERMUTE_FWD: return o->permute_fwd != NULL;
    case MT_OP_PERMUTE_BWD: return o->permute_bwd != NULL;
    case MT_OP_UNPERMUTE_FWD: return o->unpermute_fwd != NULL;
    case MT_OP_UNPERMUTE_BWD: return o->unpermute_bwd != NULL;
    case MT_OP_CROSS_ENTROPY_FWD: return o->cross_entropy_fwd != NULL;
    case MT_OP_CROSS_ENTROPY_BWD: return o->cross_entropy_bwd != NULL;
    case MT_OP_LSE_COMBINE: return o->lse_combine != NULL;
    case MT_OP_LOSS_SUM: return o->loss_sum != NULL;
    case MT_OP_ADAMW: return o->adamw != NULL;
    case MT_OP_ADAMW_DEV: return o->adamw_dev != NULL;
    case MT_OP_BF16_ROUND: return o->bf16_round != NULL;
    case MT_OP_CONVERT: return o->convert != NULL;
    case MT_OP_SCALE: return o->scale != NULL;
    case MT_OP_SUMSQ: return o->sumsq != NULL;
    case MT_OP_AMAX_HISTORY: return o->amax_history != NULL;
    case MT_OP_COUNT: break;
    }
    return false;
}

int mt_kernels_count_ops(const struct mt_kernels *k, enum mt_op *missing)
{
    int n = 0;
    bool reported = false;
    for (int i = 0; i < MT_OP_COUNT; i++) {
        if (op_present(&k->op, (enum mt_op)i)) {
            n++;
        } else if (!reported && missing) {
            *missing = (enum mt_op)i;
            reported = true;
        }
    }
    return n;
}

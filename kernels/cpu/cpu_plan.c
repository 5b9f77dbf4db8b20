/* The plan backend (mt_kernels_plan_create): the model, optimizer and trainer set up as
 * for training, every allocation an address range reserved and never backed (PROT_NONE,
 * no swap reserved), so that `moetrain --check` sizes a 256-GPU job's ranks on a login
 * node with the code that allocates in training. It computes nothing: allocation (of
 * device and of pinned host memory), memset, copy, copy_async, bf16_round, convert, sync
 * and the events do no work, and any other op would touch the
 * reserved ranges and fault, which keeps planning honest (a setup path that computes on
 * backend memory shows up at once instead of being planned wrongly). */
#include "kernels/kernels.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct plan_range {
    void *p;
    size_t bytes;
    bool host; /* alloc_host */
};

struct plan_ctx {
    struct plan_range *r;
    size_t n, cap;
    size_t live, peak; /* bytes asked for */
    size_t host_live;  /* alloc_host bytes (not in live) */
};

struct plan_kernels {
    struct mt_kernels k;
    struct plan_ctx c;
};

/* Reserves bytes of address space (never backed) as a device (host false) or pinned
 * host range. */
static void *reserve(struct plan_ctx *c, size_t bytes, bool host)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        struct plan_range *r = realloc(c->r, cap * sizeof *r);
        if (!r) return NULL;
        c->r = r;
        c->cap = cap;
    }
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) return NULL;
    c->r[c->n++] = (struct plan_range){p, bytes, host};
    if (host) {
        c->host_live += bytes;
    } else {
        c->live += bytes;
        if (c->live > c->peak) c->peak = c->live;
    }
    return p;
}

static void release(struct plan_ctx *c, void *p, bool host)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->r[i].p == p && c->r[i].host == host) {
            munmap(p, c->r[i].bytes ? c->r[i].bytes : 1);
            if (host) c->host_live -= c->r[i].bytes;
            else c->live -= c->r[i].bytes;
            c->r[i] = c->r[--c->n];
            return;
        }
    abort(); /* not an allocation of this kind of this backend: a bug of the caller */
}

static void *plan_alloc(void *ctx, size_t bytes) { return reserve(ctx, bytes, false); }

static void plan_free(void *ctx, void *p) { release(ctx, p, false); }

/* Pinned host memory is planned like device memory: reserved, never backed (the
 * offloading buffers of a large model are GiBs), and counted apart (host_live). */
static void *plan_alloc_host(void *ctx, size_t bytes) { return reserve(ctx, bytes, true); }

static void plan_free_host(void *ctx, void *p) { release(ctx, p, true); }

static void plan_memset(void *ctx, void *p, int byte, size_t bytes)
{
    (void)ctx, (void)p, (void)byte, (void)bytes;
}

static void plan_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx, (void)dst, (void)src, (void)bytes;
}

static void plan_sync(void *ctx) { (void)ctx; }

static void plan_copy_async(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx, (void)dst, (void)src, (void)bytes;
}

static void plan_bf16_round(void *ctx, float *out, const float *x, size_t n)
{
    (void)ctx, (void)out, (void)x, (void)n;
}

static void plan_convert(void *ctx, struct mt_tensor dst, struct mt_tensor src)
{
    (void)ctx, (void)dst, (void)src;
}

struct mt_kernels *mt_kernels_plan_create(void)
{
    struct plan_kernels *pk = calloc(1, sizeof *pk);
    if (!pk) return NULL;
    pk->k = *mt_kernels_cpu();
    pk->k.name = "plan";
    pk->k.ctx = &pk->c;
    pk->k.op.alloc = plan_alloc;
    pk->k.op.free = plan_free;
    pk->k.op.memset = plan_memset;
    pk->k.op.copy = plan_copy;
    pk->k.op.sync = plan_sync;
    pk->k.op.alloc_host = plan_alloc_host;
    pk->k.op.free_host = plan_free_host;
    pk->k.op.copy_async = plan_copy_async;
    pk->k.op.bf16_round = plan_bf16_round;
    pk->k.op.convert = plan_convert;
    return &pk->k;
}

size_t mt_kernels_plan_live(const struct mt_kernels *k)
{
    return ((const struct plan_ctx *)k->ctx)->live;
}

void mt_kernels_plan_destroy(struct mt_kernels *k)
{
    if (!k) return;
    struct plan_kernels *pk = (struct plan_kernels *)k;
    for (size_t i = 0; i < pk->c.n; i++)
        munmap(pk->c.r[i].p, pk->c.r[i].bytes ? pk->c.r[i].bytes : 1);
    free(pk->c.r);
    free(pk);
}

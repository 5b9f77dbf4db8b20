/* moetrain --fake-world N --fake-rank R: one rank of a job built for real in this
 * process, its allocations counted and compared with the plan of that rank. */
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

#include "train/train.h"

/* The backend's alloc and free, wrapped to count what is live. A backend's ops get its
 * own ctx, which the wrapper must pass through unchanged, so the count lives here:
 * one fake rank at a time per process. */
static struct {
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *p);
    struct live_block { void *p; size_t bytes; } *b;
    size_t n, cap, live, count;
} counted;

static void *count_alloc(void *ctx, size_t bytes)
{
    if (counted.n == counted.cap) {
        size_t cap = counted.cap ? 2 * counted.cap : 256;
        struct live_block *b = realloc(counted.b, cap * sizeof *b);
        if (!b) return NULL;
        counted.b = b;
        counted.cap = cap;
    }
    void *p = counted.alloc(ctx, bytes);
    if (!p) return NULL;
    counted.b[counted.n++] = (struct live_block){p, bytes};
    counted.live += bytes;
    counted.count++;
    return p;
}

static void count_free(void *ctx, void *p)
{
    for (size_t i = counted.n; i-- > 0;)
        if (counted.b[i].p == p) {
            counted.live -= counted.b[i].bytes;
            counted.b[i] = counted.b[--counted.n];
            break;
        }
    counted.free(ctx, p);
}

static size_t count_live(const struct mt_kernels *k)
{
    (void)k;
    return counted.live;
}

/* The first category in which a and b differ, or NULL. */
static const char *differs(const struct mt_rank_memory *a, const struct mt_rank_memory *b)
{
    if (a->params != b->params) return "parameters";
    if (a->master != b->master) return "master weights";
    if (a->grads != b->grads) return "gradients";
    if (a->optimizer != b->optimizer) return "optimizer state";
    if (a->act_per_mb != b->act_per_mb || a->inflight != b->inflight ||
        a->activations != b->activations || a->lowp_copies != b->lowp_copies ||
        a->lowp_replaced != b->lowp_replaced)
        return "activations";
    if (a->recompute != b->recompute) return "recompute";
    if (a->pipeline != b->pipeline) return "pipeline";
    if (a->comm != b->comm) return "communication";
    if (a->workspace != b->workspace) return "workspace";
    if (a->other != b->other) return "other";
    if (a->offload != b->offload || a->offload_host != b->offload_host ||
        a->offload_step != b->offload_step)
        return "offload";
    if (a->total != b->total) return "total";
    return NULL;
}

int mt_plan_fake_rank(const struct mt_config *cfg, const struct mt_layout *l, int rank,
                      const struct mt_kernels *k, FILE *out, struct mt_err *err)
{
    if (rank < 0 || rank >= l->world_size)
        return mt_err_set(err, MT_EINVAL,
                          "--fake-rank %d is not a rank of the world of %d (0 to %d)", rank,
                          l->world_size, l->world_size - 1);
    struct mt_rank_memory built, plan;
    MT_CHECK(mt_train_plan_memory(cfg, l, rank, &plan, err));
    int rc;
    size_t allocations = 0;
    const char *backend;
    if (!k) { /* reserve only: no page is touched, parameters are not initialised */
        struct mt_kernels *pk = mt_kernels_plan_create();
        if (!pk) return mt_err_set(err, MT_ENOMEM, "--fake-world: out of memory");
        backend = "plan (address ranges reserved, never backed or touched)";
        rc = mt_train_build_rank(cfg, l, rank, pk, false, mt_kernels_plan_live, &built, err);
        mt_kernels_plan_destroy(pk);
    } else {
        struct mt_kernels wrapped = *k;
        memset(&counted, 0, sizeof counted);
        counted.alloc = k->op.alloc;
        counted.free = k->op.free;
        wrapped.op.alloc = count_alloc;
        wrapped.op.free = count_free;
        backend = k->name;
        rc = mt_train_build_rank(cfg, l, rank, &wrapped, true, count_live, &built, err);
        allocations = counted.count;
        if (rc == MT_OK && counted.live != 0)
            rc = mt_err_set(err, MT_ERUNTIME,
                            "--fake-world: rank %d left %zu bytes allocated on backend %s "
                            "after its teardown (a leak)",
                            rank, counted.live, k->name);
        free(counted.b);
        memset(&counted, 0, sizeof counted);
    }
    if (rc) return rc;
    char line[768];
    fprintf(out, "fake world: rank %d of %d built in this process on backend %s, "
                 "without communication%s\n",
            rank, l->world_size, backend, k ? ", parameters initialised" : "");
    if (k) fprintf(out, "  %zu allocations\n", allocations);
    mt_train_memory_line(line, sizeof line, &built);
    fprintf(out, "built:%s\n", line + 1);
    mt_train_memory_line(line, sizeof line, &plan);
    fprintf(out, "plan: %s\n", line + 1);
    const char *cat = differs(&built, &plan);
    if (cat)
        return mt_err_set(err, MT_ERUNTIME,
                          "--fake-world: rank %d allocates a different %s from its plan "
                          "(%zu bytes built, %zu planned in all)",
                          rank, cat, built.total, plan.total);
    fprintf(out, "moetrain: rank %d of %d allocates what its plan says: %zu bytes (%.2f GiB), "
                 "category by category\n",
            rank, l->world_size, built.total, (double)built.total / (1024.0 * 1024.0 * 1024.0));
    return MT_OK;
}

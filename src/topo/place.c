/* Placement: which logical rank (Megatron order) each process plays.
 *
 * Constraint: every TP x CP group (attention generator) and every ETP x EP
 * group (expert generator) lies inside one NVLink domain. Both relations
 * partition the logical ranks; the connected components of their union
 * ("blocks") are the units that must each sit whole in one domain, and any
 * assignment of whole blocks to domains satisfies both constraints. In the
 * default order tp-cp-ep-dp-pp a TP x CP group is an aligned run of A = tp*cp
 * ranks and an ETP x EP group an aligned run of E = etp*ep ranks, so a block
 * is an aligned run of lcm(A, E) ranks: its boundaries are the positions that
 * are boundaries of both kinds of run, i.e. the common multiples of A and E.
 * Other orders are handled by the same union-find, with no closed form.
 *
 * Packing: blocks are grouped into pipelines (the blocks whose first ranks
 * share a PP group, by stage), and whole pipelines go first into domains
 * with room (consecutive stages then talk over NVLink); the remaining blocks
 * follow, next-fit in pipeline order. With blocks of one size this packing
 * succeeds exactly when every domain holds a multiple of the block size.
 * Within a domain, its ranks (ascending) go to its processes ordered by node
 * and local rank, so a single-domain job keeps launch order and small
 * groups stay inside a node where they can. */
#include "config.h"

#include "topo/topo_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- interning ---- */

uint64_t mt_topo_hash(uint64_t h, const void *data, size_t len)
{
    const unsigned char *b = data;
    for (size_t i = 0; i < len; i++) h = (h ^ b[i]) * 1099511628211ull; /* FNV-1a */
    return h;
}

int mt_topo_intern(const char *strs, size_t stride, int n, int *ids, int *firsts)
{
    size_t cap = 16;
    while (cap < 2 * (size_t)n) cap <<= 1;
    int *slot = malloc(cap * sizeof *slot); /* index of the first string with this value */
    if (!slot) return -1;
    for (size_t i = 0; i < cap; i++) slot[i] = -1;
    int count = 0;
    for (int i = 0; i < n; i++) {
        const char *s = strs + (size_t)i * stride;
        size_t h = (size_t)mt_topo_hash(MT_TOPO_HASH_SEED, s, strlen(s)) & (cap - 1);
        while (slot[h] >= 0 && strcmp(strs + (size_t)slot[h] * stride, s)) h = (h + 1) & (cap - 1);
        if (slot[h] < 0) {
            slot[h] = i;
            if (firsts) firsts[count] = i;
            ids[i] = count++;
        } else {
            ids[i] = ids[slot[h]];
        }
    }
    free(slot);
    return count;
}

/* ---- blocks ---- */

static int uf_find(int *parent, int x)
{
    while (parent[x] != x) {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    return x;
}

static void uf_union_groups(int *parent, const struct mt_group_list *g)
{
    for (int k = 0; k < g->ngroups; k++) {
        const int *m = g->ranks + (size_t)k * g->size;
        for (int i = 1; i < g->size; i++) {
            int a = uf_find(parent, m[0]), b = uf_find(parent, m[i]);
            if (a != b) parent[a > b ? a : b] = a < b ? a : b;
        }
    }
}

struct blocks {
    int n, nblocks;
    int *of_rank;   /* block of each logical rank */
    int *start;     /* [nblocks + 1]: ranks of block b are ranks[start[b] .. start[b+1]) */
    int *ranks;     /* ascending within each block */
    int *order;     /* blocks in pipeline order */
    int *pipe;      /* pipeline id of each block (by order position) */
};

static void blocks_free(struct blocks *b)
{
    free(b->of_rank);
    free(b->start);
    free(b->ranks);
    free(b->order);
    free(b->pipe);
}

struct bkey { int ppgroup, stage, block; };

static int cmp_bkey(const void *pa, const void *pb)
{
    const struct bkey *a = pa, *b = pb;
    if (a->ppgroup != b->ppgroup) return a->ppgroup < b->ppgroup ? -1 : 1;
    if (a->stage != b->stage) return a->stage < b->stage ? -1 : 1;
    return (a->block > b->block) - (a->block < b->block);
}

static int blocks_build(const struct mt_rank_layout *rl, struct blocks *b, struct mt_err *err)
{
    int n = rl->world, rc = MT_OK;
    memset(b, 0, sizeof *b);
    b->n = n;
    int *parent = malloc(sizeof(int) * (size_t)n), *id = malloc(sizeof(int) * (size_t)n);
    int *ppg = malloc(sizeof(int) * (size_t)n), *ppos = malloc(sizeof(int) * (size_t)n);
    struct bkey *keys = NULL;
    b->of_rank = malloc(sizeof(int) * (size_t)n);
    b->ranks = malloc(sizeof(int) * (size_t)n);
    if (!parent || !id || !ppg || !ppos || !b->of_rank || !b->ranks) goto oom;
    for (int r = 0; r < n; r++) parent[r] = r;
    uf_union_groups(parent, &rl->groups[MT_GROUP_TP_CP]);
    uf_union_groups(parent, &rl->groups[MT_GROUP_ETP_EP]);
    /* Roots are the smallest rank of their block (union keeps the smaller),
     * so numbering roots in rank order numbers blocks by first rank. */
    for (int r = 0; r < n; r++) {
        int root = uf_find(parent, r);
        if (root == r) id[r] = b->nblocks++;
        b->of_rank[r] = id[root];
    }
    b->start = calloc((size_t)b->nblocks + 1, sizeof(int));
    b->order = malloc(sizeof(int) * (size_t)b->nblocks);
    b->pipe = malloc(sizeof(int) * (size_t)b->nblocks);
    keys = malloc(sizeof *keys * (size_t)b->nblocks);
    if (!b->start || !b->order || !b->pipe || !keys) goto oom;
    for (int r = 0; r < n; r++) b->start[b->of_rank[r] + 1]++;
    for (int k = 0; k < b->nblocks; k++) b->start[k + 1] += b->start[k];
    int *fill = id; /* reuse: next free slot per block */
    for (int k = 0; k < b->nblocks; k++) fill[k] = b->start[k];
    for (int r = 0; r < n; r++) b->ranks[fill[b->of_rank[r]]++] = r;
    const struct mt_group_list *pp = &rl->groups[MT_GROUP_PP];
    for (int i = 0; i < pp->ngroups * pp->size; i++) {
        ppg[pp->ranks[i]] = i / pp->size;
        ppos[pp->ranks[i]] = i % pp->size;
    }
    for (int k = 0; k < b->nblocks; k++) {
        int first = b->ranks[b->start[k]];
        keys[k] = (struct bkey){ ppg[first], ppos[first], k };
    }
    qsort(keys, (size_t)b->nblocks, sizeof *keys, cmp_bkey);
    for (int i = 0, p = -1; i < b->nblocks; i++) {
        if (i == 0 || keys[i].ppgroup != keys[i - 1].ppgroup) p++;
        b->order[i] = keys[i].block;
        b->pipe[i] = p;
    }
    goto done;
oom:
    rc = mt_err_set(err, MT_ENOMEM, "out of memory placing %d ranks", n);
    blocks_free(b);
done:
    free(parent);
    free(id);
    free(ppg);
    free(ppos);
    free(keys);
    return rc;
}

static int bsize(const struct blocks *b, int k) { return b->start[k + 1] - b->start[k]; }

/* Whole pipelines first, then single blocks; block_domain[k] = -1 for blocks
 * that fit nowhere. Cursors only move forward: free space only shrinks, so
 * with pipelines (blocks) of one size a domain skipped once never fits one
 * later. */
static void pack(const struct blocks *b, int ndom, int *freecap, int *block_domain)
{
    int nb = b->nblocks, cur = 0;
    for (int k = 0; k < nb; k++) block_domain[k] = -1;
    for (int i = 0; i < nb;) {
        int j = i, need = 0;
        while (j < nb && b->pipe[j] == b->pipe[i]) need += bsize(b, b->order[j++]);
        while (cur < ndom && freecap[cur] < need) cur++;
        if (cur < ndom) {
            for (int t = i; t < j; t++) block_domain[b->order[t]] = cur;
            freecap[cur] -= need;
        }
        if (cur == ndom) break; /* the remaining pipelines all go block by block */
        i = j;
    }
    /* Next-fit keeps consecutive stages together; first-fit behind the
     * cursor only matters when blocks differ in size. */
    cur = 0;
    for (int i = 0; i < nb; i++) {
        int k = b->order[i];
        if (block_domain[k] >= 0) continue;
        int s = bsize(b, k), c = cur;
        while (c < ndom && freecap[c] < s) c++;
        if (c < ndom) {
            cur = c;
        } else {
            for (c = 0; c < cur && freecap[c] < s; c++) {}
            if (c == cur) continue;
        }
        block_domain[k] = c;
        freecap[c] -= s;
    }
}

/* ---- explaining an impossible placement ---- */

static int gcd(int a, int b)
{
    while (b) {
        int t = a % b;
        a = b;
        b = t;
    }
    return a;
}

struct domstats {
    int *nodes;     /* distinct nodes per domain */
    int gpn;        /* processes per node, when every node has the same count; else 0 */
};

static void explain(const struct mt_rank_layout *rl, const struct blocks *b,
                    const struct mt_topo_plan *p, const struct domstats *ds, int whole,
                    struct mt_err *err)
{
    if (!err) return;
    char *m = err->msg;
    size_t len = sizeof err->msg, o = 0;
    int a = rl->tp * rl->cp, e = rl->etp * rl->ep, L = p->block;
#define PUT(...) \
    do { \
        if (o < len) o += (size_t)snprintf(m + o, len - o, __VA_ARGS__); \
    } while (0)
    err->code = MT_EINVAL;
    PUT("&topology placement = 'nvlink': cannot keep every TP x CP group (tp %d x cp %d = %d "
        "ranks) and every ETP x EP group (etp %d x ep %d = %d ranks) inside one NVLink domain.\n",
        rl->tp, rl->cp, a, rl->etp, rl->ep, e);
    if (!L) {
        PUT("With order %s these groups chain into blocks of unequal sizes that could not be "
            "packed into the domains (sizes:",
            rl->order);
        for (int d = 0; d < p->ndomains && d < 16; d++) PUT(" %d", p->domain_size[d]);
        PUT("%s). Use the default order tp-cp-ep-dp-pp, or placement = 'nvlink-besteffort'.",
            p->ndomains > 16 ? " ..." : "");
        return;
    }
    int maxd = 0;
    for (int d = 1; d < p->ndomains; d++)
        if (p->domain_size[d] > p->domain_size[maxd]) maxd = d;
    PUT("Folded together (order %s) they form blocks of %d ranks (lcm(%d, %d)), each of which "
        "must sit in one domain, so every domain must hold a multiple of %d GPUs.\n",
        rl->order, L, a, e, L);
    if (p->domain_size[maxd] < L) {
        PUT("But the largest NVLink domain here, '%s', has %d GPUs: no allocation of such "
            "domains can hold a block. Make the block fit: tensor_model_parallel_size x "
            "context_parallel_size (%d) and expert_tensor_parallel_size x "
            "expert_model_parallel_size (%d) must have an lcm of at most %d; or run across "
            "domains with &topology placement = 'nvlink-besteffort'.",
            p->domain_names[maxd], p->domain_size[maxd], a, e, p->domain_size[maxd]);
        return;
    }
    int shown = 0, bad = 0;
    int M = ds->gpn ? L / gcd(L, ds->gpn) : 0; /* nodes per whole number of blocks */
    PUT("This allocation has:\n");
    for (int d = 0; d < p->ndomains; d++) {
        int s = p->domain_size[d];
        if (s % L == 0) continue;
        if (bad++ >= 12) continue;
        PUT("  domain '%s': %d GPUs on %d node%s = %d whole block%s + %d GPUs left over\n",
            p->domain_names[d], s, ds->nodes[d], ds->nodes[d] == 1 ? "" : "s", s / L,
            s / L == 1 ? "" : "s", s % L);
    }
    if (bad > 12) PUT("  ... and %d more domains like these\n", bad - 12);
    if (p->ndomains > bad)
        PUT("  (%d other domain%s hold%s whole blocks)\n", p->ndomains - bad,
            p->ndomains - bad == 1 ? "" : "s", p->ndomains - bad == 1 ? "s" : "");
    PUT("The domains hold %d whole blocks; the job needs %d.\n", whole, b->nblocks);
    if (M) {
        PUT("What would work: in every domain a node count that is a multiple of %d (%d node%s "
            "x %d GPUs = %d GPUs = %d block%s)",
            M, M, M == 1 ? "" : "s", ds->gpn, M * ds->gpn, M * ds->gpn / L,
            M * ds->gpn / L == 1 ? "" : "s");
        for (int d = 0; d < p->ndomains && shown < 4; d++) {
            int nn = ds->nodes[d], lo = nn / M * M;
            if (p->domain_size[d] % L == 0) continue;
            if (lo)
                PUT("%s '%s': %d or %d nodes instead of %d", shown ? ";" : ", e.g.",
                    p->domain_names[d], lo, lo + M, nn);
            else
                PUT("%s '%s': none or %d nodes instead of %d", shown ? ";" : ", e.g.",
                    p->domain_names[d], M, nn);
            shown++;
        }
        PUT(". With Slurm's topology/block, sbatch --segment=%d asks for exactly that.\n", M);
    } else {
        PUT("What would work: in every domain a multiple of %d GPUs.\n", L);
    }
    PUT("Or accept split groups with &topology placement = 'nvlink-besteffort'.");
#undef PUT
}

/* ---- the plan ---- */

struct pkey { int domain, node, local, proc; };

static int cmp_pkey(const void *pa, const void *pb)
{
    const struct pkey *a = pa, *b = pb;
    if (a->domain != b->domain) return a->domain < b->domain ? -1 : 1;
    if (a->node != b->node) return a->node < b->node ? -1 : 1;
    if (a->local != b->local) return a->local < b->local ? -1 : 1;
    return (a->proc > b->proc) - (a->proc < b->proc);
}

void mt_topo_plan_free(struct mt_topo_plan *p)
{
    free(p->logical_of_process);
    free(p->process_of_logical);
    free(p->domain_names);
    free(p->domain_of_process);
    free(p->domain_size);
    free(p->notes);
    memset(p, 0, sizeof *p);
}

/* Besteffort: the blocks that fit nowhere are spread, rank by rank, over the
 * domains with the most room first. */
static void split_rest(const struct blocks *b, const int *block_domain, int ndom, int *freecap,
                       int *domain_of_rank)
{
    int *byroom = malloc(sizeof(int) * (size_t)ndom);
    if (!byroom) return;
    for (int d = 0; d < ndom; d++) byroom[d] = d;
    for (int i = 1; i < ndom; i++) /* insertion sort by room, descending, stable */
        for (int j = i; j > 0 && freecap[byroom[j]] > freecap[byroom[j - 1]]; j--) {
            int t = byroom[j];
            byroom[j] = byroom[j - 1];
            byroom[j - 1] = t;
        }
    int cur = 0;
    for (int i = 0; i < b->nblocks; i++) {
        int k = b->order[i];
        if (block_domain[k] >= 0) continue;
        for (int j = b->start[k]; j < b->start[k + 1]; j++) {
            while (cur < ndom && freecap[byroom[cur]] == 0) cur++;
            domain_of_rank[b->ranks[j]] = byroom[cur];
            freecap[byroom[cur]]--;
        }
    }
    free(byroom);
}

/* Groups of kind spanning more than one domain; notes for the first few. */
static int count_split(const struct mt_rank_layout *rl, enum mt_group_kind kind,
                       const int *domain_of_rank, const struct mt_topo_plan *p, char *notes,
                       size_t len, size_t *o)
{
    const struct mt_group_list *g = &rl->groups[kind];
    int split = 0;
    for (int k = 0; k < g->ngroups; k++) {
        const int *m = g->ranks + (size_t)k * g->size;
        int d0 = domain_of_rank[m[0]], other = -1, n0 = 0;
        for (int i = 0; i < g->size; i++) {
            if (domain_of_rank[m[i]] == d0) n0++;
            else other = domain_of_rank[m[i]];
        }
        if (other < 0) continue;
        if (notes && split < 8 && *o < len)
            *o += (size_t)snprintf(notes + *o, len - *o,
                                   "  %s group %d (ranks %d..): %d in '%s', %d elsewhere "
                                   "(e.g. '%s')\n",
                                   mt_group_names[kind], k, m[0], n0, p->domain_names[d0],
                                   g->size - n0, p->domain_names[other]);
        split++;
    }
    return split;
}

static void pipeline_links(const struct mt_rank_layout *rl, const int *domain_of_rank,
                           struct mt_topo_plan *p)
{
    const struct mt_group_list *g = &rl->groups[MT_GROUP_PP];
    p->pp_links = p->pp_links_crossing = 0;
    for (int k = 0; k < g->ngroups; k++)
        for (int i = 0; i + 1 < g->size; i++) {
            int a = g->ranks[(size_t)k * g->size + i], b = g->ranks[(size_t)k * g->size + i + 1];
            p->pp_links++;
            p->pp_links_crossing += domain_of_rank[a] != domain_of_rank[b];
        }
}

int mt_topo_place(const struct mt_topo_cluster *c, const struct mt_rank_layout *rl,
                  const char *mode, struct mt_topo_plan *p, struct mt_err *err)
{
    int n = c->nprocs, rc = MT_OK;
    memset(p, 0, sizeof *p);
    if (rl->world != n)
        return mt_err_set(err, MT_EINVAL, "placement: the layout is for %d ranks but there are "
                                          "%d processes", rl->world, n);
    if (strcmp(mode, "nvlink") && strcmp(mode, "nvlink-besteffort") && strcmp(mode, "linear"))
        return mt_err_set(err, MT_EINVAL, "&topology placement = '%s' is not one of nvlink, "
                                          "nvlink-besteffort, linear", mode);
    mt_topo_copy(p->mode, sizeof p->mode, mode);
    p->nprocs = n;
    struct blocks b = { 0 };
    struct domstats ds = { 0 };
    int *firsts = NULL, *node = NULL, *freecap = NULL, *block_domain = NULL;
    int *domain_of_rank = NULL;
    struct pkey *keys = NULL;
    p->logical_of_process = malloc(sizeof(int) * (size_t)n);
    p->process_of_logical = malloc(sizeof(int) * (size_t)n);
    p->domain_of_process = malloc(sizeof(int) * (size_t)n);
    firsts = malloc(sizeof(int) * (size_t)n);
    node = malloc(sizeof(int) * (size_t)n);
    domain_of_rank = malloc(sizeof(int) * (size_t)n);
    if (!p->logical_of_process || !p->process_of_logical || !p->domain_of_process || !firsts ||
        !node || !domain_of_rank)
        goto oom;
    p->ndomains = mt_topo_intern(c->procs[0].domain, sizeof c->procs[0], n,
                                 p->domain_of_process, firsts);
    int nnodes = mt_topo_intern(c->procs[0].host, sizeof c->procs[0], n, node, NULL);
    if (p->ndomains < 0 || nnodes < 0) goto oom;
    p->domain_names = malloc(sizeof p->domain_names[0] * (size_t)p->ndomains);
    p->domain_size = calloc((size_t)p->ndomains, sizeof(int));
    ds.nodes = calloc((size_t)p->ndomains, sizeof(int));
    freecap = calloc((size_t)(nnodes > p->ndomains ? nnodes : p->ndomains), sizeof(int));
    if (!p->domain_names || !p->domain_size || !ds.nodes || !freecap) goto oom;
    for (int d = 0; d < p->ndomains; d++)
        mt_topo_copy(p->domain_names[d], sizeof p->domain_names[0], c->procs[firsts[d]].domain);
    for (int i = 0; i < n; i++) p->domain_size[p->domain_of_process[i]]++;
    /* nodes per domain and processes per node (freecap doubles as a counter) */
    for (int i = 0; i < n; i++)
        if (freecap[node[i]]++ == 0) ds.nodes[p->domain_of_process[i]]++;
    ds.gpn = freecap[0];
    for (int h = 1; h < nnodes; h++)
        if (freecap[h] != ds.gpn) ds.gpn = 0;

    MT_CHECK_GOTO(blocks_build(rl, &b, err), done);
    p->block = bsize(&b, 0);
    for (int k = 1; k < b.nblocks; k++)
        if (bsize(&b, k) != p->block) p->block = 0;

    if (!strcmp(mode, "linear")) {
        for (int i = 0; i < n; i++) p->logical_of_process[i] = i;
    } else {
        block_domain = malloc(sizeof(int) * (size_t)b.nblocks);
        keys = malloc(sizeof *keys * (size_t)n);
        if (!block_domain || !keys) goto oom;
        memcpy(freecap, p->domain_size, sizeof(int) * (size_t)p->ndomains);
        pack(&b, p->ndomains, freecap, block_domain);
        int placed = 0;
        for (int k = 0; k < b.nblocks; k++) placed += block_domain[k] >= 0;
        if (placed < b.nblocks && !strcmp(mode, "nvlink")) {
            int whole = 0;
            for (int d = 0; d < p->ndomains && p->block; d++) whole += p->domain_size[d] / p->block;
            explain(rl, &b, p, &ds, whole, err);
            rc = MT_EINVAL;
            goto done;
        }
        for (int r = 0; r < n; r++) domain_of_rank[r] = block_domain[b.of_rank[r]];
        if (placed < b.nblocks) split_rest(&b, block_domain, p->ndomains, freecap, domain_of_rank);
        /* Ranks of each domain ascending, matched to its processes in
         * (node, local rank) order: a counting sort of ranks by domain. */
        int *start = freecap; /* reuse: per-domain cursor */
        for (int d = 0, s = 0; d < p->ndomains; d++) {
            start[d] = s;
            s += p->domain_size[d];
        }
        for (int r = 0; r < n; r++) p->process_of_logical[start[domain_of_rank[r]]++] = r;
        for (int i = 0; i < n; i++)
            keys[i] = (struct pkey){ p->domain_of_process[i], node[i], c->procs[i].local_rank, i };
        qsort(keys, (size_t)n, sizeof *keys, cmp_pkey);
        for (int i = 0; i < n; i++) p->logical_of_process[keys[i].proc] = p->process_of_logical[i];
    }
    for (int i = 0; i < n; i++) p->process_of_logical[p->logical_of_process[i]] = i;
    for (int i = 0; i < n; i++) domain_of_rank[p->logical_of_process[i]] = p->domain_of_process[i];

    size_t len = 4096, o = 0;
    p->notes = calloc(1, len);
    p->split_groups[0] = count_split(rl, MT_GROUP_TP_CP, domain_of_rank, p, p->notes, len, &o);
    p->split_groups[1] = count_split(rl, MT_GROUP_ETP_EP, domain_of_rank, p, p->notes, len, &o);
    pipeline_links(rl, domain_of_rank, p);
    if (p->notes && !p->notes[0]) {
        free(p->notes);
        p->notes = NULL;
    }
    goto done;
oom:
    rc = mt_err_set(err, MT_ENOMEM, "out of memory placing %d processes", n);
done:
    blocks_free(&b);
    free(ds.nodes);
    free(firsts);
    free(node);
    free(freecap);
    free(block_domain);
    free(domain_of_rank);
    free(keys);
    if (rc != MT_OK) mt_topo_plan_free(p);
    return rc;
}

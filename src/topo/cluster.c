/* The cluster table: every process's facts, exchanged over the PMIx modex or
 * described by a nodes file; and the startup sequence that builds it. */
#include "config.h"

#include "topo/topo_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void mt_topo_cluster_free(struct mt_topo_cluster *c)
{
    free(c->procs);
    c->procs = NULL;
    c->nprocs = 0;
}

int mt_topo_cluster_describe(const struct mt_topo_map *nodes, int gpus_per_node,
                             const struct mt_topo_node *tmpl, const char *cpu_affinity,
                             struct mt_topo_cluster *out, struct mt_err *err)
{
    memset(out, 0, sizeof *out);
    if (gpus_per_node < 1 || gpus_per_node > MT_TOPO_MAX_GPUS)
        return mt_err_set(err, MT_EINVAL, "--gpus-per-node %d: expected 1..%d", gpus_per_node,
                          MT_TOPO_MAX_GPUS);
    if (tmpl && tmpl->ngpus < gpus_per_node)
        return mt_err_set(err, MT_EINVAL, "--gpus-per-node %d, but the hwloc topology %s has "
                                          "%d NVIDIA GPU%s",
                          gpus_per_node, tmpl->source, tmpl->ngpus, tmpl->ngpus == 1 ? "" : "s");
    long long total = (long long)nodes->n * gpus_per_node;
    if (total > 100000000)
        return mt_err_set(err, MT_EINVAL, "%lld processes is too many to plan", total);
    /* One node's worth of facts, then copies. */
    struct mt_topo_proc local[MT_TOPO_MAX_GPUS];
    memset(local, 0, sizeof local);
    int gpus[MT_TOPO_MAX_GPUS];
    for (int i = 0; i < gpus_per_node; i++) {
        struct mt_topo_proc *q = &local[i];
        q->local_rank = i;
        q->local_size = gpus_per_node;
        q->gpu_index = q->cuda_device = i;
        q->numa = q->membind = -1;
    }
    if (tmpl) {
        /* Every GPU is visible to every process of a described node, and
         * there are no more processes than GPUs: process i drives GPU i. */
        for (int i = 0; i < gpus_per_node; i++) gpus[i] = i;
        for (int i = 0; i < gpus_per_node; i++) {
            struct mt_topo_binding b;
            int rc = mt_topo_affinity_choose(tmpl, cpu_affinity, i, gpus_per_node, gpus, &b, err);
            if (rc == MT_OK) {
                mt_topo_copy(local[i].gpu, sizeof local[i].gpu, tmpl->gpus[gpus[i]].pci);
                mt_topo_cpulist(b.cpus, local[i].cpus, sizeof local[i].cpus);
                local[i].numa = b.numa >= 0 ? b.numa : tmpl->gpus[gpus[i]].numa;
            }
            mt_topo_binding_free(&b);
            MT_CHECK(rc);
        }
    }
    out->procs = malloc(sizeof *out->procs * (size_t)total);
    if (!out->procs) return mt_err_set(err, MT_ENOMEM, "out of memory for %lld processes", total);
    out->nprocs = (int)total;
    for (int h = 0; h < nodes->n; h++)
        for (int i = 0; i < gpus_per_node; i++) {
            struct mt_topo_proc *q = &out->procs[(size_t)h * gpus_per_node + i];
            *q = local[i];
            memcpy(q->host, nodes->host[h], sizeof q->host);
            memcpy(q->domain, nodes->key[h], sizeof q->domain);
        }
    return MT_OK;
}

int mt_topo_cluster_gather(struct mt_world *w, const char *key, const struct mt_topo_proc *mine,
                           struct mt_topo_cluster *out, struct mt_err *err)
{
    memset(out, 0, sizeof *out);
    out->procs = calloc((size_t)w->size, sizeof *out->procs);
    if (!out->procs) return mt_err_set(err, MT_ENOMEM, "out of memory for %d processes", w->size);
    out->nprocs = w->size;
    int rc = mt_world_exchange(w, key, mine, sizeof *mine, out->procs, err);
    if (rc != MT_OK) {
        mt_topo_cluster_free(out);
        return mt_err_prefix(err, "exchanging topology facts");
    }
    for (int i = 0; i < out->nprocs; i++) { /* strings from other processes: terminate */
        struct mt_topo_proc *q = &out->procs[i];
        q->host[sizeof q->host - 1] = q->domain[sizeof q->domain - 1] = '\0';
        q->gpu[sizeof q->gpu - 1] = q->cpus[sizeof q->cpus - 1] = '\0';
    }
    return MT_OK;
}

/* ---- startup ---- */

void mt_topo_setup_free(struct mt_topo_setup *s)
{
    if (!s) return;
    mt_topo_node_free(s->node);
    mt_topo_cluster_free(&s->cluster);
    mt_topo_plan_free(&s->plan);
    free(s);
}

/* The GPU of every process on this node, from the first exchange (each
 * process chose its own, so per-task CUDA_VISIBLE_DEVICES is honoured). */
static void local_gpus_from_table(const struct mt_topo_cluster *c, const struct mt_world *w,
                                  const struct mt_topo_node *n, int *gpus)
{
    for (int i = 0; i < w->local_size; i++) gpus[i] = -1;
    for (int p = 0; p < c->nprocs; p++) {
        const struct mt_topo_proc *q = &c->procs[p];
        if (strcmp(q->host, w->hostname) || q->local_rank < 0 || q->local_rank >= w->local_size)
            continue;
        for (int g = 0; g < n->ngpus; g++)
            if (!strcmp(n->gpus[g].pci, q->gpu)) gpus[q->local_rank] = g;
    }
}

int mt_topo_startup(struct mt_world *w, const struct mt_config *cfg, struct mt_topo_setup **out,
                    struct mt_err *err)
{
    struct mt_topo_setup *s = calloc(1, sizeof *s);
    struct mt_topo_binding b = { 0 };
    int rc, *gpus = NULL;
    *out = NULL;
    if (!s) return mt_err_set(err, MT_ENOMEM, "out of memory for the topology");
    const struct mt_config_topology *t = &cfg->topology;
    /* NVML also maps GPU- UUIDs in CUDA_VISIBLE_DEVICES and finds NVLink
     * peers, so it is asked whatever the domain source. */
    MT_CHECK_GOTO(mt_topo_node_load(t->hwloc_xml, true, &s->node, err), fail);

    /* CUDA ordinals follow PCI order only with this; it must be set before
     * the CUDA runtime initialises. */
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0);
    MT_CHECK_GOTO(mt_topo_choose_gpu(s->node, getenv("CUDA_VISIBLE_DEVICES"), w->local_rank,
                                     w->local_size, &s->gpu, err),
                  fail);
    struct mt_topo_proc me;
    memset(&me, 0, sizeof me);
    mt_topo_copy(me.host, sizeof me.host, w->hostname);
    me.local_rank = w->local_rank;
    me.local_size = w->local_size;
    me.gpu_index = s->gpu.gpu;
    me.cuda_device = s->gpu.cuda_device;
    me.numa = s->gpu.gpu >= 0 ? s->node->gpus[s->gpu.gpu].numa : -1;
    me.membind = -1;
    if (s->gpu.gpu >= 0) mt_topo_copy(me.gpu, sizeof me.gpu, s->node->gpus[s->gpu.gpu].pci);
    MT_CHECK_GOTO(mt_topo_domain_key(t, s->node, s->gpu.gpu, w->hostname, me.domain,
                                     sizeof me.domain, err),
                  fail);
    MT_CHECK_GOTO(mt_topo_cluster_gather(w, "mt.topo.facts", &me, &s->cluster, err), fail);

    gpus = malloc(sizeof(int) * (size_t)(w->local_size > 0 ? w->local_size : 1));
    if (!gpus) {
        rc = mt_err_set(err, MT_ENOMEM, "out of memory");
        goto fail;
    }
    local_gpus_from_table(&s->cluster, w, s->node, gpus);
    MT_CHECK_GOTO(mt_topo_affinity_choose(s->node, cfg->host.cpu_affinity, w->local_rank,
                                          w->local_size, gpus, &b, err),
                  fail);
    MT_CHECK_GOTO(mt_topo_affinity_apply(s->node, &b, cfg->host.numa_membind, &s->applied, err),
                  fail);
    mt_topo_copy(me.cpus, sizeof me.cpus, s->applied.cpus);
    me.membind = s->applied.membind;
    if (b.numa >= 0) me.numa = b.numa;
    mt_topo_cluster_free(&s->cluster);
    MT_CHECK_GOTO(mt_topo_cluster_gather(w, "mt.topo.bound", &me, &s->cluster, err), fail);
    mt_topo_binding_free(&b);
    free(gpus);
    *out = s;
    return MT_OK;
fail:
    mt_topo_binding_free(&b);
    free(gpus);
    mt_topo_setup_free(s);
    return rc;
}

/* A hash of the layout and the plan: equal on every process unless their
 * namelists or overrides differ. */
static uint64_t plan_hash(const struct mt_layout *l, const struct mt_config *cfg,
                          const struct mt_topo_plan *p)
{
    const int dims[] = { l->world_size, l->tp, l->cp, l->pp, l->ep, l->etp };
    uint64_t h = mt_topo_hash(MT_TOPO_HASH_SEED, dims, sizeof dims);
    h = mt_topo_hash(h, cfg->parallel.order, strlen(cfg->parallel.order));
    h = mt_topo_hash(h, p->mode, strlen(p->mode));
    return mt_topo_hash(h, p->logical_of_process, sizeof(int) * (size_t)p->nprocs);
}

int mt_topo_setup_place(struct mt_topo_setup *s, struct mt_world *w, const struct mt_config *cfg,
                        const struct mt_layout *l, struct mt_err *err)
{
    struct mt_rank_layout rl;
    MT_CHECK(mt_groups_build(&cfg->parallel, l, &rl, err));
    int rc = mt_topo_place(&s->cluster, &rl, cfg->topology.placement, &s->plan, err);
    mt_groups_free(&rl);
    if (rc != MT_OK) return rc;
    uint64_t mine = plan_hash(l, cfg, &s->plan);
    uint64_t *all = malloc(sizeof *all * (size_t)w->size);
    if (!all) return mt_err_set(err, MT_ENOMEM, "out of memory");
    rc = mt_world_exchange(w, "mt.topo.plan", &mine, sizeof mine, all, err);
    for (int i = 0; rc == MT_OK && i < w->size; i++)
        if (all[i] != all[0])
            rc = mt_err_set(err, MT_EINVAL,
                            "processes 0 and %d computed different placements: their layouts "
                            "or topology settings differ (the same namelists and overrides "
                            "must reach every process)",
                            i);
    free(all);
    return rc;
}

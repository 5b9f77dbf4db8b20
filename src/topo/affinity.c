/* CPU and memory affinity: choose the cores of each local process, bind, and
 * read the result back from the kernel. */
#include "config.h"

#include "topo/topo_internal.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#ifdef HAVE_NUMA
#include <numaif.h>
#endif

void mt_topo_binding_free(struct mt_topo_binding *b)
{
    hwloc_bitmap_free(b->cpus);
    b->cpus = NULL;
}

/* Host-memory NUMA nodes with distinct, non-empty cpusets (GPU memory and
 * CPU-less nodes sharing a locality with another node are left out). */
static int cpu_numa_nodes(hwloc_topology_t t, hwloc_obj_t *out, int max)
{
    int n = 0;
    for (hwloc_obj_t nn = NULL;
         (nn = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, nn)) != NULL && n < max;) {
        if (mt_topo_is_gpu_memory(nn) || hwloc_bitmap_iszero(nn->cpuset)) continue;
        bool dup = false;
        for (int i = 0; i < n; i++) dup = dup || hwloc_bitmap_isequal(out[i]->cpuset, nn->cpuset);
        if (!dup) out[n++] = nn;
    }
    return n;
}

static hwloc_obj_t numa_by_index(hwloc_topology_t t, int os_index)
{
    for (hwloc_obj_t nn = NULL;
         (nn = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, nn)) != NULL;)
        if ((int)nn->os_index == os_index) return nn;
    return NULL;
}

/* Share k of m of the cores inside region: whole cores, consecutive, the
 * remainder spread so shares differ by at most one core; more sharers than
 * cores share single cores. Machines without Core objects split PUs. */
static void split_cores(hwloc_topology_t t, hwloc_const_bitmap_t region, int k, int m,
                        hwloc_bitmap_t out)
{
    hwloc_obj_type_t type = HWLOC_OBJ_CORE;
    int nc = hwloc_get_nbobjs_inside_cpuset_by_type(t, region, type);
    if (nc <= 0) {
        type = HWLOC_OBJ_PU;
        nc = hwloc_get_nbobjs_inside_cpuset_by_type(t, region, type);
    }
    hwloc_bitmap_zero(out);
    if (nc <= 0) return;
    int lo, hi;
    if (m <= nc) {
        lo = (int)((long long)k * nc / m);
        hi = (int)((long long)(k + 1) * nc / m);
    } else {
        lo = (int)((long long)k * nc / m);
        hi = lo + 1;
    }
    for (int i = lo; i < hi; i++) {
        hwloc_obj_t o = hwloc_get_obj_inside_cpuset_by_type(t, region, type, (unsigned)i);
        if (o) hwloc_bitmap_or(out, out, o->cpuset);
    }
    hwloc_bitmap_and(out, out, region);
}

int mt_topo_affinity_choose(const struct mt_topo_node *n, const char *mode, int local_rank,
                            int local_size, const int *local_gpus, struct mt_topo_binding *out,
                            struct mt_err *err)
{
    hwloc_topology_t t = n->topo;
    out->cpus = hwloc_bitmap_alloc();
    out->numa = -1;
    out->why[0] = '\0';
    if (!out->cpus) return mt_err_set(err, MT_ENOMEM, "out of memory for a cpuset");
    if (local_rank < 0 || local_rank >= local_size)
        return mt_err_set(err, MT_EINVAL, "local rank %d outside 0..%d", local_rank,
                          local_size - 1);
    if (!strcmp(mode, "none")) {
        snprintf(out->why, sizeof out->why, "cpu_affinity = 'none'");
        return MT_OK;
    }
    if (strcmp(mode, "gpu") && strcmp(mode, "numa"))
        return mt_err_set(err, MT_EINVAL, "&host cpu_affinity = '%s' is not one of gpu, numa, "
                                          "none", mode);
    bool whole_numa = !strcmp(mode, "numa");
    int g = local_gpus[local_rank];
    hwloc_const_bitmap_t region = NULL;
    int k = 0, m = 1;
    if (g >= 0) {
        const struct mt_topo_gpu *gpu = &n->gpus[g];
        hwloc_obj_t nn = gpu->numa >= 0 ? numa_by_index(t, gpu->numa) : NULL;
        if (whole_numa && !nn) {
            snprintf(out->why, sizeof out->why, "GPU %s has no single local NUMA node; not "
                                                "bound", gpu->pci);
            return MT_OK;
        }
        region = whole_numa ? nn->cpuset : gpu->cpuset;
        for (int i = 0; i < local_size; i++) {
            int gi = local_gpus[i];
            if (gi < 0 || !hwloc_bitmap_isequal(n->gpus[gi].cpuset, gpu->cpuset)) continue;
            if (i < local_rank) k++;
            if (i != local_rank) m++;
        }
        if (whole_numa)
            snprintf(out->why, sizeof out->why, "NUMA node %d of GPU %s", gpu->numa, gpu->pci);
        else
            snprintf(out->why, sizeof out->why, "cores local to GPU %s, share %d of %d", gpu->pci,
                     k + 1, m);
    } else {
        /* No GPU: spread the GPU-less local processes evenly over the NUMA
         * nodes, consecutive local ranks together. */
        hwloc_obj_t nodes[256];
        int nn = cpu_numa_nodes(t, nodes, 256);
        int c = 0, nc = 0;
        for (int i = 0; i < local_size; i++) {
            if (local_gpus[i] >= 0) continue;
            if (i < local_rank) c++;
            nc++;
        }
        if (nn == 0) {
            region = hwloc_topology_get_topology_cpuset(t);
            k = c;
            m = nc;
            snprintf(out->why, sizeof out->why, "no GPU, no NUMA node: share %d of %d of the "
                                                "machine", k + 1, m);
        } else {
            int j = (int)((long long)c * nn / nc);
            region = nodes[j]->cpuset;
            out->numa = (int)nodes[j]->os_index;
            for (int i = 0; i < nc; i++) {
                if ((int)((long long)i * nn / nc) != j) continue;
                if (i < c) k++;
                if (i != c) m++;
            }
            if (whole_numa)
                snprintf(out->why, sizeof out->why, "no GPU: NUMA node %d (%d of %d nodes)",
                         out->numa, j + 1, nn);
            else
                snprintf(out->why, sizeof out->why, "no GPU: NUMA node %d, share %d of %d",
                         out->numa, k + 1, m);
        }
    }
    if (whole_numa)
        hwloc_bitmap_copy(out->cpus, region);
    else
        split_cores(t, region, k, m, out->cpus);
    if (hwloc_bitmap_iszero(out->cpus))
        snprintf(out->why + strlen(out->why), sizeof out->why - strlen(out->why),
                 "; no allowed cores there, not bound");
    out->numa = mt_topo_numa_of(t, out->cpus);
    return MT_OK;
}

/* ---- applying and verifying ---- */

/* The calling thread's affinity, from the kernel (sched_getaffinity). */
static int read_affinity(hwloc_bitmap_t out, struct mt_err *err)
{
    for (int ncpu = 1024;; ncpu *= 2) {
        cpu_set_t *set = CPU_ALLOC((size_t)ncpu);
        size_t size = CPU_ALLOC_SIZE((size_t)ncpu);
        if (!set) return mt_err_set(err, MT_ENOMEM, "out of memory for a CPU set");
        if (sched_getaffinity(0, size, set) == 0) {
            hwloc_bitmap_zero(out);
            for (int i = 0; i < ncpu; i++)
                if (CPU_ISSET_S((size_t)i, size, set)) hwloc_bitmap_set(out, (unsigned)i);
            CPU_FREE(set);
            return MT_OK;
        }
        CPU_FREE(set);
        if (errno != EINVAL || ncpu > (1 << 20)) return mt_err_errno(err, "sched_getaffinity");
    }
}

#ifdef HAVE_NUMA
#define MAX_NUMA_NODES 4096
/* MPOL_BIND to one node for the calling thread, read back by get_mempolicy. */
static int bind_memory(int node, int *bound, struct mt_err *err)
{
    unsigned long mask[MAX_NUMA_NODES / (8 * sizeof(unsigned long))];
    const size_t bits = 8 * sizeof(unsigned long);
    *bound = -1;
    if (node >= MAX_NUMA_NODES)
        return mt_err_set(err, MT_EUNSUPPORTED, "NUMA node %d is beyond %d", node,
                          MAX_NUMA_NODES);
    memset(mask, 0, sizeof mask);
    mask[(size_t)node / bits] = 1ul << ((size_t)node % bits);
    if (set_mempolicy(MPOL_BIND, mask, MAX_NUMA_NODES + 1))
        return mt_err_errno(err, "set_mempolicy(MPOL_BIND, node %d)", node);
    int mode = -1;
    memset(mask, 0, sizeof mask);
    if (get_mempolicy(&mode, mask, MAX_NUMA_NODES + 1, NULL, 0))
        return mt_err_errno(err, "get_mempolicy");
    int first = -1, count = 0;
    for (int i = 0; i < MAX_NUMA_NODES; i++)
        if (mask[(size_t)i / bits] >> ((size_t)i % bits) & 1) {
            if (first < 0) first = i;
            count++;
        }
    if (mode != MPOL_BIND || count != 1 || first != node)
        return mt_err_set(err, MT_ERUNTIME,
                          "memory binding did not take: asked MPOL_BIND to NUMA node %d, "
                          "get_mempolicy reports mode %d on %d node(s) starting at %d",
                          node, mode, count, first);
    *bound = node;
    return MT_OK;
}
#endif

int mt_topo_affinity_apply(const struct mt_topo_node *n, const struct mt_topo_binding *b,
                           bool membind, struct mt_topo_applied *out, struct mt_err *err)
{
    hwloc_bitmap_t before = hwloc_bitmap_alloc(), after = hwloc_bitmap_alloc();
    hwloc_bitmap_t target = hwloc_bitmap_alloc();
    char want[MT_TOPO_CPUS_MAX], had[MT_TOPO_CPUS_MAX], how[256] = "";
    int rc = MT_OK;
    out->cpus[0] = '\0';
    out->membind = -1;
    out->report[0] = '\0';
    if (!before || !after || !target) {
        rc = mt_err_set(err, MT_ENOMEM, "out of memory for cpusets");
        goto done;
    }
    mt_topo_cpulist(b->cpus, want, sizeof want);
    if (!n->this_system) {
        snprintf(out->report, sizeof out->report, "would bind to cpus %s (%s); not applied: "
                                                  "the topology is %s, not this machine",
                 want[0] ? want : "-", b->why, n->source);
        mt_topo_copy(out->cpus, sizeof out->cpus, want);
        goto done;
    }
    MT_CHECK_GOTO(read_affinity(before, err), done);
    mt_topo_cpulist(before, had, sizeof had);
    hwloc_const_bitmap_t allowed = hwloc_topology_get_allowed_cpuset(n->topo);
    bool launcher_bound = hwloc_bitmap_isincluded(before, allowed) &&
                          !hwloc_bitmap_isequal(before, allowed);
    if (hwloc_bitmap_iszero(b->cpus)) {
        snprintf(how, sizeof how, "not bound (%s)", b->why);
    } else if (launcher_bound) {
        hwloc_bitmap_and(target, b->cpus, before);
        if (hwloc_bitmap_iszero(target))
            snprintf(how, sizeof how, "kept the launcher's binding: it excludes the chosen cpus "
                                      "%s (%s); launch with --cpu-bind=none to let moetrain bind",
                     want, b->why);
        else if (hwloc_bitmap_isequal(target, before))
            snprintf(how, sizeof how, "kept the launcher's binding, inside the chosen cpus %s "
                                      "(%s)", want, b->why);
        else
            snprintf(how, sizeof how, "launcher's binding %s narrowed to the chosen cpus (%s)",
                     had, b->why);
    } else {
        hwloc_bitmap_copy(target, b->cpus);
        snprintf(how, sizeof how, "%s", b->why);
    }
    if (!hwloc_bitmap_iszero(target) && !hwloc_bitmap_isequal(target, before) &&
        hwloc_set_cpubind(n->topo, target, HWLOC_CPUBIND_PROCESS)) {
        rc = mt_err_errno(err, "binding to cpus %s", want);
        goto done;
    }
    MT_CHECK_GOTO(read_affinity(after, err), done);
    if (!hwloc_bitmap_iszero(target) && !hwloc_bitmap_isequal(after, target)) {
        char got[MT_TOPO_CPUS_MAX], asked[MT_TOPO_CPUS_MAX];
        mt_topo_cpulist(after, got, sizeof got);
        mt_topo_cpulist(target, asked, sizeof asked);
        rc = mt_err_set(err, MT_ERUNTIME, "CPU binding did not take: asked %s, "
                                          "sched_getaffinity reports %s", asked, got);
        goto done;
    }
    mt_topo_cpulist(after, out->cpus, sizeof out->cpus);
    /* Memory goes to the node local to the cores actually bound. */
    int node = mt_topo_numa_of(n->topo, after);
    char mem[160];
    if (!membind)
        snprintf(mem, sizeof mem, "memory not bound (numa_membind = .false.)");
    else if (node < 0)
        snprintf(mem, sizeof mem, "memory not bound: the cores span NUMA nodes");
    else {
#ifdef HAVE_NUMA
        MT_CHECK_GOTO(bind_memory(node, &out->membind, err), done);
        snprintf(mem, sizeof mem, "memory bound to NUMA node %d", node);
#else
        snprintf(mem, sizeof mem, "memory not bound: this build has no libnuma");
#endif
    }
    snprintf(out->report, sizeof out->report, "cpus %s: %s; %s", out->cpus, how, mem);
done:
    hwloc_bitmap_free(before);
    hwloc_bitmap_free(after);
    hwloc_bitmap_free(target);
    return rc;
}

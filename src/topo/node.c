/* The node: hwloc topology with PCI discovery, the NVIDIA GPUs and their
 * locality, and which GPU a local process drives. */
#include "config.h"

#include "topo/topo_internal.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define PCI_VENDOR_NVIDIA 0x10de
#define PCI_BASE_CLASS_DISPLAY 0x03 /* 0300 VGA, 0302 3D controller; not 0680 NVSwitch */

void mt_topo_copy(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
}

void mt_topo_cpulist(hwloc_const_bitmap_t set, char *buf, size_t len)
{
    buf[0] = '\0';
    if (!set || hwloc_bitmap_iszero(set)) return;
    int need = hwloc_bitmap_list_snprintf(buf, len, set);
    if (need >= (int)len && len > 4) memcpy(buf + len - 4, "...", 4);
}

bool mt_topo_is_gpu_memory(const struct hwloc_obj *numa)
{
    return numa->subtype && !strcasecmp(numa->subtype, "GPUMemory");
}

int mt_topo_numa_of(hwloc_topology_t t, hwloc_const_bitmap_t set)
{
    hwloc_obj_t best = NULL;
    if (!set || hwloc_bitmap_iszero(set)) return -1;
    for (hwloc_obj_t nn = NULL;
         (nn = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, nn)) != NULL;) {
        if (mt_topo_is_gpu_memory(nn) || !hwloc_bitmap_isincluded(set, nn->cpuset)) continue;
        int w = hwloc_bitmap_weight(nn->cpuset), bw = best ? hwloc_bitmap_weight(best->cpuset) : 0;
        if (!best || w < bw || (w == bw && nn->os_index < best->os_index)) best = nn;
    }
    return best ? (int)best->os_index : -1;
}

static int cmp_gpu(const void *a, const void *b)
{
    return strcmp(((const struct mt_topo_gpu *)a)->pci, ((const struct mt_topo_gpu *)b)->pci);
}

static int find_gpus(struct mt_topo_node *n, struct mt_err *err)
{
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_pcidev(n->topo, o)) != NULL;) {
        const struct hwloc_pcidev_attr_s *pa = &o->attr->pcidev;
        if (pa->vendor_id != PCI_VENDOR_NVIDIA || (pa->class_id >> 8) != PCI_BASE_CLASS_DISPLAY)
            continue;
        if (n->ngpus == MT_TOPO_MAX_GPUS)
            return mt_err_set(err, MT_EUNSUPPORTED, "%s has more than %d NVIDIA GPUs",
                              n->source, MT_TOPO_MAX_GPUS);
        struct mt_topo_gpu *g = &n->gpus[n->ngpus++];
        snprintf(g->pci, sizeof g->pci, "%04x:%02x:%02x.%x", (unsigned)pa->domain,
                 (unsigned)pa->bus, (unsigned)pa->dev, (unsigned)pa->func);
        g->device_id = pa->device_id;
        hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(n->topo, o);
        g->cpuset = hwloc_bitmap_dup(anc->cpuset);
        if (!g->cpuset) return mt_err_set(err, MT_ENOMEM, "out of memory for a cpuset");
        g->numa = mt_topo_numa_of(n->topo, g->cpuset);
    }
    qsort(n->gpus, (size_t)n->ngpus, sizeof n->gpus[0], cmp_gpu);
    return MT_OK;
}

int mt_topo_node_load(const char *xml_path, bool use_nvml, struct mt_topo_node **out,
                      struct mt_err *err)
{
    struct mt_topo_node *n = calloc(1, sizeof *n);
    int rc;
    *out = NULL;
    if (!n) return mt_err_set(err, MT_ENOMEM, "out of memory for the node topology");
    const char *envxml = getenv("HWLOC_XMLFILE");
    if (xml_path && xml_path[0])
        mt_topo_copy(n->source, sizeof n->source, xml_path);
    else if (envxml && envxml[0])
        snprintf(n->source, sizeof n->source, "%s (HWLOC_XMLFILE)", envxml);
    else
        mt_topo_copy(n->source, sizeof n->source, "this machine");
    if (hwloc_topology_init(&n->topo)) {
        free(n);
        return mt_err_errno(err, "hwloc_topology_init");
    }
    /* PCI devices are filtered out by default, from XML input too. */
    hwloc_topology_set_io_types_filter(n->topo, HWLOC_TYPE_FILTER_KEEP_ALL);
    if (xml_path && xml_path[0] && hwloc_topology_set_xml(n->topo, xml_path)) {
        rc = mt_err_errno(err, "'%s' is not a usable hwloc XML topology (check it with: "
                               "hwloc-info --input %s)",
                          xml_path, xml_path);
        goto fail;
    }
    if (hwloc_topology_load(n->topo)) {
        rc = mt_err_errno(err, "loading the hwloc topology of %s", n->source);
        goto fail;
    }
    n->this_system = hwloc_topology_is_thissystem(n->topo);
    n->npackages = hwloc_get_nbobjs_by_type(n->topo, HWLOC_OBJ_PACKAGE);
    n->nnuma = hwloc_get_nbobjs_by_type(n->topo, HWLOC_OBJ_NUMANODE);
    n->ncores = hwloc_get_nbobjs_by_type(n->topo, HWLOC_OBJ_CORE);
    n->npus = hwloc_get_nbobjs_by_type(n->topo, HWLOC_OBJ_PU);
    MT_CHECK_GOTO(find_gpus(n, err), fail);
    if (use_nvml && n->ngpus > 0 && n->this_system) {
        mt_nvml_describe(n);
    } else {
        snprintf(n->nvml_why, sizeof n->nvml_why, "%s",
                 !use_nvml        ? "NVML not asked"
                 : n->ngpus == 0  ? "no NVIDIA GPU on this node"
                                  : "the topology is not this machine's, NVML not asked");
        for (int i = 0; i < n->ngpus; i++)
            mt_topo_copy(n->gpus[i].fabric_why, sizeof n->gpus[i].fabric_why, n->nvml_why);
    }
    *out = n;
    return MT_OK;
fail:
    mt_topo_node_free(n);
    return rc;
}

void mt_topo_node_free(struct mt_topo_node *n)
{
    if (!n) return;
    for (int i = 0; i < n->ngpus; i++) hwloc_bitmap_free(n->gpus[i].cpuset);
    if (n->topo) hwloc_topology_destroy(n->topo);
    free(n);
}

void mt_topo_node_print(const struct mt_topo_node *n, FILE *out)
{
    fprintf(out, "node (%s): %d package%s, %d NUMA node%s, %d cores, %d PUs, %d NVIDIA GPU%s\n",
            n->source, n->npackages, n->npackages == 1 ? "" : "s", n->nnuma,
            n->nnuma == 1 ? "" : "s", n->ncores, n->npus, n->ngpus, n->ngpus == 1 ? "" : "s");
    for (int i = 0; i < n->ngpus; i++) {
        const struct mt_topo_gpu *g = &n->gpus[i];
        char cpus[MT_TOPO_CPUS_MAX];
        mt_topo_cpulist(g->cpuset, cpus, sizeof cpus);
        fprintf(out, "  GPU %d %s [10de:%04x]: NUMA node %d, cpus %s", i, g->pci, g->device_id,
                g->numa, cpus[0] ? cpus : "-");
        if (g->nvlink_known) {
            fputs(", NVLink peers", out);
            if (!g->nvlink_peers) fputs(" none", out);
            for (int j = 0; j < n->ngpus; j++)
                if (g->nvlink_peers >> j & 1) fprintf(out, " %d", j);
        }
        if (n->nvml) fprintf(out, ", fabric %s", g->fabric[0] ? g->fabric : g->fabric_why);
        fputc('\n', out);
    }
    if (!n->nvml && n->ngpus) fprintf(out, "  (no NVLink peers or fabric info: %s)\n", n->nvml_why);
}

/* ---- which GPU a local process drives ---- */

/* One CUDA_VISIBLE_DEVICES entry: an index into the PCI-ordered GPUs, or a
 * (prefix of a) GPU UUID; -1 if it names no GPU of this node. */
static int visible_entry(const struct mt_topo_node *n, const char *e)
{
    if (isdigit((unsigned char)e[0])) {
        char *end;
        long v = strtol(e, &end, 10);
        return *end == '\0' && v < n->ngpus ? (int)v : -1;
    }
    if (!strncmp(e, "GPU-", 4)) {
        int hit = -1, hits = 0;
        for (int i = 0; i < n->ngpus; i++)
            if (n->gpus[i].uuid[0] && !strncmp(n->gpus[i].uuid, e, strlen(e))) {
                hit = i;
                hits++;
            }
        return hits == 1 ? hit : -1;
    }
    return -1;
}

int mt_topo_choose_gpu(const struct mt_topo_node *n, const char *cuda_visible, int local_rank,
                       int local_size, struct mt_topo_gpu_choice *out, struct mt_err *err)
{
    int visible[MT_TOPO_MAX_GPUS], nv = 0;
    out->gpu = out->cuda_device = -1;
    out->nvisible = 0;
    if (!cuda_visible) {
        for (int i = 0; i < n->ngpus; i++) visible[nv++] = i;
    } else {
        /* CUDA's rule: the list ends at the first entry that names no device. */
        char buf[1024];
        mt_topo_copy(buf, sizeof buf, cuda_visible);
        for (char *save = NULL, *t = strtok_r(buf, ", ", &save); t && nv < MT_TOPO_MAX_GPUS;
             t = strtok_r(NULL, ", ", &save)) {
            if (!strncmp(t, "MIG-", 4))
                return mt_err_set(err, MT_EUNSUPPORTED,
                                  "CUDA_VISIBLE_DEVICES='%s': MIG instances are not supported "
                                  "(give whole GPUs, by index or GPU- UUID)",
                                  cuda_visible);
            if (!strncmp(t, "GPU-", 4) && !n->nvml)
                return mt_err_set(err, MT_EUNSUPPORTED,
                                  "CUDA_VISIBLE_DEVICES='%s' names GPUs by UUID, which needs "
                                  "NVML to map to PCI ids: %s",
                                  cuda_visible, n->nvml_why);
            int g = visible_entry(n, t);
            if (g < 0) break;
            visible[nv++] = g;
        }
    }
    out->nvisible = nv;
    if (nv == 0) return MT_OK;
    int pos;
    if (nv == 1)
        pos = 0;
    else if (local_size <= nv)
        pos = local_rank;
    else /* more processes than GPUs: consecutive local ranks share a GPU */
        pos = (int)((long long)local_rank * nv / local_size);
    out->gpu = visible[pos];
    out->cuda_device = pos;
    return MT_OK;
}

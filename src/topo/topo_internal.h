/* moetrain: src/topo internals shared between its files. */
#ifndef MT_TOPO_INTERNAL_H
#define MT_TOPO_INTERNAL_H

#include "topo/topo.h"

/* ---- NVML through dlopen (nvml.c) ---- */

/* Fills n->nvml / n->nvml_why and, per GPU, uuid, nvlink peers and fabric
 * info. Never fails: a missing library or a failing call leaves the fields
 * empty and says why. */
void mt_nvml_describe(struct mt_topo_node *n);

/* ---- string interning (place.c, report.c) ---- */

/* ids[i] = dense id of strs[i * stride] (first appearance order); returns the
 * number of distinct strings, or -1 when out of memory. firsts (may be NULL)
 * receives, per id, the first index holding it (an array of n). */
int mt_topo_intern(const char *strs, size_t stride, int n, int *ids, int *firsts);

/* ---- helpers ---- */

/* FNV-1a: h = MT_TOPO_HASH_SEED to start, then fold in each piece. */
#define MT_TOPO_HASH_SEED 1469598103934665603ull
uint64_t mt_topo_hash(uint64_t h, const void *data, size_t len);

/* hwloc list syntax ("0-13,112-125") into buf; "" for an empty or NULL set;
 * a list that does not fit ends in "...". */
void mt_topo_cpulist(hwloc_const_bitmap_t set, char *buf, size_t len);

/* true for NUMA nodes of GPU memory (hwloc subtype "GPUMemory"), which never
 * receive host memory bindings. */
bool mt_topo_is_gpu_memory(const struct hwloc_obj *numa);

/* The host-memory NUMA node local to every PU of set: among the nodes whose
 * cpuset contains set (GPU memory excluded), the one with the fewest PUs,
 * then the lowest number; -1 when set spans nodes or is empty. */
int mt_topo_numa_of(hwloc_topology_t t, hwloc_const_bitmap_t set);

/* Copies src into a fixed buffer, truncating. */
void mt_topo_copy(char *dst, size_t len, const char *src);

#endif

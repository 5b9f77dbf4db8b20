/* moetrain: machine topology, NVLink domains, placement and CPU/NUMA affinity.
 *
 * The pieces, in the order startup uses them (doc/topology.md tells the story
 * for site admins):
 *   node      hwloc topology of this node (live, or a saved XML): packages,
 *             NUMA nodes, cores, and every NVIDIA GPU with its PCI locality
 *             (cpuset, NUMA node) and, where NVML answers, its NVLink peers.
 *   GPU       which GPU this process drives (local rank, CUDA_VISIBLE_DEVICES).
 *   domain    the NVLink-domain key of that GPU (NVML fabric clusterUuid +
 *             cliqueId, Slurm switch/block address, host, or a map file).
 *   cluster   the facts of every process (struct mt_topo_proc), exchanged
 *             through the PMIx modex so every rank holds the same table; or,
 *             for --dry-run, described by a nodes file.
 *   plan      logical rank (Megatron order) of every process, such that every
 *             TP x CP and every ETP x EP group lies inside one domain.
 *   binding   the cores and NUMA node each rank is bound to, applied and
 *             verified (sched_getaffinity, get_mempolicy).
 * Library code returns MT_E* codes with a message; only the CLI prints. */
#ifndef MT_TOPO_TOPO_H
#define MT_TOPO_TOPO_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <hwloc.h>

#include "config/config.h"
#include "runtime/comm.h"
#include "runtime/groups.h"
#include "util/error.h"

#define MT_TOPO_MAX_GPUS 64   /* GPUs per node */
#define MT_TOPO_HOST_MAX 64
#define MT_TOPO_DOMAIN_MAX 96
#define MT_TOPO_PCI_MAX 16    /* "0000:18:00.0" */
#define MT_TOPO_CPUS_MAX 128  /* a cpulist such as "0-13,112-125" */

/* ---- the node (hwloc) --------------------------------------------------- */

struct mt_topo_gpu {
    char pci[MT_TOPO_PCI_MAX];   /* domain:bus:device.function, lower case */
    unsigned device_id;          /* PCI device id (vendor is always 0x10de) */
    hwloc_bitmap_t cpuset;       /* PUs of the GPU's non-I/O ancestor (its locality) */
    int numa;                    /* OS index of the NUMA node local to it; -1 if none */
    /* From NVML, when it answers (all empty/false without it): */
    char uuid[96];               /* "GPU-..." */
    uint64_t nvlink_peers;       /* bit j: NVLink P2P with GPU j of this node */
    bool nvlink_known;           /* NVML answered the NVLink P2P query */
    char fabric[64];             /* "clusterUuid/cliqueId" of a COMPLETED fabric
                                    registration with a non-zero UUID; else "" */
    char fabric_why[96];         /* why fabric is empty, for error messages */
};

struct mt_topo_node {
    hwloc_topology_t topo;
    bool this_system;            /* false for XML input: plan only, never bind */
    char source[MT_STR_MAX];     /* "this machine" or the XML path */
    int npackages, nnuma, ncores, npus;
    int ngpus;                   /* sorted by PCI bus id */
    struct mt_topo_gpu gpus[MT_TOPO_MAX_GPUS];
    bool nvml;                   /* NVML was loaded and initialised */
    char nvml_why[256];          /* why not, when !nvml */
};

/* Loads the topology with PCI discovery on: from xml_path when it is not
 * empty, else from HWLOC_XMLFILE when set, else the live machine. When
 * use_nvml and the topology is this machine's, NVML (if the library loads)
 * adds GPU UUIDs, NVLink peers and fabric info. */
int mt_topo_node_load(const char *xml_path, bool use_nvml, struct mt_topo_node **out,
                      struct mt_err *err);
void mt_topo_node_free(struct mt_topo_node *n);
/* One paragraph: packages, NUMA nodes, cores, and each GPU's locality/peers. */
void mt_topo_node_print(const struct mt_topo_node *n, FILE *out);

/* ---- this process's GPU ------------------------------------------------- */

struct mt_topo_gpu_choice {
    int gpu;          /* index into node->gpus; -1: no GPU for this process */
    int cuda_device;  /* the CUDA ordinal of that GPU in this process; -1: none */
    int nvisible;     /* GPUs this process can see */
};

/* Local process local_rank (of local_size) takes the local_rank-th visible GPU
 * in CUDA order (with CUDA_DEVICE_ORDER=PCI_BUS_ID, which mt_topo_startup
 * sets when it is unset): the visible list is cuda_visible
 * (CUDA_VISIBLE_DEVICES; NULL = unset = all GPUs in PCI order) of GPU indices
 * or GPU UUIDs. One visible GPU is taken whatever the local rank (Slurm's
 * per-task binding); more ranks than GPUs share them in blocks. */
int mt_topo_choose_gpu(const struct mt_topo_node *n, const char *cuda_visible, int local_rank,
                       int local_size, struct mt_topo_gpu_choice *out, struct mt_err *err);

/* ---- NVLink domains ------------------------------------------------------ */

/* "hostname key" lines ('#' comments): domain_map_file and --nodes-file. */
struct mt_topo_map {
    int n;
    char (*host)[MT_TOPO_HOST_MAX];
    char (*key)[MT_TOPO_DOMAIN_MAX];
};
int mt_topo_map_read(const char *path, struct mt_topo_map *out, struct mt_err *err);
void mt_topo_map_free(struct mt_topo_map *m);

/* The domain key of GPU `gpu` (-1: none) of this node on host `hostname`,
 * from t->nvlink_domain_source; the key starts with the source that answered
 * ("nvml:", "slurm:", "host:", "file:"). Environment: SLURM_TOPOLOGY_ADDR. */
int mt_topo_domain_key(const struct mt_config_topology *t, const struct mt_topo_node *n,
                       int gpu, const char *hostname, char *key, size_t keylen,
                       struct mt_err *err);

/* ---- the cluster table --------------------------------------------------- */

/* What one process knows about itself; fixed size, so it travels through the
 * PMIx modex as one blob. Strings are NUL-terminated. */
struct mt_topo_proc {
    char host[MT_TOPO_HOST_MAX];
    char domain[MT_TOPO_DOMAIN_MAX];
    char gpu[MT_TOPO_PCI_MAX];     /* PCI bus id; "" = no GPU */
    char cpus[MT_TOPO_CPUS_MAX];   /* cpulist bound to (verified); "" = unknown */
    int32_t local_rank, local_size;
    int32_t gpu_index;             /* index among the node's GPUs; -1 none */
    int32_t cuda_device;           /* CUDA ordinal in that process; -1 none */
    int32_t numa;                  /* NUMA node local to its cores/GPU; -1 unknown */
    int32_t membind;               /* NUMA node memory is bound to; -1 not bound */
};

struct mt_topo_cluster {
    int nprocs;
    struct mt_topo_proc *procs;    /* [nprocs], by process (job) rank */
};

/* A described cluster for --dry-run: nodes->n nodes of gpus_per_node
 * processes each (one per GPU), process p = node p / G, local rank p % G.
 * With a template node (hwloc XML), GPU ids and the affinity that
 * cpu_affinity would choose are filled in; without, they stay unknown. */
int mt_topo_cluster_describe(const struct mt_topo_map *nodes, int gpus_per_node,
                             const struct mt_topo_node *tmpl, const char *cpu_affinity,
                             struct mt_topo_cluster *out, struct mt_err *err);
/* Every process passes its own facts; every process gets the same table. */
int mt_topo_cluster_gather(struct mt_world *w, const char *key, const struct mt_topo_proc *mine,
                           struct mt_topo_cluster *out, struct mt_err *err);
void mt_topo_cluster_free(struct mt_topo_cluster *c);

/* ---- placement ----------------------------------------------------------- */

struct mt_topo_plan {
    int nprocs;
    int *logical_of_process;     /* for mt_parallel_init */
    int *process_of_logical;
    int ndomains;
    char (*domain_names)[MT_TOPO_DOMAIN_MAX]; /* in order of first appearance */
    int *domain_of_process;
    int *domain_size;            /* processes per domain */
    int block;                   /* ranks that must share a domain (lcm of TPxCP and
                                    ETPxEP sizes in Megatron order); 0 if they vary */
    char mode[24];               /* nvlink | nvlink-besteffort | linear */
    int split_groups[2];         /* TPxCP, ETPxEP groups spanning >1 domain */
    int pp_links, pp_links_crossing; /* consecutive-stage pairs; those crossing domains */
    char *notes;                 /* multi-line report of split groups (besteffort); may be NULL */
};

/* Maps logical ranks onto the processes of c (c->nprocs == rl->world) by mode:
 * 'nvlink' keeps every TP x CP and ETP x EP group inside one domain, whole
 * pipelines in one domain where they fit, else fails with what allocation
 * would work; 'nvlink-besteffort' places whole blocks first and splits the
 * rest, reporting it; 'linear' is the identity. Deterministic: every rank
 * computes the same plan from the same table. */
int mt_topo_place(const struct mt_topo_cluster *c, const struct mt_rank_layout *rl,
                  const char *mode, struct mt_topo_plan *out, struct mt_err *err);
void mt_topo_plan_free(struct mt_topo_plan *p);

/* ---- CPU and memory affinity --------------------------------------------- */

struct mt_topo_binding {
    hwloc_bitmap_t cpus;         /* chosen PUs; empty = leave the cores alone */
    int numa;                    /* NUMA node local to those cores; -1 if several/none */
    char why[256];               /* how the choice was made, for the startup report */
};

/* Chooses the cores of local process local_rank for cpu_affinity `mode`
 * ('gpu', 'numa', 'none'); local_gpus[i] is the GPU (node index, -1 none) of
 * local process i. 'gpu': the cores local to the GPU, split evenly (whole
 * cores, in order) between the local processes whose GPUs share that
 * locality; without a GPU, processes are spread evenly over the NUMA nodes
 * and then split the node's cores. 'numa': the whole local NUMA node. */
int mt_topo_affinity_choose(const struct mt_topo_node *n, const char *mode, int local_rank,
                            int local_size, const int *local_gpus, struct mt_topo_binding *out,
                            struct mt_err *err);
void mt_topo_binding_free(struct mt_topo_binding *b);

/* What mt_topo_affinity_apply did, read back from the kernel. */
struct mt_topo_applied {
    char cpus[MT_TOPO_CPUS_MAX]; /* sched_getaffinity after binding */
    int membind;                 /* MPOL_BIND node per get_mempolicy; -1 none */
    char report[512];            /* one line for the startup log */
};

/* Binds this process (all its threads) to b->cpus and, when membind, the
 * calling thread's memory to b->numa (call it before other threads start:
 * threads inherit the memory policy at creation). Rule when a launcher has
 * already bound the process to a strict subset of the allowed cores: bind
 * to the intersection with the choice; if that is empty, keep the launcher's
 * binding and say so. XML topologies are never bound. Every result is
 * verified; a mismatch is an error. */
int mt_topo_affinity_apply(const struct mt_topo_node *n, const struct mt_topo_binding *b,
                           bool membind, struct mt_topo_applied *out, struct mt_err *err);

/* ---- startup and reports --------------------------------------------------- */

struct mt_topo_setup {
    struct mt_topo_node *node;
    struct mt_topo_gpu_choice gpu;
    struct mt_topo_applied applied;
    struct mt_topo_cluster cluster;
    struct mt_topo_plan plan;
};

/* Discovery and binding for this process of world w, collective over w:
 * load the node, choose the GPU, find its domain, exchange the facts, bind
 * (cfg->host), exchange the verified bindings. An error here may be local to
 * one process: the caller prints it and calls mt_world_abort. */
int mt_topo_startup(struct mt_world *w, const struct mt_config *cfg, struct mt_topo_setup **out,
                    struct mt_err *err);
/* Placement (cfg->topology%placement) from the exchanged table, collective
 * over w: every process computes the plan, or the same error (print it
 * once), and the processes check that their plans agree. Then pass
 * s->plan.logical_of_process to mt_parallel_init and s->gpu.cuda_device to
 * cudaSetDevice. */
int mt_topo_setup_place(struct mt_topo_setup *s, struct mt_world *w, const struct mt_config *cfg,
                        const struct mt_layout *l, struct mt_err *err);
void mt_topo_setup_free(struct mt_topo_setup *s);

/* The plan summary: domains, block size, splits, pipeline links. */
void mt_topo_print_summary(const struct mt_topo_plan *p, FILE *out);
/* One line (or one JSON object) per process: host, GPU, NUMA node, cores,
 * domain and coordinates in every group. JSON keys: rank, process, host,
 * gpu, numa, cpus, domain, tp, cp, ep, etp, dp, edp, pp. */
int mt_topo_print_table(const struct mt_topo_cluster *c, const struct mt_topo_plan *p,
                        const struct mt_rank_layout *rl, bool json, FILE *out,
                        struct mt_err *err);

/* The startup report of rank 0: this node, process 0's binding as read back,
 * the plan summary, and the table when there are at most max_rows processes. */
int mt_topo_print_report(const struct mt_topo_setup *s, const struct mt_rank_layout *rl,
                         int max_rows, FILE *out, struct mt_err *err);

/* `moetrain topo ...` (argv[0] = "topo"); returns the exit status. */
int mt_topo_cli(int argc, char **argv);

#endif

/* moetrain plan: the layouts of a model on N GPUs, ranked by a modelled step time, the
 * best ones checked for memory with the trainer's own setup (doc/plan.md).
 *
 * Three passes:
 *   1. enumerate TP, PP, VPP (with the even split and, per PP x VPP, the uneven end
 *      stages that balance the LM head best), EP, ETP and the micro-batch size; keep
 *      what moetrain's configuration rules accept (mt_config_resolve,
 *      mt_model_check_config) for the world and the global batch;
 *   2. model each one's step time (below) and sort;
 *   3. in that order, place it on the cluster (mt_topo_place, cached per TP x PP x EP x
 *      ETP) and plan the memory of its most loaded ranks (mt_train_plan_memory), until
 *      --top layouts fit.
 * Pass 3 stops early, so a 100,000-GPU plan sizes a few dozen layouts, not thousands.
 *
 * Which ranks are sized: the ranks whose TP, CP, EP, ETP and DP positions are 0, on the
 * first stage, the second (the most loaded middle stage: every middle stage has the same
 * layers, and the schedules hold the most micro-batches on the earliest stages) and the
 * last. Position 0 holds the largest part of the vocabulary (mt_model splits it with the
 * remainder first) and the experts and ZeRO slices split evenly, so these are the most
 * loaded ranks; tests/train/plan.sh checks it against --check, which sizes every kind of
 * rank. */
#include "config.h"

#include "plan/plan.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/model.h"
#include "runtime/groups.h"
#include "runtime/parallel.h"
#include "topo/topo.h"
#include "train/train.h"

/* ---- the assumptions: every number the model uses ------------------------------- */

/* One platform: its peak, memory and links, and what fraction of them training gets.
 * Bandwidths are per GPU and per direction. */
struct platform {
    const char *name;
    double bf16_tflops;   /* dense BF16 tensor-core peak, TFLOP/s */
    double fp8_tflops;    /* dense FP8 tensor-core peak, TFLOP/s */
    const char *fp8_recipe; /* the FP8 recipe the platform takes (doc/fp8.md) */
    double hbm_gib;       /* GPU memory the device reports, GiB */
    double hbm_tbps;      /* GPU memory bandwidth, TB/s */
    int domain;           /* GPUs per NVLink domain */
    int gpus_per_node;    /* GPUs per node (compute tray) */
    double nvlink_gbps;   /* NVLink, GB/s per direction */
    double net_gbps;      /* scale-out network (InfiniBand), GB/s per direction */
    double host_gbps;     /* the GPU's link to host memory (activation offloading), GB/s
                             per direction */
    double eff_dense;     /* fraction of peak of the dense GEMMs and attention */
    double eff_expert;    /* fraction of peak of the grouped expert GEMMs */
    double eff_link;      /* fraction of link bandwidth NCCL collectives reach */
};

/* Sources (vendor datasheets, by name):
 *   Memory is what the device reports: 79.6 GiB of an 80 GB H100 (doc/memory.md); the
 *   other datasheets' GB are HBM stacks counted in GiB (HBM comes in powers of two),
 *   taken as they are.
 *   H100: "NVIDIA H100 Tensor Core GPU" datasheet, SXM5: BF16 989 TFLOP/s dense (1979
 *         with sparsity), 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s; "NVIDIA DGX H100"
 *         datasheet: 8 GPUs a node, 8 ConnectX-7 400 Gb/s (50 GB/s) a GPU.
 *   H800: the H100's compute and memory with NVLink cut to 400 GB/s; DeepSeek-V3
 *         Technical Report (section 3.1): 8 GPUs a node over NVLink/NVSwitch, 50 GB/s
 *         InfiniBand a GPU.
 *   H200: "NVIDIA H200 Tensor Core GPU" datasheet: 141 GB HBM3e at 4.8 TB/s, BF16 and
 *         NVLink as the H100; HGX H200 nodes of 8 with 400 Gb/s a GPU.
 *   B200: "NVIDIA DGX B200" datasheet: 8 GPUs, 1,440 GB (180 GB a GPU), 72 PFLOPS FP8
 *         training with sparsity (2.25 PFLOP/s BF16 dense a GPU), NVLink 5 1.8 TB/s a
 *         GPU, 8 ConnectX-7 400 Gb/s; 8 TB/s HBM3e a GPU.
 *   GB200: "NVIDIA GB200 NVL72" datasheet: 72 GPUs in one NVLink domain, 360 PFLOPS
 *         FP16/BF16 with sparsity (2.5 PFLOP/s dense a GPU), 13.4 TB HBM3e (186 GB a
 *         GPU) at 576 TB/s, NVLink 1.8 TB/s a GPU; compute trays of 4 GPUs; ConnectX-7
 *         400 Gb/s a GPU.
 *   GB300: "NVIDIA GB300 NVL72" datasheet: 72 GPUs in one NVLink domain, BF16 as the
 *         GB200, 20.7 TB HBM3e (288 GB a GPU) at 576 TB/s, NVLink 1.8 TB/s a GPU;
 *         trays of 4; ConnectX-8 800 Gb/s (100 GB/s) a GPU.
 * Efficiencies (doc/plan.md, "Calibration"):
 *   eff_dense: Megatron-LM's README reports up to 47% model FLOP utilisation for GPT
 *         models on H100; 0.47 for Hopper, and the same fraction for Blackwell.
 *   eff_expert: fitted to Megatron-Bridge's performance summary (25.11 container),
 *         Qwen3-235B-A22B BF16 on 256 GB200 GPUs (TP 1, PP 8, VP 3, EP 32, MBS 1): 728
 *         TFLOP/s a GPU; the one fitted number, used for every platform.
 *   eff_link: 0.8 of the link for NCCL's ring and all-to-all (DeepSeek-V3 Technical
 *         Report: about 160 GB/s of the H800's NVLink reached in practice, 0.8 of 200);
 *         the same fraction of the host link for offloading's copies.
 * FP8 (dense, without sparsity; the recipe by doc/fp8.md: blockwise on Hopper, whose
 * tensor cores take FP8 with software-promoted fp32 block scales, mxfp8 on Blackwell,
 * whose tensor cores apply UE8M0 block scales):
 *   H100, H800, H200: the H100 and H200 datasheets, FP8 3,958 TFLOP/s with sparsity:
 *         1979 dense.
 *   B200: the DGX B200 datasheet, 72 PFLOPS FP8 training with sparsity for 8 GPUs: 4500
 *         dense a GPU.
 *   GB200, GB300: the GB200 and GB300 NVL72 datasheets, FP8/FP6 720 PFLOPS with
 *         sparsity for 72 GPUs: 5000 dense a GPU.
 * Host links (activation offloading):
 *   H100, H800, H200, B200: PCI Express 5.0 x16 (the H100 datasheet: "PCIe Gen5: 128
 *         GB/s", both directions; PCI-SIG's PCIe 5.0 specification: 32 GT/s a lane,
 *         128b/130b coding, 63 GB/s a direction over 16 lanes): 63 GB/s.
 *   GB200, GB300: NVLink-C2C between the Grace CPU and the GPU (the GB200 NVL72
 *         datasheet: "NVLink-C2C 900 GB/s", both directions): 450 GB/s. */
static const struct platform platforms[] = {
    {"h100", 989.0, 1979.0, "blockwise", 79.6, 3.35, 8, 8, 450.0, 50.0, 63.0, 0.47, 0.34, 0.8},
    {"h800", 989.0, 1979.0, "blockwise", 79.6, 3.35, 8, 8, 200.0, 50.0, 63.0, 0.47, 0.34, 0.8},
    {"h200", 989.0, 1979.0, "blockwise", 141.0, 4.8, 8, 8, 450.0, 50.0, 63.0, 0.47, 0.34, 0.8},
    {"b200", 2250.0, 4500.0, "mxfp8", 180.0, 8.0, 8, 8, 900.0, 50.0, 63.0, 0.47, 0.34, 0.8},
    {"gb200", 2500.0, 5000.0, "mxfp8", 186.0, 8.0, 72, 4, 900.0, 50.0, 450.0, 0.47, 0.34, 0.8},
    {"gb300", 2500.0, 5000.0, "mxfp8", 288.0, 8.0, 72, 4, 900.0, 100.0, 450.0, 0.47, 0.34, 0.8},
};
#define NPLATFORMS (sizeof platforms / sizeof platforms[0])

/* What moetrain itself does, which the step model follows:
 *   activations and their gradients travel as BF16 (2 bytes) in the TP collectives, the
 *   EP all-to-all and the pipeline transfers;
 *   gradients are reduced in FP32 (4 bytes) and, with the distributed optimizer, the
 *   updated FP32 slices all-gathered (4 bytes), after the last micro-batch, or bucket by
 *   bucket beside its backward and the next step's first forward with &parallel
 *   overlap_grad_reduce and overlap_param_gather (src/train/optim.c);
 *   the optimizer step reads and writes 32 bytes a parameter it owns (master weight,
 *   gradient, two moments; master and moments written back) and 8 a parameter it holds
 *   (the working copy refreshed);
 *   the GPU memory moetrain may plan is the GPU's less 5.6 GiB for what it does not
 *   allocate (CUDA context, NCCL, cuBLASLt, fragmentation: doc/memory.md; 74 GiB of an
 *   80 GB H100), unless precision%gpu_memory_gb says otherwise;
 *   a layout whose most loaded rank plans 90% or more of that memory is at the memory
 *   wall. */
#define WIRE_BYTES 2.0
#define GRAD_BYTES 4.0
#define GATHER_BYTES 4.0
#define OPT_BYTES_OWNED 32.0
#define OPT_BYTES_HELD 8.0
#define RESERVE_GIB 5.6
#define MEMORY_WALL 0.90

/* The micro-batch sizes tried. */
static const int mbs_choices[] = {1, 2, 4, 8};

/* The recompute settings tried, least recomputed first (the order breaks ties in the
 * step model): nothing; the elementwise and norm outputs, which cost no GEMM; Megatron's
 * default (the attention core); both; the whole MoE block besides; whole layers. Those
 * the model lacks a module for are dropped. Every one of them keeps each layer's input
 * (the residual stream the input norm reads; 'full' with groups of one layer keeps only
 * that), so no setting saves fewer activation bytes than the last: the bound of
 * check_layout. */
static const struct {
    const char *granularity, *method;
    int num_layers;
    const char *modules[4];
} recompute_choices[] = {
    {"none", "none", 0, {NULL}},
    {"selective", "none", 0, {"moe_act", "layernorm", NULL}},
    {"selective", "none", 0, {"core_attn", NULL}},
    {"selective", "none", 0, {"core_attn", "moe_act", "layernorm", NULL}},
    {"selective", "none", 0, {"core_attn", "layernorm", "moe", NULL}},
    {"full", "uniform", 1, {NULL}},
};
#define NRECOMPUTE (sizeof recompute_choices / sizeof recompute_choices[0])

/* Activation offloading, tried after recompute (the phase 1: offloading when
 * recompute and parallelism are not enough): with each recompute setting but 'full'
 * (which saves nothing to offload), the modules in order of the bytes a layer saves,
 * the largest first (offload_order), in OFFLOAD_LEVELS cumulative steps: the first, the
 * first two, all. Every module saves one byte of each in-flight micro-batch's
 * activations per byte it copies each way, so the order by size reaches a saving with
 * the fewest copies; attn_norm, the layer's input, is not tried: it is what 'full'
 * keeps, and keeping it keeps the bound of check_layout (no setting keeps fewer
 * activation bytes than 'full') true. */
#define OFFLOAD_LEVELS 3
#define NSETTINGS_MAX (NRECOMPUTE * (1 + OFFLOAD_LEVELS))
enum { OFF_QKV, OFF_CORE, OFF_PROJ, OFF_MLP_NORM, OFF_FC1, OFF_ACT, NOFF };
static const char *const offload_names[NOFF] = {"qkv_linear", "core_attn", "attn_proj",
                                                "mlp_norm",   "expert_fc1", "moe_act"};

/* The keys the plan chooses. An override of an axis fixes it (the plan tries only that
 * value); the others are refused, not ignored. */
enum { FIX_TP, FIX_PP, FIX_VPP, FIX_FIRST, FIX_LAST, FIX_EP, FIX_ETP, FIX_MBS, NFIX };
static const char *const axis_keys[NFIX] = {
    "parallel%tensor_model_parallel_size", "parallel%pipeline_model_parallel_size",
    "parallel%virtual_pipeline_model_parallel_size",
    "parallel%decoder_first_pipeline_num_layers", "parallel%decoder_last_pipeline_num_layers",
    "parallel%expert_model_parallel_size", "parallel%expert_tensor_parallel_size",
    "training%micro_batch_size"};
static const char *const refused_keys[] = {
    "parallel%sequence_parallel", "parallel%context_parallel_size",
    "parallel%use_distributed_optimizer", "training%global_batch_size", NULL};

static bool key_is(const char *a, const char *key)
{
    size_t n = strlen(key);
    return !strncasecmp(a, key, n) && (a[n] == '=' || a[n] == ' ');
}

/* The value a fixed axis has in the loaded configuration. */
static int fixed_value(const struct mt_config *c, int axis)
{
    const struct mt_config_parallel *p = &c->parallel;
    switch (axis) {
    case FIX_TP: return p->tensor_model_parallel_size;
    case FIX_PP: return p->pipeline_model_parallel_size;
    case FIX_VPP: return p->virtual_pipeline_model_parallel_size;
    case FIX_FIRST: return p->decoder_first_pipeline_num_layers;
    case FIX_LAST: return p->decoder_last_pipeline_num_layers;
    case FIX_EP: return p->expert_model_parallel_size;
    case FIX_ETP: return p->expert_tensor_parallel_size;
    default: return c->training.micro_batch_size;
    }
}

/* ---- the model, per token ---------------------------------------------------------- */

struct model {
    double H, Q, KV, F, Fe, Fs, topk, E, V, T;
    int L, nmoe;
    const int *moe; /* layer_freq */
    /* FLOPs per token (forward and backward), Megatron's num_floating_point_operations
     * split by where they run: attention GEMMs, core attention, a dense MLP, an MoE
     * layer's experts (routed and shared), the LM head */
    double f_attn, f_core, f_mlp, f_moe, f_head;
    /* parameters: an attention block with its norms, a dense MLP, the routed experts of
     * an MoE layer, its router and shared expert, the embedding (or head) */
    double p_attn, p_mlp, p_experts, p_router_shared, p_embed;
};

static void model_facts(const struct mt_config *c, struct model *m)
{
    m->H = c->model.hidden_size;
    m->Q = (double)c->model.num_attention_heads * c->model.kv_channels;
    m->KV = (double)c->model.num_query_groups * c->model.kv_channels;
    m->F = c->model.ffn_hidden_size;
    m->L = c->model.num_layers;
    m->V = c->model.vocab_size;
    m->T = c->training.seq_length;
    m->moe = c->moe.layer_freq;
    m->nmoe = 0;
    for (int i = 0; i < m->L; i++) m->nmoe += m->moe[i] != 0;
    m->E = c->moe.num_experts;
    m->Fe = m->E > 0 ? c->moe.moe_ffn_hidden_size : 0;
    m->Fs = m->E > 0 ? c->moe.shared_expert_intermediate_size : 0;
    m->topk = m->E > 0 ? c->moe.router_topk : 0;
    const double H = m->H;
    m->f_attn = 6.0 * (H * (m->Q + 2.0 * m->KV) + m->Q * H);
    m->f_core = 6.0 * m->Q * m->T;
    m->f_mlp = 6.0 * H * m->F * 3.0;
    m->f_moe = 6.0 * H * (m->Fe * m->topk * 3.0 + m->Fs * 3.0);
    m->f_head = 6.0 * H * m->V;
    m->p_attn = H * (m->Q + 2.0 * m->KV) + m->Q * H;
    m->p_mlp = 3.0 * H * m->F;
    m->p_experts = m->E * 3.0 * H * m->Fe;
    m->p_router_shared = H * m->E + 3.0 * H * m->Fs;
    m->p_embed = m->V * H;
}

static double flops_per_token(const struct model *m)
{
    return m->L * (m->f_attn + m->f_core) + (m->L - m->nmoe) * m->f_mlp + m->nmoe * m->f_moe +
           m->f_head;
}

/* ---- layouts ------------------------------------------------------------------------ */

struct layout {
    int tp, pp, vpp, ep, etp, mbs, first, last; /* first/last: 0 = the even split */
    int rc;                 /* the recompute setting: planner's settings[rc] */
    bool fp8;               /* the platform's FP8 recipe (searched), else BF16 */
    int kid;                /* the layout without its recompute setting: planner's kinds */
    int dp, edp, m;
    /* seconds per step */
    double step, compute, bubble, t_tp, t_ep, t_pp, t_dp, t_opt, t_off; /* charged */
    /* what the overlap keys hide of the step's traffic (seconds, not in the charged
     * terms above): the EP all-to-alls behind the shared expert, the pipeline transfers
     * behind the passes that follow them, the gradient reduce-scatter behind the last
     * micro-batch's backward and the parameter all-gather behind the first one's
     * forward, which cover them (the compute the DP buckets run beside) in nbuckets */
    double h_ep, h_pp, h_rs, h_ag, cover_bwd, cover_fwd;
    int nbuckets;
    double tokens_s, tflops; /* a GPU */
    const char *wall;
    /* pass 3 */
    enum { UNCHECKED, FITS, TOO_BIG, REFUSED, SLOWER } state; /* SLOWER: another
                               recompute setting of the same layout fits, and is faster */
    struct mt_rank_memory worst;
    bool bound;              /* too big by a lower bound: worst.total only */
};

struct planner {
    const struct platform *gpu;
    int world, gbs, top;
    const char *nodes_file;
    struct mt_config *base;   /* the namelists and overrides */
    struct mt_config *resolved; /* base resolved for one process: the model's sizes */
    struct mt_config *work;   /* one layout's resolved copy */
    struct model model;
    double usable_gib;
    int domain;               /* the smallest NVLink domain of the cluster */
    struct mt_topo_cluster cluster;
    struct layout *cands;
    size_t n, cap;
    long long tried;          /* layouts enumerated before the configuration rules */
    /* placements, by TP x PP x EP x ETP */
    struct placed { int tp, pp, ep, etp, rc; char why[512]; } *placed;
    size_t nplaced, capplaced;
    int plans;                /* mt_train_plan_memory calls */
    int *stage_nd, *stage_nm; /* (L) the dense and MoE layers of each stage of the layout
                                 try_layout models (stage_layers, once for its settings) */
    char why[512];            /* why the first layout refused (in the checked order) was */
    char rule[MT_ERR_MSG_MAX]; /* why the configuration rules refused the first layout
                                 enumerated they refused (a key the namelists set, such as
                                 an overlap key, may refuse them all) */
    int bounded;              /* layouts found too big by a bound, without a plan */
    /* per TP x PP x VPP x ends x EP x ETP (the world fixes DP and EDP): the most a rank
     * holds whatever the micro-batch (parameters, master weights, gradients, optimizer
     * state, communication buffers, expert biases), from an exact plan: a lower bound
     * on the most loaded rank's total for every micro-batch size */
    struct fixed_part { int tp, pp, vpp, first, last, ep, etp; bool fp8; size_t bytes; } *parts;
    size_t nparts, capparts;
    int fixed[NFIX];          /* an axis given on the command line: 1, then its value */
    /* the recompute settings tried: the namelists' one when they or an override set
     * &recompute, else recompute_choices that the model takes */
    struct mt_config_recompute settings[NSETTINGS_MAX];
    int nsettings;
    bool searched;            /* settings are recompute_choices */
    int full;                 /* the setting that keeps the least (full, groups of 1);
                                 -1 when the setting is fixed */
    /* per layout without its recompute setting (the candidates of one are added
     * together): whether one of its settings fits, and the bound on the most loaded
     * rank's total that every setting has (bytes; 0 = not computed), with the plan of the
     * setting that keeps the least it comes from */
    struct kind { bool fits; size_t bound; struct mt_rank_memory full; } *kinds;
    size_t nkinds, capkinds;
    char **files, **overrides;
    int nfiles, noverrides;
    bool recompute_given;     /* an override sets a recompute% key */
    bool precision_given;     /* an override sets precision%fp8_format or fp4_format (''
                                 fixes BF16) */
    size_t nfp8;              /* kinds in FP8 */
    bool fp8_searched;        /* the namelists and overrides set no FP8/FP4 recipe: BF16 and
                                 the platform's FP8 recipe are tried */
};

/* cfg's layout keys for one layout. */
static void set_layout(struct mt_config *c, const struct layout *x, int gbs)
{
    struct mt_config_parallel *p = &c->parallel;
    p->tensor_model_parallel_size = x->tp;
    p->sequence_parallel = x->tp > 1;
    p->pipeline_model_parallel_size = x->pp;
    p->virtual_pipeline_model_parallel_size = x->vpp;
    p->decoder_first_pipeline_num_layers = x->first;
    p->decoder_last_pipeline_num_layers = x->last;
    p->context_parallel_size = 1;
    p->expert_model_parallel_size = x->ep;
    p->expert_tensor_parallel_size = x->etp;
    p->use_distributed_optimizer = true;
    c->training.micro_batch_size = x->mbs;
    c->training.global_batch_size = gbs;
}

/* cfg's layout keys for one process, where the model's sizes and the recompute
 * settings it takes are found: the overlap keys that need a parallel layout to overlap
 * with (the interleaved schedule, expert parallelism) and change no size are turned off
 * there, and kept for the candidates. */
static void set_one_process(struct mt_config *c)
{
    static const struct layout one = {.tp = 1, .pp = 1, .vpp = 1, .ep = 1, .etp = 1, .mbs = 1};
    set_layout(c, &one, 0);
    c->parallel.overlap_p2p_comm = c->parallel.overlap_p2p_comm_warmup_flush = false;
    c->moe.moe_shared_expert_overlap = false;
}

/* cfg's layout keys and recompute setting for x. */
static void set_candidate(const struct planner *pl, struct mt_config *c, const struct layout *x)
{
    set_layout(c, x, pl->gbs);
    c->recompute = pl->settings[x->rc];
    if (x->fp8) {
        snprintf(c->precision.fp8_format, sizeof c->precision.fp8_format, "e4m3");
        snprintf(c->precision.fp8_recipe, sizeof c->precision.fp8_recipe, "%s",
                 pl->gpu->fp8_recipe);
    }
}

/* Resolves the layout on pl->work; MT_OK when moetrain's rules accept it. */
static int resolve(struct planner *pl, const struct layout *x, struct mt_layout *l,
                   struct mt_err *err)
{
    memcpy(pl->work, pl->base, sizeof *pl->work);
    set_candidate(pl, pl->work, x);
    MT_CHECK(mt_config_resolve(pl->work, pl->world, l, err));
    return mt_model_check_config(pl->work, err);
}

/* Stage s's layers (every chunk): dense and MoE counts. */
static void stage_layers(const struct mt_config *c, int s, int *dense, int *moe)
{
    *dense = *moe = 0;
    for (int ch = 0; ch < c->parallel.virtual_pipeline_model_parallel_size; ch++) {
        int first = 0, n = 0;
        mt_config_pp_layers(c, s, ch, &first, &n);
        for (int i = first; i < first + n; i++) {
            if (c->moe.layer_freq[i])
                ++*moe;
            else
                ++*dense;
        }
    }
}

/* What &recompute makes the backward of stage s run again, per micro-batch token: the
 * forward FLOPs of what it rebuilds (a third of their training FLOPs), dense and
 * expert, and the forward's TP collectives and EP passes (dispatch and combine). The
 * shared expert's collectives are not counted, as in model_step. */
struct rebuild {
    double f_dense, f_moe, colls, ep_passes;
};

static void rebuild_cost(const struct mt_config *c, const struct model *m, int s, int nd,
                         int nm, struct rebuild *r)
{
    const struct mt_config_recompute *rc = &c->recompute;
    memset(r, 0, sizeof *r);
    if (strcmp(rc->granularity, "full") == 0) {
        const bool block = strcmp(rc->method, "block") == 0;
        for (int ch = 0; ch < c->parallel.virtual_pipeline_model_parallel_size; ch++) {
            int first = 0, n = 0;
            mt_config_pp_layers(c, s, ch, &first, &n);
            for (int i = first; i < first + n && (!block || i - first < rc->num_layers); i++) {
                const bool moe = c->moe.layer_freq[i] != 0;
                r->f_dense += (m->f_attn + m->f_core + (moe ? 0.0 : m->f_mlp)) / 3.0;
                r->f_moe += moe ? m->f_moe / 3.0 : 0.0;
                r->colls += moe ? 2.0 : 4.0;
                r->ep_passes += moe ? 2.0 : 0.0;
            }
        }
        return;
    }
    if (strcmp(rc->granularity, "selective") != 0) return;
    const int n = nd + nm;
    for (int i = 0; i < rc->modules_len; i++) {
        const char *mod = rc->modules[i];
        if (strcmp(mod, "core_attn") == 0) {
            r->f_dense += n * m->f_core / 3.0;
        } else if (strcmp(mod, "layernorm") == 0) { /* the norms' gathers */
            r->colls += n + nd;
        } else if (strcmp(mod, "mlp") == 0) { /* gate and up, and the gather */
            r->f_dense += nd * m->f_mlp * 2.0 / 9.0;
            r->colls += nd;
        } else if (strcmp(mod, "shared_experts") == 0) {
            r->f_dense += nm * 6.0 * m->H * m->Fs * 3.0 * 2.0 / 9.0;
        } else if (strcmp(mod, "moe") == 0) {
            r->f_moe += nm * m->f_moe / 3.0;
            r->ep_passes += 2.0 * nm;
        } /* moe_act: a SwiGLU, elementwise */
    }
}

/* Bytes one layer of a rank offloads per micro-batch of b tokens, as the trainer lays
 * them out in bf16 (src/model/model.c, plan_offload): the modules of c's
 * offload_modules that the layer saves (recompute rebuilds layernorm's gathered input,
 * core_attn's output and, with moe, the experts' tensors, so they are not offloaded);
 * the experts' at the rows their buffers are sized for (expert_buffer_factor times a
 * balanced load, or the capacity). */
static bool recomputes(const struct mt_config_recompute *r, const char *mod)
{
    for (int i = 0; strcmp(r->granularity, "selective") == 0 && i < r->modules_len; i++)
        if (strcmp(r->modules[i], mod) == 0) return true;
    return false;
}

/* Whether an MoE layer (moe) or a dense one saves module mod's input under r's
 * recompute setting, so that offloading it moves something (plan_offload's rules). */
static bool offloads(const struct mt_config_recompute *r, const char *mod, bool moe)
{
    if (strcmp(mod, "qkv_linear") == 0) return !recomputes(r, "layernorm");
    if (strcmp(mod, "attn_proj") == 0) return !recomputes(r, "core_attn");
    if (strcmp(mod, "expert_fc1") == 0 || strcmp(mod, "moe_act") == 0)
        return moe && !recomputes(r, "moe");
    return true;
}

static double offload_bytes(const struct mt_config *c, const struct model *m, double b, int tp,
                            bool moe)
{
    const struct mt_config_recompute *r = &c->recompute;
    if (!r->fine_grained_activation_offloading) return 0.0;
    const double f = c->moe.expert_capacity_factor > 0 ? c->moe.expert_capacity_factor
                                                       : c->moe.expert_buffer_factor;
    const double rows = f * b / tp * m->topk; /* a balanced load: etp x this x Fe / etp */
    double bytes = 0.0;
    for (int i = 0; i < r->offload_modules_len; i++) {
        const char *mod = r->offload_modules[i];
        if (!offloads(r, mod, moe)) continue;
        if (strcmp(mod, "attn_norm") == 0) bytes += b / tp * m->H;
        else if (strcmp(mod, "qkv_linear") == 0) bytes += b * m->H;
        else if (strcmp(mod, "core_attn") == 0) bytes += b * (m->Q + 2.0 * m->KV) / tp;
        else if (strcmp(mod, "attn_proj") == 0) bytes += b * m->Q / tp;
        else if (strcmp(mod, "mlp_norm") == 0) bytes += b / tp * m->H;
        else if (strcmp(mod, "expert_fc1") == 0) bytes += rows * m->H;
        else if (strcmp(mod, "moe_act") == 0) bytes += rows * 2.0 * m->Fe;
    }
    return bytes * WIRE_BYTES;
}

/* A ring all-gather or reduce-scatter over n ranks of `bytes` in all (each rank holds
 * bytes / n), at gbps GB/s: (n - 1) / n of it crosses each rank's link. */
static double ring(double bytes, int n, double gbps)
{
    return n > 1 ? (double)(n - 1) / n * bytes / (gbps * 1e9) : 0.0;
}

/* The gradient buckets of a class of `params` elements reduced over a group of n ranks
 * (none when n is 1), cut every &parallel ddp_bucket_size elements or, by default,
 * max(40M, 1M x n), as the optimizer cuts them (src/train/optim.c). */
static int dp_buckets(const struct mt_config *c, double params, int n)
{
    if (n <= 1 || params <= 0.0) return 0;
    const double cap = c->parallel.ddp_bucket_size > 0
                           ? (double)c->parallel.ddp_bucket_size
                           : fmax((double)MT_OPTIM_BUCKET_ELEMS, 1e6 * n);
    return (int)ceil(params / cap);
}

/* What &parallel overlap_p2p_comm hides of one stage's pipeline transfers in a step,
 * each transfer taking p and the passes of one model chunk fwd and bwd of compute (what
 * is free of other traffic): in the interleaved schedule's steady phase, each forward's
 * transfer runs beside the backward that follows it and each backward's beside the
 * next forward, but the last, which the flush's first backward waits for at once; with
 * overlap_p2p_comm_warmup_flush the warm-up's transfers run beside the next forward
 * and the flush's beside the next backward too, but the first input of a stage after
 * the first, the first gradient when every pass is in the warm-up, and the flush's
 * last transfer (src/train/train.c, doc/host-overhead.md). Each hides at most the pass
 * it runs beside. */
static double p2p_hidden(const struct mt_config *c, const struct layout *x, int s, double p,
                         double fwd, double bwd)
{
    const int passes = x->m * x->vpp; /* forward passes of a stage in a step */
    /* the warm-up's forwards, as src/train/train.c's il_warmup (Megatron's): every pass
     * when there are as many micro-batches as stages */
    int warm = x->m == x->pp ? passes : (x->pp - s - 1) * 2 + (x->vpp - 1) * x->pp;
    if (warm > passes) warm = passes;
    const int steady = passes - warm;
    const double f = fmin(p, fwd), bk = fmin(p, bwd);
    double hidden = steady * bk + (steady > 0 ? steady - 1 : 0) * f;
    if (c->parallel.overlap_p2p_comm_warmup_flush) {
        const int ahead = warm - (s > 0), flush = warm - 1 - (steady == 0);
        hidden += (ahead > 0 ? ahead : 0) * f + (flush > 0 ? flush : 0) * bk;
    }
    return hidden;
}

/* The step model of one resolved layout (pl->work): fills x's times and rates. With
 * the overlap keys, the traffic that runs beside compute is charged only where it
 * exceeds the compute that covers it (x->h_*, doc/plan.md "The step model"). */
static void model_step(const struct planner *pl, struct layout *x)
{
    const struct platform *g = pl->gpu;
    const struct model *m = &pl->model;
    const struct mt_config *c = pl->work;
    const double peak = g->bf16_tflops * 1e12;
    /* FP8 runs the GEMMs of the attention projections, dense MLPs and experts (routed
     * and shared) at the FP8 peak; the router, embedding, LM head and attention core, and
     * what recompute rebuilds, are counted at the BF16 peak */
    const double qpeak = c->precision.fp8_format[0] ? g->fp8_tflops * 1e12 : peak;
    const double nvl = g->nvlink_gbps * g->eff_link, net = g->net_gbps * g->eff_link;
    const double b = (double)x->mbs * m->T; /* tokens of a micro-batch */
    /* Placement keeps TP x CP and ETP x EP groups in a domain; a pipeline stays in one
     * when all of its stages' blocks fit one; data-parallel groups span the stage's
     * ranks, in one domain only when the whole job is. */
    int block = x->tp, e = x->ep * x->etp;
    while (block % e) block += x->tp; /* lcm */
    const double pp_bw = (long long)block * x->pp <= pl->domain ? nvl : net;
    const double dp_bw = pl->world <= pl->domain ? nvl : net;
    double worst = 0, w_c = 0, w_tp = 0, w_ep = 0, w_pp = 0, w_off = 0, dense_p = 0, expert_p = 0;
    double w_hep = 0, w_hpp = 0, cover_fwd = 0, cover_bwd = 0;
    for (int s = 0; s < x->pp; s++) {
        const int nd = pl->stage_nd[s], nm = pl->stage_nm[s], n = nd + nm;
        const bool last = s == x->pp - 1;
        double quant_f = n * m->f_attn + nd * m->f_mlp;
        struct rebuild rb;
        rebuild_cost(c, m, s, nd, nm, &rb);
        double t_c = b / x->tp *
                     (quant_f / (qpeak * g->eff_dense) +
                      ((last ? m->f_head : 0.0) + n * m->f_core + rb.f_dense) / (peak * g->eff_dense) +
                      nm * m->f_moe / (qpeak * g->eff_expert) + rb.f_moe / (peak * g->eff_expert));
        /* a micro-batch's forward (a third of its training compute) and backward (the
         * rest, with what recompute runs again) */
        const double fwd = b / x->tp *
                           (quant_f / (qpeak * g->eff_dense) +
                            ((last ? m->f_head : 0.0) + n * m->f_core) / (peak * g->eff_dense) +
                            nm * m->f_moe / (qpeak * g->eff_expert)) / 3.0;
        const double bwd = t_c - fwd;
        /* sequence parallel: all-gather and reduce-scatter of the activations around
         * attention and each dense MLP, forward and backward, and around the LM head */
        double colls = 4.0 * (n + nd) + (last ? 2.0 : 0.0) + rb.colls;
        double t_tp = x->tp > 1 ? colls * ring(b * m->H * WIRE_BYTES, x->tp, nvl) : 0.0;
        /* dispatch and combine, forward and backward; ETP gathers the rows it receives */
        double rows = b / x->tp * m->topk;
        double t_ep = 0.0, a2a = 0.0; /* a2a: one EP all-to-all of a MoE layer */
        if (nm > 0 && x->ep > 1) {
            t_ep += (4.0 * nm + rb.ep_passes) * (double)(x->ep - 1) / x->ep * rows * m->H *
                    WIRE_BYTES / (nvl * 1e9);
            a2a = (double)(x->ep - 1) / x->ep * rows * m->H * WIRE_BYTES / (nvl * 1e9);
        }
        if (nm > 0 && x->etp > 1)
            t_ep += (4.0 * nm + rb.ep_passes) * ring(x->etp * rows * m->H * WIRE_BYTES, x->etp, nvl);
        /* a transfer forward and one backward per model chunk */
        double t_pp = x->pp > 1 ? 2.0 * x->vpp * b / x->tp * m->H * WIRE_BYTES / (pp_bw * 1e9)
                                : 0.0;
        /* offloading: each layer's copy out runs beside the next layer's forward and
         * its copy back beside the backward of the layer above (a third and two thirds
         * of a layer's training time); only what exceeds them costs */
        double t_off = 0.0;
        const double host = g->host_gbps * g->eff_link * 1e9;
        for (int kind = 0; kind < 2 && c->recompute.fine_grained_activation_offloading; kind++) {
            const int layers = kind ? nm : nd;
            const double link = offload_bytes(c, m, b, x->tp, kind) / host;
            const double layer = b / x->tp *
                                 ((m->f_attn + (kind ? 0.0 : m->f_mlp)) / (qpeak * g->eff_dense) +
                                  m->f_core / (peak * g->eff_dense) +
                                  (kind ? m->f_moe / (qpeak * g->eff_expert) : 0.0));
            t_off += layers * (fmax(0.0, link - layer / 3.0) + fmax(0.0, link - 2.0 * layer / 3.0));
        }
        /* &moe moe_shared_expert_overlap: each EP all-to-all of a MoE layer runs beside
         * a part of the shared expert's GEMMs (gemm: one of them, forward; a backward
         * GEMM is as long): the forward dispatch beside gate and up, the combine beside
         * down, the backward dispatch beside 4 of the 6 backward GEMMs, the combine
         * beside the other 2; a MoE layer recompute rebuilds runs its forward pair again
         * (at the BF16 rate). The ETP exchanges around it stay blocking. */
        double h_ep = 0.0, h_ep_fwd = 0.0;
        if (c->moe.moe_shared_expert_overlap && a2a > 0.0) {
            const double gemm = b / x->tp * 2.0 * m->H * m->Fs / (qpeak * g->eff_expert);
            const double gemm_rb = b / x->tp * 2.0 * m->H * m->Fs / (peak * g->eff_expert);
            h_ep_fwd = nm * (fmin(a2a, 2.0 * gemm) + fmin(a2a, gemm));
            h_ep = h_ep_fwd + nm * (fmin(a2a, 4.0 * gemm) + fmin(a2a, 2.0 * gemm)) +
                   rb.ep_passes / 2.0 * (fmin(a2a, 2.0 * gemm_rb) + fmin(a2a, gemm_rb));
        }
        /* the compute free to cover other traffic: not already beside an all-to-all */
        const double free_fwd = fwd - h_ep_fwd, free_bwd = bwd - (h_ep - h_ep_fwd);
        double h_pp = 0.0;
        if (c->parallel.overlap_p2p_comm && x->pp > 1)
            h_pp = p2p_hidden(c, x, s, t_pp / (2.0 * x->vpp), free_fwd / x->vpp,
                              free_bwd / x->vpp) / x->m;
        double t = t_c + t_tp + (t_ep - h_ep) + (t_pp - h_pp) + t_off;
        if (t > worst) {
            worst = t;
            w_c = t_c;
            w_tp = t_tp;
            w_ep = t_ep - h_ep;
            w_pp = t_pp - h_pp;
            w_off = t_off;
            w_hep = h_ep;
            w_hpp = h_pp;
        }
        double dp_s = n * (m->p_attn / x->tp + 2.0 * m->H) + nd * m->p_mlp / x->tp +
                      nm * m->p_router_shared / x->tp +
                      ((s == 0) + last) * m->p_embed / x->tp;
        double ex_s = nm * m->p_experts / ((double)x->ep * x->etp);
        if (dp_s + ex_s > dense_p + expert_p) {
            dense_p = dp_s;
            expert_p = ex_s;
            cover_fwd = free_fwd;
            cover_bwd = free_bwd;
        }
    }
    x->compute = x->m * w_c;
    x->t_tp = x->m * w_tp;
    x->t_ep = x->m * w_ep;
    x->t_pp = x->m * w_pp;
    x->t_off = x->m * w_off;
    x->h_ep = x->m * w_hep;
    x->h_pp = x->m * w_hpp;
    x->bubble = (double)(x->pp - 1) / x->vpp * worst;
    x->t_dp = ring(dense_p * (GRAD_BYTES + GATHER_BYTES), x->dp, dp_bw) +
              ring(expert_p * (GRAD_BYTES + GATHER_BYTES), x->edp, dp_bw);
    /* overlap_grad_reduce: the buckets are reduced one after another as the last
     * micro-batch's backward produces them, evenly over it: all but the last hide
     * behind the backward still to run, as far as it lasts, so (n - 1) / n of the
     * shorter of the two is hidden. overlap_param_gather: the same with the all-gathers
     * started after the step and the first micro-batch's forward waiting for them in
     * turn. The stage is the one with the most parameters, whose traffic t_dp is. */
    x->nbuckets = dp_buckets(c, dense_p, x->dp) + dp_buckets(c, expert_p, x->edp);
    x->cover_fwd = cover_fwd;
    x->cover_bwd = cover_bwd;
    x->h_rs = x->h_ag = 0.0;
    const double share = x->nbuckets > 0 ? (x->nbuckets - 1.0) / x->nbuckets : 0.0;
    if (c->parallel.overlap_grad_reduce)
        x->h_rs = share * fmin(ring(dense_p * GRAD_BYTES, x->dp, dp_bw) +
                                   ring(expert_p * GRAD_BYTES, x->edp, dp_bw),
                               cover_bwd);
    if (c->parallel.overlap_param_gather)
        x->h_ag = share * fmin(ring(dense_p * GATHER_BYTES, x->dp, dp_bw) +
                                   ring(expert_p * GATHER_BYTES, x->edp, dp_bw),
                               cover_fwd);
    x->t_dp -= x->h_rs + x->h_ag;
    double owned = dense_p / x->dp + expert_p / x->edp;
    x->t_opt = (owned * OPT_BYTES_OWNED + (dense_p + expert_p) * OPT_BYTES_HELD) /
               (g->hbm_tbps * 1e12);
    x->step = x->compute + x->t_tp + x->t_ep + x->t_pp + x->t_off + x->bubble + x->t_dp + x->t_opt;
    x->tokens_s = (double)pl->gbs * m->T / x->step / pl->world;
    x->tflops = x->tokens_s * flops_per_token(m) / 1e12;
    const double comm = x->t_tp + x->t_ep + x->t_pp + x->t_dp + x->t_off;
    x->wall = x->compute >= comm && x->compute >= x->bubble ? "compute"
              : comm >= x->bubble                           ? "communication"
                                                            : "pipeline bubble";
}

static int add(struct planner *pl, const struct layout *x)
{
    if (pl->n == pl->cap) {
        size_t cap = pl->cap ? 2 * pl->cap : 1024;
        struct layout *p = realloc(pl->cands, cap * sizeof *p);
        if (!p) return MT_ENOMEM;
        pl->cands = p;
        pl->cap = cap;
    }
    pl->cands[pl->n++] = *x;
    return MT_OK;
}

/* Adds x (resolved on pl->work as l) as a kind of its own, once per setting with its
 * step model. MT_ENOMEM or MT_OK. */
static int add_kind(struct planner *pl, struct layout x, const struct mt_layout *l)
{
    if (pl->nkinds == pl->capkinds) {
        size_t cap = pl->capkinds ? 2 * pl->capkinds : 1024;
        struct kind *p = realloc(pl->kinds, cap * sizeof *p);
        if (!p) return MT_ENOMEM;
        pl->kinds = p;
        pl->capkinds = cap;
    }
    x.kid = (int)pl->nkinds;
    pl->kinds[pl->nkinds++] = (struct kind){.fits = false};
    pl->nfp8 += x.fp8;
    x.dp = l->dp;
    x.edp = l->edp;
    x.m = l->num_micro_batches;
    x.state = UNCHECKED;
    for (int i = 0; i < pl->nsettings; i++) {
        x.rc = i;
        pl->work->recompute = pl->settings[i];
        model_step(pl, &x);
        MT_CHECK(add(pl, &x));
    }
    return MT_OK;
}

/* Tries one layout: kept, once per recompute setting with its step model, when the
 * rules accept it, and again in the platform's FP8 recipe where they take it too
 * (check_low_precision; the platform's recipe is an FP8 one, which the CUDA backend runs
 * on tensor- and expert-tensor-parallel shards too; a kind of its own: its memory
 * differs). MT_ENOMEM or MT_OK. */
static int try_layout(struct planner *pl, struct layout x)
{
    struct mt_layout l;
    struct mt_err e = {0};
    pl->tried++;
    x.rc = 0;
    if (resolve(pl, &x, &l, &e) != MT_OK) { /* the same for every setting */
        if (!pl->rule[0]) snprintf(pl->rule, sizeof pl->rule, "%s", e.msg);
        return MT_OK;
    }
    for (int s = 0; s < x.pp; s++) stage_layers(pl->work, s, &pl->stage_nd[s], &pl->stage_nm[s]);
    MT_CHECK(add_kind(pl, x, &l));
    if (!pl->fp8_searched) return MT_OK;
    x.fp8 = true;
    if (resolve(pl, &x, &l, &e) != MT_OK) return MT_OK;
    return add_kind(pl, x, &l);
}

/* The uneven end stages for PP x VPP that balance the stages best (the LM head's work
 * on the last stage counted): Megatron's decoder_first/last_pipeline_num_layers, which
 * moetrain takes. *first = *last = 0 when the even split is as good or none is valid. */
static void best_ends(struct planner *pl, int pp, int vpp, int *first, int *last)
{
    const struct model *m = &pl->model;
    const struct platform *g = pl->gpu;
    struct mt_config *c = pl->work;
    memcpy(c, pl->resolved, sizeof *c);
    c->parallel.pipeline_model_parallel_size = pp;
    c->parallel.virtual_pipeline_model_parallel_size = vpp;
    const double layer = (m->f_attn + m->f_core) / g->eff_dense;
    const int L = m->L, per = (L + pp - 1) / pp;
    double best = HUGE_VAL;
    *first = *last = 0;
    for (int f = 0; f <= per && pp > 1; f++)
        for (int la = 0; la <= per; la++) {
            int rest = L - f - la, middle = pp - (f > 0) - (la > 0);
            if (rest < 0 || (middle == 0 && rest) ||
                (middle > 0 && (rest < middle || rest % (middle * vpp))) ||
                (!f && !la && L % (pp * vpp)))
                continue; /* mt_config_resolve's rule */
            c->parallel.decoder_first_pipeline_num_layers = f;
            c->parallel.decoder_last_pipeline_num_layers = la;
            double worst = 0;
            for (int s = 0; s < pp; s++) {
                int nd, nm;
                stage_layers(c, s, &nd, &nm);
                double t = (nd + nm) * layer + nd * m->f_mlp / g->eff_dense +
                           nm * m->f_moe / g->eff_expert +
                           (s == pp - 1 ? m->f_head / g->eff_dense : 0.0);
                if (t > worst) worst = t;
            }
            if (worst < best * (1 - 1e-12)) {
                best = worst;
                *first = f;
                *last = la;
            }
        }
}

/* Whether v is allowed on axis k (not fixed, or fixed to v). */
static bool allowed(const struct planner *pl, int k, int v)
{
    return pl->fixed[k] < 0 || pl->fixed[k] == v;
}

static int enumerate(struct planner *pl)
{
    const struct model *m = &pl->model;
    const int N = pl->world;
    for (int pp = 1; pp <= m->L && pp <= N; pp++) {
        if (N % pp || !allowed(pl, FIX_PP, pp)) continue;
        for (int vpp = 1; vpp * pp <= m->L && vpp <= MT_MAX_VPP; vpp++) {
            if (vpp > 1 && pp == 1) break;
            if (!allowed(pl, FIX_VPP, vpp)) continue;
            int first, last;
            best_ends(pl, pp, vpp, &first, &last);
            const bool ends_fixed = pl->fixed[FIX_FIRST] >= 0 || pl->fixed[FIX_LAST] >= 0;
            if (ends_fixed) {
                first = pl->fixed[FIX_FIRST] > 0 ? pl->fixed[FIX_FIRST] : 0;
                last = pl->fixed[FIX_LAST] > 0 ? pl->fixed[FIX_LAST] : 0;
            }
            for (int tp = 1; tp <= pl->domain && tp * pp <= N; tp++) {
                if (N % (tp * pp) || !allowed(pl, FIX_TP, tp)) continue;
                for (int ep = 1; ep <= (m->E > 0 ? m->E : 1); ep++) {
                    if ((m->E > 0 && (int)m->E % ep) || N % (ep * pp)) continue;
                    if (!allowed(pl, FIX_EP, ep)) continue;
                    for (int etp = 1; etp * ep <= pl->domain; etp++) {
                        if (N % (etp * ep * pp) || (m->E == 0 && etp > 1)) continue;
                        if (!allowed(pl, FIX_ETP, etp)) continue;
                        if (m->E > 0 && (int)m->Fe % etp) continue;
                        const int dp = N / (tp * pp);
                        const size_t nmbs = pl->fixed[FIX_MBS] > 0 ? 1 : sizeof mbs_choices /
                                                                         sizeof *mbs_choices;
                        for (size_t i = 0; i < nmbs; i++) {
                            const int mbs = pl->fixed[FIX_MBS] > 0 ? pl->fixed[FIX_MBS]
                                                                   : mbs_choices[i];
                            if (pl->gbs % ((long long)mbs * dp) || !allowed(pl, FIX_MBS, mbs))
                                continue;
                            struct layout x = {.tp = tp, .pp = pp, .vpp = vpp, .ep = ep,
                                               .etp = etp, .mbs = mbs};
                            if (!ends_fixed && try_layout(pl, x)) return MT_ENOMEM;
                            if (!first && !last && !ends_fixed) continue;
                            x.first = first;
                            x.last = last;
                            if (try_layout(pl, x)) return MT_ENOMEM;
                        }
                    }
                }
            }
        }
    }
    return MT_OK;
}

/* ---- pass 3: placement and memory -------------------------------------------------- */

static int cmp_step(const void *pa, const void *pb)
{
    const struct layout *a = pa, *b = pb;
    if (a->step != b->step) return a->step < b->step ? -1 : 1;
    /* equal models: the simpler layout first */
    int sa = a->tp * a->pp * a->vpp * a->ep * a->etp, sb = b->tp * b->pp * b->vpp * b->ep * b->etp;
    if (sa != sb) return sa < sb ? -1 : 1;
    if (a->mbs != b->mbs) return a->mbs - b->mbs;
    if (a->fp8 != b->fp8) return a->fp8 - b->fp8; /* BF16 first */
    if (a->kid != b->kid) return a->kid - b->kid;
    return a->rc - b->rc; /* the least recomputed first */
}

/* Whether moetrain's placement puts the layout on the cluster (cached). */
static int place(struct planner *pl, const struct layout *x, const struct mt_layout *l,
                 char *why, size_t len)
{
    for (size_t i = 0; i < pl->nplaced; i++) {
        const struct placed *p = &pl->placed[i];
        if (p->tp == x->tp && p->pp == x->pp && p->ep == x->ep && p->etp == x->etp) {
            snprintf(why, len, "%s", p->why);
            return p->rc;
        }
    }
    struct mt_err e = {0};
    struct mt_rank_layout rl;
    struct mt_topo_plan tp;
    int rc = mt_groups_build(&pl->work->parallel, l, &rl, &e);
    if (rc == MT_OK) {
        rc = mt_topo_place(&pl->cluster, &rl, "nvlink", &tp, &e);
        if (rc == MT_OK) mt_topo_plan_free(&tp);
        mt_groups_free(&rl);
    }
    if (rc == MT_ENOMEM) return rc;
    snprintf(why, len, "%s", rc ? e.msg : "");
    if (pl->nplaced == pl->capplaced) {
        size_t cap = pl->capplaced ? 2 * pl->capplaced : 64;
        struct placed *p = realloc(pl->placed, cap * sizeof *p);
        if (!p) return MT_ENOMEM;
        pl->placed = p;
        pl->capplaced = cap;
    }
    struct placed *p = &pl->placed[pl->nplaced++];
    *p = (struct placed){x->tp, x->pp, x->ep, x->etp, rc, ""};
    snprintf(p->why, sizeof p->why, "%s", why);
    return rc;
}

static double gib(size_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

static struct fixed_part *find_part(struct planner *pl, const struct layout *x)
{
    for (size_t i = 0; i < pl->nparts; i++) {
        struct fixed_part *f = &pl->parts[i];
        if (f->tp == x->tp && f->pp == x->pp && f->vpp == x->vpp && f->first == x->first &&
            f->last == x->last && f->ep == x->ep && f->etp == x->etp && f->fp8 == x->fp8)
            return f;
    }
    return NULL;
}

/* What rank r holds whatever the micro-batch size. */
static size_t fixed_bytes(const struct mt_rank_memory *r)
{
    return r->params + r->master + r->grads + r->optimizer + r->comm + r->other;
}

/* Sizes the most loaded ranks (see the top of this file) of x, resolved on pl->work as
 * l: the largest total in *worst, and in *floor the largest of what a rank holds whatever
 * the micro-batch plus its saved activations (the bound of check_layout, when x keeps
 * the least). Updates the fixed part of x's kind. MT_OK, or the setup's error (x is then
 * refused) in e. */
static int size_ranks(struct planner *pl, const struct layout *x, const struct mt_layout *l,
                      struct mt_rank_memory *worst, size_t *floor, struct mt_err *e)
{
    struct fixed_part *part = find_part(pl, x);
    const int per_stage = pl->world / x->pp; /* order tp-cp-ep-dp-pp: stage s starts there */
    const int stages[3] = {0, 1, x->pp - 1};
    worst->total = 0;
    *floor = 0;
    for (int i = 0; i < 3; i++) {
        if (stages[i] >= x->pp || (i > 0 && stages[i] <= stages[i - 1])) continue;
        struct mt_rank_memory r;
        pl->plans++;
        MT_CHECK(mt_train_plan_memory(pl->work, l, stages[i] * per_stage, &r, e));
        if (r.total > worst->total) *worst = r;
        if (fixed_bytes(&r) + r.activations > *floor) *floor = fixed_bytes(&r) + r.activations;
        if (!part || fixed_bytes(&r) > part->bytes) {
            if (!part) {
                if (pl->nparts == pl->capparts) {
                    size_t cap = pl->capparts ? 2 * pl->capparts : 256;
                    struct fixed_part *p = realloc(pl->parts, cap * sizeof *p);
                    if (!p) return mt_err_set(e, MT_ENOMEM, "plan: out of memory");
                    pl->parts = p;
                    pl->capparts = cap;
                }
                part = &pl->parts[pl->nparts++];
                *part = (struct fixed_part){x->tp, x->pp, x->vpp, x->first, x->last, x->ep,
                                            x->etp, x->fp8, 0};
            }
            part->bytes = fixed_bytes(&r);
        }
    }
    return MT_OK;
}

/* Places x and sizes its most loaded ranks, unless a bound says it is too big: the fixed
 * part of its TP x PP x VPP x ends x EP x ETP, or, when recompute is searched, what the
 * setting that keeps the least (full, groups of one layer) holds besides its recompute
 * buffer, which no setting of the same layout goes below. A setting of a layout another
 * setting of which fits already (faster: it was checked first) is SLOWER. */
static int check_layout(struct planner *pl, struct layout *x, struct mt_err *err)
{
    struct mt_layout l;
    struct mt_err e = {0};
    if (resolve(pl, x, &l, &e)) /* accepted in pass 1 */
        return mt_err_set(err, MT_ERUNTIME, "plan: a layout accepted before is refused: %s",
                          e.msg);
    char why[512];
    int rc = place(pl, x, &l, why, sizeof why);
    if (rc == MT_ENOMEM) return mt_err_set(err, rc, "plan: out of memory");
    if (rc) {
        x->state = REFUSED;
        if (!pl->why[0]) snprintf(pl->why, sizeof pl->why, "%s", why);
        return MT_OK;
    }
    struct kind *k = &pl->kinds[x->kid];
    if (k->fits) {
        x->state = SLOWER;
        return MT_OK;
    }
    if (x->rc == pl->full && k->bound) { /* planned for the bound of its other settings */
        x->worst = k->full;
        x->state = gib(x->worst.total) <= pl->usable_gib ? FITS : TOO_BIG;
        k->fits = x->state == FITS;
        if (k->fits && gib(x->worst.total) >= MEMORY_WALL * pl->usable_gib) x->wall = "memory";
        return MT_OK;
    }
    const struct fixed_part *part = find_part(pl, x);
    if (part && gib(part->bytes) > pl->usable_gib) {
        x->state = TOO_BIG;
        x->worst.total = part->bytes; /* at least */
        x->bound = true;
        pl->bounded++;
        return MT_OK;
    }
    size_t floor = 0;
    if (pl->full >= 0 && x->rc != pl->full && !k->bound) {
        struct layout f = *x;
        struct mt_rank_memory w;
        f.rc = pl->full;
        if (resolve(pl, &f, &l, &e))
            return mt_err_set(err, MT_ERUNTIME, "plan: a layout accepted before is refused: %s",
                              e.msg);
        rc = size_ranks(pl, &f, &l, &w, &floor, &e);
        if (rc == MT_ENOMEM) return mt_err_set(err, rc, "%s", e.msg);
        if (rc == MT_OK) {
            k->bound = floor;
            k->full = w;
        }
        if (resolve(pl, x, &l, &e))
            return mt_err_set(err, MT_ERUNTIME, "plan: a layout accepted before is refused: %s",
                              e.msg);
    }
    if (k->bound && gib(k->bound) > pl->usable_gib) {
        x->state = TOO_BIG;
        x->worst.total = k->bound; /* at least */
        x->bound = true;
        pl->bounded++;
        return MT_OK;
    } else {
        rc = size_ranks(pl, x, &l, &x->worst, &floor, &e);
        if (rc == MT_ENOMEM) return mt_err_set(err, rc, "%s", e.msg);
        if (rc) {
            x->state = REFUSED;
            if (!pl->why[0]) snprintf(pl->why, sizeof pl->why, "%s", e.msg);
            return MT_OK;
        }
        if (x->rc == pl->full) {
            k->bound = floor;
            k->full = x->worst;
        }
        x->state = gib(x->worst.total) <= pl->usable_gib ? FITS : TOO_BIG;
    }
    k->fits = x->state == FITS;
    if (x->state == FITS && gib(x->worst.total) >= MEMORY_WALL * pl->usable_gib)
        x->wall = "memory";
    return MT_OK;
}

/* ---- output ------------------------------------------------------------------------ */

/* "none", "selective core_attn+layernorm", "full uniform 1", ... */
static void recompute_name(const struct mt_config_recompute *r, char *buf, size_t n)
{
    int w = snprintf(buf, n, "%s", r->granularity);
    if (strcmp(r->granularity, "full") == 0)
        snprintf(buf + w, n - (size_t)w, " %s %d", r->method, r->num_layers);
    for (int i = 0; i < r->modules_len && (size_t)w < n; i++)
        w += snprintf(buf + w, n - (size_t)w, "%s%s", i ? "+" : " ", r->modules[i]);
    for (int i = 0; r->fine_grained_activation_offloading && i < r->offload_modules_len &&
                    (size_t)w < n; i++)
        w += snprintf(buf + w, n - (size_t)w, "%s%s", i ? "+" : ", offload ", r->offload_modules[i]);
}

static void layout_name(const struct planner *pl, const struct layout *x, char *buf, size_t n)
{
    char ends[48] = "", rc[320];
    if (x->first || x->last)
        snprintf(ends, sizeof ends, " (first %d, last %d layers)", x->first, x->last);
    recompute_name(&pl->settings[x->rc], rc, sizeof rc);
    char prec[40] = "";
    const struct mt_config_precision *q = &pl->base->precision;
    if (pl->fp8_searched)
        snprintf(prec, sizeof prec, ", %s%s", x->fp8 ? "FP8 " : "BF16", x->fp8 ? pl->gpu->fp8_recipe : "");
    else if (q->fp8_format[0]) /* the namelists' recipe */
        snprintf(prec, sizeof prec, ", FP8 %s", q->fp8_recipe);
    else if (q->fp4_format[0])
        snprintf(prec, sizeof prec, ", FP4 %s", q->fp4_recipe);
    snprintf(buf, n, "TP %d x PP %d x DP %d, VPP %d%s, EP %d x ETP %d x EDP %d, micro-batch %d "
                     "x %d%s, recompute %s",
             x->tp, x->pp, x->dp, x->vpp, ends, x->ep, x->etp, x->edp, x->mbs, x->m, prec, rc);
}

/* The --check command that checks x. */
/* 'a','b',... of n strings into buf (the namelist's list of strings). */
static const char *quoted_list(char *buf, size_t size, const char (*v)[MT_STR_MAX], int n)
{
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < n && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s'%s'", i ? "," : "", v[i]);
    return buf;
}

/* One argument of a printed command, quoted for a POSIX shell where it needs it: as it
 * is when every character is one the shell leaves alone, else in double quotes (which
 * keep the single quotes of namelist strings, precision%fp8_format='e4m3'), else in
 * single quotes with each ' written '\''. */
static void put_arg(FILE *out, const char *fmt, ...)
{
    char w[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w, sizeof w, fmt, ap);
    va_end(ap);
    const bool plain = w[0] && strspn(w, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                         "0123456789_%=./,:+@-") == strlen(w);
    if (plain) {
        fprintf(out, " %s", w);
    } else if (!strpbrk(w, "\"$`\\!")) {
        fprintf(out, " \"%s\"", w);
    } else {
        fputs(" '", out);
        for (const char *c = w; *c; c++) {
            if (*c == '\'') fputs("'\\''", out);
            else fputc(*c, out);
        }
        fputc('\'', out);
    }
}

/* The --check command of a layout, one line a user can paste into a shell. */
static void check_command(const struct planner *pl, const struct layout *x, FILE *out)
{
    fputs("    check: moetrain", out);
    put_arg(out, "--check");
    put_arg(out, "--world-size");
    put_arg(out, "%d", pl->world);
    for (int i = 0; i < pl->nfiles; i++) put_arg(out, "%s", pl->files[i]);
    for (int i = 0; i < pl->noverrides; i++) {
        bool axis = false;
        for (int k = 0; k < NFIX; k++) axis |= key_is(pl->overrides[i], axis_keys[k]);
        if (!axis) put_arg(out, "%s", pl->overrides[i]);
    }
    put_arg(out, "parallel%%tensor_model_parallel_size=%d", x->tp);
    if (x->tp > 1) put_arg(out, "parallel%%sequence_parallel=T");
    put_arg(out, "parallel%%pipeline_model_parallel_size=%d", x->pp);
    if (x->vpp > 1) put_arg(out, "parallel%%virtual_pipeline_model_parallel_size=%d", x->vpp);
    if (x->first) put_arg(out, "parallel%%decoder_first_pipeline_num_layers=%d", x->first);
    if (x->last) put_arg(out, "parallel%%decoder_last_pipeline_num_layers=%d", x->last);
    put_arg(out, "parallel%%expert_model_parallel_size=%d", x->ep);
    put_arg(out, "parallel%%expert_tensor_parallel_size=%d", x->etp);
    put_arg(out, "parallel%%use_distributed_optimizer=T");
    put_arg(out, "training%%micro_batch_size=%d", x->mbs);
    put_arg(out, "training%%global_batch_size=%d", pl->gbs);
    put_arg(out, "precision%%gpu_memory_gb=%.1f", floor(pl->usable_gib * 10) / 10);
    if (x->fp8) {
        put_arg(out, "precision%%fp8_format='e4m3'");
        put_arg(out, "precision%%fp8_recipe='%s'", pl->gpu->fp8_recipe);
    }
    const struct mt_config_recompute *r = &pl->settings[x->rc];
    /* searched: the namelists set no &recompute, so the setting's keys say it all */
    char list[512];
    if (pl->searched && strcmp(r->granularity, "none") != 0) {
        put_arg(out, "recompute%%granularity='%s'", r->granularity);
        if (strcmp(r->granularity, "full") == 0) {
            put_arg(out, "recompute%%method='%s'", r->method);
            put_arg(out, "recompute%%num_layers=%d", r->num_layers);
        }
        if (r->modules_len > 0)
            put_arg(out, "recompute%%modules=%s", quoted_list(list, sizeof list, r->modules, r->modules_len));
    }
    if (pl->searched && r->fine_grained_activation_offloading) {
        put_arg(out, "recompute%%fine_grained_activation_offloading=T");
        if (r->offload_modules_len > 0)
            put_arg(out, "recompute%%offload_modules=%s",
                    quoted_list(list, sizeof list, r->offload_modules, r->offload_modules_len));
    }
    fputc('\n', out);
}

/* What the overlap keys the namelists turn on hide, per term: its traffic in the step,
 * and how much of it runs beside compute (the modelled line's shares are of the rest). */
static void print_overlap(const struct planner *pl, const struct layout *x, FILE *out)
{
    const struct mt_config_parallel *p = &pl->base->parallel;
    const char *sep = "    overlap: "; /* " | " once a term is printed */
    if (pl->base->moe.moe_shared_expert_overlap) {
        fprintf(out, "%sEP all-to-all %.4g ms, %.4g hidden by moe_shared_expert_overlap", sep,
                1e3 * (x->t_ep + x->h_ep), 1e3 * x->h_ep);
        sep = " | ";
    }
    if (p->overlap_p2p_comm) {
        fprintf(out, "%sPP transfers %.4g ms, %.4g hidden by overlap_p2p_comm%s", sep,
                1e3 * (x->t_pp + x->h_pp), 1e3 * x->h_pp,
                p->overlap_p2p_comm_warmup_flush ? " and overlap_p2p_comm_warmup_flush" : "");
        sep = " | ";
    }
    if (p->overlap_grad_reduce) {
        fprintf(out, "%sDP %.4g ms in %d buckets, %.4g hidden by overlap_grad_reduce behind a "
                     "backward of %.4g ms",
                sep, 1e3 * (x->t_dp + x->h_rs + x->h_ag), x->nbuckets, 1e3 * x->h_rs,
                1e3 * x->cover_bwd);
        if (p->overlap_param_gather)
            fprintf(out, ", %.4g by overlap_param_gather behind a forward of %.4g ms",
                    1e3 * x->h_ag, 1e3 * x->cover_fwd);
        sep = " | ";
    }
    if (strcmp(sep, " | ") == 0) fputc('\n', out);
}

static void print_layout(const struct planner *pl, int *shown, const struct layout *x, FILE *out)
{
    char name[560];
    layout_name(pl, x, name, sizeof name);
    const double s = x->step;
    fputc('\n', out);
    if (x->state == FITS)
        fprintf(out, "%2d. %s\n", ++*shown, name);
    else
        fprintf(out, " -  %s: does not fit\n", name);
    char off[64] = "";
    if (pl->settings[x->rc].fine_grained_activation_offloading)
        snprintf(off, sizeof off, " | offload copies %.0f%%", 100 * x->t_off / s);
    fprintf(out, "    modelled: %.0f tokens/s/GPU, %.0f TFLOP/s/GPU, step %.3f s = compute %.0f%% "
                 "| TP %.0f%% | EP all-to-all %.0f%% | PP transfers %.0f%% | bubble %.0f%% | DP "
                 "%.0f%% | optimizer %.0f%%%s; wall: %s\n",
            x->tokens_s, x->tflops, s, 100 * x->compute / s, 100 * x->t_tp / s,
            100 * x->t_ep / s, 100 * x->t_pp / s, 100 * x->bubble / s, 100 * x->t_dp / s,
            100 * x->t_opt / s, off, x->wall);
    print_overlap(pl, x, out);
    const struct mt_rank_memory *r = &x->worst;
    char buf[48] = "", host[160] = "";
    if (r->offload) {
        snprintf(buf, sizeof buf, " | offload buffer %.2f", gib(r->offload));
        snprintf(host, sizeof host, "; offloaded to pinned host memory %.2f GiB, %zu bytes each "
                 "way per step", gib(r->offload_host), r->offload_step);
    }
    char lowp[128] = ""; /* FP8/FP4 copies saved for backward, per micro-batch */
    if (r->lowp_copies)
        snprintf(lowp, sizeof lowp, "; FP8 copies %.2f per micro-batch in place of %.2f",
                 gib(r->lowp_copies), gib(r->lowp_replaced));
    fprintf(out, "    memory, the most loaded rank (%lld, stage %lld), GiB: parameters %.2f | "
                 "master weights %.2f | gradients %.2f | optimizer state %.2f | activations "
                 "%.2f (%lld in flight%s) | recompute %.2f | pipeline %.2f | communication %.2f | "
                 "workspace %.2f | other %.2f%s | total %.2f (%zu bytes) of %.1f%s\n",
            r->rank, r->stage, gib(r->params), gib(r->master), gib(r->grads), gib(r->optimizer),
            gib(r->activations), r->inflight, lowp, gib(r->recompute), gib(r->pipeline), gib(r->comm),
            gib(r->workspace), gib(r->other), buf, gib(r->total), r->total, pl->usable_gib, host);
    check_command(pl, x, out);
}

/* ---- the command ------------------------------------------------------------------- */

static void usage(FILE *out)
{
    fputs("usage: moetrain plan --gpus N --gpu h100|h800|h200|b200|gb200|gb300 [--nodes-file F]\n"
          "                     [--global-batch G] [--top K] MODEL.nml [...] [group%key=value ...]\n"
          "\n"
          "Lists the layouts of the model on N GPUs that moetrain accepts and that fit the\n"
          "GPU's memory (sized as --check sizes them), fastest first by a modelled step time.\n"
          "\n"
          "  --gpus N           the job's GPUs (one process each)\n"
          "  --gpu NAME         the platform: peak, memory, NVLink domain and network\n"
          "  --nodes-file F     the cluster's nodes, 'hostname domain_key' a line (as moetrain\n"
          "                     topo --dry-run reads it); default: nodes of the platform's\n"
          "                     size in NVLink domains of its size\n"
          "  --global-batch G   sequences per iteration (default training%global_batch_size)\n"
          "  --top K            how many fitting layouts to print (default 5)\n"
          "\n"
          "See moetrain(1), PLAN, and doc/plan.md.\n",
          out);
}

static int bad(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "moetrain plan: error: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return 1;
}

/* A whole number in [lo, hi] from the option's value. */
static int number(const char *opt, const char *v, long lo, long hi, int *out)
{
    char *end;
    long n = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || n < lo || n > hi) {
        fprintf(stderr, "moetrain plan: error: %s needs a whole number from %ld to %ld%s%s%s\n",
                opt, lo, hi, v ? " (not '" : "", v ? v : "", v ? "')" : "");
        return 1;
    }
    *out = (int)n;
    return 0;
}

/* The described cluster: the nodes file, or whole nodes in domains of the platform's. */
static int describe_cluster(struct planner *pl, struct mt_err *err)
{
    const int G = pl->gpu->gpus_per_node;
    struct mt_topo_map map = {0};
    if (pl->nodes_file) {
        MT_CHECK(mt_topo_map_read(pl->nodes_file, &map, err));
        const int n = map.n;
        if ((long long)n * G != pl->world) {
            mt_topo_map_free(&map);
            return mt_err_set(err, MT_EINVAL,
                              "--nodes-file %s lists %d node%s of %d %s GPUs (%lld GPUs), but "
                              "--gpus is %d",
                              pl->nodes_file, n, n == 1 ? "" : "s", G, pl->gpu->name,
                              (long long)n * G, pl->world);
        }
    } else {
        if (pl->world % G) {
            return mt_err_set(err, MT_EINVAL,
                              "--gpus %d is not whole %s nodes of %d GPUs; give a multiple of "
                              "%d (or a --nodes-file)",
                              pl->world, pl->gpu->name, G, G);
        }
        map.n = pl->world / G;
        map.host = calloc((size_t)map.n, sizeof *map.host);
        map.key = calloc((size_t)map.n, sizeof *map.key);
        if (!map.host || !map.key) {
            mt_topo_map_free(&map);
            return mt_err_set(err, MT_ENOMEM, "out of memory");
        }
        const int per_domain = pl->gpu->domain / G;
        for (int i = 0; i < map.n; i++) {
            snprintf(map.host[i], sizeof map.host[i], "node%06d", i);
            snprintf(map.key[i], sizeof map.key[i], "nvlink%06d", i / per_domain);
        }
        pl->domain = pl->gpu->domain < pl->world ? pl->gpu->domain : pl->world;
    }
    int rc = mt_topo_cluster_describe(&map, G, NULL, "none", &pl->cluster, err);
    mt_topo_map_free(&map);
    if (rc || !pl->nodes_file) return rc;
    /* the smallest domain, in GPUs: from a placement of one-rank groups */
    struct mt_config_parallel p = pl->resolved->parallel;
    struct mt_layout l = {.world_size = pl->world, .tp = 1, .cp = 1, .pp = 1, .vpp = 1,
                          .ep = 1, .etp = 1, .dp = pl->world, .edp = pl->world,
                          .num_micro_batches = 1};
    struct mt_rank_layout rl;
    struct mt_topo_plan tp;
    MT_CHECK(mt_groups_build(&p, &l, &rl, err));
    rc = mt_topo_place(&pl->cluster, &rl, "nvlink", &tp, err);
    mt_groups_free(&rl);
    MT_CHECK(rc);
    pl->domain = tp.domain_size[0];
    for (int i = 1; i < tp.ndomains; i++)
        if (tp.domain_size[i] < pl->domain) pl->domain = tp.domain_size[i];
    mt_topo_plan_free(&tp);
    return MT_OK;
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

/* The offloading settings to try after the recompute ones: each recompute setting but
 * 'full' with the first, the first two and all of the modules the model has, in the
 * order of the bytes a layer saves per token (at TP 1: the expert modules at the buffer
 * factor's rows, weighed by the share of MoE layers), the largest first. */
static int offload_settings(struct planner *pl)
{
    const struct model *m = &pl->model;
    const struct mt_config *c = pl->resolved;
    const double f = c->moe.expert_capacity_factor > 0 ? c->moe.expert_capacity_factor
                                                       : c->moe.expert_buffer_factor;
    const double moe = m->L ? (double)m->nmoe / m->L : 0.0;
    const double per_token[NOFF] = {m->H, m->Q + 2.0 * m->KV, m->Q, m->H,
                                    f * m->topk * m->H * moe, f * m->topk * 2.0 * m->Fe * moe};
    int order[NOFF], n = 0;
    for (int i = 0; i < NOFF; i++) {
        if (per_token[i] <= 0.0) continue; /* the experts' modules without MoE layers */
        int j = n++;
        for (; j > 0 && per_token[order[j - 1]] < per_token[i]; j--) order[j] = order[j - 1];
        order[j] = i;
    }
    const int nrc = pl->nsettings;
    const int levels[OFFLOAD_LEVELS] = {1, 2, n};
    const bool has_moe = m->nmoe > 0;
    for (int r = 0; r < nrc; r++) {
        if (r == pl->full) continue;
        int moved = 0; /* modules that move something at the previous level */
        for (int lv = 0; lv < OFFLOAD_LEVELS; lv++) {
            if (levels[lv] > n || (lv > 0 && levels[lv] == levels[lv - 1])) continue;
            /* a level that adds nothing this recompute setting saves (moe's experts,
             * layernorm's qkv_linear, core_attn's attn_proj) would repeat one before */
            int moves = 0;
            for (int i = 0; i < levels[lv]; i++)
                moves += offloads(&pl->settings[r], offload_names[order[i]],
                                  has_moe && (order[i] == OFF_FC1 || order[i] == OFF_ACT));
            if (moves == moved) continue;
            moved = moves;
            struct mt_config_recompute s = pl->settings[r];
            s.fine_grained_activation_offloading = true;
            s.offload_modules_len = 0;
            for (int i = 0; i < levels[lv]; i++)
                snprintf(s.offload_modules[s.offload_modules_len++], MT_STR_MAX, "%s",
                         offload_names[order[i]]);
            struct mt_config *w = pl->work;
            memcpy(w, pl->base, sizeof *w);
            set_one_process(w);
            w->recompute = s;
            struct mt_layout l1;
            struct mt_err e = {0};
            if (mt_config_resolve(w, 1, &l1, &e) || mt_model_check_config(w, &e)) continue;
            pl->settings[pl->nsettings++] = w->recompute;
        }
    }
    return MT_OK;
}

/* The recompute settings to try: the namelists' (resolved) when they or an override set
 * &recompute, else the choices the model takes (mt_config_resolve's rules on one
 * process). */
static int recompute_settings(struct planner *pl, struct mt_err *err)
{
    pl->full = -1;
    pl->searched = !pl->recompute_given && strcmp(pl->base->recompute.granularity, "none") == 0;
    if (!pl->searched) {
        pl->settings[0] = pl->resolved->recompute;
        pl->nsettings = 1;
        return MT_OK;
    }
    struct mt_config *c = pl->work;
    pl->nsettings = 0;
    for (size_t i = 0; i < NRECOMPUTE; i++) {
        struct mt_config_recompute r = {0};
        snprintf(r.granularity, sizeof r.granularity, "%s", recompute_choices[i].granularity);
        snprintf(r.method, sizeof r.method, "%s", recompute_choices[i].method);
        r.num_layers = recompute_choices[i].num_layers;
        for (int j = 0; recompute_choices[i].modules[j]; j++)
            snprintf(r.modules[r.modules_len++], MT_STR_MAX, "%s",
                     recompute_choices[i].modules[j]);
        memcpy(c, pl->base, sizeof *c);
        set_one_process(c);
        c->recompute = r;
        struct mt_layout l1;
        struct mt_err e = {0};
        if (mt_config_resolve(c, 1, &l1, &e) || mt_model_check_config(c, &e))
            continue; /* a module the model does not have */
        if (strcmp(r.granularity, "full") == 0) pl->full = pl->nsettings;
        pl->settings[pl->nsettings++] = c->recompute;
    }
    if (pl->nsettings == 0)
        return mt_err_set(err, MT_EINVAL, "plan: the model takes no recompute setting");
    return offload_settings(pl);
}

static int run(struct planner *pl, FILE *out, struct mt_err *err)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* the model's derived sizes, from the namelists resolved on one process */
    struct mt_config *c = pl->work;
    memcpy(c, pl->base, sizeof *c);
    set_one_process(c);
    struct mt_layout l1;
    if (mt_config_resolve(c, 1, &l1, err) || mt_model_check_config(c, err))
        return mt_err_prefix(err, "the model");
    memcpy(pl->resolved, c, sizeof *c);
    model_facts(pl->resolved, &pl->model);
    pl->stage_nd = calloc(2 * (size_t)pl->model.L, sizeof *pl->stage_nd);
    if (!pl->stage_nd) return mt_err_set(err, MT_ENOMEM, "out of memory");
    pl->stage_nm = pl->stage_nd + pl->model.L;
    MT_CHECK(recompute_settings(pl, err));
    pl->fp8_searched = !pl->precision_given && !pl->base->precision.fp8_format[0] &&
                       !pl->base->precision.fp4_format[0];
    if (pl->gbs <= 0) {
        if (pl->base->training.global_batch_size <= 0)
            return mt_err_set(err, MT_EINVAL,
                              "no global batch: give --global-batch G (sequences per "
                              "iteration) or set training%%global_batch_size");
        pl->gbs = pl->base->training.global_batch_size;
    }
    pl->usable_gib = pl->base->precision.gpu_memory_gb > 0
                         ? pl->base->precision.gpu_memory_gb
                         : pl->gpu->hbm_gib - RESERVE_GIB;
    MT_CHECK(describe_cluster(pl, err));
    if (enumerate(pl)) return mt_err_set(err, MT_ENOMEM, "out of memory");
    const double t_enum = seconds_since(&t0);
    const struct model *m = &pl->model;
    fprintf(out, "moetrain plan: %d %s GPUs (NVLink domains of %d, %d a node), global batch %d "
                 "x %g tokens; %.2f GFLOP a token (forward and backward)\n",
            pl->world, pl->gpu->name, pl->domain, pl->gpu->gpus_per_node, pl->gbs, m->T,
            flops_per_token(m) / 1e9);
    char prec[160];
    if (pl->fp8_searched)
        snprintf(prec, sizeof prec, "BF16 and FP8 %s (fp8_format 'e4m3') where moetrain's "
                 "rules take it", pl->gpu->fp8_recipe);
    else
        snprintf(prec, sizeof prec, "precision as the namelists set it");
    /* the recompute settings, then the offloading levels tried with each but full */
    char settings[2048] = "";
    for (int i = 0, w = 0, lv = 0; i < pl->nsettings && w < (int)sizeof settings; i++) {
        const struct mt_config_recompute *r = &pl->settings[i];
        char one_rc[320];
        if (pl->searched && r->fine_grained_activation_offloading) {
            if (strcmp(r->granularity, "none") != 0) continue;
            w += snprintf(settings + w, sizeof settings - (size_t)w, "%s", lv++ ? "; " :
                          "; and with each setting but full, offloading ");
            for (int j = 0; j < r->offload_modules_len && w < (int)sizeof settings; j++)
                w += snprintf(settings + w, sizeof settings - (size_t)w, "%s%s", j ? "+" : "",
                              r->offload_modules[j]);
            continue;
        }
        recompute_name(r, one_rc, sizeof one_rc);
        w += snprintf(settings + w, sizeof settings - (size_t)w, "%s%s", i ? ", " : "", one_rc);
    }
    fprintf(out, "axes: TP, PP, VPP (even split, and the uneven end stages that balance best), "
                 "EP, ETP, micro-batch 1/2/4/8, recompute %s (%s); CP 1, the distributed "
                 "optimizer, %s; the namelists' layout "
                 "keys are replaced\n",
            pl->searched ? "searched" : "as the namelists and overrides set it", settings, prec);
    char in_fp8[48] = "";
    if (pl->fp8_searched) snprintf(in_fp8, sizeof in_fp8, " (%zu of them in FP8 too)", pl->nfp8);
    fprintf(out, "%lld layouts enumerated, %zu accepted by moetrain's configuration rules%s, "
                 "%zu with their precision, recompute and offloading settings (%.2f s)\n",
            pl->tried, pl->nkinds - pl->nfp8, in_fp8, pl->n, t_enum);
    if (pl->n == 0)
        return mt_err_set(err, MT_EINVAL,
                          "no layout of this model on %d GPUs is accepted with global batch %d: "
                          "the batch must divide by micro-batch x data-parallel size, heads and "
                          "experts by TP and EP (moetrain --check --world-size %d MODEL.nml "
                          "says why for a given layout; the first refused: %s)",
                          pl->world, pl->gbs, pl->world, pl->rule);
    qsort(pl->cands, pl->n, sizeof *pl->cands, cmp_step);
    int fit = 0, too_big = 0, refused = 0, slower = 0;
    size_t checked = 0;
    const struct layout *smallest = NULL;
    for (size_t i = 0; i < pl->n && fit < pl->top; i++, checked++) {
        MT_CHECK(check_layout(pl, &pl->cands[i], err));
        switch (pl->cands[i].state) {
        case FITS: fit++; break;
        case TOO_BIG:
            too_big++;
            if (!pl->cands[i].bound &&
                (!smallest || pl->cands[i].worst.total < smallest->worst.total))
                smallest = &pl->cands[i];
            break;
        case SLOWER: slower++; break;
        default: refused++; break;
        }
    }
    /* with nothing fitting yet, the rest are sized too: the message names the closest */
    fprintf(out, "%zu checked in that order until %d fit%s: %d fit, %d need more than %.1f GiB "
                 "(%d of them by a bound: the parameters and optimizer state their TP x PP x "
                 "VPP x EP x ETP holds whatever the micro-batch, or the activations no recompute "
                 "setting goes below), %d refused by placement or setup, %d passed over as "
                 "slower settings of a layout that fits with less recompute (%d memory plans, "
                 "%.2f s in all)\n",
            checked, pl->top, checked == pl->n && fit < pl->top ? " (all checked)" : "", fit,
            too_big, pl->usable_gib, pl->bounded, refused, slower, pl->plans,
            seconds_since(&t0));
    if (refused) {
        for (size_t i = 0; i < checked; i++)
            if (pl->cands[i].state == REFUSED) {
                char name[560];
                layout_name(pl, &pl->cands[i], name, sizeof name);
                fprintf(out, "  e.g. %s refused: %.300s\n", name, pl->why);
                break;
            }
    }
    const struct layout *fastest = &pl->cands[0];
    if (fastest->state == TOO_BIG && !fastest->bound) {
        char name[560];
        layout_name(pl, fastest, name, sizeof name);
        fprintf(out, "memory wall: the fastest layout by the model, %s (%.0f tokens/s/GPU), "
                     "needs %.2f GiB\n",
                name, fastest->tokens_s, gib(fastest->worst.total));
    }
    /* the fitting ones numbered; the first few that rank ahead of them but do not fit,
     * marked */
    int shown = 0, big = 0;
    for (size_t i = 0; i < checked; i++) {
        const struct layout *x = &pl->cands[i];
        if (x->state == FITS || (x->state == TOO_BIG && !x->bound && !shown && big++ < 3))
            print_layout(pl, &shown, x, out);
    }
    if (fit == 0) {
        char name[720] = "none could be placed";
        if (smallest) {
            char lay[560];
            layout_name(pl, smallest, lay, sizeof lay);
            snprintf(name, sizeof name, "the smallest, %s, needs %.2f GiB", lay,
                     gib(smallest->worst.total));
        }
        return mt_err_set(err, MT_EINVAL,
                          "the model fits no layout on %d %s GPUs: every layout's most loaded "
                          "rank needs more than %.1f GiB (%s); use more GPUs, a GPU with more "
                          "memory, a shorter training%%seq_length, or a smaller model",
                          pl->world, pl->gpu->name, pl->usable_gib, name);
    }
    return MT_OK;
}

int mt_plan_cli(int argc, char **argv)
{
    struct planner pl = {.top = 5};
    const char *gpu = NULL;
    pl.files = calloc((size_t)argc, sizeof *pl.files);
    pl.overrides = calloc((size_t)argc, sizeof *pl.overrides);
    pl.base = malloc(sizeof *pl.base);
    pl.work = malloc(sizeof *pl.work);
    pl.resolved = malloc(sizeof *pl.resolved);
    int rc = 1;
    if (!pl.files || !pl.overrides || !pl.base || !pl.work || !pl.resolved) {
        fprintf(stderr, "moetrain plan: error: out of memory\n");
        goto done;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
            goto done;
        } else if (!strcmp(a, "--gpus")) {
            if (number(a, v, 1, 10000000, &pl.world)) goto done;
            i++;
        } else if (!strcmp(a, "--global-batch")) {
            if (number(a, v, 1, 1000000000, &pl.gbs)) goto done;
            i++;
        } else if (!strcmp(a, "--top")) {
            if (number(a, v, 1, 1000, &pl.top)) goto done;
            i++;
        } else if (!strcmp(a, "--gpu")) {
            if (!v) {
                bad("--gpu needs a platform: h100, h800, h200, b200, gb200 or gb300%s%s", "", "");
                goto done;
            }
            gpu = v;
            i++;
        } else if (!strcmp(a, "--nodes-file")) {
            if (!v) {
                bad("--nodes-file needs a file of 'hostname domain_key' lines%s%s", "", "");
                goto done;
            }
            pl.nodes_file = v;
            i++;
        } else if (a[0] == '-' && a[1]) {
            bad("unknown option '%s'%s (moetrain plan --help)", a, "");
            goto done;
        } else if (mt_config_is_override(a)) {
            for (const char *const *k = refused_keys; *k; k++)
                if (key_is(a, *k)) {
                    bad("'%s': the plan sets %s itself (sequence parallelism with TP, CP 1, "
                        "the distributed optimizer; the batch is --global-batch)",
                        a, *k);
                    goto done;
                }
            for (int k = 0; k < NFIX; k++)
                if (key_is(a, axis_keys[k])) pl.fixed[k] = 1;
            if (!strncasecmp(a, "recompute%", 10)) pl.recompute_given = true;
            if (!strncasecmp(a, "precision%fp8_format", 20) || !strncasecmp(a, "precision%fp4_format", 20))
                pl.precision_given = true;
            pl.overrides[pl.noverrides++] = argv[i];
        } else {
            pl.files[pl.nfiles++] = argv[i];
        }
    }
    if (!gpu) {
        bad("--gpu is required: h100, h800, h200, b200, gb200 or gb300%s%s", "", "");
        goto done;
    }
    for (size_t i = 0; i < NPLATFORMS; i++)
        if (!strcasecmp(gpu, platforms[i].name)) pl.gpu = &platforms[i];
    if (!pl.gpu) {
        bad("--gpu '%s' is not a platform the plan knows: h100, h800, h200, b200, gb200 or "
            "gb300%s", gpu, "");
        goto done;
    }
    if (!pl.world) {
        bad("--gpus N is required (the job's GPUs)%s%s", "", "");
        goto done;
    }
    if (pl.nfiles == 0) {
        bad("no model namelist given (e.g. namelists/qwen3_30b_a3b.nml)%s%s", "", "");
        goto done;
    }
    struct mt_err err = {0};
    mt_config_defaults(pl.base);
    int rcl = mt_config_load(pl.base, pl.nfiles, pl.files, pl.noverrides, pl.overrides, &err);
    for (int k = 0; k < NFIX && rcl == MT_OK; k++)
        pl.fixed[k] = pl.fixed[k] ? fixed_value(pl.base, k) : -1;
    if (rcl || run(&pl, stdout, &err)) {
        fflush(stdout);
        fprintf(stderr, "moetrain plan: error: %s\n", err.msg);
        goto done;
    }
    rc = 0;
done:
    mt_topo_cluster_free(&pl.cluster);
    free(pl.cands);
    free(pl.placed);
    free(pl.parts);
    free(pl.kinds);
    free(pl.stage_nd);
    free(pl.files);
    free(pl.overrides);
    free(pl.base);
    free(pl.work);
    free(pl.resolved);
    return rc;
}

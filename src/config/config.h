/* moetrain: the typed configuration, filled from namelists by the schema table
 * (config.c). Every field here is a namelist key `&group key`; see
 * doc/moetrain.nml.5 or `moetrain --help-keys` for meaning, defaults and ranges.
 *
 * After mt_config_resolve() every "derived" default (0 in the table's doc) holds
 * its resolved value, so the struct is complete and --print-config round-trips. */
#ifndef MT_CONFIG_CONFIG_H
#define MT_CONFIG_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "util/error.h"

#define MT_MAX_LAYERS 1024
#define MT_MAX_DATA_PATHS 64
#define MT_STR_MAX 1024
/* The largest size or count the trainer computes with: widths, tokens of a
 * micro-batch, rows routed to experts and batch sizes are C ints (the kernels take
 * int sizes), so every one derived from the namelist must fit. */
#define MT_SIZE_MAX INT_MAX

struct mt_config_model {
    int num_layers;
    int hidden_size;
    int num_attention_heads;
    int num_query_groups;      /* KV heads (GQA); resolved: num_attention_heads if 0 */
    int kv_channels;           /* head dim; resolved: hidden_size / heads if 0 */
    int ffn_hidden_size;       /* dense MLP width; resolved: 4*hidden_size if 0 */
    int vocab_size;
    int max_position_embeddings;
    double rotary_base;
    double norm_epsilon;
    bool qk_layernorm;
    bool untie_embeddings_and_output_weights;
    double init_method_std;
};

struct mt_config_moe {
    int num_experts;                 /* 0: every layer is a dense MLP */
    int moe_ffn_hidden_size;         /* resolved: ffn_hidden_size if 0 */
    int router_topk;
    char router_score_function[16];  /* softmax | sigmoid */
    bool router_pre_softmax;
    double router_topk_scaling_factor;
    char router_dtype[8];            /* fp32 */
    int layer_freq[MT_MAX_LAYERS];   /* 1 = MoE layer, 0 = dense; resolved length num_layers */
    int layer_freq_len;
    char router_load_balancing_type[16]; /* aux_loss | seq_aux_loss | none */
    double aux_loss_coeff;
    double z_loss_coeff;
    bool router_enable_expert_bias;
    double router_bias_update_rate;
    bool router_force_load_balancing;
    double expert_capacity_factor;   /* 0: dropless */
    bool pad_expert_input_to_capacity;
    double expert_buffer_factor;     /* dropless EP buffers: x balanced rows; 0: worst case */
    char token_drop_policy[16];      /* probs | position */
    char token_dispatcher_type[16];  /* alltoall | allgather */
    int shared_expert_intermediate_size; /* 0: no shared expert */
    bool moe_shared_expert_overlap;  /* EP all-to-alls in flight during the shared expert */
    bool use_upcycling;              /* initialise from a dense model: experts = its MLP */
    bool moe_router_padding_for_fp8; /* each local expert's rows padded to the FP8 GEMM's alignment */
};

struct mt_config_parallel {
    int tensor_model_parallel_size;
    int pipeline_model_parallel_size;
    int virtual_pipeline_model_parallel_size;
    int decoder_first_pipeline_num_layers; /* 0: unset (Megatron None) */
    int decoder_last_pipeline_num_layers;  /* 0: unset */
    int context_parallel_size;
    int expert_model_parallel_size;
    int expert_tensor_parallel_size; /* resolved: tensor_model_parallel_size if 0 */
    char order[32];                  /* e.g. tp-cp-ep-dp-pp */
    bool sequence_parallel;
    bool use_distributed_optimizer;
    double distributed_timeout_minutes; /* bound on every collective */
    bool overlap_grad_reduce;        /* each gradient bucket reduced as backward finishes it */
    bool overlap_param_gather;       /* each bucket's all-gather waited for at first use */
    bool overlap_p2p_comm;           /* interleaved pipeline: transfers started ahead */
    bool overlap_p2p_comm_warmup_flush; /* ... in the warm-up and the flush too */
    int ddp_bucket_size;             /* gradient bucket, elements; 0: max(40M, 1M x DP) */
};

struct mt_config_training {
    int micro_batch_size;
    int global_batch_size;           /* resolved: micro_batch_size * dp if 0 */
    int seq_length;
    int train_iters;
    int seed;
    int eval_interval;
    int eval_iters;
    int exit_interval;               /* 0: never */
};

struct mt_config_optimizer {
    double lr;
    double min_lr;
    char lr_decay_style[16];         /* constant | linear | cosine */
    int lr_warmup_iters;
    int lr_decay_iters;              /* resolved: train_iters if 0 */
    double weight_decay;
    double adam_beta1;
    double adam_beta2;
    double adam_eps;
    double clip_grad;                /* 0: no clipping */
};

struct mt_config_precision {
    char params_dtype[8];            /* fp32 | bf16 */
    double gpu_memory_gb;            /* GiB per GPU for the memory check; 0: none */
    /* low-precision GEMMs (doc/fp8.md); Megatron/Transformer Engine names */
    char fp8_format[8];              /* '' (off) | e4m3 | hybrid */
    char fp8_recipe[16];             /* delayed | tensorwise | blockwise | mxfp8 */
    int fp8_margin;                  /* delayed: scale = fmax / amax / 2^margin */
    int fp8_amax_history_len;        /* delayed: steps of amax kept per tensor */
    char fp8_amax_compute_algo[16];  /* delayed: max | most_recent */
    char fp4_format[8];              /* '' (off) | e2m1 */
    char fp4_recipe[8];              /* nvfp4 */
    bool first_last_layers_bf16;     /* keep the first/last layers' GEMMs unquantised */
    int num_layers_at_start_in_bf16;
    int num_layers_at_end_in_bf16;
};

/* Activation recompute (Megatron's --recompute-*): what a layer's forward keeps for its
 * backward and what the backward rebuilds (doc/memory.md, Recompute). */
#define MT_RECOMPUTE_MODULES 6  /* core_attn, moe_act, layernorm, mlp, moe, shared_experts */
#define MT_OFFLOAD_MODULES 7    /* attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm,
                                   expert_fc1, moe_act */
struct mt_config_recompute {
    char granularity[16];            /* none | selective | full */
    char method[8];                  /* full: uniform | block; none otherwise */
    int num_layers;                  /* full: layers per group (uniform) or recomputed per
                                        chunk (block); 0 otherwise */
    char modules[MT_RECOMPUTE_MODULES][MT_STR_MAX]; /* selective; resolved: core_attn if empty */
    int modules_len;
    /* Activation offloading (Megatron's --fine-grained-activation-offloading,
     * --offload-modules): saved tensors copied to pinned host memory in forward and
     * back in backward (doc/memory.md, Activation offloading) */
    bool fine_grained_activation_offloading;
    char offload_modules[MT_OFFLOAD_MODULES][MT_STR_MAX]; /* attn_norm ... moe_act */
    int offload_modules_len;
};

struct mt_config_data {
    char data_path[MT_MAX_DATA_PATHS][MT_STR_MAX]; /* [weight] prefix [weight prefix ...] */
    int data_path_len;
    char split[64];                  /* e.g. 969,30,1 */
    bool mock_data;
    char data_cache_path[MT_STR_MAX];
};

struct mt_config_checkpoint {
    char save[MT_STR_MAX];
    char load[MT_STR_MAX];
    char load_hf[MT_STR_MAX];        /* initial weights: a Hugging Face directory */
    int save_interval;
    int keep_last;                   /* 0: keep all */
    bool load_optional;              /* a load dir without a checkpoint: start fresh */
    bool async_save;                 /* write saves from a host snapshot in the background */
};

struct mt_config_logging {
    int log_interval;
    char metrics_file[MT_STR_MAX];
    bool log_memory;
};

struct mt_config_topology {
    char nvlink_domain_source[16];   /* auto | nvml | slurm | host | file */
    char placement[24];              /* nvlink | nvlink-besteffort | linear */
    char domain_map_file[MT_STR_MAX];
    char hwloc_xml[MT_STR_MAX];
};

struct mt_config_host {
    char cpu_affinity[8];            /* gpu | numa | none */
    bool numa_membind;
    bool manual_gc;                  /* host memory released only at chosen steps */
    int manual_gc_interval;          /* steps between releases; 0 = none between steps */
    bool manual_gc_eval;             /* a release before and after each evaluation */
};

/* CUDA graphs (Megatron's --cuda-graph-impl, --cuda-graph-modules, --cuda-graph-warmup-steps;
 * doc/host-overhead.md, CUDA graphs). */
#define MT_CUDA_GRAPH_MODULES 5 /* attn, mlp, moe, moe_router, moe_preprocess */
struct mt_config_cuda_graph {
    char impl[16];                   /* none | local | full_iteration */
    char modules[MT_CUDA_GRAPH_MODULES][MT_STR_MAX]; /* resolved: the default if empty */
    int modules_len;
    int warmup_steps;                /* iterations run eagerly before the scopes are captured */
};

struct mt_config {
    struct mt_config_model model;
    struct mt_config_moe moe;
    struct mt_config_parallel parallel;
    struct mt_config_training training;
    struct mt_config_optimizer optimizer;
    struct mt_config_precision precision;
    struct mt_config_recompute recompute;
    struct mt_config_data data;
    struct mt_config_checkpoint checkpoint;
    struct mt_config_logging logging;
    struct mt_config_topology topology;
    struct mt_config_host host;
    struct mt_config_cuda_graph cuda_graph;
};

/* Derived layout facts, computed by mt_config_resolve for a world size. */
struct mt_layout {
    int world_size;
    int tp, cp, pp, vpp, ep, etp;
    int dp;          /* world / (tp*cp*pp) */
    int edp;         /* world / (etp*ep*pp) */
    int num_micro_batches; /* global_batch / (micro_batch * dp) */
};

/* Fills cfg with every default. */
void mt_config_defaults(struct mt_config *cfg);

/* The file a namelist argument names, into path: name itself when it exists (or is
 * absolute); else name, less a leading "namelists/", in $MOETRAIN_NAMELISTS, then in
 * the installed $(pkgdatadir)/namelists (found from the executable's own directory,
 * then as configured). MT_EIO with every place looked at when it is nowhere. */
int mt_config_find_namelist(const char *name, char *path, size_t len, struct mt_err *err);

/* Whether a command-line argument is an override ("group%key=value": a '%' before the
 * first '='), not a namelist file. */
static inline bool mt_config_is_override(const char *a)
{
    const char *pct = strchr(a, '%'), *eq = strchr(a, '=');
    return pct && eq && pct < eq;
}

/* Loads namelist files in order (found by mt_config_find_namelist), then overrides
 * ("group%key=value"), into cfg (which should hold defaults first). Errors name
 * file:line:col or the override. */
int mt_config_load(struct mt_config *cfg, int nfiles, char *const files[],
                   int noverrides, char *const overrides[], struct mt_err *err);

/* The rules of the compute backend (kernels.h name: "cpu", "cuda", "guard", "plan") on
 * a resolved configuration: activation offloading needs a backend whose memory is not
 * host memory already (not "cpu"). */
int mt_config_check_backend(const struct mt_config *cfg, const char *backend, struct mt_err *err);

/* Whether the FP8/FP4 recipe configured runs on a GPU (its name, compute capability
 * major.minor): MT_EUNSUPPORTED naming the GPU, the recipe, what it needs and the
 * recipe that fits the GPU. MT_OK without a recipe. */
int mt_config_check_recipe_gpu(const struct mt_config *cfg, const char *gpu, int major, int minor,
                               struct mt_err *err);

/* &moe moe_router_padding_for_fp8: the row alignment each local expert's rows are
 * padded to (16 for the FP8 recipes, 32 for MXFP8), 0 when off. */
int mt_config_expert_padding(const struct mt_config *cfg);

/* Resolves derived defaults and checks every cross-field rule for world_size
 * processes; fills layout. Errors name the keys and the numbers involved. */
int mt_config_resolve(struct mt_config *cfg, int world_size, struct mt_layout *layout,
                      struct mt_err *err);

/* Megatron's pipeline layer layout: the layers of model chunk `chunk` (0..vpp-1) of
 * pipeline stage `stage` (0..pp-1), in a resolved config: *first_layer and *count.
 * Chunks are laid out chunk-major (chunk 0 of every stage, then chunk 1, ...), each
 * stage's layers split evenly over its chunks; decoder_first/last_pipeline_num_layers
 * give the first/last stage their own count, the rest split evenly over the others. */
void mt_config_pp_layers(const struct mt_config *cfg, int stage, int chunk, int *first_layer,
                         int *count);

/* &data data_path, read as Megatron's get_blend_from_list reads --data-path: the
 * elements are split at blanks into words; an even number of words whose 1st, 3rd,
 * ... are all numbers is weight/prefix pairs (a weighted blend), anything else is
 * prefixes only (one prefix, or an unweighted blend: one epoch of each, blended by
 * size). A weight must be finite and > 0 and the weights' sum finite; they are
 * normalised to sum 1 (0 when unweighted). The one rule both --check (through
 * mt_config_resolve) and the data loader apply. */
struct mt_data_blend {
    int n;                                      /* datasets */
    bool weighted;
    double weight[MT_MAX_DATA_PATHS];
    char prefix[MT_MAX_DATA_PATHS][MT_STR_MAX];
};
int mt_config_data_blend(const struct mt_config_data *d, struct mt_data_blend *out,
                         struct mt_err *err);

/* &data split, as Megatron's parse_and_normalize_split: up to three finite,
 * non-negative numbers (train, valid, test; missing ones are 0) separated by ',',
 * '/' or blanks, with a finite sum > 0; normalised to sum 1. */
int mt_config_data_split(const char *split, double vec[3], struct mt_err *err);

/* Writes the whole configuration as namelist groups (gfortran-readable). */
int mt_config_print(const struct mt_config *cfg, FILE *out);
#endif

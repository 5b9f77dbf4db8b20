#include "config/schema.h"

#include <float.h>
#include <limits.h>
#include <string.h>

#include "config/config.h"

#define OFF(g, k) offsetof(struct mt_config, g.k)
#define SZ(g, k) sizeof(((struct mt_config *)0)->g.k)

#define KINT(g, k, def, lo, hi, d)                                                       \
    { #g, #k, MT_KEY_INT, OFF(g, k), 0, 0, def, 0, NULL, lo, hi, 0, 0, NULL, d }
#define KREAL(g, k, def, lo, hi, d)                                                      \
    { #g, #k, MT_KEY_REAL, OFF(g, k), 0, 0, 0, def, NULL, 0, 0, lo, hi, NULL, d }
#define KBOOL(g, k, def, d)                                                              \
    { #g, #k, MT_KEY_BOOL, OFF(g, k), 0, 0, def, 0, NULL, 0, 1, 0, 0, NULL, d }
#define KENUM(g, k, def, ch, d)                                                          \
    { #g, #k, MT_KEY_ENUM, OFF(g, k), SZ(g, k), 0, 0, 0, def, 0, 0, 0, 0, ch, d }
#define KSTR(g, k, def, d)                                                               \
    { #g, #k, MT_KEY_STRING, OFF(g, k), SZ(g, k), 0, 0, 0, def, 0, 0, 0, 0, NULL, d }
#define KIARR(g, k, fill, lo, hi, d)                                                     \
    { #g, #k, MT_KEY_INT_ARRAY, OFF(g, k), SZ(g, k) / sizeof(int), OFF(g, k##_len), fill, \
      0, NULL, lo, hi, 0, 0, NULL, d }
#define KSARR(g, k, d)                                                                   \
    { #g, #k, MT_KEY_STRING_ARRAY, OFF(g, k), SZ(g, k) / MT_STR_MAX, OFF(g, k##_len), 0, \
      0, "", 0, 0, 0, 0, NULL, d }

#define IMAX INT_MAX
#define RMAX DBL_MAX

const struct mt_key mt_schema[] = {
    /* &model */
    KINT(model, num_layers, 2, 1, MT_MAX_LAYERS, "number of transformer layers"),
    KINT(model, hidden_size, 64, 1, IMAX, "model width (H)"),
    KINT(model, num_attention_heads, 4, 1, IMAX, "query heads"),
    KINT(model, num_query_groups, 0, 0, IMAX,
         "key/value heads for GQA; 0 = num_attention_heads (plain multi-head)"),
    KINT(model, kv_channels, 0, 0, IMAX,
         "head dimension; 0 = hidden_size / num_attention_heads"),
    KINT(model, ffn_hidden_size, 0, 0, IMAX,
         "dense SwiGLU MLP width; 0 = 4 * hidden_size"),
    KINT(model, vocab_size, 257, 2, IMAX,
         "vocabulary size (257 for moetrain-preprocess's byte tokenizer)"),
    KINT(model, max_position_embeddings, 4096, 1, IMAX,
         "longest sequence RoPE is set up for; seq_length must not exceed it"),
    KREAL(model, rotary_base, 10000.0, 1.0, RMAX, "RoPE theta"),
    KREAL(model, norm_epsilon, 1e-5, 0.0, 1.0, "RMSNorm epsilon"),
    KBOOL(model, qk_layernorm, 0, "per-head RMSNorm on queries and keys before RoPE (Qwen3)"),
    KBOOL(model, untie_embeddings_and_output_weights, 1,
          "separate LM head; .false. ties it to the input embedding"),
    KREAL(model, init_method_std, 0.02, 0.0, RMAX,
          "std of the normal init; output projections use std/sqrt(2*num_layers)"),

    /* &moe */
    KINT(moe, num_experts, 0, 0, IMAX, "routed experts per MoE layer; 0 = dense model"),
    KINT(moe, moe_ffn_hidden_size, 0, 0, IMAX, "expert SwiGLU width; 0 = ffn_hidden_size"),
    KINT(moe, router_topk, 2, 1, IMAX, "experts per token"),
    KENUM(moe, router_score_function, "softmax", "softmax|sigmoid", "router score function"),
    KBOOL(moe, router_pre_softmax, 0,
          "softmax over all experts before top-k (no renormalisation); .false. renormalises "
          "the top-k probabilities"),
    KREAL(moe, router_topk_scaling_factor, 1.0, 0.0, RMAX,
          "multiplies the routing weights of the selected experts"),
    KENUM(moe, router_dtype, "fp32", "fp32", "precision of router logits and scores"),
    KIARR(moe, layer_freq, 1, 0, 1,
          "per layer: 1 = MoE, 0 = dense MLP; empty = every layer MoE; length num_layers"),
    KENUM(moe, router_load_balancing_type, "aux_loss", "aux_loss|seq_aux_loss|none",
          "load-balancing loss"),
    KREAL(moe, aux_loss_coeff, 0.0, 0.0, RMAX, "weight of the load-balancing loss"),
    KREAL(moe, z_loss_coeff, 0.0, 0.0, RMAX, "weight of the router z-loss"),
    KBOOL(moe, router_enable_expert_bias, 0,
          "aux-loss-free balancing: a per-expert bias added to scores for selection only"),
    KREAL(moe, router_bias_update_rate, 1e-3, 0.0, RMAX,
          "step of the expert-bias update after each iteration"),
    KBOOL(moe, router_force_load_balancing, 0,
          "benchmarks only: route tokens evenly regardless of the router"),
    KREAL(moe, expert_capacity_factor, 0.0, 0.0, RMAX,
          "0 = dropless; else capacity per expert = factor * tokens * topk / num_experts"),
    KBOOL(moe, pad_expert_input_to_capacity, 0,
          "pad every expert's input to its capacity (needs expert_capacity_factor)"),
    KREAL(moe, expert_buffer_factor, 2.0, 0.0, RMAX,
          "dropless expert-parallel dispatch (expert_capacity_factor = 0): the expert-side "
          "buffers hold this many times the rows a balanced routing brings to a rank's "
          "experts (at most the worst case); a step that brings more takes the overflow "
          "from the allocator for that step and counts it in the log (like "
          "expert_capacity_factor, but nothing is dropped); 0 = size for the worst case, "
          "every expert-parallel source sending all its tokens to this rank"),
    KENUM(moe, token_drop_policy, "probs", "probs|position",
          "which tokens are dropped over capacity: lowest probability or latest position"),
    KENUM(moe, token_dispatcher_type, "alltoall", "alltoall|allgather",
          "how tokens reach experts on other expert-parallel ranks"),
    KINT(moe, shared_expert_intermediate_size, 0, 0, IMAX,
         "width of the shared expert applied to every token; 0 = none"),
    KBOOL(moe, moe_shared_expert_overlap, 0,
          "all-to-all dispatcher with expert_model_parallel_size > 1 and a shared expert: "
          "start each expert-parallel all-to-all and compute the shared expert while it is in "
          "flight (its gate/up and activation during the dispatch, its down projection during "
          "the combine, its down, activation and gate gradients during the gradients' dispatch, "
          "its up gradients during the backward combine), then wait for it (Megatron's "
          "--moe-shared-expert-overlap). Results are the same, bit for bit; costs one "
          "micro-batch tokens x shared_expert_intermediate_size / TP fp32 buffer "
          "(doc/host-overhead.md, Overlap)"),
    KBOOL(moe, use_upcycling, 0,
          ".true.: initialise this MoE model from a dense model's weights (checkpoint%load_hf, "
          "else the checkpoint checkpoint%load finds), every routed expert a copy of the dense "
          "MLP, routers initialised as usual, optimizer state fresh, iteration 0 (Megatron's "
          "--moe-use-upcycling, default strategy): moe_ffn_hidden_size must equal the dense "
          "ffn_hidden_size and every other &model key the dense model's; no shared expert"),
    KBOOL(moe, moe_router_padding_for_fp8, 0,
          "pad each local expert's rows with zero rows to the FP8 GEMM's alignment, 16 (32 "
          "with fp8_recipe = 'mxfp8'), so its quantised GEMMs see aligned shapes (Megatron's "
          "--moe-router-padding-for-fp8); results unchanged. Needs an FP8 recipe; not with "
          "fp4_format, pad_expert_input_to_capacity or the allgather dispatcher"),

    /* &parallel */
    KINT(parallel, tensor_model_parallel_size, 1, 1, IMAX, "tensor parallel size (TP)"),
    KINT(parallel, pipeline_model_parallel_size, 1, 1, IMAX, "pipeline stages (PP)"),
    KINT(parallel, virtual_pipeline_model_parallel_size, 1, 1, IMAX,
         "model chunks per pipeline stage (VPP)"),
    KINT(parallel, decoder_first_pipeline_num_layers, 0, 0, IMAX,
         "transformer layers on the first pipeline stage (uneven stages); 0 = even split"),
    KINT(parallel, decoder_last_pipeline_num_layers, 0, 0, IMAX,
         "transformer layers on the last pipeline stage (uneven stages); 0 = even split"),
    KINT(parallel, context_parallel_size, 1, 1, IMAX, "context parallel size (CP)"),
    KINT(parallel, expert_model_parallel_size, 1, 1, IMAX, "expert parallel size (EP)"),
    KINT(parallel, expert_tensor_parallel_size, 0, 0, IMAX,
         "tensor parallel size inside each expert (ETP); 0 = tensor_model_parallel_size"),
    KSTR(parallel, order, "tp-cp-ep-dp-pp",
         "rank order of the parallel dimensions, fastest first: tp, cp, ep, dp in any order, "
         "then pp, which must come last (as Megatron requires: otherwise expert-data-parallel "
         "groups span pipeline stages); a dimension of size 1 may be left out"),
    KBOOL(parallel, sequence_parallel, 0,
          "split norms, residuals and dropout-free regions along the sequence across TP ranks "
          "(required with TP > 1 and MoE)"),
    KBOOL(parallel, use_distributed_optimizer, 0,
          "ZeRO-1: shard fp32 master weights and Adam state over data-parallel ranks"),
    KREAL(parallel, distributed_timeout_minutes, 10.0, 0.0, RMAX,
          "a collective waiting longer than this fails the job with a message naming it; 0 = "
          "wait forever"),
    KBOOL(parallel, overlap_grad_reduce, 0,
          "start each gradient bucket's data-parallel reduction (reduce-scatter with ZeRO-1, "
          "else all-reduce) as soon as the last micro-batch's backward has finished every "
          "gradient in it, while backward goes on; all are waited for before the optimizer "
          "step. Results are the same, bit for bit (doc/host-overhead.md, Overlap)"),
    KBOOL(parallel, overlap_param_gather, 0,
          "with ZeRO-1: start the all-gather of the updated parameters after the step and wait "
          "for each bucket only before the next forward first uses its parameters; needs "
          "use_distributed_optimizer and overlap_grad_reduce (as Megatron)"),
    KBOOL(parallel, overlap_p2p_comm, 0,
          "interleaved pipeline schedule (virtual_pipeline_model_parallel_size > 1): in the "
          "steady 1F1B phase, start each forward's send and the next input's receive before "
          "the backward that follows, and wait for them just before their data is used "
          "(Megatron's --overlap-p2p-communication). Results are the same, bit for bit "
          "(doc/host-overhead.md, Overlap)"),
    KBOOL(parallel, overlap_p2p_comm_warmup_flush, 0,
          "with overlap_p2p_comm: the warm-up's and the flush's transfers started ahead too: "
          "each forward's send (each backward's in the flush) waited for after the next "
          "pass, the next input's (gradient's) receive started before the pass and waited "
          "for when it is used (Megatron's --overlap-p2p-communication-warmup-flush). "
          "Results are the same, bit for bit (doc/host-overhead.md, Overlap)"),
    KINT(parallel, ddp_bucket_size, 0, 0, IMAX,
         "elements per gradient bucket of the data-parallel reduction (Megatron's "
         "--ddp-bucket-size); 0 = max(40000000, 1000000 x data-parallel size)"),

    /* &training */
    KINT(training, micro_batch_size, 1, 1, IMAX, "sequences per micro-batch"),
    KINT(training, global_batch_size, 0, 0, IMAX,
         "sequences per iteration; 0 = micro_batch_size * data-parallel size (which, like "
         "micro_batch_size * seq_length, must not exceed 2147483647)"),
    KINT(training, seq_length, 128, 1, IMAX, "tokens per sequence"),
    KINT(training, train_iters, 100, 1, IMAX, "iterations to train"),
    KINT(training, seed, 1234, 0, IMAX, "seed for init, data order and routing noise"),
    KINT(training, eval_interval, 1000, 1, IMAX, "iterations between evaluations"),
    KINT(training, eval_iters, 100, 0, IMAX, "validation batches per evaluation; 0 = none"),
    KINT(training, exit_interval, 0, 0, IMAX,
         "stop (after saving, if save is set) when iteration % exit_interval == 0; 0 = never"),

    /* &optimizer */
    KREAL(optimizer, lr, 1e-4, 0.0, RMAX, "peak learning rate"),
    KREAL(optimizer, min_lr, 0.0, 0.0, RMAX, "learning rate at the end of decay"),
    KENUM(optimizer, lr_decay_style, "linear", "constant|linear|cosine",
          "learning-rate decay after warmup"),
    KINT(optimizer, lr_warmup_iters, 0, 0, IMAX, "linear warmup iterations"),
    KINT(optimizer, lr_decay_iters, 0, 0, IMAX, "iterations over which lr decays; 0 = train_iters"),
    KREAL(optimizer, weight_decay, 0.01, 0.0, RMAX,
          "decoupled (AdamW) weight decay; never applied to norms and biases"),
    KREAL(optimizer, adam_beta1, 0.9, 0.0, 1.0, "Adam beta1"),
    KREAL(optimizer, adam_beta2, 0.999, 0.0, 1.0, "Adam beta2"),
    KREAL(optimizer, adam_eps, 1e-8, 0.0, RMAX, "Adam epsilon"),
    KREAL(optimizer, clip_grad, 1.0, 0.0, RMAX, "clip the global gradient norm to this; 0 = off"),

    /* &precision */
    KENUM(precision, params_dtype, "fp32", "fp32|bf16",
          "working precision of parameters and activations (fp32 master weights always)"),
    KREAL(precision, gpu_memory_gb, 0.0, 0.0, RMAX,
          "GiB of memory per GPU: --check and the start of training fail when the most "
          "loaded rank's planned bytes (moetrain --check prints them) exceed it, naming "
          "the categories to reduce; 0 = no limit"),
    KENUM(precision, fp8_format, "", "|e4m3|hybrid",
          "FP8 GEMMs (doc/fp8.md): '' = off; 'e4m3' everywhere; 'hybrid' = E4M3 for "
          "activations and weights, E5M2 for gradients (delayed and tensorwise only). The "
          "attention projections, dense MLPs, routed and shared experts run their forward, "
          "dgrad and wgrad GEMMs on quantised operands; router, embedding, LM head, norms "
          "and attention core stay high precision. The CPU backend runs every recipe"),
    KENUM(precision, fp8_recipe, "delayed", "delayed|tensorwise|blockwise|mxfp8",
          "with fp8_format: 'delayed' = per-tensor scales from an amax history (model state, "
          "checkpointed); 'tensorwise' = per-tensor current scaling; 'blockwise' = 1x128 "
          "tiles for activations and gradients, 128x128 blocks for weights (Hopper); "
          "'mxfp8' = 32-element E8M0-scaled blocks along the reduction (Blackwell)"),
    KINT(precision, fp8_margin, 0, 0, 64,
         "fp8_recipe = 'delayed': scale = fmax / amax / 2^margin"),
    KINT(precision, fp8_amax_history_len, 1, 1, 1024,
         "fp8_recipe = 'delayed': steps of amax kept per quantised tensor"),
    KENUM(precision, fp8_amax_compute_algo, "most_recent", "most_recent|max",
          "fp8_recipe = 'delayed': the amax a scale comes from: the latest step's or the "
          "largest of the history"),
    KENUM(precision, fp4_format, "", "|e2m1",
          "FP4 GEMMs: '' = off; 'e2m1' with fp4_recipe (not with fp8_format); the same "
          "GEMMs as fp8_format"),
    KENUM(precision, fp4_recipe, "nvfp4", "nvfp4",
          "with fp4_format: 'nvfp4' = 16-element blocks with E4M3 scales and a per-tensor "
          "scale, 16x16 weight blocks, random Hadamard transform on the weight-gradient "
          "GEMM's inputs, stochastic rounding of gradients"),
    KBOOL(precision, first_last_layers_bf16, 0,
          "with fp8_format or fp4_format: the first num_layers_at_start_in_bf16 and last "
          "num_layers_at_end_in_bf16 layers keep high-precision GEMMs"),
    KINT(precision, num_layers_at_start_in_bf16, 1, 0, MT_MAX_LAYERS,
         "first_last_layers_bf16: layers at the start kept in high precision"),
    KINT(precision, num_layers_at_end_in_bf16, 1, 0, MT_MAX_LAYERS,
         "first_last_layers_bf16: layers at the end kept in high precision"),

    /* &recompute */
    KENUM(recompute, granularity, "none", "none|selective|full",
          "activation recompute: 'selective' rebuilds the parts of each layer named in "
          "modules during backward, 'full' whole layers (see method, num_layers); 'none' "
          "keeps everything forward computes (doc/memory.md, Recompute)"),
    KENUM(recompute, method, "none", "none|uniform|block",
          "granularity = 'full' only: 'uniform' splits each model chunk's layers into groups "
          "of num_layers that keep only their input; 'block' recomputes the first num_layers "
          "layers of each model chunk (pipeline stage or virtual chunk) and keeps the rest; "
          "'none' with the other granularities"),
    KINT(recompute, num_layers, 0, 0, MT_MAX_LAYERS,
         "granularity = 'full' only (then >= 1): layers per recompute group ('uniform') or "
         "layers recomputed per model chunk ('block'); 0 with the other granularities"),
    KSARR(recompute, modules,
          "granularity = 'selective' only: what each layer rebuilds in backward, from "
          "core_attn (attention core: keeps q, k, v), moe_act (the routed experts' SwiGLU "
          "output), layernorm (both RMSNorm outputs, with their TP gather), mlp (a dense "
          "MLP block), moe (a whole MoE block), shared_experts (the shared expert); empty = "
          "core_attn, as in Megatron"),
    KBOOL(recompute, fine_grained_activation_offloading, 0,
          "activation offloading (GPU backends): forward copies the saved inputs of the "
          "modules in offload_modules to pinned host memory on a side stream and reuses "
          "their device memory for later layers; backward copies them back ahead of use "
          "(doc/memory.md, Activation offloading). The CPU backend refuses it (its memory "
          "is host memory already)"),
    KSARR(recompute, offload_modules,
          "fine_grained_activation_offloading only (then at least one): whose saved inputs "
          "each layer offloads, from attn_norm (the residual stream entering the layer), "
          "qkv_linear (the normed input of the q/k/v projections), core_attn (the rotated "
          "q, k and v), attn_proj (the attention output entering o_proj) and mlp_norm (the "
          "residual after attention), expert_fc1 (the routed experts' input rows, which "
          "their gate and up projections read) and moe_act (the experts' gate and up, "
          "which their SwiGLU reads), both at the rows the expert buffers are sized for"),

    /* &data */
    KSARR(data, data_path,
          "dataset prefixes, optionally weighted: 'prefix', 'p1','p2' (an unweighted blend: "
          "one epoch of each, blended by size, as in Megatron) or '0.3','p1','0.7','p2'; "
          "elements are also split at blanks; weights must be finite and > 0 (0 is refused: "
          "remove the dataset) with a finite sum. Replace a dataset only atomically (write "
          "new files and rename them over the old ones): a .bin rewritten in place while a "
          "run reads it stops the run if its size changed, and feeds it other tokens if not"),
    KSTR(data, split, "969,30,1",
         "train,valid,test proportions of the documents: up to three finite, non-negative "
         "numbers separated by ',', '/' or blanks, with a finite sum > 0"),
    KBOOL(data, mock_data, 0, "random tokens instead of a dataset (benchmarks)"),
    KSTR(data, data_cache_path, "", "directory for cached sample indices; '' = no cache"),

    /* &checkpoint */
    KSTR(checkpoint, save, "", "directory to save checkpoints into; '' = never save"),
    KSTR(checkpoint, load, "",
         "checkpoint directory (or one of its iter_* directories) to resume from; '' = start "
         "from initialisation. A directory that holds no checkpoint is an error unless "
         "load_optional"),
    KSTR(checkpoint, load_hf, "",
         "a Hugging Face directory (config.json, model*.safetensors: Qwen3MoeForCausalLM, "
         "MixtralForCausalLM or Qwen3ForCausalLM, F32 or BF16) to take the initial weights "
         "from, in any parallel layout; config.json must describe this model (a difference "
         "names the key). Optimizer state starts fresh at iteration 0. Used only when "
         "checkpoint%load finds no checkpoint (a resumed run continues from its own); '' = "
         "none"),
    KINT(checkpoint, save_interval, 0, 0, IMAX, "iterations between saves; 0 = only at the end"),
    KINT(checkpoint, keep_last, 0, 0, IMAX,
         "keep only the N most recently written checkpoints (never the one 'latest' names); "
         "0 = keep all"),
    KBOOL(checkpoint, load_optional, 0,
          ".true.: a load directory that does not exist or holds no checkpoint yet starts "
          "from initialisation (a job that saves and resumes in one directory); .false.: "
          "that is an error"),
    KBOOL(checkpoint, async_save, 0,
          ".true.: a save copies this rank's part of the state to host memory at the step "
          "boundary and a background thread writes it while training goes on; it is "
          "published once every rank has written (the next save, a stop and the end of the "
          "run wait for it). Costs host memory of the rank's own part (doc/checkpoints.md)"),

    /* &logging */
    KINT(logging, log_interval, 10, 1, IMAX, "iterations between log lines"),
    KSTR(logging, metrics_file, "", "JSON-lines metrics file; '' = none"),
    KBOOL(logging, log_memory, 0, "print the exact bytes held per category at startup"),

    /* &topology */
    KENUM(topology, nvlink_domain_source, "auto", "auto|nvml|slurm|host|file",
          "where each GPU's NVLink domain comes from: NVML fabric info, the Slurm topology "
          "address, one domain per host, or domain_map_file; auto = nvml, else host"),
    KENUM(topology, placement, "nvlink", "nvlink|nvlink-besteffort|linear",
          "map logical ranks to processes so TP x CP and ETP x EP groups stay inside NVLink "
          "domains (nvlink), accept split groups with a report (nvlink-besteffort), or use "
          "launch order (linear)"),
    KSTR(topology, domain_map_file, "",
         "file of 'hostname domain_key' lines for nvlink_domain_source = 'file'"),
    KSTR(topology, hwloc_xml, "", "load this hwloc XML topology instead of the live machine"),

    /* &host */
    KENUM(host, cpu_affinity, "gpu", "gpu|numa|none",
          "bind each rank to the cores local to its GPU, to its NUMA node, or not at all"),
    KBOOL(host, numa_membind, 1, "bind memory to the NUMA node local to the rank's cores"),
    KBOOL(host, manual_gc, 0,
          "manual GC (Megatron's --manual-gc): host memory that training freed (the C "
          "library's free lists, the CPU backend's scratch grown past its high-water mark) "
          "is given back to the system only at chosen steps, the same step on every rank "
          "(a rule on the step number: no communication), so no rank stalls alone; once at "
          "the start, then as manual_gc_interval and manual_gc_eval say. The log says when "
          "it ran and what it released (doc/host-overhead.md). .false.: memory is given "
          "back whenever the C library decides"),
    KINT(host, manual_gc_interval, 0, 0, IMAX,
         "with manual_gc: release after every iteration whose number is a multiple of this; "
         "0 = never between training steps (Megatron's default)"),
    KBOOL(host, manual_gc_eval, 1,
          "with manual_gc: release before and after each evaluation and around each "
          "checkpoint save (Megatron's --no-manual-gc-eval sets .false.)"),

    /* &cuda_graph */
    KENUM(cuda_graph, impl, "none", "none|local|full_iteration",
          "CUDA graphs (GPU backends; Megatron's --cuda-graph-impl): 'local' captures the "
          "scopes in modules per layer, micro-batch slot and pass after warmup_steps "
          "iterations and replays them with one launch each; 'full_iteration' captures the "
          "whole iteration (every micro-batch's forward and backward, the gradients' "
          "reduction, the optimizer step) as one graph, launched once per iteration: data, "
          "tensor, expert and pipeline parallelism (the whole schedule, the transfers between "
          "stages included), static shapes (a dense model, or "
          "expert_capacity_factor with pad_expert_input_to_capacity); 'none' runs every kernel eagerly "
          "(doc/host-overhead.md, CUDA graphs)"),
    KSARR(cuda_graph, modules,
          "impl = 'local': the scopes captured (Megatron's --cuda-graph-modules), from attn "
          "(attention from the q/k/v projections to o_proj, forward and backward), mlp (a "
          "dense layer's MLP), moe_router (router GEMM, z and balancing losses, top-k), "
          "moe_preprocess (the dispatch plan; needs moe_router), moe (a whole MoE block: its "
          "router, its plan and its experts; static shapes only: expert_capacity_factor with "
          "pad_expert_input_to_capacity); empty = attn, moe_router, moe_preprocess for an MoE "
          "model, attn, mlp for a dense one"),
    KINT(cuda_graph, warmup_steps, 3, 0, IMAX,
         "impl = 'local' or 'full_iteration': iterations run eagerly before the scopes (the "
         "iteration) are captured, at least 1 "
         "(Megatron's --cuda-graph-warmup-steps)"),

    { NULL, NULL, MT_KEY_INT, 0, 0, 0, 0, 0, NULL, 0, 0, 0, 0, NULL, NULL },
};

const char *const mt_schema_groups[] = {
    "model", "moe", "parallel", "training", "optimizer", "precision",
    "recompute", "data", "checkpoint", "logging", "topology", "host",
    "cuda_graph", NULL,
};

const struct mt_key *mt_schema_find(const char *group, const char *name)
{
    for (const struct mt_key *k = mt_schema; k->name; k++)
        if (strcmp(k->group, group) == 0 && strcmp(k->name, name) == 0) return k;
    return NULL;
}

const char *mt_key_type_name(enum mt_key_type t)
{
    switch (t) {
    case MT_KEY_INT: return "integer";
    case MT_KEY_REAL: return "real";
    case MT_KEY_BOOL: return "logical";
    case MT_KEY_ENUM: return "string";
    case MT_KEY_STRING: return "string";
    case MT_KEY_INT_ARRAY: return "integer array";
    case MT_KEY_STRING_ARRAY: return "string array";
    }
    return "?";
}

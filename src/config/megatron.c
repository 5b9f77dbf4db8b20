/* Megatron-LM flags -> moetrain keys (megatron.h). Flags from Megatron-LM's
 * arguments.py as the MoE examples use them. A flag missing here is reported by
 * from-megatron as unknown, never silently dropped. */
#include "config/megatron.h"

#include <stdio.h>
#include <string.h>

#define V(f, k) { f, k, MT_MEG_VALUE, NULL, MT_MEG_AS_IS, NULL, NULL }
/* a value whose Megatron default (flag absent) is not moetrain's */
#define VD(f, k, dflt) { f, k, MT_MEG_VALUE, NULL, MT_MEG_AS_IS, dflt, NULL }
/* a value converted before it becomes the key's */
#define VC(f, k, conv, how) { f, k, MT_MEG_VALUE, how, conv, NULL, NULL }
#define S(f, k) { f, k, MT_MEG_SWITCH, NULL, MT_MEG_AS_IS, NULL, NULL }
#define NI(f, why) { f, NULL, MT_MEG_NOT_IMPLEMENTED, why, MT_MEG_AS_IS, NULL, NULL }
#define NA(f, why) { f, NULL, MT_MEG_NOT_APPLICABLE, why, MT_MEG_AS_IS, NULL, NULL }
/* not applicable for the one value moetrain implements (dflt: Megatron's when absent) */
#define NAV(f, only, dflt, why) { f, NULL, MT_MEG_NOT_APPLICABLE, why, MT_MEG_AS_IS, dflt, only }
#define RF(f, why) { f, NULL, MT_MEG_REFUSED, why, MT_MEG_AS_IS, NULL, NULL }

const struct mt_megatron_flag mt_megatron_flags[] = {
    /* model */
    V("--num-layers", "model%num_layers"),
    V("--hidden-size", "model%hidden_size"),
    V("--num-attention-heads", "model%num_attention_heads"),
    V("--num-query-groups", "model%num_query_groups"),
    V("--kv-channels", "model%kv_channels"),
    V("--ffn-hidden-size", "model%ffn_hidden_size"),
    V("--vocab-size", "model%vocab_size"),
    V("--max-position-embeddings", "model%max_position_embeddings"),
    V("--rotary-base", "model%rotary_base"),
    V("--norm-epsilon", "model%norm_epsilon"),
    S("--qk-layernorm", "model%qk_layernorm"),
    S("--untie-embeddings-and-output-weights", "model%untie_embeddings_and_output_weights"),
    V("--init-method-std", "model%init_method_std"),
    NA("--group-query-attention", "model%num_query_groups below num_attention_heads is GQA"),
    NA("--use-mcore-models", "moetrain has one model implementation"),
    NAV("--disable-bias-linear", "", NULL, "moetrain's linear layers have no bias"),
    NAV("--swiglu", "", NULL, "moetrain's MLPs and experts are always SwiGLU"),
    NAV("--normalization", "RMSNorm", "LayerNorm", "moetrain always uses RMSNorm"),
    NAV("--position-embedding-type", "rope", "learned_absolute", "moetrain always uses RoPE"),
    NA("--use-rotary-position-embeddings", "moetrain always uses RoPE"),
    NA("--no-position-embedding", "moetrain has no learned position embedding"),
    NAV("--rotary-percent", "1.0", NULL, "RoPE rotates the whole head dimension"),
    NA("--no-rope-fusion", "kernel choice is moetrain's"),
    NAV("--attention-dropout", "0", "0.1", "moetrain trains without dropout"),
    NAV("--hidden-dropout", "0", "0.1", "moetrain trains without dropout"),
    NA("--no-masked-softmax-fusion", "kernel choice is moetrain's"),
    NA("--attention-softmax-in-fp32", "attention softmax is always fp32"),
    NA("--use-flash-attn", "the CUDA backend's attention is always fused"),
    NA("--attention-backend", "the CUDA backend's attention is always fused"),
    NA("--transformer-impl", "moetrain has one implementation"),
    VC("--make-vocab-size-divisible-by", "model%vocab_size", MT_MEG_VOCAB_DIVISOR,
       "--vocab-size padded to a multiple of this value x TP, as Megatron pads it"),
    NI("--apply-layernorm-1p", "zero-centred (1p) norm weights"),
    NA("--no-bias-swiglu-fusion", "kernel choice is moetrain's"),
    NA("--no-bias-dropout-fusion", "kernel choice is moetrain's"),
    NA("--no-gradient-accumulation-fusion", "kernel choice is moetrain's"),
    /* mixture of experts */
    V("--num-experts", "moe%num_experts"),
    V("--moe-ffn-hidden-size", "moe%moe_ffn_hidden_size"),
    V("--moe-router-topk", "moe%router_topk"),
    V("--moe-router-score-function", "moe%router_score_function"),
    S("--moe-router-pre-softmax", "moe%router_pre_softmax"),
    V("--moe-router-topk-scaling-factor", "moe%router_topk_scaling_factor"),
    V("--moe-router-dtype", "moe%router_dtype"),
    VC("--moe-layer-freq", "moe%layer_freq", MT_MEG_LAYER_PATTERN,
       "N: every N-th layer MoE from layer 0; or a Python list expression such as "
       "([0]*1+[1]*47): one 0 (dense) or 1 (MoE) per layer"),
    V("--moe-router-load-balancing-type", "moe%router_load_balancing_type"),
    V("--moe-aux-loss-coeff", "moe%aux_loss_coeff"),
    V("--moe-z-loss-coeff", "moe%z_loss_coeff"),
    S("--moe-router-enable-expert-bias", "moe%router_enable_expert_bias"),
    V("--moe-router-bias-update-rate", "moe%router_bias_update_rate"),
    S("--moe-router-force-load-balancing", "moe%router_force_load_balancing"),
    V("--moe-expert-capacity-factor", "moe%expert_capacity_factor"),
    S("--moe-pad-expert-input-to-capacity", "moe%pad_expert_input_to_capacity"),
    V("--moe-token-drop-policy", "moe%token_drop_policy"),
    VD("--moe-token-dispatcher-type", "moe%token_dispatcher_type", "allgather"),
    V("--moe-shared-expert-intermediate-size", "moe%shared_expert_intermediate_size"),
    S("--moe-use-upcycling", "moe%use_upcycling"),
    NI("--moe-upcycling-granularity", "granular upcycling (experts narrower than the dense MLP)"),
    NA("--moe-grouped-gemm", "experts always run as one grouped GEMM"),
    NA("--moe-permute-fusion", "kernel choice is moetrain's"),
    NA("--moe-use-legacy-grouped-gemm", "kernel choice is moetrain's"),
    NI("--moe-router-num-groups", "group-limited routing (DeepSeek-V3)"),
    NI("--moe-router-group-topk", "group-limited routing (DeepSeek-V3)"),
    NI("--moe-input-jitter-eps", "router input jitter"),
    RF("--moe-layer-recompute",
       "deprecated in Megatron; give --recompute-granularity selective --recompute-modules moe"),
    S("--moe-shared-expert-overlap", "moe%moe_shared_expert_overlap"),
    NI("--moe-per-layer-logging", "per-layer MoE logging; the log has totals"),
    /* parallelism */
    V("--tensor-model-parallel-size", "parallel%tensor_model_parallel_size"),
    V("--pipeline-model-parallel-size", "parallel%pipeline_model_parallel_size"),
    V("--virtual-pipeline-model-parallel-size", "parallel%virtual_pipeline_model_parallel_size"),
    VC("--num-layers-per-virtual-pipeline-stage", "parallel%virtual_pipeline_model_parallel_size",
       MT_MEG_VPP_LAYERS, "VPP = num_layers / PP / this value"),
    V("--num-virtual-stages-per-pipeline-rank", "parallel%virtual_pipeline_model_parallel_size"),
    V("--decoder-first-pipeline-num-layers", "parallel%decoder_first_pipeline_num_layers"),
    V("--decoder-last-pipeline-num-layers", "parallel%decoder_last_pipeline_num_layers"),
    V("--context-parallel-size", "parallel%context_parallel_size"),
    V("--expert-model-parallel-size", "parallel%expert_model_parallel_size"),
    V("--expert-tensor-parallel-size", "parallel%expert_tensor_parallel_size"),
    S("--sequence-parallel", "parallel%sequence_parallel"),
    S("--use-distributed-optimizer", "parallel%use_distributed_optimizer"),
    V("--distributed-timeout-minutes", "parallel%distributed_timeout_minutes"),
    NA("--distributed-backend", "NCCL on the GPU, MPI on the CPU, chosen by the backend"),
    S("--overlap-grad-reduce", "parallel%overlap_grad_reduce"),
    S("--overlap-param-gather", "parallel%overlap_param_gather"),
    V("--ddp-bucket-size", "parallel%ddp_bucket_size"),
    S("--overlap-p2p-communication", "parallel%overlap_p2p_comm"), /* older Megatron's */
    S("--no-overlap-p2p-communication", "parallel%overlap_p2p_comm=.false."),
    S("--overlap-p2p-communication-warmup-flush", "parallel%overlap_p2p_comm_warmup_flush"),
    NA("--accumulate-allreduce-grads-in-fp32", "gradients are always reduced in fp32"),
    NI("--tp-comm-overlap", "TP communication overlap"),
    /* activation recompute */
    V("--recompute-granularity", "recompute%granularity"),
    V("--recompute-method", "recompute%method"),
    V("--recompute-num-layers", "recompute%num_layers"),
    VC("--recompute-modules", "recompute%modules", MT_MEG_WORDS, "each module one element"),
    S("--recompute-activations", "recompute%granularity='selective'"),
    S("--fine-grained-activation-offloading", "recompute%fine_grained_activation_offloading=.true."),
    VC("--offload-modules", "recompute%offload_modules", MT_MEG_WORDS, "each module one element"),
    NI("--distribute-saved-activations", "splitting recomputed layers' inputs over TP"),
    /* training */
    V("--micro-batch-size", "training%micro_batch_size"),
    V("--global-batch-size", "training%global_batch_size"),
    V("--seq-length", "training%seq_length"),
    V("--train-iters", "training%train_iters"),
    V("--seed", "training%seed"),
    V("--eval-interval", "training%eval_interval"),
    V("--eval-iters", "training%eval_iters"),
    V("--exit-interval", "training%exit_interval"),
    VC("--train-samples", "training%train_iters", MT_MEG_SAMPLES,
       "samples / --global-batch-size, when that is a whole number"),
    NI("--rampup-batch-size", "batch-size ramp-up"),
    NI("--step-batch-size-schedule", "a batch-size schedule"),
    S("--manual-gc", "host%manual_gc"),
    V("--manual-gc-interval", "host%manual_gc_interval"),
    S("--no-manual-gc-eval", "host%manual_gc_eval=.false."),
    /* CUDA graphs */
    VC("--cuda-graph-impl", "cuda_graph%impl", MT_MEG_GRAPH_IMPL,
       "none and local as they are; transformer_engine becomes local (moetrain captures the "
       "same scopes itself)"),
    VC("--cuda-graph-modules", "cuda_graph%modules", MT_MEG_GRAPH_SCOPES,
       "each scope one element; full_iteration becomes impl = 'full_iteration'"),
    VC("--cuda-graph-scope", "cuda_graph%modules", MT_MEG_GRAPH_SCOPES,
       "each scope one element (Megatron's older name of --cuda-graph-modules); "
       "full_iteration becomes impl = 'full_iteration'"),
    V("--cuda-graph-warmup-steps", "cuda_graph%warmup_steps"),
    S("--enable-cuda-graph", "cuda_graph%impl='local'"),
    S("--external-cuda-graph", "cuda_graph%impl='local'"),
    NA("--num-workers", "moetrain's data loader has no worker processes"),
    NA("--no-create-attention-mask-in-dataloader", "attention is causal without a mask"),
    NA("--cross-entropy-loss-fusion", "kernel choice is moetrain's"),
    /* optimizer */
    V("--lr", "optimizer%lr"),
    V("--min-lr", "optimizer%min_lr"),
    V("--lr-decay-style", "optimizer%lr_decay_style"),
    V("--lr-warmup-iters", "optimizer%lr_warmup_iters"),
    V("--lr-decay-iters", "optimizer%lr_decay_iters"),
    V("--weight-decay", "optimizer%weight_decay"),
    V("--adam-beta1", "optimizer%adam_beta1"),
    V("--adam-beta2", "optimizer%adam_beta2"),
    V("--adam-eps", "optimizer%adam_eps"),
    V("--clip-grad", "optimizer%clip_grad"),
    VC("--lr-warmup-fraction", "optimizer%lr_warmup_iters", MT_MEG_WARMUP_FRACTION,
       "this fraction of the decay's iterations, when that is a whole number"),
    VC("--lr-decay-samples", "optimizer%lr_decay_iters", MT_MEG_SAMPLES,
       "samples / --global-batch-size, when that is a whole number"),
    VC("--lr-warmup-samples", "optimizer%lr_warmup_iters", MT_MEG_SAMPLES,
       "samples / --global-batch-size, when that is a whole number"),
    NAV("--lr-warmup-init", "0", NULL, "moetrain's warmup starts from a learning rate of 0"),
    NI("--lr-wsd-decay-samples", "the warmup-stable-decay (WSD) schedule"),
    NI("--lr-wsd-decay-iters", "the warmup-stable-decay (WSD) schedule"),
    NI("--lr-wsd-decay-style", "the warmup-stable-decay (WSD) schedule"),
    NA("--optimizer", "moetrain's optimizer is AdamW"),
    /* precision */
    S("--bf16", "precision%params_dtype='bf16'"),
    RF("--fp16", "fp16 with loss scaling: moetrain trains in bf16 or fp32"),
    V("--fp8-format", "precision%fp8_format"),
    V("--fp8-recipe", "precision%fp8_recipe"),
    V("--fp8-margin", "precision%fp8_margin"),
    V("--fp8-amax-history-len", "precision%fp8_amax_history_len"),
    V("--fp8-amax-compute-algo", "precision%fp8_amax_compute_algo"),
    V("--fp4-format", "precision%fp4_format"),
    V("--fp4-recipe", "precision%fp4_recipe"),
    S("--first-last-layers-bf16", "precision%first_last_layers_bf16"),
    V("--num-layers-at-start-in-bf16", "precision%num_layers_at_start_in_bf16"),
    V("--num-layers-at-end-in-bf16", "precision%num_layers_at_end_in_bf16"),
    S("--moe-router-padding-for-fp8", "moe%moe_router_padding_for_fp8"),
    /* data */
    VC("--data-path", "data%data_path", MT_MEG_WORDS,
       "each word (weight or prefix) one element"),
    V("--split", "data%split"),
    S("--mock-data", "data%mock_data"),
    V("--data-cache-path", "data%data_cache_path"),
    NA("--tokenizer-type", "tokenize with moetrain-preprocess; training reads token ids"),
    NA("--tokenizer-model", "tokenize with moetrain-preprocess; training reads token ids"),
    NA("--vocab-file", "tokenize with moetrain-preprocess; training reads token ids"),
    NA("--merge-file", "tokenize with moetrain-preprocess; training reads token ids"),
    /* checkpoints */
    V("--save", "checkpoint%save"),
    V("--load", "checkpoint%load"),
    V("--save-interval", "checkpoint%save_interval"),
    NA("--ckpt-format", "moetrain writes its own sharded format"),
    NA("--dist-ckpt-strictness", "moetrain writes its own sharded format"),
    NA("--no-save-optim", "checkpoints always hold the optimizer state"),
    NA("--no-save-rng", "checkpoints always hold the data position and seed"),
    NI("--no-load-optim", "loading a model without its optimizer state"),
    NA("--no-load-rng", "checkpoints hold no RNG state: randomness is counter-based from the seed"),
    NI("--finetune", "loading a model without its optimizer state"),
    NI("--auto-detect-ckpt-format", "reading Megatron checkpoints"),
    /* logging */
    VD("--log-interval", "logging%log_interval", "100"),
    NA("--log-throughput", "the log always has tokens/s and TFLOP/s"),
    NA("--log-timers-to-tensorboard", "no TensorBoard: logging%metrics_file is JSON lines"),
    NA("--tensorboard-dir", "no TensorBoard: logging%metrics_file is JSON lines"),
    NA("--timing-log-level", "the log has the step time"),
    NA("--log-params-norm", "the log has the gradient norm"),
    NA("--log-num-zeros-in-grad", "the log has the gradient norm"),
    NA("--wandb-project", "no Weights & Biases: logging%metrics_file is JSON lines"),
    NA("--wandb-exp-name", "no Weights & Biases: logging%metrics_file is JSON lines"),
    NA("--eval-iters-per-log", "see training%eval_iters"),
    { NULL, NULL, MT_MEG_NOT_APPLICABLE, NULL, MT_MEG_AS_IS, NULL, NULL },
};

const struct mt_megatron_flag *mt_megatron_find(const char *flag)
{
    const size_t len = strcspn(flag, "=");
    for (const struct mt_megatron_flag *f = mt_megatron_flags; f->flag; f++)
        if (strlen(f->flag) == len && strncmp(f->flag, flag, len) == 0) return f;
    return NULL;
}

const struct mt_megatron_flag *mt_megatron_for_key(const char *key)
{
    char flag[128] = "--";
    size_t n = 2;
    for (const char *p = key; *p && n + 1 < sizeof flag; p++)
        flag[n++] = *p == '_' ? '-' : (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
    flag[n] = '\0';
    return mt_megatron_find(flag);
}

const char *mt_megatron_kind_name(enum mt_megatron_kind kind)
{
    switch (kind) {
    case MT_MEG_VALUE:
    case MT_MEG_SWITCH: return "mapped";
    case MT_MEG_NOT_IMPLEMENTED: return "not implemented";
    case MT_MEG_NOT_APPLICABLE: return "not applicable";
    case MT_MEG_REFUSED: return "refused";
    }
    return "?";
}

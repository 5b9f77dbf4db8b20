#!/bin/bash
# moetrain from-megatron -- ARGS: the namelist equivalent to a pretrain_gpt.py command
# line, for two real scripts' flags (the Mixtral 8x7B example of Megatron-Core's MoE
# README, and a Qwen3-30B-A3B script: model flags as Megatron scripts give them for
# Qwen3, with TP 4, EP 8, ETP 1); the namelist passes moetrain --check at the world
# size the flags imply, gfortran reads it, and every flag not mapped is listed with
# why. Then the conversions one by one, Megatron's defaults and rules, and errors;
# last the schedule in samples: whole global batches converted (a short run of one
# such namelist has Megatron's learning rate at every iteration), the rest refused.
set -u
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

# from_megatron NAME [--world-size N --] ARGS...: moetrain from-megatron -o NAME.nml
# [--world-size N] -- ARGS, must succeed
from_megatron() {
    name=$1 opts=()
    shift
    if [ "$1" = --world-size ]; then opts=(--world-size "$2"); shift 3; fi
    "$MOETRAIN" from-megatron -o "$name.nml" "${opts[@]}" -- "$@" > "$name.out" 2> "$name.err" ||
        { cat "$name.err"; fail "from-megatron $name"; }
}
# has NAME 'KEY = VALUE': the namelist NAME.nml holds that line
has() { grep -qxF "  $2" "$1.nml" || { grep -F "${2%% =*} =" "$1.nml"; fail "$1.nml: no '$2'"; }; }
# noted NAME TEXT: the report lists TEXT
noted() { grep -qF -- "$2" "$1.err" || { cat "$1.err"; fail "$1: the report has no '$2'"; }; }
# gfortran_reads NAME: gfortran reads NAME.nml (tests/config/fortran_roundtrip.py)
gfortran_reads() {
    [ -n "${GFORTRAN:-}" ] && [ -n "${PYTHON3:-}" ] || { echo "(gfortran or python3 missing: $1 not read by gfortran)"; return; }
    "$PYTHON3" "$MT_TOP_SRCDIR/tests/config/fortran_roundtrip.py" "$1.nml" "$1.f90" &&
        "$GFORTRAN" -o "$1.exe" "$1.f90" && "./$1.exe" "$1.nml" "$1.back.nml" ||
        fail "gfortran does not read $1.nml"
}

# expect_error NEEDLE ARGS...: from-megatron fails, naming NEEDLE
expect_error() {
    needle=$1
    shift
    "$MOETRAIN" from-megatron "$@" > err.out 2> err.err && fail "from-megatron $* succeeded"
    grep -qF -- "$needle" err.err || { cat err.err; fail "from-megatron $*: no '$needle'"; }
}

# Megatron-Core MoE README, "MoE training example" (Mixtral 8x7B on 32 GPUs): its
# MODEL_ARGS, MOE_ARGS, DATA_ARGS, TRAINING_ARGS, MODEL_PARALLEL_ARGS and LOGGING_ARGS,
# with the script's variables given values.
MIXTRAL=(
    --disable-bias-linear --seq-length 4096 --max-position-embeddings 32768 --num-layers 32
    --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --init-method-std 0.01
    --attention-dropout 0.0 --hidden-dropout 0.0 --normalization RMSNorm
    --position-embedding-type rope --swiglu --untie-embeddings-and-output-weights
    --group-query-attention --num-query-groups 8 --no-masked-softmax-fusion
    --no-position-embedding
    --num-experts 8 --expert-model-parallel-size 8 --moe-router-load-balancing-type aux_loss
    --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 --moe-grouped-gemm --moe-permute-fusion
    --tokenizer-type Llama2Tokenizer --tokenizer-model /models/mixtral/tokenizer.model
    --data-path /data/mixtral_text_document --split 99990,8,2
    --micro-batch-size 1 --global-batch-size 128 --lr 1e-4 --train-iters 500000
    --lr-decay-iters 320000 --lr-decay-style cosine --min-lr 1.0e-5 --weight-decay 0.1
    --lr-warmup-iters 500 --clip-grad 1.0 --bf16 --overlap-grad-reduce --overlap-param-gather
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4
    --num-layers-per-virtual-pipeline-stage 8 --sequence-parallel --use-distributed-optimizer
    --log-interval 1 --save-interval 10000 --eval-interval 1000 --eval-iters 10
    --save /ckpt/mixtral --load /ckpt/mixtral --tensorboard-dir /ckpt/mixtral/tensorboard
    --no-load-optim --no-load-rng
)
# As given, the vocabulary is the tokenizer's: named, and the namelist still valid
from_megatron mixtral_novocab "${MIXTRAL[@]}"
noted mixtral_novocab "--vocab-size (not given): not implemented: Megatron takes the vocabulary from its tokenizer"
# With Mixtral's tokenizer size
from_megatron mixtral pretrain_gpt.py "${MIXTRAL[@]}" --vocab-size 32000
noted mixtral "valid for 32 processes (the smallest world size these flags allow)"
"$MOETRAIN" --check --world-size 32 mixtral.nml > check.out 2>&1 || { cat check.out; fail "--check of mixtral.nml for 32"; }
grep -q 'layout: world 32 = TP 1 x CP 1 x PP 4 x DP 8; experts: ETP 1 x EP 8 x EDP 1 x PP 4; VPP 1' check.out ||
    { cat check.out; fail "mixtral.nml: not the README's layout"; }
"$MOETRAIN" --check --world-size 16 mixtral.nml > /dev/null 2>&1 && fail "mixtral.nml valid for 16 processes (EP 8 x PP 4 needs 32)"
# the job's world size, given
from_megatron mixtral64 --world-size 64 -- "${MIXTRAL[@]}" --vocab-size 32000
noted mixtral64 "valid for 64 processes (--world-size)"
expect_error "pipeline_model_parallel_size" --world-size 16 -- "${MIXTRAL[@]}" --vocab-size 32000
# Megatron's rules on the overlap flags, by moetrain's key names
M1=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 256 --seq-length 32
    --max-position-embeddings 32 --micro-batch-size 1 --mock-data)
expect_error "overlap_param_gather = .true. needs use_distributed_optimizer" -- "${M1[@]}" \
    --overlap-grad-reduce --overlap-param-gather
expect_error "overlap_param_gather = .true. needs overlap_grad_reduce" -- "${M1[@]}" \
    --use-distributed-optimizer --overlap-param-gather
from_megatron buckets "${M1[@]}" --overlap-grad-reduce --ddp-bucket-size 1000
has buckets 'ddp_bucket_size = 1000'
has buckets 'overlap_grad_reduce = .true.'
for kv in 'num_layers = 32' 'hidden_size = 4096' 'num_attention_heads = 32' 'num_query_groups = 8' \
    'ffn_hidden_size = 14336' 'vocab_size = 32000' 'max_position_embeddings = 32768' \
    'untie_embeddings_and_output_weights = .true.' 'init_method_std = 0.01' 'num_experts = 8' \
    'router_topk = 2' 'aux_loss_coeff = 0.01' "router_load_balancing_type = 'aux_loss'" \
    "token_dispatcher_type = 'allgather'" 'pipeline_model_parallel_size = 4' \
    'virtual_pipeline_model_parallel_size = 1' 'expert_model_parallel_size = 8' \
    'sequence_parallel = .true.' 'use_distributed_optimizer = .true.' \
    'overlap_grad_reduce = .true.' 'overlap_param_gather = .true.' 'micro_batch_size = 1' \
    'global_batch_size = 128' 'seq_length = 4096' 'train_iters = 500000' 'lr = 0.0001' \
    'min_lr = 1e-05' "lr_decay_style = 'cosine'" 'lr_warmup_iters = 500' 'lr_decay_iters = 320000' \
    'weight_decay = 0.1' "params_dtype = 'bf16'" "data_path = '/data/mixtral_text_document'" \
    "split = '99990,8,2'" "save = '/ckpt/mixtral'" "load = '/ckpt/mixtral'" 'save_interval = 10000' \
    'log_interval = 1' 'eval_interval = 1000' 'eval_iters = 10'; do
    has mixtral "$kv"
done
noted mixtral "--num-layers-per-virtual-pipeline-stage 8: converted: parallel%virtual_pipeline_model_parallel_size=1 (32 layers / PP 4 / 8)"
noted mixtral "--moe-token-dispatcher-type (not given): default: Megatron's default allgather"
noted mixtral "--moe-grouped-gemm: not applicable"
noted mixtral "--tokenizer-type Llama2Tokenizer: not applicable: tokenize with moetrain-preprocess"
noted mixtral "--no-load-optim: not implemented: loading a model without its optimizer state"
noted mixtral "--tensorboard-dir /ckpt/mixtral/tensorboard: not applicable"
grep -q 'unknown' mixtral.err && { cat mixtral.err; fail "a flag of the README's example is unknown to the table"; }
# every flag of the example is either in the namelist (a mapped key) or in the report
for f in "${MIXTRAL[@]}"; do
    case $f in --*) ;; *) continue ;; esac
    case $f in
    --num-layers|--hidden-size|--num-attention-heads|--num-query-groups|--ffn-hidden-size|\
    --max-position-embeddings|--untie-embeddings-and-output-weights|--init-method-std|\
    --num-experts|--expert-model-parallel-size|--moe-router-load-balancing-type|--moe-router-topk|\
    --moe-aux-loss-coeff|--data-path|--split|--micro-batch-size|--global-batch-size|--lr|\
    --train-iters|--lr-decay-iters|--lr-decay-style|--min-lr|--weight-decay|--lr-warmup-iters|\
    --clip-grad|--bf16|--tensor-model-parallel-size|--pipeline-model-parallel-size|\
    --sequence-parallel|--use-distributed-optimizer|--overlap-grad-reduce|\
    --overlap-param-gather|--log-interval|--save-interval|\
    --eval-interval|--eval-iters|--save|--load|--seq-length) ;;
    *) noted mixtral "  $f" ;;
    esac
done
gfortran_reads mixtral

# A Qwen3-30B-A3B script's flags (its MODEL_ARGS and parallel ARGS); --moe-layer-freq
# quoted twice, as such scripts pass it.
QWEN3=(
    --disable-bias-linear --qk-layernorm --group-query-attention --num-attention-heads 32
    --num-query-groups 4 --kv-channels 128 --num-layers 48 --hidden-size 2048
    --ffn-hidden-size 6144 --normalization RMSNorm --position-embedding-type rope
    --norm-epsilon 1e-6 --rotary-percent 1.0 --swiglu --untie-embeddings-and-output-weights
    --vocab-size 151936 --rotary-base 1000000
    --moe-ffn-hidden-size 768 --moe-router-score-function softmax --moe-token-dispatcher-type alltoall
    --moe-router-topk 8 --moe-layer-freq "'([1]*48)'" --num-experts 128 --moe-grouped-gemm
    --moe-token-drop-policy probs --moe-router-dtype fp32 --moe-permute-fusion --moe-aux-loss-coeff 0
    --tensor-model-parallel-size 4 --sequence-parallel --pipeline-model-parallel-size 1
    --context-parallel-size 1 --expert-model-parallel-size 8 --expert-tensor-parallel-size 1
    --bf16 --seq-length 4096 --max-position-embeddings 40960 --micro-batch-size 1 --global-batch-size 512
    --mock-data
)
from_megatron qwen3 "${QWEN3[@]}"
noted qwen3 "valid for 8 processes (the smallest world size these flags allow)"
"$MOETRAIN" --check --world-size 8 qwen3.nml > check.out 2>&1 || { cat check.out; fail "--check of qwen3.nml for 8"; }
grep -q 'experts: ETP 1 x EP 8 x EDP 1 x PP 1' check.out || { cat check.out; fail "qwen3.nml: not EP 8"; }
for kv in 'num_layers = 48' 'num_query_groups = 4' 'kv_channels = 128' 'qk_layernorm = .true.' \
    'vocab_size = 152064' 'rotary_base = 1e+06' 'norm_epsilon = 1e-06' 'moe_ffn_hidden_size = 768' \
    'num_experts = 128' 'router_topk = 8' "token_dispatcher_type = 'alltoall'" 'aux_loss_coeff = 0.0' \
    'tensor_model_parallel_size = 4' 'expert_tensor_parallel_size = 1' 'mock_data = .true.'; do
    has qwen3 "$kv"
done
grep -q '^model: 48 layers (48 MoE, 0 dense)' check.out || { cat check.out; fail "qwen3.nml: not 48 MoE layers"; }
noted qwen3 "--vocab-size 151936: converted: model%vocab_size=152064: padded to a multiple of 128 x TP 4"
noted qwen3 "--moe-layer-freq '([1]*48)': converted: moe%layer_freq=48*1"
noted qwen3 "--rotary-percent 1.0: not applicable"
gfortran_reads qwen3

# --moe-layer-freq: an integer (every N-th layer from layer 0) and list expressions
from_megatron freq4 --num-layers 8 --moe-layer-freq 4 --num-experts 4 --swiglu --disable-bias-linear --mock-data
has freq4 'layer_freq = 1, 0, 0, 0, 1, 0, 0, 0'
from_megatron freqx --num-layers 12 --moe-layer-freq "([1]*3+[0]*1)*3" --num-experts 4 --swiglu --disable-bias-linear --mock-data
has freqx 'layer_freq = 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0'
from_megatron freqy --num-layers 3 --moe-layer-freq "[0, 1,1]" --num-experts 4 --swiglu --disable-bias-linear --mock-data
has freqy 'layer_freq = 0, 1, 1'
# activation recompute: Megatron's flags, its rules (checked as --check checks them)
from_megatron rcsel --num-layers 2 --num-experts 4 --swiglu --disable-bias-linear --mock-data \
    --recompute-granularity selective --recompute-modules moe_act layernorm
has rcsel "granularity = 'selective'"
grep -A1 -xF "  modules = 'moe_act'," rcsel.nml | grep -qxF "    'layernorm'" ||
    { cat rcsel.nml; fail "rcsel.nml: modules are not moe_act, layernorm"; }
from_megatron rcfull --num-layers 4 --swiglu --disable-bias-linear --mock-data \
    --recompute-granularity full --recompute-method block --recompute-num-layers 2
has rcfull "method = 'block'"
has rcfull "num_layers = 2"
from_megatron rcact --num-layers 2 --swiglu --disable-bias-linear --mock-data --recompute-activations
has rcact "granularity = 'selective'"
expect_error "granularity = 'full' needs method = 'uniform'" -- --num-layers 2 --mock-data \
    --recompute-granularity full
expect_error "modules(1) = 'moe': this model has no MoE layer" -- --num-layers 2 --mock-data \
    --recompute-granularity selective --recompute-modules moe
from_megatron rcmoe --num-layers 2 --swiglu --disable-bias-linear --mock-data --moe-layer-recompute
noted rcmoe "--moe-layer-recompute: refused: deprecated in Megatron; give --recompute-granularity selective --recompute-modules moe"
# fine-grained activation offloading: the flag, the modules, the experts' modules refused
# without MoE layers
from_megatron offl --num-layers 2 --swiglu --disable-bias-linear --mock-data \
    --fine-grained-activation-offloading --offload-modules core_attn attn_proj
has offl 'fine_grained_activation_offloading = .true.'
grep -A1 -xF "  offload_modules = 'core_attn'," offl.nml | grep -qxF "    'attn_proj'" ||
    { cat offl.nml; fail "offl.nml: offload_modules are not core_attn, attn_proj"; }
expect_error "offload_modules(1) = 'moe_act': this model has no MoE layer" -- --num-layers 2 \
    --mock-data --fine-grained-activation-offloading --offload-modules moe_act
expect_error "fine_grained_activation_offloading = .true. needs offload_modules" -- \
    --num-layers 2 --mock-data --fine-grained-activation-offloading
expect_error "gives 47 layers, --num-layers is 48" -- --num-layers 48 --moe-layer-freq "([1]*47)"
expect_error "list elements must be 0 or 1" -- --num-layers 2 --moe-layer-freq "[1,2]"
expect_error "--num-layers 32 / PP 4 is not a multiple" -- --num-layers 32 \
    --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 3
expect_error "give pretrain_gpt.py's arguments after '--'" --num-layers 2
expect_error "no '--'" -o x.nml
expect_error "takes one value" -- --num-layers 2 4
# a layout the model rules refuse at every world size: the rule's message
expect_error "num_attention_heads" -- --num-attention-heads 4 --tensor-model-parallel-size 3 \
    --sequence-parallel

# manual GC: Megatron's three flags, and its defaults (off, interval 0, around evaluations)
from_megatron gc --num-layers 2 --swiglu --disable-bias-linear --mock-data --manual-gc \
    --manual-gc-interval 50 --no-manual-gc-eval
has gc 'manual_gc = .true.'
has gc 'manual_gc_interval = 50'
has gc 'manual_gc_eval = .false.'
from_megatron nogc --num-layers 2 --swiglu --disable-bias-linear --mock-data
has nogc 'manual_gc = .false.'
has nogc 'manual_gc_interval = 0'
has nogc 'manual_gc_eval = .true.'
# CUDA graphs: the implementation (transformer_engine captures the same scopes), the
# scopes under either name, full_iteration as moetrain's impl (a dense model; refused
# with dropless MoE), the warm-up
from_megatron cg --num-layers 2 --swiglu --disable-bias-linear --mock-data --num-experts 4 \
    --cuda-graph-impl transformer_engine --cuda-graph-scope attn moe_router moe_preprocess \
    --cuda-graph-warmup-steps 5
has cg "impl = 'local'"
grep -q "^  modules = 'attn'," cg.nml && grep -q "'moe_router'," cg.nml && grep -q "'moe_preprocess'" cg.nml ||
    { cat cg.nml; fail "cg.nml: modules are not attn, moe_router, moe_preprocess"; }
has cg 'warmup_steps = 5'
from_megatron cgmod --num-layers 2 --swiglu --disable-bias-linear --mock-data --cuda-graph-impl local \
    --cuda-graph-modules attn mlp
has cgmod "impl = 'local'"
grep -q "^  modules = 'attn'," cgmod.nml && grep -q "'mlp'" cgmod.nml ||
    { cat cgmod.nml; fail "cgmod.nml: modules are not attn, mlp"; }
has cgmod 'warmup_steps = 3'
from_megatron cgfull --num-layers 2 --swiglu --disable-bias-linear --mock-data \
    --cuda-graph-impl local --cuda-graph-modules full_iteration
has cgfull "impl = 'full_iteration'"
expect_error "&cuda_graph impl = 'full_iteration': a whole iteration is one graph only where every shape is static" \
    -- --num-layers 2 --mock-data --num-experts 4 --cuda-graph-impl local --cuda-graph-modules full_iteration
# FP8 and FP4 (Transformer Engine's flags): the recipe keys, and Megatron's defaults
from_megatron fp8 --num-layers 4 --swiglu --disable-bias-linear --mock-data --bf16 \
    --fp8-format hybrid --fp8-recipe delayed --fp8-margin 1 --fp8-amax-history-len 16 \
    --fp8-amax-compute-algo max --first-last-layers-bf16 --num-layers-at-start-in-bf16 1 \
    --num-layers-at-end-in-bf16 2
has fp8 "fp8_format = 'hybrid'"
has fp8 "fp8_recipe = 'delayed'"
has fp8 'fp8_margin = 1'
has fp8 'fp8_amax_history_len = 16'
has fp8 "fp8_amax_compute_algo = 'max'"
has fp8 'first_last_layers_bf16 = .true.'
has fp8 'num_layers_at_end_in_bf16 = 2'
gfortran_reads fp8
from_megatron mxfp8 --num-layers 2 --swiglu --disable-bias-linear --mock-data --fp8-format e4m3 \
    --fp8-recipe mxfp8
has mxfp8 "fp8_recipe = 'mxfp8'"
has mxfp8 'fp8_amax_history_len = 1'
has mxfp8 "fp8_amax_compute_algo = 'most_recent'"
from_megatron nvfp4 --num-layers 2 --swiglu --disable-bias-linear --mock-data --fp4-format e2m1 \
    --fp4-recipe nvfp4
has nvfp4 "fp4_format = 'e2m1'"
has nvfp4 "fp8_format = ''"
# the delayed-scaling flags with another recipe change nothing: refused, as the key is
expect_error "apply to fp8_recipe = 'delayed' only" -- --num-layers 2 --swiglu \
    --disable-bias-linear --mock-data --fp8-format e4m3 --fp8-recipe blockwise --fp8-margin 2
expect_error "moe_router_padding_for_fp8 = .true." -- --num-layers 2 --swiglu \
    --disable-bias-linear --mock-data --num-experts 4 --moe-router-padding-for-fp8
# Megatron's defaults and rules where moetrain's differ
from_megatron defaults --hidden-size 768 --num-attention-heads 12 --num-query-groups 4 --swiglu \
    --disable-bias-linear --normalization RMSNorm --position-embedding-type rope \
    --attention-dropout 0 --hidden-dropout 0 --mock-data
has defaults 'untie_embeddings_and_output_weights = .false.'
has defaults 'log_interval = 100'
has defaults 'ffn_hidden_size = 2048'
has defaults 'num_query_groups = 0'
noted defaults "--num-query-groups 4: not applicable: ignored, as Megatron ignores it without --group-query-attention"
noted defaults "--ffn-hidden-size (not given): default: model%ffn_hidden_size=2048"
grep 'not implemented' defaults.err | grep -qv '^  --vocab-size (not given)' && { cat defaults.err; fail "a Megatron default moetrain follows reported as not implemented"; }
# what moetrain does not do, given or by Megatron's default: not implemented, refused, unknown
from_megatron gelu --num-layers 2 --normalization LayerNorm --fp16 --no-such-flag 3 --mock-data \
    --moe-router-load-balancing-type sinkhorn
noted gelu "--swiglu (not given): not implemented: moetrain's MLPs and experts are always SwiGLU; Megatron's default is without it"
noted gelu "--disable-bias-linear (not given): not implemented"
noted gelu "--position-embedding-type (not given): not implemented: moetrain always uses RoPE; Megatron's default is learned_absolute"
noted gelu "--attention-dropout (not given): not implemented"
noted gelu "--normalization LayerNorm: not implemented: moetrain always uses RMSNorm"
noted gelu "--fp16: refused"
noted gelu "--no-such-flag 3: unknown: not in moetrain's table"
noted gelu "moe%router_load_balancing_type='sinkhorn': not implemented:"
has gelu "router_load_balancing_type = 'aux_loss'"

# Megatron's schedule in samples: a count of whole global batches becomes iterations
# (Megatron's scheduler advances by the global batch each iteration, so k batches of
# samples are k iterations of moetrain's); any other count is refused, never rounded.
SMALL=(
    --num-layers 2 --hidden-size 64 --num-attention-heads 4 --num-experts 4 --moe-router-topk 2
    --swiglu --disable-bias-linear --normalization RMSNorm --position-embedding-type rope
    --attention-dropout 0 --hidden-dropout 0 --vocab-size 257 --mock-data --micro-batch-size 2
    --expert-model-parallel-size 2 --lr-decay-style cosine
)
# check_nml NAME: moetrain --check accepts NAME.nml for 2 processes
check_nml() {
    "$MOETRAIN" --check --world-size 2 "$1.nml" > check.out 2>&1 || { cat check.out; fail "--check of $1.nml"; }
}
from_megatron samples "${SMALL[@]}" --global-batch-size 16 --train-samples 1600 \
    --lr-decay-samples 1280 --lr-warmup-samples 160
for kv in 'global_batch_size = 16' 'train_iters = 100' 'lr_decay_iters = 80' 'lr_warmup_iters = 10'; do
    has samples "$kv"
done
noted samples "--train-samples 1600: converted: training%train_iters=100 (1600 samples / global batch 16)"
noted samples "--lr-decay-samples 1280: converted: optimizer%lr_decay_iters=80 (1280 samples / global batch 16)"
noted samples "--lr-warmup-samples 160: converted: optimizer%lr_warmup_iters=10 (160 samples / global batch 16)"
check_nml samples
gfortran_reads samples
# Trained for its 10 iterations, the converted namelist gives each iteration the
# learning rate Megatron's scheduler gives it, computed here in samples as Megatron
# counts: before iteration i it has consumed (i - 1) x 4 samples; warmup ends at
# 0.375 x 32 = 12 samples, cosine decay at 32, min_lr after.
if [ -n "${PYTHON3:-}" ]; then
    from_megatron lr_run "${SMALL[@]}" --expert-model-parallel-size 1 --seq-length 32 \
        --max-position-embeddings 32 --global-batch-size 4 --train-samples 40 \
        --lr-decay-samples 32 --lr-warmup-fraction 0.375 --lr 1e-3 --min-lr 1e-5 --log-interval 1
    has lr_run 'train_iters = 10'
    has lr_run 'lr_warmup_iters = 3'
    has lr_run 'lr_decay_iters = 8'
    "$MOETRAIN" lr_run.nml "logging%metrics_file='lr_run.jsonl'" > lr_run.log 2>&1 ||
        { cat lr_run.log; fail "training lr_run.nml"; }
    "$PYTHON3" - lr_run.jsonl << 'EOF' || fail "lr_run: a learning rate differs from Megatron's"
import json, math, sys
lr, min_lr, gbs, warmup, decay = 1e-3, 1e-5, 4, 0.375 * 32, 32
def megatron(steps):
    if warmup > 0 and steps <= warmup:
        return lr * steps / warmup
    if steps > decay:
        return min_lr
    ratio = (steps - warmup) / (decay - warmup)
    return min_lr + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (lr - min_lr)
rows = [r for r in map(json.loads, open(sys.argv[1])) if "lr" in r]  # training rows
assert [r["iteration"] for r in rows] == list(range(1, 11)), "not 10 iterations"
for r in rows:
    want = megatron((r["iteration"] - 1) * gbs)
    if abs(r["lr"] - want) > 1e-9 * lr:
        sys.exit("iteration %d: lr %r, Megatron's %r" % (r["iteration"], r["lr"], want))
EOF
else
    echo "(python3 missing: the learning rates of a converted schedule not compared with Megatron's)"
fi
# the warmup fraction: of --lr-decay-samples, else of --train-samples (Megatron's decay
# default, as lr_decay_iters 0 is moetrain's)
from_megatron fraction_s "${SMALL[@]}" --global-batch-size 16 --train-samples 1600 --lr-warmup-fraction 0.1
has fraction_s 'train_iters = 100'
has fraction_s 'lr_warmup_iters = 10'
has fraction_s 'lr_decay_iters = 0'
noted fraction_s "--lr-warmup-fraction 0.1: converted: optimizer%lr_warmup_iters=10: 0.1 x the decay's 1600 samples = 160 samples = 10 global batches of 16"
check_nml fraction_s
from_megatron fraction_d "${SMALL[@]}" --global-batch-size 16 --train-samples 1600 \
    --lr-decay-samples 1280 --lr-warmup-fraction 2.5e-2
has fraction_d 'lr_warmup_iters = 2'
has fraction_d 'lr_decay_iters = 80'
# with --train-iters, of the decay's iterations; the decimal as written (0.1 x 30 is 3,
# where the double nearest 0.1 times 30 is not)
from_megatron fraction_i "${SMALL[@]}" --train-iters 30 --lr-warmup-fraction 0.1
has fraction_i 'lr_warmup_iters = 3'
noted fraction_i "--lr-warmup-fraction 0.1: converted: optimizer%lr_warmup_iters=3: 0.1 x the decay's 30 iterations"
check_nml fraction_i
from_megatron fraction_id "${SMALL[@]}" --train-iters 300 --lr-decay-iters 250 --lr-warmup-fraction .02 \
    --lr-warmup-samples 0
has fraction_id 'lr_warmup_iters = 5'
noted fraction_id "--lr-warmup-samples 0: not applicable"
# not whole: refused with the counts that would convert, the keys left at moetrain's defaults
from_megatron inexact "${SMALL[@]}" --global-batch-size 16 --train-samples 1000 --lr-decay-samples 1000 \
    --lr-warmup-samples 100
noted inexact "--train-samples 1000: refused: 1000 samples are 62.50 global batches of 16, not a whole number: Megatron trains the whole batches and drops the rest"
noted inexact "give 992 or 1008"
noted inexact "--lr-decay-samples 1000: refused: 1000 samples are 62.50 global batches of 16"
noted inexact "--lr-warmup-samples 100: refused: 100 samples are 6.25 global batches of 16, not a whole number: Megatron's warmup ends part-way through an iteration"
for kv in 'train_iters = 100' 'lr_decay_iters = 0' 'lr_warmup_iters = 0'; do has inexact "$kv"; done
from_megatron inexact_f "${SMALL[@]}" --global-batch-size 16 --train-samples 1600 --lr-warmup-fraction 0.005
has inexact_f 'train_iters = 100'
has inexact_f 'lr_warmup_iters = 0'
noted inexact_f "--lr-warmup-fraction 0.005: refused: 0.005 x the decay's 1600 samples = 8 samples, 0.50 global batches of 16, not a whole number"
from_megatron inexact_fi "${SMALL[@]}" --train-iters 30 --lr-warmup-fraction 0.15
noted inexact_fi "--lr-warmup-fraction 0.15: refused: 0.15 x the decay's 30 iterations = 4.5 iterations, not a whole number"
has inexact_fi 'lr_warmup_iters = 0'
# a global batch that grows, or one that depends on the world size: refused
from_megatron rampup "${SMALL[@]}" --global-batch-size 16 --train-samples 1600 --rampup-batch-size 4 4 800
noted rampup "--rampup-batch-size 4 4 800: not implemented: batch-size ramp-up"
noted rampup "--train-samples 1600: refused: with --rampup-batch-size the global batch changes during training"
from_megatron nogbs "${SMALL[@]}" --train-samples 1600 --lr-warmup-fraction 0.1
noted nogbs "--train-samples 1600: refused: without --global-batch-size Megatron's global batch is the micro-batch x the data-parallel size, which depends on the world size"
noted nogbs "--lr-warmup-fraction 0.1: refused: without --global-batch-size"
# a real script's schedule (a hybrid MoE's, 2048 sequences a batch): the warmup
# converts, the training and decay length (not whole batches) do not, and the result,
# 12000 warmup iterations in moetrain's default 100, does not check
"$MOETRAIN" from-megatron -- "${SMALL[@]}" --global-batch-size 2048 --train-samples 366210938 \
    --lr-decay-style WSD --lr-decay-samples 366210938 --lr-warmup-samples 24576000 \
    --lr-wsd-decay-style minus_sqrt --lr-wsd-decay-samples 73242188 > wsd.out 2> wsd.err &&
    fail "from-megatron wsd: a namelist without the script's training length checked"
noted wsd "--lr-warmup-samples 24576000: converted: optimizer%lr_warmup_iters=12000 (24576000 samples / global batch 2048)"
noted wsd "error: &optimizer lr_warmup_iters = 12000 exceeds lr_decay_iters = 100"
noted wsd "--train-samples 366210938: refused: 366210938 samples are 178813.93 global batches of 2048"
noted wsd "--lr-wsd-decay-samples 73242188: not implemented: the warmup-stable-decay (WSD) schedule"
noted wsd "optimizer%lr_decay_style='WSD': not implemented"
# what Megatron's argument checks reject
expect_error "--train-iters and --train-samples" -- "${SMALL[@]}" --train-iters 10 --train-samples 160
expect_error "need sample-based training (--train-samples)" -- "${SMALL[@]}" --train-iters 10 --lr-decay-samples 160
expect_error "need iteration-based training (--train-iters)" -- "${SMALL[@]}" --global-batch-size 16 \
    --train-samples 160 --lr-warmup-iters 2
expect_error "give one of --lr-warmup-fraction and --lr-warmup-samples" -- "${SMALL[@]}" --global-batch-size 16 \
    --train-samples 160 --lr-warmup-samples 16 --lr-warmup-fraction 0.1
expect_error "--lr-warmup-fraction is a fraction of the decay" -- "${SMALL[@]}" --lr-warmup-fraction 0.1
expect_error "--lr-warmup-fraction 1/10: not a non-negative decimal" -- "${SMALL[@]}" --train-iters 10 --lr-warmup-fraction 1/10
expect_error "--train-samples -5: not a non-negative integer" -- "${SMALL[@]}" --train-samples -5
echo "ok: from-megatron: the schedule in samples (whole global batches converted, the rest refused with why), the warmup fraction"

echo "ok: from-megatron: the Mixtral 8x7B README example (32 processes) and a Qwen3-30B-A3B script (8), conversions, defaults, notes, errors"

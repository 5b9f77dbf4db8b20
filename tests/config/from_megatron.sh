#!/bin/bash
# moetrain from-megatron -- ARGS: the namelist equivalent to a pretrain_gpt.py command
# line, for two real scripts' flags (the Mixtral 8x7B example of Megatron-Core's MoE
# README, and a Qwen3-30B-A3B script: model flags as Megatron scripts give them for
# Qwen3, with TP 4, EP 8, ETP 1); the namelist passes moetrain --check at the world
# size the flags imply, gfortran reads it, and every flag not mapped is listed with
# why. Then the conversions one by one, Megatron's defaults and rules, and errors.
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
for kv in 'num_layers = 32' 'hidden_size = 4096' 'num_attention_heads = 32' 'num_query_groups = 8' \
    'ffn_hidden_size = 14336' 'vocab_size = 32000' 'max_position_embeddings = 32768' \
    'untie_embeddings_and_output_weights = .true.' 'init_method_std = 0.01' 'num_experts = 8' \
    'router_topk = 2' 'aux_loss_coeff = 0.01' "router_load_balancing_type = 'aux_loss'" \
    "token_dispatcher_type = 'allgather'" 'pipeline_model_parallel_size = 4' \
    'virtual_pipeline_model_parallel_size = 1' 'expert_model_parallel_size = 8' \
    'sequence_parallel = .true.' 'use_distributed_optimizer = .true.' 'micro_batch_size = 1' \
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
noted mixtral "--overlap-grad-reduce: not applicable"
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
    --sequence-parallel|--use-distributed-optimizer|--log-interval|--save-interval|\
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
echo "ok: from-megatron: the Mixtral 8x7B README example (32 processes) and a Qwen3-30B-A3B script (8), conversions, defaults, notes, errors"

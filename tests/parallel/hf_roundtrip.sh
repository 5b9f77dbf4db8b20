#!/bin/sh
# Hugging Face round trip across layouts: a checkpoint of 8 processes (TP 2 x EP 2 x
# PP 2, ZeRO-1) exported with `moetrain export-hf` (several files), loaded with
# checkpoint%load_hf by 4 processes in another layout (EP 4 x DP 4), saved after an
# iteration at learning rate 0 (the first of the warmup: the parameters unchanged) and
# exported again: the same files byte for byte, so every parameter went through bit for
# bit; in bf16 likewise (loaded by 4 processes, TP 2 x EP 2).
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
# the layout model as Qwen3-MoE holds it: softmax routing, no expert bias or shared expert
HF="moe%router_score_function='softmax' moe%router_enable_expert_bias=F
moe%shared_expert_intermediate_size=0 moe%router_load_balancing_type='aux_loss'"
SHORT="training%micro_batch_size=1 training%global_batch_size=8 training%seq_length=8
training%train_iters=2 model%num_layers=4 moe%layer_freq=1,0,1,1"
ONE="training%train_iters=1 optimizer%lr_warmup_iters=1"
PP2="parallel%pipeline_model_parallel_size=2"
# same_files A B: the directories hold the same files, byte for byte
same_files() {
    [ "$(ls "$1")" = "$(ls "$2")" ] || fail "$2 holds other files than $1: $(ls "$2")"
    for f in "$1"/*; do cmp "$f" "$2/${f##*/}" || fail "$2/${f##*/} differs from $1's"; done
}
# shellcheck disable=SC2086 # lists of overrides
{
    run a 8 $SHORT $HF $TP2 $EP2 $ETP1 $PP2 $ZERO
    "$MOETRAIN" export-hf --max-shard-size 40K a hf > export.log || { cat export.log; fail "export-hf failed"; }
    cat export.log
    n=$(ls hf/model-*.safetensors | wc -l)
    [ "$n" -gt 2 ] || fail "the export has $n files, the test wants several"
    grep -q '"architectures": \["Qwen3MoeForCausalLM"\]' hf/config.json || fail "hf/config.json: not Qwen3-MoE"
    run b 4 $SHORT $HF $ONE $EP4 "checkpoint%load_hf='hf'"
    grep -q "initial weights from the Hugging Face directory hf" b.log || { cat b.log; fail "b did not load hf"; }
    "$MOETRAIN" export-hf --max-shard-size 40K b hf_b > /dev/null || fail "export-hf of b failed"
    same_files hf hf_b
    echo "fp32: 8 processes -> export -> load_hf by 4 -> export: the same files"
    "$MOETRAIN" export-hf --dtype bf16 a hf16 > /dev/null || fail "export-hf --dtype bf16 failed"
    grep -q '"torch_dtype": "bfloat16"' hf16/config.json || fail "hf16/config.json does not say bfloat16"
    run c 4 $SHORT $HF $ONE $TP2 $EP2 "checkpoint%load_hf='hf16'"
    "$MOETRAIN" export-hf --dtype bf16 c hf16_c > /dev/null || fail "export-hf of c failed"
    same_files hf16 hf16_c
    echo "bf16: export -> load_hf by 4 (TP 2 x EP 2) -> export: the same files"
}
echo PASS

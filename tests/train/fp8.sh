#!/bin/sh
# FP8/FP4 training on the CPU backend (doc/fp8.md): a resumed run is bit-identical to
# a straight one with delayed scaling (amax histories of 4 steps, 'max') and with
# NVFP4 (its random bits keyed by the iteration); --check and --log-memory agree on
# the quantised path's memory, which --check shows beside bf16's, with the FP8 copies
# saved for backward in place of the inputs they replace; the keys that would
# change nothing are refused by name; the guard backend runs them as the CPU does.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
cd "$tmp"
DELAYED="precision%fp8_format='hybrid' precision%fp8_amax_history_len=4 precision%fp8_amax_compute_algo='max' precision%fp8_margin=1"
NVFP4="precision%fp4_format='e2m1'"
for recipe in DELAYED NVFP4; do
    eval "r=\$$recipe"
    # shellcheck disable=SC2086 # r is a list of overrides
    "$MOETRAIN" "$small" precision%params_dtype="'bf16'" $r "checkpoint%save='straight'" > a.log 2>&1 || { cat a.log; fail "$recipe: straight run"; }
    grep -q "low precision: fp" a.log || { cat a.log; fail "$recipe: the log does not name the recipe"; }
    # shellcheck disable=SC2086
    "$MOETRAIN" "$small" precision%params_dtype="'bf16'" $r training%exit_interval=5 "checkpoint%save='split'" > b.log 2>&1 || { cat b.log; fail "$recipe: first half"; }
    # shellcheck disable=SC2086
    "$MOETRAIN" "$small" precision%params_dtype="'bf16'" $r "checkpoint%save='split'" "checkpoint%load='split'" > c.log 2>&1 || { cat c.log; fail "$recipe: second half"; }
    grep -q "loaded checkpoint" c.log || fail "$recipe: the resumed run did not load"
    same_ckpt straight/iter_0000012 split/iter_0000012 || fail "$recipe: resumed state differs from the straight run"
    echo "$recipe: resume is bit-exact"
    rm -rf straight split
done
# a checkpoint written without the recipe's state is refused with the recipe
"$MOETRAIN" "$small" training%train_iters=3 "checkpoint%save='plain'" > d.log 2>&1 || { cat d.log; fail "plain run"; }
# shellcheck disable=SC2086
"$MOETRAIN" "$small" $DELAYED training%train_iters=4 "checkpoint%load='plain'" > e.log 2>&1 && { cat e.log; fail "a checkpoint without the FP8 state was loaded"; }
grep -q "moetrain.expert_bias" e.log || { cat e.log; fail "the refusal does not name the state"; }
echo "a checkpoint without the state is refused"

# memory: --check's bytes are those the run allocates (--log-memory), and more than bf16's
bytes() { sed -n 's/.*| total \([0-9]*\) (.*/\1/p' "$1" | head -1; }
"$MOETRAIN" --check "$small" > plain.check 2>&1 || { cat plain.check; fail "--check"; }
# shellcheck disable=SC2086
"$MOETRAIN" --check "$small" $DELAYED > fp8.check 2>&1 || { cat fp8.check; fail "--check fp8"; }
# shellcheck disable=SC2086
"$MOETRAIN" "$small" $DELAYED training%train_iters=2 optimizer%lr_warmup_iters=1 logging%log_memory=T > fp8.log 2>&1 || { cat fp8.log; fail "fp8 run"; }
c=$(bytes fp8.check); l=$(bytes fp8.log); p=$(bytes plain.check)
[ -n "$c" ] && [ "$c" = "$l" ] || fail "--check says $c bytes, --log-memory $l"
[ "$c" -gt "$p" ] || fail "the quantised path's buffers are not counted ($c vs $p bytes)"
echo "memory: fp8 $c bytes (--check = --log-memory), bf16 path $p"
# the copies saved for backward (bf16 training, MXFP8: the dense linears' inputs along
# the tokens): --check counts the run's, and the activations they leave are smaller
# than bf16's by at least what the line says they save, less the 64-byte alignment of
# each replaced tensor (at most 5 a layer)
acts() { sed -n 's/.*| activations \([0-9]*\) (.*/\1/p' "$1" | head -1; }
copies() { sed -n 's/.*of which FP8\/FP4 copies \([0-9]*\) in place of \([0-9]*\) .*/\1 \2/p' "$1" | head -1; }
MX="precision%fp8_format='e4m3' precision%fp8_recipe='mxfp8'"
"$MOETRAIN" --check "$small" precision%params_dtype="'bf16'" > bf16.check 2>&1 || { cat bf16.check; fail "--check bf16"; }
# shellcheck disable=SC2086
"$MOETRAIN" --check "$small" precision%params_dtype="'bf16'" $MX > mx.check 2>&1 || { cat mx.check; fail "--check mxfp8"; }
# shellcheck disable=SC2086
"$MOETRAIN" "$small" precision%params_dtype="'bf16'" $MX training%train_iters=2 optimizer%lr_warmup_iters=1 logging%log_memory=T > mx.log 2>&1 || { cat mx.log; fail "mxfp8 run"; }
cc=$(copies mx.check); cl=$(copies mx.log); ab=$(acts bf16.check); am=$(acts mx.check)
[ -n "$cc" ] || { cat mx.check; fail "--check does not count the FP8 copies saved for backward"; }
[ "$cc" = "$cl" ] && [ "$am" = "$(acts mx.log)" ] && [ "$(bytes mx.check)" = "$(bytes mx.log)" ] ||
    fail "--check says copies $cc, activations $am; the run $cl, $(acts mx.log)"
# shellcheck disable=SC2086 # two numbers
set -- $cc
[ "$1" -gt 0 ] && [ "$1" -lt "$2" ] || fail "the copies ($1 bytes) do not replace more ($2 bytes)"
[ $((ab - am)) -ge $(($2 - $1 - 2 * 5 * 64)) ] && [ "$am" -lt "$ab" ] ||
    fail "activations $am with the copies, $ab in bf16: not the $(($2 - $1)) bytes saved"
echo "memory: mxfp8 copies $1 bytes in place of $2 (--check = --log-memory); activations $am, bf16 $ab"

expect_refused() { # expect_refused NEEDLE ARGS...: --check exits 1 naming NEEDLE
    needle=$1; shift
    "$MOETRAIN" "$@" > out.log 2> err.log && { cat out.log err.log; fail "accepted: $*"; }
    grep -q -- "$needle" err.log || { cat err.log; fail "message lacks '$needle'"; }
}
# the guard backend runs the recipes (the CPU's qdq under its checks of device memory):
# the CPU's results, bit for bit
for recipe in DELAYED NVFP4; do
    eval "r=\$$recipe"
    for b in cpu guard; do
        # shellcheck disable=SC2086
        "$MOETRAIN" --backend=$b "$small" $r training%train_iters=3 optimizer%lr_warmup_iters=1 \
            logging%log_interval=1 "logging%metrics_file='$b.jsonl'" > $b.log 2>&1 || { cat $b.log; fail "$recipe: --backend $b"; }
        grep '"loss": ' $b.jsonl | sed 's/.*\("loss": [^,]*\).*\("grad_norm": [^,]*\).*/\1 \2/' > $b.values
    done
    [ "$(wc -l < cpu.values)" -eq 3 ] && cmp -s cpu.values guard.values ||
        { paste cpu.values guard.values; fail "$recipe: --backend guard differs from --backend cpu"; }
    echo "$recipe: --backend guard = --backend cpu ($(tail -n 1 guard.values))"
done
expect_refused "fp8_recipe = 'mxfp8' quantises gradients to E4M3 as well" \
    --check "$small" "precision%fp8_format='hybrid'" "precision%fp8_recipe='mxfp8'"
expect_refused "apply to fp8_recipe = 'delayed' only" \
    --check "$small" "precision%fp8_format='e4m3'" "precision%fp8_recipe='blockwise'" precision%fp8_amax_history_len=8
expect_refused "apply to fp8_recipe = 'delayed' only (here fp8_format is '')" \
    --check "$small" precision%fp8_margin=2
expect_refused "first_last_layers_bf16 = .true. keeps layers out of FP8/FP4, but neither" \
    --check "$small" precision%first_last_layers_bf16=T
expect_refused "apply only with first_last_layers_bf16 = .true." \
    --check "$small" "precision%fp8_format='e4m3'" precision%num_layers_at_start_in_bf16=2
expect_refused "exceed &model num_layers = 2" \
    --check "$small" "$NVFP4" precision%first_last_layers_bf16=T precision%num_layers_at_end_in_bf16=2
expect_refused "fp8_format = 'e4m3' and fp4_format = 'e2m1': choose one" \
    --check "$small" "precision%fp8_format='e4m3'" "$NVFP4"
TP2="parallel%tensor_model_parallel_size=2 parallel%sequence_parallel=T"
# shellcheck disable=SC2086 # a list of overrides
expect_refused "fp8_recipe = 'blockwise' with &model num_attention_heads x kv_channels = 32 split over tensor_model_parallel_size = 2: 16 per rank is not a multiple of the recipe's 128-element blocks" \
    --check --world-size 2 "$small" "precision%fp8_format='e4m3'" "precision%fp8_recipe='blockwise'" $TP2
expect_refused "fp4_recipe = 'nvfp4' with &moe moe_ffn_hidden_size = 40 split over expert_tensor_parallel_size = 2: 20 per rank" \
    --check --world-size 2 "$small" "$NVFP4" moe%moe_ffn_hidden_size=40 parallel%expert_tensor_parallel_size=2
expect_refused "fp8_format: with context_parallel_size = 2 the linears run on token shards" \
    --check --world-size 2 "$small" "precision%fp8_format='e4m3'" parallel%context_parallel_size=2
# per-tensor scaling takes any width (tests/parallel/fp8_layouts.sh trains each recipe in TP 2 x EP 2)
# shellcheck disable=SC2086 # a list of overrides
"$MOETRAIN" --check --world-size 4 "$small" "precision%fp8_format='hybrid'" "precision%fp8_recipe='tensorwise'" \
    $TP2 parallel%expert_model_parallel_size=2 > ok.log 2>&1 || { cat ok.log; fail "tensorwise in TP 2 x EP 2 refused"; }
echo "refusals ok"

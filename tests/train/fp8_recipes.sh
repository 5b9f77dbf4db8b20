#!/bin/sh
# Each FP8/FP4 recipe trains the tiny MoE (namelists/tiny_moe.nml: GQA, QK-norm, 4
# experts top-2, bf16) for 30 iterations of one 8-sequence micro-batch, same seed and
# data as bf16: the loss falls, and the final validation loss (8 batches) is within
# the recipe's bound of bf16's. Both curves are printed (training loss every 5
# iterations). Bounds (doc/fp8.md, "Measured"): the issue's targets relative to bf16,
# blockwise and mxfp8 0.5%, delayed and tensorwise 1%, nvfp4 3%, measured against the
# run-to-run spread of such a short run (a recipe's trajectory parts from bf16's at the
# first quantised step; the spread between recipes of one precision was up to 0.6%).
. "$MT_TOP_SRCDIR/tests/train/common.sh"
cd "$tmp"
tiny="$MT_TOP_SRCDIR/namelists/tiny_moe.nml"
COMMON="training%train_iters=30 training%micro_batch_size=8 training%global_batch_size=8
training%eval_interval=30 training%eval_iters=8 optimizer%lr_warmup_iters=5 logging%log_interval=5
precision%params_dtype='bf16'"
val() { sed -n 's/.*validation loss at iteration 30 | lm loss value: \([-0-9.eE+]*\).*/\1/p' "$1"; }
train() { # train NAME OVERRIDES...
    name=$1; shift
    # shellcheck disable=SC2086 # COMMON is a list of overrides
    "$MOETRAIN" "$tiny" $COMMON "logging%metrics_file='$name.jsonl'" "$@" > "$name.log" 2>&1 ||
        { cat "$name.log"; fail "$name run"; }
    json_field "$name.jsonl" loss > "$name.curve"
    first=$(head -1 "$name.curve"); last=$(tail -1 "$name.curve")
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }' || fail "$name: loss did not fall: $first -> $last"
}
train bf16
ref=$(val bf16.log)
bad=0
while read -r name bound overrides; do
    [ -n "$name" ] || continue
    # shellcheck disable=SC2086 # overrides is a list
    train "$name" $overrides
    grep -q "low precision: $name" "$name.log" 2>/dev/null || grep -q "low precision: fp[48] $name" "$name.log" ||
        fail "$name: the log does not name the recipe"
    v=$(val "$name.log")
    echo "== $name against bf16: training loss every 5 iterations"
    paste bf16.curve "$name.curve" | awk '{ printf "  iteration %2d  bf16 %.4f  %s %.4f  (%+.2f%%)\n", 5 * NR, $1, n, $2, 100 * ($2 / $1 - 1) }' n="$name"
    awk -v v="$v" -v r="$ref" -v b="$bound" -v n="$name" 'BEGIN {
        d = 100 * (v / r - 1)
        printf "  final validation loss: bf16 %.4f, %s %.4f (%+.2f%%, bound %s%%)\n", r, n, v, d, b
        exit !(d <= b + 0 && d >= -(b + 0)) }' || { echo "FAIL: $name: validation loss beyond its bound"; bad=1; }
done <<RECIPES
delayed 1.0 precision%fp8_format='hybrid' precision%fp8_amax_history_len=16 precision%fp8_amax_compute_algo='max'
tensorwise 1.0 precision%fp8_format='hybrid' precision%fp8_recipe='tensorwise'
blockwise 0.5 precision%fp8_format='e4m3' precision%fp8_recipe='blockwise'
mxfp8 0.5 precision%fp8_format='e4m3' precision%fp8_recipe='mxfp8'
nvfp4 3.0 precision%fp4_format='e2m1'
RECIPES
[ "$bad" = 0 ] || exit 1
echo "every recipe trains within its bound of bf16"

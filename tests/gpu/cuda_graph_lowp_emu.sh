#!/bin/sh
# &cuda_graph impl = 'full_iteration' with the FP8 recipes (doc/host-overhead.md "The full
# iteration", doc/fp8.md "CUDA graphs") on the CUDA backend under the emulator: tiny_moe
# with drop-and-pad, 4 iterations of 2 micro-batches with warmup_steps = 1 (iteration 2
# captures, 3 and 4 replay), for delayed scaling (a history of 2 steps, so a history
# position frozen at the capture would write the wrong entry and keep the wrong window)
# and tensorwise on the emulated H100, MXFP8 on the emulated GB200: each against the same
# run with impl = 'none', losses and gradient norms bit-identical, and one launch and one
# host wait per step once captured (delayed scaling's histories rolled inside the graph,
# not by a launch after it). Then NVFP4's refusal at --check. Never skipped.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
EMU="${MT_TOP_BUILDDIR:-.}/tests/gpu/moetrain-emu"
export MOETRAIN_DATADIR="${MT_TOP_BUILDDIR:-.}"
tiny="$MT_TOP_SRCDIR/namelists/tiny_moe.nml"
pad="moe%expert_capacity_factor=1.0 moe%pad_expert_input_to_capacity=T"
full="cuda_graph%impl='full_iteration' cuda_graph%warmup_steps=1"

# train NAME OVERRIDES...: $tmp/NAME.log and the compared figures in $tmp/NAME.values
train() {
    name=$1
    shift
    # shellcheck disable=SC2086 # a list of overrides
    "$EMU" --backend=cuda "$tiny" training%train_iters=4 optimizer%lr_warmup_iters=1 \
        training%micro_batch_size=1 training%global_batch_size=2 training%seq_length=16 \
        logging%log_interval=1 "precision%params_dtype='bf16'" $pad \
        "logging%metrics_file='$tmp/$name.jsonl'" "$@" > "$tmp/$name.log" 2>&1 < /dev/null ||
        { cat "$tmp/$name.log"; fail "$name: training failed"; }
    grep -o '"\(loss\|grad_norm\)": [^,}]*' "$tmp/$name.jsonl" > "$tmp/$name.values"
    [ "$(wc -l < "$tmp/$name.values")" = 8 ] || { cat "$tmp/$name.log"; fail "$name: not 4 losses and norms"; }
}

# recipe NAME DEVICE OVERRIDES...: the eager run and the full iteration's, compared
recipe() {
    r=$1 device=$2
    shift 2
    MT_EMU_DEVICE=$device train "$r.eager" "$@"
    # shellcheck disable=SC2086
    MT_EMU_DEVICE=$device train "$r.full" "$@" $full
    cmp -s "$tmp/$r.eager.values" "$tmp/$r.full.values" ||
        { paste "$tmp/$r.eager.values" "$tmp/$r.full.values"; fail "$r: the full iteration differs from impl = 'none'"; }
    grep -q "| low precision: fp8 $r |" "$tmp/$r.full.log" || fail "$r: the log names another recipe"
    per=$(grep -o 'kernel launches [0-9.]*, host synchronisations [0-9.]*' "$tmp/$r.full.log" | tail -1)
    [ "$per" = "kernel launches 1.0, host synchronisations 1.0" ] ||
        { cat "$tmp/$r.full.log"; fail "$r: per step after the capture: $per, not 1 launch and 1 wait"; }
    grep -q '^ cuda graphs: .* 1 captures (0 recaptures), [1-9][0-9]* replays' "$tmp/$r.full.log" ||
        { cat "$tmp/$r.full.log"; fail "$r: the iteration was not captured once and replayed"; }
    echo "  $r: 4 losses and gradient norms bit-identical to impl = 'none'; 1 launch and 1 host wait a step"
}

recipe delayed h100 "precision%fp8_format='hybrid'" precision%fp8_amax_history_len=2 \
    "precision%fp8_amax_compute_algo='max'"
recipe tensorwise h100 "precision%fp8_format='hybrid'" "precision%fp8_recipe='tensorwise'"
recipe mxfp8 gb200 "precision%fp8_format='e4m3'" "precision%fp8_recipe='mxfp8'"

# shellcheck disable=SC2086
if "$EMU" "$tiny" --check $pad $full "precision%fp4_format='e2m1'" > "$tmp/nvfp4.log" 2>&1; then
    fail "NVFP4 with the full iteration: accepted"
fi
grep -qF "&cuda_graph impl = 'full_iteration' with &precision fp4_format = 'e2m1': NVFP4's stochastic rounding" \
    "$tmp/nvfp4.log" || { cat "$tmp/nvfp4.log"; fail "NVFP4 with the full iteration: not refused with its reason"; }
echo "  refused: NVFP4 with the full iteration"
echo "PASS: the full iteration replays what the FP8 recipes compute eagerly"

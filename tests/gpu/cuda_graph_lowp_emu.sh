#!/bin/sh
# &cuda_graph impl = 'full_iteration' with the FP8 recipes and NVFP4 (doc/host-overhead.md
# "The full iteration", doc/fp8.md "CUDA graphs" and "Random bits") on the CUDA backend
# under the emulator: tiny_moe with drop-and-pad, iterations of 2 micro-batches with
# warmup_steps = 1 (iteration 2 captures, the rest replay), for delayed scaling (a history
# of 2 steps, so a history position frozen at the capture would write the wrong entry and
# keep the wrong window) and tensorwise on the emulated H100, MXFP8 and NVFP4 on the
# emulated GB200: each against the same run with impl = 'none', losses and gradient norms
# bit-identical, and one launch and one host wait per step once captured (delayed
# scaling's histories rolled inside the graph, not by a launch after it). NVFP4 runs 5
# iterations (3 replayed), its random key advanced on the device: a seed frozen at the
# capture would replay the capture step's stochastic rounding and Hadamard signs. Then
# NVFP4 with impl = 'local' (its backward scopes replayed against the same eager run).
# Never skipped.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
EMU="${MT_TOP_BUILDDIR:-.}/tests/gpu/moetrain-emu"
export MOETRAIN_DATADIR="${MT_TOP_BUILDDIR:-.}"
tiny="$MT_TOP_SRCDIR/namelists/tiny_moe.nml"
pad="moe%expert_capacity_factor=1.0 moe%pad_expert_input_to_capacity=T"
full="cuda_graph%impl='full_iteration' cuda_graph%warmup_steps=1"

# train NAME OVERRIDES...: $tmp/NAME.log and the compared figures in $tmp/NAME.values,
# $iters iterations
iters=4
train() {
    name=$1
    shift
    # shellcheck disable=SC2086 # a list of overrides
    "$EMU" --backend=cuda "$tiny" training%train_iters=$iters optimizer%lr_warmup_iters=1 \
        training%micro_batch_size=1 training%global_batch_size=2 training%seq_length=16 \
        logging%log_interval=1 "precision%params_dtype='bf16'" $pad \
        "logging%metrics_file='$tmp/$name.jsonl'" "$@" > "$tmp/$name.log" 2>&1 < /dev/null ||
        { cat "$tmp/$name.log"; fail "$name: training failed"; }
    grep -o '"\(loss\|grad_norm\)": [^,}]*' "$tmp/$name.jsonl" > "$tmp/$name.values"
    [ "$(wc -l < "$tmp/$name.values")" = $((2 * iters)) ] ||
        { cat "$tmp/$name.log"; fail "$name: not $iters losses and norms"; }
}

# recipe NAME LABEL DEVICE OVERRIDES...: the eager run and the full iteration's, compared
# (LABEL: the recipe as the log names it)
recipe() {
    r=$1 label=$2 device=$3
    shift 3
    MT_EMU_DEVICE=$device train "$r.eager" "$@"
    # shellcheck disable=SC2086
    MT_EMU_DEVICE=$device train "$r.full" "$@" $full
    cmp -s "$tmp/$r.eager.values" "$tmp/$r.full.values" ||
        { paste "$tmp/$r.eager.values" "$tmp/$r.full.values"; fail "$r: the full iteration differs from impl = 'none'"; }
    grep -q "| low precision: $label |" "$tmp/$r.full.log" || fail "$r: the log names another recipe"
    per=$(grep -o 'kernel launches [0-9.]*, host synchronisations [0-9.]*' "$tmp/$r.full.log" | tail -1)
    [ "$per" = "kernel launches 1.0, host synchronisations 1.0" ] ||
        { cat "$tmp/$r.full.log"; fail "$r: per step after the capture: $per, not 1 launch and 1 wait"; }
    grep -q '^ cuda graphs: .* 1 captures (0 recaptures), [1-9][0-9]* replays' "$tmp/$r.full.log" ||
        { cat "$tmp/$r.full.log"; fail "$r: the iteration was not captured once and replayed"; }
    echo "  $r: $iters losses and gradient norms bit-identical to impl = 'none'; 1 launch and 1 host wait a step"
}

recipe delayed "fp8 delayed" h100 "precision%fp8_format='hybrid'" precision%fp8_amax_history_len=2 \
    "precision%fp8_amax_compute_algo='max'"
recipe tensorwise "fp8 tensorwise" h100 "precision%fp8_format='hybrid'" "precision%fp8_recipe='tensorwise'"
recipe mxfp8 "fp8 mxfp8" gb200 "precision%fp8_format='e4m3'" "precision%fp8_recipe='mxfp8'"
iters=5
recipe nvfp4 "fp4 nvfp4" gb200 "precision%fp4_format='e2m1'"

# NVFP4 with impl = 'local': its captured backward scopes replayed with each step's key
MT_EMU_DEVICE=gb200 train nvfp4.local "precision%fp4_format='e2m1'" "cuda_graph%impl='local'" \
    cuda_graph%warmup_steps=1
cmp -s "$tmp/nvfp4.eager.values" "$tmp/nvfp4.local.values" ||
    { paste "$tmp/nvfp4.eager.values" "$tmp/nvfp4.local.values"; fail "nvfp4: impl = 'local' differs from impl = 'none'"; }
grep -q '^ cuda graphs: .* [1-9][0-9]* captures (0 recaptures), [1-9][0-9]* replays' "$tmp/nvfp4.local.log" ||
    { cat "$tmp/nvfp4.local.log"; fail "nvfp4: impl = 'local' replayed no graph"; }
echo "  nvfp4: impl = 'local', $iters losses and gradient norms bit-identical to impl = 'none'"

echo "PASS: CUDA graphs replay what the FP8 recipes and NVFP4 compute eagerly"

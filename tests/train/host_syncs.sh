#!/bin/sh
# A step that stays on the device (doc/host-overhead.md, "What the host waits for"):
# the host synchronisations of a training step, counted by the guard backend (what the
# op table's contract makes a device wait for) and logged per step, are exactly what the
# design leaves, for dropless routing and for drop-and-pad, over several micro-batches.
# The losses, drops, expert loads and the gradient norm stay in backend memory and are
# read once per step; the tokens go up on the copy stream; a dropless MoE layer reads
# its split sizes (the expert offsets) once per micro-batch; drop-and-pad reads none.
# A read per micro-batch coming back (a loss, the routing accumulators, the tokens'
# upload) adds micro-batches per step and fails here.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
cd "$tmp" || exit 1
moe="$MT_TOP_SRCDIR/tests/parallel/moe.nml"
# moe.nml: layer_freq 1,0,1 (2 MoE layers), global batch 16 of micro-batches of 2 (8
# micro-batches); the expert bias off unless a run turns it on
NMOE=2 NMB=8
run() { # NAME ARGS...: four iterations on the guard backend (or $BACKEND), every one logged
    name=$1
    shift
    "$MOETRAIN" --backend="${BACKEND:-guard}" "$moe" training%train_iters=4 training%eval_interval=100 \
        moe%router_enable_expert_bias=F logging%log_interval=1 \
        "logging%metrics_file='$name.jsonl'" "$@" > "$name.log" 2>&1 ||
        { cat "$name.log"; fail "$name: training failed"; }
}
expect() { # NAME SYNCS: every iteration waited SYNCS times
    got=$(json_field "$1.jsonl" host_syncs | sort -u | tr '\n' ' ')
    [ "$got" = "$2.000 " ] || { grep 'iteration ' "$1.log" | head -4; fail "$1: host synchronisations per step: $got, not $2"; }
    echo "$1: $2 host synchronisations per step"
}
run dropless
# dropless: NMOE x NMB reads of the split sizes, and the step's one read (losses,
# drops, loads, gradient norm) = 2 x 8 + 1
expect dropless $((NMOE * NMB + 1))
run pad moe%expert_capacity_factor=1.0 moe%pad_expert_input_to_capacity=T
# drop-and-pad: static offsets, nothing per micro-batch: the step's one read
expect pad 1
# twice the micro-batches: twice the dropless reads, the same one read per step
run dropless16 training%global_batch_size=32
expect dropless16 $((NMOE * 2 * NMB + 1))
PAD="moe%expert_capacity_factor=1.0 moe%pad_expert_input_to_capacity=T"
AG="moe%token_dispatcher_type='allgather'"
# the expert bias (sigmoid router): updated on the device from the loads kept there,
# nothing uploaded: no extra wait, dropless (2 x 8 + 1) or with drop-and-pad (1)
run bias moe%router_enable_expert_bias=T
expect bias $((NMOE * NMB + 1))
# shellcheck disable=SC2086 # two overrides
run bias_pad moe%router_enable_expert_bias=T $PAD
expect bias_pad 1
# the all-gather dispatcher: the routing masked and renumbered on the backend; dropless
# its one read per MoE layer and micro-batch is the count of its experts' rows (2 x 8 +
# 1), with drop-and-pad the rows are static and nothing is read (1)
run allgather "$AG"
expect allgather $((NMOE * NMB + 1))
# shellcheck disable=SC2086 # two overrides
run allgather_pad "$AG" $PAD
expect allgather_pad 1
# selective recompute of the dropless MoE layers: the rebuild plans what its forward
# planned and takes its offsets from the forward: still 2 x 8 + 1
run recompute "recompute%granularity='selective'" "recompute%modules='moe'"
expect recompute $((NMOE * NMB + 1))
# FP8: delayed scaling's amax histories and scales updated on the device, nothing read
# or uploaded for them; the routed experts' quantised GEMMs split by the host's copy of
# the expert offsets, nothing read back per GEMM: the waits of BF16, dropless (2 x 8 +
# 1) and with drop-and-pad (1), for delayed and blockwise scaling
DELAYED="precision%fp8_format='e4m3' precision%fp8_recipe='delayed'"
BLOCKWISE="precision%fp8_format='e4m3' precision%fp8_recipe='blockwise'"
# shellcheck disable=SC2086 # lists of overrides
{
    run fp8_delayed $DELAYED
    expect fp8_delayed $((NMOE * NMB + 1))
    run fp8_delayed_pad $DELAYED $PAD
    expect fp8_delayed_pad 1
    run fp8_blockwise $BLOCKWISE
    expect fp8_blockwise $((NMOE * NMB + 1))
    run fp8_blockwise_pad $BLOCKWISE $PAD
    expect fp8_blockwise_pad 1
}
# the losses are still what the CPU backend computes (its reads are plain memory), the
# expert bias's, the all-gather dispatcher's and FP8's too
same() { # CPU GUARD: equal losses and norms
    for key in loss grad_norm aux_loss z_loss; do
        [ "$(json_field "$1.jsonl" $key)" = "$(json_field "$2.jsonl" $key)" ] ||
            fail "guard ($2) and cpu ($1) differ in $key"
    done
}
BACKEND=cpu run cpu
same cpu dropless
BACKEND=cpu run cpu_bias moe%router_enable_expert_bias=T
same cpu_bias bias
# shellcheck disable=SC2086 # two overrides
BACKEND=cpu run cpu_allgather_pad "$AG" $PAD
same cpu_allgather_pad allgather_pad
# shellcheck disable=SC2086 # a list of overrides
BACKEND=cpu run cpu_fp8_blockwise $BLOCKWISE
same cpu_fp8_blockwise fp8_blockwise
echo "PASS: one host synchronisation per step, and one per dropless MoE layer and micro-batch"

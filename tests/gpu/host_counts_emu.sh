#!/bin/sh
# The CUDA backend's own count of kernel launches and host synchronisations (struct
# mt_op_counts, which a run on a real GPU reports too) against what the emulated device
# saw, over a short bf16 training run of the tiny model, with device work run at once
# and deferred per stream (MT_EMU_STREAMS=deferred): they must be equal. The guard
# backend's count (what the op table's contract makes a device wait for) is printed
# beside it. Then the step that stays on the device (doc/host-overhead.md, "What the host
# waits for"): after the first iteration (which uploads the RoPE table, once)
# a step of tiny_moe waits for the device exactly 2 MoE layers x 2 micro-batches + 1
# (the step's one read of its losses and gradient norm) = 5 times with dropless
# routing, and once with drop-and-pad, on the emulated GPU as on the guard backend. A
# read per micro-batch coming back adds 2 or more and fails here. Never skipped: the
# emulator is part of every build with CUDA emulation.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
EMU="${MT_TOP_BUILDDIR:-.}/tests/gpu/moetrain-emu"
cd "$tmp" || exit 1
run() { # run NAME BACKEND MOETRAIN [OVERRIDES]
    name=$1 backend=$2 bin=$3
    shift 3
    "$bin" --backend="$backend" "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" training%train_iters=3 \
        optimizer%lr_warmup_iters=1 training%eval_interval=100 training%eval_iters=0 \
        "precision%params_dtype='bf16'" logging%log_interval=1 \
        "logging%metrics_file='$name.jsonl'" "$@" > "$name.log" 2>&1 ||
        { cat "$name.log"; fail "$name: training failed"; }
    grep '^moetrain: host costs\|^moetrain: the emulated device' "$name.log" | sed "s/^/$name: /"
}
steady() { # NAME SYNCS: the iterations after the first waited SYNCS times each
    got=$(json_field "$1.jsonl" host_syncs | sed 1d | sort -u | tr '\n' ' ')
    [ "$got" = "$2.000 " ] || fail "$1: host synchronisations per step after warm-up: $got, not $2"
    echo "$1: $2 host synchronisations per step"
}
run immediate cuda "$EMU"
MT_EMU_STREAMS=deferred run deferred cuda "$EMU"
for r in immediate deferred; do
    grep -q '^moetrain: host costs of the cuda backend since it started: [1-9][0-9]* kernel launches, [1-9][0-9]* host synchronisations' "$r.log" ||
        fail "$r: no count of the cuda backend's launches and synchronisations"
    grep -q '^moetrain: the emulated device saw [0-9]* kernel launches and [0-9]* host synchronisations (the same)$' "$r.log" ||
        fail "$r: the backend's counts are not what the emulated device saw"
    steady "$r" 5
done
run guard guard "$MOETRAIN"
grep -q '^moetrain: host costs of the guard backend since it started: [1-9]' guard.log ||
    fail "guard: no count of launches and synchronisations"
steady guard 5
PAD="moe%expert_capacity_factor=1.0 moe%pad_expert_input_to_capacity=T"
# shellcheck disable=SC2086 # two overrides
MT_EMU_STREAMS=deferred run pad cuda "$EMU" $PAD
steady pad 1
echo "PASS: the cuda backend counts what the emulated device sees; a step waits 5 times dropless, once with drop-and-pad"

#!/bin/sh
# The CUDA backend's own count of kernel launches and host synchronisations (struct
# mt_op_counts, which a run on a real GPU reports too) against what the emulated device
# saw, over a short bf16 training run of the tiny model, with device work run at once
# and deferred per stream (MT_EMU_STREAMS=deferred): they must be equal. The guard
# backend's count (what the op table's contract makes a device wait for) is printed
# beside it. Never skipped: the emulator is part of every build with CUDA emulation.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
EMU="${MT_TOP_BUILDDIR:-.}/tests/gpu/moetrain-emu"
cd "$tmp" || exit 1
run() { # run NAME BACKEND MOETRAIN
    "$3" --backend="$2" "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" training%train_iters=3 \
        optimizer%lr_warmup_iters=1 training%eval_interval=100 "precision%params_dtype='bf16'" \
        > "$1.log" 2>&1 || { cat "$1.log"; fail "$1: training failed"; }
    grep '^moetrain: host costs\|^moetrain: the emulated device' "$1.log" | sed "s/^/$1: /"
}
run immediate cuda "$EMU"
MT_EMU_STREAMS=deferred run deferred cuda "$EMU"
for r in immediate deferred; do
    grep -q '^moetrain: host costs of the cuda backend since it started: [1-9][0-9]* kernel launches, [1-9][0-9]* host synchronisations' "$r.log" ||
        fail "$r: no count of the cuda backend's launches and synchronisations"
    grep -q '^moetrain: the emulated device saw [0-9]* kernel launches and [0-9]* host synchronisations (the same)$' "$r.log" ||
        fail "$r: the backend's counts are not what the emulated device saw"
done
run guard guard "$MOETRAIN"
grep -q '^moetrain: host costs of the guard backend since it started: [1-9]' guard.log ||
    fail "guard: no count of launches and synchronisations"
echo "PASS: the cuda backend counts what the emulated device sees"

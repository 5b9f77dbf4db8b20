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
# read per micro-batch coming back adds 2 or more and fails here. The same counts, on
# micro-batches cut to 2 x 64 tokens (2 iterations: one after the first), with the
# expert bias, the all-gather dispatcher, selective recompute of the MoE layers, and
# the FP8 recipes delayed and blockwise (their routed experts split their GEMMs by the
# host's copy of the expert offsets: nothing read back per GEMM), each FP8 run's losses
# within bounds of the CPU backend's (tests/gpu/lowp_train_emu.sh: 5e-3 before the
# first update). Never skipped: the emulator is part of every build with CUDA emulation.
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
# the short runs: 2 micro-batches of 2 x 64 tokens a step, so still 2 x 2 + 1 dropless
SHORT="training%micro_batch_size=2 training%global_batch_size=4 training%seq_length=64 training%train_iters=2"
AG="moe%token_dispatcher_type='allgather'"
RC="recompute%granularity='selective' recompute%modules='moe'"
DELAYED="precision%fp8_format='hybrid' precision%fp8_recipe='delayed' precision%fp8_amax_history_len=2"
BLOCKWISE="precision%fp8_format='e4m3' precision%fp8_recipe='blockwise'"
# NAME SYNCS OVERRIDES: the emulated GPU waits SYNCS times a step after the first
for leg in \
    "bias 5 moe%router_enable_expert_bias=T moe%router_score_function='sigmoid'" \
    "allgather 5 $AG" \
    "allgather_pad 1 $AG $PAD" \
    "recompute 5 $RC" \
    "fp8_delayed 5 $DELAYED" \
    "fp8_delayed_pad 1 $DELAYED $PAD" \
    "fp8_blockwise 5 $BLOCKWISE" \
    "fp8_blockwise_pad 1 $BLOCKWISE $PAD" \
    "fp8_allgather 5 $DELAYED $AG" \
    "fp8_recompute 5 $BLOCKWISE $RC"; do
    # shellcheck disable=SC2086 # name, syncs and a list of overrides
    set -- $leg
    n=$1 want=$2
    shift 2
    # shellcheck disable=SC2086 # a list of overrides
    MT_EMU_STREAMS=deferred run "$n" cuda "$EMU" $SHORT "$@"
    steady "$n" "$want"
    case $n in fp8_*) ;; *) continue ;; esac
    # shellcheck disable=SC2086 # a list of overrides
    run "$n.cpu" cpu "$MOETRAIN" $SHORT "$@"
    json_field "$n.cpu.jsonl" loss > cpu.loss
    json_field "$n.jsonl" loss > cuda.loss
    paste cpu.loss cuda.loss | awk -v r="$n" '
        function abs(x) { return x < 0 ? -x : x }
        { d = abs($2 - $1); printf "%s iteration %d: loss cpu %s cuda %s |difference| %.2e%s\n", r, NR, $1, $2, d,
                 (d > 5e-3 ? " FAIL" : "")
          if (d > 5e-3 || $2 !~ /^[0-9.]+([eE][-+]?[0-9]+)?$/) bad = 1 }
        END { if (NR != 2) { print r ": " NR " losses, expected 2"; bad = 1 } exit bad }' ||
        fail "$n: --backend cuda is not within bounds of --backend cpu"
done
echo "PASS: the cuda backend counts what the emulated device sees; a step waits 5 times dropless, once with drop-and-pad, also with the expert bias, the all-gather dispatcher, recompute and FP8"

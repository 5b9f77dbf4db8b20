#!/bin/sh
# The NCCL communicators of the parallel groups without a GPU (src/runtime/parallel.c,
# mt_parallel_use_device), over the emulated NCCL (tests/runtime/emu-nccl/libnccl.so.2):
#   - parallel_check-emu on 4 and 8 processes for layouts whose groups coincide in
#     different ways: each rank has the communicators the plan promises (their number,
#     which kinds share one, none where no device traffic goes), each device transport
#     sums and gathers like its host transport, a device-memory call on a kind without
#     one fails naming the group; rank 0's log line gives the count and the sharing;
#   - moetrain-emu --backend cuda on 4 processes, PP 2 x DP 2 x EP 2 (activations between
#     stages, the tied embedding's gradient, the all-to-all dispatcher, ZeRO-less gradient
#     sums, all in device memory) against 1 process: 2 iterations' loss and gradient norm
#     within 1e-5 relative (one micro-batch per data-parallel rank, so the gradient sums
#     differ from one process's only in the norm's order: measured 2e-8), and the startup
#     line's count. (TP's sums in bf16 differ from one process's by more than the order
#     of a sum; its collectives are parallel_check's.);
#   - FP8 (tensorwise, blockwise) and NVFP4 with TP 2 and ETP 2 on the CUDA backend
#     against one process, within tests/parallel/fp8_layouts.sh's bounds.
# Not skipped in a build with the emulator and NCCL (it is not built otherwise).
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
need_mpirun
prog=$(own parallel_check_emu "$MT_TOP_BUILDDIR/tests/runtime/parallel_check-emu")
use_emulated_nccl 8
MT_EMU_NCCL_INPROGRESS=2 # comm_nccl.c's polling of nonblocking splits runs
export MT_EMU_NCCL_INPROGRESS
cd "$tmp"

# layout N TP PP EP ETP LINE...: parallel_check-emu on N processes passes, and rank 0's
# log line contains each LINE
layout() {
    n=$1 tp=$2 pp=$3 ep=$4 etp=$5; shift 5
    mpirun_np $n "$prog" $tp $pp $ep $etp > out 2> err ||
        { cat out err; fail "parallel_check-emu on $n processes, TP $tp PP $pp EP $ep ETP $etp"; }
    grep -q "passed on $n processes" out || { cat out err; fail "$n processes: no verdict"; }
    for want in "$@"; do
        grep -qF -- "$want" out || { cat out err; fail "TP $tp PP $pp EP $ep ETP $etp: no '$want' in the log line"; }
    done
    sed -n 's/^parallel_check: NCCL/  NCCL/p' out
    echo "ok: $n processes, TP $tp PP $pp EP $ep ETP $etp"
}
# CP = ETP = 1: EP and ETP x EP are the TP groups, expert DP the DP groups (13 before)
layout 4 2 1 2 1 'NCCL communicators: 4 on this process (world + tp, dp, pp (1 rank);' \
    'shared: embedding = pp, ep = tp, etp = pp, etp-ep = tp, edp = dp;' \
    'host only: cp, dp-cp, tp-cp, mp' '4 on every process, split from the world'"'"'s by 3'
# ETP 2: ETP is TP, EP is DP, ETP x EP the world
layout 4 2 1 2 2 'NCCL communicators: 4 on this process' 'ep = dp, etp = tp, etp-ep = world, edp = pp'
# 8 processes, EP 4: expert groups of their own
layout 8 2 1 4 1 'NCCL communicators: 6 on this process (world + tp, dp, pp (1 rank), ep, edp;' \
    'etp-ep = ep'
layout 8 2 1 2 2 'NCCL communicators: 7 on this process (world + tp, dp, pp (1 rank), ep, etp-ep, edp;'
# PP 4: the pipeline group is the world; no embedding group in the middle stages
layout 4 1 4 1 1 'NCCL communicators: 3 on this process (world + tp (1 rank), embedding;' \
    'pp = world' '2 to 3 per process'

# The trainer: PP 2 x DP 2 x EP 2 on 4 emulated devices against 1 process.
set -- --backend=cuda "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" "precision%params_dtype='bf16'" \
    training%train_iters=2 training%eval_interval=100 training%eval_iters=0 \
    optimizer%lr_warmup_iters=0 training%global_batch_size=4 training%micro_batch_size=2 \
    training%seq_length=64 logging%log_interval=1 "logging%metrics_file='m.jsonl'"
mkdir one four
(cd one && timeout 300 "$emu" "$@" > out.log 2>&1 < /dev/null) ||
    { cat one/out.log; fail "moetrain-emu on one process"; }
(cd four && timeout 600 "$MPIRUN" --oversubscribe -np 4 "$emu" "$@" \
    parallel%pipeline_model_parallel_size=2 parallel%expert_model_parallel_size=2 \
    parallel%distributed_timeout_minutes=5 \
    > out.log 2>&1 < /dev/null) ||
    { cat four/out.log; fail "moetrain-emu on four processes (PP 2 x DP 2 x EP 2)"; }
grep -F 'moetrain: NCCL communicators: 4 on this process (world + tp (1 rank), dp, pp; shared: embedding = pp, ep = dp,' four/out.log ||
    { cat four/out.log; fail "no NCCL communicator count in the startup log"; }
values() { sed -n "s/.*\"$1\": \([-0-9.eE+naif]*\).*/\1/p" "$2/m.jsonl"; }
for key in loss grad_norm; do
    values $key one > a; values $key four > b
    [ "$(wc -l < a)" -eq 2 ] && [ "$(wc -l < b)" -eq 2 ] ||
        { cat one/m.jsonl four/m.jsonl; fail "expected 2 values of $key from each run"; }
    paste a b | awk -v key=$key '{ d = $1 - $2; if (d < 0) d = -d
        printf "  iteration %d %s: %s (1 process), %s (4 processes)\n", NR, key, $1, $2
        if (!(d <= 1e-5 * ($1 < 0 ? -$1 : $1))) bad = 1 } END { exit bad }' ||
        fail "$key differs by more than 1e-5 relative between 1 and 4 processes"
done
echo "ok: moetrain-emu --backend=cuda on 4 processes (PP 2 x DP 2 x EP 2 over the emulated NCCL)"

# FP8 with tensor parallelism on the CUDA backend (kernels/cuda/cuda_qdq.cu, "Shards"):
# TP 2 (sequence parallel; expert tensor parallelism follows it, ETP 2) on 2 emulated
# devices against the CUDA backend on 1 process, 2 iterations, tensorwise (its scales
# from the amax of the whole tensor, max-reduced over the TP group) and blockwise (at
# widths whose halves are whole 128-blocks: 8 heads and query groups of 32, expert FFN
# 256). Bounds: tests/parallel/fp8_layouts.sh's, loss 2e-6 and gradient norm 5e-5
# relative (TP sums the row-parallel outputs in bf16 in another order; an operand
# element within a rounding of a midpoint between two FP8 codes can quantise the other
# way). Measured: loss within 4e-9, gradient norm 2.2e-9 at iteration 1 and 1.8e-5 at
# iteration 2 (tensorwise), 3.4e-9 (blockwise). Broken on purpose (not committed): the
# CUDA qdq scaling a shard by its own amax, tensorwise's loss 2.4e-4 and gradient norm
# 6e-4 apart at iteration 1. Each run's log counts the grouped expert
# GEMMs (the routed experts' quantised GEMMs of a use in one launch).
lowp() { # lowp NAME ITERATIONS OVERRIDES...: TP 2 against 1 process
    name=$1 iters=$2
    shift 2
    mkdir "$name.one" "$name.tp2"
    set -- "$@" training%train_iters="$iters"
    (cd "$name.one" && timeout 600 "$emu" "$@" > out.log 2>&1 < /dev/null) ||
        { cat "$name.one/out.log"; fail "$name: moetrain-emu on one process"; }
    (cd "$name.tp2" && timeout 900 "$MPIRUN" --oversubscribe -np 2 "$emu" "$@" \
        parallel%tensor_model_parallel_size=2 parallel%sequence_parallel=T parallel%distributed_timeout_minutes=5 \
        > out.log 2>&1 < /dev/null) ||
        { cat "$name.tp2/out.log"; fail "$name: moetrain-emu with TP 2 (FP8/FP4 on tensor-parallel shards)"; }
    grep -qF 'layout TP 2 x CP 1 x PP 1 x DP 1, experts ETP 2 x EP 1' "$name.tp2/out.log" ||
        { cat "$name.tp2/out.log"; fail "$name: not the layout TP 2, ETP 2"; }
    for d in one tp2; do
        grep '^moetrain: low-precision GEMMs: .* [1-9][0-9]* grouped launches of [1-9][0-9]* expert GEMMs; [0-9]* quantisations fused with their producer$' \
            "$name.$d/out.log" || { cat "$name.$d/out.log"; fail "$name.$d: no grouped expert GEMM counted"; }
    done
    for key in loss grad_norm; do
        values $key "$name.one" > a; values $key "$name.tp2" > b
        [ "$(wc -l < a)" -eq "$iters" ] && [ "$(wc -l < b)" -eq "$iters" ] ||
            { cat "$name.one/m.jsonl" "$name.tp2/m.jsonl"; fail "$name: expected $iters values of $key from each run"; }
        tol=2e-6; [ $key = grad_norm ] && tol=5e-5
        paste a b | awk -v key=$key -v tol=$tol -v name="$name" '{ d = $1 - $2; if (d < 0) d = -d
            printf "  %s iteration %d %s: %s (1 process), %s (TP 2), relative %.1e\n", name, NR, key, $1, $2, d / ($1 < 0 ? -$1 : $1)
            if (!(d <= tol * ($1 < 0 ? -$1 : $1))) bad = 1 } END { exit bad }' ||
            fail "$name: $key differs by more than $tol relative between 1 process and TP 2"
    done
    echo "ok: $name with TP 2 and ETP 2 on the CUDA backend matches one process"
}
lowp tensorwise 2 "$@" "precision%fp8_format='hybrid'" "precision%fp8_recipe='tensorwise'"
lowp blockwise 2 "$@" "precision%fp8_format='e4m3'" "precision%fp8_recipe='blockwise'" model%num_attention_heads=8 \
    model%num_query_groups=8 moe%moe_ffn_hidden_size=256

# NVFP4 with TP 2 and ETP 2 on the CUDA backend (an emulated GB200, which runs NVFP4;
# struct mt_quant_ops fp4_shards): each shard quantised in its place in the whole
# tensor, its gradients' stochastic rounding drawing each element's index there, its
# fp32 scale from the whole tensor's amax (max-reduced over the group), at the tiny
# MoE's widths (every split a multiple of the 16-element blocks per rank). One
# iteration, as fp8_layouts.sh compares its layouts, within the FP8 legs' bounds:
# from the second on, an operand element at a midpoint between two E2M1 codes, which
# TP's bf16 sums in another order move, rounds the other way, a step of the format
# that the update passes on (measured at iteration 2: loss 8.6e-6, gradient norm
# 5.3e-5; fp8_layouts.sh's CPU layouts part by 8e-6 to 1.3e-4 there). Measured at
# iteration 1: loss 3.6e-9, gradient norm 3.6e-7. Broken on purpose (not committed):
# the shards' random bytes drawn by their own element indices, gradient norm 3.2e-3
# (the loss equal: only the gradients round stochastically).
MT_EMU_DEVICE=gb200
export MT_EMU_DEVICE
lowp nvfp4 1 "$@" "precision%fp4_format='e2m1'"

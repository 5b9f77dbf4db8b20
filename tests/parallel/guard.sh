#!/bin/sh
# Every collective of the parallel layouts moves backend memory the way a GPU run does:
# under --backend guard (device memory that host code cannot touch; collectives on it
# go through the comms' device path, NCCL's place on a GPU) each layout trains,
# evaluates, checkpoints and resumes with metrics identical, bit for bit, to the same
# layout on --backend cpu: TP with SP, EP with both dispatchers, ETP, ZeRO, capacity
# drops, 1F1B and interleaved pipelines.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
strip() { sed 's/"elapsed_ms[^,]*, "tokens_per_s[^,]*, "tflops[^,]*,//; s/, "host_cpu_ms".*}/}/' "$1"; }
L4="model%num_layers=4 moe%layer_freq=1,0,1,1"
L8="model%num_layers=8 moe%layer_freq=1,0,1,1,0,1,0,1"
PP2="parallel%pipeline_model_parallel_size=2"
VPP2="parallel%virtual_pipeline_model_parallel_size=2"
CAP="moe%expert_capacity_factor=1.0"
while read -r lay np layout; do
    [ -n "$lay" ] || continue
    # shellcheck disable=SC2086 # layout is a list of overrides
    run "${lay}_cpu" "$np" --backend=cpu training%train_iters=4 $layout
    # shellcheck disable=SC2086
    run "${lay}_guard" "$np" --backend=guard training%train_iters=4 $layout
    grep -q "backend guard" "${lay}_guard.log" || fail "$lay: not on the guard backend"
    strip "${lay}_cpu.jsonl" > a.txt
    strip "${lay}_guard.jsonl" > b.txt
    [ -s a.txt ] || fail "$lay: no metrics"
    cmp -s a.txt b.txt || { diff a.txt b.txt | head; fail "$lay: guard differs from cpu"; }
    same_ckpt "${lay}_cpu/iter_0000004" "${lay}_guard/iter_0000004" ||
        fail "$lay: the final checkpoints differ"
    echo "$lay: guard = cpu"
done <<LAYOUTS
tp2_ep2_dp2_zero1 4 $TP2 $EP2 $ETP1 $ZERO $CAP
ep2_etp2_allgather 4 $EP2 $ETP2 $AG
pp2_tp2 4 $PP2 $TP2 $L4
pp2_vpp2_ep2 4 $PP2 $VPP2 $EP2 $L8
LAYOUTS
# a resume in a layout under guard (the distributed checkpoint path): bit-exact
set -- $TP2 $EP2 $ETP1 $ZERO $CAP
run resume_a 4 --backend=guard training%train_iters=4 training%exit_interval=2 "$@"
run resume_b 4 --backend=guard training%train_iters=4 "checkpoint%load='resume_a'" "$@"
grep -q "loaded checkpoint" resume_b.log || fail "the resumed run did not load"
same_ckpt tp2_ep2_dp2_zero1_guard/iter_0000004 resume_b/iter_0000004 ||
    fail "resume under guard differs from the straight run"
echo "resume under guard: bit-exact"

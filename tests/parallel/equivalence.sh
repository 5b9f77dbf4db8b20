#!/bin/sh
# Layout equivalence, the central test (doc/architecture.md, section 5): the same seed, data and
# global batch give the same loss trajectory, gradient norms, routing statistics and
# final parameters (gathered into the one-process checkpoint format) in every layout
# as in one process, run for real under mpirun. Tolerances: tests/parallel/common.sh.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
# Short runs (common.sh, ROUTE_MARGIN): 4 steps of 8 one-sequence micro-batches of 16
# tokens, still 2 micro-batches per step on each of 4 DP replicas; 1536 top-k
# decisions, all clear of ties at 9 seeds of 20.
SHORT="training%micro_batch_size=1 training%global_batch_size=8 training%seq_length=16
training%train_iters=4 training%eval_interval=4"
# shellcheck disable=SC2086 # a list of overrides
reference one $SHORT
# name NP overrides: DP with and without the distributed optimizer, TP with SP (uneven
# vocabulary shards), EP and ETP with both dispatchers, and folded layouts in which the
# expert groups cut across the attention groups.
while read -r name np layout; do
    [ -n "$name" ] || continue
    # shellcheck disable=SC2086 # layout is a list of overrides
    run "$name" "$np" $SHORT "$seed" $layout
    same_as one "$name"
done <<LAYOUTS
dp2 2
dp2_zero1 2 $ZERO
tp2_sp 2 $TP2
tp4_sp 4 $TP4 $ETP1
ep2 2 $EP2
ep4 4 $EP4
ep2_etp2 4 $EP2 $ETP2
ep4_allgather 4 $EP4 $AG
ep2_etp2_allgather 4 $EP2 $ETP2 $AG
tp2_ep2_dp2 4 $TP2 $EP2 $ETP1
tp2_ep4 4 $TP2 $EP4 $ETP1
tp2_etp2_ep2_allgather 4 $TP2 $EP2 $AG
tp2_etp2_ep2_dp4_zero1 8 $TP2 $EP2 $ETP2 $ZERO
LAYOUTS
# FP8 (doc/fp8.md, Parallel layouts): delayed scaling's amaxes are reduced (max) over
# the world after each step, so every rank keeps the histories one process keeps;
# data-parallel replicas with ZeRO-1, and 2 pipeline stages holding other layers' slots,
# match one process. (Tensor, sequence and expert parallelism refuse FP8 at --check.)
# Parameters and moments within 5e-3 here, not TOL_PARAMS: quantisation takes decisions
# as routing does. An operand element at a rounding tie between two FP8 codes goes one
# way or the other by the layouts' rounding (after step 1 the weights differ by it),
# and the gradient element it feeds moves by up to one FP8 step (1/8 relative for E4M3,
# 1/4 for E5M2). Measured under OpenBLAS's Nehalem kernel: Adam m of a gate_proj 1.1e-4
# (parameters 5.4e-6; loss, norms and routing as tight as without FP8, which keep their
# bounds). Scales that disagreed over the ranks (histories not reduced) would quantise
# every element otherwise: percents.
FP8="precision%fp8_format='hybrid' precision%fp8_amax_history_len=4 precision%fp8_amax_compute_algo='max'"
TOL_PARAMS=5e-3
# shellcheck disable=SC2086 # lists of overrides
{
    reference one_fp8 $SHORT $FP8
    run dp2_zero1_fp8 2 $SHORT "$seed" $FP8 $ZERO
    same_as one_fp8 dp2_zero1_fp8
    run pp2_fp8 2 $SHORT "$seed" $FP8 parallel%pipeline_model_parallel_size=2 \
        parallel%decoder_last_pipeline_num_layers=1
    same_as one_fp8 pp2_fp8
}
echo "every layout matches one process"

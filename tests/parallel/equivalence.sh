#!/bin/sh
# Layout equivalence, the central test (DESIGN.md section 5): the same seed, data and
# global batch give the same loss trajectory, gradient norms, routing statistics and
# final parameters (gathered into the one-process checkpoint format) in every layout
# as in one process, run for real under mpirun. Tolerances: tests/parallel/common.sh.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
run one 1
# name NP overrides: DP with and without the distributed optimizer, TP with SP (uneven
# vocabulary shards), EP and ETP with both dispatchers, and folded layouts in which the
# expert groups cut across the attention groups.
while read -r name np layout; do
    [ -n "$name" ] || continue
    # shellcheck disable=SC2086 # layout is a list of overrides
    run "$name" "$np" $layout
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
echo "every layout matches one process"

#!/bin/sh
# The distributed optimizer (ZeRO-1, with one bucket and with many small ones) gives
# the same update as the all-reduce one, bit for bit (tests/parallel/optim_check.c),
# over DP alone and over a folded layout (TP x DP for dense parameters, EP x expert-DP
# for the experts).
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
check="$MT_TOP_BUILDDIR/tests/parallel/optim_check"
for layout in "2" "4 $TP2 $EP2 $ETP1"; do
    # shellcheck disable=SC2086 # np and a list of overrides
    set -- $layout
    np=$1
    shift
    mpirun_np "$np" "$check" "$nml" "$@" > out.log 2>&1 < /dev/null || { cat out.log; fail "$np processes: $*"; }
    grep passed out.log
done

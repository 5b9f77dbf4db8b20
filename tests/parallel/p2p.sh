#!/bin/sh
# mt_p2p_batch, the batched point-to-point exchange of the interleaved pipeline
# schedule: ring exchanges in both directions at once (which blocking sends would
# deadlock) with 2 and 3 processes (tests/parallel/p2p_check.c).
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
check="$MT_TOP_BUILDDIR/tests/parallel/p2p_check"
for np in 2 3; do
    mpirun_np "$np" "$check" > out.log 2>&1 < /dev/null || { cat out.log; fail "$np processes"; }
    grep passed out.log
done

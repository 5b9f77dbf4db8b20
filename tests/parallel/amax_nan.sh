#!/bin/sh
# The FP8 amaxes' MAX all-reduce over ranks keeps a NaN (tests/parallel/amax_check.c):
# one rank's NaN amax reaches every rank as a non-finite amax, on 2 and 3 processes.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
check="$MT_TOP_BUILDDIR/tests/parallel/amax_check"
for np in 2 3; do
    mpirun_np "$np" "$check" > out.log 2>&1 < /dev/null || { cat out.log; fail "$np processes"; }
    grep passed out.log
done

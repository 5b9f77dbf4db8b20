#!/bin/sh
# Every collective of the MPI backend, on the world and on split groups, on
# 4 processes, an odd 3, and 1 under mpirun; and the self world of a process
# started plainly. comm_check compares every result with one computed by hand
# and the processes agree on the verdict.
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
need_mpirun
prog=$(own mt_collectives "$MT_TOP_BUILDDIR/tests/runtime/comm_check")
cd "$tmp"

"$prog" > out 2> err || { cat out err; fail "comm_check alone"; }
grep -q 'passed: .* on each of 1 processes (1 nodes, none)' out || { cat out err; fail "alone: no verdict"; }

for n in 4 3 1; do
    mpirun_np "$n" "$prog" > out 2> err || { cat out err; fail "comm_check on $n processes"; }
    grep -q "passed: .* on each of $n processes (1 nodes, pmix (mpirun))" out ||
        { cat out err; fail "$n processes: no verdict"; }
    r=0
    while [ $r -lt "$n" ]; do
        grep -q "info: rank $r of $n, local $r of $n, node 0 of 1, host .*, launcher pmix (mpirun)" out ||
            { cat out; fail "$n processes: rank $r's line is missing or wrong"; }
        r=$((r + 1))
    done
    [ "$(count FAIL err)" -eq 0 ] || { cat err; fail "$n processes: failures reported"; }
    echo "ok: $n processes"
done
nothing_left mt_collectives

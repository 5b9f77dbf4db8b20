#!/bin/sh
# A process that hangs or dies in the middle of a run ends the whole job with
# a non-zero status within the timeout, and the survivors' messages name the
# collective and the group that waited; nothing is left running.
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
need_mpirun
prog=$(own mt_faults "$MT_TOP_BUILDDIR/tests/runtime/comm_check")
cd "$tmp"

# run_fault MODE VICTIM: 4 processes, timeout 2 s, must end non-zero in 20 s
run_fault() {
    start=$(date +%s)
    mpirun_np 4 "$prog" "$1" "$2" 2 > out 2> err && { cat out err; fail "$1 $2: exit status 0"; }
    took=$(($(date +%s) - start))
    [ "$took" -le 20 ] || { cat out err; fail "$1 $2: took $took s"; }
    nothing_left mt_faults
    echo "ok: $1 of rank $2 ended the job in $took s"
}

# Rank 1 hangs: its partner in tp[0] (rank 0) times out in the all_reduce;
# ranks 2 and 3 finish theirs and time out in the world barrier.
run_fault hang 1
# Whichever survivor's deadline passes first ends the job, so under load the
# world-barrier message may be the one printed: either names its collective.
grep -Eq 'rank 0: all_reduce on tp\[0\] timed out: rank 0 of 2 \(world rank 0\) waited 2\.[0-9] s|rank [23]: barrier on world timed out: rank [23] of 4 \(world rank [23]\) waited 2\.[0-9] s' err ||
    { cat err; fail "hang: no timeout message naming all_reduce on tp[0] (or the world barrier)"; }
# Rank 2 hangs: rank 3 names tp[1].
run_fault hang 2
grep -Eq 'rank 3: all_reduce on tp\[1\] timed out: rank 1 of 2 \(world rank 3\)|rank [01]: barrier on world timed out' err ||
    { cat err; fail "hang: no timeout message naming all_reduce on tp[1] (or the world barrier)"; }
# Rank 1 hangs while its partner waits for a started reduce_scatter: the wait times
# out within the timeout, naming the collective and the group.
run_fault hang-nb 1
grep -Eq 'rank 0: reduce_scatter on tp\[0\] timed out: rank 0 of 2 \(world rank 0\) waited 2\.[0-9] s|rank [23]: barrier on world timed out' err ||
    { cat err; fail "hang-nb: no timeout message naming reduce_scatter on tp[0] (or the world barrier)"; }
# The same while its partner waits for a started p2p batch (mt_p2p_batch_start): the
# wait names the p2p batch and the group.
run_fault hang-p2p 1
grep -Eq 'rank 0: p2p batch on tp\[0\] timed out: rank 0 of 2 \(world rank 0\) waited 2\.[0-9] s|rank [23]: barrier on world timed out' err ||
    { cat err; fail "hang-p2p: no timeout message naming the p2p batch on tp[0] (or the world barrier)"; }
# Rank 1 is killed: mpirun or the timeout ends the job.
run_fault kill 1

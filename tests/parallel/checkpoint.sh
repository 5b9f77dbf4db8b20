#!/bin/sh
# Distributed checkpoints use the one-process format: a run that stops half-way in one
# layout resumes in another, both ways, and ends where an uninterrupted one-process run
# ends (within the tolerances of tests/parallel/common.sh); a resume in the same
# distributed layout is bit-exact.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
ITERS="training%train_iters=16"
HALF="training%exit_interval=8"
# shellcheck disable=SC2086 # lists of overrides
{
    run straight 1 $ITERS
    # 8 processes (TP, EP, ZeRO) -> one process
    run a 8 $ITERS $HALF $TP2 $EP2 $ETP1 $ZERO
    grep -q "exiting at iteration 8" a.log || fail "the first half did not stop at 8"
    run a 1 $ITERS "checkpoint%load='a'"
    grep -q "loaded checkpoint a/iter_0000008" a.log || { cat a.log; fail "did not resume"; }
    echo "8 processes -> 1:"
    "$ckpt_diff" straight/iter_0000016/state.bin a/iter_0000016/state.bin $TOL_PARAMS ||
        fail "resumed in one process, the state differs from the straight run's"
    # one process -> 4 processes (EP x ETP, ZeRO)
    run b 1 $ITERS $HALF
    run b 4 $ITERS "checkpoint%load='b'" $EP2 $ETP2 $ZERO
    grep -q "loaded checkpoint b/iter_0000008" b.log || { cat b.log; fail "did not resume"; }
    echo "1 process -> 4:"
    "$ckpt_diff" straight/iter_0000016/state.bin b/iter_0000016/state.bin $TOL_PARAMS ||
        fail "resumed in 4 processes, the state differs from the straight run's"
    # the same distributed layout: bit-exact
    run c_straight 4 $ITERS $TP2 $EP2 $ETP1 $ZERO
    run c 4 $ITERS $HALF $TP2 $EP2 $ETP1 $ZERO
    run c 4 $ITERS "checkpoint%load='c'" $TP2 $EP2 $ETP1 $ZERO
    cmp c_straight/iter_0000016/state.bin c/iter_0000016/state.bin ||
        fail "a resume in the same layout is not bit-exact"
    echo "resume in the same layout is bit-exact"
}

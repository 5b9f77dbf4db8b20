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
    # pipeline stages: each saves its own layers; 4 processes (PP 2 x DP 2, ZeRO) -> PP 2 x
    # VPP 2, one process -> PP 4, and tied embeddings PP 2 -> one process (12 iterations
    # of the 4-layer model: like every layout, it drifts past TOL_PARAMS in the Adam
    # moments of the norm weights by 16)
    L4="model%num_layers=4 moe%layer_freq=1,0,1,1 training%train_iters=12"
    H6="training%exit_interval=6"
    PP2="parallel%pipeline_model_parallel_size=2"
    PP4="parallel%pipeline_model_parallel_size=4"
    VPP2="parallel%virtual_pipeline_model_parallel_size=2"
    TIED="model%untie_embeddings_and_output_weights=F"
    run p_straight 1 $L4
    run p 4 $L4 $H6 $PP2 $ZERO
    run p 2 $L4 "checkpoint%load='p'" $PP2 $VPP2
    grep -q "loaded checkpoint p/iter_0000006" p.log || { cat p.log; fail "did not resume"; }
    echo "PP 2 x DP 2 -> PP 2 x VPP 2:"
    "$ckpt_diff" p_straight/iter_0000012/state.bin p/iter_0000012/state.bin $TOL_PARAMS ||
        fail "resumed with a virtual pipeline, the state differs from the straight run's"
    run q 1 $L4 $H6
    run q 4 $L4 "checkpoint%load='q'" $PP4
    grep -q "loaded checkpoint q/iter_0000006" q.log || { cat q.log; fail "did not resume"; }
    echo "1 process -> PP 4:"
    "$ckpt_diff" p_straight/iter_0000012/state.bin q/iter_0000012/state.bin $TOL_PARAMS ||
        fail "resumed in 4 pipeline stages, the state differs from the straight run's"
    run r_straight 1 $L4 $TIED
    run r 2 $L4 $H6 $TIED $PP2
    run r 1 $L4 "checkpoint%load='r'" $TIED
    grep -q "loaded checkpoint r/iter_0000006" r.log || { cat r.log; fail "did not resume"; }
    echo "tied embeddings, PP 2 -> 1 process:"
    "$ckpt_diff" r_straight/iter_0000012/state.bin r/iter_0000012/state.bin $TOL_PARAMS ||
        fail "resumed from pipeline stages with tied embeddings, the state differs"
}

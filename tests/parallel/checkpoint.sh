#!/bin/sh
# Sharded checkpoints (doc/checkpoints.md) load in any layout: a run that stops
# half-way in one layout resumes in another, both ways, and ends where an
# uninterrupted one-process run ends, taking the same routing decisions (within the
# tolerances of tests/parallel/common.sh); a resume in the same distributed layout is
# bit-exact. The layouts of issue 16: TP 2 x EP 2 x PP 2 with ZeRO-1 on 8 processes ->
# EP 4 (DP 8, expert-DP 2); PP 2 x VPP 2 x EP 2 -> TP 2 x EP 2 x ETP 1; one process ->
# TP 2 x EP 4 on 8 and back.
#
# Short runs (common.sh, ROUTE_MARGIN): 4 steps of 8 one-sequence micro-batches of 8
# tokens, stopped after 2; the uninterrupted one-process runs are the references (768
# and 1152 top-k decisions, all clear of ties at 11 to 14 seeds of 20), and a run and
# its resumption together take each of their routing decisions.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
SHORT="training%micro_batch_size=1 training%global_batch_size=8 training%seq_length=8
training%train_iters=4 training%eval_interval=4"
HALF="training%exit_interval=2"
# resumed NAME FROM: NAME loaded FROM's checkpoint of iteration 2
resumed() {
    grep -q "loaded checkpoint $2/iter_0000002" "$1.log" || { cat "$1.log"; fail "$1 did not resume"; }
}
# ends_as REF FIRST SECOND: FIRST, resumed by SECOND, took REF's routing decisions
# and ended with REF's state
ends_as() {
    same_routing "$1" "$2" "$3" || fail "$2 resumed by $3 routes otherwise than $1"
    "$ckpt_diff" "$1/iter_0000004" "$3/iter_0000004" "$TOL_PARAMS" ||
        fail "$2 resumed by $3: the state differs from $1's"
}
# shellcheck disable=SC2086 # lists of overrides
{
    reference straight $SHORT
    # 8 processes (TP, EP, ZeRO) -> one process
    run a 8 $SHORT "$seed" $HALF $TP2 $EP2 $ETP1 $ZERO
    grep -q "exiting at iteration 2" a.log || fail "the first half did not stop at 2"
    run a_resumed 1 $SHORT "$seed" "checkpoint%load='a'"
    resumed a_resumed a
    echo "8 processes -> 1:"
    ends_as straight a a_resumed
    # one process -> 4 processes (EP x ETP, ZeRO)
    run b 1 $SHORT "$seed" $HALF
    run b_resumed 4 $SHORT "$seed" "checkpoint%load='b'" $EP2 $ETP2 $ZERO
    resumed b_resumed b
    echo "1 process -> 4:"
    ends_as straight b b_resumed
    # the same distributed layout: bit-exact
    run c_straight 4 $SHORT "$seed" $TP2 $EP2 $ETP1 $ZERO
    run c 4 $SHORT "$seed" $HALF $TP2 $EP2 $ETP1 $ZERO
    run c_resumed 4 $SHORT "$seed" "checkpoint%load='c'" $TP2 $EP2 $ETP1 $ZERO
    resumed c_resumed c
    same_ckpt c_straight/iter_0000004 c_resumed/iter_0000004 ||
        fail "a resume in the same layout is not bit-exact"
    echo "resume in the same layout is bit-exact"
    # pipeline stages: each saves its own layers; 4 processes (PP 2 x DP 2, ZeRO) -> PP 2 x
    # VPP 2, one process -> PP 4, and tied embeddings PP 2 -> one process
    L4="model%num_layers=4 moe%layer_freq=1,0,1,1"
    PP2="parallel%pipeline_model_parallel_size=2"
    PP4="parallel%pipeline_model_parallel_size=4"
    VPP2="parallel%virtual_pipeline_model_parallel_size=2"
    TIED="model%untie_embeddings_and_output_weights=F"
    reference p_straight $SHORT $L4
    run p 4 $SHORT "$seed" $L4 $HALF $PP2 $ZERO
    run p_resumed 2 $SHORT "$seed" $L4 "checkpoint%load='p'" $PP2 $VPP2
    resumed p_resumed p
    echo "PP 2 x DP 2 -> PP 2 x VPP 2:"
    ends_as p_straight p p_resumed
    run q 1 $SHORT "$seed" $L4 $HALF
    run q_resumed 4 $SHORT "$seed" $L4 "checkpoint%load='q'" $PP4
    resumed q_resumed q
    echo "1 process -> PP 4:"
    ends_as p_straight q q_resumed
    reference r_straight $SHORT $L4 $TIED
    run r 2 $SHORT "$seed" $L4 $HALF $TIED $PP2
    run r_resumed 1 $SHORT "$seed" $L4 "checkpoint%load='r'" $TIED
    resumed r_resumed r
    echo "tied embeddings, PP 2 -> 1 process:"
    ends_as r_straight r r_resumed
    # TP 2 x EP 2 x PP 2, ZeRO-1 (8 processes: DP 2, expert-DP 2) -> EP 4 (DP 8,
    # expert-DP 2), and the same layout resumed bit-exactly
    run s 8 $SHORT "$(cat p_straight.seed)" $L4 $HALF $TP2 $EP2 $ETP1 $PP2 $ZERO
    [ "$(ls s/iter_0000002/rank_*.safetensors | wc -l)" = 8 ] || { ls s/iter_0000002; fail "not every rank wrote its shard"; }
    run s_resumed 8 $SHORT "$(cat p_straight.seed)" $L4 "checkpoint%load='s'" $EP4
    resumed s_resumed s
    echo "TP 2 x EP 2 x PP 2 x ZeRO-1 -> EP 4 (8 processes):"
    ends_as p_straight s s_resumed
    run s_same 8 $SHORT "$(cat p_straight.seed)" $L4 "checkpoint%load='s'" $TP2 $EP2 $ETP1 $PP2 $ZERO
    run s_straight 8 $SHORT "$(cat p_straight.seed)" $L4 $TP2 $EP2 $ETP1 $PP2 $ZERO
    same_ckpt s_straight/iter_0000004 s_same/iter_0000004 ||
        fail "a resume in TP 2 x EP 2 x PP 2 x ZeRO-1 is not bit-exact"
    echo "  and resumed in the same layout: bit-exact"
    # PP 2 x VPP 2 x EP 2 (4 processes) -> TP 2 x EP 2 x ETP 1 (4 processes)
    run v 4 $SHORT "$(cat p_straight.seed)" $L4 $HALF $PP2 $VPP2 $EP2
    run v_resumed 4 $SHORT "$(cat p_straight.seed)" $L4 "checkpoint%load='v'" $TP2 $EP2 $ETP1
    resumed v_resumed v
    echo "PP 2 x VPP 2 x EP 2 -> TP 2 x EP 2 x ETP 1:"
    ends_as p_straight v v_resumed
    # one process -> TP 2 x EP 4 (8 processes) -> one process
    run w 1 $SHORT "$(cat straight.seed)" $HALF
    run w_resumed 8 $SHORT "$(cat straight.seed)" "checkpoint%load='w'" $TP2 $EP4 $ETP1 training%exit_interval=3
    resumed w_resumed w
    run w_back 1 $SHORT "$(cat straight.seed)" "checkpoint%load='w_resumed'"
    grep -q "loaded checkpoint w_resumed/iter_0000003" w_back.log || { cat w_back.log; fail "w_back did not resume"; }
    echo "1 process -> TP 2 x EP 4 (8 processes) -> 1 process:"
    same_routing straight w w_resumed w_back || fail "w, w_resumed, w_back route otherwise than straight"
    "$ckpt_diff" straight/iter_0000004 w_back/iter_0000004 "$TOL_PARAMS" ||
        fail "1 -> 8 -> 1: the state differs from the uninterrupted run's"
}
echo "checkpoints resume in other layouts"

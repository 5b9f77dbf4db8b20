#!/bin/sh
# Capacity-factor dropping and padding are decided on the whole micro-batch as in one
# process (with TP the routing is gathered over the TP group), so the same assignments
# are dropped in every layout: dropped-token counts and expert loads match exactly,
# and the trajectory within the tolerances of tests/parallel/common.sh.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
CAP="moe%expert_capacity_factor=1.0 moe%router_score_function='softmax'
moe%router_enable_expert_bias=F moe%router_load_balancing_type='aux_loss'"
PAD="moe%expert_capacity_factor=1.5 moe%pad_expert_input_to_capacity=T
moe%token_drop_policy='position' moe%router_score_function='softmax' moe%router_pre_softmax=T
moe%router_enable_expert_bias=F model%untie_embeddings_and_output_weights=F"
# shellcheck disable=SC2086 # lists of overrides
{
    run cap 1 $CAP
    grep -q '"dropped_tokens": [1-9]' cap.jsonl || fail "the capacity config drops nothing"
    run cap_ep4_dp2 8 $CAP $EP4
    same_as cap cap_ep4_dp2
    run cap_tp2 2 $CAP $TP2
    same_as cap cap_tp2
    run cap_tp2_ep2_allgather 4 $CAP $TP2 $EP2 $ETP1 $AG
    same_as cap cap_tp2_ep2_allgather
    run pad 1 $PAD
    run pad_tp2_ep2 4 $PAD $TP2 $EP2 $ETP1
    same_as pad pad_tp2_ep2
    run pad_ep2_etp2_allgather 4 $PAD $EP2 $ETP2 $AG
    same_as pad pad_ep2_etp2_allgather
}
echo "capacity decisions match one process"

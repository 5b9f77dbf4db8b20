#!/bin/sh
# &moe moe_shared_expert_overlap (doc/host-overhead.md, Overlap): with the all-to-all
# dispatcher over EP 2, each expert-parallel all-to-all is started and the shared
# expert computed while it is in flight (gate, up and activation during the dispatch,
# the down projection during the combine, the down projection's, activation's and
# gate's backward during the gradients' dispatch, up's backward during the backward
# combine), then waited for. The training is the same as without it, bit for bit
# (losses, gradient norms, validation losses, checkpoints after every step), at EP 2,
# TP 2 x EP 2 (the shared expert's own TP collectives run while the EP all-to-all is in
# flight) and TP 2 x EP 2 x ETP 2, in bf16, in FP8 and with the MoE block recomputed, and
# matches one process as the layout tests do. The first step's log counts the
# all-to-alls left in flight by their start while the shared expert ran: 4 per MoE
# layer and micro-batch on MPI, none on the guard backend (whose device memory a
# collective cannot stay in flight on). The buffer kept between the backward's two
# parts (N x Fs_l fp32) is in --check's workspace, which the run's own report matches.
# Refused where there is nothing to overlap, naming the key; from-megatron maps
# --moe-shared-expert-overlap.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
# 4 steps of 8 one-sequence micro-batches of 16 tokens (common.sh: the short runs)
SHORT="training%micro_batch_size=1 training%global_batch_size=8 training%seq_length=16
training%train_iters=4 training%eval_interval=4 checkpoint%save_interval=1"
ON="moe%moe_shared_expert_overlap=T"

# --check says it
# shellcheck disable=SC2086
"$MOETRAIN" "$nml" --check --world-size 2 $EP2 $ON > check.out 2>&1 || { cat check.out; fail "--check failed"; }
grep -qF "shared expert: computed while the expert-parallel all-to-alls are in flight (moe_shared_expert_overlap)" check.out ||
    { cat check.out; fail "--check does not say that moe_shared_expert_overlap is on"; }

# in_flight RUN N: the first step's log line counts N all-to-alls in flight
in_flight() {
    line=$(grep 'moe_shared_expert_overlap: ' "$1.log") ||
        { cat "$1.log"; fail "$1: no moe_shared_expert_overlap line"; }
    echo "  $line"
    echo "$line" | grep -qF "moe_shared_expert_overlap: $2 expert-parallel all-to-alls were in flight while the shared expert ran in the first step (rank 0)" ||
        fail "$1: not $2 all-to-alls in flight"
}

# workspace FILE: rank 0's workspace bytes in the memory report of FILE
workspace() { sed -n 's/^  stage 0, rank 0: .*| workspace \([0-9]*\) |.*/\1/p' "$1"; }

reference one training%micro_batch_size=1 training%global_batch_size=8 training%seq_length=16 \
    training%train_iters=4 training%eval_interval=4
# shellcheck disable=SC2086
{
    run ep2 2 $SHORT "$seed" $EP2
    run ep2_ov 2 $SHORT "$seed" $EP2 $ON logging%log_memory=T
    same_bits ep2 ep2_ov 4
    same_as one ep2_ov
    # 2 MoE layers x 4 micro-batches a rank (DP 2) x (dispatch + combine forward,
    # dispatch + combine backward)
    in_flight ep2_ov 32
    ! grep -q 'moe_shared_expert_overlap:' ep2.log || fail "ep2: overlap counted with the key off"

    # the memory: up's output gradient kept between the backward's two parts, N x Fs_l
    # fp32 (16 tokens x 32), in --check's workspace and in the run's own report
    for k in off on; do
        [ $k = on ] && o=$ON || o=
        "$MOETRAIN" "$nml" --check --world-size 2 $SHORT "checkpoint%save='mem'" $EP2 $o > "mem_$k.check" 2>&1 ||
            { cat "mem_$k.check"; fail "--check ($k) failed"; }
    done
    ws_off=$(workspace mem_off.check) ws_on=$(workspace mem_on.check) ws_run=$(workspace ep2_ov.log)
    [ -n "$ws_off" ] && [ $((ws_on - ws_off)) = $((16 * 32 * 4)) ] ||
        fail "workspace $ws_on with the key, $ws_off without: not 16 x 32 fp32 more"
    [ "$ws_run" = "$ws_on" ] || fail "the run's workspace $ws_run is not --check's $ws_on"
    echo "  workspace $ws_on with the key, $ws_off without; the run's report: $ws_run"

    # TP 2 x EP 2: the shared expert's all-gather and reduce-scatter over TP while the
    # EP all-to-all is in flight; 4 micro-batches a rank (DP 2)
    run tp2_ep2 4 $SHORT "$seed" $TP2 $EP2 $ETP1
    run tp2_ep2_ov 4 $SHORT "$seed" $TP2 $EP2 $ETP1 $ON
    same_bits tp2_ep2 tp2_ep2_ov 4
    same_as one tp2_ep2_ov
    in_flight tp2_ep2_ov 32

    # TP 2 x EP 2 x ETP 2: the ETP exchanges around the EP all-to-alls stay blocking;
    # 4 micro-batches a rank (DP 2)
    run tp2_ep2_etp2 4 $SHORT "$seed" $TP2 $EP2 $ETP2
    run tp2_ep2_etp2_ov 4 $SHORT "$seed" $TP2 $EP2 $ETP2 $ON
    same_bits tp2_ep2_etp2 tp2_ep2_etp2_ov 4
    in_flight tp2_ep2_etp2_ov 32

    # bf16 (activations stored in bf16, the dispatch moves bf16 rows)
    BF16="precision%params_dtype='bf16' training%train_iters=2 training%eval_interval=2"
    run ep2_bf16 2 $SHORT "$seed" $EP2 $BF16
    run ep2_bf16_ov 2 $SHORT "$seed" $EP2 $BF16 $ON
    same_bits ep2_bf16 ep2_bf16_ov 2

    # FP8 delayed scaling: the shared expert's linears quantised, their scratch the
    # routed experts' too (the operands are quantised again in each part)
    FP8="$BF16 precision%fp8_format='hybrid' precision%fp8_amax_history_len=4"
    run ep2_fp8 2 $SHORT "$seed" $EP2 $FP8
    run ep2_fp8_ov 2 $SHORT "$seed" $EP2 $FP8 $ON
    grep -q 'low precision: fp8 delayed' ep2_fp8_ov.log || { cat ep2_fp8_ov.log; fail "ep2_fp8_ov: not FP8"; }
    same_bits ep2_fp8 ep2_fp8_ov 2

    # selective recompute of the MoE block: its rebuild runs the dispatch, and the
    # shared expert during it, again
    RC="recompute%granularity='selective' recompute%modules='moe'"
    run ep2_rc 2 $SHORT "$seed" $EP2 $RC
    run ep2_rc_ov 2 $SHORT "$seed" $EP2 $RC $ON
    same_bits ep2_rc ep2_rc_ov 4

    # the guard backend: the same training, nothing left in flight by a start
    run ep2_ov_guard 2 --backend=guard $SHORT "$seed" $EP2 $ON
    same_bits ep2 ep2_ov_guard 4
    in_flight ep2_ov_guard 0
}

# refused where it cannot apply, naming the key to change
refused() {
    want=$1
    shift
    # shellcheck disable=SC2086
    "$MOETRAIN" "$nml" --check "$@" $ON > err.out 2>&1 && fail "moe_shared_expert_overlap accepted ($*)"
    grep -qF "&moe moe_shared_expert_overlap = .true. needs $want" err.out ||
        { cat err.out; fail "moe_shared_expert_overlap ($*): not the expected message"; }
    echo "refused ($*): $(head -n 1 err.out)"
}
# shellcheck disable=SC2086
{
    refused "a shared expert to overlap (set shared_expert_intermediate_size > 0)" \
        --world-size 2 $EP2 moe%shared_expert_intermediate_size=0
    refused "expert parallelism, whose all-to-all it overlaps (set &parallel expert_model_parallel_size > 1)" \
        --world-size 2
    refused "the alltoall dispatcher (set token_dispatcher_type = 'alltoall'" --world-size 2 $EP2 $AG
}

# from-megatron maps the flag
M="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 8
--max-position-embeddings 8 --micro-batch-size 1 --global-batch-size 8 --train-iters 2 --lr 1e-3
--num-experts 4 --expert-model-parallel-size 2 --moe-shared-expert-intermediate-size 32
--moe-token-dispatcher-type alltoall --mock-data --vocab-size 257"
# shellcheck disable=SC2086
"$MOETRAIN" from-megatron -o mapped.nml -- $M --moe-shared-expert-overlap > mapped.out 2> mapped.err ||
    { cat mapped.err; fail "from-megatron failed"; }
grep -q "moe_shared_expert_overlap = .true." mapped.nml || { cat mapped.nml; fail "from-megatron: not mapped"; }
"$MOETRAIN" mapped.nml --check --world-size 2 > mapped.check 2>&1 ||
    { cat mapped.check; fail "the mapped namelist does not pass --check"; }
echo "from-megatron: --moe-shared-expert-overlap mapped"

#!/bin/sh
# Pipeline parallelism (1F1B, and interleaved 1F1B with a virtual pipeline): the same loss trajectory, gradient norms, routing
# statistics and final parameters as one process (tolerances: common.sh), with even
# and uneven stages (decoder_first/last_pipeline_num_layers), combined with TP, EP and
# DP, a stage without MoE layers (hybrid dense + MoE) beside expert-parallel ranks,
# and the activation memory of the schedule: stage s of pp holds min(pp - s, m)
# micro-batches' activations at its peak (m micro-batches per step). Each stage holds
# its own layers' parameters; tied embeddings stay in sync over the embedding group.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
L4="model%num_layers=4 moe%layer_freq=1,0,1,1"
L6="model%num_layers=6 moe%layer_freq=1,0,1,1,0,1"
L8="model%num_layers=8 moe%layer_freq=1,0,1,1,0,1,0,1"
L10="model%num_layers=10 moe%layer_freq=1,0,1,1,0,1,1,0,0,1"
HYB="model%num_layers=4 moe%layer_freq=0,0,1,1"
TIED="model%untie_embeddings_and_output_weights=F"
PP2="parallel%pipeline_model_parallel_size=2"
PP4="parallel%pipeline_model_parallel_size=4"
VPP2="parallel%virtual_pipeline_model_parallel_size=2"
# --check prints each stage's layers (Megatron's interleaved layout) and the bubble
"$MOETRAIN" "$nml" --check --world-size 8 model%num_layers=10 moe%layer_freq=10*1 $PP4 $VPP2 \
    parallel%decoder_first_pipeline_num_layers=2 parallel%decoder_last_pipeline_num_layers=4 \
    > check.out 2>&1 || { cat check.out; fail "--check failed"; }
for want in "pipeline: PP 4 x VPP 2, interleaved 1F1B schedule, 4 micro-batches; bubble fraction (PP-1)/(m*VPP+PP-1) = 3/11 = 0.2727" \
    "  stage 0: chunk 0 layers 0-0; chunk 1 layers 5-5 (embedding)" \
    "  stage 1: chunk 0 layers 1-1; chunk 1 layers 6-6" \
    "  stage 3: chunk 0 layers 3-4; chunk 1 layers 8-9 (final norm, LM head, loss)"; do
    grep -qxF "$want" check.out || { cat check.out; fail "--check does not print: $want"; }
done
"$MOETRAIN" "$nml" --check --world-size 2 $PP2 parallel%decoder_last_pipeline_num_layers=1 \
    > check.out 2>&1 || { cat check.out; fail "--check failed"; }
grep -qxF "  stage 0: layers 0-1 (embedding)" check.out && grep -qxF "pipeline: PP 2 x VPP 1, 1F1B schedule, 8 micro-batches; bubble fraction (PP-1)/(m*VPP+PP-1) = 1/9 = 0.1111" check.out ||
    { cat check.out; fail "--check: wrong 1F1B layout"; }
echo "--check prints the stages and the bubble"
# Short runs (common.sh, ROUTE_MARGIN): 3 steps of one-sequence micro-batches of 8
# tokens, m = 8 per step (2, 4 and 6 where named); 240 to 1920 top-k decisions per
# reference, all clear of ties at 13 to 19 seeds of 20 (8 for the 10-layer model).
SHORT="training%micro_batch_size=1 training%global_batch_size=8 training%seq_length=8
training%train_iters=3 training%eval_interval=3"
M2="training%global_batch_size=2"
M4="training%global_batch_size=4"
M6="training%global_batch_size=6"
# shellcheck disable=SC2086 # lists of overrides
{
    reference one $SHORT
    reference one4 $SHORT $L4 logging%log_memory=T
    reference one6 $SHORT $L6
    reference hyb $SHORT $HYB
    reference one10 $SHORT $L10
    reference one4_m2 $SHORT $L4 $M2
    reference tied $SHORT $L4 $TIED
    reference one8_m4 $SHORT $L8 $M4
    reference one6_m6 $SHORT $L6 $M6
    reference one10_m4 $SHORT $L10 $M4
}
while read -r ref name np layout; do
    [ -n "$name" ] || continue
    # shellcheck disable=SC2086 # layout is a list of overrides
    run "$name" "$np" $SHORT "$(cat "$ref.seed")" $layout
    same_as "$ref" "$name"
done <<LAYOUTS
one4 pp2 2 $L4 $PP2
one4 pp4 4 $L4 $PP4
one6 pp3 3 $L6 parallel%pipeline_model_parallel_size=3
one pp2_first1 2 $PP2 parallel%decoder_first_pipeline_num_layers=1
one pp2_last1 2 $PP2 parallel%decoder_last_pipeline_num_layers=1
one6 pp4_first1_last1 4 $L6 $PP4 parallel%decoder_first_pipeline_num_layers=1 parallel%decoder_last_pipeline_num_layers=1
one4 pp2_tp2_ep2 4 $L4 $PP2 $TP2 $EP2 $ETP1
one4 pp2_ep2_dp2 8 $L4 $PP2 $EP2 $TP2 $ETP1
one4 pp2_ep2_dp4_zero1 8 $L4 $PP2 $EP2 $ZERO
hyb pp2_ep2_dense_stage 4 $HYB $PP2 $EP2
one4 pp2_vpp2 2 $L4 $PP2 $VPP2
one4_m2 pp2_vpp2_m2 2 $L4 $PP2 $VPP2 $M2
one10 pp4_vpp2_first2_last4 4 $L10 $PP4 $VPP2 parallel%decoder_first_pipeline_num_layers=2 parallel%decoder_last_pipeline_num_layers=4
one4 pp2_vpp2_tp2_ep2 4 $L4 $PP2 $VPP2 $TP2 $EP2 $ETP1
hyb pp2_vpp2_ep2_dense_chunk 4 $HYB $PP2 $VPP2 $EP2
one8_m4 pp4_vpp2_m4 4 $L8 $PP4 $VPP2 $M4
one6_m6 pp3_vpp2 3 $L6 parallel%pipeline_model_parallel_size=3 $VPP2 $M6
tied pp2_tied 2 $L4 $TIED $PP2
one10_m4 pp4_vpp3_first2_last2 4 $L10 $PP4 parallel%virtual_pipeline_model_parallel_size=3 parallel%decoder_first_pipeline_num_layers=2 parallel%decoder_last_pipeline_num_layers=2 $M4
tied pp4_tied_tp2_zero1 8 $L4 $TIED $PP4 $TP2 $ETP1 $ZERO
tied pp2_vpp2_tied_dp2 4 $L4 $TIED $PP2 $VPP2
LAYOUTS

# activation memory: the peak of in-flight micro-batch chunks per stage, measured, is
# what the schedule predicts: 1F1B min(pp - s, m); interleaved min(w + 1, m * vpp) with
# Megatron's warmup w = (pp - s - 1) * 2 + (vpp - 1) * pp (all m * vpp when m = pp);
# with 1F1B the peak bytes are that many micro-batches' activations of the stage.
check_memory() { # NAME PP VPP M
    name=$1 pp=$2 vpp=$3 m=$4
    s=0
    while [ $s -lt "$pp" ]; do
        total=$((m * vpp))
        if [ "$vpp" = 1 ]; then
            want=$((pp - s < m ? pp - s : m))
        elif [ "$m" = "$pp" ]; then
            want=$total
        else
            w=$(((pp - s - 1) * 2 + (vpp - 1) * pp))
            want=$((w + 1 < total ? w + 1 : total))
        fi
        line=$(grep "^pipeline stage $s " "$name.log") || fail "$name: no pipeline line for stage $s"
        got=$(echo "$line" | sed -n 's/.*peak in-flight micro-batch chunks \([0-9]*\) .*/\1/p')
        sched=$(echo "$line" | sed -n 's/.*(schedule: \([0-9]*\)).*/\1/p')
        peak=$(echo "$line" | sed -n 's/.*peak activation bytes \([0-9]*\).*/\1/p')
        per=$(echo "$line" | sed -n 's/.*chunk 0 layers [^)]*) \([0-9]*\) bytes.*/\1/p')
        [ "$got" = "$want" ] && [ "$sched" = "$want" ] ||
            fail "$name stage $s: $got micro-batch chunks in flight (trainer's prediction $sched), the schedule predicts $want"
        if [ "$vpp" = 1 ]; then
            [ "$peak" = $((want * per)) ] || fail "$name stage $s: peak $peak bytes, predicted $want x $per"
        fi
        echo "  $name stage $s: $got in flight, peak $peak activation bytes (as predicted)"
        s=$((s + 1))
    done
}
check_memory pp2 2 1 8
check_memory pp4 4 1 8
check_memory pp3 3 1 8
check_memory pp2_ep2_dp2 2 1 4
check_memory pp2_vpp2 2 2 8
check_memory pp4_vpp2_first2_last4 4 2 8
check_memory pp2_vpp2_m2 2 2 2
check_memory pp4_vpp2_m4 4 2 4
check_memory pp3_vpp2 3 2 6
# the stages partition the parameters: together they hold the model once (untied), and
# the first and last stage each hold the tied embedding
params_of() { sed -n 's/.*| parameters \([0-9]*\) |.*/\1/p' "$1.log" | awk '{ s += $1 } END { print s }'; }
whole=$(sed -n 's/^  stage 0, rank 0: parameters \([0-9]*\) .*/\1/p' one4.log)
[ -n "$whole" ] || fail "one4.log has no memory line"
for name in pp2 pp4 pp2_vpp2; do
    got=$(params_of $name)
    [ $((got * 4)) = "$whole" ] || fail "$name: the stages hold $got parameters, one process $((whole / 4))"
    echo "  $name: the stages hold $got parameters together, as one process"
done
emb=$((257 * 32))
got=$(params_of pp2_tied)
[ "$got" = $((whole / 4 - 257 * 32 + emb)) ] || fail "pp2_tied: the stages hold $got parameters"
echo "  pp2_tied: $got parameters (the embedding on both ends)"
echo "every pipeline layout matches one process"

#!/bin/sh
# &parallel overlap_grad_reduce (doc/host-overhead.md, Overlap): each gradient bucket's
# data-parallel reduction starts while backward goes on, and the training is the same
# as without it, bit for bit: the same loss, gradient norm and validation loss at
# every step, and byte-identical checkpoints. Over DP 2 with ZeRO-1 and without, TP 2 x
# DP 2 (TP-replicated gradients summed over TP before their bucket's DP reduction)
# with EP 2 (the experts' buckets over the expert-DP group), PP 2 x DP 2 with tied
# embeddings (the embedding group's sum before the embedding's own bucket) and PP 2 x
# VPP 2 x DP 2. Buckets of 1000 elements (ddp_bucket_size), cut through tensors: many
# buckets, most started during the last micro-batch's backward (the log says how many).
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
L4="model%num_layers=4 moe%layer_freq=1,0,1,1"
TIED="model%untie_embeddings_and_output_weights=F"
PP2="parallel%pipeline_model_parallel_size=2"
VPP2="parallel%virtual_pipeline_model_parallel_size=2"
SHORT="training%micro_batch_size=1 training%global_batch_size=8 training%seq_length=8
training%train_iters=3 training%eval_interval=2 parallel%ddp_bucket_size=1000"
ON="parallel%overlap_grad_reduce=T"

# --check says it
"$MOETRAIN" "$nml" --check --world-size 2 $ZERO $ON > check.out 2>&1 || { cat check.out; fail "--check failed"; }
grep -qF "data parallel: ZeRO-1 (gradients reduce-scattered), buckets of max(40M, 1M x the group's size) elements, each started as backward finishes it (overlap_grad_reduce); parameter all-gather after the step" check.out ||
    { cat check.out; fail "--check does not say that overlap_grad_reduce is on"; }

# same_bits OFF ON: ON's metrics and final checkpoint are OFF's, bit for bit
same_bits() {
    echo "$2 against $1:"
    bad=0
    for k in loss val_loss grad_norm aux_loss z_loss dropped_tokens expert_load_min expert_load_max; do
        close "$1" "$2" $k 0 || bad=1
    done
    last=$(cat "$1/latest_checkpointed_iteration.txt")
    it=$(printf %07d "$last")
    same_ckpt "$1/iter_$it" "$2/iter_$it" || bad=1
    [ $bad = 0 ] || fail "$2 is not $1, bit for bit"
    echo "  checkpoint iter_$it: byte-identical"
}

while read -r base np layout; do
    [ -n "$base" ] || continue
    # shellcheck disable=SC2086 # layout is a list of overrides
    run "$base" "$np" $SHORT $layout
    # shellcheck disable=SC2086
    run "${base}_overlap" "$np" $SHORT $layout $ON
    same_bits "$base" "${base}_overlap"
    line=$(grep 'overlap_grad_reduce: ' "${base}_overlap.log") || fail "${base}_overlap: the log does not say how many buckets started early"
    echo "  $line"
    early=$(echo "$line" | sed -n 's/.*: \([0-9]*\) of \([0-9]*\) gradient buckets.*/\1/p')
    [ "${early:-0}" -gt 0 ] || fail "${base}_overlap: no bucket started during backward"
done <<LAYOUTS
dp2_zero1 2 $ZERO
dp2 2
tp2_dp2_ep2_zero1 4 $TP2 $EP2 $ETP1 $ZERO
pp2_dp2_tied_zero1 4 $L4 $TIED $PP2 $ZERO
pp2_vpp2_dp2 4 $L4 $PP2 $VPP2
LAYOUTS

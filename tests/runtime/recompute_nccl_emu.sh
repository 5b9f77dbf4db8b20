#!/bin/sh
# Activation recompute over the emulated NCCL (tests/runtime/emu-nccl/libnccl.so.2) on
# the emulated CUDA backend (tests/gpu/moetrain-emu): 2 processes of EP 2 with the
# all-to-all dispatcher, whose rebuilt MoE forward runs the dispatch's collectives
# again in device memory, with its counts exchanged on the host. The layout model of
# tests/parallel in bf16, 3 iterations, without recompute, with selective recompute of
# the MoE block, both norms and the attention core, and with full recompute (groups
# of 2): losses, balancing and z losses, gradient norms and expert loads of every
# iteration and the final validation loss bit-identical.
# Not skipped in a build with the emulator and NCCL (it is not built otherwise).
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
need_mpirun
use_emulated_nccl 2
MT_EMU_NCCL_INPROGRESS=2
export MT_EMU_NCCL_INPROGRESS
nml="$MT_TOP_SRCDIR/tests/parallel/moe.nml"

# train NAME OVERRIDES...: 2 processes, metrics in $tmp/NAME.jsonl
train() {
    name=$1
    shift
    (cd "$MT_TOP_BUILDDIR" && timeout 600 "$MPIRUN" --oversubscribe -np 2 "$emu" --backend=cuda \
        "$nml" parallel%expert_model_parallel_size=2 parallel%expert_tensor_parallel_size=1 \
        training%train_iters=3 training%micro_batch_size=1 training%global_batch_size=4 \
        training%seq_length=16 training%eval_interval=3 training%eval_iters=1 \
        logging%log_interval=1 parallel%distributed_timeout_minutes=5 \
        "precision%params_dtype='bf16'" "logging%metrics_file='$tmp/$name.jsonl'" "$@" \
        > "$tmp/$name.log" 2>&1 < /dev/null) || { cat "$tmp/$name.log"; fail "$name: training failed"; }
    grep -q 'moetrain: NCCL communicators' "$tmp/$name.log" ||
        { cat "$tmp/$name.log"; fail "$name: no NCCL communicators in the log"; }
    grep -o '"\(loss\|val_loss\|aux_loss\|z_loss\|grad_norm\|dropped_tokens\|expert_load_min\|expert_load_max\)": [^,}]*' \
        "$tmp/$name.jsonl" > "$tmp/$name.values"
    grep -q val_loss "$tmp/$name.values" || { cat "$tmp/$name.log"; fail "$name: no val_loss"; }
}

train keep
train selective "recompute%granularity='selective'" "recompute%modules='moe','layernorm','core_attn'"
train full "recompute%granularity='full'" "recompute%method='uniform'" recompute%num_layers=2
for r in selective full; do
    cmp -s "$tmp/keep.values" "$tmp/$r.values" ||
        { diff "$tmp/keep.values" "$tmp/$r.values" | head; fail "$r: differs from the run that keeps every activation"; }
    echo "  $r: $(wc -l < "$tmp/$r.values") figures bit-identical to keeping every activation"
done
echo "ok: recompute over the emulated NCCL (EP 2, all-to-all) trains exactly as keeping every activation"

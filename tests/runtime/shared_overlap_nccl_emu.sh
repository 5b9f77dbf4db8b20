#!/bin/sh
# &moe moe_shared_expert_overlap over the emulated NCCL (tests/runtime/emu-nccl/libnccl.so.2)
# on the emulated CUDA backend (tests/gpu/moetrain-emu): 2 processes of EP 2 with the
# all-to-all dispatcher, the layout model of tests/parallel (a shared expert) in bf16,
# 3 iterations, without and with the key. With it, each EP all-to-all is enqueued on the
# comm stream after an event (mt_all_to_all_v_start), the shared expert's kernels are
# queued on the compute stream meanwhile, and the compute stream waits for the
# all-to-all's event before the routed experts read its rows. The overlapped run's
# device work is deferred per stream (it runs only when an event or a synchronisation
# asks for it), so a start not ordered after the compute that wrote its rows sends
# stale rows (without that event the run differs); the wait's event cannot show here,
# since the emulated NCCL runs a collective when it is enqueued. Losses, balancing and z
# losses, gradient norms, expert loads and the validation loss bit-identical; the same
# host synchronisations; the log counts the all-to-alls in flight while the shared
# expert ran (2 MoE layers x 2 micro-batches x 3).
# Not skipped in a build with the emulator and NCCL (it is not built otherwise).
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
need_mpirun
LD_LIBRARY_PATH="$MT_TOP_BUILDDIR/tests/runtime/emu-nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
MT_EMU_DEVICE_COUNT=2
MT_EMU_NCCL_INPROGRESS=2
export LD_LIBRARY_PATH MT_EMU_DEVICE_COUNT MT_EMU_NCCL_INPROGRESS
emu="$MT_TOP_BUILDDIR/tests/gpu/moetrain-emu"
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

train plain
MT_EMU_STREAMS=deferred
export MT_EMU_STREAMS
train overlap moe%moe_shared_expert_overlap=T
unset MT_EMU_STREAMS
cmp -s "$tmp/plain.values" "$tmp/overlap.values" ||
    { diff "$tmp/plain.values" "$tmp/overlap.values" | head; fail "the overlapped run differs"; }
echo "  $(wc -l < "$tmp/overlap.values") figures bit-identical"
grep -F 'moe_shared_expert_overlap: 12 expert-parallel all-to-alls were in flight while the shared expert ran in the first step (rank 0)' \
    "$tmp/overlap.log" || { cat "$tmp/overlap.log"; fail "not 12 all-to-alls in flight"; }
syncs() { sed -n 's/^moetrain: host costs of the cuda backend since it started: [0-9]* kernel launches, \([0-9]*\) host synchronisations.*/\1/p' "$tmp/$1.log" | sort -u; }
[ -n "$(syncs plain)" ] && [ "$(syncs plain)" = "$(syncs overlap)" ] ||
    { grep -h 'host costs' "$tmp/plain.log" "$tmp/overlap.log"; fail "the overlapped run's host synchronisations differ"; }
echo "ok: moe_shared_expert_overlap over the emulated NCCL (EP 2): the same figures, $(syncs overlap) host synchronisations as without"

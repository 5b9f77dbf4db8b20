#!/bin/sh
# Activation offloading under a pipeline schedule, over the emulated NCCL
# (tests/runtime/emu-nccl/libnccl.so.2) on the emulated CUDA backend
# (tests/gpu/moetrain-emu) with deferred streams: 2 processes of PP 2 (1F1B, two
# micro-batches in flight, each with its own pinned host block) and, with virtual
# pipeline stages, of PP 2 x VPP 2; and EP 2 with the all-to-all dispatcher, offloading
# the routed experts' tensors (expert_fc1, moe_act) at the rows the buffers hold, with
# the default buffers and with buffers too small (moe%expert_buffer_factor = 0.5: a
# layer whose rows overflow keeps them in its overflow block). The layout model of
# tests/parallel with 4 layers in bf16, 3 iterations, keeping every activation and
# offloading every module: losses, balancing and z losses, gradient norms and expert
# loads of every iteration and the final validation loss bit-identical, and each step
# copies the memory report's bytes.
# Not skipped in a build with the emulator and NCCL (it is not built otherwise).
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
need_mpirun
use_emulated_nccl 2
MT_EMU_NCCL_INPROGRESS=2
MT_EMU_STREAMS=deferred
export MT_EMU_NCCL_INPROGRESS MT_EMU_STREAMS
nml="$MT_TOP_SRCDIR/tests/parallel/moe.nml"
all="recompute%offload_modules='attn_norm','qkv_linear','core_attn','attn_proj','mlp_norm','expert_fc1','moe_act'"
pp=parallel%pipeline_model_parallel_size=2

# train NAME OVERRIDES...: 2 processes, metrics in $tmp/NAME.jsonl
train() {
    name=$1
    shift
    (cd "$MT_TOP_BUILDDIR" && timeout 600 "$MPIRUN" --oversubscribe -np 2 "$emu" --backend=cuda \
        "$nml" model%num_layers=4 "moe%layer_freq=1,0,1,1" \
        training%train_iters=3 training%micro_batch_size=1 training%global_batch_size=4 \
        training%seq_length=16 training%eval_interval=3 training%eval_iters=1 \
        logging%log_interval=1 logging%log_memory=.true. parallel%distributed_timeout_minutes=5 \
        "precision%params_dtype='bf16'" "logging%metrics_file='$tmp/$name.jsonl'" "$@" \
        > "$tmp/$name.log" 2>&1 < /dev/null) || { cat "$tmp/$name.log"; fail "$name: training failed"; }
    grep -q 'moetrain: NCCL communicators' "$tmp/$name.log" ||
        { cat "$tmp/$name.log"; fail "$name: no NCCL communicators in the log"; }
    grep -o '"\(loss\|val_loss\|aux_loss\|z_loss\|grad_norm\|dropped_tokens\|expert_load_min\|expert_load_max\)": [^,}]*' \
        "$tmp/$name.jsonl" > "$tmp/$name.values"
    grep -q val_loss "$tmp/$name.values" || { cat "$tmp/$name.log"; fail "$name: no val_loss"; }
}

# check NAME KEEP WHAT: NAME's figures are KEEP's, and rank 0 (stage 0) copies its
# memory report's traffic per step
check() {
    name=$1 keep=$2 what=$3
    cmp -s "$tmp/$keep.values" "$tmp/$name.values" ||
        { diff "$tmp/$keep.values" "$tmp/$name.values" | head; fail "$what: offloading differs from keeping every activation"; }
    line=$(grep '^  stage 0, rank 0: parameters' "$tmp/$name.log")
    each=$(echo "$line" | sed -n 's/.* \([0-9]*\) bytes each way per step$/\1/p')
    [ -n "$each" ] && [ "$each" -gt 0 ] || { cat "$tmp/$name.log"; fail "$what: no offload traffic in the memory report"; }
    grep -q "offloaded per step: $each bytes to host, $each back" "$tmp/$name.log" ||
        { grep -o 'offloaded per step: [^|]*' "$tmp/$name.log" | head -3; fail "$what: the steps did not copy $each bytes each way"; }
    host=$(echo "$line" | sed -n 's/.*offloaded to pinned host memory \([0-9]*\) .*/\1/p')
    echo "  $what: $(wc -l < "$tmp/$name.values") figures bit-identical to keeping every activation; rank 0 holds $host pinned bytes and copies $each bytes each way per step"
}

for vpp in 1 2; do
    train "keep$vpp" $pp parallel%virtual_pipeline_model_parallel_size=$vpp
    train "off$vpp" $pp parallel%virtual_pipeline_model_parallel_size=$vpp \
        recompute%fine_grained_activation_offloading=.true. "$all"
    check "off$vpp" "keep$vpp" "PP 2 x VPP $vpp"
done
ep="parallel%expert_model_parallel_size=2 parallel%expert_tensor_parallel_size=1 moe%token_dispatcher_type='alltoall'"
for f in 2 0.5; do
    # shellcheck disable=SC2086 # a list of overrides
    train "ep_keep$f" $ep moe%expert_buffer_factor=$f
    # shellcheck disable=SC2086 # a list of overrides
    train "ep_off$f" $ep moe%expert_buffer_factor=$f recompute%fine_grained_activation_offloading=.true. \
        "recompute%offload_modules='expert_fc1','moe_act'"
    check "ep_off$f" "ep_keep$f" "EP 2, expert_fc1 and moe_act, expert_buffer_factor $f"
done
# the small buffers did overflow (else the second leg proves nothing more)
grep -q 'expert buffer overflows: [1-9]' "$tmp/ep_off0.5.log" ||
    { grep 'iteration' "$tmp/ep_off0.5.log" | head -3; fail "expert_buffer_factor 0.5: no layer overflowed its buffers"; }
echo "ok: activation offloading under pipeline schedules and expert parallelism (emulated NCCL, deferred streams) trains exactly as keeping every activation"

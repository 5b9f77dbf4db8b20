#!/bin/sh
# Activation offloading under a pipeline schedule, over the emulated NCCL
# (tests/runtime/emu-nccl/libnccl.so.2) on the emulated CUDA backend
# (tests/gpu/moetrain-emu) with deferred streams: 2 processes of PP 2 (1F1B, two
# micro-batches in flight, each with its own pinned host block) and, with virtual
# pipeline stages, of PP 2 x VPP 2. The layout model of tests/parallel with 4 layers in
# bf16, 3 iterations, keeping every activation and offloading every module: losses,
# balancing and z losses, gradient norms and expert loads of every iteration and the
# final validation loss bit-identical, and each step copies the memory report's bytes.
# Not skipped in a build with the emulator and NCCL (it is not built otherwise).
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
need_mpirun
LD_LIBRARY_PATH="$MT_TOP_BUILDDIR/tests/runtime/emu-nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
MT_EMU_DEVICE_COUNT=2
MT_EMU_NCCL_INPROGRESS=2
MT_EMU_STREAMS=deferred
export LD_LIBRARY_PATH MT_EMU_DEVICE_COUNT MT_EMU_NCCL_INPROGRESS MT_EMU_STREAMS
emu="$MT_TOP_BUILDDIR/tests/gpu/moetrain-emu"
nml="$MT_TOP_SRCDIR/tests/parallel/moe.nml"
all="recompute%offload_modules='attn_norm','qkv_linear','core_attn','attn_proj','mlp_norm'"

# train NAME OVERRIDES...: 2 processes, metrics in $tmp/NAME.jsonl
train() {
    name=$1
    shift
    (cd "$MT_TOP_BUILDDIR" && timeout 600 "$MPIRUN" --oversubscribe -np 2 "$emu" --backend=cuda \
        "$nml" model%num_layers=4 "moe%layer_freq=1,0,1,1" parallel%pipeline_model_parallel_size=2 \
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

for vpp in 1 2; do
    train "keep$vpp" parallel%virtual_pipeline_model_parallel_size=$vpp
    train "off$vpp" parallel%virtual_pipeline_model_parallel_size=$vpp \
        recompute%fine_grained_activation_offloading=.true. "$all"
    cmp -s "$tmp/keep$vpp.values" "$tmp/off$vpp.values" ||
        { diff "$tmp/keep$vpp.values" "$tmp/off$vpp.values" | head; fail "VPP $vpp: offloading differs from keeping every activation"; }
    # rank 0 (stage 0) logs: its copies per step are its memory report's traffic
    line=$(grep '^  stage 0, rank 0: parameters' "$tmp/off$vpp.log")
    each=$(echo "$line" | sed -n 's/.* \([0-9]*\) bytes each way per step$/\1/p')
    [ -n "$each" ] && [ "$each" -gt 0 ] || { cat "$tmp/off$vpp.log"; fail "VPP $vpp: no offload traffic in the memory report"; }
    grep -q "offloaded per step: $each bytes to host, $each back" "$tmp/off$vpp.log" ||
        { grep -o 'offloaded per step: [^|]*' "$tmp/off$vpp.log" | head -3; fail "VPP $vpp: the steps did not copy $each bytes each way"; }
    host=$(echo "$line" | sed -n 's/.*offloaded to pinned host memory \([0-9]*\) .*/\1/p')
    echo "  PP 2 x VPP $vpp: $(wc -l < "$tmp/off$vpp.values") figures bit-identical to keeping every activation; stage 0 holds $host pinned bytes and copies $each bytes each way per step"
done
echo "ok: activation offloading under pipeline schedules (emulated NCCL, deferred streams) trains exactly as keeping every activation"

#!/bin/sh
# Activation recompute on the CUDA backend (tests/gpu/moetrain-emu: the real
# kernels/cuda code on the emulated device, whose fresh memory is NaN): the layout
# model of tests/parallel (a dense layer between MoE layers, a shared expert, QK-norm,
# sigmoid routing with the expert bias, balancing and z losses) trained in bf16 for 3
# iterations without recompute, with every selective module, and with full recompute
# (uniform and block). The losses, balancing and z losses, gradient norms and expert
# loads of every iteration and the final validation loss are bit-identical: the
# backward rebuilds with the same kernels in the same order. Never skipped.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
MOETRAIN="${MT_TOP_BUILDDIR:-.}/tests/gpu/moetrain-emu"
nml="$MT_TOP_SRCDIR/tests/parallel/moe.nml"

# train NAME OVERRIDES...: metrics in $tmp/NAME.jsonl
train() {
    name=$1
    shift
    (cd "$MT_TOP_BUILDDIR" && "$MOETRAIN" --backend=cuda "$nml" training%train_iters=3 \
        training%micro_batch_size=1 training%global_batch_size=2 training%seq_length=16 \
        training%eval_interval=3 training%eval_iters=1 logging%log_interval=1 \
        "precision%params_dtype='bf16'" "logging%metrics_file='$tmp/$name.jsonl'" "$@") \
        > "$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; fail "$name: training failed"; }
    grep -q '"val_loss": ' "$tmp/$name.jsonl" || { cat "$tmp/$name.log"; fail "$name: no val_loss"; }
}

# values NAME: the compared figures of every line
values() {
    grep -o '"\(loss\|val_loss\|aux_loss\|z_loss\|grad_norm\|dropped_tokens\|expert_load_min\|expert_load_max\)": [^,}]*' \
        "$tmp/$1.jsonl"
}

train keep
values keep > "$tmp/keep.values"
[ -s "$tmp/keep.values" ] || fail "keep: no figures in its metrics"
for s in "selective:recompute%granularity='selective' recompute%modules='core_attn','layernorm','mlp','moe_act','shared_experts'" \
         "moe:recompute%granularity='selective' recompute%modules='moe','layernorm'" \
         "uniform:recompute%granularity='full' recompute%method='uniform' recompute%num_layers=2" \
         "block:recompute%granularity='full' recompute%method='block' recompute%num_layers=1"; do
    name=${s%%:*}
    # shellcheck disable=SC2086 # a list of overrides
    train "$name" ${s#*:}
    values "$name" > "$tmp/$name.values"
    cmp -s "$tmp/keep.values" "$tmp/$name.values" ||
        { diff "$tmp/keep.values" "$tmp/$name.values" | head; fail "$name: differs from the run that keeps every activation"; }
    echo "  $name: $(wc -l < "$tmp/$name.values") figures bit-identical to keeping every activation"
done
echo "recompute on the CUDA backend (emulated) trains exactly as keeping every activation"

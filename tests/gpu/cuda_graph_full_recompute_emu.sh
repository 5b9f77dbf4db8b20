#!/bin/sh
# &cuda_graph impl = 'full_iteration' (doc/host-overhead.md, "The full iteration") with
# what the graph holds beyond the plain iteration, on the CUDA backend
# (tests/gpu/moetrain-emu), tiny_moe with drop-and-pad, bf16, 5 iterations of 2
# micro-batches with warmup_steps = 1 (iteration 2 captures, 3 to 5 replay):
# - full recompute (each layer's forward run again in backward, inside the graph);
# - selective recompute of every module this model has (core_attn, layernorm, moe_act,
#   moe, shared_experts with a shared expert, mlp with the second layer dense);
# - activation offloading of every offloadable module (the copies to pinned host
#   memory and back, and their events, inside the graph);
# - the expert bias (router_enable_expert_bias): the routers' biases updated on the
#   device inside the iteration from the step's loads, gated as the AdamW update;
# each against the same run without graphs: losses, balancing and z losses, gradient
# norms, dropped tokens, the validation loss, the offloaded bytes per step and the final
# checkpoint (weights, moments, the expert biases' master) bit-identical, one kernel
# launch and one host wait per step, the graph captured once and replayed.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
. "$MT_TOP_SRCDIR/tests/train/same_ckpt.sh"
EMU="${MT_TOP_BUILDDIR:-.}/tests/gpu/moetrain-emu"
export MOETRAIN_DATADIR="${MT_TOP_BUILDDIR:-.}"
tiny="$MT_TOP_SRCDIR/namelists/tiny_moe.nml"
pad="moe%expert_capacity_factor=1.0 moe%pad_expert_input_to_capacity=T"
full="cuda_graph%impl='full_iteration' cuda_graph%warmup_steps=1"

# train NAME OVERRIDES...: $tmp/NAME.log, the compared figures in $tmp/NAME.values, the
# final checkpoint in $tmp/NAME.ckpt
train() {
    name=$1
    shift
    # shellcheck disable=SC2086 # a list of overrides
    "$EMU" --backend=cuda "$tiny" training%train_iters=5 optimizer%lr_warmup_iters=1 \
        training%micro_batch_size=1 training%global_batch_size=2 training%seq_length=16 \
        training%eval_interval=5 training%eval_iters=1 logging%log_interval=1 $pad \
        "precision%params_dtype='bf16'" "logging%metrics_file='$tmp/$name.jsonl'" \
        "checkpoint%save='$tmp/$name.ckpt'" "$@" \
        > "$tmp/$name.log" 2>&1 < /dev/null || { cat "$tmp/$name.log"; fail "$name: training failed"; }
    grep -o '"\(loss\|val_loss\|aux_loss\|z_loss\|grad_norm\|dropped_tokens\)": [^,}]*' \
        "$tmp/$name.jsonl" > "$tmp/$name.values"
    grep -o 'offloaded per step: [^|]*' "$tmp/$name.log" >> "$tmp/$name.values"
    grep -q '"val_loss": ' "$tmp/$name.values" || { cat "$tmp/$name.log"; fail "$name: no val_loss"; }
}

# per_step NAME WHAT: the last iteration's host count WHAT per step
per_step() {
    grep -o "$2 [0-9][0-9.]*" "$tmp/$1.log" | tail -1 | sed 's/.* //'
}

# both NAME OVERRIDES...: the run without graphs and with the full iteration, compared
both() {
    c=$1
    shift
    train "${c}_eager" "$@"
    # shellcheck disable=SC2086 # a list of overrides
    train "${c}_full" $full "$@"
    cmp -s "$tmp/${c}_eager.values" "$tmp/${c}_full.values" ||
        { diff "$tmp/${c}_eager.values" "$tmp/${c}_full.values" | head; fail "$c: differs from the run without graphs"; }
    g=$(per_step "${c}_full" 'kernel launches') w=$(per_step "${c}_full" 'host synchronisations')
    if [ "$g" != 1.0 ] || [ "$w" != 1.0 ]; then
        fail "$c: $g kernel launches and $w host waits per step, not 1 and 1"
    fi
    stats=$(grep '^ cuda graphs:' "$tmp/${c}_full.log" | tail -1)
    echo "$stats" | grep -q ' 1 held .* 1 captures (0 recaptures), 3 replays' ||
        { cat "$tmp/${c}_full.log"; fail "$c: not captured once and replayed: $stats"; }
    same_ckpt "$tmp/${c}_eager.ckpt/iter_0000005" "$tmp/${c}_full.ckpt/iter_0000005" ||
        fail "$c: the final checkpoint differs from the run without graphs"
    echo "  $c: $(wc -l < "$tmp/${c}_full.values") figures and the final checkpoint bit-identical;" \
        "1 launch and 1 host wait per step;$(echo "$stats" | sed 's/^ cuda graphs://')"
}

both full_recompute "recompute%granularity='full'" "recompute%method='uniform'" recompute%num_layers=1
both selective "recompute%granularity='selective'" moe%layer_freq=1,0 moe%shared_expert_intermediate_size=128 \
    "recompute%modules='core_attn','layernorm','moe_act','moe','shared_experts','mlp'"
both offload recompute%fine_grained_activation_offloading=T \
    "recompute%offload_modules='attn_norm','qkv_linear','core_attn','attn_proj','mlp_norm','expert_fc1','moe_act'"
grep -q 'offloaded per step: [1-9]' "$tmp/offload_full.values" || fail "offload: nothing offloaded (the case tests nothing)"
bias="moe%router_enable_expert_bias=T moe%router_score_function='sigmoid' moe%router_bias_update_rate=0.01"
# shellcheck disable=SC2086
both expert_bias $bias
# the biases change the routing: without their update the figures would differ
# shellcheck disable=SC2086
train expert_bias_frozen $bias moe%router_bias_update_rate=0
cmp -s "$tmp/expert_bias_eager.values" "$tmp/expert_bias_frozen.values" &&
    fail "expert_bias: the same figures with the biases never updated (the case tests nothing)"
echo "PASS: the full iteration holds recompute, offloading and the expert bias, bit-identical to no graphs"

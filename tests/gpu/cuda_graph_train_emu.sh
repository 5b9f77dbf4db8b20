#!/bin/sh
# CUDA graphs in training (&cuda_graph, doc/host-overhead.md "CUDA graphs") on the CUDA
# backend (tests/gpu/moetrain-emu: kernels/cuda on the emulated device), bf16, 4
# iterations of 2 micro-batches with warmup_steps = 1, so that iteration 2 captures and
# iterations 3 and 4 (and the validation pass) replay:
# - tiny_moe with the default scopes (attn, moe_router, moe_preprocess), with device
#   work run at once and deferred per stream (MT_EMU_STREAMS=deferred);
# - tiny_moe with drop-and-pad (capacity with padding) and the whole-block moe scope;
# - impl = 'full_iteration' (the whole iteration, optimizer step included, one graph):
#   tiny_moe with drop-and-pad, in both MT_EMU_STREAMS modes, and a dense model: one
#   launch and one host wait per step after warm-up, the final checkpoint (weights and
#   moments) byte-identical to the eager run's; then a run whose gradient turns
#   non-finite at once (a huge learning rate), where the device's skip must match the
#   eager run's skips;
# - tests/parallel/moe.nml (a dense layer, a shared expert) with the attn, mlp,
#   moe_router and moe_preprocess scopes under full recompute, which adds the
#   recompute pass's graphs;
# - where the build has MPI and the emulated NCCL: tiny_moe over 2 processes with TP 2
#   (attention between the sequence-parallel collectives, the router in two segments
#   around the TP sum of the balancing counts) and with PP 2 (a graph per micro-batch slot
#   in flight);
# each against the same run without graphs: losses, balancing and z losses, gradient
# norms, dropped tokens and the validation loss bit-identical, fewer kernel launches per
# step after warm-up, graphs replayed, none captured again. A replay that computes
# anything else than the eager ops, or a scope that is not replayed, fails here. Then
# the refusals at --check and at start. Never skipped (the two-process cases say why when
# they do not run).
. "$MT_TOP_SRCDIR/tests/train/common.sh"
. "$MT_TOP_SRCDIR/tests/train/same_ckpt.sh"
EMU="${MT_TOP_BUILDDIR:-.}/tests/gpu/moetrain-emu"
PLAIN="${MOETRAIN:-${MT_TOP_BUILDDIR:-.}/moetrain}"
export MOETRAIN_DATADIR="${MT_TOP_BUILDDIR:-.}"
tiny="$MT_TOP_SRCDIR/namelists/tiny_moe.nml"
layers="$MT_TOP_SRCDIR/tests/parallel/moe.nml"
dense="moe%num_experts=0 moe%layer_freq=0,0" # tiny_moe's two layers dense
graphs="cuda_graph%impl='local' cuda_graph%warmup_steps=1"
LAUNCH=""

# train NAME NML OVERRIDES...: $tmp/NAME.log and the compared figures in $tmp/NAME.values
train() {
    name=$1 nml=$2
    shift 2
    $LAUNCH "$EMU" --backend=cuda "$nml" training%train_iters=4 optimizer%lr_warmup_iters=1 \
        training%micro_batch_size=1 training%global_batch_size=2 training%seq_length=16 \
        training%eval_interval=4 training%eval_iters=1 logging%log_interval=1 \
        "precision%params_dtype='bf16'" "logging%metrics_file='$tmp/$name.jsonl'" "$@" \
        > "$tmp/$name.log" 2>&1 < /dev/null || { cat "$tmp/$name.log"; fail "$name: training failed"; }
    grep -o '"\(loss\|val_loss\|aux_loss\|z_loss\|grad_norm\|dropped_tokens\)": [^,}]*' \
        "$tmp/$name.jsonl" > "$tmp/$name.values"
    grep -q '"val_loss": ' "$tmp/$name.values" || { cat "$tmp/$name.log"; fail "$name: no val_loss"; }
}

# syncs NAME: host synchronisations per step of the last iteration
syncs() {
    grep -o 'host synchronisations [0-9][0-9.]*' "$tmp/$1.log" | tail -1 | sed 's/.* //'
}

# launches NAME: kernel launches per step of the last iteration
launches() {
    grep -o 'kernel launches [0-9][0-9.]*' "$tmp/$1.log" | tail -1 | sed 's/.* //; s/\..*//'
}

# compare EAGER GRAPHED: the same figures, fewer launches, replays and no recapture
compare() {
    cmp -s "$tmp/$1.values" "$tmp/$2.values" ||
        { diff "$tmp/$1.values" "$tmp/$2.values" | head; fail "$2: differs from $1 (no graphs)"; }
    e=$(launches "$1") g=$(launches "$2")
    [ -n "$e" ] && [ -n "$g" ] && [ "$g" -lt "$e" ] ||
        fail "$2: kernel launches per step $g, not fewer than without graphs ($e)"
    stats=$(grep '^ cuda graphs:' "$tmp/$2.log" | tail -1)
    echo "$stats" | grep -q '[1-9][0-9]* held .* [1-9][0-9]* captures (0 recaptures), [1-9][0-9]* replays' ||
        { cat "$tmp/$2.log"; fail "$2: no graphs replayed, or graphs captured again: $stats"; }
    grep -q "^memory: CUDA graphs: [1-9][0-9]* graphs captured in iteration 2 hold [0-9]* bytes" "$tmp/$2.log" ||
        fail "$2: no graph memory in the memory report"
    echo "  $2: $(wc -l < "$tmp/$2.values") figures bit-identical to $1; launches per step $e -> $g;$(echo "$stats" | sed 's/^ cuda graphs://')"
}

train eager "$tiny"
# shellcheck disable=SC2086 # a list of overrides
train local "$tiny" $graphs logging%log_memory=T
compare eager local
# shellcheck disable=SC2086
MT_EMU_STREAMS=deferred train deferred "$tiny" $graphs logging%log_memory=T
compare eager deferred

pad="moe%expert_capacity_factor=1.0 moe%pad_expert_input_to_capacity=T"
# shellcheck disable=SC2086
train pad_eager "$tiny" $pad
# shellcheck disable=SC2086
train pad_moe "$tiny" $pad $graphs "cuda_graph%modules='attn','moe'" logging%log_memory=T
compare pad_eager pad_moe

# the whole iteration: one graph launch and one read per step once captured
full="cuda_graph%impl='full_iteration' cuda_graph%warmup_steps=1 logging%log_memory=T"
# full_compare EAGER GRAPHED: compare, one launch and one host wait per step, the same checkpoint
full_compare() {
    compare "$1" "$2"
    [ "$(launches "$2")" = 1 ] && [ "$(syncs "$2")" = 1.0 ] ||
        fail "$2: $(launches "$2") kernel launches and $(syncs "$2") host waits per step, not 1 and 1"
    same_ckpt "$tmp/$1.ckpt/iter_0000004" "$tmp/$2.ckpt/iter_0000004" ||
        fail "$2: the final weights or moments differ from $1's"
    echo "  $2: 1 launch and 1 host wait per step; final checkpoint byte-identical"
}
# shellcheck disable=SC2086
train pad_ckpt "$tiny" $pad "checkpoint%save='$tmp/pad_ckpt.ckpt'"
# shellcheck disable=SC2086
train pad_full "$tiny" $pad $full "checkpoint%save='$tmp/pad_full.ckpt'"
full_compare pad_ckpt pad_full
# shellcheck disable=SC2086
MT_EMU_STREAMS=deferred train pad_full_deferred "$tiny" $pad $full "checkpoint%save='$tmp/pad_full_deferred.ckpt'"
full_compare pad_ckpt pad_full_deferred
# shellcheck disable=SC2086
train dense_ckpt "$tiny" $dense "checkpoint%save='$tmp/dense_ckpt.ckpt'"
# shellcheck disable=SC2086
train dense_full "$tiny" $dense $full "checkpoint%save='$tmp/dense_full.ckpt'"
full_compare dense_ckpt dense_full
# a step whose loss or gradient is not finite is skipped on the device as the host
# skips it eagerly (the same iterations skipped, the same weights after)
blow="optimizer%lr=1e30 optimizer%lr_warmup_iters=0 optimizer%clip_grad=0"
# shellcheck disable=SC2086
train blow_ckpt "$tiny" $pad $blow "checkpoint%save='$tmp/blow_ckpt.ckpt'"
# shellcheck disable=SC2086
train blow_full "$tiny" $pad $blow $full "checkpoint%save='$tmp/blow_full.ckpt'"
grep -q '"step_skipped": true' "$tmp/blow_ckpt.jsonl" || fail "blow_ckpt: no step skipped (the case tests nothing)"
grep -o '"iteration": [0-9]*, [^}]*"step_skipped": true' "$tmp/blow_ckpt.jsonl" > "$tmp/blow_ckpt.skips"
grep -o '"iteration": [0-9]*, [^}]*"step_skipped": true' "$tmp/blow_full.jsonl" > "$tmp/blow_full.skips"
cmp -s "$tmp/blow_ckpt.skips" "$tmp/blow_full.skips" || fail "blow_full: other steps skipped than eagerly"
same_ckpt "$tmp/blow_ckpt.ckpt/iter_0000004" "$tmp/blow_full.ckpt/iter_0000004" ||
    fail "blow_full: the state after skipped steps differs from the eager run's"
echo "  blow_full: $(wc -l < "$tmp/blow_full.skips") steps skipped on the device as eagerly; final checkpoint byte-identical"

train layers_eager "$layers"
# shellcheck disable=SC2086
train layers_recompute "$layers" $graphs "cuda_graph%modules='attn','mlp','moe_router','moe_preprocess'" \
    "recompute%granularity='full'" "recompute%method='uniform'" recompute%num_layers=2 logging%log_memory=T
compare layers_eager layers_recompute

nccl="${MT_TOP_BUILDDIR:-.}/tests/runtime/emu-nccl"
env="${MT_TOP_BUILDDIR:-.}/tests/runtime/build.env" # MPIRUN, MT_HAVE_MPI
[ -r "$env" ] && . "$env"
if [ "${MT_HAVE_MPI:-}" = yes ] && [ -n "${MPIRUN:-}" ] && [ -x "$MPIRUN" ] && [ -e "$nccl/libnccl.so.2" ]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MT_EMU_DEVICE_COUNT=2
    LD_LIBRARY_PATH="$nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM MT_EMU_DEVICE_COUNT LD_LIBRARY_PATH
    LAUNCH="timeout 300 $MPIRUN --oversubscribe -np 2"
    tp="parallel%tensor_model_parallel_size=2 parallel%sequence_parallel=T training%micro_batch_size=2"
    # shellcheck disable=SC2086
    train tp_eager "$tiny" $tp
    # shellcheck disable=SC2086
    train tp_local "$tiny" $tp $graphs logging%log_memory=T
    compare tp_eager tp_local
    pp="parallel%pipeline_model_parallel_size=2 training%global_batch_size=4"
    # shellcheck disable=SC2086
    train pp_eager "$tiny" $pp
    # shellcheck disable=SC2086
    train pp_local "$tiny" $pp $graphs logging%log_memory=T
    compare pp_eager pp_local
    LAUNCH=""
else
    echo "  TP 2 and PP 2 not run: they need a build with MPI (mpirun) and the emulated NCCL ($nccl)"
fi

# refused CASE MESSAGE NML OPTIONS...: --check (or a start) fails naming the key
refused() {
    what=$1 message=$2 nml=$3
    shift 3
    if "$PLAIN" "$nml" "$@" > "$tmp/refused.log" 2>&1; then
        fail "$what: accepted"
    fi
    grep -qF -e "$message" "$tmp/refused.log" ||
        { cat "$tmp/refused.log"; fail "$what: not refused with: $message"; }
    echo "  refused: $what"
}
refused "moe scope with dropless routing" \
    "&cuda_graph modules: 'moe' with dropless routing" \
    "$tiny" --check "cuda_graph%impl='local'" "cuda_graph%modules='attn','moe'"
refused "moe scope with capacity but no padding" \
    "without pad_expert_input_to_capacity" \
    "$tiny" --check "cuda_graph%impl='local'" "cuda_graph%modules='moe'" moe%expert_capacity_factor=1.0
refused "full iteration with dropless routing" \
    "&cuda_graph impl = 'full_iteration': a whole iteration is one graph only where every shape is static, and dropless routing" \
    "$tiny" --check "cuda_graph%impl='full_iteration'"
# shellcheck disable=SC2086
refused "full iteration with overlap_param_gather" \
    "&cuda_graph impl = 'full_iteration' with &parallel overlap_param_gather = .true.: the updated parameters' all-gathers are left in flight" \
    "$tiny" --check --world-size 2 parallel%use_distributed_optimizer=T parallel%overlap_grad_reduce=T \
    parallel%overlap_param_gather=T "cuda_graph%impl='full_iteration'" $pad
# shellcheck disable=SC2086
refused "full iteration with modules" \
    "&cuda_graph modules applies only with impl = 'local' (impl 'full_iteration'" \
    "$tiny" --check "cuda_graph%impl='full_iteration'" $pad "cuda_graph%modules='attn'"
refused "moe_preprocess alone" "'moe_preprocess' needs 'moe_router'" \
    "$tiny" --check "cuda_graph%impl='local'" "cuda_graph%modules='moe_preprocess'"
refused "mlp in a model without dense layers" "&cuda_graph modules(1) = 'mlp': this model has no dense MLP layer" \
    "$tiny" --check "cuda_graph%impl='local'" "cuda_graph%modules='mlp'"
refused "a scope that does not exist" "&cuda_graph modules(2) = 'mamba' is not a scope of this model" \
    "$tiny" --check "cuda_graph%impl='local'" "cuda_graph%modules='attn','mamba'"
refused "no warm-up" "&cuda_graph warmup_steps = 0: at least 1 eager iteration" \
    "$tiny" --check "cuda_graph%impl='local'" cuda_graph%warmup_steps=0
refused "modules without impl" "&cuda_graph modules applies only with impl = 'local'" \
    "$tiny" --check "cuda_graph%modules='attn'"
refused "router forcing in a scope" "the forced logits are copied from host memory" \
    "$tiny" --check "cuda_graph%impl='local'" moe%router_force_load_balancing=T
refused "the CPU backend at --check" "&cuda_graph impl = 'local': CUDA graphs need the cuda backend (the cpu backend" \
    "$tiny" --check --backend cpu "cuda_graph%impl='local'"
refused "the CPU backend at start" "&cuda_graph impl = 'local': CUDA graphs need the cuda backend (the cpu backend" \
    "$tiny" --backend cpu training%train_iters=1 optimizer%lr_warmup_iters=0 "cuda_graph%impl='local'"
echo "PASS: CUDA graph scopes and the full iteration replay what the eager ops compute, with fewer launches"

#!/bin/sh
# &cuda_graph modules = 'moe' (the whole MoE block in a graph) under expert and tensor
# parallelism over the emulated NCCL (doc/host-overhead.md "CUDA graphs"): tiny_moe with
# drop-and-pad on 2 processes, 4 iterations with warmup_steps = 1 (iteration 2
# captures, iterations 3 and 4 and the validation pass replay):
#   - EP 2 (the all-to-all dispatcher's exchanges captured in the block), device work
#     run at once and deferred per stream (MT_EMU_STREAMS=deferred);
#   - EP 2 with a shared expert overlapped with the dispatcher's all-to-all
#     (moe_shared_expert_overlap: the all-to-all started on the communication stream,
#     its completion joined by an event in the graph), in both stream modes;
#   - EP 2 with the allgather dispatcher (its all-gathers and reduce-scatter captured);
#   - TP 2 with sequence parallelism, so ETP 2 (the ETP exchanges and the shared
#     gathers and reductions of the block captured);
# each against the same run without graphs: losses, balancing and z losses, gradient
# norms, dropped tokens and the validation loss bit-identical, graphs replayed and none
# captured again, fewer kernel launches. A collective run at capture instead of at each
# launch, or left out of the graph, changes the figures.
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
need_mpirun
use_emulated_nccl 2
cd "$tmp"

# train NAME OVERRIDES...: NAME.log and the compared figures in NAME.values
train() {
    name=$1
    shift
    timeout 300 "$MPIRUN" --oversubscribe -np 2 "$emu" --backend=cuda "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" \
        training%train_iters=4 optimizer%lr_warmup_iters=1 training%global_batch_size=2 \
        training%seq_length=16 training%eval_interval=4 training%eval_iters=1 logging%log_interval=1 \
        "precision%params_dtype='bf16'" "logging%metrics_file='$name.jsonl'" \
        moe%expert_capacity_factor=1.0 moe%pad_expert_input_to_capacity=T \
        parallel%distributed_timeout_minutes=1 "$@" > "$name.log" 2>&1 < /dev/null ||
        { cat "$name.log"; fail "$name: training failed"; }
    grep -o '"\(loss\|val_loss\|aux_loss\|z_loss\|grad_norm\|dropped_tokens\)": [^,}]*' "$name.jsonl" > "$name.values"
    grep -q '"val_loss": ' "$name.values" || { cat "$name.log"; fail "$name: no val_loss"; }
}
launches() { grep -o 'host costs of the cuda backend since it started: [0-9]* kernel launches' "$1.log" | sed 's/.*: \([0-9]*\) kernel.*/\1/'; }
# compare EAGER GRAPHED: the same figures, graphs replayed and none captured again, fewer launches
compare() {
    cmp -s "$1.values" "$2.values" || { diff "$1.values" "$2.values" | head; fail "$2: differs from $1 (no graphs)"; }
    stats=$(grep '^ cuda graphs:' "$2.log" | tail -1)
    echo "$stats" | grep -q '[1-9][0-9]* held .* [1-9][0-9]* captures (0 recaptures), [1-9][0-9]* replays' ||
        { cat "$2.log"; fail "$2: no graphs replayed, or graphs captured again: $stats"; }
    e=$(launches "$1") g=$(launches "$2")
    [ -n "$e" ] && [ -n "$g" ] && [ "$g" -lt "$e" ] || fail "$2: $g kernel launches, not fewer than without graphs ($e)"
    echo "ok: $2: $(wc -l < "$2.values") figures bit-identical to $1; launches $e -> $g;$(echo "$stats" | sed 's/^ cuda graphs://')"
}
moe="cuda_graph%impl='local' cuda_graph%warmup_steps=1 cuda_graph%modules='attn','moe'"

ep="parallel%expert_model_parallel_size=2 training%micro_batch_size=1"
# shellcheck disable=SC2086 # lists of overrides
train ep_eager $ep
# shellcheck disable=SC2086
train ep_moe $ep $moe
compare ep_eager ep_moe
# shellcheck disable=SC2086
MT_EMU_STREAMS=deferred train ep_moe_deferred $ep $moe
compare ep_eager ep_moe_deferred

shared="$ep moe%shared_expert_intermediate_size=128 moe%moe_shared_expert_overlap=T"
# shellcheck disable=SC2086
train shared_eager $shared
# shellcheck disable=SC2086
train shared_moe $shared $moe
compare shared_eager shared_moe
# shellcheck disable=SC2086
MT_EMU_STREAMS=deferred train shared_moe_deferred $shared $moe
compare shared_eager shared_moe_deferred

allgather="$ep moe%token_dispatcher_type='allgather'"
# shellcheck disable=SC2086
train allgather_eager $allgather
# shellcheck disable=SC2086
train allgather_moe $allgather $moe
compare allgather_eager allgather_moe

tp="parallel%tensor_model_parallel_size=2 parallel%sequence_parallel=T training%micro_batch_size=2"
# shellcheck disable=SC2086
train tp_eager $tp
# shellcheck disable=SC2086
train tp_moe $tp $moe
compare tp_eager tp_moe
grep -q 'experts ETP 2 x EP 1' tp_moe.log || { cat tp_moe.log; fail "tp_moe: not ETP 2"; }

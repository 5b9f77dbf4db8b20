# Sourced by the tests of &cuda_graph impl = 'full_iteration' over the emulated NCCL
# (tests/runtime/cuda_graph_full_nccl_emu.sh, cuda_graph_pp_nccl_emu.sh), after common.sh,
# same_ckpt.sh and use_emulated_nccl: tiny_moe with drop-and-pad, 4 iterations of a global
# batch of 4 micro-batches of 1, each run against the same run without graphs.
# train NAME OVERRIDES...: on $np processes (2 unless set), NAME.log, NAME.ckpt and the
# compared figures in NAME.values
train() {
    name=$1
    shift
    timeout 300 "$MPIRUN" --oversubscribe -np "${np:-2}" "$emu" --backend=cuda "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" \
        training%train_iters=4 optimizer%lr_warmup_iters=1 training%micro_batch_size=1 \
        training%global_batch_size=4 training%seq_length=16 training%eval_interval=4 \
        training%eval_iters=1 logging%log_interval=1 "precision%params_dtype='bf16'" \
        "logging%metrics_file='$name.jsonl'" "checkpoint%save='$name.ckpt'" \
        moe%expert_capacity_factor=1.0 moe%pad_expert_input_to_capacity=T \
        parallel%distributed_timeout_minutes=1 "$@" > "$name.log" 2>&1 < /dev/null ||
        { cat "$name.log"; fail "$name: training failed"; }
    grep -o '"\(loss\|val_loss\|aux_loss\|z_loss\|grad_norm\|dropped_tokens\)": [^,}]*' "$name.jsonl" > "$name.values"
    grep -q '"val_loss": ' "$name.values" || { cat "$name.log"; fail "$name: no val_loss"; }
}
# per_step NAME WHAT: kernel launches or host synchronisations per step, last iteration
per_step() { grep -o "$2 [0-9][0-9.]*" "$1.log" | tail -1 | sed 's/.* //'; }
# compare EAGER GRAPHED: the same figures and checkpoint, one launch and one wait per
# step, the graph replayed and not captured again
compare() {
    cmp -s "$1.values" "$2.values" || { diff "$1.values" "$2.values" | head; fail "$2: differs from $1 (no graphs)"; }
    same_ckpt "$1.ckpt/iter_0000004" "$2.ckpt/iter_0000004" ||
        fail "$2: the final weights or moments differ from $1's"
    e=$(per_step "$1" 'kernel launches') g=$(per_step "$2" 'kernel launches') w=$(per_step "$2" 'host synchronisations')
    [ "$g" = 1.0 ] && [ "$w" = 1.0 ] ||
        { cat "$2.log"; fail "$2: $g kernel launches and $w host waits per step, not 1 and 1"; }
    stats=$(grep '^ cuda graphs:' "$2.log" | tail -1)
    echo "$stats" | grep -q ' 1 held .* 1 captures (0 recaptures), 2 replays' ||
        { cat "$2.log"; fail "$2: not one graph captured once and replayed twice: $stats"; }
    echo "ok: $2: $(wc -l < "$2.values") figures and the checkpoint bit-identical to $1; launches per step $e -> $g"
}
full="cuda_graph%impl='full_iteration' cuda_graph%warmup_steps=1"

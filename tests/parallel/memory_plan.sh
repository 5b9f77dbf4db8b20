#!/bin/sh
# The memory report is the allocating code's: `moetrain --check --world-size N` sets
# each rank up on the plan backend (address ranges reserved, never backed) and prints
# the most loaded rank of every pipeline stage by category; logging%log_memory prints
# the same report from the objects of a real run of N processes. They agree to the
# byte in every layout below (TP, EP with both dispatchers, ETP, ZeRO, PP, interleaved
# PP with its messages, bf16). precision%gpu_memory_gb refuses a layout that does not
# fit, at --check and before a run allocates anything. A dropless step whose experts
# receive more rows than moe%expert_buffer_factor planned borrows the rest for that
# step and trains exactly as with buffers sized for the worst case.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
SHORT="training%micro_batch_size=1 training%global_batch_size=4 training%seq_length=16
training%train_iters=2 training%eval_iters=0"
TP2="parallel%tensor_model_parallel_size=2 parallel%sequence_parallel=T"
EP2="parallel%expert_model_parallel_size=2"
ETP1="parallel%expert_tensor_parallel_size=1"
PP2="parallel%pipeline_model_parallel_size=2"

# report NAME NP OVERRIDES...: the --check report and the --log-memory one of a real run
report() {
    name=$1 np=$2
    shift 2
    # shellcheck disable=SC2086 # lists of overrides
    "$MOETRAIN" "$nml" --check --world-size "$np" $SHORT "$@" > "$name.check" 2>&1 ||
        { cat "$name.check"; fail "$name: --check failed"; }
    # shellcheck disable=SC2086
    run "$name" "$np" $SHORT logging%log_memory=T "$@"
    sed -n '/^memory per GPU in bytes/,/^[^ ]/p' "$name.check" | grep '^  stage ' > "$name.planned"
    sed -n '/^memory per GPU in bytes/,/^[^ ]/p' "$name.log" | grep '^  stage ' > "$name.measured"
    [ -s "$name.planned" ] || { cat "$name.check"; fail "$name: --check prints no memory report"; }
    diff "$name.planned" "$name.measured" > /dev/null ||
        { diff "$name.planned" "$name.measured"; fail "$name: --check and the run's report differ"; }
    echo "  $name: $(wc -l < "$name.planned") stage(s) alike, e.g. $(head -n 1 "$name.planned" | sed 's/.*| total/total/')"
}

# shellcheck disable=SC2086 # lists of overrides
{
    report one 1
    report one_bf16 1 "precision%params_dtype='bf16'"
    report tp2 2 $TP2
    report ep2 2 $EP2 $ETP1
    report ep2_allgather 2 $EP2 $ETP1 "moe%token_dispatcher_type='allgather'"
    report tp2_ep2_etp2_zero 4 $TP2 $EP2 parallel%use_distributed_optimizer=T
    report pp2_tp2_ep2 4 $PP2 $TP2 $EP2 $ETP1 training%global_batch_size=8 \
        model%num_layers=4 moe%layer_freq=1,0,1,1
    report pp2_vpp2 2 $PP2 parallel%virtual_pipeline_model_parallel_size=2 \
        model%num_layers=4 moe%layer_freq=1,0,1,1 training%global_batch_size=8
}
grep -q "peak pipeline messages \([0-9]*\) (planned \1)" pp2_vpp2.log ||
    { grep "pipeline stage" pp2_vpp2.log; fail "pp2_vpp2: the interleaved schedule held other messages than planned"; }
echo "the reports of --check and of the runs agree to the byte"

# precision%gpu_memory_gb: refused at --check, and before a run allocates
"$MOETRAIN" "$nml" --check --world-size 2 $SHORT $EP2 $ETP1 precision%gpu_memory_gb=0.001 \
    > small.check 2>&1 && { cat small.check; fail "--check accepted a layout over gpu_memory_gb"; }
grep -q "needs 0.00 GiB of GPU memory, more than precision%gpu_memory_gb = 0.001: activations" small.check ||
    { cat small.check; fail "--check: no clear message for gpu_memory_gb"; }
"$MOETRAIN" "$nml" $SHORT precision%gpu_memory_gb=0.001 > small.log 2>&1 < /dev/null &&
    { cat small.log; fail "training started over gpu_memory_gb"; }
grep -q "precision%gpu_memory_gb = 0.001" small.log || { cat small.log; fail "training: no clear message for gpu_memory_gb"; }
grep -q "iteration" small.log && { cat small.log; fail "training ran before the memory check"; }
echo "precision%gpu_memory_gb refuses a rank that does not fit, naming the categories"

# overflow: buffers for a quarter of the balanced load borrow on (nearly) every layer;
# the losses, norms and loads are those of worst-case buffers, bit for bit
# shellcheck disable=SC2086
{
    run worst 2 $SHORT $EP2 $ETP1 moe%expert_buffer_factor=0
    run tight 2 $SHORT $EP2 $ETP1 moe%expert_buffer_factor=0.25
    run tight_ag 2 $SHORT $EP2 $ETP1 moe%expert_buffer_factor=0.25 "moe%token_dispatcher_type='allgather'"
    run worst_ag 2 $SHORT $EP2 $ETP1 moe%expert_buffer_factor=0 "moe%token_dispatcher_type='allgather'"
}
for r in tight tight_ag; do
    grep -q "expert buffer overflows: [1-9]" $r.log || { cat $r.log; fail "$r: no overflow counted"; }
done
grep -q "expert buffer overflows" worst.log && { cat worst.log; fail "worst: overflows with worst-case buffers"; }
for key in loss grad_norm expert_load_min expert_load_max; do
    close worst tight "$key" 0 || fail "tight: $key differs"
    close worst_ag tight_ag "$key" 0 || fail "tight_ag: $key differs"
done
echo "a step beyond the planned expert rows borrows and trains exactly as with worst-case buffers"

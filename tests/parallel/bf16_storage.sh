#!/bin/sh
# bf16 storage changes no value. In bf16 training the activations, the working copy of
# the weights and everything saved for backward are stored as bf16, written so by the
# ops that produce them; before, they were fp32 buffers rounded to bf16 in place after
# each producer. MT_DEBUG_FP32_ACTIVATIONS=1 still trains that way (the working copy
# stays bf16 either way). Both must give the same trajectory and the same checkpoint,
# byte for byte, in every layout: one process, TP with sequence parallelism, EP with
# the all-to-all and the all-gather dispatchers (ETP 1: bf16 rows cross the EP group;
# ETP 2: fp32 partial sums, rounded after their sum), pipeline stages (bf16 messages),
# the interleaved schedule, and the guard backend. Both runs of a pair use the same
# BLAS on the same machine, so the comparison is exact on any CPU.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
BF16="precision%params_dtype='bf16' training%micro_batch_size=1 training%global_batch_size=4
training%seq_length=16 training%train_iters=3 training%eval_iters=1 training%eval_interval=3
checkpoint%save_interval=3"
TP2="parallel%tensor_model_parallel_size=2 parallel%sequence_parallel=T"
EP2="parallel%expert_model_parallel_size=2"
ETP1="parallel%expert_tensor_parallel_size=1"
PP2="parallel%pipeline_model_parallel_size=2"

# pair NAME NP OVERRIDES...: bf16 storage and the fp32-stored reference, alike
pair() {
    pname=$1 pnp=$2 # (run sets name)
    shift 2
    # shellcheck disable=SC2086 # lists of overrides
    run "$pname" "$pnp" $BF16 "$@"
    MT_DEBUG_FP32_ACTIVATIONS=1
    export MT_DEBUG_FP32_ACTIVATIONS
    # shellcheck disable=SC2086
    run "$pname.ref" "$pnp" $BF16 "$@"
    unset MT_DEBUG_FP32_ACTIVATIONS
    for key in loss grad_norm aux_loss z_loss val_loss expert_load_max; do
        field "$pname.jsonl" $key > run.col
        field "$pname.ref.jsonl" $key > ref.col
        [ -s ref.col ] || fail "$pname: no $key"
        cmp -s run.col ref.col || { paste ref.col run.col; fail "$pname: $key differs from fp32 storage"; }
    done
    same_ckpt "$pname/iter_0000003" "$pname.ref/iter_0000003" ||
        fail "$pname: the checkpoint differs from fp32 storage"
    echo "  $pname ($pnp processes): losses, gradient norms and checkpoint identical"
}

# shellcheck disable=SC2086 # lists of overrides
{
    pair one 1
    pair tp2 2 $TP2
    pair ep2_alltoall 2 $EP2 $ETP1
    pair ep2_allgather 2 $EP2 $ETP1 "moe%token_dispatcher_type='allgather'"
    pair tp2_ep2_etp2 4 $TP2 $EP2
    pair tp2_ep2_etp2_allgather 4 $TP2 $EP2 "moe%token_dispatcher_type='allgather'"
    pair pp2_tp2_ep2 4 $PP2 $TP2 $EP2 $ETP1 training%global_batch_size=8 \
        model%num_layers=4 moe%layer_freq=1,0,1,1
    pair pp2_vpp2 2 $PP2 parallel%virtual_pipeline_model_parallel_size=2 \
        model%num_layers=4 moe%layer_freq=1,0,1,1 training%global_batch_size=8
    pair guard 1 --backend=guard
}

# the memory report sees it: bf16 activations take about 60% of fp32 ones here (att_out,
# the statistics, router scores and the logits stay fp32)
# shellcheck disable=SC2086 # a list of overrides
"$MOETRAIN" "$nml" --check $BF16 checkpoint%save=\'ck\' > bf16.check 2>&1 ||
    { cat bf16.check; fail "--check failed"; }
# shellcheck disable=SC2086
MT_DEBUG_FP32_ACTIVATIONS=1 "$MOETRAIN" "$nml" --check $BF16 checkpoint%save=\'ck\' > ref.check 2>&1 ||
    { cat ref.check; fail "--check failed"; }
act() { sed -n 's/.*activations \([0-9]*\) .*/\1/p' "$1" | head -n 1; }
a16=$(act bf16.check) a32=$(act ref.check)
[ -n "$a16" ] && [ -n "$a32" ] || { cat bf16.check; fail "no activation figure in the report"; }
echo "  activations of one micro-batch in flight: $a16 bytes stored bf16, $a32 stored fp32"
[ $((a16 * 100)) -lt $((a32 * 62)) ] || fail "bf16 activations take $a16 bytes, fp32 ones $a32"
echo "bf16 storage trains exactly as fp32 storage rounded in place"

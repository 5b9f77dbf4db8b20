#!/bin/sh
# Activation recompute changes no value. With &recompute, a layer's forward keeps only
# what the setting says and its backward rebuilds the rest (the same kernels in the
# same order, with the layout's collectives: TP gathers, EP all-to-all, ETP and
# all-gather exchanges) in one buffer per rank. Against the same layout without
# recompute: the same losses, balancing and z losses, gradient norms, expert loads,
# dropped tokens and expert-buffer overflows, step by step, and the same checkpoint,
# byte for byte, in one process, TP 2 with sequence parallelism, EP 2 with the
# all-to-all dispatcher (and with buffers too small, which borrow), TP 2 x EP 2 x ETP 2
# with the all-gather dispatcher, TP 2 x EP 2 with a capacity (drops decided over the
# TP group), ZeRO-1 over DP 2, and PP 2 x VPP 2 (the shared buffer
# serves every chunk and in-flight micro-batch), each with selective and full
# recompute, and on the guard backend (every tensor a rebuild touches is backend
# memory). Both runs of a pair use the same BLAS on the same machine, so the
# comparison is exact on any CPU. The memory report of --check is the run's
# (logging%log_memory) and shows the saving.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
SHORT="precision%params_dtype='bf16' training%micro_batch_size=1 training%global_batch_size=4
training%seq_length=16 training%train_iters=3 training%eval_iters=1 training%eval_interval=3
checkpoint%save_interval=3 logging%log_memory=T"
PP2="parallel%pipeline_model_parallel_size=2"
VPP2="parallel%virtual_pipeline_model_parallel_size=2"
# every module this model has (moe covers the routed experts and the shared expert)
SEL="recompute%granularity='selective' recompute%modules='core_attn','layernorm','mlp','moe'"
SEL2="recompute%granularity='selective' recompute%modules='moe_act','shared_experts','layernorm'"
UNIFORM="recompute%granularity='full' recompute%method='uniform' recompute%num_layers=2"
BLOCK="recompute%granularity='full' recompute%method='block' recompute%num_layers=1"

# same NAME REF: NAME trained exactly as REF, and its --log-memory report is --check's
same() {
    for key in loss val_loss grad_norm aux_loss z_loss dropped_tokens expert_load_min expert_load_max; do
        field "$1.jsonl" $key > run.col
        field "$2.jsonl" $key > ref.col
        [ -s ref.col ] || fail "$2: no $key"
        cmp -s run.col ref.col || { paste ref.col run.col; fail "$1: $key differs from $2"; }
    done
    grep -o 'expert buffer overflows: [0-9]*' "$1.log" > run.col
    grep -o 'expert buffer overflows: [0-9]*' "$2.log" > ref.col
    cmp -s run.col ref.col || { paste ref.col run.col; fail "$1: other expert-buffer overflows than $2"; }
    same_ckpt "$1/iter_0000003" "$2/iter_0000003" || fail "$1: the checkpoint differs from $2's"
    echo "  $1: losses, loads, gradient norms and checkpoint identical to $2"
}

# check NAME NP OVERRIDES...: --check's report, which the run NAME printed too
check() {
    cname=$1 cnp=$2
    shift 2
    # shellcheck disable=SC2086 # lists of overrides
    "$MOETRAIN" "$nml" --check --world-size "$cnp" $SHORT "$@" checkpoint%save=\'ck\' \
        > "$cname.check" 2>&1 ||
        { cat "$cname.check"; fail "$cname: --check failed"; }
    sed -n '/^memory per GPU in bytes/,/^[^ ]/p' "$cname.check" | grep '^  stage ' > "$cname.planned"
    sed -n '/^memory per GPU in bytes/,/^[^ ]/p' "$cname.log" | grep '^  stage ' > "$cname.measured"
    [ -s "$cname.planned" ] || { cat "$cname.check"; fail "$cname: --check prints no memory report"; }
    diff "$cname.planned" "$cname.measured" > /dev/null ||
        { diff "$cname.planned" "$cname.measured"; fail "$cname: --check and the run's report differ"; }
}

# figures STAGE_LINE: activations and recompute bytes of a report line
acts() { sed -n 's/.*| activations \([0-9]*\) .*/\1/p'; }
rcbytes() { sed -n 's/.*| recompute \([0-9]*\) |.*/\1/p'; }

# layout NAME NP OVERRIDES...: the layout without recompute, then with each setting
# of $SETTINGS (a list of variable names), compared with it
layout() {
    lname=$1 lnp=$2
    shift 2
    # shellcheck disable=SC2086 # lists of overrides
    run "$lname" "$lnp" $SHORT "$@"
    check "$lname" "$lnp" "$@"
    base=$(head -n 1 "$lname.planned")
    for s in $SETTINGS; do
        eval "setting=\$$s"
        # shellcheck disable=SC2086
        run "$lname.$s" "$lnp" $SHORT "$@" $setting
        same "$lname.$s" "$lname"
        # shellcheck disable=SC2086
        check "$lname.$s" "$lnp" "$@" $setting
        line=$(head -n 1 "$lname.$s.planned")
        a0=$(echo "$base" | acts) a1=$(echo "$line" | acts) r1=$(echo "$line" | rcbytes)
        [ -n "$a1" ] && [ -n "$r1" ] && [ "$r1" -gt 0 ] && [ "$a1" -lt "$a0" ] ||
            fail "$lname.$s: activations $a1 and recompute $r1 bytes, $a0 without recompute"
        echo "    memory of stage 0: activations $a0 -> $a1 bytes, recompute buffer $r1"
    done
}

# shellcheck disable=SC2086 # lists of overrides
{
    SETTINGS="SEL SEL2 UNIFORM BLOCK" layout one 1
    SETTINGS="SEL UNIFORM" layout tp2 2 $TP2
    SETTINGS="SEL SEL2 UNIFORM" layout ep2_alltoall 2 $EP2 $ETP1 moe%expert_buffer_factor=0.25
    SETTINGS="SEL BLOCK" layout tp2_ep2_etp2_allgather 4 $TP2 $EP2 $AG
    SETTINGS="SEL UNIFORM" layout tp2_ep2_capacity 4 $TP2 $EP2 $ETP1 moe%expert_capacity_factor=1.0
    SETTINGS="SEL UNIFORM" layout zero1 2 $ZERO
    SETTINGS="SEL UNIFORM BLOCK" layout pp2_vpp2 2 $PP2 $VPP2 model%num_layers=8 \
        moe%layer_freq=1,0,1,1,1,0,1,1 training%global_batch_size=8
    SETTINGS="SEL SEL2 UNIFORM" layout guard 1 --backend=guard
}
field tp2_ep2_capacity.jsonl dropped_tokens | grep -q '^[1-9]' ||
    fail "tp2_ep2_capacity: no token dropped, the capacity is not exercised"
grep -q "expert buffer overflows: [1-9]" ep2_alltoall.SEL.log ||
    { cat ep2_alltoall.SEL.log; fail "ep2_alltoall: buffers of a quarter of the load did not borrow"; }
echo "recompute trains exactly as keeping every activation, in every layout"

#!/bin/sh
# &parallel overlap_grad_reduce and overlap_param_gather (doc/host-overhead.md, Overlap):
# each gradient bucket's data-parallel reduction starts while backward goes on, and with
# ZeRO-1 each bucket's all-gather of updated parameters is waited for only when forward
# first reads them; the training is the same as without them, bit for bit: the same
# loss, gradient norm and validation loss at every step, and byte-identical checkpoints
# after every step (saved and evaluated right after the step, while the all-gathers are
# in flight: a save or an evaluation that did not wait would see the old parameters).
# Once more saved and evaluated only at the end: the next step's forward waits for
# each bucket just before it reads its weights. And on the guard backend.
# Over DP 2 with ZeRO-1 (also bf16) and without, TP 2 x DP 2 (TP-replicated gradients
# summed over TP before their bucket's DP reduction) with EP 2 (the experts' buckets
# over the expert-DP group), PP 2 x DP 2 with tied embeddings (the embedding group's
# sum before the embedding's own buckets) and PP 2 x VPP 2 x DP 2. Buckets of 1000
# elements (ddp_bucket_size), cut through tensors: many buckets, most started during
# the last micro-batch's backward (the log says how many).
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
L4="model%num_layers=4 moe%layer_freq=1,0,1,1"
TIED="model%untie_embeddings_and_output_weights=F"
PP2="parallel%pipeline_model_parallel_size=2"
VPP2="parallel%virtual_pipeline_model_parallel_size=2"
SHORT="training%micro_batch_size=1 training%global_batch_size=8 training%seq_length=8
training%train_iters=3 training%eval_interval=1 checkpoint%save_interval=1
parallel%ddp_bucket_size=1000"
ON="parallel%overlap_grad_reduce=T"
GATHER="parallel%overlap_grad_reduce=T parallel%overlap_param_gather=T"

# --check says it
"$MOETRAIN" "$nml" --check --world-size 2 $ZERO $ON > check.out 2>&1 || { cat check.out; fail "--check failed"; }
grep -qF "data parallel: ZeRO-1 (gradients reduce-scattered), buckets of max(40M, 1M x the group's size) elements, each started as backward finishes it (overlap_grad_reduce); parameter all-gather after the step" check.out ||
    { cat check.out; fail "--check does not say that overlap_grad_reduce is on"; }

# same_bits OFF ON: ON's metrics and checkpoints are OFF's, bit for bit (the
# checkpoints ON has: of the last iteration only, when ON saved only then)
same_bits() {
    echo "$2 against $1:"
    bad=0
    for k in loss grad_norm aux_loss z_loss dropped_tokens expert_load_min expert_load_max; do
        close "$1" "$2" $k 0 || bad=1
    done
    n=$(ls -d "$2"/iter_* | wc -l)
    if [ "$n" = 3 ]; then
        for d in "$2"/iter_*; do same_ckpt "$1/${d##*/}" "$d" || bad=1; done
        close "$1" "$2" val_loss 0 || bad=1
    elif [ "$n" = 1 ] && [ -d "$2/iter_0000003" ]; then
        # the same tensors; the state differs in the evaluations counted
        for f in "$1"/iter_0000003/rank_*; do cmp "$f" "$2/iter_0000003/${f##*/}" || bad=1; done
        for r in "$1" "$2"; do grep -v '"state": ' "$r/iter_0000003/index.json" > "$r.index"; done
        cmp "$1.index" "$2.index" || bad=1
    else
        echo "$2: $n checkpoints"
        bad=1
    fi
    [ $bad = 0 ] || fail "$2 is not $1, bit for bit"
    echo "  checkpoints ($n): byte-identical"
}

# started_early RUN: RUN's log says that buckets started during backward
started_early() {
    line=$(grep 'overlap_grad_reduce: ' "$1.log") || fail "$1: the log does not say how many buckets started early"
    echo "  $line"
    early=$(echo "$line" | sed -n 's/.*: \([0-9]*\) of \([0-9]*\) gradient buckets.*/\1/p')
    [ "${early:-0}" -gt 0 ] || fail "$1: no bucket started during backward"
}

while read -r base np layout; do
    [ -n "$base" ] || continue
    # shellcheck disable=SC2086 # layout is a list of overrides
    run "$base" "$np" $SHORT $layout
    # shellcheck disable=SC2086
    run "${base}_overlap" "$np" $SHORT $layout $ON
    same_bits "$base" "${base}_overlap"
    started_early "${base}_overlap"
    case " $layout " in *" $ZERO "*) ;; *) continue ;; esac
    # shellcheck disable=SC2086
    run "${base}_gather" "$np" $SHORT $layout $GATHER
    same_bits "$base" "${base}_gather"
    started_early "${base}_gather"
    # saved and evaluated at the end only: the forwards of steps 2 and 3 wait for the
    # gathers themselves, position by position
    # shellcheck disable=SC2086
    run "${base}_gather_fwd" "$np" $SHORT $layout $GATHER training%eval_interval=3 \
        checkpoint%save_interval=3
    same_bits "$base" "${base}_gather_fwd"
done <<LAYOUTS
dp2_zero1 2 $ZERO
dp2_zero1_bf16 2 $ZERO precision%params_dtype='bf16'
dp2 2
tp2_dp2_ep2_zero1 4 $TP2 $EP2 $ETP1 $ZERO
pp2_dp2_tied_zero1 4 $L4 $TIED $PP2 $ZERO
pp2_vpp2_dp2 4 $L4 $PP2 $VPP2
pp2_vpp2_dp2_zero1 4 $L4 $PP2 $VPP2 $ZERO
LAYOUTS

# The guard backend (device memory that host code cannot touch; the collectives on it
# complete where they start, doc/host-overhead.md): the same, bit for bit
# shellcheck disable=SC2086
run dp2_zero1_guard 2 --backend=guard $SHORT $ZERO $GATHER
same_bits dp2_zero1 dp2_zero1_guard
# and its count of what made the host wait for the device is that of the same run
# without overlap: the overlapped path adds no host synchronisation
# shellcheck disable=SC2086
run dp2_zero1_guard_off 2 --backend=guard $SHORT $ZERO
syncs() { sed -n 's/^moetrain: host costs of the guard backend since it started: .*, \([0-9]*\) host synchronisations.*/\1/p' "$1.log"; }
[ -n "$(syncs dp2_zero1_guard_off)" ] && [ "$(syncs dp2_zero1_guard)" = "$(syncs dp2_zero1_guard_off)" ] ||
    { grep -h 'host costs' dp2_zero1_guard.log dp2_zero1_guard_off.log; fail "the overlapped guard run's host synchronisations differ"; }
echo "guard backend: $(syncs dp2_zero1_guard) host synchronisations with and without overlap"

# Megatron's rules, by moetrain's key names
"$MOETRAIN" "$nml" --check --world-size 2 parallel%overlap_param_gather=T $ON > err.out 2>&1 &&
    fail "overlap_param_gather without use_distributed_optimizer accepted"
grep -qF "&parallel overlap_param_gather = .true. needs use_distributed_optimizer = .true." err.out ||
    { cat err.out; fail "overlap_param_gather without ZeRO-1: not the expected message"; }
"$MOETRAIN" "$nml" --check --world-size 2 parallel%overlap_param_gather=T $ZERO > err.out 2>&1 &&
    fail "overlap_param_gather without overlap_grad_reduce accepted"
grep -qF "&parallel overlap_param_gather = .true. needs overlap_grad_reduce = .true." err.out ||
    { cat err.out; fail "overlap_param_gather without overlap_grad_reduce: not the expected message"; }
echo "overlap_param_gather refused without ZeRO-1 and without overlap_grad_reduce"

#!/bin/sh
# The NCCL backend (src/runtime/comm_nccl.c) without a GPU: nccl_check-emu (nccl_check on
# the CUDA emulator) loads the emulated NCCL (tests/runtime/emu-nccl/libnccl.so.2,
# kernels/cuda/emu/emu_nccl.cc) through the real loader, found on LD_LIBRARY_PATH.
#   - the emulated NCCL's own API checks (emu_nccl_api);
#   - every collective, send/recv and the batched ring exchange on 1, 2 and 4 processes,
#     with the emulated NCCL answering ncclInProgress on about one completion in two, so
#     that comm_nccl.c's polling runs;
#   - faults that must be reported, not hang: an ordering deadlock (two ranks each send
#     first, ungrouped; found by NCCL's timeout, or by comm_nccl.c's, which aborts the
#     communicator), ranks that all-reduce different counts, a peer that leaves;
#   - moetrain-emu --backend cuda on 2 processes (data parallel, device buffers through
#     the emulated NCCL): 2 iterations' loss and gradient norm as one process's;
#   - the same with ZeRO-1, without and with overlap_grad_reduce and overlap_param_gather
#     (nonblocking NCCL collectives ordered by events, device work deferred per stream
#     so that a missing event shows): the same figures, bit for bit, and not one host
#     synchronisation more;
#   - PP 2 x VPP 2 without and with overlap_p2p_comm (the pipeline's batches started on
#     the comm stream and waited for by the compute stream, deferred per stream): the
#     same figures, bit for bit, transfers started ahead on both stages, and the same
#     host synchronisations; and with overlap_p2p_comm_warmup_flush (the warm-up's and the
#     flush's batches started ahead too, each stage's started in an order its peer's
#     match on one comm stream): the same again, more transfers in flight on each stage.
#   - EP 2 without and with moe_shared_expert_overlap (the EP all-to-alls started on the
#     comm stream while the shared expert's kernels queue on the compute stream,
#     deferred per stream): the same figures, bit for bit, 16 all-to-alls in flight in
#     the first step, and the same host synchronisations.
# Not skipped in a build with the emulator and NCCL (it is not built otherwise).
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
need_mpirun
prog=$(own nccl_check_emu "$MT_TOP_BUILDDIR/tests/runtime/nccl_check-emu")
# one emulated device per local process
use_emulated_nccl 4
MT_EMU_NCCL_INPROGRESS=2
export MT_EMU_NCCL_INPROGRESS
cd "$tmp"

# The API itself (every type and reduction, argument checks, groups, 1 to 4 forked ranks),
# every completion of a nonblocking comm claiming ncclInProgress.
MT_EMU_NCCL_INPROGRESS=1 "$MT_TOP_BUILDDIR/tests/runtime/emu_nccl_api" ||
    fail "emu_nccl_api: the emulated NCCL's API checks"

"$prog" > out 2> err || { cat out err; fail "nccl_check-emu on one process"; }
grep -q 'passed on 1 processes' out || { cat out err; fail "one process: no verdict"; }
for n in 2 4; do
    mpirun_np $n "$prog" > out 2> err || { cat out err; fail "nccl_check-emu on $n processes"; }
    grep -q "passed on $n processes" out || { cat out err; fail "$n processes: no verdict"; }
done
echo "ok: nccl_check-emu on 1, 2 and 4 processes"

# fault MODE TIMEOUT INPROGRESS PATTERN...: nccl_check-emu MODE on 2 processes, with
# MT_EMU_NCCL_TIMEOUT_S and MT_EMU_NCCL_INPROGRESS as given, fails, reporting each PATTERN
fault() {
    mode=$1 t=$2 ip=$3; shift 3
    MT_EMU_NCCL_TIMEOUT_S=$t MT_EMU_NCCL_INPROGRESS=$ip mpirun_np 2 "$prog" "$mode" > out 2> err
    rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat out err; fail "$mode: exit $rc (expected a failure, not a hang)"; }
    for p in "$@"; do
        grep -qF -- "$p" err || { cat out err; fail "$mode: no '$p' in the error output"; }
    done
    nothing_left nccl_check_emu
    echo "ok: $mode reported"
}
fault deadlock 2 2 'possible ordering deadlock' 'ncclSend of 16 x ncclUint8 to rank' \
    'the peer has not posted the matching receive' 'send on world (rank'
# the same, NCCL's timeout long and every call in the background: comm_nccl.c's own
# timeout (3 s in this mode) must abort the communicator with the sends pending
fault deadlock-timeout 60 1 'send on world timed out' \
    'the communicator failed earlier'
fault mismatch 2 2 'the ranks called different operations or counts' 'all_reduce on world'
fault peer-gone 2 2 'rank 0: rank 1 closed its connection' 'during ncclAllReduce'

# The trainer on 2 emulated devices against 1: 2 iterations of the same global batches
# of 4 sequences of 64 tokens, split over two data-parallel ranks whose gradients (device
# buffers) go through the emulated NCCL. Loss and gradient norm within 1e-5 relative (the
# sums differ only in order; measured: identical).
set -- --backend=cuda "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" "precision%params_dtype='bf16'" \
    training%train_iters=2 training%eval_interval=100 training%eval_iters=0 \
    optimizer%lr_warmup_iters=0 training%global_batch_size=4 training%micro_batch_size=2 \
    training%seq_length=64 logging%log_interval=1 "logging%metrics_file='m.jsonl'"
mkdir one two
(cd one && timeout 120 "$emu" "$@" > out.log 2>&1 < /dev/null) ||
    { cat one/out.log; fail "moetrain-emu on one process"; }
(cd two && mpirun_np 2 "$emu" "$@" parallel%distributed_timeout_minutes=1 > out.log 2>&1 < /dev/null) ||
    { cat two/out.log; fail "moetrain-emu on two processes (data parallel)"; }
# values KEY RUN: every value of KEY in RUN's metrics
values() { sed -n "s/.*\"$1\": \([-0-9.eE+naif]*\).*/\1/p" "$2/m.jsonl"; }
for key in loss grad_norm; do
    values $key one > a; values $key two > b
    [ "$(wc -l < a)" -eq 2 ] && [ "$(wc -l < b)" -eq 2 ] ||
        { cat one/m.jsonl two/m.jsonl; fail "expected 2 values of $key from each run"; }
    paste a b | awk -v key=$key '{ d = $1 - $2; if (d < 0) d = -d
        printf "  iteration %d %s: %s (1 process), %s (2 processes)\n", NR, key, $1, $2
        if (!(d <= 1e-5 * ($1 < 0 ? -$1 : $1))) bad = 1 } END { exit bad }' ||
        fail "$key differs by more than 1e-5 relative between 1 and 2 processes"
done
echo "ok: moetrain-emu --backend=cuda on 2 processes (data parallel over the emulated NCCL)"

# Overlap over the emulated NCCL: ZeRO-1 with buckets of 20000 elements, without and with
# both overlap keys, the overlapped run's device work deferred per stream (it runs only
# when an event or a synchronisation asks for it).
mkdir zero overlap
(cd zero && mpirun_np 2 "$emu" "$@" parallel%distributed_timeout_minutes=1 \
    parallel%use_distributed_optimizer=T parallel%ddp_bucket_size=20000 > out.log 2>&1 < /dev/null) ||
    { cat zero/out.log; fail "moetrain-emu on two processes (ZeRO-1)"; }
(cd overlap && MT_EMU_STREAMS=deferred mpirun_np 2 "$emu" "$@" parallel%distributed_timeout_minutes=1 \
    parallel%use_distributed_optimizer=T parallel%ddp_bucket_size=20000 \
    parallel%overlap_grad_reduce=T parallel%overlap_param_gather=T > out.log 2>&1 < /dev/null) ||
    { cat overlap/out.log; fail "moetrain-emu on two processes (ZeRO-1, overlapped)"; }
grep -q 'overlap_grad_reduce: [1-9][0-9]* of [0-9]* gradient buckets were started during the backward' overlap/out.log ||
    { cat overlap/out.log; fail "overlapped run: no bucket started during backward"; }
syncs() { sed -n 's/^moetrain: host costs of the cuda backend since it started: [0-9]* kernel launches, \([0-9]*\) host synchronisations.*/\1/p' "$1/out.log" | sort -u; }
# same_figures BASE RUN WHAT KEY...: RUN's values of each KEY are BASE's, bit for bit, and
# so is its count of host synchronisations
same_figures() {
    base=$1 run=$2 what=$3
    shift 3
    for key in "$@"; do
        values "$key" "$base" > a; values "$key" "$run" > b
        [ -s a ] && cmp -s a b || { paste a b; fail "$key: $what differs"; }
    done
    [ -n "$(syncs "$base")" ] && [ "$(syncs "$base")" = "$(syncs "$run")" ] ||
        { grep -h 'host costs' "$base/out.log" "$run/out.log"; fail "$what: the host synchronisations differ"; }
}
same_figures zero overlap "the overlapped ZeRO-1 run" loss grad_norm
grep -q 'host synchronisations (the same)' overlap/out.log ||
    { cat overlap/out.log; fail "overlapped run: the emulator did not see the backend's count"; }
echo "ok: ZeRO-1 overlapped over the emulated NCCL: the same losses and norms, $(syncs overlap) host synchronisations as without"

# The pipeline's transfers started ahead over the emulated NCCL (mt_p2p_batch_start):
# PP 2 x VPP 2, 4 micro-batches (a steady phase), without and with overlap_p2p_comm, the
# overlapped run's device work deferred per stream.
set -- "$@" training%global_batch_size=4 training%micro_batch_size=1 training%seq_length=32 \
    model%num_layers=4 'moe%layer_freq=4*1' parallel%pipeline_model_parallel_size=2 \
    parallel%virtual_pipeline_model_parallel_size=2 parallel%distributed_timeout_minutes=1
mkdir pp pp_overlap
(cd pp && mpirun_np 2 "$emu" "$@" > out.log 2>&1 < /dev/null) ||
    { cat pp/out.log; fail "moetrain-emu on two processes (PP 2 x VPP 2)"; }
(cd pp_overlap && MT_EMU_STREAMS=deferred mpirun_np 2 "$emu" "$@" parallel%overlap_p2p_comm=T \
    > out.log 2>&1 < /dev/null) ||
    { cat pp_overlap/out.log; fail "moetrain-emu on two processes (PP 2 x VPP 2, overlap_p2p_comm)"; }
[ "$(grep -c 'overlap_p2p_comm: [1-9][0-9]* transfers per step in flight during a compute pass' pp_overlap/out.log)" = 2 ] ||
    { cat pp_overlap/out.log; fail "overlap_p2p_comm: not both stages started transfers ahead"; }
same_figures pp pp_overlap "the run with overlap_p2p_comm" loss grad_norm
echo "ok: PP 2 x VPP 2 with overlap_p2p_comm over the emulated NCCL: the same losses and norms, $(syncs pp_overlap) host synchronisations as without"
mkdir pp_wf
(cd pp_wf && MT_EMU_STREAMS=deferred mpirun_np 2 "$emu" "$@" parallel%overlap_p2p_comm=T \
    parallel%overlap_p2p_comm_warmup_flush=T > out.log 2>&1 < /dev/null) ||
    { cat pp_wf/out.log; fail "moetrain-emu on two processes (PP 2 x VPP 2, overlap_p2p_comm_warmup_flush)"; }
ahead_n() { sed -n 's/.*overlap_p2p_comm: \([0-9]*\) transfers per step in flight.*/\1/p' "$1/out.log"; }
ahead_n pp_overlap > base.n
ahead_n pp_wf > wf.n
[ "$(wc -l < wf.n)" = 2 ] && paste base.n wf.n | awk '$2 <= $1 { bad = 1 } END { exit bad }' ||
    { paste base.n wf.n; fail "overlap_p2p_comm_warmup_flush: not more transfers in flight on both stages"; }
same_figures pp pp_wf "the run with overlap_p2p_comm_warmup_flush" loss grad_norm
echo "ok: PP 2 x VPP 2 with overlap_p2p_comm_warmup_flush over the emulated NCCL: the same losses and norms, $(paste -d' ' base.n wf.n | tr '\n' ',' | sed 's/,$//; s/ /->/g; s/,/, /g') transfers in flight per stage"

# The EP all-to-all started on the comm stream while the shared expert computes
# (&moe moe_shared_expert_overlap, mt_all_to_all_v_start): the layout model of
# tests/parallel (a shared expert) at EP 2, 2 micro-batches a rank, without and with the
# key, the overlapped run's device work deferred per stream. A start not ordered after
# the compute that wrote its rows would send stale rows (without that event the run
# differs); the wait's event cannot show here, since the emulated NCCL runs a
# collective when it is enqueued.
set -- --backend=cuda "$MT_TOP_SRCDIR/tests/parallel/moe.nml" "precision%params_dtype='bf16'" \
    parallel%expert_model_parallel_size=2 training%train_iters=3 training%micro_batch_size=1 \
    training%global_batch_size=4 training%seq_length=16 training%eval_interval=3 \
    training%eval_iters=1 logging%log_interval=1 "logging%metrics_file='m.jsonl'" \
    parallel%distributed_timeout_minutes=1
mkdir ep ep_overlap
(cd ep && mpirun_np 2 "$emu" "$@" > out.log 2>&1 < /dev/null) ||
    { cat ep/out.log; fail "moetrain-emu on two processes (EP 2)"; }
(cd ep_overlap && MT_EMU_STREAMS=deferred mpirun_np 2 "$emu" "$@" moe%moe_shared_expert_overlap=T \
    > out.log 2>&1 < /dev/null) ||
    { cat ep_overlap/out.log; fail "moetrain-emu on two processes (EP 2, moe_shared_expert_overlap)"; }
# 2 MoE layers x 2 micro-batches x (dispatch and combine, forward and backward)
grep -qF 'moe_shared_expert_overlap: 16 expert-parallel all-to-alls were in flight while the shared expert ran in the first step (rank 0)' \
    ep_overlap/out.log || { cat ep_overlap/out.log; fail "moe_shared_expert_overlap: not 16 all-to-alls in flight"; }
same_figures ep ep_overlap "the run with moe_shared_expert_overlap" loss grad_norm aux_loss \
    z_loss val_loss expert_load_min expert_load_max
echo "ok: EP 2 with moe_shared_expert_overlap over the emulated NCCL: the same figures, $(syncs ep_overlap) host synchronisations as without"

#!/bin/sh
# &parallel overlap_p2p_comm (doc/host-overhead.md, Overlap): in the steady phase of the
# interleaved schedule each forward's send and the next input's receive are started
# before the backward that follows, each backward's send and the next gradient's
# receive before the next forward, and each is waited for just before its data is used.
# The training is the same as without it, bit for bit: the same loss and gradient norm
# at every step and byte-identical checkpoints, over PP 2 x VPP 2 (8 micro-batches: a
# steady phase) on the CPU and on the guard backend; the log counts the transfers
# started ahead (none would mean the schedule posts nothing ahead). With
# overlap_p2p_comm_warmup_flush the warm-up's and the flush's transfers are started ahead
# too: bit for bit the same again, over PP 2 x VPP 2 and PP 4 x VPP 2 with a steady phase
# (8 micro-batches) and without one (as many micro-batches as stages: all of them in the
# warm-up), and each stage's count of transfers in flight during a compute pass grows.
# Refused without the interleaved schedule (as Megatron's non-interleaved schedule
# refuses it), the warm-up/flush variant without overlap_p2p_comm; from-megatron follows
# Megatron's default and maps --overlap-p2p-communication-warmup-flush.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
LAYOUT="model%num_layers=4 moe%layer_freq=1,0,1,1 parallel%pipeline_model_parallel_size=2
parallel%virtual_pipeline_model_parallel_size=2"
SHORT="training%micro_batch_size=1 training%global_batch_size=8 training%seq_length=8
training%train_iters=2 training%eval_interval=2 checkpoint%save_interval=1"
ON="parallel%overlap_p2p_comm=T"
WF="parallel%overlap_p2p_comm_warmup_flush=T"

# --check says it
# shellcheck disable=SC2086
"$MOETRAIN" "$nml" --check --world-size 2 $LAYOUT $ON > check.out 2>&1 || { cat check.out; fail "--check failed"; }
grep -qF "pipeline transfers: the steady phase's sends and receives started before the compute that follows them, waited for before their data is used (overlap_p2p_comm)" check.out ||
    { cat check.out; fail "--check does not say that overlap_p2p_comm is on"; }
# shellcheck disable=SC2086
"$MOETRAIN" "$nml" --check --world-size 2 $LAYOUT $ON $WF > check.out 2>&1 || { cat check.out; fail "--check failed"; }
grep -qF "pipeline transfers: the warm-up's and the flush's sends and receives started ahead too, each waited for when its data is needed or after the next pass (overlap_p2p_comm_warmup_flush)" check.out ||
    { cat check.out; fail "--check does not say that overlap_p2p_comm_warmup_flush is on"; }

# ahead RUN: each stage's log line counts the transfers started ahead (> 0)
ahead() {
    n=$(grep -c 'overlap_p2p_comm: [1-9][0-9]* transfers per step in flight during a compute pass' "$1.log")
    grep -o 'peak pipeline messages.*' "$1.log" | sed 's/^/  /'
    [ "$n" = 2 ] || fail "$1: not both stages started transfers ahead"
}

# shellcheck disable=SC2086
run pp2_vpp2 2 $SHORT $LAYOUT
# shellcheck disable=SC2086
run pp2_vpp2_p2p 2 $SHORT $LAYOUT $ON
same_bits pp2_vpp2 pp2_vpp2_p2p 2
ahead pp2_vpp2_p2p
! grep -q 'overlap_p2p_comm:' pp2_vpp2.log || fail "pp2_vpp2: overlap counted with the key off"

# the guard backend (a start on its device memory completes where it starts)
# shellcheck disable=SC2086
run pp2_vpp2_p2p_guard 2 --backend=guard $SHORT $LAYOUT $ON
same_bits pp2_vpp2 pp2_vpp2_p2p_guard 2
ahead pp2_vpp2_p2p_guard

# counts RUN: each stage's transfers in flight during a compute pass, one per line
counts() { sed -n 's/.*overlap_p2p_comm: \([0-9]*\) transfers per step in flight.*/\1/p' "$1.log"; }
# more BASE RUN: every stage of RUN counts more transfers in flight than in BASE
more() {
    counts "$1" > base.n
    counts "$2" > run.n
    [ "$(wc -l < run.n)" -gt 0 ] && [ "$(wc -l < run.n)" = "$(wc -l < base.n)" ] &&
        paste base.n run.n | awk '$2 <= $1 { bad = 1 } END { exit bad }' ||
        { paste base.n run.n; fail "$2: not more transfers in flight than $1 on every stage"; }
    echo "  in flight per stage, $1 -> $2: $(paste -d' ' base.n run.n | tr '\n' ',' | sed 's/,$//; s/ /->/g; s/,/, /g')"
}

# the warm-up and the flush too: against the steady phase's overlap alone (counts) and
# against no overlap (bits); PP 2 x VPP 2 with 8 micro-batches and with 2 (all warm-up)
# shellcheck disable=SC2086
run pp2_vpp2_wf 2 $SHORT $LAYOUT $ON $WF
same_bits pp2_vpp2 pp2_vpp2_wf 2
more pp2_vpp2_p2p pp2_vpp2_wf
# shellcheck disable=SC2086
run pp2_vpp2_wf_guard 2 --backend=guard $SHORT $LAYOUT $ON $WF
same_bits pp2_vpp2 pp2_vpp2_wf_guard 2
more pp2_vpp2_p2p_guard pp2_vpp2_wf_guard
M2="training%global_batch_size=2"
# shellcheck disable=SC2086
run pp2_m2 2 $SHORT $LAYOUT $M2
# shellcheck disable=SC2086
run pp2_m2_p2p 2 $SHORT $LAYOUT $M2 $ON
# shellcheck disable=SC2086
run pp2_m2_wf 2 $SHORT $LAYOUT $M2 $ON $WF
same_bits pp2_m2 pp2_m2_wf 2
more pp2_m2_p2p pp2_m2_wf
# PP 4 x VPP 2 (a stage between two others), 8 and 4 micro-batches
L8="model%num_layers=8 moe%layer_freq=1,0,1,1,0,1,0,1 parallel%pipeline_model_parallel_size=4
parallel%virtual_pipeline_model_parallel_size=2"
for m in 8 4; do
    # shellcheck disable=SC2086
    run pp4_m$m 4 $SHORT $L8 training%global_batch_size=$m
    # shellcheck disable=SC2086
    run pp4_m${m}_p2p 4 $SHORT $L8 training%global_batch_size=$m $ON
    # shellcheck disable=SC2086
    run pp4_m${m}_wf 4 $SHORT $L8 training%global_batch_size=$m $ON $WF
    same_bits pp4_m$m pp4_m${m}_wf 2
    more pp4_m${m}_p2p pp4_m${m}_wf
done

# refused without the interleaved schedule, naming the key and the fix
for l in "parallel%pipeline_model_parallel_size=2" ""; do
    # shellcheck disable=SC2086
    "$MOETRAIN" "$nml" --check --world-size 2 model%num_layers=4 moe%layer_freq=1,0,1,1 $l $ON > err.out 2>&1 &&
        fail "overlap_p2p_comm without VPP accepted ($l)"
    grep -qF "&parallel overlap_p2p_comm = .true. needs the interleaved pipeline schedule" err.out ||
        { cat err.out; fail "overlap_p2p_comm without VPP: not the expected message"; }
done
echo "overlap_p2p_comm refused without the interleaved schedule"
# shellcheck disable=SC2086
"$MOETRAIN" "$nml" --check --world-size 2 $LAYOUT $WF > err.out 2>&1 &&
    fail "overlap_p2p_comm_warmup_flush without overlap_p2p_comm accepted"
grep -qF "&parallel overlap_p2p_comm_warmup_flush = .true. needs overlap_p2p_comm = .true. (and with it the interleaved pipeline schedule): set overlap_p2p_comm = .true., or overlap_p2p_comm_warmup_flush = .false." err.out ||
    { cat err.out; fail "overlap_p2p_comm_warmup_flush without overlap_p2p_comm: not the expected message"; }
echo "overlap_p2p_comm_warmup_flush refused without overlap_p2p_comm"

# from-megatron: Megatron's p2p overlap is on by default with the interleaved schedule
# (--no-overlap-p2p-communication turns it off), off without it whatever the flags say
# (older versions' --overlap-p2p-communication); the warmup/flush variant is mapped with
# the interleaved schedule, dropped with a note without it (Megatron does not read it)
M="--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 8
--max-position-embeddings 8 --micro-batch-size 1 --global-batch-size 8 --train-iters 2 --lr 1e-3
--pipeline-model-parallel-size 2 --mock-data --vocab-size 257"
VPP="--num-layers-per-virtual-pipeline-stage 1"
# mapped NAME WANT ARGS...: from-megatron ARGS writes overlap_p2p_comm = WANT
mapped() {
    name=$1 want=$2
    shift 2
    # shellcheck disable=SC2086
    "$MOETRAIN" from-megatron -o "$name.nml" -- $M "$@" > "$name.out" 2> "$name.err" ||
        { cat "$name.err"; fail "from-megatron $name failed"; }
    grep -q "overlap_p2p_comm = $want" "$name.nml" ||
        { cat "$name.err"; fail "from-megatron $name: not overlap_p2p_comm = $want"; }
}
# shellcheck disable=SC2086
mapped vpp_default .true. $VPP
grep -qF -- "--no-overlap-p2p-communication (not given): default: Megatron's default with the interleaved schedule" vpp_default.err ||
    { cat vpp_default.err; fail "from-megatron: the default not noted"; }
"$MOETRAIN" vpp_default.nml --check --world-size 2 > vpp_default.check 2>&1 ||
    { cat vpp_default.check; fail "the mapped namelist does not pass --check"; }
# shellcheck disable=SC2086
mapped vpp_off .false. $VPP --no-overlap-p2p-communication
mapped novpp .false. --overlap-p2p-communication
grep -qF -- "--overlap-p2p-communication: not applicable: ignored, as Megatron turns p2p overlap off without the interleaved schedule" novpp.err ||
    { cat novpp.err; fail "from-megatron: --overlap-p2p-communication without VPP not noted"; }
# shellcheck disable=SC2086
mapped flush .true. $VPP --overlap-p2p-communication-warmup-flush
grep -q "overlap_p2p_comm_warmup_flush = .true." flush.nml ||
    { cat flush.nml; fail "from-megatron: --overlap-p2p-communication-warmup-flush not mapped"; }
"$MOETRAIN" flush.nml --check --world-size 2 > flush.check 2>&1 ||
    { cat flush.check; fail "the mapped namelist (warm-up/flush) does not pass --check"; }
grep -qF "(overlap_p2p_comm_warmup_flush)" flush.check || { cat flush.check; fail "flush.nml: the warm-up/flush overlap is not on"; }
mapped flush_novpp .false. --overlap-p2p-communication --overlap-p2p-communication-warmup-flush
grep -q "overlap_p2p_comm_warmup_flush = .true." flush_novpp.nml && { cat flush_novpp.nml; fail "from-megatron: the warm-up/flush overlap kept without VPP"; }
grep -qF -- "--overlap-p2p-communication-warmup-flush: not applicable: ignored, as Megatron's non-interleaved schedule does not read it" flush_novpp.err ||
    { cat flush_novpp.err; fail "from-megatron: --overlap-p2p-communication-warmup-flush without VPP not noted"; }
"$MOETRAIN" flush_novpp.nml --check --world-size 2 > flush_novpp.check 2>&1 ||
    { cat flush_novpp.check; fail "the mapped namelist (warm-up/flush without VPP) does not pass --check"; }
echo "from-megatron: p2p overlap on by default with VPP, off by flag and without VPP, the warmup/flush variant mapped with VPP and dropped without"

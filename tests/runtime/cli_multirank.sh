#!/bin/sh
# moetrain under mpirun: an error every process hits is printed once; an
# error only one process sees is printed by that process, naming it; every
# process exits non-zero; the startup line comes once, from rank 0.
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
need_mpirun
nml="$MT_TOP_SRCDIR/tests/fixtures/train/small.nml"
mt=$(own mt_cli "$MOETRAIN")
cd "$tmp"
MOETRAIN_DATADIR=${MOETRAIN_DATADIR:-$MT_TOP_BUILDDIR}; export MOETRAIN_DATADIR

# must_fail NAME MPIRUN-ARGS...: non-zero status, output in out/err
must_fail() {
    what=$1; shift
    timeout 120 "$MPIRUN" --oversubscribe "$@" > out 2> err && { cat out err; fail "$what: exit status 0"; }
    nothing_left mt_cli
}

must_fail "layout" -np 3 "$mt" "$nml" parallel%tensor_model_parallel_size=2
[ "$(count 'error: ' err)" -eq 1 ] || { cat err; fail "layout: expected one message"; }
grep -q '^moetrain: error: world size 3 is not divisible by tensor_model_parallel_size (2)' err ||
    { cat err; fail "layout: message"; }
[ "$(count 'moetrain: launcher' out)" -eq 0 ] || { cat out; fail "layout: started anyway"; }
echo "ok: a layout that does not divide the world, reported once"

must_fail "bad namelist" -np 2 "$mt" no_such.nml
[ "$(count 'error: ' err)" -eq 1 ] || { cat err; fail "bad namelist: expected one message"; }
grep -q 'no_such.nml' err || { cat err; fail "bad namelist: message"; }
echo "ok: a missing namelist, reported once"

# Rank 1 alone cannot read its file: it says so, naming itself.
must_fail "rank-local" -np 1 "$mt" "$nml" : -np 1 "$mt" only_rank1_misses_this.nml
[ "$(count 'error: ' err)" -eq 1 ] || { cat err; fail "rank-local: expected one message"; }
grep -q '^moetrain: error: rank 1 (.*): .*only_rank1_misses_this.nml' err ||
    { cat err; fail "rank-local: message must name rank 1"; }
# Two ranks, two different errors: both said.
must_fail "two errors" -np 1 "$mt" first_missing.nml : -np 1 "$mt" second_missing.nml
grep -q 'first_missing.nml' err && grep -q 'rank 1 (.*): .*second_missing.nml' err ||
    { cat err; fail "two errors: both messages expected"; }
echo "ok: rank-local errors reported by their rank"

must_fail "--world-size" -np 2 "$mt" --world-size 3 "$nml"
[ "$(count 'error: ' err)" -eq 1 ] && grep -q -- '--world-size 3' err || { cat err; fail "--world-size"; }

# A valid run: one startup line. (Whether training on 2 processes succeeds is
# the trainer's business; if it fails, it says so once.)
timeout 120 "$MPIRUN" --oversubscribe -np 2 "$mt" "$nml" training%train_iters=2 > out 2> err
rc=$?
[ "$(count 'moetrain: launcher pmix (mpirun), 2 processes on 1 node; layout TP 1 x CP 1 x PP 1 x DP 2' out)" -eq 1 ] ||
    { cat out err; fail "expected one startup line"; }
if [ $rc -eq 0 ]; then
    [ "$(count 'training done' out)" -eq 1 ] || { cat out; fail "the training log must come from rank 0 only"; }
else
    [ "$(count 'error: ' err)" -eq 1 ] || { cat err; fail "a failed run must say why once"; }
fi
nothing_left mt_cli
echo "ok: startup line once (training exit status $rc)"

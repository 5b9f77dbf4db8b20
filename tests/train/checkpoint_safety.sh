#!/bin/sh
# What a run keeps of its work (doc/what-happens.md): pruning never removes the
# checkpoint just written, whatever the iteration numbers already in the directory;
# one run at a time saves into a directory; a re-save of an iteration has no moment
# without it; a load that finds no checkpoint is an error unless load_optional; the
# save directory is checked before training; leftovers of crashed saves are cleaned
# up and counted; the metrics file survives resumes, records skipped steps and a
# failed write ends the run.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
cd "$tmp"
mt() { "$MOETRAIN" "$small" "$@" < /dev/null; }
expect_fail() { # expect_fail NEEDLE ARGS...: moetrain must fail with NEEDLE on stderr
    needle=$1; shift
    mt "$@" > out.log 2> err.log && { cat out.log err.log; fail "expected failure: $*"; }
    grep -q -- "$needle" err.log || { cat out.log err.log; fail "message lacks '$needle'"; }
}
latest() { cat "$1/latest_checkpointed_iteration.txt"; }

# --- keep_last after a rollback: the directory holds higher iterations ----------
mt "checkpoint%save='ckA'" checkpoint%save_interval=5 training%train_iters=20 > a.log 2>&1 ||
    { cat a.log; fail "ckA"; }
cp -a ckA ckR
mt "checkpoint%load='ckR/iter_0000010'" "checkpoint%save='ckR'" checkpoint%save_interval=3 \
    checkpoint%keep_last=2 training%train_iters=13 > r.log 2>&1 || { cat r.log; fail "rollback run"; }
[ "$(latest ckR)" = 13 ] || fail "latest after the rollback run is $(latest ckR)"
[ -f ckR/iter_0000013/index.json ] || { ls ckR; fail "the checkpoint just written was pruned"; }
[ -f ckR/iter_0000012/index.json ] || { ls ckR; fail "keep_last=2 did not keep the previous save"; }
[ "$(ls -d ckR/iter_* | wc -l)" -eq 2 ] || { ls ckR; fail "keep_last=2 left $(ls -d ckR/iter_* | wc -l)"; }
mt "checkpoint%load='ckR'" training%train_iters=14 > l.log 2>&1 || { cat l.log; fail "load after the rollback"; }
grep -q "loaded checkpoint ckR/iter_0000013" l.log || { cat l.log; fail "did not load iteration 13"; }
echo "keep_last after a rollback ok"

# --- two runs, one save directory -------------------------------------------
"$MOETRAIN" "$small" "checkpoint%save='ckB'" training%train_iters=100000 \
    optimizer%lr_decay_iters=100 < /dev/null > b1.log 2>&1 &
first=$!
n=0
until grep -q "iteration" b1.log 2>/dev/null; do
    n=$((n + 1)); [ $n -lt 600 ] || { kill -9 $first; fail "the first run did not start"; }
    sleep 0.1
done
expect_fail "is in use by another run (pid [0-9]* on host" "checkpoint%save='ckB'"
grep -q "iteration" out.log && fail "the refused run trained"
kill -TERM $first
wait $first
[ $? = 143 ] || fail "the first run did not stop with 143 on SIGTERM"
[ -f "ckB/iter_$(printf %07d "$(latest ckB)")/index.json" ] || fail "the first run's checkpoint"
echo "one run per save directory ok"

# --- a crash between the renames of a re-save: iter_N.old is found and put back
mt "checkpoint%save='ckC'" training%train_iters=4 > c.log 2>&1 || { cat c.log; fail "ckC"; }
cp -a ckC/iter_0000004 saved
mv ckC/iter_0000004 ckC/iter_0000004.old
mt "checkpoint%load='ckC'" training%train_iters=4 > c2.log 2>&1 || { cat c2.log; fail "load from .old"; }
grep -q "loaded checkpoint ckC/iter_0000004.old" c2.log || { cat c2.log; fail "did not load the .old"; }
# the restart puts it back, loads it and (train_iters reached) saves iteration 4 again
# over the existing one: a re-save, which leaves the same state and nothing else
mt "checkpoint%load='ckC'" "checkpoint%save='ckC'" training%train_iters=4 > c3.log 2>&1 ||
    { cat c3.log; fail "restart after the crash"; }
grep -q "put back 1 checkpoint" c3.log || { cat c3.log; fail "the .old was not put back"; }
grep -q "saved checkpoint at iteration 4" c3.log || { cat c3.log; fail "no re-save"; }
ls -d ckC/*.old ckC/*.tmp 2>/dev/null && fail "the re-save left a temporary directory"
same_ckpt saved ckC/iter_0000004 || fail "the re-saved state differs"
echo "re-save ok"

# --- loads that find no checkpoint ---------------------------------------
expect_fail "does not exist" "checkpoint%load='no_such_dir'"
expect_fail "load_optional" "checkpoint%load='no_such_dir'"
mkdir empty
expect_fail "holds no checkpoint" "checkpoint%load='empty'"
cp -a ckA ckN && rm ckN/latest_checkpointed_iteration.txt
expect_fail "iter_0000020" "checkpoint%load='ckN'"
grep -q "has no latest_checkpointed_iteration.txt" err.log || { cat err.log; fail "no-latest message"; }
echo previous > keep.jsonl
expect_fail "holds no checkpoint" "checkpoint%load='empty'" "logging%metrics_file='keep.jsonl'"
[ "$(cat keep.jsonl)" = previous ] || fail "a refused load truncated the metrics file"
mt "checkpoint%load='fresh'" "checkpoint%save='fresh'" checkpoint%load_optional=T training%train_iters=2 \
    > f.log 2>&1 || { cat f.log; fail "load_optional"; }
grep -q "no checkpoint in 'fresh' yet" f.log || { cat f.log; fail "load_optional message"; }
echo "missing checkpoints ok"

# --- the save path is checked before training, not at the first save ----------
echo x > plainfile
expect_fail "checkpoint%save" "checkpoint%save='plainfile/ck'" training%train_iters=50
grep -q "iteration" out.log && { cat out.log; fail "trained before checking the save path"; }
echo "save path checked at start ok"

# --- leftovers of crashed saves are removed at the next start and counted ---------
mkdir -p ckA/iter_0000025.tmp && echo partial > ckA/iter_0000025.tmp/rank_00000.safetensors
echo 7 > ckA/latest_checkpointed_iteration.txt.tmp
# a prune cut short after it removed the index (the marker goes last)
mkdir -p ckA/iter_0000030 && echo partial > ckA/iter_0000030/rank_00000.safetensors
mt "checkpoint%load='ckA'" "checkpoint%save='ckA'" training%train_iters=20 > t.log 2>&1 ||
    { cat t.log; fail "start beside leftovers"; }
grep -q "removed 3 leftovers of interrupted saves" t.log || { cat t.log; fail "leftovers not counted"; }
ls -d ckA/*.tmp ckA/iter_0000030 2>/dev/null && fail "leftovers not removed"
echo "leftovers ok"

# --- metrics: a resume appends no iteration twice; skipped steps are recorded -----
mt "checkpoint%save='ckM'" "logging%metrics_file='m.jsonl'" logging%log_interval=1 \
    checkpoint%save_interval=4 training%train_iters=6 > m1.log 2>&1 || { cat m1.log; fail "metrics run"; }
# resume from iteration 4: lines of 5 and 6 are replaced, not repeated
mt "checkpoint%load='ckM/iter_0000004'" "logging%metrics_file='m.jsonl'" logging%log_interval=1 \
    training%train_iters=8 > m2.log 2>&1 || { cat m2.log; fail "metrics resume"; }
its=$(sed -n 's/^{"iteration": \([0-9]*\), "consumed_samples".*/\1/p' m.jsonl | tr '\n' ' ')
[ "$its" = "1 2 3 4 5 6 7 8 " ] || { cat m.jsonl; fail "iterations in the metrics after resume: $its"; }
mt "logging%metrics_file='nan.jsonl'" optimizer%lr=1e30 optimizer%min_lr=1e29 optimizer%clip_grad=0 \
    training%train_iters=6 > n.log 2>&1 || true
grep -q '"step_skipped": true' nan.jsonl || { cat nan.jsonl; fail "skipped steps are not in the metrics"; }
python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' nan.jsonl ||
    fail "the metrics file is not JSON lines"
if [ -w /dev/full ]; then
    expect_fail "metrics_file '/dev/full': writing failed" "logging%metrics_file='/dev/full'" training%train_iters=4
fi
echo "metrics ok"

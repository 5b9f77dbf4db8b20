#!/bin/sh
# kill -9 at arbitrary moments of a run that saves every iteration (and prunes to 2),
# synchronously and with checkpoint%async_save in turn: after each kill the directory's latest names a whole checkpoint that loads, and the
# next run resumes from it, cleaning up what the killed save left.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
cd "$tmp"
long="training%train_iters=100000 optimizer%lr_decay_iters=200 checkpoint%save_interval=1
checkpoint%keep_last=2 checkpoint%load_optional=T training%eval_interval=1000"
prev=0
async=F
# shellcheck disable=SC2086 # a list of overrides
for delay in 0.3 0.7 0.45 1.1 0.55 0.9; do
    if [ $async = F ]; then async=T; else async=F; fi
    "$MOETRAIN" "$small" $long checkpoint%async_save=$async "checkpoint%save='ck'" "checkpoint%load='ck'" < /dev/null > run.log 2>&1 &
    pid=$!
    n=0 # wait for one more save than the last run reached, then a little longer
    until [ "$(cat ck/latest_checkpointed_iteration.txt 2>/dev/null || echo 0)" -gt "$prev" ]; do
        n=$((n + 1)); [ $n -lt 1200 ] || { kill -9 $pid; cat run.log; fail "no save"; }
        sleep 0.05
    done
    sleep "$delay"
    kill -9 $pid
    wait $pid 2>/dev/null
    k=$(cat ck/latest_checkpointed_iteration.txt)
    [ "$k" -gt "$prev" ] || fail "latest went from $prev to $k"
    # the named checkpoint is whole: it loads (train_iters reached: nothing to train)
    "$MOETRAIN" "$small" "checkpoint%load='ck'" training%train_iters="$k" optimizer%lr_decay_iters=200 training%eval_iters=0 \
        < /dev/null > load.log 2>&1 || { cat load.log; fail "after kill -9 (latest $k) the checkpoint does not load"; }
    grep -q "loaded checkpoint ck/iter_$(printf %07d "$k")" load.log || { cat load.log; fail "loaded another"; }
    echo "killed after ${delay}s (async_save $async): latest $k loads; directory: $(ls ck | tr '\n' ' ')"
    prev=$k
done
# a last run resumes, removes any leftover and keeps 2
"$MOETRAIN" "$small" $long training%exit_interval=$((prev + 2)) "checkpoint%save='ck'" "checkpoint%load='ck'" \
    < /dev/null > last.log 2>&1 || { cat last.log; fail "resume after the kills"; }
grep -q "loaded checkpoint ck/iter_$(printf %07d "$prev")" last.log || { cat last.log; fail "did not resume"; }
ls -d ck/*.tmp ck/*.old 2>/dev/null && fail "leftovers after a clean run"
[ "$(ls -d ck/iter_* | wc -l)" = 2 ] || { ls ck; fail "keep_last=2"; }
echo "kill -9 never left a checkpoint that does not load"

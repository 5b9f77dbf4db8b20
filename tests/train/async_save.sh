#!/bin/sh
# checkpoint%async_save: the checkpoints are the synchronous saves' byte for byte; the
# log reports the time training was blocked per save; a write that fails in the
# background (a full disk: a small tmpfs in a private mount namespace) ends the run
# with an error and the previous checkpoint still published; a signal stop waits for
# the pending save, which resumes bit-exactly.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
cd "$tmp"
"$MOETRAIN" "$small" checkpoint%save_interval=3 "checkpoint%save='sync'" > s.log 2>&1 || { cat s.log; fail "synchronous run"; }
"$MOETRAIN" "$small" checkpoint%save_interval=3 checkpoint%async_save=T "checkpoint%save='async'" > a.log 2>&1 || { cat a.log; fail "async run"; }
for it in 0000003 0000006 0000009 0000012; do
    same_ckpt "sync/iter_$it" "async/iter_$it" || fail "async and synchronous saves of iteration $it differ"
done
[ "$(grep -c '^checkpoint save blocked training for [0-9.]* s (async: snapshot [0-9.]* s, waiting for the writer [0-9.]* s, publishing [0-9.]* s; written in the background in [0-9.]* s)$' a.log)" = 4 ] ||
    { cat a.log; fail "the log does not report the blocked time of each async save"; }
grep -q '^checkpoint save blocked training for [0-9.]* s (synchronous)$' s.log || { cat s.log; fail "no blocked time of a synchronous save"; }
echo "async saves are the synchronous ones byte for byte"

# a full disk: the checkpoint of iteration 3 (about 0.5 MB) fits in 800 kB, that of 6 does not
if unshare -rm true 2> /dev/null; then
    mkdir full kept
    unshare -rm sh -c '
        mount -t tmpfs -o size=800k tmpfs full || exit 99
        "$MOETRAIN" "$1" checkpoint%save_interval=3 checkpoint%async_save=T "checkpoint%save='"'full'"'" > f.log 2> f.err
        echo $? > f.rc
        cp -R full/. kept/' sh "$small"
    [ "$(cat f.rc)" = 1 ] || { cat f.log f.err; fail "a run whose background save failed ended with status $(cat f.rc)"; }
    grep -q "error: the checkpoint of iteration 6 was not saved and the run stops (the last published one in 'full' is whole: fix the cause and resume from it with checkpoint%load): checkpoint: writing 'full/iter_0000006.tmp/rank_00000.safetensors' failed: No space left on device" f.err ||
        { cat f.err; fail "the failed background write is not reported"; }
    [ "$(grep -c 'error: ' f.err)" = 1 ] || { cat f.err; fail "expected one error message"; }
    grep -q "training done" f.log && { cat f.log; fail "training went on to the end after the failure"; }
    [ "$(cat kept/latest_checkpointed_iteration.txt)" = 3 ] || fail "latest does not name the previous checkpoint"
    same_ckpt sync/iter_0000003 kept/iter_0000003 || fail "the previous checkpoint is damaged"
    [ "$(cd kept && ls -d iter_* | tr '\n' ' ')" = "iter_0000003 " ] || { ls -a kept; fail "the failed save left files"; }
    echo "a background write on a full disk ends the run; the previous checkpoint stays published"
else
    echo "SKIP (full disk): unshare -rm is not permitted here"
fi

# a signal stop with a save pending (one starts at every iteration, so the one begun at
# the stop's iteration is not yet published when the stop is seen)
long="training%train_iters=100000 optimizer%lr_decay_iters=200 logging%log_interval=1
training%eval_interval=1000"
# shellcheck disable=SC2086 # $long is a list of overrides
{
    "$MOETRAIN" "$small" $long checkpoint%async_save=T checkpoint%save_interval=1 \
        "checkpoint%save='sig'" "logging%metrics_file='sig.jsonl'" < /dev/null > sig.log 2>&1 &
    pid=$!
    n=0
    until [ "$(cat sig.jsonl 2>/dev/null | grep -c '"consumed_samples"')" -ge 3 ]; do
        n=$((n + 1)); [ $n -lt 1200 ] || fail "the run did not start training"
        sleep 0.1
    done
    kill -TERM $pid
    wait $pid
    rc=$?
    [ $rc = 143 ] || { cat sig.log; fail "exit status $rc, expected 143"; }
    k=$(cat sig/latest_checkpointed_iteration.txt)
    grep -q "^stopping: waiting for the background save of iteration $k$" sig.log || { tail sig.log; fail "no save pending at the stop"; }
    grep -q "saved checkpoint at iteration $k " sig.log || { tail sig.log; fail "the pending save was not published"; }
    ls -d sig/*.tmp > /dev/null 2>&1 && fail "leftovers after the stop"
    end=$((k + 3))
    "$MOETRAIN" "$small" $long training%exit_interval=$end "checkpoint%load='sig'" \
        "checkpoint%save='sig'" < /dev/null > r.log 2>&1 || { cat r.log; fail "resume"; }
    "$MOETRAIN" "$small" $long training%exit_interval=$end "checkpoint%save='straight'" \
        < /dev/null > st.log 2>&1 || { cat st.log; fail "straight run"; }
    it=$(printf %07d $end)
    same_ckpt "sig/iter_$it" "straight/iter_$it" || fail "stopped at $k with an async save pending and resumed: differs from the straight run"
}
echo "a signal stop publishes the pending save (iteration $k); resuming from it is bit-exact"

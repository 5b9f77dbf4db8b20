#!/bin/sh
# A run told to stop (SIGTERM, as Slurm sends at a time limit; SIGINT, SIGUSR1,
# SIGHUP) saves a checkpoint at the iteration it reached, flushes its metrics and
# exits with 128 + the signal; resuming from that checkpoint continues bit-exactly,
# as if the run had not stopped. A second signal ends the process at once.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
cd "$tmp"
# train_iters sizes the sample index, so every run of a comparison has the same one;
# exit_interval ends the runs compared at one iteration
long="training%train_iters=100000 optimizer%lr_decay_iters=200 logging%log_interval=1
training%eval_interval=1000"
latest() { cat "$1/latest_checkpointed_iteration.txt"; }
# started NAME: waits until run NAME has logged three iterations
started() {
    n=0
    until [ "$(cat "$1.jsonl" 2>/dev/null | grep -c '"consumed_samples"')" -ge 3 ]; do
        n=$((n + 1)); [ $n -lt 1200 ] || fail "$1 did not start training"
        sleep 0.1
    done
}
# shellcheck disable=SC2086 # $long is a list of overrides
{
    for sig in TERM USR1; do
        "$MOETRAIN" "$small" $long "checkpoint%save='s$sig'" "logging%metrics_file='s$sig.jsonl'" \
            < /dev/null > "s$sig.log" 2>&1 &
        pid=$!
        started "s$sig"
        kill -"$sig" $pid
        wait $pid
        rc=$?
        want=$((128 + $(kill -l "$sig")))
        [ $rc = $want ] || { cat "s$sig.log"; fail "SIG$sig: exit status $rc, expected $want"; }
        k=$(latest "s$sig")
        grep -q "saved checkpoint at iteration $k" "s$sig.log" || { cat "s$sig.log"; fail "SIG$sig: no save"; }
        grep -q "stopping at iteration $k on signal" "s$sig.log" || { cat "s$sig.log"; fail "SIG$sig: stop message"; }
        [ "$(tail -n 1 "s$sig.jsonl" | sed 's/^{"iteration": \([0-9]*\),.*/\1/')" = "$k" ] ||
            fail "SIG$sig: the metrics file does not end at iteration $k"
        echo "SIG$sig: stopped at iteration $k with exit status $rc"
    done

    # resume the SIGTERM run 3 iterations past the stop; a straight run to the same
    # iteration gives the same checkpoint, byte for byte, and the same losses
    k=$(latest sTERM)
    end=$((k + 3))
    "$MOETRAIN" "$small" $long training%exit_interval=$end "checkpoint%load='sTERM'" \
        "checkpoint%save='sTERM'" "logging%metrics_file='sTERM.jsonl'" < /dev/null > r.log 2>&1 ||
        { cat r.log; fail "resume"; }
    "$MOETRAIN" "$small" $long training%exit_interval=$end "checkpoint%save='straight'" \
        "logging%metrics_file='straight.jsonl'" < /dev/null > st.log 2>&1 || { cat st.log; fail "straight run"; }
    it=$(printf %07d $end)
    same_ckpt "sTERM/iter_$it" "straight/iter_$it" ||
        fail "the run stopped at $k and resumed differs from the straight run at $end"
    json_field sTERM.jsonl loss > a.col
    json_field straight.jsonl loss > b.col
    [ "$(wc -l < a.col)" = $end ] || { cat sTERM.jsonl; fail "the resumed metrics hold $(wc -l < a.col) iterations, not $end"; }
    cmp a.col b.col || fail "the losses of the stopped and resumed run differ from the straight run's"
    echo "resume after SIGTERM is bit-exact ($k + 3 iterations)"

    # a second signal ends the process at once, by the signal's default action: of
    # SIGINT and SIGTERM sent together, the one handled first asks for the stop and the
    # other kills the process (130 or 143) before it saves or says it is stopping
    "$MOETRAIN" "$small" $long "checkpoint%save='twice'" "logging%metrics_file='twice.jsonl'" \
        < /dev/null > twice.log 2>&1 &
    pid=$!
    started twice
    kill -INT $pid
    kill -TERM $pid
    wait $pid
    rc=$?
    [ $rc = 130 ] || [ $rc = 143 ] || { cat twice.log; fail "after a second signal: exit status $rc"; }
    grep -q "stopping at iteration\|saved checkpoint" twice.log &&
        { cat twice.log; fail "the second signal did not end the process at once"; }
    echo "a second signal ends the process at once"
}

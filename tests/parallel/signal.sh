#!/bin/sh
# A signal to ONE rank of a job stops every rank at the same iteration boundary (the
# ranks agree on it collectively): the job saves its checkpoint, every rank exits with
# 128 + the signal, and resuming in the same layout is bit-exact against a run that
# was not stopped. Ranks started with different configurations (an MPMD launch) are
# refused before anything is allocated, each naming what differs.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
# train_iters sizes the sample index: every run compared has the same one
long="training%train_iters=100000 optimizer%lr_decay_iters=200 logging%log_interval=1
training%eval_interval=1000 parallel%distributed_timeout_minutes=1"
latest() { cat "$1/latest_checkpointed_iteration.txt"; }
# shellcheck disable=SC2086 # lists of overrides
{
    mpirun_np 4 "$MOETRAIN" "$nml" $long $EP2 $ZERO "checkpoint%save='sig'" \
        "logging%metrics_file='sig.jsonl'" < /dev/null > sig.log 2>&1 &
    job=$!
    n=0
    until [ "$(cat sig.jsonl 2>/dev/null | grep -c consumed_samples)" -ge 2 ]; do
        n=$((n + 1)); [ $n -lt 1200 ] || { kill $job; cat sig.log; fail "the job did not start"; }
        sleep 0.1
    done
    # the job's ranks: moetrain processes whose command line names this save directory
    ranks=$(for p in $(pgrep -f "checkpoint%save='sig'"); do
                [ "$(cat /proc/$p/comm 2>/dev/null)" = moetrain ] && echo $p; done)
    [ "$(echo $ranks | wc -w)" = 4 ] || { kill $job; fail "found ranks '$ranks'"; }
    victim=$(echo $ranks | tr ' ' '\n' | tail -n 1)
    kill -TERM "$victim"
    wait $job
    rc=$?
    [ $rc != 0 ] || fail "the job exited 0 after SIGTERM"
    k=$(latest sig)
    grep -q "stopping at iteration $k on signal 15" sig.log || { cat sig.log; fail "no stop message"; }
    grep -q "saved checkpoint at iteration $k" sig.log || { cat sig.log; fail "no save at $k"; }
    # one rank was signalled before the job stopped (mpirun may signal the others as
    # they leave, after the save: a rank that exits first with 143 ends the job)
    before=$(awk '/stopping at iteration/ { exit } /signal received/ { n++ } END { print n + 0 }' sig.log)
    [ "$before" = 1 ] || { cat sig.log; fail "$before ranks received a signal before the stop, not 1"; }
    echo "SIGTERM to one of 4 ranks: the job stopped at iteration $k and saved (mpirun exit $rc)"

    end=$((k + 2))
    mpirun_np 4 "$MOETRAIN" "$nml" $long $EP2 $ZERO training%exit_interval=$end \
        "checkpoint%load='sig'" "checkpoint%save='sig'" < /dev/null > res.log 2>&1 ||
        { cat res.log; fail "resume"; }
    mpirun_np 4 "$MOETRAIN" "$nml" $long $EP2 $ZERO training%exit_interval=$end \
        "checkpoint%save='straight'" < /dev/null > straight.log 2>&1 || { cat straight.log; fail "straight"; }
    it=$(printf %07d $end)
    same_ckpt "sig/iter_$it" "straight/iter_$it" ||
        fail "stopped at $k and resumed, the job differs from one that ran straight to $end"
    echo "resume after the stop is bit-exact ($k + 2 iterations)"

    # MPMD: two ranks with another learning rate
    timeout 120 "$MPIRUN" --oversubscribe -np 2 "$MOETRAIN" "$nml" $EP2 : \
        -np 2 "$MOETRAIN" "$nml" $EP2 optimizer%lr=1e-3 < /dev/null > mpmd.log 2>&1 &&
        { cat mpmd.log; fail "ranks with different configurations trained"; }
    grep -q "ranks 2, 3 of 4 were started with another configuration than rank 0" mpmd.log ||
        { cat mpmd.log; fail "rank 0 does not name the ranks that differ"; }
    [ "$(grep -c "rank [23] .*this rank was started with another configuration than rank 0: &optimizer lr = 0.001 (rank 0: lr = 0.003)" mpmd.log)" = 2 ] ||
        { cat mpmd.log; fail "the differing ranks do not name the key and both values"; }
    grep -q "iteration" mpmd.log && fail "the MPMD job trained"
    # another build (here: the same one with a byte appended) on two ranks
    cp "$MOETRAIN" ./moetrain-other && echo >> ./moetrain-other
    timeout 120 "$MPIRUN" --oversubscribe -np 2 "$MOETRAIN" "$nml" $EP2 : \
        -np 2 ./moetrain-other "$nml" $EP2 < /dev/null > exe.log 2>&1 &&
        { cat exe.log; fail "ranks running different executables trained"; }
    grep -q "ranks 2, 3 of 4 run another moetrain executable than rank 0" exe.log ||
        { cat exe.log; fail "different executables are not named"; }
    echo "ranks with different configurations or executables are refused"
}

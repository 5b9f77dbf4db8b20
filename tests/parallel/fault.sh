#!/bin/sh
# A training rank that hangs (SIGSTOP) or dies (SIGKILL) in the middle of a
# run: the job ends with a non-zero status within the timeout, nothing is left
# running, and for the hang the survivor's message names the collective and the
# group it waited in.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
mt=$(own mt_fault "$MOETRAIN")

# rank_pid RANK: pid of the training process with that MPI rank
rank_pid() {
    for p in $(alive mt_fault); do
        tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
    done
}

for sig in STOP KILL; do
    rm -f f.jsonl
    # 3 s bound on every collective; a run far longer than the test
    mpirun_np 2 "$mt" "$nml" training%train_iters=100000 training%eval_interval=100000 \
        parallel%distributed_timeout_minutes=0.05 logging%log_interval=1 \
        "logging%metrics_file='f.jsonl'" > out 2> err < /dev/null &
    job=$!
    i=0
    lines() { if [ -f f.jsonl ]; then wc -l < f.jsonl; else echo 0; fi; }
    while [ "$(lines)" -lt 3 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    [ -s f.jsonl ] || { kill $job; cat out err; fail "$sig: training did not start"; }
    victim=$(rank_pid 1)
    [ -n "$victim" ] || { kill $job; fail "$sig: no rank 1 process"; }
    start=$(date +%s)
    kill -"$sig" "$victim"
    wait $job && { cat out err; fail "$sig: the job exited with status 0"; }
    took=$(($(date +%s) - start))
    # the survivor waits at most 3 s per collective; allow for startup of the abort
    [ "$took" -le 30 ] || { cat err; fail "$sig: the job took $took s to end"; }
    if [ "$sig" = STOP ]; then
        grep -Eq "error: [a-z_]+ on [a-z-]+(\[[0-9a-z]+\])? timed out: rank 0 .* waited [0-9.]+ s" err ||
            { cat err; fail "STOP: no message naming the collective and group"; }
        kill -9 "$victim" 2> /dev/null
    fi
    nothing_left mt_fault
    echo "ok: SIG$sig of rank 1 ended the job in $took s"
done

#!/bin/sh
# A layout the job cannot run fails on every process before anything is allocated,
# with one message (printed once, by rank 0) that names the keys and numbers.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
# expect NEEDLE NP ARGS...: the job fails, with exactly one error line that has NEEDLE
expect() {
    needle=$1
    np=$2
    shift 2
    mpirun_np "$np" "$MOETRAIN" "$nml" "$@" > out.log 2>&1 && { cat out.log; fail "expected failure: $*"; }
    grep -q -- "$needle" out.log || { cat out.log; fail "no '$needle' in the message"; }
    [ "$(grep -c 'error: ' out.log)" = 1 ] || { cat out.log; fail "expected exactly one error message"; }
    grep -q "parameters in" out.log && fail "the model was built before the error"
    echo "ok: $(grep 'error: ' out.log)"
}
expect "not divisible by tensor_model_parallel_size (3)" 4 parallel%tensor_model_parallel_size=3 parallel%sequence_parallel=T
expect "expert_model_parallel_size (8)" 4 parallel%expert_model_parallel_size=8
expect "sequence_parallel" 2 parallel%tensor_model_parallel_size=2
expect "pipeline" 3 parallel%pipeline_model_parallel_size=3
echo "bad layouts rejected"

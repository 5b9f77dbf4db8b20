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
expect "num_layers = 3 is not divisible by pipeline_model_parallel_size (2)" 2 parallel%pipeline_model_parallel_size=2
expect "to be a multiple of pipeline_model_parallel_size = 2" 2 parallel%pipeline_model_parallel_size=2 \
    parallel%virtual_pipeline_model_parallel_size=2 model%num_layers=4 moe%layer_freq=1,0,1,1 \
    training%global_batch_size=6
expect "leave 0 of num_layers = 3 for the 2 other pipeline stage(s)" 4 parallel%pipeline_model_parallel_size=4 \
    parallel%decoder_first_pipeline_num_layers=2 parallel%decoder_last_pipeline_num_layers=1
echo "bad layouts rejected"

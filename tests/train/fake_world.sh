#!/bin/sh
# moetrain --fake-world N --fake-rank R: ranks of the 256-GPU job (slurm/qwen3_256gpu.sh's
# layout) built in one process. At reduced width on the CPU backend, for real (shards,
# stage buffers, the interleaved or 1F1B schedule's slots, the optimizer, parameters
# initialised): every allocation counted, equal to the plan category by category and
# to --check's line for the stage. At full width on the plan backend (reserved, never
# backed, never touched pages): equal to --check and to moetrain plan's figure.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
cd "$tmp"
nml="$MT_TOP_SRCDIR/namelists/qwen3_30b_a3b.nml"
layout="parallel%tensor_model_parallel_size=2 parallel%sequence_parallel=.true.
 parallel%pipeline_model_parallel_size=4 parallel%expert_model_parallel_size=8
 parallel%expert_tensor_parallel_size=1 parallel%use_distributed_optimizer=.true.
 training%global_batch_size=1024"
narrow="model%hidden_size=64 model%kv_channels=4 model%ffn_hidden_size=128 model%vocab_size=1000
 moe%moe_ffn_hidden_size=16 training%seq_length=64"
# line_of LOG STAGE: --check's (or a fake rank's) memory line of a stage, from "stage"
line_of() { sed -n "s/^.*\(stage $2, rank [0-9]*: parameters.*\)$/\1/p" "$1" | head -1; }

# shellcheck disable=SC2086
"$MOETRAIN" --check --world-size 256 "$nml" $layout $narrow > check.log 2>&1 ||
    { cat check.log; fail "--check of the narrow 256-GPU layout"; }
for rank in 1 37 255; do
    # shellcheck disable=SC2086
    "$MOETRAIN" --fake-world 256 --fake-rank $rank "$nml" $layout $narrow > fake.log 2>&1 ||
        { cat fake.log; fail "fake rank $rank"; }
    grep -q "rank $rank of 256 allocates what its plan says" fake.log || { cat fake.log; fail "rank $rank"; }
    grep -q "built in this process on backend cpu.*parameters initialised" fake.log ||
        { cat fake.log; fail "rank $rank was not built on the CPU backend"; }
done
# the most loaded rank of each stage, as --check names it, built for real
for stage in 0 1 2 3; do
    want=$(line_of check.log $stage)
    rank=$(echo "$want" | sed 's/stage [0-9]*, rank \([0-9]*\):.*/\1/')
    # shellcheck disable=SC2086
    "$MOETRAIN" --fake-world 256 --fake-rank "$rank" "$nml" $layout $narrow > fake.log 2>&1 ||
        { cat fake.log; fail "fake rank $rank"; }
    got=$(line_of fake.log "$stage")
    [ -n "$want" ] && [ "$got" = "$want" ] || { echo "$want"; echo "$got"; fail "stage $stage"; }
done
# the guard backend: its allocations are emulated device memory host code cannot touch
# shellcheck disable=SC2086
"$MOETRAIN" --fake-world 256 --fake-rank 200 --backend guard "$nml" $layout $narrow > guard.log 2>&1 ||
    { cat guard.log; fail "fake rank on the guard backend"; }
grep -q "rank 200 of 256 allocates what its plan says" guard.log || { cat guard.log; fail "guard"; }
# interleaved: PP 4 x VPP 2, its schedule's messages planned by a dry run
# shellcheck disable=SC2086
"$MOETRAIN" --fake-world 256 --fake-rank 64 "$nml" $layout $narrow \
    parallel%virtual_pipeline_model_parallel_size=2 > vpp.log 2>&1 || { cat vpp.log; fail "VPP 2"; }

# full width, nothing touched: the 65 GiB of stage 0 and the last stage
# shellcheck disable=SC2086
"$MOETRAIN" --check --world-size 256 "$nml" $layout > full.log 2>&1 || { cat full.log; fail "--check full"; }
for stage in 0 3; do
    want=$(line_of full.log $stage)
    rank=$(echo "$want" | sed 's/stage [0-9]*, rank \([0-9]*\):.*/\1/')
    # shellcheck disable=SC2086
    "$MOETRAIN" --fake-world 256 --fake-rank "$rank" --backend plan "$nml" $layout > fake.log 2>&1 ||
        { cat fake.log; fail "full-width fake rank $rank"; }
    grep -q "never backed or touched" fake.log || { cat fake.log; fail "not the plan backend"; }
    [ "$(line_of fake.log $stage)" = "$want" ] || { cat fake.log; echo "$want"; fail "full stage $stage"; }
done
# and moetrain plan, the layout and the precision fixed (BF16, as the job's namelist: the
# plan would try FP8 blockwise on H100 too), reports the same bytes for its most loaded rank
# shellcheck disable=SC2086
"$MOETRAIN" plan --gpus 256 --gpu h100 --global-batch 1024 --top 1 "$nml" "precision%fp8_format=''" \
    parallel%tensor_model_parallel_size=2 parallel%pipeline_model_parallel_size=4 \
    parallel%expert_model_parallel_size=8 parallel%expert_tensor_parallel_size=1 \
    parallel%virtual_pipeline_model_parallel_size=1 parallel%decoder_first_pipeline_num_layers=0 \
    parallel%decoder_last_pipeline_num_layers=0 training%micro_batch_size=1 > plan.log 2>&1 ||
    { cat plan.log; fail "plan of the 256-GPU layout"; }
planned=$(sed -n 's/.*total [0-9.]* (\([0-9]*\) bytes).*/\1/p' plan.log)
stage0=$(line_of full.log 0 | sed 's/.*| total \([0-9]*\) (.*/\1/')
[ "$planned" = "$stage0" ] || { cat plan.log; fail "plan says $planned bytes, --check $stage0"; }

# errors
expect() { # expect NEEDLE ARGS...
    needle=$1; shift
    "$MOETRAIN" "$@" > out.log 2> err.log && { cat out.log; fail "expected failure: $*"; }
    grep -q -- "$needle" err.log || { cat err.log; fail "message lacks '$needle'"; }
}
# shellcheck disable=SC2086
expect "--fake-rank 256 is not a rank of the world of 256" --fake-world 256 --fake-rank 256 "$nml" $layout $narrow
expect "go together" --fake-world 256 "$nml"
expect "--backend plan (address ranges reserved" --backend plan --check "$nml"
expect "does not go with" --fake-world 8 --fake-rank 0 --check "$nml"
echo "PASS"

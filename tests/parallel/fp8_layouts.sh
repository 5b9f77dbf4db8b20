#!/bin/sh
# FP8/FP4 in the parallel layouts (doc/fp8.md, "Parallel layouts"): each recipe family
# trained in 2 pipeline stages matches one process (delayed scaling in PP 2 is
# equivalence.sh's FP8 leg). Every stage quantises its layers' operands as one process
# does; the block recipes run at widths whose halves are whole blocks (128, 32, 16), the
# widths tensor parallelism needs of them (config.c refuses others at --check).
#
# Bounds: equivalence.sh's FP8 leg's (loss, norms and routing as without FP8;
# parameters and moments within 5e-3: an operand element at a tie between two codes
# goes either way by the layouts' rounding, and the gradient element it feeds moves by
# a step of the format); measured: every value equal.
#
# Not here yet: the TP 2 (sequence parallel) x EP 2 layout with ZeRO-1. Its first two
# steps match one process (loss 5e-9, gradient norm 4e-8, parameters 1.4e-5 with the
# amaxes of the shards reduced over TP; without the reduction the gradient norm of
# step 1 differs by 4.7e-4 and the parameters by 8.6e-2), but from step 3 on the runs
# part (gradient norm 1e-3) for delayed and tensorwise alike, a fault not found yet
# (doc/fp8.md).
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
SHORT="training%micro_batch_size=1 training%global_batch_size=8 training%seq_length=16
training%train_iters=4 training%eval_interval=4"
PP2="parallel%pipeline_model_parallel_size=2 parallel%decoder_last_pipeline_num_layers=1"
TOL_PARAMS=5e-3
# widths whose halves are whole blocks of each recipe (128, 32, 16 elements)
W128="model%kv_channels=32 model%num_query_groups=8 model%ffn_hidden_size=256 moe%shared_expert_intermediate_size=256"
W32="model%num_query_groups=8 moe%shared_expert_intermediate_size=64"
# recipe overrides (run() sets name)
while read -r leg recipe; do
    [ -n "$leg" ] || continue
    # shellcheck disable=SC2086 # lists of overrides
    {
        reference "one_$leg" $SHORT $recipe
        run "pp2_$leg" 2 $SHORT "$seed" $recipe $PP2
        same_as "one_$leg" "pp2_$leg"
    }
done <<RECIPES
tensorwise precision%fp8_format='hybrid' precision%fp8_recipe='tensorwise'
blockwise precision%fp8_format='e4m3' precision%fp8_recipe='blockwise' $W128
mxfp8 precision%fp8_format='e4m3' precision%fp8_recipe='mxfp8' $W32
nvfp4 precision%fp4_format='e2m1'
RECIPES
echo "every recipe's layouts match one process"

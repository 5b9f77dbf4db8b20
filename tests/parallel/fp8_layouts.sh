#!/bin/sh
# FP8/FP4 in the parallel layouts (doc/fp8.md, "Parallel layouts"): each recipe family
# in TP 2 (sequence parallel) x EP 2 with ZeRO-1 over 2 data-parallel replicas, and in
# 2 pipeline stages, matches one process.
#
# TP x EP: the per-tensor scales of current scaling (tensorwise, NVFP4's fp32 scale,
# delayed scaling's first step) come from the amax of the whole tensor, reduced over
# the TP group for the shards of the column- and row-parallel linears; the block
# recipes run at widths whose halves are whole blocks (128, 32, 16 elements; config.c
# refuses others); NVFP4 quantises a shard in its place in the whole tensor (its
# stochastic rounding draws each element's index there) and a data-parallel rank draws
# the random bits of the step's micro-batch it runs; the experts' slots are numbered
# by global expert. One step, and the validation after it (delayed scaling's history
# scales): TP sums in another order, so an operand element within an fp32 rounding of
# a midpoint between two FP8 codes is quantised the other way, and from the second
# step the runs part by what that does through Adam (gradient norm 8e-6 to 1.3e-4 at
# step 2, 1e-3 at step 4); one process under two OpenBLAS kernels parts alike (1e-3 at
# step 4, 3e-8 without FP8). Measured at step 1: loss within 1.1e-8, gradient norm
# 1.2e-6 (NVFP4; the others 2.5e-8 or equal), parameters 2.7e-5 (Nehalem kernel).
# Broken on purpose (tried, not committed): tensorwise without the amax reduction,
# gradient norm 1.6e-3 and parameters 0.16; NVFP4 shards quantised as tensors of their own, 4.8e-3 and 0.21.
#
# PP 2: every stage quantises its layers' operands as one process does; four steps,
# every value equal (delayed scaling in PP 2 is equivalence.sh's FP8 leg).
#
# Bounds: equivalence.sh's FP8 leg's (loss, norms and routing as without FP8;
# parameters and moments within 5e-3: an element at a tie between two codes goes either
# way by the layouts' rounding, and the gradient element it feeds moves by a step of
# the format).
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
BATCH="training%micro_batch_size=1 training%global_batch_size=8 training%seq_length=16"
ONE="$BATCH training%train_iters=1 training%eval_interval=1 optimizer%lr_warmup_iters=0"
SHORT="$BATCH training%train_iters=4 training%eval_interval=4"
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
        reference "one_$leg" $ONE $recipe
        run "tp2_ep2_dp2_zero1_$leg" 4 $ONE "$seed" $recipe $TP2 $EP2 $ETP1 $ZERO
        same_as "one_$leg" "tp2_ep2_dp2_zero1_$leg"
        if [ "$leg" != delayed ]; then # equivalence.sh runs delayed in PP 2
            reference "short_$leg" $SHORT $recipe
            run "pp2_$leg" 2 $SHORT "$seed" $recipe $PP2
            same_as "short_$leg" "pp2_$leg"
        fi
    }
done <<RECIPES
delayed precision%fp8_format='hybrid' precision%fp8_amax_history_len=4 precision%fp8_amax_compute_algo='max'
tensorwise precision%fp8_format='hybrid' precision%fp8_recipe='tensorwise'
blockwise precision%fp8_format='e4m3' precision%fp8_recipe='blockwise' $W128
mxfp8 precision%fp8_format='e4m3' precision%fp8_recipe='mxfp8' $W32
nvfp4 precision%fp4_format='e2m1'
RECIPES
echo "every recipe's layouts match one process"

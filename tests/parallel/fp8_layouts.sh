#!/bin/sh
# FP8/FP4 in the parallel layouts (doc/fp8.md, "Parallel layouts"): each recipe family
# in TP 2 (sequence parallel) x EP 2 with ZeRO-1 over 2 data-parallel replicas, and in
# 2 pipeline stages, matches one process; so do a per-tensor and a block recipe with
# ETP 2, and with an expert group across data-parallel replicas (at the end).
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
# Routing: every decision as the reference's, but the scores are not held to rounding
# (ROUTE_SCORES_ROUNDED=no) in the TP, ETP and EP legs: the validation after the step runs on
# parameters that part as above, and an operand element whose FP8 code flips moves a
# router score by up to a code step (2.4e-4 measured under an Intel kernel: one token's
# two experts swapped order, its decision the same, routing.awk).
#
# Bounds: equivalence.sh's FP8 leg's (loss, norms and routing as without FP8;
# parameters and moments within 5e-3: an element at a tie between two codes goes either
# way by the layouts' rounding, and the gradient element it feeds moves by a step of
# the format). NVFP4's within 5e-2: E2M1 has 8 magnitudes, so one element whose code
# flips at a tie moves by up to a third of its block's largest, and through the weight
# gradient's GEMM that is a rank-1 change of one row of dW. Seen with the CPU kernels'
# AVX2 and AVX-512 levels (kernels/cpu/cpu_isa.h), whose sums round otherwise than the
# baseline's: one code of dy for v_proj's output channel 25 (layer 0) flipped, Adam's m
# of that 32 x 32 tensor 1.65e-2 apart in norm, all of it in row 25 (the difference is
# rank 1), the parameters 1.3e-5, the gradient norm 3.1e-6; NVFP4 shards quantised as
# tensors of their own (broken on purpose, above) part the parameters by 0.21.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
ROUTE_SCORES_ROUNDED=no # (Routing, above)
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
    TOL_PARAMS=5e-3
    [ "$leg" = nvfp4 ] && TOL_PARAMS=5e-2 # (Bounds, above)
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
TOL_PARAMS=5e-3
# Expert-tensor parallelism: ETP 2 inside the TP group (4 ranks: TP 2 x ETP 2 x DP 2,
# ZeRO-1), one step against one process: the experts' gate and up split by rows and
# down by columns over ETP, every ETP rank with all the rows of the TP group's
# micro-batch; tensorwise's amax of a split operand max-reduced over ETP, blockwise's
# moe_ffn_hidden_size 256 split into whole 128-blocks.
#
# An expert group that spans data-parallel replicas (4 ranks, EP 2 x DP 4: ranks 0 and
# 1, then 2 and 3, hold the 8 experts between them, each rank a replica of its own): an
# expert's rows are the tokens of the two replicas' micro-batches (one step of 4
# sequences, rank r's sample r). One process computes the same GEMMs with
# micro_batch_size 2, whose micro-batch i is samples 2i, 2i + 1, tokens sequence by sequence, as the
# dispatcher puts an expert's rows in source-rank order. Blockwise: the features' tiles
# and blocks of the forward and dgrad GEMMs are per row; the weight gradient's 128 x 1
# tiles along the tokens are the same rows when a sequence is 128 tokens (the dense and
# attention GEMMs, a sequence a replica, one tile; the experts, the two sequences'
# rows in the same order); the 2x between the two runs' gradients (a loss over one
# sequence against two) is a power of two, which the power-of-two scales pass exactly.
# Delayed scaling (a per-tensor recipe) after its first step: every scale is the
# world-reduced history's, the same for any set of rows, so both resume one process's
# checkpoint of step 1 and run step 2 (the first step scales by the tensor's own amax,
# a set of rows that differs in the dense GEMMs: one sequence against two).
# Tensorwise and NVFP4 cannot be compared so: a per-tensor amax over the rows (the
# dense GEMMs' one sequence, the experts' two) or random bits keyed by the micro-batch.
# same_but_routing REF RUN: same_as without the routing dumps, which key a decision by
# its micro-batch (one sequence here, two in REF: no decision would find its match);
# the expert loads and dropped tokens, which come from the same decisions, still
# compare exactly
same_but_routing() {
    echo "$2 (routing: expert loads and drops only):"
    bad=0
    for k in loss val_loss; do close "$1" "$2" "$k" "$TOL_LOSS" || bad=1; done
    for k in aux_loss z_loss; do close "$1" "$2" "$k" "$TOL_AUX" || bad=1; done
    close "$1" "$2" grad_norm "$TOL_NORM" || bad=1
    for k in lr consumed_samples dropped_tokens expert_load_min expert_load_max; do
        close "$1" "$2" "$k" 0 || bad=1
    done
    it=$(printf %07d "$(cat "$1/latest_checkpointed_iteration.txt")")
    "$ckpt_diff" "$1/iter_$it" "$2/iter_$it" "$TOL_PARAMS" > diff.out || bad=1
    sed 's/^/  /' diff.out
    [ $bad = 0 ] || fail "$2 differs from $1"
}
ETP_W="moe%moe_ffn_hidden_size=256"
SPAN_ONE="training%micro_batch_size=2 training%global_batch_size=4 training%seq_length=128
model%max_position_embeddings=128 training%train_iters=1 training%eval_interval=1 optimizer%lr_warmup_iters=0"
SPAN="training%micro_batch_size=1 training%global_batch_size=4 training%seq_length=128
model%max_position_embeddings=128 training%train_iters=1 training%eval_interval=1 optimizer%lr_warmup_iters=0"
TWO="$BATCH training%train_iters=2 training%eval_interval=2 optimizer%lr_warmup_iters=0"
# the quotes are moetrain's (namelist strings), split into words with the lists
# shellcheck disable=SC2089
DELAYED="precision%fp8_format='hybrid' precision%fp8_amax_history_len=4 precision%fp8_amax_compute_algo='max'"
# shellcheck disable=SC2089
TENSORWISE="precision%fp8_format='hybrid' precision%fp8_recipe='tensorwise'"
# shellcheck disable=SC2089
BLOCKWISE="precision%fp8_format='e4m3' precision%fp8_recipe='blockwise' $W128"
# shellcheck disable=SC2086,SC2090 # lists of overrides
{
    reference one_etp_tensorwise $ONE $TENSORWISE
    run tp2_etp2_dp2_zero1_tensorwise 4 $ONE "$seed" $TENSORWISE $TP2 $ETP2 $ZERO
    same_as one_etp_tensorwise tp2_etp2_dp2_zero1_tensorwise
    reference one_etp_blockwise $ONE $BLOCKWISE $ETP_W
    run tp2_etp2_dp2_zero1_blockwise 4 $ONE "$seed" $BLOCKWISE $ETP_W $TP2 $ETP2 $ZERO
    same_as one_etp_blockwise tp2_etp2_dp2_zero1_blockwise

    reference one_span_blockwise $SPAN_ONE $BLOCKWISE
    run ep2_dp4_blockwise 4 $SPAN "$seed" $BLOCKWISE $EP2
    same_but_routing one_span_blockwise ep2_dp4_blockwise
    reference first_delayed $ONE $DELAYED
    run one_span_delayed 1 $TWO "$seed" $DELAYED "checkpoint%load='first_delayed'"
    routing_margins one_span_delayed || true
    run ep2_dp4_delayed 4 $TWO "$seed" $DELAYED $EP2 "checkpoint%load='first_delayed'"
    grep -q "loaded checkpoint first_delayed/iter_0000001" ep2_dp4_delayed.log ||
        fail "ep2_dp4_delayed did not resume step 1's checkpoint"
    same_as one_span_delayed ep2_dp4_delayed
}
echo "every recipe's layouts match one process"

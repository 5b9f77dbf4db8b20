#!/bin/sh
# &cuda_graph impl = 'full_iteration' (the whole iteration one graph, optimizer step
# included: doc/host-overhead.md "The full iteration") over 2 processes and the emulated
# NCCL: tiny_moe with drop-and-pad, 4 iterations of a global batch of 4 with
# warmup_steps = 1 (iteration 2 captures, iterations 3 and 4 replay):
#   - DP 2: the gradients' all-reduce, the norm's and the losses' sums over the world
#     captured; device work run at once and deferred per stream (MT_EMU_STREAMS=deferred);
#   - DP 2 with the distributed optimizer and overlap_grad_reduce: the reduce-scatters
#     started during backward, the updated slices' all-gathers;
#   - EP 2 with a shared expert overlapped with the dispatcher's all-to-alls (in the
#     graph, with the shared expert's parts between their start and their wait) and TP 2
#     with sequence parallelism (the TP sums of the replicated gradients), then with
#     selective recompute of core_attn, layernorm (its rebuild gathers over TP again,
#     inside the graph) and moe;
#   - DP 2 with the expert bias (router_enable_expert_bias): the loads summed over the
#     world and the biases updated on the device inside the graph;
#   - DP 2 with a learning rate that makes every step's gradient non-finite: the device
#     skips the same steps as the host does eagerly;
# each against the same run without graphs: losses, balancing and z losses, gradient
# norms, dropped tokens and the validation loss bit-identical, the final checkpoint
# (weights and moments) byte-identical, one kernel launch and one host wait per step once
# captured, the graph replayed and not captured again. A collective run at capture
# instead of at each launch, or left out of the graph, changes the figures.
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
. "$MT_TOP_SRCDIR/tests/train/same_ckpt.sh"
. "$MT_TOP_SRCDIR/tests/runtime/full_iteration_runs.sh"
need_mpirun
use_emulated_nccl 2
cd "$tmp"

train dp_eager
# shellcheck disable=SC2086 # lists of overrides
train dp_full $full
compare dp_eager dp_full
# shellcheck disable=SC2086
MT_EMU_STREAMS=deferred train dp_full_deferred $full
compare dp_eager dp_full_deferred

bias="moe%router_enable_expert_bias=T moe%router_score_function='sigmoid' moe%router_bias_update_rate=0.01"
# shellcheck disable=SC2086
train bias_eager $bias
# shellcheck disable=SC2086
train bias_full $bias $full
compare bias_eager bias_full

zero="parallel%use_distributed_optimizer=T parallel%overlap_grad_reduce=T"
# shellcheck disable=SC2086
train zero_eager $zero
# shellcheck disable=SC2086
train zero_full $zero $full
compare zero_eager zero_full
grep -q 'overlap_grad_reduce: [1-9][0-9]* of [0-9]* gradient buckets were started during the backward' zero_full.log ||
    { cat zero_full.log; fail "zero_full: no bucket started during backward"; }

ep="parallel%expert_model_parallel_size=2 moe%shared_expert_intermediate_size=128 moe%moe_shared_expert_overlap=T"
# shellcheck disable=SC2086
train ep_eager $ep
# shellcheck disable=SC2086
train ep_full $ep $full
compare ep_eager ep_full
grep -q 'experts ETP 1 x EP 2' ep_full.log || { cat ep_full.log; fail "ep_full: not EP 2"; }
grep -q 'moe_shared_expert_overlap: [1-9][0-9]* expert-parallel all-to-alls were in flight' ep_full.log ||
    { cat ep_full.log; fail "ep_full: no all-to-all overlapped with the shared expert"; }

tp="parallel%tensor_model_parallel_size=2 parallel%sequence_parallel=T"
# shellcheck disable=SC2086
train tp_eager $tp
# shellcheck disable=SC2086
train tp_full $tp $full
compare tp_eager tp_full
tpr="$tp recompute%granularity='selective' recompute%modules='core_attn','layernorm','moe'"
# shellcheck disable=SC2086
train tpr_eager $tpr
# shellcheck disable=SC2086
train tpr_full $tpr $full
compare tpr_eager tpr_full

# every step's gradient non-finite: skipped on the device on both ranks as eagerly
blow="optimizer%lr=1e30 optimizer%lr_warmup_iters=0 optimizer%clip_grad=0"
# shellcheck disable=SC2086
train blow_eager $blow
# shellcheck disable=SC2086
train blow_full $blow $full
grep -o '"iteration": [0-9]*, [^}]*"step_skipped": true' blow_eager.jsonl > blow_eager.skips
grep -o '"iteration": [0-9]*, [^}]*"step_skipped": true' blow_full.jsonl > blow_full.skips
[ -s blow_eager.skips ] || fail "blow_eager: no step skipped (the case tests nothing)"
cmp -s blow_eager.skips blow_full.skips || fail "blow_full: other steps skipped than eagerly"
same_ckpt blow_eager.ckpt/iter_0000004 blow_full.ckpt/iter_0000004 ||
    fail "blow_full: the state after skipped steps differs from the eager run's"
echo "ok: blow_full: $(wc -l < blow_full.skips) steps skipped on the device as eagerly; checkpoint byte-identical"

#!/bin/sh
# &cuda_graph impl = 'full_iteration' under pipeline parallelism (doc/host-overhead.md
# "The full iteration"): the whole schedule of an iteration (every micro-batch's forward
# and backward on the stage, the transfers between stages, the gradients' reduction, the
# device-decided AdamW step) one graph per rank, over the emulated NCCL: tiny_moe with
# drop-and-pad, 4 iterations with warmup_steps = 1 (iteration 2 captures, 3 and 4 replay):
#   - PP 2 with 1F1B (4 micro-batches: a warm-up, a steady phase and a flush), the
#     embedding tied to the LM head (its two halves summed over the embedding group);
#   - PP 2 x VPP 2 (4 layers) with overlap_p2p_comm and overlap_p2p_comm_warmup_flush,
#     device work deferred per stream (the transfers started ahead and waited for on the
#     device inside the graph), against the interleaved schedule without graphs;
#   - PP 2 x DP 2 on 4 processes with the distributed optimizer and overlap_grad_reduce;
# each against the same run without graphs: losses, balancing and z losses, gradient
# norms, dropped tokens and the validation loss bit-identical, the final checkpoint
# byte-identical, one kernel launch and one host wait per step once captured, the graph
# replayed and not captured again. A transfer between stages run at capture instead of at
# each launch leaves the next stage the capture's activations and changes the figures;
# tokens staged in another order than the interleaved schedule's forwards take them
# change them too.
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
. "$MT_TOP_SRCDIR/tests/train/same_ckpt.sh"
. "$MT_TOP_SRCDIR/tests/runtime/full_iteration_runs.sh"
need_mpirun
use_emulated_nccl 4
cd "$tmp"

pp=parallel%pipeline_model_parallel_size=2
tie=model%untie_embeddings_and_output_weights=F
train pp_eager $pp $tie
# shellcheck disable=SC2086 # lists of overrides
train pp_full $pp $tie $full
compare pp_eager pp_full
grep -q '^pipeline stage 1 (1F1B, 4 micro-batches)' pp_full.log || { cat pp_full.log; fail "pp_full: not PP 2"; }

vpp="$pp parallel%virtual_pipeline_model_parallel_size=2 model%num_layers=4 moe%layer_freq=4*1"
# shellcheck disable=SC2086
train vpp_eager $vpp
# shellcheck disable=SC2086
MT_EMU_STREAMS=deferred train vpp_full $vpp $full parallel%overlap_p2p_comm=T \
    parallel%overlap_p2p_comm_warmup_flush=T
compare vpp_eager vpp_full
[ "$(grep -c 'overlap_p2p_comm: [1-9][0-9]* transfers per step in flight during a compute pass' vpp_full.log)" = 2 ] ||
    { cat vpp_full.log; fail "vpp_full: not both stages started transfers ahead"; }

np=4
dp="$pp parallel%use_distributed_optimizer=T parallel%overlap_grad_reduce=T"
# shellcheck disable=SC2086
train ppdp_eager $dp
# shellcheck disable=SC2086
train ppdp_full $dp $full
compare ppdp_eager ppdp_full
grep -q 'layout TP 1 x CP 1 x PP 2 x DP 2' ppdp_full.log || { cat ppdp_full.log; fail "ppdp_full: not PP 2 x DP 2"; }

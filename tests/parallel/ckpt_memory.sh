#!/bin/sh
# Per-rank host memory of sharded saves and loads (doc/checkpoints.md): a model whose
# state (parameters and both moments, 120 MB) is several times what any one rank
# holds, saved by 8 processes (TP 2 x EP 4) and loaded by 8 in another layout (EP 8,
# ZeRO-1). The log reports the largest of the ranks' figures: the checkpoint code's
# host memory (counted) and the rise of the peak resident size (measured) must stay
# within the rank's own part plus one block (64 KiB here) and a 4 MiB allowance for
# the index; whole-model gathering on one rank would exceed that.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
MOETRAIN_CKPT_BLOCK=65536
export MOETRAIN_CKPT_BLOCK
BIG="model%hidden_size=256 model%num_attention_heads=8 model%num_query_groups=4
model%kv_channels=32 model%ffn_hidden_size=512 model%num_layers=3 moe%layer_freq=1,1,1
moe%moe_ffn_hidden_size=512 moe%shared_expert_intermediate_size=0
training%micro_batch_size=1 training%global_batch_size=8 training%seq_length=8
training%train_iters=1 training%eval_interval=100 optimizer%lr_decay_iters=10"
# shellcheck disable=SC2086 # lists of overrides
{
    run save 8 $BIG $TP2 $EP4 $ETP1
    run load 8 $BIG $EP4 parallel%expert_model_parallel_size=8 $ZERO "checkpoint%load='save'" \
        training%train_iters=2
}
grep -q "loaded checkpoint save/iter_0000001" load.log || { cat load.log; fail "no load"; }
params=$(sed -n 's/^model: \([0-9]*\) parameters.*/\1/p' save.log)
whole=$((params * 12))
# check LOG WHAT: the figures of LOG's "checkpoint WHAT:" line within the bounds
check() {
    line=$(grep "^checkpoint $2:" "$1.log" | head -n 1)
    [ -n "$line" ] || { cat "$1.log"; fail "$1: no checkpoint $2 line"; }
    echo "$line"
    echo "$line" | awk -v whole="$whole" -v what="$2" '{
        for (i = 1; i <= NF; i++) {
            if ($i == "counted") counted = $(i + 1)
            if ($i == "rise") rise = $(i + 1)
            if ($i == "part") own = $(i + 1)
            if ($i == "block") block = $(i + 1)
        }
        allowance = 4 * 1048576
        bound = (what == "save" ? 0 : own) + block
        printf "  %s: own part %d, block %d; counted %d, measured rise %d (bound %d + %d); whole state %d\n",
            what, own, block, counted, rise, bound, allowance, whole
        if (rise == "unknown") { print "  (the peak resident size cannot be reset here: counted only)"; rise = 0 }
        bad = counted > bound || rise > bound + allowance || bound + allowance > whole / 4
        exit bad }' || fail "$1: the $2 used more host memory than its own part and a block"
}
check save save
check load load
echo "checkpoint host memory per rank: own part + one block"

#!/bin/sh
# Background saves and conversion on 4 processes: checkpoint%async_save writes the
# synchronous saves' files byte for byte (TP 2 x EP 2 with ZeRO-1; PP 2 x EP 2), the
# log reports the time training was blocked per save; a checkpoint of 4 ranks
# converted to the one-process state.bin loads in another layout (EP 4) exactly as
# the sharded original does.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
ckpt_diff="$MT_TOP_BUILDDIR/tests/parallel/ckpt_diff"
SHORT="training%micro_batch_size=1 training%global_batch_size=8 training%seq_length=8
training%train_iters=6 training%eval_interval=6 checkpoint%save_interval=2"
PP2="parallel%pipeline_model_parallel_size=2 model%num_layers=4 moe%layer_freq=1,0,1,1"
ASYNC="checkpoint%async_save=T"
# shellcheck disable=SC2086 # lists of overrides
{
    run sync 4 $SHORT $TP2 $EP2 $ZERO
    run async 4 $SHORT $TP2 $EP2 $ZERO $ASYNC
    run psync 4 $SHORT $PP2 $EP2
    run pasync 4 $SHORT $PP2 $EP2 $ASYNC
}
for pair in "sync async" "psync pasync"; do
    set -- $pair
    for it in 0000002 0000004 0000006; do
        same_ckpt "$1/iter_$it" "$2/iter_$it" || fail "$2: the async save of iteration $it differs from the synchronous one"
    done
    [ "$(grep -c '^checkpoint save blocked training for [0-9.]* s (async: ' "$2.log")" = 3 ] ||
        { cat "$2.log"; fail "$2: the blocked time of each save is not reported"; }
    echo "$2: async saves byte-identical to $1's; $(grep '^checkpoint save blocked' "$2.log" | tail -n 1)"
done

"$MOETRAIN" ckpt convert sync/iter_0000004 single > convert.log 2>&1 || { cat convert.log; fail "convert"; }
"$ckpt_diff" sync/iter_0000004 single/iter_0000004 0 > diff.out || { cat diff.out; fail "state.bin's tensors differ from the 4 ranks' checkpoint"; }
# shellcheck disable=SC2086
{
    run from_sharded 4 $SHORT $EP4 "checkpoint%load='sync/iter_0000004'"
    run from_single 4 $SHORT $EP4 "checkpoint%load='single'"
}
grep -q "saved by one process (state.bin)" from_single.log || { cat from_single.log; fail "did not load the state.bin"; }
same_ckpt from_sharded/iter_0000006 from_single/iter_0000006 || fail "the converted state.bin loads otherwise than the sharded checkpoint"
echo "a 4-rank checkpoint converted to state.bin loads in another layout as the original does"

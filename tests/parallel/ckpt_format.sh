#!/bin/sh
# The sharded format as doc/checkpoints.md describes it, read by Python with the
# safetensors package (skipped without it): a checkpoint of 8 processes (TP 2 x EP 2 x
# PP 2, ZeRO-1: whole shards and ZeRO ranges) is whole and checksummed, and the same
# state loaded by one process and saved again is the same tensors bit for bit.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
"${PYTHON3:-python3}" -c 'import numpy, safetensors' 2> /dev/null || skip "no numpy and safetensors for ${PYTHON3:-python3}"
SHORT="training%micro_batch_size=1 training%global_batch_size=8 training%seq_length=8
training%train_iters=2 model%num_layers=4 moe%layer_freq=1,0,1,1"
PP2="parallel%pipeline_model_parallel_size=2"
# shellcheck disable=SC2086 # lists of overrides
{
    run a 8 $SHORT $TP2 $EP2 $ETP1 $PP2 $ZERO
    run one 1 $SHORT "checkpoint%load='a'" # train_iters reached: it saves what it loaded
}
grep -q "loaded checkpoint a/iter_0000002" one.log || { cat one.log; fail "one did not load"; }
"${PYTHON3:-python3}" "$MT_TOP_SRCDIR/tests/parallel/ckpt_format.py" a/iter_0000002 one/iter_0000002 ||
    fail "the checkpoint does not read as documented"

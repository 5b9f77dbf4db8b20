#!/bin/sh
# The NCCL backend on GPUs (every collective, send/recv and the batched ring
# exchange of p2p_batch): one process, then (with several GPUs) one process
# per GPU under mpirun. Skips (77) without NCCL in the build or without a GPU.
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
[ "$MT_HAVE_NCCL" = yes ] || skip "built without NCCL"
prog="$MT_TOP_BUILDDIR/tests/runtime/nccl_check"
cd "$tmp"
"$prog" > out 2> err
rc=$?
cat out err
[ $rc -eq 77 ] && skip "no GPU"
[ $rc -eq 0 ] && grep -q 'passed on 1 processes' out || fail "nccl_check on one process"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$ngpu" -ge 2 ]; then
    need_mpirun
    mpirun_np "$ngpu" "$prog" > out 2> err || { cat out err; fail "nccl_check on $ngpu GPUs"; }
    grep -q "passed on $ngpu processes" out || { cat out err; fail "$ngpu GPUs: no verdict"; }
fi
echo "ok"

#!/bin/sh
# Resume is bit-exact: 12 iterations straight give the same checkpoint, byte for
# byte, as 5 iterations (exit_interval), a restart from the checkpoint, and 7 more. The bf16
# path is checked the same way.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
cd "$tmp"
for dtype in fp32 bf16; do
    "$MOETRAIN" "$small" precision%params_dtype="'$dtype'" "checkpoint%save='straight_$dtype'" > a.log 2>&1 || { cat a.log; fail "straight run"; }
    "$MOETRAIN" "$small" precision%params_dtype="'$dtype'" training%exit_interval=5 "checkpoint%save='split_$dtype'" > b.log 2>&1 || { cat b.log; fail "first half"; }
    "$MOETRAIN" "$small" precision%params_dtype="'$dtype'" "checkpoint%save='split_$dtype'" "checkpoint%load='split_$dtype'" > c.log 2>&1 || { cat c.log; fail "second half"; }
    grep -q "loaded checkpoint" c.log || fail "the resumed run did not load"
    same_ckpt "straight_$dtype/iter_0000012" "split_$dtype/iter_0000012" || fail "$dtype: resumed state differs from the straight run"
    [ "$(cat split_$dtype/latest_checkpointed_iteration.txt)" = 12 ] || fail "latest file"
    echo "$dtype: resume is bit-exact"
done
# keep_last prunes old checkpoints
"$MOETRAIN" "$small" checkpoint%save_interval=3 "checkpoint%save='keep'" checkpoint%keep_last=2 > d.log 2>&1 || { cat d.log; fail "keep_last run"; }
[ "$(ls -d keep/iter_* | wc -l)" -eq 2 ] || { ls keep; fail "keep_last=2 left $(ls -d keep/iter_* | wc -l) checkpoints"; }
[ -d keep/iter_0000012 ] && [ -d keep/iter_0000009 ] || fail "keep_last kept the wrong ones"
ls keep/*.tmp >/dev/null 2>&1 && fail "temporary directories left behind"
echo "keep_last ok"
# a save that died half-way (a leftover .tmp directory) is ignored on load and
# cleaned up by the next save of that iteration
mkdir -p keep/iter_0000015.tmp && echo partial > keep/iter_0000015.tmp/rank_00000.safetensors
"$MOETRAIN" "$small" "checkpoint%load='keep'" > e.log 2>&1 || { cat e.log; fail "load beside a partial save"; }
grep -q "loaded checkpoint keep/iter_0000012" e.log || { cat e.log; fail "did not load the last whole checkpoint"; }
"$MOETRAIN" "$small" training%train_iters=15 "checkpoint%load='keep'" "checkpoint%save='keep'" > f.log 2>&1 || { cat f.log; fail "save over a partial save"; }
[ -d keep/iter_0000015.tmp ] && fail "the partial save was not cleaned up"
[ "$(cat keep/latest_checkpointed_iteration.txt)" = 15 ] || fail "latest after the new save"
echo "partial saves ok"

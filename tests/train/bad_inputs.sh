#!/bin/sh
# Corrupt checkpoints, a checkpoint from another model, missing data and a
# diverging run all fail cleanly with a message that names the problem.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
cd "$tmp"
expect_fail() { # expect_fail NEEDLE ARGS...: moetrain must exit 1 with NEEDLE on stderr
    needle=$1; shift
    "$MOETRAIN" "$@" > out.log 2> err.log && { cat out.log err.log; fail "expected failure: $*"; }
    grep -q -- "$needle" err.log || { cat err.log; fail "message lacks '$needle'"; }
    [ "$(grep -c 'error: ' err.log)" -eq 1 ] || { cat err.log; fail "expected exactly one error message"; }
}
"$MOETRAIN" "$small" training%train_iters=3 "checkpoint%save='ck'" > /dev/null 2>&1 || fail "setup run"
state=ck/iter_0000003/state.bin
cp "$state" good.bin
# flip one byte in the middle
size=$(wc -c < good.bin)
printf '\377' | dd of="$state" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
expect_fail "checksum does not match" "$small" "checkpoint%load='ck'"
# truncated
head -c 100 good.bin > "$state"
expect_fail "is corrupt" "$small" "checkpoint%load='ck'"
# not a checkpoint at all
echo hello > "$state"
expect_fail "moetrain checkpoint magic" "$small" "checkpoint%load='ck'"
# a checkpoint of another model
cp good.bin "$state"
expect_fail "differ" "$small" model%hidden_size=64 model%kv_channels=16 "checkpoint%load='ck'"
# a broken latest file
echo garbage > ck/latest_checkpointed_iteration.txt
expect_fail "latest_checkpointed_iteration.txt" "$small" "checkpoint%load='ck'"
# missing data
expect_fail "no_such_prefix" "$small" "data%data_path='no_such_prefix'"
# a diverging run stops after a bounded number of non-finite steps
expect_fail "in a row" "$small" optimizer%lr=1e30 optimizer%min_lr=1e29 optimizer%clip_grad=0 training%train_iters=60
echo "all bad inputs rejected"

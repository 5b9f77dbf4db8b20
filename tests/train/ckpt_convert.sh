#!/bin/sh
# moetrain ckpt convert, both ways: sharded -> state.bin -> sharded gives back the same
# files byte for byte, the tensors of both formats are bit-identical, a run resumed
# from the converted state.bin continues bit-exactly, an in-place conversion leaves
# only the new format, and bad arguments or a corrupt source fail without writing.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
ckpt_diff="$MT_TOP_BUILDDIR/tests/parallel/ckpt_diff"
[ -x "$ckpt_diff" ] || { echo "SKIP: $ckpt_diff is not built (make check builds it)"; exit 77; }
cd "$tmp"
"$MOETRAIN" "$small" "checkpoint%save='straight'" > a.log 2>&1 || { cat a.log; fail "straight run"; }
"$MOETRAIN" "$small" training%exit_interval=5 "checkpoint%save='split'" > b.log 2>&1 || { cat b.log; fail "first half"; }
[ -f split/iter_0000005/index.json ] || fail "a run does not save the sharded format"

# sharded -> state.bin
"$MOETRAIN" ckpt convert split single > c.log 2>&1 || { cat c.log; fail "convert to state.bin"; }
grep -q "split/iter_0000005 (sharded) -> single/iter_0000005 (state.bin): iteration 5" c.log || { cat c.log; fail "convert's report"; }
[ -f single/iter_0000005/state.bin ] && [ ! -f single/iter_0000005/index.json ] || { ls single/iter_0000005; fail "not a state.bin checkpoint"; }
[ "$(cat single/latest_checkpointed_iteration.txt)" = 5 ] || fail "latest of the converted checkpoint"
cmp split/iter_0000005/config.nml single/iter_0000005/config.nml || fail "the configuration was not carried over"
"$ckpt_diff" split/iter_0000005 single/iter_0000005 0 > d.log || { cat d.log; fail "state.bin's tensors differ from the sharded checkpoint's"; }

# state.bin -> sharded: the very files the run wrote
"$MOETRAIN" ckpt convert single/iter_0000005 back > c.log 2>&1 || { cat c.log; fail "convert to sharded"; }
same_ckpt split/iter_0000005 back/iter_0000005 || fail "sharded -> state.bin -> sharded is not the original"
echo "convert both ways: bit-identical"

# resuming from the converted state.bin continues the straight run bit-exactly
"$MOETRAIN" "$small" "checkpoint%load='single'" "checkpoint%save='resumed'" > e.log 2>&1 || { cat e.log; fail "resume from state.bin"; }
grep -q "loaded checkpoint single/iter_0000005: iteration 5, .*(saved by one process (state.bin))" e.log || { cat e.log; fail "did not load the state.bin"; }
same_ckpt straight/iter_0000012 resumed/iter_0000012 || fail "the run resumed from state.bin differs from the straight run"
echo "resume from a converted state.bin: bit-exact"

# in place: the save directory's latest checkpoint replaced by its conversion
"$MOETRAIN" ckpt convert --to state.bin resumed resumed > c.log 2>&1 || { cat c.log; fail "in-place convert"; }
[ "$(cd resumed/iter_0000012 && ls | tr '\n' ' ')" = "config.nml state.bin " ] || { ls resumed/iter_0000012; fail "in place: other files left"; }
"$ckpt_diff" straight/iter_0000012 resumed/iter_0000012 0 > d.log || { cat d.log; fail "in-place conversion changed the tensors"; }
ls -d resumed/*.tmp resumed/*.old > /dev/null 2>&1 && fail "in place: leftovers"

# errors: nothing is written
expect_fail() { # expect_fail NEEDLE ARGS...
    needle=$1; shift
    "$MOETRAIN" "$@" > out.log 2> err.log && { cat out.log err.log; fail "expected failure: $*"; }
    grep -q -- "$needle" err.log || { cat err.log; fail "message lacks '$needle'"; }
}
expect_fail "convert takes two paths" ckpt convert split
expect_fail "--to takes sharded or state.bin" ckpt convert --to hdf5 split x
expect_fail "checkpoint%load 'nowhere' does not exist" ckpt convert nowhere x
expect_fail "is a checkpoint's iter_\* directory" ckpt convert split split/iter_0000005
cp -r single broken
size=$(wc -c < broken/iter_0000005/state.bin)
printf '\377' | dd of=broken/iter_0000005/state.bin bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
expect_fail "broken/iter_0000005/state.bin' is corrupt: the checksum does not match" ckpt convert broken out
[ -e out/iter_0000005 ] || [ -e out/latest_checkpointed_iteration.txt ] && fail "a failed conversion wrote a checkpoint"
echo "bad arguments and a corrupt source rejected"

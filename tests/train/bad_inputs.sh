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
# sizes derived from several keys are checked in 64 bits, not wrapped (2^30 x DP 4 was "0 micro-batches")
tiny="$MT_TOP_SRCDIR/namelists/tiny_moe.nml"
expect_fail "micro_batch_size (1073741824) x seq_length (128)" --check --world-size 4 "$tiny" \
    training%micro_batch_size=1073741824 training%global_batch_size=0
expect_fail "4 x hidden_size (1073741824) = 4294967296" --check "$tiny" model%hidden_size=1073741824 \
    model%ffn_hidden_size=0 model%kv_channels=0 model%num_attention_heads=2 model%num_query_groups=2
# one data_path rule for --check and training: unweighted blends pass, zero or overflowing weights do not
"$MOETRAIN" --check "$small" "data%data_path='corpus/kjv_text_document','corpus/kjv_text_document'" \
    > /dev/null 2>&1 || fail "an unweighted blend is refused by --check"
expect_fail "the weight of dataset 'b' is 0" --check "$small" "data%data_path='1','a','0','b'"
expect_fail "blend weights sum to more than" "$small" "data%data_path='1e308','a','1e308','b'"
expect_fail "values sum to more than" "$small" "data%split='1e308,1e308,1'"
# pipeline stages must be the slowest dimension of the rank order
expect_fail "'pp' must come last" --check --world-size 4 "$small" "parallel%order='tp-pp-cp-ep-dp'" \
    parallel%pipeline_model_parallel_size=2 parallel%expert_model_parallel_size=2
# out of memory before the parameter table exists names what was being allocated
# (a 1 GB limit on writable memory, ulimit -d: an address-space limit, ulimit -v, makes
# the CUDA libraries' start-up spin; skipped where the binary cannot start under it, e.g.
# ASan's shadow memory)
if (ulimit -d 1000000 && timeout 20 "$MOETRAIN" --version) > /dev/null 2>&1; then
    (ulimit -d 1000000
     expect_fail "out of memory allocating the host token buffers (3221225472 bytes" "$small" \
         training%micro_batch_size=8388608 training%global_batch_size=0 training%train_iters=3 \
         data%mock_data=T "data%data_path=''") || exit 1
fi
echo "all bad inputs rejected"

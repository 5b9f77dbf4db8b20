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
shard=ck/iter_0000003/rank_00000.safetensors
index=ck/iter_0000003/index.json
cp "$shard" good.bin
cp "$index" good.json
# flip one byte in the middle of the shard: the message names the file and the tensor
size=$(wc -c < good.bin)
printf '\377' | dd of="$shard" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
expect_fail "the checksum of tensor 'model[.a-z_0-9]*' in 'rank_00000.safetensors' (bytes [0-9]*\.\.[0-9]*) does not match" \
    "$small" "checkpoint%load='ck'"
grep -q "Load an older checkpoint" err.log || { cat err.log; fail "no fix in the message"; }
# truncated
head -c $((size - 100)) good.bin > "$shard"
expect_fail "'rank_00000.safetensors' ends before the data of tensor" "$small" "checkpoint%load='ck'"
# a missing shard
rm "$shard"
expect_fail "cannot open its file 'rank_00000.safetensors'" "$small" "checkpoint%load='ck'"
cp good.bin "$shard"
# an index that is not JSON, or not this format's
echo hello > "$index"
expect_fail "index.json' is not valid JSON: line 1, column 1" "$small" "checkpoint%load='ck'"
echo '{"format": "other"}' > "$index"
expect_fail "does not name the format" "$small" "checkpoint%load='ck'"
# an index whose slices leave part of a tensor out
grep -v '"tensor": "model.norm.weight"' good.json > "$index"
expect_fail "its slices of tensor 'model.norm.weight' hold 0 of the 32 values needed here" "$small" "checkpoint%load='ck'"
# a checkpoint of another model
cp good.json "$index"
expect_fail "differ" "$small" model%hidden_size=64 model%kv_channels=16 "checkpoint%load='ck'"
# the one-process format (written by moetrain ckpt convert): damaged, truncated,
# not a checkpoint, another format version, another model
"$MOETRAIN" ckpt convert ck single > /dev/null 2>&1 || fail "convert to state.bin"
state=single/iter_0000003/state.bin
cp "$state" good_state.bin
ssize=$(wc -c < good_state.bin)
printf '\377' | dd of="$state" bs=1 seek=$((ssize / 2)) conv=notrunc 2>/dev/null
expect_fail "'single/iter_0000003/state.bin' is corrupt: the checksum does not match (truncated or damaged file)" \
    "$small" "checkpoint%load='single'"
grep -q "Load an older checkpoint" err.log || { cat err.log; fail "no fix in the message"; }
head -c $((ssize - 1000)) good_state.bin > "$state"
expect_fail "state.bin' is corrupt: the checksum does not match" "$small" "checkpoint%load='single'"
printf 'MTCKPT' > "$state"
expect_fail "state.bin' is corrupt: the file is truncated" "$small" "checkpoint%load='single'"
if command -v python3 > /dev/null 2>&1; then
    # a well-formed file (its checksum right) of format version 2, and one with another magic
    for what in version magic; do
        python3 - good_state.bin "$state" "$what" <<'EOF_PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read()[:-8])
if sys.argv[3] == "version": b[8:16] = struct.pack("<Q", 2)
else: b[0:8] = b"NOTMOETR"
h = 0xcbf29ce484222325
for x in b: h = ((h ^ x) * 0x100000001b3) & 0xffffffffffffffff
open(sys.argv[2], "wb").write(bytes(b) + struct.pack("<Q", h))
EOF_PY
        [ "$what" = version ] && needle="state.bin' has format version 2; this moetrain reads version 1" \
            || needle="state.bin' is corrupt: it does not start with the moetrain checkpoint magic"
        expect_fail "$needle" "$small" "checkpoint%load='single'"
    done
fi
cp good_state.bin "$state"
expect_fail "differ" "$small" model%hidden_size=64 model%kv_channels=16 "checkpoint%load='single'"
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
     expect_fail "out of memory allocating the host routing buffers (8589934912 bytes" "$small" \
         training%micro_batch_size=8388608 training%global_batch_size=0 training%train_iters=3 \
         data%mock_data=T "data%data_path=''") || exit 1
fi
echo "all bad inputs rejected"

# Shared by the training tests: a scratch directory removed on exit, and helpers.
set -u
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
small="$MT_TOP_SRCDIR/tests/fixtures/train/small.nml"
fail() { echo "FAIL: $*"; exit 1; }
# json_field FILE KEY: every value of KEY in a JSON-lines file, one per line
json_field() { sed -n "s/.*\"$2\": \([-0-9.eE+naif]*\).*/\1/p" "$1"; }
# moetrain starts the runtime (MPI, PMIx), which leaks by design: the runtime
# tests' suppressions, and full stacks so that a leak is attributed to its library.
LSAN_OPTIONS="suppressions=$MT_TOP_SRCDIR/tests/runtime/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
ASAN_OPTIONS="fast_unwind_on_malloc=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS ASAN_OPTIONS
. "$MT_TOP_SRCDIR/tests/train/same_ckpt.sh"
# same_sample_data PREFIX: a dataset (PREFIX.bin/.idx) of which every sample of 16
# tokens (training%seq_length = 16) is the same, the bytes of SAME_DOC, the end of
# document (256) and SAME_DOC's first byte: 200 copies of a 15-byte document, each
# 16 tokens with its end, so that every sample starts at a document. A loss at any
# iteration is then the loss of that one sequence (tokens in SAME_TOKENS).
SAME_DOC="In the beginnin"
SAME_TOKENS="$(printf %s "$SAME_DOC" | od -An -tu1 | tr -s ' \n' '  ') 256 73"
same_sample_data() {
    i=0
    while [ $i -lt 200 ]; do echo "{\"text\": \"$SAME_DOC\"}"; i=$((i + 1)); done > "$1.jsonl"
    "$MT_TOP_BUILDDIR/moetrain-preprocess" --input "$1.jsonl" --output-prefix "$1" --append-eod \
        > /dev/null || fail "moetrain-preprocess failed"
}

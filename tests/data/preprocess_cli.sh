#!/bin/sh
# moetrain-preprocess as a user meets it: help, exit codes, error messages,
# atomic output (a failed run leaves the previous dataset untouched and no
# temporary files), and the bundled corpus built by `make`.
set -u
tool="${MT_TOP_BUILDDIR:?}/moetrain-preprocess"
[ -x "$tool" ] || { echo "SKIP: $tool not built"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mt-preprocess-cli.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# --help documents the document boundaries and the vocabulary.
"$tool" --help > "$tmp/help" || fail "--help exited $?"
grep -q "one document per paragraph" "$tmp/help" || fail "--help does not explain text documents"
grep -q "JSON object per line" "$tmp/help" || fail "--help does not explain JSONL"
grep -q "vocabulary is 257" "$tmp/help" || fail "--help does not give the vocabulary"

# Usage errors exit 2 with a message.
"$tool" --output-prefix "$tmp/x" 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] || fail "no --input: exit $rc, expected 2"
grep -q "no --input given" "$tmp/err" || fail "no --input: $(cat "$tmp/err")"
"$tool" --input a --output-prefix b --frobnicate 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] || fail "unknown option: exit $rc"
grep -q "unknown option --frobnicate" "$tmp/err" || fail "unknown option: $(cat "$tmp/err")"

# A good run: text and JSONL into one dataset.
printf 'para one\nline two\n\npara two\n' > "$tmp/a.txt"
printf '{"text": "json \\u00e9"}\n{"text": ""}\n' > "$tmp/b.jsonl"
"$tool" --input "$tmp/a.txt" --input "$tmp/b.jsonl" --output-prefix "$tmp/ds" --append-eod \
    > "$tmp/out" 2> "$tmp/err" || fail "good run failed: $(cat "$tmp/err")"
grep -q "3 documents, 37 tokens" "$tmp/out" || fail "summary: $(cat "$tmp/out")"
grep -q "1 empty documents skipped" "$tmp/out" || fail "summary: $(cat "$tmp/out")"
[ -s "$tmp/ds.bin" ] && [ -s "$tmp/ds.idx" ] || fail "no output files"
[ "$(wc -c < "$tmp/ds.bin")" -eq 74 ] || fail "ds.bin is not 37 uint16 tokens"
ls "$tmp" | grep -q '\.tmp' && fail "temporary files left behind"
cp "$tmp/ds.bin" "$tmp/keep.bin"; cp "$tmp/ds.idx" "$tmp/keep.idx"

# Bad JSON: file:line:col, exit 1, the previous dataset untouched.
printf '{"text": "ok"}\n{"text": "x",}\n' > "$tmp/bad.jsonl"
"$tool" --input "$tmp/bad.jsonl" --output-prefix "$tmp/ds" 2> "$tmp/err"; rc=$?
[ $rc -eq 1 ] || fail "bad JSON: exit $rc, expected 1"
grep -q "bad.jsonl:2:14: error: expected a string key" "$tmp/err" ||
    fail "bad JSON: $(cat "$tmp/err")"
cmp -s "$tmp/ds.bin" "$tmp/keep.bin" && cmp -s "$tmp/ds.idx" "$tmp/keep.idx" ||
    fail "a failed run changed the previous output"
ls "$tmp" | grep -q '\.tmp' && fail "temporary files left behind after a failure"

# Missing input and unwritable output: I/O errors naming the file.
"$tool" --input "$tmp/nonexistent.txt" --output-prefix "$tmp/ds2" 2> "$tmp/err"; rc=$?
[ $rc -eq 1 ] || fail "missing input: exit $rc"
grep -q "nonexistent.txt: No such file" "$tmp/err" || fail "missing input: $(cat "$tmp/err")"
[ -e "$tmp/ds2.bin" ] && fail "output created for a missing input"
"$tool" --input "$tmp/a.txt" --output-prefix "$tmp/no/such/dir/ds" 2> "$tmp/err"; rc=$?
[ $rc -eq 1 ] || fail "unwritable output: exit $rc"
grep -q "no/such/dir/ds.bin.tmp" "$tmp/err" || fail "unwritable output: $(cat "$tmp/err")"
: > "$tmp/empty.txt"
"$tool" --input "$tmp/empty.txt" --output-prefix "$tmp/ds3" 2> "$tmp/err"; rc=$?
[ $rc -eq 1 ] || fail "empty input: exit $rc"
grep -q "no text" "$tmp/err" || fail "empty input: $(cat "$tmp/err")"

# The corpus `make` built is what the tool makes of corpus/kjv.txt.
corpus="$MT_TOP_BUILDDIR/corpus/kjv_text_document"
if [ -f "$corpus.idx" ]; then
    "$tool" --input "${MT_TOP_SRCDIR:?}/corpus/kjv.txt" --append-eod --output-prefix "$tmp/kjv" \
        > "$tmp/out" || fail "corpus run failed"
    grep -q "503 documents" "$tmp/out" || fail "corpus: $(cat "$tmp/out")"
    cmp -s "$corpus.bin" "$tmp/kjv.bin" && cmp -s "$corpus.idx" "$tmp/kjv.idx" ||
        fail "the built corpus differs from a fresh run"
    [ "$(wc -c < "$MT_TOP_SRCDIR/corpus/kjv.txt")" -ge 1000000 ] || fail "corpus is under 1 MB"
else
    echo "note: $corpus.idx not built; corpus checks skipped"
fi
exit 0

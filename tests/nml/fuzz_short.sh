#!/bin/sh
# moetrain: fuzz the namelist parser for about 10 seconds, from a corpus made
# of the fixtures; any crash, leak, hang or sanitizer report fails the test.
# Skips (77) when configure found no clang with libFuzzer.
top_srcdir=${MT_TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
fuzz=${MT_NML_FUZZ:-${MT_TOP_BUILDDIR:-.}/tests/nml/fuzz_nml}
if ! test -x "$fuzz"; then
  echo "SKIP: $fuzz not built (configure --enable-fuzz needs clang with libFuzzer)"
  exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/nml-fuzz.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/corpus" "$tmp/artifacts"
for f in "$top_srcdir"/tests/fixtures/nml/ok/*.nml "$top_srcdir"/tests/fixtures/nml/bad/*.nml; do
  cp "$f" "$tmp/corpus/$(basename "$(dirname "$f")")-$(basename "$f")"
done

"$fuzz" -max_total_time=10 -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -dict="$top_srcdir/tests/nml/nml.dict" -artifact_prefix="$tmp/artifacts/" \
  -print_final_stats=1 "$tmp/corpus" 2>"$tmp/log"
rc=$?
tail -n 20 "$tmp/log"
if test $rc -ne 0 || test -n "$(ls "$tmp/artifacts")"; then
  for a in "$tmp"/artifacts/*; do
    test -f "$a" || continue
    echo "FAIL: input that broke the parser ($(basename "$a")), as hex:"
    od -A d -t x1 "$a" | head -n 64
  done
  exit 1
fi
exit 0

#!/bin/sh
# The committed Megatron-style fixture is what its generator writes.
set -u
py="${PYTHON3:-}"
[ -n "$py" ] || py=$(command -v python3) || { echo "SKIP: no python3"; exit 77; }
fixtures="${MT_TOP_SRCDIR:?}/tests/fixtures/data"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mt-fixture.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
"$py" "$fixtures/make_megatron_fixture.py" "$tmp/megatron_int32" || exit 1
for ext in bin idx; do
    cmp "$fixtures/megatron_int32.$ext" "$tmp/megatron_int32.$ext" ||
        { echo "FAIL: megatron_int32.$ext differs from make_megatron_fixture.py's output"; exit 1; }
done
exit 0

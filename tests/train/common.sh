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
. "$MT_TOP_SRCDIR/tests/train/same_sample.sh"

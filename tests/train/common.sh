# Shared by the training tests: a scratch directory removed on exit, and helpers.
set -u
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
small="$MT_TOP_SRCDIR/tests/fixtures/train/small.nml"
fail() { echo "FAIL: $*"; exit 1; }
# json_field FILE KEY: every value of KEY in a JSON-lines file, one per line
json_field() { sed -n "s/.*\"$2\": \([-0-9.eE+naif]*\).*/\1/p" "$1"; }

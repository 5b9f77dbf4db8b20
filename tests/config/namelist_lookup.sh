#!/bin/bash
# A namelist named on the command line that is not a path from here is looked for,
# less a leading "namelists/", in $MOETRAIN_NAMELISTS and the installed namelists
# (tests/install/run_anywhere.sh runs an installed moetrain); when it is nowhere, the
# error lists every place looked at. Run from a directory outside the source tree.
set -u
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
unset MOETRAIN_NAMELISTS

# ok ARGS: moetrain --check ARGS succeeds
ok() { "$MOETRAIN" --check "$@" > out 2>&1 || { cat out; fail "--check $* (MOETRAIN_NAMELISTS=${MOETRAIN_NAMELISTS:-})"; }; }

# Not installed, no variable: the error names the file, where it looked, the fix.
"$MOETRAIN" --check namelists/tiny_moe.nml > out 2>&1 && fail "found namelists/tiny_moe.nml with nowhere to look"
cat out
grep -q "namelists/tiny_moe.nml: cannot read namelist file: no such file, and no tiny_moe.nml among the shipped namelists" out ||
    fail "the error does not say what was missing"
grep -q "looked for .*/namelists/tiny_moe.nml" out || fail "the error does not list the installed directory"
grep -q 'MOETRAIN_NAMELISTS is not set' out || fail "the error does not say that MOETRAIN_NAMELISTS is unset"

# The variable: with and without the leading namelists/, and a later override file
export MOETRAIN_NAMELISTS=$MT_TOP_SRCDIR/namelists
ok namelists/tiny_moe.nml
ok tiny_moe.nml
ok qwen3_30b_a3b.nml --world-size 256 parallel%tensor_model_parallel_size=2 \
    parallel%sequence_parallel=.true. parallel%pipeline_model_parallel_size=4 \
    parallel%expert_model_parallel_size=8
grep -q 'configuration is valid for 256 processes' out || fail "qwen3_30b_a3b.nml was not checked"

# A file here wins over a shipped one of the same name
mkdir namelists
"$MOETRAIN" --print-config "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" training%train_iters=77 > namelists/tiny_moe.nml
"$MOETRAIN" --print-config namelists/tiny_moe.nml > out 2>&1 || { cat out; fail "--print-config of the local file"; }
grep -qi 'train_iters *= *77\b' out || fail "the shipped tiny_moe.nml was read instead of ./namelists/tiny_moe.nml"

# Errors inside a shipped file name the file found, and a miss lists the variable's dir
"$MOETRAIN" --check no_such.nml > out 2>&1 && fail "no_such.nml was found"
grep -q "looked for $MOETRAIN_NAMELISTS/no_such.nml" out || { cat out; fail "the error does not list \$MOETRAIN_NAMELISTS"; }
grep -q 'MOETRAIN_NAMELISTS is set' out || fail "the error does not say that MOETRAIN_NAMELISTS is set"
# An absolute path is never looked up elsewhere
"$MOETRAIN" --check /nonexistent/tiny_moe.nml > out 2>&1 && fail "an absolute path was looked up elsewhere"
grep -q '/nonexistent/tiny_moe.nml: cannot read namelist file: No such file' out || { cat out; fail "absolute path error"; }
echo "ok: namelist lookup"

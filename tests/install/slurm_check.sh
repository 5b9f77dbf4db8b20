#!/bin/bash
# A job script's --check finds its moetrain (slurm/qwen3_256gpu.sh,
# slurm/gb200_nvl72.sh and slurm/cpu_example.sh, one find_moetrain function
# copied into each, checked identical): from a built source tree (the newest
# build, an in-tree ./moetrain or an out-of-tree */moetrain) with nothing on PATH,
# the one on PATH (an installed one: module load) before it, $MOETRAIN before
# both; with none of them it says where it looked. qwen3_256gpu.sh's group listing is a summary (first three
# groups of a kind and the last) unless --verbose lists every group.
set -u
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
built=$MOETRAIN
unset MOETRAIN MOETRAIN_NAMELISTS SLURM_SUBMIT_DIR
sys_path=/usr/bin:/bin
PATH=$sys_path command -v moetrain > /dev/null && fail "a moetrain in $sys_path hides what this test checks"

# find_moetrain's text in a script
function_of() { sed -n '/^find_moetrain() {$/,/^}$/p' "$1"; }
scripts="qwen3_256gpu.sh gb200_nvl72.sh cpu_example.sh"
function_of "$MT_TOP_SRCDIR/slurm/qwen3_256gpu.sh" > "$tmp/f1"
[ "$(wc -l < "$tmp/f1")" -gt 10 ] || fail "no find_moetrain function in slurm/qwen3_256gpu.sh"
for script in $scripts; do
    function_of "$MT_TOP_SRCDIR/slurm/$script" > "$tmp/f2"
    diff "$tmp/f1" "$tmp/f2" || fail "find_moetrain differs between slurm/qwen3_256gpu.sh and slurm/$script"
    grep -q '^MOETRAIN_BIN=$(find_moetrain) || exit 2$' "$MT_TOP_SRCDIR/slurm/$script" ||
        fail "slurm/$script does not call find_moetrain"
    # every moetrain it starts is the one found
    grep -v '^ *#' "$MT_TOP_SRCDIR/slurm/$script" | sed '/^find_moetrain() {$/,/^}$/d' |
        grep -E '(^|[^/_A-Za-z"])moetrain ' && fail "slurm/$script runs a moetrain it did not find"
done

# A source tree with two out-of-tree builds: build-old's moetrain (older) must not run.
tree=$tmp/tree
mkdir -p "$tree/slurm" "$tree/build-new" "$tree/build-old" "$tmp/inst/bin" "$tmp/elsewhere"
for script in $scripts; do cp "$MT_TOP_SRCDIR/slurm/$script" "$tree/slurm/"; done
ln -s "$MT_TOP_SRCDIR/namelists" "$tree/namelists"
cp "$built" "$tree/build-new/moetrain"
printf '#!/bin/sh\necho "the older build ran" >&2; exit 9\n' > "$tree/build-old/moetrain"
chmod +x "$tree/build-old/moetrain"
touch -d '1 hour ago' "$tree/build-old/moetrain"
cd "$tree"

# run ARGS: the script, PATH without any moetrain, from the tree; out/err kept
run() { PATH=$sys_path bash slurm/qwen3_256gpu.sh "$@" > "$tmp/out" 2> "$tmp/err"; }

run --check || { cat "$tmp/out" "$tmp/err"; fail "--check from the source tree"; }
grep -q "moetrain is $tree/build-new/moetrain (the newest build in the source tree" "$tmp/err" ||
    { cat "$tmp/err"; fail "--check did not say it used build-new/moetrain"; }
grep -q 'configuration is valid for 256 processes' "$tmp/out" || fail "no validation for 256 processes"
# the summary: no kind lists more than 4 groups, tp says how many it left out
awk '/ groups? of /{ n = gsub(/\[/, "["); if (n > 4) { print; bad = 1 } } END { exit bad }' "$tmp/out" ||
    fail "a kind lists more than 4 groups without --verbose"
grep -q '^tp        128 groups of 2: \[0,1\] \[2,3\] \[4,5\] \.\.\. (124 more) \.\.\. \[254,255\]$' "$tmp/out" ||
    { grep '^tp ' "$tmp/out"; fail "the tp summary"; }
grep -q '^(--verbose lists every group)$' "$tmp/out" || fail "the summary does not point to --verbose"

run --check --verbose || { cat "$tmp/err"; fail "--check --verbose"; }
[ "$(grep '^tp ' "$tmp/out" | grep -o '\[' | wc -l)" = 128 ] || fail "--verbose does not list the 128 tp groups"
[ "$(grep '^edp ' "$tmp/out" | grep -o '\[' | wc -l)" = 32 ] || fail "--verbose does not list the 32 edp groups"
grep -q 'more)' "$tmp/out" && fail "--verbose still cuts a listing short"

# the other scripts from the same tree: the newest out-of-tree build
for check in "gb200_nvl72.sh 288" "cpu_example.sh 4"; do
    set -- $check
    PATH=$sys_path bash "slurm/$1" --check > "$tmp/out" 2> "$tmp/err" ||
        { cat "$tmp/out" "$tmp/err"; fail "$1 --check from the source tree"; }
    grep -q "moetrain is $tree/build-new/moetrain (the newest build in the source tree" "$tmp/err" ||
        { cat "$tmp/err"; fail "$1 --check did not say it used build-new/moetrain"; }
    grep -q "configuration is valid for $2 processes" "$tmp/out" || fail "$1: no validation for $2 processes"
done

# An in-tree build newer than the others is the one used
cp "$built" "$tree/moetrain"
printf '#!/bin/sh\necho "installed moetrain: $*"\n' > "$tmp/inst/bin/moetrain"
chmod +x "$tmp/inst/bin/moetrain"
for script in $scripts; do
    nml=$(sed -n 's|^NML="${MOETRAIN_NAMELISTS:-namelists}/\(.*\)"$|\1|p' "slurm/$script")
    [ -n "$nml" ] || fail "$script: no NML line"
    run() { PATH=$sys_path bash "slurm/$script" "$@" > "$tmp/out" 2> "$tmp/err"; }
    run --check || fail "$script --check with an in-tree build"
    grep -q "moetrain is $tree/moetrain " "$tmp/err" || { cat "$tmp/err"; fail "$script: the in-tree ./moetrain was not used"; }

    # Installed (on PATH) before the tree's build; $MOETRAIN before both
    PATH=$tmp/inst/bin:$sys_path bash "slurm/$script" --check > "$tmp/out" 2> "$tmp/err" ||
        fail "$script --check with moetrain on PATH"
    grep -q "^installed moetrain: --check --world-size [0-9]* namelists/$nml" "$tmp/out" ||
        { cat "$tmp/out" "$tmp/err"; fail "$script: the moetrain on PATH was not used"; }
    MOETRAIN=$tree/build-new/moetrain PATH=$tmp/inst/bin:$sys_path bash "slurm/$script" --check > "$tmp/out" 2> "$tmp/err" ||
        fail "$script --check with MOETRAIN set"
    grep -q "moetrain is $tree/build-new/moetrain (\$MOETRAIN)" "$tmp/err" ||
        { cat "$tmp/err"; fail "$script: \$MOETRAIN was not used"; }

    # Nowhere: outside a tree, nothing on PATH
    (cd "$tmp/elsewhere" && PATH=$sys_path bash "$tree/slurm/$script" --check > "$tmp/out" 2> "$tmp/err") &&
        fail "$script ran without any moetrain"
    grep -q 'no moetrain: not on PATH (module load moetrain), MOETRAIN not set, and no build in' "$tmp/err" ||
        { cat "$tmp/err"; fail "$script: the message for no moetrain"; }
done
echo "ok: qwen3_256gpu.sh, gb200_nvl72.sh and cpu_example.sh --check find the tree's build, the installed one, \$MOETRAIN (one function); summary and --verbose"

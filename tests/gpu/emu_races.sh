#!/bin/sh
# Data races in kernels, found by ThreadSanitizer through the CUDA emulator's fibers
# (tests/gpu/emu_races.cc). In a build with --enable-sanitizers=thread every racing
# case must end in TSan's data-race report naming the kernel (in a stack and in the
# emulated thread's name, block and thread) and the source line marked
# `// RACE: CASE`; every correct case must run without a report and with its results
# right. Fails if the emulator goes blind to a race, or reports one in correct code.
# Other builds cannot see races: they check the correct cases' results only, and say so.
prog="${MT_TOP_BUILDDIR:-.}/tests/gpu/emu_races"
src="${MT_TOP_SRCDIR:-.}/tests/gpu/emu_races.cc"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
# the first report ends the run; a report in correct code fails it (exit status 66);
# no second of sleep at each exit
TSAN_OPTIONS="halt_on_error=1 exitcode=66 atexit_sleep_ms=0 ${TSAN_OPTIONS:-}"
export TSAN_OPTIONS

tsan=$("$prog" --tsan) || { echo "FAIL: $prog --tsan"; exit 1; }
listed=$("$prog" --list) || { echo "FAIL: $prog --list"; exit 1; }
[ -n "$listed" ] || { echo "FAIL: $prog lists no case"; exit 1; }

failed=0 checked=0 races=0
bad() { echo "FAIL: $1: $2"; sed 's/^/    /' "$tmp/$1.err" | head -60; failed=$((failed + 1)); }

while read -r name kind; do
    [ -n "$name" ] || continue
    if [ "$kind" = races ] && [ "$tsan" != yes ]; then continue; fi
    checked=$((checked + 1))
    "$prog" "$name" > "$tmp/$name.out" 2> "$tmp/$name.err"
    status=$?
    if [ "$kind" = runs ]; then
        if grep -q 'ThreadSanitizer' "$tmp/$name.err"; then bad "$name" "TSan reports correct code"
        elif [ $status -ne 0 ]; then bad "$name" "exit status $status"
        else echo "ok: $name runs without a report"; fi
        continue
    fi
    races=$((races + 1))
    line=$(grep -n "// RACE: $name\$" "$src" | cut -d: -f1)
    [ -n "$line" ] || { bad "$name" "no line marked // RACE: $name in $src"; continue; }
    [ $status -ne 0 ] || { bad "$name" "exit status 0: no race reported"; continue; }
    grep -q '^WARNING: ThreadSanitizer: data race' "$tmp/$name.err" || { bad "$name" "no TSan data-race report"; continue; }
    # the access reported second is at the marked line, in the kernel's frame
    first=$(grep -m1 -E '^ +#0 ' "$tmp/$name.err")
    echo "$first" | grep -q "emu_races.cc:$line\\b" ||
        { bad "$name" "the report's first access is not at emu_races.cc:$line"; continue; }
    echo "$first" | grep -q '_kernel' || { bad "$name" "the report's first frame names no kernel"; continue; }
    grep -q "'block ([0-9]*,[0-9]*,[0-9]*) thread ([0-9]*,[0-9]*,[0-9]*) of [a-z_]*_kernel" "$tmp/$name.err" ||
        { bad "$name" "the emulated threads (block, thread, kernel) are not named"; continue; }
    echo "ok: $name reported: $(echo "$first" | sed 's/^ *#0 //; s/ (.*//')"
done <<EOF2
$listed
EOF2
echo "$checked cases, $failed failed"
[ $failed -eq 0 ] && [ $checked -gt 0 ] || exit 1
if [ "$tsan" != yes ]; then
    echo "races not checked: this build has no ThreadSanitizer (configure --enable-sanitizers=thread);" \
        "the correct cases' results are"
fi
exit 0

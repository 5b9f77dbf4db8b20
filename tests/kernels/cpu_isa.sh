#!/bin/sh
# The CPU kernels per x86-64 level (kernels/cpu/cpu_isa.h, doc/site-install.md "The CPU
# kernels' instruction set"):
# - every global that a level's objects define carries the level's suffix: a global
#   function added to the compute files without its name in cpu_isa.h would otherwise
#   be defined twice, and the linker would take either copy for both levels;
# - the op-by-op tests pass on every level this build has and this CPU runs, chosen with
#   MOETRAIN_CPU_ISA (each level's table is what mt_kernels_cpu returns);
# - a value that names no level, or a level not built, is refused at start naming the
#   variable and the levels there are, before anything runs;
# - the tiny model trains on each level to the losses of the default level within 1e-3
#   relative: the levels compute the same thing, only a sum's order follows the vector
#   width (a broken level's table would be far off).
set -u
b="$MT_TOP_BUILDDIR"
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
built=$("$MOETRAIN" --version | sed -n 's/.*CPU kernels: \([^,]*\), running \([^)]*\)).*/\1/p')
running=$("$MOETRAIN" --version | sed -n 's/.*CPU kernels: \([^,]*\), running \([^)]*\)).*/\2/p')
[ -n "$built" ] || fail "moetrain --version names no CPU kernel levels"
echo "levels built: $built; running by default: $running"

for lvl in v3 v4; do
    objs=$(ls "$b"/kernels/cpu/libmt_kernels_${lvl}_la-*.o 2>/dev/null)
    if [ -z "$objs" ]; then
        case " $built " in *" x86-64-$lvl "*) fail "x86-64-$lvl is built but has no objects";; esac
        continue
    fi
    # shellcheck disable=SC2086
    bad=$(nm -g --defined-only $objs | awk 'NF == 3 {print $3}' | grep -v "_${lvl}\$")
    [ -z "$bad" ] || fail "x86-64-$lvl objects define globals without the suffix _$lvl" \
        "(add them to kernels/cpu/cpu_isa.h): $bad"
    echo "x86-64-$lvl: every global suffixed _$lvl"
done

"$MOETRAIN" --version > /dev/null
MOETRAIN_CPU_ISA=x86-64-v9 "$MOETRAIN" "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" > "$tmp/bad.log" 2>&1 &&
    fail "MOETRAIN_CPU_ISA=x86-64-v9 was accepted"
grep -q "MOETRAIN_CPU_ISA=x86-64-v9 names no CPU kernel level.*one of $built" "$tmp/bad.log" ||
    { cat "$tmp/bad.log"; fail "no clear error for MOETRAIN_CPU_ISA=x86-64-v9"; }
for lvl in x86-64-v3 x86-64-v4; do
    case " $built " in *" $lvl "*) continue;; esac
    MOETRAIN_CPU_ISA=$lvl "$MOETRAIN" --check "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" > "$tmp/nb.log" 2>&1 &&
        fail "MOETRAIN_CPU_ISA=$lvl accepted by a build without it"
    grep -q "this build has the CPU kernels for $built only" "$tmp/nb.log" ||
        { cat "$tmp/nb.log"; fail "no clear error for the level $lvl this build lacks"; }
done
echo "bad MOETRAIN_CPU_ISA values refused"

# MOETRAIN_CPU_GEMM: --version names the GEMMs' kernel (moetrain's own on x86-64-v4,
# the BLAS on x86-64-v3 and with blas; a baseline built with its own -march for AVX-512
# has it too); another value is refused at start
gemms=$("$MOETRAIN" --version | sed -n 's/.*GEMMs: \([^;]*\);.*/\1/p')
case "$running:$gemms" in
"x86-64-v4:moetrain AVX-512" | "x86-64-v3:BLAS" | "baseline:BLAS" | "baseline:moetrain AVX-512") ;;
*) fail "--version says GEMMs: '$gemms' running $running" ;;
esac
MOETRAIN_CPU_GEMM=blas "$MOETRAIN" --version | grep -q "GEMMs: BLAS;" ||
    fail "MOETRAIN_CPU_GEMM=blas: --version does not say GEMMs: BLAS"
MOETRAIN_CPU_GEMM=mkl "$MOETRAIN" --check "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" > "$tmp/g.log" 2>&1 &&
    fail "MOETRAIN_CPU_GEMM=mkl was accepted"
grep -q "MOETRAIN_CPU_GEMM=mkl: use auto .* or blas" "$tmp/g.log" ||
    { cat "$tmp/g.log"; fail "no clear error for MOETRAIN_CPU_GEMM=mkl"; }
echo "GEMMs: $gemms; MOETRAIN_CPU_GEMM=blas takes the BLAS, a bad value is refused"

# the levels this CPU runs: those MOETRAIN_CPU_ISA is accepted for
runs=""
for lvl in $built; do
    MOETRAIN_CPU_ISA=$lvl "$MOETRAIN" --version | grep -q "running $lvl)" && runs="$runs $lvl"
done
echo "levels this CPU runs:$runs"
for lvl in $runs; do
    for t in test_ops_fd test_bf16 test_attention test_guard test_quant; do
        MOETRAIN_CPU_ISA=$lvl CMOCKA_MESSAGE_OUTPUT=stdout "$b/tests/kernels/$t" > "$tmp/$t.$lvl.log" 2>&1 ||
            { tail -20 "$tmp/$t.$lvl.log"; fail "$t on $lvl"; }
    done
    echo "$lvl: the op tests pass"
done

loss() { sed -n 's/.*"loss": \([-0-9.eE+]*\).*/\1/p' "$1"; }
for lvl in $runs; do
    (cd "$tmp" && MOETRAIN_CPU_ISA=$lvl "$MOETRAIN" "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" \
        training%train_iters=30 training%eval_interval=1000 training%eval_iters=0 \
        logging%log_interval=5 "logging%metrics_file='$lvl.jsonl'" > "$lvl.log" 2>&1) ||
        { tail -5 "$tmp/$lvl.log"; fail "training on $lvl"; }
    grep -q "CPU kernels $lvl " "$tmp/$lvl.log" || fail "the log does not say the kernels ran on $lvl"
    loss "$tmp/$lvl.jsonl" > "$tmp/$lvl.loss"
    [ "$(wc -l < "$tmp/$lvl.loss")" -ge 6 ] || fail "$lvl: too few losses logged"
done
for lvl in $runs; do
    paste "$tmp/$running.loss" "$tmp/$lvl.loss" | awk -v l="$lvl" -v r="$running" '
        { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-3 * $1) { bad = 1; print "step " NR ": " $1 " on " r ", " $2 " on " l } }
        END { exit bad }' || fail "losses on $lvl are not those of $running"
    echo "$lvl: the tiny model's losses as on $running ($(tail -1 "$tmp/$lvl.loss") at the last step)"
done

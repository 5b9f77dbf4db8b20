#!/bin/sh
# The layout tests under more than one BLAS kernel. OpenBLAS (DYNAMIC_ARCH) picks its
# kernels for the CPU, and each kernel rounds the layouts' sums its own way: a routing
# decision near a tie that one kernel happens to take alike in every layout, another
# takes apart (common.sh, ROUTE_MARGIN), unless the test's reference is clear of ties,
# as every mpirun layout test's is (reference() in common.sh). make check runs
# capacity.sh and equivalence.sh, which stand for them, with the kernel OpenBLAS picks;
# this runs them again under two more,
# OPENBLAS_CORETYPE = Haswell (AVX2 and FMA), Nehalem (SSE, no FMA) or Sandybridge
# (AVX, no FMA): the first two of these that the CPU can execute (by /proc/cpuinfo)
# other than the one OpenBLAS picks. Skips without a DYNAMIC_ARCH OpenBLAS on x86-64.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
[ "$(uname -m)" = x86_64 ] || skip "OPENBLAS_CORETYPE names x86-64 kernels"
# core [TYPE]: the kernel OpenBLAS runs (under OPENBLAS_CORETYPE=TYPE)
core() {
    OPENBLAS_VERBOSE=2 OPENBLAS_CORETYPE=${1:-} "$MOETRAIN" --version 2>&1 |
        sed -n 's/^Core: *\([A-Za-z0-9]*\).*/\1/p' | head -n 1
}
default=$(core)
[ -n "$default" ] || skip "the BLAS is not an OpenBLAS that chooses its kernel at run time"
flags=$(grep -m 1 '^flags' /proc/cpuinfo)
has() { for f in "$@"; do case " $flags " in *" $f "*) ;; *) return 1 ;; esac; done; }
kernels=""
n=0
for k in Haswell Nehalem Sandybridge; do
    case $k in
    Haswell) has avx2 fma || continue ;;
    Nehalem) has sse4_2 || continue ;;
    Sandybridge) has avx || continue ;;
    esac
    [ "$k" != "$default" ] || continue
    [ "$(core $k)" = "$k" ] || fail "OPENBLAS_CORETYPE=$k: OpenBLAS runs $(core $k) instead"
    kernels="$kernels $k"
    n=$((n + 1))
    [ $n -lt 2 ] || break
done
[ -n "$kernels" ] || skip "this CPU runs none of Haswell, Nehalem, Sandybridge but OpenBLAS's pick, $default"
for k in $kernels; do
    for t in capacity equivalence; do
        echo "== $t.sh under OPENBLAS_CORETYPE=$k (OpenBLAS picks $default)"
        OPENBLAS_CORETYPE=$k sh "$MT_TOP_SRCDIR/tests/parallel/$t.sh" > "$t.$k.log" 2>&1
        rc=$?
        sed 's/^/  /' "$t.$k.log"
        [ $rc = 0 ] || fail "$t.sh fails under the $k kernel (exit status $rc)"
    done
done
echo "the layout tests pass under the kernels$kernels as under $default"

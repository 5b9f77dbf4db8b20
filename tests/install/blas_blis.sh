#!/bin/sh
# configure --with-blas=blis (doc/site-install.md, "Choosing the BLAS"): a CPU-only build
# of moetrain against BLIS, whose --version names BLIS and the kernels it picked, trains
# the tiny model to the losses the OpenBLAS build of this tree gives (the same model and
# data; only the GEMMs' summation order differs, so within 1e-3 relative, far below the
# loss's fall over the run). Both run with MOETRAIN_CPU_GEMM=blas, so that every GEMM
# goes through the BLAS also where moetrain's own kernel would take them (x86-64-v4). Skipped when BLIS is not installed (Debian: libblis-dev,
# which scripts/install-deps.sh installs).
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
cd "$tmp" || exit 1
# (Debian's headers are under /usr/include/<triplet>/blis-{openmp,pthread,serial})
have_blis=no
for h in /usr/include/blis.h /usr/include/blis/blis.h /usr/include/*/blis*/blis.h; do
    [ -r "$h" ] && have_blis=yes
done
pkg-config --exists blis 2>/dev/null && have_blis=yes
[ $have_blis = yes ] || skip "BLIS is not installed (apt-get install libblis-dev)"
mkdir build && cd build || exit 1
"$MT_TOP_SRCDIR/configure" -q --without-cuda --disable-cuda-emulation --with-blas=blis > configure.log 2>&1 ||
    { tail -20 configure.log; fail "configure --with-blas=blis"; }
grep -q 'BLAS (CPU) *yes (BLIS' configure.log || { cat configure.log; fail "configure did not say it builds with BLIS"; }
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -j2 moetrain > make.log 2>&1 || { tail -30 make.log; fail "make moetrain"; }
./moetrain --version > version.txt 2>&1 || { cat version.txt; fail "moetrain --version"; }
grep -q '^ *BLAS *BLIS *BLIS [0-9][0-9.]*; kernels: [a-z0-9_]*' version.txt ||
    { cat version.txt; fail "--version does not name BLIS and its kernels"; }
grep '^ *BLAS' version.txt
ldd ./moetrain | grep -q 'libblis' || { ldd ./moetrain; fail "moetrain is not linked with BLIS"; }
ldd ./moetrain | grep -q 'libopenblas' && { ldd ./moetrain; fail "moetrain still links OpenBLAS"; }

losses() { # losses MOETRAIN: the lm loss of each of 8 iterations of tiny_moe
    MOETRAIN_CPU_GEMM=blas MOETRAIN_DATADIR=$MT_TOP_BUILDDIR OMP_NUM_THREADS=2 "$1" \
        "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" \
        training%train_iters=8 optimizer%lr_warmup_iters=2 logging%log_interval=1 training%eval_interval=100 \
        > run.log 2>&1 || { tail -5 run.log; fail "$1: training failed"; }
    sed -n 's/^ iteration .*| lm loss: \([^ ]*\) .*/\1/p' run.log
}
losses ./moetrain > blis.txt
losses "$MT_TOP_BUILDDIR/moetrain" > openblas.txt
[ "$(wc -l < blis.txt)" -eq 8 ] && [ "$(wc -l < openblas.txt)" -eq 8 ] || fail "expected 8 logged losses each"
paste blis.txt openblas.txt | awk '
    { d = $1 - $2; if (d < 0) d = -d; r = d / $2; if (r > worst) worst = r; print "iteration " NR ": BLIS " $1 ", OpenBLAS " $2 }
    NR == 1 { first = $1 } END { last = $1
        printf "largest relative difference %.2e (bound 1e-3); loss %s -> %s\n", worst, first, last
        exit !(worst <= 1e-3 && last < first - 0.5) }' || fail "BLIS training does not match OpenBLAS's"
echo "PASS: moetrain built with BLIS trains as with OpenBLAS"

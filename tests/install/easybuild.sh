#!/bin/bash
# contrib/easybuild/moetrain-0.1.0.eb, used by EasyBuild itself: the release
# tarball (what `make dist` packs) built and installed by `eb` with the SYSTEM
# toolchain, its OS dependencies checked by eb, then the module eb wrote loaded
# (Lmod) and the installed binary run: --version, and --check of a shipped
# namelist by name from the source tree and from $MOETRAIN_NAMELISTS.
# The CUDA dependency is filtered out (eb --filter-deps=CUDA): the build is
# CPU-only, to keep this test minutes long and runnable without a CUDA module
# tree; the easyconfig then passes --with-cuda=no to configure.
# EasyBuild is a test tool here, not a dependency: `eb` from PATH, else
# installed from PyPI into a scratch venv; skips (77) when neither works or
# there is no Lmod. MT_EB_KEEP=DIR keeps eb's log there.
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
cd "$tmp"
ec=$MT_TOP_SRCDIR/contrib/easybuild/moetrain-0.1.0.eb
version=$(sed -n 's/^VERSION = //p' "$MT_TOP_BUILDDIR/Makefile")
grep -q "^version = '$version'" "$ec" || fail "$ec is not for version $version"

lmod_init=${LMOD_PKG:-/usr/share/lmod/lmod}/init/bash
[ -r "$lmod_init" ] || lmod_init=/usr/share/lmod/lmod/init/bash
[ -r "$lmod_init" ] || skip "no Lmod (EasyBuild needs a modules tool)"
unset MODULEPATH LOADEDMODULES _LMFILES_
. "$lmod_init" || fail "$lmod_init"

if ! command -v eb > /dev/null 2>&1; then
    python3 -m venv "$tmp/venv" > venv.log 2>&1 &&
        timeout 600 "$tmp/venv/bin/pip" install -q --disable-pip-version-check easybuild >> venv.log 2>&1 ||
        { cat venv.log; skip "EasyBuild could not be installed from PyPI (above)"; }
    PATH=$tmp/venv/bin:$PATH
fi
eb --version || fail "eb --version"

# The release tarball, as make dist makes it.
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$MT_TOP_BUILDDIR" distdir distdir="$tmp/moetrain-$version" > dist.log 2>&1 ||
    { cat dist.log; fail "make distdir"; }
mkdir -p src/m/moetrain && tar -czf "src/m/moetrain/moetrain-$version.tar.gz" "moetrain-$version" || fail "tar"
rm -rf "moetrain-$version"

# eb refuses root unless told (a test machine's CI runs as root).
as_root=
[ "$(id -u)" -ne 0 ] || as_root=--allow-use-as-root-and-accept-consequences
timeout 1800 eb "$ec" $as_root --sourcepath="$tmp/src" --prefix="$tmp/eb" --tmpdir="$tmp/ebtmp" \
    --filter-deps=CUDA --modules-tool=Lmod --module-syntax=Lua --parallel=2 --detect-loaded-modules=ignore \
    > eb.out 2>&1 || { tail -40 eb.out; for l in $(find "$tmp" -name 'easybuild-moetrain-*.log' 2>/dev/null); do tail -60 "$l"; done; fail "eb"; }
[ -z "${MT_EB_KEEP:-}" ] || cp eb.out $(find "$tmp/eb" -name 'easybuild-moetrain-*.log*') "$MT_EB_KEEP"/ 2>/dev/null
grep -q 'COMPLETED: Installation ended successfully' eb.out || { cat eb.out; fail "eb did not report success"; }
echo "ok: eb built and installed moetrain $version (SYSTEM toolchain, OS dependencies checked)"

module use "$tmp/eb/modules/all"
module load "moetrain/$version" || fail "module load moetrain/$version (EasyBuild's module)"
[ "$(command -v moetrain)" = "$tmp/eb/software/moetrain/$version/bin/moetrain" ] ||
    fail "moetrain on PATH is $(command -v moetrain)"
moetrain --version > version.out 2>&1 || { cat version.out; fail "installed moetrain --version"; }
grep -q "$version" version.out || { cat version.out; fail "--version does not name $version"; }
(cd "$MT_TOP_SRCDIR" && moetrain --check namelists/tiny_moe.nml) > check.out 2>&1 ||
    { cat check.out; fail "installed moetrain --check namelists/tiny_moe.nml"; }
moetrain --check "$MOETRAIN_NAMELISTS/tiny_moe.nml" > check2.out 2>&1 || { cat check2.out; fail "--check \$MOETRAIN_NAMELISTS/tiny_moe.nml"; }
grep -q 'configuration is valid' check.out || { cat check.out; fail "--check output"; }
echo "ok: the installed moetrain runs --version and --check namelists/tiny_moe.nml"

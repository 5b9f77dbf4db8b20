#!/bin/bash
# The installed module files, loaded for real: `make install prefix=<scratch>` with
# two made-up site modules as prerequisites (MODULE_PREREQS, what configure
# --with-module-prereqs sets), then moetrain/<version> loaded by Lmod (the .lua)
# and by Environment Modules (the Tcl file). Each must load the prerequisites,
# put the installed moetrain first on PATH and its pages on MANPATH without
# hiding the system's (MANPATH unset before: man-db's own path must still
# apply), set MOETRAIN_NAMELISTS to the installed configurations, show its help
# text, run `moetrain --version` and --check a shipped namelist, and undo all
# of it on unload. Skips (77) only when neither tool is on this machine.
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
version=$(sed -n 's/^VERSION = //p' "$MT_TOP_BUILDDIR/Makefile")
inst=$tmp/inst
site=$tmp/site
cd "$tmp"

env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$MT_TOP_BUILDDIR" install prefix="$inst" \
    MODULE_PREREQS="mt-cuda/13.0 mt-mpi/4.1" > install.log 2>&1 || { cat install.log; fail "make install"; }
mods=$inst/share/moetrain/modulefiles
[ -f "$mods/moetrain/$version.lua" ] && [ -f "$mods/moetrain/$version" ] ||
    { find "$inst" -path '*modulefiles*'; fail "make install wrote no moetrain/$version{,.lua}"; }

# The site's modules for the prerequisites, in both languages.
for m in mt-cuda/13.0 mt-mpi/4.1; do
    var=MT_TEST_$(echo "${m%%/*}" | tr a-z- A-Z_)
    mkdir -p "$site/${m%%/*}"
    printf 'setenv("%s", "%s")\n' "$var" "${m#*/}" > "$site/$m.lua"
    printf '#%%Module1.0\nsetenv %s %s\n' "$var" "${m#*/}" > "$site/$m"
done

# checks TOOL: in a shell where `module` is TOOL's and MANPATH is unset, load
# moetrain and check the environment it makes, then unload it.
checks() {
    tool=$1
    module load moetrain > load.out 2>&1 || { cat load.out; fail "$tool: module load moetrain"; }
    [ "${PATH%%:*}" = "$inst/bin" ] || fail "$tool: PATH starts with ${PATH%%:*}, not $inst/bin"
    [ "$(command -v moetrain)" = "$inst/bin/moetrain" ] || fail "$tool: moetrain on PATH is $(command -v moetrain)"
    [ "${MANPATH%%:*}" = "$inst/share/man" ] || fail "$tool: MANPATH='$MANPATH' does not start with $inst/share/man"
    case ":$MANPATH:" in *::*) ;; *) fail "$tool: MANPATH='$MANPATH' has no empty entry: the system's manual pages are hidden" ;; esac
    if command -v manpath > /dev/null 2>&1; then
        mp=$(manpath 2> /dev/null)
        case ":$mp:" in *":$inst/share/man:"*) ;; *) fail "$tool: manpath '$mp' lacks $inst/share/man" ;; esac
        case ":$mp:" in *:/usr/share/man:*) ;; *) fail "$tool: manpath '$mp' lacks the system's /usr/share/man" ;; esac
        [ "$(man -w moetrain 2> /dev/null)" = "$inst/share/man/man1/moetrain.1" ] ||
            fail "$tool: man -w moetrain gives '$(man -w moetrain 2>&1)'"
        echo "ok: $tool: manpath $mp"
    fi
    [ "$MOETRAIN_NAMELISTS" = "$inst/share/moetrain/namelists" ] && [ -f "$MOETRAIN_NAMELISTS/tiny_moe.nml" ] ||
        fail "$tool: MOETRAIN_NAMELISTS='$MOETRAIN_NAMELISTS'"
    [ "$MOETRAIN_ROOT" = "$inst" ] && [ "$MOETRAIN_DATADIR" = "$inst/share/moetrain" ] ||
        fail "$tool: MOETRAIN_ROOT='$MOETRAIN_ROOT' MOETRAIN_DATADIR='$MOETRAIN_DATADIR'"
    [ "${MT_TEST_MT_CUDA:-}" = 13.0 ] && [ "${MT_TEST_MT_MPI:-}" = 4.1 ] ||
        { cat load.out; fail "$tool: the prerequisite modules were not loaded"; }
    module help moetrain > help.out 2>&1 || { cat help.out; fail "$tool: module help moetrain"; }
    for s in "moetrain $version: a Mixture-of-Experts" 'moetrain --check $MOETRAIN_NAMELISTS/tiny_moe.nml' \
             'man moetrain' 'Site modules loaded with it: mt-cuda/13.0 mt-mpi/4.1'; do
        grep -qF -- "$s" help.out || { cat help.out; fail "$tool: module help lacks '$s'"; }
    done
    moetrain --version > version.out 2>&1 || { cat version.out; fail "$tool: moetrain --version"; }
    grep -q "$version" version.out || { cat version.out; fail "$tool: --version does not name $version"; }
    moetrain --check "$MOETRAIN_NAMELISTS/tiny_moe.nml" > check.out 2>&1 ||
        { cat check.out; fail "$tool: moetrain --check \$MOETRAIN_NAMELISTS/tiny_moe.nml"; }
    module unload moetrain > unload.out 2>&1 || { cat unload.out; fail "$tool: module unload"; }
    [ -z "${MANPATH:-}" ] || fail "$tool: MANPATH='$MANPATH' after unload (was unset)"
    case ":$PATH:" in *":$inst/bin:"*) fail "$tool: $inst/bin left on PATH by unload: $PATH" ;; esac
    [ -z "${MOETRAIN_NAMELISTS:-}${MT_TEST_MT_CUDA:-}" ] || fail "$tool: variables left after unload"
    echo "ok: $tool: module load moetrain/$version (help, PATH, MANPATH, MOETRAIN_NAMELISTS, prerequisites, --version, --check), unload"
}

tools=0

# Lmod, reading moetrain/<version>.lua (it takes the .lua of the two files).
lmod_init=${LMOD_PKG:-/usr/share/lmod/lmod}/init/bash
[ -r "$lmod_init" ] || lmod_init=/usr/share/lmod/lmod/init/bash
if [ -r "$lmod_init" ]; then
    (
        unset MANPATH LOADEDMODULES _LMFILES_ MODULESHOME
        . "$lmod_init" || fail "Lmod: $lmod_init"
        export MODULEPATH=$mods:$site
        module --redirect show moetrain 2>&1 | grep -qF "$mods/moetrain/$version.lua" ||
            { module --redirect show moetrain; fail "Lmod: does not read moetrain/$version.lua"; }
        checks Lmod
        # MANPATH set before: the module's pages first, the user's kept.
        export MANPATH=/opt/site/man
        module load moetrain > /dev/null 2>&1 && [ "${MANPATH%%:*}" = "$inst/share/man" ] &&
            case ":$MANPATH:" in *:/opt/site/man:*) true ;; *) false ;; esac ||
            fail "Lmod: MANPATH set before: '$MANPATH'"
        module unload moetrain > /dev/null 2>&1 && [ "$MANPATH" = /opt/site/man ] ||
            fail "Lmod: MANPATH not restored to /opt/site/man: '$MANPATH'"
        echo "ok: Lmod: MANPATH set before is kept and restored"
    ) || exit 1
    tools=$((tools + 1))
else
    echo "no Lmod here ($lmod_init)"
fi

# Environment Modules, reading the Tcl file moetrain/<version>. Debian's package
# conflicts with lmod; scripts/install-deps.sh unpacks it under /opt/environment-modules.
modulecmd=${MT_MODULECMD_TCL:-}
for m in /usr/lib/*/modulecmd.tcl /usr/share/modules/libexec/modulecmd.tcl \
         /opt/environment-modules/usr/lib/*/modulecmd.tcl; do
    [ -z "$modulecmd" ] && [ -r "$m" ] && modulecmd=$m
done
if [ -n "$modulecmd" ] && command -v tclsh > /dev/null 2>&1; then
    (
        unset MANPATH LOADEDMODULES _LMFILES_ MODULESHOME
        unset -f module ml 2> /dev/null
        module() { eval "$(tclsh "$modulecmd" bash "$@")"; }
        export MODULEPATH=$mods:$site
        module --version 2>&1 | grep -q '^Modules Release' || fail "$modulecmd is not Environment Modules"
        module show moetrain 2>&1 | grep -qF "$mods/moetrain/$version:" ||
            { module show moetrain; fail "Environment Modules: does not read moetrain/$version"; }
        checks "Environment Modules $(module --version 2>&1 | awk '{print $3}')"
    ) || exit 1
    tools=$((tools + 1))
else
    echo "no Environment Modules here (modulecmd.tcl and tclsh; scripts/install-deps.sh unpacks it)"
fi

[ $tools -gt 0 ] || skip "neither Lmod nor Environment Modules is installed"

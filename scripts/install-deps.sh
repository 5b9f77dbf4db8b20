#!/bin/sh
# Installs every Debian 12 package moetrain needs to build, test and run.
# Idempotent; run as root (or through sudo).
set -eu
PKGS="build-essential autoconf automake libtool pkg-config
      libhwloc-dev hwloc libnuma-dev libpmix-dev libopenmpi-dev openmpi-bin
      libopenblas-dev libblis-dev libcmocka-dev gfortran clang libclang-rt-14-dev
      python3 python3-pip python3-venv munge slurmctld slurmd slurm-client lmod tcl"
export DEBIAN_FRONTEND=noninteractive
if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps.sh: run as root (sudo $0)" >&2
    exit 1
fi
missing=""
for p in $PKGS; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
    apt-get update -q
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $missing
fi
# Environment Modules, the tests' second module tool (tests/install/modules.sh
# loads the Tcl module file with it), conflicts with lmod as a Debian package:
# unpacked, not installed, under /opt/environment-modules (run with tclsh; the
# login shells keep Lmod).
em=/opt/environment-modules
if ! ls "$em"/usr/lib/*/modulecmd.tcl > /dev/null 2>&1; then
    d=$(mktemp -d)
    (cd "$d" && apt-get download -q environment-modules) &&
        mkdir -p "$em" && dpkg-deb -x "$d"/environment-modules_*.deb "$em"
    rc=$?
    rm -rf "$d"
    [ $rc -eq 0 ] || { echo "install-deps.sh: could not unpack environment-modules into $em" >&2; exit 1; }
fi
echo "install-deps.sh: all packages present"

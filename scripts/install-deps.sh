#!/bin/sh
# Installs every Debian 12 package moetrain needs to build, test and run.
# Idempotent; run as root (or through sudo).
set -eu
PKGS="build-essential autoconf automake libtool pkg-config
      libhwloc-dev hwloc libnuma-dev libpmix-dev libopenmpi-dev openmpi-bin
      libopenblas-dev libcmocka-dev gfortran clang libclang-rt-14-dev
      python3 python3-pip python3-venv munge slurmctld slurmd slurm-client lmod"
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
echo "install-deps.sh: all packages present"

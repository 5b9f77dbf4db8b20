# Shared by the runtime and Slurm tests (sourced): helpers, what the build has,
# a scratch directory removed on exit (add more with `cleanup CMD`).
set -u
fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
. "$MT_TOP_BUILDDIR/tests/runtime/build.env"
tmp=$(mktemp -d) || exit 1
cleanups="rm -rf '$tmp'"
cleanup() { cleanups="$1; $cleanups"; }
trap 'eval "$cleanups"' EXIT

# In a sanitizer build: MPI and PMIx leak by design (tests/runtime/lsan.supp);
# full stacks so that a leak is attributed to the library that made it.
LSAN_OPTIONS="suppressions=$MT_TOP_SRCDIR/tests/runtime/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
ASAN_OPTIONS="fast_unwind_on_malloc=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS ASAN_OPTIONS

# The test programs run under names of their own (symlinks), so a check for
# leftover processes sees this test's processes only, even under make -j.
# own NAME PROGRAM: prints the path of a link NAME to PROGRAM
own() { ln -s "$2" "$tmp/$1" && echo "$tmp/$1"; }
# alive NAME: pids of live (not zombie) processes named NAME
alive() { ps -eo stat=,pid=,comm= | awk -v n="$1" '$1 !~ /^Z/ && $3 == n { print $2 }'; }
# nothing_left NAME: fails if a process named NAME is still running
nothing_left() {
    i=0
    while [ -n "$(alive "$1")" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    [ -z "$(alive "$1")" ] || { ps -ef | grep "$1" >&2; fail "processes named $1 were left running"; }
}

# OpenMPI's mpirun, as root, with more ranks than cores. have_mpirun: whether
# this build and host can run multi-process tests (why not: in $why).
have_mpirun() {
    why=""
    if [ "$MT_HAVE_MPI" != yes ] || [ "$MT_HAVE_PMIX" != yes ]; then
        why="built without MPI or PMIx"
    elif [ -z "$MPIRUN" ] || [ ! -x "$MPIRUN" ]; then
        why="configure found no mpirun"
    elif ! "$MPIRUN" --version 2>&1 | grep -q 'Open MPI'; then
        why="$MPIRUN is not OpenMPI's"
    fi
    OMPI_ALLOW_RUN_AS_ROOT=1; OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
    [ -z "$why" ]
}
need_mpirun() { have_mpirun || skip "$why"; }
# mpirun_np N PROGRAM ARGS...: bounded, so a hang fails the test instead
mpirun_np() { n=$1; shift; timeout 120 "$MPIRUN" --oversubscribe -np "$n" "$@"; }
# count PATTERN FILE: lines of FILE matching PATTERN (fixed string)
count() { grep -cF -- "$1" "$2"; }

# start_slurm_cluster [NODES]: starts the local Slurm cluster of tests/slurm/cluster.sh
# (NODES nodes, else its default) under $tmp/cluster, stopped on exit; puts its
# environment in this shell and OpenMPI on TCP over loopback (emulated nodes of one
# host). Skips (77) when the build lacks MPI or PMIx, when Slurm cannot run here, or
# when srun has no pmix plugin. Sets cluster (the script) and dir (the cluster's state).
start_slurm_cluster() {
    [ "$MT_HAVE_MPI" = yes ] && [ "$MT_HAVE_PMIX" = yes ] || skip "built without MPI or PMIx"
    command -v srun > /dev/null 2>&1 || skip "no srun"
    cluster="$MT_TOP_SRCDIR/tests/slurm/cluster.sh"
    dir="$tmp/cluster"
    if [ -n "${1:-}" ]; then
        MT_SLURM_NODES=$1 sh "$cluster" start "$dir"
    else
        sh "$cluster" start "$dir"
    fi
    rc=$?
    [ $rc -eq 77 ] && skip "no Slurm cluster here (see above)"
    [ $rc -eq 0 ] || fail "cluster.sh start"
    cleanup "[ -d '$dir' ] && sh '$cluster' stop '$dir'"
    eval "$(sh "$cluster" env "$dir")"
    srun --mpi=list 2>&1 | grep -q pmix || skip "srun has no mpi/pmix plugin"
    OMPI_MCA_btl=self,tcp
    OMPI_MCA_btl_tcp_if_include=lo
    export OMPI_MCA_btl OMPI_MCA_btl_tcp_if_include
}

# use_emulated_nccl N: runs below take the emulated NCCL (tests/runtime/emu-nccl) and N
# emulated GPUs; emu is the emulated-GPU binary, MOETRAIN_DATADIR the build's data
use_emulated_nccl() {
    emu="$MT_TOP_BUILDDIR/tests/gpu/moetrain-emu"
    LD_LIBRARY_PATH="$MT_TOP_BUILDDIR/tests/runtime/emu-nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    MT_EMU_DEVICE_COUNT=$1
    MOETRAIN_DATADIR="$MT_TOP_BUILDDIR"
    export LD_LIBRARY_PATH MT_EMU_DEVICE_COUNT MOETRAIN_DATADIR
}

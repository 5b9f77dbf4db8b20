#!/bin/sh
# Processes started by a launcher without PMIx are refused with one message
# that says how to start moetrain; --check, --print-config and --help still
# work there (they need no launcher).
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
nml="$MT_TOP_SRCDIR/tests/fixtures/train/small.nml"
cd "$tmp"

# refused VAR=VALUE...: moetrain must fail with one message naming the fix
refused() {
    env -u PMIX_NAMESPACE -u PMIX_RANK "$@" "$MOETRAIN" "$nml" > out 2> err &&
        { cat out err; fail "$*: accepted"; }
    [ "$(count 'error: ' err)" -eq 1 ] || { cat err; fail "$*: expected one message"; }
    grep -q 'srun --mpi=pmix' err || { cat err; fail "$*: the message lacks the fix"; }
    [ ! -s out ] || { cat out; fail "$*: wrote to stdout"; }
}
refused SLURM_STEP_NUM_TASKS=4 SLURM_STEP_ID=0 SLURM_NTASKS=4 SLURM_PROCID=0
refused SLURM_NTASKS=4 SLURM_PROCID=0
refused OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0
refused PMI_SIZE=2 PMI_RANK=0
# Only the launcher's rank 0 says it.
env SLURM_STEP_NUM_TASKS=4 SLURM_STEP_ID=0 SLURM_PROCID=1 "$MOETRAIN" "$nml" > out 2> err &&
    fail "rank 1 accepted"
[ ! -s err ] || { cat err; fail "rank 1 printed the launcher error too"; }
echo "ok: launches without PMIx refused"

# No launcher needed for these.
env SLURM_STEP_NUM_TASKS=4 SLURM_STEP_ID=0 SLURM_NTASKS=4 "$MOETRAIN" --check --world-size 2 "$nml" > out 2> err ||
    { cat err; fail "--check under a launcher without PMIx"; }
grep -q 'valid for 2 processes' out || fail "--check output"
env SLURM_NTASKS=4 "$MOETRAIN" --print-config "$nml" > out 2> err || fail "--print-config"
env SLURM_NTASKS=4 "$MOETRAIN" --help > out 2> err || fail "--help"
echo "ok: --check, --print-config, --help need no launcher"

# A real mpirun whose processes lose their PMIx environment.
have_mpirun || { echo "not with mpirun: $why"; exit 0; }
mpirun_np 2 env -u PMIX_NAMESPACE -u PMIX_RANK "$MOETRAIN" "$nml" > out 2> err &&
    { cat out err; fail "mpirun without PMIx: accepted"; }
[ "$(count 'moetrain: error: mpirun started 2 processes' err)" -eq 1 ] ||
    { cat err; fail "mpirun without PMIx: expected the message once"; }
echo "ok: mpirun without PMIx refused once"

#!/bin/bash
# The tiny MoE model on CPUs only: 4 processes on 2 nodes, any x86 or Arm
# cluster, no GPU. A first multi-node run, and a check that moetrain, PMIx and
# MPI work together at your site before a GPU job.
#
#   sbatch slurm/cpu_example.sh [group%key=value ...]     under Slurm (srun --mpi=pmix)
#   bash slurm/cpu_example.sh --mpirun HOSTFILE [group%key=value ...]
#                                   without Slurm: OpenMPI's mpirun over the
#                                   hosts of HOSTFILE ('host slots=2' lines)
#   bash slurm/cpu_example.sh --check [group%key=value ...]
#                                   validate the layout for 4 processes
#
# Submit from the moetrain source tree, or after `module load moetrain` (which
# sets MOETRAIN_NAMELISTS). The moetrain it runs: $MOETRAIN if set, else the one
# on PATH (the installed one once the module is loaded), else the build in the
# source tree it is run or submitted from (./moetrain, or the newest
# */moetrain of an out-of-tree build); it says which. The run trains for 20
# iterations on the bundled corpus (a few minutes) and writes
# tiny_moe_metrics.jsonl in the working directory.
#
# Layout: TP 2 (with sequence parallelism) x DP 2; experts ETP 1 x EP 2 x EDP 2;
# global batch 16 = micro 4 x DP 2 x 2 micro-batches. The process count comes
# from the #SBATCH lines below, which --check and --mpirun read too.
#
#SBATCH --job-name=moetrain-cpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=00:20:00
#SBATCH --output=%x-%j.out

set -euo pipefail

# sbatch_value OPTION: the value of this script's '#SBATCH --OPTION=N' line
sbatch_value() { sed -n "s/^#SBATCH --$1=\([0-9][0-9]*\)\$/\1/p" "$0"; }
NP=$(( $(sbatch_value nodes) * $(sbatch_value ntasks-per-node) ))
NML="${MOETRAIN_NAMELISTS:-namelists}/tiny_moe.nml"

# find_moetrain: prints the moetrain to run and says on stderr which it is.
# slurm/qwen3_256gpu.sh, slurm/gb200_nvl72.sh and slurm/cpu_example.sh hold the
# same function (tests/install/slurm_check.sh checks that the copies are
# identical): sbatch sends Slurm only the script itself, which runs from a copy
# in slurmd's spool directory, so a helper file beside it cannot be sourced.
find_moetrain() {
    local top=${SLURM_SUBMIT_DIR:-$PWD} bin= b
    if [ -n "${MOETRAIN:-}" ]; then
        bin=$MOETRAIN why='$MOETRAIN'
    elif bin=$(command -v moetrain); then
        why="on PATH"
    elif [ -f "$top/namelists/${NML##*/}" ]; then
        bin=
        for b in "$top/moetrain" "$top"/*/moetrain; do
            [ -f "$b" ] && [ -x "$b" ] || continue
            if [ -z "$bin" ] || [ "$b" -nt "$bin" ]; then bin=$b; fi
        done
        why="the newest build in the source tree $top"
    fi
    if [ -z "$bin" ]; then
        echo "$0: no moetrain: not on PATH (module load moetrain), MOETRAIN not set, and no build in" \
             "$top (run from a built source tree: ./configure && make)" >&2
        return 1
    fi
    echo "$0: moetrain is $bin ($why)" >&2
    echo "$bin"
}
MOETRAIN_BIN=$(find_moetrain) || exit 2

RUN=(
    parallel%tensor_model_parallel_size=2
    parallel%sequence_parallel=.true.
    parallel%expert_model_parallel_size=2
    parallel%expert_tensor_parallel_size=1
    parallel%distributed_timeout_minutes=5
    training%micro_batch_size=4
    training%train_iters=20
    optimizer%lr_warmup_iters=5
    training%eval_interval=20
    logging%log_interval=5
    "host%cpu_affinity='none'"
)

# One OpenMP thread per core of the task.
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}

case ${1:-} in
--check)
    shift
    exec "$MOETRAIN_BIN" --check --world-size "$NP" "$NML" "${RUN[@]}" "$@" ;;
--mpirun)
    [ $# -ge 2 ] && [ -r "$2" ] || { echo "usage: $0 --mpirun HOSTFILE [group%key=value ...]" >&2; exit 2; }
    hostfile=$2
    shift 2
    exec mpirun --hostfile "$hostfile" -np "$NP" -x OMP_NUM_THREADS \
        "$MOETRAIN_BIN" "$NML" "${RUN[@]}" "$@" ;;
esac

[ -n "${SLURM_JOB_ID:-}" ] || { echo "$0: submit with sbatch, or use --mpirun HOSTFILE or --check" >&2; exit 2; }
srun --mpi=pmix --kill-on-bad-exit=1 "$MOETRAIN_BIN" "$NML" "${RUN[@]}" "$@"

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
# Submit from the moetrain source tree, or after `module load moetrain`. The
# run trains for 20 iterations on the bundled corpus (a few minutes) and
# writes tiny_moe_metrics.jsonl in the working directory.
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
    exec moetrain --check --world-size "$NP" "$NML" "${RUN[@]}" "$@" ;;
--mpirun)
    [ $# -ge 2 ] && [ -r "$2" ] || { echo "usage: $0 --mpirun HOSTFILE [group%key=value ...]" >&2; exit 2; }
    hostfile=$2
    shift 2
    exec mpirun --hostfile "$hostfile" -np "$NP" -x OMP_NUM_THREADS \
        moetrain "$NML" "${RUN[@]}" "$@" ;;
esac

[ -n "${SLURM_JOB_ID:-}" ] || { echo "$0: submit with sbatch, or use --mpirun HOSTFILE or --check" >&2; exit 2; }
srun --mpi=pmix --kill-on-bad-exit=1 moetrain "$NML" "${RUN[@]}" "$@"

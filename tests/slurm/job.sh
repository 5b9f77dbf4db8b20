#!/bin/sh
# The batch job tests/slurm/srun_pmix.sh submits with `sbatch --wait`: one
# multi-node step of the program given as arguments, started with PMIx.
#SBATCH --job-name=mt-comm-check
#SBATCH --nodes=2
#SBATCH --ntasks=4
#SBATCH --overcommit
#SBATCH --time=2
echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"
exec srun --mpi=pmix "$@"

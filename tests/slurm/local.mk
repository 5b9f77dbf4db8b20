# The CPU example job script, on a local Slurm cluster (tests/slurm/cluster.sh).
# The GPU job scripts' test, tests/slurm/sbatch_script.sh, is listed with the
# runtime's tests (src/runtime/local.mk).
TESTS += tests/slurm/cpu_example.sh
EXTRA_DIST += tests/slurm/cpu_example.sh
tests/slurm/cpu_example.log: tests/runtime/build.env
# one local cluster at a time (tests/local.mk)
tests/slurm/cpu_example.log: tests/parallel/srun.log

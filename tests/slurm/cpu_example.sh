#!/bin/bash
# slurm/cpu_example.sh, the example that runs anywhere, run as a user would:
# its --check mode; `sbatch` of the script on a local Slurm cluster (two
# emulated nodes, srun --mpi=pmix), which must train on 4 processes over 2
# nodes and evaluate; and its `mpirun --hostfile` form. Training is cut to 4
# iterations by overrides on the command line, which the script passes on.
# Each form finds its moetrain another way (find_moetrain): --check through
# $MOETRAIN; mpirun, outside any source tree, on PATH with $MOETRAIN_NAMELISTS
# (as after `module load moetrain`); sbatch, with neither, from the source tree
# it is submitted from, which only the submit directory tells the job (Slurm
# runs a spool copy of the script).
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
script=$MT_TOP_SRCDIR/slurm/cpu_example.sh
bash -n "$script" || fail "bash -n"
cd "$tmp"
mkdir bin && ln -s "$MOETRAIN" bin/moetrain
built=$MOETRAIN
PATH=$tmp/bin:$PATH
MOETRAIN_NAMELISTS=$MT_TOP_SRCDIR/namelists
export PATH MOETRAIN_NAMELISTS
short=(training%train_iters=4 optimizer%lr_warmup_iters=1 training%eval_interval=4 logging%log_interval=2)

# trained FILE WHAT: FILE shows 4 processes (the launcher named by WHAT) that
# trained 4 iterations and evaluated
trained() {
    grep -q "moetrain: launcher $2, 4 processes" "$1" &&
        grep -q 'training done: 4 iterations' "$1" &&
        grep -q 'validation loss at iteration 4' "$1" || { cat "$1"; fail "$2: the run did not train and evaluate"; }
}

bash "$script" --check > check.out 2>&1 || { cat check.out; fail "--check"; }
grep -q 'valid for 4 processes' check.out || { cat check.out; fail "--check output"; }
grep -qF "moetrain is $built (\$MOETRAIN)" check.out || { cat check.out; fail "--check: not \$MOETRAIN"; }
echo "ok: --check for 4 processes"

bash "$script" > nojob.out 2>&1 && fail "ran without sbatch, --mpirun or --check"
grep -q 'submit with sbatch' nojob.out || { cat nojob.out; fail "no usage message outside a job"; }

# mpirun --hostfile (the CPU runtime needs OpenMPI's mpirun and PMIx)
if have_mpirun; then
    PATH=$(dirname "$MPIRUN"):$PATH
    echo "localhost slots=4" > hosts
    mkdir mpirun && (cd mpirun && unset MOETRAIN && timeout 300 bash "$script" --mpirun ../hosts "${short[@]}") \
        > mpirun.out 2>&1 || { cat mpirun.out; fail "--mpirun hosts"; }
    trained mpirun.out "pmix (mpirun)"
    grep -qF "moetrain is $tmp/bin/moetrain (on PATH)" mpirun.out || { cat mpirun.out; fail "--mpirun: not the moetrain on PATH"; }
    [ -s mpirun/tiny_moe_metrics.jsonl ] || fail "--mpirun: no metrics file in the working directory"
    echo "ok: mpirun --hostfile form trained 4 processes"
else
    echo "mpirun form not run: $why"
fi

# sbatch on the local cluster: srun --mpi=pmix over 2 nodes, submitted from a built
# source tree (its namelists, an out-of-tree build), nothing on PATH or in $MOETRAIN
start_slurm_cluster 2
sys_path=$(dirname "$(command -v sbatch)"):$(dirname "$(command -v srun)"):/usr/bin:/bin
PATH=$sys_path command -v moetrain > /dev/null && fail "a moetrain on PATH ($sys_path) hides what this test checks"
tree=$tmp/tree
mkdir -p "$tree/build" && ln -s "$MT_TOP_SRCDIR/namelists" "$tree/namelists" && ln -s "$built" "$tree/build/moetrain"
cd "$tree"
(unset MOETRAIN MOETRAIN_NAMELISTS && PATH=$sys_path timeout 600 sbatch --wait --output="$tmp/job.out" "$script" "${short[@]}") \
    > sbatch.out 2>&1 || { cat sbatch.out "$tmp/job.out"; fail "sbatch --wait slurm/cpu_example.sh"; }
trained "$tmp/job.out" "pmix (slurm)"
grep -q '4 processes on 2 nodes' "$tmp/job.out" || { cat "$tmp/job.out"; fail "sbatch: not 2 nodes"; }
grep -qF "moetrain is $tree/build/moetrain (the newest build in the source tree $tree)" "$tmp/job.out" ||
    { cat "$tmp/job.out"; fail "sbatch: not the build of the tree it was submitted from"; }
[ -s tiny_moe_metrics.jsonl ] || fail "sbatch: no metrics file in the submit directory"
echo "ok: sbatch slurm/cpu_example.sh from a source tree trained 4 processes on 2 nodes with the tree's build"

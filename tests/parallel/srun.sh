#!/bin/sh
# Layout equivalence under Slurm (doc/architecture.md, section 5): on a local cluster this test
# starts (tests/slurm/cluster.sh), a folded layout (TP 2 with SP, EP 2, ZeRO-1) run
# submitted with `sbatch --wait` as a batch job whose step runs `srun --mpi=pmix` over
# two emulated nodes matches one process, as under mpirun, and so does a pipeline-
# parallel one (PP 2 x EP 2) whose stages talk across the nodes (tolerances:
# tests/parallel/common.sh). Skips (77) when Slurm cannot be started here.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
start_slurm_cluster 2
# launch NP PROGRAM ARGS...: a batch job (sbatch --wait) whose one step is
# srun --mpi=pmix over both nodes; prints the job's output, returns its status.
launch() {
    np=$1
    shift
    {
        echo '#!/bin/sh'
        printf 'exec srun --mpi=pmix -N 2 -n %s --overcommit' "$np"
        for a in "$@"; do
            printf " '%s'" "$(printf '%s' "$a" | sed "s/'/'\\\\''/g")"
        done
        echo
    } > "job$np.sh"
    timeout 180 sbatch --wait -N 2 -n "$np" --overcommit -o "job$np.out" "job$np.sh" > /dev/null
    rc=$?
    cat "job$np.out"
    return $rc
}

# Short runs as in equivalence.sh (common.sh, ROUTE_MARGIN): 4 steps of 8
# one-sequence micro-batches of 16 tokens, the reference's routing clear of ties.
SHORT="training%micro_batch_size=1 training%global_batch_size=8 training%seq_length=16
training%train_iters=4 training%eval_interval=4"
# shellcheck disable=SC2086 # lists of overrides
reference one $SHORT
# shellcheck disable=SC2086 # lists of overrides
run tp2_ep2_zero1_srun 4 $SHORT "$seed" $TP2 $EP2 $ETP1 $ZERO
grep -q "launcher pmix (slurm), 4 processes on 2 nodes" tp2_ep2_zero1_srun.log ||
    { cat tp2_ep2_zero1_srun.log; fail "not started by Slurm over 2 nodes"; }
same_as one tp2_ep2_zero1_srun
# pipeline stages on different nodes (1F1B, uneven stages) with EP inside each stage
# shellcheck disable=SC2086 # lists of overrides
run pp2_ep2_srun 4 $SHORT "$seed" parallel%pipeline_model_parallel_size=2 \
    parallel%decoder_first_pipeline_num_layers=1 $EP2
same_as one pp2_ep2_srun
sh "$cluster" stop "$dir" || fail "cluster.sh stop"
echo "srun --mpi=pmix matches one process"

#!/bin/sh
# The runtime under Slurm, on a local cluster this test starts (cluster.sh):
# every collective with `srun --mpi=pmix` over two emulated nodes on two
# switches, the same through `sbatch --wait` of a job script, a hung process
# ending the step through the timeout, moetrain refusing `srun --mpi=none` and
# printing a layout error once. The cluster is stopped and nothing is left
# running. Skips (77) when Slurm cannot be started here.
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
prog=$(own mt_srun "$MT_TOP_BUILDDIR/tests/runtime/comm_check")
mt=$(own mt_srun_cli "$MOETRAIN")
nml="$MT_TOP_SRCDIR/tests/fixtures/train/small.nml"
cd "$tmp"

start_slurm_cluster 4
daemons=$(cat "$dir"/*.pid "$dir"/munge/munged.pid 2>/dev/null)
# Every PMIx fence must be a barrier across nodes: OpenMPI's MPI_Init ends
# with a fence without data (cluster.sh: PMIxCollFence=ring, and why).
scontrol show config 2>/dev/null | grep -q '^PMIxCollFence *= *ring' ||
    { scontrol show config | grep -i pmix; fail "cluster.sh: PMIxCollFence is not ring"; }

# 1. srun: 4 tasks on n1 (switch s0) and n3 (switch s1).
timeout 60 srun --mpi=pmix -w n1,n3 -N 2 -n 4 --overcommit "$prog" > out 2> err ||
    { cat out err; fail "srun --mpi=pmix comm_check"; }
grep -q 'passed: .* on each of 4 processes (2 nodes, pmix (slurm))' out || { cat out err; fail "srun: no verdict"; }
for r in 0 1 2 3; do
    node=$((r / 2)); host=n$((2 * node + 1))
    grep -q "info: rank $r of 4, local $((r % 2)) of 2, node $node of 2, host $host, launcher pmix (slurm)" out ||
        { cat out; fail "srun: rank $r's line is missing or wrong"; }
done
echo "ok: srun --mpi=pmix, 4 tasks on 2 nodes"

# 2. sbatch --wait of a job script.
timeout 60 sbatch --wait --output="$tmp/job.out" "$MT_TOP_SRCDIR/tests/slurm/job.sh" "$prog" > sbatch.out 2>&1 ||
    { cat sbatch.out "$tmp/job.out"; fail "sbatch --wait"; }
grep -q 'passed: .* on each of 4 processes (2 nodes, pmix (slurm))' "$tmp/job.out" ||
    { cat "$tmp/job.out"; fail "sbatch: no verdict"; }
echo "ok: sbatch --wait job.sh"

# 3. A hung task: the others time out in 3 s, the step ends non-zero.
timeout 60 srun --mpi=pmix -N 2 -n 4 --overcommit "$prog" hang 1 3 > out 2> err &&
    { cat out err; fail "hung task: step exited 0"; }
# Rank 0 (its all_reduce with the hung rank 1) or ranks 2 and 3 (the barrier after
# theirs) time out; whichever reports first aborts the step and may kill the others
# before they print, so any of these messages, with the bound, is the right outcome.
grep -Eq 'rank [023]: (all_reduce on tp\[0\]|barrier on world) timed out: .* waited 3\.[0-9] s' err ||
    { cat err; fail "hung task: no timeout message"; }
echo "ok: a hung task ends the step"

# 4. moetrain refuses tasks without PMIx, once; a layout error is printed once.
timeout 60 srun --mpi=none -N 2 -n 2 "$mt" "$nml" > out 2> err && { cat out err; fail "--mpi=none accepted"; }
[ "$(count 'moetrain: error: srun started 2 tasks without PMIx' err)" -eq 1 ] ||
    { cat err; fail "--mpi=none: expected one message"; }
timeout 60 srun --mpi=pmix -N 2 -n 3 --overcommit "$mt" "$nml" parallel%tensor_model_parallel_size=2 > out 2> err &&
    { cat out err; fail "bad layout accepted"; }
[ "$(count 'moetrain: error: world size 3 is not divisible' err)" -eq 1 ] || { cat err; fail "layout: expected one message"; }
echo "ok: moetrain errors under srun said once"

# 5. Stop; nothing of this test may survive.
sh "$cluster" stop "$dir" || fail "cluster.sh stop"
[ ! -d "$dir" ] || fail "cluster.sh stop left $dir"
for pid in $daemons; do
    case $(ps -o stat= -p "$pid") in
    "" | Z*) ;;
    *) fail "daemon $pid is still running" ;;
    esac
done
nothing_left mt_srun
nothing_left mt_srun_cli
echo "ok: cluster stopped, nothing left running"

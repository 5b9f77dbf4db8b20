#!/bin/sh
# `moetrain topo` under mpirun on this machine: four processes discover the
# node, bind themselves and exchange their facts over the PMIx modex; rank 0
# prints one consistent plan with the bindings each process read back. Also:
# a launcher's own binding is kept, processes that disagree on the plan stop
# with one message, the domain map file is read under a launcher.
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
. "$MT_TOP_SRCDIR/tests/topo/common.sh"
need_mpirun
F="$MT_TOP_SRCDIR/tests/fixtures/topo"
mt=$(own mt_topo_mpi "$MOETRAIN")
cd "$tmp"
sizes="parallel%tensor_model_parallel_size=2 parallel%expert_model_parallel_size=2"
sizes="$sizes parallel%expert_tensor_parallel_size=1"

# 1. Four processes, JSON: every rank once, one host, bound cpus read back.
# shellcheck disable=SC2086
mpirun_np 4 "$mt" topo --json "$F/moe.nml" $sizes > plan.json 2> err ||
    { cat plan.json err; fail "mpirun -np 4 topo --json"; }
nothing_left mt_topo_mpi
check_groups plan.json || { cat plan.json; fail "groups"; }
[ "$(grep -c '"rank"' plan.json)" -eq 4 ] || { cat plan.json; fail "expected 4 processes"; }
[ "$(grep -o '"host": "[^"]*"' plan.json | sort -u | wc -l)" -eq 1 ] || fail "one host expected"
grep -q '"cpus": null' plan.json && { cat plan.json; fail "a process reported no binding"; }
allowed=$(awk '/^Cpus_allowed_list/ { print $2 }' /proc/self/status)
cpus=$(sed -n 's/.*"cpus": "\([^"]*\)".*/\1/p' plan.json | tr '\n' ' ')
if [ "$allowed" = "0-1" ]; then
    # two cores, one NUMA node: consecutive local ranks pair up on a core
    [ "$cpus" = "0 0 1 1 " ] || { cat plan.json; fail "bindings on 2 cores: '$cpus'"; }
fi
echo "ok: 4 processes, one plan, bound to: $cpus"

# 2. Text: the launcher, the node, rank 0's binding report, the summary.
# shellcheck disable=SC2086
mpirun_np 4 "$mt" topo "$F/moe.nml" $sizes > plan.txt 2> err || { cat plan.txt err; fail "text plan"; }
for want in "launcher: pmix (mpirun), 4 processes on 1 node" "process 0: cpus " \
    "placement 'nvlink': 4 processes in 1 NVLink domain"; do
    grep -qF "$want" plan.txt || { cat plan.txt; fail "text plan lacks '$want'"; }
done
if grep -q '^#define HAVE_NUMA 1' "$MT_TOP_BUILDDIR/config.h"; then
    grep -q "memory bound to NUMA node" plan.txt || { cat plan.txt; fail "no memory binding"; }
fi
echo "ok: text plan with the binding report"

# 3. mpirun binds to cores itself (2 processes, --bind-to core): kept.
if [ "$allowed" = "0-1" ]; then
    timeout 120 "$MPIRUN" -np 2 --bind-to core "$mt" topo "$F/moe.nml" > bound.txt 2> err ||
        { cat bound.txt err; fail "--bind-to core"; }
    grep -q "^process 0: cpus 0: kept the launcher's binding" bound.txt ||
        { cat bound.txt; fail "launcher binding not kept"; }
    echo "ok: a launcher's binding is kept"
fi

# 4. Processes given different layouts disagree on the plan: one message.
printf '&parallel\n  tensor_model_parallel_size = 2\n  sequence_parallel = .true.\n/\n' > tp2.nml
timeout 120 "$MPIRUN" --oversubscribe -np 2 "$mt" topo "$F/moe.nml" : \
    -np 2 "$mt" topo "$F/moe.nml" tp2.nml > out 2> err && { cat out err; fail "disagreement accepted"; }
[ "$(count 'moetrain topo: error: processes 0 and 2 computed different placements' err)" -eq 1 ] ||
    { cat err; fail "disagreement: expected one message"; }
nothing_left mt_topo_mpi
echo "ok: a plan the processes disagree on stops the job, said once"

# 5. nvlink_domain_source = 'file' under the launcher; 'nvml' fails clearly.
host=$(sed -n 's/.*"host": "\([^"]*\)".*/\1/p' plan.json | head -1)
echo "$host rack-7" > map.txt
# shellcheck disable=SC2086
mpirun_np 4 "$mt" topo --json "$F/moe.nml" $sizes topology%nvlink_domain_source="'file'" \
    topology%domain_map_file="'map.txt'" > file.json 2> err || { cat file.json err; fail "file source"; }
[ "$(grep -c '"domain": "file:rack-7"' file.json)" -eq 4 ] || { cat file.json; fail "file domains"; }
mpirun_np 2 "$mt" topo "$F/moe.nml" topology%nvlink_domain_source="'nvml'" > out 2> err &&
    { cat out err; fail "nvml source without fabric info accepted"; }
[ "$(count "nvlink_domain_source = 'nvml'" err)" -eq 1 ] || { cat err; fail "nvml: expected one message"; }
echo "ok: domain sources file and nvml under mpirun"

#!/bin/sh
# `moetrain topo` under srun --mpi=pmix on a local Slurm cluster
# (tests/slurm/cluster.sh: nodes n1..n4 on switches s0 = n1,n2 and s1 =
# n3,n4, topology/tree). Tasks are dealt round-robin (-m cyclic) over n1 and
# n3, so launch order splits every TP group across the switches: with the
# switch as the domain ('slurm' source) placement gathers each group in one
# switch, 'linear' shows the split. Bindings with --cpu-bind=none.
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
. "$MT_TOP_SRCDIR/tests/topo/common.sh"
F="$MT_TOP_SRCDIR/tests/fixtures/topo"
mt=$(own mt_topo_srun "$MOETRAIN")
cd "$tmp"

start_slurm_cluster
sizes="parallel%tensor_model_parallel_size=2 parallel%expert_model_parallel_size=2"
sizes="$sizes parallel%expert_tensor_parallel_size=1"
run() { timeout 90 srun --mpi=pmix -w n1,n3 -N 2 -n 4 -m cyclic --cpu-bind=none "$mt" topo "$@"; }

# 1. Domains from SLURM_TOPOLOGY_ADDR: the two leaf switches.
# shellcheck disable=SC2086
run --json "$F/moe.nml" $sizes topology%nvlink_domain_source="'slurm'" > slurm.json 2> err ||
    { cat slurm.json err; fail "srun topo (slurm domains)"; }
check_groups slurm.json || { cat slurm.json; fail "groups split across switches"; }
for p in 0 1 2 3; do
    node=n$((1 + 2 * (p % 2))); sw=s$((p % 2))
    grep -q "\"process\": $p, \"host\": \"$node\", \"gpu\": null, \"numa\": [0-9]*, \"cpus\": \"[0-9]" slurm.json ||
        { cat slurm.json; fail "process $p: not on $node or not bound"; }
    grep "\"process\": $p," slurm.json | grep -q "\"domain\": \"slurm:top.$sw\"" ||
        { cat slurm.json; fail "process $p: domain is not switch $sw"; }
done
echo "ok: srun -m cyclic, domains from SLURM_TOPOLOGY_ADDR, groups inside switches"

# 2. The same job with placement = 'linear': launch order splits the groups.
# shellcheck disable=SC2086
run "$F/moe.nml" $sizes topology%nvlink_domain_source="'slurm'" topology%placement="'linear'" \
    > linear.txt 2> err || { cat linear.txt err; fail "srun topo linear"; }
grep -q "groups split across domains: 2 TP x CP, 2 ETP x EP" linear.txt ||
    { cat linear.txt; fail "linear: expected the groups split"; }
grep -q "launcher: pmix (slurm), 4 processes on 2 nodes" linear.txt || { cat linear.txt; fail "launcher line"; }
echo "ok: linear placement reports the split groups"

# 3. 'host' domains are the Slurm node names (PMIx hostname), one per node.
# shellcheck disable=SC2086
run --json "$F/moe.nml" $sizes topology%nvlink_domain_source="'host'" > host.json 2> err ||
    { cat host.json err; fail "srun topo host"; }
check_groups host.json || { cat host.json; fail "host domains: groups split"; }
[ "$(grep -c '"domain": "host:n1"' host.json)" -eq 2 ] && [ "$(grep -c '"domain": "host:n3"' host.json)" -eq 2 ] ||
    { cat host.json; fail "host domains"; }
nothing_left mt_topo_srun
echo "ok: host domains under Slurm"

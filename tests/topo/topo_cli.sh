#!/bin/sh
# `moetrain topo`: dry runs on the node-file fixtures (every TP x CP and
# ETP x EP group in one domain, read back from --json), the error text for
# allocations that cannot work, besteffort and linear, 100,000 GPUs, bad
# arguments, and a live single-process run on this machine.
set -u
: "${MOETRAIN:=./moetrain}"
: "${MT_TOP_SRCDIR:=.}"
F="$MT_TOP_SRCDIR/tests/fixtures/topo"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
topo() { "$MOETRAIN" topo "$@"; }
. "$MT_TOP_SRCDIR/tests/topo/common.sh"

sizes() {
    echo "parallel%tensor_model_parallel_size=$1 parallel%expert_model_parallel_size=$2" \
        "parallel%expert_tensor_parallel_size=$3 parallel%pipeline_model_parallel_size=$4"
}

# -- four full NVL72 racks: TP 4, EP 8, PP 4 -------------------------------
# shellcheck disable=SC2046
topo --dry-run --nodes-file "$F/nvl72-4racks.nodes" --gpus-per-node 4 \
    --hwloc-xml "$F/gb200-tray.xml" --json "$F/moe.nml" $(sizes 4 8 1 4) >"$tmp/nvl72.json" ||
    fail "nvl72 dry run"
check_groups "$tmp/nvl72.json" || fail "nvl72: groups split"
[ "$(grep -c '"rank"' "$tmp/nvl72.json")" = 288 ] || fail "nvl72: not 288 objects"
head -2 "$tmp/nvl72.json" | grep -q '"process": 0, "host": "gb200-r01-t01", "gpu": "0008:01:00.0", "numa": 0, "cpus": "0-35"' ||
    fail "nvl72: process 0 line: $(head -2 "$tmp/nvl72.json")"
for k in rank process host gpu numa cpus domain tp cp ep etp dp edp pp; do
    grep -q "\"$k\": " "$tmp/nvl72.json" || fail "key $k missing"
done
# shellcheck disable=SC2046
topo --dry-run --nodes-file "$F/nvl72-4racks.nodes" --gpus-per-node 4 \
    --hwloc-xml "$F/gb200-tray.xml" "$F/moe.nml" $(sizes 4 8 1 4) >"$tmp/nvl72.txt" ||
    fail "nvl72 text"
grep -q "288 processes in 4 NVLink domains; blocks of 8 ranks share a domain" "$tmp/nvl72.txt" ||
    fail "nvl72 summary: $(cat "$tmp/nvl72.txt" | head -12)"
grep -q "pipeline links crossing domains: 24 of 216" "$tmp/nvl72.txt" || fail "nvl72 pipelines"

# -- a DGX cluster: TP 8 inside each node; EP 16 cannot fit a node ----------
# shellcheck disable=SC2046
topo --dry-run --nodes-file "$F/dgx-cluster.nodes" --gpus-per-node 8 \
    --hwloc-xml "$F/dgx-h100.xml" --json "$F/moe.nml" $(sizes 8 8 1 2) >"$tmp/dgx.json" ||
    fail "dgx dry run"
check_groups "$tmp/dgx.json" || fail "dgx: groups split"
grep -q '"process": 13, "host": "dgx-002", "gpu": "0000:ab:00.0", "numa": 1, "cpus": "70-83,182-195"' \
    "$tmp/dgx.json" || fail "dgx: affinity of process 13"
# shellcheck disable=SC2046
if topo --dry-run --nodes-file "$F/dgx-cluster.nodes" --gpus-per-node 8 "$F/moe.nml" \
    $(sizes 2 16 1 1) >"$tmp/out" 2>"$tmp/err"; then
    fail "EP 16 on 8-GPU domains should fail"
fi
grep -q "the largest NVLink domain here, 'host:dgx-001', has 8 GPUs" "$tmp/err" ||
    fail "dgx error: $(cat "$tmp/err")"

# -- the fragmented allocation: fails with the fix, besteffort runs ----------
# shellcheck disable=SC2046
if topo --dry-run --nodes-file "$F/fragmented-64.nodes" --gpus-per-node 4 "$F/moe.nml" \
    $(sizes 4 8 1 1) >"$tmp/out" 2>"$tmp/err"; then
    fail "fragmented allocation should fail"
fi
for want in "moetrain topo: error: &topology placement = 'nvlink'" \
    "domain 'rack-a': 36 GPUs on 9 nodes = 4 whole blocks + 4 GPUs left over" \
    "domain 'rack-b': 28 GPUs on 7 nodes" "multiple of 2" "sbatch --segment=2" \
    "nvlink-besteffort"; do
    grep -qF -- "$want" "$tmp/err" || fail "fragmented error lacks '$want': $(cat "$tmp/err")"
done
[ -s "$tmp/out" ] && fail "an error run printed a plan"
# shellcheck disable=SC2046
topo --dry-run --nodes-file "$F/fragmented-64.nodes" --gpus-per-node 4 "$F/moe.nml" \
    $(sizes 4 8 1 1) topology%placement="'nvlink-besteffort'" >"$tmp/be.txt" ||
    fail "besteffort run"
grep -q "groups split across domains: 0 TP x CP, 1 ETP x EP" "$tmp/be.txt" ||
    fail "besteffort report: $(head -12 "$tmp/be.txt")"
grep -q "etp-ep group" "$tmp/be.txt" || fail "besteffort names the split group"

# -- linear keeps launch order ----------------------------------------------
# shellcheck disable=SC2046
topo --dry-run --nodes-file "$F/fragmented-64.nodes" --gpus-per-node 4 --json "$F/moe.nml" \
    $(sizes 4 8 1 1) topology%placement="'linear'" >"$tmp/lin.json" || fail "linear run"
awk '/"rank"/ { if (!match($0, /"rank": [0-9]+, "process": [0-9]+/)) exit 1
     split(substr($0, RSTART, RLENGTH), f, /[ ,]+/); if (f[2] != f[4]) exit 1 }' "$tmp/lin.json" ||
    fail "linear is not the identity"

# -- 100,000 GPUs (measured in bench/topo_place.sh; here it must finish) -----
awk 'BEGIN { for (i = 0; i < 25000; i++) printf "nid%05d rack%04d\n", i, int(i / 18) }' \
    >"$tmp/100k.nodes"
# shellcheck disable=SC2046
topo --dry-run --nodes-file "$tmp/100k.nodes" --gpus-per-node 4 --json "$F/moe.nml" \
    $(sizes 4 8 1 4) >"$tmp/100k.json" || fail "100k dry run"
[ "$(grep -c '"rank"' "$tmp/100k.json")" = 100000 ] || fail "100k: not 100000 objects"

# -- bad arguments ------------------------------------------------------------
expect_error() { # WANT ARGS...
    want=$1
    shift
    if topo "$@" >"$tmp/out" 2>"$tmp/err"; then fail "should fail: $*"; fi
    grep -qF -- "$want" "$tmp/err" || fail "'$*': expected '$want', got: $(cat "$tmp/err")"
}
expect_error "--dry-run needs --nodes-file" --dry-run --gpus-per-node 4 "$F/moe.nml"
expect_error "--dry-run needs --gpus-per-node" --dry-run --nodes-file "$F/dgx-cluster.nodes" "$F/moe.nml"
expect_error "--gpus-per-node needs 1..64, got '0'" --dry-run --gpus-per-node 0 "$F/moe.nml"
expect_error "--nodes-file needs a value" --dry-run --gpus-per-node 4 "$F/moe.nml" --nodes-file
expect_error "go with --dry-run" --nodes-file "$F/dgx-cluster.nodes" "$F/moe.nml"
expect_error "unknown option '--nodes'" --nodes x "$F/moe.nml"
expect_error "no namelist file given" --dry-run --nodes-file "$F/dgx-cluster.nodes" --gpus-per-node 8
expect_error "/nonexistent.nodes: No such file" --dry-run --nodes-file /nonexistent.nodes \
    --gpus-per-node 8 "$F/moe.nml"
expect_error "the hwloc topology $F/gb200-tray.xml has 4 NVIDIA GPUs" --dry-run \
    --nodes-file "$F/dgx-cluster.nodes" --gpus-per-node 8 --hwloc-xml "$F/gb200-tray.xml" "$F/moe.nml"
expect_error "is not divisible by" --dry-run --nodes-file "$F/dgx-cluster.nodes" \
    --gpus-per-node 3 "$F/moe.nml" parallel%expert_model_parallel_size=64 \
    parallel%expert_tensor_parallel_size=1
topo --help | grep -q -- "--dry-run" || fail "--help"

# -- live, one process, no launcher: this machine, bound and read back -------
env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK -u SLURM_JOB_ID "$MOETRAIN" topo "$F/moe.nml" \
    >"$tmp/live.txt" 2>&1 || fail "live run: $(cat "$tmp/live.txt")"
grep -q "^process 0: cpus " "$tmp/live.txt" || fail "live: no binding report: $(cat "$tmp/live.txt")"
grep -q "placement 'nvlink': 1 process in 1 NVLink domain" "$tmp/live.txt" ||
    fail "live summary: $(cat "$tmp/live.txt")"
env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK -u SLURM_JOB_ID "$MOETRAIN" topo --json "$F/moe.nml" \
    host%cpu_affinity="'none'" >"$tmp/live.json" || fail "live json"
grep -q '"rank": 0, "process": 0, "host": "[^"]*", "gpu": null' "$tmp/live.json" ||
    grep -q '"gpu": "' "$tmp/live.json" || fail "live json: $(cat "$tmp/live.json")"
echo "ok"

#!/bin/sh
# Placement time for described clusters: `moetrain topo --dry-run` on GB200
# NVL72 racks (18 trays x 4 GPUs, the last rack partial) from 1,000 to 100,000
# GPUs, TP 4 x EP 8 x PP 4 (block 8), text and JSON output to /dev/null.
# usage: bench/topo_place.sh [BUILDDIR]   (default: the current directory)
# Prints, per size: GPUs, domains, and the best of 3 wall-clock times.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
build=$(cd "${1:-.}" && pwd)
moetrain="$build/moetrain"
[ -x "$moetrain" ] || { echo "bench/topo_place.sh: no moetrain in $build (build first)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nml="$top/tests/fixtures/topo/moe.nml"
sizes="parallel%tensor_model_parallel_size=4 parallel%expert_model_parallel_size=8"
sizes="$sizes parallel%expert_tensor_parallel_size=1 parallel%pipeline_model_parallel_size=4"

now() { date +%s.%N; }
best_of_3() { # prints the fastest of three runs of "$@", in seconds
    best=""
    for _ in 1 2 3; do
        t0=$(now)
        "$@" > /dev/null || { echo "bench/topo_place.sh: failed: $*" >&2; exit 1; }
        best=$(awk -v t0="$t0" -v t1="$(now)" -v b="$best" \
            'BEGIN { t = t1 - t0; print (b == "" || t < b) ? t : b }')
    done
    printf '%.3f' "$best"
}

printf '%8s %8s %10s %10s\n' gpus domains text_s json_s
for gpus in 1024 10240 100000; do
    nodes=$((gpus / 4))
    awk -v n="$nodes" 'BEGIN { for (i = 0; i < n; i++) printf "nid%06d rack%05d\n", i, int(i / 18) }' \
        > "$tmp/nodes"
    # shellcheck disable=SC2086
    text=$(best_of_3 "$moetrain" topo --dry-run --nodes-file "$tmp/nodes" --gpus-per-node 4 "$nml" $sizes)
    # shellcheck disable=SC2086
    json=$(best_of_3 "$moetrain" topo --dry-run --json --nodes-file "$tmp/nodes" --gpus-per-node 4 "$nml" $sizes)
    printf '%8d %8d %10s %10s\n' "$gpus" $(((nodes + 17) / 18)) "$text" "$json"
done

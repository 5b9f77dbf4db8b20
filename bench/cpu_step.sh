#!/bin/sh
# CPU training throughput next to the machine's measured sgemm rate.
# usage: bench/cpu_step.sh [BUILDDIR]   (default: the current directory)
# Prints, per configuration: tokens/s, achieved model GFLOP/s (Megatron's MoE
# FLOP count), and that rate as a fraction of the measured sgemm peak.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
build=$(cd "${1:-.}" && pwd)
moetrain="$build/moetrain"
[ -x "$moetrain" ] || { echo "bench/cpu_step.sh: no moetrain in $build (build first)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cc -O2 -o "$tmp/sgemm_peak" "$here/sgemm_peak.c" $(pkg-config --cflags --libs openblas 2>/dev/null || echo -lopenblas)
"$tmp/sgemm_peak" | tee "$tmp/peak.txt"
peak=$(awk '/^sgemm_peak_gflops/ {print $2}' "$tmp/peak.txt")


bench() {
    name=$1; shift
    (cd "$top" && MOETRAIN_DATADIR="$build" "$moetrain" "$@" "logging%metrics_file='$tmp/$name.jsonl'" > "$tmp/$name.log" 2>&1) ||
        { echo "$name: moetrain failed:"; tail -5 "$tmp/$name.log"; return 1; }
    # skip the first logged interval (warm-up), average the rest
    awk -v name="$name" -v peak="$peak" '
        /"tokens_per_s"/ {
            n++; if (n == 1) next
            match($0, /"tokens_per_s": [0-9.e+]+/); t += substr($0, RSTART + 16, RLENGTH - 16)
            match($0, /"tflops": [0-9.e+-]+/); f += substr($0, RSTART + 10, RLENGTH - 10); m++
        }
        END {
            if (m == 0) { print name ": no throughput lines"; exit 1 }
            g = f / m * 1000
            printf "%-10s tokens/s %9.0f | model GFLOP/s %7.2f | %.1f%% of sgemm peak (%.1f GFLOP/s)\n",
                name, t / m, g, 100 * g / peak, peak
        }' "$tmp/$name.jsonl"
}

bench tiny_moe namelists/tiny_moe.nml training%train_iters=60 training%eval_interval=1000 training%eval_iters=0
bench cpu_large bench/cpu_large.nml

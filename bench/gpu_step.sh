#!/bin/sh
# GPU throughput on one device, for a Qwen3-30B-A3B-shaped proxy.
# usage: bench/gpu_step.sh [BUILDDIR] [REPS]   (default: the current directory, 20)
#
# Part 1: the op-level figures of bench/gpu_ops.c, every compute-bound op of one
# Qwen3-30B-A3B layer and its LM head through the CUDA backend's op table: cuBLASLt
# GEMMs, the grouped expert GEMM (forward, dgrad, wgrad; uniform and skewed routing),
# fused attention forward and backward at 4k and 32k tokens, each as TFLOP/s and as a
# fraction of the GPU's dense bf16 peak. Run it twice, with MT_CUDA_GEMM_COMPUTE=bf16
# (the default) and =tf32, to see what the fp32-operand interface costs the GEMMs.
#
# Part 2: whole training steps of bench/qwen3_30b_proxy.nml (full Qwen3-30B-A3B width,
# 4 of its 48 layers, seq 4096, micro and global batch 1, bf16, forced balanced
# routing, mock data) on one GPU: `moetrain --backend=cuda`, 5 warm-up and REPS timed
# iterations, then the same step in PyTorch (bench/torch_moe_step.py: eager, fp32
# master weights with autocast bf16 and fused AdamW, grouped_mm experts, SDPA), each
# as step time, tokens/s, TFLOP/s and MFU with moetrain's FLOP count
# (mt_model_flops_per_token), and their ratio. moetrain's figures are totals over the
# timed iterations (work / time), from its metrics file.
#
# MFU is against the datasheet dense bf16 peak of the device (H100 SXM and H200
# 989 TFLOP/s, ...: the table is in bench/torch_moe_step.py; MT_BENCH_PEAK_TFLOPS=X
# overrides), else against part 1's peak
# (multiprocessors x boost clock x bf16 FLOP per clock, which is above the datasheet
# figure). For the per-op split of a step, run part 2's command under
# `nsys profile --stats=true`.
#
# Prints "no CUDA device; nothing to measure" and exits 0 without a GPU.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-.}" && pwd)
reps=${2:-20}
warmup=5
python=${PYTHON3:-python3}
ops="$build/bench/gpu_ops"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- part 1: ops
if [ ! -x "$ops" ]; then
    (cd "$build" && make bench/gpu_ops >/dev/null) ||
        { echo "bench/gpu_step.sh: cannot build bench/gpu_ops in $build (configure found no CUDA?)" >&2; exit 1; }
fi
{ status=0; "$ops" "$reps" || status=$?; echo "$status" > "$tmp/ops.rc"; } | tee "$tmp/ops.txt"
status=$(cat "$tmp/ops.rc")
if [ "$status" -eq 77 ]; then
    echo "bench/gpu_step.sh: no CUDA device; nothing to measure"
    exit 0
fi
[ "$status" -eq 0 ] || { echo "bench/gpu_step.sh: bench/gpu_ops failed (status $status)" >&2; exit "$status"; }

# ---- the peak MFU is measured against
# "# NVIDIA H100 80GB HBM3: 132 SMs at 1.98 GHz, 79 GiB; dense bf16 peak 1070 TFLOP/s (...)"
name=$(sed -n 's/^# \(.*\): [0-9]* SMs at .*/\1/p' "$tmp/ops.txt")
derived=$(sed -n 's/.*dense bf16 peak \([0-9.]*\) TFLOP.*/\1/p' "$tmp/ops.txt")
sheet=$("$python" "$here/torch_moe_step.py" --datasheet-peak "$name" 2>/dev/null) || sheet=0
if [ -n "${MT_BENCH_PEAK_TFLOPS:-}" ]; then
    peak=$MT_BENCH_PEAK_TFLOPS peak_from="MT_BENCH_PEAK_TFLOPS"
elif [ "${sheet:-0}" != 0 ] && [ "${sheet:-0}" != 0.0 ]; then
    peak=$sheet peak_from="datasheet dense bf16 for $name"
else
    peak=${derived:-0} peak_from="derived for $name (SMs x clock x FLOP/clk)"
fi
echo
echo "# part 2: training steps of bench/qwen3_30b_proxy.nml; MFU against $peak TFLOP/s ($peak_from)"

# ---- part 2a: moetrain
moetrain="$build/moetrain"
mt_line=""
if (cd "$tmp" && "$moetrain" --backend=cuda "$here/qwen3_30b_proxy.nml" \
        training%train_iters=$((warmup + reps)) logging%log_memory=T \
        "logging%metrics_file='$tmp/moetrain.jsonl'" > "$tmp/moetrain.log" 2>&1); then
    grep -E '^(model|memory)' "$tmp/moetrain.log" | sed 's/^/moetrain: /'
    # timed iterations: work / time over them (each line is one iteration: log_interval 1)
    mt_line=$(awk -v warm=$warmup -v peak="$peak" '
        function val(k,   i, s) { i = index($0, "\"" k "\": "); s = substr($0, i + length(k) + 4)
                                  sub(/[,}].*/, "", s); return s + 0 }
        /"tokens_per_s"/ && val("iteration") > warm {
            ms = val("elapsed_ms"); n++; tms += ms
            tok += val("tokens_per_s") * ms / 1e3; tf += val("tflops") * ms / 1e3
        }
        END {
            if (n == 0) exit 1
            s = tms / 1e3
            printf "%.3f %.1f %.3f %.2f %d\n", tms / n, tok / s, tf / s, (peak > 0 ? 100 * tf / s / peak : 0), n
        }' "$tmp/moetrain.jsonl") || { echo "moetrain: no timed iterations in the metrics file"; status=1; }
else
    echo "moetrain --backend=cuda failed:"
    tail -20 "$tmp/moetrain.log"
    status=1
fi

# ---- part 2b: PyTorch
pt_line=""
"$python" "$here/torch_moe_step.py" --warmup $warmup --iters "$reps" --peak-tflops "$peak" \
    > "$tmp/torch.txt" 2>&1 || { tail -20 "$tmp/torch.txt"; echo "torch_moe_step.py failed"; status=1; }
grep -v ' result ' "$tmp/torch.txt" || true
pt_line=$(sed -n 's/.* result step_ms=\([^ ]*\) tokens_per_s=\([^ ]*\) tflops=\([^ ]*\) mfu=\([^ ]*\) .*/\1 \2 \3 \4/p' "$tmp/torch.txt")

# ---- side by side
echo
printf '%-28s %10s %12s %10s %8s\n' "one step, 4096 tokens" "step ms" "tokens/s" "TFLOP/s" "MFU %"
[ -z "$mt_line" ] || echo "$mt_line" | awk '{ printf "%-28s %10.1f %12.0f %10.1f %8.1f\n", "moetrain --backend=cuda", $1, $2, $3, $4 }'
[ -z "$pt_line" ] || echo "$pt_line" | awk '{ printf "%-28s %10.1f %12.0f %10.1f %8.1f\n", "PyTorch (eager)", $1, $2, $3, $4 }'
if [ -n "$mt_line" ] && [ -n "$pt_line" ]; then
    echo "$mt_line $pt_line" | awk '{ printf "moetrain / PyTorch: %.2fx the throughput (tokens/s)\n", $2 / $7 }'
    # both count with mt_model_flops_per_token; a difference means the shapes differ
    mt_gf=$(sed -n 's/^model: .* \([0-9.]*\) GFLOP per token.*/\1/p' "$tmp/moetrain.log")
    pt_gf=$(sed -n 's/.* result .* gflop_per_token=\([^ ]*\).*/\1/p' "$tmp/torch.txt")
    awk -v a="$mt_gf" -v b="$pt_gf" 'BEGIN { d = a - b; if (d < 0) d = -d
        if (a == "" || b == "" || d > 1e-3 * a) {
            printf "WARNING: GFLOP per token differ: moetrain %s, PyTorch %s (not the same model?)\n", a, b; exit 1 } }' ||
        status=1
fi
exit "$status"

#!/bin/sh
# GPU throughput on one device, for a Qwen3-30B-A3B-shaped proxy.
# usage: bench/gpu_step.sh [BUILDDIR] [REPS]   (default: the current directory, 20)
#
# Part 1 (runs today): the op-level figures of bench/gpu_ops.c, every compute-bound op
# of one Qwen3-30B-A3B layer and its LM head through the CUDA backend's op table:
# cuBLASLt GEMMs, the grouped expert GEMM (forward, dgrad, wgrad; uniform and skewed
# routing), fused attention forward and backward at 4k and 32k tokens, each as TFLOP/s
# and as a fraction of the GPU's dense bf16 peak. Run it twice, with
# MT_CUDA_GEMM_COMPUTE=bf16 (the default) and =tf32, to see what the fp32-operand
# interface costs the GEMMs.
#
# Part 2 (the plan; needs the model on the CUDA backend, i.e. model-side device
# buffers, not there yet): one training step of the proxy on one GPU,
#   hidden 2048, 32 heads / 4 KV groups of 128, QK-norm, 128 experts of 768, top-8,
#   vocab 151936, seq 4096, micro batch 1, bf16 recipe, 4 of the 48 layers (the expert
#   weights, gradients and AdamW moments of one layer take ~10 GB in fp32: four layers
#   and the embeddings fit in 80 GB),
# timed after 5 warm-up steps over 20 steps, reported as tokens/s and MFU with
# Megatron's MoE FLOP count (as bench/cpu_step.sh reports for the CPU), with the
# per-op split from nsys (`nsys profile --stats=true`) beside the op-level figures
# above. That part belongs to the issue that moves the model's buffers to the device.
set -eu
build=$(cd "${1:-.}" && pwd)
reps=${2:-20}
ops="$build/bench/gpu_ops"
if [ ! -x "$ops" ]; then
    (cd "$build" && make bench/gpu_ops >/dev/null) ||
        { echo "bench/gpu_step.sh: cannot build bench/gpu_ops in $build (configure found no CUDA?)" >&2; exit 1; }
fi
status=0
"$ops" "$reps" || status=$?
if [ "$status" -eq 77 ]; then
    echo "bench/gpu_step.sh: no CUDA device; nothing to measure"
    exit 0
fi
exit "$status"

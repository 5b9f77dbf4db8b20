#!/bin/sh
# The FP8/FP4 recipes trained on the CUDA backend (kernels/cuda/cuda_qdq.cu: the model's
# quantised linears and routed experts as cuBLASLt FP8/FP4 matmuls) under the emulator,
# against the CPU backend (the same recipes on dequantised operands): the tiny model
# (namelists/tiny_moe.nml, bf16) cut to one 2 x 64-token micro-batch a step, 3
# iterations, each recipe on the emulated GPU that runs it. MT_LOWP_DEVICE picks the
# device and its recipes: h100 (delayed, tensorwise, blockwise; and MXFP8 and NVFP4
# refused at start, naming the GPU and the recipe that fits) or gb200 (MXFP8, NVFP4).
# tests/gpu/lowp_train_h100_emu.sh and lowp_train_gb200_emu.sh run it (about a minute
# each). Never skipped.
#
# The run's end-of-run summary must count cuBLASLt FP8/FP4 matmuls with the recipe's
# scale modes (SCALAR_32F for delayed and tensorwise, VEC128_32F and BLK128x128_32F for
# blockwise, VEC32_UE8M0 for MXFP8, VEC16_UE4M3 for NVFP4): a CUDA path that multiplied
# dequantised operands with the dense GEMM instead would count none.
#
# What differs between the backends is the GEMMs' accumulation: the emulated
# cuBLASLt sums in another order and precision than OpenBLAS, so the inputs
# of the next quantisation differ in their last bits, and an element near a rounding
# boundary of its format (or a block's amax near a power of two) can quantise one step
# apart on the two (tests/parallel/equivalence.sh's FP8 leg meets the same ties
# between layouts). The quantisation itself is the same bit for bit
# (tests/gpu/emu_quant.sh qdq); at 128 tokens a step, one token whose top-2 experts
# swap on a near-tie moves the loss by ~1e-3. Bounds: 5e-3 on the loss while the
# weights are the initial ones (iterations 1 and 2: the first step's lr is 0) and 3e-2
# after the first update; a recipe's quantisation itself moves the loss by more (MXFP8
# and NVFP4 of the same weights and batch: 1.7e-2 apart at iteration 1). NVFP4 is the
# most sensitive: its per-tensor scale comes from the tensor's amax, so a last-bit
# difference there rescales every block. Measured (loss |cuda - cpu|, iterations 1..3):
#   delayed 1.4e-6 2.0e-5 1.1e-3, tensorwise 1.4e-6 1.4e-4 2.2e-3,
#   blockwise 3.1e-5 1.1e-3 1.0e-3, mxfp8 3.1e-5 1.1e-3 2.1e-4,
#   nvfp4 1.8e-3 1.7e-3 6.8e-3
# with the FP8/FP4 matmuls (with dequantised operands and the dense GEMM before them:
# delayed 1.2e-4 7.4e-4 1.9e-3, tensorwise 1.2e-4 2.3e-4 7.4e-4, nvfp4 9.1e-4 1.5e-3
# 1.1e-2, the others the same).
. "$MT_TOP_SRCDIR/tests/train/common.sh"
EMU="${MT_TOP_BUILDDIR:-.}/tests/gpu/moetrain-emu"
device=${MT_LOWP_DEVICE:-h100}
cd "$tmp" || exit 1
DELAYED="precision%fp8_format='hybrid' precision%fp8_amax_history_len=2 precision%fp8_amax_compute_algo='max'"
TENSORWISE="precision%fp8_format='hybrid' precision%fp8_recipe='tensorwise'"
BLOCKWISE="precision%fp8_format='e4m3' precision%fp8_recipe='blockwise'"
MXFP8="precision%fp8_format='e4m3' precision%fp8_recipe='mxfp8'"
NVFP4="precision%fp4_format='e2m1'"
# the cuBLASLt scale modes of each recipe's matmuls
DELAYED_MODES="SCALAR_32F" TENSORWISE_MODES="SCALAR_32F" BLOCKWISE_MODES="VEC128_32F, BLK128x128_32F"
MXFP8_MODES="VEC32_UE8M0" NVFP4_MODES="VEC16_UE4M3"
# the recipes whose dense linears keep FP8 copies for backward compared with a run that
# keeps the high-precision inputs (MT_CUDA_QUANT_SAVE=0): per-tensor copies (read by the
# forward, transposed by the wgrad GEMM) on the H100, block copies on the GB200
case $device in
# the recipes whose producers (RMSNorm, SwiGLU) emit their output's quantisation (the
# current-scaling FP8 recipes) compared with a run where the quantised GEMMs quantise
# it from memory (MT_CUDA_QUANT_FUSE=0)
h100) recipes="DELAYED TENSORWISE BLOCKWISE" refused="MXFP8 NVFP4" saved="TENSORWISE" fused="TENSORWISE BLOCKWISE" ;;
gb200) recipes="MXFP8 NVFP4" refused="" saved="MXFP8" fused="MXFP8" ;;
*) fail "MT_LOWP_DEVICE='$device': h100 or gb200" ;;
esac
MT_EMU_DEVICE=$device
export MT_EMU_DEVICE

run() { # run NAME BACKEND OVERRIDES
    # shellcheck disable=SC2086 # $3 is a list of overrides
    "$EMU" --backend="$2" "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" training%train_iters=3 \
        optimizer%lr_warmup_iters=1 logging%log_interval=1 training%eval_interval=100 training%eval_iters=1 \
        training%micro_batch_size=2 training%global_batch_size=2 training%seq_length=64 \
        "precision%params_dtype='bf16'" "logging%metrics_file='$1.jsonl'" logging%log_memory=.true. $3 > "$1.log" 2>&1
}

for r in $recipes; do
    eval "o=\$$r"
    for b in cpu cuda; do
        run "$r.$b" $b "$o" || { cat "$r.$b.log"; fail "$r: training with --backend $b failed"; }
        grep -q '| low precision: fp' "$r.$b.log" || { cat "$r.$b.log"; fail "$r.$b: the log names no recipe"; }
    done
    json_field "$r.cpu.jsonl" loss > cpu.loss
    json_field "$r.cuda.jsonl" loss > cuda.loss
    paste cpu.loss cuda.loss | awk -v r="$r" '
        function abs(x) { return x < 0 ? -x : x }
        { d = abs($2 - $1); bound = NR <= 2 ? 5e-3 : 3e-2
          printf "%s iteration %d: loss cpu %s cuda %s |difference| %.2e (bound %g)%s\n", r, NR, $1, $2, d, bound,
                 (d > bound ? " FAIL" : "")
          if (d > bound || $2 !~ /^[0-9.]+([eE][-+]?[0-9]+)?$/) bad = 1 }
        END { if (NR != 3) { print r ": " NR " losses, expected 3"; bad = 1 } exit bad }' ||
        fail "$r: --backend cuda is not within bounds of --backend cpu"
    eval "modes=\$${r}_MODES"
    grep "^moetrain: low-precision GEMMs: [1-9][0-9]* cuBLASLt FP8/FP4 matmuls, scale modes $modes;" "$r.cuda.log" ||
        { cat "$r.cuda.log"; fail "$r: --backend cuda ran no cuBLASLt FP8/FP4 matmul with scale modes $modes"; }
    grep '^moetrain: the emulated device saw' "$r.cuda.log" | grep -q '(the same)$' ||
        { cat "$r.cuda.log"; fail "$r: the backend's launch and sync counts are not what the emulated device saw"; }
done

# The copies saved for backward (doc/fp8.md, "FP8 copies saved for backward"): the same
# losses and gradient norms, bit for bit, as the run without them, and the memory line
# of --log-memory counting the copies as --check counts them (the CUDA backend's
# saved_bytes; --check plans with the CPU's, which the copy's size must equal).
# same_figures R OTHER WHAT: the losses and gradient norms of R's run on the CUDA backend
# are those of its run R.OTHER, bit for bit (WHAT: what R's run has that the other lacks)
same_figures() {
    for f in loss grad_norm; do
        json_field "$1.cuda.jsonl" $f > a.$f
        json_field "$1.$2.jsonl" $f > b.$f
        [ -s a.$f ] && cmp a.$f b.$f || { paste a.$f b.$f; fail "$1: the $f $3 is not the $f without"; }
    done
}
copies() { sed -n 's/.*of which FP8\/FP4 copies \([0-9]*\) in place of \([0-9]*\) .*/\1 \2/p' "$1" | head -1; }
for r in $saved; do
    eval "o=\$$r"
    MT_CUDA_QUANT_SAVE=0 run "$r.nosave" cuda "$o" || { cat "$r.nosave.log"; fail "$r: MT_CUDA_QUANT_SAVE=0 failed"; }
    same_figures "$r" nosave "with FP8 copies saved for backward"
    # shellcheck disable=SC2086 # $o is a list of overrides
    "$EMU" --check "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" training%micro_batch_size=2 training%global_batch_size=2 \
        training%seq_length=64 "precision%params_dtype='bf16'" $o > "$r.check" 2>&1 ||
        { cat "$r.check"; fail "$r: --check failed"; }
    cc=$(copies "$r.check") cl=$(copies "$r.cuda.log")
    [ -n "$cl" ] && [ "$cc" = "$cl" ] ||
        { cat "$r.cuda.log"; fail "$r: --log-memory on --backend cuda says FP8 copies '$cl', --check '$cc'"; }
    grep -q 'of which FP8/FP4 copies' "$r.nosave.log" &&
        { cat "$r.nosave.log"; fail "$r: MT_CUDA_QUANT_SAVE=0 still reports FP8 copies"; }
    echo "$r: losses and gradient norms with the copies saved = without; copies, bytes in place of bytes: $cl (--check = --log-memory)"
done

# Quantisation fused with its producer (doc/fp8.md, "Quantisation fused with its
# producer"): the same losses and gradient norms, bit for bit, as the run whose GEMMs
# quantise the producers' outputs from memory, and the summary counting what was fused.
fused() { sed -n 's/^moetrain: low-precision GEMMs: .*; \([0-9]*\) quantisations fused with their producer$/\1/p' "$1"; }
for r in $fused; do
    eval "o=\$$r"
    MT_CUDA_QUANT_FUSE=0 run "$r.nofuse" cuda "$o" || { cat "$r.nofuse.log"; fail "$r: MT_CUDA_QUANT_FUSE=0 failed"; }
    same_figures "$r" nofuse "with the quantisation fused into its producers"
    nf=$(fused "$r.cuda.log") n0=$(fused "$r.nofuse.log")
    [ "${nf:-0}" -gt 0 ] && [ "$n0" = 0 ] ||
        { cat "$r.cuda.log"; fail "$r: quantisations fused: '$nf' (expected some), with MT_CUDA_QUANT_FUSE=0 '$n0' (expected 0)"; }
    echo "$r: losses and gradient norms with $nf quantisations fused into their producers = without"
done

for r in $refused; do
    eval "o=\$$r"
    run "$r.refused" cuda "$o" && { cat "$r.refused.log"; fail "$r: accepted on the emulated $device"; }
    grep -q "the GPU (NVIDIA H100 80GB HBM3 (moetrain CUDA emulator), compute capability 9.0) cannot run it" \
        "$r.refused.log" || { cat "$r.refused.log"; fail "$r: the refusal does not name the GPU"; }
    grep -q "the recipe that fits this GPU is .*fp8_recipe = 'blockwise'" "$r.refused.log" ||
        { cat "$r.refused.log"; fail "$r: the refusal does not name the recipe that fits"; }
    grep 'moetrain: error' "$r.refused.log"
done
echo "PASS: the FP8/FP4 recipes on the emulated $device's CUDA backend are within bounds of the CPU's"

#!/bin/sh
# &moe moe_router_padding_for_fp8 on the CUDA backend under the emulated H100 (doc/fp8.md,
# "Padding the experts' rows"): blockwise FP8, the tiny model (namelists/tiny_moe.nml)
# with moe_ffn_hidden_size = 512 so that every expert's GEMMs are cuBLASLt matmuls of
# their own (above the grouped launch's 2^22 multiply-adds), one 2 x 64-token
# micro-batch a step, 2 steps, with and without padding. Padded, every expert's rows are
# a multiple of 16, so no expert matmul pads its operands and runs the fp32-scratch
# epilogue: the run's summary counts none through the epilogue, where without padding
# most expert matmuls take it (measured: 93 of 250). The losses are the same, bit for
# bit (the emulated blockwise matmul sums each run of 128 products exactly: zero rows
# change nothing), and within tests/gpu/lowp_train_emu.sh's bound (5e-3 before the
# first update) of the CPU backend's padded run. About 70 seconds.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
EMU="${MT_TOP_BUILDDIR:-.}/tests/gpu/moetrain-emu"
MT_EMU_DEVICE=h100
export MT_EMU_DEVICE
cd "$tmp" || exit 1
run() { # run NAME BACKEND PAD
    "$EMU" --backend="$2" "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" training%train_iters=2 \
        optimizer%lr_warmup_iters=1 logging%log_interval=1 training%eval_interval=100 training%eval_iters=1 \
        training%micro_batch_size=2 training%global_batch_size=2 training%seq_length=64 \
        moe%moe_ffn_hidden_size=512 "precision%params_dtype='bf16'" "precision%fp8_format='e4m3'" \
        "precision%fp8_recipe='blockwise'" moe%moe_router_padding_for_fp8="$3" \
        "logging%metrics_file='$1.jsonl'" > "$1.log" 2>&1 || { cat "$1.log"; fail "$1: training failed"; }
}
run nopad cuda F
run pad cuda T
run cpu cpu T
epilogues() { sed -n 's/^moetrain: low-precision GEMMs: [0-9]* cuBLASLt.*; \([0-9]*\) through the epilogue.*/\1/p' "$1"; }
e0=$(epilogues nopad.log) e1=$(epilogues pad.log)
[ -n "$e0" ] && [ -n "$e1" ] || { cat nopad.log pad.log; fail "no low-precision GEMM summary"; }
grep -q ' 0 grouped launches' pad.log || { cat pad.log; fail "the experts ran as a grouped launch, not cuBLASLt matmuls"; }
[ "$e1" -eq 0 ] && [ "$e0" -gt 0 ] ||
    fail "matmuls through the epilogue: $e1 with padding, $e0 without (expected 0 and some)"
json_field nopad.jsonl loss > nopad.loss
json_field pad.jsonl loss > pad.loss
json_field cpu.jsonl loss > cpu.loss
[ -s pad.loss ] && cmp -s nopad.loss pad.loss || { paste nopad.loss pad.loss; fail "the losses differ with padding"; }
paste cpu.loss pad.loss | awk '
    function abs(x) { return x < 0 ? -x : x }
    { d = abs($2 - $1); printf "iteration %d: loss cpu %s cuda %s |difference| %.2e\n", NR, $1, $2, d
      if (d > 5e-3) bad = 1 }
    END { exit bad }' || fail "the padded CUDA run is not within 5e-3 of the CPU's"
echo "PASS: padded, $e1 expert matmuls through the epilogue (unpadded $e0); losses $(tr '\n' ' ' < pad.loss)the same"

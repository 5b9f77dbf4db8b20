#!/bin/sh
# The FP8/FP4 quantisers of kernels/cuda/cuda_quant.cu against the CPU recipes byte for
# byte, the CUDA backend's qdq op against the CPU backend's bit for bit, the block
# scales in cuBLASLt's documented order, and the emulated cuBLASLt's FP8
# and FP4 matmuls against the CPU reference GEMM, and the CUDA backend's quantised GEMM
# op (cuBLASLt FP8/FP4 matmuls) against the CPU backend's: on the emulated H100
# (delayed, tensorwise, blockwise) and GB200 (MXFP8, NVFP4); the grouped quantised GEMM
# of the routed experts against the per-expert loop (its launches
# the same for 4 and 16 experts); the copies saved for
# backward (the GEMM reading one bit for bit the GEMM quantising x); qdq of tensor-parallel shards;
# RMSNorm and SwiGLU emitting their output's quantisation (the CPU recipe's bytes).
# Never skipped.
prog="${MT_TOP_BUILDDIR:-.}/tests/gpu/emu_quant"
status=0
for mode in quant order qdq gemm-h100 qgemm-h100 grouped-h100 saved-h100 fused-h100; do
    echo "== emu_quant $mode"
    MT_EMU_DEVICE=h100 "$prog" "$mode" || status=1
done
for mode in gemm-gb200 qgemm-gb200 grouped-gb200 saved-gb200 fused-gb200; do
    echo "== emu_quant $mode"
    MT_EMU_DEVICE=gb200 "$prog" "$mode" || status=1
done
exit $status

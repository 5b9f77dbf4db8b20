#!/bin/sh
# Every CUDA op against the CPU reference, the real kernels/cuda code run by the CUDA
# execution emulator (kernels/cuda/emu): never skipped. The 32k-token attention case
# runs at 4096 tokens here (prefix invariance over the first 1024), the full length
# stays for a real GPU (test_parity.sh).
MT_PARITY_LONG_T=${MT_PARITY_LONG_T:-4096}
export MT_PARITY_LONG_T
exec "${MT_TOP_BUILDDIR:-.}/tests/gpu/test_parity_emu"

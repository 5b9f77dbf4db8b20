#!/bin/sh
# train_parity.sh with the CUDA backend on the emulated device (tests/gpu/moetrain-emu):
# the tiny model, 20 iterations, the real kernels/cuda code against the CPU backend,
# and the determinism of two emulated runs. Never skipped.
MOETRAIN="${MT_TOP_BUILDDIR:-.}/tests/gpu/moetrain-emu"
export MOETRAIN
exec sh "$MT_TOP_SRCDIR/tests/gpu/train_parity.sh"

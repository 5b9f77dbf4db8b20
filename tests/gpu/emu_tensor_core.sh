#!/bin/sh
# mma.sync and ldmatrix of the CUDA emulator on hand-computed cases (never skipped).
exec "${MT_TOP_BUILDDIR:-.}/tests/gpu/emu_tensor_core"

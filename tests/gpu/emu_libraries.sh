#!/bin/sh
# The CUDA emulator's cuBLASLt and cub on hand-computed cases (never skipped).
exec "${MT_TOP_BUILDDIR:-.}/tests/gpu/emu_libraries"

#!/bin/sh
# Every CUDA op against the CPU reference; exits 77 (skip) without a CUDA device.
exec "${MT_TOP_BUILDDIR:-.}/tests/gpu/test_parity"

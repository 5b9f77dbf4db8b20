#!/bin/sh
# The parity harness with the CPU backend in the device's place (every comparison must
# then be exact): checks the harness, its shapes and its bounds' plumbing without a GPU.
MT_PARITY_BACKEND=cpu
export MT_PARITY_BACKEND
exec "${MT_TOP_BUILDDIR:-.}/tests/gpu/test_parity"

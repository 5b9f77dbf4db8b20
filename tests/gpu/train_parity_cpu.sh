#!/bin/sh
# train_parity.sh with the CPU backend in the CUDA runs' place: runs everywhere and
# checks that script's runs, parsing and comparisons without a GPU (two CPU runs
# must be bit-identical, and CPU against CPU must differ by exactly 0).
MT_TRAIN_PARITY_BACKENDS=cpu,cpu
export MT_TRAIN_PARITY_BACKENDS
exec sh "$MT_TOP_SRCDIR/tests/gpu/train_parity.sh"

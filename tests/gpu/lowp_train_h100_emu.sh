#!/bin/sh
# tests/gpu/lowp_train_emu.sh on the emulated H100.
MT_LOWP_DEVICE=h100
export MT_LOWP_DEVICE
exec sh "$MT_TOP_SRCDIR/tests/gpu/lowp_train_emu.sh"

#!/bin/sh
# tests/gpu/lowp_train_emu.sh on the emulated GB200.
MT_LOWP_DEVICE=gb200
export MT_LOWP_DEVICE
exec sh "$MT_TOP_SRCDIR/tests/gpu/lowp_train_emu.sh"

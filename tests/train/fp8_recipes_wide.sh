#!/bin/sh
# tests/train/fp8_recipes.sh on a wider model: tests/fixtures/train/fp8_wide.nml
# (hidden 320, attention 4 x 80, dense MLP 320, experts 192), where the rows of the
# quantised GEMMs' reductions hold several 128-element blocks and a partial one; each
# recipe against bf16 at three seeds, the same targets on the mean (doc/fp8.md,
# "Measured").
fp8_model="$MT_TOP_SRCDIR/tests/fixtures/train/fp8_wide.nml"
. "$MT_TOP_SRCDIR/tests/train/fp8_recipes.sh"

#!/bin/sh
# The CUDA emulator's fragment tables (mma.sync m16n8k16 bf16 A, B, C; ldmatrix.x4 and
# .x4.trans), probed by `emu_tensor_core --dump`, against NVIDIA CUTLASS's cute layouts
# (MMA_Traits<SM80_16x8x16_F32BF16BF16F32_TN>, Copy_Traits<SM75_U32x4_LDSM_N> and
# <SM75_U16x8_LDSM_T>) from the nvidia-cutlass PyPI package, a test oracle only:
# emu_cute_oracle.cc is compiled here against its headers. Skips (77) without the
# package (python3 -m pip install nvidia-cutlass) or the CUDA headers' libcu++.
python=${PYTHON3:-python3}
[ -n "$python" ] || python=python3
skip() { echo "SKIP: $*"; exit 77; }
cute=$("$python" -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include"))' 2>/dev/null) ||
    skip "the nvidia-cutlass Python package is not installed (python3 -m pip install nvidia-cutlass)"
[ -f "$cute/cute/atom/mma_traits_sm80.hpp" ] || skip "no cute headers under $cute"
cuda_inc=$(sed -n 's/^cuda_emu_CFLAGS = -I//p' "${MT_TOP_BUILDDIR:-.}/Makefile")
[ -n "$cuda_inc" ] || cuda_inc=/usr/local/cuda/include
[ -f "$cuda_inc/cccl/cuda/std/utility" ] && cccl="-I$cuda_inc/cccl" || cccl=
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2086
${CXX:-c++} -std=c++17 -I"$cute" -I"$cuda_inc" $cccl -o "$tmp/oracle" "$MT_TOP_SRCDIR/tests/gpu/emu_cute_oracle.cc" \
    2> "$tmp/cc.log" || { cat "$tmp/cc.log"; skip "cute's headers do not compile here with ${CXX:-c++}"; }
"$tmp/oracle" > "$tmp/cute.txt" || { echo "FAIL: the oracle failed"; exit 1; }
"${MT_TOP_BUILDDIR:-.}/tests/gpu/emu_tensor_core" --dump > "$tmp/emu.txt" || { echo "FAIL: emu_tensor_core --dump"; exit 1; }
n=$(wc -l < "$tmp/cute.txt")
[ "$n" -eq 1024 ] || { echo "FAIL: the oracle printed $n lines, expected 1024"; exit 1; }
if ! diff "$tmp/cute.txt" "$tmp/emu.txt" > "$tmp/diff"; then
    echo "FAIL: the emulator's fragment tables differ from cute's (< cute, > emulator; columns: table lane value coordinates)"
    head -40 "$tmp/diff"
    exit 1
fi
for t in "mma A" "mma B" "mma C" "ldsm N" "ldsm T"; do
    echo "ok: $t: $(grep -c "^$t " "$tmp/emu.txt") entries equal cute's"
done

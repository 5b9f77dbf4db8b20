#!/bin/sh
# The CUDA backend's dense GEMMs on the emulator (tests/gpu/emu_gemm.cc), never skipped:
# - fallback: with MT_EMU_CUBLASLT_TENSOR_CORE_ALIGN=16 (the emulator's test knob) the
#   heuristic has no 32F_FAST_16BF algorithm for two of the three shapes, which then run
#   in fp32 (results exact), are counted (2 shapes, 6 calls), and are each reported on
#   stderr exactly once (3 calls each) with the shape, the compute types and the fix;
# - tensor-cores: without the knob nothing falls back and nothing is reported;
# - both: the teardown leaves no cuBLASLt object alive, and a new backend works after it;
# - a knob value that is not a power of two is refused with its name.
prog="${MT_TOP_BUILDDIR:-.}/tests/gpu/emu_gemm"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
unset MT_CUDA_GEMM_COMPUTE MT_EMU_CUBLASLT_TENSOR_CORE_ALIGN
failed=0
fail() {
    echo "FAIL: $*"
    failed=$((failed + 1))
}

# MODE [KNOB]: the program's own checks, its stdout and stderr kept in $tmp
run() {
    mode=$1
    if [ -n "$2" ]; then
        MT_EMU_CUBLASLT_TENSOR_CORE_ALIGN=$2 "$prog" "$mode" > "$tmp/$mode.out" 2> "$tmp/$mode.err"
    else
        "$prog" "$mode" > "$tmp/$mode.out" 2> "$tmp/$mode.err"
    fi
    status=$?
    sed 's/^/    /' "$tmp/$mode.out"
    [ $status -eq 0 ] && echo "ok: $mode: the program's checks" ||
        { fail "$mode: exit status $status"; sed 's/^/    stderr: /' "$tmp/$mode.err"; }
}

# count FILE PATTERN: lines of FILE matching the fixed string PATTERN
count() { grep -c -F -e "$2" "$1"; }

run fallback 16
err=$tmp/fallback.err
warn='moetrain: warning: CUDA device 0: cuBLASLt has no algorithm with CUBLAS_COMPUTE_32F_FAST_16BF for the GEMM'
odd="$warn M=8 N=8 K=13 (A not transposed, lda 13; B not transposed, ldb 8; ldc 8; pointers 16-byte aligned): it runs with CUBLAS_COMPUTE_32F, without tensor cores"
offset="$warn M=8 N=8 K=16 (A transposed, lda 8; B transposed, ldb 16; ldc 8; pointers 4-byte aligned): it runs with CUBLAS_COMPUTE_32F, without tensor cores"
[ "$(count "$err" "$warn")" -eq 2 ] && echo "ok: fallback: two warnings for two shapes of three calls each" ||
    fail "fallback: expected 2 warnings, got $(count "$err" "$warn")"
[ "$(count "$err" "$odd")" -eq 1 ] && echo "ok: fallback: K = lda = 13 reported once, with its shape" ||
    fail "fallback: expected once: $odd"
[ "$(count "$err" "$offset")" -eq 1 ] && echo "ok: fallback: the 4-byte-aligned transposed product reported once" ||
    fail "fallback: expected once: $offset"
[ "$(count "$err" 'HINT: not multiples of 16 bytes: lda 13 (52 bytes), K 13 (52 bytes); pad them to a multiple of 4 floats')" -eq 1 ] &&
    echo "ok: fallback: the hint names lda and K and says to pad them" || fail "fallback: no hint naming lda 13 and K 13"
[ "$(count "$err" 'HINT: the pointers are only 4-byte aligned: start each matrix 16-byte aligned')" -eq 1 ] &&
    echo "ok: fallback: the hint names the pointer alignment" || fail "fallback: no hint naming the 4-byte pointers"
[ "$(wc -l < "$err")" -eq 4 ] || { fail "fallback: stderr holds more than the 2 warnings and 2 hints"; sed 's/^/    /' "$err"; }
sed 's/^/    stderr: /' "$err"

run tensor-cores
[ ! -s "$tmp/tensor-cores.err" ] && echo "ok: tensor-cores: nothing on stderr" ||
    { fail "tensor-cores: stderr is not empty"; sed 's/^/    /' "$tmp/tensor-cores.err"; }

MT_EMU_CUBLASLT_TENSOR_CORE_ALIGN=12 "$prog" fallback > "$tmp/bad" 2>&1 && fail "a knob of 12 bytes was accepted" ||
    { grep -q "MT_EMU_CUBLASLT_TENSOR_CORE_ALIGN='12' is not a power of two" "$tmp/bad" &&
        echo "ok: MT_EMU_CUBLASLT_TENSOR_CORE_ALIGN=12 is refused with its name" ||
        { fail "MT_EMU_CUBLASLT_TENSOR_CORE_ALIGN=12: no message naming it"; sed 's/^/    /' "$tmp/bad"; }; }
[ $failed -eq 0 ]

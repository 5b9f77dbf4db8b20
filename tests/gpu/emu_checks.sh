#!/bin/sh
# The CUDA execution emulator's negative tests: every case of tests/gpu/emu_checks.cc
# that breaks a rule of CUDA's execution model must end in the emulator's error
# (abort) with the message below, naming the kernel, block and thread, and the source
# line marked `// CHECK: CASE` in emu_checks.cc (faults are found by a signal, which
# knows no line: kernel, block and thread only). The cases that run (`ok`, the
# launch-error cases) must exit 0. Fails if the emulator goes blind to any of them,
# or reports an error in correct code. Never skipped.
prog="${MT_TOP_BUILDDIR:-.}/tests/gpu/emu_checks"
src="${MT_TOP_SRCDIR:-.}/tests/gpu/emu_checks.cc"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# CASE|message the error must contain|kernel it names (- for a host API call)
expectations='
ok|-|-
oob_read|0 bytes past the end of a 256-byte device allocation|oob_read_kernel
use_after_free|256-byte device allocation at 0x[0-9a-f]* that was freed|read_kernel
memcpy_past_end|cudaMemcpy (destination): 44 bytes at 0x[0-9a-f]* leave the 40-byte allocation|-
ldg_misaligned|__ldg of 16 bytes at 0x[0-9a-f]*: misaligned|ldg_kernel
barrier_after_return|__syncthreads is not reached by every thread of the block: thread (31,0,0) returned|barrier_after_return_kernel
barrier_after_early_return|__syncthreads is not reached by every thread of the block: thread (0,0,0) returned|barrier_after_early_return_kernel
divergent_barrier|divergent __syncthreads: thread (0,0,0) waits at [^ ]*emu_checks.cc:[0-9]*, thread (40,0,0) at|divergent_barrier_kernel
deadlock|deadlock: no emulated thread of the block can continue (0 returned):|deadlock_kernel
shfl_mask_mismatch|__shfl_sync: lane 5 passes mask 0x000000ff but lane 0 waits at __shfl_sync|shfl_mask_mismatch_kernel
shfl_returned_lane|__shfl_xor_sync with mask 0xffffffff names lane 0, which has returned from the kernel|shfl_returned_lane_kernel
shfl_lane_returns|waits at __shfl_down_sync with mask 0xffffffff, which names lane 31; that lane returned|shfl_lane_returns_kernel
shfl_not_caller|__shfl_sync with mask 0xfffffffe, which does not name the calling lane 0|shfl_not_caller_kernel
shfl_outside_mask|__shfl_sync: lane 0 reads lane 20, which is not in the mask 0x0000ffff|shfl_outside_mask_kernel
divergent_collective|divergent warp collective: lane [0-9]* is at|divergent_collective_kernel
ldmatrix_misaligned|ldmatrix: lane 9 gives shared address [0-9]*, not 16-byte aligned|ldmatrix_misaligned_kernel
mma_partial_warp|mma.sync.m16n8k16 with mask 0xffffffff names lane 16, which does not exist|mma_partial_warp_kernel
static_smem_over|static shared memory of the kernel reaches 49156 bytes with big; the limit is 49152|static_smem_over_kernel
dynamic_smem_limits|-|-
smem_total_over|shared memory of the block reaches 233472 bytes with extra (232448 dynamic); the device allows 232448|smem_total_over_kernel
bad_launch|-|-
'

failed=0 checked=0
bad() { echo "FAIL: $1: $2"; sed 's/^/    /' "$tmp/$1.err"; failed=$((failed + 1)); }

listed=$("$prog" --list) || { echo "FAIL: $prog --list"; exit 1; }
[ -n "$listed" ] || { echo "FAIL: $prog lists no case"; exit 1; }
echo "$listed" | while read -r name kind; do
    echo "$expectations" | grep -q "^$name|" || echo "$name"
done > "$tmp/unexpected"
if [ -s "$tmp/unexpected" ]; then
    echo "FAIL: cases without an expectation in emu_checks.sh: $(cat "$tmp/unexpected")"
    failed=$((failed + 1))
fi

while IFS='|' read -r name message kernel; do
    [ -n "$name" ] || continue
    kind=$(echo "$listed" | sed -n "s/^$name //p")
    [ -n "$kind" ] || { echo "FAIL: $name: emu_checks does not list it"; failed=$((failed + 1)); continue; }
    checked=$((checked + 1))
    "$prog" "$name" > "$tmp/$name.out" 2> "$tmp/$name.err"
    status=$?
    if [ "$kind" = runs ]; then
        if [ $status -ne 0 ]; then bad "$name" "exit status $status (correct code must run)"
        else echo "ok: $name"; fi
        continue
    fi
    # abort() is SIGABRT: status 134 from the shell
    [ $status -eq 134 ] || { bad "$name" "exit status $status, expected the emulator's abort (134)"; continue; }
    grep -q '^moetrain CUDA emulator: error: ' "$tmp/$name.err" || { bad "$name" "no emulator error"; continue; }
    grep -q -e "$message" "$tmp/$name.err" || { bad "$name" "the message lacks: $message"; continue; }
    if [ "$kernel" != - ]; then
        grep -q "^  in kernel $kernel launched at [^ ]*emu_checks.cc:[0-9]*, grid" "$tmp/$name.err" ||
            { bad "$name" "the kernel $kernel and its launch site are not named"; continue; }
        # a deadlock names no one thread, it lists where they wait
        grep -q -e '^  block ([0-9]*,[0-9]*,[0-9]*), thread ([0-9]*,[0-9]*,[0-9]*) \[warp [0-9]* lane [0-9]*\]$' \
            -e '^  block ([0-9]*,[0-9]*,[0-9]*)$' "$tmp/$name.err" || { bad "$name" "no block named"; continue; }
        grep -q -e '^  block .*, thread (' -e ' thread(s) from ([0-9]*,[0-9]*,[0-9]*) wait at ' "$tmp/$name.err" ||
            { bad "$name" "no thread named"; continue; }
    fi
    line=$(grep -n "// CHECK: $name\$" "$src" | cut -d: -f1)
    if [ -n "$line" ] && ! grep -q "emu_checks.cc:$line\\b" "$tmp/$name.err"; then
        bad "$name" "the source line emu_checks.cc:$line is not named"
        continue
    fi
    echo "ok: $name reported: $(grep -m1 '^moetrain CUDA emulator: error: ' "$tmp/$name.err" | cut -c31-)"
done <<EOF
$expectations
EOF
echo "$checked cases, $failed failed"
[ $failed -eq 0 ] && [ $checked -gt 0 ]

#!/bin/sh
# The CUDA emulator's streams and events (tests/gpu/emu_streams.cc), in both modes of
# MT_EMU_STREAMS: `ok` (work ordered in every way CUDA provides, results and queries
# checked, deferral observed) must run and report nothing; every other case leaves two
# pieces of device work unordered and must end in the emulator's error naming both,
# their streams and the allocation. Never skipped.
prog="${MT_TOP_BUILDDIR:-.}/tests/gpu/emu_streams"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

alloc='the 1024-byte allocation at 0x[0-9a-f]*'
site='[^ ]*emu_streams.cc:[0-9]*'
# CASE|message the error must contain
expectations="
unordered_streams|add_kernel on stream 2 reads $alloc, which fill_kernel on stream 1 ($site) writes
memcpy_without_sync|cudaMemcpy on the legacy default stream reads $alloc, which fill_kernel on stream 1 ($site) writes
write_after_read|fill_kernel on stream 2 writes $alloc, which add_kernel on stream 1 ($site) reads
struct_argument|add_kernel on stream 2 reads $alloc, which fill_struct_kernel on stream 1 ($site) writes
event_too_early|add_kernel on stream 2 reads $alloc, which fill_kernel on stream 1 ($site) writes
"

failed=0 checked=0
for mode in immediate deferred; do
    checked=$((checked + 1))
    if MT_EMU_STREAMS=$mode "$prog" ok > "$tmp/out" 2>&1; then
        echo "ok: ok ($mode)"
    else
        echo "FAIL: ok ($mode): correct code must run and report nothing"
        sed 's/^/    /' "$tmp/out"
        failed=$((failed + 1))
    fi
    echo "$expectations" | while IFS='|' read -r name message; do
        [ -n "$name" ] || continue
        MT_EMU_STREAMS=$mode "$prog" "$name" > "$tmp/out" 2>&1
        status=$?
        if [ $status -eq 134 ] && grep -q -e "^moetrain CUDA emulator: error: unordered device work: $message" "$tmp/out"; then
            echo "ok: $name ($mode)"
        else
            echo "FAIL: $name ($mode): exit status $status, expected the emulator's abort with: $message"
            sed 's/^/    /' "$tmp/out"
            echo x >> "$tmp/failed"
        fi
    done
    checked=$((checked + 5))
done
[ -f "$tmp/failed" ] && failed=$((failed + $(wc -l < "$tmp/failed")))
echo "$checked checks, $failed failed"
[ $failed -eq 0 ]

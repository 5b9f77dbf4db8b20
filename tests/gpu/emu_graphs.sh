#!/bin/sh
# The CUDA emulator's stream capture and graphs (tests/gpu/emu_graphs.cc), in both modes
# of MT_EMU_STREAMS: `ok` (capture across a fork and a join runs and launches nothing;
# every replay equals the work issued directly, bit for bit; relaxed mode lets an
# allocation through) must pass and report nothing; every other case breaks one rule of
# stream capture and must get CUDA's error, an invalidated capture and the emulator's
# message saying which call and why; `race` must end in the emulator's unordered-work
# error, found while capturing. Never skipped.
prog="${MT_TOP_BUILDDIR:-.}/tests/gpu/emu_graphs"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

cap='moetrain CUDA emulator: stream capture:'
# CASE|message the emulator must print
expectations="
stream_sync|$cap cudaErrorStreamCaptureUnsupported: cudaStreamSynchronize of a capturing stream
device_sync|$cap cudaErrorStreamCaptureUnsupported: cudaDeviceSynchronize waits for the whole device
memcpy|$cap cudaErrorStreamCaptureUnsupported: cudaMemcpy during stream capture
memcpy_async_pageable|$cap cudaErrorStreamCaptureUnsupported: cudaMemcpyAsync with pageable host memory
malloc|$cap cudaErrorStreamCaptureUnsupported: cudaMalloc during stream capture
free|$cap cudaErrorStreamCaptureUnsupported: cudaFree waits for the whole device
event_query|$cap cudaErrorCapturedEvent: cudaEventSynchronize or cudaEventQuery of an event recorded in the capture
legacy|$cap cudaErrorStreamCaptureImplicit: cudaMemset on the legacy default stream while stream 3 (a blocking stream) captures
isolation|$cap cudaErrorStreamCaptureIsolation: cudaStreamWaitEvent of a capturing stream on an event recorded outside
unjoined|$cap cudaErrorStreamCaptureUnjoined: stream 2 joined the capture and its last captured work is not joined back
unmatched|$cap cudaErrorStreamCaptureUnmatched: cudaStreamEndCapture on a stream that joined the capture
"

failed=0 checked=0
for mode in immediate deferred; do
    checked=$((checked + 1))
    if MT_EMU_STREAMS=$mode "$prog" ok > "$tmp/out" 2>&1 && ! grep -q "moetrain CUDA emulator" "$tmp/out"; then
        echo "ok: ok ($mode)"
    else
        echo "FAIL: ok ($mode): correct code must pass and the emulator report nothing"
        sed 's/^/    /' "$tmp/out"
        failed=$((failed + 1))
    fi
    for name in $(echo "$expectations" | cut -d'|' -f1); do
        message=$(echo "$expectations" | grep "^$name|" | cut -d'|' -f2-)
        checked=$((checked + 1))
        if MT_EMU_STREAMS=$mode "$prog" "$name" > "$tmp/out" 2>&1 && grep -qF -e "$message" "$tmp/out"; then
            echo "ok: $name ($mode)"
        else
            echo "FAIL: $name ($mode): expected CUDA's error, an invalidated capture, and: $message"
            sed 's/^/    /' "$tmp/out"
            failed=$((failed + 1))
        fi
    done
    checked=$((checked + 1))
    MT_EMU_STREAMS=$mode "$prog" race > "$tmp/out" 2>&1
    status=$?
    if [ $status -eq 134 ] && grep -q "^moetrain CUDA emulator: error: unordered device work: fill_kernel on stream 1 writes the 1024-byte allocation at 0x[0-9a-f]*, which fill_kernel on stream 2 ([^ ]*emu_graphs.cc:[0-9]*) writes" "$tmp/out"; then
        echo "ok: race ($mode)"
    else
        echo "FAIL: race ($mode): exit status $status, expected the emulator's abort on unordered captured work"
        sed 's/^/    /' "$tmp/out"
        failed=$((failed + 1))
    fi
done
echo "$checked checks, $failed failed"
[ $failed -eq 0 ]

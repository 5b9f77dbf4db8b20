#!/bin/sh
# The CUDA backend's graphs on the emulator (tests/gpu/emu_cuda_graph.cc), in both modes
# of MT_EMU_STREAMS: `ok` (capture once, replays bit-identical to the ops run directly,
# one launch a replay, the graph's own blocks, recapture on a changed signature) must
# pass; each other case breaks a rule of scopes and must fail with its message. Never
# skipped.
prog="${MT_TOP_BUILDDIR:-.}/tests/gpu/emu_cuda_graph"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# CASE|exit status|message: host_read stops in the backend (134, its CUDA error after the
# emulator's reason); the others exit 0 once their own checks of the refusal passed
expectations="
host_read|134|moetrain CUDA emulator: stream capture: cudaErrorStreamCaptureUnsupported: cudaMemcpyAsync with pageable host memory
leak|0|the scope allocated a block and did not free it
foreign_free|0|the scope freed a block allocated before it
nested|0|scopes do not nest
"

failed=0 checked=0
for mode in immediate deferred; do
    checked=$((checked + 1))
    if MT_EMU_STREAMS=$mode "$prog" ok > "$tmp/out" 2>&1 && ! grep -q "FAIL" "$tmp/out"; then
        echo "ok: ok ($mode): $(grep -c '^ok' "$tmp/out") checks"
    else
        echo "FAIL: ok ($mode)"
        sed 's/^/    /' "$tmp/out"
        failed=$((failed + 1))
    fi
    for name in $(echo "$expectations" | cut -d'|' -f1); do
        want=$(echo "$expectations" | grep "^$name|" | cut -d'|' -f2)
        message=$(echo "$expectations" | grep "^$name|" | cut -d'|' -f3-)
        checked=$((checked + 1))
        MT_EMU_STREAMS=$mode "$prog" "$name" > "$tmp/out" 2>&1
        status=$?
        if [ $status -eq "$want" ] && grep -qF -e "$message" "$tmp/out" && ! grep -q "FAIL" "$tmp/out"; then
            echo "ok: $name ($mode)"
        else
            echo "FAIL: $name ($mode): exit status $status (want $want), expected: $message"
            sed 's/^/    /' "$tmp/out"
            failed=$((failed + 1))
        fi
    done
done
echo "$checked checks, $failed failed"
[ $failed -eq 0 ]

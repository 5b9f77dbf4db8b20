#!/bin/sh
# The emulated NCCL inside CUDA graphs (tests/runtime/emu_nccl_graph.cc), in both modes of
# MT_EMU_STREAMS: `ok` (two processes capture an all-reduce and a send/receive group
# between kernels; each of three launches with new inputs equals the eager work, bit for
# bit) must pass and the emulator report nothing; `memcpy` (a synchronous read of the
# captured all-reduce's output) must be refused with the emulator's stream-capture
# message; `host_func` (a CUDA call inside a host function, what a captured NCCL
# operation runs as) must abort with the emulator's message.
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
prog="$MT_TOP_BUILDDIR/tests/runtime/emu_nccl_graph"
use_emulated_nccl 1
MT_EMU_NCCL_TIMEOUT_S=20
export MT_EMU_NCCL_TIMEOUT_S
for mode in immediate deferred; do
    export MT_EMU_STREAMS=$mode
    timeout 120 "$prog" ok > "$tmp/out" 2>&1 && ! grep -q "moetrain CUDA emulator" "$tmp/out" &&
        [ "$(grep -c '^ok: rank [01]: 3 launches' "$tmp/out")" = 2 ] ||
        { cat "$tmp/out"; fail "ok ($mode): captured NCCL operations must replay as eager ones"; }
    echo "ok: ok ($mode)"
    timeout 120 "$prog" memcpy > "$tmp/out" 2>&1 &&
        [ "$(grep -c 'moetrain CUDA emulator: stream capture: cudaErrorStreamCaptureUnsupported: cudaMemcpy during stream capture' "$tmp/out")" = 2 ] ||
        { cat "$tmp/out"; fail "memcpy ($mode): the read during capture must be refused on both ranks"; }
    echo "ok: memcpy ($mode)"
    timeout 60 "$prog" host_func > "$tmp/out" 2>&1
    status=$?
    [ $status -eq 134 ] &&
        grep -qF 'cudaStreamSynchronize called inside a host function (cudaLaunchHostFunc): CUDA forbids CUDA calls' "$tmp/out" ||
        { cat "$tmp/out"; fail "host_func ($mode): exit $status, expected the emulator's abort"; }
    echo "ok: host_func ($mode)"
done

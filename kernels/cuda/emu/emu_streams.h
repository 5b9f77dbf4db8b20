// The CUDA execution emulator: device work on streams (emu_streams.cc).
//
// Every piece of device work (a kernel, a copy, a memset, a cuBLASLt matmul, a sort) is
// issued with the device memory it reads and writes. The emulator keeps a vector clock
// per stream, per event and for the host, so it knows, for every piece of work, which
// earlier work CUDA guarantees to have finished before it starts (the same stream,
// cudaStreamWaitEvent on a recorded event, the legacy default stream's implicit
// synchronisation, the host's synchronisations). Work that touches device memory that
// other work wrote (or that writes memory other work read) without such an order is an
// error naming both, whatever the mode.
//
// MT_EMU_STREAMS selects when the work runs: `immediate` (the default) runs it when it
// is issued; `deferred` queues it per stream and runs it only when something waits for
// it (a synchronisation, a blocking copy, cudaFree, an event or stream query), each
// piece after exactly the work it is ordered after, other streams' work left queued as
// long as CUDA allows: results that depend on an order the program never asked for
// change.
#ifndef MT_KERNELS_CUDA_EMU_STREAMS_H
#define MT_KERNELS_CUDA_EMU_STREAMS_H

#include <cuda_runtime.h>
#include <stddef.h>

#include <functional>
#include <vector>

namespace mt_emu {

// [p, p + bytes) read or written by a piece of work; bytes 0 means the whole device
// allocation holding p. Pointers outside device allocations are ignored.
struct mem_access {
    const void *p;
    size_t bytes;
    bool write;
};

// Issues `work` on `stream`: runs it now or queues it (MT_EMU_STREAMS), after checking
// that everything it touches is ordered after the work that touched it before. `what`
// and file:line name it in reports. On a capturing stream the work becomes a node of
// the capture's graph instead, checked against the graph's other nodes. False (the
// error as the last error, with a message) when stream capture refuses it: the
// capture is invalidated, or it is legacy-stream work while a blocking stream captures.
bool stream_work(cudaStream_t stream, const char *what, const char *file, int line, const mem_access *acc, size_t nacc,
                 std::function<void()> work);

// Appends an access for every aligned word of an argument block that points into a
// device allocation (a kernel's parameter struct does not say what it writes: `write`).
void scan_pointers(const void *block, size_t bytes, bool write, std::vector<mem_access> &out);

// The host waits for `stream` (cudaStreamSynchronize semantics; null: the legacy stream).
void host_waits_stream(cudaStream_t stream);

// Stream capture (cudaStreamBeginCapture .. cudaStreamEndCapture; doc/cuda-emulator.md,
// "Stream capture and graphs"). Whether the stream belongs to a capture sequence now;
// the refusals of calls a capture cannot hold, each returning cudaSuccess when the call
// may go on, else the error (printed, the last error, the capture(s) invalidated):
bool capturing(cudaStream_t stream);
// a potentially unsafe call (cudaMalloc, cudaMallocHost, synchronous cudaMemcpy) while a
// capture not begun in relaxed mode is under way and the thread's mode is not relaxed
cudaError_t capture_refuses_unsafe(const char *api);
// a call that waits for the whole device (cudaDeviceSynchronize, cudaFree, cudaFreeHost)
cudaError_t capture_refuses_device_wait(const char *api);
// a copy with pageable host memory (which makes the host wait) on a capturing stream
cudaError_t capture_refuses_pageable(cudaStream_t stream, const char *api);

// What the program made the host do, as the emulated device saw it: kernel launches and
// cuBLASLt matmuls (none while capturing; a graph launch is one); the host's waits for the device through the runtime (stream, event
// and device synchronisations, cudaMemcpy, cudaFree, cudaFreeHost), not counting the
// emulated NCCL's own waits for a call's stream (NCCL enqueues; a GPU's host does not
// wait there). The CUDA backend counts the same by itself (struct mt_op_counts).
void note_launch();
void note_host_sync();

} // namespace mt_emu

extern "C" {
// The counts of note_launch and note_host_sync since the process started.
void mt_emu_counts(long long *launches, long long *host_syncs);
// cudaStreamSynchronize for the emulated NCCL: the same wait, not counted.
cudaError_t mt_emu_stream_wait(cudaStream_t stream);
}

#endif

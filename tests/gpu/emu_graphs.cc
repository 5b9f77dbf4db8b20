// The CUDA emulator's stream capture and graphs (emu_graphs.sh runs each case in a
// process of its own, under MT_EMU_STREAMS=immediate and =deferred).
//
//   emu_graphs CASE
//
// `ok` captures work on two streams (a fork and a join), checks that capture runs
// nothing and launches nothing, and that each replay of the graph gives, bit for bit,
// what the same work issued directly gives, reading its inputs at replay; relaxed mode
// and the thread's capture mode let an allocation through. Every other case breaks one
// rule of stream capture: the call must return CUDA's error, the capture must end
// invalidated (cudaStreamEndCapture returns no graph), and the emulator must say why
// (emu_graphs.sh checks the message); `race` leaves two captured kernels unordered and
// must end in the emulator's "unordered device work" error.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_launch.cuh"
#include "tests/gpu/emu_test.h"

extern "C" void mt_emu_counts(long long *launches, long long *host_syncs);

static int failures;
static void expect(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "emu_graphs: FAIL: %s\n", what);
        failures++;
    }
}

enum { N = 256 };

static float *dev()
{
    void *p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, N * sizeof(float)));
    CHECK_CUDA(cudaMemset(p, 0, N * sizeof(float)));
    return static_cast<float *>(p);
}

static cudaStream_t stream(bool blocking)
{
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking));
    return s;
}

static cudaEvent_t event()
{
    cudaEvent_t e;
    CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
}

__global__ static void fill_kernel(float *x, float v) { x[blockIdx.x * blockDim.x + threadIdx.x] = v; }

// y = x * a + b, in an order of operations whose rounding depends on the values
__global__ static void axpb_kernel(float *y, const float *x, float a, float b)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[i] * a + b / (float)(i + 1);
}

static void fill(float *x, float v, cudaStream_t s) { MT_LAUNCH(N / 64, 64, 0, s, fill_kernel)(x, v); }
static void axpb(float *y, const float *x, float a, float b, cudaStream_t s)
{
    MT_LAUNCH(N / 64, 64, 0, s, axpb_kernel)(y, x, a, b);
}

static long long launches()
{
    long long l, h;
    mt_emu_counts(&l, &h);
    return l;
}

static cudaStreamCaptureStatus status(cudaStream_t s)
{
    cudaStreamCaptureStatus st;
    CHECK_CUDA(cudaStreamIsCapturing(s, &st));
    return st;
}

// The work of `ok`: y = x a + b on s; z from y on s2 (forked by an event); y from z on
// s again after s2 (joined by another).
struct work {
    float *x, *y, *z;
    cudaStream_t s, s2;
    cudaEvent_t fork, join;
};

static void issue(const work &w)
{
    axpb(w.y, w.x, 1.5f, 0.1f, w.s);
    CHECK_CUDA(cudaEventRecord(w.fork, w.s));
    CHECK_CUDA(cudaStreamWaitEvent(w.s2, w.fork, 0));
    axpb(w.z, w.y, -0.7f, 3.0f, w.s2);
    CHECK_CUDA(cudaEventRecord(w.join, w.s2));
    CHECK_CUDA(cudaStreamWaitEvent(w.s, w.join, 0));
    axpb(w.y, w.z, 1.0f / 3.0f, -2.0f, w.s);
}

static void case_ok(bool deferred)
{
    float hx[N], hy[N], hz[N], ey[N], ez[N], zero[N] = {0};
    work w = {dev(), dev(), dev(), stream(false), stream(false), event(), event()};
    CHECK_CUDA(cudaDeviceSynchronize());

    // capture: nothing runs, nothing is launched
    const long long before = launches();
    expect(status(w.s) == cudaStreamCaptureStatusNone, "not capturing before cudaStreamBeginCapture");
    CHECK_CUDA(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal));
    expect(status(w.s) == cudaStreamCaptureStatusActive, "capturing after cudaStreamBeginCapture");
    issue(w);
    expect(status(w.s2) == cudaStreamCaptureStatusActive, "the forked stream joined the capture");
    cudaGraph_t g;
    CHECK_CUDA(cudaStreamEndCapture(w.s, &g));
    expect(status(w.s) == cudaStreamCaptureStatusNone && status(w.s2) == cudaStreamCaptureStatusNone,
           "no stream captures after cudaStreamEndCapture");
    expect(launches() == before, "capture launches nothing");
    size_t nodes = 0;
    CHECK_CUDA(cudaGraphGetNodes(g, nullptr, &nodes));
    expect(nodes == 3, "the graph holds the three kernels");
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(hy, w.y, sizeof hy, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hz, w.z, sizeof hz, cudaMemcpyDeviceToHost));
    expect(!memcmp(hy, zero, sizeof hy) && !memcmp(hz, zero, sizeof hz), "capture ran nothing");

    cudaGraphExec_t x;
    CHECK_CUDA(cudaGraphInstantiate(&x, g, 0));
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) hx[i] = (float)((i * 7919 + round * 104729) % 1000) / 37.0f - 13.0f;
        // eager: the same work issued directly
        CHECK_CUDA(cudaMemcpy(w.x, hx, sizeof hx, cudaMemcpyHostToDevice));
        issue(w);
        CHECK_CUDA(cudaStreamSynchronize(w.s));
        CHECK_CUDA(cudaMemcpy(ey, w.y, sizeof ey, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(ez, w.z, sizeof ez, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemset(w.y, 0, sizeof hy));
        CHECK_CUDA(cudaMemset(w.z, 0, sizeof hz));
        CHECK_CUDA(cudaDeviceSynchronize());
        // replay: reads x as it is now
        const long long l0 = launches();
        CHECK_CUDA(cudaGraphLaunch(x, w.s));
        expect(launches() == l0 + 1, "a graph launch is one launch");
        // (the emulator's device memory is the host's: a peek, not a copy)
        if (deferred) expect(w.y[0] == 0.0f, "deferred: the graph's work waits until something needs it");
        CHECK_CUDA(cudaStreamSynchronize(w.s));
        CHECK_CUDA(cudaMemcpy(hy, w.y, sizeof hy, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(hz, w.z, sizeof hz, cudaMemcpyDeviceToHost));
        expect(!memcmp(hy, ey, sizeof hy) && !memcmp(hz, ez, sizeof hz), "replay equals eager work, bit for bit");
    }
    // two launches back to back on one stream: the second after the first
    CHECK_CUDA(cudaGraphLaunch(x, w.s));
    CHECK_CUDA(cudaGraphLaunch(x, w.s));
    CHECK_CUDA(cudaStreamSynchronize(w.s));
    CHECK_CUDA(cudaGraphExecDestroy(x));
    CHECK_CUDA(cudaGraphDestroy(g));
    expect(cudaGraphLaunch(x, w.s) == cudaErrorInvalidResourceHandle, "a destroyed graph is not a graph");
    (void)cudaGetLastError();

    // relaxed mode: an allocation during capture is the program's business
    CHECK_CUDA(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeRelaxed));
    void *p = nullptr;
    expect(cudaMalloc(&p, 64) == cudaSuccess, "cudaMalloc in a relaxed capture");
    fill(w.y, 2.0f, w.s);
    CHECK_CUDA(cudaStreamEndCapture(w.s, &g));
    CHECK_CUDA(cudaGraphDestroy(g));
    // a global capture, with the thread's mode relaxed around the allocation
    CHECK_CUDA(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal));
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&m));
    expect(m == cudaStreamCaptureModeGlobal, "the thread's mode was global");
    expect(cudaMalloc(&p, 64) == cudaSuccess, "cudaMalloc with the thread's mode relaxed");
    CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&m));
    fill(w.y, 3.0f, w.s);
    CHECK_CUDA(cudaStreamEndCapture(w.s, &g));
    CHECK_CUDA(cudaGraphDestroy(g));
}

// ---------------------------------------------------------------- broken rules

static bool refused(cudaError_t got, cudaError_t want, const char *what)
{
    if (got != want) {
        fprintf(stderr, "emu_graphs: FAIL: %s returned %d (%s), expected %d (%s)\n", what, (int)got,
                cudaGetErrorString(got), (int)want, cudaGetErrorString(want));
        failures++;
        return false;
    }
    return true;
}

int main(int argc, char **argv)
{
    const char *c = argc > 1 ? argv[1] : "";
    const char *mode = getenv("MT_EMU_STREAMS");
    const bool deferred = mode && !strcmp(mode, "deferred");
    if (!strcmp(c, "ok")) {
        case_ok(deferred);
        if (failures) return 1;
        printf("emu_graphs: ok (%s)\n", deferred ? "deferred" : "immediate");
        return 0;
    }
    // every other case: buffers and streams first (allocation is refused during capture)
    float *x = dev(), *y = dev();
    static float pageable[N];
    cudaStream_t s = stream(false), s2 = stream(false), b = stream(true);
    cudaEvent_t e = event();
    CHECK_CUDA(cudaDeviceSynchronize());
    cudaStream_t origin = !strcmp(c, "legacy") ? b : s;
    if (!strcmp(c, "isolation")) {
        fill(x, 1.0f, s2);
        CHECK_CUDA(cudaEventRecord(e, s2)); // outside any capture
    }
    CHECK_CUDA(cudaStreamBeginCapture(origin, cudaStreamCaptureModeGlobal));
    fill(x, 1.0f, origin);
    if (!strcmp(c, "stream_sync")) {
        refused(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize");
        fill(y, 1.0f, s); // further work is refused too
        refused(cudaGetLastError(), cudaErrorStreamCaptureInvalidated, "a launch into an invalidated capture");
    } else if (!strcmp(c, "device_sync")) {
        refused(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported, "cudaDeviceSynchronize");
    } else if (!strcmp(c, "memcpy")) {
        refused(cudaMemcpy(pageable, x, sizeof pageable, cudaMemcpyDeviceToHost), cudaErrorStreamCaptureUnsupported,
                "cudaMemcpy");
    } else if (!strcmp(c, "memcpy_async_pageable")) {
        refused(cudaMemcpyAsync(pageable, x, sizeof pageable, cudaMemcpyDeviceToHost, s),
                cudaErrorStreamCaptureUnsupported, "cudaMemcpyAsync to pageable memory");
    } else if (!strcmp(c, "malloc")) {
        void *p = reinterpret_cast<void *>(1);
        refused(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported, "cudaMalloc");
        expect(p == nullptr, "a refused cudaMalloc gives no pointer");
    } else if (!strcmp(c, "free")) {
        refused(cudaFree(y), cudaErrorStreamCaptureUnsupported, "cudaFree");
    } else if (!strcmp(c, "event_query")) {
        CHECK_CUDA(cudaEventRecord(e, s));
        refused(cudaEventQuery(e), cudaErrorCapturedEvent, "cudaEventQuery of an event recorded in the capture");
    } else if (!strcmp(c, "legacy")) {
        refused(cudaMemsetAsync(y, 0, N * sizeof(float), nullptr), cudaErrorStreamCaptureImplicit,
                "cudaMemsetAsync on the legacy stream");
    } else if (!strcmp(c, "isolation")) {
        refused(cudaStreamWaitEvent(s, e, 0), cudaErrorStreamCaptureIsolation,
                "cudaStreamWaitEvent on an event recorded outside");
    } else if (!strcmp(c, "unjoined")) {
        CHECK_CUDA(cudaEventRecord(e, s));
        CHECK_CUDA(cudaStreamWaitEvent(s2, e, 0));
        fill(y, 2.0f, s2); // never joined back into s
        cudaGraph_t g = reinterpret_cast<cudaGraph_t>(1);
        refused(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureUnjoined, "cudaStreamEndCapture");
        expect(g == nullptr, "no graph from an unjoined capture");
        return failures ? 1 : 0;
    } else if (!strcmp(c, "unmatched")) {
        CHECK_CUDA(cudaEventRecord(e, s));
        CHECK_CUDA(cudaStreamWaitEvent(s2, e, 0));
        cudaGraph_t g;
        refused(cudaStreamEndCapture(s2, &g), cudaErrorStreamCaptureUnmatched, "cudaStreamEndCapture on a fork");
    } else if (!strcmp(c, "race")) {
        CHECK_CUDA(cudaEventRecord(e, s));
        CHECK_CUDA(cudaStreamWaitEvent(s2, e, 0));
        fill(y, 2.0f, s2);
        fill(y, 3.0f, s); // unordered with the fork's write: the emulator aborts here
        fprintf(stderr, "emu_graphs: race: the emulator reported nothing\n");
        return 1;
    } else {
        fprintf(stderr, "usage: emu_graphs ok|stream_sync|device_sync|memcpy|memcpy_async_pageable|malloc|free|"
                        "event_query|legacy|isolation|unjoined|unmatched|race\n");
        return 2;
    }
    cudaGraph_t g = reinterpret_cast<cudaGraph_t>(1);
    expect(cudaStreamEndCapture(origin, &g) == cudaErrorStreamCaptureInvalidated,
           "cudaStreamEndCapture returns cudaErrorStreamCaptureInvalidated");
    expect(g == nullptr, "no graph from an invalidated capture");
    return failures ? 1 : 0;
}

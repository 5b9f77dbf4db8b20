// The CUDA emulator's streams and events (emu_streams.sh runs each case in a process
// of its own, under MT_EMU_STREAMS=immediate and =deferred).
//
//   emu_streams CASE
//
// `ok` orders work across streams in every way CUDA provides (events, the legacy
// default stream with blocking streams, host synchronisation, cudaFree) and checks the
// results, the queries' answers and, when deferred, that work waits until something
// needs it; it fails if the emulator reports anything. Every other case leaves two
// pieces of work unordered and must end in the emulator's "unordered device work" error.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_launch.cuh"
#include "tests/gpu/emu_test.h"

static int failures;
static void expect(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "emu_streams: FAIL: %s\n", what);
        failures++;
    }
}

enum { N = 256 };

static float *dev()
{
    void *p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, N * sizeof(float)));
    return static_cast<float *>(p);
}

static cudaStream_t stream(bool blocking)
{
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking));
    return s;
}

__global__ static void fill_kernel(float *x, float v) { x[blockIdx.x * blockDim.x + threadIdx.x] = v; }

__global__ static void add_kernel(float *y, const float *x, float v)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[i] + v;
}

struct holder {
    int n;
    float *p;
};
__global__ static void fill_struct_kernel(holder h, float v) { h.p[blockIdx.x * blockDim.x + threadIdx.x] = v; }

static void fill(float *x, float v, cudaStream_t s) { MT_LAUNCH(N / 64, 64, 0, s, fill_kernel)(x, v); }
static void add(float *y, const float *x, float v, cudaStream_t s)
{
    MT_LAUNCH(N / 64, 64, 0, s, add_kernel)(y, x, v);
}

static bool all(const float *h, float v)
{
    for (int i = 0; i < N; i++)
        if (h[i] != v) return false;
    return true;
}

static void case_ok(bool deferred)
{
    float h[N];
    float *x = dev(), *y = dev(), *z = dev();
    cudaStream_t s1 = stream(false), s2 = stream(false), b = stream(true);
    cudaEvent_t e;
    CHECK_CUDA(cudaEventCreate(&e));

    // an event orders s2 after s1
    fill(x, 1.0f, s1);
    if (deferred) expect(x[0] != 1.0f, "deferred: the kernel ran before anything waited for it");
    CHECK_CUDA(cudaEventRecord(e, s1));
    CHECK_CUDA(cudaStreamWaitEvent(s2, e, 0));
    add(y, x, 1.0f, s2);
    CHECK_CUDA(cudaStreamSynchronize(s2));
    CHECK_CUDA(cudaMemcpy(h, y, sizeof h, cudaMemcpyDeviceToHost));
    expect(all(h, 2.0f), "event: y = x + 1 after x = 1");

    // the legacy default stream waits for a blocking stream
    fill(z, 3.0f, b);
    CHECK_CUDA(cudaMemcpy(h, z, sizeof h, cudaMemcpyDeviceToHost));
    expect(all(h, 3.0f), "legacy stream after a blocking stream");

    // queries: "not ready" once after new work, then done
    fill(x, 4.0f, s1);
    const cudaError_t q1 = cudaStreamQuery(s1);
    const cudaError_t q2 = cudaStreamQuery(s1);
    expect(q1 == cudaErrorNotReady && q2 == cudaSuccess, "cudaStreamQuery: not ready, then ready");
    fill(x, 5.0f, s1);
    CHECK_CUDA(cudaEventRecord(e, s1));
    const cudaError_t e1 = cudaEventQuery(e);
    const cudaError_t e2 = cudaEventQuery(e);
    expect(e1 == cudaErrorNotReady && e2 == cudaSuccess, "cudaEventQuery: not ready, then ready");
    CHECK_CUDA(cudaMemcpyAsync(h, x, sizeof h, cudaMemcpyDeviceToHost, s1)); // pageable: returns when done
    expect(all(h, 5.0f), "cudaMemcpyAsync to pageable memory after the query");

    // a copy from pageable memory reads it when issued
    for (int i = 0; i < N; i++) h[i] = 6.0f;
    CHECK_CUDA(cudaMemcpyAsync(x, h, sizeof h, cudaMemcpyHostToDevice, s1));
    for (int i = 0; i < N; i++) h[i] = -1.0f;
    CHECK_CUDA(cudaStreamSynchronize(s1));
    CHECK_CUDA(cudaMemcpyAsync(h, x, sizeof h, cudaMemcpyDeviceToHost, s1));
    expect(all(h, 6.0f), "cudaMemcpyAsync from pageable memory staged at the call");

    // cudaFree waits for the whole device
    float *w = dev();
    fill(y, 7.0f, s2);
    CHECK_CUDA(cudaFree(w));
    CHECK_CUDA(cudaMemcpy(h, y, sizeof h, cudaMemcpyDeviceToHost));
    expect(all(h, 7.0f), "cudaFree synchronises the device");

    // one stream reads, another writes after an event
    add(z, y, 1.0f, s1);
    CHECK_CUDA(cudaEventRecord(e, s1));
    CHECK_CUDA(cudaStreamWaitEvent(s2, e, 0));
    fill(y, 0.0f, s2);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(h, z, sizeof h, cudaMemcpyDeviceToHost));
    expect(all(h, 8.0f), "a read on one stream before a write on another");

    // an event destroyed and a stream destroyed with work queued: the work still runs
    fill(x, 9.0f, s1);
    CHECK_CUDA(cudaStreamDestroy(s1));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(h, x, sizeof h, cudaMemcpyDeviceToHost));
    expect(all(h, 9.0f), "cudaStreamDestroy lets queued work finish");
    expect(cudaStreamSynchronize(s1) == cudaErrorInvalidResourceHandle, "a destroyed stream is not a stream");
    CHECK_CUDA(cudaEventDestroy(e));
    expect(cudaEventQuery(e) == cudaErrorInvalidResourceHandle, "a destroyed event is not an event");
    (void)cudaGetLastError();
}

// ---------------------------------------------------------------- unordered work

static void case_unordered_streams()
{
    float *x = dev(), *y = dev();
    cudaStream_t s1 = stream(false), s2 = stream(false);
    fill(x, 1.0f, s1);
    add(y, x, 1.0f, s2); // no event: may run before the fill
}

static void case_memcpy_without_sync()
{
    float h[N];
    float *x = dev();
    fill(x, 1.0f, stream(false));
    CHECK_CUDA(cudaMemcpy(h, x, sizeof h, cudaMemcpyDeviceToHost)); // the legacy stream does not wait for it
}

static void case_write_after_read()
{
    float *x = dev(), *y = dev();
    CHECK_CUDA(cudaMemset(x, 0, N * sizeof(float)));
    CHECK_CUDA(cudaDeviceSynchronize());
    cudaStream_t s1 = stream(false), s2 = stream(false);
    add(y, x, 1.0f, s1);
    fill(x, 2.0f, s2); // may overwrite x before s1 reads it
}

static void case_struct_argument()
{
    float *x = dev(), *y = dev();
    cudaStream_t s1 = stream(false), s2 = stream(false);
    MT_LAUNCH(N / 64, 64, 0, s1, fill_struct_kernel)(holder{N, x}, 1.0f);
    add(y, x, 1.0f, s2);
}

static void case_event_too_early()
{
    float *x = dev(), *y = dev();
    cudaStream_t s1 = stream(false), s2 = stream(false);
    cudaEvent_t e;
    CHECK_CUDA(cudaEventCreate(&e));
    CHECK_CUDA(cudaEventRecord(e, s1)); // recorded before the work it should follow
    fill(x, 1.0f, s1);
    CHECK_CUDA(cudaStreamWaitEvent(s2, e, 0));
    add(y, x, 1.0f, s2);
}

int main(int argc, char **argv)
{
    const char *c = argc > 1 ? argv[1] : "";
    const char *m = getenv("MT_EMU_STREAMS");
    const bool deferred = m && !strcmp(m, "deferred");
    if (!strcmp(c, "ok")) case_ok(deferred);
    else if (!strcmp(c, "unordered_streams")) case_unordered_streams();
    else if (!strcmp(c, "memcpy_without_sync")) case_memcpy_without_sync();
    else if (!strcmp(c, "write_after_read")) case_write_after_read();
    else if (!strcmp(c, "struct_argument")) case_struct_argument();
    else if (!strcmp(c, "event_too_early")) case_event_too_early();
    else {
        fprintf(stderr, "usage: emu_streams ok|unordered_streams|memcpy_without_sync|write_after_read|"
                        "struct_argument|event_too_early\n");
        return 2;
    }
    if (strcmp(c, "ok")) {
        fprintf(stderr, "emu_streams: %s: the emulator reported nothing\n", c);
        return 1;
    }
    if (failures) return 1;
    printf("emu_streams: ok (%s)\n", deferred ? "deferred" : "immediate");
    return 0;
}

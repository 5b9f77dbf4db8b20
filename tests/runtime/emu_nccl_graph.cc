// The emulated NCCL inside CUDA graphs (kernels/cuda/emu/emu_nccl.cc, doc/cuda-emulator.md
// "NCCL"), on the CUDA emulator, with libnccl.so.2 opened from LD_LIBRARY_PATH as moetrain
// opens it (emu_nccl_graph.sh runs each case under MT_EMU_STREAMS=immediate and =deferred).
//
//   emu_nccl_graph CASE
//
// `ok`: two forked processes capture, between kernels, an all-reduce and a group of a send
// and a receive (the ranks swap their sums) into a graph; the capture runs nothing; the
// graph is launched three times with new input data each time, and every launch gives, bit
// for bit, what the same work issued directly gives. `memcpy`: a synchronous read of the
// all-reduce's output during the capture is refused (the capture invalidated), as without
// NCCL. `host_func`: a CUDA call inside a host function (what a captured NCCL operation
// runs as) aborts with the emulator's message.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cuda/cuda_launch.cuh"
#include "tests/gpu/emu_test.h"

enum { N = 256 };

static int failures;
static void expect(bool ok, int rank, const char *what)
{
    if (!ok) {
        fprintf(stderr, "emu_nccl_graph: rank %d: FAIL: %s\n", rank, what);
        failures++;
    }
}

// The NCCL calls used, from the library the loader finds.
static struct {
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*init)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*destroy)(ncclComm_t);
    const char *(*last_error)(ncclComm_t);
} nccl;

static void load_nccl()
{
    void *h = dlopen("libnccl.so.2", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "emu_nccl_graph: %s\n", dlerror());
        exit(1);
    }
    const struct {
        void **fn;
        const char *name;
    } syms[] = {{(void **)&nccl.get_unique_id, "ncclGetUniqueId"}, {(void **)&nccl.init, "ncclCommInitRankConfig"},
                {(void **)&nccl.all_reduce, "ncclAllReduce"},      {(void **)&nccl.send, "ncclSend"},
                {(void **)&nccl.recv, "ncclRecv"},                 {(void **)&nccl.group_start, "ncclGroupStart"},
                {(void **)&nccl.group_end, "ncclGroupEnd"},        {(void **)&nccl.destroy, "ncclCommDestroy"},
                {(void **)&nccl.last_error, "ncclGetLastError"}};
    for (const auto &s : syms)
        if (!(*s.fn = dlsym(h, s.name))) {
            fprintf(stderr, "emu_nccl_graph: libnccl.so.2 lacks %s\n", s.name);
            exit(1);
        }
}

#define CHECK_NCCL(call)                                                                                   \
    do {                                                                                                   \
        const ncclResult_t r_ = (call);                                                                    \
        if (r_ != ncclSuccess) {                                                                           \
            fprintf(stderr, "%s:%d: %s: %d (%s)\n", __FILE__, __LINE__, #call, r_, nccl.last_error(NULL)); \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

// y = x a + b / (i + 1): a rounding that depends on the values
__global__ static void axpb_kernel(float *y, const float *x, float a, float b)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[i] * a + b / (float)(i + 1);
}

// out = mine - 0.25 theirs
__global__ static void mix_kernel(float *out, const float *mine, const float *theirs)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = mine[i] - 0.25f * theirs[i];
}

struct bufs {
    float *in, *x, *sum, *swapped, *out;
    cudaStream_t s;
    ncclComm_t comm;
    int rank;
};

static float *dev()
{
    void *p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, N * sizeof(float)));
    CHECK_CUDA(cudaMemset(p, 0, N * sizeof(float)));
    return static_cast<float *>(p);
}

// The work: a kernel, an all-reduce, the ranks' sums swapped by a group of a send and a
// receive, a kernel; all on one stream.
static void issue(const bufs &b)
{
    MT_LAUNCH(N / 64, 64, 0, b.s, axpb_kernel)(b.x, b.in, 1.0f + (float)b.rank, 0.3f);
    CHECK_NCCL(nccl.all_reduce(b.x, b.sum, N, ncclFloat32, ncclSum, b.comm, b.s));
    MT_LAUNCH(N / 64, 64, 0, b.s, axpb_kernel)(b.sum, b.sum, 0.5f, (float)b.rank);
    CHECK_NCCL(nccl.group_start());
    CHECK_NCCL(nccl.send(b.sum, N, ncclFloat32, 1 - b.rank, b.comm, b.s));
    CHECK_NCCL(nccl.recv(b.swapped, N, ncclFloat32, 1 - b.rank, b.comm, b.s));
    CHECK_NCCL(nccl.group_end());
    MT_LAUNCH(N / 64, 64, 0, b.s, mix_kernel)(b.out, b.sum, b.swapped);
}

static void read(float *h, const float *d) { CHECK_CUDA(cudaMemcpy(h, d, N * sizeof(float), cudaMemcpyDeviceToHost)); }

static int rank_ok(int rank, ncclUniqueId id)
{
    bufs b = {dev(), dev(), dev(), dev(), dev(), nullptr, nullptr, rank};
    CHECK_CUDA(cudaStreamCreateWithFlags(&b.s, cudaStreamNonBlocking));
    CHECK_NCCL(nccl.init(&b.comm, 2, id, rank, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    float h[N], eager[N], graph[N], zero[N] = {0};

    cudaGraph_t g;
    CHECK_CUDA(cudaStreamBeginCapture(b.s, cudaStreamCaptureModeGlobal));
    issue(b);
    CHECK_CUDA(cudaStreamEndCapture(b.s, &g));
    size_t nodes = 0;
    CHECK_CUDA(cudaGraphGetNodes(g, nullptr, &nodes));
    expect(nodes == 5, rank, "the graph holds 3 kernels, the all-reduce and the send/receive group");
    CHECK_CUDA(cudaDeviceSynchronize());
    read(h, b.sum);
    expect(!memcmp(h, zero, sizeof h), rank, "capture ran no all-reduce");
    read(h, b.out);
    expect(!memcmp(h, zero, sizeof h), rank, "capture ran nothing");

    cudaGraphExec_t x;
    CHECK_CUDA(cudaGraphInstantiate(&x, g, 0));
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) h[i] = (float)((i * 7919 + round * 104729 + rank * 31) % 1000) / 37.0f - 13.0f;
        CHECK_CUDA(cudaMemcpy(b.in, h, sizeof h, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaDeviceSynchronize());
        issue(b);
        CHECK_CUDA(cudaStreamSynchronize(b.s));
        read(eager, b.out);
        CHECK_CUDA(cudaMemsetAsync(b.out, 0, sizeof h, b.s));
        CHECK_CUDA(cudaMemsetAsync(b.sum, 0, sizeof h, b.s));
        CHECK_CUDA(cudaMemsetAsync(b.swapped, 0, sizeof h, b.s));
        CHECK_CUDA(cudaGraphLaunch(x, b.s));
        CHECK_CUDA(cudaStreamSynchronize(b.s));
        read(graph, b.out);
        expect(!memcmp(eager, graph, sizeof h), rank, "a launch of the graph gives the eager results, bit for bit");
        expect(memcmp(eager, zero, sizeof h) != 0, rank, "the results are not all zero");
    }
    CHECK_CUDA(cudaGraphExecDestroy(x));
    CHECK_CUDA(cudaGraphDestroy(g));
    CHECK_NCCL(nccl.destroy(b.comm));
    if (!failures) printf("ok: rank %d: 3 launches of the captured all-reduce and send/receive group equal eager\n", rank);
    return failures ? 1 : 0;
}

// A synchronous read of the captured all-reduce's output: refused, the capture invalidated.
static int rank_memcpy(int rank, ncclUniqueId id)
{
    bufs b = {dev(), dev(), dev(), dev(), dev(), nullptr, nullptr, rank};
    CHECK_CUDA(cudaStreamCreateWithFlags(&b.s, cudaStreamNonBlocking));
    CHECK_NCCL(nccl.init(&b.comm, 2, id, rank, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    float h[N];
    CHECK_CUDA(cudaStreamBeginCapture(b.s, cudaStreamCaptureModeGlobal));
    CHECK_NCCL(nccl.all_reduce(b.in, b.sum, N, ncclFloat32, ncclSum, b.comm, b.s));
    const cudaError_t e = cudaMemcpy(h, b.sum, sizeof h, cudaMemcpyDeviceToHost);
    expect(e == cudaErrorStreamCaptureUnsupported, rank, "cudaMemcpy during the capture is refused");
    cudaGraph_t g;
    expect(cudaStreamEndCapture(b.s, &g) == cudaErrorStreamCaptureInvalidated && !g, rank,
           "the capture ends invalidated, with no graph");
    (void)cudaGetLastError();
    CHECK_NCCL(nccl.destroy(b.comm));
    return failures ? 1 : 0;
}

static void sync_inside(void *stream) { (void)cudaStreamSynchronize(static_cast<cudaStream_t>(stream)); }

static int case_host_func()
{
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_CUDA(cudaLaunchHostFunc(s, sync_inside, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    fprintf(stderr, "emu_nccl_graph: FAIL: a CUDA call inside a host function went through\n");
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: emu_nccl_graph ok|memcpy|host_func\n");
        return 2;
    }
    if (!strcmp(argv[1], "host_func")) return case_host_func();
    int (*run)(int, ncclUniqueId) = !strcmp(argv[1], "ok") ? rank_ok : !strcmp(argv[1], "memcpy") ? rank_memcpy : nullptr;
    if (!run) {
        fprintf(stderr, "emu_nccl_graph: unknown case %s\n", argv[1]);
        return 2;
    }
    load_nccl();
    ncclUniqueId id;
    CHECK_NCCL(nccl.get_unique_id(&id));
    fflush(stdout);
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        pid[r] = fork();
        if (pid[r] < 0) return 1;
        if (pid[r] == 0) {
            const int rc = run(r, id);
            fflush(stdout);
            _exit(rc);
        }
    }
    int bad = 0;
    for (int r = 0; r < 2; r++) {
        int st;
        waitpid(pid[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "emu_nccl_graph: rank %d failed (status %d)\n", r, st);
            bad = 1;
        }
    }
    return bad;
}

// CUDA backend: CUDA graphs (struct mt_graph_ops in kernels/kernels.h; doc/host-overhead.md,
// "CUDA graphs").
//
// A scope is captured on the compute stream in global mode, so that any call a graph
// cannot hold (a synchronisation, a host read of device memory, cudaMalloc outside the
// caching allocator) invalidates the capture and is reported at end, not replayed
// wrongly. Device memory inside a scope comes from the caching allocator: a block the
// scope allocates and frees is the graph's from then on (each replay uses it; nothing
// else is handed it), which is what keeps a replay from writing memory that has another
// owner by then. A block allocated in the scope and not freed in it, or freed in it and
// allocated before it, breaks that rule and fails the capture.
//
// One compute stream: a graph launch is ordered after the work queued before it and
// before the work queued after it, as the scope's ops would have been.
#include "kernels/cuda/cuda_common.cuh"

#include <stdio.h>

#include <vector>

struct mt_cuda_graph {
    uint64_t signature;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    std::unordered_map<void *, size_t> blocks; // the device blocks it owns
    size_t bytes;
};

// Blocks a graph held (or a failed capture allocated) back to the caching allocator's
// free lists; the stream orders their next use after the work that used them.
static void give_back(mt_cuda_ctx *c, const std::unordered_map<void *, size_t> &blocks)
{
    std::lock_guard<std::mutex> lock(c->mu);
    for (auto &b : blocks) {
        c->live.erase(b.first);
        c->in_use -= b.second;
        c->free_blocks.emplace(b.second, b.first);
        c->cached += b.second;
    }
}

// Its blocks back to the caching allocator; the graph and its executable destroyed.
// Caller holds nothing.
static void destroy(mt_cuda_ctx *c, mt_cuda_graph *g)
{
    if (g->exec) MT_CUDA_CHECK(cudaGraphExecDestroy(g->exec));
    if (g->graph) MT_CUDA_CHECK(cudaGraphDestroy(g->graph));
    give_back(c, g->blocks);
    c->graph_stats.bytes -= g->bytes;
    c->graph_stats.graphs--;
    delete g;
}

void mt_cuda_graphs_destroy(mt_cuda_ctx *c)
{
    for (auto &kv : c->graphs) destroy(c, kv.second);
    c->graphs.clear();
}

// The capture's bookkeeping cleared; launches counted again.
static void stop_capturing(mt_cuda_ctx *c)
{
    c->capturing = false;
    c->cap_blocks.clear();
    c->cap_freed.clear();
    c->cap_error = nullptr;
    mt_cuda_launch_slot = &c->counts.launches[c->op];
}

extern "C" int mt_cuda_graph_begin(void *ctx, uint64_t key, uint64_t signature, bool capture, bool *replayed,
                                   struct mt_err *err)
{
    mt_cuda_ctx *c = mt_cuda(ctx);
    *replayed = false;
    if (c->capturing)
        return mt_err_set(err, MT_EINVAL,
                          "CUDA graph scope %016llx begun while scope %016llx is being captured: scopes do not nest",
                          (unsigned long long)key, (unsigned long long)c->cap_key);
    auto it = c->graphs.find(key);
    if (it != c->graphs.end()) {
        if (it->second->signature == signature) {
            c->counts.launches[MT_OP_COUNT]++; // one launch, the scope's ops are not called
            MT_CUDA_CHECK(cudaGraphLaunch(it->second->exec, c->stream));
            c->graph_stats.replays++;
            *replayed = true;
            return MT_OK;
        }
        // what the graph was captured with has changed (a pointer, a shape, a value its
        // kernels take): it would compute something else; captured again below
        destroy(c, it->second);
        c->graphs.erase(it);
        c->graph_stats.recaptures++;
    }
    if (!capture) return MT_OK; // warm-up: the ops run as they are
    c->cap_key = key;
    c->cap_sig = signature;
    c->cap_error = nullptr;
    c->capturing = true;
    mt_cuda_launch_slot = &c->capture_sink;
    const cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeGlobal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        stop_capturing(c);
        return mt_err_set(err, MT_ERUNTIME, "CUDA graph scope %016llx: cudaStreamBeginCapture: %s",
                          (unsigned long long)key, cudaGetErrorString(e));
    }
    return MT_OK;
}

extern "C" int mt_cuda_graph_end(void *ctx, struct mt_err *err)
{
    mt_cuda_ctx *c = mt_cuda(ctx);
    if (!c->capturing) return MT_OK; // a warm-up scope: nothing to close
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    const uint64_t key = c->cap_key;
    const char *rule = c->cap_error;
    if (!rule && !c->cap_blocks.empty())
        rule = "the scope allocated a block and did not free it (its replays would write it while its "
               "owner holds it)";
    if (e != cudaSuccess || rule) {
        (void)cudaGetLastError();
        if (graph) MT_CUDA_CHECK(cudaGraphDestroy(graph));
        give_back(c, c->cap_freed); // allocated and freed in the failed scope
        stop_capturing(c);
        if (e != cudaSuccess)
            return mt_err_set(err, MT_ERUNTIME,
                              "CUDA graph scope %016llx: the capture failed (%s): an op in the scope made a call "
                              "a graph cannot hold (a synchronisation, a host read of device memory, an "
                              "allocation outside the caching allocator; the CUDA error above names it)\n"
                              "hint: leave that module out of &cuda_graph modules",
                              (unsigned long long)key, cudaGetErrorString(e));
        return mt_err_set(err, MT_ERUNTIME, "CUDA graph scope %016llx: %s", (unsigned long long)key, rule);
    }
    mt_cuda_graph *g = new mt_cuda_graph{c->cap_sig, graph, nullptr, std::move(c->cap_freed), 0};
    for (auto &b : g->blocks) g->bytes += b.second;
    stop_capturing(c);
    const cudaError_t ie = cudaGraphInstantiate(&g->exec, graph, 0);
    if (ie != cudaSuccess) {
        (void)cudaGetLastError();
        c->graph_stats.graphs++;
        c->graph_stats.bytes += g->bytes;
        destroy(c, g);
        return mt_err_set(err, MT_ERUNTIME, "CUDA graph scope %016llx: cudaGraphInstantiate: %s",
                          (unsigned long long)key, cudaGetErrorString(ie));
    }
    c->graphs[key] = g;
    c->graph_stats.graphs++;
    c->graph_stats.captures++;
    c->graph_stats.bytes += g->bytes;
    // the capture ran nothing: the scope's work is this first launch
    c->counts.launches[MT_OP_COUNT]++;
    MT_CUDA_CHECK(cudaGraphLaunch(g->exec, c->stream));
    return MT_OK;
}

extern "C" void mt_cuda_graph_stats(void *ctx, struct mt_graph_stats *out) { *out = mt_cuda(ctx)->graph_stats; }

extern "C" void mt_cuda_graph_reset(void *ctx) { mt_cuda_graphs_destroy(mt_cuda(ctx)); }

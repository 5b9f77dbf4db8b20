// The CUDA execution emulator: streams, events and the order of device work
// (emu_streams.h says what is checked and the two modes).
//
// Clocks: stream i's pieces of work are numbered 1, 2, ... in issue order; a vector
// clock maps every stream to the last piece of its work known to have finished. Each
// piece of work gets, when issued, the clock of its stream joined with the host's (what
// the host has waited for happens before whatever it issues next) and, for the legacy
// default stream and the blocking streams, with each other's (their implicit
// synchronisation). An event records its stream's clock; cudaStreamWaitEvent joins it
// into the waiting stream's; a host synchronisation joins the stream's (or event's)
// clock into the host's. Work A is ordered before work B exactly when B's clock covers
// A's number on A's stream.
//
// Device memory is tracked per allocation (cudaMalloc or cudaMallocHost): its last
// writer and its last reader on each stream. Two pieces of work on different streams
// that touch one allocation, one of them writing, are reported unless ordered: at
// allocation granularity, so two streams writing disjoint halves of one allocation are
// reported too (moetrain's allocator gives every tensor its own allocation).
#include "kernels/cuda/emu/emu_internal.h"
#include "kernels/cuda/emu/emu_streams.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace mt_emu {

namespace {

struct vclock {
    std::vector<uint64_t> c;
    uint64_t at(unsigned i) const { return i < c.size() ? c[i] : 0; }
    void set(unsigned i, uint64_t v)
    {
        if (c.size() <= i) c.resize(i + 1, 0);
        c[i] = v;
    }
    void join(const vclock &o)
    {
        if (c.size() < o.c.size()) c.resize(o.c.size(), 0);
        for (size_t i = 0; i < o.c.size(); i++)
            if (o.c[i] > c[i]) c[i] = o.c[i];
    }
};

struct item {
    uint64_t seq;
    vclock vc;
    std::function<void()> work;
};

struct stream_rec {
    unsigned id;
    bool blocking; // synchronises with the legacy default stream
    bool live;
    uint64_t issued, done;
    vclock vc; // after the last piece of work issued
    std::deque<item> queue;
    bool polled; // a query has answered "not ready" since the last work
    struct capture_rec *cap; // the capture sequence it belongs to, or null
};

struct event_rec {
    bool recorded;
    unsigned stream;
    uint64_t seq;
    vclock vc;
    bool polled;
    unsigned long long cap_id; // last recorded inside this capture sequence (0: outside)
};

struct touch {
    unsigned stream;
    uint64_t seq;
    const char *what, *file;
    int line;
};

struct alloc_state {
    size_t bytes;
    bool written;
    touch writer;
    std::map<unsigned, touch> readers; // the last on each stream since the last write
};

// A piece of device work as a graph holds it: what it is, what it touches, and the
// work itself, with the arguments it was issued with (a kernel's parameters are copied
// when it is captured, as CUDA copies a kernel node's).
struct graph_node {
    const char *what, *file;
    int line;
    std::vector<mem_access> acc;
    std::function<void()> work;
};
using node_list = std::vector<graph_node>;

// A stream capture sequence (cudaStreamBeginCapture .. cudaStreamEndCapture): the
// streams it has drawn in (the origin, and those that waited on an event recorded in
// it), the work captured in issue order (an order every dependency of the graph
// respects), the first rule broken (then the sequence is invalidated), and the
// last writer and readers of each allocation inside the graph, so that work the graph
// leaves unordered is reported when captured, as it would be when issued.
struct capture_rec {
    unsigned long long id;
    enum cudaStreamCaptureMode mode;
    unsigned origin;
    cudaError_t invalid;
    std::set<unsigned> streams;
    std::map<unsigned, uint64_t> last; // per stream: its last piece of captured work
    std::shared_ptr<node_list> nodes;
    std::map<uintptr_t, alloc_state> allocs;
};

// cudaGraph_t and cudaGraphExec_t: the captured work (an executable graph shares it).
struct graph_rec {
    std::shared_ptr<const node_list> nodes;
};
struct exec_rec {
    std::shared_ptr<const node_list> nodes;
};

// Never destroyed (work may be issued from other objects' destructors at exit); handles
// are looked up before use, so a destroyed stream or event is refused, never read.
std::recursive_mutex &mu = *new std::recursive_mutex;
std::vector<stream_rec *> &streams = *new std::vector<stream_rec *>; // by id; 0 legacy, 1 per-thread
std::set<const void *> &live_handles = *new std::set<const void *>;
vclock &host = *new vclock;
std::map<uintptr_t, alloc_state> &allocs = *new std::map<uintptr_t, alloc_state>;
int mode = -1; // 0 immediate, 1 deferred
std::map<unsigned long long, capture_rec *> &captures = *new std::map<unsigned long long, capture_rec *>;
unsigned long long capture_ids;
// cudaThreadExchangeStreamCaptureMode's mode (the emulated program's CUDA calls come
// from one host thread)
enum cudaStreamCaptureMode thread_capture_mode = cudaStreamCaptureModeGlobal;

bool deferred()
{
    if (mode < 0) {
        const char *e = getenv("MT_EMU_STREAMS");
        if (!e || !*e || !strcmp(e, "immediate")) mode = 0;
        else if (!strcmp(e, "deferred")) mode = 1;
        else fail(nullptr, 0, "MT_EMU_STREAMS='%s': expected immediate or deferred", e);
    }
    return mode == 1;
}

stream_rec *new_stream(bool blocking)
{
    stream_rec *s = new stream_rec{};
    s->id = (unsigned)streams.size();
    s->blocking = blocking;
    s->live = true;
    streams.push_back(s);
    return s;
}

void init_streams()
{
    if (streams.empty()) {
        new_stream(true); // legacy
        new_stream(true); // per-thread default stream (every host thread shares one here)
    }
}

// The stream behind a handle, or null (an error message printed) for a bad handle.
stream_rec *stream_of(cudaStream_t h, const char *api)
{
    init_streams();
    if (h == nullptr || h == cudaStreamLegacy) return streams[0];
    if (h == cudaStreamPerThread) return streams[1];
    stream_rec *s = reinterpret_cast<stream_rec *>(h);
    if (!live_handles.count(h) || !s->live) {
        fprintf(stderr, "moetrain CUDA emulator: %s: %p is not a stream (never created, or destroyed)\n", api,
                (void *)h);
        return nullptr;
    }
    return s;
}

event_rec *event_of(cudaEvent_t h, const char *api)
{
    event_rec *e = reinterpret_cast<event_rec *>(h);
    if (!e || !live_handles.count(h)) {
        fprintf(stderr, "moetrain CUDA emulator: %s(%p): not an event (never created, or destroyed)\n", api,
                (void *)h);
        return nullptr;
    }
    return e;
}

void run_until(stream_rec *s, uint64_t seq)
{
    while (s->done < seq && !s->queue.empty()) {
        item it = std::move(s->queue.front());
        s->queue.pop_front();
        // first the work of other streams it is ordered after (issued earlier than it,
        // so never behind it in its own stream)
        for (unsigned u = 0; u < streams.size(); u++)
            if (u != s->id && it.vc.at(u) > streams[u]->done) run_until(streams[u], it.vc.at(u));
        if (it.work) it.work();
        s->done = it.seq;
    }
}

// The clock of the next piece of work on s, which it becomes the stream's.
uint64_t next_clock(stream_rec *s, vclock *out)
{
    vclock v = s->vc;
    v.join(host);
    if (s->id == 0) {
        for (stream_rec *b : streams)
            if (b->id != 0 && b->blocking) v.join(b->vc);
    } else if (s->blocking) {
        v.join(streams[0]->vc);
    }
    const uint64_t seq = ++s->issued;
    v.set(s->id, seq);
    s->vc = v;
    s->polled = false;
    *out = v;
    return seq;
}

const char *stream_name(unsigned id, char *buf, size_t n)
{
    if (id == 0) snprintf(buf, n, "the legacy default stream");
    else if (id == 1) snprintf(buf, n, "the per-thread default stream");
    else snprintf(buf, n, "stream %u", id - 1);
    return buf;
}

const char *capture_error_name(cudaError_t e)
{
    switch (e) {
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureMerge: return "cudaErrorStreamCaptureMerge";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    default: return "an error";
    }
}

// A rule of stream capture broken: the message (what the CUDA runtime would refuse, and
// why), the call's error as the last error, and the capture sequence invalidated (its
// cudaStreamEndCapture then returns no graph), as CUDA does.
__attribute__((format(printf, 3, 4))) void capture_violation(capture_rec *c, cudaError_t e, const char *fmt, ...)
{
    char msg[512], o[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr,
            "moetrain CUDA emulator: stream capture: %s: %s; the capture begun on %s is invalidated "
            "(cudaStreamEndCapture returns no graph)\n",
            capture_error_name(e), msg, stream_name(c->origin, o, sizeof o));
    if (c->invalid == cudaSuccess) c->invalid = e;
    set_last_error(e);
}

// The host function (cudaLaunchHostFunc) running now, or null: CUDA forbids CUDA calls
// inside one (they may deadlock, or see the device in any state), and the emulator refuses
// the calls that issue or wait for device work there (refuse_in_host_func).
thread_local bool in_host_func;

void refuse_in_host_func(const char *api)
{
    if (in_host_func)
        fail(nullptr, 0, "%s called inside a host function (cudaLaunchHostFunc): CUDA forbids CUDA calls in a host "
                         "function; do the work before or after it on the stream",
             api);
}

// Whether a potentially unsafe call (one stream capture cannot observe: cudaMalloc,
// cudaMallocHost, a synchronous cudaMemcpy) is prohibited now: a capture sequence not
// begun in relaxed mode is under way and the thread's mode is not relaxed
// (cudaThreadExchangeStreamCaptureMode).
bool unsafe_prohibited()
{
    if (thread_capture_mode == cudaStreamCaptureModeRelaxed) return false;
    for (const auto &c : captures)
        if (c.second->mode != cudaStreamCaptureModeRelaxed) return true;
    return false;
}

[[noreturn]] void unordered(const touch &now, bool now_writes, const touch &then, bool then_wrote, uintptr_t base,
                            size_t bytes)
{
    char a[64], b[64];
    fail(now.file, now.line,
         "unordered device work: %s on %s %s the %zu-byte allocation at 0x%lx, which %s on %s (%s:%d) %s, and "
         "nothing orders the two (record an event after the one, cudaStreamWaitEvent before the other, or "
         "synchronise the host in between)",
         now.what, stream_name(now.stream, a, sizeof a), now_writes ? "writes" : "reads", bytes, (unsigned long)base,
         then.what, stream_name(then.stream, b, sizeof b), then.file, then.line, then_wrote ? "writes" : "reads");
}

void check_and_note(std::map<uintptr_t, alloc_state> &allocs, const touch &now, const vclock &v,
                    const mem_access *acc, size_t nacc)
{
    for (size_t i = 0; i < nacc; i++) {
        uintptr_t base;
        size_t bytes;
        if (!acc[i].p || !live_allocation(acc[i].p, &base, &bytes)) continue;
        alloc_state &st = allocs[base];
        st.bytes = bytes;
        if (st.written && v.at(st.writer.stream) < st.writer.seq)
            unordered(now, acc[i].write, st.writer, true, base, bytes);
        if (acc[i].write)
            for (const auto &r : st.readers)
                if (v.at(r.second.stream) < r.second.seq) unordered(now, true, r.second, false, base, bytes);
    }
    for (size_t i = 0; i < nacc; i++) {
        uintptr_t base;
        size_t bytes;
        if (!acc[i].p || !live_allocation(acc[i].p, &base, &bytes)) continue;
        alloc_state &st = allocs[base];
        if (acc[i].write) {
            st.written = true;
            st.writer = now;
            st.readers.clear();
        } else {
            st.readers[now.stream] = now;
        }
    }
}

// The host waits for everything s's clock covers: its own work and what it was made to
// wait for after its last piece of work (cudaStreamWaitEvent with nothing issued since).
void host_waits(stream_rec *s)
{
    run_until(s, s->issued);
    for (unsigned u = 0; u < streams.size(); u++)
        if (u != s->id && s->vc.at(u) > streams[u]->done) run_until(streams[u], s->vc.at(u));
    host.join(s->vc);
}

} // namespace

bool stream_work(cudaStream_t stream, const char *what, const char *file, int line, const mem_access *acc, size_t nacc,
                 std::function<void()> work)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    refuse_in_host_func(what);
    stream_rec *s = stream_of(stream, what);
    if (!s) fail(file, line, "%s issued on an invalid stream %p", what, (void *)stream);
    if (s->cap) {
        capture_rec *c = s->cap;
        if (c->invalid != cudaSuccess) {
            set_last_error(cudaErrorStreamCaptureInvalidated);
            return false;
        }
        // captured, not run: a no-op in the stream's own order, a node of the graph
        vclock v;
        const uint64_t seq = next_clock(s, &v);
        check_and_note(c->allocs, touch{s->id, seq, what, file, line}, v, acc, nacc);
        c->nodes->push_back(graph_node{what, file, line, std::vector<mem_access>(acc, acc + nacc), std::move(work)});
        c->last[s->id] = seq;
        if (deferred()) s->queue.push_back(item{seq, std::move(v), nullptr});
        else s->done = seq;
        return true;
    }
    if (s->id == 0)
        for (stream_rec *b : streams)
            if (b->cap && b->blocking) {
                char n[64];
                capture_violation(b->cap, cudaErrorStreamCaptureImplicit, "%s on the legacy default stream while %s "
                                  "(a blocking stream) captures: the legacy stream would wait for the capture",
                                  what, stream_name(b->id, n, sizeof n));
                return false;
            }
    vclock v;
    const uint64_t seq = next_clock(s, &v);
    check_and_note(allocs, touch{s->id, seq, what, file, line}, v, acc, nacc);
    if (deferred()) {
        s->queue.push_back(item{seq, std::move(v), std::move(work)});
    } else {
        work();
        s->done = seq;
    }
    return true;
}

bool capturing(cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    stream_rec *s = stream_of(stream, "a capture query");
    return s && s->cap;
}

cudaError_t capture_refuses_unsafe(const char *api)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    if (!unsafe_prohibited()) return cudaSuccess;
    for (const auto &c : captures)
        if (c.second->mode != cudaStreamCaptureModeRelaxed)
            capture_violation(c.second, cudaErrorStreamCaptureUnsupported,
                              "%s during stream capture (it is not stream work, so the graph cannot hold it; "
                              "allocate before capturing, or capture in relaxed mode)",
                              api);
    return cudaErrorStreamCaptureUnsupported;
}

cudaError_t capture_refuses_device_wait(const char *api)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    if (captures.empty()) return cudaSuccess;
    for (const auto &c : captures)
        capture_violation(c.second, cudaErrorStreamCaptureUnsupported,
                          "%s waits for the whole device, the capturing streams included, whose work is captured, "
                          "not run",
                          api);
    return cudaErrorStreamCaptureUnsupported;
}

cudaError_t capture_refuses_pageable(cudaStream_t stream, const char *api)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    stream_rec *s = stream_of(stream, api);
    if (!s || !s->cap) return cudaSuccess;
    capture_violation(s->cap, cudaErrorStreamCaptureUnsupported,
                      "%s with pageable host memory (not from cudaMallocHost) on a capturing stream: such a copy "
                      "makes the host wait, which a graph cannot hold (a host read of device memory inside a "
                      "graph scope)",
                      api);
    return cudaErrorStreamCaptureUnsupported;
}

void scan_pointers(const void *block, size_t bytes, bool write, std::vector<mem_access> &out)
{
    const unsigned char *b = static_cast<const unsigned char *>(block);
    for (size_t off = 0; off + sizeof(void *) <= bytes; off += sizeof(void *)) {
        void *p;
        memcpy(&p, b + off, sizeof p);
        uintptr_t base;
        size_t n;
        if (p && live_allocation(p, &base, &n)) out.push_back(mem_access{p, 0, write});
    }
}

void host_waits_stream(cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    stream_rec *s = stream_of(stream, "synchronisation");
    if (s) host_waits(s);
}

void host_waits_device()
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    refuse_in_host_func("a device synchronisation");
    init_streams();
    // the newest streams first: work CUDA leaves unordered runs in the order least
    // like the issue order
    for (size_t i = streams.size(); i-- > 0;) host_waits(streams[i]); // destroyed ones' work too
}

static std::atomic<long long> launches_seen{0}, host_syncs_seen{0};
void note_launch() { launches_seen++; }
void note_host_sync() { host_syncs_seen++; }

void forget_allocation(const void *p)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    allocs.erase((uintptr_t)p);
}

cudaError_t bad_handle()
{
    set_last_error(cudaErrorInvalidResourceHandle);
    return cudaErrorInvalidResourceHandle;
}

} // namespace mt_emu

using namespace mt_emu;

extern "C" {

void mt_emu_counts(long long *launches, long long *host_syncs)
{
    *launches = launches_seen.load();
    *host_syncs = host_syncs_seen.load();
}

cudaError_t mt_emu_stream_wait(cudaStream_t h)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    refuse_in_host_func("an emulated NCCL call");
    stream_rec *s = stream_of(h, "cudaStreamSynchronize");
    if (!s) return bad_handle();
    if (s->cap)
        fail(nullptr, 0, "an emulated NCCL call waits for a capturing stream: the program does not export "
                         "cudaStreamIsCapturing and cudaLaunchHostFunc, through which the emulated NCCL "
                         "captures a call (link it with MT_EMU_NCCL_EXPORT)");
    host_waits(s);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *h, unsigned flags)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    init_streams();
    *h = reinterpret_cast<cudaStream_t>(new_stream(!(flags & cudaStreamNonBlocking)));
    live_handles.insert(*h);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *h) { return cudaStreamCreateWithFlags(h, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t h)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    stream_rec *s = stream_of(h, "cudaStreamDestroy");
    if (!s || s->id < 2) return bad_handle();
    run_until(s, s->issued); // CUDA finishes the queued work; the handle dies now
    s->live = false;
    live_handles.erase(h); // the record stays: its id is in clocks and reports
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t h)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    refuse_in_host_func("cudaStreamSynchronize");
    stream_rec *s = stream_of(h, "cudaStreamSynchronize");
    if (!s) return bad_handle();
    if (s->cap) {
        capture_violation(s->cap, cudaErrorStreamCaptureUnsupported,
                          "cudaStreamSynchronize of a capturing stream (its work is captured, not run)");
        return cudaErrorStreamCaptureUnsupported;
    }
    note_host_sync();
    host_waits(s);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (cudaError_t e = capture_refuses_device_wait("cudaDeviceSynchronize")) return e;
    note_host_sync();
    host_waits_device();
    return cudaSuccess;
}

// With work issued since the last query, the first query answers "not ready" (what a
// GPU may answer at any time), so that callers' polling loops run; the next one waits.
cudaError_t cudaStreamQuery(cudaStream_t h)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    refuse_in_host_func("cudaStreamQuery");
    stream_rec *s = stream_of(h, "cudaStreamQuery");
    if (!s) return bad_handle();
    if (s->cap) {
        capture_violation(s->cap, cudaErrorStreamCaptureUnsupported,
                          "cudaStreamQuery of a capturing stream (its work is captured, not run)");
        return cudaErrorStreamCaptureUnsupported;
    }
    if (s->issued > host.at(s->id) && !s->polled) {
        s->polled = true;
        return cudaErrorNotReady;
    }
    host_waits(s);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *h, unsigned)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    *h = reinterpret_cast<cudaEvent_t>(new event_rec{false, 0, 0, vclock{}, false, 0});
    live_handles.insert(*h);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *h) { return cudaEventCreateWithFlags(h, 0); }

cudaError_t cudaEventRecord(cudaEvent_t h, cudaStream_t sh)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    refuse_in_host_func("cudaEventRecord");
    event_rec *e = event_of(h, "cudaEventRecord");
    stream_rec *s = e ? stream_of(sh, "cudaEventRecord") : nullptr;
    if (!s) return bad_handle();
    vclock v;
    e->seq = next_clock(s, &v);
    e->vc = v;
    e->stream = s->id;
    e->recorded = true;
    e->polled = false;
    e->cap_id = s->cap ? s->cap->id : 0;
    if (s->cap) s->cap->last[s->id] = e->seq;
    if (deferred()) s->queue.push_back(item{e->seq, std::move(v), nullptr});
    else s->done = e->seq;
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t sh, cudaEvent_t h, unsigned)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    refuse_in_host_func("cudaStreamWaitEvent");
    event_rec *e = event_of(h, "cudaStreamWaitEvent");
    stream_rec *s = e ? stream_of(sh, "cudaStreamWaitEvent") : nullptr;
    if (!s) return bad_handle();
    if (e->cap_id) {
        auto it = captures.find(e->cap_id);
        if (it == captures.end()) {
            // the event's capture is over: the graph holds that record, nothing to wait for here
            if (s->cap)
                capture_violation(s->cap, cudaErrorCapturedEvent,
                                  "cudaStreamWaitEvent on an event last recorded in a capture that has ended");
            set_last_error(cudaErrorCapturedEvent);
            return cudaErrorCapturedEvent;
        }
        capture_rec *c = it->second;
        if (s->cap && s->cap != c) {
            capture_violation(c, cudaErrorStreamCaptureMerge,
                              "cudaStreamWaitEvent would merge two capture sequences (the event was recorded in "
                              "one, the waiting stream captures another)");
            capture_violation(s->cap, cudaErrorStreamCaptureMerge, "the same cudaStreamWaitEvent");
            return cudaErrorStreamCaptureMerge;
        }
        if (!s->cap) { // a fork: the stream joins the capture
            s->cap = c;
            c->streams.insert(s->id);
        }
    } else if (s->cap && e->recorded && s->cap->invalid == cudaSuccess) {
        capture_violation(s->cap, cudaErrorStreamCaptureIsolation,
                          "cudaStreamWaitEvent of a capturing stream on an event recorded outside the capture (a "
                          "dependency across the capture's boundary; record the event inside the capture, or "
                          "order the work before cudaStreamBeginCapture)");
        return cudaErrorStreamCaptureIsolation;
    }
    if (e->recorded) s->vc.join(e->vc); // an event never recorded is complete: nothing to wait for
    return cudaSuccess;
}

// A host function in stream order: a piece of stream work of its own (captured as a node,
// a host node in CUDA's terms), which touches no device memory the emulator knows of.
cudaError_t cudaLaunchHostFunc(cudaStream_t h, cudaHostFn_t fn, void *user)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    if (!fn) {
        set_last_error(cudaErrorInvalidValue);
        return cudaErrorInvalidValue;
    }
    if (!stream_of(h, "cudaLaunchHostFunc")) return bad_handle();
    const bool ok = stream_work(h, "a host function (cudaLaunchHostFunc)", __FILE__, __LINE__, nullptr, 0, [fn, user] {
        in_host_func = true;
        fn(user);
        in_host_func = false;
    });
    return ok ? cudaSuccess : cudaPeekAtLastError();
}

cudaError_t cudaEventSynchronize(cudaEvent_t h)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    refuse_in_host_func("cudaEventSynchronize");
    event_rec *e = event_of(h, "cudaEventSynchronize");
    if (!e) return bad_handle();
    if (e->cap_id) {
        auto it = captures.find(e->cap_id);
        if (it != captures.end())
            capture_violation(it->second, cudaErrorCapturedEvent,
                              "cudaEventSynchronize or cudaEventQuery of an event recorded in the capture (the "
                              "host would wait for work that is captured, not run)");
        set_last_error(cudaErrorCapturedEvent);
        return cudaErrorCapturedEvent;
    }
    note_host_sync();
    if (e->recorded) {
        run_until(streams[e->stream], e->seq);
        host.join(e->vc);
    }
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t h)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    event_rec *e = event_of(h, "cudaEventQuery");
    if (!e) return bad_handle();
    if (e->cap_id) return cudaEventSynchronize(h);
    if (e->recorded && host.at(e->stream) < e->seq && !e->polled) {
        e->polled = true;
        return cudaErrorNotReady;
    }
    return cudaEventSynchronize(h);
}

cudaError_t cudaEventDestroy(cudaEvent_t h)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    event_rec *e = event_of(h, "cudaEventDestroy");
    if (!e) return bad_handle();
    live_handles.erase(h);
    delete e;
    return cudaSuccess;
}

// ---------------------------------------------------------------- stream capture and graphs

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *m)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    if (!m || (*m != cudaStreamCaptureModeGlobal && *m != cudaStreamCaptureModeThreadLocal &&
               *m != cudaStreamCaptureModeRelaxed)) {
        set_last_error(cudaErrorInvalidValue);
        return cudaErrorInvalidValue;
    }
    std::swap(*m, thread_capture_mode);
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t h, enum cudaStreamCaptureMode m)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    stream_rec *s = stream_of(h, "cudaStreamBeginCapture");
    if (!s) return bad_handle();
    if (m != cudaStreamCaptureModeGlobal && m != cudaStreamCaptureModeThreadLocal && m != cudaStreamCaptureModeRelaxed) {
        set_last_error(cudaErrorInvalidValue);
        return cudaErrorInvalidValue;
    }
    if (s->id < 2) { // the legacy and per-thread default streams
        fprintf(stderr, "moetrain CUDA emulator: cudaStreamBeginCapture: the default streams cannot capture "
                        "(capture on a stream of cudaStreamCreate)\n");
        set_last_error(cudaErrorStreamCaptureUnsupported);
        return cudaErrorStreamCaptureUnsupported;
    }
    if (s->cap) {
        fprintf(stderr, "moetrain CUDA emulator: cudaStreamBeginCapture: the stream already captures\n");
        set_last_error(cudaErrorIllegalState);
        return cudaErrorIllegalState;
    }
    capture_rec *c = new capture_rec{};
    c->id = ++capture_ids;
    c->mode = m;
    c->origin = s->id;
    c->invalid = cudaSuccess;
    c->streams.insert(s->id);
    c->nodes = std::make_shared<node_list>();
    captures[c->id] = c;
    s->cap = c;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t h, enum cudaStreamCaptureStatus *st)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    stream_rec *s = stream_of(h, "cudaStreamIsCapturing");
    if (!s) return bad_handle();
    *st = !s->cap                           ? cudaStreamCaptureStatusNone
          : s->cap->invalid == cudaSuccess ? cudaStreamCaptureStatusActive
                                           : cudaStreamCaptureStatusInvalidated;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t h, cudaGraph_t *graph)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    *graph = nullptr;
    stream_rec *s = stream_of(h, "cudaStreamEndCapture");
    if (!s) return bad_handle();
    capture_rec *c = s->cap;
    if (!c) {
        set_last_error(cudaErrorIllegalState);
        return cudaErrorIllegalState;
    }
    if (c->origin != s->id) {
        capture_violation(c, cudaErrorStreamCaptureUnmatched,
                          "cudaStreamEndCapture on a stream that joined the capture, not the one that began it");
        return cudaErrorStreamCaptureUnmatched;
    }
    cudaError_t r = c->invalid == cudaSuccess ? cudaSuccess : cudaErrorStreamCaptureInvalidated;
    for (unsigned j : c->streams) {
        auto l = c->last.find(j);
        if (r == cudaSuccess && j != s->id && l != c->last.end() && s->vc.at(j) < l->second) {
            char n[64];
            capture_violation(c, cudaErrorStreamCaptureUnjoined,
                              "%s joined the capture and its last captured work is not joined back into the "
                              "origin stream (record an event on it and make the origin wait for it before "
                              "cudaStreamEndCapture)",
                              stream_name(j, n, sizeof n));
            r = cudaErrorStreamCaptureUnjoined;
        }
        streams[j]->cap = nullptr;
    }
    captures.erase(c->id);
    if (r == cudaSuccess) {
        graph_rec *g = new graph_rec{c->nodes};
        live_handles.insert(g);
        *graph = reinterpret_cast<cudaGraph_t>(g);
    } else {
        set_last_error(r);
    }
    delete c;
    return r;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t h, cudaGraphNode_t *nodes, size_t *n)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    if (!h || !live_handles.count(h)) return bad_handle();
    const node_list &l = *reinterpret_cast<graph_rec *>(h)->nodes;
    if (!nodes) {
        *n = l.size();
        return cudaSuccess;
    }
    const size_t k = *n < l.size() ? *n : l.size();
    for (size_t i = 0; i < k; i++) nodes[i] = reinterpret_cast<cudaGraphNode_t>(const_cast<graph_node *>(&l[i]));
    *n = k;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t h, unsigned long long)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    if (!h || !live_handles.count(h)) return bad_handle();
    exec_rec *e = new exec_rec{reinterpret_cast<graph_rec *>(h)->nodes};
    live_handles.insert(e);
    *x = reinterpret_cast<cudaGraphExec_t>(e);
    return cudaSuccess;
}

// The graph's work issued on the stream in capture order (an order its dependencies
// allow), each piece checked against the stream's other work as when issued directly;
// one launch for the host (mt_emu_counts), however many kernels it holds.
cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t h)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    refuse_in_host_func("cudaGraphLaunch");
    if (!x || !live_handles.count(x)) return bad_handle();
    stream_rec *s = stream_of(h, "cudaGraphLaunch");
    if (!s) return bad_handle();
    if (!s->cap) note_launch();
    const std::shared_ptr<const node_list> nodes = reinterpret_cast<exec_rec *>(x)->nodes;
    for (const graph_node &n : *nodes)
        if (!stream_work(h, n.what, n.file, n.line, n.acc.data(), n.acc.size(), n.work))
            return cudaPeekAtLastError();
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    if (!x || !live_handles.count(x)) return bad_handle();
    live_handles.erase(x);
    delete reinterpret_cast<exec_rec *>(x);
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t h)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    if (!h || !live_handles.count(h)) return bad_handle();
    live_handles.erase(h);
    delete reinterpret_cast<graph_rec *>(h);
    return cudaSuccess;
}

} // extern "C"

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

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <deque>
#include <map>
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
};

struct event_rec {
    bool recorded;
    unsigned stream;
    uint64_t seq;
    vclock vc;
    bool polled;
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

// Never destroyed (work may be issued from other objects' destructors at exit); handles
// are looked up before use, so a destroyed stream or event is refused, never read.
std::recursive_mutex &mu = *new std::recursive_mutex;
std::vector<stream_rec *> &streams = *new std::vector<stream_rec *>; // by id; 0 legacy, 1 per-thread
std::set<const void *> &live_handles = *new std::set<const void *>;
vclock &host = *new vclock;
std::map<uintptr_t, alloc_state> &allocs = *new std::map<uintptr_t, alloc_state>;
int mode = -1; // 0 immediate, 1 deferred

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

void check_and_note(const touch &now, const vclock &v, const mem_access *acc, size_t nacc)
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

void stream_work(cudaStream_t stream, const char *what, const char *file, int line, const mem_access *acc, size_t nacc,
                 std::function<void()> work)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    stream_rec *s = stream_of(stream, what);
    if (!s) fail(file, line, "%s issued on an invalid stream %p", what, (void *)stream);
    vclock v;
    const uint64_t seq = next_clock(s, &v);
    check_and_note(touch{s->id, seq, what, file, line}, v, acc, nacc);
    if (deferred()) {
        s->queue.push_back(item{seq, std::move(v), std::move(work)});
    } else {
        work();
        s->done = seq;
    }
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
    stream_rec *s = stream_of(h, "cudaStreamSynchronize");
    if (!s) return bad_handle();
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
    stream_rec *s = stream_of(h, "cudaStreamSynchronize");
    if (!s) return bad_handle();
    note_host_sync();
    host_waits(s);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    note_host_sync();
    host_waits_device();
    return cudaSuccess;
}

// With work issued since the last query, the first query answers "not ready" (what a
// GPU may answer at any time), so that callers' polling loops run; the next one waits.
cudaError_t cudaStreamQuery(cudaStream_t h)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    stream_rec *s = stream_of(h, "cudaStreamQuery");
    if (!s) return bad_handle();
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
    *h = reinterpret_cast<cudaEvent_t>(new event_rec{false, 0, 0, vclock{}, false});
    live_handles.insert(*h);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *h) { return cudaEventCreateWithFlags(h, 0); }

cudaError_t cudaEventRecord(cudaEvent_t h, cudaStream_t sh)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    event_rec *e = event_of(h, "cudaEventRecord");
    stream_rec *s = e ? stream_of(sh, "cudaEventRecord") : nullptr;
    if (!s) return bad_handle();
    vclock v;
    e->seq = next_clock(s, &v);
    e->vc = v;
    e->stream = s->id;
    e->recorded = true;
    e->polled = false;
    if (deferred()) s->queue.push_back(item{e->seq, std::move(v), nullptr});
    else s->done = e->seq;
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t sh, cudaEvent_t h, unsigned)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    event_rec *e = event_of(h, "cudaStreamWaitEvent");
    stream_rec *s = e ? stream_of(sh, "cudaStreamWaitEvent") : nullptr;
    if (!s) return bad_handle();
    if (e->recorded) s->vc.join(e->vc); // an event never recorded is complete: nothing to wait for
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t h)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    event_rec *e = event_of(h, "cudaEventSynchronize");
    if (!e) return bad_handle();
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

} // extern "C"

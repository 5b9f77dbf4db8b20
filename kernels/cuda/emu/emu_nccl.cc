// The emulated NCCL: libnccl.so.2 for tests without a GPU (doc/cuda-emulator.md, "NCCL").
//
// Under the CUDA emulator device memory is host memory, so the processes of one host
// exchange buffers over a full mesh of Unix-domain stream sockets, named in the abstract
// namespace after the ncclUniqueId. Point-to-point transfers are rendezvous: the receiver
// announces each posted receive (a clear-to-send frame) and the sender moves no data before
// it has one, so a send never completes before its receive is posted and ordering
// deadlocks that buffering would hide stay deadlocks; one that outlasts
// MT_EMU_NCCL_TIMEOUT_S is reported, naming the operation, rank, peer and count.
// Collectives are built on the same transfers; every chunk is reduced by one rank in rank
// order, so all ranks get the same bits. Operations run after the work queued on their
// stream, to completion inside the call (on a capturing stream they are captured instead,
// one host function per call or group, run by each launch of the graph); on a
// nonblocking communicator one call in MT_EMU_NCCL_INPROGRESS instead runs on a thread of
// its own and answers ncclInProgress (or only claims to), so that callers' polling,
// timeouts and aborts run.
// ncclCommSplit is collective over every rank of the parent: the ranks exchange their colour
// and key over the parent's connections, and those of one colour bootstrap a communicator of
// their own, ranked by key, then parent rank, under an id derived from the parent's, the
// split's sequence number and the colour. A parent made with splitShare = 1 shares its abort
// flag with its children, as NCCL's do: aborting one makes the others unusable.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <nccl.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

#define MT_NCCL_TRY(expr)                                                                     \
    do {                                                                                       \
        const ncclResult_t r_ = (expr);                                                        \
        if (r_ != ncclSuccess) return r_;                                                      \
    } while (0)

// memmove that accepts the null pointers of empty buffers
void copy(void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src) memmove(dst, src, bytes);
}

// ---------------------------------------------------------------- settings, errors

double env_double(const char *name, double dflt)
{
    const char *e = getenv(name);
    if (!e || !*e) return dflt;
    char *end;
    const double v = strtod(e, &end);
    return *end || v < 0 ? dflt : v;
}

double timeout_s() { return env_double("MT_EMU_NCCL_TIMEOUT_S", 60); }

// ncclInProgress on about one completion in N of a nonblocking communicator (0: never).
unsigned inprogress_every() { return (unsigned)env_double("MT_EMU_NCCL_INPROGRESS", 3); }

double now_s()
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// NCCL keeps the text of the last error per thread, whatever comm is asked about.
thread_local char last_error[1024];

__attribute__((format(printf, 2, 3))) ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    if (getenv("MT_EMU_NCCL_DEBUG")) fprintf(stderr, "emulated NCCL: %s\n", last_error);
    return r;
}

const char *type_name(ncclDataType_t t)
{
    static const char *const names[] = { "ncclInt8",   "ncclUint8",   "ncclInt32",
                                         "ncclUint32", "ncclInt64",   "ncclUint64",
                                         "ncclFloat16", "ncclFloat32", "ncclFloat64",
                                         "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2" };
    return (unsigned)t < sizeof names / sizeof *names ? names[t] : "?";
}

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

const char *op_name(ncclRedOp_t op)
{
    static const char *const names[] = { "ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg" };
    return (unsigned)op < sizeof names / sizeof *names ? names[op] : "?";
}

// ---------------------------------------------------------------- the communicator

constexpr char id_magic[8] = { 'm', 't', 'e', 'm', 'u', 'n', 'c', 'l' };
constexpr uint32_t frame_magic = 0x6e63636c;
enum frame_type : uint32_t { frame_cts = 1, frame_data = 2 };

// Which call a transfer belongs to: both sides must be in the same one.
enum op_kind : uint32_t { k_p2p, k_all_reduce, k_all_gather, k_reduce_scatter, k_broadcast,
                          k_split };
const char *kind_name(uint32_t k, bool send)
{
    switch (k) {
    case k_p2p: return send ? "ncclSend" : "ncclRecv";
    case k_all_reduce: return "ncclAllReduce";
    case k_all_gather: return "ncclAllGather";
    case k_reduce_scatter: return "ncclReduceScatter";
    case k_broadcast: return "ncclBroadcast";
    case k_split: return "ncclCommSplit";
    }
    return "?";
}

struct frame {
    uint32_t magic, type, kind, dtype;
    uint64_t bytes;
};

struct transfer;

struct out_frame {
    frame hdr;
    transfer *data; // the send whose payload follows, or none (clear to send)
};

struct peer_conn {
    int fd = -1;
    std::deque<frame> cts;         // receives the peer posted that no send of ours has used
    std::deque<transfer *> sends;  // our sends waiting for the peer's clear to send
    std::deque<transfer *> recvs;  // our receives announced, waiting for their data
    std::deque<out_frame> out;     // frames to write; the front one is written from out_off
    size_t out_off = 0;
    frame in_hdr{};                // the frame being read
    size_t in_got = 0;             // its bytes read: header, then payload
    bool closed = false;           // the peer closed the connection between transfers
};

struct hello {
    uint32_t magic;
    int32_t rank, nranks;
};

} // namespace

struct ncclComm {
    int rank = 0, nranks = 0;
    bool blocking = true;
    ncclResult_t error = ncclSuccess; // set when a transfer failed: the comm is unusable
    int pending = 0;                  // polls of ncclCommGetAsyncError still to answer InProgress
    ncclUniqueId id{};                // its own, or derived from its parent's (ncclCommSplit)
    uint64_t splits = 0;              // ncclCommSplit calls on it so far
    bool split_share = false;         // config splitShare: children share its abort flag
    std::shared_ptr<std::atomic<bool>> abort_flag = std::make_shared<std::atomic<bool>>(false);
    std::vector<peer_conn> peers;
    std::deque<transfer *> self_sends, self_recvs;
    // A call of a nonblocking comm that runs in the background (see execute)
    std::thread worker;
    std::atomic<bool> busy{ false }, aborting{ false };
    ncclResult_t worker_result = ncclSuccess;
    std::string worker_error; // its error text, for the thread that polls
};

namespace {

// One send or receive of a call, to or from one peer.
struct transfer {
    ncclComm *comm;
    int peer;
    bool send;
    uint32_t kind;
    ncclDataType_t dtype;
    char *buf;
    size_t count, bytes;
    bool queued = false; // a send: its data frame is queued
    bool done = false;
};

std::string describe(const transfer &t)
{
    char s[256];
    snprintf(s, sizeof s, "%s of %zu x %s %s rank %d", kind_name(t.kind, t.send), t.count,
             type_name(t.dtype), t.send ? "to" : "from", t.peer);
    return s;
}

void close_comm(ncclComm *c)
{
    for (peer_conn &p : c->peers)
        if (p.fd >= 0) close(p.fd);
    delete c;
}

ncclResult_t broken(ncclComm *c, ncclResult_t r)
{
    if (c->error == ncclSuccess) c->error = r;
    return r;
}

// ---------------------------------------------------------------- the progress engine

ncclResult_t lost(ncclComm *c, const transfer *t, int peer, int err)
{
    const std::string what = t ? " during " + describe(*t) : std::string();
    if (err == 0 || err == ECONNRESET || err == EPIPE)
        return broken(c, fail(ncclRemoteError,
                              "rank %d: rank %d closed its connection (it exited or aborted)%s",
                              c->rank, peer, what.c_str()));
    return broken(c, fail(ncclSystemError, "rank %d: connection to rank %d: %s%s", c->rank, peer,
                          strerror(err), what.c_str()));
}

// Pairs the front send waiting on p with the peer's oldest unused clear to send.
ncclResult_t match_sends(ncclComm *c, peer_conn &p)
{
    while (!p.sends.empty() && !p.cts.empty()) {
        transfer *t = p.sends.front();
        const frame f = p.cts.front();
        if (f.kind != t->kind || f.bytes != t->bytes || f.dtype != (uint32_t)t->dtype)
            return broken(c, fail(ncclInvalidUsage,
                                  "rank %d: %s met rank %d's %s of %llu bytes of %s: the ranks "
                                  "called different operations or counts",
                                  c->rank, describe(*t).c_str(), t->peer, kind_name(f.kind, false),
                                  (unsigned long long)f.bytes, type_name((ncclDataType_t)f.dtype)));
        p.cts.pop_front();
        p.sends.pop_front();
        t->queued = true;
        p.out.push_back({ { frame_magic, frame_data, t->kind, (uint32_t)t->dtype, t->bytes }, t });
    }
    return ncclSuccess;
}

// A transfer with the peer still in flight, to name in an error: the oldest receive,
// else the oldest send waiting for its clear to send, else the send being written.
const transfer *pending(const peer_conn &p)
{
    if (!p.recvs.empty()) return p.recvs.front();
    if (!p.sends.empty()) return p.sends.front();
    for (const out_frame &o : p.out)
        if (o.data) return o.data;
    return nullptr;
}

// Reads what p has sent; false with the error set when the connection failed.
ncclResult_t read_peer(ncclComm *c, int peer)
{
    peer_conn &p = c->peers[peer];
    for (;;) {
        char *dst;
        size_t want;
        transfer *t = nullptr;
        if (p.in_got < sizeof(frame)) {
            dst = (char *)&p.in_hdr + p.in_got;
            want = sizeof(frame) - p.in_got;
        } else {
            t = p.recvs.front();
            dst = t->buf + (p.in_got - sizeof(frame));
            want = sizeof(frame) + t->bytes - p.in_got;
        }
        const ssize_t n = want ? read(p.fd, dst, want) : 0;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ncclSuccess;
        if (n < 0 && errno == EINTR) continue;
        if (n == 0 && p.in_got == 0 && p.recvs.empty() && p.sends.empty() && p.out.empty()) {
            // A peer that is done with us may close (ncclCommDestroy) while others are not.
            close(p.fd);
            p.fd = -1;
            p.closed = true;
            return ncclSuccess;
        }
        if (n <= 0 && want)
            return lost(c, t ? t : pending(p), peer, n == 0 ? 0 : errno);
        p.in_got += (size_t)n;
        if (p.in_got == sizeof(frame) && !t) {
            const frame &f = p.in_hdr;
            if (f.magic != frame_magic)
                return broken(c, fail(ncclInternalError, "rank %d: garbled frame from rank %d",
                                      c->rank, peer));
            if (f.type == frame_cts) {
                p.cts.push_back(f);
                p.in_got = 0;
                MT_NCCL_TRY(match_sends(c, p));
                continue;
            }
            // Data comes only after our clear to send, for our oldest announced receive.
            if (p.recvs.empty())
                return broken(c, fail(ncclInternalError,
                                      "rank %d: data from rank %d without a receive", c->rank,
                                      peer));
            transfer *r = p.recvs.front();
            if (f.bytes != r->bytes || f.kind != r->kind)
                return broken(c, fail(ncclInternalError,
                                      "rank %d: rank %d sent %llu bytes for %s", c->rank, peer,
                                      (unsigned long long)f.bytes, describe(*r).c_str()));
        }
        if (p.in_got >= sizeof(frame) && !p.recvs.empty() &&
            p.in_got == sizeof(frame) + p.recvs.front()->bytes) {
            p.recvs.front()->done = true;
            p.recvs.pop_front();
            p.in_got = 0;
        }
    }
}

ncclResult_t write_peer(ncclComm *c, int peer)
{
    peer_conn &p = c->peers[peer];
    while (!p.out.empty()) {
        out_frame &o = p.out.front();
        const size_t total = sizeof(frame) + (o.data ? o.data->bytes : 0);
        const char *src = p.out_off < sizeof(frame)
                              ? (const char *)&o.hdr + p.out_off
                              : o.data->buf + (p.out_off - sizeof(frame));
        const size_t want = p.out_off < sizeof(frame) ? sizeof(frame) - p.out_off
                                                      : total - p.out_off;
        const ssize_t n = send(p.fd, src, want, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ncclSuccess;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return lost(c, o.data ? o.data : pending(p), peer, errno);
        p.out_off += (size_t)n;
        if (p.out_off == total) {
            if (o.data) o.data->done = true;
            p.out.pop_front();
            p.out_off = 0;
        }
    }
    return ncclSuccess;
}

// Runs the transfers of one call or group to completion, all at once.
ncclResult_t run(const std::vector<transfer *> &ts)
{
    std::vector<ncclComm *> comms;
    ncclResult_t r = ncclSuccess;
    for (transfer *t : ts) {
        ncclComm *c = t->comm;
        bool seen = false;
        for (ncclComm *x : comms) seen |= x == c;
        if (!seen) comms.push_back(c);
        if (t->bytes == 0) {
            t->done = true;
        } else if (t->peer != c->rank && c->peers[t->peer].closed) {
            t->done = true; // nothing is queued for it
            if (r == ncclSuccess) r = lost(c, t, t->peer, 0);
        } else if (t->peer == c->rank) {
            (t->send ? c->self_sends : c->self_recvs).push_back(t);
        } else if (t->send) {
            c->peers[t->peer].sends.push_back(t);
        } else {
            peer_conn &p = c->peers[t->peer];
            p.recvs.push_back(t);
            p.out.push_back({ { frame_magic, frame_cts, t->kind, (uint32_t)t->dtype, t->bytes },
                              nullptr });
        }
    }
    for (ncclComm *c : comms)
        for (peer_conn &p : c->peers)
            if (r == ncclSuccess && p.fd >= 0) r = match_sends(c, p);
    const double limit = timeout_s(), deadline = now_s() + limit;
    std::vector<pollfd> fds;
    std::vector<std::pair<ncclComm *, int>> who;
    while (r == ncclSuccess) {
        // A send to oneself pairs with a receive from oneself of the same group.
        for (ncclComm *c : comms)
            while (r == ncclSuccess && !c->self_sends.empty() && !c->self_recvs.empty()) {
                transfer *s = c->self_sends.front(), *v = c->self_recvs.front();
                if (s->bytes != v->bytes || s->kind != v->kind) {
                    r = broken(c, fail(ncclInvalidUsage,
                                       "rank %d: %s met %s: different operations or counts",
                                       c->rank, describe(*s).c_str(), describe(*v).c_str()));
                    break;
                }
                copy(v->buf, s->buf, s->bytes);
                s->done = v->done = true;
                c->self_sends.pop_front();
                c->self_recvs.pop_front();
            }
        if (r != ncclSuccess) break;
        const transfer *waiting = nullptr;
        for (const transfer *t : ts)
            if (!t->done && !waiting) waiting = t;
        if (!waiting) return ncclSuccess;
        bool aborted = false;
        for (ncclComm *c : comms) aborted |= c->aborting.load() || c->abort_flag->load();
        if (aborted) {
            r = broken(waiting->comm, fail(ncclRemoteError, "rank %d: %s: the communicator was aborted",
                                           waiting->comm->rank, describe(*waiting).c_str()));
            break;
        }
        const double left = deadline - now_s();
        if (left <= 0) {
            const transfer &t = *waiting;
            const char *why = t.peer == t.comm->rank
                                  ? "no matching operation with itself in the same group"
                              : t.send && !t.queued ? "the peer has not posted the matching receive"
                              : t.send              ? "the peer is not reading"
                                                    : "the peer has not sent the data";
            r = broken(t.comm, fail(ncclRemoteError,
                                    "rank %d: %s did not complete within %g s (%s): possible "
                                    "ordering deadlock (MT_EMU_NCCL_TIMEOUT_S)",
                                    t.comm->rank, describe(t).c_str(), limit, why));
            break;
        }
        fds.clear();
        who.clear();
        for (ncclComm *c : comms)
            for (int i = 0; i < c->nranks; i++)
                if (c->peers[i].fd >= 0) {
                    fds.push_back({ c->peers[i].fd,
                                    (short)(POLLIN | (c->peers[i].out.empty() ? 0 : POLLOUT)), 0 });
                    who.push_back({ c, i });
                }
        const int ms = left > 0.1 ? 100 : (int)(left * 1000) + 1;
        if (poll(fds.data(), fds.size(), ms) < 0 && errno != EINTR) {
            r = fail(ncclSystemError, "poll: %s", strerror(errno));
            break;
        }
        for (size_t i = 0; i < fds.size() && r == ncclSuccess; i++) {
            ncclComm *c = who[i].first;
            if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) r = read_peer(c, who[i].second);
            if (r == ncclSuccess && (fds[i].revents & POLLOUT)) r = write_peer(c, who[i].second);
        }
    }
    // The failed comms' queues may still point into this call's transfers.
    for (ncclComm *c : comms)
        if (c->error != ncclSuccess) {
            c->self_sends.clear();
            c->self_recvs.clear();
            for (peer_conn &p : c->peers) {
                p.sends.clear();
                p.recvs.clear();
                p.out.clear();
                if (p.fd >= 0) shutdown(p.fd, SHUT_RDWR);
            }
        }
    return r;
}

// ---------------------------------------------------------------- reductions

// fp16 and bf16 through the CUDA headers' host conversions (round to nearest even, as
// NCCL's half arithmetic rounds each step).
float to_float(__half h) { return __half2float(h); }
float to_float(__nv_bfloat16 b) { return __bfloat162float(b); }
__half to_half(float f) { return __float2half_rn(f); }
__nv_bfloat16 to_bf16(float f) { return __float2bfloat16_rn(f); }

template <typename T> T combine(T a, T b, ncclRedOp_t op)
{
    switch (op) {
    case ncclProd: return (T)(a * b);
    case ncclMax: return a > b ? a : b;
    case ncclMin: return a < b ? a : b;
    default: return (T)(a + b);
    }
}

// Integers wrap: the arithmetic is done unsigned.
template <typename T, typename U> void reduce_int(void *acc, const void *x, size_t n, ncclRedOp_t op)
{
    T *a = (T *)acc;
    const T *b = (const T *)x;
    for (size_t i = 0; i < n; i++) {
        if (op == ncclSum || op == ncclAvg || op == ncclProd)
            a[i] = (T)combine<U>((U)a[i], (U)b[i], op);
        else
            a[i] = combine<T>(a[i], b[i], op);
    }
}

template <typename T> void reduce_float(void *acc, const void *x, size_t n, ncclRedOp_t op)
{
    T *a = (T *)acc;
    const T *b = (const T *)x;
    for (size_t i = 0; i < n; i++) a[i] = combine<T>(a[i], b[i], op);
}

template <typename H, H (*round)(float)> void reduce_16(void *acc, const void *x, size_t n, ncclRedOp_t op)
{
    H *a = (H *)acc;
    const H *b = (const H *)x;
    for (size_t i = 0; i < n; i++) a[i] = round(combine<float>(to_float(a[i]), to_float(b[i]), op));
}

// acc = acc op x, elementwise.
void reduce(void *acc, const void *x, size_t n, ncclDataType_t t, ncclRedOp_t op)
{
    switch (t) {
    case ncclInt8: reduce_int<int8_t, uint8_t>(acc, x, n, op); break;
    case ncclUint8: reduce_int<uint8_t, uint8_t>(acc, x, n, op); break;
    case ncclInt32: reduce_int<int32_t, uint32_t>(acc, x, n, op); break;
    case ncclUint32: reduce_int<uint32_t, uint32_t>(acc, x, n, op); break;
    case ncclInt64: reduce_int<int64_t, uint64_t>(acc, x, n, op); break;
    case ncclUint64: reduce_int<uint64_t, uint64_t>(acc, x, n, op); break;
    case ncclFloat16: reduce_16<__half, to_half>(acc, x, n, op); break;
    case ncclBfloat16: reduce_16<__nv_bfloat16, to_bf16>(acc, x, n, op); break;
    case ncclFloat32: reduce_float<float>(acc, x, n, op); break;
    case ncclFloat64: reduce_float<double>(acc, x, n, op); break;
    default: break; // refused by check_op
    }
}

// ncclAvg: the sum divided by the number of ranks.
void divide(void *acc, size_t n, ncclDataType_t t, int nranks)
{
    for (size_t i = 0; i < n; i++) switch (t) {
        case ncclInt8: ((int8_t *)acc)[i] = (int8_t)(((int8_t *)acc)[i] / nranks); break;
        case ncclUint8: ((uint8_t *)acc)[i] = (uint8_t)(((uint8_t *)acc)[i] / nranks); break;
        case ncclInt32: ((int32_t *)acc)[i] /= nranks; break;
        case ncclUint32: ((uint32_t *)acc)[i] /= (uint32_t)nranks; break;
        case ncclInt64: ((int64_t *)acc)[i] /= nranks; break;
        case ncclUint64: ((uint64_t *)acc)[i] /= (uint64_t)nranks; break;
        case ncclFloat16: ((__half *)acc)[i] = to_half(to_float(((__half *)acc)[i]) / (float)nranks); break;
        case ncclBfloat16: ((__nv_bfloat16 *)acc)[i] = to_bf16(to_float(((__nv_bfloat16 *)acc)[i]) / (float)nranks); break;
        case ncclFloat32: ((float *)acc)[i] /= (float)nranks; break;
        case ncclFloat64: ((double *)acc)[i] /= nranks; break;
        default: break;
        }
}

// ---------------------------------------------------------------- calls and groups

// A call as posted: run at once, or at ncclGroupEnd.
struct call {
    uint32_t kind;
    bool send;                // k_p2p
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    ncclDataType_t dtype;
    ncclRedOp_t op;
    int peer;                 // k_p2p: the peer; k_broadcast: the root
    ncclComm *comm;
    cudaStream_t stream;
};

// A call runs on the host at once, but in NCCL it is stream work: what the stream holds
// must be done first. The emulator's mt_emu_stream_wait (cudaStreamSynchronize, not
// counted as the host's wait: struct mt_op_counts), or the program's
// cudaStreamSynchronize, does that, when the program exports it for libraries it loads.
void wait_stream(cudaStream_t s)
{
    using sync_fn = cudaError_t (*)(cudaStream_t);
    static const sync_fn quiet = (sync_fn)dlsym(RTLD_DEFAULT, "mt_emu_stream_wait");
    static const sync_fn sync = quiet ? quiet : (sync_fn)dlsym(RTLD_DEFAULT, "cudaStreamSynchronize");
    if (sync) sync(s);
}

struct group_state {
    int depth = 0;
    ncclResult_t error = ncclSuccess; // a call of the group was refused
    std::vector<call> calls;
};
thread_local group_state group;

transfer *new_transfer(std::vector<transfer> &pool, ncclComm *c, uint32_t kind, bool send, int peer,
                       const void *buf, size_t count, ncclDataType_t t)
{
    pool.push_back({ c, peer, send, kind, t, (char *)buf, count, count * type_size(t) });
    return &pool.back();
}

// Chunk i of n of count elements: [off, off + len).
void chunk(size_t count, int n, int i, size_t *off, size_t *len)
{
    *off = count * (size_t)i / (size_t)n;
    *len = count * (size_t)(i + 1) / (size_t)n - *off;
}

ncclResult_t run_pool(std::vector<transfer> &pool)
{
    std::vector<transfer *> ts;
    for (transfer &t : pool) ts.push_back(&t);
    return run(ts);
}

// Reduces rank-indexed contributions (n of them, len elements each, contiguous) into the
// first, in rank order.
void reduce_in_order(char *contrib, size_t len, int n, ncclDataType_t t, ncclRedOp_t op)
{
    const size_t es = type_size(t);
    for (int j = 1; j < n; j++) reduce(contrib, contrib + (size_t)j * len * es, len, t, op);
    if (op == ncclAvg) divide(contrib, len, t, n);
}

ncclResult_t run_collective(const call &k)
{
    ncclComm *c = k.comm;
    const int n = c->nranks, me = c->rank;
    const size_t es = type_size(k.dtype);
    const char *in = (const char *)k.sendbuf;
    char *out = (char *)k.recvbuf;
    std::vector<transfer> pool;
    pool.reserve(2 * (size_t)n);
    switch (k.kind) {
    case k_all_reduce: {
        // Reduce-scatter by chunk owner, in rank order, then all-gather the chunks.
        size_t off, len;
        chunk(k.count, n, me, &off, &len);
        std::vector<char> contrib(len * es * (size_t)n);
        copy(contrib.data() + (size_t)me * len * es, in + off * es, len * es);
        for (int p = 0; p < n; p++) {
            if (p == me) continue;
            size_t po, pl;
            chunk(k.count, n, p, &po, &pl);
            new_transfer(pool, c, k.kind, true, p, in + po * es, pl, k.dtype);
            new_transfer(pool, c, k.kind, false, p, contrib.data() + (size_t)p * len * es, len,
                         k.dtype);
        }
        MT_NCCL_TRY(run_pool(pool));
        reduce_in_order(contrib.data(), len, n, k.dtype, k.op);
        copy(out + off * es, contrib.data(), len * es);
        pool.clear();
        for (int p = 0; p < n; p++) {
            if (p == me) continue;
            size_t po, pl;
            chunk(k.count, n, p, &po, &pl);
            new_transfer(pool, c, k.kind, true, p, out + off * es, len, k.dtype);
            new_transfer(pool, c, k.kind, false, p, out + po * es, pl, k.dtype);
        }
        return run_pool(pool);
    }
    case k_reduce_scatter: {
        const size_t len = k.count;
        std::vector<char> contrib(len * es * (size_t)n);
        copy(contrib.data() + (size_t)me * len * es, in + (size_t)me * len * es, len * es);
        for (int p = 0; p < n; p++) {
            if (p == me) continue;
            new_transfer(pool, c, k.kind, true, p, in + (size_t)p * len * es, len, k.dtype);
            new_transfer(pool, c, k.kind, false, p, contrib.data() + (size_t)p * len * es, len,
                         k.dtype);
        }
        MT_NCCL_TRY(run_pool(pool));
        reduce_in_order(contrib.data(), len, n, k.dtype, k.op);
        copy(out, contrib.data(), len * es);
        return ncclSuccess;
    }
    case k_all_gather: {
        char *mine = out + (size_t)me * k.count * es;
        copy(mine, in, k.count * es);
        for (int p = 0; p < n; p++) {
            if (p == me) continue;
            new_transfer(pool, c, k.kind, true, p, mine, k.count, k.dtype);
            new_transfer(pool, c, k.kind, false, p, out + (size_t)p * k.count * es, k.count,
                         k.dtype);
        }
        return run_pool(pool);
    }
    case k_broadcast:
        if (me == k.peer) {
            copy(out, in, k.count * es);
            for (int p = 0; p < n; p++)
                if (p != me) new_transfer(pool, c, k.kind, true, p, out, k.count, k.dtype);
        } else {
            new_transfer(pool, c, k.kind, false, k.peer, out, k.count, k.dtype);
        }
        return run_pool(pool);
    }
    return fail(ncclInternalError, "unknown collective");
}

// A call on a nonblocking comm: now and then it is, or claims to be, still running.
bool claim_in_progress(ncclComm *c)
{
    static uint64_t state = 0x853c49e6748fea9bull;
    const unsigned every = inprogress_every();
    if (c->blocking || every == 0) return false;
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const unsigned x = (unsigned)(state >> 33);
    if (x % every) return false;
    c->pending = 1 + (int)((x / every) % 3);
    return true;
}

// Runs the calls of a group (or a lone call): collectives one after another in the order
// posted, then every send and receive together.
ncclResult_t run_calls(const std::vector<call> &calls)
{
    ncclResult_t r = ncclSuccess;
    for (const call &k : calls)
        if (r == ncclSuccess && k.kind != k_p2p) r = run_collective(k);
    if (r == ncclSuccess) {
        std::vector<transfer> pool;
        pool.reserve(calls.size());
        for (const call &k : calls)
            if (k.kind == k_p2p)
                new_transfer(pool, k.comm, k_p2p, k.send, k.peer,
                             k.send ? k.sendbuf : k.recvbuf, k.count, k.dtype);
        if (!pool.empty()) r = run_pool(pool);
    }
    return r;
}

// Ends a comm's background call: its result becomes the comm's state.
void join_worker(ncclComm *c)
{
    if (!c->worker.joinable()) return;
    c->worker.join();
    if (c->worker_result != ncclSuccess) {
        if (c->error == ncclSuccess) c->error = c->worker_result;
        snprintf(last_error, sizeof last_error, "%s", c->worker_error.c_str());
    }
}

// Stream capture (doc/cuda-emulator.md, "NCCL"): as NCCL's, a call on a capturing stream
// is stream work, captured into the graph and run at each launch. The program's
// cudaStreamIsCapturing and cudaLaunchHostFunc (the emulator's, exported like
// cudaStreamSynchronize) tell and enqueue it; without them nothing is captured.
using is_capturing_fn = cudaError_t (*)(cudaStream_t, cudaStreamCaptureStatus *);
using launch_host_fn = cudaError_t (*)(cudaStream_t, cudaHostFn_t, void *);

bool stream_capturing(cudaStream_t s)
{
    static const is_capturing_fn query = (is_capturing_fn)dlsym(RTLD_DEFAULT, "cudaStreamIsCapturing");
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return query && query(s, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone;
}

// The calls of every capture so far (a graph replays them for as long as it lives; never
// freed, a few per captured scope).
std::deque<std::vector<call>> &captured = *new std::deque<std::vector<call>>;

// A captured group (or lone call) as a graph launch runs it, in the stream's order: the
// same transfers as an eager call, on every rank that launches its graph. No caller is
// there to take an error: it is printed, and the communicators fail (their next call
// returns it).
void run_captured(void *p)
{
    const std::vector<call> &calls = *static_cast<const std::vector<call> *>(p);
    ncclResult_t r = ncclSuccess;
    for (const call &k : calls) {
        join_worker(k.comm); // an eager call before it in the stream's order ends first
        if (r == ncclSuccess && k.comm->error != ncclSuccess)
            r = fail(k.comm->error, "rank %d: the communicator failed earlier (%s)", k.comm->rank,
                     ncclGetErrorString(k.comm->error));
        if (r == ncclSuccess && k.comm->abort_flag->load())
            r = fail(ncclInvalidUsage, "rank %d: the communicator was aborted", k.comm->rank);
    }
    if (r == ncclSuccess) r = run_calls(calls);
    if (r == ncclSuccess) return;
    for (const call &k : calls) broken(k.comm, r);
    fprintf(stderr, "emulated NCCL: a captured operation failed when its graph was launched: %s\n", last_error);
}

// Enqueues the calls of a group (or a lone call) on their capturing stream as one host
// function: the group stays one unit in the graph.
ncclResult_t capture(const std::vector<call> &calls)
{
    static const launch_host_fn launch = (launch_host_fn)dlsym(RTLD_DEFAULT, "cudaLaunchHostFunc");
    const cudaStream_t s = calls[0].stream;
    for (const call &k : calls)
        if (k.stream != s)
            return fail(ncclInvalidUsage,
                        "rank %d: a group of NCCL calls on different streams, one of them capturing: not "
                        "emulated; issue the group's calls on one stream",
                        k.comm->rank);
    if (!launch)
        return fail(ncclInvalidUsage, "an NCCL call on a capturing stream, and the program does not export "
                                      "cudaLaunchHostFunc to capture it with");
    captured.push_back(calls);
    const cudaError_t e = launch(s, run_captured, &captured.back());
    if (e != cudaSuccess) {
        captured.pop_back();
        return fail(ncclUnhandledCudaError,
                    "rank %d: the capturing stream refused the operation (CUDA error %d: the capture is "
                    "invalidated)",
                    calls[0].comm->rank, (int)e);
    }
    return ncclSuccess;
}

// Runs the calls of a group (or a lone call) after the work queued on their streams. On
// nonblocking comms one call in MT_EMU_NCCL_INPROGRESS runs on a thread of its own, as
// NCCL's would on the GPU: the call answers ncclInProgress, ncclCommGetAsyncError too
// until it is done, and the caller's own timeout and ncclCommAbort can end it.
ncclResult_t execute(const std::vector<call> &calls)
{
    for (const call &k : calls)
        if (stream_capturing(k.stream)) return capture(calls);
    for (const call &k : calls) wait_stream(k.stream);
    std::vector<ncclComm *> comms;
    bool nonblocking = true;
    for (const call &k : calls) {
        bool dup = false;
        for (ncclComm *x : comms) dup |= x == k.comm;
        if (!dup) comms.push_back(k.comm);
        nonblocking &= !k.comm->blocking;
    }
    if (nonblocking && comms.size() == 1 && claim_in_progress(comms[0])) {
        ncclComm *c = comms[0];
        c->pending = 0;
        c->busy = true;
        c->worker = std::thread([c, calls] {
            c->worker_result = run_calls(calls);
            if (c->worker_result != ncclSuccess) c->worker_error = last_error;
            c->busy = false;
        });
        return ncclInProgress;
    }
    const ncclResult_t r = run_calls(calls);
    if (r != ncclSuccess) return r;
    bool in_progress = false;
    for (ncclComm *c : comms) in_progress |= claim_in_progress(c);
    return in_progress ? ncclInProgress : ncclSuccess;
}

// Checks what every call has; k.comm is not null.
ncclResult_t check_usable(const char *fn, ncclComm *c)
{
    if (c->pending > 0 || c->busy) // (a busy comm is the background call's until it is done)
        return fail(ncclInvalidUsage,
                    "%s: rank %d: the communicator's previous operation is still in progress: "
                    "poll ncclCommGetAsyncError until it is no longer ncclInProgress first",
                    fn, c->rank);
    join_worker(c);
    if (c->error != ncclSuccess)
        return fail(c->error, "%s: rank %d: the communicator failed earlier (%s); abort it", fn,
                    c->rank, ncclGetErrorString(c->error));
    if (c->abort_flag->load())
        return fail(ncclInvalidUsage,
                    "%s: rank %d: a communicator sharing this one's resources (splitShare) was "
                    "aborted; abort or destroy this one too",
                    fn, c->rank);
    return ncclSuccess;
}

ncclResult_t post(const char *fn, const call &k, bool reduces, ncclRedOp_t op)
{
    ncclResult_t r = ncclSuccess;
    if (!k.comm) {
        r = fail(ncclInvalidArgument, "%s: comm argument is NULL", fn);
    } else if ((r = check_usable(fn, k.comm)) != ncclSuccess) {
    } else if (type_size(k.dtype) == 0) {
        r = fail(ncclInvalidArgument, "%s: rank %d: invalid data type %d", fn, k.comm->rank,
                 (int)k.dtype);
    } else if (reduces && ((unsigned)op >= (unsigned)ncclNumOps)) {
        r = fail(ncclInvalidArgument, "%s: rank %d: invalid reduction operation %d", fn,
                 k.comm->rank, (int)op);
    } else if (reduces && (k.dtype == ncclFloat8e4m3 || k.dtype == ncclFloat8e5m2)) {
        r = fail(ncclInvalidArgument, "%s: rank %d: %s reductions on %s are not emulated", fn,
                 k.comm->rank, op_name(op), type_name(k.dtype));
    } else if (k.peer < 0 || k.peer >= k.comm->nranks) {
        r = fail(ncclInvalidArgument, "%s: rank %d: invalid %s %d (the communicator has %d ranks)",
                 fn, k.comm->rank, k.kind == k_p2p ? "peer" : "root", k.peer, k.comm->nranks);
    } else if (k.count > 0 &&
               ((k.kind != k_p2p || k.send) && !k.sendbuf &&
                !(k.kind == k_broadcast && k.comm->rank != k.peer))) {
        r = fail(ncclInvalidArgument, "%s: rank %d: send buffer is NULL", fn, k.comm->rank);
    } else if (k.count > 0 && (k.kind != k_p2p || !k.send) && !k.recvbuf) {
        r = fail(ncclInvalidArgument, "%s: rank %d: receive buffer is NULL", fn, k.comm->rank);
    }
    if (r != ncclSuccess) {
        if (group.depth > 0) group.error = r;
        return r;
    }
    if (group.depth > 0) {
        group.calls.push_back(k);
        return ncclSuccess;
    }
    return execute({ k });
}

call make_call(uint32_t kind, bool send, const void *sendbuf, void *recvbuf, size_t count,
               ncclDataType_t dtype, ncclRedOp_t op, int peer, ncclComm_t comm,
               cudaStream_t stream)
{
    call k;
    k.kind = kind;
    k.send = send;
    k.sendbuf = sendbuf;
    k.recvbuf = recvbuf;
    k.count = count;
    k.dtype = dtype;
    k.op = op;
    k.peer = peer;
    k.comm = comm;
    k.stream = stream;
    return k;
}

// ---------------------------------------------------------------- bootstrap

std::string socket_name(const ncclUniqueId &id, int rank)
{
    std::string s("mt-emu-nccl-");
    char hex[3];
    for (size_t i = sizeof id_magic; i < sizeof id_magic + 20; i++) {
        snprintf(hex, sizeof hex, "%02x", (unsigned char)id.internal[i]);
        s += hex;
    }
    return s + "-" + std::to_string(rank);
}

socklen_t abstract_addr(const std::string &name, sockaddr_un *a)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    const size_t n = name.size() < sizeof a->sun_path - 1 ? name.size() : sizeof a->sun_path - 1;
    memcpy(a->sun_path + 1, name.data(), n); // sun_path[0] = 0: the abstract namespace
    return (socklen_t)(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// Reads or writes exactly n bytes before the deadline (a blocking socket).
bool exchange(int fd, void *buf, size_t n, bool out, double deadline)
{
    char *p = (char *)buf;
    while (n > 0) {
        pollfd pf = { fd, (short)(out ? POLLOUT : POLLIN), 0 };
        const double left = deadline - now_s();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return false;
        }
        if (poll(&pf, 1, (int)(left * 1000) + 1) <= 0) continue;
        const ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : read(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            if (k == 0) errno = ECONNRESET;
            return false;
        }
        p += k;
        n -= (size_t)k;
    }
    return true;
}

// blocking and splitShare of config (NULL: the defaults, blocking and not shared).
ncclResult_t parse_config(const char *fn, const ncclConfig_t *config, bool *blocking, bool *share)
{
    *blocking = true;
    *share = false;
    if (!config) return ncclSuccess;
    if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, cgaClusterSize))
        return fail(ncclInvalidArgument,
                    "%s: the config was not initialised with NCCL_CONFIG_INITIALIZER", fn);
    if (config->blocking != NCCL_CONFIG_UNDEF_INT) {
        if (config->blocking != 0 && config->blocking != 1)
            return fail(ncclInvalidArgument, "%s: config blocking = %d is not 0 or 1", fn,
                        config->blocking);
        *blocking = config->blocking == 1;
    }
    if (config->size >= offsetof(ncclConfig_t, splitShare) + sizeof config->splitShare &&
        config->splitShare != NCCL_CONFIG_UNDEF_INT) {
        if (config->splitShare != 0 && config->splitShare != 1)
            return fail(ncclInvalidArgument, "%s: config splitShare = %d is not 0 or 1", fn,
                        config->splitShare);
        *share = config->splitShare == 1;
    }
    return ncclSuccess;
}

uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// The id of the communicator of colour made by split number seq of the comm of id parent:
// the same on every rank of that colour, different for every other colour and split.
ncclUniqueId derive_id(const ncclUniqueId &parent, uint64_t seq, int color)
{
    uint64_t h = 0xcbf29ce484222325ull; // FNV-1a over the parent's random bytes, seq, colour
    auto mix = [&h](const void *p, size_t n) {
        for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    };
    mix(parent.internal + sizeof id_magic, 20);
    mix(&seq, sizeof seq);
    mix(&color, sizeof color);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    memcpy(id.internal, id_magic, sizeof id_magic);
    for (int i = 0; i < 3; i++) {
        const uint64_t x = splitmix64(h + (uint64_t)i);
        memcpy(id.internal + sizeof id_magic + 8 * i, &x, i < 2 ? 8 : 4);
    }
    return id;
}

ncclResult_t bootstrap(ncclComm *c, const ncclUniqueId &id)
{
    const double limit = timeout_s(), deadline = now_s() + limit;
    sockaddr_un a;
    int lfd = -1;
    if (c->rank < c->nranks - 1) { // ranks above connect to this one
        lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        const socklen_t len = abstract_addr(socket_name(id, c->rank), &a);
        if (lfd < 0 || bind(lfd, (sockaddr *)&a, len) != 0 || listen(lfd, c->nranks) != 0) {
            const int e = errno;
            if (lfd >= 0) close(lfd);
            return fail(e == EADDRINUSE ? ncclInvalidUsage : ncclSystemError,
                        "ncclCommInitRankConfig: rank %d of %d: %s%s", c->rank, c->nranks,
                        strerror(e),
                        e == EADDRINUSE ? " (another communicator of this unique id has this rank)"
                                        : "");
        }
    }
    const hello mine = { frame_magic, c->rank, c->nranks };
    ncclResult_t r = ncclSuccess;
    for (int p = 0; p < c->rank && r == ncclSuccess; p++) {
        const socklen_t len = abstract_addr(socket_name(id, p), &a);
        for (;;) {
            int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd >= 0 && connect(fd, (sockaddr *)&a, len) == 0) {
                c->peers[p].fd = fd;
                break;
            }
            const int e = errno;
            if (fd >= 0) close(fd);
            if (e != ECONNREFUSED && e != ENOENT && e != EAGAIN && e != EINTR) {
                r = fail(ncclSystemError, "ncclCommInitRankConfig: rank %d: connect to rank %d: %s",
                         c->rank, p, strerror(e));
                break;
            }
            if (now_s() > deadline) {
                r = fail(ncclSystemError,
                         "ncclCommInitRankConfig: rank %d of %d: rank %d did not join within %g s",
                         c->rank, c->nranks, p, limit);
                break;
            }
            usleep(2000);
        }
        if (r == ncclSuccess && !exchange(c->peers[p].fd, (void *)&mine, sizeof mine, true, deadline))
            r = fail(ncclSystemError, "ncclCommInitRankConfig: rank %d: hello to rank %d: %s",
                     c->rank, p, strerror(errno));
    }
    for (int k = c->rank + 1; k < c->nranks && r == ncclSuccess; k++) {
        pollfd pf = { lfd, POLLIN, 0 };
        const double left = deadline - now_s();
        int fd = -1;
        if (left > 0 && poll(&pf, 1, (int)(left * 1000) + 1) > 0)
            fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
        hello h;
        if (fd < 0 || !exchange(fd, &h, sizeof h, false, deadline)) {
            if (fd >= 0) close(fd);
            if (now_s() < deadline) {
                k--; // an interrupted wait, or a connection that went away: wait again
                continue;
            }
            r = fail(ncclSystemError,
                     "ncclCommInitRankConfig: rank %d of %d: only %d of the ranks above it "
                     "joined within %g s",
                     c->rank, c->nranks, k - c->rank - 1, limit);
            break;
        }
        if (h.magic != frame_magic || h.nranks != c->nranks || h.rank <= c->rank ||
            h.rank >= c->nranks || c->peers[h.rank].fd >= 0) {
            close(fd);
            r = fail(ncclInvalidUsage,
                     "ncclCommInitRankConfig: rank %d of %d: a rank joined as rank %d of %d",
                     c->rank, c->nranks, h.rank, h.nranks);
            break;
        }
        c->peers[h.rank].fd = fd;
    }
    if (lfd >= 0) close(lfd);
    for (peer_conn &p : c->peers)
        if (p.fd >= 0) fcntl(p.fd, F_SETFL, fcntl(p.fd, F_GETFL) | O_NONBLOCK);
    return r;
}

} // namespace

// ---------------------------------------------------------------- the API

extern "C" {

ncclResult_t ncclGetVersion(int *version)
{
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version argument is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: id argument is NULL");
    memset(id, 0, sizeof *id);
    memcpy(id->internal, id_magic, sizeof id_magic);
    char *rnd = id->internal + sizeof id_magic;
    if (getrandom(rnd, 16, 0) != 16) {
        const uint64_t t = (uint64_t)(now_s() * 1e9);
        memcpy(rnd, &t, sizeof t);
    }
    const uint32_t pid = (uint32_t)getpid();
    memcpy(rnd + 16, &pid, sizeof pid);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    const char *fn = "ncclCommInitRankConfig";
    if (!comm) return fail(ncclInvalidArgument, "%s: comm argument is NULL", fn);
    *comm = nullptr;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "%s: rank %d of %d ranks is invalid", fn, rank, nranks);
    if (memcmp(id.internal, id_magic, sizeof id_magic) != 0)
        return fail(ncclInvalidArgument, "%s: the unique id was not made by ncclGetUniqueId", fn);
    bool blocking, share;
    MT_NCCL_TRY(parse_config(fn, config, &blocking, &share));
    ncclComm *c = new ncclComm;
    c->rank = rank;
    c->nranks = nranks;
    c->blocking = blocking;
    c->split_share = share;
    c->id = id;
    c->peers.resize((size_t)nranks);
    const ncclResult_t r = bootstrap(c, id);
    if (r != ncclSuccess) {
        close_comm(c);
        return r;
    }
    *comm = c;
    return claim_in_progress(c) ? ncclInProgress : ncclSuccess;
}

// Collective over every rank of comm (see the top). config NULL: the child inherits comm's
// blocking and splitShare, else it has the config's.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config)
{
    const char *fn = "ncclCommSplit";
    if (!comm) return fail(ncclInvalidArgument, "%s: comm argument is NULL", fn);
    if (!newcomm) return fail(ncclInvalidArgument, "%s: newcomm argument is NULL", fn);
    *newcomm = nullptr;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return fail(ncclInvalidArgument,
                    "%s: rank %d: color %d is negative and not NCCL_SPLIT_NOCOLOR", fn, comm->rank,
                    color);
    if (group.depth > 0)
        return fail(ncclInvalidUsage, "%s: rank %d: inside ncclGroupStart/ncclGroupEnd (not "
                                      "emulated)", fn, comm->rank);
    MT_NCCL_TRY(check_usable(fn, comm));
    bool blocking = comm->blocking, share = comm->split_share;
    if (config) MT_NCCL_TRY(parse_config(fn, config, &blocking, &share));
    const int n = comm->nranks, me = comm->rank;
    const uint64_t seq = comm->splits++;
    // every rank's colour and key, over the parent
    std::vector<int32_t> all(2 * (size_t)n);
    all[2 * (size_t)me] = color;
    all[2 * (size_t)me + 1] = key;
    std::vector<transfer> pool;
    pool.reserve(2 * (size_t)n);
    for (int p = 0; p < n; p++) {
        if (p == me) continue;
        new_transfer(pool, comm, k_split, true, p, &all[2 * (size_t)me], 2, ncclInt32);
        new_transfer(pool, comm, k_split, false, p, &all[2 * (size_t)p], 2, ncclInt32);
    }
    MT_NCCL_TRY(run_pool(pool));
    bool in_progress = claim_in_progress(comm);
    if (color == NCCL_SPLIT_NOCOLOR) return in_progress ? ncclInProgress : ncclSuccess;
    std::vector<int> members; // parent ranks of my colour, by key, then parent rank
    for (int p = 0; p < n; p++)
        if (all[2 * (size_t)p] == color) members.push_back(p);
    std::stable_sort(members.begin(), members.end(),
                     [&all](int a, int b) { return all[2 * (size_t)a + 1] < all[2 * (size_t)b + 1]; });
    ncclComm *c = new ncclComm;
    c->rank = (int)(std::find(members.begin(), members.end(), me) - members.begin());
    c->nranks = (int)members.size();
    c->blocking = blocking;
    c->split_share = share;
    c->id = derive_id(comm->id, seq, color);
    if (comm->split_share) c->abort_flag = comm->abort_flag; // NCCL reads the parent's
    c->peers.resize(members.size());
    const ncclResult_t r = bootstrap(c, c->id);
    if (r != ncclSuccess) {
        close_comm(c);
        return r;
    }
    *newcomm = c;
    in_progress |= claim_in_progress(c);
    return in_progress ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count)
        return fail(ncclInvalidArgument, "ncclCommCount: %s argument is NULL",
                    comm ? "count" : "comm");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank)
        return fail(ncclInvalidArgument, "ncclCommUserRank: %s argument is NULL",
                    comm ? "rank" : "comm");
    *rank = comm->rank;
    return ncclSuccess;
}

// A background call stops at its next poll (within 0.1 s); no peer is waited for.
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm) return ncclSuccess;
    comm->aborting = true;
    *comm->abort_flag = true; // also the comms that share it (splitShare)
    if (comm->worker.joinable()) comm->worker.join();
    close_comm(comm);
    return ncclSuccess;
}

// A call still running is finished first, as NCCL does.
ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm) return ncclSuccess;
    if (comm->worker.joinable()) comm->worker.join();
    close_comm(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state)
{
    if (!comm || !state)
        return fail(ncclInvalidArgument, "ncclCommGetAsyncError: %s argument is NULL",
                    comm ? "asyncError" : "comm");
    if (comm->busy) {
        *state = ncclInProgress;
        return ncclSuccess;
    }
    join_worker(comm);
    if (comm->error != ncclSuccess) {
        *state = comm->error;
    } else if (comm->pending > 0) {
        comm->pending--;
        *state = ncclInProgress;
    } else {
        *state = ncclSuccess;
    }
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t) { return last_error; }

ncclResult_t ncclGroupStart(void)
{
    if (group.depth++ == 0) {
        group.calls.clear();
        group.error = ncclSuccess;
    }
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group.depth == 0)
        return fail(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart is open");
    if (--group.depth > 0) return ncclSuccess;
    std::vector<call> calls;
    calls.swap(group.calls);
    if (group.error != ncclSuccess) return group.error; // the group is dropped, as NCCL does
    return calls.empty() ? ncclSuccess : execute(calls);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    return post("ncclAllReduce",
                make_call(k_all_reduce, false, sendbuff, recvbuff, count, datatype, op, 0, comm, stream),
                true, op);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    return post("ncclReduceScatter",
                make_call(k_reduce_scatter, false, sendbuff, recvbuff, recvcount, datatype, op, 0,
                          comm, stream),
                true, op);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return post("ncclAllGather",
                make_call(k_all_gather, false, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0,
                          comm, stream),
                false, ncclSum);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return post("ncclBroadcast",
                make_call(k_broadcast, false, sendbuff, recvbuff, count, datatype, ncclSum, root,
                          comm, stream),
                false, ncclSum);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return post("ncclSend",
                make_call(k_p2p, true, sendbuff, nullptr, count, datatype, ncclSum, peer, comm, stream),
                false, ncclSum);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return post("ncclRecv",
                make_call(k_p2p, false, nullptr, recvbuff, count, datatype, ncclSum, peer, comm, stream),
                false, ncclSum);
}

} // extern "C"

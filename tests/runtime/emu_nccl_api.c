/* The emulated NCCL's API (kernels/cuda/emu/emu_nccl.cc) called directly, through the
 * real loader (nccl_dl.c opens libnccl.so.2 from LD_LIBRARY_PATH): argument checks and
 * their ncclGetLastError text, groups, a send to oneself, the nonblocking protocol, and
 * every collective over every data type and reduction on 1, 2, 3 and 4 processes (forked:
 * no launcher), with results checked against hand-computed ones and bit-identical
 * across ranks; ncclCommSplit on 1 to 4 processes (colours, key order and its ties,
 * NCCL_SPLIT_NOCOLOR, a split of a split, the nonblocking protocol, splitShare's shared
 * abort flag, and a rank calling another operation instead). Exits 0 when every check
 * passed. */
#include "config.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

static int fails;
#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "emu_nccl_api: line %d: ", __LINE__);                         \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fputc('\n', stderr);                                                          \
            fails++;                                                                      \
        }                                                                                 \
    } while (0)
/* an NCCL call that must return want, its error text containing text */
#define EXPECT(call, want, text)                                                          \
    do {                                                                                  \
        ncclResult_t r_ = (call);                                                         \
        CHECK(r_ == (want), "%s returned %d (%s), expected %d", #call, r_,                \
              ncclGetErrorString(r_), (int)(want));                                       \
        if ((want) != ncclSuccess)                                                        \
            CHECK(strstr(ncclGetLastError(NULL), text) != NULL, "%s: last error '%s' lacks '%s'", \
                  #call, ncclGetLastError(NULL), text);                                   \
    } while (0)

/* Waits while a nonblocking comm is in progress; the polls it took. */
static int settle(ncclComm_t c)
{
    ncclResult_t s = ncclInProgress;
    int polls = 0;
    while (s == ncclInProgress && polls < 10000) { /* 10 s */
        CHECK(ncclCommGetAsyncError(c, &s) == ncclSuccess, "ncclCommGetAsyncError failed");
        if (polls++) usleep(1000);
    }
    CHECK(s == ncclSuccess, "comm state %d after %d polls", s, polls);
    return polls;
}

static void single_process(void)
{
    int v = 0;
    EXPECT(ncclGetVersion(&v), ncclSuccess, "");
    CHECK(v == NCCL_VERSION_CODE, "version %d", v);
    ncclUniqueId id;
    EXPECT(ncclGetUniqueId(&id), ncclSuccess, "");
    ncclComm_t c = NULL;
    EXPECT(ncclCommInitRankConfig(&c, 1, id, 0, NULL), ncclSuccess, "");
    float a[4] = { 1, 2, 3, 4 }, b[4] = { 0 };
    EXPECT(ncclAllReduce(a, b, 4, ncclFloat32, ncclSum, NULL, 0), ncclInvalidArgument,
           "comm argument is NULL");
    EXPECT(ncclAllReduce(a, b, 4, ncclNumTypes, ncclSum, c, 0), ncclInvalidArgument,
           "invalid data type");
    EXPECT(ncclAllReduce(a, b, 4, ncclFloat32, ncclNumOps, c, 0), ncclInvalidArgument,
           "invalid reduction operation");
    EXPECT(ncclAllReduce(a, NULL, 4, ncclFloat32, ncclSum, c, 0), ncclInvalidArgument,
           "receive buffer is NULL");
    EXPECT(ncclBroadcast(a, b, 4, ncclFloat32, 1, c, 0), ncclInvalidArgument, "invalid root 1");
    EXPECT(ncclSend(a, 4, ncclFloat32, 1, c, 0), ncclInvalidArgument, "invalid peer 1");
    EXPECT(ncclRecv(b, 4, ncclFloat32, -1, c, 0), ncclInvalidArgument, "invalid peer -1");
    EXPECT(ncclGroupEnd(), ncclInvalidUsage, "no ncclGroupStart");
    /* a refused call inside a group drops the group */
    EXPECT(ncclGroupStart(), ncclSuccess, "");
    EXPECT(ncclSend(a, 4, ncclFloat32, 3, c, 0), ncclInvalidArgument, "invalid peer 3");
    EXPECT(ncclGroupEnd(), ncclInvalidArgument, "invalid peer 3");
    /* a send to oneself pairs with a receive from oneself in the same group */
    EXPECT(ncclGroupStart(), ncclSuccess, "");
    EXPECT(ncclRecv(b, 4, ncclFloat32, 0, c, 0), ncclSuccess, "");
    EXPECT(ncclSend(a, 4, ncclFloat32, 0, c, 0), ncclSuccess, "");
    EXPECT(ncclGroupEnd(), ncclSuccess, "");
    CHECK(!memcmp(a, b, sizeof a), "self send/recv: %g %g %g %g", b[0], b[1], b[2], b[3]);
    /* one rank: every collective is a copy */
    memset(b, 0, sizeof b);
    EXPECT(ncclAllReduce(a, b, 4, ncclFloat32, ncclMax, c, 0), ncclSuccess, "");
    CHECK(!memcmp(a, b, sizeof a), "1-rank all_reduce");
    EXPECT(ncclCommDestroy(c), ncclSuccess, "");

    /* Nonblocking (MT_EMU_NCCL_INPROGRESS=1: every completion claims ncclInProgress) */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    EXPECT(ncclGetUniqueId(&id), ncclSuccess, "");
    EXPECT(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInProgress, "");
    EXPECT(ncclAllReduce(a, b, 4, ncclFloat32, ncclSum, c, 0), ncclInvalidUsage,
           "still in progress");
    CHECK(settle(c) >= 2, "ncclInProgress answered no poll");
    EXPECT(ncclAllReduce(a, b, 4, ncclFloat32, ncclSum, c, 0), ncclInProgress, "");
    settle(c);
    EXPECT(ncclGroupStart(), ncclSuccess, "");
    EXPECT(ncclSend(a, 4, ncclFloat32, 0, c, 0), ncclSuccess, ""); /* inside a group: queued */
    EXPECT(ncclRecv(b, 4, ncclFloat32, 0, c, 0), ncclSuccess, "");
    EXPECT(ncclGroupEnd(), ncclInProgress, "");
    EXPECT(ncclCommAbort(c), ncclSuccess, ""); /* allowed while in progress */
    cfg.magic = 0;
    EXPECT(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument,
           "NCCL_CONFIG_INITIALIZER");
    memset(&id, 0, sizeof id);
    EXPECT(ncclCommInitRankConfig(&c, 1, id, 0, NULL), ncclInvalidArgument, "ncclGetUniqueId");
}

/* ---- collectives on n forked ranks */

static const ncclDataType_t types[] = { ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32, ncclInt64,
                                        ncclUint64,  ncclFloat16, ncclFloat32, ncclFloat64,
                                        ncclBfloat16 };
enum { NTYPES = sizeof types / sizeof *types, MAXN = 4, COUNT = 11 };

static size_t tsize(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

/* v (exactly representable in every type used) stored as type t at p[i] */
static void put(void *p, size_t i, ncclDataType_t t, double v)
{
    switch (t) {
    case ncclInt8: ((int8_t *)p)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)p)[i] = (uint8_t)(uint64_t)v; break;
    case ncclInt32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t *)p)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case ncclFloat16: ((_Float16 *)p)[i] = (_Float16)v; break;
    case ncclFloat32: ((float *)p)[i] = (float)v; break;
    case ncclFloat64: ((double *)p)[i] = v; break;
    case ncclBfloat16: {
        float f = (float)v; /* exact in bf16: the upper half */
        uint32_t b;
        memcpy(&b, &f, 4);
        ((uint16_t *)p)[i] = (uint16_t)(b >> 16);
        break;
    }
    default: break;
    }
}

static bool is_int(ncclDataType_t t) { return t <= ncclUint64; }

/* rank r's element i: small integers, so every reduction is exact in every type */
static double x(int r, size_t i) { return (double)(r + 1 + (int)(i % 3)); }

static double expected(int n, size_t i, ncclRedOp_t op, ncclDataType_t t)
{
    double s = 0, p = 1, mx = -1e30, mn = 1e30;
    for (int r = 0; r < n; r++) {
        double v = x(r, i);
        s += v;
        p *= v;
        mx = v > mx ? v : mx;
        mn = v < mn ? v : mn;
    }
    switch (op) {
    case ncclSum: return s;
    case ncclProd: return t == ncclUint8 ? (double)((uint64_t)p % 256) : t == ncclInt8 ? (double)(int8_t)(uint8_t)((uint64_t)p % 256) : p;
    case ncclMax: return mx;
    case ncclMin: return mn;
    default: return is_int(t) ? (double)((long long)s / n) : s / n;
    }
}

static void rank_main(int n, int r, ncclUniqueId id, unsigned char *shared)
{
    ncclComm_t c = NULL;
    EXPECT(ncclCommInitRankConfig(&c, n, id, r, NULL), ncclSuccess, "");
    if (!c) return;
    unsigned char send[MAXN * COUNT * 8], recv[MAXN * COUNT * 8], want[MAXN * COUNT * 8];
    for (int k = 0; k < NTYPES; k++) {
        ncclDataType_t t = types[k];
        size_t es = tsize(t);
        for (ncclRedOp_t op = ncclSum; op < ncclNumOps; op++) {
            for (size_t i = 0; i < COUNT; i++) {
                put(send, i, t, x(r, i));
                put(want, i, t, expected(n, i, op, t));
            }
            memset(recv, 0xee, sizeof recv);
            EXPECT(ncclAllReduce(send, recv, COUNT, t, op, c, 0), ncclSuccess, "");
            CHECK(!memcmp(recv, want, COUNT * es), "n %d rank %d: all_reduce type %d op %d", n, r, t, op);
            EXPECT(ncclAllReduce(send, send, COUNT, t, op, c, 0), ncclSuccess, ""); /* in place */
            CHECK(!memcmp(send, want, COUNT * es), "n %d rank %d: in-place all_reduce type %d op %d", n, r, t, op);
        }
        /* reduce_scatter: rank r gets block r of the sums */
        for (size_t i = 0; i < (size_t)n * COUNT; i++) put(send, i, t, x(r, i));
        for (size_t i = 0; i < COUNT; i++) put(want, i, t, expected(n, (size_t)r * COUNT + i, ncclSum, t));
        EXPECT(ncclReduceScatter(send, recv, COUNT, t, ncclSum, c, 0), ncclSuccess, "");
        CHECK(!memcmp(recv, want, COUNT * es), "n %d rank %d: reduce_scatter type %d", n, r, t);
        /* all_gather: block p is rank p's */
        for (size_t i = 0; i < COUNT; i++) put(send, i, t, (double)(r * 20 + (int)i));
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < COUNT; i++) put(want, (size_t)p * COUNT + i, t, (double)(p * 20 + (int)i));
        EXPECT(ncclAllGather(send, recv, COUNT, t, c, 0), ncclSuccess, "");
        CHECK(!memcmp(recv, want, (size_t)n * COUNT * es), "n %d rank %d: all_gather type %d", n, r, t);
        /* broadcast from every root, in place */
        for (int root = 0; root < n; root++) {
            for (size_t i = 0; i < COUNT; i++) {
                put(recv, i, t, r == root ? (double)(root + 7 * (int)i % 5) : 0);
                put(want, i, t, (double)(root + 7 * (int)i % 5));
            }
            EXPECT(ncclBroadcast(recv, recv, COUNT, t, root, c, 0), ncclSuccess, "");
            CHECK(!memcmp(recv, want, COUNT * es), "n %d rank %d: broadcast from %d type %d", n, r, root, t);
        }
    }
    /* Sums that round: every rank must get the same bits (one reduction order). Counts
     * below, at and above the rank count split into uneven chunks. */
    static float f[257], g[257];
    const size_t counts[] = { 1, 3, 257 };
    size_t at = 0;
    for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
        const size_t m = counts[k];
        for (size_t i = 0; i < m; i++)
            f[i] = (float)(1.0 / (3.0 + r + 7.0 * (double)i)) * (r % 2 ? -1e3f : 1.0f);
        EXPECT(ncclAllReduce(f, g, m, ncclFloat32, ncclSum, c, 0), ncclSuccess, "");
        memcpy(shared + (size_t)r * 4096 + at, g, m * 4);
        at += m * 4;
    }
    /* a grouped exchange in both directions around the ring, posted in opposite orders */
    if (n > 1) {
        int next = (r + 1) % n, prev = (r + n - 1) % n;
        int32_t out[2] = { r, -r }, in[2] = { -1, -1 };
        EXPECT(ncclGroupStart(), ncclSuccess, "");
        if (r % 2) {
            EXPECT(ncclRecv(&in[0], 1, ncclInt32, prev, c, 0), ncclSuccess, "");
            EXPECT(ncclSend(&out[1], 1, ncclInt32, prev, c, 0), ncclSuccess, "");
            EXPECT(ncclSend(&out[0], 1, ncclInt32, next, c, 0), ncclSuccess, "");
            EXPECT(ncclRecv(&in[1], 1, ncclInt32, next, c, 0), ncclSuccess, "");
        } else {
            EXPECT(ncclSend(&out[0], 1, ncclInt32, next, c, 0), ncclSuccess, "");
            EXPECT(ncclRecv(&in[1], 1, ncclInt32, next, c, 0), ncclSuccess, "");
            EXPECT(ncclRecv(&in[0], 1, ncclInt32, prev, c, 0), ncclSuccess, "");
            EXPECT(ncclSend(&out[1], 1, ncclInt32, prev, c, 0), ncclSuccess, "");
        }
        EXPECT(ncclGroupEnd(), ncclSuccess, "");
        CHECK(in[0] == prev && in[1] == -next, "rank %d: ring got %d %d", r, in[0], in[1]);
    }
    EXPECT(ncclCommDestroy(c), ncclSuccess, "");
}

static void collectives(int n)
{
    ncclUniqueId id;
    EXPECT(ncclGetUniqueId(&id), ncclSuccess, "");
    unsigned char *shared = mmap(NULL, MAXN * 4096, PROT_READ | PROT_WRITE,
                                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(shared != MAP_FAILED, "mmap");
    if (shared == MAP_FAILED) return;
    memset(shared, 0, MAXN * 4096);
    fflush(NULL);
    pid_t pids[MAXN];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            fails = 0; /* the child's own */
            rank_main(n, r, id, shared);
            _exit(fails ? 1 : 0);
        }
    }
    for (int r = 0; r < n; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%d ranks: rank %d failed (status %d)", n, r, st);
    }
    for (int r = 1; r < n; r++)
        CHECK(!memcmp(shared, shared + (size_t)r * 4096, 4096),
              "%d ranks: rank %d's float sums differ from rank 0's", n, r);
    munmap(shared, MAXN * 4096);
}

/* ---- ncclCommSplit on n forked ranks */

/* Calls that may answer ncclInProgress on a nonblocking comm: then settle it. */
static void nb(ncclResult_t r, ncclComm_t c, const char *what)
{
    CHECK(r == ncclSuccess || r == ncclInProgress, "%s returned %d (%s): %s", what, r,
          ncclGetErrorString(r), ncclGetLastError(NULL));
    if (r == ncclInProgress) settle(c);
}

/* The sum over the ranks of c of v (an int all-reduce). */
static int sum_of(ncclComm_t c, int v)
{
    int s = -1;
    nb(ncclAllReduce(&v, &s, 1, ncclInt32, ncclSum, c, 0), c, "ncclAllReduce");
    return s;
}

static void split_main(int n, int r, ncclUniqueId id, bool nonblocking)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = nonblocking ? 0 : 1;
    cfg.splitShare = nonblocking ? 1 : 0;
    ncclComm_t world = NULL;
    ncclResult_t ir = ncclCommInitRankConfig(&world, n, id, r, &cfg);
    CHECK(world != NULL, "n %d rank %d: ncclCommInitRankConfig returned %d", n, r, ir);
    if (!world) return;
    nb(ir, world, "ncclCommInitRankConfig");
    /* two colours, keys in reverse: colour r % 2 holds r % 2, r % 2 + 2, ... with the
     * highest parent rank first */
    ncclComm_t half = NULL;
    nb(ncclCommSplit(world, r % 2, -r, &half, NULL), world, "ncclCommSplit");
    CHECK(half != NULL, "n %d rank %d: no communicator for colour %d", n, r, r % 2);
    if (!half) return;
    if (nonblocking) settle(half);
    int members = (n - r % 2 + 1) / 2, rank = -1, count = -1, above = 0;
    for (int p = r + 2; p < n; p += 2) above++;
    CHECK(ncclCommCount(half, &count) == ncclSuccess && count == members,
          "n %d rank %d: count %d, expected %d", n, r, count, members);
    CHECK(ncclCommUserRank(half, &rank) == ncclSuccess && rank == above,
          "n %d rank %d: rank %d, expected %d (by key, the highest parent rank first)", n, r,
          rank, above);
    int want = 0;
    for (int p = r % 2; p < n; p += 2) want += p + 1;
    CHECK(sum_of(half, r + 1) == want, "n %d rank %d: the sum over colour %d", n, r, r % 2);
    /* equal keys: parent rank order; the last rank takes no part */
    ncclComm_t most = (ncclComm_t)&most; /* must become NULL for NOCOLOR */
    const bool last = r == n - 1 && n > 1;
    nb(ncclCommSplit(world, last ? NCCL_SPLIT_NOCOLOR : 7, 0, &most, NULL), world,
       "ncclCommSplit");
    if (last) {
        CHECK(most == NULL, "n %d rank %d: a communicator for NCCL_SPLIT_NOCOLOR", n, r);
    } else if (most) {
        if (nonblocking) settle(most);
        CHECK(ncclCommUserRank(most, &rank) == ncclSuccess && rank == r, "n %d rank %d: rank %d",
              n, r, rank);
        CHECK(ncclCommCount(most, &count) == ncclSuccess && count == (n > 1 ? n - 1 : 1),
              "n %d rank %d: count %d", n, r, count);
        /* a split of a split: one rank each */
        ncclComm_t alone = NULL;
        nb(ncclCommSplit(most, r, 0, &alone, NULL), most, "ncclCommSplit");
        if (alone && nonblocking) settle(alone);
        CHECK(alone && ncclCommCount(alone, &count) == ncclSuccess && count == 1,
              "n %d rank %d: split of a split", n, r);
        if (alone) CHECK(sum_of(alone, 5) == 5, "n %d rank %d: one-rank sum", n, r);
        if (alone) ncclCommDestroy(alone);
        ncclCommDestroy(most);
    }
    /* the parent still works, and so does the other child */
    CHECK(sum_of(world, 1) == n, "n %d rank %d: the parent after the splits", n, r);
    CHECK(sum_of(half, 1) == members, "n %d rank %d: the child after the parent", n, r);
    /* aborting a child: with splitShare (the nonblocking parent here) the parent's abort
     * flag is the child's, so the parent is unusable too; without, it goes on */
    EXPECT(ncclCommAbort(half), ncclSuccess, "");
    int v = 1, s = 0;
    ncclResult_t rr = ncclAllReduce(&v, &s, 1, ncclInt32, ncclSum, world, 0);
    if (nonblocking) {
        CHECK(rr == ncclInvalidUsage && strstr(ncclGetLastError(NULL), "splitShare"),
              "n %d rank %d: the parent of an aborted child (splitShare) answered %d: %s", n, r,
              rr, ncclGetLastError(NULL));
        ncclCommAbort(world);
    } else {
        nb(rr, world, "ncclAllReduce after aborting a child");
        CHECK(s == n, "n %d rank %d: the parent after aborting an unshared child", n, r);
        EXPECT(ncclCommDestroy(world), ncclSuccess, "");
    }
}

/* Rank 0 splits while rank 1 all-reduces: both must fail, not hang, and one of them
 * (whichever sees the other's transfer first) names the mismatch; *named is set then. */
static void split_mismatch_main(int r, ncclUniqueId id, unsigned char *named)
{
    ncclComm_t world = NULL;
    EXPECT(ncclCommInitRankConfig(&world, 2, id, r, NULL), ncclSuccess, "");
    if (!world) return;
    ncclComm_t c = NULL;
    int v[2] = { 1, 2 };
    ncclResult_t rr = r == 0 ? ncclCommSplit(world, 0, 0, &c, NULL)
                             : ncclAllReduce(v, v, 2, ncclInt32, ncclSum, world, 0);
    CHECK(rr != ncclSuccess && rr != ncclInProgress, "rank %d: a mismatched split succeeded", r);
    CHECK(c == NULL, "a failed split made a communicator");
    if (strstr(ncclGetLastError(NULL), "the ranks called different operations")) *named = 1;
    ncclCommAbort(world);
}

static void splits(int n, bool nonblocking, bool mismatch)
{
    ncclUniqueId id;
    EXPECT(ncclGetUniqueId(&id), ncclSuccess, "");
    unsigned char *named = mmap(NULL, 1, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(named != MAP_FAILED, "mmap");
    if (named == MAP_FAILED) return;
    *named = 0;
    fflush(NULL);
    pid_t pids[MAXN];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            fails = 0;
            if (mismatch)
                split_mismatch_main(r, id, named);
            else
                split_main(n, r, id, nonblocking);
            _exit(fails ? 1 : 0);
        }
    }
    for (int r = 0; r < n; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "split on %d ranks%s: rank %d failed "
              "(status %d)", n, mismatch ? " (mismatch)" : nonblocking ? " (nonblocking)" : "",
              r, st);
    }
    if (mismatch) CHECK(*named, "a split against an all-reduce: no rank named the mismatch");
    munmap(named, 1);
}

int main(void)
{
    if (getenv("MT_EMU_NCCL_INPROGRESS") == NULL || strcmp(getenv("MT_EMU_NCCL_INPROGRESS"), "1")) {
        fprintf(stderr, "emu_nccl_api: run with MT_EMU_NCCL_INPROGRESS=1 (and the emulated "
                        "libnccl.so.2 on LD_LIBRARY_PATH)\n");
        return 2;
    }
    single_process();
    for (int n = 1; n <= MAXN; n++) collectives(n);
    for (int n = 1; n <= MAXN; n++) {
        splits(n, false, false);
        splits(n, true, false);
    }
    splits(2, false, true);
    printf("emu_nccl_api: %s\n", fails ? "FAILED" : "passed");
    return fails ? 1 : 0;
}

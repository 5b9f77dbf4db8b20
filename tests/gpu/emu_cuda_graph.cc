// The CUDA backend's graphs (struct mt_graph_ops; emu_cuda_graph.sh runs each case in a
// process of its own, under MT_EMU_STREAMS=immediate and =deferred).
//
//   emu_cuda_graph CASE
//
// `ok`: a scope of op-table calls (RMSNorm, a GEMM into a block the scope allocates and
// frees, an add) on fixed buffers is captured once and replayed; each replay, with new
// inputs, equals the ops run directly bit for bit; a replay costs one launch and calls
// no op; the graph holds the scope's block; a changed signature is captured again; a
// replay after another scope's work sees that work. The other cases break a rule of
// scopes and must fail: `host_read` (a copy to the host inside a scope: the emulator
// refuses it during capture and the backend stops with the CUDA error), `leak` (a block
// allocated and kept), `foreign_free` (a block allocated before the scope freed in it),
// `nested` (a scope begun inside another).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/gpu/emu_test.h"
extern "C" {
#include "util/error.h" // a C header without its own extern "C"
}

static int failures;
static void expect(bool ok, const char *what)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (!ok) failures++;
}

enum { M = 48, K = 40, N = 40 }; // x (M,K), w (N,K): y = rmsnorm(x), z = y w^T + y

struct bufs {
    float *x, *w, *nw, *y, *rstd, *z;
};

static float *dalloc(const struct mt_kernels *k, size_t n)
{
    float *p = (float *)k->op.alloc(k->ctx, n * sizeof(float));
    if (!p) {
        fprintf(stderr, "emu_cuda_graph: alloc failed\n");
        exit(1);
    }
    return p;
}

static void put(const struct mt_kernels *k, float *d, const std::vector<float> &h)
{
    k->op.copy(k->ctx, d, h.data(), h.size() * sizeof(float));
}

static std::vector<float> get(const struct mt_kernels *k, const float *d, size_t n)
{
    std::vector<float> h(n);
    k->op.copy(k->ctx, h.data(), d, n * sizeof(float));
    return h;
}

// The scope's ops: what a module's forward does, on fixed buffers.
static void body(const struct mt_kernels *k, const bufs &b)
{
    k->op.rmsnorm_fwd(k->ctx, mt_f32(b.y, M, K), b.rstd, mt_f32(b.x, M, K), mt_f32(b.nw, 1, K), M, K, 1e-6f);
    float *t = (float *)k->op.alloc(k->ctx, sizeof(float) * M * N); // a temporary of the scope
    k->op.gemm(k->ctx, false, true, M, N, K, 1.0f, mt_f32(b.y, M, K), mt_f32(b.w, N, K), 0.0f, mt_f32(t, M, N));
    k->op.add(k->ctx, mt_f32(b.z, 1, M * N), mt_f32(t, 1, M * N), mt_f32(b.y, 1, M * N), (size_t)M * N);
    k->op.free(k->ctx, t);
}

static std::vector<float> data(size_t n, int seed)
{
    std::vector<float> v(n);
    unsigned s = 2463534242u + 977u * (unsigned)seed;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 17, s ^= s << 5;
        v[i] = (float)(s % 20001) / 10000.0f - 1.0f;
    }
    return v;
}

static long long outside_launches(const struct mt_kernels *k)
{
    struct mt_op_counts c;
    k->counts(k->ctx, &c);
    return c.launches[MT_OP_COUNT];
}

static long long op_launches(const struct mt_kernels *k)
{
    struct mt_op_counts c;
    k->counts(k->ctx, &c);
    long long n = 0;
    for (int i = 0; i < MT_OP_COUNT; i++) n += c.launches[i];
    return n;
}

static int run(const char *c)
{
    struct mt_err err = {};
    const struct mt_kernels *k = mt_kernels_cuda(&err);
    if (!k) {
        fprintf(stderr, "emu_cuda_graph: %s\n", err.msg);
        return 1;
    }
    expect(k->graph != nullptr, "the CUDA backend has graph ops");
    bufs b = {dalloc(k, M * K), dalloc(k, N * K), dalloc(k, K), dalloc(k, M * K), dalloc(k, M), dalloc(k, M * N)};
    put(k, b.w, data(N * K, 1));
    put(k, b.nw, data(K, 2));
    const uint64_t key = 0x617474656e00ull, sig = 1;
    bool replayed = false;
    if (!strcmp(c, "ok")) {
        // warm-up: the ops run as they are (their blocks and plans exist afterwards)
        put(k, b.x, data(M * K, 10));
        if (k->graph->begin(k->ctx, key, sig, false, &replayed, &err) || replayed) return 1;
        body(k, b);
        if (k->graph->end(k->ctx, &err)) return 1;
        for (int round = 0; round < 4; round++) {
            put(k, b.x, data(M * K, 20 + round));
            body(k, b);
            const std::vector<float> want = get(k, b.z, M * N);
            k->op.memset(k->ctx, b.z, 0, sizeof(float) * M * N);
            put(k, b.x, data(M * K, 20 + round));
            const long long l0 = outside_launches(k), o0 = op_launches(k);
            if (k->graph->begin(k->ctx, key, sig, true, &replayed, &err)) {
                fprintf(stderr, "emu_cuda_graph: %s\n", err.msg);
                return 1;
            }
            expect(replayed == (round > 0), round ? "replayed" : "captured, not replayed");
            if (!replayed) {
                body(k, b);
                if (k->graph->end(k->ctx, &err)) {
                    fprintf(stderr, "emu_cuda_graph: %s\n", err.msg);
                    return 1;
                }
            }
            expect(outside_launches(k) == l0 + 1 && op_launches(k) == o0,
                   "the scope's work is one launch (the capture launched nothing)");
            const std::vector<float> got = get(k, b.z, M * N);
            expect(!memcmp(got.data(), want.data(), sizeof(float) * M * N), "graph equals the ops run directly, bit for bit");
        }
        struct mt_graph_stats st;
        k->graph->stats(k->ctx, &st);
        expect(st.graphs == 1 && st.captures == 1 && st.replays == 3 && st.recaptures == 0,
               "one graph, captured once, replayed three times");
        expect(st.bytes == 8192, "the graph holds its temporary (7680 bytes in an 8 KiB block)");
        // the graph's block is its own: a temporary of the same size outside is another
        float *other = dalloc(k, M * N);
        k->op.memset(k->ctx, other, 0xff, sizeof(float) * M * N);
        if (k->graph->begin(k->ctx, key, sig, true, &replayed, &err) || !replayed) return 1;
        const std::vector<float> o = get(k, other, M * N);
        bool kept = true;
        for (float v : o) kept = kept && isnan(v);
        expect(kept, "a replay leaves a block allocated outside it alone");
        k->op.free(k->ctx, other);
        // a changed signature: captured again, not replayed
        if (k->graph->begin(k->ctx, key, sig + 1, true, &replayed, &err)) return 1;
        expect(!replayed, "a changed signature is not replayed");
        body(k, b);
        if (k->graph->end(k->ctx, &err)) return 1;
        k->graph->stats(k->ctx, &st);
        expect(st.graphs == 1 && st.captures == 2 && st.recaptures == 1, "captured again under the new signature");
        k->graph->reset(k->ctx);
        k->graph->stats(k->ctx, &st);
        expect(st.graphs == 0 && st.bytes == 0, "reset destroys the graphs and gives back their blocks");
    } else if (!strcmp(c, "host_read")) {
        if (k->graph->begin(k->ctx, key, sig, true, &replayed, &err)) return 1;
        body(k, b);
        float h[4];
        k->op.copy(k->ctx, h, b.z, sizeof h); // the host reads device memory: stops here
        fprintf(stderr, "emu_cuda_graph: host_read: nothing stopped the host read\n");
        return 1;
    } else if (!strcmp(c, "leak") || !strcmp(c, "foreign_free") || !strcmp(c, "nested")) {
        float *before = dalloc(k, 16);
        if (k->graph->begin(k->ctx, key, sig, true, &replayed, &err)) return 1;
        body(k, b);
        if (!strcmp(c, "leak")) (void)dalloc(k, 16);
        if (!strcmp(c, "foreign_free")) k->op.free(k->ctx, before);
        if (!strcmp(c, "nested")) {
            const int rc = k->graph->begin(k->ctx, key + 1, sig, true, &replayed, &err);
            expect(rc == MT_EINVAL, "a scope inside a scope is refused");
            fprintf(stderr, "%s\n", err.msg);
            mt_err_clear(&err);
        }
        const int rc = k->graph->end(k->ctx, &err);
        if (!strcmp(c, "nested")) {
            expect(rc == MT_OK, "the outer scope still ends");
        } else {
            expect(rc == MT_ERUNTIME, "the capture fails");
            fprintf(stderr, "%s\n", err.msg);
        }
        struct mt_graph_stats st;
        k->graph->stats(k->ctx, &st);
        expect(st.graphs == (strcmp(c, "nested") ? 0 : 1), "no graph from a failed capture");
    } else {
        fprintf(stderr, "usage: emu_cuda_graph ok|host_read|leak|foreign_free|nested\n");
        return 2;
    }
    if (mt_kernels_cuda_destroy(&err)) {
        fprintf(stderr, "emu_cuda_graph: teardown: %s\n", err.msg);
        return 1;
    }
    return failures ? 1 : 0;
}

int main(int argc, char **argv) { return run(argc > 1 ? argv[1] : ""); }

/* The NCCL backend against results computed by hand, one GPU per process:
 * alone, or under a launcher with as many processes as GPUs on each node.
 * Exit 77 when there is no GPU (or fewer GPUs than local processes). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"
#include "tests/runtime/check.h"

#define CUDA(expr) CHECK((expr) == cudaSuccess, "%s failed", #expr)

static void *dev(size_t bytes)
{
    void *p = NULL;
    CUDA(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

static void check_all_reduce_and_broadcast(struct mt_comm *c)
{
    int n = c->size, r = c->rank;
    enum { N = 1000 };
    float h[N];
    for (int i = 0; i < N; i++) h[i] = (float)((r + 1) * (i % 7 + 1));
    float *d = dev(sizeof h);
    CUDA(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
    CALL(mt_all_reduce(c, d, N, MT_DT_F32, MT_OP_SUM, &g_err));
    CUDA(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += h[i] != (float)(n * (n + 1) / 2 * (i % 7 + 1));
    CHECK(!bad, "all_reduce: %d wrong", bad);

    for (int root = 0; root < n; root++) {
        int64_t v[3] = { r == root ? root : -1, 2 * root, 3 };
        int64_t *dv = dev(sizeof v);
        CUDA(cudaMemcpy(dv, v, sizeof v, cudaMemcpyHostToDevice));
        CALL(mt_broadcast(c, dv, 3, MT_DT_I64, root, &g_err));
        CUDA(cudaMemcpy(v, dv, sizeof v, cudaMemcpyDeviceToHost));
        CHECK(v[0] == root, "broadcast from %d: got %lld", root, (long long)v[0]);
        cudaFree(dv);
    }
    cudaFree(d);
}

static void check_scatter_gather(struct mt_comm *c)
{
    int n = c->size, r = c->rank;
    enum { C = 5 };
    double *h = malloc(sizeof *h * C * n);
    for (int j = 0; j < C * n; j++) h[j] = (double)(r + 1) * (j + 1);
    double *ds = dev(sizeof *h * C * n), *dr = dev(sizeof *h * C);
    CUDA(cudaMemcpy(ds, h, sizeof *h * C * n, cudaMemcpyHostToDevice));
    CALL(mt_reduce_scatter(c, ds, dr, C, MT_DT_F64, MT_OP_SUM, &g_err));
    CUDA(cudaMemcpy(h, dr, sizeof *h * C, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < C; i++) bad += h[i] != (double)n * (n + 1) / 2 * (r * C + i + 1);
    CHECK(!bad, "reduce_scatter: %d wrong", bad);

    for (int i = 0; i < C; i++) h[i] = r * 100 + i;
    CUDA(cudaMemcpy(dr, h, sizeof *h * C, cudaMemcpyHostToDevice));
    CALL(mt_all_gather(c, dr, ds, C, MT_DT_F64, &g_err));
    CUDA(cudaMemcpy(h, ds, sizeof *h * C * n, cudaMemcpyDeviceToHost));
    bad = 0;
    for (int b = 0; b < n; b++)
        for (int i = 0; i < C; i++) bad += h[b * C + i] != b * 100 + i;
    CHECK(!bad, "all_gather: %d wrong", bad);
    cudaFree(ds);
    cudaFree(dr);
    free(h);
}

/* Nonblocking collectives ordered with a compute stream s (NULL: none set): the input
 * written on s before the start (the collective follows it), a reduce_scatter and an
 * all_gather pending at once, work queued on s between the start and the wait that
 * touches other memory, and the result read on s after the wait (it follows the
 * collective) give what the blocking calls give. */
static void check_nonblocking(struct mt_comm *c, cudaStream_t s)
{
    int n = c->size, r = c->rank;
    enum { C = 6 };
    if (n > 8) return;
    int32_t *in = dev(sizeof(int32_t) * C * n), *out = dev(sizeof(int32_t) * C);
    int32_t *gin = dev(sizeof(int32_t) * C), *gout = dev(sizeof(int32_t) * C * n);
    int32_t *other = dev(sizeof(int32_t) * C);
    CUDA(cudaMemsetAsync(in, 1 + r, sizeof(int32_t) * C * n, s)); /* each int 0x0R0R0R0R */
    CUDA(cudaMemsetAsync(gin, 1 + r, sizeof(int32_t) * C, s));
    if (!s) CUDA(cudaStreamSynchronize(s)); /* no compute stream: nothing orders them */
    struct mt_comm_req q[2] = { { 0 } };
    CALL(mt_reduce_scatter_start(c, in, out, C, MT_DT_I32, MT_OP_SUM, &q[0], &g_err));
    CALL(mt_all_gather_start(c, gin, gout, C, MT_DT_I32, &q[1], &g_err));
    CHECK(mt_comm_pending(&q[0]) && mt_comm_pending(&q[1]), "requests not pending");
    CUDA(cudaMemsetAsync(other, 0, sizeof(int32_t) * C, s)); /* beside the collectives */
    CALL(mt_comm_wait(&q[1], &g_err));
    CALL(mt_comm_wait(&q[0], &g_err));
    int32_t h[C * 8], g[C * 8];
    CUDA(cudaMemcpyAsync(h, out, sizeof(int32_t) * C, cudaMemcpyDeviceToHost, s));
    CUDA(cudaMemcpyAsync(g, gout, sizeof(int32_t) * C * n, cudaMemcpyDeviceToHost, s));
    CUDA(cudaStreamSynchronize(s));
    int bad = 0;
    for (int i = 0; i < C; i++) bad += h[i] != n * (n + 1) / 2 * 0x01010101;
    for (int b = 0; b < n; b++)
        for (int i = 0; i < C; i++) bad += g[b * C + i] != (b + 1) * 0x01010101;
    CHECK(!bad, "nonblocking reduce_scatter and all_gather%s: %d wrong",
          s ? " ordered with a compute stream" : "", bad);
    cudaFree(in);
    cudaFree(out);
    cudaFree(gin);
    cudaFree(gout);
    cudaFree(other);
}

/* The pattern of check.h, blocks packed; started (mt_all_to_all_v_start, ordered with
 * the compute stream s: the counts overwritten while it is pending) or blocking. */
static void check_all_to_all_v(struct mt_comm *c, bool started, cudaStream_t s)
{
    int n = c->size, r = c->rank;
    size_t stot, rtot, *v = a2a_pattern(n, r, 0, &stot, &rtot);
    size_t *sc = v, *sd = v + n, *rc = v + 2 * n, *rd = v + 3 * n;
    int32_t *hs = malloc(sizeof *hs * (stot + 1)), *hr = malloc(sizeof *hr * (rtot + 1));
    for (int p = 0; p < n; p++)
        for (size_t k = 0; k < sc[p]; k++) hs[sd[p] + k] = (int32_t)a2a_value(r, p, k);
    int32_t *ds = dev(sizeof *hs * stot), *dr = dev(sizeof *hr * rtot);
    CUDA(cudaMemcpy(ds, hs, sizeof *hs * stot, cudaMemcpyHostToDevice));
    if (started) {
        struct mt_comm_req q = { 0 };
        CALL(mt_all_to_all_v_start(c, ds, sc, sd, dr, rc, rd, MT_DT_I32, &q, &g_err));
        CHECK(mt_comm_pending(&q), "a started all_to_all_v is not pending");
        size_t *saved = malloc(4 * (size_t)n * sizeof *saved);
        memcpy(saved, v, 4 * (size_t)n * sizeof *v);
        memset(v, 0, 4 * (size_t)n * sizeof *v);
        CALL(mt_comm_wait(&q, &g_err));
        memcpy(v, saved, 4 * (size_t)n * sizeof *v);
        free(saved);
        CUDA(cudaStreamSynchronize(s));
    } else {
        CALL(mt_all_to_all_v(c, ds, sc, sd, dr, rc, rd, MT_DT_I32, &g_err));
    }
    CUDA(cudaMemcpy(hr, dr, sizeof *hr * rtot, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int p = 0; p < n; p++)
        for (size_t k = 0; k < rc[p]; k++) bad += hr[rd[p] + k] != a2a_value(p, r, k);
    CHECK(!bad, "%sall_to_all_v: %d wrong", started ? "started " : "", bad);
    cudaFree(ds);
    cudaFree(dr);
    free(hs);
    free(hr);
    free(v);
}

static void check_send_recv(struct mt_comm *c)
{
    int n = c->size, r = c->rank;
    if (n < 2) return; /* NCCL pairs a send to oneself only inside a group */
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    /* separate buffers: an odd rank receives before it sends */
    uint8_t h[16];
    for (int i = 0; i < 16; i++) h[i] = (uint8_t)(r * 16 + i);
    uint8_t *ds = dev(16), *dr = dev(16);
    CUDA(cudaMemcpy(ds, h, 16, cudaMemcpyHostToDevice));
    for (int phase = 0; phase < 2; phase++) {
        if ((r % 2 == 0) == (phase == 0))
            CALL(mt_send(c, ds, 16, MT_DT_U8, next, 0, &g_err));
        else
            CALL(mt_recv(c, dr, 16, MT_DT_U8, prev, 0, &g_err));
    }
    CUDA(cudaMemcpy(h, dr, 16, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < 16; i++) bad += h[i] != (uint8_t)(prev * 16 + i);
    CHECK(!bad, "recv from %d: %d wrong", prev, bad);
    cudaFree(ds);
    cudaFree(dr);
}

/* mt_p2p_batch as the interleaved pipeline uses it: every process sends to
 * the next one around the ring and to the previous one and receives both
 * theirs, all in one batch (separate blocking calls in that order would
 * deadlock). Odd ranks list their transfers in the reverse order: the batch
 * must still pair them by tag. With one process the ring is a loop to
 * oneself, which NCCL allows inside a group. */
static void check_p2p_batch(struct mt_comm *c)
{
    enum { N = 1 << 20 }; /* 4 MiB per message */
    int n = c->size, r = c->rank, next = (r + 1) % n, prev = (r + n - 1) % n;
    float *h = malloc(sizeof *h * N);
    CHECK(h != NULL, "out of memory");
    if (!h) return;
    float *to_next = dev(sizeof *h * N), *to_prev = dev(sizeof *h * N);
    float *from_prev = dev(sizeof *h * N), *from_next = dev(sizeof *h * N);
    for (int i = 0; i < N; i++) h[i] = (float)(r * 1000 + i % 997);
    CUDA(cudaMemcpy(to_next, h, sizeof *h * N, cudaMemcpyHostToDevice));
    for (int i = 0; i < N; i++) h[i] = (float)(-r * 1000 - i % 991);
    CUDA(cudaMemcpy(to_prev, h, sizeof *h * N, cudaMemcpyHostToDevice));
    for (int round = 0; round < 2; round++) {
        CUDA(cudaMemset(from_prev, 0, sizeof *h * N));
        CUDA(cudaMemset(from_next, 0, sizeof *h * N));
        struct mt_p2p ops[4] = {
            { true, to_next, N, next, 1 },
            { false, from_prev, N, prev, 1 },
            { true, to_prev, N, prev, 2 },
            { false, from_next, N, next, 2 },
        };
        if (r % 2)
            for (int i = 0; i < 2; i++) {
                struct mt_p2p t = ops[i];
                ops[i] = ops[3 - i];
                ops[3 - i] = t;
            }
        CALL(mt_p2p_batch(c, ops, 4, MT_DT_F32, &g_err));
        int bad = 0;
        CUDA(cudaMemcpy(h, from_prev, sizeof *h * N, cudaMemcpyDeviceToHost));
        for (int i = 0; i < N; i++) bad += h[i] != (float)(prev * 1000 + i % 997);
        CUDA(cudaMemcpy(h, from_next, sizeof *h * N, cudaMemcpyDeviceToHost));
        for (int i = 0; i < N; i++) bad += h[i] != (float)(-next * 1000 - i % 991);
        CHECK(!bad, "p2p batch round %d (next %d, prev %d): %d wrong", round, next, prev, bad);
    }
    cudaFree(to_next);
    cudaFree(to_prev);
    cudaFree(from_prev);
    cudaFree(from_next);
    free(h);
}

/* Faults the emulated NCCL must report (tests/runtime/nccl_collectives_emu.sh), as the
 * argument names them; each is an error, never a hang:
 *   deadlock   two ranks each send to the other first, outside a group: each send
 *              waits for its receive (rendezvous), so neither is ever posted;
 *   deadlock-timeout  the same with a communicator timeout of 3 s (run with NCCL's own
 *              timeout longer, and the sends in the background: comm_nccl.c's
 *              timeout must end them with ncclCommAbort);
 *   mismatch   the ranks all-reduce different counts;
 *   peer-gone  rank 1 destroys its communicator while rank 0 all-reduces on it.
 * The failed calls print their message through CALL; the program then exits 1. */
static void run_fault(struct mt_comm *c, const char *mode)
{
    int r = c->rank, peer = 1 - r;
    uint8_t *d = dev(64);
    CUDA(cudaMemset(d, 0, 64));
    if (!strcmp(mode, "deadlock") || !strcmp(mode, "deadlock-timeout")) {
        CALL(mt_send(c, d, 16, MT_DT_U8, peer, 0, &g_err));
        CALL(mt_recv(c, d, 16, MT_DT_U8, peer, 0, &g_err));
    } else if (!strcmp(mode, "mismatch")) {
        CALL(mt_all_reduce(c, d, r == 0 ? 10 : 12, MT_DT_I32, MT_OP_SUM, &g_err));
    } else if (!strcmp(mode, "peer-gone")) {
        if (r == 0) CALL(mt_all_reduce(c, d, 16, MT_DT_F32, MT_OP_SUM, &g_err));
    } else {
        CHECK(0, "unknown mode %s", mode);
    }
    cudaFree(d);
}

int main(int argc, char **argv)
{
    const char *fault = argc > 1 ? argv[1] : NULL;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("nccl_check: no CUDA device\n");
        return 77;
    }
    struct mt_world *w;
    const bool short_timeout = fault && !strcmp(fault, "deadlock-timeout");
    if (mt_world_init(&w, short_timeout ? 3 : 120, &g_err)) {
        fprintf(stderr, "nccl_check: %s\n", g_err.msg);
        return 1;
    }
    g_rank = w->rank;
    if (w->local_size > ndev) {
        printf("nccl_check: %d local processes but %d GPUs\n", w->local_size, ndev);
        mt_world_finalize(w);
        return 77;
    }
    CUDA(cudaSetDevice(w->local_rank));
    struct mt_comm *c = NULL;
    CALL(mt_comm_nccl_create(w->comm, &c, &g_err));
    if (c && fault) {
        CHECK(c->size == 2, "%s needs 2 processes", fault);
        if (c->size == 2) run_fault(c, fault);
        mt_comm_destroy(c);
    } else if (c) {
        check_all_reduce_and_broadcast(c);
        check_scatter_gather(c);
        check_all_to_all_v(c, false, NULL);
        check_send_recv(c);
        check_p2p_batch(c);
        CALL(mt_barrier(c, &g_err));
        cudaStream_t s;
        CUDA(cudaStreamCreate(&s));
        CALL(mt_comm_nccl_set_stream(c, s, &g_err));
        check_all_reduce_and_broadcast(c);
        check_nonblocking(c, s);
        check_all_to_all_v(c, true, s);
        CALL(mt_comm_nccl_set_stream(c, NULL, &g_err));
        check_nonblocking(c, NULL);
        check_all_to_all_v(c, true, NULL);
        cudaStreamDestroy(s);
        mt_comm_destroy(c);
    }
    struct mt_comm *self = NULL;
    CALL(mt_comm_self_create("self", 0, &self, &g_err));
    CHECK(mt_comm_nccl_set_stream(self, NULL, &g_err) == MT_EINVAL,
          "set_stream accepted a self comm");
    mt_comm_destroy(self);

    struct mt_err e = { 0 };
    if (g_fails) mt_err_set(&e, MT_ERUNTIME, "%d checks failed", g_fails);
    int nfailed = 0;
    bool report = false;
    if (mt_world_agree(w, &e, 120, &nfailed, &report, &g_err)) {
        fprintf(stderr, "nccl_check: %s\n", g_err.msg);
        mt_world_abort(w);
    }
    if (!nfailed && w->rank == 0) printf("nccl_check: passed on %d processes\n", w->size);
    mt_world_finalize(w);
    return nfailed ? 1 : 0;
}

/* A multi-process check of the runtime, started by a launcher (mpirun, srun)
 * or alone. Modes:
 *
 *   comm_check [collectives]   every collective on the world, on a split in
 *                              reverse key order, on singleton splits and on
 *                              the groups of mt_parallel_init, against results
 *                              computed by hand from the ranks; zero-length and
 *                              in-place calls; the modex; mt_world_agree. Each
 *                              process prints one "info" line (rank, local rank,
 *                              node, host, launcher); rank 0 prints "passed".
 *   comm_check hang R S        timeout S seconds; rank R stops answering before
 *                              an all_reduce on the pair groups "tp[i]" (ranks
 *                              2i, 2i+1): the others must fail naming it, and
 *                              abort the job.
 *   comm_check kill R S        the same, but rank R dies of SIGKILL.
 *   comm_check hang-nb R S     as hang, with a reduce_scatter started
 *                              (mt_reduce_scatter_start) whose wait must time out.
 *   comm_check hang-p2p R S    as hang-nb, with a p2p batch started with the partner
 *                              (mt_p2p_batch_start).
 *   (collectives also checks the nonblocking starts and their waits.)
 *
 * Exit status: 0 when every check passed on every process, else 1 (through
 * mt_world_abort after a runtime error). */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/comm.h"
#include "runtime/parallel.h"
#include "tests/runtime/check.h"

static void check_all_reduce(struct mt_comm *c)
{
    int n = c->size, r = c->rank;
    static const size_t counts[] = { 1, 7, 1000 };
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        size_t cnt = counts[k];
        double *d = malloc(sizeof *d * cnt);
        int32_t *mx = malloc(sizeof *mx * cnt), *mn = malloc(sizeof *mn * cnt);
        int64_t *l = malloc(sizeof *l * cnt);
        float *f = malloc(sizeof *f * cnt);
        uint8_t *u = malloc(cnt);
        for (size_t i = 0; i < cnt; i++) {
            d[i] = (double)(r + 1) * (double)(i + 1);
            mx[i] = mn[i] = (int32_t)(r * 3 - (int)i);
            l[i] = ((int64_t)1 << 40) * (r + 1) + (int64_t)i;
            f[i] = (float)(r + 1);
            u[i] = (uint8_t)((r * 37 + i) % 251);
        }
        CALL(mt_all_reduce(c, d, cnt, MT_DT_F64, MT_OP_SUM, &g_err));
        CALL(mt_all_reduce(c, mx, cnt, MT_DT_I32, MT_OP_MAX, &g_err));
        CALL(mt_all_reduce(c, mn, cnt, MT_DT_I32, MT_OP_MIN, &g_err));
        CALL(mt_all_reduce(c, l, cnt, MT_DT_I64, MT_OP_SUM, &g_err));
        CALL(mt_all_reduce(c, f, cnt, MT_DT_F32, MT_OP_SUM, &g_err));
        CALL(mt_all_reduce(c, u, cnt, MT_DT_U8, MT_OP_MAX, &g_err));
        int bad = 0;
        for (size_t i = 0; i < cnt; i++) {
            uint8_t umax = 0;
            for (int q = 0; q < n; q++)
                if ((uint8_t)((q * 37 + i) % 251) > umax) umax = (uint8_t)((q * 37 + i) % 251);
            bad += d[i] != (double)n * (n + 1) / 2 * (double)(i + 1);
            bad += mx[i] != (int32_t)((n - 1) * 3 - (int)i) || mn[i] != -(int32_t)i;
            bad += l[i] != ((int64_t)1 << 40) * n * (n + 1) / 2 + (int64_t)i * n;
            bad += f[i] != (float)(n * (n + 1) / 2) || u[i] != umax;
        }
        CHECK(!bad, "all_reduce on %s, count %zu: %d wrong elements", c->name, cnt, bad);
        free(d);
        free(mx);
        free(mn);
        free(l);
        free(f);
        free(u);
    }
    CALL(mt_all_reduce(c, NULL, 0, MT_DT_F32, MT_OP_SUM, &g_err));
}

static void check_reduce_scatter(struct mt_comm *c)
{
    int n = c->size, r = c->rank;
    for (size_t cnt = 0; cnt <= 3; cnt += 3) {
        for (int inplace = 0; inplace < 2; inplace++) {
            double *send = malloc(sizeof *send * (n * cnt + 1));
            double *recv = inplace ? send : malloc(sizeof *recv * (cnt + 1));
            for (size_t j = 0; j < n * cnt; j++) send[j] = (double)(r + 1) * (double)(j + 1);
            CALL(mt_reduce_scatter(c, send, recv, cnt, MT_DT_F64, MT_OP_SUM, &g_err));
            int bad = 0;
            for (size_t i = 0; i < cnt; i++)
                bad += recv[i] != (double)n * (n + 1) / 2 * (double)(r * cnt + i + 1);
            CHECK(!bad, "reduce_scatter on %s, count %zu%s: %d wrong", c->name, cnt,
                  inplace ? " in place" : "", bad);
            if (!inplace) free(recv);
            free(send);
        }
    }
}

static void check_all_gather(struct mt_comm *c)
{
    int n = c->size, r = c->rank;
    for (size_t cnt = 0; cnt <= 5; cnt += 5) {
        for (int inplace = 0; inplace < 2; inplace++) {
            int32_t *recv = malloc(sizeof *recv * (n * cnt + 1)), mine[5];
            for (size_t i = 0; i < n * cnt; i++) recv[i] = -1;
            int32_t *send = inplace ? recv + r * cnt : mine;
            for (size_t i = 0; i < cnt; i++) send[i] = r * 100 + (int32_t)i;
            CALL(mt_all_gather(c, send, recv, cnt, MT_DT_I32, &g_err));
            int bad = 0;
            for (int b = 0; b < n; b++)
                for (size_t i = 0; i < cnt; i++) bad += recv[b * cnt + i] != b * 100 + (int)i;
            CHECK(!bad, "all_gather on %s, count %zu%s: %d wrong", c->name, cnt,
                  inplace ? " in place" : "", bad);
            free(recv);
        }
    }
}

/* The pattern of check.h with a gap of one element between blocks, so that
 * displacements matter; started (mt_all_to_all_v_start: the counts overwritten while it
 * is pending, which the backend must not read any more, and a second start on the comm
 * refused) or blocking. */
static void check_all_to_all_v(struct mt_comm *c, bool started)
{
    int n = c->size, r = c->rank;
    size_t stot, rtot, *v = a2a_pattern(n, r, 1, &stot, &rtot);
    size_t *sc = v, *sd = v + n, *rc = v + 2 * n, *rd = v + 3 * n;
    int64_t *send = malloc(sizeof *send * (stot + 1)), *recv = malloc(sizeof *recv * (rtot + 1));
    for (int p = 0; p < n; p++)
        for (size_t k = 0; k < sc[p]; k++) send[sd[p] + k] = a2a_value(r, p, k);
    for (size_t i = 0; i < rtot; i++) recv[i] = -7;
    if (started) {
        struct mt_comm_req q = { 0 }, q2 = { 0 };
        CALL(mt_all_to_all_v_start(c, send, sc, sd, recv, rc, rd, MT_DT_I64, &q, &g_err));
        size_t *saved = malloc(4 * (size_t)n * sizeof *saved);
        memcpy(saved, v, 4 * (size_t)n * sizeof *v);
        memset(v, 0xff, 4 * (size_t)n * sizeof *v);
        int64_t x = 0;
        size_t one = 1, zero = 0;
        int rc2 = n == 1 ? MT_OK
                         : mt_all_to_all_v_start(c, &x, &one, &zero, &x, &one, &zero, MT_DT_I64,
                                                 &q2, &g_err);
        CHECK(n == 1 || (rc2 == MT_EINVAL && strstr(g_err.msg, "another started all_to_all_v")),
              "a second started all_to_all_v on %s: rc %d, %s", c->name, rc2, g_err.msg);
        CALL(mt_comm_wait(&q, &g_err));
        CHECK(!mt_comm_pending(&q), "all_to_all_v's request still pending");
        memcpy(v, saved, 4 * (size_t)n * sizeof *v);
        free(saved);
    } else {
        CALL(mt_all_to_all_v(c, send, sc, sd, recv, rc, rd, MT_DT_I64, &g_err));
    }
    int bad = 0;
    for (int p = 0; p < n; p++) {
        for (size_t k = 0; k < rc[p]; k++) bad += recv[rd[p] + k] != a2a_value(p, r, k);
        bad += recv[rd[p] + rc[p]] != -7; /* the gap is untouched */
    }
    CHECK(!bad, "%sall_to_all_v on %s: %d wrong", started ? "started " : "", c->name, bad);
    free(send);
    free(recv);

    /* Every count zero: a valid exchange of nothing. */
    memset(v, 0, 4 * (size_t)n * sizeof *v);
    CALL(mt_all_to_all_v(c, NULL, sc, sd, NULL, rc, rd, MT_DT_I64, &g_err));
    free(v);
}

static void check_broadcast(struct mt_comm *c)
{
    for (int root = 0; root < c->size; root++) {
        uint8_t buf[10];
        for (int i = 0; i < 10; i++) buf[i] = (uint8_t)(c->rank == root ? root * 10 + i : 255);
        CALL(mt_broadcast(c, buf, 10, MT_DT_U8, root, &g_err));
        int bad = 0;
        for (int i = 0; i < 10; i++) bad += buf[i] != root * 10 + i;
        CHECK(!bad, "broadcast on %s from root %d: %d wrong", c->name, root, bad);
        CALL(mt_broadcast(c, NULL, 0, MT_DT_U8, root, &g_err));
    }
    CHECK(mt_broadcast(c, NULL, 0, MT_DT_U8, c->size, &g_err) == MT_EINVAL,
          "broadcast with root %d outside %s was accepted", c->size, c->name);
}

/* A ring: even ranks send first, odd ranks receive first. */
static void check_send_recv(struct mt_comm *c)
{
    int n = c->size, r = c->rank, next = (r + 1) % n, prev = (r + n - 1) % n;
    float out[64], in[64];
    for (int i = 0; i < 64; i++) out[i] = (float)(r * 64 + i);
    for (int phase = 0; phase < 2; phase++) {
        if ((r % 2 == 0) == (phase == 0)) {
            CALL(mt_send(c, out, 64, MT_DT_F32, next, 5, &g_err));
            CALL(mt_send(c, NULL, 0, MT_DT_F32, next, 6, &g_err));
        } else {
            CALL(mt_recv(c, in, 64, MT_DT_F32, prev, 5, &g_err));
            CALL(mt_recv(c, NULL, 0, MT_DT_F32, prev, 6, &g_err));
        }
    }
    int bad = 0;
    for (int i = 0; i < 64; i++) bad += in[i] != (float)(prev * 64 + i);
    CHECK(!bad, "recv on %s from %d: %d wrong", c->name, prev, bad);
}

/* Nonblocking collectives: several started at once, on one comm, waited for in the
 * reverse order of their starts, give what the blocking calls give; a request reused
 * before its wait is refused; a wait on an empty request does nothing. */
static void check_nonblocking(struct mt_comm *c)
{
    int n = c->size, r = c->rank;
    enum { CNT = 6 };
    double ar[CNT], rs_send[CNT * 8], rs_recv[CNT], rs_inplace[CNT * 8];
    int32_t ag_recv[CNT * 8], mine[CNT];
    if (n > 8) return;
    for (int i = 0; i < CNT; i++) {
        ar[i] = (double)(r + 1) * (i + 1);
        mine[i] = r * 100 + i;
    }
    for (int j = 0; j < n * CNT; j++)
        rs_send[j] = rs_inplace[j] = (double)(r + 1) * (double)(j + 1);
    struct mt_comm_req q[4] = { 0 };
    CALL(mt_all_reduce_start(c, ar, CNT, MT_DT_F64, MT_OP_SUM, &q[0], &g_err));
    CALL(mt_reduce_scatter_start(c, rs_send, rs_recv, CNT, MT_DT_F64, MT_OP_SUM, &q[1], &g_err));
    CALL(mt_reduce_scatter_start(c, rs_inplace, rs_inplace, CNT, MT_DT_F64, MT_OP_SUM, &q[2],
                                 &g_err));
    CALL(mt_all_gather_start(c, mine, ag_recv, CNT, MT_DT_I32, &q[3], &g_err));
    /* a pending request is not started over */
    double x = 1;
    int rc = n > 1 ? mt_all_reduce_start(c, &x, 1, MT_DT_F64, MT_OP_SUM, &q[0], &g_err) : MT_OK;
    CHECK(n == 1 || (rc == MT_EINVAL && strstr(g_err.msg, "not waited for")),
          "a pending request started again on %s: rc %d, %s", c->name, rc, g_err.msg);
    for (int i = 3; i >= 0; i--) CALL(mt_comm_wait(&q[i], &g_err));
    for (int i = 0; i < 4; i++) CHECK(!mt_comm_pending(&q[i]), "request %d still pending", i);
    CALL(mt_comm_wait(&q[0], &g_err)); /* nothing pending: nothing to do */
    int bad = 0;
    for (int i = 0; i < CNT; i++) {
        bad += ar[i] != (double)n * (n + 1) / 2 * (i + 1);
        double want = (double)n * (n + 1) / 2 * (double)(r * CNT + i + 1);
        bad += rs_recv[i] != want;
        bad += rs_inplace[i] != want;
    }
    for (int b = 0; b < n; b++)
        for (int i = 0; i < CNT; i++) bad += ag_recv[b * CNT + i] != b * 100 + i;
    CHECK(!bad, "nonblocking collectives on %s: %d wrong values", c->name, bad);
}

static void check_comm(struct mt_comm *c)
{
    check_nonblocking(c);
    check_all_reduce(c);
    check_reduce_scatter(c);
    check_all_gather(c);
    check_all_to_all_v(c, false);
    check_all_to_all_v(c, true);
    check_broadcast(c);
    check_send_recv(c);
    CALL(mt_barrier(c, &g_err));
}

/* Counts past MPI's int are refused before anything is sent (on every rank). */
static void check_huge_counts(struct mt_comm *c)
{
    if (c->size == 1) return;
    size_t *v = calloc(4 * (size_t)c->size, sizeof *v);
    v[0] = (size_t)1 << 31;
    int rc = mt_all_to_all_v(c, NULL, v, v + c->size, NULL, v + 2 * c->size, v + 3 * c->size,
                             MT_DT_U8, &g_err);
    CHECK(rc == MT_EUNSUPPORTED && strstr(g_err.msg, "send_counts[0]"),
          "all_to_all_v with 2^31 elements: rc %d, %s", rc, g_err.msg);
    free(v);
}

static void check_exchange(struct mt_world *w)
{
    char mine[16], *all = malloc(16 * (size_t)w->size);
    snprintf(mine, sizeof mine, "rank-%d", w->rank);
    for (int round = 0; round < 2; round++) {
        memset(all, 0, 16 * (size_t)w->size);
        CALL(mt_world_exchange(w, "probe", mine, sizeof mine, all, &g_err));
        int bad = 0;
        for (int r = 0; r < w->size; r++) {
            char want[16];
            snprintf(want, sizeof want, "rank-%d", r);
            bad += strcmp(all + 16 * r, want) != 0;
        }
        CHECK(!bad, "exchange round %d: %d wrong blobs", round, bad);
        mine[15] = (char)round;
    }
    free(all);
}

static void check_splits(struct mt_world *w)
{
    /* Two groups by parity, ranks in reverse order of world rank. */
    struct mt_comm *c = NULL;
    char name[32];
    snprintf(name, sizeof name, "parity[%d]", w->rank % 2);
    CALL(mt_world_split(w, w->rank % 2, -w->rank, name, &c, &g_err));
    if (c) {
        int size = (w->size + 1 - w->rank % 2) / 2, pos = 0;
        for (int q = w->rank + 2; q < w->size; q += 2) pos++;
        CHECK(c->size == size && c->rank == pos && !strcmp(c->name, name),
              "split %s: rank %d of %d, expected %d of %d", name, c->rank, c->size, pos, size);
        check_comm(c);
        mt_comm_destroy(c);
    }
    /* Every process alone. */
    CALL(mt_world_split(w, w->rank, 0, "alone", &c, &g_err));
    if (c) {
        CHECK(c->size == 1 && c->rank == 0, "singleton split: rank %d of %d", c->rank, c->size);
        check_comm(c);
        mt_comm_destroy(c);
    }
}

/* Every comm of p holds the processes the layout lists: the sum of their
 * logical ranks is the sum over the list (in no group: its own rank). */
static void check_group_sums(struct mt_parallel *p)
{
    for (int k = 0; k < MT_GROUP_COUNT; k++) {
        int group, pos;
        mt_groups_find(&p->layout, (enum mt_group_kind)k, p->rank, &group, &pos);
        const struct mt_group_list *gl = &p->layout.groups[k];
        int64_t want = group < 0 ? p->rank : 0, sum = p->rank;
        for (int i = 0; group >= 0 && i < gl->size; i++) want += gl->ranks[group * gl->size + i];
        CALL(mt_all_reduce(p->comm[k], &sum, 1, MT_DT_I64, MT_OP_SUM, &g_err));
        CHECK(sum == want, "%s: sum of ranks %lld, expected %lld", p->comm[k]->name,
              (long long)sum, (long long)want);
    }
}

/* The groups of TP x PP (x DP) with EP x PP (x EDP) on the world, ETP 1. */
static struct mt_parallel *make_parallel(struct mt_world *w, int tp, int pp, int ep,
                                         const int *map)
{
    struct mt_config *cfg = calloc(1, sizeof *cfg);
    snprintf(cfg->parallel.order, sizeof cfg->parallel.order, "tp-cp-ep-dp-pp");
    int n = w->size;
    struct mt_layout l = { .world_size = n, .tp = tp, .cp = 1, .pp = pp, .vpp = 1, .ep = ep,
                           .etp = 1, .dp = n / (tp * pp), .edp = n / (ep * pp),
                           .num_micro_batches = 1 };
    struct mt_parallel *p = NULL;
    CALL(mt_parallel_init(w, cfg, &l, map, &p, &g_err));
    if (p) check_group_sums(p);
    /* The same layout for another world size is refused. */
    l.world_size = n + 1;
    struct mt_parallel *q = NULL;
    CHECK(mt_parallel_init(w, cfg, &l, NULL, &q, &g_err) == MT_EINVAL,
          "a layout for %d processes was accepted on %d", n + 1, n);
    free(cfg);
    return p;
}

static void check_parallel(struct mt_world *w)
{
    int n = w->size, r = w->rank;
    struct mt_parallel *p;
    if (n != 4) {
        /* DP = EP = world: one group each of dp, ep; tp, pp alone. */
        if ((p = make_parallel(w, 1, 1, n, NULL))) {
            CHECK(p->dp_rank == r && p->ep_rank == r && p->tp_rank == 0 && p->pp_rank == 0,
                  "coordinates dp %d ep %d tp %d pp %d", p->dp_rank, p->ep_rank, p->tp_rank,
                  p->pp_rank);
            mt_parallel_destroy(p);
        }
        return;
    }
    /* TP 2 x PP 2, EP 2: tp and ep vary fastest. */
    if ((p = make_parallel(w, 2, 2, 2, NULL))) {
        CHECK(p->tp_rank == r % 2 && p->pp_rank == r / 2 && p->dp_rank == 0 &&
                  p->ep_rank == r % 2 && p->edp_rank == 0 && p->etp_rank == 0,
              "coordinates tp %d pp %d dp %d ep %d", p->tp_rank, p->pp_rank, p->dp_rank,
              p->ep_rank);
        char want[32];
        snprintf(want, sizeof want, "tp[%d]", r / 2);
        CHECK(!strcmp(p->comm[MT_GROUP_TP]->name, want), "TP comm named %s, expected %s",
              p->comm[MT_GROUP_TP]->name, want);
        mt_parallel_destroy(p);
    }
    /* PP 4 with processes playing logical ranks in reverse: the middle
     * stages (logical 1, 2) are in no embedding group. */
    static const int reverse[4] = { 3, 2, 1, 0 };
    if ((p = make_parallel(w, 1, 4, 1, reverse))) {
        int logical = 3 - r, middle = logical == 1 || logical == 2;
        struct mt_comm *e = p->comm[MT_GROUP_EMBD];
        CHECK(p->rank == logical && p->pp_rank == logical, "logical rank %d, pp rank %d",
              p->rank, p->pp_rank);
        CHECK(e->size == (middle ? 1 : 2) &&
                  !strcmp(e->name, middle ? "embedding[none]" : "embedding[0]"),
              "embedding comm %s of size %d", e->name, e->size);
        mt_parallel_destroy(p);
    }
}

static void check_agree(struct mt_world *w)
{
    int n = w->size, r = w->rank, nfailed = -1;
    bool report = false;
    struct mt_err e = { 0 };
    /* Everyone fails alike: reported once, by rank 0. */
    mt_err_set(&e, MT_EINVAL, "the same error everywhere");
    CALL(mt_world_agree(w, &e, w->timeout_s, &nfailed, &report, &g_err));
    CHECK(nfailed == n && report == (r == 0), "agree (all alike): %d failed, report %d", nfailed,
          report);
    /* Only the last rank fails: it reports. */
    CALL(mt_world_agree(w, r == n - 1 ? &e : NULL, w->timeout_s, &nfailed, &report, &g_err));
    CHECK(nfailed == 1 && report == (r == n - 1), "agree (last): %d failed, report %d", nfailed,
          report);
    /* Different messages are each reported. */
    mt_err_set(&e, MT_EIO, "cannot read something on rank %d", r);
    CALL(mt_world_agree(w, r % 2 ? &e : NULL, w->timeout_s, &nfailed, &report, &g_err));
    CHECK(nfailed == n / 2 && report == (r % 2 == 1), "agree (odd): %d failed, report %d",
          nfailed, report);
    CALL(mt_world_agree(w, NULL, w->timeout_s, &nfailed, &report, &g_err));
    CHECK(nfailed == 0 && !report, "agree (none): %d failed, report %d", nfailed, report);
}

static _Noreturn void die(struct mt_world *w)
{
    fprintf(stderr, "comm_check: rank %d: %s\n", g_rank, g_err.msg);
    mt_world_abort(w);
}

/* How the survivors wait for the victim: a blocking all_reduce, a started reduce_scatter
 * (then waited for), a started p2p batch with its partner (then waited for). */
enum fault_wait { WAIT_BLOCKING, WAIT_STARTED, WAIT_P2P_STARTED };

static int fault(struct mt_world *w, int victim, int kill_it, enum fault_wait how)
{
    struct mt_comm *pair;
    char name[32];
    snprintf(name, sizeof name, "tp[%d]", w->rank / 2);
    if (mt_world_split(w, w->rank / 2, w->rank, name, &pair, &g_err)) die(w);
    if (w->rank == 0) printf("comm_check: fault test: rank %d will %s\n", victim,
                             kill_it ? "die" : "hang");
    fflush(stdout);
    if (w->rank == victim) {
        if (kill_it) raise(SIGKILL);
        for (;;) pause();
    }
    double x[2] = { 1, 1 }, y = 0;
    if (how == WAIT_STARTED) { /* started, then waited for: the wait times out */
        struct mt_comm_req q = { 0 };
        if (mt_reduce_scatter_start(pair, x, &y, 1, MT_DT_F64, MT_OP_SUM, &q, &g_err) ||
            mt_comm_wait(&q, &g_err))
            die(w);
    } else if (how == WAIT_P2P_STARTED) { /* the same with the partner's message */
        struct mt_comm_req q = { 0 };
        const int partner = 1 - pair->rank;
        struct mt_p2p ops[2] = { {true, x, 1, partner, 7}, {false, &y, 1, partner, 7} };
        if (mt_p2p_batch_start(pair, ops, 2, MT_DT_F64, &q, &g_err) || mt_comm_wait(&q, &g_err))
            die(w);
    } else if (mt_all_reduce(pair, x, 1, MT_DT_F64, MT_OP_SUM, &g_err)) {
        die(w);
    }
    if (mt_barrier(w->comm, &g_err)) die(w);
    printf("comm_check: rank %d: the collectives completed although rank %d stopped\n", g_rank,
           victim);
    return 1;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "collectives";
    double timeout = argc > 3 ? atof(argv[3]) : 60;
    struct mt_world *w;
    if (mt_world_init(&w, timeout, &g_err)) {
        fprintf(stderr, "comm_check: %s\n", g_err.msg);
        return 1;
    }
    g_rank = w->rank;
    if (!strcmp(mode, "hang") || !strcmp(mode, "kill") || !strcmp(mode, "hang-nb") ||
        !strcmp(mode, "hang-p2p"))
        return fault(w, argc > 2 ? atoi(argv[2]) : 1, !strcmp(mode, "kill"),
                     !strcmp(mode, "hang-nb")    ? WAIT_STARTED
                     : !strcmp(mode, "hang-p2p") ? WAIT_P2P_STARTED
                                                 : WAIT_BLOCKING);
    if (strcmp(mode, "collectives")) {
        fprintf(stderr, "comm_check: unknown mode '%s'\n", mode);
        return 2;
    }
    printf("comm_check: info: rank %d of %d, local %d of %d, node %d of %d, host %s, "
           "launcher %s\n",
           w->rank, w->size, w->local_rank, w->local_size, w->node_id, w->num_nodes,
           w->hostname, w->launcher);
    fflush(stdout);
    check_comm(w->comm);
    check_huge_counts(w->comm);
    check_exchange(w);
    check_splits(w);
    check_parallel(w);
    check_agree(w);

    /* The verdict, agreed: every process exits alike. */
    struct mt_err e = { 0 };
    if (g_fails) mt_err_set(&e, MT_ERUNTIME, "%d of %d checks failed", g_fails, g_checks);
    int nfailed = 0;
    bool report = false;
    if (mt_world_agree(w, &e, w->timeout_s, &nfailed, &report, &g_err)) die(w);
    if (nfailed == 0 && w->rank == 0)
        printf("comm_check: passed: %d checks on each of %d processes (%d nodes, %s)\n", g_checks,
               w->size, w->num_nodes, w->launcher);
    if (report) fprintf(stderr, "comm_check: rank %d: %s\n", w->rank, e.msg);
    mt_world_finalize(w);
    return nfailed ? 1 : 0;
}

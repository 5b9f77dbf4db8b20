/* p2p_check: mt_p2p_batch (Megatron's batch_isend_irecv, which the interleaved
 * pipeline schedule exchanges with), under a launcher (tests/parallel/p2p.sh). Every
 * process sends a message far above any eager limit to the next one around the ring
 * and another to the previous one, and receives theirs, all in one batch: blocking
 * sends in that order would deadlock, the batch must not. Then a batch whose receive
 * count does not match the message fails with a clear error on the receiver. The same
 * exchanges started (mt_p2p_batch_start) one direction at a time, both in flight while
 * the process writes its next messages, and waited for in the other order
 * (overlap_p2p_comm); a size mismatch is then reported at the wait. Exits 0 when every
 * check passed (rank 0 prints "passed"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"

static struct mt_err g_err;

#define CALL(x)                                                                               \
    do {                                                                                      \
        if ((x) != MT_OK) {                                                                   \
            fprintf(stderr, "p2p_check: %s:%d: %s\n", __FILE__, __LINE__, g_err.msg);         \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

#define N (1u << 20) /* 4 MiB of floats per message */

int main(void)
{
    struct mt_world *w;
    CALL(mt_world_init(&w, 60.0, &g_err));
    struct mt_comm *c = w->comm;
    const int r = c->rank, P = c->size, next = (r + 1) % P, prev = (r + P - 1) % P;
    float *to_next = malloc(sizeof(float) * N), *to_prev = malloc(sizeof(float) * N);
    float *from_prev = malloc(sizeof(float) * N), *from_next = malloc(sizeof(float) * N);
    if (!to_next || !to_prev || !from_prev || !from_next) return 1;
    for (size_t i = 0; i < N; i++) {
        to_next[i] = (float)(r * 1000 + (int)(i % 997));
        to_prev[i] = (float)(-r * 1000 - (int)(i % 991));
    }
    for (int round = 0; round < 3; round++) {
        struct mt_p2p ops[4] = {
            {true, to_next, N, next, 1},
            {false, from_prev, N, prev, 1},
            {true, to_prev, N, prev, 2},
            {false, from_next, N, next, 2},
        };
        CALL(mt_p2p_batch(c, ops, 4, MT_DT_F32, &g_err));
        for (size_t i = 0; i < N; i++)
            if (from_prev[i] != (float)(prev * 1000 + (int)(i % 997)) ||
                from_next[i] != (float)(-next * 1000 - (int)(i % 991))) {
                fprintf(stderr, "p2p_check: rank %d round %d: wrong element %zu\n", r, round, i);
                return 1;
            }
    }
    /* started: forward half, backward half, both in flight while the next round's
     * messages are computed into other buffers, then waited for in reverse order */
    float *next_to_next = malloc(sizeof(float) * N), *next_to_prev = malloc(sizeof(float) * N);
    if (!next_to_next || !next_to_prev) return 1;
    for (int round = 0; round < 3; round++) {
        struct mt_p2p fwd[2] = { {true, to_next, N, next, 1}, {false, from_prev, N, prev, 1} };
        struct mt_p2p bwd[2] = { {true, to_prev, N, prev, 2}, {false, from_next, N, next, 2} };
        struct mt_comm_req qf = { 0 }, qb = { 0 };
        CALL(mt_p2p_batch_start(c, fwd, 2, MT_DT_F32, &qf, &g_err));
        CALL(mt_p2p_batch_start(c, bwd, 2, MT_DT_F32, &qb, &g_err));
        for (size_t i = 0; i < N; i++) {
            next_to_next[i] = (float)((r + round + 1) * 1000 + (int)(i % 997));
            next_to_prev[i] = (float)(-(r + round + 1) * 1000 - (int)(i % 991));
        }
        CALL(mt_comm_wait(&qb, &g_err));
        CALL(mt_comm_wait(&qf, &g_err));
        if (mt_comm_pending(&qf) || mt_comm_pending(&qb)) {
            fprintf(stderr, "p2p_check: rank %d: a request still pending after its wait\n", r);
            return 1;
        }
        for (size_t i = 0; i < N; i++)
            if (from_prev[i] != (float)((prev + round) * 1000 + (int)(i % 997)) ||
                from_next[i] != (float)(-(next + round) * 1000 - (int)(i % 991))) {
                fprintf(stderr, "p2p_check: rank %d started round %d: wrong element %zu\n", r,
                        round, i);
                return 1;
            }
        memcpy(to_next, next_to_next, sizeof(float) * N);
        memcpy(to_prev, next_to_prev, sizeof(float) * N);
    }
    free(next_to_next);
    free(next_to_prev);
    /* a receive of the wrong size: the receiver reports it (the sender's send completes) */
    if (P >= 2 && r < 2) {
        float x[4] = {1, 2, 3, 4};
        struct mt_p2p op = r == 0 ? (struct mt_p2p){true, x, 4, 1, 3}
                                  : (struct mt_p2p){false, x, 8, 0, 3};
        int rc = mt_p2p_batch(c, &op, 1, MT_DT_F32, &g_err);
        if (r == 1 && (rc == MT_OK || !strstr(g_err.msg, "expected 8 elements from rank 0"))) {
            fprintf(stderr, "p2p_check: a short message was not reported (%s)\n", g_err.msg);
            return 1;
        }
        if (r == 0) CALL(rc);
        /* the same started: reported at the wait */
        struct mt_comm_req q = { 0 };
        op.tag = 4;
        rc = mt_p2p_batch_start(c, &op, 1, MT_DT_F32, &q, &g_err);
        if (rc == MT_OK) rc = mt_comm_wait(&q, &g_err);
        if (r == 1 && (rc == MT_OK || !strstr(g_err.msg, "expected 8 elements from rank 0"))) {
            fprintf(stderr, "p2p_check: a short message was not reported at the wait (%s)\n",
                    g_err.msg);
            return 1;
        }
        if (r == 0) CALL(rc);
    }
    CALL(mt_barrier(c, &g_err));
    if (r == 0) printf("p2p_check: %d processes: passed\n", P);
    free(to_next);
    free(to_prev);
    free(from_prev);
    free(from_next);
    mt_world_finalize(w);
    return 0;
}

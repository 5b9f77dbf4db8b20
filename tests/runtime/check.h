/* Shared by the multi-process check programs (comm_check, nccl_check): checks
 * that count failures instead of stopping (every process must reach the final
 * agreement), and the all_to_all_v pattern both test. */
#ifndef MT_TESTS_RUNTIME_CHECK_H
#define MT_TESTS_RUNTIME_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "runtime/comm.h"

static int g_rank, g_checks, g_fails;
static struct mt_err g_err;

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        g_checks++;                                                                       \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s: rank %d: FAIL line %d: ", __FILE__, g_rank, __LINE__);   \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fputc('\n', stderr);                                                          \
            g_fails++;                                                                    \
        }                                                                                 \
    } while (0)

/* A runtime call that must succeed. */
#define CALL(expr) CHECK((expr) == MT_OK, "%s: %s", #expr, g_err.msg)

/* Counts and displacements of an exchange on n ranks seen from rank r: r
 * sends (r + p) % 3 elements to p (none for some pairs), value
 * r * 1000 + p * 10 + k; blocks are gap elements apart. Returns one
 * allocation holding send_counts, send_displs, recv_counts, recv_displs (n
 * each); *stot and *rtot are the buffer lengths needed. */
static inline size_t *a2a_pattern(int n, int r, size_t gap, size_t *stot, size_t *rtot)
{
    size_t *v = calloc(4 * (size_t)n, sizeof *v);
    if (!v) abort();
    size_t *sc = v, *sd = v + n, *rc = v + 2 * n, *rd = v + 3 * n;
    *stot = *rtot = 0;
    for (int p = 0; p < n; p++) {
        sc[p] = (size_t)(r + p) % 3;
        sd[p] = *stot;
        *stot += sc[p] + gap;
        rc[p] = (size_t)(p + r) % 3;
        rd[p] = *rtot;
        *rtot += rc[p] + gap;
    }
    return v;
}

static inline long long a2a_value(int from, int to, size_t k)
{
    return from * 1000LL + to * 10LL + (long long)k;
}

#endif

/* amax_check: the MAX all-reduce of FP8 amaxes over ranks (mt_lowp_amax_all_reduce),
 * under a launcher (tests/parallel/amax_nan.sh), on the CPU backend. Rank r holds a NaN
 * amax at element r % 2 and finite amaxes elsewhere: every rank must get a non-finite
 * amax at elements 0 and 1 (a plain MAX drops a NaN in one of the two orders of its
 * operands, so one of them would come back finite), and the largest finite amax at
 * the others. Exits 0 when every check passed (rank 0 prints "passed"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "model/model_internal.h"
#include "runtime/comm.h"

static struct mt_err g_err;

int main(void)
{
    struct mt_world *w;
    if (mt_world_init(&w, 60.0, &g_err) != MT_OK) {
        fprintf(stderr, "amax_check: %s\n", g_err.msg);
        return 1;
    }
    struct mt_comm *c = w->comm;
    const struct mt_kernels *k = mt_kernels_cpu();
    enum { N = 4 };
    float amax[N];
    for (int i = 0; i < N; i++) amax[i] = (float)(c->rank + 1) * (float)(i + 1);
    amax[c->rank % 2] = NAN;
    if (mt_lowp_amax_all_reduce(k, k->ctx, c, amax, N, &g_err) != MT_OK) {
        fprintf(stderr, "amax_check: %s\n", g_err.msg);
        return 1;
    }
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const bool nan_somewhere = i < 2 && (i < c->size);
        const float want = (float)c->size * (float)(i + 1);
        if (nan_somewhere ? isfinite(amax[i]) : amax[i] != want) {
            fprintf(stderr, "amax_check: rank %d: amax[%d] = %g after the reduction, want %s\n", c->rank, i,
                    (double)amax[i], nan_somewhere ? "a non-finite amax (a rank's NaN)" : "the largest");
            bad = 1;
        }
    }
    int all_bad = bad;
    if (mt_all_reduce(c, &all_bad, 1, MT_DT_I32, MT_OP_MAX, &g_err) != MT_OK) {
        fprintf(stderr, "amax_check: %s\n", g_err.msg);
        return 1;
    }
    if (c->rank == 0 && !all_bad) printf("passed on %d processes\n", c->size);
    mt_world_finalize(w);
    return all_bad;
}

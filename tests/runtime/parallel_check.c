/* mt_parallel_use_device with NCCL, one GPU per process, under a launcher:
 *   parallel_check TP PP EP ETP
 * builds the groups of that layout over the job's processes and checks, on every rank,
 * that the NCCL communicators are those mt_parallel_device_plan promises (how many; which
 * kinds share one; none for the kinds that carry no device traffic, nor for a rank in no
 * group of a kind), that each kind's device transport gives what its host transport
 * gives (a sum and a gather of the logical ranks, in device memory: the ranks of the
 * split communicators in the layout's order), that host-memory calls still work on
 * every kind, and that a device-memory call on a kind without a device transport fails
 * with a message naming the group. Rank 0 prints the startup log line and the verdict.
 * Exit 77 when there is no GPU (or fewer GPUs than local processes). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/parallel.h"
#include "tests/runtime/check.h"

#define CUDA(expr) CHECK((expr) == cudaSuccess, "%s failed", #expr)

static bool is_device(void *arg, const void *p)
{
    (void)arg;
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice;
}

/* The group's sum of (logical rank + 1) and its gather of logical ranks through c's
 * device transport, against the same through its host transport (host memory). */
static void check_kind(struct mt_comm *c, struct mt_comm *host, int rank, bool device)
{
    const int n = c->size;
    int32_t h[2] = { rank + 1, rank + 1 };
    int32_t *hg = calloc((size_t)n, sizeof *hg), *dg_h = calloc((size_t)n, sizeof *dg_h);
    int32_t mine = rank;
    CALL(mt_all_reduce(host, h, 2, MT_DT_I32, MT_OP_SUM, &g_err));
    CALL(mt_all_gather(host, &mine, hg, 1, MT_DT_I32, &g_err));
    int32_t *d = NULL, *dg = NULL;
    CUDA(cudaMalloc((void **)&d, sizeof(int32_t) * 2));
    CUDA(cudaMalloc((void **)&dg, sizeof(int32_t) * (size_t)n));
    int32_t v[2] = { rank + 1, rank + 1 };
    CUDA(cudaMemcpy(d, v, sizeof v, cudaMemcpyHostToDevice));
    CUDA(cudaMemcpy(dg, &mine, sizeof mine, cudaMemcpyHostToDevice));
    int rc = mt_all_reduce(c, d, 2, MT_DT_I32, MT_OP_SUM, &g_err);
    if (device) {
        CHECK(rc == MT_OK, "all_reduce on %s (device memory): %s", c->name, g_err.msg);
        CUDA(cudaMemcpy(v, d, sizeof v, cudaMemcpyDeviceToHost));
        CHECK(v[0] == h[0], "%s: device sum %d, host sum %d", c->name, v[0], h[0]);
        /* the gather of the logical ranks, through the device */
        CUDA(cudaMemcpy(d, &mine, sizeof mine, cudaMemcpyHostToDevice));
        CALL(mt_all_gather(c, d, dg, 1, MT_DT_I32, &g_err));
        CUDA(cudaMemcpy(dg_h, dg, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int i = 0; i < n; i++) bad += dg_h[i] != hg[i];
        CHECK(!bad, "%s: the device gather of the logical ranks differs from the host's in "
                    "%d places (rank order of the split communicator)",
              c->name, bad);
    } else {
        CHECK(rc == MT_EUNSUPPORTED && strstr(g_err.msg, c->name) &&
                  strstr(g_err.msg, "has no device transport"),
              "a device-memory all_reduce on %s (no device transport) returned %d: %s", c->name,
              rc, g_err.msg);
    }
    /* host memory through the dual comm: the host transport, whatever the kind */
    int32_t x[2] = { rank + 1, rank + 1 };
    CALL(mt_all_reduce(c, x, 2, MT_DT_I32, MT_OP_SUM, &g_err));
    CHECK(x[0] == h[0], "%s: host sum through the dual comm %d, expected %d", c->name, x[0],
          h[0]);
    cudaFree(d);
    cudaFree(dg);
    free(hg);
    free(dg_h);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: parallel_check TP PP EP ETP\n");
        return 2;
    }
    const int tp = atoi(argv[1]), pp = atoi(argv[2]), ep = atoi(argv[3]), etp = atoi(argv[4]);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("parallel_check: no CUDA device\n");
        return 77;
    }
    struct mt_world *w;
    if (mt_world_init(&w, 120, &g_err)) {
        fprintf(stderr, "parallel_check: %s\n", g_err.msg);
        return 1;
    }
    g_rank = w->rank;
    if (w->local_size > ndev) {
        printf("parallel_check: %d local processes but %d GPUs\n", w->local_size, ndev);
        mt_world_finalize(w);
        return 77;
    }
    CUDA(cudaSetDevice(w->local_rank));
    static struct mt_config cfg;
    struct mt_config_parallel *cp = &cfg.parallel;
    cp->tensor_model_parallel_size = tp;
    cp->pipeline_model_parallel_size = pp;
    cp->virtual_pipeline_model_parallel_size = 1;
    cp->context_parallel_size = 1;
    cp->expert_model_parallel_size = ep;
    cp->expert_tensor_parallel_size = etp;
    snprintf(cp->order, sizeof cp->order, "tp-cp-ep-dp-pp");
    const int world = w->size;
    struct mt_layout l = { .world_size = world, .tp = tp, .cp = 1, .pp = pp, .vpp = 1,
                           .ep = ep, .etp = etp, .dp = world / (tp * pp),
                           .edp = world / (etp * ep * pp) };
    struct mt_parallel *par = NULL;
    CALL(mt_parallel_init(w, &cfg, &l, NULL, &par, &g_err));
    static const struct mt_device_memory dm = { NULL, is_device, NULL, NULL };
    if (par) CALL(mt_parallel_use_device(par, &dm, true, NULL, &g_err));
    if (par && par->world_device) {
        struct mt_device_plan plan;
        mt_parallel_device_plan(&par->layout, NULL, par->rank, &plan);
        CHECK(par->nnccl == plan.ncomms, "%d NCCL communicators, the plan says %d", par->nnccl,
              plan.ncomms);
        for (int k = 0; k < MT_GROUP_COUNT; k++) {
            struct mt_comm *d = par->device_of[k];
            switch (plan.how[k]) {
            case MT_DEVICE_NONE:
            case MT_DEVICE_ABSENT:
                CHECK(d == NULL, "%s has a device transport", mt_group_names[k]);
                break;
            case MT_DEVICE_SHARED:
                CHECK(d == (plan.same_as[k] < 0 ? par->world_device
                                                : par->device_of[plan.same_as[k]]),
                      "%s does not share the communicator of %s", mt_group_names[k],
                      plan.same_as[k] < 0 ? "world" : mt_group_names[plan.same_as[k]]);
                break;
            case MT_DEVICE_OWN: {
                bool unique = d != NULL && d != par->world_device;
                for (int j = 0; j < MT_GROUP_COUNT; j++)
                    if (j != k && plan.how[j] == MT_DEVICE_OWN) unique &= par->device_of[j] != d;
                CHECK(unique, "%s: no communicator of its own", mt_group_names[k]);
                break;
            }
            }
            check_kind(par->comm[k], par->host[k], par->rank, d != NULL);
        }
        check_kind(par->world_comm, w->comm, par->rank, true);
        if (w->rank == 0) {
            char line[1024];
            mt_parallel_device_summary(&par->layout, NULL, par->rank, line, sizeof line);
            printf("parallel_check: %s\n", line);
        }
    }
    mt_parallel_destroy(par);

    struct mt_err e = { 0 };
    if (g_fails) mt_err_set(&e, MT_ERUNTIME, "%d checks failed", g_fails);
    int nfailed = 0;
    bool report = false;
    if (mt_world_agree(w, &e, 120, &nfailed, &report, &g_err)) {
        fprintf(stderr, "parallel_check: %s\n", g_err.msg);
        mt_world_abort(w);
    }
    if (!nfailed && w->rank == 0)
        printf("parallel_check: passed on %d processes (TP %d, PP %d, EP %d, ETP %d)\n", world,
               tp, pp, ep, etp);
    mt_world_finalize(w);
    return nfailed ? 1 : 0;
}

/* The runtime without a launcher: a world of one, self comms, the launcher
 * checks that refuse several tasks without PMIx. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/comm.h"
#include "runtime/parallel.h"

/* Variables a launcher sets; cleared so that the tests see no launcher even
 * when `make check` itself runs inside a Slurm job or under mpirun. */
static const char *const launcher_vars[] = {
    "PMIX_NAMESPACE", "PMIX_RANK",    "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_STEP_ID",
    "SLURM_PROCID",   "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "PMI_RANK",
};

static int clear_launcher(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof launcher_vars / sizeof launcher_vars[0]; i++)
        unsetenv(launcher_vars[i]);
    return 0;
}

static void test_dt_size(void **state)
{
    (void)state;
    assert_int_equal(mt_dt_size(MT_DT_F32), 4);
    assert_int_equal(mt_dt_size(MT_DT_F64), 8);
    assert_int_equal(mt_dt_size(MT_DT_I32), 4);
    assert_int_equal(mt_dt_size(MT_DT_I64), 8);
    assert_int_equal(mt_dt_size(MT_DT_U8), 1);
    assert_int_equal(mt_dt_size((enum mt_dt)99), 0);
}

static void test_world_of_one(void **state)
{
    (void)state;
    struct mt_world *w;
    struct mt_err err = { 0 };
    assert_int_equal(mt_world_init(&w, 30, &err), MT_OK);
    assert_int_equal(w->rank, 0);
    assert_int_equal(w->size, 1);
    assert_int_equal(w->local_rank, 0);
    assert_int_equal(w->local_size, 1);
    assert_int_equal(w->node_id, 0);
    assert_int_equal(w->num_nodes, 1);
    assert_string_equal(w->launcher, "none");
    assert_true(w->hostname[0] != '\0');
    assert_int_equal(w->comm->size, 1);
    assert_string_equal(w->comm->name, "world");
    assert_true(w->comm->timeout_s == 30);
    mt_world_set_timeout(w, 90);
    assert_true(w->timeout_s == 90 && w->comm->timeout_s == 90);

    char all[8] = { 0 };
    assert_int_equal(mt_world_exchange(w, "k", "abcdefg", 8, all, &err), MT_OK);
    assert_string_equal(all, "abcdefg");

    struct mt_comm *c;
    assert_int_equal(mt_world_split(w, 3, 0, "tp[3]", &c, &err), MT_OK);
    assert_int_equal(c->size, 1);
    assert_string_equal(c->name, "tp[3]");
    assert_true(c->timeout_s == 90);
    mt_comm_destroy(c);
    assert_int_equal(mt_world_split(w, -1, 0, "x", &c, &err), MT_EINVAL);

    int nfailed;
    bool report;
    struct mt_err e = { 0 };
    assert_int_equal(mt_world_agree(w, NULL, 1, &nfailed, &report, &err), MT_OK);
    assert_int_equal(nfailed, 0);
    assert_false(report);
    mt_err_set(&e, MT_EIO, "x");
    assert_int_equal(mt_world_agree(w, &e, 1, &nfailed, &report, &err), MT_OK);
    assert_int_equal(nfailed, 1);
    assert_true(report);
    mt_world_finalize(w);
}

static void test_self_collectives(void **state)
{
    (void)state;
    struct mt_comm *c;
    struct mt_err err = { 0 };
    assert_int_equal(mt_comm_self_create("self", 0, &c, &err), MT_OK);
    double d[3] = { 1, 2, 3 };
    assert_int_equal(mt_all_reduce(c, d, 3, MT_DT_F64, MT_OP_SUM, &err), MT_OK);
    assert_true(d[0] == 1 && d[1] == 2 && d[2] == 3);
    assert_int_equal(mt_all_reduce(c, NULL, 0, MT_DT_F64, MT_OP_MAX, &err), MT_OK);

    int32_t in[4] = { 5, 6, 7, 8 }, out[4] = { 0 };
    assert_int_equal(mt_reduce_scatter(c, in, out, 4, MT_DT_I32, MT_OP_SUM, &err), MT_OK);
    assert_memory_equal(in, out, sizeof in);
    memset(out, 0, sizeof out);
    assert_int_equal(mt_all_gather(c, in, out, 4, MT_DT_I32, &err), MT_OK);
    assert_memory_equal(in, out, sizeof in);
    assert_int_equal(mt_all_gather(c, out, out, 4, MT_DT_I32, &err), MT_OK);
    assert_memory_equal(in, out, sizeof in);

    size_t sc = 2, sd = 1, rc = 2, rd = 2;
    int32_t res[4] = { 0, 0, 0, 0 };
    assert_int_equal(mt_all_to_all_v(c, in, &sc, &sd, res, &rc, &rd, MT_DT_I32, &err), MT_OK);
    assert_true(res[0] == 0 && res[1] == 0 && res[2] == 6 && res[3] == 7);
    rc = 1;
    assert_int_equal(mt_all_to_all_v(c, in, &sc, &sd, res, &rc, &rd, MT_DT_I32, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "self"));

    assert_int_equal(mt_broadcast(c, d, 3, MT_DT_F64, 0, &err), MT_OK);
    assert_int_equal(mt_broadcast(c, d, 3, MT_DT_F64, 1, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "root 1"));
    assert_int_equal(mt_barrier(c, &err), MT_OK);
    mt_comm_destroy(c);
}

/* Nonblocking collectives on a group of one: done at the start, nothing pending; a
 * pending request is not started over. */
static void test_self_nonblocking(void **state)
{
    (void)state;
    struct mt_comm *c;
    struct mt_err err = { 0 };
    assert_int_equal(mt_comm_self_create("self", 0, &c, &err), MT_OK);
    struct mt_comm_req q = { 0 };
    int32_t in[4] = { 5, 6, 7, 8 }, out[4] = { 0 };
    assert_int_equal(mt_reduce_scatter_start(c, in, out, 4, MT_DT_I32, MT_OP_SUM, &q, &err), MT_OK);
    assert_false(mt_comm_pending(&q));
    assert_memory_equal(in, out, sizeof in);
    memset(out, 0, sizeof out);
    assert_int_equal(mt_all_gather_start(c, in, out, 4, MT_DT_I32, &q, &err), MT_OK);
    assert_memory_equal(in, out, sizeof in);
    assert_int_equal(mt_all_reduce_start(c, in, 4, MT_DT_I32, MT_OP_SUM, &q, &err), MT_OK);
    assert_int_equal(mt_comm_wait(&q, &err), MT_OK);
    size_t sc = 2, sd = 1, rc = 2, rd = 2;
    int32_t res[4] = { 0, 0, 0, 0 };
    assert_int_equal(mt_all_to_all_v_start(c, in, &sc, &sd, res, &rc, &rd, MT_DT_I32, &q, &err),
                     MT_OK);
    assert_false(mt_comm_pending(&q));
    assert_true(res[0] == 0 && res[1] == 0 && res[2] == 6 && res[3] == 7);
    rc = 1;
    assert_int_equal(mt_all_to_all_v_start(c, in, &sc, &sd, res, &rc, &rd, MT_DT_I32, &q, &err),
                     MT_EINVAL);
    assert_false(mt_comm_pending(&q));
    assert_int_equal(mt_all_reduce_start(c, in, 4, MT_DT_BF16, MT_OP_SUM, &q, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "bf16"));
    assert_int_equal(mt_reduce_scatter_start(c, in, out, 4, MT_DT_I32, MT_OP_SUM, NULL, &err),
                     MT_EINVAL);
    /* a request that still holds a collective is refused */
    q.comm = c;
    q.op = "all_gather";
    assert_int_equal(mt_all_reduce_start(c, in, 4, MT_DT_I32, MT_OP_SUM, &q, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "not waited for"));
    mt_comm_destroy(c);
}

/* The dual comm: a start on host memory goes to the host comm; on device memory to the
 * device comm, or, when the transport needs enter/leave around a call (the guard
 * backend's memory, mapped only during a call), completed at the start between them. */
static int fake_device[8], entered, left;
static bool is_fake_device(void *arg, const void *p)
{
    (void)arg;
    return (const int *)p >= fake_device && (const int *)p < fake_device + 8;
}
static void enter(void *arg) { (void)arg; entered++; }
static void leave(void *arg) { (void)arg; left++; }

static void test_dual_nonblocking(void **state)
{
    (void)state;
    struct mt_err err = { 0 };
    struct mt_comm *host, *dev, *d;
    assert_int_equal(mt_comm_self_create("host", 0, &host, &err), MT_OK);
    assert_int_equal(mt_comm_self_create("dev", 0, &dev, &err), MT_OK);
    const struct mt_device_memory guarded = { NULL, is_fake_device, enter, leave };
    assert_int_equal(mt_comm_dual_create(host, dev, true, &guarded, &d, &err), MT_OK);
    struct mt_comm_req q = { 0 };
    int32_t h[4] = { 1, 2, 3, 4 };
    for (int i = 0; i < 4; i++) fake_device[i] = 10 + i;
    assert_int_equal(mt_all_gather_start(d, fake_device, fake_device + 4, 4, MT_DT_I32, &q, &err),
                     MT_OK);
    assert_false(mt_comm_pending(&q));
    assert_true(entered == 1 && left == 1);
    assert_int_equal(fake_device[4], 10);
    size_t n4 = 4, at0 = 0, at4 = 4;
    fake_device[4] = 0;
    assert_int_equal(mt_all_to_all_v_start(d, fake_device, &n4, &at0, fake_device, &n4, &at4,
                                           MT_DT_I32, &q, &err),
                     MT_OK);
    assert_false(mt_comm_pending(&q));
    assert_true(entered == 2 && left == 2);
    assert_int_equal(fake_device[4], 10);
    assert_int_equal(mt_all_reduce_start(d, h, 4, MT_DT_I32, MT_OP_SUM, &q, &err), MT_OK);
    assert_true(entered == 2 && left == 2); /* host memory: the host comm's */
    assert_int_equal(mt_all_reduce_start(d, h, 4, MT_DT_I32, MT_OP_SUM, &q, &err), MT_OK);
    assert_int_equal(mt_reduce_scatter_start(d, h, fake_device, 4, MT_DT_I32, MT_OP_SUM, &q, &err),
                     MT_EINVAL); /* both sides */
    assert_non_null(strstr(err.msg, "host and device"));
    mt_comm_destroy(d);
    mt_comm_destroy(host);
}

/* A send to oneself waits for its recv; tags pick the message. */
static void test_self_send_recv(void **state)
{
    (void)state;
    struct mt_comm *c;
    struct mt_err err = { 0 };
    assert_int_equal(mt_comm_self_create("pp[0]", 0, &c, &err), MT_OK);
    float a[2] = { 1, 2 }, b[3] = { 3, 4, 5 }, got[3];
    assert_int_equal(mt_send(c, a, 2, MT_DT_F32, 0, 1, &err), MT_OK);
    assert_int_equal(mt_send(c, b, 3, MT_DT_F32, 0, 2, &err), MT_OK);
    assert_int_equal(mt_send(c, NULL, 0, MT_DT_F32, 0, 3, &err), MT_OK);
    assert_int_equal(mt_recv(c, got, 3, MT_DT_F32, 0, 2, &err), MT_OK);
    assert_memory_equal(got, b, sizeof b);
    assert_int_equal(mt_recv(c, got, 3, MT_DT_F32, 0, 1, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "tag 1"));
    assert_int_equal(mt_recv(c, got, 2, MT_DT_F32, 0, 1, &err), MT_OK);
    assert_memory_equal(got, a, sizeof a);
    assert_int_equal(mt_recv(c, NULL, 0, MT_DT_F32, 0, 3, &err), MT_OK);
    assert_int_equal(mt_recv(c, got, 2, MT_DT_F32, 0, 1, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "no message with tag 1"));
    assert_int_equal(mt_send(c, a, 2, MT_DT_F32, 1, 1, &err), MT_EINVAL);
    assert_int_equal(mt_send(c, a, 2, MT_DT_F32, 0, 9, &err), MT_OK); /* freed by destroy */
    mt_comm_destroy(c);
}

/* A started p2p batch on a group of one: done at the start (a send to oneself and its
 * receive), nothing pending; more transfers than a request holds, refused; on the dual
 * comm with guarded device memory, completed at the start between enter and leave. */
static void test_p2p_batch_start(void **state)
{
    (void)state;
    struct mt_comm *c, *host, *dev, *d;
    struct mt_err err = { 0 };
    assert_int_equal(mt_comm_self_create("pp[0]", 0, &c, &err), MT_OK);
    float a[3] = { 1, 2, 3 }, got[3] = { 0 };
    struct mt_p2p ops[MT_P2P_START_MAX + 1] = { {true, a, 3, 0, 1}, {false, got, 3, 0, 1} };
    struct mt_comm_req q = { 0 };
    assert_int_equal(mt_p2p_batch_start(c, ops, 2, MT_DT_F32, &q, &err), MT_OK);
    assert_false(mt_comm_pending(&q));
    assert_memory_equal(got, a, sizeof a);
    assert_int_equal(mt_comm_wait(&q, &err), MT_OK);
    for (int i = 2; i <= MT_P2P_START_MAX; i++) ops[i] = (struct mt_p2p){true, a, 3, 0, 2};
    assert_int_equal(mt_p2p_batch_start(c, ops, MT_P2P_START_MAX + 1, MT_DT_F32, &q, &err),
                     MT_EINVAL);
    assert_non_null(strstr(err.msg, "p2p batch on pp[0]"));
    assert_non_null(strstr(err.msg, "at most"));
    ops[0].peer = 1; /* a group of one has no rank 1 */
    assert_int_equal(mt_p2p_batch_start(c, ops, 2, MT_DT_F32, &q, &err), MT_EINVAL);
    mt_comm_destroy(c);

    assert_int_equal(mt_comm_self_create("host", 0, &host, &err), MT_OK);
    assert_int_equal(mt_comm_self_create("dev", 0, &dev, &err), MT_OK);
    const struct mt_device_memory guarded = { NULL, is_fake_device, enter, leave };
    assert_int_equal(mt_comm_dual_create(host, dev, true, &guarded, &d, &err), MT_OK);
    entered = left = 0;
    for (int i = 0; i < 4; i++) fake_device[i] = 20 + i;
    struct mt_p2p dops[2] = { {true, fake_device, 4, 0, 1}, {false, fake_device + 4, 4, 0, 1} };
    assert_int_equal(mt_p2p_batch_start(d, dops, 2, MT_DT_I32, &q, &err), MT_OK);
    assert_false(mt_comm_pending(&q));
    assert_true(entered == 1 && left == 1);
    assert_int_equal(fake_device[7], 23);
    mt_comm_destroy(d);
    mt_comm_destroy(host);
}

static void test_parallel_one_process(void **state)
{
    (void)state;
    struct mt_world *w;
    struct mt_err err = { 0 };
    assert_int_equal(mt_world_init(&w, 5, &err), MT_OK);
    struct mt_config *cfg = calloc(1, sizeof *cfg);
    snprintf(cfg->parallel.order, sizeof cfg->parallel.order, "tp-cp-ep-dp-pp");
    struct mt_layout l = { .world_size = 1, .tp = 1, .cp = 1, .pp = 1, .vpp = 1, .ep = 1,
                           .etp = 1, .dp = 1, .edp = 1, .num_micro_batches = 1 };
    struct mt_parallel *p;
    assert_int_equal(mt_parallel_init(w, cfg, &l, NULL, &p, &err), MT_OK);
    for (int k = 0; k < MT_GROUP_COUNT; k++) {
        char want[32];
        snprintf(want, sizeof want, "%s[0]", mt_group_names[k]);
        assert_string_equal(p->comm[k]->name, want);
        assert_int_equal(p->comm[k]->size, 1);
        assert_true(p->comm[k]->timeout_s == 5);
    }
    assert_int_equal(p->tp_rank + p->cp_rank + p->dp_rank + p->pp_rank + p->ep_rank +
                         p->etp_rank + p->edp_rank,
                     0);
    assert_int_equal(p->tp * p->cp * p->dp * p->pp, 1);
    mt_parallel_destroy(p);

    l.world_size = 4;
    l.tp = 4;
    assert_int_equal(mt_parallel_init(w, cfg, &l, NULL, &p, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "resolved for 4 processes but the job has 1"));
    l.world_size = 1;
    l.tp = 1;
    int bad_map[1] = { 1 };
    assert_int_equal(mt_parallel_init(w, cfg, &l, bad_map, &p, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "permutation"));
    free(cfg);
    mt_world_finalize(w);
}

/* Several tasks but no PMIx: refused, naming the launcher and the fix. */
static void refused(const char *var, const char *value, const char *expect)
{
    setenv(var, value, 1);
    struct mt_world *w = (struct mt_world *)1;
    struct mt_err err = { 0 };
    assert_int_equal(mt_world_init(&w, 1, &err), MT_EUNSUPPORTED);
    assert_null(w);
    assert_non_null(strstr(err.msg, expect));
    assert_non_null(strstr(err.msg, "srun --mpi=pmix"));
    assert_non_null(strstr(err.msg, "mpirun"));
    unsetenv(var);
}

static void test_launch_without_pmix(void **state)
{
    (void)state;
    refused("SLURM_STEP_NUM_TASKS", "4", "srun started 4 tasks without PMIx");
    refused("OMPI_COMM_WORLD_SIZE", "2", "mpirun started 2 processes");
    refused("PMI_SIZE", "3", "PMI-1/PMI-2");
    refused("SLURM_NTASKS", "8", "Slurm job of 8 tasks but moetrain was not started by srun");
    /* One task is a world of one. */
    setenv("SLURM_NTASKS", "1", 1);
    struct mt_world *w;
    struct mt_err err = { 0 };
    assert_int_equal(mt_world_init(&w, 1, &err), MT_OK);
    mt_world_finalize(w);
    unsetenv("SLURM_NTASKS");
}

static void test_launcher_rank(void **state)
{
    (void)state;
    assert_int_equal(mt_world_launcher_rank(), 0);
    setenv("SLURM_PROCID", "7", 1);
    assert_int_equal(mt_world_launcher_rank(), 7);
    setenv("PMIX_RANK", "3", 1);
    assert_int_equal(mt_world_launcher_rank(), 3);
    unsetenv("PMIX_RANK");
    unsetenv("SLURM_PROCID");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dt_size),
        cmocka_unit_test(test_world_of_one),
        cmocka_unit_test(test_self_collectives),
        cmocka_unit_test(test_self_nonblocking),
        cmocka_unit_test(test_dual_nonblocking),
        cmocka_unit_test(test_self_send_recv),
        cmocka_unit_test(test_p2p_batch_start),
        cmocka_unit_test(test_parallel_one_process),
        cmocka_unit_test(test_launch_without_pmix),
        cmocka_unit_test(test_launcher_rank),
    };
    return cmocka_run_group_tests(tests, clear_launcher, NULL);
}

/* Which NCCL communicators a rank gets (mt_parallel_device_plan): the table of kinds that
 * carry device traffic, identical groups sharing one communicator, ranks in no group of
 * a kind, placement, and the counts and the log line for a few layouts, the shipped
 * 256-GPU one among them (slurm/qwen3_256gpu.sh). No processes, no NCCL. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/parallel.h"

static void build(struct mt_rank_layout *rl, int world, int tp, int pp, int ep, int etp)
{
    struct mt_config_parallel p = { .tensor_model_parallel_size = tp,
                                    .pipeline_model_parallel_size = pp,
                                    .virtual_pipeline_model_parallel_size = 1,
                                    .context_parallel_size = 1,
                                    .expert_model_parallel_size = ep,
                                    .expert_tensor_parallel_size = etp };
    snprintf(p.order, sizeof p.order, "tp-cp-ep-dp-pp");
    struct mt_layout l = { .world_size = world, .tp = tp, .cp = 1, .pp = pp, .vpp = 1,
                           .ep = ep, .etp = etp, .dp = world / (tp * pp),
                           .edp = world / (etp * ep * pp) };
    struct mt_err err;
    assert_int_equal(mt_groups_build(&p, &l, rl, &err), 0);
}

/* how[k] of every kind, as letters: '-' none, 'a' absent, 'O' own, 'w' the world's, or
 * the index ('0' + j) of the kind shared with */
static void expect_plan(const struct mt_device_plan *p, const char *want, int ncomms)
{
    char got[MT_GROUP_COUNT + 1];
    for (int k = 0; k < MT_GROUP_COUNT; k++)
        got[k] = p->how[k] == MT_DEVICE_NONE     ? '-'
                 : p->how[k] == MT_DEVICE_ABSENT ? 'a'
                 : p->how[k] == MT_DEVICE_OWN    ? 'O'
                 : p->same_as[k] < 0             ? 'w'
                                                 : (char)('0' + p->same_as[k]);
    got[MT_GROUP_COUNT] = '\0';
    if (strcmp(got, want) || p->ncomms != ncomms) {
        print_error("plan %s with %d communicators, expected %s with %d\n", got, p->ncomms,
                    want, ncomms);
        fail();
    }
}

/* Kinds, in order: tp cp dp dp-cp pp tp-cp mp embedding ep etp etp-ep edp. Kind 4 is pp,
 * 0 tp, 2 dp, 8 ep. */

static void test_table(void **state)
{
    (void)state;
    static const bool want[MT_GROUP_COUNT] = {
        [MT_GROUP_TP] = true,   [MT_GROUP_DP] = true,  [MT_GROUP_PP] = true,
        [MT_GROUP_EMBD] = true, [MT_GROUP_EP] = true,  [MT_GROUP_ETP] = true,
        [MT_GROUP_ETP_EP] = true, [MT_GROUP_EDP] = true,
    };
    for (int k = 0; k < MT_GROUP_COUNT; k++)
        assert_int_equal(mt_group_kind_on_device((enum mt_group_kind)k), want[k]);
}

/* 4 ranks, TP 2, EP 2, CP = ETP = 1: EP and ETP x EP are the TP groups, expert DP the DP
 * groups; PP, embedding (pp = 1: each rank alone) and ETP are groups of one, which share
 * one communicator of one rank. 4 communicators where every kind used to get its own
 * (13). */
static void test_tp2_ep2(void **state)
{
    (void)state;
    struct mt_rank_layout rl;
    build(&rl, 4, 2, 1, 2, 1);
    for (int r = 0; r < 4; r++) {
        struct mt_device_plan p;
        mt_parallel_device_plan(&rl, NULL, r, &p);
        expect_plan(&p, "O-O-O--40402", 4);
        assert_int_equal(p.color[MT_GROUP_TP], r / 2);
        assert_int_equal(p.key[MT_GROUP_TP], r % 2);
        assert_int_equal(p.color[MT_GROUP_DP], r % 2);
        assert_int_equal(p.key[MT_GROUP_DP], r / 2);
        assert_int_equal(p.size[MT_GROUP_PP], 1);
        assert_true(p.split[MT_GROUP_TP] && p.split[MT_GROUP_DP] && p.split[MT_GROUP_PP]);
        assert_false(p.split[MT_GROUP_EP] || p.split[MT_GROUP_EDP] || p.split[MT_GROUP_CP]);
    }
    mt_groups_free(&rl);
}

/* The same with ETP 2: ETP is the TP groups, EP the DP groups, ETP x EP the world. */
static void test_tp2_ep2_etp2(void **state)
{
    (void)state;
    struct mt_rank_layout rl;
    build(&rl, 4, 2, 1, 2, 2);
    struct mt_device_plan p;
    mt_parallel_device_plan(&rl, NULL, 1, &p);
    expect_plan(&p, "O-O-O--420w4", 4);
    mt_groups_free(&rl);
}

/* 8 ranks, TP 2, EP 4: EP groups of 4 and expert DP groups of 2 of their own (6); with
 * ETP 2 and EP 2 instead, EP, ETP x EP and expert DP all differ from the dense groups
 * (7). */
static void test_8_ranks(void **state)
{
    (void)state;
    struct mt_rank_layout rl;
    build(&rl, 8, 2, 1, 4, 1);
    struct mt_device_plan p;
    mt_parallel_device_plan(&rl, NULL, 5, &p);
    expect_plan(&p, "O-O-O--4O48O", 6);
    assert_int_equal(p.color[MT_GROUP_EP], 1);
    assert_int_equal(p.key[MT_GROUP_EP], 1);
    mt_groups_free(&rl);
    build(&rl, 8, 2, 1, 2, 2);
    mt_parallel_device_plan(&rl, NULL, 5, &p);
    expect_plan(&p, "O-O-O--4O0OO", 7);
    mt_groups_free(&rl);
}

/* PP 4 on 4 ranks: the pipeline group is the world; the embedding group (first and last
 * stage) is its own there and absent in the middle stages, which thus split with no
 * colour. TP, DP, EP... are groups of one, sharing one communicator. */
static void test_pp4(void **state)
{
    (void)state;
    struct mt_rank_layout rl;
    build(&rl, 4, 1, 4, 1, 1);
    struct mt_device_plan p;
    mt_parallel_device_plan(&rl, NULL, 0, &p);
    expect_plan(&p, "O-0-w--O0000", 3);
    assert_true(p.split[MT_GROUP_EMBD]);
    mt_parallel_device_plan(&rl, NULL, 1, &p);
    expect_plan(&p, "O-0-w--a0000", 2);
    assert_true(p.split[MT_GROUP_EMBD]); /* the same answer on every rank */
    assert_false(p.split[MT_GROUP_PP]);
    /* a placement that reorders the processes: the pipeline group (logical order) is
     * no longer the world's communicator (process order) */
    static const int swap[4] = { 1, 0, 2, 3 };
    mt_parallel_device_plan(&rl, swap, 0, &p);
    expect_plan(&p, "O-0-O--O0000", 4);
    assert_true(p.split[MT_GROUP_PP]);
    mt_groups_free(&rl);
}

/* slurm/qwen3_256gpu.sh: TP 2 x PP 4 x DP 32, EP 8 x EDP 8, ETP 1. 8 communicators on the
 * first and last pipeline stages, 7 in the middle ones (no embedding group), from 7
 * splits; every kind used to get one (13). */
static void test_qwen3_256(void **state)
{
    (void)state;
    struct mt_rank_layout rl;
    build(&rl, 256, 2, 4, 8, 1);
    struct mt_device_plan p;
    mt_parallel_device_plan(&rl, NULL, 0, &p);
    expect_plan(&p, "O-O-O--OOO8O", 8);
    mt_parallel_device_plan(&rl, NULL, 64, &p); /* stage 1 */
    expect_plan(&p, "O-O-O--aOO8O", 7);
    char line[1024];
    mt_parallel_device_summary(&rl, NULL, 0, line, sizeof line);
    assert_string_equal(line, "NCCL communicators: 8 on this process (world + tp, dp, pp, "
                              "embedding, ep, etp (1 rank), edp; shared: etp-ep = ep; host "
                              "only: cp, dp-cp, tp-cp, mp); 7 to 8 per process, split from the "
                              "world's by 7 ncclCommSplit calls");
    mt_groups_free(&rl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),     cmocka_unit_test(test_tp2_ep2),
        cmocka_unit_test(test_tp2_ep2_etp2), cmocka_unit_test(test_8_ranks),
        cmocka_unit_test(test_pp4),       cmocka_unit_test(test_qwen3_256),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Megatron's rank generator against hand-computed tables. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/groups.h"

static void make(struct mt_config_parallel *pp_, struct mt_layout *lp, int world, int tp, int cp,
                 int pp, int ep, int etp, const char *order)
{
    struct mt_config_parallel p = { .tensor_model_parallel_size = tp,
                                    .pipeline_model_parallel_size = pp,
                                    .virtual_pipeline_model_parallel_size = 1,
                                    .context_parallel_size = cp,
                                    .expert_model_parallel_size = ep,
                                    .expert_tensor_parallel_size = etp };
    snprintf(p.order, sizeof p.order, "%s", order);
    struct mt_layout l = { .world_size = world, .tp = tp, .cp = cp, .pp = pp, .vpp = 1,
                           .ep = ep, .etp = etp, .dp = world / (tp * cp * pp),
                           .edp = world / (etp * ep * pp) };
    *pp_ = p;
    *lp = l;
}

static void build(struct mt_rank_layout *rl, int world, int tp, int cp, int pp, int ep, int etp,
                  const char *order)
{
    struct mt_config_parallel p;
    struct mt_layout l;
    make(&p, &l, world, tp, cp, pp, ep, etp, order);
    struct mt_err err;
    assert_int_equal(mt_groups_build(&p, &l, rl, &err), 0);
}

static void expect(const struct mt_rank_layout *rl, enum mt_group_kind k, int ngroups, int size,
                   const int *ranks)
{
    const struct mt_group_list *g = &rl->groups[k];
    assert_int_equal(g->ngroups, ngroups);
    assert_int_equal(g->size, size);
    for (int i = 0; i < ngroups * size; i++)
        if (g->ranks[i] != ranks[i]) {
            print_error("%s: element %d is %d, expected %d\n", mt_group_names[k], i, g->ranks[i],
                        ranks[i]);
            fail();
        }
}

/* Megatron's docstring example: 16 GPUs, TP 2, PP 4 (so DP 2). */
static void test_megatron_readme_example(void **state)
{
    (void)state;
    struct mt_rank_layout rl;
    build(&rl, 16, 2, 1, 4, 1, 2, "tp-cp-ep-dp-pp");
    static const int tp[] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 };
    static const int pp[] = { 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15 };
    static const int dp[] = { 0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15 };
    static const int embd[] = { 0, 12, 1, 13, 2, 14, 3, 15 };
    expect(&rl, MT_GROUP_TP, 8, 2, tp);
    expect(&rl, MT_GROUP_PP, 4, 4, pp);
    expect(&rl, MT_GROUP_DP, 8, 2, dp);
    expect(&rl, MT_GROUP_EMBD, 4, 2, embd);
    mt_groups_free(&rl);
}

/* Parallel folding: world 8, TP 2 (attention), EP 4 with ETP 1 (experts). */
static void test_folding_tp2_ep4(void **state)
{
    (void)state;
    struct mt_rank_layout rl;
    build(&rl, 8, 2, 1, 1, 4, 1, "tp-cp-ep-dp-pp");
    static const int tp[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    static const int dp[] = { 0, 2, 4, 6, 1, 3, 5, 7 };
    static const int ep[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    static const int edp[] = { 0, 4, 1, 5, 2, 6, 3, 7 };
    static const int etp[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    expect(&rl, MT_GROUP_TP, 4, 2, tp);
    expect(&rl, MT_GROUP_DP, 2, 4, dp);
    expect(&rl, MT_GROUP_EP, 2, 4, ep);
    expect(&rl, MT_GROUP_EDP, 4, 2, edp);
    expect(&rl, MT_GROUP_ETP, 8, 1, etp);
    mt_groups_free(&rl);
}

/* EP 2 with ETP 2 on 8 ranks, PP 2: expert groups stride over ETP. */
static void test_ep2_etp2_pp2(void **state)
{
    (void)state;
    struct mt_rank_layout rl;
    build(&rl, 8, 2, 1, 2, 2, 2, "tp-cp-ep-dp-pp");
    static const int etp[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    static const int ep[] = { 0, 2, 1, 3, 4, 6, 5, 7 };
    static const int etp_ep[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    static const int pp[] = { 0, 4, 1, 5, 2, 6, 3, 7 };
    static const int edp[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    expect(&rl, MT_GROUP_ETP, 4, 2, etp);
    expect(&rl, MT_GROUP_EP, 4, 2, ep);
    expect(&rl, MT_GROUP_ETP_EP, 2, 4, etp_ep);
    expect(&rl, MT_GROUP_PP, 4, 2, pp);
    expect(&rl, MT_GROUP_EDP, 8, 1, edp);
    mt_groups_free(&rl);
}

/* A different order: tp-pp-dp puts pipeline stages next to each other. */
static void test_order_tp_pp_dp(void **state)
{
    (void)state;
    struct mt_rank_layout rl;
    build(&rl, 8, 2, 1, 2, 1, 2, "tp-pp-dp");
    static const int pp[] = { 0, 2, 1, 3, 4, 6, 5, 7 };
    static const int dp[] = { 0, 4, 1, 5, 2, 6, 3, 7 };
    expect(&rl, MT_GROUP_PP, 4, 2, pp);
    expect(&rl, MT_GROUP_DP, 4, 2, dp);
    mt_groups_free(&rl);
}

/* Every kind partitions the world (each rank once), for many layouts. */
static void test_partitions(void **state)
{
    (void)state;
    static const int layouts[][6] = { /* world tp cp pp ep etp */
        { 1, 1, 1, 1, 1, 1 },  { 8, 2, 1, 1, 2, 2 },   { 16, 2, 2, 2, 4, 1 },
        { 64, 4, 1, 4, 8, 1 }, { 256, 2, 1, 8, 8, 2 }, { 24, 2, 1, 3, 4, 1 } };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        const int *L = layouts[i];
        struct mt_rank_layout rl;
        build(&rl, L[0], L[1], L[2], L[3], L[4], L[5], "tp-cp-ep-dp-pp");
        for (int k = 0; k < MT_GROUP_COUNT; k++) {
            if (k == MT_GROUP_EMBD) continue;
            int *seen = calloc((size_t)L[0], sizeof(int));
            const struct mt_group_list *g = &rl.groups[k];
            assert_int_equal(g->ngroups * g->size, L[0]);
            for (int j = 0; j < L[0]; j++) seen[g->ranks[j]]++;
            for (int j = 0; j < L[0]; j++) assert_int_equal(seen[j], 1);
            free(seen);
        }
        int gi, pos;
        mt_groups_find(&rl, MT_GROUP_TP, L[0] - 1, &gi, &pos);
        assert_int_equal(pos, L[1] - 1);
        mt_groups_free(&rl);
    }
}

/* mt_groups_locate (a rank's place from its coordinates) says what mt_groups_find
 * finds in the lists, for every rank and kind, over layouts and orders. */
static void test_locate(void **state)
{
    (void)state;
    static const int layouts[][6] = { /* world tp cp pp ep etp */
        { 1, 1, 1, 1, 1, 1 },  { 8, 2, 1, 1, 2, 2 },   { 16, 2, 2, 2, 4, 1 },
        { 64, 4, 1, 4, 8, 1 }, { 256, 2, 1, 8, 8, 2 }, { 24, 2, 1, 3, 4, 1 },
        { 48, 1, 1, 4, 3, 2 }, { 32, 2, 1, 2, 2, 4 } };
    static const char *const orders[] = { "tp-cp-ep-dp-pp", "tp-pp-dp", "tp-dp-pp", "pp-dp-tp" };
    int checked = 0;
    for (size_t o = 0; o < sizeof orders / sizeof orders[0]; o++)
        for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
            const int *L = layouts[i];
            if (!strstr(orders[o], "cp") && L[2] != 1) continue;
            if (!strstr(orders[o], "ep") && L[4] != 1) continue;
            struct mt_config_parallel p;
            struct mt_layout l;
            make(&p, &l, L[0], L[1], L[2], L[3], L[4], L[5], orders[o]);
            struct mt_rank_layout rl;
            struct mt_err err;
            assert_int_equal(mt_groups_build(&p, &l, &rl, &err), 0);
            for (int r = 0; r < L[0]; r++) {
                struct mt_group_place at[MT_GROUP_COUNT];
                assert_int_equal(mt_groups_locate(&p, &l, r, at, &err), 0);
                for (int k = 0; k < MT_GROUP_COUNT; k++) {
                    int g, pos;
                    mt_groups_find(&rl, (enum mt_group_kind)k, r, &g, &pos);
                    if (g != at[k].group || pos != at[k].position ||
                        rl.groups[k].size != at[k].size) {
                        print_error("%s, world %d: rank %d in %s: lists say group %d position %d "
                                    "of %d, locate says %d %d of %d\n",
                                    orders[o], L[0], r, mt_group_names[k], g, pos,
                                    rl.groups[k].size, at[k].group, at[k].position, at[k].size);
                        fail();
                    }
                    checked++;
                }
            }
            mt_groups_free(&rl);
        }
    assert_true(checked > 3000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_megatron_readme_example), cmocka_unit_test(test_folding_tp2_ep4),
        cmocka_unit_test(test_ep2_etp2_pp2),            cmocka_unit_test(test_order_tp_pp_dp),
        cmocka_unit_test(test_partitions),              cmocka_unit_test(test_locate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

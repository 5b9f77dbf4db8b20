/* Placement: every TP x CP and ETP x EP group inside one NVLink domain, the
 * lcm block structure (parallel folding), pipelines, the error text for
 * impossible allocations, besteffort and linear. Clusters are built in
 * memory (mt_topo_cluster_describe) or read from tests/fixtures/topo. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "topo/topo_internal.h"

#ifndef MT_TOPO_FIXTURES
#define MT_TOPO_FIXTURES "tests/fixtures/topo"
#endif

static struct mt_rank_layout layout(int world, int tp, int cp, int pp, int ep, int etp,
                                    const char *order)
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
    struct mt_rank_layout rl;
    struct mt_err err = { 0 };
    if (mt_groups_build(&p, &l, &rl, &err)) {
        print_error("mt_groups_build: %s\n", err.msg);
        fail();
    }
    return rl;
}

/* nodes_per_domain[d] nodes of gpn processes, domain names "dom<d>". */
static struct mt_topo_cluster cluster(int ndom, const int *nodes_per_domain, int gpn)
{
    struct mt_topo_map m = { 0 };
    for (int d = 0; d < ndom; d++) m.n += nodes_per_domain[d];
    m.host = calloc((size_t)m.n, sizeof m.host[0]);
    m.key = calloc((size_t)m.n, sizeof m.key[0]);
    assert_non_null(m.host);
    assert_non_null(m.key);
    for (int d = 0, h = 0; d < ndom; d++)
        for (int i = 0; i < nodes_per_domain[d]; i++, h++) {
            snprintf(m.host[h], sizeof m.host[h], "node%d", h);
            snprintf(m.key[h], sizeof m.key[h], "dom%d", d);
        }
    struct mt_topo_cluster c;
    struct mt_err err = { 0 };
    assert_int_equal(mt_topo_cluster_describe(&m, gpn, NULL, "none", &c, &err), 0);
    mt_topo_map_free(&m);
    return c;
}

static struct mt_topo_cluster cluster_file(const char *name, int gpn)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", MT_TOPO_FIXTURES, name);
    struct mt_topo_map m;
    struct mt_err err = { 0 };
    if (mt_topo_map_read(path, &m, &err)) {
        print_error("%s\n", err.msg);
        fail();
    }
    struct mt_topo_cluster c;
    assert_int_equal(mt_topo_cluster_describe(&m, gpn, NULL, "none", &c, &err), 0);
    mt_topo_map_free(&m);
    return c;
}

static int domain_of_rank(const struct mt_topo_plan *p, int r)
{
    return p->domain_of_process[p->process_of_logical[r]];
}

/* Groups of kind k that span more than one domain, counted independently of
 * the plan's own statistics. */
static int split_groups(const struct mt_rank_layout *rl, const struct mt_topo_plan *p,
                        enum mt_group_kind k)
{
    const struct mt_group_list *g = &rl->groups[k];
    int split = 0;
    for (int i = 0; i < g->ngroups; i++) {
        int d0 = domain_of_rank(p, g->ranks[i * g->size]);
        for (int j = 1; j < g->size; j++)
            if (domain_of_rank(p, g->ranks[i * g->size + j]) != d0) {
                split++;
                break;
            }
    }
    return split;
}

static void check_permutation(const struct mt_topo_plan *p)
{
    char *seen = calloc((size_t)p->nprocs, 1);
    assert_non_null(seen);
    for (int i = 0; i < p->nprocs; i++) {
        int r = p->logical_of_process[i];
        assert_true(r >= 0 && r < p->nprocs);
        assert_false(seen[r]);
        seen[r] = 1;
        assert_int_equal(p->process_of_logical[r], i);
    }
    free(seen);
}

/* Plans and checks that every TPxCP and ETPxEP group is in one domain. */
static void place_ok(const struct mt_topo_cluster *c, const struct mt_rank_layout *rl,
                     const char *mode, struct mt_topo_plan *p)
{
    struct mt_err err = { 0 };
    if (mt_topo_place(c, rl, mode, p, &err)) {
        print_error("mt_topo_place: %s\n", err.msg);
        fail();
    }
    check_permutation(p);
    assert_int_equal(split_groups(rl, p, MT_GROUP_TP_CP), 0);
    assert_int_equal(split_groups(rl, p, MT_GROUP_ETP_EP), 0);
    assert_int_equal(p->split_groups[0], 0);
    assert_int_equal(p->split_groups[1], 0);
}

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

/* Parallel folding: TPxCP groups are aligned runs of tp*cp ranks, ETPxEP
 * groups aligned runs of etp*ep, so the ranks that must share a domain are
 * the aligned runs of their lcm. Check the block size and that domains of
 * exactly one block each hold every group, over a grid of layouts. */
static void test_block_is_lcm(void **state)
{
    (void)state;
    static const int tps[] = { 1, 2, 4, 8 }, cps[] = { 1, 2 }, etps[] = { 1, 2, 4 },
                     eps[] = { 1, 2, 3, 4, 8, 16 }, pps[] = { 1, 2, 3 };
    int cases = 0;
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 2; b++)
            for (size_t c = 0; c < 3; c++)
                for (size_t d = 0; d < 6; d++)
                    for (size_t e = 0; e < 3; e++) {
                        int A = tps[a] * cps[b], E = etps[c] * eps[d], L = A / gcd(A, E) * E;
                        int pp = pps[e], world = 2 * L * pp;
                        struct mt_rank_layout rl =
                            layout(world, tps[a], cps[b], pp, eps[d], etps[c], "tp-cp-ep-dp-pp");
                        int ndom = world / L, *nodes = malloc(sizeof(int) * (size_t)ndom);
                        for (int i = 0; i < ndom; i++) nodes[i] = 1;
                        struct mt_topo_cluster cl = cluster(ndom, nodes, L);
                        struct mt_topo_plan p;
                        place_ok(&cl, &rl, "nvlink", &p);
                        assert_int_equal(p.block, L);
                        /* each domain holds one aligned run of L logical ranks */
                        for (int r = 0; r < world; r++)
                            assert_int_equal(domain_of_rank(&p, r), domain_of_rank(&p, r / L * L));
                        mt_topo_plan_free(&p);
                        mt_topo_cluster_free(&cl);
                        mt_groups_free(&rl);
                        free(nodes);
                        cases++;
                    }
    assert_int_equal(cases, 4 * 2 * 3 * 6 * 3);
}

/* Every order Megatron accepts (permutations of tp, cp, ep, dp, pp): blocks
 * come out of the union-find with one size, and domains of that size hold
 * every group whole. */
static void test_every_order(void **state)
{
    (void)state;
    static const char *const dims[5] = { "tp", "cp", "ep", "dp", "pp" };
    int perm[5] = { 0, 1, 2, 3, 4 }, norders = 0;
    static const int shapes[][5] = { /* tp, cp, ep, etp, pp */
        { 2, 1, 4, 1, 2 }, { 4, 1, 2, 2, 2 }, { 2, 2, 8, 1, 1 }, { 2, 1, 3, 2, 2 },
    };
    for (;;) {
        char order[32];
        snprintf(order, sizeof order, "%s-%s-%s-%s-%s", dims[perm[0]], dims[perm[1]],
                 dims[perm[2]], dims[perm[3]], dims[perm[4]]);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int *sh = shapes[s];
            int world = 96;
            struct mt_rank_layout rl = layout(world, sh[0], sh[1], sh[4], sh[2], sh[3], order);
            struct mt_topo_plan p;
            int twelve[1] = { 12 };
            struct mt_topo_cluster whole = cluster(1, twelve, 8);
            place_ok(&whole, &rl, "nvlink", &p);
            int L = p.block;
            if (L == 0) {
                print_error("order %s, shape %zu: blocks of unequal size\n", order, s);
                fail();
            }
            mt_topo_plan_free(&p);
            mt_topo_cluster_free(&whole);
            int ndom = world / L, *nodes = malloc(sizeof(int) * (size_t)ndom);
            for (int i = 0; i < ndom; i++) nodes[i] = 1;
            struct mt_topo_cluster cl = cluster(ndom, nodes, L);
            place_ok(&cl, &rl, "nvlink", &p);
            mt_topo_plan_free(&p);
            mt_topo_cluster_free(&cl);
            mt_groups_free(&rl);
            free(nodes);
        }
        norders++;
        /* next permutation */
        int i = 3;
        while (i >= 0 && perm[i] > perm[i + 1]) i--;
        if (i < 0) break;
        int j = 4;
        while (perm[j] < perm[i]) j--;
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        for (int a = i + 1, b = 4; a < b; a++, b--) {
            t = perm[a];
            perm[a] = perm[b];
            perm[b] = t;
        }
    }
    assert_int_equal(norders, 120);
}

/* Four full NVL72 racks: TP 4, EP 8 (block 8, 9 per rack), PP 4. Two whole
 * pipelines fit per rack; the ninth pipeline is spread over the four
 * leftover slots, so only its 3 stage links cross racks, for each of the 8
 * PP groups (rank chains) running through its blocks. */
static void test_nvl72_racks(void **state)
{
    (void)state;
    struct mt_topo_cluster c = cluster_file("nvl72-4racks.nodes", 4);
    assert_int_equal(c.nprocs, 288);
    struct mt_rank_layout rl = layout(288, 4, 1, 4, 8, 1, "tp-cp-ep-dp-pp");
    struct mt_topo_plan p;
    place_ok(&c, &rl, "nvlink", &p);
    assert_int_equal(p.ndomains, 4); /* clusterUuid + clique: 4 racks, not 2 cliques */
    assert_int_equal(p.block, 8);
    assert_int_equal(p.pp_links, 72 * 3);
    assert_int_equal(p.pp_links_crossing, 3 * 8);
    for (int d = 0; d < 4; d++) assert_int_equal(p.domain_size[d], 72);
    mt_topo_plan_free(&p);
    mt_groups_free(&rl);
    /* a whole rack per expert group: EP 72 with ETP 1, TP 4 -> block 72 */
    rl = layout(288, 4, 1, 1, 72, 1, "tp-cp-ep-dp-pp");
    place_ok(&c, &rl, "nvlink", &p);
    assert_int_equal(p.block, 72);
    mt_topo_plan_free(&p);
    mt_groups_free(&rl);
    mt_topo_cluster_free(&c);
}

/* 64 trays from five partly allocated racks (9, 7, 18, 16, 14 trays): with
 * TP 4 x EP 8 (block 8 = 2 trays) racks a and b hold half a block too many;
 * the message names them, the block, and the node multiple that works. */
static void test_fragmented_error(void **state)
{
    (void)state;
    struct mt_topo_cluster c = cluster_file("fragmented-64.nodes", 4);
    struct mt_rank_layout rl = layout(256, 4, 1, 1, 8, 1, "tp-cp-ep-dp-pp");
    struct mt_topo_plan p;
    struct mt_err err = { 0 };
    assert_int_equal(mt_topo_place(&c, &rl, "nvlink", &p, &err), MT_EINVAL);
    static const char *const expect[] = {
        "TP x CP group (tp 4 x cp 1 = 4 ranks)",
        "ETP x EP group (etp 1 x ep 8 = 8 ranks)",
        "blocks of 8 ranks (lcm(4, 8))",
        "domain 'rack-a': 36 GPUs on 9 nodes = 4 whole blocks + 4 GPUs left over",
        "domain 'rack-b': 28 GPUs on 7 nodes = 3 whole blocks + 4 GPUs left over",
        "(3 other domains hold whole blocks)",
        "The domains hold 31 whole blocks; the job needs 32.",
        "a node count that is a multiple of 2",
        "'rack-a': 8 or 10 nodes instead of 9",
        "sbatch --segment=2",
        "placement = 'nvlink-besteffort'",
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
        if (!strstr(err.msg, expect[i])) {
            print_error("missing \"%s\" in:\n%s\n", expect[i], err.msg);
            fail();
        }
    assert_null(strstr(err.msg, "rack-c'")); /* whole racks are not listed */
    mt_groups_free(&rl);

    /* EP 16 (block 16 = 4 trays): racks c (18) and e (14) fail too */
    rl = layout(256, 4, 1, 1, 16, 1, "tp-cp-ep-dp-pp");
    assert_int_equal(mt_topo_place(&c, &rl, "nvlink", &p, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "multiple of 4 (4 nodes x 4 GPUs = 16 GPUs = 1 block)"));
    assert_non_null(strstr(err.msg, "domain 'rack-c': 72 GPUs on 18 nodes"));
    assert_non_null(strstr(err.msg, "--segment=4"));
    mt_groups_free(&rl);

    /* TP 4 x EP 4 (block 4 = one tray) always fits */
    rl = layout(256, 4, 1, 1, 4, 1, "tp-cp-ep-dp-pp");
    place_ok(&c, &rl, "nvlink", &p);
    mt_topo_plan_free(&p);
    mt_groups_free(&rl);
    mt_topo_cluster_free(&c);
}

/* Besteffort on the same allocation: whole blocks first, then one block is
 * split between the leftovers of racks a and b, and reported. */
static void test_besteffort(void **state)
{
    (void)state;
    struct mt_topo_cluster c = cluster_file("fragmented-64.nodes", 4);
    struct mt_rank_layout rl = layout(256, 4, 1, 1, 8, 1, "tp-cp-ep-dp-pp");
    struct mt_topo_plan p;
    struct mt_err err = { 0 };
    assert_int_equal(mt_topo_place(&c, &rl, "nvlink-besteffort", &p, &err), 0);
    check_permutation(&p);
    assert_int_equal(split_groups(&rl, &p, MT_GROUP_TP_CP), 0);
    assert_int_equal(split_groups(&rl, &p, MT_GROUP_ETP_EP), 1);
    assert_int_equal(p.split_groups[0], 0);
    assert_int_equal(p.split_groups[1], 1);
    assert_non_null(p.notes);
    assert_non_null(strstr(p.notes, "etp-ep group"));
    assert_non_null(strstr(p.notes, "4 in 'rack-"));
    mt_topo_plan_free(&p);
    mt_groups_free(&rl);
    mt_topo_cluster_free(&c);
}

/* DGX nodes are 8-GPU domains: a block of 16 cannot be placed at all. */
static void test_block_larger_than_domain(void **state)
{
    (void)state;
    struct mt_topo_cluster c = cluster_file("dgx-cluster.nodes", 8);
    struct mt_rank_layout rl = layout(256, 2, 1, 1, 16, 1, "tp-cp-ep-dp-pp");
    struct mt_topo_plan p;
    struct mt_err err = { 0 };
    assert_int_equal(mt_topo_place(&c, &rl, "nvlink", &p, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "blocks of 16 ranks (lcm(2, 16))"));
    assert_non_null(strstr(err.msg, "the largest NVLink domain here, 'host:dgx-001', has 8 GPUs"));
    assert_non_null(strstr(err.msg, "lcm of at most 8"));
    mt_groups_free(&rl);
    /* folding TP 2 x CP 1 with ETP 1 x EP 3 gives lcm 6, which does not
     * divide 8 even though each group fits a node */
    rl = layout(192, 2, 1, 1, 3, 1, "tp-cp-ep-dp-pp");
    struct mt_topo_cluster c24;
    int nodes[1] = { 24 };
    c24 = cluster(1, nodes, 8);
    for (int i = 0; i < c24.nprocs; i++)
        snprintf(c24.procs[i].domain, sizeof c24.procs[i].domain, "host:%s", c24.procs[i].host);
    assert_int_equal(mt_topo_place(&c24, &rl, "nvlink", &p, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "blocks of 6 ranks (lcm(2, 3))"));
    assert_non_null(strstr(err.msg, "multiple of 3 (3 nodes x 8 GPUs = 24 GPUs = 4 blocks)"));
    mt_groups_free(&rl);
    mt_topo_cluster_free(&c24);
    mt_topo_cluster_free(&c);
}

/* TP 8 on DGX nodes, PP 4 (DP 8): a pipeline does not fit a node, so its
 * stages go to consecutive nodes: node 1 plays stage 1 of pipeline 0
 * (ranks 64..71), not stage 0 of pipeline 1 as launch order would have it. */
static void test_dgx_pipeline_chain(void **state)
{
    (void)state;
    struct mt_topo_cluster c = cluster_file("dgx-cluster.nodes", 8);
    struct mt_rank_layout rl = layout(256, 8, 1, 4, 8, 1, "tp-cp-ep-dp-pp");
    struct mt_topo_plan p;
    place_ok(&c, &rl, "nvlink", &p);
    for (int node = 0; node < 32; node++)
        for (int i = 0; i < 8; i++)
            assert_int_equal(p.logical_of_process[node * 8 + i],
                             (node % 4) * 64 + (node / 4) * 8 + i);
    mt_topo_plan_free(&p);
    mt_groups_free(&rl);
    mt_topo_cluster_free(&c);
}

/* One domain: nothing to move, the plan is the launch order. */
static void test_single_domain_identity(void **state)
{
    (void)state;
    int nodes[1] = { 4 };
    struct mt_topo_cluster c = cluster(1, nodes, 4);
    struct mt_rank_layout rl = layout(16, 2, 1, 2, 4, 1, "tp-cp-ep-dp-pp");
    struct mt_topo_plan p;
    place_ok(&c, &rl, "nvlink", &p);
    for (int i = 0; i < 16; i++) assert_int_equal(p.logical_of_process[i], i);
    assert_int_equal(p.pp_links_crossing, 0);
    mt_topo_plan_free(&p);
    mt_groups_free(&rl);
    mt_topo_cluster_free(&c);
}

/* Processes launched round-robin over nodes (srun -m cyclic): placement
 * gathers each node's processes, so TP groups stay in their node. */
static void test_cyclic_launch(void **state)
{
    (void)state;
    int nodes[4] = { 1, 1, 1, 1 };
    struct mt_topo_cluster c = cluster(4, nodes, 4);
    struct mt_topo_proc *cyc = malloc(sizeof *cyc * 16);
    for (int p = 0; p < 16; p++) cyc[p] = c.procs[(p % 4) * 4 + p / 4];
    memcpy(c.procs, cyc, sizeof *cyc * 16);
    free(cyc);
    struct mt_rank_layout rl = layout(16, 4, 1, 1, 2, 2, "tp-cp-ep-dp-pp");
    struct mt_topo_plan p;
    place_ok(&c, &rl, "nvlink", &p);
    /* linear keeps launch order and splits every TP group over 4 nodes */
    mt_topo_plan_free(&p);
    struct mt_err err = { 0 };
    assert_int_equal(mt_topo_place(&c, &rl, "linear", &p, &err), 0);
    for (int i = 0; i < 16; i++) assert_int_equal(p.logical_of_process[i], i);
    assert_int_equal(p.split_groups[0], 4);
    assert_int_equal(p.split_groups[1], 4);
    mt_topo_plan_free(&p);
    mt_groups_free(&rl);
    mt_topo_cluster_free(&c);
}

static void test_bad_input(void **state)
{
    (void)state;
    int nodes[1] = { 2 };
    struct mt_topo_cluster c = cluster(1, nodes, 4);
    struct mt_rank_layout rl = layout(16, 2, 1, 1, 2, 1, "tp-cp-ep-dp-pp");
    struct mt_topo_plan p;
    struct mt_err err = { 0 };
    assert_int_equal(mt_topo_place(&c, &rl, "nvlink", &p, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "16 ranks but there are 8 processes"));
    mt_groups_free(&rl);
    rl = layout(8, 2, 1, 1, 2, 1, "tp-cp-ep-dp-pp");
    assert_int_equal(mt_topo_place(&c, &rl, "round-robin", &p, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "'round-robin' is not one of"));
    mt_groups_free(&rl);
    mt_topo_cluster_free(&c);
}

static void test_map_file_errors(void **state)
{
    (void)state;
    char path[] = "/tmp/mt-topo-map-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("# comment\n\nnode1 rack-a\nnode2 rack-a extra\n", f);
    fclose(f);
    struct mt_topo_map m;
    struct mt_err err = { 0 };
    assert_int_equal(mt_topo_map_read(path, &m, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, ":4: expected 'hostname domain_key'"));
    f = fopen(path, "w");
    fputs("# nothing\n", f);
    fclose(f);
    assert_int_equal(mt_topo_map_read(path, &m, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "no 'hostname domain_key' lines"));
    remove(path);
    assert_int_equal(mt_topo_map_read(path, &m, &err), MT_EIO);
}

static void test_intern(void **state)
{
    (void)state;
    char s[6][8] = { "b", "a", "b", "c", "a", "b" };
    int ids[6], firsts[6];
    assert_int_equal(mt_topo_intern(s[0], sizeof s[0], 6, ids, firsts), 3);
    static const int want[6] = { 0, 1, 0, 2, 1, 0 }, wf[3] = { 0, 1, 3 };
    for (int i = 0; i < 6; i++) assert_int_equal(ids[i], want[i]);
    for (int i = 0; i < 3; i++) assert_int_equal(firsts[i], wf[i]);
}

/* 100,000 GPUs: 25,000 GB200 trays in NVL72 racks (the last one partial).
 * Finishing is the test; bench/topo_place.sh measures the time. */
static void test_100k(void **state)
{
    (void)state;
    int ndom = 25000 / 18 + 1, *nodes = malloc(sizeof(int) * (size_t)ndom);
    for (int d = 0; d < ndom; d++) nodes[d] = d + 1 < ndom ? 18 : 25000 % 18;
    struct mt_topo_cluster c = cluster(ndom, nodes, 4);
    assert_int_equal(c.nprocs, 100000);
    struct mt_rank_layout rl = layout(100000, 4, 1, 4, 8, 1, "tp-cp-ep-dp-pp");
    struct mt_topo_plan p;
    place_ok(&c, &rl, "nvlink", &p);
    assert_int_equal(p.block, 8);
    mt_topo_plan_free(&p);
    mt_groups_free(&rl);
    mt_topo_cluster_free(&c);
    free(nodes);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_intern),
        cmocka_unit_test(test_block_is_lcm),
        cmocka_unit_test(test_every_order),
        cmocka_unit_test(test_nvl72_racks),
        cmocka_unit_test(test_fragmented_error),
        cmocka_unit_test(test_besteffort),
        cmocka_unit_test(test_block_larger_than_domain),
        cmocka_unit_test(test_dgx_pipeline_chain),
        cmocka_unit_test(test_single_domain_identity),
        cmocka_unit_test(test_cyclic_launch),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_map_file_errors),
        cmocka_unit_test(test_100k),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

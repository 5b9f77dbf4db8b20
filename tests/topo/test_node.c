/* The node: GPUs and their locality from the hwloc XML fixtures (DGX H100,
 * GB200 tray), which GPU each local process takes, the cores and NUMA node
 * chosen for it, NVLink-domain keys, and binding this very process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sched.h>

#include "config.h"
#include "topo/topo_internal.h"

#ifdef HAVE_NUMA
#include <numaif.h>
#endif

#ifndef MT_TOPO_FIXTURES
#define MT_TOPO_FIXTURES "tests/fixtures/topo"
#endif

static struct mt_topo_node *load(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", MT_TOPO_FIXTURES, name);
    struct mt_topo_node *n;
    struct mt_err err = { 0 };
    if (mt_topo_node_load(path, true, &n, &err)) {
        print_error("%s\n", err.msg);
        fail();
    }
    assert_false(n->this_system);
    return n;
}

static void test_dgx_h100_gpus(void **state)
{
    (void)state;
    struct mt_topo_node *n = load("dgx-h100.xml");
    assert_int_equal(n->npackages, 2);
    assert_int_equal(n->nnuma, 2);
    assert_int_equal(n->ncores, 112);
    assert_int_equal(n->npus, 224);
    assert_int_equal(n->ngpus, 8); /* the 4 NVSwitches (10de, class 0680) are not GPUs */
    static const char *const pci[8] = { "0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0",
                                        "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0",
                                        "0000:ba:00.0", "0000:db:00.0" };
    for (int i = 0; i < 8; i++) {
        char cpus[MT_TOPO_CPUS_MAX];
        assert_string_equal(n->gpus[i].pci, pci[i]);
        assert_int_equal(n->gpus[i].device_id, 0x2330);
        assert_int_equal(n->gpus[i].numa, i / 4);
        mt_topo_cpulist(n->gpus[i].cpuset, cpus, sizeof cpus);
        assert_string_equal(cpus, i < 4 ? "0-55,112-167" : "56-111,168-223");
        assert_false(n->gpus[i].nvlink_known);
        assert_string_equal(n->gpus[i].fabric, "");
    }
    assert_false(n->nvml);
    mt_topo_node_free(n);
}

static void test_gb200_gpus(void **state)
{
    (void)state;
    struct mt_topo_node *n = load("gb200-tray.xml");
    assert_int_equal(n->npackages, 2);
    assert_int_equal(n->nnuma, 6); /* 2 Grace LPDDR5X + 4 GPU HBM */
    assert_int_equal(n->ncores, 144);
    assert_int_equal(n->ngpus, 4);
    static const char *const pci[4] = { "0008:01:00.0", "0009:01:00.0", "0018:01:00.0",
                                        "0019:01:00.0" };
    for (int i = 0; i < 4; i++) {
        char cpus[MT_TOPO_CPUS_MAX];
        assert_string_equal(n->gpus[i].pci, pci[i]);
        assert_int_equal(n->gpus[i].device_id, 0x2941);
        /* the Grace's memory, never the GPU's own HBM node */
        assert_int_equal(n->gpus[i].numa, i / 2);
        mt_topo_cpulist(n->gpus[i].cpuset, cpus, sizeof cpus);
        assert_string_equal(cpus, i < 2 ? "0-71" : "72-143");
    }
    mt_topo_node_free(n);
}

static void test_bad_xml(void **state)
{
    (void)state;
    struct mt_topo_node *n;
    struct mt_err err = { 0 };
    assert_int_not_equal(mt_topo_node_load("/nonexistent/topo.xml", false, &n, &err), 0);
    assert_non_null(strstr(err.msg, "'/nonexistent/topo.xml' is not a usable hwloc XML"));
    assert_non_null(strstr(err.msg, "hwloc-info --input"));
}

static void choose(const struct mt_topo_node *n, const char *vis, int lr, int ls, int gpu,
                   int cuda)
{
    struct mt_topo_gpu_choice c;
    struct mt_err err = { 0 };
    if (mt_topo_choose_gpu(n, vis, lr, ls, &c, &err)) {
        print_error("%s\n", err.msg);
        fail();
    }
    if (c.gpu != gpu || c.cuda_device != cuda) {
        print_error("CUDA_VISIBLE_DEVICES=%s local %d/%d: gpu %d cuda %d, expected %d %d\n",
                    vis ? vis : "(unset)", lr, ls, c.gpu, c.cuda_device, gpu, cuda);
        fail();
    }
}

static void test_choose_gpu(void **state)
{
    (void)state;
    struct mt_topo_node *n = load("dgx-h100.xml");
    for (int i = 0; i < 8; i++) choose(n, NULL, i, 8, i, i);   /* one per GPU */
    choose(n, NULL, 1, 4, 1, 1);                               /* fewer ranks than GPUs */
    choose(n, NULL, 3, 16, 1, 1);                              /* two ranks per GPU */
    choose(n, NULL, 15, 16, 7, 7);
    choose(n, "3,1", 0, 2, 3, 0);                              /* CUDA order = list order */
    choose(n, "3,1", 1, 2, 1, 1);
    choose(n, "5", 6, 8, 5, 0);                                /* Slurm per-task binding */
    choose(n, "", 0, 8, -1, -1);                               /* empty = no GPU */
    choose(n, "2,9,1", 0, 1, 2, 0);                            /* CUDA stops at 9 */
    struct mt_topo_gpu_choice c;
    struct mt_err err = { 0 };
    assert_int_equal(mt_topo_choose_gpu(n, "2,9,1", 1, 2, &c, &err), 0);
    assert_int_equal(c.nvisible, 1);
    assert_int_equal(c.gpu, 2); /* one visible GPU: every rank takes it */
    assert_int_equal(mt_topo_choose_gpu(n, "GPU-6f1c2a3e", 0, 1, &c, &err), MT_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "needs NVML"));
    assert_int_equal(mt_topo_choose_gpu(n, "MIG-0/1/2", 0, 1, &c, &err), MT_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "MIG"));
    mt_topo_node_free(n);
}

static void bound(const struct mt_topo_node *n, const char *mode, int lr, int ls, const int *gpus,
                  const char *cpus, int numa)
{
    struct mt_topo_binding b;
    struct mt_err err = { 0 };
    if (mt_topo_affinity_choose(n, mode, lr, ls, gpus, &b, &err)) {
        print_error("%s\n", err.msg);
        fail();
    }
    char got[MT_TOPO_CPUS_MAX];
    mt_topo_cpulist(b.cpus, got, sizeof got);
    if (strcmp(got, cpus) || b.numa != numa) {
        print_error("%s, local %d/%d: cpus '%s' numa %d (%s), expected '%s' numa %d\n", mode, lr,
                    ls, got, b.numa, b.why, cpus, numa);
        fail();
    }
    mt_topo_binding_free(&b);
}

static void test_affinity_dgx(void **state)
{
    (void)state;
    struct mt_topo_node *n = load("dgx-h100.xml");
    int one[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    /* 4 GPUs share a socket's 56 cores: 14 cores (28 PUs) each */
    bound(n, "gpu", 0, 8, one, "0-13,112-125", 0);
    bound(n, "gpu", 3, 8, one, "42-55,154-167", 0);
    bound(n, "gpu", 4, 8, one, "56-69,168-181", 1);
    bound(n, "gpu", 7, 8, one, "98-111,210-223", 1);
    bound(n, "numa", 5, 8, one, "56-111,168-223", 1);
    bound(n, "none", 5, 8, one, "", -1);
    /* two ranks per GPU: 8 share a socket, 7 cores each */
    int two[16];
    for (int i = 0; i < 16; i++) two[i] = i / 2;
    bound(n, "gpu", 0, 16, two, "0-6,112-118", 0);
    bound(n, "gpu", 1, 16, two, "7-13,119-125", 0);
    bound(n, "gpu", 15, 16, two, "105-111,217-223", 1);
    /* no GPUs (CPU-only run): ranks spread over the two sockets */
    int none[4] = { -1, -1, -1, -1 };
    bound(n, "gpu", 0, 4, none, "0-27,112-139", 0);
    bound(n, "gpu", 1, 4, none, "28-55,140-167", 0);
    bound(n, "gpu", 2, 4, none, "56-83,168-195", 1);
    bound(n, "gpu", 3, 4, none, "84-111,196-223", 1);
    bound(n, "numa", 3, 4, none, "56-111,168-223", 1);
    bound(n, "gpu", 1, 3, none, "28-55,140-167", 0); /* 3 ranks: 2 on node 0, 1 on node 1 */
    bound(n, "gpu", 2, 3, none, "56-111,168-223", 1);
    /* more ranks than cores share single cores */
    int many[300];
    for (int i = 0; i < 300; i++) many[i] = -1;
    bound(n, "gpu", 0, 300, many, "0,112", 0);
    bound(n, "gpu", 1, 300, many, "0,112", 0);
    bound(n, "gpu", 2, 300, many, "0,112", 0); /* 150 ranks on 56 cores */
    bound(n, "gpu", 3, 300, many, "1,113", 0);
    struct mt_topo_binding b;
    struct mt_err err = { 0 };
    assert_int_equal(mt_topo_affinity_choose(n, "socket", 0, 8, one, &b, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "'socket' is not one of gpu, numa, none"));
    mt_topo_binding_free(&b);
    mt_topo_node_free(n);
}

static void test_affinity_gb200(void **state)
{
    (void)state;
    struct mt_topo_node *n = load("gb200-tray.xml");
    int one[4] = { 0, 1, 2, 3 };
    bound(n, "gpu", 0, 4, one, "0-35", 0);
    bound(n, "gpu", 1, 4, one, "36-71", 0);
    bound(n, "gpu", 2, 4, one, "72-107", 1);
    bound(n, "gpu", 3, 4, one, "108-143", 1);
    bound(n, "numa", 1, 4, one, "0-71", 0);
    /* 6 ranks on 4 GPUs: GPUs 0,0,1,2,2,3; three share each Grace */
    int six[6] = { 0, 0, 1, 2, 2, 3 };
    bound(n, "gpu", 0, 6, six, "0-23", 0);
    bound(n, "gpu", 2, 6, six, "48-71", 0);
    bound(n, "gpu", 5, 6, six, "120-143", 1);
    mt_topo_node_free(n);
}

/* XML topologies are plans, never bindings. */
static void test_apply_xml_not_bound(void **state)
{
    (void)state;
    struct mt_topo_node *n = load("gb200-tray.xml");
    int one[4] = { 0, 1, 2, 3 };
    struct mt_topo_binding b;
    struct mt_topo_applied a;
    struct mt_err err = { 0 };
    assert_int_equal(mt_topo_affinity_choose(n, "gpu", 2, 4, one, &b, &err), 0);
    assert_int_equal(mt_topo_affinity_apply(n, &b, true, &a, &err), 0);
    assert_string_equal(a.cpus, "72-107");
    assert_int_equal(a.membind, -1);
    assert_non_null(strstr(a.report, "not applied"));
    mt_topo_binding_free(&b);
    mt_topo_node_free(n);
}

static void set_affinity(hwloc_const_bitmap_t set)
{
    cpu_set_t cs;
    CPU_ZERO(&cs);
    for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) CPU_SET(i, &cs);
    assert_int_equal(sched_setaffinity(0, sizeof cs, &cs), 0);
}

static void get_affinity(char *buf, size_t len)
{
    cpu_set_t cs;
    assert_int_equal(sched_getaffinity(0, sizeof cs, &cs), 0);
    hwloc_bitmap_t s = hwloc_bitmap_alloc();
    for (int i = 0; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &cs)) hwloc_bitmap_set(s, (unsigned)i);
    mt_topo_cpulist(s, buf, len);
    hwloc_bitmap_free(s);
}

/* Binding this process for real: the CPU-only rule on the live machine,
 * checked with sched_getaffinity and get_mempolicy; then the rule for a
 * process the launcher already bound. */
static void test_apply_live(void **state)
{
    (void)state;
    struct mt_topo_node *n;
    struct mt_err err = { 0 };
    assert_int_equal(mt_topo_node_load("", false, &n, &err), 0);
    if (!n->this_system) {
        mt_topo_node_free(n);
        skip(); /* HWLOC_XMLFILE points elsewhere */
    }
    hwloc_bitmap_t allowed = hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(n->topo));
    set_affinity(allowed); /* start unbound, whatever the test runner did */
    int ls = 2, gpus[2] = { -1, -1 };
    struct mt_topo_binding b;
    struct mt_topo_applied a;
    assert_int_equal(mt_topo_affinity_choose(n, "gpu", 1, ls, gpus, &b, &err), 0);
    char want[MT_TOPO_CPUS_MAX], got[MT_TOPO_CPUS_MAX];
    mt_topo_cpulist(b.cpus, want, sizeof want);
    if (mt_topo_affinity_apply(n, &b, true, &a, &err)) {
        print_error("%s\n", err.msg);
        fail();
    }
    get_affinity(got, sizeof got);
    assert_string_equal(got, want);
    assert_string_equal(a.cpus, want);
    int node = mt_topo_numa_of(n->topo, b.cpus);
#ifdef HAVE_NUMA
    if (node >= 0) {
        int mode = -1;
        unsigned long mask[16] = { 0 };
        assert_int_equal(get_mempolicy(&mode, mask, 16 * 64, NULL, 0), 0);
        assert_int_equal(mode, MPOL_BIND);
        assert_true(mask[node / 64] >> (node % 64) & 1);
        assert_int_equal(a.membind, node);
        set_mempolicy(MPOL_DEFAULT, NULL, 0);
    }
#endif
    mt_topo_binding_free(&b);
    if (hwloc_bitmap_weight(allowed) >= 2) {
        /* The launcher bound us to the first PU; our choice is the last one:
         * disjoint, so the launcher's binding is kept and the report says so. */
        hwloc_bitmap_t first = hwloc_bitmap_alloc();
        hwloc_bitmap_only(first, (unsigned)hwloc_bitmap_first(allowed));
        set_affinity(first);
        b.cpus = hwloc_bitmap_alloc();
        hwloc_bitmap_only(b.cpus, (unsigned)hwloc_bitmap_last(allowed));
        snprintf(b.why, sizeof b.why, "test");
        assert_int_equal(mt_topo_affinity_apply(n, &b, false, &a, &err), 0);
        get_affinity(got, sizeof got);
        mt_topo_cpulist(first, want, sizeof want);
        assert_string_equal(got, want);
        assert_non_null(strstr(a.report, "kept the launcher's binding"));
        assert_non_null(strstr(a.report, "--cpu-bind=none"));
        /* Launcher binding inside a larger choice: kept as it is. */
        hwloc_bitmap_copy(b.cpus, allowed);
        assert_int_equal(mt_topo_affinity_apply(n, &b, false, &a, &err), 0);
        get_affinity(got, sizeof got);
        assert_string_equal(got, want);
        assert_non_null(strstr(a.report, "inside the chosen cpus"));
        mt_topo_binding_free(&b);
        hwloc_bitmap_free(first);
    }
    set_affinity(allowed);
    hwloc_bitmap_free(allowed);
    mt_topo_node_free(n);
}

static struct mt_config_topology topo_cfg(const char *source, const char *map)
{
    struct mt_config_topology t;
    memset(&t, 0, sizeof t);
    snprintf(t.nvlink_domain_source, sizeof t.nvlink_domain_source, "%s", source);
    snprintf(t.domain_map_file, sizeof t.domain_map_file, "%s", map);
    return t;
}

static void test_domain_keys(void **state)
{
    (void)state;
    struct mt_topo_node *n = load("gb200-tray.xml");
    char key[MT_TOPO_DOMAIN_MAX];
    struct mt_err err = { 0 };
    struct mt_config_topology t = topo_cfg("host", "");
    assert_int_equal(mt_topo_domain_key(&t, n, 0, "nid001", key, sizeof key, &err), 0);
    assert_string_equal(key, "host:nid001");
    /* auto without NVML fabric info: one node = one domain */
    t = topo_cfg("auto", "");
    assert_int_equal(mt_topo_domain_key(&t, n, 0, "nid001", key, sizeof key, &err), 0);
    assert_string_equal(key, "host:nid001");
    /* nvml without NVML: a clear error */
    t = topo_cfg("nvml", "");
    assert_int_equal(mt_topo_domain_key(&t, n, 0, "nid001", key, sizeof key, &err),
                     MT_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "GPU 0008:01:00.0 has no NVLink fabric domain"));
    assert_non_null(strstr(err.msg, "use 'auto' or 'host'"));
    assert_int_equal(mt_topo_domain_key(&t, n, -1, "nid001", key, sizeof key, &err),
                     MT_EINVAL);
    assert_non_null(strstr(err.msg, "this process has no GPU"));
    /* slurm: the switch path without the node */
    t = topo_cfg("slurm", "");
    setenv("SLURM_TOPOLOGY_ADDR", "core.leaf07.nid001", 1);
    assert_int_equal(mt_topo_domain_key(&t, n, 0, "nid001", key, sizeof key, &err), 0);
    assert_string_equal(key, "slurm:core.leaf07");
    setenv("SLURM_TOPOLOGY_ADDR", "nid001", 1);
    assert_int_equal(mt_topo_domain_key(&t, n, 0, "nid001", key, sizeof key, &err),
                     MT_EINVAL);
    assert_non_null(strstr(err.msg, "names no switch or block"));
    unsetenv("SLURM_TOPOLOGY_ADDR");
    assert_int_equal(mt_topo_domain_key(&t, n, 0, "nid001", key, sizeof key, &err),
                     MT_EINVAL);
    assert_non_null(strstr(err.msg, "SLURM_TOPOLOGY_ADDR is not set"));
    /* file: exact host, then the short name */
    char map[512];
    snprintf(map, sizeof map, "%s/fragmented-64.nodes", MT_TOPO_FIXTURES);
    t = topo_cfg("file", map);
    assert_int_equal(mt_topo_domain_key(&t, n, 0, "nvl-b-t03", key, sizeof key, &err), 0);
    assert_string_equal(key, "file:rack-b");
    assert_int_equal(
        mt_topo_domain_key(&t, n, 0, "nvl-c-t01.cluster.example", key, sizeof key, &err),
        0);
    assert_string_equal(key, "file:rack-c");
    assert_int_equal(mt_topo_domain_key(&t, n, 0, "login1", key, sizeof key, &err),
                     MT_EINVAL);
    assert_non_null(strstr(err.msg, "has no line for host 'login1' (64 hosts listed)"));
    t = topo_cfg("file", "");
    assert_int_equal(mt_topo_domain_key(&t, n, 0, "x", key, sizeof key, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "needs domain_map_file"));
    mt_topo_node_free(n);
}

/* The template a dry run copies to every node. */
static void test_describe(void **state)
{
    (void)state;
    struct mt_topo_node *n = load("dgx-h100.xml");
    struct mt_topo_map m = { 0 };
    char path[512];
    snprintf(path, sizeof path, "%s/dgx-cluster.nodes", MT_TOPO_FIXTURES);
    struct mt_err err = { 0 };
    assert_int_equal(mt_topo_map_read(path, &m, &err), 0);
    struct mt_topo_cluster c;
    assert_int_equal(mt_topo_cluster_describe(&m, 8, n, "gpu", &c, &err), 0);
    assert_int_equal(c.nprocs, 256);
    const struct mt_topo_proc *q = &c.procs[8 + 5];
    assert_string_equal(q->host, "dgx-002");
    assert_string_equal(q->domain, "host:dgx-002");
    assert_string_equal(q->gpu, "0000:ab:00.0");
    assert_string_equal(q->cpus, "70-83,182-195");
    assert_int_equal(q->numa, 1);
    assert_int_equal(q->local_rank, 5);
    mt_topo_cluster_free(&c);
    assert_int_equal(mt_topo_cluster_describe(&m, 16, n, "gpu", &c, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "--gpus-per-node 16, but the hwloc topology"));
    mt_topo_map_free(&m);
    mt_topo_node_free(n);
}

int main(void)
{
#ifdef __SANITIZE_ADDRESS__
    /* hwloc's PCI plugin (libpciaccess) keeps allocations of the live PCI
     * scan and is unloaded with the last topology, before LeakSanitizer can
     * name (and suppress) it; the live tests here need no PCI devices. */
    setenv("HWLOC_COMPONENTS", "-pci", 0);
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dgx_h100_gpus),      cmocka_unit_test(test_gb200_gpus),
        cmocka_unit_test(test_bad_xml),            cmocka_unit_test(test_choose_gpu),
        cmocka_unit_test(test_affinity_dgx),       cmocka_unit_test(test_affinity_gb200),
        cmocka_unit_test(test_apply_xml_not_bound), cmocka_unit_test(test_apply_live),
        cmocka_unit_test(test_domain_keys),        cmocka_unit_test(test_describe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

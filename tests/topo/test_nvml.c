/* NVML through dlopen, against tests/topo/fake_nvml.c (run by nvml_fake.sh
 * with LD_LIBRARY_PATH at the fake and HWLOC_THISSYSTEM=1, so the GB200
 * fixture counts as this machine and NVML is asked about its GPUs). */
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

#define GB200_GPUS "0008:01:00.0,0009:01:00.0,0018:01:00.0,0019:01:00.0"
#define UUID_HEX "6f1c2a3e8b4d4e2a9c510a7e3b2d4f10"
#define UUID_STR "6f1c2a3e-8b4d-4e2a-9c51-0a7e3b2d4f10"

static struct mt_topo_node *load(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/gb200-tray.xml", MT_TOPO_FIXTURES);
    struct mt_topo_node *n;
    struct mt_err err = { 0 };
    if (mt_topo_node_load(path, true, &n, &err)) {
        print_error("%s\n", err.msg);
        fail();
    }
    return n;
}

static int setup(void **state)
{
    (void)state;
    if (!getenv("HWLOC_THISSYSTEM")) return -1; /* run through nvml_fake.sh */
    setenv("FAKE_NVML_GPUS", GB200_GPUS, 1);
    setenv("FAKE_NVML_FABRIC", UUID_HEX "/7/3/0", 1);
    setenv("FAKE_NVML_PEERS", "all", 1);
    return 0;
}

static void key(const struct mt_topo_node *n, const char *source, int gpu, int want_rc,
                const char *want)
{
    struct mt_config_topology t;
    memset(&t, 0, sizeof t);
    snprintf(t.nvlink_domain_source, sizeof t.nvlink_domain_source, "%s", source);
    char k[MT_TOPO_DOMAIN_MAX];
    struct mt_err err = { 0 };
    int rc = mt_topo_domain_key(&t, n, gpu, "nid042", k, sizeof k, &err);
    if (rc != want_rc || !strstr(rc ? err.msg : k, want)) {
        print_error("source %s: rc %d, key '%s', error '%s'; expected %d and '%s'\n", source, rc,
                    rc ? "" : k, rc ? err.msg : "", want_rc, want);
        fail();
    }
}

static void test_fabric_completed(void **state)
{
    (void)state;
    struct mt_topo_node *n = load();
    assert_true(n->this_system);
    assert_true(n->nvml);
    for (int i = 0; i < 4; i++) {
        assert_string_equal(n->gpus[i].fabric, UUID_STR "/7");
        assert_true(n->gpus[i].nvlink_known);
        assert_int_equal(n->gpus[i].nvlink_peers, 0xfull & ~(1ull << i));
    }
    assert_string_equal(n->gpus[2].uuid, "GPU-fake-0018:01:00.0");
    key(n, "nvml", 0, 0, "nvml:" UUID_STR "/7");
    key(n, "auto", 3, 0, "nvml:" UUID_STR "/7");
    key(n, "host", 3, 0, "host:nid042");
    mt_topo_node_free(n);
}

/* The key is the (clusterUuid, cliqueId) pair: same clique in another
 * cluster is another domain. */
static void test_key_is_the_pair(void **state)
{
    (void)state;
    struct mt_topo_node *a = load();
    setenv("FAKE_NVML_FABRIC", "d2a94c0751e34b8fa6c27e0f19b3c5a8/7/3/0", 1);
    struct mt_topo_node *b = load();
    setenv("FAKE_NVML_FABRIC", UUID_HEX "/7/3/0", 1);
    assert_string_not_equal(a->gpus[0].fabric, b->gpus[0].fabric);
    assert_string_equal(b->gpus[0].fabric, "d2a94c07-51e3-4b8f-a6c2-7e0f19b3c5a8/7");
    mt_topo_node_free(a);
    mt_topo_node_free(b);
}

static void test_fabric_not_ready(void **state)
{
    (void)state;
    static const struct { const char *env, *why; } cases[] = {
        { UUID_HEX "/7/2/0", "fabric state IN_PROGRESS" },
        { UUID_HEX "/7/0/0", "fabric state NOT_SUPPORTED" },
        { "00000000000000000000000000000000/7/3/0", "fabric cluster UUID is zero" },
        { UUID_HEX "/7/3/999", "fabric registration failed" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv("FAKE_NVML_FABRIC", cases[i].env, 1);
        struct mt_topo_node *n = load();
        assert_string_equal(n->gpus[1].fabric, "");
        if (!strstr(n->gpus[1].fabric_why, cases[i].why)) {
            print_error("'%s': why '%s'\n", cases[i].env, n->gpus[1].fabric_why);
            fail();
        }
        key(n, "nvml", 1, MT_EUNSUPPORTED, cases[i].why);
        key(n, "auto", 1, 0, "host:nid042");
        mt_topo_node_free(n);
    }
    setenv("FAKE_NVML_FABRIC", UUID_HEX "/7/3/0", 1);
}

static void test_unknown_gpu_and_peers(void **state)
{
    (void)state;
    setenv("FAKE_NVML_GPUS", "0008:01:00.0,0009:01:00.0,0018:01:00.0", 1);
    setenv("FAKE_NVML_PEERS", "none", 1);
    struct mt_topo_node *n = load();
    assert_non_null(strstr(n->gpus[3].fabric_why, "NVML does not know GPU 0019:01:00.0"));
    assert_false(n->gpus[3].nvlink_known);
    assert_true(n->gpus[0].nvlink_known);
    assert_int_equal(n->gpus[0].nvlink_peers, 0);
    key(n, "auto", 3, 0, "host:");
    key(n, "auto", 0, 0, "nvml:");
    mt_topo_node_free(n);
    setenv("FAKE_NVML_GPUS", GB200_GPUS, 1);
    setenv("FAKE_NVML_PEERS", "all", 1);
}

/* CUDA_VISIBLE_DEVICES by UUID maps through NVML. */
static void test_visible_by_uuid(void **state)
{
    (void)state;
    struct mt_topo_node *n = load();
    struct mt_topo_gpu_choice c;
    struct mt_err err = { 0 };
    assert_int_equal(
        mt_topo_choose_gpu(n, "GPU-fake-0019:01:00.0,GPU-fake-0008", 1, 2, &c, &err), 0);
    assert_int_equal(c.nvisible, 2);
    assert_int_equal(c.gpu, 0);
    assert_int_equal(c.cuda_device, 1);
    mt_topo_node_free(n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fabric_completed),   cmocka_unit_test(test_key_is_the_pair),
        cmocka_unit_test(test_fabric_not_ready),   cmocka_unit_test(test_unknown_gpu_and_peers),
        cmocka_unit_test(test_visible_by_uuid),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}

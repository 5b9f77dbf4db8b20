/* The CUDA backend's op table has every slot of enum mt_op filled, the choice of GPU
 * code for a device (mt_cuda_image_for) follows CUDA's compatibility rules, and the
 * backend reports a missing device with a message instead of failing later. Runs
 * without a GPU: the table is static, and the device is only touched by
 * mt_kernels_cuda(). */
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/kernels.h"
#include "util/error.h"

/* Devices against build lists: what runs (SASS, PTX or nothing) and which entry. */
static int check_images(void)
{
    static const struct {
        const char *archs;
        int major, minor;
        enum mt_cuda_image want;
        const char *which;
    } cases[] = {
        {"sm_90 sm_100 compute_100", 9, 0, MT_CUDA_IMAGE_SASS, "sm_90"},
        {"sm_90 sm_100 compute_100", 10, 0, MT_CUDA_IMAGE_SASS, "sm_100"},
        {"sm_90 sm_100 compute_100", 10, 3, MT_CUDA_IMAGE_SASS, "sm_100"}, /* GB300: same major */
        {"sm_90 sm_100 compute_100", 12, 0, MT_CUDA_IMAGE_PTX, "compute_100"},
        {"sm_90 sm_100 compute_100", 11, 0, MT_CUDA_IMAGE_PTX, "compute_100"},
        {"sm_90 sm_100 compute_100", 8, 0, MT_CUDA_IMAGE_NONE, ""}, /* older than the PTX */
        {"sm_90 sm_100 compute_100", 9, 1, MT_CUDA_IMAGE_SASS, "sm_90"},
        {"sm_90a sm_100a", 9, 0, MT_CUDA_IMAGE_SASS, "sm_90a"},
        {"sm_90a sm_100a", 10, 3, MT_CUDA_IMAGE_NONE, ""}, /* a: that GPU only */
        {"sm_90a sm_100a", 12, 0, MT_CUDA_IMAGE_NONE, ""},
        {"sm_100f", 10, 3, MT_CUDA_IMAGE_SASS, "sm_100f"},
        {"sm_100f", 12, 0, MT_CUDA_IMAGE_NONE, ""},
        {"compute_90a", 10, 0, MT_CUDA_IMAGE_NONE, ""},
        {"compute_90 compute_100", 12, 1, MT_CUDA_IMAGE_PTX, "compute_100"}, /* the newest PTX */
        {"compute_100 sm_90", 9, 0, MT_CUDA_IMAGE_SASS, "sm_90"}, /* SASS before PTX */
        {"compute_90 sm_100", 10, 0, MT_CUDA_IMAGE_SASS, "sm_100"},
        {"  sm_80   sm_86 ", 8, 9, MT_CUDA_IMAGE_SASS, "sm_86"},
        {"", 9, 0, MT_CUDA_IMAGE_NONE, ""},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char which[32] = "?";
        enum mt_cuda_image got = mt_cuda_image_for(cases[i].archs, cases[i].major, cases[i].minor, which, sizeof which);
        if (got != cases[i].want || strcmp(which, cases[i].which) != 0) {
            fprintf(stderr, "FAIL: build \"%s\", device sm_%d%d: got %d (%s), expected %d (%s)\n", cases[i].archs,
                    cases[i].major, cases[i].minor, (int)got, which, (int)cases[i].want, cases[i].which);
            bad = 1;
        }
    }
    if (!bad) printf("ok: GPU code chosen for %zu build/device pairs; this build: %s\n", sizeof cases / sizeof cases[0],
                     mt_cuda_archs());
    return bad;
}

int main(void)
{
    if (check_images()) return 1;

    struct mt_kernels k = {.name = "cuda", .ctx = NULL, .op = *mt_kernels_cuda_ops()};
    enum mt_op missing = MT_OP_COUNT;
    int n = mt_kernels_count_ops(&k, &missing);
    if (n != MT_OP_COUNT) {
        fprintf(stderr, "FAIL: the CUDA op table has %d of %d ops; first missing: %s\n", n, MT_OP_COUNT,
                mt_op_names[missing]);
        return 1;
    }
    printf("ok: the CUDA op table fills all %d ops\n", n);

    char desc[256];
    int devices = mt_cuda_describe(desc, sizeof desc);
    struct mt_err err;
    mt_err_clear(&err);
    const struct mt_kernels *g = mt_kernels_cuda(&err);
    if (devices == 0) {
        if (g != NULL || err.code == MT_OK || err.msg[0] == '\0') {
            fprintf(stderr, "FAIL: without a device (%s), mt_kernels_cuda must return NULL with a message\n", desc);
            return 1;
        }
        printf("ok: without a device, mt_kernels_cuda says: %s\n", err.msg);
        return 0;
    }
    if (g == NULL || strcmp(g->name, "cuda") != 0 || g->ctx == NULL ||
        memcmp(&g->op, mt_kernels_cuda_ops(), sizeof g->op) != 0) {
        fprintf(stderr, "FAIL: %s, but mt_kernels_cuda gave %s\n", desc, g ? "a malformed backend" : err.msg);
        return 1;
    }
    printf("ok: %s; backend \"%s\" ready\n", desc, g->name);
    return 0;
}

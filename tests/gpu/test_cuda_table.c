/* The CUDA backend's op table has every slot of enum mt_op filled, and the backend
 * reports a missing device with a message instead of failing later. Runs without a
 * GPU: the table is static, and the device is only touched by mt_kernels_cuda(). */
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/kernels.h"
#include "util/error.h"

int main(void)
{
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

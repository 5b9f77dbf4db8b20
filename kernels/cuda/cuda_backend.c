/* CUDA backend: the op table. Written in C so that it is checked by the same
 * designated-initializer table as the CPU backend; the ops live in the .cu files. */
#include "kernels/cuda/cuda_backend.h"

#include <pthread.h>

#include "kernels/cuda/cuda_ops.h"
#include "util/error.h"

static struct mt_kernels cuda_kernels = {
    .name = "cuda",
    .ctx = NULL,
    .op = {
        .alloc = mt_cuda_alloc,
        .free = mt_cuda_free,
        .memset = mt_cuda_memset,
        .copy = mt_cuda_copy,
        .sync = mt_cuda_sync,
        .gemm = mt_cuda_gemm,
        .grouped_gemm = mt_cuda_grouped_gemm,
        .embedding_fwd = mt_cuda_embedding_fwd,
        .embedding_bwd = mt_cuda_embedding_bwd,
        .rmsnorm_fwd = mt_cuda_rmsnorm_fwd,
        .rmsnorm_bwd = mt_cuda_rmsnorm_bwd,
        .rope_fwd = mt_cuda_rope_fwd,
        .rope_bwd = mt_cuda_rope_bwd,
        .attention_fwd = mt_cuda_attention_fwd,
        .attention_bwd = mt_cuda_attention_bwd,
        .swiglu_fwd = mt_cuda_swiglu_fwd,
        .swiglu_bwd = mt_cuda_swiglu_bwd,
        .add = mt_cuda_add,
        .router_fwd = mt_cuda_router_fwd,
        .router_bwd = mt_cuda_router_bwd,
        .aux_counts = mt_cuda_aux_counts,
        .aux_loss_fwd = mt_cuda_aux_loss_fwd,
        .aux_loss_bwd = mt_cuda_aux_loss_bwd,
        .z_loss_fwd = mt_cuda_z_loss_fwd,
        .z_loss_bwd = mt_cuda_z_loss_bwd,
        .dispatch_plan = mt_cuda_dispatch_plan,
        .permute_fwd = mt_cuda_permute_fwd,
        .permute_bwd = mt_cuda_permute_bwd,
        .unpermute_fwd = mt_cuda_unpermute_fwd,
        .unpermute_bwd = mt_cuda_unpermute_bwd,
        .cross_entropy_fwd = mt_cuda_cross_entropy_fwd,
        .cross_entropy_bwd = mt_cuda_cross_entropy_bwd,
        .adamw = mt_cuda_adamw,
        .bf16_round = mt_cuda_bf16_round,
        .scale = mt_cuda_scale,
        .sumsq = mt_cuda_sumsq,
    },
};

const struct mt_kernel_ops *mt_kernels_cuda_ops(void) { return &cuda_kernels.op; }

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

const struct mt_kernels *mt_kernels_cuda(struct mt_err *err)
{
    const struct mt_kernels *k = &cuda_kernels;
    pthread_mutex_lock(&init_lock);
    if (!cuda_kernels.ctx) {
        char msg[512];
        if (mt_cuda_ctx_create(&cuda_kernels.ctx, msg, sizeof msg) != 0) {
            mt_err_set(err, MT_EUNSUPPORTED, "CUDA backend: %s", msg);
            k = NULL;
        }
    }
    pthread_mutex_unlock(&init_lock);
    return k;
}

/* CUDA backend: the op table. Written in C so that it is checked by the same
 * designated-initializer table as the CPU backend; the ops live in the .cu files. */
#include "config.h"

#include "kernels/cuda/cuda_backend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_ops.h"
#include "util/error.h"

static const struct mt_graph_ops cuda_graph_ops = {
    .begin = mt_cuda_graph_begin,
    .end = mt_cuda_graph_end,
    .stats = mt_cuda_graph_stats,
    .reset = mt_cuda_graph_reset,
};

/* every recipe on the shards of tensor and expert-tensor parallelism (cuda_qdq.cu,
 * "Shards"): NVFP4's random bits and fp32 scale by the shard's place in its tensor; the
 * copies saved for backward (cuda_qdq.cu, "copies saved for backward"), unless
 * MT_CUDA_QUANT_SAVE=0; RMSNorm and SwiGLU emitting the quantisation of their output
 * (cuda_layers.cu), unless MT_CUDA_QUANT_FUSE=0 (quant_ops_from_env) */
static struct mt_quant_ops cuda_quant_ops = {
    .qdq = mt_cuda_qdq, .gemm = mt_cuda_qgemm, .save = mt_cuda_quant_save,
    .saved_bytes = mt_cuda_quant_saved_bytes, .grouped_gemm = mt_cuda_qgemm_grouped,
    .amax_nan_to_inf = mt_cuda_amax_nan_to_inf, .random_key = mt_cuda_random_key, .shards = true,
    .fp4_shards = true, .rmsnorm_fwd = mt_cuda_rmsnorm_fwd_q, .swiglu_fwd = mt_cuda_swiglu_fwd_q };

/* Environment variable name, read once when the backend starts: unset, empty or 1 (on,
 * the default), or 0: *off. Anything else is an error naming both meanings. */
static int quant_switch_from_env(const char *name, const char *on, const char *off_means, bool *off, char *msg,
                                 size_t msg_len)
{
    const char *s = getenv(name);
    *off = false;
    if (!s || !*s || !strcmp(s, "1")) return 0;
    if (strcmp(s, "0")) {
        snprintf(msg, msg_len, "%s='%s' is not 1 (%s, the default) or 0 (%s)", name, s, on, off_means);
        return -1;
    }
    *off = true;
    return 0;
}

/* MT_CUDA_QUANT_SAVE=0 leaves save out of the op table, so that the model keeps its
 * quantised linears' high-precision inputs and quantises them again in backward, as on
 * a backend without save (doc/fp8.md, "FP8 copies saved for backward": the comparison
 * that proves the copies change no bit). MT_CUDA_QUANT_FUSE=0 leaves out the producers
 * that emit their output's quantisation, so that the quantised GEMM quantises it from
 * memory (doc/fp8.md, "Quantisation fused with its producer": the same comparison). */
static int quant_ops_from_env(char *msg, size_t msg_len)
{
    bool off;
    if (quant_switch_from_env("MT_CUDA_QUANT_SAVE", "keep FP8 copies for backward", "keep the high-precision inputs",
                              &off, msg, msg_len))
        return -1;
    if (off) cuda_quant_ops.save = NULL, cuda_quant_ops.saved_bytes = NULL;
    if (quant_switch_from_env("MT_CUDA_QUANT_FUSE", "RMSNorm and SwiGLU emit their output's quantisation",
                              "the quantised GEMM quantises it from memory", &off, msg, msg_len))
        return -1;
    if (off) cuda_quant_ops.rmsnorm_fwd = NULL, cuda_quant_ops.swiglu_fwd = NULL;
    return 0;
}

static struct mt_kernels cuda_kernels = {
    .name = "cuda",
    .ctx = NULL,
    .op = {
        .alloc = mt_cuda_alloc,
        .free = mt_cuda_free,
        .alloc_host = mt_cuda_alloc_host,
        .free_host = mt_cuda_free_host,
        .memset = mt_cuda_memset,
        .copy = mt_cuda_copy,
        .sync = mt_cuda_sync,
        .event_create = mt_cuda_event_create,
        .event_destroy = mt_cuda_event_destroy,
        .event_record = mt_cuda_event_record,
        .event_wait = mt_cuda_event_wait,
        .copy_async = mt_cuda_copy_async,
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
        .drop_mask = mt_cuda_drop_mask,
        .expert_select = mt_cuda_expert_select,
        .expert_bias_update = mt_cuda_expert_bias_update,
        .permute_fwd = mt_cuda_permute_fwd,
        .permute_bwd = mt_cuda_permute_bwd,
        .unpermute_fwd = mt_cuda_unpermute_fwd,
        .unpermute_bwd = mt_cuda_unpermute_bwd,
        .cross_entropy_fwd = mt_cuda_cross_entropy_fwd,
        .cross_entropy_bwd = mt_cuda_cross_entropy_bwd,
        .lse_combine = mt_cuda_lse_combine,
        .loss_sum = mt_cuda_loss_sum,
        .adamw = mt_cuda_adamw,
        .adamw_dev = mt_cuda_adamw_dev,
        .bf16_round = mt_cuda_bf16_round,
        .convert = mt_cuda_convert,
        .scale = mt_cuda_scale,
        .sumsq = mt_cuda_sumsq,
        .amax_history = mt_cuda_amax_history,
    },
    .counts = mt_cuda_counts,
    .graph = &cuda_graph_ops,
    .quant = &cuda_quant_ops,
};

const struct mt_kernel_ops *mt_kernels_cuda_ops(void) { return &cuda_kernels.op; }

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

const struct mt_kernels *mt_kernels_cuda(struct mt_err *err)
{
    const struct mt_kernels *k = &cuda_kernels;
    pthread_mutex_lock(&init_lock);
    if (!cuda_kernels.ctx) {
        char msg[512];
        if (quant_ops_from_env(msg, sizeof msg) != 0 ||
            mt_cuda_ctx_create(&cuda_kernels.ctx, msg, sizeof msg) != 0) {
            mt_err_set(err, MT_EUNSUPPORTED, "CUDA backend: %s", msg);
            k = NULL;
        }
    }
    pthread_mutex_unlock(&init_lock);
    return k;
}

int mt_kernels_cuda_destroy(struct mt_err *err)
{
    int rc = MT_OK;
    pthread_mutex_lock(&init_lock);
    if (cuda_kernels.ctx) {
        char msg[512];
        if (mt_cuda_ctx_destroy(cuda_kernels.ctx, msg, sizeof msg) != 0)
            rc = mt_err_set(err, MT_ERUNTIME, "CUDA backend teardown: %s", msg);
        cuda_kernels.ctx = NULL;
    }
    pthread_mutex_unlock(&init_lock);
    return rc;
}

/* A build of the emulator without nvcc has no configured list: its devices (H100,
 * GB200) run what configure's default builds. */
#ifndef MT_CUDA_ARCHS
#define MT_CUDA_ARCHS "sm_90 sm_100 compute_100"
#endif

const char *mt_cuda_archs(void) { return MT_CUDA_ARCHS; }

enum mt_cuda_image mt_cuda_image_for(const char *archs, int major, int minor, char *which, size_t which_len)
{
    enum mt_cuda_image best = MT_CUDA_IMAGE_NONE;
    int best_n = -1;
    const char *p = archs;
    while (*p) {
        size_t len = strcspn(p, " \t");
        if (len == 0) {
            p++;
            continue;
        }
        char word[32] = "";
        if (len < sizeof word) memcpy(word, p, len), word[len] = '\0';
        p += len;
        enum mt_cuda_image kind = MT_CUDA_IMAGE_NONE;
        const char *num = word;
        if (!strncmp(word, "sm_", 3)) kind = MT_CUDA_IMAGE_SASS, num += 3;
        else if (!strncmp(word, "compute_", 8)) kind = MT_CUDA_IMAGE_PTX, num += 8;
        char *end;
        long n = strtol(num, &end, 10);
        if (kind == MT_CUDA_IMAGE_NONE || end == num || n <= 0 || n > 10000 ||
            (*end && ((*end != 'a' && *end != 'f') || end[1])))
            continue; /* not an architecture (configure lets none through) */
        const int code_major = (int)n / 10, code_minor = (int)n % 10;
        bool fits;
        if (*end == 'a') fits = major == code_major && minor == code_minor;
        else if (*end == 'f' || kind == MT_CUDA_IMAGE_SASS) fits = major == code_major && minor >= code_minor;
        else fits = major > code_major || (major == code_major && minor >= code_minor);
        /* the driver takes SASS before PTX, then the newest */
        const bool better = best == MT_CUDA_IMAGE_NONE || (kind == MT_CUDA_IMAGE_SASS && best == MT_CUDA_IMAGE_PTX) ||
                            (kind == best && n > best_n);
        if (!fits || !better) continue;
        best = kind;
        best_n = (int)n;
        if (which && which_len) snprintf(which, which_len, "%s", word);
    }
    if (best == MT_CUDA_IMAGE_NONE && which && which_len) which[0] = '\0';
    return best;
}

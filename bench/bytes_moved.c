/* bench/bytes_moved: the bytes one decoder layer's forward writes and reads, counted
 * from the op table's arguments: each typed tensor's elements times its dtype's size,
 * and the fp32 tensors (statistics, router scores, the attention output, logits) from
 * the ops' sizes. Activations and weights (the working copy) are counted apart; index
 * arrays, and copies (tokens and routing counts to and from the host), are left out.
 *
 *   bench/bytes_moved FILE.nml [group%key=value ...]
 *
 * runs one forward of the model with n and with 2n MoE layers (n: the namelist's
 * layer_freq entries, at least 1) on the CPU backend and prints the
 * difference, for bf16 storage and for the fp32-stored activations rounded in place
 * that moetrain used before (MT_DEBUG_FP32_ACTIVATIONS), per layer and per token.
 * bench/bytes_moved.sh runs it on the Qwen3-30B-A3B proxy's widths. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "kernels/kernels.h"
#include "model/model_internal.h"

static const struct mt_kernels *cpu;
static struct mt_kernels counting;
static const char *w_base; /* the working copy of the model being counted */
static size_t w_bytes;
static double act_bytes, weight_bytes, passes;

static void count(const void *p, size_t bytes)
{
    const char *c = p;
    if (w_base && c >= w_base && c < w_base + w_bytes)
        weight_bytes += (double)bytes;
    else
        act_bytes += (double)bytes;
}

static void T(struct mt_tensor t) { count(t.data, mt_tensor_payload(t)); }
static void F(const float *p, size_t n) { count(p, n * sizeof(float)); }

static void c_gemm(void *ctx, bool ta, bool tb, int M, int N, int K, float alpha,
                   struct mt_tensor A, struct mt_tensor B, float beta, struct mt_tensor C)
{
    T(A), T(B), T(C);
    if (beta != 0.0f) T(C);
    cpu->op.gemm(ctx, ta, tb, M, N, K, alpha, A, B, beta, C);
}

static void c_grouped_gemm(void *ctx, bool ta, bool tb, int G, const int32_t *offsets, int M,
                           int N, int K, float alpha, struct mt_tensor A, struct mt_tensor B,
                           float beta, struct mt_tensor C)
{
    T(A), T(B), T(C);
    if (beta != 0.0f) T(C);
    cpu->op.grouped_gemm(ctx, ta, tb, G, offsets, M, N, K, alpha, A, B, beta, C);
}

static void c_embedding_fwd(void *ctx, struct mt_tensor out, const int32_t *tokens,
                            struct mt_tensor wte, int N, int C)
{
    T(out);
    count(wte.data, (size_t)N * C * mt_dtype_size(wte.dtype)); /* the rows it reads */
    cpu->op.embedding_fwd(ctx, out, tokens, wte, N, C);
}

static void c_rmsnorm_fwd(void *ctx, struct mt_tensor out, float *rstd, struct mt_tensor x,
                          struct mt_tensor w, int N, int C, float eps)
{
    T(out), T(x), T(w), F(rstd, (size_t)N);
    cpu->op.rmsnorm_fwd(ctx, out, rstd, x, w, N, C, eps);
}

static void c_rope_fwd(void *ctx, struct mt_tensor out, struct mt_tensor x, int B, int Tn, int H,
                       int D, float theta)
{
    T(out), T(x);
    cpu->op.rope_fwd(ctx, out, x, B, Tn, H, D, theta);
}

static void c_attention_fwd(void *ctx, float *out, float *lse, struct mt_tensor q,
                            struct mt_tensor k, struct mt_tensor v, int B, int Tn, int Hq,
                            int Hkv, int D)
{
    T(q), T(k), T(v);
    F(out, (size_t)B * Tn * Hq * D), F(lse, (size_t)B * Hq * Tn);
    cpu->op.attention_fwd(ctx, out, lse, q, k, v, B, Tn, Hq, Hkv, D);
}

static void c_swiglu_fwd(void *ctx, struct mt_tensor out, struct mt_tensor g, struct mt_tensor u,
                         int N, int Fw)
{
    T(out), T(g), T(u);
    cpu->op.swiglu_fwd(ctx, out, g, u, N, Fw);
}

static void c_add(void *ctx, struct mt_tensor out, struct mt_tensor a, struct mt_tensor b, size_t n)
{
    T(out), T(a), T(b);
    cpu->op.add(ctx, out, a, b, n);
}

static void c_router_fwd(void *ctx, const struct mt_router_args *a, const float *logits,
                         const float *bias, int32_t *idx, float *prob)
{
    F(logits, (size_t)a->num_tokens * a->num_experts);
    F(prob, (size_t)a->num_tokens * a->topk);
    cpu->op.router_fwd(ctx, a, logits, bias, idx, prob);
}

static void c_aux_counts(void *ctx, const struct mt_aux_args *a, float *counts, const float *logits)
{
    F(logits, (size_t)a->num_tokens * a->num_experts);
    cpu->op.aux_counts(ctx, a, counts, logits);
}

static void c_aux_loss_fwd(void *ctx, const struct mt_aux_args *a, double *loss, const float *counts,
                           const float *logits)
{
    F(logits, (size_t)a->num_tokens * a->num_experts);
    cpu->op.aux_loss_fwd(ctx, a, loss, counts, logits);
}

static void c_z_loss_fwd(void *ctx, double *loss, float *lse, const float *logits, int N, int E,
                         float coeff)
{
    F(logits, (size_t)N * E), F(lse, (size_t)N);
    cpu->op.z_loss_fwd(ctx, loss, lse, logits, N, E, coeff);
}

static void c_permute_fwd(void *ctx, struct mt_tensor xp, struct mt_tensor x,
                          const int32_t *row_slot, int rows, int topk, int C)
{
    T(xp);
    count(x.data, (size_t)rows * C * mt_dtype_size(x.dtype)); /* one row read per row written */
    cpu->op.permute_fwd(ctx, xp, x, row_slot, rows, topk, C);
}

static void c_unpermute_fwd(void *ctx, struct mt_tensor out, struct mt_tensor yp,
                            const int32_t *slot_row, const float *prob, int N, int topk, int C)
{
    T(out), T(yp), F(prob, (size_t)N * topk);
    cpu->op.unpermute_fwd(ctx, out, yp, slot_row, prob, N, topk, C);
}

static void c_cross_entropy_fwd(void *ctx, float *lse, float *tl, const float *logits,
                                const int32_t *tg, int N, int V, int v0)
{
    F(logits, (size_t)N * V), F(lse, (size_t)N), F(tl, (size_t)N);
    cpu->op.cross_entropy_fwd(ctx, lse, tl, logits, tg, N, V, v0);
}

static void c_bf16_round(void *ctx, float *out, const float *x, size_t n)
{
    F(x, n), F(out, n);
    passes += 1;
    cpu->op.bf16_round(ctx, out, x, n);
}

static void c_convert(void *ctx, struct mt_tensor dst, struct mt_tensor src)
{
    T(dst), T(src);
    cpu->op.convert(ctx, dst, src);
}

/* Bytes (activations, weights) and rounding passes of one forward of cfg's model. */
static int forward_bytes(const struct mt_config *cfg, double *act, double *wt, double *np,
                         struct mt_err *err)
{
    struct mt_model *m;
    const int B = cfg->training.micro_batch_size;
    MT_CHECK(mt_model_create(cfg, &counting, B, NULL, &m, err));
    /* the values do not change what is moved: zero weights (routing by ties or forced) */
    memset(mt_model_params(m), 0, sizeof(float) * mt_model_num_params(m));
    mt_model_params_updated(m);
    const int T1 = cfg->training.seq_length + 1;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * T1);
    if (!tok) return mt_err_set(err, MT_ENOMEM, "out of memory");
    for (int i = 0; i < B * T1; i++) tok[i] = (int32_t)((i * 7919u + 13u) % (unsigned)cfg->model.vocab_size);
    w_base = m->work;
    w_bytes = mt_dtype_size(m->wdt) * m->nparams;
    act_bytes = weight_bytes = passes = 0;
    struct mt_model_stats st;
    int rc = mt_model_forward(m, tok, B, &st, err);
    *act = act_bytes, *wt = weight_bytes, *np = passes;
    w_base = NULL;
    free(tok);
    mt_model_destroy(m);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE.nml [group%%key=value ...]\n", argv[0]);
        return 2;
    }
    cpu = mt_kernels_cpu();
    counting = *cpu;
    counting.name = "count";
    counting.op.gemm = c_gemm;
    counting.op.grouped_gemm = c_grouped_gemm;
    counting.op.embedding_fwd = c_embedding_fwd;
    counting.op.rmsnorm_fwd = c_rmsnorm_fwd;
    counting.op.rope_fwd = c_rope_fwd;
    counting.op.attention_fwd = c_attention_fwd;
    counting.op.swiglu_fwd = c_swiglu_fwd;
    counting.op.add = c_add;
    counting.op.router_fwd = c_router_fwd;
    counting.op.aux_counts = c_aux_counts;
    counting.op.aux_loss_fwd = c_aux_loss_fwd;
    counting.op.z_loss_fwd = c_z_loss_fwd;
    counting.op.permute_fwd = c_permute_fwd;
    counting.op.unpermute_fwd = c_unpermute_fwd;
    counting.op.cross_entropy_fwd = c_cross_entropy_fwd;
    counting.op.bf16_round = c_bf16_round;
    counting.op.convert = c_convert;

    struct mt_err err = {0};
    /* n and 2n layers, all MoE: n covers the namelist's layer_freq (an override sets its
     * first entries and keeps the rest) */
    struct mt_config base;
    mt_config_defaults(&base);
    if (mt_config_load(&base, 1, &argv[1], argc - 2, argv + 2, &err)) {
        fprintf(stderr, "bytes_moved: %s\n", err.msg);
        return 1;
    }
    const int n1 = base.moe.layer_freq_len > 1 ? base.moe.layer_freq_len : 1;
    double r[2][3][2]; /* [storage][act, weights, passes][n1 layers, 2 n1 layers] */
    int tokens = 0;
    for (int s = 0; s < 2; s++) {
        if (s == 1) setenv("MT_DEBUG_FP32_ACTIVATIONS", "1", 1);
        for (int i = 0; i < 2; i++) {
            const int L = n1 * (i + 1);
            struct mt_config cfg;
            mt_config_defaults(&cfg);
            char *ovr[argc + 3];
            int n = 0;
            for (int j = 2; j < argc; j++) ovr[n++] = argv[j];
            char layers[64], freq[2 * MT_MAX_LAYERS + 32], dtype[64] = "precision%params_dtype='bf16'";
            snprintf(layers, sizeof layers, "model%%num_layers=%d", L);
            int at = snprintf(freq, sizeof freq, "moe%%layer_freq=1");
            for (int j = 1; j < L; j++) at += snprintf(freq + at, sizeof freq - (size_t)at, ",1");
            ovr[n++] = layers;
            ovr[n++] = freq;
            ovr[n++] = dtype;
            struct mt_layout lay;
            if (mt_config_load(&cfg, 1, &argv[1], n, ovr, &err) ||
                mt_config_resolve(&cfg, 1, &lay, &err) ||
                forward_bytes(&cfg, &r[s][0][i], &r[s][1][i], &r[s][2][i], &err)) {
                fprintf(stderr, "bytes_moved: %s\n", err.msg);
                return 1;
            }
            tokens = cfg.training.micro_batch_size * cfg.training.seq_length;
        }
    }
    unsetenv("MT_DEBUG_FP32_ACTIVATIONS");
    printf("one decoder layer's forward, %d tokens (bytes written and read, from the op table's "
           "arguments):\n", tokens);
    const char *name[2] = {"bf16 storage (producers write bf16)",
                           "fp32 storage rounded in place (before)"};
    for (int s = 0; s < 2; s++) {
        const double a = (r[s][0][1] - r[s][0][0]) / n1, w = (r[s][1][1] - r[s][1][0]) / n1,
                     p = (r[s][2][1] - r[s][2][0]) / n1;
        printf("  %-40s activations %.1f MB (%.0f bytes/token) | weights %.1f MB | rounding passes %.0f\n",
               name[s], a / 1e6, a / tokens, w / 1e6, p);
    }
    const double a0 = r[1][0][1] - r[1][0][0], a1 = r[0][0][1] - r[0][0][0]; /* per n1 layers */
    printf("  activation bytes: %.2fx fewer with bf16 storage\n", a0 / a1);
    return 0;
}

/* Qwen3-MoE forward and backward passes, written once against struct mt_kernels.
 * Shapes: N = B*T tokens, H hidden, Q = heads*head_dim, KV = groups*head_dim,
 * E experts, k = top-k, R permuted rows, Fe/Fs/F expert/shared/dense widths. */
#include "model/model_internal.h"

#include <stdlib.h>
#include <string.h>

struct pass {
    struct mt_model *m;
    const struct mt_kernel_ops *o;
    void *ctx;
    int B, N;
    bool train;
    float scale;             /* loss_scale */
    struct mt_model_stats *st;
};

/* Rounds a stored activation to bf16 (no-op in fp32). */
static void rnd(const struct pass *p, float *x, size_t n)
{
    if (p->m->bf16) p->o->bf16_round(p->ctx, x, x, n);
}

static float *W(const struct pass *p, int tensor) { return mt_model_view(p->m->work, p->m, tensor); }
static float *G(const struct pass *p, int tensor) { return mt_model_view(p->m->grads, p->m, tensor); }

// out (N,dout) = in (N,din) W^T, W is (dout,din)
static void linear_fwd(const struct pass *p, float *out, const float *in, const float *w, int N,
                       int dout, int din)
{
    p->o->gemm(p->ctx, false, true, N, dout, din, 1.0f, in, din, w, din, 0.0f, out, dout);
}

// din (N,din) = beta din + dout W; dw (dout,din) += dout^T in
static void linear_bwd(const struct pass *p, float *din, float beta, float *dw, const float *dout,
                       const float *in, const float *w, int N, int d_out, int d_in)
{
    p->o->gemm(p->ctx, false, false, N, d_in, d_out, 1.0f, dout, d_out, w, d_in, beta, din, d_in);
    p->o->gemm(p->ctx, true, false, d_out, d_in, N, 1.0f, dout, d_out, in, d_in, 1.0f, dw, d_in);
}

/* SwiGLU MLP on N rows: act = silu(x Wg^T) * (x Wu^T); out = act Wd^T. */
static void mlp_fwd(const struct pass *p, float *out, const float *x, const float *wg,
                    const float *wu, const float *wd, float *gate, float *up, float *act, int N,
                    int F)
{
    const int H = p->m->H;
    linear_fwd(p, gate, x, wg, N, F, H);
    rnd(p, gate, (size_t)N * F);
    linear_fwd(p, up, x, wu, N, F, H);
    rnd(p, up, (size_t)N * F);
    p->o->swiglu_fwd(p->ctx, act, gate, up, N, F);
    rnd(p, act, (size_t)N * F);
    linear_fwd(p, out, act, wd, N, H, F);
    rnd(p, out, (size_t)N * H);
}

// dx (N,H) = beta dx + d(x); weight grads +=; dout (N,H)
static void mlp_bwd(const struct pass *p, float *dx, float beta, const float *dout, const float *x,
                    const float *gate, const float *up, const float *act, int N, int F,
                    const float *wg, const float *wu, const float *wd, float *gg, float *gu,
                    float *gd)
{
    struct mt_model *m = p->m;
    const int H = m->H;
    float *dact = m->d_f1, *dgate = m->d_f2, *dup = m->d_f3;
    linear_bwd(p, dact, 0.0f, gd, dout, act, wd, N, H, F);
    p->o->swiglu_bwd(p->ctx, dgate, dup, dact, gate, up, N, F);
    linear_bwd(p, dx, beta, gg, dgate, x, wg, N, F, H);
    linear_bwd(p, dx, 1.0f, gu, dup, x, wu, N, F, H);
}

/* ------------------------------------------------------------ attention */

static void attention_fwd(const struct pass *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    const int N = p->N, H = m->H, Q = m->Q, KV = m->KV;
    p->o->rmsnorm_fwd(p->ctx, a->ln1, a->ln1_rstd, m->res[l], W(p, t->ln1), N, H, m->eps);
    rnd(p, a->ln1, (size_t)N * H);
    linear_fwd(p, a->q, a->ln1, W(p, t->wq), N, Q, H);
    rnd(p, a->q, (size_t)N * Q);
    linear_fwd(p, a->k, a->ln1, W(p, t->wk), N, KV, H);
    rnd(p, a->k, (size_t)N * KV);
    linear_fwd(p, a->v, a->ln1, W(p, t->wv), N, KV, H);
    rnd(p, a->v, (size_t)N * KV);
    if (m->qk_norm) { /* per-head RMSNorm over head_dim, before RoPE */
        p->o->rmsnorm_fwd(p->ctx, a->qr, a->q_rstd, a->q, W(p, t->q_norm), N * m->nh, m->hd, m->eps);
        rnd(p, a->qr, (size_t)N * Q);
        p->o->rmsnorm_fwd(p->ctx, a->kr, a->k_rstd, a->k, W(p, t->k_norm), N * m->ng, m->hd, m->eps);
        rnd(p, a->kr, (size_t)N * KV);
    } else {
        p->o->copy(p->ctx, a->qr, a->q, sizeof(float) * (size_t)N * Q);
        p->o->copy(p->ctx, a->kr, a->k, sizeof(float) * (size_t)N * KV);
    }
    p->o->rope_fwd(p->ctx, a->qr, a->qr, p->B, m->T, m->nh, m->hd, m->theta);
    rnd(p, a->qr, (size_t)N * Q);
    p->o->rope_fwd(p->ctx, a->kr, a->kr, p->B, m->T, m->ng, m->hd, m->theta);
    rnd(p, a->kr, (size_t)N * KV);
    p->o->attention_fwd(p->ctx, a->y, a->att, a->qr, a->kr, a->v, p->B, m->T, m->nh, m->ng, m->hd);
    rnd(p, a->y, (size_t)N * Q);
    linear_fwd(p, m->tmp, a->y, W(p, t->wo), N, H, Q);
    rnd(p, m->tmp, (size_t)N * H);
    p->o->add(p->ctx, a->res_mid, m->res[l], m->tmp, (size_t)N * H);
    rnd(p, a->res_mid, (size_t)N * H);
}

/* d_res (N,H): in, the gradient of res_mid; out, the gradient of res[l]. */
static void attention_bwd(const struct pass *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    const int N = p->N, H = m->H, Q = m->Q, KV = m->KV;
    linear_bwd(p, m->dy, 0.0f, G(p, t->wo), m->d_res, a->y, W(p, t->wo), N, H, Q);
    p->o->attention_bwd(p->ctx, m->dq, m->dk, m->dv, m->dy, a->qr, a->kr, a->v, a->att, p->B, m->T,
                        m->nh, m->ng, m->hd);
    p->o->rope_bwd(p->ctx, m->dq, m->dq, p->B, m->T, m->nh, m->hd, m->theta);
    p->o->rope_bwd(p->ctx, m->dk, m->dk, p->B, m->T, m->ng, m->hd, m->theta);
    float *dq = m->dq, *dk = m->dk;
    if (m->qk_norm) {
        p->o->memset(p->ctx, m->dq2, 0, sizeof(float) * (size_t)N * Q);
        p->o->memset(p->ctx, m->dk2, 0, sizeof(float) * (size_t)N * KV);
        p->o->rmsnorm_bwd(p->ctx, m->dq2, G(p, t->q_norm), m->dq, a->q, W(p, t->q_norm), a->q_rstd,
                          N * m->nh, m->hd);
        p->o->rmsnorm_bwd(p->ctx, m->dk2, G(p, t->k_norm), m->dk, a->k, W(p, t->k_norm), a->k_rstd,
                          N * m->ng, m->hd);
        dq = m->dq2;
        dk = m->dk2;
    }
    linear_bwd(p, m->d_ln, 0.0f, G(p, t->wq), dq, a->ln1, W(p, t->wq), N, Q, H);
    linear_bwd(p, m->d_ln, 1.0f, G(p, t->wk), dk, a->ln1, W(p, t->wk), N, KV, H);
    linear_bwd(p, m->d_ln, 1.0f, G(p, t->wv), m->dv, a->ln1, W(p, t->wv), N, KV, H);
    p->o->rmsnorm_bwd(p->ctx, m->d_res, G(p, t->ln1), m->d_ln, m->res[l], W(p, t->ln1), a->ln1_rstd,
                      N, H);
}

/* ------------------------------------------------------------ MoE */

/* Benchmark mode (moe%router_force_load_balancing): Megatron replaces the router
 * logits by random ones through a straight-through estimator. Here the replacement
 * is deterministic: token n gets logit 0 for experts (n*k + j) mod E, j < k, and -1
 * elsewhere, so the assignments go round-robin and every expert receives N*k/E (+-1)
 * tokens; the gradient passes straight through to the real logits, as in Megatron. */
static void force_logits(const struct pass *p, float *logits)
{
    const struct mt_model *m = p->m;
    const int E = m->E, k = m->topk;
    float *host = malloc(sizeof(float) * (size_t)p->N * E);
    if (!host) abort(); /* (N,E) floats, no larger than the logits themselves */
    for (int n = 0; n < p->N; n++) {
        for (int e = 0; e < E; e++) host[(size_t)n * E + e] = -1.0f;
        for (int j = 0; j < k; j++) host[(size_t)n * E + ((size_t)n * k + j) % E] = 0.0f;
    }
    p->o->copy(p->ctx, logits, host, sizeof(float) * (size_t)p->N * E);
    free(host);
}

static void moe_fwd(const struct pass *p, int l, float *out)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    const int N = p->N, H = m->H, E = m->E, k = m->topk, moe = m->moe_of_layer[l];
    struct mt_router_args ra = m->router;
    ra.num_tokens = N;

    linear_fwd(p, a->logits, a->ln2, W(p, t->router), N, E, H); /* fp32 router */
    if (m->force_balance) force_logits(p, a->logits);
    if (m->z_coeff > 0.0f) {
        float z;
        p->o->z_loss_fwd(p->ctx, &z, a->z_lse, a->logits, N, E, m->z_coeff);
        p->st->z_loss += z;
    }
    if (a->aux_counts) {
        float aux;
        int seqs = m->balance == MT_BALANCE_SEQ_AUX ? p->B : 1;
        p->o->aux_loss_fwd(p->ctx, &aux, a->aux_counts, a->logits, N, E, k, ra.score_fn, seqs,
                           m->aux_coeff);
        p->st->aux_loss += aux;
    }
    p->o->router_fwd(p->ctx, &ra, a->logits, m->expert_bias_on ? m->expert_bias + (size_t)moe * E : NULL,
                     a->topk_idx, a->topk_prob);
    int cap = mt_model_capacity(m, N);
    p->st->dropped_tokens += p->o->dispatch_plan(p->ctx, &a->plan, a->topk_idx, a->topk_prob, N, E,
                                                 k, cap, m->drop_policy, m->pad_to_capacity);
    int32_t rows;
    p->o->copy(p->ctx, &rows, a->plan.offsets + E, sizeof rows);
    a->rows = rows;
    if (p->train) {
        p->o->copy(p->ctx, m->host_kept, a->plan.kept, sizeof(int64_t) * (size_t)E);
        for (int e = 0; e < E; e++) m->expert_counts[(size_t)moe * E + e] += m->host_kept[e];
    }

    /* routed experts: permute -> grouped SwiGLU -> unpermute weighted by probs */
    const int Fe = m->Fe;
    const int32_t *offs = a->plan.offsets;
    p->o->permute_fwd(p->ctx, a->xp, a->ln2, a->plan.row_slot, rows, k, H);
    p->o->grouped_gemm(p->ctx, false, true, E, offs, 0, Fe, H, 1.0f, a->xp, W(p, t->exp_gate), 0.0f, a->eg);
    rnd(p, a->eg, (size_t)rows * Fe);
    p->o->grouped_gemm(p->ctx, false, true, E, offs, 0, Fe, H, 1.0f, a->xp, W(p, t->exp_up), 0.0f, a->eu);
    rnd(p, a->eu, (size_t)rows * Fe);
    p->o->swiglu_fwd(p->ctx, a->ea, a->eg, a->eu, rows, Fe);
    rnd(p, a->ea, (size_t)rows * Fe);
    p->o->grouped_gemm(p->ctx, false, true, E, offs, 0, H, Fe, 1.0f, a->ea, W(p, t->exp_down), 0.0f, a->ey);
    rnd(p, a->ey, (size_t)rows * H);
    p->o->unpermute_fwd(p->ctx, out, a->ey, a->plan.slot_row, a->topk_prob, N, k, H);
    rnd(p, out, (size_t)N * H);
    if (m->Fs > 0) { /* shared expert on every token, added without a gate */
        mlp_fwd(p, m->tmp2, a->ln2, W(p, t->sh_gate), W(p, t->sh_up), W(p, t->sh_down), a->sg, a->su,
                a->sa, N, m->Fs);
        p->o->add(p->ctx, out, out, m->tmp2, (size_t)N * H);
        rnd(p, out, (size_t)N * H);
    }
}

/* dout = d_res (N,H), the gradient of the MoE output; writes d_ln, the gradient of ln2. */
static void moe_bwd(const struct pass *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    const int N = p->N, H = m->H, E = m->E, k = m->topk, Fe = m->Fe, rows = a->rows;
    const int32_t *offs = a->plan.offsets;
    const float *dout = m->d_res;
    struct mt_router_args ra = m->router;
    ra.num_tokens = N;

    if (m->Fs > 0)
        mlp_bwd(p, m->d_ln, 0.0f, dout, a->ln2, a->sg, a->su, a->sa, N, m->Fs, W(p, t->sh_gate),
                W(p, t->sh_up), W(p, t->sh_down), G(p, t->sh_gate), G(p, t->sh_up), G(p, t->sh_down));
    else
        p->o->memset(p->ctx, m->d_ln, 0, sizeof(float) * (size_t)N * H);

    float *dyp = m->d_rows, *dxp = m->d_rows2, *dea = m->d_f1, *deg = m->d_f2, *deu = m->d_f3;
    p->o->unpermute_bwd(p->ctx, dyp, m->d_prob, dout, a->ey, a->plan.slot_row, a->topk_prob, N, k, H,
                        rows);
    /* down: ey = ea Wd^T per expert, slabs (H,Fe) */
    p->o->grouped_gemm(p->ctx, false, false, E, offs, 0, Fe, H, 1.0f, dyp, W(p, t->exp_down), 0.0f, dea);
    p->o->grouped_gemm(p->ctx, true, false, E, offs, H, Fe, 0, 1.0f, dyp, a->ea, 1.0f, G(p, t->exp_down));
    p->o->swiglu_bwd(p->ctx, deg, deu, dea, a->eg, a->eu, rows, Fe);
    /* gate, up: slabs (Fe,H) */
    p->o->grouped_gemm(p->ctx, false, false, E, offs, 0, H, Fe, 1.0f, deg, W(p, t->exp_gate), 0.0f, dxp);
    p->o->grouped_gemm(p->ctx, false, false, E, offs, 0, H, Fe, 1.0f, deu, W(p, t->exp_up), 1.0f, dxp);
    p->o->grouped_gemm(p->ctx, true, false, E, offs, Fe, H, 0, 1.0f, deg, a->xp, 1.0f, G(p, t->exp_gate));
    p->o->grouped_gemm(p->ctx, true, false, E, offs, Fe, H, 0, 1.0f, deu, a->xp, 1.0f, G(p, t->exp_up));
    p->o->permute_bwd(p->ctx, m->d_ln, dxp, a->plan.slot_row, N, k, H);

    /* router: routing weights, balancing loss, z-loss; forced logits pass straight through */
    p->o->memset(p->ctx, m->d_logits, 0, sizeof(float) * (size_t)N * E);
    p->o->router_bwd(p->ctx, &ra, m->d_logits, m->d_prob, a->logits, a->topk_idx);
    if (a->aux_counts) {
        int seqs = m->balance == MT_BALANCE_SEQ_AUX ? p->B : 1;
        p->o->aux_loss_bwd(p->ctx, m->d_logits, p->scale, a->aux_counts, a->logits, N, E, ra.score_fn,
                           seqs, k, m->aux_coeff);
    }
    if (m->z_coeff > 0.0f)
        p->o->z_loss_bwd(p->ctx, m->d_logits, p->scale, a->z_lse, a->logits, N, E, m->z_coeff);
    linear_bwd(p, m->d_ln, 1.0f, G(p, t->router), m->d_logits, a->ln2, W(p, t->router), N, E, H);
}

/* ------------------------------------------------------------ layers */

static void mlp_block_fwd(const struct pass *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    const int N = p->N, H = m->H;
    p->o->rmsnorm_fwd(p->ctx, a->ln2, a->ln2_rstd, a->res_mid, W(p, t->ln2), N, H, m->eps);
    rnd(p, a->ln2, (size_t)N * H);
    if (m->moe_of_layer[l] >= 0)
        moe_fwd(p, l, m->tmp);
    else
        mlp_fwd(p, m->tmp, a->ln2, W(p, t->gate), W(p, t->up), W(p, t->down), a->gate, a->up, a->act,
                N, m->F);
    p->o->add(p->ctx, m->res[l + 1], a->res_mid, m->tmp, (size_t)N * H);
    rnd(p, m->res[l + 1], (size_t)N * H);
}

/* d_res (N,H): in, the gradient of res[l+1]; out, the gradient of res_mid. */
static void mlp_block_bwd(const struct pass *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    const int N = p->N, H = m->H;
    if (m->moe_of_layer[l] >= 0)
        moe_bwd(p, l);
    else
        mlp_bwd(p, m->d_ln, 0.0f, m->d_res, a->ln2, a->gate, a->up, a->act, N, m->F, W(p, t->gate),
                W(p, t->up), W(p, t->down), G(p, t->gate), G(p, t->up), G(p, t->down));
    p->o->rmsnorm_bwd(p->ctx, m->d_res, G(p, t->ln2), m->d_ln, a->res_mid, W(p, t->ln2), a->ln2_rstd,
                      N, H);
}

/* ------------------------------------------------------------ the whole model */

static int stage_tokens(struct mt_model *m, const int32_t *tokens, int B, long long *valid,
                        struct mt_err *err)
{
    const int T = m->T;
    int32_t *in = m->host_tokens, *tg = m->host_tokens + (size_t)B * T;
    long long count = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int32_t x = tokens[(size_t)b * (T + 1) + t], y = tokens[(size_t)b * (T + 1) + t + 1];
            if (x < 0 || x >= m->V)
                return mt_err_set(err, MT_EINVAL, "model: input token %d at [%d][%d] is outside [0, %d)",
                                  x, b, t, m->V);
            if (y >= m->V)
                return mt_err_set(err, MT_EINVAL, "model: target token %d at [%d][%d] is outside [0, %d)",
                                  y, b, t + 1, m->V);
            in[(size_t)b * T + t] = x;
            tg[(size_t)b * T + t] = y < 0 ? -1 : y;
            count += y >= 0;
        }
    m->k->op.copy(m->k->ctx, m->inputs, in, sizeof(int32_t) * (size_t)B * T);
    m->k->op.copy(m->k->ctx, m->targets, tg, sizeof(int32_t) * (size_t)B * T);
    *valid = count;
    return MT_OK;
}

int mt_model_run(struct mt_model *m, const int32_t *tokens, int B, bool backward, float loss_scale,
                 struct mt_model_stats *st, struct mt_err *err)
{
    if (B < 1 || B > m->Bmax)
        return mt_err_set(err, MT_EINVAL, "model: micro batch %d is outside [1, %d] (max_micro_batch)",
                          B, m->Bmax);
    struct mt_model_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    long long valid = 0;
    MT_CHECK(stage_tokens(m, tokens, B, &valid, err));
    struct pass p = {m, &m->k->op, m->k->ctx, B, B * m->T, backward, loss_scale, st};
    const int N = p.N, H = m->H, V = m->V;

    /* forward */
    p.o->embedding_fwd(p.ctx, m->res[0], m->inputs, W(&p, m->embed), N, H);
    for (int l = 0; l < m->L; l++) {
        attention_fwd(&p, l);
        mlp_block_fwd(&p, l);
    }
    p.o->rmsnorm_fwd(p.ctx, m->lnf, m->lnf_rstd, m->res[m->L], W(&p, m->final_norm), N, H, m->eps);
    rnd(&p, m->lnf, (size_t)N * H);
    linear_fwd(&p, m->lm_logits, m->lnf, W(&p, m->lm_head), N, V, H);
    rnd(&p, m->lm_logits, (size_t)N * V);
    p.o->cross_entropy_fwd(p.ctx, m->ce_loss, m->ce_lse, m->lm_logits, m->targets, N, V);
    float *host_loss = malloc(sizeof(float) * (size_t)N);
    if (!host_loss) return mt_err_set(err, MT_ENOMEM, "model: out of memory");
    p.o->copy(p.ctx, host_loss, m->ce_loss, sizeof(float) * (size_t)N);
    double sum = 0.0;
    for (int n = 0; n < N; n++) sum += host_loss[n];
    free(host_loss);
    st->tokens = valid;
    st->lm_loss = valid > 0 ? sum / (double)valid : 0.0;
    if (!backward) return MT_OK;

    /* backward: d_res carries the gradient of the residual stream down the layers */
    float ce_scale = valid > 0 ? loss_scale / (float)valid : 0.0f;
    float *dlogits = m->lm_logits; /* in place */
    p.o->cross_entropy_bwd(p.ctx, dlogits, m->lm_logits, m->ce_lse, m->targets, N, V, ce_scale);
    linear_bwd(&p, m->d_ln, 0.0f, G(&p, m->lm_head), dlogits, m->lnf, W(&p, m->lm_head), N, V, H);
    p.o->memset(p.ctx, m->d_res, 0, sizeof(float) * (size_t)N * H);
    p.o->rmsnorm_bwd(p.ctx, m->d_res, G(&p, m->final_norm), m->d_ln, m->res[m->L],
                     W(&p, m->final_norm), m->lnf_rstd, N, H);
    for (int l = m->L - 1; l >= 0; l--) {
        mlp_block_bwd(&p, l);
        attention_bwd(&p, l);
    }
    p.o->embedding_bwd(p.ctx, G(&p, m->embed), m->d_res, m->inputs, N, H);
    return MT_OK;
}

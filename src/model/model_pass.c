/* Qwen3-MoE forward and backward passes, written once against struct mt_kernels.
 * Shapes: N = B*T tokens of the micro-batch, Nl = N/tp this rank's sequence-parallel
 * part, H hidden, Q_l = heads_l*head_dim, KV_l = groups_l*head_dim (this rank's heads),
 * F_l the dense MLP's shard, V_l the vocabulary shard.
 *
 * Tensor parallelism with sequence parallelism (Megatron's layout): the residual stream
 * and the RMSNorms hold Nl tokens; before a column-parallel linear (q/k/v, gate/up, LM
 * head) the normed tokens are all-gathered over the TP group; after a row-parallel
 * linear (o_proj, down_proj) and after the vocabulary-parallel embedding the partial
 * sums are reduce-scattered back to Nl tokens. The backward mirrors it. With tp = 1
 * every gathered buffer is the local one and no collective runs. */
#include "model/model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct mt_pass pass_t;

/* Rounds an fp32-stored activation to bf16 in place: only in bf16 training on fp32
 * storage (MT_DEBUG_FP32_ACTIVATIONS, the reference of tests/model/bf16_storage.sh);
 * with bf16 storage the producers write bf16 and this does nothing. */
void mt_pass_round(const pass_t *p, void *x, size_t n)
{
    if (p->m->round_in_place) p->o->bf16_round(p->ctx, x, x, n);
}

enum mt_dt mt_pass_act_dt(const pass_t *p) { return p->m->adt == MT_BF16 ? MT_DT_BF16 : MT_DT_F32; }

static struct mt_tensor W(const pass_t *p, int tensor) { return mt_model_weight(p->m, tensor); }
static float *G(const pass_t *p, int tensor) { return mt_model_view(p->m->grads, p->m, tensor); }
static struct mt_tensor ACT(const pass_t *p, const void *x, int64_t rows, int64_t cols)
{
    return mt_pass_act(p, x, rows, cols);
}
static struct mt_tensor F32(const float *x, int64_t rows, int64_t cols) { return mt_f32(x, rows, cols); }

// out (N,dout) = in (N,din) W^T, W is (dout,din)
void mt_pass_linear_fwd(const pass_t *p, struct mt_tensor out, struct mt_tensor in,
                        struct mt_tensor w, int N, int dout, int din)
{
    p->o->gemm(p->ctx, false, true, N, dout, din, 1.0f, in, w, 0.0f, out);
}

// din (N,din) = beta din + dout W; dw (dout,din) += dout^T in
void mt_pass_linear_bwd(const pass_t *p, float *din, float beta, float *dw, const float *dout,
                        struct mt_tensor in, struct mt_tensor w, int N, int d_out, int d_in)
{
    p->o->gemm(p->ctx, false, false, N, d_in, d_out, 1.0f, F32(dout, N, d_out), w, beta,
               F32(din, N, d_in));
    p->o->gemm(p->ctx, true, false, d_out, d_in, N, 1.0f, F32(dout, N, d_out), in, 1.0f,
               F32(dw, d_out, d_in));
}

/* SwiGLU MLP on N rows: act = silu(x Wg^T) * (x Wu^T); out = act Wd^T (not rounded:
 * with TP it is a partial sum, rounded by the caller once reduced). */
int mt_pass_mlp_act_fwd(const pass_t *p, const void *x, int wg, int wu, int wd, void *gate, void *up,
                        void *act, int N, int F)
{
    const int H = p->m->H;
    MT_CHECK(mt_pass_qlinear_fwd(p, wg, ACT(p, gate, N, F), ACT(p, x, N, H), N, F, H));
    mt_pass_round(p, gate, (size_t)N * F);
    MT_CHECK(mt_pass_qlinear_fwd(p, wu, ACT(p, up, N, F), ACT(p, x, N, H), N, F, H));
    mt_pass_round(p, up, (size_t)N * F);
    mt_pass_swiglu_qfwd(p, wd, ACT(p, act, N, F), ACT(p, gate, N, F), ACT(p, up, N, F), N, F);
    mt_pass_round(p, act, (size_t)N * F);
    return MT_OK;
}

int mt_pass_mlp_fwd(const pass_t *p, struct mt_tensor out, const void *x, int wg, int wu, int wd,
                    void *gate, void *up, void *act, int N, int F)
{
    MT_CHECK(mt_pass_mlp_act_fwd(p, x, wg, wu, wd, gate, up, act, N, F));
    return mt_pass_qlinear_fwd(p, wd, out, ACT(p, act, N, F), N, p->m->H, F);
}

// dx (N,H) = beta dx + d(x) through gate; dup (N,F) up's output gradient, for
// mt_pass_mlp_bwd_up; weight grads of wd and wg +=; dout (N,H)
int mt_pass_mlp_bwd_gate(const pass_t *p, float *dx, float beta, float *dup, const float *dout,
                         const void *x, const void *gate, const void *up, const void *act, int N,
                         int F, int wg, int wd)
{
    struct mt_model *m = p->m;
    const int H = m->H;
    float *dact = m->d_f1, *dgate = m->d_f2;
    MT_CHECK(mt_pass_qlinear_bwd(p, wd, dact, 0.0f, dout, ACT(p, act, N, F), N, H, F));
    p->o->swiglu_bwd(p->ctx, dgate, dup, dact, ACT(p, gate, N, F), ACT(p, up, N, F), N, F);
    return mt_pass_qlinear_bwd(p, wg, dx, beta, dgate, ACT(p, x, N, H), N, F, H);
}

// dx (N,H) += dup Wu; wu's weight grad +=
int mt_pass_mlp_bwd_up(const pass_t *p, float *dx, const float *dup, const void *x, int N, int F,
                       int wu)
{
    return mt_pass_qlinear_bwd(p, wu, dx, 1.0f, dup, ACT(p, x, N, p->m->H), N, F, p->m->H);
}

// dx (N,H) = beta dx + d(x); weight grads +=; dout (N,H)
int mt_pass_mlp_bwd(const pass_t *p, float *dx, float beta, const float *dout, const void *x,
                    const void *gate, const void *up, const void *act, int N, int F, int wg,
                    int wu, int wd)
{
    float *dup = p->m->d_f3;
    MT_CHECK(mt_pass_mlp_bwd_gate(p, dx, beta, dup, dout, x, gate, up, act, N, F, wg, wd));
    return mt_pass_mlp_bwd_up(p, dx, dup, x, N, F, wu);
}

int mt_pass_sp_gather(const pass_t *p, void *full, const void *local, int C, enum mt_dt dt)
{
    if (p->m->sc.tp == 1) return MT_OK;
    return mt_all_gather(p->m->tp_comm, local, full, (size_t)p->Nl * C, dt, p->err);
}

int mt_pass_sp_reduce_scatter(const pass_t *p, float *local, const float *full, int C)
{
    if (p->m->sc.tp == 1) return MT_OK;
    return mt_reduce_scatter(p->m->tp_comm, full, local, (size_t)p->Nl * C, MT_DT_F32, MT_OP_SUM,
                             p->err);
}

/* The buffer a gathered (N,C) tensor lives in: full with TP, the local one without. */
static float *full_or(const pass_t *p, float *full, float *local)
{
    return p->m->sc.tp > 1 ? full : local;
}

/* A row-parallel linear's (N,H) output: partial sums over TP in fp32 full, reduced to
 * (Nl,H) in fp32 tmp, then stored in the activation dtype in out; with tp = 1 the
 * linear writes out directly (rowpar_dst), and rowpar_finish only rounds in the
 * reference mode. out == tmp when activations are fp32. */
struct mt_tensor mt_pass_rowpar_dst(const pass_t *p, float *full, void *out)
{
    return p->m->sc.tp > 1 ? F32(full, p->N, p->m->H) : ACT(p, out, p->Nl, p->m->H);
}

int mt_pass_rowpar_finish(const pass_t *p, float *full, float *tmp, void *out)
{
    const int Nl = p->Nl, H = p->m->H;
    if (p->m->sc.tp > 1) {
        MT_CHECK(mt_pass_sp_reduce_scatter(p, tmp, full, H));
        if (out != tmp) p->o->convert(p->ctx, ACT(p, out, Nl, H), F32(tmp, Nl, H));
    }
    mt_pass_round(p, out, (size_t)Nl * H);
    return MT_OK;
}

/* The pass that rebuilds, in backward, what forward did not keep (&recompute): the
 * same forward code, without its side effects. */
static pass_t rebuild_pass(const pass_t *p)
{
    pass_t r = *p;
    r.recompute = true;
    return r;
}

/* ------------------------------------------------------------ attention */

/* ln1 (Nl,H) and its statistics = RMSNorm of res[l]; ln1_full its TP gather. fwd: the
 * q, k and v projections' forward reads ln1 next (not a rebuild for backward), where
 * it is not gathered: the norm emits its quantisation for them. */
static int ln1_fwd(const pass_t *p, int l, bool fwd)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const int Nl = p->Nl, H = m->H;
    mt_pass_rmsnorm_qfwd(p, fwd && a->ln1_full == a->ln1 ? m->lt[l].wq : MT_NO_TENSOR, ACT(p, a->ln1, Nl, H),
                         a->ln1_rstd, ACT(p, m->res[l], Nl, H), W(p, m->lt[l].ln1), Nl, H, m->eps);
    mt_pass_round(p, a->ln1, (size_t)Nl * H);
    return mt_pass_sp_gather(p, a->ln1_full, a->ln1, H, mt_pass_act_dt(p));
}

/* The attention core: att_out (fp32) and att_lse from the rotated q, k and v, and y,
 * att_out in the activation dtype for o_proj. */
static void core_attn_fwd(const pass_t *p, const struct mt_layer_acts *a)
{
    struct mt_model *m = p->m;
    const int N = p->N, Q = m->Q_l, KV = m->KV_l;
    p->o->attention_fwd(p->ctx, a->att_out, a->att_lse, ACT(p, a->qr, N, Q), ACT(p, a->kr, N, KV),
                        ACT(p, a->v, N, KV), p->B, m->T, m->nh_l, m->ng_l, m->hd);
    /* stored in y, not in place: attention_bwd needs the fp32 output it wrote */
    if (m->round_in_place) p->o->bf16_round(p->ctx, a->y, a->att_out, (size_t)N * Q);
    else if (m->bf16) p->o->convert(p->ctx, ACT(p, a->y, N, Q), F32(a->att_out, N, Q));
}

static int attention_core_fwd(const pass_t *p, int l);
static int attention_core_bwd(const pass_t *p, int l, const float *d_out, float *d_ln);

/* The signature of layer l's attention scopes: every buffer their ops read or write,
 * the recompute choice and the layer's weights. */
static uint64_t attn_sig(const pass_t *p, int l)
{
    const struct mt_model *m = p->m;
    const struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    return MT_GRAPH_SIG((uintptr_t)a->ln1_full, (uintptr_t)a->q, (uintptr_t)a->k, (uintptr_t)a->v,
                        (uintptr_t)a->q_rstd, (uintptr_t)a->k_rstd, (uintptr_t)a->qr,
                        (uintptr_t)a->kr, (uintptr_t)a->att_lse, (uintptr_t)a->att_out,
                        (uintptr_t)a->y, (uintptr_t)m->full, (uintptr_t)m->full2,
                        (uintptr_t)m->tmpb, (uintptr_t)m->d_res, (uintptr_t)m->d_ln,
                        (uintptr_t)m->dy, (uintptr_t)m->dq, (uintptr_t)m->dk, (uintptr_t)m->dv,
                        (uintptr_t)m->dq2, (uintptr_t)m->dk2, (uintptr_t)m->drop[l],
                        (uintptr_t)W(p, t->wq).data, (uintptr_t)W(p, t->wk).data,
                        (uintptr_t)W(p, t->wv).data, (uintptr_t)W(p, t->wo).data,
                        (uintptr_t)(m->qk_norm ? W(p, t->q_norm).data : NULL),
                        (uintptr_t)(m->qk_norm ? W(p, t->k_norm).data : NULL));
}

/* The signature of layer l's dense MLP scopes. */
static uint64_t mlp_sig(const pass_t *p, int l)
{
    const struct mt_model *m = p->m;
    const struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    return MT_GRAPH_SIG((uintptr_t)a->ln2_full, (uintptr_t)a->gate, (uintptr_t)a->up,
                        (uintptr_t)a->act, (uintptr_t)m->full, (uintptr_t)m->full2,
                        (uintptr_t)m->tmpb, (uintptr_t)m->d_res, (uintptr_t)m->d_ln,
                        (uintptr_t)m->d_f1, (uintptr_t)m->d_f2, (uintptr_t)m->d_f3,
                        (uintptr_t)W(p, t->gate).data, (uintptr_t)W(p, t->up).data,
                        (uintptr_t)W(p, t->down).data);
}

static int attention_fwd(const pass_t *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const int Nl = p->Nl, H = m->H;
    if (!p->recompute) mt_offload_acquire(p, l);
    MT_CHECK(ln1_fwd(p, l, true));
    /* &cuda_graph attn: from the projections to o_proj, between the TP collectives */
    bool run;
    MT_CHECK(mt_graph_begin(p, MT_GM_ATTN, l, 0, false, attn_sig(p, l), &run));
    if (run) MT_CHECK(attention_core_fwd(p, l));
    MT_CHECK(mt_graph_end(p));
    MT_CHECK(mt_pass_rowpar_finish(p, m->full, m->tmp, m->tmpb));
    const int64_t n = (int64_t)Nl * H;
    p->o->add(p->ctx, ACT(p, a->res_mid, 1, n), ACT(p, m->res[l], 1, n), ACT(p, m->tmpb, 1, n),
              (size_t)n);
    mt_pass_round(p, a->res_mid, (size_t)Nl * H);
    return MT_OK;
}

/* Attention from ln1_full to o_proj's output (in mt_pass_rowpar_dst): no collective. */
static int attention_core_fwd(const pass_t *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    const int N = p->N, H = m->H, Q = m->Q_l, KV = m->KV_l;
    MT_CHECK(mt_pass_qlinear_fwd(p, t->wq, ACT(p, a->q, N, Q), ACT(p, a->ln1_full, N, H), N, Q, H));
    mt_pass_round(p, a->q, (size_t)N * Q);
    MT_CHECK(mt_pass_qlinear_fwd(p, t->wk, ACT(p, a->k, N, KV), ACT(p, a->ln1_full, N, H), N, KV, H));
    mt_pass_round(p, a->k, (size_t)N * KV);
    MT_CHECK(mt_pass_qlinear_fwd(p, t->wv, ACT(p, a->v, N, KV), ACT(p, a->ln1_full, N, H), N, KV, H));
    mt_pass_round(p, a->v, (size_t)N * KV);
    if (m->qk_norm) { /* per-head RMSNorm over head_dim, before RoPE */
        const int nq = N * m->nh_l, nk = N * m->ng_l, hd = m->hd;
        p->o->rmsnorm_fwd(p->ctx, ACT(p, a->qr, nq, hd), a->q_rstd, ACT(p, a->q, nq, hd),
                          W(p, t->q_norm), nq, hd, m->eps);
        mt_pass_round(p, a->qr, (size_t)N * Q);
        p->o->rmsnorm_fwd(p->ctx, ACT(p, a->kr, nk, hd), a->k_rstd, ACT(p, a->k, nk, hd),
                          W(p, t->k_norm), nk, hd, m->eps);
        mt_pass_round(p, a->kr, (size_t)N * KV);
    } else {
        p->o->copy(p->ctx, a->qr, a->q, mt_dtype_size(m->adt) * (size_t)N * Q);
        p->o->copy(p->ctx, a->kr, a->k, mt_dtype_size(m->adt) * (size_t)N * KV);
    }
    p->o->rope_fwd(p->ctx, ACT(p, a->qr, N, Q), ACT(p, a->qr, N, Q), p->B, m->T, m->nh_l, m->hd,
                   m->theta);
    mt_pass_round(p, a->qr, (size_t)N * Q);
    p->o->rope_fwd(p->ctx, ACT(p, a->kr, N, KV), ACT(p, a->kr, N, KV), p->B, m->T, m->ng_l, m->hd,
                   m->theta);
    mt_pass_round(p, a->kr, (size_t)N * KV);
    core_attn_fwd(p, a);
    MT_CHECK(mt_pass_qlinear_fwd(p, t->wo, mt_pass_rowpar_dst(p, m->full, m->tmpb), ACT(p, a->y, N, Q), N,
                        H, Q)); /* row-parallel */
    return MT_OK;
}

/* d_res (Nl,H): in, the gradient of res_mid; out, the gradient of res[l]. */
static int attention_bwd(const pass_t *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    const int Nl = p->Nl, H = m->H;
    /* selective recompute: what forward did not keep, rebuilt before its first use */
    const pass_t rp = rebuild_pass(p);
    if (m->drop[l] & MT_RC_LN1) MT_CHECK(ln1_fwd(&rp, l, false));
    float *d_out = full_or(p, m->full2, m->d_res);
    MT_CHECK(mt_pass_sp_gather(p, d_out, m->d_res, H, MT_DT_F32));
    /* &cuda_graph attn: the core's rebuild and the gradients up to ln1's, between the TP
     * collectives */
    float *d_ln = full_or(p, m->full, m->d_ln); /* partial sums over the TP group */
    bool run;
    MT_CHECK(mt_graph_begin(p, MT_GM_ATTN, l, 0, true, attn_sig(p, l), &run));
    if (run) MT_CHECK(attention_core_bwd(p, l, d_out, d_ln));
    MT_CHECK(mt_graph_end(p));
    MT_CHECK(mt_pass_sp_reduce_scatter(p, m->d_ln, d_ln, H));
    p->o->rmsnorm_bwd(p->ctx, m->d_res, G(p, t->ln1), m->d_ln, ACT(p, m->res[l], Nl, H), W(p, t->ln1),
                      a->ln1_rstd, Nl, H);
    return MT_OK;
}

/* d_ln (N,H) = the gradient of ln1_full from d_out (N,H), o_proj's output gradient; the
 * core rebuilt first when forward did not keep it. No collective. */
static int attention_core_bwd(const pass_t *p, int l, const float *d_out, float *d_ln)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    const int N = p->N, H = m->H, Q = m->Q_l, KV = m->KV_l;
    if (m->drop[l] & MT_RC_CORE_ATTN) {
        const pass_t rp = rebuild_pass(p);
        core_attn_fwd(&rp, a);
    }
    MT_CHECK(mt_pass_qlinear_bwd(p, t->wo, m->dy, 0.0f, d_out, ACT(p, a->y, N, Q), N, H, Q));
    p->o->attention_bwd(p->ctx, m->dq, m->dk, m->dv, m->dy, ACT(p, a->qr, N, Q), ACT(p, a->kr, N, KV),
                        ACT(p, a->v, N, KV), a->att_out, a->att_lse, p->B, m->T, m->nh_l, m->ng_l,
                        m->hd);
    p->o->rope_bwd(p->ctx, m->dq, m->dq, p->B, m->T, m->nh_l, m->hd, m->theta);
    p->o->rope_bwd(p->ctx, m->dk, m->dk, p->B, m->T, m->ng_l, m->hd, m->theta);
    float *dq = m->dq, *dk = m->dk;
    if (m->qk_norm) {
        p->o->memset(p->ctx, m->dq2, 0, sizeof(float) * (size_t)N * Q);
        p->o->memset(p->ctx, m->dk2, 0, sizeof(float) * (size_t)N * KV);
        const int nq = N * m->nh_l, nk = N * m->ng_l, hd = m->hd;
        p->o->rmsnorm_bwd(p->ctx, m->dq2, G(p, t->q_norm), m->dq, ACT(p, a->q, nq, hd),
                          W(p, t->q_norm), a->q_rstd, nq, hd);
        p->o->rmsnorm_bwd(p->ctx, m->dk2, G(p, t->k_norm), m->dk, ACT(p, a->k, nk, hd),
                          W(p, t->k_norm), a->k_rstd, nk, hd);
        dq = m->dq2;
        dk = m->dk2;
    }
    const struct mt_tensor ln1_full = ACT(p, a->ln1_full, N, H);
    MT_CHECK(mt_pass_qlinear_bwd(p, t->wq, d_ln, 0.0f, dq, ln1_full, N, Q, H));
    MT_CHECK(mt_pass_qlinear_bwd(p, t->wk, d_ln, 1.0f, dk, ln1_full, N, KV, H));
    return mt_pass_qlinear_bwd(p, t->wv, d_ln, 1.0f, m->dv, ln1_full, N, KV, H);
}

/* ------------------------------------------------------------ layers */

/* ln2 (Nl,H) and its statistics = RMSNorm of res_mid. fwd: a dense MLP's gate and up
 * forward read ln2 next (not a rebuild, not a MoE layer, whose router reads it too),
 * where it is not gathered: the norm emits its quantisation for them. */
static void ln2_fwd(const pass_t *p, int l, bool fwd)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const int Nl = p->Nl, H = m->H;
    const bool dense = m->moe_of_layer[l] < 0 && a->ln2_full == a->ln2;
    mt_pass_rmsnorm_qfwd(p, fwd && dense ? m->lt[l].gate : MT_NO_TENSOR, ACT(p, a->ln2, Nl, H), a->ln2_rstd,
                         ACT(p, a->res_mid, Nl, H), W(p, m->lt[l].ln2), Nl, H, m->eps);
    mt_pass_round(p, a->ln2, (size_t)Nl * H);
}

static int mlp_block_fwd(const pass_t *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    const int N = p->N, Nl = p->Nl, H = m->H;
    ln2_fwd(p, l, true);
    if (m->moe_of_layer[l] >= 0) {
        MT_CHECK(mt_moe_fwd(p, l)); /* into tmpb */
    } else {
        MT_CHECK(mt_pass_sp_gather(p, a->ln2_full, a->ln2, H, mt_pass_act_dt(p)));
        bool run; /* &cuda_graph mlp: between the TP collectives */
        MT_CHECK(mt_graph_begin(p, MT_GM_MLP, l, 0, false, mlp_sig(p, l), &run));
        if (run)
            MT_CHECK(mt_pass_mlp_fwd(p, mt_pass_rowpar_dst(p, m->full, m->tmpb), a->ln2_full, t->gate,
                                     t->up, t->down, a->gate, a->up, a->act, N, m->F_l));
        MT_CHECK(mt_graph_end(p));
        MT_CHECK(mt_pass_rowpar_finish(p, m->full, m->tmp, m->tmpb));
    }
    const int64_t n = (int64_t)Nl * H;
    if (!p->recompute) mt_offload_acquire(p, l + 1); /* res[l+1] may be the next layer's */
    p->o->add(p->ctx, ACT(p, m->res[l + 1], 1, n), ACT(p, a->res_mid, 1, n), ACT(p, m->tmpb, 1, n),
              (size_t)n);
    mt_pass_round(p, m->res[l + 1], (size_t)Nl * H);
    mt_offload_store(p, l);
    return MT_OK;
}

/* Selective recompute of the MLP half of layer l: the norm's output, then the dense
 * MLP's, the whole MoE block's, the shared expert's or the experts' SwiGLU, as
 * m->drop[l] says; the gather of ln2 over TP once for all that read it. */
static int mlp_block_rebuild(const pass_t *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    const unsigned drop = m->drop[l];
    const bool moe = m->moe_of_layer[l] >= 0;
    if (drop & MT_RC_LN2) ln2_fwd(p, l, false);
    if (drop & MT_RC_MOE) return mt_moe_fwd(p, l); /* gathers ln2 for the shared expert */
    if (a->ln2_full != a->ln2 && (drop & (MT_RC_LN2 | MT_RC_MLP | MT_RC_SHARED)))
        MT_CHECK(mt_pass_sp_gather(p, a->ln2_full, a->ln2, m->H, mt_pass_act_dt(p)));
    if (!moe && (drop & MT_RC_MLP))
        MT_CHECK(mt_pass_mlp_act_fwd(p, a->ln2_full, t->gate, t->up, MT_NO_TENSOR, a->gate, a->up, a->act,
                                     p->N, m->F_l));
    if (moe && (drop & MT_RC_SHARED))
        MT_CHECK(mt_pass_mlp_act_fwd(p, a->ln2_full, t->sh_gate, t->sh_up, MT_NO_TENSOR, a->sg, a->su, a->sa,
                                     p->N, m->Fs_l));
    if (moe && (drop & MT_RC_MOE_ACT)) mt_moe_act_rebuild(p, l);
    return MT_OK;
}

/* d_res (Nl,H): in, the gradient of res[l+1]; out, the gradient of res_mid. */
static int mlp_block_bwd(const pass_t *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    const int N = p->N, Nl = p->Nl, H = m->H;
    if (m->drop[l] & ~MT_RC_LAYER) {
        const pass_t rp = rebuild_pass(p);
        MT_CHECK(mlp_block_rebuild(&rp, l));
    }
    if (m->moe_of_layer[l] >= 0) {
        MT_CHECK(mt_moe_bwd(p, l));
    } else {
        float *d_out = full_or(p, m->full2, m->d_res);
        MT_CHECK(mt_pass_sp_gather(p, d_out, m->d_res, H, MT_DT_F32));
        float *d_ln = full_or(p, m->full, m->d_ln);
        bool run; /* &cuda_graph mlp: between the TP collectives */
        MT_CHECK(mt_graph_begin(p, MT_GM_MLP, l, 0, true, mlp_sig(p, l), &run));
        if (run)
            MT_CHECK(mt_pass_mlp_bwd(p, d_ln, 0.0f, d_out, a->ln2_full, a->gate, a->up, a->act, N,
                                     m->F_l, t->gate, t->up, t->down));
        MT_CHECK(mt_graph_end(p));
        MT_CHECK(mt_pass_sp_reduce_scatter(p, m->d_ln, d_ln, H));
    }
    p->o->rmsnorm_bwd(p->ctx, m->d_res, G(p, t->ln2), m->d_ln, ACT(p, a->res_mid, Nl, H), W(p, t->ln2),
                      a->ln2_rstd, Nl, H);
    return MT_OK;
}

/* ------------------------------------------------------------ embedding and loss */

/* Takes the next record (struct mt_fwd_record) and its token staging slot, and writes
 * the micro-batch's inputs, targets and shard inputs there (host memory only). */
static int fill_record(struct mt_model *m, const int32_t *tokens, int B, struct mt_err *err)
{
    if (!m->defer && m->nrec > 0) /* a pass that failed before reading its own */
        mt_model_reset_records(m);
    if (m->nrec == m->nrec_max)
        return mt_err_set(err, MT_EINVAL,
                          "model: a forward beyond the %d whose statistics mt_model_defer_stats "
                          "reserved before mt_model_read_stats", m->nrec_max);
    const int T = m->T;
    const size_t N = (size_t)B * T;
    int32_t *in = m->host_tokens_all + (size_t)m->nrec * 3 * m->Bmax * T;
    int32_t *tg = in + N, *in_v = in + 2 * N;
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
            /* this rank's vocabulary shard: its rows, -1 for the others' */
            in_v[(size_t)b * T + t] = x >= m->v0 && x < m->v0 + m->V_l ? x - m->v0 : -1;
            count += y >= 0;
        }
    m->rec_cur = m->nrec++;
    m->rec_valid[m->rec_cur] = count;
    m->rec_B[m->rec_cur] = B;
    return MT_OK;
}

int mt_model_stage_tokens(struct mt_model *m, const int32_t *tokens, int B, struct mt_err *err)
{
    if (!m->defer)
        return mt_err_set(err, MT_EINVAL, "model: mt_model_stage_tokens needs mt_model_defer_stats");
    if (B < 1 || B > m->Bmax)
        return mt_err_set(err, MT_EINVAL, "model: micro batch %d is outside [1, %d] (max_micro_batch)",
                          B, m->Bmax);
    MT_CHECK(fill_record(m, tokens, B, err));
    m->nahead++;
    return MT_OK;
}

/* The pass's record and token slot: filled from tokens here, or (tokens NULL) the next
 * one mt_model_stage_tokens filled ahead. The slot is uploaded on the copy stream, so
 * that the host does not wait: the copy first waits for the compute that used the
 * previous tokens, the compute then for the copy. *valid: the targets that count. */
static int stage_tokens(struct mt_model *m, const int32_t *tokens, int B, long long *valid,
                        struct mt_err *err)
{
    if (tokens && m->nahead)
        return mt_err_set(err, MT_EINVAL, "model: a forward given tokens while %d staged "
                          "micro-batches wait (mt_model_stage_tokens)", m->nahead);
    if (tokens) {
        MT_CHECK(fill_record(m, tokens, B, err));
    } else {
        if (!m->nahead)
            return mt_err_set(err, MT_EINVAL, "model: a forward without tokens, and none staged "
                              "(mt_model_stage_tokens)");
        m->rec_cur = m->nrec - m->nahead--;
        if (m->rec_B[m->rec_cur] != B)
            return mt_err_set(err, MT_EINVAL, "model: a forward of micro batch %d on the staged "
                              "one of %d sequences", B, m->rec_B[m->rec_cur]);
    }
    const size_t N = (size_t)B * m->T;
    int32_t *in = m->host_tokens_all + (size_t)m->rec_cur * 3 * m->Bmax * m->T;
    m->host_tokens = in;
    void *const dst[3] = {m->inputs, m->targets, m->inputs_v};
    const void *const src[3] = {in, in + N, in + 2 * N};
    const size_t bytes[3] = {sizeof(int32_t) * N, sizeof(int32_t) * N, sizeof(int32_t) * N};
    mt_model_upload(m, m->inputs_v != m->inputs ? 3 : 2, dst, src, bytes);
    *valid = m->rec_valid[m->rec_cur];
    return MT_OK;
}

/* Without mt_model_defer_stats, a pass reads its own record at the end of its forward
 * (one wait) into p->st. */
static int finish_record(const pass_t *p)
{
    struct mt_model *m = p->m;
    if (m->defer) return MT_OK;
    struct mt_model_stats r;
    int n;
    MT_CHECK(mt_model_read_stats(m, &r, 1, &n, NULL, p->err));
    p->st->lm_loss = r.lm_loss;
    p->st->aux_loss += r.aux_loss;
    p->st->z_loss += r.z_loss;
    p->st->dropped_tokens += r.dropped_tokens;
    return MT_OK;
}

/* Vocabulary-parallel cross-entropy: the shards' logsumexps gathered and combined into
 * ce_lse on the backend (lse_combine: in rank order with the largest factored out, as
 * one process's would be), the target logits summed (one shard holds each target). */
static int combine_vocab_shards(const pass_t *p)
{
    struct mt_model *m = p->m;
    const int N = p->N, tp = m->sc.tp;
    MT_CHECK(mt_all_gather(m->tp_comm, m->ce_lse, m->lse_all, (size_t)N, MT_DT_F32, p->err));
    MT_CHECK(mt_all_reduce(m->tp_comm, m->ce_tl, (size_t)N, MT_DT_F32, MT_OP_SUM, p->err));
    p->o->lse_combine(p->ctx, m->ce_lse, m->lse_all, tp, N);
    return MT_OK;
}

/* res[0] (Nl,H) = the micro-batch's token embeddings (vocabulary-parallel: each TP
 * rank embeds the tokens of its shard, the rows are summed over TP and scattered to
 * the rank's tokens; a sum of one row and zeros, so the rows stay bf16 values). */
static int embed(const pass_t *p)
{
    struct mt_model *m = p->m;
    const int N = p->N, H = m->H;
    if (m->sc.tp == 1) {
        p->o->embedding_fwd(p->ctx, ACT(p, m->res[0], N, H), m->inputs_v, W(p, m->embed), N, H);
        return MT_OK;
    }
    p->o->embedding_fwd(p->ctx, F32(m->full, N, H), m->inputs_v, W(p, m->embed), N, H);
    if (m->adt == MT_F32) return mt_pass_sp_reduce_scatter(p, m->res[0], m->full, H);
    MT_CHECK(mt_pass_sp_reduce_scatter(p, m->tmp, m->full, H));
    p->o->convert(p->ctx, ACT(p, m->res[0], p->Nl, H), F32(m->tmp, p->Nl, H));
    return MT_OK;
}

/* The final norm, the LM head and the cross-entropy of the last stage; the loss sum into
 * the pass's record. */
static int head_fwd(const pass_t *p, long long valid)
{
    struct mt_model *m = p->m;
    const int N = p->N, Nl = p->Nl, H = m->H, V = m->V_l;
    p->o->rmsnorm_fwd(p->ctx, ACT(p, m->lnf, Nl, H), m->lnf_rstd, ACT(p, m->res[m->L], Nl, H),
                      W(p, m->final_norm), Nl, H, m->eps);
    mt_pass_round(p, m->lnf, (size_t)Nl * H);
    MT_CHECK(mt_pass_sp_gather(p, m->lnf_full, m->lnf, H, mt_pass_act_dt(p)));
    mt_pass_linear_fwd(p, F32(m->lm_logits, N, V), ACT(p, m->lnf_full, N, H), W(p, m->lm_head), N,
                       V, H);
    /* The logits stay fp32 (the cross-entropy backward writes its gradient over them)
     * holding bf16 values: in bf16 training the one rounding pass left */
    if (m->bf16) p->o->bf16_round(p->ctx, m->lm_logits, m->lm_logits, (size_t)N * V);
    p->o->cross_entropy_fwd(p->ctx, m->ce_lse, m->ce_tl, m->lm_logits, m->targets, N, V, m->v0);
    if (m->sc.tp > 1) MT_CHECK(combine_vocab_shards(p));
    p->o->loss_sum(p->ctx, &mt_model_record(m)->lm_sum, m->ce_lse, m->ce_tl, m->targets, N);
    p->st->tokens = valid;
    return MT_OK;
}

/* Tells the hooks that this pass has finished position pos (model.h). */
static int grads_done(const pass_t *p, int pos)
{
    struct mt_model *m = p->m;
    return m->hooks.grads_done ? m->hooks.grads_done(m->hooks.ctx, pos, p->err) : MT_OK;
}

/* Tells the hooks that this pass is about to read the weights at position pos. */
static int weights_needed(const pass_t *p, int pos)
{
    struct mt_model *m = p->m;
    return m->hooks.weights_needed ? m->hooks.weights_needed(m->hooks.ctx, pos, p->err) : MT_OK;
}

/* Backward of the layers [l0, l1) (descending). Full recompute: each group of layers
 * rebuilt by running its forward again from the group's kept input just before the
 * group's backward. Offloading: each layer's offloaded tensors copied back while the
 * layer above computes its backward. */
static int layers_bwd(const pass_t *p, int l0, int l1)
{
    struct mt_model *m = p->m;
    if (l1 > l0) mt_offload_load(p, l1 - 1);
    for (int l = l1 - 1; l >= l0; l--) {
        /* offloading: this layer's tensors back, the next one's on their way */
        mt_offload_wait(p, l);
        if (l > l0) mt_offload_load(p, l - 1);
        const int g = m->rc_first[l];
        if (g >= 0 && (l + 1 == l1 || m->rc_first[l + 1] != g)) {
            const pass_t rp = rebuild_pass(p);
            for (int j = g; j <= l; j++) {
                MT_CHECK(attention_fwd(&rp, j));
                MT_CHECK(mlp_block_fwd(&rp, j));
            }
        }
        MT_CHECK(mlp_block_bwd(p, l));
        MT_CHECK(attention_bwd(p, l));
        MT_CHECK(grads_done(p, l));
    }
    return MT_OK;
}

/* ------------------------------------------------------------ the whole model */

int mt_model_run(struct mt_model *m, const int32_t *tokens, int B, bool backward, float loss_scale,
                 struct mt_model_stats *st, struct mt_err *err)
{
    if (B < 1 || B > m->Bmax)
        return mt_err_set(err, MT_EINVAL, "model: micro batch %d is outside [1, %d] (max_micro_batch)",
                          B, m->Bmax);
    if (((long long)B * m->T) % m->sc.tp)
        return mt_err_set(err, MT_EINVAL,
                          "model: the %d tokens of a micro batch do not split over %d TP ranks",
                          B * m->T, m->sc.tp);
    if (m->staged || !m->acts)
        return mt_err_set(err, MT_EINVAL,
                          "model: a pipeline stage runs mt_model_set_stage and "
                          "mt_model_stage_forward / mt_model_stage_backward");
    struct mt_model_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    long long valid = 0;
    MT_CHECK(stage_tokens(m, tokens, B, &valid, err));
    const int N = B * m->T, Nl = N / m->sc.tp;
    pass_t p = {m, &m->k->op, m->k->ctx, B, N, Nl, (long long)m->sc.tp_rank * Nl, backward,
                false, loss_scale, st, err};
    const int H = m->H, V = m->V_l;

    /* forward */
    MT_CHECK(weights_needed(&p, -1));
    MT_CHECK(embed(&p));
    for (int l = 0; l < m->L; l++) {
        MT_CHECK(weights_needed(&p, l));
        MT_CHECK(attention_fwd(&p, l));
        MT_CHECK(mlp_block_fwd(&p, l));
    }
    MT_CHECK(weights_needed(&p, m->L));
    MT_CHECK(head_fwd(&p, valid));
    MT_CHECK(finish_record(&p));
    if (!backward) return MT_OK;

    /* backward: d_res carries the gradient of the residual stream down the layers */
    mt_lowp_backward_begin(m, loss_scale);
    float ce_scale = valid > 0 ? loss_scale / (float)valid : 0.0f;
    float *dlogits = m->lm_logits; /* in place */
    p.o->cross_entropy_bwd(p.ctx, dlogits, m->lm_logits, m->ce_lse, m->targets, N, V, m->v0, ce_scale);
    float *d_lnf = full_or(&p, m->full, m->d_ln);
    mt_pass_linear_bwd(&p, d_lnf, 0.0f, G(&p, m->lm_head), dlogits, ACT(&p, m->lnf_full, N, H),
                       W(&p, m->lm_head), N, V, H);
    MT_CHECK(mt_pass_sp_reduce_scatter(&p, m->d_ln, d_lnf, H));
    p.o->memset(p.ctx, m->d_res, 0, sizeof(float) * (size_t)Nl * H);
    p.o->rmsnorm_bwd(p.ctx, m->d_res, G(&p, m->final_norm), m->d_ln, ACT(&p, m->res[m->L], Nl, H),
                     W(&p, m->final_norm), m->lnf_rstd, Nl, H);
    MT_CHECK(grads_done(&p, m->L));
    MT_CHECK(layers_bwd(&p, 0, m->L));
    float *d_emb = full_or(&p, m->full2, m->d_res);
    MT_CHECK(mt_pass_sp_gather(&p, d_emb, m->d_res, H, MT_DT_F32));
    p.o->embedding_bwd(p.ctx, G(&p, m->embed), d_emb, m->inputs_v, N, H);
    return grads_done(&p, -1);
}

/* ------------------------------------------------------------ one pipeline stage */

static int check_batch(const struct mt_model *m, int B, struct mt_err *err)
{
    if (B < 1 || B > m->Bmax)
        return mt_err_set(err, MT_EINVAL, "model: micro batch %d is outside [1, %d] (max_micro_batch)",
                          B, m->Bmax);
    if (((long long)B * m->T) % m->sc.tp)
        return mt_err_set(err, MT_EINVAL,
                          "model: the %d tokens of a micro batch do not split over %d TP ranks",
                          B * m->T, m->sc.tp);
    return MT_OK;
}

static int check_slot(const struct mt_model *m, int chunk, int slot, struct mt_err *err)
{
    if (m->staged && chunk >= 0 && chunk < m->nchunks && slot >= 0 && slot < m->nslots)
        return MT_OK;
    return mt_err_set(err, MT_EINVAL,
                      "model: chunk %d slot %d of a pipeline stage with %d chunks of %d slots",
                      chunk, slot, m->staged ? m->nchunks : 0, m->staged ? m->nslots : 0);
}

int mt_model_stage_forward(struct mt_model *m, int chunk, int slot, const int32_t *tokens,
                           int B, const float *x_in, float *x_out, bool train, float loss_scale,
                           struct mt_model_stats *st, struct mt_err *err)
{
    MT_CHECK(check_slot(m, chunk, slot, err));
    MT_CHECK(check_batch(m, B, err));
    struct mt_model_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    mt_model_select_slot(m, chunk, slot);
    struct mt_act_slot *sl = &m->slots[chunk * m->nslots + slot];
    long long valid = 0;
    MT_CHECK(stage_tokens(m, tokens, B, &valid, err));
    const int N = B * m->T, Nl = N / m->sc.tp;
    pass_t p = {m, &m->k->op, m->k->ctx, B, N, Nl, (long long)m->sc.tp_rank * Nl, train,
                false, loss_scale, st, err};
    const int H = m->H;
    sl->B = B;
    sl->valid = valid;
    sl->loss_scale = loss_scale;
    const size_t act_bytes = mt_dtype_size(m->adt) * (size_t)Nl * H;
    if (m->first) {
        MT_CHECK(weights_needed(&p, -1));
        MT_CHECK(embed(&p));
    } else {
        p.o->copy(p.ctx, m->res[m->l0], x_in, act_bytes);
    }
    for (int l = m->l0; l < m->l1; l++) {
        MT_CHECK(weights_needed(&p, l));
        MT_CHECK(attention_fwd(&p, l));
        MT_CHECK(mlp_block_fwd(&p, l));
    }
    if (!m->last) {
        p.o->copy(p.ctx, x_out, m->res[m->l1], act_bytes);
        return finish_record(&p);
    }
    MT_CHECK(weights_needed(&p, m->L));
    MT_CHECK(head_fwd(&p, valid));
    return finish_record(&p);
}

int mt_model_stage_backward(struct mt_model *m, int chunk, int slot, const float *dy,
                            float *dx, struct mt_model_stats *st, struct mt_err *err)
{
    MT_CHECK(check_slot(m, chunk, slot, err));
    struct mt_model_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    mt_model_select_slot(m, chunk, slot);
    const struct mt_act_slot *sl = &m->slots[chunk * m->nslots + slot];
    const int B = sl->B, N = B * m->T, Nl = N / m->sc.tp;
    pass_t p = {m, &m->k->op, m->k->ctx, B, N, Nl, (long long)m->sc.tp_rank * Nl, true,
                false, sl->loss_scale, st, err};
    const int H = m->H, V = m->V_l;
    mt_lowp_backward_begin(m, sl->loss_scale);
    if (m->last) {
        float ce_scale = sl->valid > 0 ? sl->loss_scale / (float)sl->valid : 0.0f;
        float *dlogits = m->lm_logits; /* in place */
        p.o->cross_entropy_bwd(p.ctx, dlogits, m->lm_logits, m->ce_lse, m->targets, N, V, m->v0,
                               ce_scale);
        float *d_lnf = full_or(&p, m->full, m->d_ln);
        mt_pass_linear_bwd(&p, d_lnf, 0.0f, G(&p, m->lm_head), dlogits, ACT(&p, m->lnf_full, N, H),
                           W(&p, m->lm_head), N, V, H);
        MT_CHECK(mt_pass_sp_reduce_scatter(&p, m->d_ln, d_lnf, H));
        p.o->memset(p.ctx, m->d_res, 0, sizeof(float) * (size_t)Nl * H);
        p.o->rmsnorm_bwd(p.ctx, m->d_res, G(&p, m->final_norm), m->d_ln, ACT(&p, m->res[m->L], Nl, H),
                         W(&p, m->final_norm), m->lnf_rstd, Nl, H);
        MT_CHECK(grads_done(&p, m->L));
    } else {
        p.o->copy(p.ctx, m->d_res, dy, sizeof(float) * (size_t)Nl * H);
    }
    MT_CHECK(layers_bwd(&p, m->l0, m->l1));
    if (!m->first) {
        p.o->copy(p.ctx, dx, m->d_res, sizeof(float) * (size_t)Nl * H);
        return MT_OK;
    }
    float *d_emb = full_or(&p, m->full2, m->d_res);
    MT_CHECK(mt_pass_sp_gather(&p, d_emb, m->d_res, H, MT_DT_F32));
    p.o->embedding_bwd(p.ctx, G(&p, m->embed), d_emb, m->inputs_v, N, H);
    return grads_done(&p, -1);
}

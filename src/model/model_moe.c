/* The MoE block: router, load-balancing losses, capacity, the token dispatcher and the
 * routed SwiGLU experts (plus the shared expert), forward and backward.
 *
 * A rank routes its own Nl tokens (the sequence-parallel part of the micro-batch).
 * Everything that decides routing is global, as in one process: the balancing loss
 * uses the expert counts of the whole micro-batch (summed over the TP group), and with
 * a capacity the drop decisions are taken over the whole micro-batch (its routing is
 * gathered over the TP group and planned once, identically on every TP rank).
 *
 * Then one of three dispatchers brings the kept token-expert rows to the experts:
 *   LOCAL      EP = ETP = 1: this rank holds every expert whole.
 *   ALLTOALL   the rows go to the EP rank that owns their expert (all-to-all-v over the
 *              EP group, after exchanging per-expert counts), are all-gathered over the
 *              ETP group (each ETP rank holds a slice of every local expert's FFN), sorted
 *              by local expert for one grouped pass, and come back the same way: the
 *              ETP partial sums reduce-scattered, then the reverse all-to-all-v.
 *   ALLGATHER  the tokens and their routing are all-gathered over the ETP x EP group,
 *              each rank computes its local experts (its FFN slice) on the tokens routed
 *              to them, and the weighted outputs are reduce-scattered back.
 * Megatron's MoEAlltoAllTokenDispatcher and MoEAllGatherTokenDispatcher. */
#include "model/model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mt_pass pass_t;

static struct mt_tensor W(const pass_t *p, int tensor) { return mt_model_weight(p->m, tensor); }
static float *G(const pass_t *p, int tensor) { return mt_model_view(p->m->grads, p->m, tensor); }
static struct mt_tensor ACT(const pass_t *p, const void *x, int64_t rows, int64_t cols)
{
    return mt_pass_act(p, x, rows, cols);
}
static struct mt_tensor F32(const float *x, int64_t rows, int64_t cols) { return mt_f32(x, rows, cols); }

/* ------------------------------------------------------------ routing */

/* Benchmark mode (moe%router_force_load_balancing): Megatron replaces the router
 * logits by random ones through a straight-through estimator. Here the replacement
 * is deterministic: token n of the micro-batch gets logit 0 for experts (n*k + j) mod
 * E, j < k, and -1 elsewhere, so the assignments go round-robin and every expert
 * receives N*k/E (+-1) tokens; the gradient passes straight through to the real
 * logits, as in Megatron. */
static void force_logits(const pass_t *p, float *logits)
{
    const struct mt_model *m = p->m;
    const int E = m->E, k = m->topk;
    float *host = m->h_force;
    for (int n = 0; n < p->Nl; n++) {
        const long long g = p->tok0 + n;
        for (int e = 0; e < E; e++) host[(size_t)n * E + e] = -1.0f;
        for (int j = 0; j < k; j++) host[(size_t)n * E + (size_t)((g * k + j) % E)] = 0.0f;
    }
    p->o->copy(p->ctx, logits, host, sizeof(float) * (size_t)p->Nl * E);
}

/* The balancing loss over this rank's tokens, as a part of the micro-batch's. */
static struct mt_aux_args aux_args(const pass_t *p)
{
    const struct mt_model *m = p->m;
    const bool seq = m->balance == MT_BALANCE_SEQ_AUX;
    return (struct mt_aux_args){.num_tokens = p->Nl, .num_experts = m->E, .topk = m->topk,
                                .score_fn = m->router.score_fn, .num_seqs = seq ? p->B : 1,
                                .seq_len = seq ? m->T : p->N, .first = p->tok0,
                                .coeff = m->aux_coeff};
}

/* z-loss coefficient of this rank's part: the mean over N tokens is a sum over Nl of them
 * divided by N (Megatron divides moe_z_loss_coeff by the TP x CP size). */
static float z_coeff(const pass_t *p) { return p->m->z_coeff / (float)p->m->sc.tp; }

bool mt_moe_dynamic(const struct mt_model *m, int N)
{
    return !(mt_model_capacity(m, N) > 0 && m->pad_to_capacity);
}

/* Capacity dropping decided over the whole micro-batch (TP > 1): the routing of the N
 * tokens is gathered over the TP group and planned as one process plans it; this
 * rank's assignments that the plan drops become -1 in route_idx, and are added to
 * dropped (backend memory, or NULL), all on the backend. */
static int drop_over_tp(const pass_t *p, struct mt_layer_acts *a, int cap, int64_t *dropped)
{
    struct mt_model *m = p->m;
    const size_t k = (size_t)m->topk, nk = (size_t)p->Nl * k;
    MT_CHECK(mt_all_gather(m->tp_comm, a->topk_idx, m->idx_full, nk, MT_DT_I32, p->err));
    MT_CHECK(mt_all_gather(m->tp_comm, a->topk_prob, m->prob_full, nk, MT_DT_F32, p->err));
    p->o->dispatch_plan(p->ctx, &m->full_plan, m->idx_full, m->prob_full, p->N, m->E, m->topk,
                        cap, m->drop_policy, false, NULL, NULL);
    p->o->drop_mask(p->ctx, m->route_idx, a->topk_idx, m->full_plan.slot_row + (size_t)p->tok0 * k,
                    nk, dropped);
    return MT_OK;
}

/* ------------------------------------------------------------ routing dump */

/* MT_DEBUG_ROUTING=FILE writes every routing decision of the process to FILE (FILE.R
 * for PMIX_RANK R under mpirun or srun), to see what a decision hinges on when layouts
 * disagree (tests/parallel/common.sh reads it). It only reads: training is
 * bit-identical with and without it. Per MoE layer forward, in words:
 *   topk MB L TOK k: E_1..E_k keys: K_0..K_{E-1} margin M [aux_margin A]
 *   slot MB L TOK E PROB kept|dropped                      (with a capacity)
 *   capacity MB L E CANDIDATES CAPACITY margin M           (an over-full expert)
 * MB names the micro-batch in every layout: the FNV-1a hash of its input tokens, then t
 * (training) or e (evaluation); L is the layer, TOK the token in the micro-batch. Keys
 * rank the experts as the router does: the logits for softmax (before or after the
 * top-k: the same order), sigmoid + expert bias, in double from the fp32 logits;
 * M = the smallest chosen key minus the largest other, and A the same for the
 * balancing loss's top-k (sigmoid scores without the bias, when the bias is on).
 * capacity: the probs policy's margin, the lowest kept minus the highest dropped
 * PROB of the expert (-1 under the position policy, which compares no scores). With
 * TP, each rank writes its own tokens' topk lines and TP rank 0 the plan's. */
static FILE *routing_dump;
static bool routing_dump_read;

static void close_routing_dump(void) { fclose(routing_dump); }

/* The dump file, NULL without MT_DEBUG_ROUTING; the variable is read once. */
static int routing_dump_file(FILE **out, struct mt_err *err)
{
    if (!routing_dump_read) {
        routing_dump_read = true;
        const char *path = getenv("MT_DEBUG_ROUTING"), *rank = getenv("PMIX_RANK");
        if (path && *path) {
            char name[4096];
            if (rank)
                snprintf(name, sizeof name, "%s.%s", path, rank);
            else
                snprintf(name, sizeof name, "%s", path);
            routing_dump = fopen(name, "w");
            if (!routing_dump) return mt_err_errno(err, "MT_DEBUG_ROUTING: cannot write %s", name);
            atexit(close_routing_dump);
        }
    }
    *out = routing_dump;
    return MT_OK;
}

/* key (E) = what the router ranks for logits l (E) (see above); score (E) = without the bias */
static void routing_keys(const pass_t *p, int moe, const float *l, double *key, double *score)
{
    const struct mt_model *m = p->m;
    const int E = m->E;
    for (int e = 0; e < E; e++) {
        score[e] = m->router.score_fn == MT_SCORE_SIGMOID ? 1.0 / (1.0 + exp(-(double)l[e])) : l[e];
        key[e] = score[e] + (m->expert_bias_on ? m->expert_bias[(size_t)moe * E + e] : 0.0);
    }
}

/* The smallest of x over the chosen experts (k) minus the largest over the others. */
static double topk_margin(const double *x, const int32_t *chosen, int E, int k)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int e = 0; e < E; e++) {
        bool in = false;
        for (int j = 0; j < k; j++) in = in || chosen[j] == e;
        if (in)
            lo = x[e] < lo ? x[e] : lo;
        else
            hi = x[e] > hi ? x[e] : hi;
    }
    return lo - hi;
}

/* The k largest of x (E), best first (ties: the lower expert), as the balancing loss picks. */
static void topk_of(int32_t *idx, const double *x, int E, int k)
{
    for (int j = 0; j < k; j++) {
        idx[j] = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken = taken || idx[i] == e;
            if (!taken && (idx[j] < 0 || x[e] > x[idx[j]])) idx[j] = e;
        }
    }
}

/* The slot and capacity lines of one plan over the N tokens of the micro-batch. */
static void dump_plan(FILE *f, const pass_t *p, const char *mb, int l, const int32_t *idx,
                      const float *prob, const int32_t *slot_row, int cap)
{
    const struct mt_model *m = p->m;
    const int k = m->topk, S = p->N * k;
    for (int s = 0; s < S; s++)
        if (idx[s] >= 0)
            fprintf(f, "slot %s %d %d %d %.9g %s\n", mb, l, s / k, idx[s], prob[s],
                    slot_row[s] < 0 ? "dropped" : "kept");
    for (int e = 0; e < m->E; e++) {
        int n = 0;
        double lo = INFINITY, hi = -INFINITY;
        for (int s = 0; s < S; s++) {
            if (idx[s] != e) continue;
            n++;
            if (slot_row[s] >= 0)
                lo = prob[s] < lo ? prob[s] : lo;
            else
                hi = prob[s] > hi ? prob[s] : hi;
        }
        if (n > cap)
            fprintf(f, "capacity %s %d %d %d %d margin %.6e\n", mb, l, e, n, cap,
                    m->drop_policy == MT_DROP_PROBS ? lo - hi : -1.0);
    }
}

/* The decisions of route() for layer l (see MT_DEBUG_ROUTING above). */
static int dump_routing(FILE *f, const pass_t *p, int l, const struct mt_layer_acts *a, int cap)
{
    const struct mt_model *m = p->m;
    const int E = m->E, k = m->topk, Nl = p->Nl, moe = m->moe_of_layer[l];
    const size_t nk = (size_t)p->N * k;
    float *logits = malloc(sizeof(float) * (size_t)Nl * E), *prob = malloc(sizeof(float) * nk);
    int32_t *idx = malloc(sizeof(int32_t) * nk), *slot_row = malloc(sizeof(int32_t) * nk);
    double *key = malloc(sizeof(double) * 2 * (size_t)E), *score = key + E;
    int32_t *aux_idx = malloc(sizeof(int32_t) * (size_t)k);
    int rc = MT_OK;
    if (!logits || !prob || !idx || !slot_row || !key || !aux_idx) {
        rc = mt_err_set(p->err, MT_ENOMEM, "MT_DEBUG_ROUTING: out of memory");
        goto done;
    }
    uint32_t h = 2166136261u; /* FNV-1a over the bytes of the input tokens */
    for (size_t i = 0; i < sizeof(int32_t) * (size_t)p->N; i++)
        h = (h ^ ((const unsigned char *)m->host_tokens)[i]) * 16777619u;
    char mb[16];
    snprintf(mb, sizeof mb, "%08x%c", h, p->train ? 't' : 'e');

    p->o->copy(p->ctx, logits, a->logits, sizeof(float) * (size_t)Nl * E);
    p->o->copy(p->ctx, idx, a->topk_idx, sizeof(int32_t) * (size_t)Nl * k);
    for (int n = 0; n < Nl; n++) {
        const int32_t *chosen = idx + (size_t)n * k;
        routing_keys(p, moe, logits + (size_t)n * E, key, score);
        fprintf(f, "topk %s %d %lld k:", mb, l, p->tok0 + n);
        for (int j = 0; j < k; j++) fprintf(f, " %d", chosen[j]);
        fprintf(f, " keys:");
        for (int e = 0; e < E; e++) fprintf(f, " %.9g", key[e]);
        fprintf(f, " margin %.6e", topk_margin(key, chosen, E, k));
        if (m->expert_bias_on && a->aux_counts) {
            topk_of(aux_idx, score, E, k);
            fprintf(f, " aux_margin %.6e", topk_margin(score, aux_idx, E, k));
        }
        fputc('\n', f);
    }
    if (cap > 0 && m->sc.tp > 1 && m->sc.tp_rank == 0) {
        p->o->copy(p->ctx, idx, m->idx_full, sizeof(int32_t) * nk);
        p->o->copy(p->ctx, prob, m->prob_full, sizeof(float) * nk);
        p->o->copy(p->ctx, slot_row, m->full_plan.slot_row, sizeof(int32_t) * nk);
        dump_plan(f, p, mb, l, idx, prob, slot_row, cap);
    } else if (cap > 0 && m->sc.tp == 1) {
        p->o->copy(p->ctx, prob, a->topk_prob, sizeof(float) * nk);
        p->o->copy(p->ctx, slot_row, a->plan.slot_row, sizeof(int32_t) * nk);
        dump_plan(f, p, mb, l, idx, prob, slot_row, cap);
    }
    if (ferror(f)) rc = mt_err_set(p->err, MT_EIO, "MT_DEBUG_ROUTING: write error");
done:
    free(logits);
    free(prob);
    free(idx);
    free(slot_row);
    free(key);
    free(aux_idx);
    return rc;
}

/* The signature of layer l's router buffers (the experts' scopes chain it). */
static uint64_t router_bufs_sig(const pass_t *p, int l)
{
    const struct mt_model *m = p->m;
    const struct mt_layer_acts *a = &m->la[l];
    return MT_GRAPH_SIG((uintptr_t)a->ln2, (uintptr_t)a->logits, (uintptr_t)a->aux_counts,
                        (uintptr_t)a->z_lse, (uintptr_t)a->topk_idx, (uintptr_t)a->topk_prob,
                        (uintptr_t)m->expert_bias_dev, (uintptr_t)m->expert_bias_on,
                        (uintptr_t)W(p, m->lt[l].router).data);
}

/* The signature of layer l's router scope (&cuda_graph moe_router): its buffers and the
 * forward's record its losses are added to. */
static uint64_t router_sig(const pass_t *p, int l)
{
    return mt_graph_sig(router_bufs_sig(p, l), (const uintptr_t[]){(uintptr_t)mt_model_record(p->m)}, 1);
}

/* The signature of layer l's plan scope (&cuda_graph moe_preprocess). */
static uint64_t plan_sig(const pass_t *p, int l, const int32_t *idx, int cap)
{
    const struct mt_model *m = p->m;
    const struct mt_layer_acts *a = &m->la[l];
    return MT_GRAPH_SIG((uintptr_t)a->plan.offsets, (uintptr_t)a->plan.row_slot,
                        (uintptr_t)a->plan.slot_row, (uintptr_t)a->plan.kept, (uintptr_t)idx,
                        (uintptr_t)a->topk_prob, (uintptr_t)mt_model_record(m),
                        (uintptr_t)m->acc, (uintptr_t)cap);
}

/* The signature of layer l's expert scopes (&cuda_graph moe: the block after its plan's
 * offsets are read, forward and backward); with FP8/FP4 experts, the host's offsets too,
 * which split their GEMMs. */
static uint64_t experts_sig(const pass_t *p, int l)
{
    const struct mt_model *m = p->m;
    const struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    uint64_t h = mt_graph_sig(
        router_bufs_sig(p, l),
        (const uintptr_t[]){(uintptr_t)a->rows, (uintptr_t)a->x_rows, (uintptr_t)a->xp,
                            (uintptr_t)a->xs, (uintptr_t)a->ey, (uintptr_t)a->eg, (uintptr_t)a->eu,
                            (uintptr_t)a->ea, (uintptr_t)a->x_offsets, (uintptr_t)a->plan.offsets,
                            (uintptr_t)a->plan.row_slot, (uintptr_t)a->plan.slot_row,
                            (uintptr_t)a->ln2_full, (uintptr_t)a->sg, (uintptr_t)a->su,
                            (uintptr_t)a->sa, (uintptr_t)m->tmpb, (uintptr_t)m->full2,
                            (uintptr_t)m->tmp2, (uintptr_t)m->tmp2b, (uintptr_t)m->d_res,
                            (uintptr_t)m->d_ln, (uintptr_t)m->d_rows, (uintptr_t)m->d_rows2,
                            (uintptr_t)m->d_prob, (uintptr_t)m->d_logits, (uintptr_t)m->d_f1,
                            (uintptr_t)m->d_f2, (uintptr_t)m->d_f3, (uintptr_t)m->drop[l],
                            (uintptr_t)W(p, t->exp_gate).data, (uintptr_t)W(p, t->exp_up).data,
                            (uintptr_t)W(p, t->exp_down).data,
                            (uintptr_t)(m->Fs > 0 ? W(p, t->sh_gate).data : NULL)},
        34);
    if (mt_lowp_grouped(p, t->exp_gate))
        for (int e = 0; e <= m->E_l; e++)
            h = mt_graph_sig(h, (const uintptr_t[]){(uintptr_t)a->hx_offsets[e]}, 1);
    return h;
}

/* Router, balancing and z losses, top-k, capacity and the plan of this rank's tokens. */
static int route(const pass_t *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    const int Nl = p->Nl, H = m->H, E = m->E, k = m->topk, moe = m->moe_of_layer[l];
    struct mt_router_args ra = m->router;
    ra.num_tokens = Nl;

    /* a rebuild for backward (recompute) adds nothing to the losses, drop counts and
     * expert loads that its forward already counted; the forward adds them to the
     * pass's record and the loads in backend memory (mt_model_read_stats reads them) */
    const bool count = !p->recompute;
    struct mt_fwd_record *acc = mt_model_record(m);
    struct mt_aux_args aa = aux_args(p);
    /* &cuda_graph moe_router: in two segments around the TP sum of the balancing counts */
    const uint64_t sig = router_sig(p, l);
    bool run;
    MT_CHECK(mt_graph_begin(p, MT_GM_MOE_ROUTER, l, 0, false, sig, &run));
    if (run) {
        mt_pass_linear_fwd(p, F32(a->logits, Nl, E), ACT(p, a->ln2, Nl, H), W(p, t->router), Nl, E,
                           H); /* fp32 router logits */
        if (m->force_balance) force_logits(p, a->logits);
        if (m->z_coeff > 0.0f)
            p->o->z_loss_fwd(p->ctx, count ? &acc->z : NULL, a->z_lse, a->logits, Nl, E, z_coeff(p));
        if (a->aux_counts) p->o->aux_counts(p->ctx, &aa, a->aux_counts, a->logits);
    }
    if (a->aux_counts && m->sc.tp > 1) {
        MT_CHECK(mt_graph_end(p));
        MT_CHECK(mt_all_reduce(m->tp_comm, a->aux_counts, (size_t)aa.num_seqs * E, MT_DT_F32,
                               MT_OP_SUM, p->err));
        MT_CHECK(mt_graph_begin(p, MT_GM_MOE_ROUTER, l, 1, false, sig, &run));
    }
    if (run) {
        if (a->aux_counts && count) p->o->aux_loss_fwd(p->ctx, &aa, &acc->aux, a->aux_counts, a->logits);
        p->o->router_fwd(p->ctx, &ra, a->logits,
                         m->expert_bias_on ? m->expert_bias_dev + (size_t)moe * E : NULL, a->topk_idx,
                         a->topk_prob);
    }
    MT_CHECK(mt_graph_end(p));
    const int cap = mt_model_capacity(m, p->N);
    const int32_t *idx = a->topk_idx;
    if (cap > 0 && m->sc.tp > 1) {
        MT_CHECK(drop_over_tp(p, a, cap, count ? &acc->dropped : NULL));
        idx = m->route_idx;
    }
    /* &cuda_graph moe_preprocess: the plan, up to the host's read of its offsets */
    MT_CHECK(mt_graph_begin(p, MT_GM_MOE_PREPROCESS, l, 0, false, plan_sig(p, l, idx, cap), &run));
    if (run)
        p->o->dispatch_plan(p->ctx, &a->plan, idx, a->topk_prob, Nl, E, k, cap, m->drop_policy,
                            m->pad_to_capacity, count ? &acc->dropped : NULL,
                            p->train && count ? m->acc->load + (size_t)moe * E : NULL);
    MT_CHECK(mt_graph_end(p));
    FILE *dump = NULL;
    if (count) MT_CHECK(routing_dump_file(&dump, p->err));
    if (dump) MT_CHECK(dump_routing(dump, p, l, a, cap));
    if (!mt_moe_dynamic(m, p->N)) { /* drop-and-pad: every expert cap rows, no read */
        for (int e = 0; e <= E; e++) a->h_offsets[e] = (long long)e * cap;
    } else if (m->dispatch != MT_DISPATCH_ALLGATHER && !p->recompute) {
        /* the split sizes the dispatch needs: the one wait of a dynamic layer. The
         * all-gather dispatcher counts its rows after the gather instead (ag_prepare);
         * a rebuild for backward plans what its forward planned, whose offsets the
         * slot keeps */
        int32_t *offs = m->h_offs;
        p->o->copy(p->ctx, offs, a->plan.offsets, sizeof(int32_t) * ((size_t)E + 1));
        for (int e = 0; e <= E; e++) a->h_offsets[e] = offs[e];
    }
    a->rows = (int)a->h_offsets[E];
    if (m->dispatch == MT_DISPATCH_LOCAL) /* every expert here: the expert side is the plan */
        for (int e = 0; e <= E; e++) a->hx_offsets[e] = (int32_t)a->h_offsets[e];
    return MT_OK;
}

/* ------------------------------------------------------------ experts */

/* ey (rows,H) = SwiGLU of this rank's experts (its FFN slice) on xs (rows,H), grouped by
 * local expert at offs (E_l+1); ey is a partial sum over the ETP group. */
static int experts_fwd(const pass_t *p, const struct mt_layer_acts *a,
                       const struct mt_layer_tensors *t, const int32_t *offs, int rows,
                       struct mt_tensor ey)
{
    const struct mt_model *m = p->m;
    const int El = m->E_l, H = m->H, Fe = m->Fe_l;
    const struct mt_tensor xs = ACT(p, a->xs, rows, H), eg = ACT(p, a->eg, rows, Fe);
    const struct mt_tensor eu = ACT(p, a->eu, rows, Fe), ea = ACT(p, a->ea, rows, Fe);
    if (mt_lowp_grouped(p, t->exp_gate)) { /* FP8/FP4 */
        MT_CHECK(mt_pass_qgrouped_fwd(p, t->exp_gate, a->hx_offsets, xs, rows, Fe, H, eg));
        mt_pass_round(p, a->eg, (size_t)rows * Fe);
        MT_CHECK(mt_pass_qgrouped_fwd(p, t->exp_up, a->hx_offsets, xs, rows, Fe, H, eu));
        mt_pass_round(p, a->eu, (size_t)rows * Fe);
        p->o->swiglu_fwd(p->ctx, ea, eg, eu, rows, Fe);
        mt_pass_round(p, a->ea, (size_t)rows * Fe);
        return mt_pass_qgrouped_fwd(p, t->exp_down, a->hx_offsets, ea, rows, H, Fe, ey);
    }
    p->o->grouped_gemm(p->ctx, false, true, El, offs, 0, Fe, H, 1.0f, xs, W(p, t->exp_gate), 0.0f, eg);
    mt_pass_round(p, a->eg, (size_t)rows * Fe);
    p->o->grouped_gemm(p->ctx, false, true, El, offs, 0, Fe, H, 1.0f, xs, W(p, t->exp_up), 0.0f, eu);
    mt_pass_round(p, a->eu, (size_t)rows * Fe);
    p->o->swiglu_fwd(p->ctx, ea, eg, eu, rows, Fe);
    mt_pass_round(p, a->ea, (size_t)rows * Fe);
    p->o->grouped_gemm(p->ctx, false, true, El, offs, 0, H, Fe, 1.0f, ea, W(p, t->exp_down), 0.0f, ey);
    return MT_OK;
}

/* dxs (rows,H) = the input gradient (partial over ETP) from dys (rows,H); weight grads +=. */
static int experts_bwd(const pass_t *p, const struct mt_layer_acts *a,
                       const struct mt_layer_tensors *t, const int32_t *offs, int rows,
                       const float *dys, float *dxs)
{
    struct mt_model *m = p->m;
    const int El = m->E_l, H = m->H, Fe = m->Fe_l;
    float *dea = m->d_f1, *deg = m->d_f2, *deu = m->d_f3;
    /* down: ey = ea Wd^T per expert, slabs (H,Fe) */
    const struct mt_tensor xs = ACT(p, a->xs, rows, H), ea = ACT(p, a->ea, rows, Fe);
    const struct mt_tensor dy = F32(dys, rows, H), dx = F32(dxs, rows, H);
    const struct mt_tensor dg = F32(deg, rows, Fe), du = F32(deu, rows, Fe);
    if (mt_lowp_grouped(p, t->exp_gate)) { /* FP8/FP4 */
        MT_CHECK(mt_pass_qgrouped_bwd(p, t->exp_down, a->hx_offsets, dys, ea, rows, H, Fe, dea, 0.0f));
        p->o->swiglu_bwd(p->ctx, deg, deu, dea, ACT(p, a->eg, rows, Fe), ACT(p, a->eu, rows, Fe),
                         rows, Fe);
        MT_CHECK(mt_pass_qgrouped_bwd(p, t->exp_gate, a->hx_offsets, deg, xs, rows, Fe, H, dxs, 0.0f));
        return mt_pass_qgrouped_bwd(p, t->exp_up, a->hx_offsets, deu, xs, rows, Fe, H, dxs, 1.0f);
    }
    p->o->grouped_gemm(p->ctx, false, false, El, offs, 0, Fe, H, 1.0f, dy, W(p, t->exp_down), 0.0f,
                       F32(dea, rows, Fe));
    p->o->grouped_gemm(p->ctx, true, false, El, offs, H, Fe, 0, 1.0f, dy, ea, 1.0f,
                       F32(G(p, t->exp_down), (int64_t)El * H, Fe));
    p->o->swiglu_bwd(p->ctx, deg, deu, dea, ACT(p, a->eg, rows, Fe), ACT(p, a->eu, rows, Fe), rows, Fe);
    /* gate, up: slabs (Fe,H) */
    p->o->grouped_gemm(p->ctx, false, false, El, offs, 0, H, Fe, 1.0f, dg, W(p, t->exp_gate), 0.0f, dx);
    p->o->grouped_gemm(p->ctx, false, false, El, offs, 0, H, Fe, 1.0f, du, W(p, t->exp_up), 1.0f, dx);
    p->o->grouped_gemm(p->ctx, true, false, El, offs, Fe, H, 0, 1.0f, dg, xs, 1.0f,
                       F32(G(p, t->exp_gate), (int64_t)El * Fe, H));
    p->o->grouped_gemm(p->ctx, true, false, El, offs, Fe, H, 0, 1.0f, du, xs, 1.0f,
                       F32(G(p, t->exp_up), (int64_t)El * Fe, H));
    return MT_OK;
}

/* ------------------------------------------------------------ the shared expert */

/* The shared expert, a TP-sharded SwiGLU MLP on every token, added to the block's output
 * without a gate. &moe moe_shared_expert_overlap runs its parts while an EP all-to-all
 * is in flight, as Megatron does: gate, up and activation during the dispatch, the down
 * projection during the combine; its backward during the gradients' dispatch (the
 * down projection's, SwiGLU's and gate's: 4 of its 6 GEMMs) and the backward combine
 * (up's 2 GEMMs and the reduce-scatter of its input gradient over TP). Both backward
 * all-to-alls move the same rows, so an even 3:3 split would hide the most; it would
 * keep gate's and up's output gradients (2 x N x Fs_l) across the routed experts'
 * backward, where this split keeps up's alone (m->sh_dup, N x Fs_l, allocated with the
 * key) and the input gradient's partial sums in d_ln (full with TP), which the routed
 * experts' backward and the combine do not touch: d_f1, d_f2 are the routed experts'
 * scratch too. Each part writes only buffers the all-to-alls and the routed experts
 * do not touch, so the results are those of the parts run one after the other. */
typedef int (*shared_part_fn)(const pass_t *p, int l);

/* sg, su, sa (N,Fs_l) from ln2 (gathered over TP into ln2_full) */
static int shared_fc1_fwd(const pass_t *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    MT_CHECK(mt_pass_sp_gather(p, a->ln2_full, a->ln2, m->H, mt_pass_act_dt(p)));
    return mt_pass_mlp_act_fwd(p, a->ln2_full, t->sh_gate, t->sh_up, t->sh_down, a->sg, a->su, a->sa, p->N,
                               m->Fs_l);
}

/* tmp2b (Nl,H) = sa Wd^T, reduced over TP (through full2 and tmp2) */
static int shared_fc2_fwd(const pass_t *p, int l)
{
    struct mt_model *m = p->m;
    const struct mt_layer_acts *a = &m->la[l];
    MT_CHECK(mt_pass_qlinear_fwd(p, m->lt[l].sh_down, mt_pass_rowpar_dst(p, m->full2, m->tmp2b),
                                 ACT(p, a->sa, p->N, m->Fs_l), p->N, m->H, m->Fs_l));
    return mt_pass_rowpar_finish(p, m->full2, m->tmp2, m->tmp2b);
}

/* The shared expert's input gradient's partial sums, (N,H) over TP, else d_ln (Nl,H) */
static float *shared_d_ln(const struct mt_model *m) { return m->sc.tp > 1 ? m->full : m->d_ln; }

/* up's output gradient (N,Fs_l): its own buffer when it stays across the routed
 * experts' backward (moe_shared_expert_overlap), else their scratch */
static float *shared_dup(const struct mt_model *m) { return m->shared_overlap ? m->sh_dup : m->d_f3; }

/* The backward's first part: the down projection's, SwiGLU's and gate's from d_res
 * (Nl,H) (gathered over TP through full2): shared_d_ln = gate's input gradient,
 * shared_dup = up's output gradient; weight grads +=. */
static int shared_bwd_gate(const pass_t *p, int l)
{
    struct mt_model *m = p->m;
    const struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    float *d_sh = m->sc.tp > 1 ? m->full2 : m->d_res;
    MT_CHECK(mt_pass_sp_gather(p, d_sh, m->d_res, m->H, MT_DT_F32));
    return mt_pass_mlp_bwd_gate(p, shared_d_ln(m), 0.0f, shared_dup(m), d_sh, a->ln2_full, a->sg,
                                a->su, a->sa, p->N, m->Fs_l, t->sh_gate, t->sh_down);
}

/* The second: up's; d_ln (Nl,H) = the shared expert's input gradient (reduce-scattered
 * over TP); up's weight grad +=. */
static int shared_bwd_up(const pass_t *p, int l)
{
    struct mt_model *m = p->m;
    float *d_ln = shared_d_ln(m);
    MT_CHECK(mt_pass_mlp_bwd_up(p, d_ln, shared_dup(m), m->la[l].ln2_full, p->N, m->Fs_l,
                                m->lt[l].sh_up));
    return mt_pass_sp_reduce_scatter(p, m->d_ln, d_ln, m->H);
}

/* The EP all-to-all-v; with a part of the shared expert (else NULL), started, the part
 * run while it is in flight, then waited for. Without EP (the all-to-all dispatcher's
 * layout for moe_router_padding_for_fp8 on EP 1) a copy. */
static int ep_all_to_all(const pass_t *p, int l, const void *send, const size_t *send_counts,
                         const size_t *send_at, void *recv, const size_t *recv_counts,
                         const size_t *recv_at, enum mt_dt dt, shared_part_fn part)
{
    struct mt_model *m = p->m;
    if (m->sc.ep == 1) {
        const size_t es = mt_dt_size(dt);
        (void)recv_counts;
        p->o->copy(p->ctx, (char *)recv + es * recv_at[0], (const char *)send + es * send_at[0],
                   es * send_counts[0]);
        return part ? part(p, l) : MT_OK;
    }
    if (!part)
        return mt_all_to_all_v(m->ep_comm, send, send_counts, send_at, recv, recv_counts,
                               recv_at, dt, p->err);
    MT_CHECK(mt_all_to_all_v_start(m->ep_comm, send, send_counts, send_at, recv, recv_counts,
                                   recv_at, dt, &m->a2a_req, p->err));
    m->a2a_overlapped += mt_comm_pending(&m->a2a_req);
    MT_CHECK(part(p, l));
    return mt_comm_wait(&m->a2a_req, p->err);
}

/* ------------------------------------------------------------ all-to-all dispatcher */

/* Counts and displacements of the exchanges, in floats (rows of H). */
struct a2a_counts {
    size_t *send, *send_at, *recv, *recv_at; /* EP all-to-all: per EP peer */
    size_t *gather, *gather_at;              /* ETP: rows each ETP peer received over EP */
    size_t *mine, *mine_at;                  /* ETP: this rank's received rows, per ETP peer */
    size_t rows;                             /* rows this rank received over EP */
    size_t gathered;                         /* and with its ETP peers': the real rows */
};

static struct a2a_counts a2a_counts_of(const pass_t *p, const struct mt_layer_acts *a)
{
    const struct mt_model *m = p->m;
    const int ep = m->sc.ep, etp = m->sc.etp, El = m->E_l, H = m->H;
    const size_t P = (size_t)(ep > etp ? ep : etp);
    size_t *b = m->h_cnt;
    struct a2a_counts c = {b, b + P, b + 2 * P, b + 3 * P, b + 4 * P, b + 5 * P, b + 6 * P,
                           b + 7 * P, 0, 0};
    size_t at = 0, gat = 0;
    for (int q = 0; q < etp; q++) {
        size_t rows_q = 0;
        for (int j = 0; j < ep; j++) {
            size_t rows = 0;
            for (int le = 0; le < El; le++)
                rows += (size_t)a->recv_counts[((size_t)q * ep + j) * El + le];
            if (q == m->sc.etp_rank) {
                c.recv[j] = rows * H;
                c.recv_at[j] = at;
                at += rows * H;
            }
            rows_q += rows;
        }
        c.gather[q] = rows_q * H;
        c.gather_at[q] = gat;
        gat += rows_q * H;
    }
    c.rows = at / (size_t)H;
    c.gathered = gat / (size_t)H;
    for (int q = 0; q < etp; q++) {
        c.mine[q] = c.rows * H;
        c.mine_at[q] = (size_t)q * c.rows * H;
    }
    for (int j = 0; j < ep; j++) {
        c.send[j] = (size_t)(a->h_offsets[(j + 1) * El] - a->h_offsets[j * El]) * H;
        c.send_at[j] = (size_t)a->h_offsets[j * El] * H;
    }
    return c;
}

/* Exchanges the per-expert row counts (EP all-to-all, then ETP all-gather) and builds
 * the expert-side offsets and the maps between the received order (ETP peer, EP
 * source, local expert) and the expert order (local expert, ETP peer, EP source).
 * With moe_router_padding_for_fp8 each local expert's rows are followed by zero rows up
 * to a multiple of pad_align (sort_map -1: no received row), which no token reads back
 * (unsort_map names only the real rows); the exchanges move the real rows only. */
static int a2a_prepare(const pass_t *p, int l, struct mt_layer_acts *a)
{
    struct mt_model *m = p->m;
    const int ep = m->sc.ep, etp = m->sc.etp, El = m->E_l;
    const size_t S = (size_t)ep * El;
    /* the counts of every source into start (its room), then kept when they changed */
    long long *counts = m->h_start;
    if (!mt_moe_dynamic(m, p->N)) {
        /* drop-and-pad: every source sends every expert its capacity (the plan's
         * offsets), so nothing is exchanged: the block holds no host collective
         * (&cuda_graph modules = 'moe' under EP and ETP) */
        for (size_t b = 0; b < (size_t)etp * S; b++) counts[b] = a->h_offsets[1] - a->h_offsets[0];
    } else {
        long long *send = m->h_send, *recv = m->h_recv;
        for (int e = 0; e < m->E; e++) send[e] = a->h_offsets[e + 1] - a->h_offsets[e];
        size_t *cnt = m->h_cnt, *at = cnt + ep;
        for (int j = 0; j < ep; j++) {
            cnt[j] = (size_t)El;
            at[j] = (size_t)j * El;
        }
        if (ep == 1)
            memcpy(recv, send, sizeof(long long) * S);
        else
            MT_CHECK(mt_all_to_all_v(m->ep_comm, send, cnt, at, recv, cnt, at, MT_DT_I64, p->err));
        if (etp > 1)
            MT_CHECK(mt_all_gather(m->etp_comm, recv, counts, S, MT_DT_I64, p->err));
        else
            memcpy(counts, recv, sizeof(long long) * S);
    }
    const size_t cbytes = sizeof(long long) * (size_t)etp * S;
    const bool same = a->maps_of_counts && !memcmp(counts, a->recv_counts, cbytes);
    memcpy(a->recv_counts, counts, cbytes);

    /* received order: block (q, j, le) holds recv_counts[(q*ep + j)*El + le] rows */
    const size_t blocks = (size_t)etp * S;
    long long *start = m->h_start, total = 0;
    for (size_t b = 0; b < blocks; b++) {
        start[b] = total;
        total += a->recv_counts[b];
    }
    long long xr = total; /* the expert-side rows, padded */
    if (m->pad_align) {
        xr = 0;
        for (int le = 0; le < El; le++) {
            long long n = 0;
            for (size_t q = 0; q < (size_t)etp * ep; q++) n += a->recv_counts[q * El + le];
            xr += (n + m->pad_align - 1) / m->pad_align * m->pad_align;
        }
    }
    MT_CHECK(mt_model_expert_rows(p, l, a, xr, true));
    a->x_rows = (int)xr;
    /* the same counts (static shapes; a rebuild for backward): the maps on the device
     * hold, where nothing else wrote their buffers since: the slot keeps every layer's
     * maps, also a recomputed layer's (layout_moe_acts), unless they are an overflow's,
     * which went back; the host copy of the offsets (hx_offsets), made with the maps
     * from these counts, holds too */
    const bool own = !a->over;
    if (same && own) return MT_OK;
    int32_t *sort = m->h_sort, *unsort = m->h_unsort, *offs = a->hx_offsets;
    int32_t r = 0;
    offs[0] = 0;
    for (int le = 0; le < El; le++) {
        for (int q = 0; q < etp; q++)
            for (int j = 0; j < ep; j++) {
                size_t b = ((size_t)q * ep + j) * El + le;
                for (long long i = 0; i < a->recv_counts[b]; i++, r++) {
                    sort[r] = (int32_t)(start[b] + i);
                    unsort[start[b] + i] = r;
                }
            }
        for (; m->pad_align && r % m->pad_align; r++) sort[r] = -1;
        offs[le + 1] = r;
    }
    void *const dst[3] = {a->sort_map, a->unsort_map, a->x_offsets};
    const size_t bytes[3] = {sizeof(int32_t) * (size_t)xr, sizeof(int32_t) * (size_t)total,
                             sizeof(int32_t) * ((size_t)El + 1)};
    a->maps_of_counts = own;
    if (mt_moe_dynamic(m, p->N) && xr <= m->x_rows_max) {
        /* dropless: through the staging on the copy stream, no wait; the staging is
         * written again only after the next MoE layer's read of its offsets (route),
         * which waits for the compute queued after this upload (a rebuild for
         * backward, which reads none, has the same counts and its forward's maps: it
         * uploads nothing) */
        int32_t *st = m->a2a_stage;
        memcpy(st, sort, bytes[0]);
        memcpy(st + xr, unsort, bytes[1]);
        memcpy(st + xr + total, offs, bytes[2]);
        const void *const src[3] = {st, st + xr, st + xr + total};
        mt_model_upload(m, 3, dst, src, bytes);
    } else { /* static shapes (once), or rows beyond the staging: synchronous copies */
        const void *const src[3] = {sort, unsort, offs};
        for (int i = 0; i < 3; i++) p->o->copy(p->ctx, dst[i], src[i], bytes[i]);
    }
    return MT_OK;
}

/* Layer l's rows (R,H) in plan order -> out (Rx,H) in expert order: all-to-all over EP
 * (part, or NULL, of the shared expert run while it is in flight), all-gather over ETP,
 * sort; both in dt (the activations forward, fp32 gradients backward). Uses stage and
 * stage2 (sized for fp32 rows). */
static int a2a_dispatch(const pass_t *p, int l, const void *rows, void *out, enum mt_dtype dt,
                        shared_part_fn part)
{
    struct mt_model *m = p->m;
    const struct mt_layer_acts *a = &m->la[l];
    const enum mt_dt cdt = dt == MT_BF16 ? MT_DT_BF16 : MT_DT_F32;
    struct a2a_counts c = a2a_counts_of(p, a);
    MT_CHECK(ep_all_to_all(p, l, rows, c.send, c.send_at, m->stage, c.recv, c.recv_at, cdt,
                           part));
    const void *got = m->stage;
    if (m->sc.etp > 1) { /* every ETP peer gets the same rows: displacement 0 for all */
        for (int q = 0; q < m->sc.etp; q++) c.mine_at[q] = 0;
        MT_CHECK(mt_all_to_all_v(m->etp_comm, m->stage, c.mine, c.mine_at, m->stage2, c.gather,
                                 c.gather_at, cdt, p->err));
        got = m->stage2;
    }
    p->o->permute_fwd(p->ctx, mt_tview(out, dt, a->x_rows, m->H),
                      mt_tview(got, dt, (int64_t)c.gathered, m->H), a->sort_map, a->x_rows, 1, m->H);
    return MT_OK;
}

/* Layer l's xrows (Rx,H) in expert order, partial over ETP -> out (R,H) in plan order,
 * summed: unsort, reduce-scatter over ETP (summed in rank order), reverse all-to-all
 * over EP (part, or NULL, of the shared expert run while it is in flight). Uses stage
 * and stage2. */
static int a2a_combine(const pass_t *p, int l, const float *xrows, float *out,
                       shared_part_fn part)
{
    struct mt_model *m = p->m;
    const struct mt_layer_acts *a = &m->la[l];
    const int etp = m->sc.etp;
    struct a2a_counts c = a2a_counts_of(p, a);
    p->o->permute_fwd(p->ctx, F32(m->stage, (int64_t)c.gathered, m->H), F32(xrows, a->x_rows, m->H),
                      a->unsort_map, (int)c.gathered, 1, m->H);
    if (etp > 1) {
        MT_CHECK(mt_all_to_all_v(m->etp_comm, m->stage, c.gather, c.gather_at, m->stage2, c.mine,
                                 c.mine_at, MT_DT_F32, p->err));
        const size_t n = c.rows * m->H;
        p->o->copy(p->ctx, m->stage, m->stage2, sizeof(float) * n);
        for (int q = 1; q < etp; q++)
            p->o->add(p->ctx, F32(m->stage, 1, (int64_t)n), F32(m->stage, 1, (int64_t)n),
                      F32(m->stage2 + q * n, 1, (int64_t)n), n);
    }
    return ep_all_to_all(p, l, m->stage, c.recv, c.recv_at, out, c.send, c.send_at, MT_DT_F32,
                         part);
}

/* ------------------------------------------------------------ all-gather dispatcher */

/* Gathers the tokens and their kept routing over the ETP x EP group and plans the rows
 * of this rank's experts, on the backend. The rows: static shapes (drop-and-pad) pad
 * every expert to G x capacity rows, known on the host; dropless, the rows of each
 * expert are the one read of the layer, whose sums are the expert-side offsets (a
 * rebuild for backward has its forward's). m->stage (G*Nl,H) receives the
 * tokens, once the expert side holds the rows (mt_model_expert_rows may give it another
 * stage). */
static int ag_prepare(const pass_t *p, int l, struct mt_layer_acts *a)
{
    struct mt_model *m = p->m;
    const size_t k = (size_t)m->topk, nk = (size_t)p->Nl * k, G = (size_t)m->xg;
    p->o->drop_mask(p->ctx, m->route_idx, a->topk_idx, a->plan.slot_row, nk, NULL);
    MT_CHECK(mt_all_gather(m->xg_comm, m->route_idx, m->idx_full, nk, MT_DT_I32, p->err));
    MT_CHECK(mt_all_gather(m->xg_comm, a->topk_prob, a->g_prob, nk, MT_DT_F32, p->err));
    /* this rank's experts as 0..E_l-1, the others' (and the dropped) as -1 */
    const bool dyn = mt_moe_dynamic(m, p->N);
    p->o->expert_select(p->ctx, m->idx_full, m->idx_full, G * nk, m->e0, m->E_l,
                        dyn ? m->ag_counts : NULL);
    /* every source keeps at most capacity rows per expert: padding to G x capacity
     * keeps the shapes static without dropping anything */
    const int cap = mt_model_capacity(m, p->N);
    if (!dyn || !p->recompute) {
        long long *rows = m->h_send; /* (E >= E_l) */
        if (dyn)
            p->o->copy(p->ctx, rows, m->ag_counts, sizeof(int64_t) * (size_t)m->E_l);
        a->hx_offsets[0] = 0;
        for (int e = 0; e < m->E_l; e++)
            a->hx_offsets[e + 1] = a->hx_offsets[e] + (int32_t)(dyn ? rows[e] : (long long)cap * m->xg);
        a->x_rows = a->hx_offsets[m->E_l];
    }
    MT_CHECK(mt_model_expert_rows(p, l, a, a->x_rows, true));
    struct mt_dispatch_plan plan = {a->x_offsets, a->sort_map, a->g_slot_row, m->x_kept};
    p->o->dispatch_plan(p->ctx, &plan, m->idx_full, a->g_prob, (int)(G * p->Nl), m->E_l, m->topk,
                        dyn ? 0 : cap * m->xg, m->drop_policy, m->pad_to_capacity, NULL, NULL);
    return mt_all_gather(m->xg_comm, a->ln2, m->stage, (size_t)p->Nl * m->H, mt_pass_act_dt(p),
                         p->err);
}

/* ------------------------------------------------------------ the block */

static int moe_combine_fwd(const pass_t *p, int l);

int mt_moe_fwd(const pass_t *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    const int Nl = p->Nl, H = m->H, k = m->topk;
    void *out = m->tmpb; /* the block's output, (Nl,H) in adt */
    const bool ov = m->shared_overlap; /* the shared expert runs during the all-to-alls */
    MT_CHECK(route(p, l));
    /* &cuda_graph moe (its EP/ETP collectives captured with it): the experts, then the
     * combination and the shared expert, around the host's bookkeeping of expert rows */
    bool run;
    if (m->dispatch == MT_DISPATCH_LOCAL) a->x_rows = a->rows;
    MT_CHECK(mt_graph_begin(p, MT_GM_MOE, l, 0, false, experts_sig(p, l), &run));
    if (run) switch (m->dispatch) {
    case MT_DISPATCH_LOCAL:
        p->o->permute_fwd(p->ctx, ACT(p, a->xp, a->rows, H), ACT(p, a->ln2, Nl, H), a->plan.row_slot,
                          a->rows, k, H);
        MT_CHECK(experts_fwd(p, a, t, a->x_offsets, a->x_rows, ACT(p, a->ey, a->rows, H)));
        break;
    case MT_DISPATCH_ALLTOALL:
        p->o->permute_fwd(p->ctx, ACT(p, a->xp, a->rows, H), ACT(p, a->ln2, Nl, H), a->plan.row_slot,
                          a->rows, k, H);
        MT_CHECK(a2a_prepare(p, l, a));
        MT_CHECK(a2a_dispatch(p, l, a->xp, a->xs, m->adt, ov ? shared_fc1_fwd : NULL));
        MT_CHECK(experts_fwd(p, a, t, a->x_offsets, a->x_rows, F32(m->d_x, a->x_rows, H)));
        /* partial sums over ETP, summed in fp32, then stored in adt */
        MT_CHECK(a2a_combine(p, l, m->d_x, m->d_rows, ov ? shared_fc2_fwd : NULL));
        p->o->convert(p->ctx, ACT(p, a->ey, a->rows, H), F32(m->d_rows, a->rows, H));
        break;
    case MT_DISPATCH_ALLGATHER: {
        const size_t NG = (size_t)m->xg * Nl;
        MT_CHECK(ag_prepare(p, l, a));
        p->o->permute_fwd(p->ctx, ACT(p, a->xs, a->x_rows, H), ACT(p, m->stage, (int64_t)NG, H),
                          a->sort_map, a->x_rows, k, H);
        const struct mt_tensor eys = mt_tview(a->eys, m->eys_dt, a->x_rows, H);
        MT_CHECK(experts_fwd(p, a, t, a->x_offsets, a->x_rows, eys));
        if (m->sc.etp == 1) mt_pass_round(p, a->eys, (size_t)a->x_rows * H);
        p->o->unpermute_fwd(p->ctx, F32(m->stage2, (int64_t)NG, H), eys, a->g_slot_row, a->g_prob,
                            (int)NG, k, H);
        MT_CHECK(mt_reduce_scatter(m->xg_comm, m->stage2, m->tmp, (size_t)Nl * H, MT_DT_F32,
                                   MT_OP_SUM, p->err));
        if (out != m->tmp) p->o->convert(p->ctx, ACT(p, out, Nl, H), F32(m->tmp, Nl, H));
        break;
    }
    }
    MT_CHECK(mt_graph_end(p));
    /* the activations stay for backward, unless backward rebuilds them (recompute) */
    mt_model_expert_release(m, a, p->recompute || !(m->drop[l] & (MT_RC_MOE | MT_RC_LAYER)));
    MT_CHECK(mt_graph_begin(p, MT_GM_MOE, l, 1, false, experts_sig(p, l), &run));
    if (run) MT_CHECK(moe_combine_fwd(p, l));
    return mt_graph_end(p);
}

/* The block's output in tmpb: the experts' rows combined per token, plus the shared
 * expert's output (tmp2b). */
static int moe_combine_fwd(const pass_t *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const int Nl = p->Nl, H = m->H, k = m->topk;
    void *out = m->tmpb;
    if (m->dispatch != MT_DISPATCH_ALLGATHER) {
        mt_pass_round(p, a->ey, (size_t)a->rows * H);
        p->o->unpermute_fwd(p->ctx, ACT(p, out, Nl, H), ACT(p, a->ey, a->rows, H), a->plan.slot_row,
                            a->topk_prob, Nl, k, H);
    }
    mt_pass_round(p, out, (size_t)Nl * H);
    if (m->Fs > 0) { /* the shared expert, computed here unless during the all-to-alls */
        if (!m->shared_overlap) {
            MT_CHECK(shared_fc1_fwd(p, l));
            MT_CHECK(shared_fc2_fwd(p, l));
        }
        const int64_t n = (int64_t)Nl * H;
        p->o->add(p->ctx, ACT(p, out, 1, n), ACT(p, out, 1, n), ACT(p, m->tmp2b, 1, n), (size_t)n);
        mt_pass_round(p, out, (size_t)Nl * H);
    }
    return MT_OK;
}

void mt_moe_act_rebuild(const pass_t *p, int l)
{
    const struct mt_model *m = p->m;
    const struct mt_layer_acts *a = &m->la[l];
    const int rows = a->x_rows, Fe = m->Fe_l;
    p->o->swiglu_fwd(p->ctx, ACT(p, a->ea, rows, Fe), ACT(p, a->eg, rows, Fe),
                     ACT(p, a->eu, rows, Fe), rows, Fe);
    mt_pass_round(p, a->ea, (size_t)rows * Fe);
}

static int moe_block_bwd(const pass_t *p, int l);

int mt_moe_bwd(const pass_t *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    MT_CHECK(mt_model_expert_rows(p, l, a, a->x_rows, false));
    /* &cuda_graph moe (its EP/ETP collectives captured with it) */
    bool run;
    MT_CHECK(mt_graph_begin(p, MT_GM_MOE, l, 0, true, experts_sig(p, l), &run));
    if (run) MT_CHECK(moe_block_bwd(p, l));
    MT_CHECK(mt_graph_end(p));
    mt_model_expert_release(m, a, false);
    return MT_OK;
}

/* The block's backward: d_ln (Nl,H) from d_res (Nl,H), weight gradients +=. */
static int moe_block_bwd(const pass_t *p, int l)
{
    struct mt_model *m = p->m;
    struct mt_layer_acts *a = &m->la[l];
    const struct mt_layer_tensors *t = &m->lt[l];
    const int Nl = p->Nl, H = m->H, E = m->E, k = m->topk;
    const float *dout = m->d_res;
    struct mt_router_args ra = m->router;
    ra.num_tokens = Nl;
    /* d_ln = the shared expert's input gradient (during the gradients' dispatch and
     * the backward combine with moe_shared_expert_overlap), then the routed experts'
     * is added */
    const bool ov = m->shared_overlap;
    if (m->Fs == 0) {
        p->o->memset(p->ctx, m->d_ln, 0, sizeof(float) * (size_t)Nl * H);
    } else if (!ov) {
        MT_CHECK(shared_bwd_gate(p, l));
        MT_CHECK(shared_bwd_up(p, l));
    }

    switch (m->dispatch) {
    case MT_DISPATCH_LOCAL:
        p->o->unpermute_bwd(p->ctx, m->d_rows, m->d_prob, dout, ACT(p, a->ey, a->rows, H),
                            a->plan.slot_row, a->topk_prob, Nl, k, H, a->rows);
        MT_CHECK(experts_bwd(p, a, t, a->x_offsets, a->x_rows, m->d_rows, m->d_rows2));
        p->o->permute_bwd(p->ctx, m->d_ln, m->d_rows2, a->plan.slot_row, Nl, k, H);
        break;
    case MT_DISPATCH_ALLTOALL:
        p->o->unpermute_bwd(p->ctx, m->d_rows, m->d_prob, dout, ACT(p, a->ey, a->rows, H),
                            a->plan.slot_row, a->topk_prob, Nl, k, H, a->rows);
        MT_CHECK(a2a_dispatch(p, l, m->d_rows, m->d_x, MT_F32, ov ? shared_bwd_gate : NULL));
        MT_CHECK(experts_bwd(p, a, t, a->x_offsets, a->x_rows, m->d_x, m->d_x2));
        MT_CHECK(a2a_combine(p, l, m->d_x2, m->d_rows2, ov ? shared_bwd_up : NULL));
        p->o->permute_bwd(p->ctx, m->d_ln, m->d_rows2, a->plan.slot_row, Nl, k, H);
        break;
    case MT_DISPATCH_ALLGATHER: {
        const size_t NG = (size_t)m->xg * Nl;
        MT_CHECK(mt_all_gather(m->xg_comm, dout, m->stage, (size_t)Nl * H, MT_DT_F32, p->err));
        p->o->unpermute_bwd(p->ctx, m->d_x, m->g_dprob, m->stage,
                            mt_tview(a->eys, m->eys_dt, a->x_rows, H), a->g_slot_row, a->g_prob,
                            (int)NG, k, H, a->x_rows);
        MT_CHECK(mt_reduce_scatter(m->xg_comm, m->g_dprob, m->d_prob, (size_t)Nl * k, MT_DT_F32,
                                   MT_OP_SUM, p->err));
        MT_CHECK(experts_bwd(p, a, t, a->x_offsets, a->x_rows, m->d_x, m->d_x2));
        p->o->memset(p->ctx, m->stage2, 0, sizeof(float) * NG * H);
        p->o->permute_bwd(p->ctx, m->stage2, m->d_x2, a->g_slot_row, (int)NG, k, H);
        MT_CHECK(mt_reduce_scatter(m->xg_comm, m->stage2, m->tmp, (size_t)Nl * H, MT_DT_F32,
                                   MT_OP_SUM, p->err));
        p->o->add(p->ctx, F32(m->d_ln, 1, (int64_t)Nl * H), F32(m->d_ln, 1, (int64_t)Nl * H),
                  F32(m->tmp, 1, (int64_t)Nl * H), (size_t)Nl * H);
        break;
    }
    }

    /* router: routing weights, balancing loss, z-loss; forced logits pass straight through */
    p->o->memset(p->ctx, m->d_logits, 0, sizeof(float) * (size_t)Nl * E);
    p->o->router_bwd(p->ctx, &ra, m->d_logits, m->d_prob, a->logits, a->topk_idx);
    if (a->aux_counts) {
        struct mt_aux_args aa = aux_args(p);
        p->o->aux_loss_bwd(p->ctx, &aa, m->d_logits, p->scale, a->aux_counts, a->logits);
    }
    if (m->z_coeff > 0.0f)
        p->o->z_loss_bwd(p->ctx, m->d_logits, p->scale, a->z_lse, a->logits, Nl, E, z_coeff(p));
    mt_pass_linear_bwd(p, m->d_ln, 1.0f, G(p, t->router), m->d_logits, ACT(p, a->ln2, Nl, H),
                       W(p, t->router), Nl, E, H);
    return MT_OK;
}

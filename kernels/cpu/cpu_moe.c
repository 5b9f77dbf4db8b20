/* CPU reference backend: router top-k, load-balancing and z losses, and the
 * token dispatch (plan, permute, unpermute) of a dropless or capacity-bounded MoE. */
#include "kernels/cpu/cpu_ops.h"

#include <stdlib.h>
#include <string.h>

/* p (E) = softmax(l) */
static void softmax_row(float *p, const float *l, int E)
{
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    for (int e = 0; e < E; e++) {
        p[e] = expf(l[e] - mx);
        sum += p[e];
    }
    float inv = 1.0f / sum;
    for (int e = 0; e < E; e++) p[e] *= inv;
}

/* idx (k) = the k largest keys (E), best first; ties pick the lower index. */
static void topk_row(int32_t *idx, const float *key, int E, int k)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken = taken || idx[i] == e;
            if (taken) continue;
            if (best < 0 || key[e] > key[best]) best = e;
        }
        idx[j] = best;
    }
}

void mt_cpu_router_fwd(void *ctx, const struct mt_router_args *a, const float *logits,
                       const float *expert_bias, int32_t *topk_idx, float *topk_prob)
{
    (void)ctx;
    const int E = a->num_experts, k = a->topk;
    const float sf = a->scaling_factor != 0.0f ? a->scaling_factor : 1.0f;
    const size_t per = sizeof(float) * 2 * (size_t)E; /* score, key */
    void *scratch = mt_cpu_scratch_threads("router_fwd", per);
#pragma omp parallel
    {
        float *score = mt_cpu_slice(scratch, per), *key = score + E;
#pragma omp for schedule(static)
        for (int n = 0; n < a->num_tokens; n++) {
            const float *l = logits + (size_t)n * E;
            int32_t *idx = topk_idx + (size_t)n * k;
            float *prob = topk_prob + (size_t)n * k;
            if (a->score_fn == MT_SCORE_SOFTMAX && a->pre_softmax)
                softmax_row(score, l, E);
            else if (a->score_fn == MT_SCORE_SOFTMAX)
                memcpy(score, l, sizeof(float) * (size_t)E);
            else
                for (int e = 0; e < E; e++) score[e] = mt_cpu_sigmoid(l[e]);
            for (int e = 0; e < E; e++) key[e] = score[e] + (expert_bias ? expert_bias[e] : 0.0f);
            topk_row(idx, key, E, k);
            for (int j = 0; j < k; j++) prob[j] = score[idx[j]];
            if (a->score_fn == MT_SCORE_SOFTMAX && !a->pre_softmax) {
                softmax_row(key, prob, k);
                memcpy(prob, key, sizeof(float) * (size_t)k);
            } else if (a->score_fn == MT_SCORE_SIGMOID && k > 1) {
                float sum = 0.0f;
                for (int j = 0; j < k; j++) sum += prob[j];
                for (int j = 0; j < k; j++) prob[j] /= sum + 1e-20f;
            }
            for (int j = 0; j < k; j++) prob[j] *= sf;
        }
    }
    mt_cpu_scratch_give(scratch);
}

void mt_cpu_router_bwd(void *ctx, const struct mt_router_args *a, float *dlogits,
                       const float *dprob, const float *logits, const int32_t *topk_idx)
{
    (void)ctx;
    const int E = a->num_experts, k = a->topk;
    const float sf = a->scaling_factor != 0.0f ? a->scaling_factor : 1.0f;
    const size_t per = sizeof(float) * 2 * (size_t)E; /* p, g */
    void *scratch = mt_cpu_scratch_threads("router_bwd", per);
#pragma omp parallel
    {
        float *p = mt_cpu_slice(scratch, per), *g = p + E;
#pragma omp for schedule(static)
        for (int n = 0; n < a->num_tokens; n++) {
            const float *l = logits + (size_t)n * E;
            const int32_t *idx = topk_idx + (size_t)n * k;
            const float *dp = dprob + (size_t)n * k;
            float *dl = dlogits + (size_t)n * E;
            if (a->score_fn == MT_SCORE_SOFTMAX && a->pre_softmax) {
                /* prob_j = sf p[idx_j], p = softmax(l) */
                softmax_row(p, l, E);
                for (int e = 0; e < E; e++) g[e] = 0.0f;
                for (int j = 0; j < k; j++) g[idx[j]] += sf * dp[j];
                float dot = 0.0f;
                for (int e = 0; e < E; e++) dot += g[e] * p[e];
                for (int e = 0; e < E; e++) dl[e] += p[e] * (g[e] - dot);
            } else if (a->score_fn == MT_SCORE_SOFTMAX) {
                /* prob = sf softmax(l[idx]) over the k picked */
                for (int j = 0; j < k; j++) g[j] = l[idx[j]];
                softmax_row(p, g, k);
                float dot = 0.0f;
                for (int j = 0; j < k; j++) dot += sf * dp[j] * p[j];
                for (int j = 0; j < k; j++) dl[idx[j]] += p[j] * (sf * dp[j] - dot);
            } else {
                /* prob_j = sf s_j / (sum s + 1e-20) (k > 1) or sf s_j, s = sigmoid(l[idx]) */
                float z = 0.0f, dot = 0.0f;
                for (int j = 0; j < k; j++) {
                    p[j] = mt_cpu_sigmoid(l[idx[j]]);
                    z += p[j];
                }
                z += 1e-20f;
                for (int j = 0; j < k; j++) dot += sf * dp[j] * p[j] / z;
                for (int j = 0; j < k; j++) {
                    float ds = k > 1 ? (sf * dp[j] - dot) / z : sf * dp[j];
                    dl[idx[j]] += ds * p[j] * (1.0f - p[j]);
                }
            }
        }
    }
    mt_cpu_scratch_give(scratch);
}

/* p (E) = the scores the balancing loss sees: softmax, or sigmoid normalised to sum 1;
 * returns the normaliser sum(sigmoid) + 1e-20 (1 for softmax). */
static float aux_scores(float *p, const float *l, int E, enum mt_score_fn fn)
{
    if (fn == MT_SCORE_SOFTMAX) {
        softmax_row(p, l, E);
        return 1.0f;
    }
    float z = 0.0f;
    for (int e = 0; e < E; e++) {
        p[e] = mt_cpu_sigmoid(l[e]);
        z += p[e];
    }
    z += 1e-20f;
    for (int e = 0; e < E; e++) p[e] /= z;
    return z;
}

/* The sequence (of the whole, see struct mt_aux_args) of a call's token n. */
static int aux_seq(const struct mt_aux_args *a, int n)
{
    return (int)((a->first + n) / a->seq_len);
}

void mt_cpu_aux_counts(void *ctx, const struct mt_aux_args *a, float *counts, const float *logits)
{
    (void)ctx;
    const int E = a->num_experts, k = a->topk;
    float *p = mt_cpu_scratch("aux_counts", sizeof(float) * (size_t)E);
    int32_t *idx = mt_cpu_scratch("aux_counts", sizeof(int32_t) * (size_t)k);
    memset(counts, 0, sizeof(float) * (size_t)a->num_seqs * E);
    for (int n = 0; n < a->num_tokens; n++) {
        float *cnt = counts + (size_t)aux_seq(a, n) * E;
        aux_scores(p, logits + (size_t)n * E, E, a->score_fn);
        topk_row(idx, p, E, k);
        for (int j = 0; j < k; j++) cnt[idx[j]] += 1.0f;
    }
    mt_cpu_scratch_give(p);
    mt_cpu_scratch_give(idx);
}

void mt_cpu_aux_loss_fwd(void *ctx, const struct mt_aux_args *a, double *acc, const float *counts,
                         const float *logits)
{
    (void)ctx;
    const int E = a->num_experts;
    const double S = a->seq_len;
    float *p = mt_cpu_scratch("aux_loss_fwd", sizeof(float) * (size_t)E);
    double *psum = mt_cpu_scratch("aux_loss_fwd", sizeof(double) * (size_t)a->num_seqs * E);
    for (size_t i = 0; i < (size_t)a->num_seqs * E; i++) psum[i] = 0.0;
    for (int n = 0; n < a->num_tokens; n++) {
        double *ps = psum + (size_t)aux_seq(a, n) * E;
        aux_scores(p, logits + (size_t)n * E, E, a->score_fn);
        for (int e = 0; e < E; e++) ps[e] += p[e];
    }
    double total = 0.0;
    for (int s = 0; s < a->num_seqs; s++) {
        double seq = 0.0;
        for (int e = 0; e < E; e++)
            seq += (double)counts[(size_t)s * E + e] * psum[(size_t)s * E + e];
        total += seq * E / (S * S * a->topk);
    }
    *acc += (float)(a->coeff * total / a->num_seqs);
    mt_cpu_scratch_give(p);
    mt_cpu_scratch_give(psum);
}

void mt_cpu_aux_loss_bwd(void *ctx, const struct mt_aux_args *a, float *dlogits, float dloss,
                         const float *counts, const float *logits)
{
    (void)ctx;
    const int E = a->num_experts;
    const double S = a->seq_len;
    /* d loss / d p[n,e] = c * count[s(n),e] with c = coeff E / (S^2 k num_seqs) */
    const float c = (float)((double)dloss * a->coeff * E / (S * S * a->topk * a->num_seqs));
    void *scratch = mt_cpu_scratch_threads("aux_loss_bwd", sizeof(float) * (size_t)E);
#pragma omp parallel
    {
        float *p = mt_cpu_slice(scratch, sizeof(float) * (size_t)E);
#pragma omp for schedule(static)
        for (int n = 0; n < a->num_tokens; n++) {
            const float *cnt = counts + (size_t)aux_seq(a, n) * E;
            const float *l = logits + (size_t)n * E;
            float *dl = dlogits + (size_t)n * E;
            float z = aux_scores(p, l, E, a->score_fn);
            float dot = 0.0f;
            for (int e = 0; e < E; e++) dot += c * cnt[e] * p[e];
            if (a->score_fn == MT_SCORE_SOFTMAX) {
                for (int e = 0; e < E; e++) dl[e] += p[e] * (c * cnt[e] - dot);
            } else {
                /* p = s / z, s = sigmoid(l): dL/ds_e = (g_e - <g,p>) / z */
                for (int e = 0; e < E; e++) {
                    float s = p[e] * z;
                    dl[e] += (c * cnt[e] - dot) / z * s * (1.0f - s);
                }
            }
        }
    }
    mt_cpu_scratch_give(scratch);
}

static float logsumexp_row(const float *l, int E)
{
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    for (int e = 0; e < E; e++) sum += expf(l[e] - mx);
    return mx + logf(sum);
}

void mt_cpu_z_loss_fwd(void *ctx, double *acc, float *lse, const float *logits, int N, int E,
                       float coeff)
{
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) lse[n] = logsumexp_row(logits + (size_t)n * E, E);
    if (!acc) return;
    double sum = 0.0;
    for (int n = 0; n < N; n++) sum += (double)lse[n] * lse[n];
    *acc += (float)(coeff * sum / N);
}

void mt_cpu_z_loss_bwd(void *ctx, float *dlogits, float dloss, const float *lse,
                       const float *logits, int N, int E, float coeff)
{
    (void)ctx;
    const float c = dloss * coeff * 2.0f / (float)N;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * E;
        float *dl = dlogits + (size_t)n * E;
        for (int e = 0; e < E; e++) dl[e] += c * lse[n] * expf(l[e] - lse[n]);
    }
}

/* Candidates of one over-full expert, ordered best first by the drop policy. */
struct cand {
    int32_t slot;
    float prob;
};

/* Whether a goes before b: the higher probability, then the earlier slot (a total
 * order: slots differ). */
static bool cand_before(struct cand a, struct cand b)
{
    return a.prob != b.prob ? a.prob > b.prob : a.slot < b.slot;
}

/* Sorts c (n) by cand_before with tmp (n) as room: a bottom-up merge sort, so that
 * nothing is allocated (glibc's qsort mallocs for large arrays). */
static void sort_cands(struct cand *c, struct cand *tmp, int n)
{
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int i = lo, j = mid, o = lo;
            while (i < mid && j < hi) tmp[o++] = cand_before(c[j], c[i]) ? c[j++] : c[i++];
            while (i < mid) tmp[o++] = c[i++];
            while (j < hi) tmp[o++] = c[j++];
        }
        memcpy(c, tmp, sizeof *c * (size_t)n);
    }
}

void mt_cpu_drop_mask(void *ctx, int32_t *out, const int32_t *idx, const int32_t *slot_row,
                      size_t n, int64_t *dropped)
{
    (void)ctx;
    int64_t d = 0;
    for (size_t s = 0; s < n; s++) {
        const bool drop = slot_row[s] < 0;
        out[s] = drop ? -1 : idx[s];
        d += drop;
    }
    if (dropped) *dropped += d;
}

void mt_cpu_expert_select(void *ctx, int32_t *out, const int32_t *idx, size_t n, int e0, int count,
                          int64_t *selected)
{
    (void)ctx;
    if (selected) memset(selected, 0, sizeof *selected * (size_t)count);
    for (size_t s = 0; s < n; s++) {
        const bool mine = idx[s] >= e0 && idx[s] < e0 + count;
        out[s] = mine ? idx[s] - e0 : -1;
        if (mine && selected) selected[out[s]]++;
    }
}

void mt_cpu_expert_bias_update(void *ctx, float *bias, const int64_t *load, int nmoe, int E,
                               float rate, const double *sumsq, const double *loss,
                               int loss_stride, int n_loss)
{
    (void)ctx;
    if (sumsq && !mt_q_step_taken(sumsq, loss, loss_stride, n_loss)) return;
    for (int i = 0; i < nmoe; i++) {
        const int64_t *c = load + (size_t)i * E;
        float *b = bias + (size_t)i * E;
        int64_t total = 0;
        for (int e = 0; e < E; e++) total += c[e];
        const double mean = (double)total / E;
        for (int e = 0; e < E; e++) {
            const double off = mean - (double)c[e];
            b[e] += rate * (float)((off > 0) - (off < 0));
        }
    }
}

void mt_cpu_dispatch_plan(void *ctx, struct mt_dispatch_plan *plan, const int32_t *topk_idx,
                          const float *topk_prob, int N, int E, int topk, int capacity,
                          enum mt_drop_policy policy, bool pad, int64_t *dropped_acc,
                          int64_t *load)
{
    (void)ctx;
    const int S = N * topk;
    int32_t *fill = mt_cpu_scratch("dispatch_plan", sizeof(int32_t) * (size_t)E);
    /* an expert's candidates, and the room to sort them */
    struct cand *cands = mt_cpu_scratch("dispatch_plan", 2 * sizeof(struct cand) * (size_t)(N > 0 ? N : 1));
    long long dropped = 0;
    for (int s = 0; s < S; s++) plan->slot_row[s] = topk_idx[s] < 0 ? -1 : 0; /* 0 = kept, for now */
    for (int e = 0; e < E; e++) plan->kept[e] = 0;
    for (int s = 0; s < S; s++)
        if (topk_idx[s] >= 0) plan->kept[topk_idx[s]]++;
    if (capacity > 0) {
        for (int e = 0; e < E; e++) {
            if (plan->kept[e] <= capacity) continue;
            int nc = 0; /* slots ascend with the token, so candidates are in token order */
            for (int s = 0; s < S; s++)
                if (topk_idx[s] == e) cands[nc++] = (struct cand){s, topk_prob[s]};
            if (policy == MT_DROP_PROBS) sort_cands(cands, cands + N, nc);
            for (int i = capacity; i < nc; i++) plan->slot_row[cands[i].slot] = -1;
            dropped += nc - capacity;
            plan->kept[e] = capacity;
        }
    }
    plan->offsets[0] = 0;
    for (int e = 0; e < E; e++) {
        plan->offsets[e + 1] = plan->offsets[e] + (int32_t)(pad ? capacity : plan->kept[e]);
        fill[e] = plan->offsets[e];
    }
    for (int s = 0; s < S; s++) {
        if (plan->slot_row[s] < 0) continue;
        int e = topk_idx[s];
        plan->slot_row[s] = fill[e];
        plan->row_slot[fill[e]++] = s;
    }
    for (int e = 0; e < E; e++)
        for (int r = fill[e]; r < plan->offsets[e + 1]; r++) plan->row_slot[r] = -1;
    mt_cpu_scratch_give(fill);
    mt_cpu_scratch_give(cands);
    if (dropped_acc) *dropped_acc += dropped;
    if (load)
        for (int e = 0; e < E; e++) load[e] += plan->kept[e];
}

/* The typed ops below read and write their bf16 rows a row at a time (a row's values
 * widened into, or rounded from, a buffer of the thread's), so bf16 costs no pass of its
 * own; the fp32 arithmetic is the same. */

void mt_cpu_t_permute_fwd(void *ctx, struct mt_tensor xp, struct mt_tensor x,
                          const int32_t *row_slot, int rows, int topk, int C)
{
    (void)ctx;
    mt_cpu_check_dense("permute_fwd", xp);
    mt_cpu_check_dense("permute_fwd", x);
    const size_t de = mt_dtype_size(xp.dtype), se = mt_dtype_size(x.dtype);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        char *dst = (char *)xp.data + (size_t)r * C * de;
        if (row_slot[r] < 0) {
            memset(dst, 0, de * (size_t)C); /* +0 in fp32 and in bf16 */
            continue;
        }
        const char *src = (const char *)x.data + (size_t)(row_slot[r] / topk) * C * se;
        mt_cpu_convert_span(dst, xp.dtype, src, x.dtype, (size_t)C);
    }
}

void mt_cpu_permute_bwd(void *ctx, float *dx, const float *dxp, const int32_t *slot_row,
                        int N, int topk, int C)
{
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *d = dx + (size_t)n * C;
        for (int j = 0; j < topk; j++) {
            int r = slot_row[(size_t)n * topk + j];
            if (r < 0) continue;
            const float *src = dxp + (size_t)r * C;
            for (int c = 0; c < C; c++) d[c] += src[c];
        }
    }
}

void mt_cpu_t_unpermute_fwd(void *ctx, struct mt_tensor out, struct mt_tensor yp,
                            const int32_t *slot_row, const float *prob, int N, int topk, int C)
{
    (void)ctx;
    mt_cpu_check_dense("unpermute_fwd", out);
    mt_cpu_check_dense("unpermute_fwd", yp);
    const size_t row = sizeof(float) * (size_t)C;
    void *bufs = mt_cpu_scratch_threads("unpermute_fwd", 2 * row);
#pragma omp parallel
    {
        float *ybuf = mt_cpu_slice(bufs, 2 * row), *obuf = ybuf + C;
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            float *o = mt_cpu_span_out(out, (size_t)n * C, obuf);
            memset(o, 0, row);
            for (int j = 0; j < topk; j++) {
                size_t s = (size_t)n * topk + j;
                if (slot_row[s] < 0) continue;
                const float *y = mt_cpu_span_in(yp, (size_t)slot_row[s] * C, (size_t)C, ybuf);
                for (int c = 0; c < C; c++) o[c] += prob[s] * y[c];
            }
            mt_cpu_span_store(out, (size_t)n * C, (size_t)C, o);
        }
    }
    mt_cpu_scratch_give(bufs);
}

void mt_cpu_t_unpermute_bwd(void *ctx, float *dyp, float *dprob, const float *dout,
                            struct mt_tensor yp, const int32_t *slot_row, const float *prob,
                            int N, int topk, int C, int rows)
{
    (void)ctx;
    mt_cpu_check_dense("unpermute_bwd", yp);
    void *bufs = mt_cpu_scratch_threads("unpermute_bwd", sizeof(float) * (size_t)C);
#pragma omp parallel
    {
        float *ybuf = mt_cpu_slice(bufs, sizeof(float) * (size_t)C);
        /* rows no slot names (dropped, padding) get zeros: all cleared first, each
         * thread a block of rows */
        int r0, r1;
        mt_cpu_split(rows, &r0, &r1);
        if (r1 > r0) memset(dyp + (size_t)r0 * C, 0, sizeof(float) * (size_t)(r1 - r0) * C);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * C;
            for (int j = 0; j < topk; j++) {
                size_t s = (size_t)n * topk + j;
                int r = slot_row[s];
                if (r < 0) {
                    dprob[s] = 0.0f;
                    continue;
                }
                const float *y = mt_cpu_span_in(yp, (size_t)r * C, (size_t)C, ybuf);
                float *dy = dyp + (size_t)r * C;
                float dot = 0.0f;
                for (int c = 0; c < C; c++) {
                    dy[c] = prob[s] * d[c];
                    dot += d[c] * y[c];
                }
                dprob[s] = dot;
            }
        }
    }
    mt_cpu_scratch_give(bufs);
}

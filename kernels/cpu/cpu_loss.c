/* CPU reference backend: cross-entropy, AdamW, bf16 rounding, the sum of squares. */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/quant.h"

void mt_cpu_cross_entropy_fwd(void *ctx, float *lse, float *tlogit, const float *logits,
                              const int32_t *targets, int N, int V, int v0)
{
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V;
        float mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
        for (int v = 0; v < V; v++) mx = l[v] > mx ? l[v] : mx;
#pragma omp simd reduction(+ : sum)
        for (int v = 0; v < V; v++) sum += mt_cpu_expf(l[v] - mx);
        lse[n] = mx + logf(sum);
        int t = targets[n] - v0;
        tlogit[n] = targets[n] >= 0 && t >= 0 && t < V ? l[t] : 0.0f;
    }
}

void mt_cpu_cross_entropy_bwd(void *ctx, float *dlogits, const float *logits, const float *lse,
                              const int32_t *targets, int N, int V, int v0, float scale)
{
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V; /* d may alias l */
        float *d = dlogits + (size_t)n * V;
        if (targets[n] < 0) {
            for (int v = 0; v < V; v++) d[v] = 0.0f;
            continue;
        }
        const float ln = lse[n];
#pragma omp simd
        for (int v = 0; v < V; v++) d[v] = scale * mt_cpu_expf(l[v] - ln);
        int t = targets[n] - v0;
        if (t >= 0 && t < V) d[t] -= scale;
    }
}

/* Per token, the shards in order: the same bits for any thread count. */
void mt_cpu_lse_combine(void *ctx, float *lse, const float *shard_lse, int R, int N)
{
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float hi = -INFINITY;
        for (int r = 0; r < R; r++) hi = shard_lse[(size_t)r * N + n] > hi ? shard_lse[(size_t)r * N + n] : hi;
        double sum = 0.0;
        for (int r = 0; r < R; r++) sum += exp((double)shard_lse[(size_t)r * N + n] - hi);
        lse[n] = hi + (float)log(sum);
    }
}

/* The fp64 sum in loss_sum's order (kernels.h): lanes of strided tokens, then pairwise. */
void mt_cpu_loss_sum(void *ctx, double *acc, const float *lse, const float *tlogit,
                     const int32_t *targets, int N)
{
    (void)ctx;
    double s[MT_LOSS_SUM_LANES] = {0};
    for (int n = 0; n < N; n++)
        if (targets[n] >= 0) s[n % MT_LOSS_SUM_LANES] += lse[n] - tlogit[n];
    for (int w = MT_LOSS_SUM_LANES / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) s[j] += s[j + w];
    *acc += s[0];
}

/* AdamW's update of n values with the constants of its step. */
static void adamw_apply(float *param, const float *grad, float *m, float *v, size_t n,
                        const struct mt_adamw_consts *k, float grad_scale)
{
    const float beta1 = k->beta1, beta2 = k->beta2, one_m_b1 = k->one_m_b1, one_m_b2 = k->one_m_b2;
    const float step = k->step, decay = k->decay, bc2_sqrt = k->bc2_sqrt, eps = k->eps;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        m[i] = beta1 * m[i] + one_m_b1 * g;
        v[i] = beta2 * v[i] + one_m_b2 * g * g;
        param[i] = param[i] * decay - step * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
    }
}

void mt_cpu_adamw(void *ctx, float *param, const float *grad, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay,
                  float grad_scale, long long t)
{
    (void)ctx;
    const struct mt_adamw_consts k = mt_adamw_consts_of(lr, beta1, beta2, eps, weight_decay, t);
    adamw_apply(param, grad, m, v, n, &k, grad_scale);
}

void mt_cpu_adamw_dev(void *ctx, float *param, const float *grad, float *m, float *v, size_t n,
                      const struct mt_adamw_consts *k, const double *sumsq, const double *loss,
                      int loss_stride, int n_loss, double clip)
{
    (void)ctx;
    if (!mt_q_step_taken(sumsq, loss, loss_stride, n_loss)) return;
    const double norm = sqrt(*sumsq);
    const float scale = clip > 0 && norm > clip ? (float)(clip / (norm + 1e-6)) : 1.0f;
    adamw_apply(param, grad, m, v, n, k, scale);
}

void mt_cpu_bf16_round(void *ctx, float *out, const float *x, size_t n)
{
    (void)ctx;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = mt_cpu_bf16(x[i]);
}

void mt_cpu_scale(void *ctx, float *x, float s, size_t n)
{
    (void)ctx;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* One running fp64 sum in index order: the same bits for any thread count, and
 * calls over consecutive pieces equal one call over the whole. */
/* The sum of squares in a fixed order that no thread count changes: blocks of
 * SUMSQ_BLOCK values, each summed in SUMSQ_LANES interleaved fp64 lanes (independent
 * additions, so not one add's latency per value) combined pairwise; the blocks' sums
 * added to acc in block order. The blocks of a group of SUMSQ_GROUP are summed in
 * parallel. */
#define SUMSQ_BLOCK 8192
#define SUMSQ_LANES 8
#define SUMSQ_GROUP 256

static double sumsq_block(const float *x, size_t n)
{
    double lane[SUMSQ_LANES] = {0};
    size_t i = 0;
    for (; i + SUMSQ_LANES <= n; i += SUMSQ_LANES)
#pragma omp simd
        for (int j = 0; j < SUMSQ_LANES; j++) lane[j] += (double)x[i + j] * x[i + j];
    for (int j = 0; i < n; i++, j++) lane[j] += (double)x[i] * x[i];
    for (int w = SUMSQ_LANES / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) lane[j] += lane[j + w];
    return lane[0];
}

void mt_cpu_sumsq(void *ctx, double *acc, const float *x, size_t n)
{
    (void)ctx;
    double a = *acc;
    for (size_t g = 0; g < n; g += (size_t)SUMSQ_GROUP * SUMSQ_BLOCK) {
        const size_t len = n - g < (size_t)SUMSQ_GROUP * SUMSQ_BLOCK
                               ? n - g : (size_t)SUMSQ_GROUP * SUMSQ_BLOCK;
        const int nb = (int)((len + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK);
        double part[SUMSQ_GROUP];
        if (nb < 4) { /* no region for a small one: libgomp allocates a team per region */
            for (int b = 0; b < nb; b++)
                part[b] = sumsq_block(x + g + (size_t)b * SUMSQ_BLOCK,
                                      b == nb - 1 ? len - (size_t)b * SUMSQ_BLOCK : SUMSQ_BLOCK);
        } else {
#pragma omp parallel for schedule(static)
            for (int b = 0; b < nb; b++)
                part[b] = sumsq_block(x + g + (size_t)b * SUMSQ_BLOCK,
                                      b == nb - 1 ? len - (size_t)b * SUMSQ_BLOCK : SUMSQ_BLOCK);
        }
        for (int b = 0; b < nb; b++) a += part[b];
    }
    *acc = a;
}

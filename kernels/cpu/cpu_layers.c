/* CPU reference backend: embedding, RMSNorm, RoPE, attention, SwiGLU, add.
 * Loops are parallel over independent rows; parameter-gradient reductions are
 * parallel over columns with the rows summed in order, so results do not depend
 * on the number of threads. */
#include "kernels/cpu/cpu_ops.h"

#include <stdlib.h>

void mt_cpu_embedding_fwd(void *ctx, float *out, const int32_t *tokens, const float *wte,
                          int N, int C)
{
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        if (tokens[n] < 0)
            memset(out + (size_t)n * C, 0, sizeof(float) * (size_t)C);
        else
            memcpy(out + (size_t)n * C, wte + (size_t)tokens[n] * C, sizeof(float) * (size_t)C);
    }
}

void mt_cpu_embedding_bwd(void *ctx, float *dwte, const float *dout, const int32_t *tokens,
                          int N, int C)
{
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++)
        for (int n = 0; n < N; n++)
            if (tokens[n] >= 0) dwte[(size_t)tokens[n] * C + c] += dout[(size_t)n * C + c];
}

void mt_cpu_rmsnorm_fwd(void *ctx, float *out, float *rstd, const float *x, const float *w,
                        int N, int C, float eps)
{
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *xn = x + (size_t)n * C;
        float *on = out + (size_t)n * C;
        float ss = 0.0f;
        for (int c = 0; c < C; c++) ss += xn[c] * xn[c];
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        for (int c = 0; c < C; c++) on[c] = xn[c] * r * w[c];
        rstd[n] = r;
    }
}

void mt_cpu_rmsnorm_bwd(void *ctx, float *dx, float *dw, const float *dout, const float *x,
                        const float *w, const float *rstd, int N, int C)
{
    (void)ctx;
    /* y = x r w with r = (mean x^2 + eps)^-1/2:
     * dx = r (w dy) - x r^3 (sum_c w dy x) / C */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *xn = x + (size_t)n * C, *dn = dout + (size_t)n * C;
        float *dxn = dx + (size_t)n * C;
        float r = rstd[n], dot = 0.0f;
        for (int c = 0; c < C; c++) dot += w[c] * dn[c] * xn[c];
        float k = dot * r * r * r / (float)C;
        for (int c = 0; c < C; c++) dxn[c] += r * w[c] * dn[c] - k * xn[c];
    }
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        float acc = 0.0f;
        for (int n = 0; n < N; n++) acc += dout[(size_t)n * C + c] * x[(size_t)n * C + c] * rstd[n];
        dw[c] += acc;
    }
}

/* cos/sin of t * theta^(-2i/D) for t < T, i < D/2, as HF computes them in fp32:
 * inv_freq = 1 / theta^(2i/D) rounded to fp32, angle = fp32(t) * inv_freq in fp32. */
static float *rope_table(int T, int D, float theta)
{
    int half = D / 2;
    float *tab = malloc(sizeof(float) * 2 * (size_t)T * (size_t)half);
    if (!tab) abort(); /* a few KB; the backend has no error channel for this */
    for (int i = 0; i < half; i++) {
        float inv = (float)(1.0 / pow((double)theta, (double)(2 * i) / (double)D));
        for (int t = 0; t < T; t++) {
            float ang = (float)t * inv;
            tab[((size_t)t * half + i) * 2] = cosf(ang);
            tab[((size_t)t * half + i) * 2 + 1] = sinf(ang);
        }
    }
    return tab;
}

/* sign = +1: out = x cos + rotate_half(x) sin (forward); -1: the transpose (backward). */
static void rope_apply(float *out, const float *x, int B, int T, int H, int D, float theta,
                       float sign)
{
    int half = D / 2;
    float *tab = rope_table(T, D, theta);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                size_t base = (((size_t)b * T + t) * H + h) * D;
                for (int i = 0; i < half; i++) {
                    float c = tab[((size_t)t * half + i) * 2];
                    float s = sign * tab[((size_t)t * half + i) * 2 + 1];
                    float x1 = x[base + i], x2 = x[base + i + half];
                    out[base + i] = x1 * c - x2 * s;
                    out[base + i + half] = x2 * c + x1 * s;
                }
            }
    free(tab);
}

void mt_cpu_rope_fwd(void *ctx, float *out, const float *x, int B, int T, int H, int D,
                     float theta)
{
    (void)ctx;
    rope_apply(out, x, B, T, H, D, theta, 1.0f);
}

void mt_cpu_rope_bwd(void *ctx, float *dx, const float *dout, int B, int T, int H, int D,
                     float theta)
{
    (void)ctx;
    rope_apply(dx, dout, B, T, H, D, theta, -1.0f);
}

/* Scaled score of query row qt against key row ks. */
static float attention_score(const float *qt, const float *ks, int D, float scale)
{
    float dot = 0.0f;
    for (int d = 0; d < D; d++) dot += qt[d] * ks[d];
    return dot * scale;
}

void mt_cpu_attention_fwd(void *ctx, float *out, float *lse, const float *q, const float *k,
                          const float *v, int B, int T, int Hq, int Hkv, int D)
{
    (void)ctx;
    const float scale = 1.0f / sqrtf((float)D);
    const int rep = Hq / Hkv;
    /* One task per (batch, head), one row of T probabilities at a time. */
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            int g = h / rep;
            float *row = malloc(sizeof(float) * (size_t)(T > 0 ? T : 1));
            if (!row) abort();
            for (int t = 0; t < T; t++) {
                const float *qt = q + (((size_t)b * T + t) * Hq + h) * D;
                float mx = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    row[s] = attention_score(qt, k + (((size_t)b * T + s) * Hkv + g) * D, D, scale);
                    if (row[s] > mx) mx = row[s];
                }
                float sum = 0.0f;
                for (int s = 0; s <= t; s++) {
                    row[s] = expf(row[s] - mx);
                    sum += row[s];
                }
                float inv = 1.0f / sum;
                float *ot = out + (((size_t)b * T + t) * Hq + h) * D;
                for (int d = 0; d < D; d++) ot[d] = 0.0f;
                for (int s = 0; s <= t; s++) {
                    const float *vs = v + (((size_t)b * T + s) * Hkv + g) * D;
                    float p = row[s] * inv;
                    for (int d = 0; d < D; d++) ot[d] += p * vs[d];
                }
                lse[((size_t)b * Hq + h) * T + t] = mx + logf(sum);
            }
            free(row);
        }
}

void mt_cpu_attention_bwd(void *ctx, float *dq, float *dk, float *dv, const float *dout,
                          const float *q, const float *k, const float *v, const float *out,
                          const float *lse, int B, int T, int Hq, int Hkv, int D)
{
    (void)ctx;
    const float scale = 1.0f / sqrtf((float)D);
    const int rep = Hq / Hkv;
    /* P = exp(s - lse) is recomputed one score at a time; with delta = rowsum(dout * out)
     * (= sum_s P dP), dS = P (dP - delta). One task per (batch, KV group): it owns dk,
     * dv of its group and dq of its heads, and visits the heads of the group in order. */
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < Hkv; g++) {
            for (int t = 0; t < T; t++) {
                memset(dk + (((size_t)b * T + t) * Hkv + g) * D, 0, sizeof(float) * (size_t)D);
                memset(dv + (((size_t)b * T + t) * Hkv + g) * D, 0, sizeof(float) * (size_t)D);
            }
            for (int h = g * rep; h < (g + 1) * rep; h++) {
                for (int t = 0; t < T; t++) {
                    const size_t qrow = (((size_t)b * T + t) * Hq + h) * D;
                    const float *dot_ = dout + qrow, *qt = q + qrow, *ot = out + qrow;
                    const float lse_t = lse[((size_t)b * Hq + h) * T + t];
                    float *dqt = dq + qrow;
                    float delta = 0.0f;
                    for (int d = 0; d < D; d++) delta += dot_[d] * ot[d];
                    for (int d = 0; d < D; d++) dqt[d] = 0.0f;
                    for (int s = 0; s <= t; s++) {
                        const size_t kvrow = (((size_t)b * T + s) * Hkv + g) * D;
                        const float *ks = k + kvrow, *vs = v + kvrow;
                        float *dks = dk + kvrow, *dvs = dv + kvrow;
                        float p = expf(attention_score(qt, ks, D, scale) - lse_t);
                        float dp = 0.0f;
                        for (int d = 0; d < D; d++) {
                            dp += dot_[d] * vs[d];
                            dvs[d] += p * dot_[d];
                        }
                        float ds = p * (dp - delta) * scale;
                        for (int d = 0; d < D; d++) {
                            dqt[d] += ds * ks[d];
                            dks[d] += ds * qt[d];
                        }
                    }
                }
            }
        }
}

void mt_cpu_swiglu_fwd(void *ctx, float *out, const float *gate, const float *up, int N, int F)
{
    (void)ctx;
    size_t n = (size_t)N * F;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g * mt_cpu_sigmoid(g) * up[i];
    }
}

void mt_cpu_swiglu_bwd(void *ctx, float *dgate, float *dup, const float *dout,
                       const float *gate, const float *up, int N, int F)
{
    (void)ctx;
    size_t n = (size_t)N * F;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], s = mt_cpu_sigmoid(g), d = dout[i];
        float silu = g * s;
        dgate[i] = d * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] = d * silu;
    }
}

void mt_cpu_add(void *ctx, float *out, const float *a, const float *b, size_t n)
{
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* The FP8/FP4 recipes in the model (src/model/model_lowp.c, doc/fp8.md): one quantised
 * linear layer of a model (its q projection), forward, dgrad and wgrad, equals the
 * product of its operands quantised directly with kernels/cpu/cpu_quant.c's functions
 * as each recipe prescribes, for every recipe. The GEMMs run on BLAS, so results are
 * compared within the bound of fp32 accumulation, (K + 2) 2^-24 sum |a b|, far below
 * what any other choice of scaling, block direction, element format, rounding or
 * Hadamard signs moves them (at least a quantisation step, 2^-4 relative and more).
 * And the wgrad GEMM reads the copy of x the forward saved (test_saved_*); MXFP8 and
 * blockwise, whose values mostly agree, are told apart (test_*_not_*). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/quant_recipe.h"
#include "model/model_internal.h"
#include "tests/model/tiny_config.h"
#include "util/rng.h"

#define B_ 2
#define T_ 20 /* N = 40 tokens: 32-row MX blocks and 16-row Hadamard groups with a tail */

enum recipe { DELAYED, TENSORWISE, BLOCKWISE, MXFP8, NVFP4, NRECIPES };
static const char *const recipe_names[] = {"delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4"};
enum role { X, W, G };
enum use { FWD, DGRAD, WGRAD };

/* A dense one-layer model whose q projection is (80, 160): 1 x 128 tiles and 128 x 128
 * blocks with partial ones. */
static void config(struct mt_config *c, enum recipe r)
{
    tiny_config(c);
    c->model.num_layers = 1;
    c->model.hidden_size = 160;
    c->model.num_attention_heads = 4;
    c->model.num_query_groups = 2;
    c->model.kv_channels = 20;
    c->model.ffn_hidden_size = 48;
    c->moe.num_experts = 0;
    c->moe.layer_freq[0] = 0;
    c->moe.shared_expert_intermediate_size = 0;
    c->training.seq_length = T_;
    struct mt_config_precision *q = &c->precision;
    strcpy(q->fp8_recipe, "delayed");
    q->fp8_amax_history_len = 1;
    strcpy(q->fp8_amax_compute_algo, "most_recent");
    strcpy(q->fp4_recipe, "nvfp4");
    q->num_layers_at_start_in_bf16 = q->num_layers_at_end_in_bf16 = 1;
    if (r == NVFP4) {
        strcpy(q->fp4_format, "e2m1");
    } else {
        strcpy(q->fp8_format, r == BLOCKWISE || r == MXFP8 ? "e4m3" : "hybrid");
        strcpy(q->fp8_recipe, recipe_names[r]);
    }
    if (r == DELAYED) q->fp8_margin = 1;
}

/* Normal values times magnitudes that vary over rows (2^15) and columns (2^8), and an
 * outlier, so that blocks along a row and along a column get other scales, their
 * small elements fall into the subnormals differently, and tensor scales differ from
 * block scales: a block taken the wrong way changes results far beyond the bound. */
static void fill(float *x, int64_t rows, int64_t cols, uint64_t key, float scale)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            x[r * cols + c] = ldexpf(scale * mt_rng_normal(key, 0, (uint64_t)(r * cols + c)),
                                     3 * (int)(r % 6) + 2 * (int)(c % 5) - 12);
    x[rows * cols / 3] *= 40.0f;
}

static void transpose(const float *a, float *t, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) t[c * rows + r] = a[r * cols + c];
}

/* The model's numbering (model_lowp.c): the q projection of layer 0 is slot 0; the
 * random stream of operand role in use u is (slot * 3 + role) * 3 + u, the Hadamard
 * signs' stream the slot. */
static uint32_t stream_of(enum role role, enum use u) { return (uint32_t)((0 * 3 + role) * 3 + u); }

struct ref {
    enum recipe r;
    float scale[3]; /* delayed: the encode scales the histories give */
    uint64_t seed;  /* the backward pass's seed */
};

/* x (rows, cols) quantised as recipe r prescribes for operand role in use u, and
 * dequantised, in out; written from the recipes' definitions (doc/fp8.md). */
static void reference(const struct ref *rf, enum role role, enum use u, const float *x,
                      int64_t rows, int64_t cols, float *out)
{
    struct mt_err err;
    const size_t n = (size_t)rows * cols;
    float *v = malloc(sizeof(float) * n), *t = malloc(sizeof(float) * n);
    memcpy(v, x, sizeof(float) * n);
    /* the reduction runs along the rows of W in dgrad and of both wgrad operands */
    const bool down = u == WGRAD || (role == W && u == DGRAD);
    struct mt_qtensor q;
    switch (rf->r) {
    case DELAYED:
    case TENSORWISE: {
        const enum mt_q_elem el = role == G ? MT_Q_ELEM_E5M2 : MT_Q_ELEM_E4M3;
        const float fmax = role == G ? MT_E5M2_MAX : MT_E4M3_MAX;
        const float s = rf->r == DELAYED ? rf->scale[role]
                                         : mt_q_tensor_scale(mt_q_amax(v, rows, cols, cols), fmax, 0);
        assert_int_equal(mt_qtensor_init(&q, MT_Q_TENSOR, el, MT_Q_ALONG_ROW, rows, cols, &err), MT_OK);
        assert_int_equal(mt_quant_tensorwise(&q, v, cols, s, MT_Q_RN, 0, 0, &err), MT_OK);
        assert_int_equal(mt_dequant(&q, out, cols, &err), MT_OK);
        break;
    }
    case BLOCKWISE:
        if (role == W) { /* 128 x 128 blocks, whichever way the GEMM reads them */
            assert_int_equal(mt_qtensor_init(&q, MT_Q_BLOCK_128X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW,
                                             rows, cols, &err), MT_OK);
            assert_int_equal(mt_quant_blockwise(&q, v, cols, 1, &err), MT_OK);
            assert_int_equal(mt_dequant(&q, out, cols, &err), MT_OK);
        } else if (!down) { /* 1 x 128 tiles along the row */
            assert_int_equal(mt_qtensor_init(&q, MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW,
                                             rows, cols, &err), MT_OK);
            assert_int_equal(mt_quant_blockwise(&q, v, cols, 1, &err), MT_OK);
            assert_int_equal(mt_dequant(&q, out, cols, &err), MT_OK);
        } else { /* 128 x 1 tiles: 1 x 128 tiles of the transpose */
            transpose(v, t, rows, cols);
            assert_int_equal(mt_qtensor_init(&q, MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW,
                                             cols, rows, &err), MT_OK);
            assert_int_equal(mt_quant_blockwise(&q, t, rows, 1, &err), MT_OK);
            assert_int_equal(mt_dequant(&q, t, rows, &err), MT_OK);
            transpose(t, out, cols, rows);
        }
        break;
    case MXFP8: /* E4M3 everywhere, 32-blocks along the reduction, from the fp32 values */
        assert_int_equal(mt_qtensor_init(&q, MT_Q_MX, MT_Q_ELEM_E4M3,
                                         down ? MT_Q_ALONG_COL : MT_Q_ALONG_ROW, rows, cols, &err),
                         MT_OK);
        assert_int_equal(mt_quant_mxfp8(&q, v, cols, &err), MT_OK);
        assert_int_equal(mt_dequant(&q, out, cols, &err), MT_OK);
        break;
    case NVFP4: {
        const enum mt_q_round rnd = role == G ? MT_Q_SR : MT_Q_RN;
        const uint32_t st = stream_of(role, u);
        if (u == WGRAD) /* the Hadamard transform over the tokens, whole groups of 16 */
            assert_int_equal(mt_q_rht(v, rows / 16 * 16, cols, cols, MT_Q_ALONG_COL, rf->seed, 0, &err),
                             MT_OK);
        if (role == W) { /* 16 x 16 blocks */
            assert_int_equal(mt_qtensor_init(&q, MT_Q_NVFP4_2D, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, rows,
                                             cols, &err), MT_OK);
            assert_int_equal(mt_quant_nvfp4(&q, v, cols, rnd, rf->seed, st, &err), MT_OK);
            assert_int_equal(mt_dequant(&q, out, cols, &err), MT_OK);
        } else if (!down) {
            assert_int_equal(mt_qtensor_init(&q, MT_Q_NVFP4, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, rows,
                                             cols, &err), MT_OK);
            assert_int_equal(mt_quant_nvfp4(&q, v, cols, rnd, rf->seed, st, &err), MT_OK);
            assert_int_equal(mt_dequant(&q, out, cols, &err), MT_OK);
        } else { /* 16-element blocks down the columns: along the rows of the transpose */
            transpose(v, t, rows, cols);
            assert_int_equal(mt_qtensor_init(&q, MT_Q_NVFP4, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, cols,
                                             rows, &err), MT_OK);
            assert_int_equal(mt_quant_nvfp4(&q, t, rows, rnd, rf->seed, st, &err), MT_OK);
            assert_int_equal(mt_dequant(&q, t, rows, &err), MT_OK);
            transpose(t, out, cols, rows);
        }
        break;
    }
    case NRECIPES: break;
    }
    mt_qtensor_free(&q);
    free(v);
    free(t);
}

/* c (m, n) against sum_k a[i,k] b[k,j] (a(i,k) = a[i * sa_i + k * sa_k], likewise b)
 * within fp32 accumulation's bound; returns the largest error in units of the bound. */
static double check_gemm(const float *c, const float *a, int64_t sai, int64_t sak, const float *b,
                         int64_t sbk, int64_t sbj, int64_t m, int64_t n, int64_t k, const char *what)
{
    double worst = 0.0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0, mag = 0.0;
            for (int64_t l = 0; l < k; l++) {
                double p = (double)a[i * sai + l * sak] * b[l * sbk + j * sbj];
                s += p;
                mag += fabs(p);
            }
            const double bound = (double)(k + 2) * ldexp(1.0, -24) * mag + 1e-30;
            const double e = fabs((double)c[i * n + j] - s) / bound;
            if (e > worst) worst = e;
            if (e > 1.0) {
                printf("# %s: [%lld,%lld] = %.9g, reference %.9g, bound %.3g\n", what, (long long)i,
                       (long long)j, (double)c[i * n + j], s, bound);
                fail();
            }
        }
    return worst;
}

/* A model of config(r), initialised. */
static struct mt_model *new_model(enum recipe r)
{
    struct mt_config cfg;
    config(&cfg, r);
    struct mt_model *m;
    struct mt_err err;
    int rc = mt_model_create(&cfg, mt_kernels_cpu(), B_, NULL, &m, &err);
    if (rc != MT_OK) printf("# %s\n", err.msg);
    assert_int_equal(rc, MT_OK);
    mt_model_init(m, 42);
    return m;
}

static void run(enum recipe r)
{
    struct mt_model *m = new_model(r);
    struct mt_err err;
    const int N = B_ * T_, dout = m->Q_l, din = m->H, tensor = m->lt[0].wq;
    assert_int_equal(dout, 80);
    assert_int_equal(din, 160);
    struct mt_model_stats st;
    struct mt_pass p = {m, &m->k->op, m->k->ctx, B_, N, N, 0, true, false, 1.0f, &st, &err};
    float *x = malloc(sizeof(float) * N * din), *dy = malloc(sizeof(float) * N * dout);
    float *out = malloc(sizeof(float) * N * dout), *dx = calloc((size_t)N * din, sizeof(float));
    fill(x, N, din, 11, 1.0f);
    fill(dy, N, dout, 12, 1e-3f);
    /* the weight too (fp32 training: the working copy is the master) */
    float *w = mt_model_weight(m, tensor).data;
    fill(w, dout, din, 13, 0.05f);
    float *dw = mt_model_view(m->grads, m, tensor);
    struct ref rf = {r, {1, 1, 1}, 0};
    if (r == DELAYED) { /* one recorded step: the next scales come from its amaxes */
        mt_lowp_backward_begin(m, 1.0f);
        assert_int_equal(mt_pass_qlinear_fwd(&p, tensor, mt_f32(out, N, dout), mt_f32(x, N, din), N, dout, din), MT_OK);
        assert_int_equal(mt_pass_qlinear_bwd(&p, tensor, dx, 0.0f, dy, mt_f32(x, N, din), N, dout, din), MT_OK);
        assert_int_equal(mt_model_lowp_step(m, false, &err), MT_OK);
        rf.scale[X] = mt_q_tensor_scale(mt_q_amax(x, N, din, din), MT_E4M3_MAX, 1);
        rf.scale[W] = mt_q_tensor_scale(mt_q_amax(w, dout, din, din), MT_E4M3_MAX, 1);
        rf.scale[G] = mt_q_tensor_scale(mt_q_amax(dy, N, dout, dout), MT_E5M2_MAX, 1);
    }
    mt_model_zero_grad(m);
    mt_lowp_backward_begin(m, 1.0f);
    rf.seed = mt_lowp_backward_seed(m);
    assert_int_equal(mt_pass_qlinear_fwd(&p, tensor, mt_f32(out, N, dout), mt_f32(x, N, din), N, dout, din), MT_OK);
    assert_int_equal(mt_pass_qlinear_bwd(&p, tensor, dx, 0.0f, dy, mt_f32(x, N, din), N, dout, din), MT_OK);

    const size_t most = (size_t)(N > dout ? N : dout) * din;
    float *qa = malloc(sizeof(float) * most), *qb = malloc(sizeof(float) * most);
    double worst[3];
    /* forward: out = q(x) q(W)^T */
    reference(&rf, X, FWD, x, N, din, qa);
    reference(&rf, W, FWD, w, dout, din, qb);
    worst[0] = check_gemm(out, qa, din, 1, qb, 1, din, N, dout, din, "forward");
    /* dgrad: dx = q(dy) q'(W) */
    reference(&rf, G, DGRAD, dy, N, dout, qa);
    reference(&rf, W, DGRAD, w, dout, din, qb);
    worst[1] = check_gemm(dx, qa, dout, 1, qb, din, 1, N, din, dout, "dgrad");
    /* wgrad: dW = q'(dy)^T q'(x) */
    reference(&rf, G, WGRAD, dy, N, dout, qa);
    reference(&rf, X, WGRAD, x, N, din, qb);
    worst[2] = check_gemm(dw, qa, 1, dout, qb, din, 1, dout, din, N, "wgrad");
    printf("# %s: forward, dgrad, wgrad within %.2f, %.2f, %.2f of the fp32 accumulation bound\n",
           recipe_names[r], worst[0], worst[1], worst[2]);
    /* and the quantisation did something: the forward differs from the fp32 product */
    double moved = 0.0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < dout; j++) {
            double s = 0.0;
            for (int l = 0; l < din; l++) s += (double)x[i * din + l] * w[j * din + l];
            moved = fmax(moved, fabs(s - out[i * dout + j]));
        }
    assert_true(moved > 1e-4);
    free(qa), free(qb), free(x), free(dy), free(out), free(dx);
    mt_model_destroy(m);
}

static void test_delayed(void **s) { (void)s; run(DELAYED); }
static void test_tensorwise(void **s) { (void)s; run(TENSORWISE); }
static void test_blockwise(void **s) { (void)s; run(BLOCKWISE); }
static void test_mxfp8(void **s) { (void)s; run(MXFP8); }
static void test_nvfp4(void **s) { (void)s; run(NVFP4); }

/* MXFP8 is not blockwise. Both are E4M3 with power-of-two scales, and an element's value
 * under a power-of-two scale is the element rounded to E4M3's 3 mantissa bits whatever
 * the scale, unless it falls into E4M3's subnormals (below 2^-6 of the scale's range,
 * about 2^-15 of its block's amax) or saturates: so the two recipes store other codes
 * (other exponents under other scales) but mostly the same values, and a model's losses
 * can agree to many digits (doc/fp8.md, "MXFP8 and blockwise"). What tells them apart is
 * a block of large values beside small ones: MXFP8 gives each 32 elements along the
 * reduction their own scale, blockwise one scale to a 1 x 128 tile or a 128 x 128 block,
 * under which the small ones are subnormal or zero. Here, for each of the two recipes:
 * the specs the recipe gives each operand, the model's recipe name, and two GEMMs whose
 * small operands meet large ones in one 32-block (forward: x's columns 32..63 large and
 * W's zero there; dgrad: W's rows 32..63 large and dy's columns zero there), each equal
 * to the recipe's own reference product and far from the other recipe's. */
static void fill_range(float *x, int64_t rows, int64_t cols, uint64_t key, float scale)
{
    for (int64_t i = 0; i < rows * cols; i++) x[i] = scale * mt_rng_normal(key, 0, (uint64_t)i);
}

/* max |c - op(a) op(b)| / max(|c|, |op(a) op(b)|) for the product check_gemm takes */
static double gemm_distance(const float *c, const float *a, int64_t sai, int64_t sak, const float *b,
                            int64_t sbk, int64_t sbj, int64_t m, int64_t n, int64_t k)
{
    double d = 0.0, big = 0.0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0;
            for (int64_t l = 0; l < k; l++) s += (double)a[i * sai + l * sak] * b[l * sbk + j * sbj];
            d = fmax(d, fabs(c[i * n + j] - s));
            big = fmax(big, fmax(fabs((double)c[i * n + j]), fabs(s)));
        }
    return d / big;
}

static void mx_not_blockwise(enum recipe r)
{
    const enum recipe other = r == MXFP8 ? BLOCKWISE : MXFP8;
    const enum mt_q_recipe qr = r == MXFP8 ? MT_RECIPE_MXFP8 : MT_RECIPE_BLOCKWISE;
    /* the specs: MXFP8 32-blocks along each use's reduction, E4M3 for every operand;
     * blockwise 1 x 128 tiles (along the reduction) and 128 x 128 weight blocks */
    for (int role = X; role <= G; role++)
        for (int u = FWD; u <= WGRAD; u++) {
            const struct mt_quant_spec q = mt_quant_operand_spec(qr, false, (enum mt_q_role)role, (enum mt_q_use)u);
            const bool down = u == WGRAD || (role == W && u == DGRAD);
            assert_int_equal(q.elem, MT_Q_ELEM_E4M3);
            assert_int_equal(q.rnd, MT_Q_RN);
            if (r == MXFP8) {
                assert_int_equal(q.scaling, MT_Q_MX);
                assert_int_equal(q.along, down ? MT_Q_ALONG_COL : MT_Q_ALONG_ROW);
            } else {
                assert_int_equal(q.scaling, role == W ? MT_Q_BLOCK_128X128 : MT_Q_BLOCK_1X128);
                assert_int_equal(q.along, down && role != W ? MT_Q_ALONG_COL : MT_Q_ALONG_ROW);
            }
        }
    struct mt_model *m = new_model(r);
    struct mt_err err;
    assert_string_equal(mt_model_lowp_recipe(m), r == MXFP8 ? "fp8 mxfp8" : "fp8 blockwise");
    const int N = B_ * T_, dout = m->Q_l, din = m->H, tensor = m->lt[0].wq;
    struct mt_model_stats st;
    struct mt_pass p = {m, &m->k->op, m->k->ctx, B_, N, N, 0, true, false, 1.0f, &st, &err};
    float *x = malloc(sizeof(float) * N * din), *dy = malloc(sizeof(float) * N * dout);
    float *out = malloc(sizeof(float) * N * dout), *dx = calloc((size_t)N * din, sizeof(float));
    float *w = mt_model_weight(m, tensor).data;
    const size_t most = (size_t)(N > dout ? N : dout) * din;
    float *qa = malloc(sizeof(float) * most), *qb = malloc(sizeof(float) * most);
    struct ref own = {r, {1, 1, 1}, 0}, theirs = {other, {1, 1, 1}, 0};

    /* forward: x small (2^-12) but its 32-block of columns 32..63, large (2^8), where W is 0 */
    fill_range(x, N, din, 21, 0x1p-12f);
    fill_range(w, dout, din, 22, 0.05f);
    for (int i = 0; i < N; i++)
        for (int c = 32; c < 64; c++) x[i * din + c] = 0x1p8f * mt_rng_normal(23, 0, (uint64_t)(i * din + c));
    for (int j = 0; j < dout; j++)
        for (int c = 32; c < 64; c++) w[j * din + c] = 0.0f;
    mt_model_zero_grad(m);
    mt_lowp_backward_begin(m, 1.0f);
    assert_int_equal(mt_pass_qlinear_fwd(&p, tensor, mt_f32(out, N, dout), mt_f32(x, N, din), N, dout, din), MT_OK);
    reference(&own, X, FWD, x, N, din, qa);
    reference(&own, W, FWD, w, dout, din, qb);
    check_gemm(out, qa, din, 1, qb, 1, din, N, dout, din, "forward, the recipe's own quantisation");
    reference(&theirs, X, FWD, x, N, din, qa);
    reference(&theirs, W, FWD, w, dout, din, qb);
    const double dfwd = gemm_distance(out, qa, din, 1, qb, 1, din, N, dout, din);

    /* dgrad: W small (2^-12) but its 32-block of rows 32..63, large, where dy is 0 */
    fill_range(w, dout, din, 24, 0x1p-12f);
    for (int j = 32; j < 64; j++)
        for (int c = 0; c < din; c++) w[j * din + c] = 0x1p8f * mt_rng_normal(25, 0, (uint64_t)(j * din + c));
    fill_range(x, N, din, 26, 1.0f);
    fill_range(dy, N, dout, 27, 1e-3f);
    for (int i = 0; i < N; i++)
        for (int j = 32; j < 64; j++) dy[i * dout + j] = 0.0f;
    assert_int_equal(mt_pass_qlinear_fwd(&p, tensor, mt_f32(out, N, dout), mt_f32(x, N, din), N, dout, din), MT_OK);
    assert_int_equal(mt_pass_qlinear_bwd(&p, tensor, dx, 0.0f, dy, mt_f32(x, N, din), N, dout, din), MT_OK);
    reference(&own, G, DGRAD, dy, N, dout, qa);
    reference(&own, W, DGRAD, w, dout, din, qb);
    check_gemm(dx, qa, dout, 1, qb, din, 1, N, din, dout, "dgrad, the recipe's own quantisation");
    reference(&theirs, G, DGRAD, dy, N, dout, qa);
    reference(&theirs, W, DGRAD, w, dout, din, qb);
    const double dbwd = gemm_distance(dx, qa, dout, 1, qb, din, 1, N, din, dout);
    printf("# %s: forward and dgrad %.3g and %.3g (of their largest element) from %s's products\n",
           recipe_names[r], dfwd, dbwd, recipe_names[other]);
    assert_true(dfwd > 0.1);
    assert_true(dbwd > 0.1);
    free(qa), free(qb), free(x), free(dy), free(out), free(dx);
    mt_model_destroy(m);
}

static void test_mxfp8_not_blockwise(void **s) { (void)s; mx_not_blockwise(MXFP8); }
static void test_blockwise_not_mxfp8(void **s) { (void)s; mx_not_blockwise(BLOCKWISE); }

/* FP8 copies saved for backward: the forward keeps x quantised for the wgrad GEMM, which
 * reads that copy, so a backward given NaN for x computes dx and dW bit for bit as the
 * backward given x (they would be NaN if it quantised x again). NVFP4 keeps no copy
 * (its wgrad copy takes the backward pass's Hadamard signs): its dW is NaN then. */
static void saved_copy(enum recipe r)
{
    struct mt_model *m = new_model(r);
    struct mt_err err;
    const int N = B_ * T_, dout = m->Q_l, din = m->H, tensor = m->lt[0].wq;
    assert_int_equal(mt_lowp_saves(m, 0), r != NVFP4);
    struct mt_model_stats st;
    struct mt_pass p = {m, &m->k->op, m->k->ctx, B_, N, N, 0, true, false, 1.0f, &st, &err};
    float *x = malloc(sizeof(float) * N * din), *nan = malloc(sizeof(float) * N * din);
    float *dy = malloc(sizeof(float) * N * dout), *out = malloc(sizeof(float) * N * dout);
    float *dx[2], *dw[2];
    fill(x, N, din, 11, 1.0f);
    fill(dy, N, dout, 12, 1e-3f);
    for (int i = 0; i < N * din; i++) nan[i] = NAN;
    fill(mt_model_weight(m, tensor).data, dout, din, 13, 0.05f);
    const size_t nw = (size_t)dout * din;
    for (int pass = 0; pass < 2; pass++) {
        mt_model_zero_grad(m);
        dx[pass] = calloc((size_t)N * din, sizeof(float));
        dw[pass] = malloc(sizeof(float) * nw);
        assert_int_equal(mt_pass_qlinear_fwd(&p, tensor, mt_f32(out, N, dout), mt_f32(x, N, din), N, dout, din), MT_OK);
        assert_int_equal(mt_pass_qlinear_bwd(&p, tensor, dx[pass], 0.0f, dy, mt_f32(pass ? nan : x, N, din), N,
                                             dout, din), MT_OK);
        memcpy(dw[pass], mt_model_view(m->grads, m, tensor), sizeof(float) * nw);
    }
    assert_memory_equal(dx[0], dx[1], sizeof(float) * (size_t)N * din); /* dgrad reads no x */
    bool any_nan = false;
    for (size_t i = 0; i < nw; i++) any_nan |= isnan(dw[1][i]);
    if (r == NVFP4) {
        assert_true(any_nan);
    } else {
        assert_false(any_nan);
        assert_memory_equal(dw[0], dw[1], sizeof(float) * nw);
    }
    for (int i = 0; i < 2; i++) free(dx[i]), free(dw[i]);
    free(x), free(nan), free(dy), free(out);
    mt_model_destroy(m);
}

static void test_saved_delayed(void **s) { (void)s; saved_copy(DELAYED); }
static void test_saved_tensorwise(void **s) { (void)s; saved_copy(TENSORWISE); }
static void test_saved_blockwise(void **s) { (void)s; saved_copy(BLOCKWISE); }
static void test_saved_mxfp8(void **s) { (void)s; saved_copy(MXFP8); }
static void test_saved_nvfp4(void **s) { (void)s; saved_copy(NVFP4); }

/* first_last_layers_bf16 keeps the ends high precision: with the only layer kept, the
 * linear is the plain fp32 one. */
static void test_first_last_bf16(void **s)
{
    (void)s;
    struct mt_config cfg;
    config(&cfg, MXFP8);
    cfg.precision.first_last_layers_bf16 = true;
    struct mt_model *m;
    struct mt_err err;
    assert_int_equal(mt_model_create(&cfg, mt_kernels_cpu(), B_, NULL, &m, &err), MT_OK);
    mt_model_init(m, 42);
    const int N = B_ * T_, dout = m->Q_l, din = m->H, tensor = m->lt[0].wq;
    struct mt_model_stats st;
    struct mt_pass p = {m, &m->k->op, m->k->ctx, B_, N, N, 0, true, false, 1.0f, &st, &err};
    float *x = malloc(sizeof(float) * N * din), *out = malloc(sizeof(float) * N * dout);
    fill(x, N, din, 11, 1.0f);
    const float *w = mt_model_weight(m, tensor).data;
    assert_int_equal(mt_pass_qlinear_fwd(&p, tensor, mt_f32(out, N, dout), mt_f32(x, N, din), N, dout, din), MT_OK);
    check_gemm(out, x, din, 1, w, 1, din, N, dout, din, "high-precision forward");
    free(x), free(out);
    mt_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_delayed),  cmocka_unit_test(test_tensorwise),
        cmocka_unit_test(test_blockwise), cmocka_unit_test(test_mxfp8),
        cmocka_unit_test(test_nvfp4),    cmocka_unit_test(test_first_last_bf16),
        cmocka_unit_test(test_saved_delayed), cmocka_unit_test(test_saved_tensorwise),
        cmocka_unit_test(test_saved_blockwise), cmocka_unit_test(test_saved_mxfp8),
        cmocka_unit_test(test_saved_nvfp4), cmocka_unit_test(test_mxfp8_not_blockwise),
        cmocka_unit_test(test_blockwise_not_mxfp8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

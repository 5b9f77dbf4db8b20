/* The FP8/FP4 codecs (kernels/quant.h) and the recipes' CPU quantisers
 * (kernels/quant_recipe.h): codes, round trips, ties, saturation, stochastic rounding
 * against a double-precision model, Philox known answers, scales of hand-made tensors
 * and their tails, MXFP8 along rows against columns, the random Hadamard transform, and
 * the quantised GEMM against a double-precision GEMM of the dequantised operands.
 * Bit-exactness against NVIDIA's conversions is tests/kernels/quant_oracle.cc. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/kernels.h"
#include "kernels/quant_recipe.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t rnd32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* uniform in [-1, 1) */
static float rnd_unit(void) { return (float)((double)rnd32() / 2147483648.0 - 1.0); }

/* A format's parameters, for the independent double-precision model. */
struct fmt {
    const char *name;
    int mbits, emin, maxcode, sign_shift;
    double max;
};
static const struct fmt E4M3 = {"E4M3", 3, -6, 0x7e, 7, 448.0};
static const struct fmt E5M2 = {"E5M2", 2, -14, 0x7b, 7, 57344.0};
static const struct fmt E2M1 = {"E2M1", 1, 0, 0x7, 3, 6.0};

/* The value of magnitude code c, from the definition of the format. */
static double model_value(const struct fmt *f, int c)
{
    int ex = c >> f->mbits, man = c & ((1 << f->mbits) - 1);
    if (ex == 0) return ldexp(man, f->emin - f->mbits);
    return ldexp((1 << f->mbits) + man, ex - 1 + f->emin - f->mbits);
}

static uint8_t enc(const struct fmt *f, float x, int sat, enum mt_q_round rnd, uint32_t r)
{
    if (f == &E4M3) return mt_e4m3_from_float(x, sat, rnd, r);
    if (f == &E5M2) return mt_e5m2_from_float(x, sat, rnd, r);
    return mt_e2m1_from_float(x, rnd, r);
}

static float dec(const struct fmt *f, uint8_t c)
{
    if (f == &E4M3) return mt_e4m3_to_float(c);
    if (f == &E5M2) return mt_e5m2_to_float(c);
    return mt_e2m1_to_float(c);
}

static void test_all_codes(void **state)
{
    (void)state;
    const struct fmt *fs[] = {&E4M3, &E5M2, &E2M1};
    for (int k = 0; k < 3; k++) {
        const struct fmt *f = fs[k];
        int ncodes = 2 << f->sign_shift;
        for (int c = 0; c < ncodes; c++) {
            int mag = c & ((1 << f->sign_shift) - 1), neg = c >> f->sign_shift;
            float v = dec(f, (uint8_t)c);
            if (f == &E4M3 && mag == 0x7f) {
                assert_true(isnan(v));
            } else if (f == &E5M2 && mag > 0x7c) {
                assert_true(isnan(v));
            } else if (f == &E5M2 && mag == 0x7c) {
                assert_true(isinf(v) && (v < 0) == neg);
            } else {
                double want = neg ? -model_value(f, mag) : model_value(f, mag);
                assert_true((double)v == want);
                assert_int_equal(signbit(v) != 0, neg);
            }
        }
    }
    static const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int c = 0; c < 16; c++)
        assert_true(mt_e2m1_to_float((uint8_t)c) == (c & 8 ? -e2m1[c & 7] : e2m1[c & 7]));
    assert_true(mt_e4m3_to_float(0x7e) == 448.0f && mt_e4m3_to_float(0x01) == 0x1p-9f);
    assert_true(mt_e5m2_to_float(0x7b) == 57344.0f && mt_e5m2_to_float(0x01) == 0x1p-16f);
    for (int c = 0; c < 255; c++) assert_true(mt_e8m0_to_float((uint8_t)c) == ldexpf(1.0f, c - 127));
    assert_true(isnan(mt_e8m0_to_float(0xff)));
}

/* decode(encode(v)) is v for every finite value, in every rounding (stochastic rounding
 * never moves a value that is exact, whatever the random bits). */
static void test_round_trip(void **state)
{
    (void)state;
    const struct fmt *fs[] = {&E4M3, &E5M2, &E2M1};
    for (int k = 0; k < 3; k++) {
        const struct fmt *f = fs[k];
        for (int s = 0; s < 2; s++)
            for (int mag = 0; mag <= f->maxcode; mag++) {
                uint8_t c = (uint8_t)(mag | (s << f->sign_shift));
                float v = dec(f, c);
                for (int sat = 0; sat < 2; sat++) assert_int_equal(enc(f, v, sat, MT_Q_RN, 0), c);
                for (uint32_t r = 0; r < 256; r++) assert_int_equal(enc(f, v, 1, MT_Q_SR, r), c);
            }
    }
    for (int c = 0; c < 255; c++) {
        float v = mt_e8m0_to_float((uint8_t)c);
        assert_int_equal(mt_e8m0_from_float(v, 1, 0), c);
        assert_int_equal(mt_e8m0_from_float(v, 1, 1), c);
    }
}

static void test_ties_and_saturation(void **state)
{
    (void)state;
    /* E4M3: 464 is the tie between 448 (even) and 480 (past the largest) */
    assert_int_equal(mt_e4m3_from_float(464.0f, 0, MT_Q_RN, 0), 0x7e);
    assert_int_equal(mt_e4m3_from_float(nextafterf(464.0f, 1e9f), 0, MT_Q_RN, 0), 0x7f);
    assert_int_equal(mt_e4m3_from_float(-nextafterf(464.0f, 1e9f), 0, MT_Q_RN, 0), 0xff);
    assert_int_equal(mt_e4m3_from_float(1e30f, 1, MT_Q_RN, 0), 0x7e);
    assert_int_equal(mt_e4m3_from_float(-INFINITY, 1, MT_Q_RN, 0), 0xfe);
    assert_int_equal(mt_e4m3_from_float(INFINITY, 0, MT_Q_RN, 0), 0x7f);
    assert_int_equal(mt_e4m3_from_float(NAN, 1, MT_Q_RN, 0), 0x7f);
    assert_int_equal(mt_e4m3_from_float(1.0625f, 1, MT_Q_RN, 0), 0x38); /* tie 1 | 1.125: even */
    assert_int_equal(mt_e4m3_from_float(1.1875f, 1, MT_Q_RN, 0), 0x3a); /* tie 1.125 | 1.25 */
    assert_int_equal(mt_e4m3_from_float(0x1p-10f, 1, MT_Q_RN, 0), 0x00); /* half the least */
    assert_int_equal(mt_e4m3_from_float(0x1.8p-9f, 1, MT_Q_RN, 0), 0x02); /* 1.5 ulp: even 2 */
    assert_int_equal(mt_e4m3_from_float(-0.0f, 1, MT_Q_RN, 0), 0x80);
    assert_int_equal(mt_e4m3_from_float(-1e-30f, 1, MT_Q_RN, 0), 0x80);
    /* E5M2: 61440 is the tie between 57344 (odd mantissa) and 65536: up, to infinity */
    assert_int_equal(mt_e5m2_from_float(61440.0f, 0, MT_Q_RN, 0), 0x7c);
    assert_int_equal(mt_e5m2_from_float(61440.0f, 1, MT_Q_RN, 0), 0x7b);
    assert_int_equal(mt_e5m2_from_float(nextafterf(61440.0f, 0), 0, MT_Q_RN, 0), 0x7b);
    assert_int_equal(mt_e5m2_from_float(-INFINITY, 0, MT_Q_RN, 0), 0xfc);
    assert_int_equal(mt_e5m2_from_float(NAN, 0, MT_Q_RN, 0), 0x7f);
    /* E2M1 */
    assert_int_equal(mt_e2m1_from_float(0.25f, MT_Q_RN, 0), 0x0); /* tie 0 | 0.5 */
    assert_int_equal(mt_e2m1_from_float(0.75f, MT_Q_RN, 0), 0x2); /* tie 0.5 | 1 */
    assert_int_equal(mt_e2m1_from_float(2.5f, MT_Q_RN, 0), 0x4);  /* tie 2 | 3 */
    assert_int_equal(mt_e2m1_from_float(5.0f, MT_Q_RN, 0), 0x6);  /* tie 4 | 6 */
    assert_int_equal(mt_e2m1_from_float(-7.0f, MT_Q_RN, 0), 0xf); /* saturates */
    assert_int_equal(mt_e2m1_from_float(NAN, MT_Q_RN, 0), 0x7);
    assert_int_equal(mt_e2m1_from_float(-0.0f, MT_Q_RN, 0), 0x8);
    /* UE8M0 */
    assert_int_equal(mt_e8m0_from_float(3.0f, 1, 0), 0x80);
    assert_int_equal(mt_e8m0_from_float(3.0f, 1, 1), 0x81);
    assert_int_equal(mt_e8m0_from_float(-3.0f, 1, 1), 0x81);
    assert_int_equal(mt_e8m0_from_float(0.0f, 1, 1), 0x00);
    assert_int_equal(mt_e8m0_from_float(0x1.8p127f, 1, 1), 0xfe);
    assert_int_equal(mt_e8m0_from_float(0x1.8p127f, 0, 1), 0xff);
    assert_int_equal(mt_e8m0_from_float(0x1p-140f, 1, 1), 0x00);
    assert_int_equal(mt_e8m0_from_float(NAN, 1, 0), 0xff);
}

/* Stochastic rounding against a model in double: the magnitude's grid below and above,
 * D the 8 most significant bits of the distance above the lower point in ulps, up when
 * D + r carries out of 8 bits; saturation to the largest value. */
static void check_sr(const struct fmt *f, float x, uint32_t r)
{
    double a = fabs((double)x);
    int e = a > 0 ? ilogb(a) : f->emin;
    if (e < f->emin) e = f->emin;
    double ulp = ldexp(1.0, e - f->mbits);
    double lo = floor(a / ulp) * ulp;
    double d = floor((a - lo) / ulp * 256.0);
    double want = d + r >= 256 ? lo + ulp : lo;
    if (want > f->max) want = f->max;
    float got = dec(f, enc(f, x, 1, MT_Q_SR, r));
    if (fabs((double)got) != want || (x < 0) != (signbit(got) != 0))
        fail_msg("%s stochastic rounding of %a with random bits %u: %a, the model says %a",
                 f->name, (double)x, r, (double)got, want);
}

static void test_stochastic_rounding(void **state)
{
    (void)state;
    const struct fmt *fs[] = {&E4M3, &E5M2, &E2M1};
    for (int k = 0; k < 3; k++) {
        const struct fmt *f = fs[k];
        for (int i = 0; i < 200000; i++) {
            /* log-uniform magnitudes from below the least subnormal to past the largest */
            float m = ldexpf(1.0f + (float)(rnd32() >> 9) * 0x1p-23f,
                             (int)(rnd32() % 40) + f->emin - f->mbits - 8);
            if (m > 2 * f->max) continue;
            check_sr(f, rnd32() & 1 ? -m : m, rnd32() & 0xff);
        }
        /* 1 + 0.3 ulp rounds up for exactly the 76 random bytes that carry (D = 76.8 -> 76) */
        float x = (float)(1.0 + 0.3 * ldexp(1.0, -f->mbits));
        int ups = 0;
        for (uint32_t r = 0; r < 256; r++) ups += dec(f, enc(f, x, 1, MT_Q_SR, r)) > 1.0f;
        assert_int_equal(ups, 76);
    }
    /* saturation is implied, NaN as in nearest rounding */
    assert_int_equal(mt_e4m3_from_float(1e9f, 0, MT_Q_SR, 255), 0x7e);
    assert_int_equal(mt_e5m2_from_float(-INFINITY, 0, MT_Q_SR, 0), 0xfb);
    assert_int_equal(mt_e4m3_from_float(NAN, 0, MT_Q_SR, 7), 0x7f);
}

static void test_philox(void **state)
{
    (void)state;
    /* known answers of Philox-4x32-10 (Random123's test vectors) */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
        {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
         0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
        {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u,
         0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u},
    };
    for (int t = 0; t < 3; t++) {
        uint32_t out[4];
        mt_philox4x32_10(kat[t], kat[t] + 4, out);
        for (int i = 0; i < 4; i++) assert_int_equal(out[i], kat[t][6 + i]);
    }
    /* element i's byte: byte i % 16 of the draw at counter i / 16 */
    uint64_t seed = 0x0123456789abcdefull;
    for (uint64_t i = 0; i < 64; i++) {
        uint32_t ctr[4] = {(uint32_t)(i / 16), 0, 5, MT_Q_RAND_ROUNDING};
        uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, out[4];
        mt_philox4x32_10(ctr, key, out);
        uint8_t bytes[16];
        for (int w = 0; w < 4; w++)
            for (int b = 0; b < 4; b++) bytes[w * 4 + b] = (uint8_t)(out[w] >> (8 * b));
        assert_int_equal(mt_q_random_byte(seed, 5, i), bytes[i % 16]);
    }
    assert_int_not_equal(mt_q_hadamard_signs(1, 0), mt_q_hadamard_signs(2, 0));
}

static void test_delayed_scaling(void **state)
{
    (void)state;
    struct mt_amax_history h;
    struct mt_err err;
    assert_int_equal(mt_amax_history_init(&h, 0, MT_AMAX_MAX, 448.0f, 0, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "length 0"));
    assert_int_equal(mt_amax_history_init(&h, 3, MT_AMAX_MAX, 448.0f, 0, &err), MT_OK);
    assert_true(mt_amax_history_scale(&h) == 1.0f);
    mt_amax_history_update(&h, 1.0f);
    assert_true(mt_amax_history_scale(&h) == 448.0f);
    mt_amax_history_update(&h, 4.0f);
    mt_amax_history_update(&h, 2.0f);
    assert_true(mt_amax_history_scale(&h) == 112.0f); /* max of {1, 4, 2} */
    mt_amax_history_update(&h, 1.0f);
    assert_true(mt_amax_history_scale(&h) == 112.0f); /* {4, 2, 1} */
    mt_amax_history_update(&h, 1.0f);
    assert_true(mt_amax_history_scale(&h) == 224.0f); /* {2, 1, 1}: the 4 left the window */
    mt_amax_history_free(&h);

    assert_int_equal(mt_amax_history_init(&h, 4, MT_AMAX_MOST_RECENT, 57344.0f, 2, &err), MT_OK);
    mt_amax_history_update(&h, 8.0f);
    mt_amax_history_update(&h, 2.0f);
    assert_true(mt_amax_history_scale(&h) == 57344.0f / 2.0f / 4.0f); /* margin 2 */
    mt_amax_history_update(&h, 0.0f);                                 /* zero: kept */
    assert_true(mt_amax_history_scale(&h) == 57344.0f / 2.0f / 4.0f);
    mt_amax_history_update(&h, NAN); /* not finite: kept */
    assert_true(mt_amax_history_scale(&h) == 57344.0f / 2.0f / 4.0f);
    mt_amax_history_free(&h);

    assert_true(mt_q_tensor_scale(0.0f, 448.0f, 0) == 1.0f);
    assert_true(mt_q_tensor_scale(INFINITY, 448.0f, 0) == 1.0f);
    assert_true(mt_q_tensor_scale(1e-45f, 448.0f, 0) == 0x1.fffffep127f);
    assert_true(mt_q_tensor_scale(2.0f, 448.0f, -1) == 448.0f);
}

static void test_tensorwise(void **state)
{
    (void)state;
    struct mt_qtensor q;
    struct mt_err err;
    enum { R = 3, C = 50, LD = 53 };
    float x[R * LD], y[R * C];
    for (int i = 0; i < R * LD; i++) x[i] = rnd_unit() * 3.0f;
    x[LD + 7] = -10.0f; /* the amax */
    assert_int_equal(mt_qtensor_init(&q, MT_Q_TENSOR, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, R, C, &err), MT_OK);
    float amax = mt_q_amax(x, R, C, LD);
    assert_true(amax == 10.0f);
    float s = mt_q_tensor_scale(amax, MT_E4M3_MAX, 0);
    assert_int_equal(mt_quant_tensorwise(&q, x, LD, s, MT_Q_RN, 0, 0, &err), MT_OK);
    assert_int_equal(q.data[C + 7], 0xfe); /* the amax lands on -448 */
    assert_true(q.scale[0] == 1.0f / s);
    assert_int_equal(mt_dequant(&q, y, C, &err), MT_OK);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float v = x[r * LD + c];
            /* half an ulp of 3 mantissa bits (relative 2^-4), or half the least
             * subnormal under the scale, plus the two fp32 roundings */
            double tol = fmax(fabs(v) * 0x1p-4, 0x1p-10 / s) * (1 + 0x1p-20);
            assert_true(fabs((double)y[r * C + c] - v) <= tol);
        }
    /* stochastic rounding: element r * C + c draws its byte of (seed, stream) */
    assert_int_equal(mt_quant_tensorwise(&q, x, LD, s, MT_Q_SR, 77, 2, &err), MT_OK);
    int moved = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            uint8_t want = mt_e4m3_from_float(x[r * LD + c] * s, 1, MT_Q_SR,
                                              mt_q_random_byte(77, 2, (uint64_t)(r * C + c)));
            assert_int_equal(q.data[r * C + c], want);
            moved += want != mt_e4m3_from_float(x[r * LD + c] * s, 1, MT_Q_RN, 0);
        }
    assert_true(moved > 0);
    assert_int_equal(mt_quant_tensorwise(&q, x, LD, 0.0f, MT_Q_RN, 0, 0, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "scale"));
    assert_int_equal(mt_quant_tensorwise(&q, x, C - 1, s, MT_Q_RN, 0, 0, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "row stride 49"));
    assert_int_equal(mt_quant_blockwise(&q, x, LD, 0, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "set up for tensorwise"));
    mt_qtensor_free(&q);
    assert_int_equal(mt_qtensor_init(&q, MT_Q_TENSOR, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, R, C, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "E4M3 or E5M2"));
}

static void test_blockwise(void **state)
{
    (void)state;
    struct mt_qtensor q;
    struct mt_err err;
    /* 1x128 tiles on 2 x 300: tiles of 128, 128 and a tail of 44 */
    enum { R = 2, C = 300 };
    static float x[R * C], y[R * C];
    for (int i = 0; i < R * C; i++) x[i] = 0.5f * rnd_unit();
    x[0 * C + 5] = 7.0f;    /* tile (0,0) */
    x[0 * C + 290] = -3.0f; /* tile (0,2), the tail */
    x[1 * C + 200] = 1000.0f;
    assert_int_equal(mt_qtensor_init(&q, MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, R, C, &err), MT_OK);
    assert_int_equal(q.srows, 2);
    assert_int_equal(q.scols, 3);
    assert_int_equal(mt_quant_blockwise(&q, x, C, 0, &err), MT_OK);
    assert_true(q.scale[0] == 1.0f / (448.0f / 7.0f));
    assert_true(q.scale[2] == 1.0f / (448.0f / 3.0f));
    assert_true(q.scale[4] == 1.0f / (448.0f / 1000.0f));
    assert_int_equal(q.data[5], 0x7e);
    assert_int_equal(q.data[290], 0xfe);
    for (int t = 0; t < 6; t++) { /* every tile's amax maps to +-448 */
        int r = t / 3, c0 = (t % 3) * 128, c1 = c0 + 128 < C ? c0 + 128 : C, hit = 0;
        for (int c = c0; c < c1; c++) hit |= (q.data[r * C + c] & 0x7f) == 0x7e;
        assert_true(hit);
    }
    /* power-of-two scales: exact, and no larger than the tile needs */
    assert_int_equal(mt_quant_blockwise(&q, x, C, 1, &err), MT_OK);
    for (int t = 0; t < 6; t++) {
        float d = q.scale[t];
        assert_true((mt_q_bits(d) & 0x7fffffu) == 0);
    }
    assert_true(q.scale[0] == 1.0f / 64.0f); /* 448/7 = 64 */
    assert_true(q.scale[2] == 1.0f / 128.0f); /* 448/3 = 149.3 -> 128 */
    assert_true(q.scale[4] == 4.0f);          /* 0.448 -> 0.25 */
    assert_int_equal(mt_dequant(&q, y, C, &err), MT_OK);
    for (int i = 0; i < R * C; i++)
        assert_true(fabs((double)y[i] - x[i]) <= fmax(fabs(x[i]) * 0x1p-4, 0x1p-10 * 4.0));
    mt_qtensor_free(&q);

    /* 128x128 blocks on 130 x 260: blocks of 128 x 128, 128 x 4, 2 x 128 and 2 x 4 */
    enum { R2 = 130, C2 = 260 };
    float *w = malloc(sizeof(float) * R2 * C2);
    assert_non_null(w);
    for (int i = 0; i < R2 * C2; i++) w[i] = 0.25f * rnd_unit();
    w[129 * C2 + 259] = 5.0f; /* the corner block's amax */
    w[3 * C2 + 257] = 2.0f;   /* block (0, 2) */
    assert_int_equal(mt_qtensor_init(&q, MT_Q_BLOCK_128X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, R2, C2, &err), MT_OK);
    assert_int_equal(q.srows, 2);
    assert_int_equal(q.scols, 3);
    assert_int_equal(mt_quant_blockwise(&q, w, C2, 0, &err), MT_OK);
    assert_true(q.scale[1 * 3 + 2] == 1.0f / (448.0f / 5.0f));
    assert_true(q.scale[0 * 3 + 2] == 1.0f / (448.0f / 2.0f));
    for (int b = 0; b < 6; b++) assert_true(q.scale[b] <= 1.0f / (448.0f / 0.25f) || b == 2 || b == 5);
    mt_qtensor_free(&q);
    free(w);
}

/* MXFP8 along rows against columns: a huge element makes the small ones of its block
 * underflow; which neighbours share its block depends on the dimension. */
static void test_mxfp8_rows_vs_cols(void **state)
{
    (void)state;
    enum { N = 64 };
    static float x[N * N], y[N * N];
    for (int i = 0; i < N * N; i++) x[i] = 1.0f;
    x[5 * N + 7] = 1e6f;
    struct mt_qtensor qr, qc;
    struct mt_err err;
    assert_int_equal(mt_qtensor_init(&qr, MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, N, N, &err), MT_OK);
    assert_int_equal(mt_qtensor_init(&qc, MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_COL, N, N, &err), MT_OK);
    assert_int_equal(qr.srows, N);
    assert_int_equal(qr.scols, 2);
    assert_int_equal(qc.srows, 2);
    assert_int_equal(qc.scols, N);
    assert_int_equal(mt_quant_mxfp8(&qr, x, N, &err), MT_OK);
    assert_int_equal(mt_quant_mxfp8(&qc, x, N, &err), MT_OK);
    /* 1e6 / 448 = 2232 -> 2^12 (up); 1 / 448 -> 2^-8 */
    for (int r = 0; r < N; r++)
        for (int b = 0; b < 2; b++)
            assert_int_equal(qr.scale8[r * 2 + b], r == 5 && b == 0 ? 127 + 12 : 127 - 8);
    for (int b = 0; b < 2; b++)
        for (int c = 0; c < N; c++)
            assert_int_equal(qc.scale8[b * N + c], c == 7 && b == 0 ? 127 + 12 : 127 - 8);
    assert_int_equal(mt_dequant(&qr, y, N, &err), MT_OK);
    assert_true(y[5 * N + 8] == 0.0f);  /* 1 / 4096 under E4M3's least subnormal */
    assert_true(y[6 * N + 7] == 1.0f);  /* another row: its own block */
    assert_true(y[5 * N + 40] == 1.0f); /* the row's second block */
    assert_true(y[5 * N + 7] == 983040.0f); /* 244.1 -> 240 (step 16), times 4096 */
    assert_int_equal(mt_dequant(&qc, y, N, &err), MT_OK);
    assert_true(y[5 * N + 8] == 1.0f);
    assert_true(y[6 * N + 7] == 0.0f);
    assert_true(y[40 * N + 7] == 1.0f);
    /* a tail: 40 rows along the column are a block of 32 and one of 8 */
    mt_qtensor_free(&qc);
    assert_int_equal(mt_qtensor_init(&qc, MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_COL, 40, 3, &err), MT_OK);
    for (int i = 0; i < 120; i++) x[i] = (float)i;
    assert_int_equal(mt_quant_mxfp8(&qc, x, 3, &err), MT_OK);
    assert_int_equal(qc.srows, 2);
    assert_int_equal(qc.scale8[1 * 3 + 2], mt_q_mx_scale(119.0f)); /* rows 32..39, column 2 */
    assert_int_equal(qc.scale8[0 * 3 + 0], mt_q_mx_scale(93.0f));  /* rows 0..31, column 0 */
    mt_qtensor_free(&qr);
    mt_qtensor_free(&qc);
    assert_int_equal(mt_qtensor_init(&qc, MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_COL, 4, 4, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "transpose"));
}

static void test_nvfp4(void **state)
{
    (void)state;
    struct mt_qtensor q, q2;
    struct mt_err err;
    enum { R = 32, C = 40 }; /* 40 = 16 + 16 + a tail of 8 */
    static float x[R * C], y[R * C];
    for (int i = 0; i < R * C; i++) x[i] = rnd_unit();
    x[3 * C + 3] = 12.0f; /* the tensor's amax */
    x[20 * C + 30] = 3.0f;
    assert_int_equal(mt_qtensor_init(&q, MT_Q_NVFP4, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, R, C, &err), MT_OK);
    assert_int_equal(q.scols, 3);
    assert_int_equal(mt_quant_nvfp4(&q, x, C, MT_Q_RN, 0, 0, &err), MT_OK);
    float genc = 6.0f * 448.0f / 12.0f;
    assert_true(q.global == 1.0f / genc);
    assert_int_equal(q.scale8[3 * 3 + 0], 0x7e); /* the amax's block: 448 */
    assert_int_equal(q.data[3 * 20 + 1] >> 4, 0x7); /* column 3: high nibble of byte 1 */
    assert_int_equal(q.scale8[20 * 3 + 1], mt_e4m3_from_float(3.0f / 6.0f * genc, 1, MT_Q_RN, 0));
    assert_int_equal(mt_dequant(&q, y, C, &err), MT_OK);
    assert_true(fabsf(y[3 * C + 3] - 12.0f) <= 12.0f * 0x1p-20f);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            /* E2M1's spacing is at most a third of the block's amax (4 -> 6), and the
             * block scale rounds by 2^-4 */
            float amax = 0;
            for (int k = (c / 16) * 16; k < (c / 16) * 16 + 16 && k < C; k++)
                amax = fmaxf(amax, fabsf(x[r * C + k]));
            assert_true(fabsf(y[r * C + c] - x[r * C + c]) <= amax * (1.0f / 6.0f + 0x1p-3f));
        }
    /* 2D: one scale per 16 x 16 block, the same on its 16 rows */
    assert_int_equal(mt_qtensor_init(&q2, MT_Q_NVFP4_2D, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, R, C, &err), MT_OK);
    assert_int_equal(mt_quant_nvfp4(&q2, x, C, MT_Q_RN, 0, 0, &err), MT_OK);
    for (int r = 0; r < R; r++) {
        assert_int_equal(q2.scale8[r * 3 + 0], r < 16 ? 0x7e : q2.scale8[16 * 3 + 0]);
        assert_int_equal(q2.scale8[r * 3 + 1], q2.scale8[(r / 16) * 16 * 3 + 1]);
    }
    assert_int_equal(q2.scale8[16 * 3 + 1], q.scale8[20 * 3 + 1]); /* 3.0 is that block's amax */
    /* a 16 x 16-block tensor and its transpose quantise alike, element for element */
    {
        enum { T = 48 };
        static float w[T * T], wt[T * T];
        struct mt_qtensor qw, qwt;
        for (int i = 0; i < T * T; i++) w[i] = rnd_unit() * (i % 5 ? 1.0f : 8.0f);
        for (int r = 0; r < T; r++)
            for (int c = 0; c < T; c++) wt[c * T + r] = w[r * T + c];
        assert_int_equal(mt_qtensor_init(&qw, MT_Q_NVFP4_2D, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, T, T, &err), MT_OK);
        assert_int_equal(mt_qtensor_init(&qwt, MT_Q_NVFP4_2D, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, T, T, &err), MT_OK);
        assert_int_equal(mt_quant_nvfp4(&qw, w, T, MT_Q_RN, 0, 0, &err), MT_OK);
        assert_int_equal(mt_quant_nvfp4(&qwt, wt, T, MT_Q_RN, 0, 0, &err), MT_OK);
        for (int r = 0; r < T; r++)
            for (int c = 0; c < T; c++) {
                uint8_t a = qw.data[r * (T / 2) + c / 2], b = qwt.data[c * (T / 2) + r / 2];
                assert_int_equal(c & 1 ? a >> 4 : a & 15, r & 1 ? b >> 4 : b & 15);
                assert_int_equal(qw.scale8[r * 3 + c / 16], qwt.scale8[c * 3 + r / 16]);
            }
        mt_qtensor_free(&qw);
        mt_qtensor_free(&qwt);
    }
    /* stochastic rounding: element i draws byte i of (seed, stream); each result is one
     * of the two neighbours of the scaled value */
    assert_int_equal(mt_quant_nvfp4(&q2, x, C, MT_Q_SR, 42, 7, &err), MT_OK);
    int differ = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float m = mt_q_nvfp4_element_scale(q2.scale8[r * 3 + c / 16], genc);
            uint8_t b = q2.data[r * 20 + c / 2], got = (uint8_t)(c & 1 ? b >> 4 : b & 15);
            uint8_t want = mt_e2m1_from_float(x[r * C + c] * m, MT_Q_SR,
                                              mt_q_random_byte(42, 7, (uint64_t)(r * C + c)));
            assert_int_equal(got, want);
            differ += got != mt_e2m1_from_float(x[r * C + c] * m, MT_Q_RN, 0);
        }
    assert_true(differ > 0);
    mt_qtensor_free(&q);
    mt_qtensor_free(&q2);
}

static void test_rht(void **state)
{
    (void)state;
    float h[256], h2[256];
    mt_q_rht_matrix(h, 1234, 0);
    mt_q_rht_matrix(h2, 1235, 0);
    assert_true(memcmp(h, h2, sizeof h) != 0);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = 0; /* (Q^T Q)[i][j]: sums of +-1/16, exact in fp32 */
            for (int k = 0; k < 16; k++) s += h[k * 16 + i] * h[k * 16 + j];
            assert_true(s == (i == j ? 1.0f : 0.0f));
        }
    /* C = A B with A (M, K) and B (K, N): transforming A's rows and B's columns along
     * K leaves C unchanged, to the rounding of the transforms and the products */
    enum { M = 6, K = 64, N = 5 };
    float a[M * K], b[K * N];
    for (int i = 0; i < M * K; i++) a[i] = rnd_unit();
    for (int i = 0; i < K * N; i++) b[i] = rnd_unit();
    double c0[M * N], bound[M * N];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, na = 0, nb = 0;
            for (int k = 0; k < K; k++) {
                s += (double)a[i * K + k] * b[k * N + j];
                na += (double)a[i * K + k] * a[i * K + k];
                nb += (double)b[k * N + j] * b[k * N + j];
            }
            c0[i * N + j] = s;
            /* u = 2^-24. A transformed element sums 16 terms v_i/4: its error is at most
             * 16 u sum|v_i|/4 <= 16 u |v| (|v| the chunk's 2-norm). Against the other
             * transformed operand (whose chunk sums of magnitudes are at most 4 times its
             * chunk norms, and which keeps the norms, Q being orthogonal) that is
             * 64 u |a| |b| per operand; the K-term fp32 sum adds K u |a| |b|. */
            bound[i * N + j] = (2.0 * 64 + K) * 0x1p-24 * sqrt(na) * sqrt(nb) * 1.01;
        }
    struct mt_err err;
    assert_int_equal(mt_q_rht(a, M, K, K, MT_Q_ALONG_ROW, 99, 3, &err), MT_OK);
    assert_int_equal(mt_q_rht(b, K, N, N, MT_Q_ALONG_COL, 99, 3, &err), MT_OK);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            for (int k = 0; k < K; k++) s += a[i * K + k] * b[k * N + j];
            assert_true(fabs(s - c0[i * N + j]) <= bound[i * N + j]);
        }
    /* the transform moved the operands: not the identity */
    float e[16] = {1};
    assert_int_equal(mt_q_rht(e, 1, 16, 16, MT_Q_ALONG_ROW, 99, 3, &err), MT_OK);
    for (int j = 0; j < 16; j++) assert_true(fabsf(e[j]) == 0.25f);
    assert_int_equal(mt_q_rht(a, M, 20, K, MT_Q_ALONG_ROW, 99, 3, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "multiple of 16"));
}

/* The signs flip the transform's inputs, Q = diag(s) H / 4: the unit vector e_i becomes
 * s_i times row i of H / 4, and the quantised product of two transformed operands
 * depends on the signs. With the signs on the outputs (H diag(s)) they multiply both
 * operands' elements alike and cancel in the product, every quantiser being symmetric
 * in sign: the transform would be the fixed Hadamard one whatever the seed. */
static void test_rht_signs(void **state)
{
    (void)state;
    struct mt_err err;
    const uint32_t signs = mt_q_hadamard_signs(99, 3);
    assert_true(signs != 0 && signs != 0xffffu); /* both signs drawn */
    for (int i = 0; i < 16; i++) {
        float e[16] = {0};
        e[i] = 1.0f;
        assert_int_equal(mt_q_rht(e, 1, 16, 16, MT_Q_ALONG_ROW, 99, 3, &err), MT_OK);
        const float s = (signs >> i) & 1u ? -0.25f : 0.25f;
        for (int j = 0; j < 16; j++)
            assert_true(e[j] == (__builtin_parity((unsigned)(i & j)) ? -s : s));
    }
    /* a (4, 32) and b (4, 32), transformed along their rows (the reduction), quantised
     * to NVFP4 along it: q(a Q) q(b Q)^T under two seeds whose signs differ */
    enum { R = 4, K = 32 };
    float a[R * K], b[R * K], c[2][R * R];
    for (int i = 0; i < R * K; i++) a[i] = rnd_unit(), b[i] = rnd_unit();
    const uint64_t seeds[2] = {99, 100};
    assert_true(mt_q_hadamard_signs(seeds[0], 3) != mt_q_hadamard_signs(seeds[1], 3));
    for (int v = 0; v < 2; v++) {
        float ta[R * K], tb[R * K];
        memcpy(ta, a, sizeof a);
        memcpy(tb, b, sizeof b);
        assert_int_equal(mt_q_rht(ta, R, K, K, MT_Q_ALONG_ROW, seeds[v], 3, &err), MT_OK);
        assert_int_equal(mt_q_rht(tb, R, K, K, MT_Q_ALONG_ROW, seeds[v], 3, &err), MT_OK);
        struct mt_qtensor qa, qb;
        assert_int_equal(mt_qtensor_init(&qa, MT_Q_NVFP4, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, R, K, &err), MT_OK);
        assert_int_equal(mt_qtensor_init(&qb, MT_Q_NVFP4, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, R, K, &err), MT_OK);
        assert_int_equal(mt_quant_nvfp4(&qa, ta, K, MT_Q_RN, 0, 0, &err), MT_OK);
        assert_int_equal(mt_quant_nvfp4(&qb, tb, K, MT_Q_RN, 0, 0, &err), MT_OK);
        assert_int_equal(mt_q_gemm(&qa, 0, &qb, 1, c[v], R, 0, &err), MT_OK);
        mt_qtensor_free(&qa);
        mt_qtensor_free(&qb);
    }
    int differ = 0;
    for (int i = 0; i < R * R; i++) differ += c[0][i] != c[1][i];
    assert_true(differ > 0);
}

/* The quantised GEMM against a double-precision GEMM of the dequantised operands. The
 * fp32 accumulation of K products errs by at most K u sum|a b| (u = 2^-24, to first
 * order); the dequantised values and the scale products add up to four roundings of u
 * each: |c - ref| <= (K + 4) u sum|a b| (times 1.01 for the second-order terms). */
static void check_gemm(const struct mt_qtensor *a, int ta, const struct mt_qtensor *b, int tb,
                       int split, int64_t m, int64_t n, int64_t k)
{
    struct mt_err err;
    float *da = malloc(sizeof(float) * (size_t)(a->rows * a->cols));
    float *db = malloc(sizeof(float) * (size_t)(b->rows * b->cols));
    float *c = malloc(sizeof(float) * (size_t)(m * n));
    assert_true(da && db && c);
    assert_int_equal(mt_dequant(a, da, a->cols, &err), MT_OK);
    assert_int_equal(mt_dequant(b, db, b->cols, &err), MT_OK);
    int rc = mt_q_gemm(a, ta, b, tb, c, n, split, &err);
    if (rc) fail_msg("mt_q_gemm: %s", err.msg);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (int64_t l = 0; l < k; l++) {
                double x = ta ? da[l * a->cols + i] : da[i * a->cols + l];
                double y = tb ? db[j * b->cols + l] : db[l * b->cols + j];
                ref += x * y;
                mag += fabs(x * y);
            }
            double bound = (double)(k + 4) * 0x1p-24 * mag * 1.01;
            if (!(fabs(c[i * n + j] - ref) <= bound))
                fail_msg("c[%lld][%lld] = %.9g, double-precision %.9g, bound %.3g",
                         (long long)i, (long long)j, (double)c[i * n + j], ref, bound);
        }
    free(da);
    free(db);
    free(c);
}

static float *random_matrix(int64_t rows, int64_t cols, float range)
{
    float *x = malloc(sizeof(float) * (size_t)(rows * cols));
    assert_non_null(x);
    for (int64_t i = 0; i < rows * cols; i++) x[i] = range * rnd_unit() * (i % 7 ? 1.0f : 9.0f);
    return x;
}

static void test_gemm(void **state)
{
    (void)state;
    struct mt_err err;
    enum { M = 7, N = 9, K = 300 }; /* K: two whole 128-blocks and a tail of 44 */
    float *xa = random_matrix(M, K, 2.0f);  /* A (M, K) */
    float *xbt = random_matrix(N, K, 0.5f); /* B^T (N, K) */
    float *xb = random_matrix(K, N, 0.5f);  /* B (K, N) */
    struct mt_qtensor a, b;

    /* tensorwise: E4M3 activations, E5M2 (hybrid) other operand */
    assert_int_equal(mt_qtensor_init(&a, MT_Q_TENSOR, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, M, K, &err), MT_OK);
    assert_int_equal(mt_qtensor_init(&b, MT_Q_TENSOR, MT_Q_ELEM_E5M2, MT_Q_ALONG_ROW, K, N, &err), MT_OK);
    assert_int_equal(mt_quant_tensorwise(&a, xa, K, mt_q_tensor_scale(mt_q_amax(xa, M, K, K), MT_E4M3_MAX, 0), MT_Q_RN, 0, 0, &err), MT_OK);
    assert_int_equal(mt_quant_tensorwise(&b, xb, N, mt_q_tensor_scale(mt_q_amax(xb, K, N, N), MT_E5M2_MAX, 0), MT_Q_RN, 0, 0, &err), MT_OK);
    check_gemm(&a, 0, &b, 0, 0, M, N, K);
    mt_qtensor_free(&a);
    mt_qtensor_free(&b);

    /* blockwise: 1x128 activations times 128x128 weights (B^T stored (N, K)), with and
     * without the split accumulation */
    for (int pow2 = 0; pow2 < 2; pow2++) {
        assert_int_equal(mt_qtensor_init(&a, MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, M, K, &err), MT_OK);
        assert_int_equal(mt_qtensor_init(&b, MT_Q_BLOCK_128X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, N, K, &err), MT_OK);
        assert_int_equal(mt_quant_blockwise(&a, xa, K, pow2, &err), MT_OK);
        assert_int_equal(mt_quant_blockwise(&b, xbt, K, pow2, &err), MT_OK);
        check_gemm(&a, 0, &b, 1, 0, M, N, K);
        check_gemm(&a, 0, &b, 1, 1, M, N, K);
        mt_qtensor_free(&a);
        mt_qtensor_free(&b);
    }

    /* 1x128 tiles read with k along their columns (a transposed A) do not lie along k */
    static float sq[128 * 128], csq[128 * 128];
    assert_int_equal(mt_qtensor_init(&a, MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, 128, 128, &err), MT_OK);
    assert_int_equal(mt_quant_blockwise(&a, sq, 128, 0, &err), MT_OK);
    assert_int_equal(mt_q_gemm(&a, 1, &a, 1, csq, 128, 0, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "do not lie along the reduction"));
    assert_int_equal(mt_q_gemm(&a, 0, &a, 1, csq, 128, 1, &err), MT_OK);
    mt_qtensor_free(&a);

    /* mxfp8: A (M, K) along its rows, B (K, N) along its columns: both along k */
    assert_int_equal(mt_qtensor_init(&a, MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, M, K, &err), MT_OK);
    assert_int_equal(mt_qtensor_init(&b, MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_COL, K, N, &err), MT_OK);
    assert_int_equal(mt_quant_mxfp8(&a, xa, K, &err), MT_OK);
    assert_int_equal(mt_quant_mxfp8(&b, xb, N, &err), MT_OK);
    check_gemm(&a, 0, &b, 0, 0, M, N, K);
    float c[M * N];
    assert_int_equal(mt_q_gemm(&a, 0, &b, 0, c, N, 1, &err), MT_EINVAL); /* split: blockwise only */
    mt_qtensor_free(&b);
    /* B quantised along its rows (the forward layout of a weight used as (N, K)) cannot
     * serve as the (K, N) operand: it must be quantised again along k */
    assert_int_equal(mt_qtensor_init(&b, MT_Q_MX, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, K, N, &err), MT_OK);
    assert_int_equal(mt_quant_mxfp8(&b, xb, N, &err), MT_OK);
    assert_int_equal(mt_q_gemm(&a, 0, &b, 0, c, N, 0, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "quantise it along its other dimension"));
    mt_qtensor_free(&b);

    /* mixed recipes are refused */
    assert_int_equal(mt_qtensor_init(&b, MT_Q_TENSOR, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, K, N, &err), MT_OK);
    assert_int_equal(mt_q_gemm(&a, 0, &b, 0, c, N, 0, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "one recipe"));
    mt_qtensor_free(&a);
    mt_qtensor_free(&b);

    /* nvfp4: 1x16 activations times 16x16 weights (B^T (N, K)); K = 304 (19 blocks) */
    enum { K4 = 304 };
    float *ya = random_matrix(M, K4, 2.0f), *ybt = random_matrix(N, K4, 0.5f);
    assert_int_equal(mt_qtensor_init(&a, MT_Q_NVFP4, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, M, K4, &err), MT_OK);
    assert_int_equal(mt_qtensor_init(&b, MT_Q_NVFP4_2D, MT_Q_ELEM_E2M1, MT_Q_ALONG_ROW, N, K4, &err), MT_OK);
    assert_int_equal(mt_quant_nvfp4(&a, ya, K4, MT_Q_RN, 0, 0, &err), MT_OK);
    assert_int_equal(mt_quant_nvfp4(&b, ybt, K4, MT_Q_SR, 5, 1, &err), MT_OK);
    check_gemm(&a, 0, &b, 1, 0, M, N, K4);
    mt_qtensor_free(&a);
    mt_qtensor_free(&b);
    free(ya);
    free(ybt);
    free(xa);
    free(xb);
    free(xbt);
}

/* The blockwise recipe's split accumulation (doc/fp8.md, "Blockwise accumulation") on
 * a constructed input, c (1, 2) = a (1, 256) b^T, b (2, 256), both 1 x 128 tiles with
 * power-of-two scales, every value exact in E4M3 under its tile's scale. k 0..127 (the
 * first tile) gives 1 in both columns; k 128..255:
 *   column 0: products 2^-24 and 2^-50 (a 1 and 2^-13; b 2^-24 and 2^-37). Exactly,
 *     1 + 2^-24 + 2^-50 rounds up to 1 + 2^-23; split, the tile's sum rounds to 2^-24
 *     first and 1 + 2^-24 is a tie that goes to 1.
 *   column 1: 128 products of 2^-25. Split, the tile sums to 2^-18 and c = 1 + 2^-18,
 *     the exact sum; summed one by one in fp32 each product is lost against 1 (c = 1).
 * The CPU backend's quantised GEMM (the model's) must give mt_q_gemm's split result,
 * bit for bit, on these and on a random (5, 300) x (300, 6) whose sums do round. */
static void test_gemm_split(void **state)
{
    (void)state;
    struct mt_err err;
    enum { K = 256, N = 2 };
    static float a[K], b[N * K];
    a[0] = 1.0f;
    b[0] = 1.0f;
    b[K] = 1.0f;
    a[128] = 1.0f;
    a[129] = 0x1p-13f;
    b[128] = 0x1p-24f;
    b[129] = 0x1p-37f;
    b[K + 128] = 0x1p-25f; /* column 1: 1 * 2^-25 */
    b[K + 129] = 0x1p-12f; /* 2^-13 * 2^-12 */
    for (int l = 130; l < K; l++) {
        a[l] = 0x1p-12f;      /* column 0's b is zero there */
        b[K + l] = 0x1p-13f;  /* 2^-12 * 2^-13 */
    }
    struct mt_qtensor qa, qb;
    assert_int_equal(mt_qtensor_init(&qa, MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, 1, K, &err), MT_OK);
    assert_int_equal(mt_qtensor_init(&qb, MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, N, K, &err), MT_OK);
    assert_int_equal(mt_quant_blockwise(&qa, a, K, 1, &err), MT_OK);
    assert_int_equal(mt_quant_blockwise(&qb, b, K, 1, &err), MT_OK);
    float da[K], db[N * K];
    assert_int_equal(mt_dequant(&qa, da, K, &err), MT_OK);
    assert_int_equal(mt_dequant(&qb, db, K, &err), MT_OK);
    assert_memory_equal(da, a, sizeof a); /* the input is its own quantisation */
    assert_memory_equal(db, b, sizeof b);
    float split[N], seq[N], model[N];
    double exact[N];
    assert_int_equal(mt_q_gemm(&qa, 0, &qb, 1, split, N, 1, &err), MT_OK);
    assert_int_equal(mt_q_gemm(&qa, 0, &qb, 1, seq, N, 0, &err), MT_OK);
    for (int j = 0; j < N; j++) {
        exact[j] = 0;
        for (int l = 0; l < K; l++) exact[j] += (double)a[l] * (double)b[j * K + l];
    }
    assert_true(exact[0] == 1.0 + 0x1p-24 + 0x1p-50);
    assert_true((float)exact[0] == 1.0f + 0x1p-23f);
    assert_true(split[0] == 1.0f); /* one fp32 ulp from the exact sum's rounding */
    assert_true(exact[1] == 1.0 + 0x1p-18);
    assert_true(split[1] == 1.0f + 0x1p-18f && seq[1] == 1.0f);

    const struct mt_kernels *kc = mt_kernels_cpu();
    assert_non_null(kc->quant);
    struct mt_quant_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.scaling = MT_Q_BLOCK_1X128;
    sp.elem = MT_Q_ELEM_E4M3;
    sp.along = MT_Q_ALONG_ROW;
    sp.rnd = MT_Q_RN;
    kc->quant->gemm(NULL, false, true, &sp, mt_tview(a, MT_F32, 1, K), &sp,
                    mt_tview(b, MT_F32, N, K), 0.0f, mt_tview(model, MT_F32, 1, N));
    assert_memory_equal(model, split, sizeof split);
    mt_qtensor_free(&qa);
    mt_qtensor_free(&qb);

    /* random operands: x (M, KR) 1 x 128 tiles times w (NR, KR) 128 x 128 blocks, the
     * model's forward; and the same x read transposed (its 128 x 1 tiles along k, the
     * weight gradient's layout) times y (KR, NR) 128 x 1 tiles */
    enum { M = 5, NR = 6, KR = 300 };
    float *x = random_matrix(M, KR, 2.0f), *w = random_matrix(NR, KR, 0.5f);
    float *xt = random_matrix(KR, M, 2.0f), *y = random_matrix(KR, NR, 0.5f);
    float ref[M * NR], got[M * NR];
    struct mt_quant_spec sx = sp, sw = sp;
    sw.scaling = MT_Q_BLOCK_128X128;
    assert_int_equal(mt_qtensor_init(&qa, MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, M, KR, &err), MT_OK);
    assert_int_equal(mt_qtensor_init(&qb, MT_Q_BLOCK_128X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, NR, KR, &err), MT_OK);
    assert_int_equal(mt_quant_blockwise(&qa, x, KR, 1, &err), MT_OK);
    assert_int_equal(mt_quant_blockwise(&qb, w, KR, 1, &err), MT_OK);
    assert_int_equal(mt_q_gemm(&qa, 0, &qb, 1, ref, NR, 1, &err), MT_OK);
    kc->quant->gemm(NULL, false, true, &sx, mt_tview(x, MT_F32, M, KR), &sw,
                    mt_tview(w, MT_F32, NR, KR), 0.0f, mt_tview(got, MT_F32, M, NR));
    assert_memory_equal(got, ref, sizeof ref);
    mt_qtensor_free(&qa);
    mt_qtensor_free(&qb);
    /* 128 x 1 tiles: quantise the transposes along their rows (what qdq does for a
     * column-wise 1 x 128 spec) and compare with the GEMM on the stored layouts */
    float *xtt = malloc(sizeof(float) * M * KR), *yt = malloc(sizeof(float) * NR * KR);
    assert_true(xtt && yt);
    for (int l = 0; l < KR; l++) {
        for (int i = 0; i < M; i++) xtt[i * KR + l] = xt[l * M + i];
        for (int j = 0; j < NR; j++) yt[j * KR + l] = y[l * NR + j];
    }
    assert_int_equal(mt_qtensor_init(&qa, MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, M, KR, &err), MT_OK);
    assert_int_equal(mt_qtensor_init(&qb, MT_Q_BLOCK_1X128, MT_Q_ELEM_E4M3, MT_Q_ALONG_ROW, NR, KR, &err), MT_OK);
    assert_int_equal(mt_quant_blockwise(&qa, xtt, KR, 1, &err), MT_OK);
    assert_int_equal(mt_quant_blockwise(&qb, yt, KR, 1, &err), MT_OK);
    assert_int_equal(mt_q_gemm(&qa, 0, &qb, 1, ref, NR, 1, &err), MT_OK);
    sx.along = MT_Q_ALONG_COL;
    struct mt_quant_spec sy = sx;
    float c0[M * NR];
    for (int i = 0; i < M * NR; i++) c0[i] = got[i] = 0.25f * (float)i;
    kc->quant->gemm(NULL, true, false, &sx, mt_tview(xt, MT_F32, KR, M), &sy,
                    mt_tview(y, MT_F32, KR, NR), 1.0f, mt_tview(got, MT_F32, M, NR));
    for (int i = 0; i < M * NR; i++)
        if (got[i] != ref[i] + c0[i])
            fail_msg("c[%d] = %.9g, split %.9g + beta c %.9g", i, (double)got[i], (double)ref[i], (double)c0[i]);
    mt_qtensor_free(&qa);
    mt_qtensor_free(&qb);
    free(x);
    free(w);
    free(xt);
    free(y);
    free(xtt);
    free(yt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_codes),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_ties_and_saturation),
        cmocka_unit_test(test_stochastic_rounding),
        cmocka_unit_test(test_philox),
        cmocka_unit_test(test_delayed_scaling),
        cmocka_unit_test(test_tensorwise),
        cmocka_unit_test(test_blockwise),
        cmocka_unit_test(test_mxfp8_rows_vs_cols),
        cmocka_unit_test(test_nvfp4),
        cmocka_unit_test(test_rht),
        cmocka_unit_test(test_rht_signs),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_gemm_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

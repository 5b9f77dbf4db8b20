/* moetrain: the scalar codecs of the FP8 and FP4 recipes (doc/fp8.md).
 *
 * One definition for the CPU reference, the CUDA kernels and the CUDA emulator: every
 * function is `static inline`, C11 and C++ at once, and `__host__ __device__` under nvcc.
 * They work on the fp32 bit pattern with integer arithmetic only, so that every compiler
 * and every device computes the same bits (no FMA contraction, no rounding mode, no
 * denormal flushing can change a result).
 *
 * Formats (OCP 8-bit floating point and OCP MX v1.0):
 *   E4M3  sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinity, 0x7f/0xff NaN;
 *         largest finite 448 (0x7e), smallest subnormal 2^-9.
 *   E5M2  sign, 5 exponent bits (bias 15), 2 mantissa bits; IEEE-like: 0x7c infinity,
 *         0x7d..0x7f NaN; largest finite 57344 (0x7b), smallest subnormal 2^-16.
 *   E2M1  (FP4) sign, 2 exponent bits (bias 1), 1 mantissa bit; no infinity or NaN;
 *         values 0, 0.5, 1, 1.5, 2, 3, 4, 6; a nibble.
 *   UE8M0 (MX scale) 8 exponent bits, no sign or mantissa: 2^(c-127), c = 0..254,
 *         0xff NaN.
 *   UE4M3 (NVFP4 scale) an E4M3 code with the sign bit clear.
 *
 * Rounding and special values are those of NVIDIA's conversions (cuda_fp8.h,
 * cuda_fp4.h; PTX `cvt`), which tests/kernels/quant_oracle.cc compares bit for bit:
 *   - round to nearest, ties to even (RN); the sign of zero is kept;
 *   - FP8 with saturation: anything beyond the largest finite value, infinity included,
 *     becomes the largest finite value of its sign; without saturation E4M3 overflow
 *     becomes NaN (sign kept) and E5M2 overflow infinity; a NaN input becomes 0x7f;
 *   - E2M1 always saturates; a NaN input becomes +6 (0x7);
 *   - UE8M0 rounds |x| to a power of two toward zero (RZ) or toward +infinity (RU),
 *     clips below 2^-127 to 2^-127, above 2^127 to 2^127 (saturating) or NaN; NaN and
 *     (without saturation) infinity give 0xff.
 *   - Stochastic rounding (SR) as PTX `cvt.rs.satfinite` defines it: the magnitude is
 *     truncated to the target format, and rounded away from zero when the integer sum
 *     of the caller's random bits and the same number of most significant discarded
 *     bits carries out. The discarded bits are counted in units of the target's ulp at
 *     the magnitude's exponent (its subnormal ulp below the normal range), so the
 *     probability of rounding away is the discarded fraction, to 2^-8. PTX gives each
 *     FP8 and FP4 element 8 random bits (cvt.rs .e4m3x4/.e5m2x4/.e2m1x4); so do these.
 *     Saturation is implied (satfinite); NaN gives what RN gives.
 *
 * Random bits come from Philox-4x32-10 (util/philox.h), keyed by a 64-bit seed and
 * counting in the element index, so the CPU and any GPU thread draw the same bits for
 * the same element. */
#ifndef MT_KERNELS_QUANT_H
#define MT_KERNELS_QUANT_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "util/philox.h"

#if defined(__CUDACC__)
#define MT_QFN static inline __host__ __device__
#else
#define MT_QFN static inline
#endif

/* Largest finite values of the element formats. */
#define MT_E4M3_MAX 448.0f
#define MT_E5M2_MAX 57344.0f
#define MT_E2M1_MAX 6.0f

/* Rounding of the element encoders: nearest even, or stochastic with 8 random bits. */
enum mt_q_round { MT_Q_RN = 0, MT_Q_SR = 1 };

MT_QFN uint32_t mt_q_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

MT_QFN float mt_q_float(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Rounds a finite fp32 magnitude (bit pattern, sign clear) to a format with mbits
 * mantissa bits and minimum normal exponent emin (unbounded above), and returns the
 * magnitude's code: (biased exponent << mbits) | mantissa, which counts the format's
 * values upward, so that rounding away from zero is code + 1 even across an exponent.
 * rnd: MT_Q_RN, or MT_Q_SR with the random byte rbits. No overflow check here. */
MT_QFN uint32_t mt_q_round_mag(uint32_t mag, int mbits, int emin, enum mt_q_round rnd,
                               uint32_t rbits)
{
    int e = (int)(mag >> 23) - 127;
    uint32_t sig = mag & 0x7fffffu;
    if (e == -127)
        e = -126; /* fp32 subnormal: no implicit bit */
    else
        sig |= 0x800000u;
    int top = e < emin ? emin : e;   /* the exponent whose ulp the result counts in */
    int s = 23 + top - mbits - e;     /* sig >> s: whole ulps; s >= 23 - mbits */
    uint32_t kept, frac;              /* frac: the discarded part, 0.32 fixed point */
    if (s >= 64) {
        kept = 0;
        frac = sig != 0; /* below 2^-32 ulp: a sticky bit only */
    } else {
        uint64_t low = (uint64_t)sig << (64 - s); /* the s discarded bits, at the top */
        kept = s >= 32 ? 0 : sig >> s;
        frac = (uint32_t)(low >> 32) | ((uint32_t)low != 0); /* sticky in the last bit */
    }
    uint32_t code = ((uint32_t)(top - emin) << mbits) + kept;
    uint32_t up;
    if (rnd == MT_Q_SR)
        up = ((frac >> 24) + (rbits & 0xffu)) >> 8; /* carry out of 8 bits */
    else
        up = frac > 0x80000000u || (frac == 0x80000000u && (code & 1u));
    return code + up;
}

/* float -> an FP8 format with mbits mantissa bits, minimum normal exponent emin and
 * largest finite code maxcode; overflow (infinity included) is maxcode with sat, else
 * over (E4M3: NaN, E5M2: infinity); NaN is 0x7f. */
MT_QFN uint8_t mt_q_fp8_from_float(float x, int mbits, int emin, uint32_t maxcode,
                                   uint32_t over, int sat, enum mt_q_round rnd, uint32_t rbits)
{
    uint32_t u = mt_q_bits(x), mag = u & 0x7fffffffu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if (rnd == MT_Q_SR) sat = 1;
    if (mag > 0x7f800000u) return 0x7f;
    uint32_t code = mag == 0x7f800000u ? over : mt_q_round_mag(mag, mbits, emin, rnd, rbits);
    if (code > maxcode) code = sat ? maxcode : over;
    return (uint8_t)(sign | code);
}

/* float -> E4M3. sat: saturate to +-448 (else overflow is NaN). */
MT_QFN uint8_t mt_e4m3_from_float(float x, int sat, enum mt_q_round rnd, uint32_t rbits)
{
    return mt_q_fp8_from_float(x, 3, -6, 0x7eu, 0x7fu, sat, rnd, rbits);
}

/* float -> E5M2. sat: saturate to +-57344 (else overflow is infinity). */
MT_QFN uint8_t mt_e5m2_from_float(float x, int sat, enum mt_q_round rnd, uint32_t rbits)
{
    return mt_q_fp8_from_float(x, 2, -14, 0x7bu, 0x7cu, sat, rnd, rbits);
}

/* float -> E2M1 (the low nibble); always saturating, NaN -> +6. */
MT_QFN uint8_t mt_e2m1_from_float(float x, enum mt_q_round rnd, uint32_t rbits)
{
    uint32_t u = mt_q_bits(x), mag = u & 0x7fffffffu;
    uint8_t sign = (uint8_t)((u >> 28) & 0x8u);
    if (mag > 0x7f800000u) return 0x7;
    if (mag == 0x7f800000u) return (uint8_t)(sign | 0x7);
    uint32_t code = mt_q_round_mag(mag, 1, 0, rnd, rbits);
    if (code > 0x7u) code = 0x7u;
    return (uint8_t)(sign | code);
}

/* float -> UE8M0: |x| to a power of two, toward zero (round_up 0) or toward +infinity
 * (round_up 1); sat: 2^127 for what is above it (else NaN). */
MT_QFN uint8_t mt_e8m0_from_float(float x, int sat, int round_up)
{
    uint32_t mag = mt_q_bits(x) & 0x7fffffffu;
    if (mag > 0x7f800000u) return 0xff;
    if (mag == 0x7f800000u) return sat ? 0xfe : 0xff;
    if (mag == 0) return 0x00;
    int e;
    uint32_t below; /* the bits under the leading one */
    if (mag >= 0x800000u) {
        e = (int)(mag >> 23) - 127;
        below = mag & 0x7fffffu;
    } else {
        int p = 22;
        while (!(mag >> p)) p--;
        e = p - 149;
        below = mag & ((1u << p) - 1u);
    }
    if (round_up && below) e++;
    int c = e + 127;
    if (c < 0) c = 0;
    if (c > 254) return sat ? 0xfe : 0xff;
    return (uint8_t)c;
}

/* The value of a magnitude code of a format with mbits mantissa bits and minimum normal
 * exponent emin (finite codes only). */
MT_QFN float mt_q_mag_value(uint32_t code, int mbits, int emin)
{
    uint32_t ex = code >> mbits, man = code & ((1u << mbits) - 1u);
    if (ex == 0) /* subnormal: man ulps of 2^(emin - mbits), exact in fp32 */
        return (float)man * mt_q_float((uint32_t)(emin - mbits + 127) << 23);
    return mt_q_float(((ex - 1u + (uint32_t)(emin + 127)) << 23) | (man << (23 - mbits)));
}

#define MT_Q_NAN 0x7fc00000u

MT_QFN float mt_q_signed(uint32_t neg, float v)
{
    return mt_q_float(mt_q_bits(v) | (neg ? 0x80000000u : 0u));
}

/* E4M3 -> float; 0x7f and 0xff are NaN. */
MT_QFN float mt_e4m3_to_float(uint8_t c)
{
    if ((c & 0x7fu) == 0x7fu) return mt_q_float(MT_Q_NAN);
    return mt_q_signed(c & 0x80u, mt_q_mag_value(c & 0x7fu, 3, -6));
}

/* E5M2 -> float; 0x7c infinity, 0x7d..0x7f NaN (either sign). */
MT_QFN float mt_e5m2_to_float(uint8_t c)
{
    uint32_t m = c & 0x7fu;
    if (m > 0x7cu) return mt_q_float(MT_Q_NAN);
    if (m == 0x7cu) return mt_q_float((c & 0x80u ? 0xff800000u : 0x7f800000u));
    return mt_q_signed(c & 0x80u, mt_q_mag_value(m, 2, -14));
}

/* E2M1 (low nibble of c) -> float. */
MT_QFN float mt_e2m1_to_float(uint8_t c)
{
    return mt_q_signed(c & 0x8u, mt_q_mag_value(c & 0x7u, 1, 0));
}

/* UE8M0 -> float: 2^(c-127); 0x00 is 2^-127 (an fp32 subnormal), 0xff NaN. */
MT_QFN float mt_e8m0_to_float(uint8_t c)
{
    if (c == 0xff) return mt_q_float(MT_Q_NAN);
    if (c == 0) return mt_q_float(0x00400000u);
    return mt_q_float((uint32_t)c << 23);
}

/* ---- counter-based random bits ---- */

/* What a Philox draw is for (the counter's last word), so uses never share bits. */
enum mt_q_purpose { MT_Q_RAND_ROUNDING = 0, MT_Q_RAND_HADAMARD_SIGNS = 1 };

/* The 8 random bits of element i (its flat index in the tensor) of stream `stream`
 * under seed: byte i % 16 of the draw at counter (i / 16, stream, MT_Q_RAND_ROUNDING). */
MT_QFN uint32_t mt_q_random_byte(uint64_t seed, uint32_t stream, uint64_t i)
{
    uint32_t ctr[4] = {(uint32_t)(i >> 4), (uint32_t)(i >> 36), stream, MT_Q_RAND_ROUNDING};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t r[4];
    mt_philox4x32_10(ctr, key, r);
    return (r[(i >> 2) & 3u] >> (8u * (uint32_t)(i & 3u))) & 0xffu;
}

/* The 16 signs of a random Hadamard transform: bit j set means -1 for entry j. */
MT_QFN uint32_t mt_q_hadamard_signs(uint64_t seed, uint32_t stream)
{
    uint32_t ctr[4] = {0, 0, stream, MT_Q_RAND_HADAMARD_SIGNS};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t r[4];
    mt_philox4x32_10(ctr, key, r);
    return r[0] & 0xffffu;
}

/* A draw's seed (struct mt_quant_spec seed and seed_dev): value, or where dev is not
 * NULL the seed in backend memory there, read where the bits are drawn (on a device by
 * the kernel as it runs, so that a captured graph's replay draws its own step's bits). */
struct mt_q_seed {
    const uint64_t *dev;
    uint64_t value;
};
MT_QFN uint64_t mt_q_seed_value(struct mt_q_seed s) { return s.dev ? *s.dev : s.value; }

/* NVFP4's random key in backend memory (doc/fp8.md, "Random bits"; struct mt_quant_ops
 * random_key): key[MT_Q_KEY_SEED] the seed of the current backward pass,
 * key[MT_Q_KEY_ITER] the iteration (optimizer steps taken), key[MT_Q_KEY_NBWD] the
 * backward passes begun in it. */
enum { MT_Q_KEY_SEED, MT_Q_KEY_ITER, MT_Q_KEY_NBWD, MT_Q_KEY_WORDS };

/* The seed of the backward pass of micro-batch mb (the step's: j x DP + DP rank for a
 * rank's j-th) in iteration iter, under the run's base seed. */
MT_QFN uint64_t mt_q_backward_seed(uint64_t base, uint64_t iter, uint64_t mb)
{
    return mt_philox_key_mix(base, (iter << 20) + mb);
}

/* The key's step (op random_key): end false, a backward pass begins: its seed from the
 * iteration and the pass, the passes counted; end true, the iteration ends: the next
 * one's, no pass begun. */
MT_QFN void mt_q_random_key_step(uint64_t *key, uint64_t base, int dp, int dp_rank, bool end)
{
    if (end) {
        key[MT_Q_KEY_ITER]++;
        key[MT_Q_KEY_NBWD] = 0;
        return;
    }
    key[MT_Q_KEY_SEED] = mt_q_backward_seed(base, key[MT_Q_KEY_ITER],
                                            key[MT_Q_KEY_NBWD] * (uint64_t)dp + (uint64_t)dp_rank);
    key[MT_Q_KEY_NBWD]++;
}

/* ---- scales shared by the recipes ---- */

/* Tensorwise and delayed scaling: the encode scale fmax / amax / 2^margin (data =
 * x * scale, value = data / scale). An amax of zero, or one that is not finite, gives
 * 1; a scale that would overflow is FLT_MAX. */
MT_QFN float mt_q_tensor_scale(float amax, float fmax, int margin)
{
    if (!(amax > 0.0f) || mt_q_bits(amax) >= 0x7f800000u) return 1.0f;
    float s = fmax / amax;
    for (int i = 0; i < margin; i++) s *= 0.5f;
    for (int i = 0; i > margin; i--) s *= 2.0f;
    if (mt_q_bits(s) >= 0x7f800000u) s = mt_q_float(0x7f7fffffu);
    return s;
}

/* Whether a step decided on the device is taken (struct mt_step_gate; op adamw_dev's
 * and amax_history's gate): the squared norm and the n loss sums loss[r * stride] finite. */
MT_QFN bool mt_q_step_taken(const double *sumsq, const double *loss, int stride, int n)
{
    bool ok = isfinite(*sumsq);
    for (int r = 0; r < n; r++) ok = ok && isfinite(loss[(size_t)r * (size_t)stride]);
    return ok;
}

/* Delayed scaling: the encode scale an amax history (struct mt_amax_history) gives after
 * its newest amax went in: hist holds count entries (newest among them, amaxes are
 * magnitudes), max_algo takes the window's largest, else newest itself; a NaN anywhere
 * there, or an amax of zero or infinity, keeps scale. */
MT_QFN float mt_q_history_scale(const float *hist, int count, float newest, int max_algo,
                                float fmax, int margin, float scale)
{
    float a = newest;
    int nan = a != a;
    if (max_algo)
        for (int i = 0; i < count; i++) {
            nan |= hist[i] != hist[i];
            a = hist[i] > a ? hist[i] : a;
        }
    return !nan && a > 0.0f && mt_q_bits(a) < 0x7f800000u ? mt_q_tensor_scale(a, fmax, margin) : scale;
}

/* Blockwise (DeepSeek-V3): the encode scale of a tile or block of largest magnitude
 * amax, fmax / amax as mt_q_tensor_scale gives it; pow2: rounded down to a power of two,
 * so that it and its inverse are exact and the tile's largest element still fits. */
MT_QFN float mt_q_block_scale(float amax, float fmax, int pow2)
{
    float s = mt_q_tensor_scale(amax, fmax, 0);
    return pow2 ? mt_q_float(mt_q_bits(s) & 0xff800000u) : s;
}

/* MXFP8: the UE8M0 block scale of a block whose largest magnitude is amax: amax / 448
 * rounded up to a power of two, so the block's largest element never saturates
 * (NVIDIA's MXFP8 recipe; OCP MX v1.0 rounds down, which can clip it). */
MT_QFN uint8_t mt_q_mx_scale(float amax)
{
    return mt_e8m0_from_float(amax / MT_E4M3_MAX, 1, 1);
}

/* MXFP8: what a block's elements are multiplied by before rounding: 2^(127 - c), the
 * inverse of the UE8M0 scale c, exact (NaN for the NaN scale 0xff). */
MT_QFN float mt_q_mx_element_scale(uint8_t c)
{
    if (c == 0xff) return mt_q_float(MT_Q_NAN);
    if (c == 254) return mt_q_float(0x00400000u); /* 2^-127 */
    return mt_q_float((uint32_t)(254 - c) << 23);
}

/* NVFP4: the per-tensor encode scale 6 * 448 / amax (1 for an amax of zero or not
 * finite, FLT_MAX rather than infinity). */
MT_QFN float mt_q_nvfp4_global_scale(float amax)
{
    return mt_q_tensor_scale(amax, MT_E2M1_MAX * MT_E4M3_MAX, 0);
}

/* NVFP4: the UE4M3 scale of a block of largest magnitude amax, under the per-tensor
 * encode scale genc: (amax / 6) * genc, rounded to nearest, saturating. */
MT_QFN uint8_t mt_q_nvfp4_block_scale(float amax, float genc)
{
    return mt_e4m3_from_float(amax / MT_E2M1_MAX * genc, 1, MT_Q_RN, 0);
}

/* NVFP4: what an element of a block is multiplied by before rounding to E2M1:
 * 1 / (block scale / genc); 0 for a block scale of zero (a block that rounds to zero). */
MT_QFN float mt_q_nvfp4_element_scale(uint8_t block_scale, float genc)
{
    float s = mt_e4m3_to_float(block_scale);
    if (s == 0.0f) return 0.0f;
    return genc / s;
}

#endif

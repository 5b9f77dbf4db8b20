#include "util/rng.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo)
{
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

void mt_rng_philox(uint64_t key, uint64_t counter_hi, uint64_t counter_lo, uint32_t out[4])
{
    uint32_t c0 = (uint32_t)counter_lo, c1 = (uint32_t)(counter_lo >> 32);
    uint32_t c2 = (uint32_t)counter_hi, c3 = (uint32_t)(counter_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(PHILOX_M0, c0, &hi0, &lo0);
        mulhilo(PHILOX_M1, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

uint64_t mt_rng_key(uint64_t a, uint64_t b)
{
    uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float mt_rng_uniform(uint64_t key, uint64_t stream, uint64_t index)
{
    uint32_t w[4];
    mt_rng_philox(key, stream, index, w);
    return (float)(w[0] >> 8) * (1.0f / 16777216.0f);
}

float mt_rng_normal(uint64_t key, uint64_t stream, uint64_t index)
{
    uint32_t w[4];
    mt_rng_philox(key, stream, index, w);
    /* u1 in (0, 1], u2 in [0, 1): 53-bit doubles from two words each */
    double u1 = ((double)(((uint64_t)w[0] << 21) ^ (w[1] >> 11)) + 1.0) / 9007199254740992.0;
    double u2 = (double)(((uint64_t)w[2] << 21) ^ (w[3] >> 11)) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t mt_rng_below(uint64_t key, uint64_t stream, uint64_t index, uint64_t n)
{
    uint32_t w[4];
    mt_rng_philox(key, stream, index, w);
    uint64_t x = ((uint64_t)w[0] << 32) | w[1];
    return n ? x % n : 0;
}

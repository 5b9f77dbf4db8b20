#include "util/rng.h"

#include "util/philox.h"

#include <math.h>

void mt_rng_philox(uint64_t key, uint64_t counter_hi, uint64_t counter_lo, uint32_t out[4])
{
    uint32_t ctr[4] = {(uint32_t)counter_lo, (uint32_t)(counter_lo >> 32), (uint32_t)counter_hi,
                       (uint32_t)(counter_hi >> 32)};
    uint32_t k[2] = {(uint32_t)key, (uint32_t)(key >> 32)};
    mt_philox4x32_10(ctr, k, out);
}

uint64_t mt_rng_key(uint64_t a, uint64_t b) { return mt_philox_key_mix(a, b); }

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

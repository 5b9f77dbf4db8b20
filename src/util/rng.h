/* Counter-based random numbers (Philox4x32-10). A value depends only on
 * (key, counter), never on call order, so any shard of a tensor can draw exactly
 * the elements the unsharded tensor would have: init is layout-independent. */
#ifndef MT_UTIL_RNG_H
#define MT_UTIL_RNG_H

#include <stdint.h>

/* Four 32-bit random words for (key, counter). */
void mt_rng_philox(uint64_t key, uint64_t counter_hi, uint64_t counter_lo, uint32_t out[4]);

/* Uniform in [0, 1) with 24 random bits, from word w of the block. */
float mt_rng_uniform(uint64_t key, uint64_t stream, uint64_t index);

/* Standard normal (Box-Muller on two uniforms of one block). */
float mt_rng_normal(uint64_t key, uint64_t stream, uint64_t index);

/* Mixes several 64-bit words into one key (splitmix64 finaliser chain). */
uint64_t mt_rng_key(uint64_t a, uint64_t b);

/* Uniform integer in [0, n) for (key, stream, index); unbiased enough for n < 2^32. */
uint64_t mt_rng_below(uint64_t key, uint64_t stream, uint64_t index, uint64_t n);

#endif

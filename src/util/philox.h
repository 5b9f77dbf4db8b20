/* Philox-4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as
 * 1, 2, 3", SC 2011; cuRAND's Philox is the same function): a 10-round bijection of a
 * 128-bit counter under a 64-bit key. Header-only, C11 and C++, `__host__ __device__`
 * under nvcc, so that the CPU (util/rng.c), the GPU kernels and the CUDA emulator draw
 * the same bits for the same counter. */
#ifndef MT_UTIL_PHILOX_H
#define MT_UTIL_PHILOX_H

#include <stdint.h>

#if defined(__CUDACC__)
#define MT_PHILOX_FN static inline __host__ __device__
#else
#define MT_PHILOX_FN static inline
#endif

MT_PHILOX_FN void mt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
        k0 += 0x9E3779B9u; /* the Weyl sequence of the key schedule */
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* util/rng.h's mt_rng_key (a splitmix64 finaliser of a and b), here to be callable on a
 * device too: NVFP4's backward-pass seeds are mixed by a kernel (kernels/quant.h,
 * mt_q_backward_seed). */
MT_PHILOX_FN uint64_t mt_philox_key_mix(uint64_t a, uint64_t b)
{
    uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif

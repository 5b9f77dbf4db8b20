// The CUDA execution emulator under ThreadSanitizer (--enable-sanitizers=thread):
// kernels with a data race, each of which must be reported, and the same kernels made
// correct (a barrier, __syncwarp, atomics, shuffles, launch order), which must not be
// (emu_races.sh runs each case in a process of its own and reads TSan's report).
//
//   emu_races CASE | --list | --tsan
//
// A racing case marks the line of the access that TSan sees second with
// `// RACE: CASE`; the report must name that line and the kernel. The correct cases
// check their results too, so that they mean something in a build without TSan, where
// the racing cases cannot be told from correct code (--tsan prints whether this build
// has it).
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_launch.cuh"
#include "tests/gpu/emu_test.h"

static int failures;
static void expect(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "emu_races: FAIL: %s\n", what);
        failures++;
    }
}

template <typename T>
static T *device_alloc(size_t n)
{
    void *p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
    CHECK_CUDA(cudaMemset(p, 0, n * sizeof(T)));
    return static_cast<T *>(p);
}

template <typename T>
static void to_host(T *h, const T *d, size_t n)
{
    CHECK_CUDA(cudaMemcpy(h, d, n * sizeof(T), cudaMemcpyDeviceToHost));
}

// ---------------------------------------------------------------- shared memory, one block

// Each thread reads its mirror's element: without the barrier, thread 0 reads s[63]
// before thread 63 writes it.
template <bool BARRIER>
__global__ static void smem_mirror_kernel(float *out)
{
    MT_SHARED(float, s, [64]);
    const unsigned t = threadIdx.x;
    s[t] = (float)t; // RACE: smem_missing_barrier
    if (BARRIER) __syncthreads();
    out[t] = s[63 - t];
}

static void case_smem_missing_barrier()
{
    float *out = device_alloc<float>(64);
    MT_LAUNCH(1, 64, 0, nullptr, smem_mirror_kernel<false>)(out);
}

static void case_smem_barrier()
{
    float *out = device_alloc<float>(64);
    MT_LAUNCH(1, 64, 0, nullptr, smem_mirror_kernel<true>)(out);
    float h[64];
    to_host(h, out, 64);
    for (unsigned t = 0; t < 64; t++) expect(h[t] == (float)(63 - t), "smem_barrier: s[63 - t] after __syncthreads");
}

// Two rounds through the same shared array: the second write needs a barrier after the
// reads of the first round (a barrier orders what comes before it, not after it).
template <bool SECOND>
__global__ static void smem_rounds_kernel(float *out)
{
    MT_SHARED(float, s, [64]);
    const unsigned t = threadIdx.x;
    s[t] = (float)t;
    __syncthreads();
    const float v = s[(t + 1) % 64];
    if (SECOND) __syncthreads();
    s[t] = 2 * v; // RACE: smem_missing_second_barrier
    __syncthreads();
    out[t] = s[(t + 1) % 64];
}

static void case_smem_missing_second_barrier()
{
    float *out = device_alloc<float>(64);
    MT_LAUNCH(1, 64, 0, nullptr, smem_rounds_kernel<false>)(out);
}

static void case_smem_second_barrier()
{
    float *out = device_alloc<float>(64);
    MT_LAUNCH(1, 64, 0, nullptr, smem_rounds_kernel<true>)(out);
    float h[64];
    to_host(h, out, 64);
    for (unsigned t = 0; t < 64; t++)
        expect(h[t] == (float)(2 * ((t + 2) % 64)), "smem_second_barrier: two rounds through shared memory");
}

// ---------------------------------------------------------------- global memory, two blocks

// Every block writes out[threadIdx.x]: blocks are unordered, barriers order only the
// threads of their own block.
__global__ static void blocks_same_address_kernel(unsigned *out)
{
    __syncthreads();
    out[threadIdx.x] = blockIdx.x + 1; // RACE: global_two_blocks
    __syncthreads();
}

static void case_global_two_blocks()
{
    unsigned *out = device_alloc<unsigned>(32);
    MT_LAUNCH(2, 32, 0, nullptr, blocks_same_address_kernel)(out);
}

// The same with atomics, which do not race with each other; many blocks.
__global__ static void blocks_atomic_kernel(unsigned *sum, int *top, unsigned *claimed)
{
    __syncthreads();
    atomicAdd(sum + threadIdx.x, blockIdx.x + 1);
    atomicMax(top + threadIdx.x, (int)blockIdx.x);
    atomicCAS(claimed + threadIdx.x, 0u, blockIdx.x + 1); // the first block to get there
}

static void case_global_atomics()
{
    const unsigned nb = 6;
    unsigned *sum = device_alloc<unsigned>(32), *claimed = device_alloc<unsigned>(32);
    int *top = device_alloc<int>(32);
    MT_LAUNCH(nb, 32, 0, nullptr, blocks_atomic_kernel)(sum, top, claimed);
    unsigned hs[32], hc[32];
    int ht[32];
    to_host(hs, sum, 32);
    to_host(ht, top, 32);
    to_host(hc, claimed, 32);
    for (unsigned t = 0; t < 32; t++) {
        expect(hs[t] == nb * (nb + 1) / 2, "global_atomics: atomicAdd over the blocks");
        expect(ht[t] == (int)nb - 1, "global_atomics: atomicMax over the blocks");
        expect(hc[t] >= 1 && hc[t] <= nb, "global_atomics: atomicCAS claimed once");
    }
}

// Launch order and the host's synchronisation: a kernel reads what the one before it
// wrote, the host reads both, then a third kernel overwrites the first's output.
__global__ static void fill_kernel(float *out, float v) { out[blockIdx.x * blockDim.x + threadIdx.x] = v; }
__global__ static void double_kernel(float *out, const float *in)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = 2 * in[(i + 37) % (4 * 64)];
}

static void case_launch_order()
{
    float *a = device_alloc<float>(4 * 64), *b = device_alloc<float>(4 * 64);
    MT_LAUNCH(4, 64, 0, nullptr, fill_kernel)(a, 1.5f);
    MT_LAUNCH(4, 64, 0, nullptr, double_kernel)(b, a);
    float ha[4 * 64], hb[4 * 64];
    to_host(ha, a, 4 * 64);
    to_host(hb, b, 4 * 64);
    MT_LAUNCH(4, 64, 0, nullptr, fill_kernel)(a, 2.5f);
    CHECK_CUDA(cudaDeviceSynchronize());
    float ha2[4 * 64];
    to_host(ha2, a, 4 * 64);
    for (unsigned i = 0; i < 4 * 64; i++) {
        expect(ha[i] == 1.5f && hb[i] == 3.0f, "launch_order: the second kernel reads the first's output");
        expect(ha2[i] == 2.5f, "launch_order: the third kernel's output");
    }
}

// ---------------------------------------------------------------- lanes of one warp

// Lane l reads lane l^1's element: the lanes of a warp need __syncwarp (or another
// collective) between a write and another lane's read, as any two threads do.
template <bool SYNC>
__global__ static void warp_neighbour_kernel(unsigned *out)
{
    MT_SHARED(unsigned, s, [32]);
    const unsigned l = threadIdx.x;
    s[l] = l * 3; // RACE: warp_missing_syncwarp
    if (SYNC) __syncwarp();
    out[l] = s[l ^ 1];
}

static void case_warp_missing_syncwarp()
{
    unsigned *out = device_alloc<unsigned>(32);
    MT_LAUNCH(1, 32, 0, nullptr, warp_neighbour_kernel<false>)(out);
}

static void case_warp_syncwarp()
{
    unsigned *out = device_alloc<unsigned>(32);
    MT_LAUNCH(1, 32, 0, nullptr, warp_neighbour_kernel<true>)(out);
    unsigned h[32];
    to_host(h, out, 32);
    for (unsigned l = 0; l < 32; l++) expect(h[l] == (l ^ 1) * 3, "warp_syncwarp: the neighbour's element");
}

// Half-warps meeting at their own __syncwarp are not ordered with each other: the
// upper half reads what the lower half wrote before the lower half's meeting.
__global__ static void warp_halves_kernel(unsigned *out)
{
    MT_SHARED(unsigned, s, [16]);
    const unsigned l = threadIdx.x;
    if (l < 16) {
        s[l] = l + 100;
        __syncwarp(0x0000ffffu);
    } else {
        __syncwarp(0xffff0000u);
        out[l] = s[l - 16]; // RACE: warp_halves
    }
}

static void case_warp_halves()
{
    unsigned *out = device_alloc<unsigned>(32);
    MT_LAUNCH(1, 32, 0, nullptr, warp_halves_kernel)(out);
}

// Values exchanged through shuffles and a ballot, not memory; one lane per warp writes
// the warp's result, half-warps meet at their own __syncwarp.
__global__ static void warp_shuffle_kernel(float *out, unsigned *bits)
{
    MT_SHARED(float, s, [64]);
    const unsigned t = threadIdx.x, l = t % 32;
    float v = (float)t;
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    const unsigned b = __ballot_sync(0xffffffffu, l % 5 == 0);
    s[t] = (float)l;
    __syncwarp(l < 16 ? 0x0000ffffu : 0xffff0000u);
    const float mirror = s[(t & ~15u) + 15 - (t & 15)]; // within the half-warp
    if (l == 0) {
        out[t / 32] = v;
        bits[t / 32] = b;
    }
    out[2 + t] = mirror;
}

static void case_warp_shuffle()
{
    float *out = device_alloc<float>(2 + 64);
    unsigned *bits = device_alloc<unsigned>(2);
    MT_LAUNCH(1, 64, 0, nullptr, warp_shuffle_kernel)(out, bits);
    float h[2 + 64];
    unsigned hb[2];
    to_host(h, out, 2 + 64);
    to_host(hb, bits, 2);
    unsigned want = 0;
    for (unsigned l = 0; l < 32; l += 5) want |= 1u << l;
    for (unsigned w = 0; w < 2; w++) {
        expect(h[w] == (float)(32 * 32 * w + 31 * 32 / 2), "warp_shuffle: butterfly sum");
        expect(hb[w] == want, "warp_shuffle: ballot");
    }
    for (unsigned t = 0; t < 64; t++)
        expect(h[2 + t] == (float)((t % 32 & ~15u) + 15 - (t & 15)), "warp_shuffle: half-warp mirror");
}

// ---------------------------------------------------------------- ldmatrix

// Warp 1 writes the tile that warp 0 reads with ldmatrix: a __syncthreads between.
// Without it warp 0 reads first (the scheduler runs it first), and warp 1's writes race.
template <bool BARRIER>
__global__ static void ldmatrix_tile_kernel(uint32_t *out)
{
    MT_SHARED(uint16_t, tile, [32 * 8]);
    const unsigned t = threadIdx.x;
    if (t >= 32)
        for (unsigned i = t - 32; i < 32 * 8; i += 32) tile[i] = (uint16_t)i; // RACE: ldmatrix_missing_barrier
    if (BARRIER) __syncthreads();
    if (t < 32) {
        uint32_t r[4];
        ::mt_emu::ldmatrix_x4(r, __cvta_generic_to_shared(tile) + 16 * t, false, __FILE__, __LINE__);
        out[t] = r[0];
    }
}

static void case_ldmatrix_missing_barrier()
{
    uint32_t *out = device_alloc<uint32_t>(32);
    MT_LAUNCH(1, 64, 0, nullptr, ldmatrix_tile_kernel<false>)(out);
}

static void case_ldmatrix_barrier()
{
    uint32_t *out = device_alloc<uint32_t>(32);
    MT_LAUNCH(1, 64, 0, nullptr, ldmatrix_tile_kernel<true>)(out);
    uint32_t h[32];
    to_host(h, out, 32);
    // matrix 0, lane l: row l / 4 (given by lane l / 4), columns 2 (l % 4) and 2 (l % 4) + 1
    for (unsigned l = 0; l < 32; l++) {
        const unsigned e = 8 * (l / 4) + 2 * (l % 4);
        expect(h[l] == (e | (e + 1) << 16), "ldmatrix_barrier: fragment of the tile");
    }
}

// ---------------------------------------------------------------- driver

struct test_case {
    const char *name;
    void (*run)();
    bool races; // TSan must report a data race
};
static const test_case cases[] = {
    {"smem_missing_barrier", case_smem_missing_barrier, true},
    {"smem_barrier", case_smem_barrier, false},
    {"smem_missing_second_barrier", case_smem_missing_second_barrier, true},
    {"smem_second_barrier", case_smem_second_barrier, false},
    {"global_two_blocks", case_global_two_blocks, true},
    {"global_atomics", case_global_atomics, false},
    {"launch_order", case_launch_order, false},
    {"warp_missing_syncwarp", case_warp_missing_syncwarp, true},
    {"warp_syncwarp", case_warp_syncwarp, false},
    {"warp_halves", case_warp_halves, true},
    {"warp_shuffle", case_warp_shuffle, false},
    {"ldmatrix_missing_barrier", case_ldmatrix_missing_barrier, true},
    {"ldmatrix_barrier", case_ldmatrix_barrier, false},
};

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--list")) {
        for (const test_case &c : cases) printf("%s %s\n", c.name, c.races ? "races" : "runs");
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "--tsan")) {
#if defined(__SANITIZE_THREAD__)
        printf("yes\n");
#else
        printf("no\n");
#endif
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: emu_races CASE | --list | --tsan\n");
        return 2;
    }
    for (const test_case &c : cases) {
        if (strcmp(c.name, argv[1])) continue;
        c.run();
        CHECK_CUDA(cudaDeviceSynchronize());
        return failures ? 1 : 0;
    }
    fprintf(stderr, "emu_races: no case '%s' (--list names them)\n", argv[1]);
    return 2;
}

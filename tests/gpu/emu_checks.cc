// The CUDA execution emulator's checks, one small kernel per check (emu_checks.sh runs
// each case in a process of its own and compares what it reports).
//
//   emu_checks CASE
//
// A case that breaks a rule of CUDA's execution model must end in the emulator's
// error (abort, exit status 134) naming the kernel, the block, the thread and the
// source line; the line is the one marked `// CHECK: CASE` below, found by the script.
// If such a case returns, the program says that the emulator reported nothing and
// exits 1. The cases whose error is an API return code (launch configuration, shared
// memory attributes) check the code themselves, and that the kernel did not run.
// `ok` runs every collective correctly (results checked), and fails if the emulator
// reports anything there: a check that fires on correct code is as blind as one that
// never fires.
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
        fprintf(stderr, "emu_checks: FAIL: %s\n", what);
        failures++;
    }
}

template <typename T>
static T *device_alloc(size_t n)
{
    void *p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
    return static_cast<T *>(p);
}

// ---------------------------------------------------------------- memory

__global__ static void oob_read_kernel(float *out, const float *in)
{
    out[threadIdx.x] = in[threadIdx.x + 1]; // thread 63 reads in[64]
}

static void case_oob_read()
{
    float *in = device_alloc<float>(64), *out = device_alloc<float>(64); // 256 bytes: no rounding slack
    MT_LAUNCH(1, 64, 0, nullptr, oob_read_kernel)(out, in);
}

__global__ static void read_kernel(float *out, const float *in) { out[threadIdx.x] = in[threadIdx.x]; }

static void case_use_after_free()
{
    float *in = device_alloc<float>(64), *out = device_alloc<float>(64);
    CHECK_CUDA(cudaFree(in));
    MT_LAUNCH(1, 32, 0, nullptr, read_kernel)(out, in);
}

static void case_memcpy_past_end()
{
    float *d = device_alloc<float>(10);
    float h[11] = {0};
    cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
}

__global__ static void ldg_kernel(float4 *out, const float4 *in) { out[threadIdx.x] = __ldg(in + threadIdx.x); }

static void case_ldg_misaligned()
{
    float *in = device_alloc<float>(256), *out = device_alloc<float>(256);
    MT_LAUNCH(1, 32, 0, nullptr, ldg_kernel)(reinterpret_cast<float4 *>(out), reinterpret_cast<const float4 *>(in + 1));
}

// ---------------------------------------------------------------- barriers

__global__ static void barrier_after_return_kernel(int *out)
{
    if (threadIdx.x >= 16) return;
    __syncthreads(); // CHECK: barrier_after_return
    out[threadIdx.x] = 1;
}

static void case_barrier_after_return()
{
    int *out = device_alloc<int>(32);
    MT_LAUNCH(1, 32, 0, nullptr, barrier_after_return_kernel)(out);
}

// The other order: the returning thread runs first, the last to reach the barrier
// finds it gone.
__global__ static void barrier_after_early_return_kernel(int *out)
{
    if (threadIdx.x == 0) return;
    __syncthreads(); // CHECK: barrier_after_early_return
    out[threadIdx.x] = 1;
}

static void case_barrier_after_early_return()
{
    int *out = device_alloc<int>(64);
    MT_LAUNCH(dim3(2, 1, 1), 64, 0, nullptr, barrier_after_early_return_kernel)(out);
}

__global__ static void divergent_barrier_kernel(int *out)
{
    if (threadIdx.x < 40) {
        out[threadIdx.x] = 1;
        __syncthreads(); // CHECK: divergent_barrier
    } else {
        out[threadIdx.x] = 2;
        __syncthreads();
    }
}

static void case_divergent_barrier()
{
    int *out = device_alloc<int>(64);
    MT_LAUNCH(1, 64, 0, nullptr, divergent_barrier_kernel)(out);
}

// Thread 0 waits at the block barrier; the rest of its warp waits for it at __syncwarp.
__global__ static void deadlock_kernel(int *out)
{
    if (threadIdx.x == 0) __syncthreads(); // CHECK: deadlock
    else __syncwarp();
    out[threadIdx.x] = 1;
}

static void case_deadlock()
{
    int *out = device_alloc<int>(32);
    MT_LAUNCH(1, 32, 0, nullptr, deadlock_kernel)(out);
}

// ---------------------------------------------------------------- warp collectives

__global__ static void shfl_mask_mismatch_kernel(float *out)
{
    const unsigned lane = threadIdx.x % 32;
    const unsigned mask = lane == 5 ? 0x000000ffu : 0xffffffffu;
    out[threadIdx.x] = __shfl_sync(mask, (float)lane, 0); // CHECK: shfl_mask_mismatch
}

static void case_shfl_mask_mismatch()
{
    float *out = device_alloc<float>(64);
    MT_LAUNCH(dim3(1, 1, 1), dim3(32, 2, 1), 0, nullptr, shfl_mask_mismatch_kernel)(out);
}

__global__ static void shfl_returned_lane_kernel(float *out)
{
    if (threadIdx.x == 0) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1); // CHECK: shfl_returned_lane
}

static void case_shfl_returned_lane()
{
    float *out = device_alloc<float>(32);
    MT_LAUNCH(1, 32, 0, nullptr, shfl_returned_lane_kernel)(out);
}

// The lane named returns while the others already wait for it.
__global__ static void shfl_lane_returns_kernel(float *out)
{
    if (threadIdx.x == 31) return;
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (float)threadIdx.x, 1); // CHECK: shfl_lane_returns
}

static void case_shfl_lane_returns()
{
    float *out = device_alloc<float>(32);
    MT_LAUNCH(1, 32, 0, nullptr, shfl_lane_returns_kernel)(out);
}

__global__ static void shfl_not_caller_kernel(float *out)
{
    out[threadIdx.x] = __shfl_sync(0xfffffffeu, 1.0f, 1); // CHECK: shfl_not_caller
}

static void case_shfl_not_caller()
{
    float *out = device_alloc<float>(32);
    MT_LAUNCH(1, 32, 0, nullptr, shfl_not_caller_kernel)(out);
}

__global__ static void shfl_outside_mask_kernel(float *out)
{
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1.0f, 20); // CHECK: shfl_outside_mask
}

static void case_shfl_outside_mask()
{
    float *out = device_alloc<float>(32);
    MT_LAUNCH(1, 32, 0, nullptr, shfl_outside_mask_kernel)(out);
}

// Lanes of one warp at two different collectives with the same mask.
__global__ static void divergent_collective_kernel(unsigned *out)
{
    if (threadIdx.x % 2) out[threadIdx.x] = __ballot_sync(0xffffffffu, 1); // CHECK: divergent_collective
    else out[threadIdx.x] = __shfl_sync(0xffffffffu, 1u, 0);
}

static void case_divergent_collective()
{
    unsigned *out = device_alloc<unsigned>(32);
    MT_LAUNCH(1, 32, 0, nullptr, divergent_collective_kernel)(out);
}

// ---------------------------------------------------------------- tensor-core collectives

__global__ static void ldmatrix_misaligned_kernel(uint32_t *out)
{
    MT_SHARED(uint16_t, tile, [32 * 8 + 8]);
    for (unsigned i = threadIdx.x; i < 32 * 8 + 8; i += 32) tile[i] = (uint16_t)i;
    __syncthreads();
    uint32_t r[4];
    const uint32_t addr = __cvta_generic_to_shared(tile) + 16 * threadIdx.x + (threadIdx.x == 9 ? 8 : 0);
    ::mt_emu::ldmatrix_x4(r, addr, false, __FILE__, __LINE__); // CHECK: ldmatrix_misaligned
    out[threadIdx.x] = r[0];
}

static void case_ldmatrix_misaligned()
{
    uint32_t *out = device_alloc<uint32_t>(32);
    MT_LAUNCH(1, 32, 0, nullptr, ldmatrix_misaligned_kernel)(out);
}

__global__ static void mma_partial_warp_kernel(float *out)
{
    float c[4] = {0, 0, 0, 0};
    const uint32_t a[4] = {0, 0, 0, 0};
    ::mt_emu::mma_m16n8k16_bf16(c, a, 0, 0, __FILE__, __LINE__); // CHECK: mma_partial_warp
    out[threadIdx.x] = c[0];
}

static void case_mma_partial_warp()
{
    float *out = device_alloc<float>(48);
    MT_LAUNCH(1, 48, 0, nullptr, mma_partial_warp_kernel)(out);
}

// ---------------------------------------------------------------- shared-memory limits

__global__ static void static_smem_over_kernel(float *out)
{
    MT_SHARED(float, small, [1024]);
    MT_SHARED(float, big, [11 * 1024 + 1]); // CHECK: static_smem_over
    small[threadIdx.x] = 1.0f;
    big[threadIdx.x] = 2.0f;
    __syncthreads();
    out[threadIdx.x] = small[threadIdx.x] + big[threadIdx.x];
}

static void case_static_smem_over()
{
    float *out = device_alloc<float>(32);
    MT_LAUNCH(1, 32, 0, nullptr, static_smem_over_kernel)(out);
}

__global__ static void dynamic_smem_kernel(int *ran, size_t bytes)
{
    MT_DYNAMIC_SHARED(unsigned char, smem);
    smem[bytes - 1 - threadIdx.x] = 1; // the last bytes of what the launch asked for
    __syncthreads();
    if (threadIdx.x == 0) *ran = smem[bytes - 1];
}

// Over 48 KB without cudaFuncSetAttribute: the launch fails (cudaErrorInvalidValue)
// and the kernel does not run; with the attribute it runs, up to the device's opt-in.
static void case_dynamic_smem_limits()
{
    int *ran = device_alloc<int>(1), h = 0;
    const size_t over = (48 << 10) + 16, optin = 232448;
    CHECK_CUDA(cudaMemset(ran, 0, sizeof(int)));
    MT_LAUNCH(1, 32, over, nullptr, dynamic_smem_kernel)(ran, over);
    expect(cudaGetLastError() == cudaErrorInvalidValue, "a launch over 48 KB of dynamic shared memory without "
                                                        "cudaFuncSetAttribute returns cudaErrorInvalidValue");
    CHECK_CUDA(cudaMemcpy(&h, ran, sizeof h, cudaMemcpyDeviceToHost));
    expect(h == 0, "the kernel of a failed launch did not run");

    expect(cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)optin + 1) ==
               cudaErrorInvalidValue,
           "cudaFuncSetAttribute beyond the device's opt-in limit (232448 on an H100) fails");
    (void)cudaGetLastError();
    CHECK_CUDA(cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
    MT_LAUNCH(1, 32, (64 << 10) + 16, nullptr, dynamic_smem_kernel)(ran, (64 << 10) + 16);
    expect(cudaGetLastError() == cudaErrorInvalidValue, "a launch over the granted 64 KB fails");
    CHECK_CUDA(cudaMemcpy(&h, ran, sizeof h, cudaMemcpyDeviceToHost));
    expect(h == 0, "the kernel of the launch over the granted size did not run");

    CHECK_CUDA(cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)optin));
    MT_LAUNCH(1, 32, optin, nullptr, dynamic_smem_kernel)(ran, optin);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemcpy(&h, ran, sizeof h, cudaMemcpyDeviceToHost));
    expect(h == 1, "a launch with the whole opt-in (232448 bytes) granted runs");
}

// Static and dynamic shared memory together beyond the device's limit.
__global__ static void smem_total_over_kernel(float *out, size_t bytes)
{
    MT_DYNAMIC_SHARED(float, dyn);
    MT_SHARED(float, extra, [256]); // CHECK: smem_total_over
    extra[threadIdx.x] = 1.0f;
    dyn[bytes / sizeof(float) - 1] = 1.0f;
    out[threadIdx.x] = extra[threadIdx.x];
}

static void case_smem_total_over()
{
    float *out = device_alloc<float>(32);
    const size_t optin = 232448;
    CHECK_CUDA(cudaFuncSetAttribute(smem_total_over_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)optin));
    MT_LAUNCH(1, 32, optin, nullptr, smem_total_over_kernel)(out, optin);
}

__global__ static void empty_kernel(int *out) { out[threadIdx.x] = 1; }

static void case_bad_launch()
{
    int *out = device_alloc<int>(2048), h = 0;
    CHECK_CUDA(cudaMemset(out, 0, sizeof(int)));
    MT_LAUNCH(1, 1025, 0, nullptr, empty_kernel)(out);
    expect(cudaGetLastError() == cudaErrorInvalidConfiguration, "a block of 1025 threads: cudaErrorInvalidConfiguration");
    CHECK_CUDA(cudaMemcpy(&h, out, sizeof h, cudaMemcpyDeviceToHost));
    expect(h == 0, "the kernel of an invalid launch did not run");
    expect(cudaGetLastError() == cudaSuccess, "cudaGetLastError clears the error");
}

// ---------------------------------------------------------------- correct code runs

__global__ static void collectives_kernel(float *out, unsigned *bits, const float *fresh)
{
    MT_SHARED(float, s, [64]);
    MT_DYNAMIC_SHARED(float, d);
    const unsigned t = threadIdx.x, lane = t % 32;
    float v = (float)t;
    // a butterfly sum over the warp: every lane ends with the warp's sum
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    const float up = __shfl_up_sync(0xffffffffu, (float)lane, 3);     // lanes 0..2 keep their own
    const float down = __shfl_down_sync(0xffffffffu, (float)lane, 3); // lanes 29..31 keep their own
    const float seg = __shfl_sync(0xffffffffu, (float)lane, 1, 8);    // lane 1 of each group of 8
    const unsigned b = __ballot_sync(0xffffffffu, lane % 3 == 0);
    if (lane < 16) __syncwarp(0x0000ffffu); // a partial warp may meet at __syncwarp
    s[t] = v;
    __syncthreads();
    d[t] = s[63 - t] + d[t]; // dynamic shared memory is NaN before its first write
    __syncthreads();
    out[5 * t + 0] = s[t];
    out[5 * t + 1] = up;
    out[5 * t + 2] = down;
    out[5 * t + 3] = seg;
    out[5 * t + 4] = d[t] + fresh[t]; // fresh device memory is NaN too
    bits[t] = b;
}

static void case_ok()
{
    float *out = device_alloc<float>(5 * 64), *fresh = device_alloc<float>(64);
    unsigned *bits = device_alloc<unsigned>(64);
    MT_LAUNCH(1, 64, 64 * sizeof(float), nullptr, collectives_kernel)(out, bits, fresh);
    CHECK_CUDA(cudaGetLastError());
    float h[5 * 64];
    unsigned hb[64];
    CHECK_CUDA(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hb, bits, sizeof hb, cudaMemcpyDeviceToHost));
    unsigned want_bits = 0;
    for (unsigned l = 0; l < 32; l += 3) want_bits |= 1u << l;
    for (unsigned t = 0; t < 64; t++) {
        const unsigned lane = t % 32, w = t / 32;
        const float sum = (float)(32 * 32 * w + 31 * 32 / 2);
        char what[128];
        snprintf(what, sizeof what, "thread %u: __shfl_xor_sync butterfly sum %g, want %g", t, h[5 * t], sum);
        expect(h[5 * t] == sum, what);
        snprintf(what, sizeof what, "thread %u: __shfl_up_sync by 3 gives %g", t, h[5 * t + 1]);
        expect(h[5 * t + 1] == (float)(lane < 3 ? lane : lane - 3), what);
        snprintf(what, sizeof what, "thread %u: __shfl_down_sync by 3 gives %g", t, h[5 * t + 2]);
        expect(h[5 * t + 2] == (float)(lane > 28 ? lane : lane + 3), what);
        snprintf(what, sizeof what, "thread %u: __shfl_sync(lane 1, width 8) gives %g", t, h[5 * t + 3]);
        expect(h[5 * t + 3] == (float)(lane / 8 * 8 + 1), what);
        snprintf(what, sizeof what, "thread %u: fresh shared and device memory read as %g, want NaN", t, h[5 * t + 4]);
        expect(h[5 * t + 4] != h[5 * t + 4], what);
        snprintf(what, sizeof what, "thread %u: __ballot_sync gives 0x%08x, want 0x%08x", t, hb[t], want_bits);
        expect(hb[t] == want_bits, what);
    }
    if (!failures) printf("ok: shuffles, ballot, barriers, partial __syncwarp, NaN-poisoned fresh memory\n");
}

// ---------------------------------------------------------------- driver

struct test_case {
    const char *name;
    void (*run)();
    bool reports; // the emulator must end the run with an error
};
static const test_case cases[] = {
    {"ok", case_ok, false},
    {"oob_read", case_oob_read, true},
    {"use_after_free", case_use_after_free, true},
    {"memcpy_past_end", case_memcpy_past_end, true},
    {"ldg_misaligned", case_ldg_misaligned, true},
    {"barrier_after_return", case_barrier_after_return, true},
    {"barrier_after_early_return", case_barrier_after_early_return, true},
    {"divergent_barrier", case_divergent_barrier, true},
    {"deadlock", case_deadlock, true},
    {"shfl_mask_mismatch", case_shfl_mask_mismatch, true},
    {"shfl_returned_lane", case_shfl_returned_lane, true},
    {"shfl_lane_returns", case_shfl_lane_returns, true},
    {"shfl_not_caller", case_shfl_not_caller, true},
    {"shfl_outside_mask", case_shfl_outside_mask, true},
    {"divergent_collective", case_divergent_collective, true},
    {"ldmatrix_misaligned", case_ldmatrix_misaligned, true},
    {"mma_partial_warp", case_mma_partial_warp, true},
    {"static_smem_over", case_static_smem_over, true},
    {"dynamic_smem_limits", case_dynamic_smem_limits, false},
    {"smem_total_over", case_smem_total_over, true},
    {"bad_launch", case_bad_launch, false},
};

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--list")) {
        for (const test_case &c : cases) printf("%s %s\n", c.name, c.reports ? "reports" : "runs");
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: emu_checks CASE | --list\n");
        return 2;
    }
    for (const test_case &c : cases) {
        if (strcmp(c.name, argv[1])) continue;
        c.run();
        CHECK_CUDA(cudaDeviceSynchronize());
        if (c.reports) {
            fprintf(stderr, "emu_checks: %s: the emulator reported nothing\n", c.name);
            return 1;
        }
        return failures ? 1 : 0;
    }
    fprintf(stderr, "emu_checks: no case '%s' (--list names them)\n", argv[1]);
    return 2;
}

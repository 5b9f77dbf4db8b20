// kernels/quant.h against NVIDIA's own conversions, bit for bit: cuda_fp8.h and cuda_fp4.h
// (host-callable), and cuRAND's Philox-4x32-10 for the random bits. Built with the host
// C++ compiler against the CUDA headers only (no nvcc, no GPU); tests/kernels/local.mk.
//
// Inputs, for every encoder (E4M3 and E5M2 saturating and not, E2M1 nearest, UE8M0
// toward zero and toward +infinity, saturating and not):
//   - every bf16 bit pattern as a float (65536: zeros, subnormals, normals, inf, NaN);
//   - every float within 2 ulp of each rounding boundary of the format: the midpoints
//     between neighbouring values (ties), the values themselves, the overflow threshold
//     (UE8M0: every power of two), both signs;
//   - random floats: uniform bit patterns and log-uniform magnitudes around the range.
// Decoders: all 256 FP8 codes of each kind, all 16 E2M1 codes, all 256 UE8M0 codes.
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <curand_philox4x32_x.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/quant.h"

namespace {

long g_fail = 0;

struct Enc {
    const char *name;
    uint8_t (*ours)(float);
    uint8_t (*nv)(float);
    long count = 0;
};

uint8_t ours_e4m3_sat(float x) { return mt_e4m3_from_float(x, 1, MT_Q_RN, 0); }
uint8_t ours_e4m3_nosat(float x) { return mt_e4m3_from_float(x, 0, MT_Q_RN, 0); }
uint8_t ours_e5m2_sat(float x) { return mt_e5m2_from_float(x, 1, MT_Q_RN, 0); }
uint8_t ours_e5m2_nosat(float x) { return mt_e5m2_from_float(x, 0, MT_Q_RN, 0); }
uint8_t ours_e2m1(float x) { return mt_e2m1_from_float(x, MT_Q_RN, 0); }
uint8_t ours_e8m0_rz_sat(float x) { return mt_e8m0_from_float(x, 1, 0); }
uint8_t ours_e8m0_ru_sat(float x) { return mt_e8m0_from_float(x, 1, 1); }
uint8_t ours_e8m0_rz_nosat(float x) { return mt_e8m0_from_float(x, 0, 0); }
uint8_t ours_e8m0_ru_nosat(float x) { return mt_e8m0_from_float(x, 0, 1); }

uint8_t nv_e4m3_sat(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
uint8_t nv_e4m3_nosat(float x) { return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3); }
uint8_t nv_e5m2_sat(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2); }
uint8_t nv_e5m2_nosat(float x) { return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2); }
uint8_t nv_e2m1(float x) { return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest); }
uint8_t nv_e8m0_rz_sat(float x) { return __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundZero); }
uint8_t nv_e8m0_ru_sat(float x) { return __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf); }
uint8_t nv_e8m0_rz_nosat(float x) { return __nv_cvt_float_to_e8m0(x, __NV_NOSAT, cudaRoundZero); }
uint8_t nv_e8m0_ru_nosat(float x) { return __nv_cvt_float_to_e8m0(x, __NV_NOSAT, cudaRoundPosInf); }

Enc g_enc[] = {
    {"E4M3 satfinite", ours_e4m3_sat, nv_e4m3_sat},
    {"E4M3 nosat", ours_e4m3_nosat, nv_e4m3_nosat},
    {"E5M2 satfinite", ours_e5m2_sat, nv_e5m2_sat},
    {"E5M2 nosat", ours_e5m2_nosat, nv_e5m2_nosat},
    {"E2M1 nearest", ours_e2m1, nv_e2m1},
    {"UE8M0 toward zero, satfinite", ours_e8m0_rz_sat, nv_e8m0_rz_sat},
    {"UE8M0 toward +inf, satfinite", ours_e8m0_ru_sat, nv_e8m0_ru_sat},
    {"UE8M0 toward zero, nosat", ours_e8m0_rz_nosat, nv_e8m0_rz_nosat},
    {"UE8M0 toward +inf, nosat", ours_e8m0_ru_nosat, nv_e8m0_ru_nosat},
};
const int n_enc = sizeof g_enc / sizeof g_enc[0];

void check(Enc &e, float x)
{
    uint8_t a = e.ours(x), b = e.nv(x);
    e.count++;
    if (a != b && g_fail++ < 20)
        std::printf("FAIL: %s of %a (0x%08x): ours 0x%02x, NVIDIA 0x%02x\n", e.name, (double)x,
                    mt_q_bits(x), a, b);
}

void check_all(float x)
{
    for (int i = 0; i < n_enc; i++) check(g_enc[i], x);
}

// Every float within 2 ulp of v and of -v.
void around(Enc &e, float v)
{
    uint32_t u = mt_q_bits(v) & 0x7fffffffu;
    for (int d = -2; d <= 2; d++) {
        int64_t w = (int64_t)u + d;
        if (w < 0 || w > 0x7fffffff) continue;
        check(e, mt_q_float((uint32_t)w));
        check(e, mt_q_float((uint32_t)w | 0x80000000u));
    }
}

// Boundaries of a format whose magnitude codes 0..maxcode decode through dec: each
// value, each midpoint between neighbours, and the midpoint above the largest value.
void boundaries(Enc &e, float (*dec)(uint8_t), int maxcode, float above_max)
{
    for (int c = 0; c <= maxcode; c++) {
        float v = dec((uint8_t)c);
        around(e, v);
        float next = c < maxcode ? dec((uint8_t)(c + 1)) : above_max;
        around(e, (float)(((double)v + (double)next) / 2)); // exact: a few more bits
    }
}

uint64_t g_rng = 0x9e3779b97f4a7c15ull;
uint32_t rnd32()
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

float half_to_float(__half_raw h)
{
    __half v(h);
    return __half2float(v);
}

float bf16_to_float(__nv_bfloat16_raw b)
{
    return mt_q_float((uint32_t)b.x << 16);
}

long g_dec = 0;
void check_decode(const char *name, int code, float ours, float nv)
{
    g_dec++;
    bool same = (std::isnan(ours) && std::isnan(nv)) || mt_q_bits(ours) == mt_q_bits(nv);
    if (!same && g_fail++ < 20)
        std::printf("FAIL: %s decode of 0x%02x: ours %a, NVIDIA %a\n", name, code, (double)ours,
                    (double)nv);
}

} // namespace

int main()
{
    // every bf16 bit pattern
    for (uint32_t b = 0; b < 65536; b++) check_all(mt_q_float(b << 16));
    long per_enc_bf16 = g_enc[0].count;

    // rounding boundaries, +-2 ulp, both signs
    boundaries(g_enc[0], mt_e4m3_to_float, 0x7e, 480.0f);
    boundaries(g_enc[1], mt_e4m3_to_float, 0x7e, 480.0f);
    boundaries(g_enc[2], mt_e5m2_to_float, 0x7b, 65536.0f);
    boundaries(g_enc[3], mt_e5m2_to_float, 0x7b, 65536.0f);
    boundaries(g_enc[4], mt_e2m1_to_float, 0x7, 8.0f);
    for (int i = 5; i < 9; i++) {
        for (int k = -149; k <= 127; k++) around(g_enc[i], std::ldexp(1.0f, k));
        around(g_enc[i], mt_q_float(0x7f7fffffu));
        around(g_enc[i], mt_q_float(0x7f800000u));
    }

    // random floats: uniform bit patterns, and log-uniform magnitudes from 2^-24 to 2^24
    const int n_random = 1 << 20;
    for (int i = 0; i < n_random; i++) check_all(mt_q_float(rnd32()));
    for (int i = 0; i < n_random; i++) {
        float m = std::ldexp(1.0f + (float)(rnd32() >> 9) * 0x1p-23f, (int)(rnd32() % 49) - 24);
        check_all(rnd32() & 1 ? -m : m);
    }

    for (int i = 0; i < n_enc; i++)
        std::printf("%-30s %9ld inputs (%ld bf16 patterns, %ld near boundaries, %d random)\n",
                    g_enc[i].name, g_enc[i].count, per_enc_bf16,
                    g_enc[i].count - per_enc_bf16 - 2L * n_random, 2 * n_random);

    // decoders
    for (int c = 0; c < 256; c++) {
        check_decode("E4M3", c, mt_e4m3_to_float((uint8_t)c),
                     half_to_float(__nv_cvt_fp8_to_halfraw((uint8_t)c, __NV_E4M3)));
        check_decode("E5M2", c, mt_e5m2_to_float((uint8_t)c),
                     half_to_float(__nv_cvt_fp8_to_halfraw((uint8_t)c, __NV_E5M2)));
        check_decode("UE8M0", c, mt_e8m0_to_float((uint8_t)c),
                     bf16_to_float(__nv_cvt_e8m0_to_bf16raw((uint8_t)c)));
    }
    for (int c = 0; c < 16; c++)
        check_decode("E2M1", c, mt_e2m1_to_float((uint8_t)c),
                     half_to_float(__nv_cvt_fp4_to_halfraw((uint8_t)c, __NV_E2M1)));
    std::printf("decoders: %ld codes (256 E4M3, 256 E5M2, 256 UE8M0, 16 E2M1)\n", g_dec);

    // Philox-4x32-10 against cuRAND's
    long n_philox = 0;
    for (int i = 0; i < 100000; i++) {
        uint32_t ctr[4] = {rnd32(), rnd32(), rnd32(), rnd32()}, key[2] = {rnd32(), rnd32()};
        if (i == 0) ctr[0] = ctr[1] = ctr[2] = ctr[3] = key[0] = key[1] = 0;
        uint32_t ours[4];
        mt_philox4x32_10(ctr, key, ours);
        uint4 c = make_uint4(ctr[0], ctr[1], ctr[2], ctr[3]);
        uint2 k = make_uint2(key[0], key[1]);
        uint4 nv = curand_Philox4x32_10(c, k);
        n_philox++;
        if ((ours[0] != nv.x || ours[1] != nv.y || ours[2] != nv.z || ours[3] != nv.w) &&
            g_fail++ < 20)
            std::printf("FAIL: Philox of ctr %08x %08x %08x %08x key %08x %08x differs from "
                        "cuRAND's\n", ctr[0], ctr[1], ctr[2], ctr[3], key[0], key[1]);
    }
    std::printf("Philox-4x32-10: %ld counters and keys equal cuRAND's\n", n_philox);

    if (g_fail) {
        std::printf("FAIL: %ld mismatches\n", g_fail);
        return 1;
    }
    std::printf("ok: every conversion equals NVIDIA's\n");
    return 0;
}

// The CUDA emulator's tensor-core instructions (mma.sync.m16n8k16 bf16, ldmatrix.x4 and
// .x4.trans, through kernels/cuda's wrappers mt_mma_bf16 / mt_ldsm_x4 / mt_ldsm_x4_t)
// on hand-computed cases, and the fragment tables it implements, as data:
//
//   emu_tensor_core          the hand-computed cases (TAP-like lines, exit 1 on a failure)
//   emu_tensor_core --dump   the tables, found by probing the emulator with one-hot
//                            operands, in the format of emu_cute_check.sh's oracle:
//     mma A LANE V M K   (V = 2 * register + half) element (M, K) of the 16x16 A
//     mma B LANE V K N   element (K, N) of the 16x8 B
//     mma C LANE V M N   element (M, N) of the 16x8 C and D (V = c index)
//     ldsm N|T LANE R H SRC E   half H of register R holds element E (0..7) of the
//                               16-byte row whose address lane SRC gave
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"
#include "tests/gpu/emu_test.h"


// ---------------------------------------------------------------- kernels

// Each lane passes its fragments: a[4 lane + r], b[2 lane + r], c[4 lane + e]; d likewise.
__global__ static void mma_kernel(float *d, const uint32_t *a, const uint32_t *b, const float *c)
{
    const unsigned l = threadIdx.x;
    const uint32_t fa[4] = {a[4 * l], a[4 * l + 1], a[4 * l + 2], a[4 * l + 3]};
    float acc[4] = {c[4 * l], c[4 * l + 1], c[4 * l + 2], c[4 * l + 3]};
    mt_mma_bf16(acc, fa, b[2 * l], b[2 * l + 1]);
    for (int e = 0; e < 4; e++) d[4 * l + e] = acc[e];
}

// Shared memory: 32 rows of 8 b16 elements (row i = 16 bytes), filled from `in`; lane l
// gives the address of row rows[l]. r[4 l + i] receives register i.
__global__ static void ldsm_kernel(uint32_t *r, const uint16_t *in, const int *rows, int trans)
{
    MT_SHARED(uint16_t, tile, [32 * 8]);
    const unsigned l = threadIdx.x;
    for (int i = 0; i < 8; i++) tile[8 * l + i] = in[8 * l + i];
    __syncthreads();
    uint32_t out[4];
    const uint32_t addr = mt_smem_addr(tile + 8 * rows[l]);
    if (trans) mt_ldsm_x4_t(out, addr);
    else mt_ldsm_x4(out, addr);
    for (int i = 0; i < 4; i++) r[4 * l + i] = out[i];
}

// ---------------------------------------------------------------- host side

static uint16_t bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if (u & 0xffffu) {
        fprintf(stderr, "emu_tensor_core: %g is not a bf16 value\n", x);
        exit(1);
    }
    return (uint16_t)(u >> 16);
}
static uint32_t pack(float lo, float hi) { return bf16_bits(lo) | (uint32_t)bf16_bits(hi) << 16; }

template <typename T>
static T *dev_copy(const T *h, size_t n)
{
    void *p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
    CHECK_CUDA(cudaMemcpy(p, h, n * sizeof(T), cudaMemcpyHostToDevice));
    return static_cast<T *>(p);
}

// Runs one mma.sync on fragments a[128], b[64], c[128] (per lane), returns d[128].
static void run_mma(float d[128], const uint32_t a[128], const uint32_t b[64], const float c[128])
{
    uint32_t *da = dev_copy(a, 128), *db = dev_copy(b, 64);
    float *dc = dev_copy(c, 128), *dd = nullptr;
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void **>(&dd), 128 * sizeof(float)));
    MT_LAUNCH(1, 32, 0, nullptr, mma_kernel)(dd, da, db, dc);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemcpy(d, dd, 128 * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaFree(da));
    CHECK_CUDA(cudaFree(db));
    CHECK_CUDA(cudaFree(dc));
    CHECK_CUDA(cudaFree(dd));
}

static void run_ldsm(uint32_t r[128], const uint16_t in[256], const int rows[32], bool trans)
{
    uint16_t *din = dev_copy(in, 256);
    int *drows = dev_copy(rows, 32);
    uint32_t *dr = nullptr;
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void **>(&dr), 128 * sizeof(uint32_t)));
    MT_LAUNCH(1, 32, 0, nullptr, ldsm_kernel)(dr, din, drows, trans ? 1 : 0);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemcpy(r, dr, 128 * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaFree(din));
    CHECK_CUDA(cudaFree(drows));
    CHECK_CUDA(cudaFree(dr));
}

// The PTX ISA's fragment layout for m16n8k16 with 16-bit A/B (g = lane / 4, t = lane % 4):
// the matrices as fragments, written out again here from the ISA's figures.
static void frag_a(uint32_t a[128], float (*A)[16])
{
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        for (int r = 0; r < 4; r++) {
            const int m = g + 8 * (r & 1), k = 2 * t + 8 * (r >> 1);
            a[4 * l + r] = pack(A[m][k], A[m][k + 1]);
        }
    }
}
static void frag_b(uint32_t b[64], float (*B)[8])
{
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        for (int r = 0; r < 2; r++) b[2 * l + r] = pack(B[2 * t + 8 * r][g], B[2 * t + 8 * r + 1][g]);
    }
}
static void frag_c(float c[128], float (*C)[8])
{
    for (int l = 0; l < 32; l++)
        for (int e = 0; e < 4; e++) c[4 * l + e] = C[l / 4 + 8 * (e >> 1)][2 * (l % 4) + (e & 1)];
}
static float d_at(const float d[128], int m, int n) { return d[4 * ((m % 8) * 4 + n / 2) + 2 * (m / 8) + n % 2]; }

static int checks, failures;
static void check(bool ok, const char *what)
{
    checks++;
    if (!ok) failures++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

// D = I B + 1/2 with B(k, n) = 8 k + n: D(m, n) = 8 m + n + 1/2.
static void mma_identity(void)
{
    static float A[16][16], B[16][8], C[16][8];
    for (int m = 0; m < 16; m++)
        for (int k = 0; k < 16; k++) A[m][k] = m == k ? 1.0f : 0.0f;
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 8; n++) B[k][n] = (float)(8 * k + n), C[k][n] = 0.5f;
    uint32_t a[128], b[64];
    float c[128], d[128];
    frag_a(a, A);
    frag_b(b, B);
    frag_c(c, C);
    run_mma(d, a, b, c);
    int bad = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) bad += d_at(d, m, n) != 8 * m + n + 0.5f;
    char what[128];
    snprintf(what, sizeof what, "mma.sync: I (16x16) x B(k,n) = 8k+n, + 1/2: D(m,n) = 8m+n+1/2 (%d of 128 wrong)", bad);
    check(!bad, what);
}

// A(m, k) = m + 1 on k = m / 2 + 4, -1 on k = 15 - m; B(k, n) = (k + 1) (n + 1) / 4
// (all exact in bf16): D(m, n) = C + (m+1) (m/2+5) (n+1) / 4 - (16-m) (n+1) / 4.
static void mma_sums(void)
{
    static float A[16][16], B[16][8], C[16][8];
    memset(A, 0, sizeof A);
    for (int m = 0; m < 16; m++) {
        A[m][m / 2 + 4] += (float)(m + 1);
        A[m][15 - m] += -1.0f;
    }
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 8; n++) B[k][n] = (float)((k + 1) * (n + 1)) / 4.0f, C[k][n] = (float)(k - n);
    uint32_t a[128], b[64];
    float c[128], d[128];
    frag_a(a, A);
    frag_b(b, B);
    frag_c(c, C);
    run_mma(d, a, b, c);
    int bad = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            const int k1 = m / 2 + 4, k2 = 15 - m;
            // k1 == k2 (m = 7): the two terms of A add in one element
            const float want = (float)(m - n) + (float)((m + 1) * (k1 + 1) * (n + 1)) / 4.0f -
                               (float)((k2 + 1) * (n + 1)) / 4.0f;
            bad += d_at(d, m, n) != want;
        }
    char what[160];
    snprintf(what, sizeof what, "mma.sync: two terms per row at different k, accumulator C(m,n) = m-n (%d of 128 wrong)",
             bad);
    check(!bad, what);
}

// Sixteen products of 2^-24 added to c = 1: summed first, then rounded once, 1 + 2^-20
// (fp32 additions one at a time would leave 1: each 2^-24 is half an ulp of 1, a tie
// to even). The emulator's documented claim; a GPU's order may differ.
static void mma_one_rounding(void)
{
    static float A[16][16], B[16][8], C[16][8];
    for (int m = 0; m < 16; m++)
        for (int k = 0; k < 16; k++) A[m][k] = 1.0f / 4096.0f;
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 8; n++) B[k][n] = 1.0f / 4096.0f, C[k][n] = 1.0f;
    uint32_t a[128], b[64];
    float c[128], d[128];
    frag_a(a, A);
    frag_b(b, B);
    frag_c(c, C);
    run_mma(d, a, b, c);
    int bad = 0;
    for (int i = 0; i < 128; i++) bad += d[i] != 1.0f + 1.0f / 1048576.0f;
    char what[128];
    snprintf(what, sizeof what, "mma.sync: 1 + 16 x 2^-24 = 1 + 2^-20 (one rounding; %d of 128 wrong)", bad);
    check(!bad, what);
}

// Element (row i, column j) of the 32 x 8 tile is 8 i + j; lane l gives row rows[l].
static void ldsm_case(bool trans, bool permuted)
{
    uint16_t in[256];
    int rows[32];
    for (int i = 0; i < 256; i++) in[i] = (uint16_t)i;
    for (int l = 0; l < 32; l++) rows[l] = permuted ? (l * 7 + 3) % 32 : l;
    uint32_t r[128];
    run_ldsm(r, in, rows, trans);
    int bad = 0;
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++)
            for (int h = 0; h < 2; h++) {
                // matrix i has rows given by lanes 8i..8i+7; lane l holds (row l/4, cols
                // 2(l%4)+h), or with .trans (row 2(l%4)+h, col l/4) of that matrix
                const int src = trans ? 8 * i + 2 * (l % 4) + h : 8 * i + l / 4;
                const int col = trans ? l / 4 : 2 * (l % 4) + h;
                const unsigned want = (unsigned)(8 * rows[src] + col);
                bad += ((r[4 * l + i] >> (16 * h)) & 0xffffu) != want;
            }
    char what[128];
    snprintf(what, sizeof what, "ldmatrix.x4%s, lanes giving %s rows (%d of 256 halves wrong)", trans ? ".trans" : "",
             permuted ? "permuted" : "consecutive", bad);
    check(!bad, what);
}

// ---------------------------------------------------------------- the tables, probed

static void dump(void)
{
    uint32_t a[128], b[64];
    float c[128], d[128];
    // A: one fragment half = 1; B(k, n) = k + 1 for every n: D is k + 1 on row m only
    for (int l = 0; l < 32; l++)
        for (int v = 0; v < 8; v++) {
            memset(a, 0, sizeof a);
            memset(c, 0, sizeof c);
            a[4 * l + v / 2] = (uint32_t)bf16_bits(1.0f) << (16 * (v % 2));
            static float B[16][8];
            for (int k = 0; k < 16; k++)
                for (int n = 0; n < 8; n++) B[k][n] = (float)(k + 1);
            frag_b(b, B);
            run_mma(d, a, b, c);
            int m = -1, k = -1;
            for (int mm = 0; mm < 16; mm++)
                if (d_at(d, mm, 0) != 0.0f) m = mm, k = (int)d_at(d, mm, 0) - 1;
            printf("mma A %d %d %d %d\n", l, v, m, k);
        }
    // B: one fragment half = 1; A(m, k) = k + 1 for every m: D is k + 1 in column n only
    for (int l = 0; l < 32; l++)
        for (int v = 0; v < 4; v++) {
            memset(b, 0, sizeof b);
            memset(c, 0, sizeof c);
            b[2 * l + v / 2] = (uint32_t)bf16_bits(1.0f) << (16 * (v % 2));
            static float A[16][16];
            for (int m = 0; m < 16; m++)
                for (int k = 0; k < 16; k++) A[m][k] = (float)(k + 1);
            frag_a(a, A);
            run_mma(d, a, b, c);
            int n = -1, k = -1;
            for (int nn = 0; nn < 8; nn++)
                if (d_at(d, 0, nn) != 0.0f) n = nn, k = (int)d_at(d, 0, nn) - 1;
            printf("mma B %d %d %d %d\n", l, v, k, n);
        }
    // C: the accumulator passes through (A = B = 0): C(m, n) = 16 m + n + 1 read back
    // through the lanes' c
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    for (int l = 0; l < 32; l++)
        for (int e = 0; e < 4; e++) c[4 * l + e] = (float)(1000 + 4 * l + e);
    run_mma(d, a, b, c);
    for (int l = 0; l < 32; l++)
        for (int e = 0; e < 4; e++) {
            // where did lane l's c[e] go? d is returned per lane too: this shows that D
            // has C's layout; the coordinates are those of frag_c's table
            const int m = l / 4 + 8 * (e >> 1), n = 2 * (l % 4) + (e & 1);
            printf("mma C %d %d %d %d\n", l, e, d[4 * l + e] == c[4 * l + e] ? m : -1, n);
        }
    for (int t = 0; t < 2; t++) {
        uint16_t in[256];
        int rows[32];
        for (int i = 0; i < 256; i++) in[i] = (uint16_t)i;
        for (int l = 0; l < 32; l++) rows[l] = l;
        uint32_t r[128];
        run_ldsm(r, in, rows, t == 1);
        for (int l = 0; l < 32; l++)
            for (int i = 0; i < 4; i++)
                for (int h = 0; h < 2; h++) {
                    const unsigned x = (r[4 * l + i] >> (16 * h)) & 0xffffu;
                    printf("ldsm %c %d %d %d %u %u\n", t ? 'T' : 'N', l, i, h, x / 8, x % 8);
                }
    }
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--dump")) {
        dump();
        return 0;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: emu_tensor_core [--dump]\n");
        return 2;
    }
    mma_identity();
    mma_sums();
    mma_one_rounding();
    ldsm_case(false, false);
    ldsm_case(false, true);
    ldsm_case(true, false);
    ldsm_case(true, true);
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}

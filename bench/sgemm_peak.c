/* Measures the machine's achieved single-precision GEMM rate through the same
 * CBLAS the CPU backend uses: the best of several runs of square sgemm at a few
 * sizes. Prints "sgemm_peak_gflops <value>" and the per-size figures. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void)
{
    const int sizes[] = { 256, 512, 1024, 2048 };
    double best = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int n = sizes[s];
        float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n),
              *c = malloc(sizeof(float) * n * n);
        if (!a || !b || !c) return 1;
        for (long i = 0; i < (long)n * n; i++) {
            a[i] = (float)(i % 7) * 0.1f;
            b[i] = (float)(i % 5) * 0.2f;
            c[i] = 0;
        }
        double flops = 2.0 * n * n * n, rate = 0;
        int reps = n <= 512 ? 50 : (n <= 1024 ? 8 : 2);
        for (int trial = 0; trial < 3; trial++) {
            double t0 = now_s();
            for (int r = 0; r < reps; r++)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n,
                            0.0f, c, n);
            double dt = now_s() - t0;
            double g = flops * reps / dt / 1e9;
            if (g > rate) rate = g;
        }
        printf("sgemm %5d x %5d x %5d: %8.1f GFLOP/s\n", n, n, n, rate);
        if (rate > best) best = rate;
        free(a);
        free(b);
        free(c);
    }
    printf("sgemm_peak_gflops %.1f\n", best);
    return 0;
}

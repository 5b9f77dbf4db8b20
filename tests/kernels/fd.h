/* Finite-difference gradient checking shared by the kernel and model tests.
 *
 * A test defines a scalar loss L(inputs) computed by the code under test (fp32) and
 * summed in double, the analytic gradient dL/dinput from the hand-written backward,
 * and asks fd_rel_error() for the norm-based relative error
 *     ||g_fd - g||_2 / max(||g_fd||_2, ||g||_2)
 * over a sample of elements, where g_fd is the central difference
 *     (L(x + h) - L(x - h)) / 2h.
 * Elements whose perturbation changes a discrete choice (top-k selection, capacity
 * drops) are skipped: the loss function sets fd_unstable, and fd_rel_error leaves the
 * element out. A test can fail: the bounds are checked with assert_true. */
#ifndef MT_TESTS_FD_H
#define MT_TESTS_FD_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util/rng.h"

typedef double (*fd_loss_fn)(void *state);

static int fd_unstable; /* set by a loss function when a discrete choice moved */

/* x (n) = scale * N(0,1) from a counter RNG keyed by stream (reproducible). */
static inline void fd_randn(float *x, size_t n, float scale, uint64_t stream)
{
    for (size_t i = 0; i < n; i++) x[i] = scale * mt_rng_normal(0x5eedULL, stream, i);
}

/* sum_i w[i] * y[i] in double: the loss that turns an op output into a scalar; with
 * random w, its gradient with respect to y is w (a dense, non-symmetric dout). */
static inline double fd_dot(const float *w, const float *y, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)w[i] * y[i];
    return s;
}

/* Relative error of grad against central differences of f at the elements idx
 * (nidx) of x. *checked gets the number of elements compared (unstable ones skipped). */
static inline double fd_rel_error_at(fd_loss_fn f, void *state, float *x, const float *grad,
                                     const size_t *idx, size_t nidx, float h, int *checked)
{
    double num = 0.0, nfd = 0.0, ng = 0.0;
    int count = 0;
    for (size_t s = 0; s < nidx; s++) {
        size_t i = idx[s];
        float keep = x[i];
        fd_unstable = 0;
        x[i] = keep + h;
        double lp = f(state);
        x[i] = keep - h;
        double lm = f(state);
        x[i] = keep;
        int skip = fd_unstable;
        fd_unstable = 0;
        f(state); /* restore any state the loss function caches */
        if (skip) continue;
        double gfd = (lp - lm) / (2.0 * (double)h);
        num += (gfd - grad[i]) * (gfd - grad[i]);
        nfd += gfd * gfd;
        ng += (double)grad[i] * grad[i];
        count++;
    }
    if (checked) *checked = count;
    double den = sqrt(nfd > ng ? nfd : ng);
    return den > 0.0 ? sqrt(num) / den : sqrt(num);
}

/* Same over min(n, max_samples) elements: all when n is small, else a fixed
 * pseudo-random sample. */
static inline double fd_rel_error(fd_loss_fn f, void *state, float *x, const float *grad,
                                  size_t n, float h, int max_samples, int *checked)
{
    size_t samples = n < (size_t)max_samples ? n : (size_t)max_samples;
    size_t idx[1024];
    if (samples > 1024) samples = 1024;
    for (size_t s = 0; s < samples; s++)
        idx[s] = samples == n ? s : (size_t)mt_rng_below(0xfdULL, n, s, n);
    return fd_rel_error_at(f, state, x, grad, idx, samples, h, checked);
}

#endif

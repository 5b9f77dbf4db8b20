/* ckpt_diff A B TOL: compares two checkpoints written in any layouts (iter_* directories
 * of the sharded format or with a state.bin, or state.bin files).
 * The tensor tables and the training state must be equal; every parameter tensor, the
 * Adam moments of each tensor and the expert biases must agree within TOL in the
 * norm-based relative error ||a - b|| / ||a|| (0 when both are 0). Prints the worst
 * tensor of each kind; exits 0 when all agree, 1 otherwise (2 on usage or I/O errors). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

static double rel(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)a[i] * a[i];
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: ckpt_diff A B TOL (iter_* directories or state.bin files)\n");
        return 2;
    }
    const double tol = atof(argv[3]);
    struct mt_ckpt_file a, b;
    struct mt_err err;
    if (mt_ckpt_read(argv[1], &a, &err) || mt_ckpt_read(argv[2], &b, &err)) {
        fprintf(stderr, "ckpt_diff: %s\n", err.msg);
        return 2;
    }
    const struct mt_ckpt_view *x = &a.view, *y = &b.view;
    int bad = 0;
    if (memcmp(&a.state, &b.state, sizeof a.state)) {
        printf("training state differs: iteration %lld/%lld, consumed %lld/%lld, adam step "
               "%lld/%lld\n",
               a.state.iteration, b.state.iteration, a.state.consumed_samples,
               b.state.consumed_samples, a.state.adam_step, b.state.adam_step);
        bad = 1;
    }
    if (x->ntensors != y->ntensors || x->nparams != y->nparams || x->nbuffers != y->nbuffers) {
        printf("the tensor tables differ\n");
        return 1;
    }
    const char *kinds[3] = {"parameters", "Adam m", "Adam v"};
    for (int k = 0; k < 3; k++) {
        const float *px = k == 0 ? x->params : k == 1 ? x->adam_m : x->adam_v;
        const float *py = k == 0 ? y->params : k == 1 ? y->adam_m : y->adam_v;
        double worst = 0.0;
        const char *where = "-";
        size_t at = 0;
        for (int i = 0; i < x->ntensors; i++) {
            size_t n = 1;
            for (int d = 0; d < x->ndims[i]; d++) n *= (size_t)x->shapes[i][d];
            if (strcmp(x->names[i], y->names[i])) {
                printf("tensor %d is %s in one and %s in the other\n", i, x->names[i], y->names[i]);
                return 1;
            }
            double r = rel(px + at, py + at, n);
            if (!(r <= worst)) {
                worst = r;
                where = x->names[i];
            }
            at += n;
        }
        printf("%-10s worst relative difference %.3e (%s)\n", kinds[k], worst, where);
        bad |= !(worst <= tol);
    }
    double rb = rel(x->buffers, y->buffers, x->nbuffers);
    printf("%-10s relative difference %.3e\n", "buffers", rb);
    bad |= !(rb <= tol);
    mt_ckpt_file_free(&a);
    mt_ckpt_file_free(&b);
    if (bad) printf("FAIL: differences above %g\n", tol);
    return bad;
}

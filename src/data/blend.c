/* Blending, as Megatron's BlendedDataset (helpers.cpp build_blending_indices):
 * each sample goes to the dataset whose draw count lags its weighted share the
 * most, ties to the lowest index, so every prefix of the blend follows the
 * weights as closely as whole samples allow. */
#include "data/data_internal.h"

void mt_blend_build(const double *weights, int n, uint64_t size, int16_t *dataset_index,
                    int64_t *dataset_sample_index)
{
    int64_t counts[MT_MAX_DATA_PATHS] = {0};
    for (uint64_t i = 0; i < size; i++) {
        double at = i > 1 ? (double)i : 1.0;  /* Megatron: max(i, 1) */
        int best = 0;
        double best_err = weights[0] * at - (double)counts[0];
        for (int d = 1; d < n; d++) {
            double e = weights[d] * at - (double)counts[d];
            if (e > best_err) {
                best_err = e;
                best = d;
            }
        }
        dataset_index[i] = (int16_t)best;
        dataset_sample_index[i] = counts[best]++;
    }
}

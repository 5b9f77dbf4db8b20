/* GPT sampling, as Megatron's GPTDataset (megatron/core/datasets/gpt_dataset.py
 * and helpers.cpp build_sample_idx): the split's sequences are repeated for as
 * many epochs as the requested samples need and shuffled (the last epoch on its
 * own when it is used less than 80%), flattened into one token stream, cut
 * into samples of seq_length+1 tokens that share their last token with the
 * next sample, and the samples shuffled. Shuffles are Fisher-Yates on the
 * Philox stream of training%seed instead of numpy's RandomState. */
#include "data/data_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "util/rng.h"

/* Philox streams, one per shuffle Megatron draws from its RandomState. */
enum { STREAM_DOCS = 1, STREAM_DOCS_FINAL = 2, STREAM_SAMPLES = 3, STREAM_SAMPLES_FINAL = 4 };

#define SEED_SALT 0x4750542d44415441ull  /* "GPT-DATA" */

void mt_data_shuffle(void *a, size_t elem, uint64_t n, uint64_t key, uint64_t stream)
{
    unsigned char *p = a, t[8];
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = mt_rng_below(key, stream, i - 1, i);
        memcpy(t, p + (i - 1) * elem, elem);
        memcpy(p + (i - 1) * elem, p + j * elem, elem);
        memcpy(p + j * elem, t, elem);
    }
}

/* The sizes Megatron derives before drawing anything. */
struct plan {
    uint64_t ndocs;            /* sequences in the split */
    uint64_t tokens_per_epoch;
    uint64_t epochs;
    uint64_t n_samples;        /* samples the token stream holds */
    bool separate_final_epoch;
    uint64_t samples_before_final;  /* shuffled apart from the rest when separate */
};

static int make_plan(const struct mt_indexed *ix, const struct mt_gpt_params *p, struct plan *pl,
                     struct mt_err *err)
{
    memset(pl, 0, sizeof *pl);
    const char *prefix = mt_indexed_prefix(ix);
    if (p->seq_beg >= p->seq_end || p->seq_end > mt_indexed_num_sequences(ix))
        return mt_err_set(err, MT_EINVAL, "%s: empty or invalid sequence range [%" PRIu64
                          ", %" PRIu64 ")", prefix, p->seq_beg, p->seq_end);
    if (p->seq_end > INT32_MAX)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "%s: %" PRIu64 " sequences; sampling supports at most 2^31-1 (as"
                          " Megatron's int32 document index)", prefix, p->seq_end);
    if (p->seq_length < 1)
        return mt_err_set(err, MT_EINVAL, "training%%seq_length must be >= 1 (is %d)",
                          p->seq_length);
    const uint64_t seq = (uint64_t)p->seq_length;
    pl->ndocs = p->seq_end - p->seq_beg;
    for (uint64_t s = p->seq_beg; s < p->seq_end; s++)
        pl->tokens_per_epoch += (uint64_t)mt_indexed_sequence_length(ix, s);
    if (pl->tokens_per_epoch < 2)
        return mt_err_set(err, MT_EINVAL,
                          "%s: sequences [%" PRIu64 ", %" PRIu64 ") hold %" PRIu64
                          " tokens; a sample needs at least 2\nhint: use a larger dataset or"
                          " give this split a larger share in data%%split",
                          prefix, p->seq_beg, p->seq_end, pl->tokens_per_epoch);
    const uint64_t tpe = pl->tokens_per_epoch;
    pl->epochs = 1;
    if (p->num_samples >= 0) {
        if ((uint64_t)p->num_samples > (UINT64_MAX / 2) / seq)
            return mt_err_set(err, MT_EINVAL, "%" PRId64 " samples of %d tokens is too many",
                              p->num_samples, p->seq_length);
        uint64_t needed = (uint64_t)p->num_samples * seq + 1;
        pl->epochs = needed / tpe + (needed % tpe != 0);
    }
    if (pl->epochs > (UINT64_MAX / 2) / tpe || pl->epochs > (UINT64_MAX / 2) / pl->ndocs)
        return mt_err_set(err, MT_EINVAL, "%s: %" PRIu64 " epochs are too many", prefix,
                          pl->epochs);
    pl->n_samples = (pl->epochs * tpe - 1) / seq;
    if (pl->epochs > 1) {
        uint64_t before = ((pl->epochs - 1) * tpe - 1) / seq;
        uint64_t from_final = (uint64_t)p->num_samples - before;
        uint64_t per_epoch = (tpe - 1) / seq;
        /* Megatron: threshold 0.80, int() truncation of the float product. */
        pl->separate_final_epoch = from_final < (uint64_t)(0.80 * (double)per_epoch);
        pl->samples_before_final = before;
    }
    return MT_OK;
}

void mt_gpt_index_free(struct mt_gpt_index *g)
{
    free(g->doc_idx);
    free(g->sample_idx);
    free(g->shuffle_idx);
    memset(g, 0, sizeof *g);
}

static void build_doc_idx(const struct mt_gpt_params *p, const struct plan *pl, uint64_t key,
                          int32_t *doc_idx)
{
    uint64_t n = pl->epochs * pl->ndocs;
    for (uint64_t i = 0; i < n; i++) doc_idx[i] = (int32_t)(p->seq_beg + i % pl->ndocs);
    if (!pl->separate_final_epoch) {
        mt_data_shuffle(doc_idx, sizeof *doc_idx, n, key, STREAM_DOCS);
        return;
    }
    uint64_t first = (pl->epochs - 1) * pl->ndocs;
    mt_data_shuffle(doc_idx, sizeof *doc_idx, first, key, STREAM_DOCS);
    mt_data_shuffle(doc_idx + first, sizeof *doc_idx, pl->ndocs, key, STREAM_DOCS_FINAL);
}

/* helpers.cpp build_sample_idx with add_extra_token_to_sequence = 1 and
 * drop_last_partial_sequence = true. */
static int build_sample_idx(const struct mt_indexed *ix, const int32_t *doc_idx,
                            uint64_t n_doc_idx, int64_t seq_length, uint64_t n_samples,
                            int64_t *sample_idx, struct mt_err *err)
{
    int64_t di = 0, off = 0;
    sample_idx[0] = 0;
    sample_idx[1] = 0;
    for (uint64_t k = 1; k <= n_samples; k++) {
        int64_t remaining = seq_length + 1;
        while (remaining != 0) {
            int64_t doc_len = mt_indexed_sequence_length(ix, (uint64_t)doc_idx[di]) - off;
            remaining -= doc_len;
            if (remaining <= 0) {
                off += remaining + doc_len - 1;
                remaining = 0;
            } else {
                if ((uint64_t)di == n_doc_idx - 1)
                    return mt_err_set(err, MT_ERUNTIME,
                                      "%s: internal error: the token stream ran out at sample"
                                      " %" PRIu64 " of %" PRIu64,
                                      mt_indexed_prefix(ix), k, n_samples);
                di++;
                off = 0;
            }
        }
        sample_idx[2 * k] = di;
        sample_idx[2 * k + 1] = off;
    }
    return MT_OK;
}

static void build_shuffle_idx(const struct plan *pl, uint64_t key, int64_t *shuffle_idx)
{
    for (uint64_t i = 0; i < pl->n_samples; i++) shuffle_idx[i] = (int64_t)i;
    if (!pl->separate_final_epoch) {
        mt_data_shuffle(shuffle_idx, sizeof *shuffle_idx, pl->n_samples, key, STREAM_SAMPLES);
        return;
    }
    uint64_t first = pl->samples_before_final;
    mt_data_shuffle(shuffle_idx, sizeof *shuffle_idx, first, key, STREAM_SAMPLES);
    mt_data_shuffle(shuffle_idx + first, sizeof *shuffle_idx, pl->n_samples - first, key,
                    STREAM_SAMPLES_FINAL);
}

int mt_gpt_index_build(const struct mt_indexed *ix, const struct mt_gpt_params *p,
                       struct mt_gpt_index *g, struct mt_err *err)
{
    memset(g, 0, sizeof *g);
    struct plan pl;
    MT_CHECK(make_plan(ix, p, &pl, err));
    uint64_t key = mt_rng_key(p->seed, SEED_SALT);
    g->n_doc_idx = pl.epochs * pl.ndocs;
    g->n_samples = pl.n_samples;
    g->doc_idx = malloc(g->n_doc_idx * sizeof *g->doc_idx);
    g->sample_idx = malloc(2 * (g->n_samples + 1) * sizeof *g->sample_idx);
    g->shuffle_idx = malloc((g->n_samples ? g->n_samples : 1) * sizeof *g->shuffle_idx);
    if (!g->doc_idx || !g->sample_idx || !g->shuffle_idx) {
        mt_gpt_index_free(g);
        return mt_err_set(err, MT_ENOMEM,
                          "%s: out of memory for the sample index (%" PRIu64 " epochs, %" PRIu64
                          " samples)",
                          mt_indexed_prefix(ix), pl.epochs, pl.n_samples);
    }
    build_doc_idx(p, &pl, key, g->doc_idx);
    int rc = build_sample_idx(ix, g->doc_idx, g->n_doc_idx, p->seq_length, g->n_samples,
                              g->sample_idx, err);
    if (rc != MT_OK) {
        mt_gpt_index_free(g);
        return rc;
    }
    build_shuffle_idx(&pl, key, g->shuffle_idx);
    return MT_OK;
}

int mt_gpt_index_check(const struct mt_indexed *ix, const struct mt_gpt_params *p,
                       const struct mt_gpt_index *g, struct mt_err *err)
{
    struct plan pl;
    MT_CHECK(make_plan(ix, p, &pl, err));
    const char *bad = NULL;
    if (g->n_doc_idx != pl.epochs * pl.ndocs || g->n_samples != pl.n_samples)
        bad = "array sizes differ from the dataset's";
    for (uint64_t i = 0; !bad && i < g->n_doc_idx; i++)
        if (g->doc_idx[i] < 0 || (uint64_t)g->doc_idx[i] < p->seq_beg ||
            (uint64_t)g->doc_idx[i] >= p->seq_end)
            bad = "document index outside the split";
    int64_t prev_d = 0, prev_o = 0;
    for (uint64_t k = 0; !bad && k <= g->n_samples; k++) {
        int64_t d = g->sample_idx[2 * k], o = g->sample_idx[2 * k + 1];
        if (d < 0 || (uint64_t)d >= g->n_doc_idx || o < 0 ||
            o > mt_indexed_sequence_length(ix, (uint64_t)g->doc_idx[d]) ||
            d < prev_d || (d == prev_d && o < prev_o))
            bad = "sample index out of range";
        prev_d = d;
        prev_o = o;
    }
    unsigned char *seen = bad ? NULL : calloc(g->n_samples / 8 + 1, 1);
    if (!bad && !seen) return mt_err_set(err, MT_ENOMEM, "out of memory");
    for (uint64_t i = 0; !bad && i < g->n_samples; i++) {
        int64_t s = g->shuffle_idx[i];
        if (s < 0 || (uint64_t)s >= g->n_samples || (seen[s / 8] >> (s % 8) & 1))
            bad = "shuffle index is not a permutation";
        else
            seen[s / 8] |= (unsigned char)(1u << (s % 8));
    }
    free(seen);
    if (bad) return mt_err_set(err, MT_ECORRUPT, "%s", bad);
    return MT_OK;
}

int mt_gpt_sample(const struct mt_indexed *ix, const struct mt_gpt_index *g, int seq_length,
                  uint64_t k, int32_t vocab, int32_t *tokens, struct mt_err *err)
{
    if (k >= g->n_samples)
        return mt_err_set(err, MT_EINVAL, "sample %" PRIu64 " out of range (%" PRIu64 ")", k,
                          g->n_samples);
    const int64_t d0 = g->sample_idx[2 * k], o0 = g->sample_idx[2 * k + 1];
    const int64_t d1 = g->sample_idx[2 * k + 2], o1 = g->sample_idx[2 * k + 3];
    /* Sizes first: a sample must be exactly seq_length+1 tokens before any copy. */
    int64_t total = 0;
    for (int64_t d = d0; d <= d1; d++) {
        int64_t len = mt_indexed_sequence_length(ix, (uint64_t)g->doc_idx[d]);
        int64_t beg = d == d0 ? o0 : 0, end = d == d1 ? o1 + 1 : len;
        if (end > len || end < beg)
            return mt_err_set(err, MT_ECORRUPT, "%s: sample %" PRIu64 " spans past a document",
                              mt_indexed_prefix(ix), k);
        total += end - beg;
    }
    if (total != (int64_t)seq_length + 1)
        return mt_err_set(err, MT_ECORRUPT,
                          "%s: sample %" PRIu64 " has %" PRId64 " tokens, expected %d",
                          mt_indexed_prefix(ix), k, total, seq_length + 1);
    int32_t *out = tokens;
    for (int64_t d = d0; d <= d1; d++) {
        int64_t len = mt_indexed_sequence_length(ix, (uint64_t)g->doc_idx[d]);
        int64_t beg = d == d0 ? o0 : 0, end = d == d1 ? o1 + 1 : len;
        MT_CHECK(mt_indexed_read(ix, (uint64_t)g->doc_idx[d], (uint64_t)beg,
                                 (uint64_t)(end - beg), vocab, out, err));
        out += end - beg;
    }
    return MT_OK;
}

/* moetrain data module internals: the GPT sample index, blending and the
 * index cache. Shared by the files of src/data and by tests/data; nothing
 * outside the module includes this. */
#ifndef MT_DATA_DATA_INTERNAL_H
#define MT_DATA_DATA_INTERNAL_H

#include <stdint.h>

#include "data/data.h"

/* ---- GPT sampling (Megatron's GPTDataset) -------------------------------- */

struct mt_gpt_params {
    uint64_t seq_beg, seq_end;  /* the split: sequences [seq_beg, seq_end) */
    int seq_length;             /* tokens per sample, plus one shared with the next */
    uint64_t seed;              /* training%seed */
    int64_t num_samples;        /* requested; -1 = exactly one epoch */
};

/* The three arrays of a GPTDataset. Sample k (before shuffling) starts at token
 * sample_idx[2k+1] of sequence doc_idx[sample_idx[2k]] and ends, one token
 * past its last, at the position pair k+1. */
struct mt_gpt_index {
    int32_t *doc_idx;           /* (n_doc_idx,) sequence ids, shuffled per epoch */
    uint64_t n_doc_idx;
    int64_t *sample_idx;        /* (n_samples+1, 2) positions into doc_idx */
    int64_t *shuffle_idx;       /* (n_samples,) permutation of the samples */
    uint64_t n_samples;
};

int mt_gpt_index_build(const struct mt_indexed *ix, const struct mt_gpt_params *p,
                       struct mt_gpt_index *g, struct mt_err *err);
/* Checks arrays loaded from a cache against the dataset and params: every
 * entry in range, so that sampling can never read out of bounds. */
int mt_gpt_index_check(const struct mt_indexed *ix, const struct mt_gpt_params *p,
                       const struct mt_gpt_index *g, struct mt_err *err);
void mt_gpt_index_free(struct mt_gpt_index *g);

/* Copies sample k of the unshuffled order (seq_length+1 tokens). */
int mt_gpt_sample(const struct mt_indexed *ix, const struct mt_gpt_index *g, int seq_length,
                  uint64_t k, int32_t vocab, int32_t *tokens, struct mt_err *err);

/* Fisher-Yates shuffle of n elements of elem (<= 8) bytes, drawn from the
 * Philox stream (key, stream). */
void mt_data_shuffle(void *a, size_t elem, uint64_t n, uint64_t key, uint64_t stream);

/* ---- Blending (Megatron's BlendedDataset) -------------------------------- */

/* Greedy assignment: sample i goes to the dataset furthest below its share
 * weights[d]*max(i,1); dataset_sample_index[i] counts that dataset's draws so
 * far. weights must be normalised. */
void mt_blend_build(const double *weights, int n, uint64_t size, int16_t *dataset_index,
                    int64_t *dataset_sample_index);

/* ---- Index cache -------------------------------------------------------- */

/* One array of a cache file. On load, data is allocated (malloc) and count set. */
struct mt_cache_array {
    void *data;
    uint32_t elem_size;         /* 2, 4 or 8 */
    uint64_t count;
};

enum mt_cache_status { MT_CACHE_MISS, MT_CACHE_HIT, MT_CACHE_REJECTED };

/* 64-bit FNV-1a, continued from h (start with MT_HASH64_INIT). */
#define MT_HASH64_INIT 0xcbf29ce484222325ull
uint64_t mt_hash64(const void *p, size_t n, uint64_t h);

/* The file for a description: <dir>/<hash of desc>-<tag>.mtidx. */
void mt_cache_path(const char *dir, const char *desc, const char *tag, char *out, size_t n);

/* Loads the n arrays stored under desc. A missing file is a MISS; a file of the
 * wrong size, magic, version, description, shape or checksum is REJECTED (why
 * in reason) and never used; only real I/O trouble is an error. */
int mt_cache_load(const char *path, const char *desc, struct mt_cache_array *arrays, int n,
                  enum mt_cache_status *status, char *reason, size_t reason_n,
                  struct mt_err *err);

/* Writes the arrays atomically (temporary file, fsync, rename), creating dir. */
int mt_cache_store(const char *dir, const char *path, const char *desc,
                   const struct mt_cache_array *arrays, int n, struct mt_err *err);

#endif

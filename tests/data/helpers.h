/* Shared helpers for the tests/data programs: temporary directories, small
 * datasets with recognisable tokens, and a test configuration. */
#ifndef MT_TESTS_DATA_HELPERS_H
#define MT_TESTS_DATA_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "data/data.h"

/* A fresh directory under $TMPDIR (or /tmp); free() the result. */
char *th_tmpdir(void);
/* Removes a directory tree. */
void th_rmtree(const char *dir);

/* Token j of document d in th_write_dataset: recognisable, unique per (d, j)
 * for j < 1000. */
#define TH_TOKEN(base, d, j) ((int32_t)((base) + 1000 * (d) + (j)))

/* Writes prefix.bin/.idx: ndocs documents, document d of lens[d] tokens
 * TH_TOKEN(base, d, j). */
void th_write_dataset(const char *prefix, enum mt_token_dtype dtype, int ndocs, const int *lens,
                      int32_t base);
/* The same with lengths drawn from [lo, hi] by a fixed LCG seeded with seed. */
void th_write_random_dataset(const char *prefix, int ndocs, int lo, int hi, unsigned seed,
                             int32_t base);

/* A configuration for the data module alone: one data_path element (may be
 * NULL), split 969,30,1, no cache. */
void th_config(struct mt_config *cfg, const char *data_path);

/* mt_data_open that fails the test (printing the message) on error. */
struct mt_data *th_open(const struct mt_config *cfg);
/* Whether a and b give the same samples (seq_length+1 tokens) in split s. */
bool th_same_samples(struct mt_data *a, struct mt_data *b, enum mt_split s, int seq_length);

/* Whole-file helpers; abort the test on failure. */
void th_write_file(const char *path, const void *p, size_t n);
void *th_read_file(const char *path, size_t *n);
/* path1 + path2, malloc'd. */
char *th_join(const char *a, const char *b);

#endif

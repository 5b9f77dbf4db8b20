/* moetrain: training data, the Megatron way.
 *
 * Datasets are Megatron-LM indexed datasets (<prefix>.bin + <prefix>.idx, the
 * MMapIndexedDataset format), sampled as Megatron's GPTDataset samples them and
 * blended as its BlendedDataset blends them: a Megatron user's data files, split
 * string and blend weights mean the same thing here. Index arrays are cached
 * under data%data_cache_path. moetrain-preprocess writes such datasets with a
 * byte-level tokenizer (token = byte, 256 = end of document, vocabulary 257).
 *
 * The first section is what the training loop uses; the rest is the file
 * format, used by moetrain-preprocess and the tests. */
#ifndef MT_DATA_DATA_H
#define MT_DATA_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "util/error.h"

/* ------------------------------------------------------------------------- */
/* The training loop's view                                                   */
/* ------------------------------------------------------------------------- */

enum mt_split { MT_SPLIT_TRAIN = 0, MT_SPLIT_VALID = 1, MT_SPLIT_TEST = 2 };
#define MT_NUM_SPLITS 3

struct mt_data;

/* Opens everything the config names (data%*, training%seq_length/seed/
 * train_iters/eval_interval/eval_iters/global_batch_size, model%vocab_size)
 * and builds or loads the index caches. A split is requested as many samples as
 * Megatron requests: train_iters*global_batch_size, (train_iters/eval_interval
 * + 1)*eval_iters*global_batch_size, eval_iters*global_batch_size. A split that
 * is requested no samples, or has weight 0 in data%split, is not built and has
 * 0 samples. */
int mt_data_open(const struct mt_config *cfg, struct mt_data **out, struct mt_err *err);

/* Samples available in split s: at least the number requested, except for an
 * unweighted blend of several prefixes, which (as in Megatron) offers at most
 * one epoch of each. */
uint64_t mt_data_num_samples(const struct mt_data *d, enum mt_split s);

/* Copies sample `index` (0 <= index < num_samples) of split s: seq_length+1
 * tokens into tokens[]. Fails (naming file and document) on a token outside
 * [0, vocab_size). */
int mt_data_get(struct mt_data *d, enum mt_split s, uint64_t index, int32_t *tokens,
                struct mt_err *err);

/* A one-line description for the startup log (prefixes, documents, tokens,
 * samples per split, cache use). */
void mt_data_describe(const struct mt_data *d, char *buf, size_t n);

void mt_data_close(struct mt_data *d);

/* What mt_data_open did for the index arrays: sets loaded from
 * data%data_cache_path, sets built (and stored there, with a cache path), and
 * cache files found invalid (damaged or not matching) and rebuilt. A set is the
 * GPT indices of one prefix and split, or the blend indices of one split. */
struct mt_data_cache_stats {
    unsigned loaded;
    unsigned built;
    unsigned rejected;
};
void mt_data_cache_stats(const struct mt_data *d, struct mt_data_cache_stats *out);

/* ------------------------------------------------------------------------- */
/* Indexed dataset files                                                      */
/* ------------------------------------------------------------------------- */

/* Megatron's DType codes for the token type in the .bin file. */
enum mt_token_dtype {
    MT_DTYPE_UINT8 = 1,
    MT_DTYPE_INT8 = 2,
    MT_DTYPE_INT16 = 3,
    MT_DTYPE_INT32 = 4,
    MT_DTYPE_INT64 = 5,
    MT_DTYPE_FLOAT64 = 6,
    MT_DTYPE_FLOAT32 = 7,
    MT_DTYPE_UINT16 = 8
};

/* Bytes per token of a dtype code; 0 for a code that is not one. */
size_t mt_token_dtype_size(int code);
const char *mt_token_dtype_name(int code);

/* A read-only dataset. Opening reads the whole index into memory and validates it
 * (header, sizes against file lengths, pointers against the .bin); any problem
 * is MT_ECORRUPT with the file, the fault and the fix. Tokens are read from the
 * .bin as needed (never memory-mapped), so a dataset must be replaced atomically
 * while a run reads it: new files renamed over the old ones. */
struct mt_indexed;

int mt_indexed_open(const char *prefix, struct mt_indexed **out, struct mt_err *err);
void mt_indexed_close(struct mt_indexed *ix);

const char *mt_indexed_prefix(const struct mt_indexed *ix);
int mt_indexed_dtype(const struct mt_indexed *ix);
/* Sequences (Megatron's unit of sampling) and documents (runs of sequences;
 * one sequence each unless the data was preprocessed with --split-sentences). */
uint64_t mt_indexed_num_sequences(const struct mt_indexed *ix);
uint64_t mt_indexed_num_documents(const struct mt_indexed *ix);
uint64_t mt_indexed_num_tokens(const struct mt_indexed *ix);
int32_t mt_indexed_sequence_length(const struct mt_indexed *ix, uint64_t seq);
/* The document holding sequence seq. */
uint64_t mt_indexed_document_of(const struct mt_indexed *ix, uint64_t seq);

/* Copies count tokens of sequence seq from token offset off into out[],
 * converting the file's dtype; every token must lie in [0, vocab) or the call
 * fails with MT_ECORRUPT naming the .bin file, document and position. A .bin
 * whose size changed since open (truncated or rewritten in place) is MT_ECORRUPT
 * naming the file, with the fix. */
int mt_indexed_read(const struct mt_indexed *ix, uint64_t seq, uint64_t off, uint64_t count,
                    int32_t vocab, int32_t *out, struct mt_err *err);

/* Writes <prefix>.bin/.idx atomically (both written as .tmp, fsynced, then
 * renamed), one sequence per document, in Megatron's layout. */
struct mt_indexed_writer;

int mt_indexed_writer_open(const char *prefix, enum mt_token_dtype dtype,
                           struct mt_indexed_writer **out, struct mt_err *err);
/* Appends one document; each token must fit the dtype. */
int mt_indexed_writer_add(struct mt_indexed_writer *w, const int32_t *tokens, size_t n,
                          struct mt_err *err);
uint64_t mt_indexed_writer_documents(const struct mt_indexed_writer *w);
/* Publishes the files and frees w (also on failure, after removing the .tmp). */
int mt_indexed_writer_finish(struct mt_indexed_writer *w, struct mt_err *err);
/* Removes the .tmp files and frees w. */
void mt_indexed_writer_abort(struct mt_indexed_writer *w);

/* ------------------------------------------------------------------------- */
/* moetrain-preprocess: text and JSONL to byte tokens                         */
/* ------------------------------------------------------------------------- */

#define MT_BYTE_EOD 256    /* end-of-document token */
#define MT_BYTE_VOCAB 257  /* bytes 0..255 and EOD */

enum mt_input_format { MT_INPUT_TEXT, MT_INPUT_JSONL };

/* JSONL for names ending in .jsonl or .json, plain text otherwise. */
enum mt_input_format mt_preprocess_format_of(const char *path);

struct mt_preprocess_opts {
    const char *json_key;   /* JSONL: the string field holding the text */
    bool append_eod;        /* end every document with MT_BYTE_EOD */
};

struct mt_preprocess_stats {
    uint64_t documents;     /* written */
    uint64_t empty;         /* skipped: no text */
    uint64_t tokens;
};

/* Appends the documents of one input file to w. Plain text: one document per
 * paragraph (lines up to a blank or whitespace-only line, newlines kept, blank
 * lines dropped). JSONL: one document per line, the json_key string field
 * unescaped to UTF-8. Errors name file:line(:col). */
int mt_preprocess_file(struct mt_indexed_writer *w, const char *path,
                       const struct mt_preprocess_opts *opts, struct mt_preprocess_stats *st,
                       struct mt_err *err);

#endif

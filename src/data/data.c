/* The training loop's data: Megatron's BlendedMegatronDatasetBuilder for GPT.
 *
 * data%data_path names one prefix, several (blended by their sizes, one epoch
 * each) or weight/prefix pairs (blended by weight). data%split cuts every
 * prefix's sequences into contiguous train/valid/test ranges. Each (prefix,
 * split) is a GPT dataset (gpt.c); several prefixes are blended (blend.c);
 * both kinds of index are cached (cache.c). */
#include "data/data_internal.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/rng.h"

#ifndef MT_PKGDATADIR
#error "MT_PKGDATADIR (the installed data directory) must be defined by the build"
#endif

#define MOCK_SALT 0x4d4f434b2d544f4bull  /* "MOCK-TOK" */
/* Megatron's mid_level_dataset_surplus: weighted datasets build 0.5% more. */
#define BLEND_SURPLUS 0.005

static const char *const split_names[MT_NUM_SPLITS] = {"train", "valid", "test"};

struct source {
    char *name;                 /* as written in data%data_path */
    char *path;                 /* where it was found */
    struct mt_indexed *ix;
    double weight;              /* normalised; 0 if the blend has no weights */
    char *stamp;                /* identity of the files, for the cache */
    struct mt_gpt_params params[MT_NUM_SPLITS];
    struct mt_gpt_index index[MT_NUM_SPLITS];
    char *desc[MT_NUM_SPLITS];  /* cache description of each split's indices */
};

struct blend {
    int16_t *dataset_index;
    int64_t *dataset_sample_index;
    uint64_t size;
};

struct mt_data {
    bool mock;
    int seq_length;
    int32_t vocab;
    uint64_t seed;
    uint64_t requested[MT_NUM_SPLITS];
    uint64_t num_samples[MT_NUM_SPLITS];
    char split[64];
    double split_vec[MT_NUM_SPLITS];
    int n;
    bool weighted;
    struct source src[MT_MAX_DATA_PATHS];
    struct blend blend[MT_NUM_SPLITS];
    char cache_dir[MT_STR_MAX];
    struct mt_data_cache_stats cache;
    char rejected_why[MT_STR_MAX + 128];  /* the last rejected cache file, for the log */
};

/* ------------------------------------------------------------------------- */
/* Configuration                                                              */
/* ------------------------------------------------------------------------- */

/* Megatron's sample counts for train, valid, test. */
static int requested_samples(const struct mt_config_training *t, uint64_t out[MT_NUM_SPLITS],
                             struct mt_err *err)
{
    if (t->global_batch_size < 1)
        return mt_err_set(err, MT_EINVAL,
                          "training%%global_batch_size is %d; resolve the configuration"
                          " (mt_config_resolve) before opening the data",
                          t->global_batch_size);
    if (t->train_iters < 0 || t->eval_iters < 0 || t->eval_interval < 1)
        return mt_err_set(err, MT_EINVAL,
                          "training%%train_iters (%d) and eval_iters (%d) must be >= 0 and"
                          " eval_interval (%d) >= 1",
                          t->train_iters, t->eval_iters, t->eval_interval);
    uint64_t gbs = (uint64_t)t->global_batch_size;
    out[MT_SPLIT_TRAIN] = (uint64_t)t->train_iters * gbs;
    out[MT_SPLIT_VALID] =
        ((uint64_t)(t->train_iters / t->eval_interval) + 1) * (uint64_t)t->eval_iters * gbs;
    out[MT_SPLIT_TEST] = (uint64_t)t->eval_iters * gbs;
    return MT_OK;
}

/* Megatron's split matrix applied to n sequences: the range of split i, or
 * false when split i has weight 0. */
static bool split_range(const double vec[MT_NUM_SPLITS], int i, uint64_t n, uint64_t *beg,
                        uint64_t *end)
{
    double lo = 0;
    for (int k = 0; k < i; k++) lo += vec[k];
    double hi = lo + vec[i];
    if (hi <= lo) return false;
    /* Python's round(): half to even, which rint does in the default mode. */
    *beg = (uint64_t)rint(lo * (double)n);
    *end = (uint64_t)rint(hi * (double)n);
    return true;
}

/* data%data_path by the rule --check applies (mt_config_data_blend). */
static int parse_blend(struct mt_data *d, const struct mt_config_data *dc, struct mt_err *err)
{
    struct mt_data_blend *b = malloc(sizeof *b);
    if (!b)
        return mt_err_set(err, MT_ENOMEM, "out of memory reading data%%data_path (%zu bytes)",
                          sizeof *b);
    int rc = mt_config_data_blend(dc, b, err);
    d->weighted = b->weighted;
    for (int k = 0; rc == MT_OK && k < b->n; k++) {
        struct source *s = &d->src[d->n];
        s->name = strdup(b->prefix[k]);
        if (!s->name) rc = mt_err_set(err, MT_ENOMEM, "out of memory");
        else d->n++;
        s->weight = b->weight[k];
    }
    free(b);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* Finding and opening datasets                                               */
/* ------------------------------------------------------------------------- */

static bool readable(const char *prefix, const char *ext)
{
    char path[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s%s", prefix, ext);
    return access(path, R_OK) == 0;
}

/* A prefix as given (from the working directory), then under $MOETRAIN_DATADIR,
 * then under the installed data directory. */
static int resolve_prefix(const char *name, char **out, struct mt_err *err)
{
    char cand[3][PATH_MAX];
    const char *what[3];
    int n = 0;
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "?");
    snprintf(cand[n], PATH_MAX, "%s", name);
    what[n++] = name[0] == '/' ? "as given" : "relative to the working directory";
    const char *env = getenv("MOETRAIN_DATADIR");
    bool env_set = env && *env;
    if (name[0] != '/' && env_set) {
        snprintf(cand[n], PATH_MAX, "%s/%s", env, name);
        what[n++] = "under $MOETRAIN_DATADIR";
    }
    if (name[0] != '/') {
        snprintf(cand[n], PATH_MAX, "%s/%s", MT_PKGDATADIR, name);
        what[n++] = "under the installed data directory";
    }
    for (int i = 0; i < n; i++) {
        if (readable(cand[i], ".idx") && readable(cand[i], ".bin")) {
            *out = strdup(cand[i]);
            return *out ? MT_OK : mt_err_set(err, MT_ENOMEM, "out of memory");
        }
    }
    char msg[MT_ERR_MSG_MAX];
    size_t len = (size_t)snprintf(msg, sizeof msg,
                                  "data%%data_path: dataset '%s' not found (need %s.bin and"
                                  " %s.idx); tried:", name, name, name);
    for (int i = 0; i < n && len < sizeof msg; i++) {
        bool idx = readable(cand[i], ".idx"), bin = readable(cand[i], ".bin");
        len += (size_t)snprintf(msg + len, sizeof msg - len, "\n  %s  (%s%s%s%s)", cand[i],
                                what[i], i == 0 && name[0] != '/' ? " " : "",
                                i == 0 && name[0] != '/' ? cwd : "",
                                idx ? "; has .idx but no .bin"
                                    : bin ? "; has .bin but no .idx" : "");
    }
    if (name[0] != '/' && !env_set && len < sizeof msg)
        len += (size_t)snprintf(msg + len, sizeof msg - len, "\n  ($MOETRAIN_DATADIR is not set)");
    if (len < sizeof msg)
        snprintf(msg + len, sizeof msg - len,
                 "\nhint: create it with moetrain-preprocess --output-prefix PREFIX, and give"
                 " data_path without the .bin/.idx extension");
    return mt_err_set(err, MT_EINVAL, "%s", msg);
}

/* What identifies the files: their real path, sizes and modification times. */
static int file_stamp(const char *path, char **out, struct mt_err *err)
{
    char real[PATH_MAX], file[PATH_MAX + 8];
    struct stat st[2];
    if (!realpath(path, real)) snprintf(real, sizeof real, "%s", path);
    static const char *const ext[2] = {".idx", ".bin"};
    for (int i = 0; i < 2; i++) {
        snprintf(file, sizeof file, "%s%s", path, ext[i]);
        if (stat(file, &st[i]) != 0) return mt_err_errno(err, "%s", file);
    }
    if (asprintf(out, "%s idx %lld %lld.%09ld bin %lld %lld.%09ld", real,
                 (long long)st[0].st_size, (long long)st[0].st_mtim.tv_sec,
                 (long)st[0].st_mtim.tv_nsec, (long long)st[1].st_size,
                 (long long)st[1].st_mtim.tv_sec, (long)st[1].st_mtim.tv_nsec) < 0) {
        *out = NULL;
        return mt_err_set(err, MT_ENOMEM, "out of memory");
    }
    return MT_OK;
}

/* ------------------------------------------------------------------------- */
/* Building or loading the indices                                            */
/* ------------------------------------------------------------------------- */

static void count_status(struct mt_data *d, enum mt_cache_status st, const char *why)
{
    if (st == MT_CACHE_HIT) d->cache.loaded++;
    if (st == MT_CACHE_REJECTED) {
        d->cache.rejected++;
        snprintf(d->rejected_why, sizeof d->rejected_why, "%s", why);
    }
}

static int gpt_indices(struct mt_data *d, struct source *s, int split, struct mt_err *err)
{
    const struct mt_gpt_params *p = &s->params[split];
    struct mt_gpt_index *g = &s->index[split];
    if (asprintf(&s->desc[split],
                 "moetrain GPT indices\nfiles %s\nsplit %s (%s) sequences %" PRIu64 " %" PRIu64
                 "\nseq_length %d\nseed %" PRIu64 "\nnum_samples %" PRId64 "\n",
                 s->stamp, d->split, split_names[split], p->seq_beg, p->seq_end,
                 p->seq_length, p->seed, p->num_samples) < 0) {
        s->desc[split] = NULL;
        return mt_err_set(err, MT_ENOMEM, "out of memory");
    }
    char path[MT_STR_MAX + 64] = "", tag[16];
    snprintf(tag, sizeof tag, "gpt-%s", split_names[split]);
    if (d->cache_dir[0]) {
        mt_cache_path(d->cache_dir, s->desc[split], tag, path, sizeof path);
        struct mt_cache_array a[3] = {{NULL, 4, 0}, {NULL, 8, 0}, {NULL, 8, 0}};
        enum mt_cache_status st;
        char why[MT_STR_MAX + 128];
        MT_CHECK(mt_cache_load(path, s->desc[split], a, 3, &st, why, sizeof why, err));
        if (st == MT_CACHE_HIT) {
            g->doc_idx = a[0].data;
            g->n_doc_idx = a[0].count;
            g->sample_idx = a[1].data;
            g->shuffle_idx = a[2].data;
            g->n_samples = a[2].count;
            struct mt_err bad;
            if (a[1].count != 2 * (a[2].count + 1) ||
                mt_gpt_index_check(s->ix, p, g, &bad) != MT_OK) {
                mt_gpt_index_free(g);
                st = MT_CACHE_REJECTED;
                snprintf(why, sizeof why, "%s: arrays do not fit the dataset", path);
            }
        }
        count_status(d, st, why);
        if (st == MT_CACHE_HIT) return MT_OK;
    }
    MT_CHECK(mt_gpt_index_build(s->ix, p, g, err));
    d->cache.built++;
    if (!d->cache_dir[0]) return MT_OK;
    struct mt_cache_array a[3] = {{g->doc_idx, 4, g->n_doc_idx},
                                  {g->sample_idx, 8, 2 * (g->n_samples + 1)},
                                  {g->shuffle_idx, 8, g->n_samples}};
    return mt_cache_store(d->cache_dir, path, s->desc[split], a, 3, err);
}

static int blend_check(const struct mt_data *d, int split, const struct blend *b)
{
    for (uint64_t i = 0; i < b->size; i++) {
        int k = b->dataset_index[i];
        if (k < 0 || k >= d->n || b->dataset_sample_index[i] < 0 ||
            (uint64_t)b->dataset_sample_index[i] >= d->src[k].index[split].n_samples)
            return MT_ECORRUPT;
    }
    return MT_OK;
}

static int blend_load_or_build(struct mt_data *d, int split, const double *weights,
                               uint64_t size, const char *desc, struct mt_err *err)
{
    struct blend *b = &d->blend[split];
    char path[MT_STR_MAX + 64] = "", tag[16];
    snprintf(tag, sizeof tag, "blend-%s", split_names[split]);
    b->size = size;
    if (d->cache_dir[0]) {
        mt_cache_path(d->cache_dir, desc, tag, path, sizeof path);
        struct mt_cache_array a[2] = {{NULL, 2, 0}, {NULL, 8, 0}};
        enum mt_cache_status st;
        char why[MT_STR_MAX + 128];
        MT_CHECK(mt_cache_load(path, desc, a, 2, &st, why, sizeof why, err));
        if (st == MT_CACHE_HIT) {
            b->dataset_index = a[0].data;
            b->dataset_sample_index = a[1].data;
            if (a[0].count != size || a[1].count != size || blend_check(d, split, b) != MT_OK) {
                free(b->dataset_index);
                free(b->dataset_sample_index);
                b->dataset_index = NULL;
                b->dataset_sample_index = NULL;
                st = MT_CACHE_REJECTED;
                snprintf(why, sizeof why, "%s: arrays do not fit the datasets", path);
            }
        }
        count_status(d, st, why);
        if (st == MT_CACHE_HIT) return MT_OK;
    }
    b->dataset_index = malloc((size ? size : 1) * sizeof *b->dataset_index);
    b->dataset_sample_index = malloc((size ? size : 1) * sizeof *b->dataset_sample_index);
    if (!b->dataset_index || !b->dataset_sample_index)
        return mt_err_set(err, MT_ENOMEM, "out of memory for the %s blend index (%" PRIu64
                          " samples)", split_names[split], size);
    mt_blend_build(weights, d->n, size, b->dataset_index, b->dataset_sample_index);
    if (blend_check(d, split, b) != MT_OK)
        return mt_err_set(err, MT_ERUNTIME,
                          "the %s blend draws more samples from a dataset than it holds"
                          " (internal error)", split_names[split]);
    d->cache.built++;
    if (!d->cache_dir[0]) return MT_OK;
    struct mt_cache_array a[2] = {{b->dataset_index, 2, size}, {b->dataset_sample_index, 8, size}};
    return mt_cache_store(d->cache_dir, path, desc, a, 2, err);
}

static int blend_indices(struct mt_data *d, int split, const double *weights, uint64_t size,
                         struct mt_err *err)
{
    size_t cap = 64;
    for (int k = 0; k < d->n; k++) cap += strlen(d->src[k].desc[split]) + 40;
    char *desc = malloc(cap);
    if (!desc) return mt_err_set(err, MT_ENOMEM, "out of memory");
    size_t len = (size_t)snprintf(desc, cap, "moetrain blend indices\nsize %" PRIu64 "\n", size);
    for (int k = 0; k < d->n; k++)
        len += (size_t)snprintf(desc + len, cap - len, "weight %.17g\n%s", weights[k],
                                d->src[k].desc[split]);
    int rc = blend_load_or_build(d, split, weights, size, desc, err);
    free(desc);
    return rc;
}

/* Megatron's _get_size_per_split_per_dataset: ceil(ceil(size * w) * (1 + surplus)). */
static uint64_t weighted_size(uint64_t size, double w, double surplus)
{
    return (uint64_t)ceil(ceil((double)size * w) * (1.0 + surplus));
}

static int build_split(struct mt_data *d, int split, struct mt_err *err)
{
    uint64_t want = d->requested[split];
    for (int k = 0; k < d->n; k++) {
        struct source *s = &d->src[k];
        uint64_t nseq = mt_indexed_num_sequences(s->ix), beg, end;
        if (!split_range(d->split_vec, split, nseq, &beg, &end)) return MT_OK;
        if (beg == end)
            return mt_err_set(err, MT_EINVAL,
                              "%s: the %s split is empty: data%%split = '%s' of %" PRIu64
                              " documents gives it documents [%" PRIu64 ", %" PRIu64 "), but %"
                              PRIu64 " %s samples are requested\nhint: use a dataset with more"
                              " documents, give %s a larger share in data%%split, or set"
                              " training%%eval_iters = 0",
                              s->name, split_names[split], d->split, nseq, beg, end, want,
                              split_names[split], split_names[split]);
        /* One prefix: the samples requested. Weighted: its share plus the
         * surplus. Unweighted blend: one epoch. */
        int64_t num = (int64_t)want;
        if (d->weighted) num = (int64_t)weighted_size(want, s->weight, BLEND_SURPLUS);
        else if (d->n > 1) num = -1;
        s->params[split] = (struct mt_gpt_params){beg, end, d->seq_length, d->seed, num};
        int rc = gpt_indices(d, s, split, err);
        if (rc != MT_OK) return mt_err_prefix(err, "%s (%s split)", s->name, split_names[split]);
    }
    if (d->n == 1 && !d->weighted) {
        d->num_samples[split] = d->src[0].index[split].n_samples;
        return MT_OK;
    }
    double weights[MT_MAX_DATA_PATHS];
    uint64_t size = 0;
    if (d->weighted) {
        for (int k = 0; k < d->n; k++) {
            weights[k] = d->src[k].weight;
            size += weighted_size(want, weights[k], 0.0);
        }
    } else {
        /* Unweighted: one epoch of each, blended by their sizes. */
        double total = 0;
        for (int k = 0; k < d->n; k++) total += (double)d->src[k].index[split].n_samples;
        if (total == 0)
            return mt_err_set(err, MT_EINVAL,
                              "data%%data_path: the %s split of these datasets holds no sample"
                              " of %d+1 tokens", split_names[split], d->seq_length);
        for (int k = 0; k < d->n; k++) {
            weights[k] = (double)d->src[k].index[split].n_samples / total;
            size += d->src[k].index[split].n_samples;
        }
        if (size > want) size = want;
    }
    MT_CHECK(blend_indices(d, split, weights, size, err));
    d->num_samples[split] = size;
    return MT_OK;
}

/* ------------------------------------------------------------------------- */
/* API                                                                        */
/* ------------------------------------------------------------------------- */

int mt_data_open(const struct mt_config *cfg, struct mt_data **out, struct mt_err *err)
{
    *out = NULL;
    const struct mt_config_training *t = &cfg->training;
    if (t->seq_length < 1)
        return mt_err_set(err, MT_EINVAL, "training%%seq_length must be >= 1 (is %d)",
                          t->seq_length);
    if (cfg->model.vocab_size < 1)
        return mt_err_set(err, MT_EINVAL, "model%%vocab_size must be >= 1 (is %d)",
                          cfg->model.vocab_size);
    if (t->seed < 0)
        return mt_err_set(err, MT_EINVAL, "training%%seed must be >= 0 (is %lld)",
                          (long long)t->seed);
    struct mt_data *d = calloc(1, sizeof *d);
    if (!d) return mt_err_set(err, MT_ENOMEM, "out of memory");
    d->seq_length = t->seq_length;
    d->vocab = cfg->model.vocab_size;
    d->seed = (uint64_t)t->seed;
    d->mock = cfg->data.mock_data;
    int rc;
    MT_CHECK_GOTO(requested_samples(t, d->requested, err), fail);
    if (d->mock) {
        memcpy(d->num_samples, d->requested, sizeof d->num_samples);
        *out = d;
        return MT_OK;
    }
    snprintf(d->split, sizeof d->split, "%s", cfg->data.split);
    snprintf(d->cache_dir, sizeof d->cache_dir, "%s", cfg->data.data_cache_path);
    MT_CHECK_GOTO(mt_config_data_split(d->split, d->split_vec, err), fail);
    MT_CHECK_GOTO(parse_blend(d, &cfg->data, err), fail);
    for (int k = 0; k < d->n; k++) {
        struct source *s = &d->src[k];
        MT_CHECK_GOTO(resolve_prefix(s->name, &s->path, err), fail);
        MT_CHECK_GOTO(mt_indexed_open(s->path, &s->ix, err), fail);
        MT_CHECK_GOTO(file_stamp(s->path, &s->stamp, err), fail);
    }
    for (int split = 0; split < MT_NUM_SPLITS; split++)
        if (d->requested[split] > 0) MT_CHECK_GOTO(build_split(d, split, err), fail);
    *out = d;
    return MT_OK;
fail:
    mt_data_close(d);
    return rc;
}

void mt_data_close(struct mt_data *d)
{
    if (!d) return;
    for (int k = 0; k < d->n; k++) {
        struct source *s = &d->src[k];
        for (int i = 0; i < MT_NUM_SPLITS; i++) {
            mt_gpt_index_free(&s->index[i]);
            free(s->desc[i]);
        }
        free(s->stamp);
        mt_indexed_close(s->ix);
        free(s->name);
        free(s->path);
    }
    for (int i = 0; i < MT_NUM_SPLITS; i++) {
        free(d->blend[i].dataset_index);
        free(d->blend[i].dataset_sample_index);
    }
    free(d);
}

uint64_t mt_data_num_samples(const struct mt_data *d, enum mt_split s)
{
    if ((int)s < 0 || (int)s >= MT_NUM_SPLITS) return 0;
    return d->num_samples[s];
}

void mt_data_cache_stats(const struct mt_data *d, struct mt_data_cache_stats *out)
{
    *out = d->cache;
}

static void mock_sample(const struct mt_data *d, enum mt_split s, uint64_t index,
                        int32_t *tokens)
{
    uint64_t key = mt_rng_key(d->seed, MOCK_SALT);
    for (int j = 0; j <= d->seq_length; j++)
        tokens[j] = (int32_t)mt_rng_below(key, ((uint64_t)s + 1) << 40 | (uint64_t)j, index,
                                          (uint64_t)d->vocab);
}

int mt_data_get(struct mt_data *d, enum mt_split s, uint64_t index, int32_t *tokens,
                struct mt_err *err)
{
    if ((int)s < 0 || (int)s >= MT_NUM_SPLITS)
        return mt_err_set(err, MT_EINVAL, "no split %d", (int)s);
    if (index >= d->num_samples[s])
        return mt_err_set(err, MT_EINVAL, "sample %" PRIu64 " of the %s split is out of range"
                          " (%" PRIu64 " samples)", index, split_names[s], d->num_samples[s]);
    if (d->mock) {
        mock_sample(d, s, index, tokens);
        return MT_OK;
    }
    const struct source *src = &d->src[0];
    uint64_t k = index;
    if (d->blend[s].dataset_index) {
        src = &d->src[d->blend[s].dataset_index[index]];
        k = (uint64_t)d->blend[s].dataset_sample_index[index];
    }
    const struct mt_gpt_index *g = &src->index[s];
    return mt_gpt_sample(src->ix, g, d->seq_length, (uint64_t)g->shuffle_idx[k], d->vocab,
                         tokens, err);
}

/* A count to three significant figures: 1363299 -> "1.36M". */
static void human(uint64_t v, char *out, size_t n)
{
    if (v >= 1000000000ull) snprintf(out, n, "%.3gG", (double)v / 1e9);
    else if (v >= 1000000ull) snprintf(out, n, "%.3gM", (double)v / 1e6);
    else if (v >= 10000ull) snprintf(out, n, "%.3gk", (double)v / 1e3);
    else snprintf(out, n, "%" PRIu64, v);
}

void mt_data_describe(const struct mt_data *d, char *buf, size_t n)
{
    if (!n) return;
    size_t len;
    if (d->mock) {
        len = (size_t)snprintf(buf, n, "data: mock (uniform tokens in [0, %" PRId32 "), seed %"
                               PRIu64 ")", d->vocab, d->seed);
    } else {
        len = (size_t)snprintf(buf, n, "data: ");
        for (int k = 0; k < d->n && len < n; k++) {
            const struct source *s = &d->src[k];
            char tok[32];
            human(mt_indexed_num_tokens(s->ix), tok, sizeof tok);
            char w[32] = "";
            if (d->weighted) snprintf(w, sizeof w, "%.3g*", s->weight);
            len += (size_t)snprintf(buf + len, n - len, "%s%s%s (%" PRIu64 " documents, %s %s"
                                    " tokens)", k ? ", " : "", w, s->path,
                                    mt_indexed_num_documents(s->ix), tok,
                                    mt_token_dtype_name(mt_indexed_dtype(s->ix)));
        }
        if (len < n) len += (size_t)snprintf(buf + len, n - len, "; split %s", d->split);
    }
    if (len < n)
        len += (size_t)snprintf(buf + len, n - len, "; samples train %" PRIu64 ", valid %" PRIu64
                                ", test %" PRIu64, d->num_samples[0], d->num_samples[1],
                                d->num_samples[2]);
    if (len < n && !d->mock && d->cache_dir[0])
        len += (size_t)snprintf(buf + len, n - len,
                                "; index cache %s: %u loaded, %u built, %u rejected", d->cache_dir,
                                d->cache.loaded, d->cache.built, d->cache.rejected);
    if (len < n && d->cache.rejected)
        snprintf(buf + len, n - len, " (last: %s)", d->rejected_why);
}

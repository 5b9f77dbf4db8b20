/* GPT sampling: the index arrays against an independent reference and
 * Megatron's epoch rules, then the public API's invariants (sample length,
 * one-token overlap, split confinement, determinism), mock data, split
 * errors, path resolution and the bundled corpus. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "data/data_internal.h"
#include "helpers.h"

/* ---- the index arrays ---- */

/* Megatron's epoch count and final-epoch rule, restated from gpt_dataset.py. */
static void expected_plan(uint64_t tpe, int64_t num_samples, int seq, uint64_t *epochs,
                          uint64_t *n_samples, bool *separate, uint64_t *before)
{
    *epochs = 1;
    if (num_samples >= 0) {
        uint64_t tokens = tpe;
        while (tokens < (uint64_t)num_samples * (uint64_t)seq + 1) {
            (*epochs)++;
            tokens += tpe;
        }
    }
    *n_samples = (*epochs * tpe - 1) / (uint64_t)seq;
    *separate = false;
    *before = 0;
    if (*epochs > 1) {
        *before = ((*epochs - 1) * tpe - 1) / (uint64_t)seq;
        uint64_t from_final = (uint64_t)num_samples - *before;
        uint64_t per_epoch = (tpe - 1) / (uint64_t)seq;
        *separate = from_final < (uint64_t)(0.8 * (double)per_epoch);
    }
}

/* Sample k starts at token k*seq of the stream of doc_idx's sequences: at
 * position (i, o) of the first sequence holding that token. */
static void check_sample_idx(const struct mt_indexed *ix, const struct mt_gpt_index *g, int seq)
{
    assert_int_equal(g->sample_idx[0], 0);
    assert_int_equal(g->sample_idx[1], 0);
    uint64_t i = 0, start = 0;  /* stream offset of doc_idx[i] */
    for (uint64_t k = 1; k <= g->n_samples; k++) {
        uint64_t tok = k * (uint64_t)seq;
        while (start + (uint64_t)mt_indexed_sequence_length(ix, (uint64_t)g->doc_idx[i]) <= tok) {
            start += (uint64_t)mt_indexed_sequence_length(ix, (uint64_t)g->doc_idx[i]);
            i++;
            assert_true(i < g->n_doc_idx);
        }
        assert_int_equal(g->sample_idx[2 * k], i);
        assert_int_equal(g->sample_idx[2 * k + 1], tok - start);
    }
}

static void check_permutation(const int64_t *a, uint64_t lo, uint64_t hi)
{
    char *seen = calloc(hi - lo + 1, 1);
    for (uint64_t i = lo; i < hi; i++) {
        assert_true(a[i] >= (int64_t)lo && a[i] < (int64_t)hi);
        assert_false(seen[a[i] - (int64_t)lo]);
        seen[a[i] - (int64_t)lo] = 1;
    }
    free(seen);
}

static void index_arrays_follow_megatron(void **state)
{
    (void)state;
    char *dir = th_tmpdir();
    char *prefix = th_join(dir, "/ds");
    th_write_random_dataset(prefix, 50, 1, 40, 7, 0);
    struct mt_indexed *ix;
    struct mt_err err = {0};
    assert_int_equal(mt_indexed_open(prefix, &ix, &err), MT_OK);
    static const int seqs[] = {1, 2, 7, 16, 100};
    /* Fixed requests, then requests whose last epoch is used a fraction of
     * the way, either side of Megatron's 0.8 threshold. */
    static const int64_t fixed[] = {-1, 1, 10, 150, 500, 3000};
    static const double fractions[] = {0.3, 0.79, 0.81, 0.85, 0.95};
    enum { NW = sizeof fixed / sizeof fixed[0] + 2 * sizeof fractions / sizeof fractions[0] };
    static const uint64_t ranges[][2] = {{0, 50}, {10, 30}, {49, 50}};
    int separate_seen = 0, joint_seen = 0;
    for (size_t r = 0; r < 3; r++)
        for (size_t si = 0; si < sizeof seqs / sizeof seqs[0]; si++)
            for (size_t wi = 0; wi < NW; wi++) {
                struct mt_gpt_params p = {ranges[r][0], ranges[r][1], seqs[si], 99, -1};
                uint64_t tpe = 0, ndocs = p.seq_end - p.seq_beg;
                for (uint64_t s = p.seq_beg; s < p.seq_end; s++)
                    tpe += (uint64_t)mt_indexed_sequence_length(ix, s);
                size_t nf = sizeof fixed / sizeof fixed[0], fk = wi - nf;
                if (wi < nf) {
                    p.num_samples = fixed[wi];
                } else {
                    /* epochs 2 or 3, the last one used this fraction */
                    uint64_t e = 1 + fk / (sizeof fractions / sizeof fractions[0]);
                    double frac = fractions[fk % (sizeof fractions / sizeof fractions[0])];
                    if (tpe < 2) continue;
                    uint64_t before = (e * tpe - 1) / (uint64_t)p.seq_length;
                    uint64_t per_epoch = (tpe - 1) / (uint64_t)p.seq_length;
                    p.num_samples = (int64_t)(before + (uint64_t)(frac * (double)per_epoch) + 1);
                }
                struct mt_gpt_index g;
                int rc = mt_gpt_index_build(ix, &p, &g, &err);
                if (tpe < 2) {
                    assert_int_equal(rc, MT_EINVAL);
                    continue;
                }
                assert_int_equal(rc, MT_OK);
                uint64_t epochs, n, before;
                bool separate;
                expected_plan(tpe, p.num_samples, p.seq_length, &epochs, &n, &separate, &before);
                assert_int_equal(g.n_doc_idx, epochs * ndocs);
                assert_int_equal(g.n_samples, n);
                if (p.num_samples >= 0) assert_true(g.n_samples >= (uint64_t)p.num_samples);
                /* Every sequence of the split once per epoch; a separate final
                 * epoch is a permutation of its own. */
                uint64_t *count = calloc(ndocs, sizeof *count);
                for (uint64_t i = 0; i < g.n_doc_idx; i++) {
                    assert_true((uint64_t)g.doc_idx[i] >= p.seq_beg &&
                                (uint64_t)g.doc_idx[i] < p.seq_end);
                    count[(uint64_t)g.doc_idx[i] - p.seq_beg]++;
                }
                for (uint64_t d = 0; d < ndocs; d++) assert_int_equal(count[d], epochs);
                if (separate) {
                    memset(count, 0, ndocs * sizeof *count);
                    for (uint64_t i = g.n_doc_idx - ndocs; i < g.n_doc_idx; i++)
                        count[(uint64_t)g.doc_idx[i] - p.seq_beg]++;
                    for (uint64_t d = 0; d < ndocs; d++) assert_int_equal(count[d], 1);
                    check_permutation(g.shuffle_idx, 0, before);
                    check_permutation(g.shuffle_idx, before, g.n_samples);
                    separate_seen++;
                } else {
                    check_permutation(g.shuffle_idx, 0, g.n_samples);
                    if (epochs > 1 && before > 1 && g.n_samples - before > 1) {
                        /* one shuffle over all: the first part is not kept apart */
                        bool mixed = false;
                        for (uint64_t i = 0; i < before; i++)
                            mixed |= g.shuffle_idx[i] >= (int64_t)before;
                        assert_true(mixed);
                        joint_seen++;
                    }
                }
                free(count);
                check_sample_idx(ix, &g, p.seq_length);
                /* Every sample has exactly seq_length+1 tokens. */
                int32_t *buf = malloc(((size_t)p.seq_length + 2) * sizeof *buf);
                for (uint64_t k = 0; k < g.n_samples; k++) {
                    buf[p.seq_length + 1] = -7;
                    assert_int_equal(mt_gpt_sample(ix, &g, p.seq_length, k, 1 << 30, buf, &err),
                                     MT_OK);
                    assert_int_equal(buf[p.seq_length + 1], -7);
                }
                free(buf);
                assert_int_equal(mt_gpt_index_check(ix, &p, &g, &err), MT_OK);
                mt_gpt_index_free(&g);
            }
    /* Both final-epoch rules were exercised. */
    assert_true(separate_seen > 0);
    assert_true(joint_seen > 0);
    mt_indexed_close(ix);
    th_rmtree(dir);
    free(prefix);
    free(dir);
}

/* The shuffles are Fisher-Yates permutations depending only on (key, stream). */
static void shuffle_is_a_seeded_permutation(void **state)
{
    (void)state;
    int64_t a[100], b[100], c[100];
    for (int i = 0; i < 100; i++) a[i] = b[i] = c[i] = i;
    mt_data_shuffle(a, sizeof a[0], 100, 1, 3);
    mt_data_shuffle(b, sizeof b[0], 100, 1, 3);
    mt_data_shuffle(c, sizeof c[0], 100, 2, 3);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    check_permutation(a, 0, 100);
    int fixed = 0;
    for (int i = 0; i < 100; i++) fixed += a[i] == i;
    assert_true(fixed < 10);
}

/* ---- the public API ---- */

struct fixture {
    char *dir, *prefix;
    int lens[100];
    int ndocs;
};

static void make_fixture(struct fixture *f, int ndocs, int lo, int hi)
{
    f->dir = th_tmpdir();
    f->prefix = th_join(f->dir, "/ds");
    f->ndocs = ndocs;
    unsigned x = 11;
    for (int d = 0; d < ndocs; d++) {
        x = x * 1103515245u + 12345u;
        f->lens[d] = lo + (int)((x >> 8) % (unsigned)(hi - lo + 1));
    }
    th_write_dataset(f->prefix, MT_DTYPE_INT32, ndocs, f->lens, 0);
}

static void free_fixture(struct fixture *f)
{
    th_rmtree(f->dir);
    free(f->prefix);
    free(f->dir);
}

/* Samples of a 1-epoch split: seq_length+1 tokens, from the split's documents
 * only, contiguous inside, and chained: each sample's last token is the next
 * one's first. */
static void samples_are_chained_within_split(void **state)
{
    (void)state;
    struct fixture f;
    make_fixture(&f, 100, 5, 60);
    struct mt_config cfg;
    th_config(&cfg, f.prefix);
    snprintf(cfg.data.split, sizeof cfg.data.split, "80,15,5");
    struct mt_data *d = th_open(&cfg);
    const int seq = cfg.training.seq_length;
    static const int range[3][2] = {{0, 80}, {80, 95}, {95, 100}};
    static const uint64_t requested[3] = {40, 24, 8};
    for (int s = 0; s < MT_NUM_SPLITS; s++) {
        uint64_t tpe = 0;
        for (int k = range[s][0]; k < range[s][1]; k++) tpe += (uint64_t)f.lens[k];
        uint64_t n = mt_data_num_samples(d, (enum mt_split)s);
        assert_true(requested[s] * (uint64_t)seq + 1 <= tpe);  /* one epoch */
        assert_int_equal(n, (tpe - 1) / (uint64_t)seq);
        int32_t *first = calloc(100 * 1000, sizeof *first);
        int32_t *last = calloc(100 * 1000, sizeof *last);
        int32_t tok[64];
        for (uint64_t i = 0; i < n; i++) {
            tok[seq + 1] = -7;
            struct mt_err err = {0};
            assert_int_equal(mt_data_get(d, (enum mt_split)s, i, tok, &err), MT_OK);
            assert_int_equal(tok[seq + 1], -7);
            for (int j = 0; j <= seq; j++) {
                int doc = tok[j] / 1000, pos = tok[j] % 1000;
                assert_true(doc >= range[s][0] && doc < range[s][1]);
                assert_true(pos < f.lens[doc]);
                if (j > 0) {
                    int pdoc = tok[j - 1] / 1000, ppos = tok[j - 1] % 1000;
                    if (pdoc == doc && ppos + 1 == pos) continue;
                    assert_int_equal(ppos, f.lens[pdoc] - 1);  /* document boundary */
                    assert_int_equal(pos, 0);
                }
            }
            first[tok[0]]++;
            last[tok[seq]]++;
        }
        int starts = 0, ends = 0;
        for (int t = 0; t < 100 * 1000; t++) {
            assert_true(first[t] <= 1 && last[t] <= 1);
            starts += first[t] && !last[t];
            ends += last[t] && !first[t];
        }
        assert_int_equal(starts, 1);
        assert_int_equal(ends, 1);
        free(first);
        free(last);
    }
    char line[1024];
    mt_data_describe(d, line, sizeof line);
    print_message("# %s\n", line);
    assert_non_null(strstr(line, "100 documents"));
    mt_data_close(d);
    free_fixture(&f);
}

/* Several epochs: every token of the split appears epochs-1 or epochs times. */
static void epochs_repeat_every_document(void **state)
{
    (void)state;
    struct fixture f;
    make_fixture(&f, 20, 5, 30);
    struct mt_config cfg;
    th_config(&cfg, f.prefix);
    snprintf(cfg.data.split, sizeof cfg.data.split, "1,0,0");
    cfg.training.train_iters = 50;  /* 200 samples of 16 = 3200 tokens */
    struct mt_data *d = th_open(&cfg);
    uint64_t tpe = 0;
    for (int k = 0; k < 20; k++) tpe += (uint64_t)f.lens[k];
    uint64_t epochs = (200 * 16 + 1 + tpe - 1) / tpe;
    assert_true(epochs >= 4);
    uint64_t n = mt_data_num_samples(d, MT_SPLIT_TRAIN);
    assert_int_equal(n, (epochs * tpe - 1) / 16);
    assert_int_equal(mt_data_num_samples(d, MT_SPLIT_VALID), 0);
    assert_int_equal(mt_data_num_samples(d, MT_SPLIT_TEST), 0);
    int *count = calloc(20 * 1000, sizeof *count);
    int32_t tok[17];
    struct mt_err err = {0};
    for (uint64_t i = 0; i < n; i++) {
        assert_int_equal(mt_data_get(d, MT_SPLIT_TRAIN, i, tok, &err), MT_OK);
        for (int j = 0; j < 16; j++) count[tok[j]]++;  /* the last token is the next's first */
    }
    for (int doc = 0; doc < 20; doc++)
        for (int pos = 0; pos < f.lens[doc]; pos++) {
            int c = count[1000 * doc + pos];
            assert_true(c == (int)epochs || c == (int)epochs - 1);
        }
    free(count);
    /* A split of weight 0 is absent even though eval samples are requested. */
    assert_int_equal(mt_data_get(d, MT_SPLIT_VALID, 0, tok, &err), MT_EINVAL);
    mt_data_close(d);
    free_fixture(&f);
}

static void deterministic_from_seed(void **state)
{
    (void)state;
    struct fixture f;
    make_fixture(&f, 100, 5, 60);
    struct mt_config cfg;
    th_config(&cfg, f.prefix);
    snprintf(cfg.data.split, sizeof cfg.data.split, "80,15,5");
    struct mt_data *a = th_open(&cfg), *b = th_open(&cfg);
    for (int s = 0; s < MT_NUM_SPLITS; s++)
        assert_true(th_same_samples(a, b, (enum mt_split)s, cfg.training.seq_length));
    cfg.training.seed = 1235;
    struct mt_data *c = th_open(&cfg);
    assert_false(th_same_samples(a, c, MT_SPLIT_TRAIN, cfg.training.seq_length));
    mt_data_close(a);
    mt_data_close(b);
    mt_data_close(c);
    free_fixture(&f);
}

static void sample_counts_follow_megatron(void **state)
{
    (void)state;
    struct mt_config cfg;
    th_config(&cfg, NULL);
    cfg.data.mock_data = true;
    cfg.training.train_iters = 23;
    cfg.training.global_batch_size = 6;
    cfg.training.eval_interval = 5;
    cfg.training.eval_iters = 3;
    struct mt_data *d = th_open(&cfg);
    assert_int_equal(mt_data_num_samples(d, MT_SPLIT_TRAIN), 23 * 6);
    assert_int_equal(mt_data_num_samples(d, MT_SPLIT_VALID), (23 / 5 + 1) * 3 * 6);
    assert_int_equal(mt_data_num_samples(d, MT_SPLIT_TEST), 3 * 6);
    mt_data_close(d);
    cfg.training.eval_iters = 0;
    d = th_open(&cfg);
    assert_int_equal(mt_data_num_samples(d, MT_SPLIT_VALID), 0);
    assert_int_equal(mt_data_num_samples(d, MT_SPLIT_TEST), 0);
    mt_data_close(d);
}

static void mock_data_is_deterministic(void **state)
{
    (void)state;
    struct mt_config cfg;
    th_config(&cfg, NULL);
    cfg.data.mock_data = true;
    cfg.model.vocab_size = 50;
    struct mt_data *a = th_open(&cfg), *b = th_open(&cfg);
    for (int s = 0; s < MT_NUM_SPLITS; s++)
        assert_true(th_same_samples(a, b, (enum mt_split)s, cfg.training.seq_length));
    int32_t t0[17], t1[17], tv[17];
    struct mt_err err = {0};
    int hist[50] = {0};
    for (uint64_t i = 0; i < mt_data_num_samples(a, MT_SPLIT_TRAIN); i++) {
        assert_int_equal(mt_data_get(a, MT_SPLIT_TRAIN, i, t0, &err), MT_OK);
        for (int j = 0; j < 17; j++) {
            assert_true(t0[j] >= 0 && t0[j] < 50);
            hist[t0[j]]++;
        }
    }
    int used = 0;
    for (int v = 0; v < 50; v++) used += hist[v] > 0;
    assert_true(used > 40);  /* 680 draws cover the vocabulary */
    assert_int_equal(mt_data_get(a, MT_SPLIT_TRAIN, 0, t0, &err), MT_OK);
    assert_int_equal(mt_data_get(a, MT_SPLIT_TRAIN, 1, t1, &err), MT_OK);
    assert_int_equal(mt_data_get(a, MT_SPLIT_VALID, 0, tv, &err), MT_OK);
    assert_memory_not_equal(t0, t1, sizeof t0);
    assert_memory_not_equal(t0, tv, sizeof t0);
    cfg.training.seed = 7;
    struct mt_data *c = th_open(&cfg);
    assert_false(th_same_samples(a, c, MT_SPLIT_TRAIN, cfg.training.seq_length));
    char line[256];
    mt_data_describe(a, line, sizeof line);
    assert_non_null(strstr(line, "mock"));
    mt_data_close(a);
    mt_data_close(b);
    mt_data_close(c);
}

static void empty_split_is_an_error(void **state)
{
    (void)state;
    struct fixture f;
    make_fixture(&f, 10, 20, 40);
    struct mt_config cfg;
    th_config(&cfg, f.prefix);  /* 969,30,1 of 10 documents: valid [10,10) */
    struct mt_data *d = NULL;
    struct mt_err err = {0};
    assert_int_equal(mt_data_open(&cfg, &d, &err), MT_EINVAL);
    assert_null(d);
    print_message("# %s\n", err.msg);
    assert_non_null(strstr(err.msg, "valid split is empty"));
    assert_non_null(strstr(err.msg, f.prefix));
    assert_non_null(strstr(err.msg, "24 valid samples"));
    /* Without eval samples requested, the empty splits are not built. */
    cfg.training.eval_iters = 0;
    d = th_open(&cfg);
    assert_true(mt_data_num_samples(d, MT_SPLIT_TRAIN) >= 40);
    mt_data_close(d);
    /* A malformed split string. */
    snprintf(cfg.data.split, sizeof cfg.data.split, "90,x,10");
    assert_int_equal(mt_data_open(&cfg, &d, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "&data split = '90,x,10'"));
    assert_non_null(strstr(err.msg, "'x' is not a number"));
    snprintf(cfg.data.split, sizeof cfg.data.split, "1e308,1e308,1");
    assert_int_equal(mt_data_open(&cfg, &d, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "the values sum to more than the largest number"));
    snprintf(cfg.data.split, sizeof cfg.data.split, "0,0,0");
    assert_int_equal(mt_data_open(&cfg, &d, &err), MT_EINVAL);
    snprintf(cfg.data.split, sizeof cfg.data.split, "1,1,1,1");
    assert_int_equal(mt_data_open(&cfg, &d, &err), MT_EINVAL);
    /* No data at all. */
    th_config(&cfg, NULL);
    assert_int_equal(mt_data_open(&cfg, &d, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "mock_data"));
    free_fixture(&f);
}

static void get_checks_index_and_vocab(void **state)
{
    (void)state;
    struct fixture f;
    make_fixture(&f, 50, 5, 30);
    struct mt_config cfg;
    th_config(&cfg, f.prefix);
    snprintf(cfg.data.split, sizeof cfg.data.split, "1,0,0");
    cfg.model.vocab_size = 30000;  /* documents 30.. hold tokens >= 30000 */
    struct mt_data *d = th_open(&cfg);
    int32_t tok[17];
    struct mt_err err = {0};
    uint64_t n = mt_data_num_samples(d, MT_SPLIT_TRAIN);
    assert_int_equal(mt_data_get(d, MT_SPLIT_TRAIN, n, tok, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "out of range"));
    int failures = 0;
    for (uint64_t i = 0; i < n; i++) {
        int rc = mt_data_get(d, MT_SPLIT_TRAIN, i, tok, &err);
        if (rc == MT_OK) continue;
        assert_int_equal(rc, MT_ECORRUPT);
        assert_non_null(strstr(err.msg, "ds.bin"));
        const char *at = strstr(err.msg, "of document ");
        assert_non_null(at);
        assert_true(atoi(at + strlen("of document ")) >= 30);  /* documents 30..49 */
        assert_non_null(strstr(err.msg, "vocabulary"));
        failures++;
    }
    assert_true(failures > 0);
    mt_data_close(d);
    free_fixture(&f);
}

/* 'sub/ds' is found from the working directory, then under $MOETRAIN_DATADIR;
 * otherwise the error lists every place tried. */
static void relative_paths_are_resolved(void **state)
{
    (void)state;
    char *dir = th_tmpdir();
    char *sub = th_join(dir, "/sub");
    char *elsewhere = th_join(dir, "/elsewhere");
    assert_int_equal(mkdir(sub, 0777), 0);
    assert_int_equal(mkdir(elsewhere, 0777), 0);
    char *prefix = th_join(sub, "/ds");
    th_write_random_dataset(prefix, 40, 10, 40, 3, 0);
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    const char *old_env = getenv("MOETRAIN_DATADIR");
    char *saved_env = old_env ? strdup(old_env) : NULL;
    struct mt_config cfg;
    th_config(&cfg, "sub/ds");
    snprintf(cfg.data.split, sizeof cfg.data.split, "1,0,0");

    assert_int_equal(chdir(dir), 0);
    unsetenv("MOETRAIN_DATADIR");
    struct mt_data *d = th_open(&cfg);
    mt_data_close(d);

    assert_int_equal(chdir(elsewhere), 0);
    setenv("MOETRAIN_DATADIR", dir, 1);
    d = th_open(&cfg);
    char line[1024];
    mt_data_describe(d, line, sizeof line);
    assert_non_null(strstr(line, prefix));
    mt_data_close(d);

    struct mt_err err = {0};
    setenv("MOETRAIN_DATADIR", elsewhere, 1);
    assert_int_equal(mt_data_open(&cfg, &d, &err), MT_EINVAL);
    print_message("# %s\n", err.msg);
    assert_non_null(strstr(err.msg, "'sub/ds' not found"));
    assert_non_null(strstr(err.msg, "working directory"));
    char *under_env = th_join(elsewhere, "/sub/ds");
    assert_non_null(strstr(err.msg, under_env));
    assert_non_null(strstr(err.msg, "installed data directory"));
    unsetenv("MOETRAIN_DATADIR");
    assert_int_equal(mt_data_open(&cfg, &d, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "$MOETRAIN_DATADIR is not set"));

    /* Only one of the two files: said so. */
    assert_int_equal(chdir(dir), 0);
    char *bin = th_join(prefix, ".bin");
    unlink(bin);
    assert_int_equal(mt_data_open(&cfg, &d, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "has .idx but no .bin"));

    assert_int_equal(chdir(cwd), 0);
    if (saved_env) setenv("MOETRAIN_DATADIR", saved_env, 1);
    free(saved_env);
    free(bin);
    free(under_env);
    th_rmtree(dir);
    free(prefix);
    free(sub);
    free(elsewhere);
    free(dir);
}

/* Megatron's own layout (several sequences per document, int32) samples too:
 * sampling is over sequences, as Megatron's GPTDataset. */
static void megatron_fixture_samples(void **state)
{
    (void)state;
    const char *src = getenv("MT_TOP_SRCDIR");
    if (!src) skip();
    char *prefix = th_join(src, "/tests/fixtures/data/megatron_int32");
    struct mt_config cfg;
    th_config(&cfg, prefix);
    snprintf(cfg.data.split, sizeof cfg.data.split, "1,0,0");
    cfg.training.seq_length = 8;
    cfg.training.train_iters = 5;
    cfg.model.vocab_size = 9000;
    struct mt_data *d = th_open(&cfg);
    static const int lens[9] = {7, 5, 12, 3, 4, 6, 20, 9, 1};
    int32_t tok[9];
    struct mt_err err = {0};
    for (uint64_t i = 0; i < mt_data_num_samples(d, MT_SPLIT_TRAIN); i++) {
        assert_int_equal(mt_data_get(d, MT_SPLIT_TRAIN, i, tok, &err), MT_OK);
        for (int j = 0; j < 9; j++) assert_true(tok[j] % 1000 < lens[tok[j] / 1000]);
    }
    mt_data_close(d);
    free(prefix);
}

/* The bundled corpus, found through $MOETRAIN_DATADIR (the build tree). */
static void bundled_corpus(void **state)
{
    (void)state;
    const char *dd = getenv("MOETRAIN_DATADIR");
    if (!dd) skip();
    char *idx = th_join(dd, "/corpus/kjv_text_document.idx");
    bool have = access(idx, R_OK) == 0;
    free(idx);
    if (!have) skip();
    struct mt_config cfg;
    th_config(&cfg, "corpus/kjv_text_document");
    cfg.model.vocab_size = MT_BYTE_VOCAB;
    cfg.training.seq_length = 128;
    cfg.training.global_batch_size = 8;
    cfg.training.train_iters = 100;
    cfg.training.eval_interval = 50;
    cfg.training.eval_iters = 10;
    struct mt_data *d = th_open(&cfg);
    char line[1024];
    mt_data_describe(d, line, sizeof line);
    print_message("# %s\n", line);
    assert_non_null(strstr(line, "503 documents"));
    for (int s = 0; s < MT_NUM_SPLITS; s++)
        assert_true(mt_data_num_samples(d, (enum mt_split)s) > 0);
    int32_t tok[129];
    struct mt_err err = {0};
    int eod = 0;
    for (uint64_t i = 0; i < mt_data_num_samples(d, MT_SPLIT_TEST); i++) {
        assert_int_equal(mt_data_get(d, MT_SPLIT_TEST, i, tok, &err), MT_OK);
        for (int j = 0; j < 129; j++) eod += tok[j] == MT_BYTE_EOD;
    }
    /* The test split is the single chapter Malachi 4, over and over. */
    assert_true(eod > 0);
    mt_data_close(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(index_arrays_follow_megatron),
        cmocka_unit_test(shuffle_is_a_seeded_permutation),
        cmocka_unit_test(samples_are_chained_within_split),
        cmocka_unit_test(epochs_repeat_every_document),
        cmocka_unit_test(deterministic_from_seed),
        cmocka_unit_test(sample_counts_follow_megatron),
        cmocka_unit_test(mock_data_is_deterministic),
        cmocka_unit_test(empty_split_is_an_error),
        cmocka_unit_test(get_checks_index_and_vocab),
        cmocka_unit_test(relative_paths_are_resolved),
        cmocka_unit_test(megatron_fixture_samples),
        cmocka_unit_test(bundled_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

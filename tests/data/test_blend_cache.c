/* Blending (Megatron's greedy BlendedDataset) and the index cache: reuse,
 * rebuild on changed inputs, and rejection of damaged files. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "data/data_internal.h"
#include "helpers.h"

#define B_BASE 500000  /* tokens of dataset B start here */

static void set_paths(struct mt_config *cfg, int n, const char *const *items)
{
    for (int i = 0; i < n; i++) snprintf(cfg->data.data_path[i], MT_STR_MAX, "%s", items[i]);
    cfg->data.data_path_len = n;
}

/* Megatron's helpers.cpp on a small case worked by hand. */
static void greedy_blend_by_hand(void **state)
{
    (void)state;
    double w[2] = {0.5, 0.5};
    int16_t di[4];
    int64_t dsi[4];
    mt_blend_build(w, 2, 4, di, dsi);
    static const int16_t want_d[4] = {0, 1, 0, 1};
    static const int64_t want_s[4] = {0, 0, 1, 1};
    assert_memory_equal(di, want_d, sizeof di);
    assert_memory_equal(dsi, want_s, sizeof dsi);

    /* Megatron divides by max(i, 1): samples 0 and 1 are both weighed at 1. */
    double w2[2] = {0.3, 0.7};
    int16_t d2[8];
    int64_t s2[8];
    mt_blend_build(w2, 2, 8, d2, s2);
    static const int16_t want_d2[8] = {1, 0, 1, 1, 0, 1, 1, 0};
    assert_memory_equal(d2, want_d2, sizeof d2);

    double w3[3] = {0.2, 0.3, 0.5};
    int16_t d3[1000];
    int64_t s3[1000];
    mt_blend_build(w3, 3, 1000, d3, s3);
    int64_t c[3] = {0, 0, 0};
    for (int i = 0; i < 1000; i++) {
        assert_int_equal(s3[i], c[d3[i]]);
        c[d3[i]]++;
        for (int k = 0; k < 3; k++)  /* every prefix within a sample of its share */
            assert_true((double)c[k] - w3[k] * (i + 1) < 1.0 + 1e-9 &&
                        w3[k] * (i + 1) - (double)c[k] < 1.0 + 1e-9);
    }
    assert_int_equal(c[0], 200);
    assert_int_equal(c[1], 300);
    assert_int_equal(c[2], 500);
}

struct two {
    char *dir, *a, *b;
};

static void make_two(struct two *t)
{
    t->dir = th_tmpdir();
    t->a = th_join(t->dir, "/a");
    t->b = th_join(t->dir, "/b");
    th_write_random_dataset(t->a, 60, 10, 50, 1, 0);
    th_write_random_dataset(t->b, 90, 10, 50, 2, B_BASE);
}

static void free_two(struct two *t)
{
    th_rmtree(t->dir);
    free(t->a);
    free(t->b);
    free(t->dir);
}

static void weighted_blend_proportions(void **state)
{
    (void)state;
    struct two t;
    make_two(&t);
    struct mt_config cfg;
    th_config(&cfg, NULL);
    snprintf(cfg.data.split, sizeof cfg.data.split, "8,1,1");
    cfg.training.train_iters = 250;  /* 1000 samples */
    const char *items[4] = {"0.3", t.a, "0.7", t.b};
    set_paths(&cfg, 4, items);
    struct mt_data *d = th_open(&cfg);
    assert_int_equal(mt_data_num_samples(d, MT_SPLIT_TRAIN), 300 + 700);
    /* valid (250/5+1)*2*4 = 408: ceil(122.4) + ceil(285.6) */
    assert_int_equal(mt_data_num_samples(d, MT_SPLIT_VALID), 123 + 286);
    int32_t tok[17];
    struct mt_err err = {0};
    int from_a = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        assert_int_equal(mt_data_get(d, MT_SPLIT_TRAIN, i, tok, &err), MT_OK);
        bool a = tok[0] < B_BASE;
        for (int j = 1; j <= 16; j++) assert_int_equal(tok[j] < B_BASE, a);  /* never mixed */
        from_a += a;
        double share = 0.3 * (double)(i + 1);
        assert_true(from_a - share < 1.0 + 1e-9 && share - from_a < 1.0 + 1e-9);
    }
    assert_int_equal(from_a, 300);
    char line[2048];
    mt_data_describe(d, line, sizeof line);
    print_message("# %s\n", line);
    assert_non_null(strstr(line, "0.3*"));

    /* One element holding weights and prefixes separated by blanks is the same. */
    char joined[MT_STR_MAX];
    snprintf(joined, sizeof joined, " 0.3  %s\t0.7 %s ", t.a, t.b);
    const char *one[1] = {joined};
    set_paths(&cfg, 1, one);
    struct mt_data *d2 = th_open(&cfg);
    int32_t t2[17];
    for (uint64_t i = 0; i < 1000; i += 37) {
        assert_int_equal(mt_data_get(d, MT_SPLIT_TRAIN, i, tok, &err), MT_OK);
        assert_int_equal(mt_data_get(d2, MT_SPLIT_TRAIN, i, t2, &err), MT_OK);
        assert_memory_equal(tok, t2, sizeof tok);
    }
    mt_data_close(d);
    mt_data_close(d2);
    free_two(&t);
}

/* Prefixes without weights: one epoch of each, blended by their sizes. */
static void unweighted_blend(void **state)
{
    (void)state;
    struct two t;
    make_two(&t);
    struct mt_config cfg;
    th_config(&cfg, NULL);
    snprintf(cfg.data.split, sizeof cfg.data.split, "1,0,0");
    cfg.training.train_iters = 10000;  /* more than one epoch of both */
    const char *items[2] = {t.a, t.b};
    set_paths(&cfg, 2, items);
    struct mt_data *d = th_open(&cfg);
    struct mt_indexed *ia, *ib;
    struct mt_err err = {0};
    assert_int_equal(mt_indexed_open(t.a, &ia, &err), MT_OK);
    assert_int_equal(mt_indexed_open(t.b, &ib, &err), MT_OK);
    uint64_t na = (mt_indexed_num_tokens(ia) - 1) / 16, nb = (mt_indexed_num_tokens(ib) - 1) / 16;
    uint64_t n = mt_data_num_samples(d, MT_SPLIT_TRAIN);
    assert_int_equal(n, na + nb);  /* capped at one epoch each */
    int32_t tok[17];
    uint64_t from_a = 0;
    for (uint64_t i = 0; i < n; i++) {
        assert_int_equal(mt_data_get(d, MT_SPLIT_TRAIN, i, tok, &err), MT_OK);
        from_a += tok[0] < B_BASE;
    }
    assert_int_equal(from_a, na);
    mt_indexed_close(ia);
    mt_indexed_close(ib);
    mt_data_close(d);
    free_two(&t);
}

static void blend_errors(void **state)
{
    (void)state;
    struct two t;
    make_two(&t);
    struct mt_config cfg;
    th_config(&cfg, NULL);
    struct mt_data *d = NULL;
    struct mt_err err = {0};
    const char *mixed[4] = {"0.3", t.a, t.b, t.b};
    set_paths(&cfg, 4, mixed);
    assert_int_equal(mt_data_open(&cfg, &d, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "mixes weights and prefixes"));
    const char *zero[4] = {"0", t.a, "1", t.b};
    set_paths(&cfg, 4, zero);
    assert_int_equal(mt_data_open(&cfg, &d, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "positive"));
    /* Weights that overflow when summed are blamed on the weights, not the split. */
    const char *huge[4] = {"1e308", t.a, "1e308", t.b};
    set_paths(&cfg, 4, huge);
    assert_int_equal(mt_data_open(&cfg, &d, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "the blend weights sum to more than the largest number"));
    const char *inf[4] = {"1e309", t.a, "1", t.b};
    set_paths(&cfg, 4, inf);
    assert_int_equal(mt_data_open(&cfg, &d, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "'1e309': the weight of dataset"));
    assert_non_null(strstr(err.msg, "is not a finite number"));
    const char *missing[4] = {"1", t.a, "1", "no/such/prefix"};
    set_paths(&cfg, 4, missing);
    assert_int_equal(mt_data_open(&cfg, &d, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "no/such/prefix"));
    assert_null(d);
    free_two(&t);
}

/* ---- cache ---- */

static int count_files(const char *dir, const char *needle)
{
    DIR *dp = opendir(dir);
    if (!dp) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dp)))
        if (strstr(e->d_name, needle)) n++;
    closedir(dp);
    return n;
}

/* Applies edit() to every cache file of the directory. */
static void for_each_cache_file(const char *dir, void (*edit)(const char *path))
{
    DIR *dp = opendir(dir);
    assert_non_null(dp);
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (!strstr(e->d_name, ".mtidx")) continue;
        char *p = th_join(dir, "/");
        char *path = th_join(p, e->d_name);
        edit(path);
        free(p);
        free(path);
    }
    closedir(dp);
}

static void flip_middle_byte(const char *path)
{
    size_t n;
    unsigned char *img = th_read_file(path, &n);
    img[n / 2 + 3] ^= 0x40;
    th_write_file(path, img, n);
    free(img);
}

static void truncate_file(const char *path)
{
    size_t n;
    unsigned char *img = th_read_file(path, &n);
    th_write_file(path, img, n - 9);
    free(img);
}

static void garbage_file(const char *path)
{
    size_t n;
    unsigned char *img = th_read_file(path, &n);
    memset(img, 0x5a, n);
    th_write_file(path, img, n);
    free(img);
}

/* Swaps the first two entries of the shuffle index of a GPT train file: still
 * a permutation, so only the checksum can tell. */
static void swap_shuffle_entries(const char *path)
{
    if (!strstr(path, "gpt-train")) return;
    size_t n;
    unsigned char *img = th_read_file(path, &n);
    uint64_t len, count[3];
    memcpy(&len, img + 16, 8);
    for (int i = 0; i < 3; i++) memcpy(&count[i], img + 24 + len + 16 * i + 8, 8);
    unsigned char *shuffle = img + 24 + len + 48 + 4 * count[0] + 8 * count[1];
    unsigned char t[8];
    memcpy(t, shuffle, 8);
    memcpy(shuffle, shuffle + 8, 8);
    memcpy(shuffle + 8, t, 8);
    th_write_file(path, img, n);
    free(img);
}

/* Rewrites the file with a valid checksum but a shuffle index that repeats a
 * sample: only the semantic check can catch it. */
static void duplicate_shuffle_entry(const char *path)
{
    if (!strstr(path, "gpt-train")) return;
    size_t n;
    unsigned char *img = th_read_file(path, &n);
    uint64_t len;
    memcpy(&len, img + 16, 8);
    char *desc = malloc(len + 1);
    memcpy(desc, img + 24, len);
    desc[len] = '\0';
    free(img);
    struct mt_cache_array a[3] = {{NULL, 4, 0}, {NULL, 8, 0}, {NULL, 8, 0}};
    enum mt_cache_status st;
    char why[256];
    struct mt_err err = {0};
    assert_int_equal(mt_cache_load(path, desc, a, 3, &st, why, sizeof why, &err), MT_OK);
    assert_int_equal(st, MT_CACHE_HIT);
    int64_t *shuffle = a[2].data;
    shuffle[0] = shuffle[1];
    char *dir = strdup(path);
    *strrchr(dir, '/') = '\0';
    assert_int_equal(mt_cache_store(dir, path, desc, a, 3, &err), MT_OK);
    for (int i = 0; i < 3; i++) free(a[i].data);
    free(dir);
    free(desc);
}

static void expect_stats(struct mt_data *d, unsigned loaded, unsigned built, unsigned rejected)
{
    struct mt_data_cache_stats st;
    mt_data_cache_stats(d, &st);
    print_message("# cache: %u loaded, %u built, %u rejected\n", st.loaded, st.built, st.rejected);
    assert_int_equal(st.loaded, loaded);
    assert_int_equal(st.built, built);
    assert_int_equal(st.rejected, rejected);
}

static void cache_is_reused_and_rebuilt(void **state)
{
    (void)state;
    char *dir = th_tmpdir();
    char *prefix = th_join(dir, "/ds"), *cache = th_join(dir, "/cache/nested");
    th_write_random_dataset(prefix, 200, 5, 60, 5, 0);
    struct mt_config cfg;
    th_config(&cfg, prefix);
    snprintf(cfg.data.split, sizeof cfg.data.split, "90,5,5");
    struct mt_data *ref = th_open(&cfg);  /* no cache */
    expect_stats(ref, 0, 3, 0);
    snprintf(cfg.data.data_cache_path, MT_STR_MAX, "%s", cache);

    struct mt_data *d = th_open(&cfg);
    expect_stats(d, 0, 3, 0);
    assert_int_equal(count_files(cache, ".mtidx"), 3);
    assert_int_equal(count_files(cache, ".tmp"), 0);
    mt_data_close(d);
    d = th_open(&cfg);
    expect_stats(d, 3, 0, 0);
    assert_true(th_same_samples(d, ref, MT_SPLIT_TRAIN, cfg.training.seq_length));
    char line[2048];
    mt_data_describe(d, line, sizeof line);
    assert_non_null(strstr(line, "3 loaded"));
    mt_data_close(d);

    /* Inputs change: other seed, other sequence length, other split: new files. */
    cfg.training.seed = 99;
    d = th_open(&cfg);
    expect_stats(d, 0, 3, 0);
    assert_false(th_same_samples(d, ref, MT_SPLIT_TRAIN, cfg.training.seq_length));
    mt_data_close(d);
    cfg.training.seed = 1234;
    snprintf(cfg.data.split, sizeof cfg.data.split, "80,10,10");
    d = th_open(&cfg);
    expect_stats(d, 0, 3, 0);
    mt_data_close(d);
    snprintf(cfg.data.split, sizeof cfg.data.split, "90,5,5");
    cfg.training.train_iters = 11;
    d = th_open(&cfg);
    expect_stats(d, 2, 1, 0);  /* only the train request changed */
    mt_data_close(d);
    cfg.training.train_iters = 10;

    /* The dataset is rewritten (same name and size, new contents and time). */
    th_write_random_dataset(prefix, 200, 5, 60, 5, 0);
    char *idx = th_join(prefix, ".idx");
    struct timespec times[2] = {{0, UTIME_OMIT}, {1000000000, 0}};
    assert_int_equal(utimensat(AT_FDCWD, idx, times, 0), 0);
    d = th_open(&cfg);
    expect_stats(d, 0, 3, 0);
    mt_data_close(d);
    d = th_open(&cfg);
    expect_stats(d, 3, 0, 0);
    mt_data_close(d);

    /* Damaged files are rejected and rebuilt, never used. Start from the
     * current files only. */
    th_rmtree(cache);
    d = th_open(&cfg);
    expect_stats(d, 0, 3, 0);
    mt_data_close(d);
    void (*const damage[])(const char *) = {flip_middle_byte, truncate_file, garbage_file};
    for (size_t k = 0; k < sizeof damage / sizeof damage[0]; k++) {
        for_each_cache_file(cache, damage[k]);
        d = th_open(&cfg);
        expect_stats(d, 0, 3, 3);
        assert_true(th_same_samples(d, ref, MT_SPLIT_TRAIN, cfg.training.seq_length));
        mt_data_close(d);
        d = th_open(&cfg);
        expect_stats(d, 3, 0, 0);
        mt_data_close(d);
    }
    for_each_cache_file(cache, swap_shuffle_entries);
    d = th_open(&cfg);
    expect_stats(d, 2, 1, 1);
    mt_data_describe(d, line, sizeof line);
    assert_non_null(strstr(line, "gpt-train.mtidx: checksum mismatch"));
    assert_true(th_same_samples(d, ref, MT_SPLIT_TRAIN, cfg.training.seq_length));
    mt_data_close(d);
    for_each_cache_file(cache, duplicate_shuffle_entry);
    d = th_open(&cfg);
    expect_stats(d, 2, 1, 1);
    assert_true(th_same_samples(d, ref, MT_SPLIT_TRAIN, cfg.training.seq_length));
    mt_data_close(d);
    assert_int_equal(count_files(cache, ".tmp"), 0);

    /* A cache path that cannot be created is an error that says what to do. */
    char *file = th_join(dir, "/plainfile");
    th_write_file(file, "x", 1);
    char *bad = th_join(file, "/sub");
    snprintf(cfg.data.data_cache_path, MT_STR_MAX, "%s", bad);
    struct mt_err err = {0};
    assert_int_equal(mt_data_open(&cfg, &d, &err), MT_EIO);
    assert_non_null(strstr(err.msg, "data_cache_path"));
    free(file);
    free(bad);

    mt_data_close(ref);
    free(idx);
    th_rmtree(dir);
    free(prefix);
    free(cache);
    free(dir);
}

static void blend_indices_are_cached(void **state)
{
    (void)state;
    struct two t;
    make_two(&t);
    char *cache = th_join(t.dir, "/cache");
    struct mt_config cfg;
    th_config(&cfg, NULL);
    snprintf(cfg.data.split, sizeof cfg.data.split, "8,1,1");
    snprintf(cfg.data.data_cache_path, MT_STR_MAX, "%s", cache);
    const char *items[4] = {"0.3", t.a, "0.7", t.b};
    set_paths(&cfg, 4, items);
    struct mt_data *d = th_open(&cfg);
    expect_stats(d, 0, 9, 0);  /* 2 datasets x 3 splits + 3 blends */
    assert_int_equal(count_files(cache, "-blend-"), 3);
    struct mt_data *e = th_open(&cfg);
    expect_stats(e, 9, 0, 0);
    assert_true(th_same_samples(d, e, MT_SPLIT_TRAIN, cfg.training.seq_length));
    mt_data_close(e);
    /* Other weights: the datasets' sizes and the blend change. */
    const char *other[4] = {"0.5", t.a, "0.5", t.b};
    set_paths(&cfg, 4, other);
    e = th_open(&cfg);
    struct mt_data_cache_stats st;
    mt_data_cache_stats(e, &st);
    assert_true(st.built >= 3);
    assert_false(th_same_samples(d, e, MT_SPLIT_TRAIN, cfg.training.seq_length));
    mt_data_close(e);
    /* A damaged blend file is rebuilt. */
    set_paths(&cfg, 4, items);
    DIR *dp = opendir(cache);
    struct dirent *de;
    while ((de = readdir(dp)))
        if (strstr(de->d_name, "-blend-train")) {
            char *p = th_join(cache, "/"), *path = th_join(p, de->d_name);
            flip_middle_byte(path);
            free(p);
            free(path);
        }
    closedir(dp);
    e = th_open(&cfg);
    expect_stats(e, 8, 1, 1);
    assert_true(th_same_samples(d, e, MT_SPLIT_TRAIN, cfg.training.seq_length));
    mt_data_close(e);
    mt_data_close(d);
    free(cache);
    free_two(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(greedy_blend_by_hand),
        cmocka_unit_test(weighted_blend_proportions),
        cmocka_unit_test(unweighted_blend),
        cmocka_unit_test(blend_errors),
        cmocka_unit_test(cache_is_reused_and_rebuilt),
        cmocka_unit_test(blend_indices_are_cached),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

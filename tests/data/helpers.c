#include "helpers.h"

#include <stdarg.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <unistd.h>

#include <cmocka.h>

char *th_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char *t = th_join(base && *base ? base : "/tmp", "/mt-data-test-XXXXXX");
    assert_non_null(mkdtemp(t));
    return t;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st; (void)flag; (void)ftw;
    remove(path);
    return 0;
}

void th_rmtree(const char *dir)
{
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void th_write_dataset(const char *prefix, enum mt_token_dtype dtype, int ndocs, const int *lens,
                      int32_t base)
{
    struct mt_err err = {0};
    struct mt_indexed_writer *w;
    assert_int_equal(mt_indexed_writer_open(prefix, dtype, &w, &err), MT_OK);
    for (int d = 0; d < ndocs; d++) {
        int32_t *t = malloc(((size_t)lens[d] + 1) * sizeof *t);
        assert_non_null(t);
        for (int j = 0; j < lens[d]; j++) t[j] = TH_TOKEN(base, d, j);
        assert_int_equal(mt_indexed_writer_add(w, t, (size_t)lens[d], &err), MT_OK);
        free(t);
    }
    int rc = mt_indexed_writer_finish(w, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, MT_OK);
}

void th_write_random_dataset(const char *prefix, int ndocs, int lo, int hi, unsigned seed,
                             int32_t base)
{
    int *lens = malloc((size_t)ndocs * sizeof *lens);
    assert_non_null(lens);
    unsigned x = seed;
    for (int d = 0; d < ndocs; d++) {
        x = x * 1103515245u + 12345u;
        lens[d] = lo + (int)((x >> 8) % (unsigned)(hi - lo + 1));
    }
    th_write_dataset(prefix, MT_DTYPE_INT32, ndocs, lens, base);
    free(lens);
}

void th_config(struct mt_config *cfg, const char *data_path)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->model.vocab_size = 1 << 30;
    cfg->training.micro_batch_size = 1;
    cfg->training.global_batch_size = 4;
    cfg->training.seq_length = 16;
    cfg->training.train_iters = 10;
    cfg->training.seed = 1234;
    cfg->training.eval_interval = 5;
    cfg->training.eval_iters = 2;
    snprintf(cfg->data.split, sizeof cfg->data.split, "969,30,1");
    if (data_path) {
        snprintf(cfg->data.data_path[0], MT_STR_MAX, "%s", data_path);
        cfg->data.data_path_len = 1;
    }
}

void th_write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

void *th_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)len + 1);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return p;
}

char *th_join(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 1);
    assert_non_null(s);
    memcpy(s, a, na);
    memcpy(s + na, b, nb + 1);
    return s;
}

struct mt_data *th_open(const struct mt_config *cfg)
{
    struct mt_data *d = NULL;
    struct mt_err err = {0};
    int rc = mt_data_open(cfg, &d, &err);
    if (rc) fprintf(stderr, "mt_data_open: %s\n", err.msg);
    assert_int_equal(rc, MT_OK);
    return d;
}

bool th_same_samples(struct mt_data *a, struct mt_data *b, enum mt_split s, int seq_length)
{
    uint64_t n = mt_data_num_samples(a, s);
    if (n != mt_data_num_samples(b, s)) return false;
    size_t bytes = ((size_t)seq_length + 1) * sizeof(int32_t);
    int32_t *ta = malloc(bytes), *tb = malloc(bytes);
    assert_true(ta && tb);
    struct mt_err err = {0};
    bool same = true;
    for (uint64_t i = 0; same && i < n; i++) {
        assert_int_equal(mt_data_get(a, s, i, ta, &err), MT_OK);
        assert_int_equal(mt_data_get(b, s, i, tb, &err), MT_OK);
        same = memcmp(ta, tb, bytes) == 0;
    }
    free(ta);
    free(tb);
    return same;
}

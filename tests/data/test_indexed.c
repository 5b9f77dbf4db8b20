/* Indexed dataset files: writer/reader round trip in every dtype, Megatron's
 * own layout (fixture), and every validation failure on crafted files. */
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

#include "helpers.h"

static const int lens3[3] = {5, 0, 7};

static void roundtrip_every_dtype(void **state)
{
    (void)state;
    char *dir = th_tmpdir();
    char *prefix = th_join(dir, "/ds");
    /* Small tokens, so that every dtype (int8 included) holds them. */
    for (int code = 1; code <= 8; code++) {
        struct mt_err err = {0};
        struct mt_indexed_writer *w;
        assert_int_equal(mt_indexed_writer_open(prefix, (enum mt_token_dtype)code, &w, &err), MT_OK);
        for (int d = 0; d < 3; d++) {
            int32_t t[8];
            for (int j = 0; j < lens3[d]; j++) t[j] = 10 * d + j + 1;
            assert_int_equal(mt_indexed_writer_add(w, t, (size_t)lens3[d], &err), MT_OK);
        }
        assert_int_equal(mt_indexed_writer_documents(w), 3);
        assert_int_equal(mt_indexed_writer_finish(w, &err), MT_OK);

        struct mt_indexed *ix;
        int rc = mt_indexed_open(prefix, &ix, &err);
        if (rc) fprintf(stderr, "%s\n", err.msg);
        assert_int_equal(rc, MT_OK);
        assert_int_equal(mt_indexed_dtype(ix), code);
        assert_int_equal(mt_indexed_num_sequences(ix), 3);
        assert_int_equal(mt_indexed_num_documents(ix), 3);
        assert_int_equal(mt_indexed_num_tokens(ix), 12);
        for (int d = 0; d < 3; d++) {
            assert_int_equal(mt_indexed_sequence_length(ix, (uint64_t)d), lens3[d]);
            assert_int_equal(mt_indexed_document_of(ix, (uint64_t)d), d);
            int32_t got[8];
            assert_int_equal(mt_indexed_read(ix, (uint64_t)d, 0, (uint64_t)lens3[d], 100, got,
                                             &err), MT_OK);
            for (int j = 0; j < lens3[d]; j++) assert_int_equal(got[j], 10 * d + j + 1);
        }
        /* A partial read at an offset. */
        int32_t part[3];
        assert_int_equal(mt_indexed_read(ix, 2, 3, 3, 100, part, &err), MT_OK);
        assert_int_equal(part[0], 24);
        assert_int_equal(part[2], 26);
        /* Past the end of the sequence. */
        assert_int_equal(mt_indexed_read(ix, 2, 5, 3, 100, part, &err), MT_EINVAL);
        mt_indexed_close(ix);
    }
    th_rmtree(dir);
    free(prefix);
    free(dir);
}

/* The fixture written by make_megatron_fixture.py: 5 documents of several
 * int32 sequences each; token j of sequence s is 1000 s + j. */
static void megatron_fixture_loads(void **state)
{
    (void)state;
    const char *src = getenv("MT_TOP_SRCDIR");
    if (!src) skip();
    char *prefix = th_join(src, "/tests/fixtures/data/megatron_int32");
    struct mt_indexed *ix;
    struct mt_err err = {0};
    int rc = mt_indexed_open(prefix, &ix, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, MT_OK);
    static const int lens[9] = {7, 5, 12, 3, 4, 6, 20, 9, 1};
    static const int doc_of[9] = {0, 0, 1, 2, 2, 2, 3, 4, 4};
    assert_int_equal(mt_indexed_dtype(ix), MT_DTYPE_INT32);
    assert_int_equal(mt_indexed_num_sequences(ix), 9);
    assert_int_equal(mt_indexed_num_documents(ix), 5);
    assert_int_equal(mt_indexed_num_tokens(ix), 67);
    for (int s = 0; s < 9; s++) {
        assert_int_equal(mt_indexed_sequence_length(ix, (uint64_t)s), lens[s]);
        assert_int_equal(mt_indexed_document_of(ix, (uint64_t)s), doc_of[s]);
        int32_t got[20];
        assert_int_equal(mt_indexed_read(ix, (uint64_t)s, 0, (uint64_t)lens[s], 10000, got, &err),
                         MT_OK);
        for (int j = 0; j < lens[s]; j++) assert_int_equal(got[j], 1000 * s + j);
    }
    mt_indexed_close(ix);
    free(prefix);
}

/* ---- corrupt files ---- */

struct corrupt_case {
    const char *name;
    const char *file;      /* "idx" or "bin" */
    /* edits the file image in place; may change *n */
    void (*edit)(unsigned char *p, size_t *n);
    const char *expect;    /* substring of the message */
};

static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static void put_i64(unsigned char *p, int64_t v) { memcpy(p, &v, 8); }
static void put_i32(unsigned char *p, int32_t v) { memcpy(p, &v, 4); }
static uint64_t get_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* Offsets in the index of the 3-sequence dataset used below. */
#define NSEQ 3
#define OFF_LEN 34
#define OFF_PTR (34 + 4 * NSEQ)
#define OFF_DOC (34 + 12 * NSEQ)

static void cut_header(unsigned char *p, size_t *n) { *n = 20; }
static void cut_empty(unsigned char *p, size_t *n) { *n = 0; }
static void cut_arrays(unsigned char *p, size_t *n) { *n -= 8; }
static void bad_magic(unsigned char *p, size_t *n) { p[0] = 'X'; }
static void bad_version(unsigned char *p, size_t *n) { put_u64(p + 9, 2); }
static void bad_dtype(unsigned char *p, size_t *n) { p[17] = 9; }
static void more_sequences(unsigned char *p, size_t *n) { put_u64(p + 18, get_u64(p + 18) + 1); }
static void fewer_doc_indices(unsigned char *p, size_t *n) { put_u64(p + 26, get_u64(p + 26) - 1); }
static void pointer_out_of_range(unsigned char *p, size_t *n) { put_i64(p + OFF_PTR + 8 * 2, 1 << 20); }
static void pointer_backwards(unsigned char *p, size_t *n) { put_i64(p + OFF_PTR + 8 * 2, 0); }
static void pointer_negative(unsigned char *p, size_t *n) { put_i64(p + OFF_PTR, -4); }
static void length_longer(unsigned char *p, size_t *n) { put_i32(p + OFF_LEN + 4 * 2, 8); }
static void length_shorter(unsigned char *p, size_t *n) { put_i32(p + OFF_LEN + 4 * 2, 6); }
static void length_negative(unsigned char *p, size_t *n) { put_i32(p + OFF_LEN, -1); }
static void docs_not_from_zero(unsigned char *p, size_t *n) { put_i64(p + OFF_DOC, 1); }
static void docs_wrong_end(unsigned char *p, size_t *n) { put_i64(p + OFF_DOC + 8 * NSEQ, NSEQ - 1); }
static void docs_decreasing(unsigned char *p, size_t *n)
{
    put_i64(p + OFF_DOC + 8, 2);
    put_i64(p + OFF_DOC + 16, 1);
}
static void bin_truncated(unsigned char *p, size_t *n) { *n -= 3; }
static void bin_longer(unsigned char *p, size_t *n) { *n += 4; }

static const struct corrupt_case cases[] = {
    {"truncated header", "idx", cut_header, "truncated header"},
    {"empty index", "idx", cut_empty, "truncated header"},
    {"truncated arrays", "idx", cut_arrays, "truncated file"},
    {"wrong magic", "idx", bad_magic, "bad magic"},
    {"wrong version", "idx", bad_version, "version 2"},
    {"unknown dtype", "idx", bad_dtype, "dtype code 9"},
    {"sequence count too large", "idx", more_sequences, "truncated file"},
    {"document count mismatch", "idx", fewer_doc_indices, "lengths mismatch"},
    {"pointer out of range", "idx", pointer_out_of_range, "beyond the end"},
    {"pointer not increasing", "idx", pointer_backwards, "pointers must increase"},
    {"pointer negative", "idx", pointer_negative, "negative pointer"},
    {"length past the .bin", "idx", length_longer, "beyond the end"},
    {"lengths do not cover the .bin", "idx", length_shorter, "do not belong together"},
    {"negative length", "idx", length_negative, "negative length"},
    {"document indices not from 0", "idx", docs_not_from_zero, "start with 0"},
    {"document indices wrong end", "idx", docs_wrong_end, "last document index"},
    {"document indices decreasing", "idx", docs_decreasing, "decrease"},
    {"truncated .bin", "bin", bin_truncated, "truncated .bin"},
    {"trailing bytes in .bin", "bin", bin_longer, "do not belong together"},
};

static void every_corruption_is_reported(void **state)
{
    (void)state;
    char *dir = th_tmpdir();
    char *good = th_join(dir, "/good"), *bad = th_join(dir, "/bad");
    static const int lens[NSEQ] = {4, 6, 7};
    th_write_dataset(good, MT_DTYPE_UINT16, NSEQ, lens, 0);
    char *paths[2][2];
    static const char *const ext[2] = {".idx", ".bin"};
    for (int i = 0; i < 2; i++) {
        paths[i][0] = th_join(good, ext[i]);
        paths[i][1] = th_join(bad, ext[i]);
    }
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n[2];
        unsigned char *img[2];
        for (int i = 0; i < 2; i++) {
            img[i] = th_read_file(paths[i][0], &n[i]);
            img[i] = realloc(img[i], n[i] + 64);
            memset(img[i] + n[i], 0, 64);
        }
        int which = strcmp(cases[c].file, "idx") == 0 ? 0 : 1;
        cases[c].edit(img[which], &n[which]);
        for (int i = 0; i < 2; i++) {
            th_write_file(paths[i][1], img[i], n[i]);
            free(img[i]);
        }
        struct mt_indexed *ix = (struct mt_indexed *)1;
        struct mt_err err = {0};
        int rc = mt_indexed_open(bad, &ix, &err);
        print_message("# %s: %s\n", cases[c].name, err.msg);
        assert_int_equal(rc, MT_ECORRUPT);
        assert_null(ix);
        assert_non_null(strstr(err.msg, cases[c].expect));
        assert_true(strstr(err.msg, "bad.idx") || strstr(err.msg, "bad.bin"));
        assert_non_null(strstr(err.msg, "re-run moetrain-preprocess"));
    }
    /* A missing .bin is an I/O error naming it. */
    unlink(paths[1][1]);
    struct mt_indexed *ix;
    struct mt_err err = {0};
    assert_int_equal(mt_indexed_open(bad, &ix, &err), MT_EIO);
    assert_non_null(strstr(err.msg, "bad.bin"));
    for (int i = 0; i < 2; i++) {
        free(paths[i][0]);
        free(paths[i][1]);
    }
    th_rmtree(dir);
    free(good);
    free(bad);
    free(dir);
}

/* Tokens outside the vocabulary are caught when read, naming file and document. */
static void token_outside_vocab(void **state)
{
    (void)state;
    char *dir = th_tmpdir();
    char *prefix = th_join(dir, "/ds");
    static const int lens[3] = {3, 3, 3};
    th_write_dataset(prefix, MT_DTYPE_UINT16, 3, lens, 0);  /* doc 2 holds 2000..2002 */
    struct mt_indexed *ix;
    struct mt_err err = {0};
    assert_int_equal(mt_indexed_open(prefix, &ix, &err), MT_OK);
    int32_t got[3];
    assert_int_equal(mt_indexed_read(ix, 1, 0, 3, 2000, got, &err), MT_OK);
    assert_int_equal(mt_indexed_read(ix, 2, 0, 3, 2000, got, &err), MT_ECORRUPT);
    assert_non_null(strstr(err.msg, "ds.bin"));
    assert_non_null(strstr(err.msg, "token 2000"));
    assert_non_null(strstr(err.msg, "document 2"));
    assert_non_null(strstr(err.msg, "vocab_size"));
    mt_indexed_close(ix);

    /* Negative int16 tokens and non-integral floats are refused too. */
    struct mt_indexed_writer *w;
    int32_t neg[2] = {5, -3};
    assert_int_equal(mt_indexed_writer_open(prefix, MT_DTYPE_INT16, &w, &err), MT_OK);
    assert_int_equal(mt_indexed_writer_add(w, neg, 2, &err), MT_OK);
    assert_int_equal(mt_indexed_writer_finish(w, &err), MT_OK);
    assert_int_equal(mt_indexed_open(prefix, &ix, &err), MT_OK);
    assert_int_equal(mt_indexed_read(ix, 0, 0, 2, 100, got, &err), MT_ECORRUPT);
    assert_non_null(strstr(err.msg, "token -3"));
    mt_indexed_close(ix);

    int32_t one[1] = {7};
    assert_int_equal(mt_indexed_writer_open(prefix, MT_DTYPE_FLOAT32, &w, &err), MT_OK);
    assert_int_equal(mt_indexed_writer_add(w, one, 1, &err), MT_OK);
    assert_int_equal(mt_indexed_writer_finish(w, &err), MT_OK);
    char *bin = th_join(prefix, ".bin");
    float half = 7.5f;
    th_write_file(bin, &half, 4);
    assert_int_equal(mt_indexed_open(prefix, &ix, &err), MT_OK);
    assert_int_equal(mt_indexed_read(ix, 0, 0, 1, 100, got, &err), MT_ECORRUPT);
    assert_non_null(strstr(err.msg, "non-integer float32"));
    mt_indexed_close(ix);
    free(bin);
    th_rmtree(dir);
    free(prefix);
    free(dir);
}

static bool exists(const char *prefix, const char *ext)
{
    char *p = th_join(prefix, ext);
    bool e = access(p, F_OK) == 0;
    free(p);
    return e;
}

/* Output appears only at finish, all at once; abort leaves nothing behind. */
static void writer_is_atomic(void **state)
{
    (void)state;
    char *dir = th_tmpdir();
    char *prefix = th_join(dir, "/ds");
    struct mt_err err = {0};
    struct mt_indexed_writer *w;
    int32_t t[4] = {1, 2, 3, 4};

    assert_int_equal(mt_indexed_writer_open(prefix, MT_DTYPE_UINT16, &w, &err), MT_OK);
    assert_int_equal(mt_indexed_writer_add(w, t, 4, &err), MT_OK);
    assert_false(exists(prefix, ".bin"));
    assert_false(exists(prefix, ".idx"));
    mt_indexed_writer_abort(w);
    assert_false(exists(prefix, ".bin.tmp"));
    assert_false(exists(prefix, ".bin"));

    static const int lens[1] = {4};
    th_write_dataset(prefix, MT_DTYPE_UINT16, 1, lens, 0);
    /* A second writer does not disturb the published pair until it finishes. */
    assert_int_equal(mt_indexed_writer_open(prefix, MT_DTYPE_UINT16, &w, &err), MT_OK);
    assert_int_equal(mt_indexed_writer_add(w, t, 2, &err), MT_OK);
    assert_int_equal(mt_indexed_writer_add(w, t, 3, &err), MT_OK);
    struct mt_indexed *ix;
    assert_int_equal(mt_indexed_open(prefix, &ix, &err), MT_OK);
    assert_int_equal(mt_indexed_num_sequences(ix), 1);
    mt_indexed_close(ix);
    assert_int_equal(mt_indexed_writer_finish(w, &err), MT_OK);
    assert_false(exists(prefix, ".bin.tmp"));
    assert_false(exists(prefix, ".idx.tmp"));
    assert_int_equal(mt_indexed_open(prefix, &ix, &err), MT_OK);
    assert_int_equal(mt_indexed_num_sequences(ix), 2);
    mt_indexed_close(ix);

    /* A token that does not fit the dtype is refused. */
    int32_t big[1] = {300};
    assert_int_equal(mt_indexed_writer_open(prefix, MT_DTYPE_UINT8, &w, &err), MT_OK);
    assert_int_equal(mt_indexed_writer_add(w, big, 1, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "uint8"));
    mt_indexed_writer_abort(w);
    /* An unwritable place is an I/O error naming the file. */
    assert_int_equal(mt_indexed_writer_open("/nonexistent-dir/x", MT_DTYPE_UINT16, &w, &err),
                     MT_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent-dir/x.bin.tmp"));
    th_rmtree(dir);
    free(prefix);
    free(dir);
}

/* A .bin truncated or rewritten in place while a run reads it is an error naming the
 * file and the fix (atomic replacement), never a SIGBUS; a .bin replaced atomically
 * (renamed over) leaves the open dataset reading the files it opened. */
static void bin_changed_during_run(void **state)
{
    (void)state;
    char *dir = th_tmpdir();
    char *prefix = th_join(dir, "/ds");
    char *bin = th_join(prefix, ".bin");
    static const int lens[3] = {700, 5, 900};  /* more than a page of int32 tokens */
    th_write_dataset(prefix, MT_DTYPE_INT32, 3, lens, 7);
    struct mt_err err = {0};
    struct mt_indexed *ix;
    assert_int_equal(mt_indexed_open(prefix, &ix, &err), MT_OK);
    int32_t got[900];
    assert_int_equal(mt_indexed_read(ix, 2, 0, 900, 1 << 20, got, &err), MT_OK);
    assert_int_equal(got[899], TH_TOKEN(7, 2, 899));

    /* Truncated to nothing: the next read fails with the file and the fix. */
    assert_int_equal(truncate(bin, 0), 0);
    assert_int_equal(mt_indexed_read(ix, 2, 0, 900, 1 << 20, got, &err), MT_ECORRUPT);
    print_message("# %s\n", err.msg);
    assert_non_null(strstr(err.msg, bin));
    assert_non_null(strstr(err.msg, "truncated or rewritten"));
    assert_non_null(strstr(err.msg, "replaced atomically"));
    /* Rewritten in place (same inode) with contents of another size: the same. */
    FILE *f = fopen(bin, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(got, 4, 900, f), 900);
    fclose(f);
    assert_int_equal(mt_indexed_read(ix, 0, 0, 700, 1 << 20, got, &err), MT_ECORRUPT);
    assert_non_null(strstr(err.msg, "not the 6420 it had"));
    mt_indexed_close(ix);

    /* Replaced atomically (renamed over) while open: reads go on from the opened file. */
    th_write_dataset(prefix, MT_DTYPE_INT32, 3, lens, 7);
    assert_int_equal(mt_indexed_open(prefix, &ix, &err), MT_OK);
    static const int other[2] = {3, 3};
    th_write_dataset(prefix, MT_DTYPE_INT32, 2, other, 9);
    assert_int_equal(mt_indexed_read(ix, 2, 0, 900, 1 << 20, got, &err), MT_OK);
    assert_int_equal(got[0], TH_TOKEN(7, 2, 0));
    /* ... but truncating the file it opened in place, by its other name, is caught. */
    mt_indexed_close(ix);
    th_write_dataset(prefix, MT_DTYPE_INT32, 3, lens, 7);
    assert_int_equal(mt_indexed_open(prefix, &ix, &err), MT_OK);
    f = fopen(bin, "r+b");
    assert_non_null(f);
    assert_int_equal(ftruncate(fileno(f), 4 * 700), 0);
    fclose(f);
    assert_int_equal(mt_indexed_read(ix, 0, 0, 700, 1 << 20, got, &err), MT_ECORRUPT);
    assert_non_null(strstr(err.msg, "replaced atomically"));
    mt_indexed_close(ix);
    th_rmtree(dir);
    free(bin);
    free(prefix);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(roundtrip_every_dtype),
        cmocka_unit_test(megatron_fixture_loads),
        cmocka_unit_test(every_corruption_is_reported),
        cmocka_unit_test(token_outside_vocab),
        cmocka_unit_test(writer_is_atomic),
        cmocka_unit_test(bin_changed_during_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

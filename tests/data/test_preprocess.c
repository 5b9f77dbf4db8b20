/* moetrain-preprocess input handling: plain-text paragraphs and JSONL with
 * every escape, read back through the indexed reader; malformed JSON named by
 * file:line:col. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "helpers.h"

struct run {
    char *dir, *prefix, *input;
};

static void run_init(struct run *r, const char *name, const void *text, size_t n)
{
    r->dir = th_tmpdir();
    r->prefix = th_join(r->dir, "/out");
    char *slash = th_join(r->dir, "/");
    r->input = th_join(slash, name);
    free(slash);
    th_write_file(r->input, text, n);
}

static void run_free(struct run *r)
{
    th_rmtree(r->dir);
    free(r->dir);
    free(r->prefix);
    free(r->input);
}

/* Preprocesses r->input; returns the code, with st filled. */
static int preprocess(struct run *r, const char *key, bool eod, struct mt_preprocess_stats *st,
                      struct mt_err *err)
{
    struct mt_indexed_writer *w;
    struct mt_preprocess_opts o = {key, eod};
    memset(st, 0, sizeof *st);
    assert_int_equal(mt_indexed_writer_open(r->prefix, MT_DTYPE_UINT16, &w, err), MT_OK);
    int rc = mt_preprocess_file(w, r->input, &o, st, err);
    if (rc == MT_OK) return mt_indexed_writer_finish(w, err);
    mt_indexed_writer_abort(w);
    return rc;
}

/* Asserts that the dataset's documents are exactly docs[] (+ EOD if eod). */
static void expect_documents(const char *prefix, int n, const char *const *docs,
                             const size_t *lens, bool eod)
{
    struct mt_indexed *ix;
    struct mt_err err = {0};
    assert_int_equal(mt_indexed_open(prefix, &ix, &err), MT_OK);
    assert_int_equal(mt_indexed_dtype(ix), MT_DTYPE_UINT16);
    assert_int_equal(mt_indexed_num_documents(ix), n);
    for (int d = 0; d < n; d++) {
        size_t len = lens ? lens[d] : strlen(docs[d]);
        assert_int_equal(mt_indexed_sequence_length(ix, (uint64_t)d), len + (eod ? 1 : 0));
        int32_t *t = malloc((len + 1) * sizeof *t);
        assert_int_equal(mt_indexed_read(ix, (uint64_t)d, 0, len + (eod ? 1 : 0), MT_BYTE_VOCAB,
                                         t, &err), MT_OK);
        for (size_t j = 0; j < len; j++) assert_int_equal(t[j], (unsigned char)docs[d][j]);
        if (eod) assert_int_equal(t[len], MT_BYTE_EOD);
        free(t);
    }
    mt_indexed_close(ix);
}

static void text_paragraphs(void **state)
{
    (void)state;
    static const char text[] = "\n\nfirst line\nsecond line\n\n\n  \t\nthird\r\n\r\n"
                               "x\n \nlast, no newline";
    struct run r;
    run_init(&r, "in.txt", text, sizeof text - 1);
    struct mt_preprocess_stats st;
    struct mt_err err = {0};
    assert_int_equal(preprocess(&r, "text", true, &st, &err), MT_OK);
    static const char *const docs[] = {"first line\nsecond line\n", "third\r\n", "x\n",
                                       "last, no newline"};
    assert_int_equal(st.documents, 4);
    assert_int_equal(st.tokens, strlen(docs[0]) + strlen(docs[1]) + strlen(docs[2]) +
                                    strlen(docs[3]) + 4);
    expect_documents(r.prefix, 4, docs, NULL, true);
    /* Without --append-eod. */
    assert_int_equal(preprocess(&r, "text", false, &st, &err), MT_OK);
    expect_documents(r.prefix, 4, docs, NULL, false);
    run_free(&r);
}

static void jsonl_escapes(void **state)
{
    (void)state;
    static const char text[] =
        "{\"id\": 1, \"text\": \"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\tA\\u0041\\u00e9\\u20AC\\ud83d\\ude00"
        "\\u0000z\", \"meta\": {\"x\": [1, -2.5e+3, 0.5, true, false, null, \"s\\u1234\"], \"y\": {}}}\n"
        "\n"
        "  {\"text\":\"raw \xc3\xa9 \xf0\x9f\x98\x80 utf-8\"}  \r\n"
        "{\"text\": \"first\", \"text\": \"last wins\"}\n"
        "{\"text\": \"\"}\n"
        "{\"other\": \"x\", \"text\": \"tail without newline\"}";
    struct run r;
    run_init(&r, "in.jsonl", text, sizeof text - 1);
    struct mt_preprocess_stats st;
    struct mt_err err = {0};
    int rc = preprocess(&r, "text", true, &st, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, MT_OK);
    static const char d0[] = "a\"b\\c/d\b\f\n\r\tAA\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\0z";
    static const char *const docs[] = {d0, "raw \xc3\xa9 \xf0\x9f\x98\x80 utf-8", "last wins",
                                       "tail without newline"};
    const size_t lens[] = {sizeof d0 - 1, strlen(docs[1]), strlen(docs[2]), strlen(docs[3])};
    assert_int_equal(st.documents, 4);
    assert_int_equal(st.empty, 1);
    expect_documents(r.prefix, 4, docs, lens, true);
    run_free(&r);

    /* --json-key picks another field. */
    static const char other[] = "{\"body\": \"B1\", \"text\": \"T1\"}\n{\"body\": \"B2\"}\n";
    run_init(&r, "in.json", other, sizeof other - 1);
    assert_int_equal(preprocess(&r, "body", false, &st, &err), MT_OK);
    static const char *const bodies[] = {"B1", "B2"};
    expect_documents(r.prefix, 2, bodies, NULL, false);
    run_free(&r);
}

struct bad_json {
    const char *line2;     /* the second line of the file */
    const char *expect;    /* substring of the message */
    int col;               /* expected column, 0: not checked */
};

static const struct bad_json bad[] = {
    {"{\"text\": \"unterminated}", "unterminated string", 0},
    {"{\"text\": \"x\"", "expected ',' or '}'", 13},
    {"{\"text\": \"x\"} trailing", "unexpected text after the object", 15},
    {"[\"text\"]", "expected a JSON object", 1},
    {"{\"text\": 5}", "field \"text\" is not a string", 10},
    {"{\"title\": \"x\"}", "no \"text\" field", 1},
    {"{\"text\": \"bad \\x escape\"}", "invalid escape \\x", 0},
    {"{\"text\": \"\\u12G4\"}", "four hex digits", 0},
    {"{\"text\": \"lone \\udc00 low\"}", "lone low surrogate", 16},
    {"{\"text\": \"high \\ud800 alone\"}", "not followed by a low surrogate", 16},
    {"{\"text\": \"\\ud800\\u0041\"}", "not a low surrogate", 11},
    {"{\"text\": \"tab\there\"}", "control character 0x09", 14},
    {"{\"text\": \"bad \xff byte\"}", "invalid UTF-8", 15},
    {"{\"text\": \"overlong \xc0\xaf\"}", "invalid UTF-8", 0},
    {"{\"text\": \"x\", \"n\": 01}", "expected ',' or '}'", 0},
    {"{\"text\": \"x\", \"n\": tru}", "invalid value", 0},
    {"{\"text\": \"x\", \"a\": [1, 2}", "expected ',' or ']'", 0},
    {"{\"text\": \"x\", 5: 1}", "expected a string key", 0},
};

static void jsonl_errors_name_the_place(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[256];
        int n = snprintf(text, sizeof text, "{\"text\": \"good\"}\n%s\n{\"text\": \"after\"}\n",
                         bad[i].line2);
        struct run r;
        run_init(&r, "bad.jsonl", text, (size_t)n);
        struct mt_preprocess_stats st;
        struct mt_err err = {0};
        int rc = preprocess(&r, "text", true, &st, &err);
        print_message("# %s\n", err.msg);
        assert_int_equal(rc, MT_EINVAL);
        char where[512];
        snprintf(where, sizeof where, "%s:2:", r.input);
        assert_non_null(strstr(err.msg, where));
        if (bad[i].col) {
            snprintf(where, sizeof where, "%s:2:%d: error: ", r.input, bad[i].col);
            assert_non_null(strstr(err.msg, where));
        }
        assert_non_null(strstr(err.msg, bad[i].expect));
        run_free(&r);
    }
}

static void format_from_name(void **state)
{
    (void)state;
    assert_int_equal(mt_preprocess_format_of("a/b.jsonl"), MT_INPUT_JSONL);
    assert_int_equal(mt_preprocess_format_of("x.json"), MT_INPUT_JSONL);
    assert_int_equal(mt_preprocess_format_of("x.txt"), MT_INPUT_TEXT);
    assert_int_equal(mt_preprocess_format_of("jsonl"), MT_INPUT_TEXT);
    assert_int_equal(mt_preprocess_format_of("x.jsonl.gz"), MT_INPUT_TEXT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(text_paragraphs),
        cmocka_unit_test(jsonl_escapes),
        cmocka_unit_test(jsonl_errors_name_the_place),
        cmocka_unit_test(format_from_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

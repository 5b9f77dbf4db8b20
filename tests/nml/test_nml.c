/* moetrain: namelist parser tests.
 *
 * One test per fixture: tests/fixtures/nml/ok/NAME.nml must parse and flatten
 * (flatten.h) to NAME.expect ('#' lines there are for the conformance test);
 * tests/fixtures/nml/bad/NAME.nml must fail with the first line of NAME.err
 * (FILE standing for the path), then the source line and a caret under the
 * column.  Then the cases made at run time: a directory, a missing file, 10 MB
 * lines, the value limits, and the fields of the tree. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flatten.h"
#include "nml/nml.h"

/* A fixture: the .nml path and its .expect or .err sibling. */
struct fixture {
    char *nml, *want;
};

static char *read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) fail_msg("%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, n = 0, k;
    do {
        if (n + 4096 + 1 > cap) {
            cap = 2 * cap + 4096 + 1;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        k = fread(buf + n, 1, cap - n - 1, fp);
        n += k;
    } while (k > 0);
    fclose(fp);
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

/* The text of s without its lines that start with '#'. */
static char *drop_comment_lines(const char *s)
{
    char *out = malloc(strlen(s) + 1), *o = out;
    assert_non_null(out);
    while (*s) {
        const char *nl = strchr(s, '\n');
        size_t n = nl ? (size_t)(nl - s) + 1 : strlen(s);
        if (*s != '#') {
            memcpy(o, s, n);
            o += n;
        }
        s += n;
    }
    *o = '\0';
    return out;
}

static void test_ok_fixture(void **state)
{
    const struct fixture *fx = *state;
    struct mt_nml_file *f;
    struct mt_err err;
    if (mt_nml_parse_file(fx->nml, &f, &err) != MT_OK) fail_msg("%s", err.msg);
    char *got = nml_flatten_string(f);
    assert_non_null(got);
    char *raw = read_file(fx->want, NULL);
    char *want = drop_comment_lines(raw);
    assert_string_equal(got, want);
    free(want);
    free(raw);
    free(got);
    mt_nml_free(f);
}

/* Checks the 2nd and 3rd lines of an error message: the source line and a
 * caret under col.  The bad fixtures keep the error's line ASCII, apart from
 * the byte a test is about, which shows as '?'. */
static void check_excerpt(const char *msg, const char *text, size_t len, int line, int col)
{
    size_t bol = 0;
    for (int l = 1; l < line && bol < len; l++) {
        const char *nl = memchr(text + bol, '\n', len - bol);
        bol = nl ? (size_t)(nl - text) + 1 : len;
    }
    const char *nl = bol < len ? memchr(text + bol, '\n', len - bol) : NULL;
    size_t n = (nl ? (size_t)(nl - text) : len) - bol;
    if (n > 0 && text[bol + n - 1] == '\r') n--;
    char *want = malloc(2 * n + (size_t)col + 8), *w = want;
    assert_non_null(want);
    *w++ = '\n';
    *w++ = ' ';
    for (size_t k = 0; k < n; k++) {
        unsigned char c = (unsigned char)text[bol + k];
        *w++ = c == '\t' || (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    *w++ = '\n';
    *w++ = ' ';
    for (int k = 0; k < col - 1; k++) *w++ = text[bol + k] == '\t' ? '\t' : ' ';
    *w++ = '^';
    *w = '\0';
    const char *rest = strchr(msg, '\n');
    assert_non_null(rest);
    assert_string_equal(rest, want);
    free(want);
}

static void test_bad_fixture(void **state)
{
    const struct fixture *fx = *state;
    struct mt_nml_file *f = (struct mt_nml_file *)1;
    struct mt_err err;
    int rc = mt_nml_parse_file(fx->nml, &f, &err);
    assert_int_equal(rc, MT_EINVAL);
    assert_null(f);
    assert_int_equal(err.code, MT_EINVAL);

    char *spec = read_file(fx->want, NULL);
    *strchrnul(spec, '\n') = '\0';
    assert_true(strncmp(spec, "FILE:", 5) == 0);
    char want[1024];
    snprintf(want, sizeof want, "%s%s", fx->nml, spec + 4);
    size_t first = strcspn(err.msg, "\n");
    if (first != strlen(want) || strncmp(err.msg, want, first) != 0)
        fail_msg("got:  %.*s\nwant: %s", (int)first, err.msg, want);

    int line = 0, col = 0;
    assert_int_equal(sscanf(spec + 5, "%d:%d:", &line, &col), 2);
    size_t len;
    char *text = read_file(fx->nml, &len);
    check_excerpt(err.msg, text, len, line, col);
    free(text);
    free(spec);
}

/* ------------------------------------------------------------------------ */
/* Cases made at run time                                                    */

static void test_missing_file(void **state)
{
    (void)state;
    struct mt_nml_file *f;
    struct mt_err err;
    assert_int_equal(mt_nml_parse_file("/nonexistent/moetrain.nml", &f, &err), MT_EIO);
    assert_null(f);
    char want[256];
    snprintf(want, sizeof want, "/nonexistent/moetrain.nml: cannot read namelist file: %s",
             strerror(ENOENT));
    assert_string_equal(err.msg, want);
}

/* state: the fixture directory. */
static void test_directory(void **state)
{
    const char *dir = *state;
    struct mt_nml_file *f;
    struct mt_err err;
    assert_int_equal(mt_nml_parse_file(dir, &f, &err), MT_EIO);
    char want[4200];
    snprintf(want, sizeof want, "%s: cannot read namelist file: %s", dir, strerror(EISDIR));
    assert_string_equal(err.msg, want);
}

#define BIG (10u << 20)

/* prefix + n copies of fill + suffix, as one malloc'd buffer. */
static char *make_big(const char *prefix, const char *fill, size_t n, const char *suffix, size_t *len)
{
    size_t pl = strlen(prefix), fl = strlen(fill), sl = strlen(suffix);
    char *b = malloc(pl + n * fl + sl + 1);
    assert_non_null(b);
    memcpy(b, prefix, pl);
    for (size_t k = 0; k < n; k++) memcpy(b + pl + k * fl, fill, fl);
    memcpy(b + pl + n * fl, suffix, sl + 1);
    *len = pl + n * fl + sl;
    return b;
}

/* Parses text; returns the result code.  Fails if it took over 20 s: a
 * quadratic step on 10 MB would take hours, linear takes well under 1 s. */
static int parse_timed(const char *text, size_t len, struct mt_nml_file **f, struct mt_err *err)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = mt_nml_parse_string("big.nml", text, len, f, err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (s > 20) fail_msg("parsing %zu bytes took %.1f s", len, s);
    return rc;
}

/* The message of an error on a long line stays short, with the caret under
 * the right byte of a window of the line. */
static void check_window(const char *msg, char at)
{
    assert_true(strlen(msg) < 1024);
    const char *l2 = strchr(msg, '\n'), *l3 = l2 ? strchr(l2 + 1, '\n') : NULL;
    assert_non_null(l3);
    const char *caret = strchr(l3 + 1, '^');
    assert_non_null(caret);
    size_t k = (size_t)(caret - (l3 + 1));
    assert_true(k < (size_t)(l3 - (l2 + 1)));
    assert_int_equal(l2[1 + k], at);
    assert_memory_equal(l2 + 1, " ...", 4);
}

/* 10 MB inputs: prefix, count copies of fill, suffix.  want: NULL if it must
 * parse, else part of the message; caret: the byte the caret must be under
 * in a cut line (0: not checked); slen: the length of the first value's
 * string (0: not checked). */
struct big_case {
    const char *prefix, *fill;
    size_t count;
    const char *suffix, *want;
    char caret;
    size_t slen;
};

static void test_big_inputs(void **state)
{
    (void)state;
    const struct big_case cases[] = {
        {"&g s = '", "x", BIG, "' /\n", NULL, 0, BIG},
        {"&g a = 1 ! ", "c", BIG, "\n/\n", NULL, 0, 0},
        {"&g a", "_b%c", BIG / 4, " = 1 /\n", NULL, 0, 0},
        {"&g l = t", "\n", BIG, "/\n", NULL, 0, 0},
        {"&g a = 0.", "0", BIG, "1 /\n", NULL, 0, 0},
        {"&g a = ", "1 ", BIG / 2, "/\n",
         "big.nml:1:2000008: error: too many values: more than 1000000 in one assignment\n", '1', 0},
        {"&g l = ", "t ", BIG / 2, "/\n", "big.nml:1:2000008: error: too many values", 't', 0},
        {"&g a = ", ",", BIG, "/\n", "big.nml:1:1000008: error: too many values", ',', 0},
        {"&g a = ", "9", BIG, " /\n", "big.nml:1:8: error: integer 99999", 0, 0},
        {"&g a = '", "x", BIG, "\n/\n", "big.nml:1:8: error: unterminated string\n", 0, 0},
        {"&g a = ", "t(", BIG / 2, "\n/\n", "big.nml:1:8: error: invalid value 't(t(", 0, 0},
        {"&g\n", "a = 1\n", BIG / 6, "", "big.nml:1:1: error: namelist group '&g' is not closed", 0, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const struct big_case *bc = &cases[c];
        size_t len;
        char *t = make_big(bc->prefix, bc->fill, bc->count, bc->suffix, &len);
        struct mt_nml_file *f;
        struct mt_err err;
        int rc = parse_timed(t, len, &f, &err);
        if (!bc->want) {
            if (rc != MT_OK) fail_msg("case %zu: %s", c, err.msg);
            if (bc->slen) assert_int_equal(strlen(f->groups[0].assigns[0].values[0].s), bc->slen);
            mt_nml_free(f);
        } else {
            assert_int_equal(rc, MT_EINVAL);
            if (!strstr(err.msg, bc->want)) fail_msg("case %zu: %s", c, err.msg);
            if (bc->caret) check_window(err.msg, bc->caret);
        }
        free(t);
    }
}

static void test_values_per_file(void **state)
{
    (void)state;
    const char *t = "&g a = 1000000*0 b = 1000000*0\n c = 1*0 /\n";
    struct mt_nml_file *f;
    struct mt_err err;
    assert_int_equal(mt_nml_parse_string("v.nml", t, strlen(t), &f, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "v.nml:2:6: error: too many values: more than 2000000 in one file\n"));
    t = "&g a = 1000000*0, 1 /";
    assert_int_equal(mt_nml_parse_string("v.nml", t, strlen(t), &f, &err), MT_EINVAL);
    assert_non_null(strstr(err.msg, "v.nml:1:19: error: too many values: more than 1000000 in one assignment\n"));
    t = "&g a = 1000000*'x' /";
    assert_int_equal(mt_nml_parse_string("v.nml", t, strlen(t), &f, &err), MT_OK);
    const struct mt_nml_assign *a = &f->groups[0].assigns[0];
    assert_int_equal(a->nvalues, 1000000);
    assert_ptr_equal(a->values[0].s, a->values[999999].s);
    mt_nml_free(f);
}

static const struct mt_nml_assign *find(const struct mt_nml_group *g, const char *name)
{
    for (size_t k = 0; k < g->nassign; k++)
        if (strcmp(g->assigns[k].name, name) == 0) return &g->assigns[k];
    fail_msg("no assignment %s", name);
    return NULL;
}

static void check_index(const struct mt_nml_group *g, const char *name, bool has, long long start,
                        long long end, long long stride)
{
    const struct mt_nml_assign *a = find(g, name);
    assert_int_equal(a->has_index, has);
    assert_int_equal(a->start, start);
    assert_int_equal(a->end, end);
    assert_int_equal(a->stride, stride);
}

static void test_tree(void **state)
{
    (void)state;
    const char *t = "junk\n"
                    "  &Grp A = 1, 2.5 b(3) = 'x' c(2:) = T\n"
                    "  d(:4) = 1 e(6:2:-2) = 1 f(0) = 1 g = / &h $end";
    struct mt_nml_file *f;
    struct mt_err err;
    if (mt_nml_parse_string(NULL, t, strlen(t), &f, &err) != MT_OK) fail_msg("%s", err.msg);
    assert_string_equal(f->path, "<string>");
    assert_int_equal(f->ngroups, 2);
    const struct mt_nml_group *g = &f->groups[0];
    assert_string_equal(g->name, "grp");
    assert_int_equal(g->line, 2);
    assert_int_equal(g->col, 3);
    assert_string_equal(f->groups[1].name, "h");
    assert_int_equal(f->groups[1].nassign, 0);
    check_index(g, "a", false, 1, -1, 1);
    check_index(g, "b", true, 3, 3, 1);
    check_index(g, "c", true, 2, -1, 1);
    check_index(g, "d", true, 1, 4, 1);
    check_index(g, "e", true, 6, 2, -2);
    check_index(g, "f", true, 0, 0, 1);
    assert_int_equal(find(g, "g")->nvalues, 0);

    const struct mt_nml_assign *a = find(g, "a");
    assert_int_equal(a->line, 2);
    assert_int_equal(a->col, 8);
    assert_int_equal(a->nvalues, 2);
    assert_int_equal(a->values[0].type, MT_NML_INT);
    assert_int_equal(a->values[0].i, 1);
    assert_true(a->values[0].r == 1.0);
    assert_int_equal(a->values[0].col, 12);
    assert_int_equal(a->values[1].type, MT_NML_REAL);
    assert_true(a->values[1].r == 2.5);
    assert_int_equal(a->values[1].line, 2);
    assert_int_equal(a->values[1].col, 15);
    assert_int_equal(find(g, "c")->values[0].type, MT_NML_LOGICAL);
    assert_true(find(g, "c")->values[0].l);
    mt_nml_free(f);
    mt_nml_free(NULL);
}

/* mt_nml_error_at, as the config module calls it: a caret under a value
 * after a tab and multi-byte UTF-8 characters. */
static void test_error_at(void **state)
{
    (void)state;
    const char *t = "&g\n\ts = 'h\xc3\xa9llo', n = 'x'\n/\n";
    struct mt_nml_file *f;
    struct mt_err err;
    if (mt_nml_parse_string("cfg.nml", t, strlen(t), &f, &err) != MT_OK) fail_msg("%s", err.msg);
    const struct mt_nml_value *v = &find(&f->groups[0], "n")->values[0];
    assert_int_equal(v->col, 20);
    assert_int_equal(mt_nml_error_at(f, v->line, v->col, &err, MT_EINVAL, "'%s' is not an integer", v->s),
                     MT_EINVAL);
    assert_int_equal(err.code, MT_EINVAL);
    assert_string_equal(err.msg, "cfg.nml:2:20: error: 'x' is not an integer\n"
                                 " \ts = 'h\xc3\xa9llo', n = 'x'\n"
                                 " \t                 ^");
    mt_nml_free(f);
}

/* Input given as a string: NUL bytes count, and nothing at all is an error. */
static void test_parse_string(void **state)
{
    (void)state;
    struct mt_nml_file *f;
    struct mt_err err;
    assert_int_equal(mt_nml_parse_string("s", "&g a=1 /\0", 9, &f, &err), MT_EINVAL);
    assert_string_equal(err.msg, "s:1:9: error: NUL byte at byte offset 8\n &g a=1 /?\n         ^");
    assert_int_equal(mt_nml_parse_string("s", NULL, 0, &f, &err), MT_EINVAL);
    assert_string_equal(err.msg, "s:1:1: error: no namelist group found\n \n ^");
    assert_int_equal(mt_nml_parse_string("s", "&g a=1 /", 8, &f, &err), MT_OK);
    mt_nml_free(f);
    /* The size is checked before the text is read. */
    assert_int_equal(mt_nml_parse_string("s", "", MT_NML_MAX_INPUT + 1, &f, &err), MT_EINVAL);
    assert_string_equal(err.msg, "s: error: namelist input is larger than 256 MiB");
}

/* ------------------------------------------------------------------------ */

static int has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n > k && strcmp(s + n - k, suffix) == 0;
}

/* Adds one test per NAME.nml in dir/sub, each with its NAME<want_ext>. */
static void add_fixtures(struct CMUnitTest **tests, size_t *n, const char *root, const char *sub,
                         const char *want_ext, CMUnitTestFunction fn)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/%s", root, sub);
    struct dirent **names;
    int k = scandir(dir, &names, NULL, alphasort);
    if (k < 0) {
        fprintf(stderr, "%s: %s\n", dir, strerror(errno));
        exit(1);
    }
    for (int i = 0; i < k; i++) {
        const char *e = names[i]->d_name;
        if (has_suffix(e, ".nml")) {
            struct fixture *fx = malloc(sizeof *fx);
            size_t dl = strlen(dir), el = strlen(e);
            fx->nml = malloc(dl + el + 2);
            fx->want = malloc(dl + el + strlen(want_ext) + 2);
            char *name = malloc(strlen(sub) + el + 2);
            if (!fx || !fx->nml || !fx->want || !name) exit(1);
            sprintf(fx->nml, "%s/%s", dir, e);
            sprintf(fx->want, "%s/%.*s%s", dir, (int)(el - 4), e, want_ext);
            sprintf(name, "%s/%.*s", sub, (int)(el - 4), e);
            *tests = realloc(*tests, (*n + 1) * sizeof **tests);
            if (!*tests) exit(1);
            (*tests)[(*n)++] = (struct CMUnitTest){name, fn, NULL, NULL, fx};
        }
        free(names[i]);
    }
    free(names);
}

int main(void)
{
    char root[4096];
    const char *top = getenv("MT_TOP_SRCDIR");
    if (top && *top)
        snprintf(root, sizeof root, "%s/tests/fixtures/nml", top);
    else
        snprintf(root, sizeof root, "%s", MT_NML_FIXTURES);
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test_prestate(test_directory, root),
        cmocka_unit_test(test_big_inputs),
        cmocka_unit_test(test_values_per_file),
        cmocka_unit_test(test_tree),
        cmocka_unit_test(test_error_at),
        cmocka_unit_test(test_parse_string),
    };
    struct CMUnitTest *tests = NULL;
    size_t n = 0;
    add_fixtures(&tests, &n, root, "ok", ".expect", test_ok_fixture);
    add_fixtures(&tests, &n, root, "bad", ".err", test_bad_fixture);
    size_t nfixtures = n;
    tests = realloc(tests, (n + sizeof fixed / sizeof *fixed) * sizeof *tests);
    if (!tests) return 1;
    for (size_t k = 0; k < sizeof fixed / sizeof *fixed; k++) tests[n++] = fixed[k];
    int failed = _cmocka_run_group_tests("nml", tests, n, NULL, NULL);
    for (size_t k = 0; k < nfixtures; k++) {
        struct fixture *fx = tests[k].initial_state;
        free(fx->nml);
        free(fx->want);
        free(fx);
        free((char *)tests[k].name);
    }
    free(tests);
    return failed;
}

/* The JSON reader: every kind of value, escapes, integers kept exact, a family of
 * malformed inputs that must fail naming line and column, and CRC-32's check value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util/crc32.h"
#include "util/json.h"

static struct mt_json *parse_ok(const char *text)
{
    struct mt_json *v = NULL;
    struct mt_err err = { 0 };
    int rc = mt_json_parse(text, strlen(text), "'t.json'", &v, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, MT_OK);
    return v;
}

static void test_values(void **state)
{
    (void)state;
    struct mt_json *v = parse_ok(" {\"a\": [1, -2, 3.5, 1e3, true, false, null], \"b\": {},"
                                 " \"c\": [], \"d\": \"x\", \"big\": 9007199254740993,"
                                 " \"neg0\": -0}\n");
    assert_int_equal(v->type, MT_JSON_OBJECT);
    assert_int_equal(v->n, 6);
    const struct mt_json *a = mt_json_get(v, "a");
    assert_non_null(a);
    assert_int_equal(a->type, MT_JSON_ARRAY);
    assert_int_equal(a->n, 7);
    long long x;
    assert_true(mt_json_int(&a->items[0], 0, 10, &x));
    assert_int_equal(x, 1);
    assert_true(mt_json_int(&a->items[1], -5, 5, &x));
    assert_int_equal(x, -2);
    assert_false(mt_json_int(&a->items[1], 0, 5, &x)); /* out of range */
    assert_false(a->items[2].is_int);
    assert_true(a->items[2].number == 3.5);
    assert_false(a->items[3].is_int); /* 1e3 is a number, not an integer literal */
    assert_true(a->items[3].number == 1000.0);
    assert_int_equal(a->items[4].type, MT_JSON_BOOL);
    assert_true(a->items[4].boolean);
    assert_false(a->items[5].boolean);
    assert_int_equal(a->items[6].type, MT_JSON_NULL);
    assert_int_equal(mt_json_get(v, "b")->n, 0);
    assert_int_equal(mt_json_get(v, "c")->type, MT_JSON_ARRAY);
    assert_string_equal(mt_json_get(v, "d")->string, "x");
    /* integers beyond 2^53 stay exact */
    assert_true(mt_json_int(mt_json_get(v, "big"), 0, INT64_MAX, &x));
    assert_true(x == 9007199254740993LL);
    assert_null(mt_json_get(v, "missing"));
    assert_null(mt_json_get(a, "a")); /* not an object */
    mt_json_free(v);
}

static void test_strings(void **state)
{
    (void)state;
    struct mt_json *v = parse_ok("[\"q\\\"b\\\\s\\/n\\n\\t\\b\\f\\r\", \"\\u00e9\\u20ac\","
                                 " \"\\ud83d\\ude00\", \"\xc3\xa9\"]");
    assert_string_equal(v->items[0].string, "q\"b\\s/n\n\t\b\f\r");
    assert_string_equal(v->items[1].string, "\xc3\xa9\xe2\x82\xac");
    assert_string_equal(v->items[2].string, "\xf0\x9f\x98\x80");
    assert_string_equal(v->items[3].string, "\xc3\xa9");
    mt_json_free(v);
    /* what mt_json_write_string writes reads back */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    mt_json_write_string(f, "a\"b\\c\n\x01");
    fclose(f);
    assert_string_equal(buf, "\"a\\\"b\\\\c\\u000a\\u0001\"");
    v = parse_ok(buf);
    assert_string_equal(v->string, "a\"b\\c\n\x01");
    mt_json_free(v);
    free(buf);
}

/* Each malformed input fails with MT_ECORRUPT and a message naming the place. */
static void test_malformed(void **state)
{
    (void)state;
    static const struct { const char *text, *needle; } bad[] = {
        { "", "line 1, column 1: the input ends where a value was expected" },
        { "   ", "ends where a value was expected" },
        { "{", "an object key (a string) was expected" },
        { "{\"a\" 1}", "':' was expected" },
        { "{\"a\": 1,}", "an object key" },
        { "[1, 2", "',' or ']' was expected" },
        { "[1 2]", "',' or ']' was expected" },
        { "{\"a\": 1 \"b\": 2}", "',' or '}' was expected" },
        { "[1,]", "a value was expected" },
        { "tru", "a value was expected" },
        { "nul", "a value was expected" },
        { "01", "leading zero" },
        { "1.", "a digit must follow the decimal point" },
        { "1e", "an exponent needs digits" },
        { "-", "a value was expected" },
        { "+1", "a value was expected" },
        { "\"abc", "not terminated" },
        { "\"a\\x\"", "unknown escape" },
        { "\"\\u12\"", "four hex digits" },
        { "\"\\ud800\"", "surrogate pair is incomplete" },
        { "\"\\ud800\\u0041\"", "surrogate pair is invalid" },
        { "\"\\udc00\"", "lone low" },
        { "\"\\u0000\"", "\\u0000" },
        { "\"a\tb\"", "control character" },
        { "1 2", "something follows the value" },
        { "{} x", "something follows the value" },
        { "[\n1,\n  x]", "line 3, column 3" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct mt_json *v = (struct mt_json *)1;
        struct mt_err err = { 0 };
        int rc = mt_json_parse(bad[i].text, strlen(bad[i].text), "'t.json'", &v, &err);
        if (rc != MT_ECORRUPT || !strstr(err.msg, bad[i].needle) ||
            !strstr(err.msg, "'t.json' is not valid JSON"))
            fail_msg("input %zu '%s': rc %d, message '%s' (wanted '%s')", i, bad[i].text, rc,
                     err.msg, bad[i].needle);
        assert_null(v);
    }
    /* nesting is bounded, not a stack overflow */
    char deep[2 * MT_JSON_MAX_DEPTH + 10];
    memset(deep, '[', MT_JSON_MAX_DEPTH + 1);
    memset(deep + MT_JSON_MAX_DEPTH + 1, ']', MT_JSON_MAX_DEPTH + 1);
    struct mt_json *v;
    struct mt_err err;
    assert_int_equal(mt_json_parse(deep, 2 * MT_JSON_MAX_DEPTH + 2, "x", &v, &err), MT_ECORRUPT);
    assert_non_null(strstr(err.msg, "nesting is too deep"));
    assert_int_equal(mt_json_parse(deep + 1, 2 * MT_JSON_MAX_DEPTH, "x", &v, &err), MT_OK);
    mt_json_free(v);
    /* the length bounds the input: no NUL needed, nothing read past it */
    assert_int_equal(mt_json_parse("[1]garbage", 3, "x", &v, &err), MT_OK);
    mt_json_free(v);
    assert_int_equal(mt_json_parse("\"ab\"", 3, "x", &v, &err), MT_ECORRUPT);
}

static void test_crc32(void **state)
{
    (void)state;
    assert_int_equal(mt_crc32(0, "123456789", 9), 0xcbf43926u); /* the standard check value */
    assert_int_equal(mt_crc32(0, "", 0), 0);
    /* in pieces as at once */
    unsigned char data[1000];
    for (int i = 0; i < 1000; i++) data[i] = (unsigned char)(i * 7 + 3);
    uint32_t whole = mt_crc32(0, data, sizeof data);
    uint32_t parts = mt_crc32(mt_crc32(mt_crc32(0, data, 3), data + 3, 500), data + 503, 497);
    assert_int_equal(whole, parts);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_crc32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

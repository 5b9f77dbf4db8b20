/* A small JSON reader (see json.h): recursive descent over the buffer. */
#include "util/json.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct parser {
    const char *p, *end, *start;
    const char *what;
    struct mt_err *err;
    int depth;
};

static int fail(struct parser *ps, const char *fmt, const char *detail)
{
    int line = 1, col = 1;
    for (const char *c = ps->start; c < ps->p && c < ps->end; c++) {
        if (*c == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    char msg[256];
    snprintf(msg, sizeof msg, fmt, detail);
    return mt_err_set(ps->err, MT_ECORRUPT, "%s is not valid JSON: line %d, column %d: %s",
                      ps->what, line, col, msg);
}

static void skip_ws(struct parser *ps)
{
    while (ps->p < ps->end &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int parse_value(struct parser *ps, struct mt_json *v);

static bool literal(struct parser *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n)) return false;
    ps->p += n;
    return true;
}

static int hex4(struct parser *ps, unsigned *out)
{
    if (ps->end - ps->p < 4) return fail(ps, "%s", "a \\u escape needs four hex digits");
    unsigned x = 0;
    for (int i = 0; i < 4; i++) {
        char c = ps->p[i];
        x <<= 4;
        if (c >= '0' && c <= '9') x |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') x |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') x |= (unsigned)(c - 'A' + 10);
        else return fail(ps, "%s", "a \\u escape needs four hex digits");
    }
    ps->p += 4;
    *out = x;
    return MT_OK;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* At the opening quote: the decoded string, malloc'd. */
static int parse_string(struct parser *ps, char **out)
{
    ps->p++; /* the quote */
    const char *s = ps->p;
    while (s < ps->end && *s != '"') s += *s == '\\' ? 2 : 1;
    if (s >= ps->end) return fail(ps, "%s", "a string is not terminated");
    /* decoded is never longer than the escaped text */
    char *o = malloc((size_t)(s - ps->p) + 1);
    if (!o) return mt_err_set(ps->err, MT_ENOMEM, "out of memory reading %s", ps->what);
    size_t n = 0;
    while (*ps->p != '"') {
        unsigned char c = (unsigned char)*ps->p;
        if (c < 0x20) {
            free(o);
            return fail(ps, "%s", "a control character inside a string must be escaped");
        }
        if (c != '\\') {
            o[n++] = (char)c;
            ps->p++;
            continue;
        }
        ps->p++;
        char e = *ps->p++;
        unsigned cp;
        switch (e) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u':
            if (hex4(ps, &cp)) {
                free(o);
                return ps->err->code;
            }
            if (cp >= 0xd800 && cp < 0xdc00) { /* a high surrogate: its low half follows */
                unsigned lo;
                if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                    free(o);
                    return fail(ps, "%s", "a \\u surrogate pair is incomplete");
                }
                ps->p += 2;
                if (hex4(ps, &lo)) {
                    free(o);
                    return ps->err->code;
                }
                if (lo < 0xdc00 || lo >= 0xe000) {
                    free(o);
                    return fail(ps, "%s", "a \\u surrogate pair is invalid");
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else if (cp >= 0xdc00 && cp < 0xe000) {
                free(o);
                return fail(ps, "%s", "a lone low \\u surrogate");
            }
            if (cp == 0) {
                free(o);
                return fail(ps, "%s", "\\u0000 inside a string is not supported");
            }
            n += put_utf8(o + n, cp);
            break;
        default:
            ps->p--;
            free(o);
            return fail(ps, "%s", "an unknown escape in a string");
        }
    }
    ps->p++; /* the closing quote */
    o[n] = '\0';
    *out = o;
    return MT_OK;
}

static int parse_number(struct parser *ps, struct mt_json *v)
{
    const char *s = ps->p;
    bool integral = true;
    if (s < ps->end && *s == '-') s++;
    if (s >= ps->end || *s < '0' || *s > '9') return fail(ps, "%s", "a value was expected");
    if (*s == '0' && s + 1 < ps->end && s[1] >= '0' && s[1] <= '9')
        return fail(ps, "%s", "a number has a leading zero");
    while (s < ps->end && *s >= '0' && *s <= '9') s++;
    if (s < ps->end && *s == '.') {
        integral = false;
        s++;
        if (s >= ps->end || *s < '0' || *s > '9')
            return fail(ps, "%s", "a digit must follow the decimal point");
        while (s < ps->end && *s >= '0' && *s <= '9') s++;
    }
    if (s < ps->end && (*s == 'e' || *s == 'E')) {
        integral = false;
        s++;
        if (s < ps->end && (*s == '+' || *s == '-')) s++;
        if (s >= ps->end || *s < '0' || *s > '9')
            return fail(ps, "%s", "an exponent needs digits");
        while (s < ps->end && *s >= '0' && *s <= '9') s++;
    }
    char buf[400];
    size_t len = (size_t)(s - ps->p);
    if (len >= sizeof buf) return fail(ps, "%s", "a number is too long");
    memcpy(buf, ps->p, len);
    buf[len] = '\0';
    v->type = MT_JSON_NUMBER;
    v->number = strtod(buf, NULL);
    if (integral) {
        errno = 0;
        long long x = strtoll(buf, NULL, 10);
        if (errno == 0) {
            v->is_int = true;
            v->integer = x;
        }
    }
    ps->p = s;
    return MT_OK;
}

/* Grows a value's item (and key) arrays to hold one more. */
static int grow(struct parser *ps, struct mt_json *v, size_t *cap, bool keys)
{
    if (v->n < *cap) return MT_OK;
    size_t nc = *cap ? 2 * *cap : 8;
    struct mt_json *items = realloc(v->items, nc * sizeof *items);
    if (items) v->items = items;
    char **k = keys ? realloc(v->keys, nc * sizeof *k) : NULL;
    if (k) v->keys = k;
    if (!items || (keys && !k))
        return mt_err_set(ps->err, MT_ENOMEM, "out of memory reading %s", ps->what);
    *cap = nc;
    return MT_OK;
}

static int parse_container(struct parser *ps, struct mt_json *v, bool object)
{
    if (++ps->depth > MT_JSON_MAX_DEPTH) return fail(ps, "%s", "nesting is too deep");
    v->type = object ? MT_JSON_OBJECT : MT_JSON_ARRAY;
    const char close = object ? '}' : ']';
    size_t cap = 0;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        ps->depth--;
        return MT_OK;
    }
    for (;;) {
        MT_CHECK(grow(ps, v, &cap, object));
        struct mt_json *item = &v->items[v->n];
        memset(item, 0, sizeof *item);
        if (object) {
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != '"')
                return fail(ps, "%s", "an object key (a string) was expected");
            char *key;
            MT_CHECK(parse_string(ps, &key));
            v->keys[v->n] = key;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                v->n++; /* the key is freed with the object */
                return fail(ps, "%s", "':' was expected after an object key");
            }
            ps->p++;
        }
        v->n++;
        MT_CHECK(parse_value(ps, item));
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            ps->depth--;
            return MT_OK;
        }
        return fail(ps, object ? "%s or '}' was expected" : "%s or ']' was expected", "','");
    }
}

static int parse_value(struct parser *ps, struct mt_json *v)
{
    skip_ws(ps);
    if (ps->p >= ps->end) return fail(ps, "%s", "the input ends where a value was expected");
    switch (*ps->p) {
    case '{': return parse_container(ps, v, true);
    case '[': return parse_container(ps, v, false);
    case '"':
        v->type = MT_JSON_STRING;
        return parse_string(ps, &v->string);
    case 't':
    case 'f':
    case 'n':
        if (literal(ps, "true") || literal(ps, "false")) {
            v->type = MT_JSON_BOOL;
            v->boolean = ps->p[-1] == 'e' && ps->p[-2] == 'u';
            return MT_OK;
        }
        if (literal(ps, "null")) {
            v->type = MT_JSON_NULL;
            return MT_OK;
        }
        return fail(ps, "%s", "a value was expected");
    default: return parse_number(ps, v);
    }
}

static void free_value(struct mt_json *v)
{
    free(v->string);
    for (size_t i = 0; i < v->n; i++) {
        free_value(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
}

void mt_json_free(struct mt_json *v)
{
    if (!v) return;
    free_value(v);
    free(v);
}

int mt_json_parse(const char *text, size_t len, const char *what, struct mt_json **out,
                  struct mt_err *err)
{
    *out = NULL;
    struct mt_json *v = calloc(1, sizeof *v);
    if (!v) return mt_err_set(err, MT_ENOMEM, "out of memory reading %s", what);
    struct parser ps = { text, text + len, text, what, err, 0 };
    int rc = parse_value(&ps, v);
    if (rc == MT_OK) {
        skip_ws(&ps);
        if (ps.p != ps.end) rc = fail(&ps, "%s", "something follows the value");
    }
    if (rc != MT_OK) {
        mt_json_free(v);
        return rc;
    }
    *out = v;
    return MT_OK;
}

const struct mt_json *mt_json_get(const struct mt_json *v, const char *key)
{
    if (!v || v->type != MT_JSON_OBJECT) return NULL;
    for (size_t i = 0; i < v->n; i++)
        if (!strcmp(v->keys[i], key)) return &v->items[i];
    return NULL;
}

bool mt_json_int(const struct mt_json *v, long long lo, long long hi, long long *out)
{
    if (!v || v->type != MT_JSON_NUMBER || !v->is_int || v->integer < lo || v->integer > hi)
        return false;
    *out = v->integer;
    return true;
}

void mt_json_write_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
        else if (*c < 0x20) fprintf(f, "\\u%04x", *c);
        else fputc(*c, f);
    }
    fputc('"', f);
}

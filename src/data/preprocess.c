/* moetrain-preprocess input: plain text and JSONL, tokenised byte by byte.
 *
 * Plain text: a document is a paragraph, i.e. the lines up to the next blank
 * (empty or whitespace-only) line; the lines keep their newlines, the blank
 * lines are dropped. JSONL: a document is one line's JSON object, of which the
 * chosen string field is taken, unescaped to UTF-8 (\uXXXX included, surrogate
 * pairs combined). Every byte of the text is one token. */
#include "data/data.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 512

struct bytes {
    unsigned char *p;
    size_t n, cap;
};

static bool bytes_reserve(struct bytes *b, size_t more)
{
    if (b->n + more <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more) cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

static bool bytes_put(struct bytes *b, const void *p, size_t n)
{
    if (!bytes_reserve(b, n)) return false;
    memcpy(b->p + b->n, p, n);
    b->n += n;
    return true;
}

enum mt_input_format mt_preprocess_format_of(const char *path)
{
    size_t n = strlen(path);
    if ((n >= 6 && strcmp(path + n - 6, ".jsonl") == 0) ||
        (n >= 5 && strcmp(path + n - 5, ".json") == 0))
        return MT_INPUT_JSONL;
    return MT_INPUT_TEXT;
}

/* Writes one document of bytes as tokens; empty documents are skipped. */
static int emit(struct mt_indexed_writer *w, const struct bytes *doc,
                const struct mt_preprocess_opts *o, struct mt_preprocess_stats *st,
                int32_t **tok, size_t *tok_cap, struct mt_err *err)
{
    if (doc->n == 0) {
        st->empty++;
        return MT_OK;
    }
    size_t n = doc->n + (o->append_eod ? 1 : 0);
    if (n > *tok_cap) {
        int32_t *t = realloc(*tok, n * sizeof *t);
        if (!t) return mt_err_set(err, MT_ENOMEM, "out of memory");
        *tok = t;
        *tok_cap = n;
    }
    for (size_t i = 0; i < doc->n; i++) (*tok)[i] = doc->p[i];
    if (o->append_eod) (*tok)[doc->n] = MT_BYTE_EOD;
    MT_CHECK(mt_indexed_writer_add(w, *tok, n, err));
    st->documents++;
    st->tokens += n;
    return MT_OK;
}

/* ------------------------------------------------------------------------- */
/* JSON                                                                       */
/* ------------------------------------------------------------------------- */

struct json {
    const unsigned char *s;
    size_t n, i;
    const char *path;
    uint64_t line;
    struct mt_err *err;
};

__attribute__((format(printf, 2, 3)))
static int json_fail(struct json *j, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return mt_err_set(j->err, MT_EINVAL, "%s:%" PRIu64 ":%zu: error: %s", j->path, j->line,
                      j->i + 1, what);
}

static void json_ws(struct json *j)
{
    while (j->i < j->n && strchr(" \t\r\n", j->s[j->i]) && j->s[j->i]) j->i++;
}

static int json_peek(const struct json *j) { return j->i < j->n ? j->s[j->i] : -1; }

static int hex4(struct json *j, unsigned *out)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        int c = json_peek(j);
        int d = c >= '0' && c <= '9' ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return json_fail(j, "\\u needs four hex digits");
        v = v << 4 | (unsigned)d;
        j->i++;
    }
    *out = v;
    return MT_OK;
}

/* Appends to out; a NULL out (a value being skipped) takes anything. */
static bool put_bytes(struct bytes *out, const void *p, size_t n)
{
    return !out || bytes_put(out, p, n);
}

static bool put_utf8(struct bytes *out, unsigned cp)
{
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) { u[0] = (unsigned char)cp; n = 1; }
    else if (cp < 0x800) { u[0] = (unsigned char)(0xC0 | cp >> 6); n = 2; }
    else if (cp < 0x10000) { u[0] = (unsigned char)(0xE0 | cp >> 12); n = 3; }
    else { u[0] = (unsigned char)(0xF0 | cp >> 18); n = 4; }
    for (size_t k = 1; k < n; k++)
        u[k] = (unsigned char)(0x80 | ((cp >> (6 * (n - 1 - k))) & 0x3F));
    return put_bytes(out, u, n);
}

/* Length of the valid UTF-8 sequence at s (up to n bytes), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    unsigned min, cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if (len > n) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

/* The code point of a \u escape at j->i (just after "\u"), a surrogate pair
 * combined into one. */
static int json_unicode(struct json *j, unsigned *cp)
{
    MT_CHECK(hex4(j, cp));
    if (*cp >= 0xDC00 && *cp <= 0xDFFF) {
        j->i -= 6;
        return json_fail(j, "lone low surrogate \\u%04X", *cp);
    }
    if (*cp < 0xD800 || *cp > 0xDBFF) return MT_OK;
    if (j->n - j->i < 2 || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u') {
        j->i -= 6;
        return json_fail(j, "high surrogate \\u%04X is not followed by a low surrogate", *cp);
    }
    j->i += 2;
    unsigned lo;
    MT_CHECK(hex4(j, &lo));
    if (lo < 0xDC00 || lo > 0xDFFF) {
        j->i -= 12;
        return json_fail(j, "high surrogate \\u%04X is followed by \\u%04X, not a low surrogate",
                         *cp, lo);
    }
    *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
    return MT_OK;
}

/* An escape at j->i (just after its backslash), decoded into out. */
static int json_escape(struct json *j, struct bytes *out)
{
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    int c = json_peek(j);
    const char *at = c > 0 ? strchr(from, c) : NULL;
    bool ok;
    if (at) {
        j->i++;
        ok = put_bytes(out, &to[at - from], 1);
    } else if (c == 'u') {
        j->i++;
        unsigned cp;
        MT_CHECK(json_unicode(j, &cp));
        ok = put_utf8(out, cp);
    } else {
        return json_fail(j, "invalid escape \\%c", c > 0x20 && c < 0x7f ? c : '?');
    }
    return ok ? MT_OK : mt_err_set(j->err, MT_ENOMEM, "out of memory");
}

/* A string at j->i (on its opening quote), decoded into out (NULL: skipped). */
static int json_string(struct json *j, struct bytes *out)
{
    j->i++;
    for (;;) {
        int c = json_peek(j);
        if (c < 0) return json_fail(j, "unterminated string");
        if (c == '"') {
            j->i++;
            return MT_OK;
        }
        if (c < 0x20) return json_fail(j, "control character 0x%02x in a string (escape it)", c);
        if (c == '\\') {
            j->i++;
            MT_CHECK(json_escape(j, out));
            continue;
        }
        size_t len = utf8_len(j->s + j->i, j->n - j->i);
        if (!len) return json_fail(j, "invalid UTF-8 byte 0x%02x", c);
        if (!put_bytes(out, j->s + j->i, len))
            return mt_err_set(j->err, MT_ENOMEM, "out of memory");
        j->i += len;
    }
}

static int json_number(struct json *j)
{
    size_t start = j->i;
    if (json_peek(j) == '-') j->i++;
    int c = json_peek(j);
    if (c == '0') {
        j->i++;
    } else if (c >= '1' && c <= '9') {
        while ((c = json_peek(j)) >= '0' && c <= '9') j->i++;
    } else {
        j->i = start;
        return json_fail(j, "invalid number");
    }
    if (json_peek(j) == '.') {
        j->i++;
        if (!((c = json_peek(j)) >= '0' && c <= '9')) return json_fail(j, "digits must follow '.'");
        while ((c = json_peek(j)) >= '0' && c <= '9') j->i++;
    }
    if (json_peek(j) == 'e' || json_peek(j) == 'E') {
        j->i++;
        if (json_peek(j) == '+' || json_peek(j) == '-') j->i++;
        if (!((c = json_peek(j)) >= '0' && c <= '9'))
            return json_fail(j, "digits must follow the exponent");
        while ((c = json_peek(j)) >= '0' && c <= '9') j->i++;
    }
    return MT_OK;
}

static int json_value(struct json *j, int depth);

/* An object or array at j->i, skipped. */
static int json_container(struct json *j, int depth)
{
    bool object = json_peek(j) == '{';
    char close = object ? '}' : ']';
    if (depth > JSON_MAX_DEPTH) return json_fail(j, "nested deeper than %d", JSON_MAX_DEPTH);
    j->i++;
    json_ws(j);
    if (json_peek(j) == close) {
        j->i++;
        return MT_OK;
    }
    for (;;) {
        json_ws(j);
        if (object) {
            if (json_peek(j) != '"') return json_fail(j, "expected a string key");
            MT_CHECK(json_string(j, NULL));
            json_ws(j);
            if (json_peek(j) != ':') return json_fail(j, "expected ':'");
            j->i++;
            json_ws(j);
        }
        MT_CHECK(json_value(j, depth + 1));
        json_ws(j);
        int c = json_peek(j);
        if (c == close) {
            j->i++;
            return MT_OK;
        }
        if (c != ',') return json_fail(j, "expected ',' or '%c'", close);
        j->i++;
    }
}

static int json_literal(struct json *j, const char *word)
{
    size_t n = strlen(word);
    if (j->n - j->i < n || memcmp(j->s + j->i, word, n) != 0)
        return json_fail(j, "invalid value");
    j->i += n;
    return MT_OK;
}

static int json_value(struct json *j, int depth)
{
    int c = json_peek(j);
    switch (c) {
    case '"': return json_string(j, NULL);
    case '{': case '[': return json_container(j, depth);
    case 't': return json_literal(j, "true");
    case 'f': return json_literal(j, "false");
    case 'n': return json_literal(j, "null");
    case -1: return json_fail(j, "expected a value, found the end of the line");
    default: return json_number(j);
    }
}

/* One JSONL line: an object whose field `key` (a string) becomes doc. */
static int json_document(struct json *j, const char *key, struct bytes *doc, struct bytes *name)
{
    json_ws(j);
    if (json_peek(j) != '{') return json_fail(j, "expected a JSON object ('{') per line");
    j->i++;
    bool found = false;
    json_ws(j);
    if (json_peek(j) == '}') {
        j->i++;
    } else {
        for (;;) {
            json_ws(j);
            if (json_peek(j) != '"') return json_fail(j, "expected a string key");
            name->n = 0;
            MT_CHECK(json_string(j, name));
            json_ws(j);
            if (json_peek(j) != ':') return json_fail(j, "expected ':'");
            j->i++;
            json_ws(j);
            bool mine = name->n == strlen(key) && memcmp(name->p, key, name->n) == 0;
            if (mine && json_peek(j) != '"')
                return json_fail(j, "field \"%s\" is not a string", key);
            if (mine) {
                doc->n = 0;  /* a repeated key: the last one wins, as in Python */
                MT_CHECK(json_string(j, doc));
                found = true;
            } else {
                MT_CHECK(json_value(j, 1));
            }
            json_ws(j);
            int c = json_peek(j);
            j->i++;
            if (c == '}') break;
            if (c != ',') {
                j->i--;
                return json_fail(j, "expected ',' or '}'");
            }
        }
    }
    json_ws(j);
    if (j->i != j->n) return json_fail(j, "unexpected text after the object");
    if (!found) {
        j->i = 0;
        return json_fail(j, "no \"%s\" field (choose the field with --json-key)", key);
    }
    return MT_OK;
}

/* ------------------------------------------------------------------------- */
/* Files                                                                      */
/* ------------------------------------------------------------------------- */

static bool blank(const char *line, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\n\f\v", line[i]) || !line[i]) return false;
    return true;
}

int mt_preprocess_file(struct mt_indexed_writer *w, const char *path,
                       const struct mt_preprocess_opts *opts, struct mt_preprocess_stats *st,
                       struct mt_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return mt_err_errno(err, "%s", path);
    bool jsonl = mt_preprocess_format_of(path) == MT_INPUT_JSONL;
    struct bytes doc = {0}, name = {0};
    int32_t *tok = NULL;
    size_t tok_cap = 0, cap = 0;
    char *line = NULL;
    ssize_t len;
    uint64_t lineno = 0;
    int rc = MT_OK;
    while (rc == MT_OK && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        bool is_blank = blank(line, (size_t)len);
        if (jsonl) {
            if (is_blank) continue;
            struct json j = {(const unsigned char *)line, (size_t)len, 0, path, lineno, err};
            if (len > 0 && line[len - 1] == '\n') j.n--;
            rc = json_document(&j, opts->json_key, &doc, &name);
            if (rc == MT_OK && (rc = emit(w, &doc, opts, st, &tok, &tok_cap, err)) != MT_OK)
                mt_err_prefix(err, "%s:%" PRIu64, path, lineno);
            doc.n = 0;
        } else if (is_blank) {
            if (doc.n && (rc = emit(w, &doc, opts, st, &tok, &tok_cap, err)) != MT_OK)
                mt_err_prefix(err, "%s:%" PRIu64, path, lineno);
            doc.n = 0;
        } else if (!bytes_put(&doc, line, (size_t)len)) {
            rc = mt_err_set(err, MT_ENOMEM, "out of memory");
        }
    }
    if (rc == MT_OK && ferror(f)) rc = mt_err_errno(err, "%s: read", path);
    if (rc == MT_OK && doc.n && (rc = emit(w, &doc, opts, st, &tok, &tok_cap, err)) != MT_OK)
        mt_err_prefix(err, "%s:%" PRIu64, path, lineno);
    fclose(f);
    free(line);
    free(doc.p);
    free(name.p);
    free(tok);
    return rc;
}

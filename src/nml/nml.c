/* moetrain: Fortran namelist parser.  What it accepts and why it is stricter
 * than gfortran in places: see nml.h.
 *
 * One pass checks that the input is UTF-8 text; a recursive-descent parser
 * then reads it with one byte of lookahead, plus one bounded lookahead to tell
 * a logical value `t` from the next name `t = ...`.  Every byte is visited a
 * bounded number of times, so parsing is linear in the input.  Names and
 * strings are copied into one pool owned by the file. */
#include "nml/nml.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Longest source excerpt shown under an error message, in bytes. */
#define SHOW_MAX 160
/* Longest token quoted inside an error message, in bytes. */
#define QUOTE_MAX 40

/* ------------------------------------------------------------------------ */
/* Characters                                                                */

static bool is_letter(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_name_char(int c) { return is_letter(c) || is_digit(c) || c == '_'; }
static bool is_blank(int c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
static int lower(int c) { return (c >= 'A' && c <= 'Z') ? c - 'A' + 'a' : c; }

/* Characters that end a value: blanks, line ends, ',', '/', '!' (EOF too). */
static bool ends_value(int c) { return c == EOF || is_blank(c) || c == ',' || c == '/' || c == '!'; }

/* Length of the valid UTF-8 sequence at p (1 to 4 bytes), or 0 if p does not
 * start one (stray continuation byte, overlong form, surrogate, > U+10FFFF). */
static size_t utf8_len(const unsigned char *p, size_t avail)
{
    unsigned c = p[0];
    size_t n;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) n = 2;
    else if (c >= 0xe0 && c <= 0xef) n = 3;
    else if (c >= 0xf0 && c <= 0xf4) n = 4;
    else return 0;
    if (avail < n) return 0;
    for (size_t k = 1; k < n; k++)
        if ((p[k] & 0xc0) != 0x80) return 0;
    if ((c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] >= 0xa0) ||
        (c == 0xf0 && p[1] < 0x90) || (c == 0xf4 && p[1] >= 0x90))
        return 0;
    return n;
}

/* How many bytes of the n at p to quote in a message: at most QUOTE_MAX, not
 * splitting a UTF-8 sequence. */
static int quote_len(const char *p, size_t n)
{
    if (n <= QUOTE_MAX) return (int)n;
    size_t k = QUOTE_MAX;
    while (k > 0 && ((unsigned char)p[k] & 0xc0) == 0x80) k--;
    return (int)k;
}

/* ------------------------------------------------------------------------ */
/* Error messages: "path:line:col: error: msg", the line, a caret            */

/* A bounded string builder over a fixed buffer; output past cap is dropped. */
struct sbuf {
    char *p;
    size_t cap, len;
};

static void sb_putc(struct sbuf *b, char c)
{
    if (b->len + 1 < b->cap) {
        b->p[b->len++] = c;
        b->p[b->len] = '\0';
    }
}

static void sb_vprintf(struct sbuf *b, const char *fmt, va_list ap)
{
    if (b->len + 1 >= b->cap) return;
    int k = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    if (k < 0) return;
    b->len += (size_t)k < b->cap - b->len ? (size_t)k : b->cap - b->len - 1;
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sb_vprintf(b, fmt, ap);
    va_end(ap);
}

/* Appends src[from, to) as one display line (show) or as the blanks that
 * line up under it (!show).  Tabs stay tabs so a caret lines up in a
 * terminal; a UTF-8 character is one column; other bytes that do not print
 * show as '?'. */
static void sb_source(struct sbuf *b, const unsigned char *src, size_t from, size_t to, bool show)
{
    size_t q = from;
    while (q < to) {
        unsigned c = src[q];
        size_t n = (c < 0x20 || c == 0x7f) ? 0 : utf8_len(src + q, to - q);
        if (c == '\t') {
            sb_putc(b, '\t');
            q++;
        } else if (n == 0) {
            sb_putc(b, show ? '?' : ' ');
            q++;
        } else if (show) {
            for (size_t k = 0; k < n; k++) sb_putc(b, (char)src[q + k]);
            q += n;
        } else {
            sb_putc(b, ' ');
            q += n;
        }
    }
}

static int vformat_error(const char *path, const char *text, size_t len, int line, int col,
                         struct mt_err *err, int code, const char *fmt, va_list ap)
{
    if (!err) return code;
    const unsigned char *src = (const unsigned char *)text;
    struct sbuf b = {err->msg, sizeof err->msg, 0};
    err->code = code;
    err->msg[0] = '\0';
    sb_printf(&b, "%s:%d:%d: error: ", path, line, col);
    sb_vprintf(&b, fmt, ap);

    size_t bol = 0;
    for (int l = 1; l < line && bol < len; l++) {
        const char *nl = memchr(text + bol, '\n', len - bol);
        bol = nl ? (size_t)(nl - text) + 1 : len;
    }
    const char *nl = bol < len ? memchr(text + bol, '\n', len - bol) : NULL;
    size_t eol = nl ? (size_t)(nl - text) : len;
    if (eol > bol && src[eol - 1] == '\r') eol--;
    size_t at = bol + (col > 1 ? (size_t)col - 1 : 0);
    if (at > eol) at = eol;

    /* A long line is cut to SHOW_MAX bytes around the caret. */
    size_t from = bol, to = eol;
    if (eol - bol > SHOW_MAX) {
        from = at - bol > SHOW_MAX / 2 ? at - SHOW_MAX / 2 : bol;
        if (from > eol - SHOW_MAX) from = eol - SHOW_MAX;
        to = from + SHOW_MAX;
        while (from > bol && (src[from] & 0xc0) == 0x80) from--;
        while (to < eol && (src[to] & 0xc0) == 0x80) to++;
    }
    sb_printf(&b, "\n %s", from > bol ? "..." : "");
    sb_source(&b, src, from, to, true);
    if (to < eol) sb_printf(&b, "...");
    sb_printf(&b, "\n %s", from > bol ? "   " : "");
    sb_source(&b, src, from, at, false);
    sb_putc(&b, '^');
    return code;
}

int mt_nml_error_at(const struct mt_nml_file *f, int line, int col, struct mt_err *err,
                    int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vformat_error(f->path, f->src, f->src_len, line, col, err, code, fmt, ap);
    va_end(ap);
    return code;
}

/* ------------------------------------------------------------------------ */
/* Parser state                                                              */

/* A position in the input: byte offset, line (1-based), offset of its line. */
struct cur {
    size_t off;
    int line;
    size_t bol;
};

struct parser {
    const unsigned char *s;
    size_t n;
    struct cur at;
    struct mt_nml_file *f;
    struct mt_err *err;
    size_t pool_used, pool_cap;
    size_t group_cap;    /* capacity of f->groups */
    size_t assign_cap;   /* capacity of the assigns of the group being read */
    size_t value_cap;    /* capacity of the values of the assignment being read */
    size_t file_values;  /* values stored so far, over all assignments */
};

static int col_of(const struct cur *c) { return (int)(c->off - c->bol) + 1; }

static int peek(const struct parser *p) { return p->at.off < p->n ? p->s[p->at.off] : EOF; }

static int peek_at(const struct parser *p, size_t k)
{
    return p->at.off + k < p->n ? p->s[p->at.off + k] : EOF;
}

static void advance(struct parser *p)
{
    if (p->s[p->at.off] == '\n') {
        p->at.line++;
        p->at.bol = p->at.off + 1;
    }
    p->at.off++;
}

/* Moves forward k bytes within the current line. */
static void advance_in_line(struct parser *p, size_t k) { p->at.off += k; }

static int perr(const struct parser *p, const struct cur *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int perr(const struct parser *p, const struct cur *at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vformat_error(p->f->path, p->f->src, p->f->src_len, at->line, col_of(at), p->err, MT_EINVAL,
                  fmt, ap);
    va_end(ap);
    return MT_EINVAL;
}

static int out_of_memory(struct mt_err *err, const char *name)
{
    return mt_err_set(err, MT_ENOMEM, "%s: out of memory while reading the namelist", name);
}

static int nomem(const struct parser *p) { return out_of_memory(p->err, p->f->path); }

/* Length of the token at off: up to the next blank, ',', '/', '!' or EOF. */
static size_t token_len(const struct parser *p, size_t off)
{
    size_t e = off;
    while (e < p->n && !ends_value(p->s[e])) e++;
    return e - off;
}

/* Error "<what> 'token'" for the token at c. */
static int bad_token(const struct parser *p, const struct cur *c, const char *what, const char *hint)
{
    const char *t = (const char *)p->s + c->off;
    size_t n = token_len(p, c->off);
    if (n == 0) n = utf8_len(p->s + c->off, p->n - c->off);
    int q = quote_len(t, n);
    return perr(p, c, "%s '%.*s%s'%s", what, q, t, (size_t)q < n ? "..." : "", hint);
}

/* Error "<what>, found 'x'" (or "found end of file") for the character at c. */
static int bad_char(const struct parser *p, const struct cur *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad_char(const struct parser *p, const struct cur *c, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (c->off >= p->n) return perr(p, c, "%s, found end of file", what);
    if (p->s[c->off] == '\n' || p->s[c->off] == '\r') return perr(p, c, "%s, found end of line", what);
    size_t n = utf8_len(p->s + c->off, p->n - c->off);
    return perr(p, c, "%s, found '%.*s'", what, (int)n, (const char *)p->s + c->off);
}

/* Takes n bytes from the pool.  The pool holds 2 bytes per input byte and
 * every name or string takes at most 2 bytes per byte of its source, so this
 * cannot run out; the check keeps it that way. */
static char *pool_take(struct parser *p, size_t n)
{
    if (n > p->pool_cap - p->pool_used) return NULL;
    char *r = p->f->pool + p->pool_used;
    p->pool_used += n;
    return r;
}

/* Grows *v (elements of size sz, capacity *cap) to hold need elements. */
static bool grow(void **v, size_t *cap, size_t need, size_t sz)
{
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 4;
    while (c < need) c *= 2;
    void *q = realloc(*v, c * sz);
    if (!q) return false;
    *v = q;
    *cap = c;
    return true;
}

/* ------------------------------------------------------------------------ */
/* Whole-input checks and blank skipping                                     */

/* Rejects NUL bytes, control characters other than tab, CR and LF, and bytes
 * that are not UTF-8, naming the first one by line, column and byte offset. */
static int check_text(struct parser *p)
{
    struct cur c = {0, 1, 0};
    while (c.off < p->n) {
        unsigned ch = p->s[c.off];
        if (ch == '\n') {
            c.line++;
            c.bol = ++c.off;
        } else if (ch == 0) {
            return perr(p, &c, "NUL byte at byte offset %zu", c.off);
        } else if ((ch < 0x20 && ch != '\t' && ch != '\r') || ch == 0x7f) {
            return perr(p, &c, "control character 0x%02x at byte offset %zu", ch, c.off);
        } else {
            size_t k = utf8_len(p->s + c.off, p->n - c.off);
            if (k == 0)
                return perr(p, &c, "invalid UTF-8 byte 0x%02x at byte offset %zu (the file must be UTF-8 text)",
                            ch, c.off);
            c.off += k;
        }
    }
    return MT_OK;
}

static void skip_comment(struct parser *p)
{
    const unsigned char *nl = memchr(p->s + p->at.off, '\n', p->n - p->at.off);
    p->at.off = nl ? (size_t)(nl - p->s) : p->n;
}

/* Skips blanks, line ends and comments. */
static void skip_space(struct parser *p)
{
    for (;;) {
        int c = peek(p);
        if (is_blank(c))
            advance(p);
        else if (c == '!')
            skip_comment(p);
        else
            return;
    }
}

/* Whether `&end` or `$end` (any case) is at off, not followed by a name character. */
static bool is_end_marker(const struct parser *p, size_t off)
{
    const unsigned char *s = p->s;
    return off + 4 <= p->n && (s[off] == '&' || s[off] == '$') && lower(s[off + 1]) == 'e' &&
           lower(s[off + 2]) == 'n' && lower(s[off + 3]) == 'd' &&
           (off + 4 == p->n || !is_name_char(s[off + 4]));
}

/* Length of the identifier at off (a letter, then letters, digits, '_'). */
static size_t ident_len(const struct parser *p, size_t off)
{
    size_t e = off;
    if (e < p->n && is_letter(p->s[e]))
        while (e < p->n && is_name_char(p->s[e])) e++;
    return e - off;
}

/* Copies n bytes at off to the pool, lower-case and NUL-terminated. */
static char *pool_lower(struct parser *p, size_t off, size_t n)
{
    char *d = pool_take(p, n + 1);
    if (!d) return NULL;
    for (size_t k = 0; k < n; k++) d[k] = (char)lower(p->s[off + k]);
    d[n] = '\0';
    return d;
}

/* ------------------------------------------------------------------------ */
/* Values                                                                    */

/* The assignment whose values are being read. */
struct assign_ctx {
    struct mt_nml_assign *a;
    size_t limit;          /* the most values it may hold */
    bool section;          /* limit is the length of its index section */
    const char *lhs;       /* its left side in the source, e.g. "a(2:6:2)" */
    int lhs_len;
};

/* Appends r copies of v to the assignment. */
static int add_values(struct parser *p, struct assign_ctx *ac, const struct mt_nml_value *v,
                      unsigned long long r, const struct cur *at)
{
    struct mt_nml_assign *a = ac->a;
    if (r > ac->limit - a->nvalues) {
        if (ac->section)
            return perr(p, at, "too many values for '%.*s': the section has %zu element%s",
                        ac->lhs_len, ac->lhs, ac->limit, ac->limit == 1 ? "" : "s");
        return perr(p, at, "too many values: more than %d in one assignment",
                    MT_NML_MAX_VALUES_PER_ASSIGN);
    }
    if (r > MT_NML_MAX_VALUES_PER_FILE - p->file_values)
        return perr(p, at, "too many values: more than %d in one file", MT_NML_MAX_VALUES_PER_FILE);
    if (!grow((void **)&a->values, &p->value_cap, a->nvalues + r, sizeof *a->values))
        return nomem(p);
    for (unsigned long long k = 0; k < r; k++) a->values[a->nvalues++] = *v;
    p->file_values += r;
    return MT_OK;
}

/* A quoted string; doubled quotes stand for one.  It must close on its line. */
static int parse_string(struct parser *p, struct mt_nml_value *v, const struct cur *at)
{
    const unsigned char *s = p->s;
    unsigned char quote = s[at->off];
    size_t i = at->off + 1, len = 0;
    for (;; i++, len++) {
        if (i >= p->n || s[i] == '\n') return perr(p, at, "unterminated string");
        if (s[i] == quote) {
            if (i + 1 < p->n && s[i + 1] == quote)
                i++;
            else
                break;
        }
    }
    char *d = pool_take(p, len + 1);
    if (!d) return nomem(p);
    size_t k = 0;
    for (size_t j = at->off + 1; j < i; j++) {
        d[k++] = (char)s[j];
        if (s[j] == quote) j++;
    }
    d[k] = '\0';
    v->type = MT_NML_STRING;
    v->s = d;
    advance_in_line(p, i + 1 - at->off);
    return MT_OK;
}

static bool is_exponent_letter(int c)
{
    c = lower(c);
    return c == 'e' || c == 'd' || c == 'q';
}

/* An integer or real constant: [sign] digits [. digits] [exponent], where the
 * exponent is e, d or q (any case) with an optional sign, or a bare sign
 * (`1.5+3`), as Fortran list-directed input allows. */
static int parse_number(struct parser *p, struct mt_nml_value *v, const struct cur *at)
{
    const unsigned char *s = p->s;
    size_t i = at->off, n = p->n;
    bool real = false, neg = s[i] == '-';
    if (s[i] == '+' || neg) i++;
    size_t digits_at = i, digits = 0;
    while (i < n && is_digit(s[i])) i++, digits++;
    if (i < n && s[i] == '.') {
        real = true;
        i++;
        while (i < n && is_digit(s[i])) i++, digits++;
    }
    if (digits == 0) return bad_token(p, at, "invalid value", "");
    size_t exp = i;   /* where the exponent starts, if there is one */
    if (i < n && is_exponent_letter(s[i])) {
        size_t j = i + 1;
        if (j < n && (s[j] == '+' || s[j] == '-')) j++;
        if (!(j < n && is_digit(s[j]))) return bad_token(p, at, "invalid value", "");
        while (j < n && is_digit(s[j])) j++;
        real = true;
        i = j;
    } else if (i + 1 < n && (s[i] == '+' || s[i] == '-') && is_digit(s[i + 1])) {
        i++;
        while (i < n && is_digit(s[i])) i++;
        real = true;
    }
    size_t len = i - at->off;
    const char *t = (const char *)s + at->off;
    int q = quote_len(t, len);
    const char *more = (size_t)q < len ? "..." : "";

    if (!real) {
        unsigned long long lim = (unsigned long long)INT64_MAX + (neg ? 1 : 0), u = 0;
        for (size_t j = digits_at; j < i; j++) {
            unsigned d = s[j] - '0';
            if (u > (lim - d) / 10)
                return perr(p, at, "integer %.*s%s is out of range (the limit is %lld)", q, t, more,
                            (long long)INT64_MAX);
            u = u * 10 + d;
        }
        v->type = MT_NML_INT;
        v->i = neg ? (u == lim ? INT64_MIN : -(long long)u) : (long long)u;
        v->r = (double)v->i;
    } else {
        /* strtod reads the C spelling: 'e' for the exponent letter, always present. */
        char stackbuf[128];
        char *buf = len + 2 <= sizeof stackbuf ? stackbuf : malloc(len + 2);
        if (!buf) return nomem(p);
        size_t k = 0;
        for (size_t j = at->off; j < i; j++) {
            if (j == exp && (s[j] == '+' || s[j] == '-')) buf[k++] = 'e';
            buf[k++] = j == exp && is_letter(s[j]) ? 'e' : (char)s[j];
        }
        buf[k] = '\0';
        double r = strtod(buf, NULL);
        if (buf != stackbuf) free(buf);
        if (!isfinite(r)) return perr(p, at, "real number %.*s%s is out of range", q, t, more);
        v->type = MT_NML_REAL;
        v->r = r;
    }
    advance_in_line(p, len);
    return MT_OK;
}

/* Whether the n bytes at t spell word (lower case) in any case. */
static bool is_word(const unsigned char *t, size_t n, const char *word)
{
    if (n != strlen(word)) return false;
    for (size_t k = 0; k < n; k++)
        if (lower(t[k]) != word[k]) return false;
    return true;
}

/* The length of the logical at the cursor, or 0: '.' then t or f then any
 * letters or dots (`.true.`, `.t.`, `.tru`), or the word t, f, true or false,
 * in any case.  The standard and gfortran also read any other word that
 * starts with t or f (`fast` is false); that is an error here, so a typo or
 * an unquoted string does not become a logical. */
static size_t logical_len(const struct parser *p)
{
    const unsigned char *t = p->s + p->at.off;
    size_t n = token_len(p, p->at.off), k = 1;
    if (t[0] == '.') {
        if (n < 2 || (lower(t[1]) != 't' && lower(t[1]) != 'f')) return 0;
        for (k = 2; k < n && (is_letter(t[k]) || t[k] == '.'); k++) {}
        return k;
    }
    if (is_word(t, n, "t") || is_word(t, n, "f") || is_word(t, n, "true") || is_word(t, n, "false"))
        return n;
    return 0;
}

/* Whether the cursor, at a letter, starts `name[(...)] =`: the next assignment
 * rather than a value such as the logical `t`.  Scans at most to the next
 * token, or to the end of the line inside an index. */
static bool starts_assignment(const struct parser *p)
{
    const unsigned char *s = p->s;
    size_t i = p->at.off, n = p->n;
    while (i < n && (is_name_char(s[i]) || s[i] == '%')) i++;
    if (i < n && s[i] == '(') {
        while (i < n && s[i] != ')' && s[i] != '\n') i++;
        if (i >= n || s[i] != ')') return false;
        i++;
    }
    for (;;) {
        if (i < n && is_blank(s[i])) {
            i++;
        } else if (i < n && s[i] == '!') {
            const unsigned char *nl = memchr(s + i, '\n', n - i);
            i = nl ? (size_t)(nl - s) : n;
        } else {
            return i < n && s[i] == '=';
        }
    }
}

/* One item of a value list: [r*]constant, or r* for r null values. */
static int parse_item(struct parser *p, struct assign_ctx *ac)
{
    const unsigned char *s = p->s;
    struct cur at = p->at;
    unsigned long long r = 1;
    struct mt_nml_value v = {.type = MT_NML_NULL, .line = at.line, .col = col_of(&at)};

    size_t e = at.off;
    while (e < p->n && is_digit(s[e])) e++;
    if (e > at.off && e < p->n && s[e] == '*') {
        /* Stop at the limit digit by digit, so no count can overflow. */
        r = 0;
        for (size_t j = at.off; j < e; j++) {
            r = r * 10 + (s[j] - '0');
            if (r > MT_NML_MAX_VALUES_PER_ASSIGN) {
                int q = quote_len((const char *)s + at.off, e - at.off);
                return perr(p, &at, "repeat count %.*s%s is over the limit of %d values in one assignment",
                            q, (const char *)s + at.off, (size_t)q < e - at.off ? "..." : "",
                            MT_NML_MAX_VALUES_PER_ASSIGN);
            }
        }
        if (r == 0) return perr(p, &at, "repeat count must be at least 1");
        advance_in_line(p, e + 1 - at.off);
        if (ends_value(peek(p))) return add_values(p, ac, &v, r, &at);
    }

    struct cur vat = p->at;
    int c = peek(p);
    size_t logical = 0;
    if (c == '\'' || c == '"') {
        MT_CHECK(parse_string(p, &v, &vat));
    } else if ((c == '.' || is_letter(c)) && (logical = logical_len(p)) > 0) {
        v.type = MT_NML_LOGICAL;
        v.l = lower(c == '.' ? peek_at(p, 1) : c) == 't';
        advance_in_line(p, logical);
    } else if (c == '+' || c == '-' || c == '.' || is_digit(c)) {
        MT_CHECK(parse_number(p, &v, &vat));
    } else if (c == '(') {
        return perr(p, &vat, "complex values are not supported");
    } else if (is_letter(c)) {
        return bad_token(p, &vat, "invalid value", " (strings must be quoted)");
    } else if (c == '=' || c == '*' || c == ')' || c == '%' || c == ';') {
        return bad_char(p, &vat, "expected a value");
    } else {
        return bad_token(p, &vat, "invalid value", "");
    }
    if (peek(p) == ';')
        return perr(p, &p->at, "';' is not a value separator: use ',' or a blank");
    if (!ends_value(peek(p))) return bad_token(p, &vat, "invalid value", "");
    return add_values(p, ac, &v, r, &at);
}

/* The values after `=`, up to '/', '&end', the next `name =` or EOF (the
 * caller reports what is wrong there).  A comma right after '=' or after
 * another comma stands for a null value. */
static int parse_values(struct parser *p, struct assign_ctx *ac)
{
    bool expect = true;
    for (;;) {
        skip_space(p);
        struct cur at = p->at;
        int c = peek(p);
        if (c == ',') {
            if (expect) {
                struct mt_nml_value v = {.type = MT_NML_NULL, .line = at.line, .col = col_of(&at)};
                MT_CHECK(add_values(p, ac, &v, 1, &at));
            }
            expect = true;
            advance(p);
            continue;
        }
        if (c == EOF || c == '/' || c == '&' || c == '$') return MT_OK;
        if (is_letter(c) && starts_assignment(p)) return MT_OK;
        MT_CHECK(parse_item(p, ac));
        expect = false;
    }
}

/* ------------------------------------------------------------------------ */
/* Names, indices, assignments, groups                                       */

/* A signed decimal at the cursor into *v: an index (>= 0) or a stride. */
static int parse_index_number(struct parser *p, long long *v, bool stride)
{
    struct cur at = p->at;
    size_t i = at.off;
    bool neg = p->s[i] == '-';
    if (p->s[i] == '+' || neg) i++;
    if (!(i < p->n && is_digit(p->s[i]))) {
        struct cur c = {i, at.line, at.bol};
        return bad_char(p, &c, "expected digits in the array index");
    }
    long long u = 0;
    for (; i < p->n && is_digit(p->s[i]); i++) {
        if (u > (INT64_MAX - (p->s[i] - '0')) / 10) return perr(p, &at, "array index is too large");
        u = u * 10 + (p->s[i] - '0');
    }
    if (neg && u != 0 && !stride)
        return perr(p, &at, "negative array index -%lld: indices start at 1", u);
    *v = neg ? -u : u;
    advance_in_line(p, i - at.off);
    return MT_OK;
}

/* `(i)`, `(start:end)` or `(start:end:stride)`, start and end optional in a
 * section; the cursor is on '('.  name_off: where the name starts. */
static int parse_index(struct parser *p, struct mt_nml_assign *a, size_t name_off)
{
    struct cur open = p->at;
    struct cur field[3];
    long long v[3] = {0, 0, 1};
    bool have[3] = {false, false, false};
    int nf = 0;   /* number of ':' seen */
    advance_in_line(p, 1);
    for (;;) {
        field[nf] = p->at;
        int c = peek(p);
        if (c == '+' || c == '-' || is_digit(c)) {
            MT_CHECK(parse_index_number(p, &v[nf], nf == 2));
            have[nf] = true;
            c = peek(p);
        }
        if (c == ')') break;
        if (c == ':' && nf < 2) {
            nf++;
            advance_in_line(p, 1);
        } else if (c == ',') {
            return perr(p, &p->at, "multi-dimensional array indices are not supported");
        } else if (c == ' ' || c == '\t') {
            return perr(p, &p->at, "no blanks allowed inside an array index");
        } else {
            return bad_char(p, &p->at, nf < 2 ? "expected an index, ':' or ')'" : "expected a stride or ')'");
        }
    }
    advance_in_line(p, 1);
    int len = (int)(p->at.off - name_off);
    const char *lhs = (const char *)p->s + name_off;
    if (nf == 0 && !have[0]) return perr(p, &open, "empty array index in '%.*s'", len, lhs);
    if (nf == 2 && !have[2]) return perr(p, &field[2], "empty stride in '%.*s'", len, lhs);
    if (v[2] == 0) return perr(p, &field[2], "array stride must not be zero");
    if (v[2] < 0 && !(have[0] && have[1]))
        return perr(p, &open, "a negative stride needs an explicit start and end in '%.*s'", len, lhs);
    a->has_index = true;
    a->stride = v[2];
    a->start = have[0] ? v[0] : 1;
    a->end = nf == 0 ? v[0] : have[1] ? v[1] : -1;
    if (a->end != -1 && (v[2] > 0 ? a->start > a->end : a->start < a->end))
        return perr(p, have[0] ? &field[0] : &open, "empty array section '%.*s': %s", len, lhs,
                    v[2] > 0 ? "start is after end" : "start is before end with a negative stride");
    return MT_OK;
}

/* `name[%comp...][(index)] = values`; the cursor is on the name's letter. */
static int parse_assign(struct parser *p, struct mt_nml_group *g)
{
    struct cur start = p->at;
    size_t e = start.off + ident_len(p, start.off);
    while (e < p->n && p->s[e] == '%') {
        size_t k = ident_len(p, e + 1);
        if (k == 0) {
            struct cur c = {e + 1, start.line, start.bol};
            return bad_char(p, &c, "expected a component name after '%%'");
        }
        e += 1 + k;
    }

    if (!grow((void **)&g->assigns, &p->assign_cap, g->nassign + 1, sizeof *g->assigns))
        return nomem(p);
    struct mt_nml_assign *a = &g->assigns[g->nassign++];
    *a = (struct mt_nml_assign){.start = 1, .end = -1, .stride = 1, .line = start.line,
                                .col = col_of(&start)};
    p->value_cap = 0;
    a->name = pool_lower(p, start.off, e - start.off);
    if (!a->name) return nomem(p);
    advance_in_line(p, e - start.off);

    if (peek(p) == '(') {
        MT_CHECK(parse_index(p, a, start.off));
        if (peek(p) == '%')
            return perr(p, &p->at, "components of array elements are not supported");
        if (peek(p) == '(') return perr(p, &p->at, "substrings and multiple indices are not supported");
    }
    struct assign_ctx ac = {.a = a, .limit = MT_NML_MAX_VALUES_PER_ASSIGN,
                            .lhs = (const char *)p->s + start.off,
                            .lhs_len = (int)(p->at.off - start.off)};
    if (a->has_index && a->end != -1) {
        unsigned long long len = (unsigned long long)((a->end - a->start) / a->stride) + 1;
        if (len <= MT_NML_MAX_VALUES_PER_ASSIGN) {
            ac.limit = (size_t)len;
            ac.section = true;
        }
    }
    skip_space(p);
    if (peek(p) != '=') {
        if (peek(p) == '(' && !a->has_index)
            return perr(p, &p->at, "no blank allowed between '%s' and its index", a->name);
        return bad_char(p, &p->at, "expected '=' after '%.*s'", ac.lhs_len, ac.lhs);
    }
    advance_in_line(p, 1);
    return parse_values(p, &ac);
}

/* A group: the cursor is on its '&' or '$'. */
static int parse_group(struct parser *p)
{
    struct cur start = p->at;
    int opener = peek(p);
    size_t n = ident_len(p, start.off + 1);
    if (n == 0) return perr(p, &start, "expected a namelist group name after '%c'", opener);
    if (is_end_marker(p, start.off))
        return perr(p, &start, "'%cend' outside a namelist group", opener);
    struct cur after = {start.off + 1 + n, start.line, start.bol};
    if (after.off < p->n && !ends_value(p->s[after.off]))
        return bad_char(p, &after, "expected a blank after the group name");

    if (!grow((void **)&p->f->groups, &p->group_cap, p->f->ngroups + 1, sizeof *p->f->groups))
        return nomem(p);
    struct mt_nml_group *g = &p->f->groups[p->f->ngroups++];
    *g = (struct mt_nml_group){.line = start.line, .col = col_of(&start)};
    p->assign_cap = 0;
    g->name = pool_lower(p, start.off + 1, n);
    if (!g->name) return nomem(p);
    advance_in_line(p, 1 + n);

    for (;;) {
        skip_space(p);
        int c = peek(p);
        if (c == ',') {
            advance(p);
        } else if (c == '/') {
            advance(p);
            return MT_OK;
        } else if (is_end_marker(p, p->at.off)) {
            advance_in_line(p, 4);
            return MT_OK;
        } else if (c == EOF) {
            return perr(p, &start, "namelist group '&%s' is not closed: expected '/' or '&end' before the end of the file",
                        g->name);
        } else if (c == '&' || c == '$') {
            return perr(p, &p->at, "expected '/' or '&end' to close namelist group '&%s' (line %d)",
                        g->name, start.line);
        } else if (is_letter(c)) {
            MT_CHECK(parse_assign(p, g));
        } else if (c == '=') {
            return perr(p, &p->at, "expected a variable name before '='");
        } else {
            return bad_token(p, &p->at, "expected a variable name, found", "");
        }
    }
}

/* Skips text between groups: up to the next '&' or '$' outside a comment. */
static void skip_to_group(struct parser *p)
{
    for (;;) {
        int c = peek(p);
        if (c == EOF || c == '&' || c == '$') return;
        if (c == '!')
            skip_comment(p);
        else
            advance(p);
    }
}

static int parse_all(struct parser *p)
{
    MT_CHECK(check_text(p));
    for (;;) {
        skip_to_group(p);
        if (peek(p) == EOF) break;
        MT_CHECK(parse_group(p));
    }
    if (p->f->ngroups == 0) {
        struct cur c = {0, 1, 0};
        return perr(p, &c, "no namelist group found");
    }
    return MT_OK;
}

/* ------------------------------------------------------------------------ */
/* Entry points                                                              */

void mt_nml_free(struct mt_nml_file *f)
{
    if (!f) return;
    for (size_t g = 0; g < f->ngroups; g++) {
        for (size_t a = 0; a < f->groups[g].nassign; a++) free(f->groups[g].assigns[a].values);
        free(f->groups[g].assigns);
    }
    free(f->groups);
    free(f->pool);
    free(f->src);
    free(f->path);
    free(f);
}

/* Parses src (len bytes, malloc'd with room for a NUL, owned from here on). */
static int parse_owned(const char *name, char *src, size_t len, struct mt_nml_file **out,
                       struct mt_err *err)
{
    *out = NULL;
    struct mt_nml_file *f = calloc(1, sizeof *f);
    size_t pool_cap = 2 * len + 16;
    if (f) {
        f->src = src;
        f->src_len = len;
        f->path = strdup(name);
        f->pool = malloc(pool_cap);
    }
    if (!f || !f->path || !f->pool) {
        if (f) mt_nml_free(f);
        else free(src);
        return out_of_memory(err, name);
    }
    src[len] = '\0';
    struct parser p = {.s = (const unsigned char *)src, .n = len, .at = {0, 1, 0}, .f = f,
                       .err = err, .pool_cap = pool_cap};
    int rc = parse_all(&p);
    if (rc != MT_OK) {
        mt_nml_free(f);
        return rc;
    }
    *out = f;
    return MT_OK;
}

int mt_nml_parse_string(const char *display_name, const char *text, size_t len,
                        struct mt_nml_file **out, struct mt_err *err)
{
    const char *name = display_name ? display_name : "<string>";
    *out = NULL;
    if (len > MT_NML_MAX_INPUT)
        return mt_err_set(err, MT_EINVAL, "%s: error: namelist input is larger than %zu MiB", name,
                          MT_NML_MAX_INPUT >> 20);
    char *src = malloc(len + 1);
    if (!src) return out_of_memory(err, name);
    if (len) memcpy(src, text, len);
    return parse_owned(name, src, len, out, err);
}

/* Reads all of fd into a malloc'd buffer with room for a NUL. */
static int read_all(int fd, const char *path, size_t hint, char **buf, size_t *len, struct mt_err *err)
{
    /* hint + 2: room for the file, the NUL, and a read that sees the end. */
    size_t cap = hint + 2 > 4096 ? hint + 2 : 4096, n = 0;
    if (cap > MT_NML_MAX_INPUT + 2) cap = MT_NML_MAX_INPUT + 2;
    char *b = malloc(cap);
    if (!b) return out_of_memory(err, path);
    for (;;) {
        if (n + 1 == cap) {
            /* Full at the largest size: the input is over the limit. */
            if (cap == MT_NML_MAX_INPUT + 2) {
                free(b);
                return mt_err_set(err, MT_EINVAL, "%s: error: namelist file is larger than %zu MiB",
                                  path, MT_NML_MAX_INPUT >> 20);
            }
            size_t c = cap * 2 > MT_NML_MAX_INPUT + 2 ? MT_NML_MAX_INPUT + 2 : cap * 2;
            char *q = realloc(b, c);
            if (!q) {
                free(b);
                return out_of_memory(err, path);
            }
            b = q;
            cap = c;
        }
        ssize_t k = read(fd, b + n, cap - 1 - n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            int e = errno;
            free(b);
            errno = e;
            return mt_err_errno(err, "%s: cannot read namelist file", path);
        }
        if (k == 0) break;
        n += (size_t)k;
    }
    *buf = b;
    *len = n;
    return MT_OK;
}

int mt_nml_parse_file(const char *path, struct mt_nml_file **out, struct mt_err *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mt_err_errno(err, "%s: cannot read namelist file", path);
    struct stat st;
    int bad = fstat(fd, &st) != 0;
    if (bad || S_ISDIR(st.st_mode)) {
        int e = bad ? errno : EISDIR;
        close(fd);
        errno = e;
        return mt_err_errno(err, "%s: cannot read namelist file", path);
    }
    char *buf = NULL;
    size_t len = 0;
    size_t hint = S_ISREG(st.st_mode) && st.st_size > 0 ? (size_t)st.st_size : 0;
    int rc = read_all(fd, path, hint, &buf, &len, err);
    close(fd);
    if (rc != MT_OK) return rc;
    return parse_owned(path, buf, len, out, err);
}

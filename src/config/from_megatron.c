/* moetrain from-megatron: Megatron-LM arguments -> namelist overrides (from_megatron.h).
 * The flags and their keys are megatron.c's table; this file reads a command line,
 * converts the values that need it, applies Megatron's defaults and argument rules,
 * and checks every override against the schema. */
#include "config/from_megatron.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config/megatron.h"
#include "config/schema.h"

/* One flag as given: its name and the words after it. */
struct given {
    const char *name; /* points into argv, up to len */
    size_t len;
    int nvals;
    const char **vals;
    char *eqval;      /* "--flag=V": V */
    bool used;
};

struct conv {
    struct mt_megatron_result *out;
    int ngiven;
    struct given *g;
    struct mt_config dflt;
    struct mt_err *err;
};

static char *vfmt(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s) vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

static char *fmt(const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    char *s = vfmt(f, ap);
    va_end(ap);
    return s;
}

static int oom(struct conv *c) { return mt_err_set(c->err, MT_ENOMEM, "from-megatron: out of memory"); }

static int add_override(struct conv *c, char *ov)
{
    struct mt_megatron_result *o = c->out;
    char **p = ov ? realloc(o->overrides, (size_t)(o->noverrides + 1) * sizeof *p) : NULL;
    if (!p) {
        free(ov);
        return oom(c);
    }
    o->overrides = p;
    o->overrides[o->noverrides++] = ov;
    return MT_OK;
}

/* A note on `given` (a flag and its values, or "(not given)"): status and why. */
static int add_note(struct conv *c, char *given, const char *status, const char *why, ...)
{
    struct mt_megatron_result *o = c->out;
    va_list ap;
    va_start(ap, why);
    char *w = vfmt(why, ap);
    va_end(ap);
    struct mt_megatron_note *n = given && w ? realloc(o->notes, (size_t)(o->nnotes + 1) * sizeof *n)
                                            : NULL;
    if (!n) {
        free(given);
        free(w);
        return oom(c);
    }
    o->notes = n;
    o->notes[o->nnotes++] = (struct mt_megatron_note){ given, status, w };
    return MT_OK;
}

/* "--flag v1 v2" as given */
static char *given_text(const struct given *g)
{
    size_t n = g->len + 1;
    for (int i = 0; i < g->nvals; i++) n += strlen(g->vals[i]) + 3;
    char *s = malloc(n);
    if (!s) return NULL;
    memcpy(s, g->name, g->len);
    s[g->len] = '\0';
    for (int i = 0; i < g->nvals; i++) {
        bool blank = strchr(g->vals[i], ' ') != NULL;
        strcat(s, blank ? " \"" : " ");
        strcat(s, g->vals[i]);
        if (blank) strcat(s, "\"");
    }
    return s;
}

/* The last occurrence of flag (argparse: the last one wins), or NULL. */
static struct given *find_given(struct conv *c, const char *flag)
{
    for (int i = c->ngiven - 1; i >= 0; i--)
        if (strlen(flag) == c->g[i].len && !strncmp(c->g[i].name, flag, c->g[i].len))
            return &c->g[i];
    return NULL;
}

/* The flag's single value into *v; MT_EINVAL when it has none or several. */
static int one_value(struct conv *c, const struct given *g, const char **v)
{
    if (g->nvals != 1)
        return mt_err_set(c->err, MT_EINVAL, "from-megatron: %.*s takes one value, not %d",
                          (int)g->len, g->name, g->nvals);
    *v = g->vals[0];
    return MT_OK;
}

static int parse_int(struct conv *c, const char *flag, const char *v, long *out)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < 0 || n > 1000000000)
        return mt_err_set(c->err, MT_EINVAL, "from-megatron: %s %s: not a non-negative integer",
                          flag, v);
    *out = n;
    return MT_OK;
}

/* An integer flag's value, or dflt when it is not given. */
static int int_flag(struct conv *c, const char *flag, long dflt, long *out)
{
    struct given *g = find_given(c, flag);
    const char *v = NULL;
    if (!g) {
        *out = dflt;
        return MT_OK;
    }
    MT_CHECK(one_value(c, g, &v));
    return parse_int(c, flag, v, out);
}

/* A namelist string literal of s ('...', quotes doubled). */
static char *quoted(const char *s)
{
    char *q = malloc(2 * strlen(s) + 3), *p = q;
    if (!q) return NULL;
    *p++ = '\'';
    for (; *s; s++) {
        if (*s == '\'') *p++ = '\'';
        *p++ = *s;
    }
    *p++ = '\'';
    *p = '\0';
    return q;
}

static const struct mt_key *key_of(const char *key)
{
    char group[64];
    const char *pct = strchr(key, '%');
    if (!pct || (size_t)(pct - key) >= sizeof group) return NULL;
    memcpy(group, key, (size_t)(pct - key));
    group[pct - key] = '\0';
    return mt_schema_find(group, pct + 1);
}

/* "key=value" with value written for the key's type. */
static char *assignment(const char *key, const char *value)
{
    const struct mt_key *k = key_of(key);
    if (k && (k->type == MT_KEY_STRING || k->type == MT_KEY_ENUM)) {
        char *q = quoted(value), *s = q ? fmt("%s=%s", key, q) : NULL;
        free(q);
        return s;
    }
    return fmt("%s=%s", key, value);
}

/* ---- --moe-layer-freq: an integer, or a Python list expression ---------------------- */

/* A list expression of Megatron's --moe-layer-freq: [a, b, ...] of 0/1, '*' by an integer,
 * '+' between lists, parentheses. The grammar is Python's for these operators:
 *   sum := prod ('+' prod)* ; prod := atom ('*' int)* ; atom := '[' ints ']' | '(' sum ')' */
struct lexpr {
    const char *p;
    int *v;
    int n, cap;
    const char *bad;
};

static void skip_blanks(struct lexpr *e)
{
    while (*e->p == ' ' || *e->p == '\t') e->p++;
}

static bool lx_push(struct lexpr *e, int x)
{
    if (e->n == e->cap) {
        int cap = e->cap ? 2 * e->cap : 64;
        if (cap > 1 << 20) return (e->bad = "the list is too long"), false;
        int *v = realloc(e->v, (size_t)cap * sizeof *v);
        if (!v) return (e->bad = "out of memory"), false;
        e->v = v;
        e->cap = cap;
    }
    e->v[e->n++] = x;
    return true;
}

static bool lx_sum(struct lexpr *e);

static bool lx_atom(struct lexpr *e)
{
    skip_blanks(e);
    if (*e->p == '(') {
        e->p++;
        if (!lx_sum(e)) return false;
        skip_blanks(e);
        if (*e->p != ')') return (e->bad = "')' expected"), false;
        e->p++;
        return true;
    }
    if (*e->p != '[') return (e->bad = "'[' or '(' expected"), false;
    e->p++;
    skip_blanks(e);
    if (*e->p == ']') return e->p++, true;
    for (;;) {
        skip_blanks(e);
        if (*e->p != '0' && *e->p != '1') return (e->bad = "list elements must be 0 or 1"), false;
        if (!lx_push(e, *e->p++ - '0')) return false;
        skip_blanks(e);
        if (*e->p == ']') return e->p++, true;
        if (*e->p != ',') return (e->bad = "',' or ']' expected"), false;
        e->p++;
    }
}

static bool lx_prod(struct lexpr *e)
{
    int start = e->n;
    if (!lx_atom(e)) return false;
    for (;;) {
        skip_blanks(e);
        if (*e->p != '*') return true;
        e->p++;
        skip_blanks(e);
        char *end;
        long r = strtol(e->p, &end, 10);
        if (end == e->p || r < 0 || r > 1 << 20) return (e->bad = "a repeat count expected after '*'"), false;
        e->p = end;
        int len = e->n - start;
        if (r == 0) e->n = start;
        for (long i = 1; i < r; i++)
            for (int j = 0; j < len; j++)
                if (!lx_push(e, e->v[start + j])) return false;
    }
}

static bool lx_sum(struct lexpr *e)
{
    if (!lx_prod(e)) return false;
    for (;;) {
        skip_blanks(e);
        if (*e->p != '+') return true;
        e->p++;
        if (!lx_prod(e)) return false;
    }
}

/* moe%layer_freq=... for num_layers layers from the flag's value. */
static int layer_pattern(struct conv *c, const char *value, long num_layers, char **ov)
{
    struct lexpr e = { 0 };
    char *end;
    long every = strtol(value, &end, 10);
    if (end != value && *end == '\0') {
        if (every < 1)
            return mt_err_set(c->err, MT_EINVAL, "from-megatron: --moe-layer-freq %s: must be >= 1",
                              value);
        for (long i = 0; i < num_layers && !e.bad; i++) lx_push(&e, i % every == 0);
    } else {
        /* Megatron's scripts often quote the expression twice: "'([1]*48)'" */
        size_t n = strlen(value);
        char *text = strdup(value);
        if (!text) return oom(c);
        if (n >= 2 && (text[0] == '\'' || text[0] == '"') && text[n - 1] == text[0]) {
            text[n - 1] = '\0';
            e.p = text + 1;
        } else {
            e.p = text;
        }
        if (lx_sum(&e)) {
            skip_blanks(&e);
            if (*e.p) e.bad = "unexpected text after the expression";
        }
        if (e.bad) {
            int rc = mt_err_set(c->err, MT_EINVAL,
                                "from-megatron: --moe-layer-freq %s: %s at '%s' (give an integer N "
                                "or a list expression such as ([0]*1+[1]*47))",
                                value, e.bad, e.p);
            free(text);
            free(e.v);
            return rc;
        }
        free(text);
        if (e.n != num_layers) {
            free(e.v);
            return mt_err_set(c->err, MT_EINVAL,
                              "from-megatron: --moe-layer-freq %s gives %d layers, --num-layers is "
                              "%ld",
                              value, e.n, num_layers);
        }
    }
    if (e.bad) {
        free(e.v);
        return oom(c);
    }
    /* "moe%layer_freq=1*0,47*1": runs as repeat counts */
    size_t cap = 32 + (size_t)e.n * 12;
    char *s = malloc(cap);
    if (!s) {
        free(e.v);
        return oom(c);
    }
    size_t at = (size_t)snprintf(s, cap, "moe%%layer_freq=");
    for (int i = 0; i < e.n;) {
        int j = i;
        while (j < e.n && e.v[j] == e.v[i]) j++;
        at += (size_t)snprintf(s + at, cap - at, "%s%d*%d", i ? "," : "", j - i, e.v[i]);
        i = j;
    }
    free(e.v);
    *ov = s;
    return MT_OK;
}

/* ---- the flags --------------------------------------------------------------------- */

/* Whether the value v is the one `only` names (numbers compared as numbers). */
static bool same_value(const char *v, const char *only)
{
    char *e1, *e2;
    double a = strtod(v, &e1), b = strtod(only, &e2);
    if (e1 != v && !*e1 && e2 != only && !*e2) return a == b;
    return strcasecmp(v, only) == 0;
}

/* Megatron's full_iteration scope of --cuda-graph-modules (--cuda-graph-scope) is
 * moetrain's impl = 'full_iteration'. */
static int graph_full_iteration(struct conv *c, struct given *g)
{
    MT_CHECK(add_override(c, strdup("cuda_graph%impl='full_iteration'")));
    return add_note(c, given_text(g), "converted",
                    "cuda_graph%%impl='full_iteration' (moetrain's name for the scope)");
}

/* An nargs='*' flag: every blank-separated word of its values one element of the key
 * (MT_MEG_WORDS); with scopes, the word full_iteration becomes the impl instead. */
static int words_override(struct conv *c, const struct mt_megatron_flag *f, struct given *g,
                          bool scopes)
{
    if (g->nvals == 0)
        return mt_err_set(c->err, MT_EINVAL, "from-megatron: %s needs a value", f->flag);
    size_t len = strlen(f->key) + 2;
    for (int i = 0; i < g->nvals; i++) len += 2 * strlen(g->vals[i]) + 4;
    char *s = malloc(len);
    if (!s) return oom(c);
    size_t at = (size_t)snprintf(s, len, "%s=", f->key);
    int n = 0, rc = MT_OK;
    for (int i = 0; i < g->nvals && rc == MT_OK; i++) {
        char *words = strdup(g->vals[i]), *save = NULL;
        if (!words) {
            free(s);
            return oom(c);
        }
        for (char *w = strtok_r(words, " \t", &save); w && rc == MT_OK;
             w = strtok_r(NULL, " \t", &save)) {
            if (scopes && strcmp(w, "full_iteration") == 0) {
                rc = graph_full_iteration(c, g);
                continue;
            }
            char *q = quoted(w);
            if (q) at += (size_t)snprintf(s + at, len - at, "%s%s", n++ ? "," : "", q);
            free(q);
        }
        free(words);
    }
    if (rc || (n == 0 && scopes)) { /* only full_iteration: no modules */
        free(s);
        return rc;
    }
    return add_override(c, s);
}

/* A mapped flag given: its override (and a note when its value was converted). */
static int mapped_flag(struct conv *c, const struct mt_megatron_flag *f, struct given *g)
{
    const char *v = NULL;
    char *ov = NULL;
    long num_layers, pp, n;
    if (f->kind == MT_MEG_SWITCH) {
        if (g->nvals)
            return mt_err_set(c->err, MT_EINVAL, "from-megatron: %s takes no value (given: %s)",
                              f->flag, g->vals[0]);
        return add_override(c, strchr(f->key, '=') ? strdup(f->key) : fmt("%s=.true.", f->key));
    }
    switch (f->conv) {
    case MT_MEG_AS_IS:
        MT_CHECK(one_value(c, g, &v));
        return add_override(c, assignment(f->key, v));
    case MT_MEG_WORDS:
        return words_override(c, f, g, false);
    case MT_MEG_LAYER_PATTERN:
        MT_CHECK(one_value(c, g, &v));
        MT_CHECK(int_flag(c, "--num-layers", c->dflt.model.num_layers, &num_layers));
        MT_CHECK(layer_pattern(c, v, num_layers, &ov));
        MT_CHECK(add_note(c, given_text(g), "converted", "%s", ov));
        return add_override(c, ov);
    case MT_MEG_VPP_LAYERS:
        MT_CHECK(one_value(c, g, &v));
        MT_CHECK(parse_int(c, f->flag, v, &n));
        MT_CHECK(int_flag(c, "--num-layers", c->dflt.model.num_layers, &num_layers));
        MT_CHECK(int_flag(c, "--pipeline-model-parallel-size", 1, &pp));
        if (find_given(c, "--decoder-first-pipeline-num-layers") ||
            find_given(c, "--decoder-last-pipeline-num-layers"))
            return add_note(c, given_text(g), "not implemented",
                            "with uneven first or last stages: give "
                            "--num-virtual-stages-per-pipeline-rank instead");
        if (n < 1 || pp < 1 || num_layers % pp || (num_layers / pp) % n)
            return mt_err_set(c->err, MT_EINVAL,
                              "from-megatron: %s %ld: --num-layers %ld / PP %ld is not a multiple "
                              "of it",
                              f->flag, n, num_layers, pp);
        ov = fmt("%s=%ld", f->key, num_layers / pp / n);
        if (ov) MT_CHECK(add_note(c, given_text(g), "converted", "%s (%ld layers / PP %ld / %ld)",
                                  ov, num_layers, pp, n));
        return add_override(c, ov);
    case MT_MEG_GRAPH_IMPL:
        MT_CHECK(one_value(c, g, &v));
        if (strcmp(v, "transformer_engine") == 0) {
            ov = assignment(f->key, "local");
            if (ov) MT_CHECK(add_note(c, given_text(g), "converted", "%s (moetrain captures the same "
                                      "scopes itself)", ov));
            return add_override(c, ov);
        }
        return add_override(c, assignment(f->key, v));
    case MT_MEG_GRAPH_SCOPES:
        return words_override(c, f, g, true);
    case MT_MEG_VOCAB_DIVISOR:
        return MT_OK; /* with --vocab-size, in vocab_rule */
    case MT_MEG_SAMPLES:
    case MT_MEG_WARMUP_FRACTION:
        return MT_OK; /* with the other schedule flags, in schedule_rule */
    }
    return MT_OK;
}

/* A flag given that maps to no key: a note why. */
static int unmapped_flag(struct conv *c, const struct mt_megatron_flag *f, struct given *g)
{
    if (f->kind == MT_MEG_NOT_APPLICABLE && f->only) {
        bool ok = *f->only ? g->nvals == 1 && same_value(g->vals[0], f->only) : g->nvals == 0;
        if (!ok)
            return add_note(c, given_text(g), "not implemented", "%s%s%s", f->why,
                            *f->only ? "; Megatron's value here is not " : "",
                            *f->only ? f->only : "");
    }
    return add_note(c, given_text(g), mt_megatron_kind_name(f->kind), "%s", f->why);
}

/* Megatron's defaults for flags not given, where moetrain's differ. */
static int absent_flag(struct conv *c, const struct mt_megatron_flag *f)
{
    if (f->kind == MT_MEG_VALUE && f->megatron_default) {
        MT_CHECK(add_override(c, assignment(f->key, f->megatron_default)));
        return add_note(c, fmt("%s (not given)", f->flag), "default",
                        "Megatron's default %s: %s = %s", f->megatron_default, f->key,
                        f->megatron_default);
    }
    if (f->kind == MT_MEG_SWITCH && !strchr(f->key, '=')) {
        const struct mt_key *k = key_of(f->key);
        if (k && k->type == MT_KEY_BOOL && k->idef) {
            MT_CHECK(add_override(c, fmt("%s=.false.", f->key)));
            return add_note(c, fmt("%s (not given)", f->flag), "default",
                            "Megatron's default: %s = .false.", f->key);
        }
    }
    if (f->kind == MT_MEG_NOT_APPLICABLE && f->only &&
        !(*f->only && f->megatron_default && same_value(f->megatron_default, f->only)) &&
        !(*f->only && !f->megatron_default))
        return add_note(c, fmt("%s (not given)", f->flag), "not implemented",
                        "%s; Megatron's default is %s", f->why,
                        f->megatron_default ? f->megatron_default : "without it");
    return MT_OK;
}

/* Megatron's vocabulary: --vocab-size padded to a multiple of
 * --make-vocab-size-divisible-by (128) x TP; without --vocab-size, the tokenizer's. */
static int vocab_rule(struct conv *c)
{
    struct given *vg = find_given(c, "--vocab-size");
    struct given *dg = find_given(c, "--make-vocab-size-divisible-by");
    long vocab, div, tp;
    if (!vg)
        return add_note(c, strdup("--vocab-size (not given)"), "not implemented",
                        "Megatron takes the vocabulary from its tokenizer; add --vocab-size N "
                        "(the tokenizer's size; 257 for moetrain-preprocess's bytes)");
    MT_CHECK(int_flag(c, "--vocab-size", 0, &vocab));
    MT_CHECK(int_flag(c, "--make-vocab-size-divisible-by", 128, &div));
    MT_CHECK(int_flag(c, "--tensor-model-parallel-size", 1, &tp));
    if (div < 1 || tp < 1)
        return mt_err_set(c->err, MT_EINVAL,
                          "from-megatron: --make-vocab-size-divisible-by and "
                          "--tensor-model-parallel-size must be >= 1");
    long mult = div * tp, padded = (vocab + mult - 1) / mult * mult;
    if (dg)
        MT_CHECK(add_note(c, given_text(dg), "converted", "pads --vocab-size to a multiple of %ld",
                          mult));
    if (padded == vocab) return MT_OK;
    MT_CHECK(add_override(c, fmt("model%%vocab_size=%ld", padded)));
    return add_note(c, given_text(vg), "converted",
                    "model%%vocab_size=%ld: padded to a multiple of %ld x TP %ld, as Megatron "
                    "pads it",
                    padded, div, tp);
}

static long long gcd(long long a, long long b) { return b ? gcd(b, a % b) : a; }

/* ---- the schedule in samples ------------------------------------------------------- */

/* A flag's count of samples: a non-negative integer, which may exceed an int. */
static int count_flag(struct conv *c, const struct given *g, long long *out)
{
    const char *v = NULL;
    char *end;
    MT_CHECK(one_value(c, g, &v));
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno || end == v || *end || n < 0)
        return mt_err_set(c->err, MT_EINVAL, "from-megatron: %.*s %s: not a non-negative integer",
                          (int)g->len, g->name, v);
    *out = n;
    return MT_OK;
}

/* A decimal number as written ("0.01", ".5", "1e-2") into num / den in lowest terms,
 * so that a fraction of a count is computed exactly (0.1 is one tenth, not the double
 * nearest it). False when it is not a non-negative decimal or does not fit. */
static bool decimal_ratio(const char *s, long long *num, long long *den)
{
    long long n = 0, d = 1;
    int exp10 = 0, digits = 0;
    bool point = false;
    const char *p = s + (*s == '+');
    for (; isdigit((unsigned char)*p) || (*p == '.' && !point); p++) {
        if (*p == '.') {
            point = true;
            continue;
        }
        if (n > (LLONG_MAX - 9) / 10) return false;
        n = n * 10 + (*p - '0');
        digits++;
        exp10 -= point;
    }
    if (!digits) return false;
    const bool signed_exp = p[1] == '-' || p[1] == '+';
    if ((*p == 'e' || *p == 'E') && (isdigit((unsigned char)p[1]) || signed_exp)) {
        char *end;
        long e = strtol(p + 1, &end, 10);
        if (end == p + 1 || e < -30 || e > 30) return false;
        exp10 += (int)e;
        p = end;
    }
    if (*p) return false;
    for (; exp10 > 0; exp10--) {
        if (n > LLONG_MAX / 10) return false;
        n *= 10;
    }
    for (; exp10 < 0; exp10++) {
        if (d > LLONG_MAX / 10) return false;
        d *= 10;
    }
    long long g = gcd(n, d);
    *num = n / g;
    *den = d / g;
    return true;
}

/* The sample count n of flag g as n / gbs iterations into key, when that is whole;
 * else, or when refused says why there is no constant global batch, a note why not.
 * megatron: what Megatron does with a count that is not whole. */
static int samples_to_iters(struct conv *c, struct given *g, const char *key, long long n,
                            long gbs, const char *refused, const char *megatron)
{
    if (refused) return add_note(c, given_text(g), "refused", "%s", refused);
    if (n % gbs)
        return add_note(c, given_text(g), "refused",
                        "%lld samples are %.2f global batches of %ld, not a whole number: %s, "
                        "which moetrain's schedule in whole iterations cannot express; give "
                        "%lld or %lld",
                        n, (double)n / (double)gbs, gbs, megatron, n / gbs * gbs,
                        (n / gbs + 1) * gbs);
    char *ov = fmt("%s=%lld", key, n / gbs);
    if (!ov) return oom(c);
    MT_CHECK(add_note(c, given_text(g), "converted", "%s (%lld samples / global batch %ld)", ov,
                      n, gbs));
    return add_override(c, ov);
}

/* --lr-warmup-fraction F: F x decay (iterations, or samples of global batches of gbs)
 * as warmup iterations, when that is whole; else, or when refused, a note why not. */
static int warmup_fraction(struct conv *c, struct given *g, long long decay, bool in_samples,
                           long gbs, const char *refused)
{
    const char *v = NULL, *unit = in_samples ? "samples" : "iterations";
    long long num, den;
    MT_CHECK(one_value(c, g, &v));
    if (!decimal_ratio(v, &num, &den))
        return mt_err_set(c->err, MT_EINVAL,
                          "from-megatron: --lr-warmup-fraction %s: not a non-negative decimal "
                          "number",
                          v);
    if (refused) return add_note(c, given_text(g), "refused", "%s", refused);
    if (num && decay / den > LLONG_MAX / num)
        return mt_err_set(c->err, MT_EINVAL,
                          "from-megatron: --lr-warmup-fraction %s x %lld %s: too large", v,
                          decay, unit);
    if (decay % den)
        return add_note(c, given_text(g), "refused",
                        "%s x the decay's %lld %s = %g %s, not a whole number: Megatron's "
                        "warmup ends part-way through an iteration, which moetrain's schedule "
                        "in whole iterations cannot express; give --lr-warmup-%s instead",
                        v, decay, unit, (double)decay * (double)num / (double)den, unit,
                        in_samples ? "samples" : "iters");
    const long long warm = decay / den * num;
    if (!in_samples) {
        char *ov = fmt("optimizer%%lr_warmup_iters=%lld", warm);
        if (!ov) return oom(c);
        MT_CHECK(add_note(c, given_text(g), "converted", "%s: %s x the decay's %lld iterations",
                          ov, v, decay));
        return add_override(c, ov);
    }
    if (warm % gbs)
        return add_note(c, given_text(g), "refused",
                        "%s x the decay's %lld samples = %lld samples, %.2f global batches of "
                        "%ld, not a whole number: Megatron's warmup ends part-way through an "
                        "iteration, which moetrain's schedule in whole iterations cannot "
                        "express; give --lr-warmup-samples %lld or %lld instead",
                        v, decay, warm, (double)warm / (double)gbs, gbs, warm / gbs * gbs,
                        (warm / gbs + 1) * gbs);
    char *ov = fmt("optimizer%%lr_warmup_iters=%lld", warm / gbs);
    if (!ov) return oom(c);
    MT_CHECK(add_note(c, given_text(g), "converted",
                      "%s: %s x the decay's %lld samples = %lld samples = %lld global batches "
                      "of %ld",
                      ov, v, decay, warm, warm / gbs, gbs));
    return add_override(c, ov);
}

/* Whether flag g is given with a value other than 0. */
static int nonzero_count(struct conv *c, struct given *g, bool *nonzero)
{
    long long n = 0;
    if (g) MT_CHECK(count_flag(c, g, &n));
    *nonzero = n != 0;
    return MT_OK;
}

/* Megatron's sample-based training (--train-samples, --lr-decay-samples,
 * --lr-warmup-samples) and --lr-warmup-fraction, in iterations. Megatron's scheduler
 * counts samples: an iteration advances it by the global batch G; warmup ends at
 * lr_warmup_samples (or the fraction x the decay), decay at lr_decay_samples (default
 * train_samples); it trains train_samples // G iterations and sizes its training set
 * by train_samples. With iterations it counts the same way, iterations x G. mt_lr_at
 * is that function of iterations, so a count of k x G samples becomes k iterations
 * and every iteration gets the same learning rate. Any other count, a global batch
 * that changes during training, or one that depends on the world size (no
 * --global-batch-size) is refused. The mixtures Megatron's argument checks reject are
 * errors. */
static int schedule_rule(struct conv *c)
{
    struct given *ts = find_given(c, "--train-samples"), *ti = find_given(c, "--train-iters");
    struct given *ds = find_given(c, "--lr-decay-samples"), *di = find_given(c, "--lr-decay-iters");
    struct given *ws = find_given(c, "--lr-warmup-samples");
    struct given *wi = find_given(c, "--lr-warmup-iters");
    struct given *wf = find_given(c, "--lr-warmup-fraction");
    bool ws_set, wi_set;
    MT_CHECK(nonzero_count(c, ws, &ws_set));
    MT_CHECK(nonzero_count(c, wi, &wi_set));
    const char *rule = NULL;
    if (ti && ts)
        rule = "--train-iters and --train-samples: Megatron trains by iterations or by samples, "
               "give one";
    else if (!ts && (ds || ws_set))
        rule = "--lr-decay-samples and --lr-warmup-samples need sample-based training "
               "(--train-samples); with --train-iters give --lr-decay-iters and --lr-warmup-iters";
    else if (ts && (di || wi_set))
        rule = "--lr-decay-iters and --lr-warmup-iters need iteration-based training "
               "(--train-iters); with --train-samples give --lr-decay-samples and "
               "--lr-warmup-samples";
    else if (wf && (ts ? ws_set : wi_set))
        rule = ts ? "give one of --lr-warmup-fraction and --lr-warmup-samples, as Megatron requires"
                  : "give one of --lr-warmup-fraction and --lr-warmup-iters, as Megatron requires";
    else if (wf && !ts && !ti)
        rule = "--lr-warmup-fraction is a fraction of the decay, which Megatron takes from "
               "--train-iters or --train-samples: give one";
    if (rule) return mt_err_set(c->err, MT_EINVAL, "from-megatron: %s", rule);

    if (!ts) { /* by iterations: the warmup fraction, and --lr-warmup-samples 0 */
        if (ws)
            MT_CHECK(add_note(c, given_text(ws), "not applicable",
                              "no warmup in samples, as Megatron reads it with --train-iters"));
        if (!wf) return MT_OK;
        long iters, decay;
        MT_CHECK(int_flag(c, "--train-iters", 0, &iters));
        MT_CHECK(int_flag(c, "--lr-decay-iters", iters, &decay));
        return warmup_fraction(c, wf, decay, false, 1, NULL);
    }

    long gbs;
    long long train, decay, warm = 0;
    MT_CHECK(int_flag(c, "--global-batch-size", 0, &gbs));
    MT_CHECK(count_flag(c, ts, &train));
    decay = train;
    if (ds) MT_CHECK(count_flag(c, ds, &decay));
    if (ws) MT_CHECK(count_flag(c, ws, &warm));
    if (train == 0 || decay == 0)
        return mt_err_set(c->err, MT_EINVAL,
                          "from-megatron: --train-samples and --lr-decay-samples must be "
                          "positive");
    const struct given *ramp = find_given(c, "--rampup-batch-size");
    if (!ramp) ramp = find_given(c, "--step-batch-size-schedule");
    char *refused = NULL;
    if (ramp)
        refused = fmt("with %.*s the global batch changes during training, so Megatron's "
                      "iterations are not all one batch of samples; moetrain's are",
                      (int)ramp->len, ramp->name);
    else if (gbs == 0)
        refused = strdup("without --global-batch-size Megatron's global batch is the micro-batch "
                         "x the data-parallel size, which depends on the world size; give "
                         "--global-batch-size");
    if ((ramp || gbs == 0) && !refused) return oom(c);
    int rc = samples_to_iters(c, ts, "training%train_iters", train, gbs, refused,
                              "Megatron trains the whole batches and drops the rest, but sizes "
                              "its training set (and by default its decay) by all the samples");
    if (!rc && ds)
        rc = samples_to_iters(c, ds, "optimizer%lr_decay_iters", decay, gbs, refused,
                              "Megatron's decay ends part-way through an iteration");
    if (!rc && ws)
        rc = samples_to_iters(c, ws, "optimizer%lr_warmup_iters", warm, gbs, refused,
                              "Megatron's warmup ends part-way through an iteration");
    if (!rc && wf) rc = warmup_fraction(c, wf, decay, true, gbs, refused);
    free(refused);
    return rc;
}

/* Megatron's GQA rule and SwiGLU width. */
static int model_rules(struct conv *c)
{
    struct given *qg = find_given(c, "--num-query-groups");
    if (qg && !find_given(c, "--group-query-attention")) {
        for (int i = 0; i < c->out->noverrides; i++)
            if (!strncmp(c->out->overrides[i], "model%num_query_groups=", 23)) {
                free(c->out->overrides[i]);
                c->out->overrides[i--] = c->out->overrides[--c->out->noverrides];
            }
        MT_CHECK(add_note(c, given_text(qg), "not applicable",
                          "ignored, as Megatron ignores it without --group-query-attention: one "
                          "KV head per query head"));
    }
    if (find_given(c, "--swiglu") && !find_given(c, "--ffn-hidden-size")) {
        long h;
        MT_CHECK(int_flag(c, "--hidden-size", c->dflt.model.hidden_size, &h));
        long ffn = (long)((4.0 * (double)h * 2.0 / 3.0) / 64.0) * 64;
        MT_CHECK(add_override(c, fmt("model%%ffn_hidden_size=%ld", ffn)));
        MT_CHECK(add_note(c, strdup("--ffn-hidden-size (not given)"), "default",
                          "model%%ffn_hidden_size=%ld: Megatron's SwiGLU default, "
                          "int(4 x hidden %ld x 2/3 / 64) x 64",
                          ffn, h));
    }
    return MT_OK;
}

/* The override of key (e.g. "parallel%overlap_p2p_comm="), or -1. */
static int override_of(const struct conv *c, const char *key)
{
    for (int i = 0; i < c->out->noverrides; i++)
        if (!strncmp(c->out->overrides[i], key, strlen(key))) return i;
    return -1;
}

/* Drops the override at index i (its order does not matter). */
static void drop_override(struct conv *c, int i)
{
    free(c->out->overrides[i]);
    c->out->overrides[i] = c->out->overrides[--c->out->noverrides];
}

/* Megatron's p2p overlap: on by default with the interleaved schedule (only
 * --no-overlap-p2p-communication turns it off), turned off without it whatever the flags
 * say (older versions' --overlap-p2p-communication included); its warm-up/flush variant
 * is only read by the interleaved schedule, so it is dropped without it. */
static int pipeline_rule(struct conv *c)
{
    const int v = override_of(c, "parallel%virtual_pipeline_model_parallel_size=");
    const bool vpp = v >= 0 && atol(strchr(c->out->overrides[v], '=') + 1) > 1;
    const int w = override_of(c, "parallel%overlap_p2p_comm_warmup_flush=");
    if (!vpp && w >= 0) {
        drop_override(c, w);
        MT_CHECK(add_note(c, strdup("--overlap-p2p-communication-warmup-flush"),
                          "not applicable",
                          "ignored, as Megatron's non-interleaved schedule does not read it "
                          "(no virtual pipeline)"));
    }
    const int o = override_of(c, "parallel%overlap_p2p_comm=");
    if (vpp && o < 0) {
        MT_CHECK(add_override(c, strdup("parallel%overlap_p2p_comm=.true.")));
        return add_note(c, strdup("--no-overlap-p2p-communication (not given)"), "default",
                        "Megatron's default with the interleaved schedule: "
                        "parallel%%overlap_p2p_comm = .true.");
    }
    if (!vpp && o >= 0 && strstr(c->out->overrides[o], ".true.")) {
        drop_override(c, o);
        return add_note(c, strdup("--overlap-p2p-communication"), "not applicable",
                        "ignored, as Megatron turns p2p overlap off without the interleaved "
                        "schedule (no virtual pipeline)");
    }
    return MT_OK;
}

/* Each override against the schema alone: one it rejects becomes a note. */
static int check_overrides(struct conv *c)
{
    struct mt_megatron_result *o = c->out;
    for (int i = 0; i < o->noverrides; i++) {
        struct mt_config scratch = c->dflt;
        struct mt_err e = { 0 };
        if (mt_config_load(&scratch, 0, NULL, 1, &o->overrides[i], &e) == MT_OK) continue;
        char *ov = o->overrides[i];
        memmove(&o->overrides[i], &o->overrides[i + 1],
                (size_t)(o->noverrides - i - 1) * sizeof *o->overrides);
        o->noverrides--;
        i--;
        int rc = add_note(c, ov, "not implemented", "%s", e.msg);
        if (rc) return rc;
    }
    return MT_OK;
}

/* argv -> the flags given, with their values */
static int read_flags(struct conv *c, int argc, char *const argv[])
{
    c->g = calloc((size_t)argc + 1, sizeof *c->g);
    if (!c->g) return oom(c);
    int i = 0;
    if (argc > 0 && strlen(argv[0]) > 3 && !strcmp(argv[0] + strlen(argv[0]) - 3, ".py")) i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) || !a[2]) {
            MT_CHECK(add_note(c, strdup(a), "unknown",
                              "not a flag: every word must follow a --flag it is a value of"));
            continue;
        }
        struct given *g = &c->g[c->ngiven++];
        g->name = a;
        g->len = strcspn(a, "=");
        g->vals = calloc((size_t)argc, sizeof *g->vals);
        if (!g->vals) return oom(c);
        if (a[g->len] == '=') {
            g->vals[g->nvals++] = a + g->len + 1;
            continue;
        }
        while (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) g->vals[g->nvals++] = argv[++i];
    }
    c->out->nflags = c->ngiven;
    return MT_OK;
}

static int convert(struct conv *c, int argc, char *const argv[])
{
    MT_CHECK(read_flags(c, argc, argv));
    for (int i = 0; i < c->ngiven; i++) {
        struct given *g = &c->g[i];
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)g->len, g->name);
        if (find_given(c, name) != g) continue; /* only the last occurrence counts */
        const struct mt_megatron_flag *f = mt_megatron_find(name);
        if (!f)
            MT_CHECK(add_note(c, given_text(g), "unknown",
                              "not in moetrain's table of Megatron-LM flags "
                              "(src/config/megatron.c): check by hand"));
        else if (f->key)
            MT_CHECK(mapped_flag(c, f, g));
        else
            MT_CHECK(unmapped_flag(c, f, g));
    }
    for (const struct mt_megatron_flag *f = mt_megatron_flags; f->flag; f++)
        if (!find_given(c, f->flag)) MT_CHECK(absent_flag(c, f));
    MT_CHECK(vocab_rule(c));
    MT_CHECK(model_rules(c));
    MT_CHECK(pipeline_rule(c));
    MT_CHECK(schedule_rule(c));
    return check_overrides(c);
}

int mt_megatron_convert(int argc, char *const argv[], struct mt_megatron_result *out,
                        struct mt_err *err)
{
    struct conv c = { .out = out, .err = err };
    memset(out, 0, sizeof *out);
    mt_config_defaults(&c.dflt);
    int rc = convert(&c, argc, argv);
    for (int i = 0; i < c.ngiven; i++) free(c.g[i].vals);
    free(c.g);
    if (rc) mt_megatron_result_free(out);
    return rc;
}

void mt_megatron_result_free(struct mt_megatron_result *c)
{
    for (int i = 0; i < c->noverrides; i++) free(c->overrides[i]);
    for (int i = 0; i < c->nnotes; i++) {
        free(c->notes[i].given);
        free(c->notes[i].why);
    }
    free(c->overrides);
    free(c->notes);
    memset(c, 0, sizeof *c);
}

void mt_megatron_report(const struct mt_megatron_result *c, FILE *out)
{
    static const char *const order[] = { "converted", "default", "not applicable",
                                         "not implemented", "refused", "unknown" };
    int unmapped = 0;
    for (int i = 0; i < c->nnotes; i++)
        unmapped += strcmp(c->notes[i].status, "converted") && strcmp(c->notes[i].status, "default");
    fprintf(out, "moetrain from-megatron: %d flags read; %d notes, %d of them flags or defaults "
                 "not mapped:\n",
            c->nflags, c->nnotes, unmapped);
    for (size_t k = 0; k < sizeof order / sizeof *order; k++)
        for (int i = 0; i < c->nnotes; i++)
            if (!strcmp(c->notes[i].status, order[k]))
                fprintf(out, "  %s: %s: %s\n", c->notes[i].given, c->notes[i].status,
                        c->notes[i].why);
}

int mt_megatron_world_unit(const struct mt_config_parallel *p)
{
    long a = (long)p->tensor_model_parallel_size * p->context_parallel_size;
    long etp = p->expert_tensor_parallel_size ? p->expert_tensor_parallel_size
                                              : p->tensor_model_parallel_size;
    long e = etp * p->expert_model_parallel_size;
    return (int)(a / gcd(a, e) * e * p->pipeline_model_parallel_size);
}

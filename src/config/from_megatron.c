/* moetrain from-megatron: Megatron-LM arguments -> namelist overrides (from_megatron.h).
 * The flags and their keys are megatron.c's table; this file reads a command line,
 * converts the values that need it, applies Megatron's defaults and argument rules,
 * and checks every override against the schema. */
#include "config/from_megatron.h"

#include <errno.h>
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
    case MT_MEG_WORDS: {
        if (g->nvals == 0)
            return mt_err_set(c->err, MT_EINVAL, "from-megatron: %s needs a value", f->flag);
        size_t len = strlen(f->key) + 2;
        for (int i = 0; i < g->nvals; i++) len += 2 * strlen(g->vals[i]) + 4;
        char *s = malloc(len);
        if (!s) return oom(c);
        size_t at = (size_t)snprintf(s, len, "%s=", f->key);
        bool first = true;
        for (int i = 0; i < g->nvals; i++) {
            char *words = strdup(g->vals[i]), *save = NULL;
            if (!words) {
                free(s);
                return oom(c);
            }
            for (char *w = strtok_r(words, " \t", &save); w; w = strtok_r(NULL, " \t", &save)) {
                char *q = quoted(w);
                if (q) at += (size_t)snprintf(s + at, len - at, "%s%s", first ? "" : ",", q);
                free(q);
                first = false;
            }
            free(words);
        }
        return add_override(c, s);
    }
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
    case MT_MEG_VOCAB_DIVISOR:
        return MT_OK; /* with --vocab-size, in vocab_rule */
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

static long gcd(long a, long b) { return b ? gcd(b, a % b) : a; }

int mt_megatron_world_unit(const struct mt_config_parallel *p)
{
    long a = (long)p->tensor_model_parallel_size * p->context_parallel_size;
    long etp = p->expert_tensor_parallel_size ? p->expert_tensor_parallel_size
                                              : p->tensor_model_parallel_size;
    long e = etp * p->expert_model_parallel_size;
    return (int)(a / gcd(a, e) * e * p->pipeline_model_parallel_size);
}

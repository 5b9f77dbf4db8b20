/* Namelist files and overrides -> struct mt_config, through the schema table. */
#include "config/config.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config/megatron.h"
#include "config/schema.h"
#include "nml/nml.h"

#define FIELD(cfg, k) ((char *)(cfg) + (k)->offset)

void mt_config_defaults(struct mt_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (const struct mt_key *k = mt_schema; k->name; k++) {
        char *f = FIELD(cfg, k);
        switch (k->type) {
        case MT_KEY_INT: *(int *)f = (int)k->idef; break;
        case MT_KEY_REAL: *(double *)f = k->rdef; break;
        case MT_KEY_BOOL: *(bool *)f = k->idef != 0; break;
        case MT_KEY_ENUM:
        case MT_KEY_STRING: snprintf(f, k->size, "%s", k->sdef); break;
        case MT_KEY_INT_ARRAY:
            for (size_t i = 0; i < k->size; i++) ((int *)f)[i] = (int)k->idef;
            *(int *)((char *)cfg + k->len_offset) = 0;
            break;
        case MT_KEY_STRING_ARRAY: *(int *)((char *)cfg + k->len_offset) = 0; break;
        }
    }
}

/* ---- "did you mean" ---------------------------------------------------- */

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) return 99;
    size_t prev[65], cur[65];
    for (size_t j = 0; j <= lb; j++) prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(size_t) * (lb + 1));
    }
    return prev[lb];
}

/* Closest candidate within a distance that scales with the word, or NULL. */
static const char *closest(const char *word, const char *const *cands, size_t n)
{
    const char *best = NULL;
    size_t bestd = (size_t)-1, limit = strlen(word) / 3 + 2;
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(word, cands[i]);
        /* a key that contains the word (or the reverse) is a good guess too */
        if (d > 1 && (strstr(cands[i], word) || strstr(word, cands[i]))) d = limit;
        if (d < bestd) { bestd = d; best = cands[i]; }
    }
    return bestd <= limit ? best : NULL;
}

static size_t group_count(void)
{
    size_t n = 0;
    while (mt_schema_groups[n]) n++;
    return n;
}

static bool group_exists(const char *g)
{
    for (size_t i = 0; mt_schema_groups[i]; i++)
        if (strcmp(mt_schema_groups[i], g) == 0) return true;
    return false;
}

static int unknown_group(const struct mt_nml_file *f, const struct mt_nml_group *g,
                         struct mt_err *err)
{
    const char *s = closest(g->name, mt_schema_groups, group_count());
    char hint[256] = "";
    if (s) snprintf(hint, sizeof hint, "; did you mean '&%s'?", s);
    return mt_nml_error_at(f, g->line, g->col, err, MT_EINVAL,
                           "unknown namelist group '&%s'%s (groups: &model &moe &parallel "
                           "&training &optimizer &precision &data &checkpoint &logging "
                           "&topology &host)",
                           g->name, hint);
}

static int unknown_key(const struct mt_nml_file *f, const char *group,
                       const struct mt_nml_assign *a, struct mt_err *err)
{
    const char *names[256] = { 0 };
    size_t n = 0;
    for (const struct mt_key *k = mt_schema; k->name && n < 256; k++)
        if (strcmp(k->group, group) == 0) names[n++] = k->name;
    const char *s = closest(a->name, names, n);
    char hint[512] = "";
    const struct mt_megatron_flag *meg = mt_megatron_for_key(a->name);
    /* a key both spell alike ("lr") is placed below by its group */
    const char *meg_name = meg && meg->key ? strchr(meg->key, '%') + 1 : NULL;
    if (meg_name && strncmp(meg_name, a->name, strcspn(meg_name, "=")) == 0 &&
        a->name[strcspn(meg_name, "=")] == '\0')
        meg = NULL;
    if (meg && meg->key && meg->conv != MT_MEG_AS_IS) { /* a value to convert first */
        snprintf(hint, sizeof hint, "; that is Megatron's %s, which becomes '%s' converted (%s)",
                 meg->flag, meg->key, meg->why);
    } else if (meg && meg->key) { /* Megatron's spelling of a flag moetrain has as a key */
        snprintf(hint, sizeof hint, "; did you mean '%s'? (Megatron's %s)", meg->key, meg->flag);
    } else if (meg) {
        snprintf(hint, sizeof hint, "; that is Megatron's %s: %s in moetrain (%s)", meg->flag,
                 mt_megatron_kind_name(meg->kind), meg->why);
    } else if (s) {
        snprintf(hint, sizeof hint, "; did you mean '%s'?", s);
    } else {
        for (const struct mt_key *k = mt_schema; k->name; k++)
            if (strcmp(k->name, a->name) == 0) {
                snprintf(hint, sizeof hint, "; '%s' belongs in &%s", k->name, k->group);
                break;
            }
    }
    return mt_nml_error_at(f, a->line, a->col, err, MT_EINVAL,
                           "unknown key '%s' in &%s%s (moetrain --help-config lists every key)",
                           a->name, group, hint);
}

/* ---- assigning values -------------------------------------------------- */

static const char *value_type_name(enum mt_nml_type t)
{
    switch (t) {
    case MT_NML_NULL: return "a null value";
    case MT_NML_INT: return "an integer";
    case MT_NML_REAL: return "a real";
    case MT_NML_LOGICAL: return "a logical";
    case MT_NML_STRING: return "a string";
    }
    return "a value";
}

static int type_error(const struct mt_nml_file *f, const char *group, const struct mt_key *k,
                      const struct mt_nml_value *v, struct mt_err *err)
{
    const char *want = "a value";
    switch (k->type) {
    case MT_KEY_INT: want = "an integer"; break;
    case MT_KEY_REAL: want = "a number"; break;
    case MT_KEY_BOOL: want = "a logical (.true. or .false.)"; break;
    case MT_KEY_ENUM:
    case MT_KEY_STRING: want = "a string in quotes"; break;
    case MT_KEY_INT_ARRAY: want = "integers"; break;
    case MT_KEY_STRING_ARRAY: want = "strings in quotes"; break;
    }
    return mt_nml_error_at(f, v->line, v->col, err, MT_EINVAL, "&%s %s expects %s, got %s",
                           group, k->name, want, value_type_name(v->type));
}

/* Copies s into dst (capacity cap) with trailing blanks removed (Fortran
 * character semantics: blank padding is not part of the value). */
static int store_string(const struct mt_nml_file *f, const char *group, const struct mt_key *k,
                        const struct mt_nml_value *v, char *dst, size_t cap, struct mt_err *err)
{
    size_t len = strlen(v->s);
    while (len > 0 && v->s[len - 1] == ' ') len--;
    if (len >= cap)
        return mt_nml_error_at(f, v->line, v->col, err, MT_EINVAL,
                               "&%s %s: string of %zu characters is too long (at most %zu)",
                               group, k->name, len, cap - 1);
    memcpy(dst, v->s, len);
    dst[len] = '\0';
    return MT_OK;
}

static int store_enum(const struct mt_nml_file *f, const char *group, const struct mt_key *k,
                      const struct mt_nml_value *v, char *dst, struct mt_err *err)
{
    char val[128];
    int rc = store_string(f, group, k, v, val, sizeof val, err);
    if (rc == MT_EINVAL)
        return mt_nml_error_at(f, v->line, v->col, err, MT_EINVAL,
                               "&%s %s: unknown value (allowed: %s)", group, k->name,
                               k->choices);
    const char *p = k->choices;
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == strlen(val) && strncasecmp(p, val, n) == 0) {
            memcpy(dst, p, n);
            dst[n] = '\0';
            return MT_OK;
        }
        p += n + (bar ? 1 : 0);
    }
    return mt_nml_error_at(f, v->line, v->col, err, MT_EINVAL,
                           "&%s %s = '%s' is not allowed (allowed: %s)", group, k->name, val,
                           k->choices);
}

static int store_int(const struct mt_nml_file *f, const char *group, const struct mt_key *k,
                     const struct mt_nml_value *v, int *dst, struct mt_err *err)
{
    if (v->type != MT_NML_INT) return type_error(f, group, k, v, err);
    if (v->i < k->imin || v->i > k->imax) {
        if (k->imax == INT32_MAX)
            return mt_nml_error_at(f, v->line, v->col, err, MT_EINVAL,
                                   "&%s %s = %lld is out of range (must be >= %lld)", group,
                                   k->name, v->i, k->imin);
        return mt_nml_error_at(f, v->line, v->col, err, MT_EINVAL,
                               "&%s %s = %lld is out of range (allowed %lld..%lld)", group,
                               k->name, v->i, k->imin, k->imax);
    }
    *dst = (int)v->i;
    return MT_OK;
}

static int store_real(const struct mt_nml_file *f, const char *group, const struct mt_key *k,
                      const struct mt_nml_value *v, double *dst, struct mt_err *err)
{
    double x;
    if (v->type == MT_NML_INT) x = (double)v->i;
    else if (v->type == MT_NML_REAL) x = v->r;
    else return type_error(f, group, k, v, err);
    if (!isfinite(x) || x < k->rmin || x > k->rmax) {
        if (k->rmax >= 1e300)
            return mt_nml_error_at(f, v->line, v->col, err, MT_EINVAL,
                                   "&%s %s = %g is out of range (must be >= %g)", group,
                                   k->name, x, k->rmin);
        return mt_nml_error_at(f, v->line, v->col, err, MT_EINVAL,
                               "&%s %s = %g is out of range (allowed %g..%g)", group, k->name,
                               x, k->rmin, k->rmax);
    }
    *dst = x;
    return MT_OK;
}

static int store_scalar(struct mt_config *cfg, const struct mt_nml_file *f, const char *group,
                        const struct mt_key *k, const struct mt_nml_assign *a,
                        struct mt_err *err)
{
    if (a->has_index)
        return mt_nml_error_at(f, a->line, a->col, err, MT_EINVAL,
                               "&%s %s is a scalar and cannot take an index", group, k->name);
    if (a->nvalues > 1)
        return mt_nml_error_at(f, a->values[1].line, a->values[1].col, err, MT_EINVAL,
                               "&%s %s takes one value, got %zu", group, k->name, a->nvalues);
    if (a->nvalues == 0 || a->values[0].type == MT_NML_NULL) return MT_OK; /* null: keep */
    const struct mt_nml_value *v = &a->values[0];
    char *fld = FIELD(cfg, k);
    switch (k->type) {
    case MT_KEY_INT: return store_int(f, group, k, v, (int *)fld, err);
    case MT_KEY_REAL: return store_real(f, group, k, v, (double *)fld, err);
    case MT_KEY_BOOL:
        if (v->type != MT_NML_LOGICAL) return type_error(f, group, k, v, err);
        *(bool *)fld = v->l;
        return MT_OK;
    case MT_KEY_ENUM:
        if (v->type != MT_NML_STRING) return type_error(f, group, k, v, err);
        return store_enum(f, group, k, v, fld, err);
    case MT_KEY_STRING:
        if (v->type != MT_NML_STRING) return type_error(f, group, k, v, err);
        return store_string(f, group, k, v, fld, k->size, err);
    default: return MT_EINVAL;
    }
}

static int store_array(struct mt_config *cfg, const struct mt_nml_file *f, const char *group,
                       const struct mt_key *k, const struct mt_nml_assign *a,
                       struct mt_err *err)
{
    long long start = a->has_index ? a->start : 1;
    long long stride = a->has_index ? a->stride : 1;
    long long cap = (long long)k->size;
    long long count_limit = (long long)a->nvalues;
    if (a->has_index && a->end != -1) {
        long long n = (a->end - start) / stride + 1;
        if (n < count_limit)
            return mt_nml_error_at(f, a->values[n].line, a->values[n].col, err, MT_EINVAL,
                                   "&%s %s(%lld:%lld:%lld) has %lld elements but %zu values "
                                   "were given",
                                   group, k->name, a->start, a->end, a->stride, n, a->nvalues);
    }
    int *len = (int *)((char *)cfg + k->len_offset);
    for (long long j = 0; j < count_limit; j++) {
        long long idx = start + j * stride; /* 1-based */
        const struct mt_nml_value *v = &a->values[j];
        if (idx < 1 || idx > cap)
            return mt_nml_error_at(f, a->has_index ? a->line : v->line,
                                   a->has_index ? a->col : v->col, err, MT_EINVAL,
                                   "&%s %s(%lld) is out of bounds (valid indices 1..%lld)", group,
                                   k->name, idx, cap);
        if (v->type == MT_NML_NULL) continue;
        if (k->type == MT_KEY_INT_ARRAY) {
            MT_CHECK(store_int(f, group, k, v, (int *)FIELD(cfg, k) + (idx - 1), err));
        } else {
            if (v->type != MT_NML_STRING) return type_error(f, group, k, v, err);
            char *dst = FIELD(cfg, k) + (size_t)(idx - 1) * MT_STR_MAX;
            MT_CHECK(store_string(f, group, k, v, dst, MT_STR_MAX, err));
        }
        if (idx > *len) *len = (int)idx;
    }
    if (k->type == MT_KEY_STRING_ARRAY) {
        /* Fortran character arrays are blank-filled: trailing empty entries are absent */
        char (*arr)[MT_STR_MAX] = (char (*)[MT_STR_MAX])FIELD(cfg, k);
        while (*len > 0 && arr[*len - 1][0] == '\0') (*len)--;
    }
    return MT_OK;
}

static int apply_file(struct mt_config *cfg, const struct mt_nml_file *f, struct mt_err *err)
{
    for (size_t gi = 0; gi < f->ngroups; gi++) {
        const struct mt_nml_group *g = &f->groups[gi];
        if (!group_exists(g->name)) return unknown_group(f, g, err);
        for (size_t ai = 0; ai < g->nassign; ai++) {
            const struct mt_nml_assign *a = &g->assigns[ai];
            const struct mt_key *k = mt_schema_find(g->name, a->name);
            if (!k) return unknown_key(f, g->name, a, err);
            if (k->type == MT_KEY_INT_ARRAY || k->type == MT_KEY_STRING_ARRAY)
                MT_CHECK(store_array(cfg, f, g->name, k, a, err));
            else
                MT_CHECK(store_scalar(cfg, f, g->name, k, a, err));
        }
    }
    return MT_OK;
}

/* "group%key=value" -> "&group key=value /" */
static int parse_override(const char *ov, struct mt_nml_file **out, struct mt_err *err)
{
    const char *pct = strchr(ov, '%');
    const char *eq = strchr(ov, '=');
    if (!pct || !eq || pct > eq || pct == ov)
        return mt_err_set(err, MT_EINVAL,
                          "command-line override '%s' is not of the form group%%key=value "
                          "(e.g. training%%train_iters=10 or moe%%layer_freq=4*1)",
                          ov);
    size_t n = strlen(ov);
    char *text = malloc(n + 8);
    if (!text) return mt_err_set(err, MT_ENOMEM, "out of memory");
    size_t glen = (size_t)(pct - ov);
    snprintf(text, n + 8, "&%.*s %s /", (int)glen, ov, pct + 1);
    char name[64];
    snprintf(name, sizeof name, "command-line override");
    int rc = mt_nml_parse_string(name, text, strlen(text), out, err);
    free(text);
    return rc;
}

int mt_config_load(struct mt_config *cfg, int nfiles, char *const files[], int noverrides,
                   char *const overrides[], struct mt_err *err)
{
    for (int i = 0; i < nfiles + noverrides; i++) {
        struct mt_nml_file *f = NULL;
        char path[4096];
        int rc = i < nfiles ? mt_config_find_namelist(files[i], path, sizeof path, err) : MT_OK;
        if (rc != MT_OK) return rc;
        rc = i < nfiles ? mt_nml_parse_file(path, &f, err)
                        : parse_override(overrides[i - nfiles], &f, err);
        if (rc != MT_OK) return rc;
        rc = apply_file(cfg, f, err);
        mt_nml_free(f);
        if (rc != MT_OK) return rc;
    }
    return MT_OK;
}

/* ---- cross-field rules ------------------------------------------------- */

static int check_order(const char *order, const struct mt_layout *l, struct mt_err *err)
{
    static const char *const dims[] = { "tp", "cp", "ep", "dp", "pp" };
    bool seen[5] = { false };
    int last = -1;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", order);
    for (char *save = NULL, *tok = strtok_r(buf, "-", &save); tok;
         tok = strtok_r(NULL, "-", &save)) {
        int d = -1;
        for (int j = 0; j < 5; j++)
            if (strcasecmp(tok, dims[j]) == 0) d = j;
        if (d < 0)
            return mt_err_set(err, MT_EINVAL,
                              "&parallel order = '%s': unknown dimension '%s' (use tp, cp, ep, "
                              "dp, pp joined by '-', e.g. 'tp-cp-ep-dp-pp')",
                              order, tok);
        if (seen[d])
            return mt_err_set(err, MT_EINVAL, "&parallel order = '%s': '%s' appears twice",
                              order, dims[d]);
        seen[d] = true;
        last = d;
    }
    /* Megatron builds the attention and the expert groups from two rank generators
     * that share this order; only with pp slowest (last) do both put a rank in the
     * same pipeline stage. Otherwise expert-data-parallel groups span stages. */
    if (seen[4] && last != 4)
        return mt_err_set(err, MT_EINVAL,
                          "&parallel order = '%s': 'pp' must come last (the slowest-varying "
                          "dimension), or expert-data-parallel groups would span pipeline "
                          "stages; accepted orders are tp, cp, ep, dp in any order followed "
                          "by pp, e.g. 'tp-cp-ep-dp-pp' (the default) or 'tp-dp-pp'",
                          order);
    const int sizes[5] = { l->tp, l->cp, l->ep, l->dp, l->pp };
    for (int j = 0; j < 5; j++)
        if (!seen[j] && sizes[j] > 1)
            return mt_err_set(err, MT_EINVAL,
                              "&parallel order = '%s' does not name '%s', whose size is %d",
                              order, dims[j], sizes[j]);
    return MT_OK;
}

/* A size derived from the namelist, computed in 64 bits: refused beyond MT_SIZE_MAX
 * with what it is made of (the printf-style `what`, e.g. "micro_batch_size (8) x
 * seq_length (128)") and the fix. */
static int check_size(long long v, struct mt_err *err, const char *fix, const char *what, ...)
    __attribute__((format(printf, 4, 5)));
static int check_size(long long v, struct mt_err *err, const char *fix, const char *what, ...)
{
    if (v <= MT_SIZE_MAX) return MT_OK;
    char buf[512];
    va_list ap;
    va_start(ap, what);
    vsnprintf(buf, sizeof buf, what, ap);
    va_end(ap);
    return mt_err_set(err, MT_EINVAL,
                      "%s = %lld, more than %d, the largest size moetrain computes with; %s",
                      buf, v, MT_SIZE_MAX, fix);
}

static int check_data(const struct mt_config *c, struct mt_err *err)
{
    const struct mt_config_data *d = &c->data;
    if (!d->mock_data && d->data_path_len == 0)
        return mt_err_set(err, MT_EINVAL,
                          "&data: no data_path and mock_data = .false.; set data_path = "
                          "'PREFIX' (a .bin/.idx pair from moetrain-preprocess) or mock_data = "
                          ".true.");
    if (d->data_path_len > 0) {
        struct mt_data_blend *b = malloc(sizeof *b);
        if (!b)
            return mt_err_set(err, MT_ENOMEM, "out of memory checking &data data_path (%zu "
                              "bytes)", sizeof *b);
        int rc = mt_config_data_blend(d, b, err);
        free(b);
        MT_CHECK(rc);
    }
    double split[3];
    return mt_config_data_split(d->split, split, err);
}

/* &recompute: Megatron's rules (TransformerConfig), and modules this model has. */
static int check_recompute(struct mt_config *c, struct mt_err *err)
{
    struct mt_config_recompute *r = &c->recompute;
    const bool full = strcmp(r->granularity, "full") == 0;
    const bool selective = strcmp(r->granularity, "selective") == 0;
    const bool method = strcmp(r->method, "none") != 0;
    if (full && !method)
        return mt_err_set(err, MT_EINVAL,
                          "&recompute granularity = 'full' needs method = 'uniform' (groups of "
                          "num_layers layers keep only their input) or 'block' (the first "
                          "num_layers layers of each model chunk are recomputed)");
    if (!full && method)
        return mt_err_set(err, MT_EINVAL,
                          "&recompute method = '%s' applies only with granularity = 'full' "
                          "(granularity is '%s'); remove method",
                          r->method, r->granularity);
    if (full && r->num_layers < 1)
        return mt_err_set(err, MT_EINVAL,
                          "&recompute granularity = 'full' needs num_layers >= 1 (layers per "
                          "group with method = 'uniform', layers recomputed per model chunk "
                          "with 'block'); for example num_layers = 1");
    if (!full && r->num_layers)
        return mt_err_set(err, MT_EINVAL,
                          "&recompute num_layers = %d applies only with granularity = 'full' "
                          "(granularity is '%s'); remove num_layers",
                          r->num_layers, r->granularity);
    if (r->num_layers > c->model.num_layers)
        return mt_err_set(err, MT_EINVAL,
                          "&recompute num_layers = %d exceeds &model num_layers = %d; at most "
                          "%d",
                          r->num_layers, c->model.num_layers, c->model.num_layers);
    if (!selective && r->modules_len)
        return mt_err_set(err, MT_EINVAL,
                          "&recompute modules applies only with granularity = 'selective' "
                          "(granularity is '%s'); remove modules%s",
                          r->granularity,
                          full ? " (full recompute rebuilds whole layers)" : "");
    if (!selective) return MT_OK;
    if (r->modules_len == 0) { /* Megatron's default */
        snprintf(r->modules[0], MT_STR_MAX, "core_attn");
        r->modules_len = 1;
    }
    bool moe = false, dense = false;
    for (int i = 0; i < c->model.num_layers; i++) {
        moe = moe || (c->moe.num_experts > 0 && c->moe.layer_freq[i]);
        dense = dense || !(c->moe.num_experts > 0 && c->moe.layer_freq[i]);
    }
    for (int i = 0; i < r->modules_len; i++) {
        const char *mod = r->modules[i];
        static const char *const names[] = {"core_attn", "moe_act", "layernorm",
                                            "mlp",       "moe",     "shared_experts"};
        bool known = false;
        for (size_t j = 0; j < sizeof names / sizeof *names; j++)
            known = known || strcmp(mod, names[j]) == 0;
        if (!known)
            return mt_err_set(err, MT_EINVAL,
                              "&recompute modules(%d) = '%s' is not a module of this model; "
                              "choose from core_attn, moe_act, layernorm, mlp, moe, "
                              "shared_experts",
                              i + 1, mod);
        for (int j = 0; j < i; j++)
            if (strcmp(mod, r->modules[j]) == 0)
                return mt_err_set(err, MT_EINVAL,
                                  "&recompute modules(%d) = '%s' repeats modules(%d); name "
                                  "each module once",
                                  i + 1, mod, j + 1);
        const char *missing = NULL;
        if ((strcmp(mod, "moe") == 0 || strcmp(mod, "moe_act") == 0) && !moe)
            missing = "has no MoE layer (&moe num_experts, layer_freq)";
        else if (strcmp(mod, "mlp") == 0 && !dense)
            missing = "has no dense MLP layer (every layer is MoE: &moe layer_freq); the MoE "
                      "block is 'moe'";
        else if (strcmp(mod, "shared_experts") == 0 &&
                 (!moe || c->moe.shared_expert_intermediate_size == 0))
            missing = "has no shared expert (&moe shared_expert_intermediate_size = 0)";
        if (missing)
            return mt_err_set(err, MT_EINVAL,
                              "&recompute modules(%d) = '%s': this model %s; remove it", i + 1,
                              mod, missing);
    }
    return MT_OK;
}

/* &recompute fine_grained_activation_offloading, offload_modules: Megatron's module
 * names whose saved inputs map onto this model's saved tensors. */
static int check_offload(const struct mt_config *c, struct mt_err *err)
{
    const struct mt_config_recompute *r = &c->recompute;
    static const char *const names[MT_OFFLOAD_MODULES] = {
        "attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"};
    const char *accepted = "attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, "
                           "moe_act";
    bool moe = false;
    for (int i = 0; i < c->model.num_layers; i++)
        moe = moe || (c->moe.num_experts > 0 && c->moe.layer_freq[i]);
    if (!r->fine_grained_activation_offloading) {
        if (r->offload_modules_len)
            return mt_err_set(err, MT_EINVAL,
                              "&recompute offload_modules applies only with "
                              "fine_grained_activation_offloading = .true.; set it, or remove "
                              "offload_modules");
        return MT_OK;
    }
    if (r->offload_modules_len == 0)
        return mt_err_set(err, MT_EINVAL,
                          "&recompute fine_grained_activation_offloading = .true. needs "
                          "offload_modules: one or more of %s",
                          accepted);
    if (strcmp(r->granularity, "full") == 0)
        return mt_err_set(err, MT_EINVAL,
                          "&recompute fine_grained_activation_offloading with granularity = "
                          "'full': a fully recomputed layer saves nothing but its group's "
                          "input, so there is nothing to offload; use granularity = "
                          "'selective' or 'none' with offloading");
    for (int i = 0; i < r->offload_modules_len; i++) {
        const char *mod = r->offload_modules[i];
        bool known = false;
        for (int j = 0; j < MT_OFFLOAD_MODULES; j++) known = known || strcmp(mod, names[j]) == 0;
        if (known && !moe && (strcmp(mod, "expert_fc1") == 0 || strcmp(mod, "moe_act") == 0))
            return mt_err_set(err, MT_EINVAL,
                              "&recompute offload_modules(%d) = '%s': this model has no MoE "
                              "layer (&moe num_experts, layer_freq), so no routed experts' "
                              "tensors to offload; remove it",
                              i + 1, mod);
        if (!known)
            return mt_err_set(err, MT_EINVAL,
                              "&recompute offload_modules(%d) = '%s' is not an offloadable "
                              "module; choose from %s",
                              i + 1, mod, accepted);
        for (int j = 0; j < i; j++)
            if (strcmp(mod, r->offload_modules[j]) == 0)
                return mt_err_set(err, MT_EINVAL,
                                  "&recompute offload_modules(%d) = '%s' repeats "
                                  "offload_modules(%d); name each module once",
                                  i + 1, mod, j + 1);
    }
    return MT_OK;
}

int mt_config_check_backend(const struct mt_config *c, const char *backend, struct mt_err *err)
{
    const char *impl = c->cuda_graph.impl;
    if ((!strcmp(impl, "local") || !strcmp(impl, "full_iteration")) && strcmp(backend, "cuda"))
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "&cuda_graph impl = '%s': CUDA graphs need the cuda backend (the %s "
                          "backend launches no kernels to capture); run --backend cuda, or set "
                          "impl = 'none'",
                          impl, backend);
    if (c->recompute.fine_grained_activation_offloading && strcmp(backend, "cpu") == 0)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "&recompute fine_grained_activation_offloading: offloading needs a GPU "
                          "backend; on the CPU backend use &recompute granularity = 'selective' "
                          "(its memory is host memory already), or run --backend cuda");
    return MT_OK;
}

/* The compute capability each recipe's GEMMs need, as Transformer Engine checks it
 * (transformer_engine/pytorch/quantization.py, check_recipe_support): per-tensor FP8
 * from 8.9 (Ada), blockwise from 9.0 (Hopper; Blackwell too), MXFP8 on 10.x and 11.x
 * (not 12.x: its GEMMs lack layouts there), NVFP4 from 10.0. The recipe that fits a
 * GPU is the first of the platform guidance the GPU runs. */
static bool recipe_runs(const char *recipe, int cc)
{
    if (!strcmp(recipe, "nvfp4")) return cc >= 100;
    if (!strcmp(recipe, "mxfp8")) return cc >= 100 && cc < 120;
    if (!strcmp(recipe, "blockwise")) return cc >= 90;
    return cc >= 89; /* delayed, tensorwise */
}

int mt_config_check_recipe_gpu(const struct mt_config *c, const char *gpu, int major, int minor,
                               struct mt_err *err)
{
    const struct mt_config_precision *q = &c->precision;
    const bool fp8 = q->fp8_format[0] != '\0', fp4 = q->fp4_format[0] != '\0';
    if (!fp8 && !fp4) return MT_OK;
    const char *recipe = fp4 ? "nvfp4" : q->fp8_recipe;
    const int cc = 10 * major + minor;
    if (recipe_runs(recipe, cc)) return MT_OK;
    /* what the guidance would have this GPU run: Blackwell MXFP8, Hopper blockwise,
     * Ada and Blackwell 12.x the per-tensor current scaling (Transformer Engine's
     * default recipe there) */
    static const char *const fits[] = {"mxfp8", "blockwise", "tensorwise"};
    const char *fit = NULL;
    for (size_t i = 0; i < sizeof fits / sizeof fits[0] && !fit; i++)
        if (recipe_runs(fits[i], cc) && !(cc >= 100 && !strcmp(fits[i], "blockwise"))) fit = fits[i];
    char key[96];
    if (fp4) snprintf(key, sizeof key, "fp4_format = '%s' (nvfp4)", q->fp4_format);
    else snprintf(key, sizeof key, "fp8_recipe = '%s'", q->fp8_recipe);
    const char *needs = !strcmp(recipe, "nvfp4")   ? "compute capability 10.0 or newer (Blackwell)"
                        : !strcmp(recipe, "mxfp8") ? "compute capability 10.x or 11.x (Blackwell data-center GPUs)"
                        : !strcmp(recipe, "blockwise") ? "compute capability 9.0 or newer (Hopper)"
                                                       : "compute capability 8.9 or newer (Ada)";
    if (!fit)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "&precision %s: the GPU (%s, compute capability %d.%d) runs no FP8/FP4 "
                          "recipe (they need %s); train in bf16 (fp8_format = '', fp4_format = "
                          "''), or run --backend cpu",
                          key, gpu, major, minor, needs);
    return mt_err_set(err, MT_EUNSUPPORTED,
                      "&precision %s: the GPU (%s, compute capability %d.%d) cannot run it (it "
                      "needs %s); the recipe that fits this GPU is %sfp8_recipe = '%s'%s, or run "
                      "--backend cpu",
                      key, gpu, major, minor, needs, fp4 ? "fp4_format = '', fp8_format = 'e4m3', " : "",
                      fit, fp8 && strcmp(q->fp8_format, "e4m3") && strcmp(fit, "tensorwise") ? " with fp8_format = 'e4m3'" : "");
}

/* The rows each local expert's rows are padded to a multiple of (&moe
 * moe_router_padding_for_fp8, doc/fp8.md "Padding the experts' rows"), or 0. */
int mt_config_expert_padding(const struct mt_config *c)
{
    const struct mt_config_precision *q = &c->precision;
    if (!c->moe.moe_router_padding_for_fp8 || !q->fp8_format[0]) return 0;
    return strcmp(q->fp8_recipe, "mxfp8") == 0 ? 32 : 16;
}

/* &moe moe_router_padding_for_fp8: where padding each local expert's rows to the
 * quantised GEMM's alignment applies (doc/fp8.md, "Padding the experts' rows"). */
static int check_expert_padding(const struct mt_config *c, struct mt_err *err)
{
    const struct mt_config_moe *e = &c->moe;
    const struct mt_config_precision *q = &c->precision;
    const struct mt_config_parallel *p = &c->parallel;
    if (!e->moe_router_padding_for_fp8) return MT_OK;
    if (!q->fp8_format[0] && !q->fp4_format[0])
        return mt_err_set(err, MT_EINVAL,
                          "&moe moe_router_padding_for_fp8 = .true. pads the experts' rows for "
                          "the FP8/FP4 GEMMs, but neither &precision fp8_format nor fp4_format "
                          "is set; set one, or remove moe_router_padding_for_fp8");
    if (q->fp4_format[0])
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "&moe moe_router_padding_for_fp8 = .true. with &precision fp4_format = "
                          "'%s' (nvfp4): the stochastic rounding of the weight gradients' "
                          "operands draws each element's bits by its place in the expert's "
                          "transposed rows, which padding moves, so results would change; "
                          "remove moe_router_padding_for_fp8, or use an FP8 recipe",
                          q->fp4_format);
    if (e->expert_capacity_factor > 0 && e->pad_expert_input_to_capacity)
        return mt_err_set(err, MT_EINVAL,
                          "&moe moe_router_padding_for_fp8 = .true. with "
                          "pad_expert_input_to_capacity = .true.: drop-and-pad already gives "
                          "every expert the same fixed number of rows (its capacity); remove "
                          "moe_router_padding_for_fp8, or pad_expert_input_to_capacity");
    if (strcmp(e->token_dispatcher_type, "allgather") == 0 &&
        p->expert_model_parallel_size * p->expert_tensor_parallel_size > 1)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "&moe moe_router_padding_for_fp8 = .true. with token_dispatcher_type = "
                          "'allgather' (expert_model_parallel_size %d x "
                          "expert_tensor_parallel_size %d): that dispatcher plans the experts' "
                          "rows on the device and the host never holds their per-expert counts "
                          "to pad them; use token_dispatcher_type = 'alltoall'",
                          p->expert_model_parallel_size, p->expert_tensor_parallel_size);
    return MT_OK;
}

/* The block recipes on tensor-parallel shards (doc/fp8.md, "Parallel layouts"): a
 * block scale is local to its block, so a rank's shard quantises as one process's
 * tensor does only when the shard boundaries fall on block boundaries, i.e. every
 * width split over TP (ETP for the routed experts) is a multiple of the block per
 * rank: 128 for blockwise (1 x 128 tiles, 128 x 128 weight blocks), 32 for MXFP8, 16
 * for NVFP4 (1 x 16 and 16 x 16). */
static int check_low_precision_blocks(const struct mt_config *c, struct mt_err *err)
{
    const struct mt_config_precision *q = &c->precision;
    const struct mt_config_model *m = &c->model;
    const struct mt_config_parallel *p = &c->parallel;
    const char *recipe = q->fp4_format[0] ? "nvfp4" : q->fp8_format[0] ? q->fp8_recipe : "";
    const int block = strcmp(recipe, "blockwise") == 0 ? 128
                      : strcmp(recipe, "mxfp8") == 0   ? 32
                      : strcmp(recipe, "nvfp4") == 0   ? 16
                                                       : 0;
    if (!block) return MT_OK;
    const int tp = p->tensor_model_parallel_size, etp = p->expert_tensor_parallel_size;
    const int hd = m->kv_channels ? m->kv_channels : m->num_attention_heads
                                                         ? m->hidden_size / m->num_attention_heads
                                                         : 0;
    bool dense = c->moe.num_experts == 0;
    for (int i = 0; i < c->moe.layer_freq_len && i < m->num_layers; i++) dense |= !c->moe.layer_freq[i];
    static const char *const TP = "tensor_model_parallel_size", *const ETP = "expert_tensor_parallel_size";
    const struct { const char *key; int width, split; const char *by; bool on; } w[] = {
        {"&model num_attention_heads x kv_channels", m->num_attention_heads * hd, tp, TP, true},
        {"&model num_query_groups x kv_channels", m->num_query_groups * hd, tp, TP, true},
        {"&model ffn_hidden_size", m->ffn_hidden_size, tp, TP, dense},
        {"&moe shared_expert_intermediate_size", c->moe.shared_expert_intermediate_size, tp, TP,
         c->moe.num_experts > 0 && c->moe.shared_expert_intermediate_size > 0},
        {"&moe moe_ffn_hidden_size", c->moe.moe_ffn_hidden_size, etp, ETP, c->moe.num_experts > 0},
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        if (!w[i].on || w[i].split <= 1 || w[i].width % w[i].split) continue;
        const int per = w[i].width / w[i].split;
        if (per % block)
            return mt_err_set(err, MT_EINVAL,
                              "&precision %s = '%s' with %s = %d split over %s = %d: %d per rank "
                              "is not a multiple of the recipe's %d-element blocks, so a rank's "
                              "blocks would not be those of the whole tensor (nor its result one "
                              "process's); make %s / %s a multiple of %d, or use fp8_recipe = "
                              "'tensorwise' or 'delayed'",
                              q->fp4_format[0] ? "fp4_recipe" : "fp8_recipe", recipe, w[i].key,
                              w[i].width, w[i].by, w[i].split, per, block, w[i].key, w[i].by,
                              block);
    }
    return MT_OK;
}

/* &precision's FP8/FP4 keys (Transformer Engine's recipes, doc/fp8.md): a key that
 * would change nothing in the configuration given is refused, never ignored. */
static int check_low_precision(const struct mt_config *c, struct mt_err *err)
{
    const struct mt_config_precision *q = &c->precision;
    const bool fp8 = q->fp8_format[0] != '\0', fp4 = q->fp4_format[0] != '\0';
    const bool delayed = fp8 && strcmp(q->fp8_recipe, "delayed") == 0;
    if (fp8 && fp4)
        return mt_err_set(err, MT_EINVAL,
                          "&precision fp8_format = '%s' and fp4_format = '%s': choose one "
                          "(NVFP4 runs every low-precision GEMM in FP4); set the other to ''",
                          q->fp8_format, q->fp4_format);
    if (fp8 && strcmp(q->fp8_format, "hybrid") == 0 &&
        (strcmp(q->fp8_recipe, "blockwise") == 0 || strcmp(q->fp8_recipe, "mxfp8") == 0))
        return mt_err_set(err, MT_EINVAL,
                          "&precision fp8_recipe = '%s' quantises gradients to E4M3 as well "
                          "(E5M2 gradients are for the per-tensor recipes); set fp8_format = "
                          "'e4m3'",
                          q->fp8_recipe);
    if (!delayed && (q->fp8_margin != 0 || q->fp8_amax_history_len != 1 ||
                     strcmp(q->fp8_amax_compute_algo, "most_recent") != 0))
        return mt_err_set(err, MT_EINVAL,
                          "&precision fp8_margin = %d, fp8_amax_history_len = %d and "
                          "fp8_amax_compute_algo = '%s' apply to fp8_recipe = 'delayed' only "
                          "(here %s); remove them",
                          q->fp8_margin, q->fp8_amax_history_len, q->fp8_amax_compute_algo,
                          !fp8 ? "fp8_format is ''" : "fp8_recipe is another one");
    if (!fp8 && !fp4 && q->first_last_layers_bf16)
        return mt_err_set(err, MT_EINVAL,
                          "&precision first_last_layers_bf16 = .true. keeps layers out of "
                          "FP8/FP4, but neither fp8_format nor fp4_format is set; remove it or "
                          "set one");
    if (!q->first_last_layers_bf16 &&
        (q->num_layers_at_start_in_bf16 != 1 || q->num_layers_at_end_in_bf16 != 1))
        return mt_err_set(err, MT_EINVAL,
                          "&precision num_layers_at_start_in_bf16 = %d and "
                          "num_layers_at_end_in_bf16 = %d apply only with "
                          "first_last_layers_bf16 = .true.; set it, or remove them",
                          q->num_layers_at_start_in_bf16, q->num_layers_at_end_in_bf16);
    if (q->first_last_layers_bf16 &&
        q->num_layers_at_start_in_bf16 + q->num_layers_at_end_in_bf16 > c->model.num_layers)
        return mt_err_set(err, MT_EINVAL,
                          "&precision num_layers_at_start_in_bf16 (%d) + "
                          "num_layers_at_end_in_bf16 (%d) exceed &model num_layers = %d",
                          q->num_layers_at_start_in_bf16, q->num_layers_at_end_in_bf16,
                          c->model.num_layers);
    MT_CHECK(check_expert_padding(c, err));
    const struct mt_config_parallel *p = &c->parallel;
    if ((fp8 || fp4) && p->context_parallel_size > 1)
        return mt_err_set(err, MT_EINVAL,
                          "&precision %s: with context_parallel_size = %d the linears run on "
                          "token shards whose amaxes and blocks along the tokens are not "
                          "agreed yet; FP8/FP4 needs context_parallel_size = 1",
                          fp8 ? "fp8_format" : "fp4_format", p->context_parallel_size);
    MT_CHECK(check_low_precision_blocks(c, err));
    return MT_OK;
}

/* &cuda_graph impl = 'full_iteration': what one graph of the whole iteration can hold
 * (doc/host-overhead.md, "The full iteration"): static shapes, and nothing the host
 * decides or uploads inside the iteration (a pipeline's schedule, its transfers between
 * stages included, is captured whole, as the rest). Recompute, offloading and the
 * expert bias are held (their buffers fixed, their copies and updates device work), so
 * none is refused here. */
static int check_full_iteration(const struct mt_config *c, bool dropless_moe, struct mt_err *err)
{
    const struct mt_config_moe *e = &c->moe;
    const char *pre = "&cuda_graph impl = 'full_iteration'";
    if (dropless_moe)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "%s: a whole iteration is one graph only where every shape is static, "
                          "and dropless routing (&moe expert_capacity_factor = %g%s) gives each "
                          "expert a number of rows known only after routing; set "
                          "expert_capacity_factor > 0 with pad_expert_input_to_capacity = .true. "
                          "(drop-and-pad), or use impl = 'local' with modules",
                          pre, e->expert_capacity_factor,
                          e->expert_capacity_factor > 0 ? " without pad_expert_input_to_capacity" : "");
    if (c->parallel.overlap_param_gather)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "%s with &parallel overlap_param_gather = .true.: the updated "
                          "parameters' all-gathers are left in flight into the next "
                          "iteration's forward, across the graph's end, and a graph's launch "
                          "completes only once every operation in it has, so none can stay "
                          "in flight past it; set overlap_param_gather = .false. (the "
                          "iteration's gathers are then captured at its end)", pre);
    if (e->router_force_load_balancing)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "%s with &moe router_force_load_balancing: the forced logits are "
                          "copied from host memory in the iteration, which a graph cannot hold; "
                          "remove router_force_load_balancing", pre);
    return MT_OK;
}

/* &cuda_graph: the modules this model has, and the scopes whose shapes are static. */
static int check_cuda_graph(struct mt_config *c, const struct mt_layout *l, struct mt_err *err)
{
    struct mt_config_cuda_graph *g = &c->cuda_graph;
    const struct mt_config_moe *e = &c->moe;
    bool moe = false, dense = false;
    for (int i = 0; i < c->model.num_layers; i++) {
        moe = moe || (e->num_experts > 0 && e->layer_freq[i]);
        dense = dense || !(e->num_experts > 0 && e->layer_freq[i]);
    }
    const bool dropless = !(e->expert_capacity_factor > 0 && e->pad_expert_input_to_capacity);
    const char *nopad = e->expert_capacity_factor > 0 ? " without pad_expert_input_to_capacity" : "";
    if (strcmp(g->impl, "none") == 0) {
        if (g->modules_len)
            return mt_err_set(err, MT_EINVAL,
                              "&cuda_graph modules applies only with impl = 'local' (impl is "
                              "'none'); set impl = 'local', or remove modules");
        return MT_OK;
    }
    if (strcmp(g->impl, "full_iteration") == 0) {
        MT_CHECK(check_full_iteration(c, moe && dropless, err));
        if (g->modules_len)
            return mt_err_set(err, MT_EINVAL,
                              "&cuda_graph modules applies only with impl = 'local' (impl "
                              "'full_iteration' captures the whole iteration); remove modules");
    }
    if (g->warmup_steps < 1)
        return mt_err_set(err, MT_EINVAL,
                          "&cuda_graph warmup_steps = %d: at least 1 eager iteration must come "
                          "before the captures (it sets up what the kernels build once, such as "
                          "the RoPE tables, with copies from host memory that a graph cannot "
                          "hold); set warmup_steps >= 1 (Megatron's default is 3)",
                          g->warmup_steps);
    if (strcmp(g->impl, "full_iteration") == 0) return MT_OK;
    if (g->modules_len == 0) { /* Megatron's advice for dropless MoE; a dense model's layers */
        const char *def[] = {"attn", moe ? "moe_router" : "mlp", "moe_preprocess"};
        g->modules_len = moe ? 3 : 2;
        for (int i = 0; i < g->modules_len; i++) snprintf(g->modules[i], MT_STR_MAX, "%s", def[i]);
    }
    static const char *const names[] = {"attn", "mlp", "moe", "moe_router", "moe_preprocess"};
    bool has[5] = {false};
    for (int i = 0; i < g->modules_len; i++) {
        int j = 0;
        while (j < 5 && strcmp(g->modules[i], names[j])) j++;
        if (j == 5)
            return mt_err_set(err, MT_EINVAL,
                              "&cuda_graph modules(%d) = '%s' is not a scope of this model; choose "
                              "from attn, mlp, moe, moe_router, moe_preprocess",
                              i + 1, g->modules[i]);
        if (has[j])
            return mt_err_set(err, MT_EINVAL,
                              "&cuda_graph modules(%d) = '%s' is named twice; name each scope once",
                              i + 1, g->modules[i]);
        has[j] = true;
        if (j == 1 && !dense)
            return mt_err_set(err, MT_EINVAL,
                              "&cuda_graph modules(%d) = 'mlp': this model has no dense MLP layer "
                              "(every layer is MoE: &moe layer_freq); remove it",
                              i + 1);
        if (j >= 2 && !moe)
            return mt_err_set(err, MT_EINVAL,
                              "&cuda_graph modules(%d) = '%s': this model has no MoE layer (&moe "
                              "num_experts, layer_freq); remove it",
                              i + 1, g->modules[i]);
    }
    if (has[4] && !has[3] && !has[2])
        return mt_err_set(err, MT_EINVAL,
                          "&cuda_graph modules: 'moe_preprocess' needs 'moe_router' (the plan "
                          "reads the router's top-k in the graph before it, as in Megatron); add "
                          "moe_router");
    if (has[2] && (has[3] || has[4]))
        return mt_err_set(err, MT_EINVAL,
                          "&cuda_graph modules: 'moe' captures the whole MoE block, its router "
                          "and plan included; remove moe_router and moe_preprocess, or moe");
    if (has[2] && dropless)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "&cuda_graph modules: 'moe' with dropless routing (&moe "
                          "expert_capacity_factor = %g%s): the experts' rows are known only after "
                          "routing (dynamic shapes), and a graph replays fixed shapes; set "
                          "expert_capacity_factor > 0 with pad_expert_input_to_capacity = .true. "
                          "(drop-and-pad), or capture moe_router and moe_preprocess instead",
                          e->expert_capacity_factor, nopad);
    if ((has[2] || has[3]) && e->router_force_load_balancing)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "&cuda_graph modules: '%s' with &moe router_force_load_balancing: the "
                          "forced logits are copied from host memory in the scope, which a graph "
                          "cannot hold; remove %s, or router_force_load_balancing",
                          has[2] ? "moe" : "moe_router", has[2] ? "moe" : "moe_router");
    return MT_OK;
}

int mt_config_resolve(struct mt_config *c, int world, struct mt_layout *l, struct mt_err *err)
{
    struct mt_config_model *m = &c->model;
    struct mt_config_moe *e = &c->moe;
    struct mt_config_parallel *p = &c->parallel;
    struct mt_config_training *t = &c->training;

    if (world < 1) return mt_err_set(err, MT_EINVAL, "world size %d must be >= 1", world);

    /* derived defaults */
    if (m->num_query_groups == 0) m->num_query_groups = m->num_attention_heads;
    if (m->kv_channels == 0) {
        if (m->hidden_size % m->num_attention_heads)
            return mt_err_set(err, MT_EINVAL,
                              "&model hidden_size = %d is not divisible by num_attention_heads "
                              "= %d; change one, or set kv_channels (the head dimension) "
                              "explicitly",
                              m->hidden_size, m->num_attention_heads);
        m->kv_channels = m->hidden_size / m->num_attention_heads;
    }
    if (m->ffn_hidden_size == 0) {
        MT_CHECK(check_size(4LL * m->hidden_size, err, "set ffn_hidden_size explicitly",
                            "&model ffn_hidden_size = 0 defaults to 4 x hidden_size (%d)",
                            m->hidden_size));
        m->ffn_hidden_size = 4 * m->hidden_size;
    }
    if (e->moe_ffn_hidden_size == 0) e->moe_ffn_hidden_size = m->ffn_hidden_size;
    if (p->expert_tensor_parallel_size == 0)
        p->expert_tensor_parallel_size = p->tensor_model_parallel_size;
    if (c->optimizer.lr_decay_iters == 0) c->optimizer.lr_decay_iters = t->train_iters;

    /* model shape */
    if (m->num_attention_heads % m->num_query_groups)
        return mt_err_set(err, MT_EINVAL,
                          "&model num_query_groups = %d must divide num_attention_heads = %d",
                          m->num_query_groups, m->num_attention_heads);
    if (t->seq_length > m->max_position_embeddings)
        return mt_err_set(err, MT_EINVAL,
                          "&training seq_length = %d exceeds &model max_position_embeddings = "
                          "%d; raise max_position_embeddings",
                          t->seq_length, m->max_position_embeddings);
    if (m->kv_channels % 2)
        return mt_err_set(err, MT_EINVAL,
                          "&model kv_channels = %d must be even (RoPE rotates pairs)",
                          m->kv_channels);
    MT_CHECK(check_size((long long)m->num_attention_heads * m->kv_channels, err,
                        "lower one of them",
                        "&model num_attention_heads (%d) x kv_channels (%d), the query width",
                        m->num_attention_heads, m->kv_channels));
    const long long tokens = (long long)t->micro_batch_size * t->seq_length;
    MT_CHECK(check_size(tokens, err, "lower one of them",
                        "&training micro_batch_size (%d) x seq_length (%d), the tokens of a "
                        "micro-batch",
                        t->micro_batch_size, t->seq_length));

    /* MoE */
    if (e->num_experts > 0) {
        if (e->router_topk > e->num_experts)
            return mt_err_set(err, MT_EINVAL,
                              "&moe router_topk = %d exceeds num_experts = %d", e->router_topk,
                              e->num_experts);
        if (e->layer_freq_len == 0) {
            for (int i = 0; i < m->num_layers; i++) e->layer_freq[i] = 1;
            e->layer_freq_len = m->num_layers;
        } else if (e->layer_freq_len != m->num_layers) {
            return mt_err_set(err, MT_EINVAL,
                              "&moe layer_freq has %d entries but &model num_layers = %d; give "
                              "one 0/1 per layer (e.g. layer_freq = %d*1)",
                              e->layer_freq_len, m->num_layers, m->num_layers);
        }
    } else {
        for (int i = 0; i < e->layer_freq_len; i++)
            if (e->layer_freq[i])
                return mt_err_set(err, MT_EINVAL,
                                  "&moe layer_freq(%d) = 1 asks for an MoE layer but "
                                  "num_experts = 0; set num_experts",
                                  i + 1);
        for (int i = 0; i < m->num_layers; i++) e->layer_freq[i] = 0;
        e->layer_freq_len = m->num_layers;
    }
    if (e->num_experts > 0) {
        MT_CHECK(check_size(tokens * e->router_topk, err, "lower one of them",
                            "&training micro_batch_size (%d) x seq_length (%d) x &moe "
                            "router_topk (%d), the expert rows of a micro-batch",
                            t->micro_batch_size, t->seq_length, e->router_topk));
        /* Megatron's capacity: ceil(tokens * topk / num_experts * factor) per expert */
        double cap = ceil((double)tokens * e->router_topk / e->num_experts *
                          e->expert_capacity_factor);
        if (cap * e->num_experts > MT_SIZE_MAX)
            return mt_err_set(err, MT_EINVAL,
                              "&moe expert_capacity_factor = %g gives each of the num_experts = "
                              "%d experts a capacity of %.0f rows of a micro-batch (%d x %d "
                              "tokens, router_topk %d), more than %d in all, the largest size "
                              "moetrain computes with; lower expert_capacity_factor",
                              e->expert_capacity_factor, e->num_experts, cap,
                              t->micro_batch_size, t->seq_length, e->router_topk, MT_SIZE_MAX);
    }
    if (e->use_upcycling) {
        int nmoe = 0;
        for (int i = 0; i < m->num_layers; i++) nmoe += e->num_experts > 0 && e->layer_freq[i];
        if (nmoe == 0)
            return mt_err_set(err, MT_EINVAL,
                              "&moe use_upcycling = .true. turns a dense model into an MoE "
                              "model, but this model has no MoE layer: set num_experts (and "
                              "layer_freq)");
        if (!c->checkpoint.load[0] && !c->checkpoint.load_hf[0])
            return mt_err_set(err, MT_EINVAL,
                              "&moe use_upcycling = .true. needs the dense model's weights: set "
                              "&checkpoint load_hf (a Hugging Face directory) or load (a "
                              "moetrain checkpoint)");
        if (e->shared_expert_intermediate_size)
            return mt_err_set(err, MT_EINVAL,
                              "&moe use_upcycling = .true. copies the dense MLP into the routed "
                              "experts; a shared expert (shared_expert_intermediate_size = %d) "
                              "has no dense counterpart: set it to 0",
                              e->shared_expert_intermediate_size);
    }
    if (e->pad_expert_input_to_capacity && e->expert_capacity_factor <= 0)
        return mt_err_set(err, MT_EINVAL,
                          "&moe pad_expert_input_to_capacity = .true. needs "
                          "expert_capacity_factor > 0 (it is %g)",
                          e->expert_capacity_factor);

    MT_CHECK(check_recompute(c, err));
    MT_CHECK(check_offload(c, err));
    MT_CHECK(check_low_precision(c, err));

    /* layout */
    l->world_size = world;
    l->tp = p->tensor_model_parallel_size;
    l->cp = p->context_parallel_size;
    l->pp = p->pipeline_model_parallel_size;
    l->vpp = p->virtual_pipeline_model_parallel_size;
    l->ep = p->expert_model_parallel_size;
    l->etp = p->expert_tensor_parallel_size;
    long long attn = (long long)l->tp * l->cp * l->pp;
    long long expert = (long long)l->etp * l->ep * l->pp;
    if (world % attn)
        return mt_err_set(err, MT_EINVAL,
                          "world size %d is not divisible by tensor_model_parallel_size (%d) x "
                          "context_parallel_size (%d) x pipeline_model_parallel_size (%d) = "
                          "%lld",
                          world, l->tp, l->cp, l->pp, attn);
    if (world % expert)
        return mt_err_set(err, MT_EINVAL,
                          "world size %d is not divisible by expert_tensor_parallel_size (%d) x "
                          "expert_model_parallel_size (%d) x pipeline_model_parallel_size (%d) "
                          "= %lld",
                          world, l->etp, l->ep, l->pp, expert);
    l->dp = (int)(world / attn);
    l->edp = (int)(world / expert);
    MT_CHECK(check_order(p->order, l, err));
    if (m->num_attention_heads % l->tp)
        return mt_err_set(err, MT_EINVAL,
                          "&model num_attention_heads = %d is not divisible by "
                          "tensor_model_parallel_size = %d",
                          m->num_attention_heads, l->tp);
    if (m->num_query_groups % l->tp)
        return mt_err_set(err, MT_EINVAL,
                          "&model num_query_groups = %d is not divisible by "
                          "tensor_model_parallel_size = %d",
                          m->num_query_groups, l->tp);
    if (m->ffn_hidden_size % l->tp)
        return mt_err_set(err, MT_EINVAL,
                          "&model ffn_hidden_size = %d is not divisible by "
                          "tensor_model_parallel_size = %d",
                          m->ffn_hidden_size, l->tp);
    if (p->overlap_param_gather && !p->use_distributed_optimizer)
        return mt_err_set(err, MT_EINVAL,
                          "&parallel overlap_param_gather = .true. needs "
                          "use_distributed_optimizer = .true. (only the distributed optimizer "
                          "gathers parameters; Megatron: --overlap-param-gather only supported "
                          "with distributed optimizer)");
    if (p->overlap_param_gather && !p->overlap_grad_reduce)
        return mt_err_set(err, MT_EINVAL,
                          "&parallel overlap_param_gather = .true. needs overlap_grad_reduce = "
                          ".true. (as Megatron: must use --overlap-param-gather with "
                          "--overlap-grad-reduce)");
    if (p->overlap_p2p_comm && l->vpp <= 1)
        return mt_err_set(err, MT_EINVAL,
                          "&parallel overlap_p2p_comm = .true. needs the interleaved pipeline "
                          "schedule (pipeline_model_parallel_size > 1 and "
                          "virtual_pipeline_model_parallel_size > 1; here PP %d, VPP %d): set "
                          "both, or overlap_p2p_comm = .false. (Megatron: the non-interleaved "
                          "schedule does not support overlapping p2p communication)",
                          l->pp, l->vpp);
    if (p->overlap_p2p_comm_warmup_flush && !p->overlap_p2p_comm)
        return mt_err_set(err, MT_EINVAL,
                          "&parallel overlap_p2p_comm_warmup_flush = .true. needs "
                          "overlap_p2p_comm = .true. (and with it the interleaved pipeline "
                          "schedule): set overlap_p2p_comm = .true., or "
                          "overlap_p2p_comm_warmup_flush = .false. (Megatron: "
                          "overlap_p2p_comm_warmup_flush is only valid with overlap_p2p_comm)");
    if (e->moe_shared_expert_overlap) {
        const char *why = NULL;
        if (e->num_experts == 0 || e->shared_expert_intermediate_size == 0)
            why = "a shared expert to overlap (set shared_expert_intermediate_size > 0)";
        else if (l->ep <= 1)
            why = "expert parallelism, whose all-to-all it overlaps (set &parallel "
                  "expert_model_parallel_size > 1)";
        else if (!strcmp(e->token_dispatcher_type, "allgather"))
            why = "the alltoall dispatcher (set token_dispatcher_type = 'alltoall'; the "
                  "allgather dispatcher has no all-to-all to overlap)";
        if (why)
            return mt_err_set(err, MT_EINVAL,
                              "&moe moe_shared_expert_overlap = .true. needs %s, or set "
                              "moe_shared_expert_overlap = .false. (as Megatron, which "
                              "overlaps the shared expert with the alltoall dispatcher's "
                              "communication only)",
                              why);
    }
    if (l->tp > 1) {
        if (!p->sequence_parallel)
            return mt_err_set(err, MT_EINVAL,
                              "&parallel tensor_model_parallel_size = %d needs sequence_parallel "
                              "= .true. (moetrain implements tensor parallelism with sequence "
                              "parallelism, as Megatron requires for MoE)",
                              l->tp);
        if (t->seq_length % l->tp)
            return mt_err_set(err, MT_EINVAL,
                              "&training seq_length = %d is not divisible by "
                              "tensor_model_parallel_size = %d (sequence parallelism splits it)",
                              t->seq_length, l->tp);
        if (e->shared_expert_intermediate_size % l->tp)
            return mt_err_set(err, MT_EINVAL,
                              "&moe shared_expert_intermediate_size = %d is not divisible by "
                              "tensor_model_parallel_size = %d",
                              e->shared_expert_intermediate_size, l->tp);
        if (m->vocab_size < l->tp)
            return mt_err_set(err, MT_EINVAL,
                              "&model vocab_size = %d is smaller than "
                              "tensor_model_parallel_size = %d",
                              m->vocab_size, l->tp);
    }
    if (e->num_experts > 0) {
        if (e->num_experts % l->ep)
            return mt_err_set(err, MT_EINVAL,
                              "&moe num_experts = %d is not divisible by "
                              "expert_model_parallel_size = %d",
                              e->num_experts, l->ep);
        if (e->moe_ffn_hidden_size % l->etp)
            return mt_err_set(err, MT_EINVAL,
                              "&moe moe_ffn_hidden_size = %d is not divisible by "
                              "expert_tensor_parallel_size = %d",
                              e->moe_ffn_hidden_size, l->etp);
    } else if (l->ep > 1) {
        return mt_err_set(err, MT_EINVAL,
                          "&parallel expert_model_parallel_size = %d needs an MoE model "
                          "(&moe num_experts > 0)",
                          l->ep);
    }
    if (l->vpp > 1 && l->pp == 1)
        return mt_err_set(err, MT_EINVAL,
                          "&parallel virtual_pipeline_model_parallel_size = %d needs "
                          "pipeline_model_parallel_size > 1",
                          l->vpp);
    const int pfirst = p->decoder_first_pipeline_num_layers;
    const int plast = p->decoder_last_pipeline_num_layers;
    if ((pfirst || plast) && l->pp == 1)
        return mt_err_set(err, MT_EINVAL,
                          "&parallel decoder_%s_pipeline_num_layers = %d needs "
                          "pipeline_model_parallel_size > 1",
                          pfirst ? "first" : "last", pfirst ? pfirst : plast);
    if (pfirst || plast) {
        long long rest = (long long)m->num_layers - pfirst - plast;
        int middle = l->pp - (pfirst > 0) - (plast > 0);
        if (rest < 0 || (middle == 0 && rest != 0) || (middle > 0 && rest < middle))
            return mt_err_set(err, MT_EINVAL,
                              "&parallel decoder_first_pipeline_num_layers (%d) + "
                              "decoder_last_pipeline_num_layers (%d) leave %lld of num_layers = "
                              "%d for the %d other pipeline stage(s)",
                              pfirst, plast, rest, m->num_layers, middle);
        if (middle > 0 && rest % ((long long)middle * l->vpp))
            return mt_err_set(err, MT_EINVAL,
                              "&model num_layers = %d less decoder_first_pipeline_num_layers (%d) "
                              "and decoder_last_pipeline_num_layers (%d) = %lld is not divisible "
                              "by the %d other pipeline stage(s) x "
                              "virtual_pipeline_model_parallel_size (%d)",
                              m->num_layers, pfirst, plast, rest, middle, l->vpp);
    } else if (m->num_layers % ((long long)l->pp * l->vpp))
        return mt_err_set(err, MT_EINVAL,
                          "&model num_layers = %d is not divisible by "
                          "pipeline_model_parallel_size (%d) x "
                          "virtual_pipeline_model_parallel_size (%d)",
                          m->num_layers, l->pp, l->vpp);
    if (l->cp > 1)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "&parallel context_parallel_size = %d: context parallelism is not "
                          "implemented in this version of moetrain; use 1",
                          l->cp);

    /* batch */
    const long long per_step = (long long)t->micro_batch_size * l->dp;
    MT_CHECK(check_size(per_step, err, "lower micro_batch_size",
                        "&training micro_batch_size (%d) x data-parallel size (%d), the "
                        "sequences of one micro-batch step%s",
                        t->micro_batch_size, l->dp,
                        t->global_batch_size ? "" : " and the default global_batch_size"));
    if (t->global_batch_size == 0) t->global_batch_size = (int)per_step;
    if (t->global_batch_size % per_step)
        return mt_err_set(err, MT_EINVAL,
                          "&training global_batch_size = %d is not divisible by "
                          "micro_batch_size (%d) x data-parallel size (%d) = %lld",
                          t->global_batch_size, t->micro_batch_size, l->dp, per_step);
    l->num_micro_batches = (int)(t->global_batch_size / per_step);
    if (l->vpp > 1 && l->num_micro_batches % l->pp)
        return mt_err_set(err, MT_EINVAL,
                          "the interleaved pipeline schedule (virtual_pipeline_model_parallel_size "
                          "= %d) needs the number of micro-batches, global_batch_size (%d) / "
                          "(micro_batch_size (%d) x data-parallel size (%d)) = %d, to be a "
                          "multiple of pipeline_model_parallel_size = %d",
                          l->vpp, t->global_batch_size, t->micro_batch_size, l->dp,
                          l->num_micro_batches, l->pp);

    /* optimizer */
    struct mt_config_optimizer *o = &c->optimizer;
    if (o->min_lr > o->lr)
        return mt_err_set(err, MT_EINVAL, "&optimizer min_lr = %g exceeds lr = %g", o->min_lr,
                          o->lr);
    if (o->lr_warmup_iters > o->lr_decay_iters && strcmp(o->lr_decay_style, "constant"))
        return mt_err_set(err, MT_EINVAL,
                          "&optimizer lr_warmup_iters = %d exceeds lr_decay_iters = %d",
                          o->lr_warmup_iters, o->lr_decay_iters);

    /* checkpoint */
    if (c->checkpoint.save_interval > 0 && c->checkpoint.save[0] == '\0')
        return mt_err_set(err, MT_EINVAL,
                          "&checkpoint save_interval = %d but save is empty; set save = 'DIR'",
                          c->checkpoint.save_interval);
    MT_CHECK(check_cuda_graph(c, l, err));
    return check_data(c, err);
}

/* ---- pipeline layout --------------------------------------------------- */

static int stage_layers(const struct mt_config *cfg, int stage)
{
    const struct mt_config_parallel *p = &cfg->parallel;
    const int pp = p->pipeline_model_parallel_size, L = cfg->model.num_layers;
    const int f = p->decoder_first_pipeline_num_layers, la = p->decoder_last_pipeline_num_layers;
    if (f && stage == 0) return f;
    if (la && stage == pp - 1) return la;
    int middle = pp - (f > 0) - (la > 0);
    return middle > 0 ? (L - f - la) / middle : 0;
}

void mt_config_pp_layers(const struct mt_config *cfg, int stage, int chunk, int *first_layer,
                         int *count)
{
    const int pp = cfg->parallel.pipeline_model_parallel_size;
    const int vpp = cfg->parallel.virtual_pipeline_model_parallel_size;
    int off = 0;
    for (int c = 0; c <= chunk; c++)
        for (int s = 0; s < pp; s++) {
            /* A first or last stage whose count does not divide by vpp (94 layers
             * on PP 32 x VPP 3 with 2 on each end) has chunks of unequal size: the
             * first stage is short in its first chunk, beside the embedding, the
             * last stage in its last chunk, beside the loss. */
            int S = stage_layers(cfg, s), r = S % vpp;
            int n = S / vpp + (s == 0 ? (c >= vpp - r) : (c < r));
            if (c == chunk && s == stage) {
                *first_layer = off;
                *count = n;
                return;
            }
            off += n;
        }
}

/* ---- printing ---------------------------------------------------------- */

/* Shortest decimal that reads back to the same double, always with a '.' or
 * an exponent so that it is a Fortran real literal. */
static void format_real(double x, char *buf, size_t n)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    if (!strpbrk(buf, ".eE")) {
        size_t len = strlen(buf);
        if (len + 3 <= n) memcpy(buf + len, ".0", 3);
    }
}

static void print_string(FILE *out, const char *s)
{
    fputc('\'', out);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', out);
        fputc(*s, out);
    }
    fputc('\'', out);
}

int mt_config_print(const struct mt_config *cfg, FILE *out)
{
    for (size_t gi = 0; mt_schema_groups[gi]; gi++) {
        const char *g = mt_schema_groups[gi];
        fprintf(out, "&%s\n", g);
        for (const struct mt_key *k = mt_schema; k->name; k++) {
            if (strcmp(k->group, g)) continue;
            const char *f = (const char *)cfg + k->offset;
            char buf[64];
            fprintf(out, "  %s = ", k->name);
            switch (k->type) {
            case MT_KEY_INT: fprintf(out, "%d", *(const int *)f); break;
            case MT_KEY_REAL:
                format_real(*(const double *)f, buf, sizeof buf);
                fputs(buf, out);
                break;
            case MT_KEY_BOOL: fputs(*(const bool *)f ? ".true." : ".false.", out); break;
            case MT_KEY_ENUM:
            case MT_KEY_STRING: print_string(out, f); break;
            case MT_KEY_INT_ARRAY: {
                int len = *(const int *)((const char *)cfg + k->len_offset);
                if (len == 0) fputs(",", out); /* a null value: keeps the default */
                for (int i = 0; i < len; i++)
                    fprintf(out, "%s%d", i ? (i % 32 ? ", " : ",\n    ") : "",
                            ((const int *)f)[i]);
                break;
            }
            case MT_KEY_STRING_ARRAY: {
                int len = *(const int *)((const char *)cfg + k->len_offset);
                if (len == 0) fputs("''", out);
                for (int i = 0; i < len; i++) {
                    if (i) fputs(",\n    ", out);
                    print_string(out, f + (size_t)i * MT_STR_MAX);
                }
                break;
            }
            }
            fputc('\n', out);
        }
        fputs("/\n", out);
    }
    return ferror(out) ? MT_EIO : MT_OK;
}

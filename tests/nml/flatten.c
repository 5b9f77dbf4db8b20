/* moetrain tests: flatten a parsed namelist (see flatten.h). */
#include "flatten.h"

#include <stdlib.h>
#include <string.h>

struct element {
    const char *group, *key;
    long long index;
    size_t seq;   /* order of the assignment in the file: later wins */
    const struct mt_nml_value *v;
};

static int compare(const void *pa, const void *pb)
{
    const struct element *a = pa, *b = pb;
    int c = strcmp(a->group, b->group);
    if (c == 0) c = strcmp(a->key, b->key);
    if (c == 0) c = (a->index > b->index) - (a->index < b->index);
    if (c == 0) c = (a->seq > b->seq) - (a->seq < b->seq);
    return c;
}

static void print_value(FILE *out, const struct mt_nml_value *v)
{
    switch (v->type) {
    case MT_NML_NULL: fputs("null", out); break;
    case MT_NML_INT: fprintf(out, "int %lld", v->i); break;
    case MT_NML_REAL: fprintf(out, "real %.17g", v->r); break;
    case MT_NML_LOGICAL: fprintf(out, "logical %c", v->l ? 'T' : 'F'); break;
    case MT_NML_STRING:
        fputs("str '", out);
        for (const char *c = v->s; *c; c++) {
            if (*c == '\'') fputc('\'', out);
            fputc(*c, out);
        }
        fputc('\'', out);
        break;
    }
}

int nml_flatten(const struct mt_nml_file *f, FILE *out)
{
    size_t n = 0, k = 0, seq = 0;
    for (size_t g = 0; g < f->ngroups; g++)
        for (size_t a = 0; a < f->groups[g].nassign; a++) n += f->groups[g].assigns[a].nvalues;
    struct element *e = malloc((n ? n : 1) * sizeof *e);
    if (!e) return -1;
    for (size_t g = 0; g < f->ngroups; g++) {
        for (size_t a = 0; a < f->groups[g].nassign; a++, seq++) {
            const struct mt_nml_assign *as = &f->groups[g].assigns[a];
            for (size_t v = 0; v < as->nvalues; v++)
                e[k++] = (struct element){f->groups[g].name, as->name,
                                          as->start + (long long)v * as->stride, seq, &as->values[v]};
        }
    }
    qsort(e, n, sizeof *e, compare);
    /* Each run of equal (group, key, index) is one element, in file order. */
    for (size_t i = 0; i < n;) {
        size_t j = i;
        const struct mt_nml_value *v = e[i].v;
        while (j < n && strcmp(e[j].group, e[i].group) == 0 && strcmp(e[j].key, e[i].key) == 0 &&
               e[j].index == e[i].index) {
            if (e[j].v->type != MT_NML_NULL || v->type == MT_NML_NULL) v = e[j].v;
            j++;
        }
        fprintf(out, "%s.%s(%lld) = ", e[i].group, e[i].key, e[i].index);
        print_value(out, v);
        fputc('\n', out);
        i = j;
    }
    free(e);
    return 0;
}

char *nml_flatten_string(const struct mt_nml_file *f)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) return NULL;
    int rc = nml_flatten(f, m);
    if (fclose(m) != 0 || rc != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

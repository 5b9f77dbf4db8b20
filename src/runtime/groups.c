#include "runtime/groups.h"

#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>

const char *const mt_group_names[MT_GROUP_COUNT] = {
    "tp", "cp", "dp", "dp-cp", "pp", "tp-cp", "mp", "embedding", "ep", "etp", "etp-ep", "edp",
};

int mt_groups_masked_orthogonal(int world, int ndims, const int *sizes, const int *mask,
                                int *out)
{
    int stride[8], mshape[8], mstride[8], ushape[8], ustride[8];
    int nm = 0, nu = 0, s = 1;
    for (int d = 0; d < ndims; d++) {
        stride[d] = s;
        s *= sizes[d];
    }
    for (int d = 0; d < ndims; d++) {
        if (mask[d]) {
            mshape[nm] = sizes[d];
            mstride[nm++] = stride[d];
        } else {
            ushape[nu] = sizes[d];
            ustride[nu++] = stride[d];
        }
    }
    int gsize = 1;
    for (int i = 0; i < nm; i++) gsize *= mshape[i];
    int ngroups = world / gsize;
    for (int g = 0; g < ngroups; g++) {
        int base = 0, rem = g;
        for (int i = 0; i < nu; i++) {
            base += (rem % ushape[i]) * ustride[i];
            rem /= ushape[i];
        }
        for (int j = 0; j < gsize; j++) {
            int off = 0, r = j;
            for (int i = 0; i < nm; i++) {
                off += (r % mshape[i]) * mstride[i];
                r /= mshape[i];
            }
            out[g * gsize + j] = base + off;
        }
    }
    return gsize;
}

/* A rank generator as Megatron builds one: named sizes in `order`, missing
 * names appended (they must have size 1). */
struct generator {
    int ndims;
    char names[5][3];
    int sizes[5];
};

static int make_generator(const char *order, int tp, int cp, int ep, int dp, int pp,
                          struct generator *g, struct mt_err *err)
{
    static const char *const all[5] = { "tp", "cp", "ep", "dp", "pp" };
    const int size_of[5] = { tp, cp, ep, dp, pp };
    char buf[32];
    snprintf(buf, sizeof buf, "%s", order);
    g->ndims = 0;
    bool seen[5] = { false };
    for (char *save = NULL, *t = strtok_r(buf, "-", &save); t; t = strtok_r(NULL, "-", &save)) {
        int d = -1;
        for (int i = 0; i < 5; i++)
            if (!strcasecmp(t, all[i])) d = i;
        if (d < 0 || seen[d])
            return mt_err_set(err, MT_EINVAL, "&parallel order = '%s' is not valid", order);
        seen[d] = true;
        snprintf(g->names[g->ndims], 3, "%s", all[d]);
        g->sizes[g->ndims++] = size_of[d];
    }
    for (int d = 0; d < 5; d++) {
        if (seen[d]) continue;
        if (size_of[d] != 1)
            return mt_err_set(err, MT_EINVAL, "&parallel order = '%s' lacks '%s' (size %d)",
                              order, all[d], size_of[d]);
        snprintf(g->names[g->ndims], 3, "%s", all[d]);
        g->sizes[g->ndims++] = 1;
    }
    return MT_OK;
}

/* Every kind but MT_GROUP_EMBD: which generator (the expert one for the expert kinds)
 * and the dimensions that vary inside a group. */
static const struct { enum mt_group_kind kind; bool expert; const char *token; } spec[] = {
    { MT_GROUP_TP, false, "tp" },        { MT_GROUP_CP, false, "cp" },
    { MT_GROUP_DP, false, "dp" },        { MT_GROUP_DP_CP, false, "dp-cp" },
    { MT_GROUP_PP, false, "pp" },        { MT_GROUP_TP_CP, false, "tp-cp" },
    { MT_GROUP_MP, false, "tp-pp" },     { MT_GROUP_EP, true, "ep" },
    { MT_GROUP_ETP, true, "tp" },        { MT_GROUP_ETP_EP, true, "tp-ep" },
    { MT_GROUP_EDP, true, "dp" },
};

/* mask[d] = 1 for the generator's dimensions named in token ("tp", "dp-cp", ...). */
static void token_mask(const struct generator *g, const char *token, int mask[5])
{
    char buf[32];
    snprintf(buf, sizeof buf, "%s", token);
    for (int d = 0; d < 5; d++) mask[d] = 0;
    for (char *save = NULL, *t = strtok_r(buf, "-", &save); t; t = strtok_r(NULL, "-", &save))
        for (int d = 0; d < g->ndims; d++)
            if (!strcmp(g->names[d], t)) mask[d] = 1;
}

/* Groups over the dimensions named in token ("tp", "dp-cp", "tp-ep-pp", ...). */
static int generate(const struct generator *g, int world, const char *token,
                    struct mt_group_list *out, struct mt_err *err)
{
    int mask[5];
    token_mask(g, token, mask);
    out->ranks = malloc(sizeof(int) * (size_t)world);
    if (!out->ranks) return mt_err_set(err, MT_ENOMEM, "out of memory for %d ranks", world);
    out->size = mt_groups_masked_orthogonal(world, g->ndims, g->sizes, mask, out->ranks);
    out->ngroups = world / out->size;
    return MT_OK;
}

/* Megatron's embedding group: first and last stage of each pipeline group. */
static int embedding_groups(const struct mt_group_list *pp, int world, struct mt_group_list *out,
                            struct mt_err *err)
{
    out->ranks = malloc(sizeof(int) * (size_t)world);
    if (!out->ranks) return mt_err_set(err, MT_ENOMEM, "out of memory for %d ranks", world);
    if (pp->size == 1) {
        memcpy(out->ranks, pp->ranks, sizeof(int) * (size_t)world);
        out->size = 1;
        out->ngroups = world;
        return MT_OK;
    }
    out->size = 2;
    out->ngroups = pp->ngroups;
    for (int g = 0; g < pp->ngroups; g++) {
        out->ranks[2 * g] = pp->ranks[g * pp->size];
        out->ranks[2 * g + 1] = pp->ranks[g * pp->size + pp->size - 1];
    }
    return MT_OK;
}

int mt_groups_build(const struct mt_config_parallel *p, const struct mt_layout *l,
                    struct mt_rank_layout *rl, struct mt_err *err)
{
    memset(rl, 0, sizeof *rl);
    rl->world = l->world_size;
    rl->tp = l->tp;
    rl->cp = l->cp;
    rl->pp = l->pp;
    rl->dp = l->dp;
    rl->ep = l->ep;
    rl->etp = l->etp;
    rl->edp = l->edp;
    snprintf(rl->order, sizeof rl->order, "%s", p->order);
    struct generator attn, expert;
    int rc;
    MT_CHECK(make_generator(p->order, l->tp, l->cp, 1, l->dp, l->pp, &attn, err));
    MT_CHECK(make_generator(p->order, l->etp, 1, l->ep, l->edp, l->pp, &expert, err));
    for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++)
        MT_CHECK_GOTO(generate(spec[i].expert ? &expert : &attn, rl->world, spec[i].token,
                               &rl->groups[spec[i].kind], err),
                      fail);
    MT_CHECK_GOTO(embedding_groups(&rl->groups[MT_GROUP_PP], rl->world,
                                   &rl->groups[MT_GROUP_EMBD], err),
                  fail);
    return MT_OK;
fail:
    mt_groups_free(rl);
    return rc;
}

/* Where r sits in generator g's groups over mask, as mt_groups_masked_orthogonal lists
 * them: the group is r's coordinates in the other dimensions and the position its
 * coordinates in the masked ones, each read as a mixed-radix number, first dimension
 * fastest. */
static void locate(const struct generator *g, const int mask[5], int r, int *group, int *pos,
                   int *size)
{
    int gm = 1, gu = 1;
    *group = *pos = 0;
    for (int d = 0; d < g->ndims; d++) {
        const int c = r % g->sizes[d];
        r /= g->sizes[d];
        if (mask[d]) {
            *pos += c * gm;
            gm *= g->sizes[d];
        } else {
            *group += c * gu;
            gu *= g->sizes[d];
        }
    }
    *size = gm;
}

int mt_groups_locate(const struct mt_config_parallel *p, const struct mt_layout *l, int r,
                     struct mt_group_place out[MT_GROUP_COUNT], struct mt_err *err)
{
    struct generator attn, expert;
    MT_CHECK(make_generator(p->order, l->tp, l->cp, 1, l->dp, l->pp, &attn, err));
    MT_CHECK(make_generator(p->order, l->etp, 1, l->ep, l->edp, l->pp, &expert, err));
    for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
        const struct generator *g = spec[i].expert ? &expert : &attn;
        int mask[5];
        token_mask(g, spec[i].token, mask);
        struct mt_group_place *o = &out[spec[i].kind];
        locate(g, mask, r, &o->group, &o->position, &o->size);
    }
    /* the embedding group: the pipeline group's first and last stage (each rank its own
     * group without a pipeline) */
    const struct mt_group_place *pp = &out[MT_GROUP_PP];
    struct mt_group_place *e = &out[MT_GROUP_EMBD];
    if (pp->size == 1)
        *e = (struct mt_group_place){ pp->group, 0, 1 };
    else if (pp->position == 0 || pp->position == pp->size - 1)
        *e = (struct mt_group_place){ pp->group, pp->position ? 1 : 0, 2 };
    else
        *e = (struct mt_group_place){ -1, -1, 2 };
    return MT_OK;
}

void mt_groups_free(struct mt_rank_layout *rl)
{
    for (int k = 0; k < MT_GROUP_COUNT; k++) {
        free(rl->groups[k].ranks);
        rl->groups[k].ranks = NULL;
    }
}

void mt_groups_find(const struct mt_rank_layout *rl, enum mt_group_kind kind, int r,
                    int *group_index, int *position)
{
    const struct mt_group_list *gl = &rl->groups[kind];
    *group_index = -1;
    *position = -1;
    for (int i = 0; i < gl->ngroups * gl->size; i++)
        if (gl->ranks[i] == r) {
            *group_index = i / gl->size;
            *position = i % gl->size;
            return;
        }
}

static void print_group(const struct mt_group_list *gl, int g, FILE *out)
{
    fputs(" [", out);
    for (int i = 0; i < gl->size; i++) fprintf(out, "%s%d", i ? "," : "", gl->ranks[g * gl->size + i]);
    fputc(']', out);
}

bool mt_groups_print(const struct mt_rank_layout *rl, int max_shown, FILE *out)
{
    bool cut = false;
    for (int k = 0; k < MT_GROUP_COUNT; k++) {
        const struct mt_group_list *gl = &rl->groups[k];
        fprintf(out, "%-9s %d group%s of %d:", mt_group_names[k], gl->ngroups,
                gl->ngroups == 1 ? "" : "s", gl->size);
        const bool all = max_shown <= 0 || gl->ngroups <= max_shown;
        const int head = all ? gl->ngroups : max_shown - 1;
        for (int g = 0; g < head; g++) print_group(gl, g, out);
        if (!all) {
            fprintf(out, " ... (%d more) ...", gl->ngroups - head - 1);
            print_group(gl, gl->ngroups - 1, out);
            cut = true;
        }
        fputc('\n', out);
    }
    return cut;
}

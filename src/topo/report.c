/* Printing the plan: a summary, then one line or JSON object per process. */
#include "config.h"

#include "topo/topo_internal.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

void mt_topo_print_summary(const struct mt_topo_plan *p, FILE *out)
{
    fprintf(out, "placement '%s': %d process%s in %d NVLink domain%s", p->mode, p->nprocs,
            p->nprocs == 1 ? "" : "es", p->ndomains, p->ndomains == 1 ? "" : "s");
    if (p->block)
        fprintf(out, "; blocks of %d rank%s share a domain\n", p->block, p->block == 1 ? "" : "s");
    else
        fprintf(out, "; blocks of unequal sizes\n");
    int shown = p->ndomains < 16 ? p->ndomains : 16;
    for (int d = 0; d < shown; d++)
        fprintf(out, "  domain '%s': %d process%s\n", p->domain_names[d], p->domain_size[d],
                p->domain_size[d] == 1 ? "" : "es");
    if (shown < p->ndomains) fprintf(out, "  ... %d more domains\n", p->ndomains - shown);
    fprintf(out, "groups split across domains: %d TP x CP, %d ETP x EP; pipeline links crossing "
                 "domains: %d of %d\n",
            p->split_groups[0], p->split_groups[1], p->pp_links_crossing, p->pp_links);
    if (p->notes) fputs(p->notes, out);
}

static void json_str(FILE *out, const char *s)
{
    if (!s[0]) {
        fputs("null", out);
        return;
    }
    fputc('"', out);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(out, "\\%c", ch);
        else if (ch < 0x20) fprintf(out, "\\u%04x", ch);
        else fputc(ch, out);
    }
    fputc('"', out);
}

/* The coordinates printed per rank, in the JSON key order. */
static const struct { const char *name; enum mt_group_kind kind; } coords[] = {
    { "tp", MT_GROUP_TP }, { "cp", MT_GROUP_CP },  { "ep", MT_GROUP_EP }, { "etp", MT_GROUP_ETP },
    { "dp", MT_GROUP_DP }, { "edp", MT_GROUP_EDP }, { "pp", MT_GROUP_PP },
};
#define NCOORDS ((int)(sizeof coords / sizeof coords[0]))

static size_t maxlen(const struct mt_topo_cluster *c, size_t off, size_t at_least)
{
    size_t m = at_least;
    for (int i = 0; i < c->nprocs; i++) {
        size_t l = strlen((const char *)&c->procs[i] + off);
        if (l > m) m = l;
    }
    return m;
}

int mt_topo_print_table(const struct mt_topo_cluster *c, const struct mt_topo_plan *p,
                        const struct mt_rank_layout *rl, bool json, FILE *out,
                        struct mt_err *err)
{
    int n = c->nprocs;
    int *pos = malloc(sizeof(int) * (size_t)n * NCOORDS);
    if (!pos) return mt_err_set(err, MT_ENOMEM, "out of memory for %d ranks", n);
    for (int k = 0; k < NCOORDS; k++) {
        const struct mt_group_list *g = &rl->groups[coords[k].kind];
        for (int i = 0; i < g->ngroups * g->size; i++)
            pos[(size_t)g->ranks[i] * NCOORDS + (size_t)k] = i % g->size;
    }
    int wh = (int)maxlen(c, offsetof(struct mt_topo_proc, host), 4);
    int wd = (int)maxlen(c, offsetof(struct mt_topo_proc, domain), 6);
    int wc = (int)maxlen(c, offsetof(struct mt_topo_proc, cpus), 4);
    if (json)
        fputs("[\n", out);
    else
        fprintf(out, "%-7s %-7s %-*s %-12s %4s %-*s %-*s %3s %3s %3s %3s %4s %4s %3s\n",
                "process", "rank", wh, "host", "gpu", "numa", wc, "cpus", wd, "domain", "tp",
                "cp", "ep", "etp", "dp", "edp", "pp");
    for (int i = 0; i < n; i++) {
        const struct mt_topo_proc *q = &c->procs[i];
        int r = p->logical_of_process[i];
        const int *co = pos + (size_t)r * NCOORDS;
        if (json) {
            fprintf(out, "  {\"rank\": %d, \"process\": %d, \"host\": ", r, i);
            json_str(out, q->host);
            fputs(", \"gpu\": ", out);
            json_str(out, q->gpu);
            if (q->numa >= 0)
                fprintf(out, ", \"numa\": %d, \"cpus\": ", q->numa);
            else
                fputs(", \"numa\": null, \"cpus\": ", out);
            json_str(out, q->cpus);
            fputs(", \"domain\": ", out);
            json_str(out, q->domain);
            for (int k = 0; k < NCOORDS; k++) fprintf(out, ", \"%s\": %d", coords[k].name, co[k]);
            fputs(i + 1 < n ? "},\n" : "}\n", out);
        } else {
            char numa[16], gpu[32];
            snprintf(numa, sizeof numa, "%d", q->numa);
            if (q->gpu[0])
                snprintf(gpu, sizeof gpu, "%s", q->gpu);
            else if (q->gpu_index >= 0)
                snprintf(gpu, sizeof gpu, "#%d", q->gpu_index);
            else
                snprintf(gpu, sizeof gpu, "-");
            fprintf(out, "%-7d %-7d %-*s %-12s %4s %-*s %-*s %3d %3d %3d %3d %4d %4d %3d\n", i, r,
                    wh, q->host, gpu, q->numa >= 0 ? numa : "-", wc, q->cpus[0] ? q->cpus : "-",
                    wd, q->domain, co[0], co[1], co[2], co[3], co[4], co[5], co[6]);
        }
    }
    if (json) fputs("]\n", out);
    free(pos);
    return ferror(out) ? mt_err_set(err, MT_EIO, "writing the plan failed") : MT_OK;
}

int mt_topo_print_report(const struct mt_topo_setup *s, const struct mt_rank_layout *rl,
                         int max_rows, FILE *out, struct mt_err *err)
{
    mt_topo_node_print(s->node, out);
    fprintf(out, "process 0: %s\n", s->applied.report);
    mt_topo_print_summary(&s->plan, out);
    if (s->cluster.nprocs > max_rows) {
        fprintf(out, "(%d processes: `moetrain topo` with the same namelists prints each)\n",
                s->cluster.nprocs);
        return MT_OK;
    }
    return mt_topo_print_table(&s->cluster, &s->plan, rl, false, out, err);
}

/* `moetrain topo`: print the topology plan of this job, or of a described
 * cluster (--dry-run). Only this file (with main.c) prints errors. */
#include "config.h"

#include "runtime/cli_end.h"
#include "topo/topo_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fputs("usage: moetrain topo [--json] CONFIG.nml [CONFIG.nml ...] [group%key=value ...]\n"
          "       moetrain topo --dry-run --nodes-file FILE --gpus-per-node G [--hwloc-xml F]\n"
          "                     [--json] CONFIG.nml [...] [group%key=value ...]\n"
          "\n"
          "Prints, per process, its host, GPU (PCI id), NUMA node, cores, NVLink-domain key\n"
          "and coordinates in every parallel group, as placed by &topology placement.\n"
          "Run it under the job's launcher (srun --mpi=pmix, mpirun): every process\n"
          "discovers its node, binds itself as training would (&host cpu_affinity,\n"
          "numa_membind), and rank 0 prints the plan with the bindings read back.\n"
          "\n"
          "  --json               a JSON array of {rank, process, host, gpu, numa, cpus,\n"
          "                       domain, tp, cp, ep, etp, dp, edp, pp}\n"
          "  --dry-run            plan a described cluster without starting processes:\n"
          "  --nodes-file FILE    one line per node: 'hostname domain_key'\n"
          "  --gpus-per-node G    processes (GPUs) per node; world = nodes x G\n"
          "  --hwloc-xml F        the nodes' hardware (hwloc XML) for GPU ids and cores;\n"
          "                       default &topology hwloc_xml, else unknown\n"
          "\n"
          "See doc/topology.md.\n",
          out);
}

static int fail(const struct mt_err *err)
{
    mt_cli_print_error("moetrain topo", err, "");
    return 1;
}

struct args {
    bool json, dry_run;
    const char *nodes_file, *hwloc_xml;
    int gpus_per_node;
    int nfiles, noverrides;
    char **files, **overrides;
};

/* "--opt VALUE" or "--opt=VALUE"; NULL when absent. */
static const char *opt_value(int argc, char **argv, int *i, const char *name)
{
    size_t l = strlen(name);
    if (strncmp(argv[*i], name, l)) return NULL;
    if (argv[*i][l] == '=') return argv[*i] + l + 1;
    if (argv[*i][l] != '\0') return NULL;
    return *i + 1 < argc ? argv[++*i] : "";
}

static bool missing(const char *name, const char *v)
{
    if (v[0]) return false;
    fprintf(stderr, "moetrain topo: error: %s needs a value (see moetrain topo --help)\n", name);
    return true;
}

static int parse(int argc, char **argv, struct args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *v, *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(s, "--json")) {
            a->json = true;
        } else if (!strcmp(s, "--dry-run")) {
            a->dry_run = true;
        } else if ((v = opt_value(argc, argv, &i, "--nodes-file"))) {
            if (missing("--nodes-file", v)) return 1;
            a->nodes_file = v;
        } else if ((v = opt_value(argc, argv, &i, "--hwloc-xml"))) {
            if (missing("--hwloc-xml", v)) return 1;
            a->hwloc_xml = v;
        } else if ((v = opt_value(argc, argv, &i, "--gpus-per-node"))) {
            char *end;
            long g = strtol(v, &end, 10);
            if (!*v || *end || g < 1 || g > MT_TOPO_MAX_GPUS) {
                fprintf(stderr, "moetrain topo: error: --gpus-per-node needs 1..%d, got '%s'\n",
                        MT_TOPO_MAX_GPUS, v);
                return 1;
            }
            a->gpus_per_node = (int)g;
        } else if (s[0] == '-' && s[1]) {
            fprintf(stderr, "moetrain topo: error: unknown option '%s' (see moetrain topo "
                            "--help)\n", s);
            return 1;
        } else if (mt_config_is_override(s)) {
            a->overrides[a->noverrides++] = argv[i];
        } else {
            a->files[a->nfiles++] = argv[i];
        }
    }
    const char *need = NULL;
    if (a->dry_run && !a->nodes_file) need = "--dry-run needs --nodes-file FILE";
    else if (a->dry_run && !a->gpus_per_node) need = "--dry-run needs --gpus-per-node G";
    else if (!a->dry_run && (a->nodes_file || a->gpus_per_node || a->hwloc_xml))
        need = "--nodes-file, --gpus-per-node and --hwloc-xml go with --dry-run "
               "(a live run reads &topology hwloc_xml)";
    else if (a->nfiles + a->noverrides == 0) need = "no namelist file given";
    if (need) {
        fprintf(stderr, "moetrain topo: error: %s (see moetrain topo --help)\n", need);
        return 1;
    }
    return -1; /* go on */
}

static int dry_run(const struct args *a, struct mt_config *cfg)
{
    struct mt_err err = { 0 };
    struct mt_topo_map nodes = { 0 };
    struct mt_topo_node *tmpl = NULL;
    struct mt_topo_cluster c = { 0 };
    struct mt_topo_plan plan = { 0 };
    struct mt_rank_layout rl;
    bool have_rl = false;
    struct mt_layout l;
    int rc;
    MT_CHECK_GOTO(mt_topo_map_read(a->nodes_file, &nodes, &err), out);
    long long world = (long long)nodes.n * a->gpus_per_node;
    if (world > 100000000) {
        rc = mt_err_set(&err, MT_EINVAL, "%d nodes x %d GPUs is too large", nodes.n,
                        a->gpus_per_node);
        goto out;
    }
    MT_CHECK_GOTO(mt_config_resolve(cfg, (int)world, &l, &err), out);
    const char *xml = a->hwloc_xml ? a->hwloc_xml : cfg->topology.hwloc_xml;
    if (xml[0]) MT_CHECK_GOTO(mt_topo_node_load(xml, false, &tmpl, &err), out);
    MT_CHECK_GOTO(mt_topo_cluster_describe(&nodes, a->gpus_per_node, tmpl,
                                           cfg->host.cpu_affinity, &c, &err),
                  out);
    MT_CHECK_GOTO(mt_groups_build(&cfg->parallel, &l, &rl, &err), out);
    have_rl = true;
    MT_CHECK_GOTO(mt_topo_place(&c, &rl, cfg->topology.placement, &plan, &err), out);
    if (!a->json) {
        printf("dry run: %d nodes x %d GPUs from %s\n", nodes.n, a->gpus_per_node,
               a->nodes_file);
        if (tmpl) mt_topo_node_print(tmpl, stdout);
        mt_topo_print_summary(&plan, stdout);
    }
    rc = mt_topo_print_table(&c, &plan, &rl, a->json, stdout, &err);
out:
    if (have_rl) mt_groups_free(&rl);
    mt_topo_plan_free(&plan);
    mt_topo_cluster_free(&c);
    mt_topo_node_free(tmpl);
    mt_topo_map_free(&nodes);
    return rc ? fail(&err) : 0;
}

static void agree_or_abort(struct mt_world *w, int rc, const struct mt_err *err)
{
    mt_cli_agree_or_exit("moetrain topo", w, rc, err);
}

/* Under the job's launcher: every process discovers and binds itself, the
 * facts are exchanged, every process places, rank 0 prints. */
static int live(const struct args *a, struct mt_config *cfg)
{
    struct mt_err err = { 0 };
    struct mt_world *w = NULL;
    struct mt_topo_setup *s = NULL;
    struct mt_rank_layout rl;
    struct mt_layout l;
    if (mt_world_init(&w, cfg->parallel.distributed_timeout_minutes * 60.0, &err)) {
        /* MT_EUNSUPPORTED (launcher, build) is the same everywhere: say it once. */
        int r = mt_world_launcher_rank();
        if (err.code != MT_EUNSUPPORTED || r == 0) {
            if (r) fprintf(stderr, "moetrain topo: error: rank %d: %s\n", r, err.msg);
            else fail(&err);
        }
        return 1;
    }
    int rc = mt_config_load(cfg, a->nfiles, a->files, a->noverrides, a->overrides, &err);
    if (!rc) rc = mt_config_resolve(cfg, w->size, &l, &err);
    agree_or_abort(w, rc, &err);
    mt_world_set_timeout(w, cfg->parallel.distributed_timeout_minutes * 60.0);
    agree_or_abort(w, mt_topo_startup(w, cfg, &s, &err), &err);
    rc = mt_topo_setup_place(s, w, cfg, &l, &err);
    if (!rc) rc = mt_groups_build(&cfg->parallel, &l, &rl, &err);
    agree_or_abort(w, rc, &err);
    if (w->rank == 0) {
        if (a->json) {
            rc = mt_topo_print_table(&s->cluster, &s->plan, &rl, true, stdout, &err);
        } else {
            printf("launcher: %s, %d process%s on %d node%s\n", w->launcher, w->size,
                   w->size == 1 ? "" : "es", w->num_nodes, w->num_nodes == 1 ? "" : "s");
            rc = mt_topo_print_report(s, &rl, INT_MAX, stdout, &err);
        }
        fflush(stdout);
    }
    agree_or_abort(w, rc, &err);
    mt_groups_free(&rl);
    mt_topo_setup_free(s);
    mt_world_finalize(w);
    return 0;
}

int mt_topo_cli(int argc, char **argv)
{
    struct args a = { 0 };
    struct mt_config *cfg = malloc(sizeof *cfg);
    a.files = calloc((size_t)argc + 1, sizeof *a.files);
    a.overrides = calloc((size_t)argc + 1, sizeof *a.overrides);
    int rc = 1;
    if (!cfg || !a.files || !a.overrides) {
        fprintf(stderr, "moetrain topo: error: out of memory\n");
        goto out;
    }
    rc = parse(argc, argv, &a);
    if (rc >= 0) goto out;
    mt_config_defaults(cfg);
    if (!a.dry_run) {
        rc = live(&a, cfg);
        goto out;
    }
    struct mt_err err = { 0 };
    if (mt_config_load(cfg, a.nfiles, a.files, a.noverrides, a.overrides, &err))
        rc = fail(&err);
    else
        rc = dry_run(&a, cfg);
out:
    free(cfg);
    free(a.files);
    free(a.overrides);
    return rc;
}

/* moetrain: the command-line entry. Only this file prints errors and exits. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/schema.h"
#include "model/model.h"
#include "runtime/groups.h"
#include "train/train.h"
#include "util/error.h"
#ifdef HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

static void usage(FILE *out)
{
    fputs("usage: moetrain [options] FILE.nml [FILE.nml ...] [group%key=value ...]\n"
          "\n"
          "Trains a Mixture-of-Experts language model configured by Fortran namelist files.\n"
          "Later files override earlier ones; group%key=value overrides (namelist value\n"
          "syntax, e.g. moe%layer_freq=4*1 or data%data_path='a','b') override files.\n"
          "\n"
          "options:\n"
          "  --check            validate the configuration, print the derived layout, exit\n"
          "  --print-config     print the fully resolved configuration as a namelist\n"
          "  --help-config      list every namelist group and key: type, default, meaning\n"
          "  --world-size N     with --check/--print-config: validate for N processes\n"
          "  -V, --version      print the version and the backends this build has\n"
          "  -h, --help         this text\n"
          "\n"
          "See moetrain(1) and moetrain.nml(5).\n",
          out);
}

static void version(void)
{
    printf("%s\n", PACKAGE_STRING);
    printf("backends: cpu (BLAS%s)", "");
#ifdef _OPENMP
    printf(" with OpenMP");
#endif
#ifdef HAVE_CUDA
    printf(", cuda (%s", MT_CUDA_ARCHS);
#ifdef HAVE_NCCL
    printf(", NCCL");
#endif
    printf(")");
#endif
    printf("\nruntime: self");
#ifdef HAVE_MPI
    printf(", MPI");
#endif
#ifdef HAVE_PMIX
    printf(", PMIx");
#endif
#ifdef HAVE_HWLOC
    printf("\ntopology: hwloc");
#endif
#ifdef HAVE_NUMA
    printf(", libnuma");
#endif
    printf("\n");
#ifdef HAVE_CUDA
    char buf[256];
    mt_cuda_describe(buf, sizeof buf);
    printf("devices: %s\n", buf);
#endif
}

static void help_config(void)
{
    const char *group = "";
    for (const struct mt_key *k = mt_schema; k->name; k++) {
        if (strcmp(group, k->group)) {
            group = k->group;
            printf("%s&%s\n", k == mt_schema ? "" : "\n", group);
        }
        char def[128];
        switch (k->type) {
        case MT_KEY_INT: snprintf(def, sizeof def, "%lld", k->idef); break;
        case MT_KEY_REAL: snprintf(def, sizeof def, "%g", k->rdef); break;
        case MT_KEY_BOOL: snprintf(def, sizeof def, "%s", k->idef ? ".true." : ".false."); break;
        case MT_KEY_ENUM:
        case MT_KEY_STRING:
        case MT_KEY_STRING_ARRAY: snprintf(def, sizeof def, "'%s'", k->sdef ? k->sdef : ""); break;
        case MT_KEY_INT_ARRAY: snprintf(def, sizeof def, "(empty)"); break;
        }
        printf("  %-38s %-13s default %s\n", k->name, mt_key_type_name(k->type), def);
        if (k->choices) printf("      one of: %s\n", k->choices);
        printf("      %s\n", k->doc);
    }
}

static void print_layout(const struct mt_config *c, const struct mt_layout *l)
{
    const struct mt_config_model *m = &c->model;
    int nmoe = 0;
    for (int i = 0; i < m->num_layers; i++) nmoe += c->moe.layer_freq[i] != 0;
    printf("model: %d layers (%d MoE, %d dense), hidden %d, %d heads / %d KV groups x head dim "
           "%d, vocab %d\n",
           m->num_layers, nmoe, m->num_layers - nmoe, m->hidden_size, m->num_attention_heads,
           m->num_query_groups, m->kv_channels, m->vocab_size);
    if (c->moe.num_experts > 0)
        printf("experts: %d per MoE layer, top-%d, expert FFN %d%s\n", c->moe.num_experts,
               c->moe.router_topk, c->moe.moe_ffn_hidden_size,
               c->moe.shared_expert_intermediate_size ? ", with a shared expert" : "");
    printf("layout: world %d = TP %d x CP %d x PP %d x DP %d; experts: ETP %d x EP %d x EDP %d "
           "x PP %d; VPP %d; order %s\n",
           l->world_size, l->tp, l->cp, l->pp, l->dp, l->etp, l->ep, l->edp, l->pp, l->vpp,
           c->parallel.order);
    printf("batch: global %d = micro %d x DP %d x %d micro-batches; %lld tokens per iteration\n",
           c->training.global_batch_size, c->training.micro_batch_size, l->dp,
           l->num_micro_batches,
           (long long)c->training.global_batch_size * c->training.seq_length);
}

static int fail(const struct mt_err *err)
{
    if (strstr(err->msg, ": error: "))
        fprintf(stderr, "%s\n", err->msg);
    else
        fprintf(stderr, "moetrain: error: %s\n", err->msg);
    return 1;
}

static int is_override(const char *a)
{
    const char *pct = strchr(a, '%'), *eq = strchr(a, '=');
    return pct && eq && pct < eq;
}

int main(int argc, char **argv)
{
    enum { TRAIN, CHECK, PRINT } action = TRAIN;
    int world = 1;
    char **files = calloc((size_t)argc, sizeof *files);
    char **overrides = calloc((size_t)argc, sizeof *overrides);
    int nfiles = 0, noverrides = 0;
    struct mt_err err = { 0 };
    if (!files || !overrides) {
        fprintf(stderr, "moetrain: error: out of memory\n");
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-V") || !strcmp(a, "--version")) {
            version();
            return 0;
        } else if (!strcmp(a, "--help-config")) {
            help_config();
            return 0;
        } else if (!strcmp(a, "--check")) {
            action = CHECK;
        } else if (!strcmp(a, "--print-config")) {
            action = PRINT;
        } else if (!strcmp(a, "--world-size") || !strncmp(a, "--world-size=", 13)) {
            const char *v = a[12] == '=' ? a + 13 : (i + 1 < argc ? argv[++i] : NULL);
            char *end;
            long n = v ? strtol(v, &end, 10) : 0;
            if (!v || *end || n < 1 || n > 100000000) {
                fprintf(stderr, "moetrain: error: --world-size needs a positive integer\n");
                return 1;
            }
            world = (int)n;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "moetrain: error: unknown option '%s' (see moetrain --help)\n", a);
            return 1;
        } else if (is_override(a)) {
            overrides[noverrides++] = argv[i];
        } else {
            files[nfiles++] = argv[i];
        }
    }
    if (nfiles == 0 && noverrides == 0) {
        usage(stderr);
        fprintf(stderr, "\nmoetrain: error: no namelist file given (try namelists/tiny_moe.nml)\n");
        return 1;
    }

    struct mt_config *cfg = malloc(sizeof *cfg);
    if (!cfg) {
        fprintf(stderr, "moetrain: error: out of memory\n");
        return 1;
    }
    mt_config_defaults(cfg);
    struct mt_layout layout;
    if (mt_config_load(cfg, nfiles, files, noverrides, overrides, &err) ||
        mt_config_resolve(cfg, world, &layout, &err) || mt_model_check_config(cfg, &err))
        return fail(&err);

    int rc = 0;
    switch (action) {
    case PRINT: rc = mt_config_print(cfg, stdout) ? 1 : 0; break;
    case CHECK:
        printf("moetrain: configuration is valid for %d process%s\n", world,
               world == 1 ? "" : "es");
        print_layout(cfg, &layout);
        {
            struct mt_rank_layout rl;
            if (mt_groups_build(&cfg->parallel, &layout, &rl, &err)) return fail(&err);
            printf("groups (logical ranks):\n");
            mt_groups_print(&rl, stdout);
            mt_groups_free(&rl);
        }
        break;
    case TRAIN:
        if (mt_train_run(cfg, &layout, stdout, &err)) rc = fail(&err);
        break;
    }
    free(cfg);
    free(files);
    free(overrides);
    return rc;
}

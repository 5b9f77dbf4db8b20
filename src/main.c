/* moetrain: the command-line entry. Only this file prints errors and exits.
 *
 * A training run is one process of a job (srun --mpi=pmix, mpirun) or a job of
 * one (started plainly). Startup: the world first, then every process loads
 * and resolves the configuration for the world size; the processes agree on
 * the outcome, so an error every process hits (a bad namelist, a layout that
 * does not divide the world) is printed once, by rank 0, and a rank-local one
 * (a file only one node cannot read) by the rank that saw it. After world
 * init every failure ends the whole job through mt_world_abort: no process is
 * left waiting for a dead peer. --check, --print-config and --help never start
 * the world and need no launcher. */
#include "config.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "config/from_megatron.h"
#include "config/megatron.h"
#include "config/schema.h"
#include "model/model.h"
#include "plan/plan.h"
#include "runtime/comm.h"
#include "runtime/cli_end.h"
#include "runtime/groups.h"
#include "topo/topo.h"
#include "runtime/parallel.h"
#include "train/train.h"
#include "util/error.h"
#include "version.h"
#include "kernels/kernels.h"
#ifdef HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

/* How long a process that failed waits for the others to agree on the outcome
 * before it reports alone and aborts the job: peers blocked in a collective
 * with it never arrive. */

static void usage(FILE *out)
{
    fputs("usage: moetrain [options] FILE.nml [FILE.nml ...] [group%key=value ...]\n"
          "       moetrain plan --gpus N --gpu h100|h800|h200|b200|gb200|gb300 [--nodes-file F]\n"
          "                     [--global-batch G] [--top K] FILE.nml ...\n"
          "       moetrain --fake-world N --fake-rank R [--backend cpu|guard|plan] FILE.nml ...\n"
          "       moetrain topo [--json] [--dry-run --nodes-file F --gpus-per-node G] FILE.nml ...\n"
          "       moetrain ckpt convert [--to sharded|state.bin] SRC DST\n"
          "       moetrain export-hf [--dtype fp32|bf16] [--max-shard-size BYTES] CKPT OUTDIR\n"
          "       moetrain from-megatron [--world-size N] [-o FILE.nml] -- PRETRAIN_GPT_ARGS...\n"
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
          "  --fake-world N     build rank --fake-rank R of an N-process job in this process\n"
          "  --fake-rank R      (no communication) and check its allocations against the\n"
          "                     memory plan; --backend plan reserves without touching\n"
          "  --verbose          with --check: list every group (default: the first few of a\n"
          "                     kind and its last)\n"
          "  --backend NAME     compute backend: cuda (default when this build has CUDA, a\n"
          "                     GPU is visible and precision%params_dtype is 'bf16'), cpu\n"
          "                     (the reference), or guard (the CPU kernels on emulated device\n"
          "                     memory that host code cannot touch: a check without a GPU)\n"
          "  -V, --version      print the version and the backends this build has\n"
          "  -h, --help         this text\n"
          "\n"
          "See moetrain(1) and moetrain.nml(5). Report bugs at " PACKAGE_BUGREPORT "\n",
          out);
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
    if (c->moe.moe_shared_expert_overlap)
        printf("shared expert: computed while the expert-parallel all-to-alls are in flight "
               "(moe_shared_expert_overlap)\n");
    printf("layout: world %d = TP %d x CP %d x PP %d x DP %d; experts: ETP %d x EP %d x EDP %d "
           "x PP %d; VPP %d; order %s\n",
           l->world_size, l->tp, l->cp, l->pp, l->dp, l->etp, l->ep, l->edp, l->pp, l->vpp,
           c->parallel.order);
    printf("batch: global %d = micro %d x DP %d x %d micro-batches; %lld tokens per iteration\n",
           c->training.global_batch_size, c->training.micro_batch_size, l->dp,
           l->num_micro_batches,
           (long long)c->training.global_batch_size * c->training.seq_length);
    if (l->dp > 1 || l->edp > 1) {
        const struct mt_config_parallel *p = &c->parallel;
        char bucket[64] = "max(40M, 1M x the group's size)";
        if (p->ddp_bucket_size) snprintf(bucket, sizeof bucket, "%d", p->ddp_bucket_size);
        printf("data parallel: %s, buckets of %s elements%s; parameter all-gather %s\n",
               p->use_distributed_optimizer ? "ZeRO-1 (gradients reduce-scattered)"
                                            : "gradients all-reduced",
               bucket,
               p->overlap_grad_reduce ? ", each started as backward finishes it "
                                        "(overlap_grad_reduce)"
                                      : " after backward",
               !p->use_distributed_optimizer ? "none (every rank updates everything)"
               : p->overlap_param_gather ? "waited for at each bucket's first use in forward "
                                           "(overlap_param_gather)"
                                         : "after the step");
    }
    if (l->pp > 1) {
        const int nmb = l->num_micro_batches;
        printf("pipeline: PP %d x VPP %d, %s schedule, %d micro-batches; bubble fraction "
               "(PP-1)/(m*VPP+PP-1) = %d/%d = %.4f\n",
               l->pp, l->vpp, l->vpp > 1 ? "interleaved 1F1B" : "1F1B", nmb, l->pp - 1,
               nmb * l->vpp + l->pp - 1, (double)(l->pp - 1) / (nmb * l->vpp + l->pp - 1));
        if (c->parallel.overlap_p2p_comm)
            printf("pipeline transfers: the steady phase's sends and receives started before "
                   "the compute that follows them, waited for before their data is used "
                   "(overlap_p2p_comm)\n");
        if (c->parallel.overlap_p2p_comm_warmup_flush)
            printf("pipeline transfers: the warm-up's and the flush's sends and receives "
                   "started ahead too, each waited for when its data is needed or after the "
                   "next pass (overlap_p2p_comm_warmup_flush)\n");
        for (int s = 0; s < l->pp; s++) {
            printf("  stage %d:", s);
            for (int ch = 0; ch < l->vpp; ch++) {
                int first = 0, n = 0;
                mt_config_pp_layers(c, s, ch, &first, &n);
                if (l->vpp > 1) printf(" chunk %d", ch);
                if (n > 0)
                    printf(" layers %d-%d", first, first + n - 1);
                else
                    printf(" no layers");
                if (ch + 1 < l->vpp) putchar(';');
            }
            printf("%s%s\n", s == 0 ? " (embedding)" : "",
                   s == l->pp - 1 ? " (final norm, LM head, loss)" : "");
        }
    }
}

static void print_error(const struct mt_err *err, const char *who)
{
    mt_cli_print_error("moetrain", err, who);
}

static int fail(const struct mt_err *err)
{
    print_error(err, "");
    return 1;
}

static void agree_or_abort(struct mt_world *w, int rc, const struct mt_err *err)
{
    mt_cli_agree_or_exit("moetrain", w, rc, err);
}

/* What the command line asks for. */
struct cli {
    enum { TRAIN, CHECK, PRINT, FAKE } action;
    int fake_world, fake_rank; /* --fake-world, --fake-rank (-1: not given) */
    int world;         /* --world-size (default 1) */
    bool world_given;
    bool verbose;      /* --verbose: --check lists every group */
    const char *backend; /* --backend, NULL: the default */
    char **files, **overrides;
    int nfiles, noverrides;
};

/* Loads, resolves and checks the configuration for world processes. */
static int load_config(struct mt_config *cfg, const struct cli *cli, int world,
                       struct mt_layout *layout, struct mt_err *err)
{
    MT_CHECK(mt_config_load(cfg, cli->nfiles, cli->files, cli->noverrides, cli->overrides, err));
    MT_CHECK(mt_config_resolve(cfg, world, layout, err));
    return mt_model_check_config(cfg, err);
}

static void print_startup(const struct mt_world *w, const struct mt_config *c,
                          const struct mt_layout *l)
{
    printf("moetrain: launcher %s, %d process%s on %d node%s; layout TP %d x CP %d x PP %d x "
           "DP %d, experts ETP %d x EP %d x EDP %d, order %s\n",
           w->launcher, w->size, w->size == 1 ? "" : "es", w->num_nodes,
           w->num_nodes == 1 ? "" : "s", l->tp, l->cp, l->pp, l->dp, l->etp, l->ep, l->edp,
           c->parallel.order);
    fflush(stdout);
}

#ifdef HAVE_CUDA
static bool dm_is_cuda(void *arg, const void *p)
{
    (void)arg;
    return mt_cuda_is_device_memory(p);
}
#endif
static bool dm_is_guard(void *arg, const void *p)
{
    (void)arg;
    return mt_guard_owns(p, 1);
}
static void dm_guard_open(void *arg)
{
    (void)arg;
    mt_guard_open();
}
static void dm_guard_close(void *arg)
{
    (void)arg;
    mt_guard_close();
}

/* The name of the compute backend --backend names, else of the default; why says how
 * it was chosen. */
static const char *backend_name(const struct cli *cli, const struct mt_config *cfg, char *why,
                                size_t why_len)
{
    const char *name = cli->backend;
    snprintf(why, why_len, "--backend %s", name ? name : "");
    if (!name) {
#ifdef HAVE_CUDA
        const bool bf16 = !strcmp(cfg->precision.params_dtype, "bf16");
        char desc[256];
        bool gpu = mt_cuda_describe(desc, sizeof desc) > 0;
        name = gpu && bf16 ? "cuda" : "cpu";
        snprintf(why, why_len, "default: %s",
                 !gpu ? "no GPU visible" : bf16 ? "a GPU is visible and params_dtype is 'bf16'"
                                                : "params_dtype is 'fp32'; the CUDA backend "
                                                  "runs bf16 (--backend cuda needs "
                                                  "precision%params_dtype='bf16')");
#else
        (void)cfg;
        name = "cpu";
        snprintf(why, why_len, "default: this build has no CUDA");
#endif
    }
    return name;
}

/* The compute backend (--backend, else the default) on this process's GPU, and the
 * device transports of the communicators. why says how it was chosen. */
static int select_backend(const struct cli *cli, const struct mt_config *cfg,
                          const struct mt_topo_setup *topo, struct mt_parallel *par,
                          const struct mt_kernels **out, char *why, size_t why_len,
                          struct mt_err *err)
{
    const bool bf16 = !strcmp(cfg->precision.params_dtype, "bf16");
    const char *name = backend_name(cli, cfg, why, why_len);
    if (!strcmp(name, "cpu")) {
        *out = mt_kernels_cpu();
        return MT_OK;
    }
    if (!strcmp(name, "guard")) {
        *out = mt_kernels_guard();
        static const struct mt_device_memory dm = { NULL, dm_is_guard, dm_guard_open,
                                                    dm_guard_close };
        return par && par->world->size > 1 ? mt_parallel_use_device(par, &dm, false, NULL, err)
                                           : MT_OK;
    }
    if (!bf16)
        return mt_err_set(err, MT_EINVAL,
                          "--backend cuda: the CUDA backend multiplies in bf16 on tensor cores; "
                          "set precision%%params_dtype = 'bf16' (or run --backend cpu for fp32)");
#ifdef HAVE_CUDA
    /* cuBLASLt and the driver are loaded now, not at program start (doc/site-install.md) */
    if (mt_cuda_load_libraries(err) != MT_OK) return mt_err_prefix(err, "--backend cuda");
    int dev = topo && topo->gpu.cuda_device >= 0 ? topo->gpu.cuda_device : 0;
    char msg[256];
    if (mt_cuda_select_device(dev, msg, sizeof msg) != 0)
        return mt_err_set(err, MT_EUNSUPPORTED, "--backend cuda: %s", msg);
    const struct mt_kernels *k = mt_kernels_cuda(err);
    if (!k) return err->code;
    struct mt_cuda_device_info gpu;
    if (mt_cuda_device_info(&gpu) == 0)
        MT_CHECK(mt_config_check_recipe_gpu(cfg, gpu.name, gpu.cc_major, gpu.cc_minor, err));
    *out = k;
    if (par && par->world->size > 1) { /* one process trains without collectives */
#ifdef HAVE_NCCL
        static const struct mt_device_memory dm = { NULL, dm_is_cuda, NULL, NULL };
        return mt_parallel_use_device(par, &dm, true, mt_cuda_stream(k), err);
#else
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "--backend cuda with %d processes: this moetrain was built without "
                          "NCCL (see ./configure --with-nccl)",
                          par->world->size);
#endif
    }
    return MT_OK;
#else
    (void)topo;
    (void)par;
    return mt_err_set(err, MT_EUNSUPPORTED,
                      "--backend cuda: this moetrain was built without CUDA (configure found no "
                      "nvcc/cudart/cuBLASLt; see ./configure --with-cuda)");
#endif
}

/* After a run on a device backend, rank 0 prints what the backend made the host do
 * (struct mt_op_counts): launches and host synchronisations in all, the ops with the
 * most synchronisations, and under the CUDA emulator what the emulated device saw. */
static void report_counts(const struct mt_kernels *k, const struct mt_world *w)
{
    if (!k->counts || w->rank != 0) return;
    struct mt_op_counts c;
    k->counts(k->ctx, &c);
    long long launches = 0, syncs = 0;
    for (int i = 0; i <= MT_OP_COUNT; i++) launches += c.launches[i], syncs += c.syncs[i];
    char top[256] = "";
    size_t at = 0;
    bool used[MT_OP_COUNT + 1] = { false };
    for (int n = 0; n < 4; n++) {
        int best = -1;
        for (int i = 0; i <= MT_OP_COUNT; i++)
            if (!used[i] && c.syncs[i] > 0 && (best < 0 || c.syncs[i] > c.syncs[best])) best = i;
        if (best < 0) break;
        used[best] = true;
        at += (size_t)snprintf(top + at, sizeof top - at, "%s%s %lld", n ? ", " : "",
                               best == MT_OP_COUNT ? "outside ops" : mt_op_names[best],
                               c.syncs[best]);
        if (at >= sizeof top) break;
    }
    printf("moetrain: host costs of the %s backend since it started: %lld kernel launches, %lld "
           "host synchronisations%s%s%s\n",
           k->name, launches, syncs, top[0] ? " (most in " : "", top, top[0] ? ")" : "");
#ifdef HAVE_CUDA
    long long el, es;
    if (!strcmp(k->name, "cuda") && mt_cuda_emulated_counts(k, &el, &es))
        printf("moetrain: the emulated device saw %lld kernel launches and %lld host "
               "synchronisations%s\n",
               el, es, el == launches && es == syncs ? " (the same)" : " (NOT the backend's counts)");
#endif
}

/* After a training run: the CUDA backend's dense GEMMs that ran on cuBLASLt's fp32
 * fallback (each shape was named on stderr when first seen). Rank 0 prints the counts
 * at the end of the training log; another rank only when it used the fallback. */
static void report_backend(const struct mt_kernels *k, const struct mt_world *w)
{
    report_counts(k, w);
#ifdef HAVE_CUDA
    if (strcmp(k->name, "cuda") != 0) return;
    struct mt_cuda_gemm_stats s;
    mt_cuda_gemm_stats(k, &s);
    if (!s.compute || (w->rank != 0 && s.fallback_shapes == 0)) return;
    char who[32] = "";
    if (w->size > 1) snprintf(who, sizeof who, " (rank %d)", w->rank);
    fprintf(w->rank == 0 ? stdout : stderr,
            "moetrain: dense GEMMs%s: %lld shapes, %lld cuBLASLt calls asking for %s; on the %s fallback "
            "(no tensor cores): %lld shape%s, %lld call%s%s\n",
            who, s.shapes, s.calls, s.compute, s.fallback_compute, s.fallback_shapes,
            s.fallback_shapes == 1 ? "" : "s", s.fallback_calls, s.fallback_calls == 1 ? "" : "s",
            s.fallback_shapes ? " (each shape and its fix on stderr)" : "");
    if ((s.lowp_calls || s.lowp_grouped) && w->rank == 0)
        printf("moetrain: low-precision GEMMs: %lld cuBLASLt FP8/FP4 matmuls, scale modes %s; %lld "
               "through the epilogue (padding, NVFP4's per-tensor scales); %lld grouped launches of "
               "%lld expert GEMMs; %lld quantisations fused with their producer\n",
               s.lowp_calls, s.lowp_modes, s.lowp_epilogues, s.lowp_grouped, s.lowp_groups, s.lowp_fused);
#else
    (void)k;
    (void)w;
#endif
}

/* Releases what the backend holds (the CUDA context: GEMM plans, cuBLASLt, memory,
 * stream), once nothing uses it any more (the communicators are gone). */
static void release_backend(const struct mt_kernels *k, const struct mt_world *w)
{
#ifdef HAVE_CUDA
    struct mt_err err = { 0 };
    if (!strcmp(k->name, "cuda") && mt_kernels_cuda_destroy(&err) != MT_OK) {
        char who[32] = "";
        if (w->size > 1) snprintf(who, sizeof who, "rank %d", w->rank);
        print_error(&err, who);
    }
#else
    (void)k;
    (void)w;
#endif
}

/* SIGTERM, SIGINT, SIGUSR1, SIGHUP: the first asks the training loop to save and stop
 * at the next iteration boundary (every rank agrees on which); a second one ends the
 * process at once, by the signal's default action. */
static void on_stop_signal(int sig)
{
    static const char msg[] = "moetrain: signal received: saving a checkpoint and stopping at "
                              "the end of this iteration (a second signal ends the process "
                              "at once)\n";
    if (mt_train_request_stop(sig) > 0) {
        signal(sig, SIG_DFL);
        raise(sig); /* delivered when this handler returns */
        return;
    }
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
}

static void install_stop_handlers(void)
{
    static const int sigs[] = { SIGTERM, SIGINT, SIGUSR1, SIGHUP };
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
}

/* Every process names what it found (its own differing keys, or rank 0 the ranks
 * that differ), then the job ends: nothing has been allocated yet. */
static void agree_on_config_or_exit(struct mt_world *w, const struct mt_config *cfg)
{
    struct mt_err err = { 0 };
    bool report;
    if (mt_train_agree_config(w, cfg, &report, &err) == MT_OK) return;
    if (report) mt_cli_print_rank_error("moetrain", w, &err);
    fflush(stderr);
    struct mt_err berr = { 0 };
    if (mt_barrier(w->comm, &berr) != MT_OK) mt_world_abort(w);
    mt_world_finalize(w);
    exit(1);
}

/* A training run: the world, the config on every process, the groups, the
 * loop. Returns the exit status (failures after world init do not return): 0, or
 * 128 + the signal that stopped the run (after its checkpoint was saved). */
static int train(struct mt_config *cfg, const struct cli *cli)
{
    struct mt_err err = { 0 };
    struct mt_world *w;
    /* Until the config is read, the default bound on collectives applies. */
    if (mt_world_init(&w, cfg->parallel.distributed_timeout_minutes * 60.0, &err)) {
        /* MT_EUNSUPPORTED (launcher, build) is the same everywhere: say it once. */
        int r = mt_world_launcher_rank();
        if (err.code != MT_EUNSUPPORTED || r == 0) {
            char who[32] = "";
            if (r != 0) snprintf(who, sizeof who, "rank %d", r);
            print_error(&err, who);
        }
        return 1;
    }
    struct mt_layout layout;
    int rc = load_config(cfg, cli, w->size, &layout, &err);
    if (rc == MT_OK && cli->world_given && cli->world != w->size)
        rc = mt_err_set(&err, MT_EINVAL,
                        "--world-size %d: a training run has the size its launcher gives "
                        "(here %d process%s); --world-size is for --check and --print-config",
                        cli->world, w->size, w->size == 1 ? "" : "es");
    agree_or_abort(w, rc, &err);
    agree_on_config_or_exit(w, cfg);
    install_stop_handlers();
    mt_world_set_timeout(w, cfg->parallel.distributed_timeout_minutes * 60.0);
    if (w->rank == 0) print_startup(w, cfg, &layout);

    /* Discovery, binding and placement come before anything starts threads. */
    struct mt_topo_setup *topo = NULL;
    rc = mt_topo_startup(w, cfg, &topo, &err);
    agree_or_abort(w, rc, &err);
    rc = mt_topo_setup_place(topo, w, cfg, &layout, &err);
    agree_or_abort(w, rc, &err);

    struct mt_parallel *par = NULL;
    rc = mt_parallel_init(w, cfg, &layout, topo->plan.logical_of_process, &par, &err);
    agree_or_abort(w, rc, &err);
    if (w->rank == 0) {
        rc = mt_topo_print_report(topo, &par->layout, 64, stdout, &err);
        fflush(stdout);
    }
    agree_or_abort(w, rc, &err);

    const struct mt_kernels *k = NULL;
    char why[256];
    rc = select_backend(cli, cfg, topo, par, &k, why, sizeof why, &err);
    agree_or_abort(w, rc, &err);
    if (w->rank == 0) {
        char isa[128] = "";
        if (strcmp(k->name, "cuda")) /* the CPU kernels run the ops (cpu, guard) */
            snprintf(isa, sizeof isa, "; CPU kernels %s (built: %s)", mt_cpu_isa(), mt_cpu_isa_built());
        printf("moetrain: backend %s (%s)%s\n", k->name, why, isa);
    }
    if (w->rank == 0 && par->nnccl > 0) {
        char line[1024];
        mt_parallel_device_summary(&par->layout, par->logical_of_process, par->rank, line,
                                   sizeof line);
        printf("moetrain: %s\n", line);
    }

    /* Only rank 0 writes the training log. */
    int stopped_by = 0;
    rc = mt_train_run(cfg, &layout, par, k, w->rank == 0 ? stdout : NULL, &stopped_by, &err);
    fflush(stdout);
    agree_or_abort(w, rc, &err);
    report_backend(k, w);
    fflush(stdout);
    mt_parallel_destroy(par);
    release_backend(k, w);
    mt_topo_setup_free(topo);
    mt_world_finalize(w);
    return stopped_by ? 128 + stopped_by : 0;
}

/* An unknown option; Megatron's flags are named with the key they are here. */
static void unknown_option(const char *a)
{
    const struct mt_megatron_flag *meg = mt_megatron_find(a);
    if (meg && meg->key && meg->conv != MT_MEG_AS_IS)
        fprintf(stderr,
                "moetrain: error: unknown option '%s': Megatron's %s becomes %s here, converted "
                "(%s); moetrain from-megatron converts a whole command line\n",
                a, meg->flag, meg->key, meg->why);
    else if (meg && meg->key)
        fprintf(stderr,
                "moetrain: error: unknown option '%s'; did you mean %s%s? (Megatron's %s is a "
                "namelist setting here, on the command line or in a file)\n",
                a, meg->key,
                meg->kind == MT_MEG_VALUE ? "=VALUE" : strchr(meg->key, '=') ? "" : "=.true.",
                meg->flag);
    else if (meg)
        fprintf(stderr, "moetrain: error: unknown option '%s': Megatron's %s is %s in moetrain (%s)\n",
                a, meg->flag, mt_megatron_kind_name(meg->kind), meg->why);
    else
        fprintf(stderr, "moetrain: error: unknown option '%s' (see moetrain --help)\n", a);
}

/* Returns -1 to go on, else the exit status (--help, --version, bad usage). */
static int parse_args(int argc, char **argv, struct cli *cli)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-V") || !strcmp(a, "--version")) {
            mt_print_version(stdout);
            return 0;
        } else if (!strcmp(a, "--help-config")) {
            help_config();
            return 0;
        } else if (!strcmp(a, "--check")) {
            cli->action = CHECK;
        } else if (!strcmp(a, "--print-config")) {
            cli->action = PRINT;
        } else if (!strcmp(a, "--verbose")) {
            cli->verbose = true;
        } else if (!strcmp(a, "--world-size") || !strncmp(a, "--world-size=", 13)) {
            const char *v = a[12] == '=' ? a + 13 : (i + 1 < argc ? argv[++i] : NULL);
            char *end;
            long n = v ? strtol(v, &end, 10) : 0;
            if (!v || *end || n < 1 || n > 100000000) {
                fprintf(stderr, "moetrain: error: --world-size needs a positive integer\n");
                return 1;
            }
            cli->world = (int)n;
            cli->world_given = true;
        } else if (!strcmp(a, "--backend") || !strncmp(a, "--backend=", 10)) {
            const char *v = a[9] == '=' ? a + 10 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v || (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "guard") &&
                       strcmp(v, "plan"))) {
                fprintf(stderr, "moetrain: error: --backend takes cpu, cuda or guard (plan with "
                                "--fake-world)%s%s%s\n",
                        v ? " (not '" : "", v ? v : "", v ? "')" : "");
                return 1;
            }
            cli->backend = v;
        } else if (!strcmp(a, "--fake-world") || !strcmp(a, "--fake-rank")) {
            const char *v = i + 1 < argc ? argv[++i] : NULL;
            char *end;
            long n = v ? strtol(v, &end, 10) : -1;
            const bool world = a[7] == 'w';
            if (!v || !*v || *end || n < (world ? 1 : 0) || n > 100000000) {
                fprintf(stderr, "moetrain: error: %s needs %s\n", a,
                        world ? "the job's process count, a positive integer"
                              : "a rank, an integer from 0 to the --fake-world size - 1");
                return 1;
            }
            if (world)
                cli->fake_world = (int)n;
            else
                cli->fake_rank = (int)n;
        } else if (a[0] == '-' && a[1]) {
            unknown_option(a);
            return 1;
        } else if (mt_config_is_override(a)) {
            cli->overrides[cli->noverrides++] = argv[i];
        } else {
            cli->files[cli->nfiles++] = argv[i];
        }
    }
    if ((cli->fake_world > 0) != (cli->fake_rank >= 0)) {
        fprintf(stderr, "moetrain: error: --fake-world N and --fake-rank R go together (rank R "
                        "of an N-process job)\n");
        return 1;
    }
    if (cli->fake_world > 0) {
        if (cli->action != TRAIN || cli->world_given) {
            fprintf(stderr, "moetrain: error: --fake-world builds one rank; it does not go with "
                            "--check, --print-config or --world-size (its N is the world size)\n");
            return 1;
        }
        cli->action = FAKE;
        cli->world = cli->fake_world;
    } else if (cli->backend && !strcmp(cli->backend, "plan")) {
        fprintf(stderr, "moetrain: error: --backend plan (address ranges reserved, never "
                        "touched) builds nothing that trains; it goes with --fake-world N "
                        "--fake-rank R\n");
        return 1;
    }
    if (cli->nfiles == 0 && cli->noverrides == 0) {
        usage(stderr);
        fprintf(stderr, "\nmoetrain: error: no namelist file given (try namelists/tiny_moe.nml)\n");
        return 1;
    }
    return -1;
}

/* --check and --print-config: this process alone, no launcher needed. */
static int check_or_print(struct mt_config *cfg, const struct cli *cli)
{
    struct mt_err err = { 0 };
    struct mt_layout layout;
    if (load_config(cfg, cli, cli->world, &layout, &err)) return fail(&err);
    if (cli->action == PRINT) return mt_config_print(cfg, stdout) ? 1 : 0;
    if (cli->backend && mt_config_check_backend(cfg, cli->backend, &err)) return fail(&err);
    printf("moetrain: configuration is valid for %d process%s\n", cli->world,
           cli->world == 1 ? "" : "es");
    print_layout(cfg, &layout);
    struct mt_rank_layout rl;
    if (mt_groups_build(&cfg->parallel, &layout, &rl, &err)) return fail(&err);
    printf("groups (logical ranks):\n");
    if (mt_groups_print(&rl, cli->verbose ? 0 : 4, stdout))
        printf("(--verbose lists every group)\n");
    if (cli->world > 1) { /* what --backend cuda would make, for logical rank 0 */
        char line[1024];
        mt_parallel_device_summary(&rl, NULL, 0, line, sizeof line);
        printf("with --backend cuda: %s\n", line);
    }
    mt_groups_free(&rl);
    if (mt_train_memory_report(cfg, &layout, stdout, &err)) return fail(&err);
    return 0;
}

/* --fake-world N --fake-rank R: rank R of an N-process job, built in this process on the
 * backend asked (cpu by default; plan: reserved ranges, no page touched) without
 * communication, its allocations compared with its memory plan. */
static int fake_world(struct mt_config *cfg, const struct cli *cli)
{
    struct mt_err err = { 0 };
    struct mt_layout layout;
    if (load_config(cfg, cli, cli->world, &layout, &err)) return fail(&err);
    const struct mt_kernels *k = NULL;
    if (!cli->backend || !strcmp(cli->backend, "cpu"))
        k = mt_kernels_cpu();
    else if (!strcmp(cli->backend, "guard"))
        k = mt_kernels_guard();
    else if (strcmp(cli->backend, "plan")) {
        mt_err_set(&err, MT_EUNSUPPORTED,
                   "--fake-world with --backend %s: a fake rank is built on cpu, guard or plan "
                   "(a GPU's allocations are what --backend cpu counts: the same sizes go "
                   "through the same op table)",
                   cli->backend);
        return fail(&err);
    }
    printf("moetrain: fake world of %d processes, layout TP %d x CP %d x PP %d x DP %d, experts "
           "ETP %d x EP %d x EDP %d, VPP %d\n",
           layout.world_size, layout.tp, layout.cp, layout.pp, layout.dp, layout.etp, layout.ep,
           layout.edp, layout.vpp);
    if (mt_plan_fake_rank(cfg, &layout, cli->fake_rank, k, stdout, &err)) {
        fflush(stdout);
        return fail(&err);
    }
    return 0;
}

/* moetrain from-megatron [--world-size N] [-o FILE] -- ARGS: the namelist equivalent to
 * Megatron-LM's pretrain_gpt.py ARGS (src/config/from_megatron.c), checked as --check
 * checks it for N processes, or for the smallest world size the flags allow; the flags
 * not mapped, and why, on stderr. */
static int from_megatron(int argc, char **argv)
{
    const char *out_path = NULL;
    int world = 0, i = 1;
    for (; i < argc && strcmp(argv[i], "--"); i++) {
        char *end;
        if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) && i + 1 < argc) {
            out_path = argv[++i];
        } else if (!strcmp(argv[i], "--world-size") && i + 1 < argc &&
                   (world = (int)strtol(argv[i + 1], &end, 10)) > 0 && !*end) {
            i++;
        } else {
            fprintf(stderr, "moetrain from-megatron: error: %s: not an option of from-megatron; "
                            "give pretrain_gpt.py's arguments after '--' (moetrain from-megatron "
                            "[--world-size N] [-o FILE.nml] -- ARGS...)\n", argv[i]);
            return 1;
        }
    }
    if (i == argc) {
        fprintf(stderr, "moetrain from-megatron: error: no '--': give pretrain_gpt.py's "
                        "arguments after it\n");
        return 1;
    }
    struct mt_err err = { 0 };
    struct mt_megatron_result conv;
    if (mt_megatron_convert(argc - i - 1, argv + i + 1, &conv, &err)) return fail(&err);
    struct mt_config *cfg = malloc(sizeof *cfg), *tried = malloc(sizeof *tried);
    struct mt_layout layout;
    int rc = 1, unit = 1, w = world;
    if (!cfg || !tried) {
        mt_err_set(&err, MT_ENOMEM, "out of memory");
        goto done;
    }
    mt_config_defaults(cfg);
    if (mt_config_load(cfg, 0, NULL, conv.noverrides, conv.overrides, &err)) goto done;
    /* the smallest multiple of the layout's unit that the batch and model rules accept */
    unit = mt_megatron_world_unit(&cfg->parallel);
    for (int k = 1; k <= (world ? 1 : 4096); k++) {
        struct mt_err e = { 0 };
        *tried = *cfg;
        w = world ? world : k * unit;
        if (!mt_config_resolve(tried, w, &layout, &e) && !mt_model_check_config(tried, &e)) {
            rc = 0;
            break;
        }
        if (k == 1) err = e;
    }
    if (rc) goto done;
    FILE *out = out_path ? fopen(out_path, "w") : stdout;
    if (!out || mt_config_print(cfg, out) || (out_path && fclose(out))) {
        rc = 1;
        mt_err_set(&err, MT_EIO, "cannot write %s", out_path ? out_path : "the namelist");
        goto done;
    }
    mt_megatron_report(&conv, stderr);
    fprintf(stderr, "moetrain from-megatron: valid for %d process%s (%s); check with "
                    "moetrain --check --world-size %d %s\n",
            w, w == 1 ? "" : "es", world ? "--world-size" : "the smallest world size these flags allow", w,
            out_path ? out_path : "FILE.nml");
done:
    if (rc) {
        mt_megatron_report(&conv, stderr);
        print_error(&err, "");
        if (!world && unit > 0)
            fprintf(stderr, "(checked for %d process%s, the smallest world size these flags allow, "
                            "and its multiples; give --world-size N for the job's)\n",
                    unit, unit == 1 ? "" : "es");
    }
    mt_megatron_result_free(&conv);
    free(cfg);
    free(tried);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "topo")) return mt_topo_cli(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "ckpt")) return mt_ckpt_cli(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "export-hf")) return mt_hf_cli(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "from-megatron")) return from_megatron(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "plan")) return mt_plan_cli(argc - 1, argv + 1);
    struct cli cli = { .action = TRAIN, .world = 1, .fake_rank = -1 };
    cli.files = calloc((size_t)argc, sizeof *cli.files);
    cli.overrides = calloc((size_t)argc, sizeof *cli.overrides);
    struct mt_config *cfg = malloc(sizeof *cfg);
    int rc;
    if (!cli.files || !cli.overrides || !cfg) {
        fprintf(stderr, "moetrain: error: out of memory\n");
        rc = 1;
    } else if ((rc = parse_args(argc, argv, &cli)) < 0) {
        struct mt_err err = { 0 };
        mt_config_defaults(cfg);
        /* MOETRAIN_CPU_ISA, before anything runs on the CPU kernels */
        if (mt_cpu_isa_check(&err) != MT_OK)
            rc = fail(&err);
        else
            rc = cli.action == TRAIN  ? train(cfg, &cli)
                 : cli.action == FAKE ? fake_world(cfg, &cli)
                                      : check_or_print(cfg, &cli);
    }
    free(cfg);
    free(cli.files);
    free(cli.overrides);
    return rc;
}

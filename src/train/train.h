/* moetrain: the training loop (src/train), for one process or one rank of a layout.
 *
 * train.c runs the loop: micro-batches accumulated to the global batch (split over
 * data-parallel ranks as Megatron's sampler splits it) or, with pipeline parallelism,
 * run through the stages by Megatron's 1F1B schedule (interleaved 1F1B with a virtual
 * pipeline: activations and gradients travel over the pipeline group, blocking calls
 * ordered activation-first for 1F1B, batched mt_p2p_batch exchanges around the ring
 * for the interleaved schedule), AdamW, global-norm clipping,
 * the LR schedule, evaluation, Megatron-style logs, a JSON-lines metrics file and
 * checkpoints. optim.c synchronises gradients and runs the (distributed) optimizer;
 * checkpoint.c holds the save directory and the one-process format, ckpt_shard.c the
 * sharded format, ckpt_dist.c saves and loads it from any layout. */
#ifndef MT_TRAIN_TRAIN_H
#define MT_TRAIN_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config/config.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "runtime/parallel.h"
#include "util/error.h"

/* Model chunks per pipeline stage (virtual_pipeline_model_parallel_size) the trainer
 * runs at most. */
#define MT_MAX_VPP 16

/* One rank's GPU memory by category, in bytes: what moetrain allocates through the
 * kernel backend (not the CUDA context, the backend's own workspace, NCCL's buffers). */
struct mt_rank_memory {
    long long rank, stage;  /* logical rank, pipeline stage */
    size_t params;          /* the weights the passes read: the bf16 working copy, or the
                               fp32 parameters */
    size_t master;          /* fp32 master weights (bf16 training) */
    size_t grads;           /* fp32 gradients, and the reduced slices ZeRO keeps */
    size_t optimizer;       /* Adam moments (ZeRO: this rank's slices) */
    size_t act_per_mb;      /* activations saved for backward of one micro-batch (every
                               model chunk of the stage) */
    long long inflight;     /* micro-batches held at once under the schedule */
    size_t activations;     /* act_per_mb x inflight */
    size_t lowp_copies;     /* FP8/FP4: of act_per_mb, the linears' inputs saved quantised
                               for backward (data and scales; offloaded ones included) */
    size_t lowp_replaced;   /* the high-precision inputs they replace, which are not kept */
    size_t recompute;       /* the buffer backward rebuilds unkept activations in
                               (&recompute; one per rank) */
    size_t pipeline;        /* stage-boundary buffers, and the interleaved schedule's
                               messages at their peak */
    size_t comm;            /* staging of the gradient reductions */
    size_t workspace;       /* the passes' temporaries, the norm accumulator */
    size_t other;           /* expert biases */
    size_t offload;         /* activation offloading's device buffer (two layers' tensors) */
    size_t total;
    size_t offload_host;    /* pinned host memory holding the offloaded tensors (not in
                               total: host memory) */
    size_t offload_step;    /* bytes a training step copies to the host, and back */
};

/* Sets logical rank `rank` of layout l up as training would (model, pipeline stage,
 * optimizer) on the plan backend, which reserves address ranges and backs none, and
 * reports its bytes: the same code and the same figures as logging%log_memory in a real
 * run of that layout. Checks that the categories account for every byte allocated. */
int mt_train_plan_memory(const struct mt_config *cfg, const struct mt_layout *l, int rank,
                         struct mt_rank_memory *r, struct mt_err *err);
/* mt_train_plan_memory on any backend k: builds logical rank `rank` of layout l for real
 * (its shards, stage buffers, schedule and optimizer; parameters initialised when init)
 * with mt_parallel_plan's communicators (rank and size, no traffic), reports its bytes, checks
 * that they equal live(k) (the bytes k holds) and releases everything. The plan backend
 * with init false is mt_train_plan_memory; moetrain --fake-world runs it on a backend
 * that allocates. */
int mt_train_build_rank(const struct mt_config *cfg, const struct mt_layout *l, int rank,
                        const struct mt_kernels *k, bool init,
                        size_t (*live)(const struct mt_kernels *k), struct mt_rank_memory *r,
                        struct mt_err *err);
/* One line of the memory report for r (no newline): "  stage S, rank R: parameters ...". */
void mt_train_memory_line(char *buf, size_t n, const struct mt_rank_memory *r);
/* moetrain --check: the report of the most loaded rank of every pipeline stage, to out;
 * fails (after printing) when one exceeds precision%gpu_memory_gb. */
int mt_train_memory_report(const struct mt_config *cfg, const struct mt_layout *l, FILE *out,
                           struct mt_err *err);

/* Consecutive non-finite steps after which training stops with an error. */
#define MT_MAX_CONSECUTIVE_NONFINITE 10

/* Runs training as configured on the compute backend k; progress goes to log (world
 * rank 0's; the others' may be NULL). par is this process's place in the layout, NULL
 * for one process; with a device backend its comms must route device memory
 * (mt_parallel_use_device).
 * A stop requested with mt_train_request_stop ends the run at the next iteration
 * boundary that every rank agrees on: it saves a checkpoint (when &checkpoint save is
 * set), flushes the log and metrics and returns MT_OK with *stopped_by set to the
 * signal (0 when the run ended otherwise).
 * Returns MT_OK, or an error (bad data, unreadable checkpoint, a streak of NaN/Inf
 * steps, I/O, a failed collective). */
int mt_train_run(const struct mt_config *cfg, const struct mt_layout *layout,
                 struct mt_parallel *par, const struct mt_kernels *k, FILE *log,
                 int *stopped_by, struct mt_err *err);

/* Asks the running training loop to stop at the next iteration boundary (sig: the
 * signal number to report). Async-signal-safe: a signal handler calls it. Returns how
 * many stops had been requested before this one. */
int mt_train_request_stop(int sig);

/* A collective over the world, before anything is allocated: every process compares
 * the executable it runs and its resolved configuration with world rank 0's. On a
 * difference every process returns MT_EINVAL: a rank whose configuration differs
 * names its differing keys with both values, rank 0 names the ranks that differ, and
 * *report says whether this process's message is one of those to print. */
int mt_train_agree_config(struct mt_world *w, const struct mt_config *cfg, bool *report,
                          struct mt_err *err);

/* Learning rate for the step that follows `steps_done` completed iterations
 * (Megatron's OptimizerParamScheduler: linear warmup from 0, then constant,
 * linear or cosine decay to min_lr at lr_decay_iters, min_lr after). */
double mt_lr_at(const struct mt_config_optimizer *o, long long steps_done);

/* Everything a checkpoint holds besides the model's tensors. */
struct mt_train_state {
    long long iteration;           /* completed iterations */
    long long consumed_samples;    /* training samples consumed */
    long long eval_count;          /* evaluations done (validation read position) */
    long long skipped_iters;       /* non-finite steps skipped so far */
    long long adam_step;           /* optimizer steps taken */
};

/* A checkpoint's view of the trainer: the arrays and their sizes. */
struct mt_ckpt_view {
    int ntensors;
    const char *const *names;      /* per tensor */
    const int *ndims;
    const long long (*shapes)[4];
    size_t nparams;
    float *params, *adam_m, *adam_v; /* nparams each */
    size_t nbuffers;
    float *buffers;                /* non-trainable state (expert biases) */
};

/* The directory a run saves into, held from the run's start to its end. Opening it
 * creates it, takes an exclusive lock on DIR/.moetrain.lock (refused, naming the
 * holder, while another run holds it), proves it writable, and cleans up after
 * crashed saves: *removed counts the leftovers removed, *restored the older saves
 * put back (a crash in the middle of replacing one). Closing releases the lock. */
#define MT_CKPT_LOCK_FILE ".moetrain.lock"
struct mt_ckpt_dir;
int mt_ckpt_dir_open(const char *path, struct mt_ckpt_dir **out, int *removed, int *restored,
                     struct mt_err *err);
const char *mt_ckpt_dir_path(const struct mt_ckpt_dir *d);
void mt_ckpt_dir_close(struct mt_ckpt_dir *d);

/* The steps of a save into DIR/iter_%07lld (world rank 0's): begin creates the empty
 * DIR/iter_N.tmp (tmp gets its path; a leftover is removed first); the ranks write
 * their files there; publish writes config_text (the resolved namelist) beside them,
 * syncs the directory, renames it into place (an existing save of the iteration is
 * replaced without a moment where none exists), points
 * DIR/latest_checkpointed_iteration.txt to it, then prunes to the keep_last most
 * recently written checkpoints (0 = keep all; never the one just written). abort
 * removes the unfinished directory. */
int mt_ckpt_begin(const struct mt_ckpt_dir *d, long long iteration, char *tmp, size_t len,
                  struct mt_err *err);
int mt_ckpt_publish(const struct mt_ckpt_dir *d, long long iteration, const char *config_text,
                    int keep_last, struct mt_err *err);
void mt_ckpt_abort(const struct mt_ckpt_dir *d, long long iteration);

/* Saves v and s in the one-process format (DIR/iter_N/state.bin: header, tensor table,
 * params, Adam m and v, buffers, FNV-1a 64 checksum), through begin and publish. */
int mt_ckpt_save(const struct mt_ckpt_dir *d, const struct mt_ckpt_view *v,
                 const struct mt_train_state *s, const char *config_text, int keep_last,
                 struct mt_err *err);

/* Finds the checkpoint a load of dir reads: dir itself if it is an iter_* directory,
 * else the one its latest file names. *found is false only when dir holds no
 * checkpoint at all (missing, or without a latest file and iter_* directories) and
 * optional is true; otherwise that is an error listing what dir holds, as is a dir
 * with iter_* directories but no latest file. iter_dir gets the directory to read. */
int mt_ckpt_locate(const char *dir, bool optional, char *iter_dir, size_t len, bool *found,
                   struct mt_err *err);

/* A checkpoint read whole, its tables and arrays allocated: for tools and tests that
 * compare or convert checkpoints. path: an iter_* directory of either format, or a
 * state.bin. */
struct mt_ckpt_file {
    struct mt_train_state state;
    struct mt_ckpt_view view;
};
int mt_ckpt_read(const char *path, struct mt_ckpt_file *f, struct mt_err *err);
void mt_ckpt_file_free(struct mt_ckpt_file *f);

/* Converts the checkpoint src (a checkpoint directory or an iter_* directory, either
 * format, read whole) into format `to` (an enum mt_ckpt_format; -1: the other one),
 * saved into the save directory dst (DST/iter_N and its latest file, published as a
 * run publishes; dst may be src's directory). info says what was done. */
enum mt_ckpt_format { MT_CKPT_SHARDED, MT_CKPT_STATE_BIN };
struct mt_ckpt_convert_info {
    char src_iter[4200], dst_iter[4200];
    enum mt_ckpt_format from, to;
    long long iteration;
    int ntensors;
    size_t nparams;
};
const char *mt_ckpt_format_name(enum mt_ckpt_format f);
int mt_ckpt_convert(const char *src, const char *dst, int to, struct mt_ckpt_convert_info *info,
                    struct mt_err *err);
/* `moetrain ckpt ...` (argv[0] is "ckpt"): returns the exit status. */
int mt_ckpt_cli(int argc, char **argv);

/* ---- the optimizer (optim.c): gradient synchronisation and AdamW over the
 * data-parallel groups.
 *
 * Parameters fall in two classes: dense ones are data parallel over the DP group,
 * the routed experts' over the expert-DP group (MoE parallel folding). After the
 * micro-batches:
 *   0. with pipeline parallelism each stage holds its own tensors only; a tied
 *      embedding, held by the first and the last stage, has its gradient summed over
 *      the embedding group (MT_GROUP_EMBD), and only the first stage's copy counts in
 *      the norm and in checkpoints;
 *   1. the gradients of TP-replicated parameters (norms, router) are summed over the
 *      TP group (each TP rank computed the part of its tokens or heads), one reduction
 *      per backward position (a layer; the head; the embedding);
 *   2. each class's gradients are packed in table order into contiguous buckets and
 *      summed over its DP group: all-reduced, or, with the distributed optimizer
 *      (ZeRO-1, Megatron's use_distributed_optimizer), reduce-scattered so that each
 *      rank keeps the sum of its 1/dp slice of every bucket; then scaled by 1/dp, so
 *      the gradient is the mean over the global batch as with one process;
 *   3. the global norm counts every element of the whole model once: a shard on the
 *      rank that holds it, a TP-replicated tensor on TP rank 0, a replica over data
 *      parallelism on one rank (or its slice's owner with ZeRO), summed over all ranks.
 * The step runs AdamW on what each rank owns: everything it holds, or with ZeRO its
 * slices (fp32 master weights and both moments exist only there), after which the
 * updated slices are all-gathered back into every replica. With one process (par
 * NULL) it is the plain loop over the model's tensors. */

/* Megatron's default DDP bucket: max(40M, 1M x group size) elements. */
#define MT_OPTIM_BUCKET_ELEMS 40000000u

struct mt_optim;

/* How the optimizer reduces and updates (NULL: all zero). */
struct mt_optim_opts {
    bool distributed;          /* ZeRO-1 (&parallel use_distributed_optimizer) */
    size_t bucket_elems;       /* the bucket size (0: the default above) */
    bool overlap_grad_reduce;  /* buckets started by mt_optim_grads_ready (see there) */
    bool overlap_param_gather; /* with ZeRO and overlap_grad_reduce: mt_optim_step leaves
                                  each bucket's all-gather in flight (see
                                  mt_optim_params_needed) */
};

/* Buckets: each class is packed in table order and cut every bucket_elems elements
 * (through tensors), except that an embedding tied across pipeline stages has buckets
 * of its own (Megatron's shared_embedding rule). */
int mt_optim_create(struct mt_model *m, const struct mt_kernels *k, const struct mt_parallel *par,
                    const struct mt_optim_opts *opts, struct mt_optim **out, struct mt_err *err);
void mt_optim_destroy(struct mt_optim *o);

/* &parallel overlap_grad_reduce: the last micro-batch's backward has finished position
 * `position` (mt_model_set_grad_hook: num_layers for the final norm and LM head, a
 * layer, -1 for the embedding): step 1 for the TP-replicated tensors there, then step
 * 2 is started (not waited for) for every bucket whose tensors are all complete, last
 * bucket first. Every rank of a group reports the same positions in the same order
 * (they run the same schedule). Does nothing without overlap_grad_reduce or with one
 * process. A step's buffers then stay in use until mt_optim_reduce_grads. */
int mt_optim_grads_ready(struct mt_optim *o, int position, struct mt_err *err);

/* Steps 0-3 above on the model's gradients, for what mt_optim_grads_ready has not
 * started (everything without overlap), then every bucket waited for and finished in
 * bucket order; *norm is the global gradient norm (norm NULL: its square stays in
 * backend memory, mt_model_sumsq_acc, for mt_model_read_stats). Each bucket's reduction and the
 * norm's order of summation are the same with and without overlap: the results are
 * the same, bit for bit. */
int mt_optim_reduce_grads(struct mt_optim *o, double *norm, struct mt_err *err);

/* AdamW step number t (>= 1) with learning rate lr, gradients scaled by clip_coeff;
 * then the model's working copy is refreshed. With overlap_param_gather the updated
 * slices' all-gathers are started, bucket by bucket, and left in flight: the model's
 * parameters (and working copy) are not current until mt_optim_params_needed has seen
 * their position or mt_optim_params_wait has run. */
int mt_optim_step(struct mt_optim *o, const struct mt_config_optimizer *c, double lr,
                  double clip_coeff, long long t, struct mt_err *err);
/* The step of a captured iteration (&cuda_graph impl = 'full_iteration'; not with
 * overlap_param_gather), in two parts: mt_optim_stage_step, on the host before the
 * iteration, writes AdamW's constants of step t with learning rate lr;
 * mt_optim_step_dev, in it after mt_optim_reduce_grads (norm NULL), uploads them and
 * updates every tensor (with the distributed optimizer, this rank's slices, then their
 * all-gathers) with adamw_dev: the clipping coefficient comes from the squared norm
 * (summed over the world), and the step is skipped when it or a forward's loss is not
 * finite (over several processes, the forwards' losses summed over the world first, so
 * that every rank decides alike), all on the device (the trainer's decision, read
 * afterwards); *gate: that decision's inputs, for the rest of the step's device work. */
int mt_optim_stage_step(struct mt_optim *o, const struct mt_config_optimizer *c, double lr,
                        long long t, struct mt_err *err);
int mt_optim_step_dev(struct mt_optim *o, const struct mt_config_optimizer *c,
                      struct mt_step_gate *gate, struct mt_err *err);
/* overlap_param_gather: forward is about to read the weights at `position`
 * (mt_model_set_hooks): every bucket in flight that holds a part of them is waited for,
 * unpacked and refreshed. Nothing to do otherwise. */
int mt_optim_params_needed(struct mt_optim *o, int position, struct mt_err *err);
/* Every all-gather in flight completed: the parameters are current (before a checkpoint
 * is saved, an evaluation, the end of a run). */
int mt_optim_params_wait(struct mt_optim *o, struct mt_err *err);

/* The moments of every parameter this rank holds, in the model's layout (m, v have
 * mt_model_num_params values); with ZeRO gathered from the slices (a collective over
 * the data-parallel groups: every rank calls it). */
int mt_optim_export(struct mt_optim *o, float *m, float *v, struct mt_err *err);
/* Sets the moments from arrays in the model's layout (each rank keeps what it owns). */
void mt_optim_import(struct mt_optim *o, const float *m, const float *v);

/* The optimizer state this rank keeps, as pieces: n moments of tensor `tensor` from
 * element `at` of this rank's shard of it (row-major), at m and v in backend memory.
 * Without ZeRO, every tensor the rank holds, whole; with ZeRO, its slices. */
struct mt_optim_piece {
    int tensor;
    size_t at, n;
    float *m, *v;
};
/* *out (free it) gets the pieces, *n their number. */
int mt_optim_pieces(const struct mt_optim *o, struct mt_optim_piece **out, int *n,
                    struct mt_err *err);
/* Whether the moments are sharded over data parallelism (ZeRO-1). */
bool mt_optim_zero(const struct mt_optim *o);
/* The buckets of the last mt_optim_reduce_grads that mt_optim_grads_ready had started
 * during backward, and all the buckets (of both classes). */
void mt_optim_overlap_counts(const struct mt_optim *o, int *early, int *total);

/* Bytes of backend memory the optimizer holds: moments (with ZeRO, gradient and moment
 * slices) and its staging buffers (the norm's accumulator is the model's,
 * mt_model_sumsq_acc). */
size_t mt_optim_memory(const struct mt_optim *o);
/* The same by kind: Adam moments (fp32, ZeRO: this rank's slices), the reduced gradient
 * slices ZeRO keeps, the staging buffers of the gradient reductions. */
struct mt_optim_bytes {
    size_t moments, grad_shards, staging;
};
void mt_optim_bytes(const struct mt_optim *o, struct mt_optim_bytes *b);

/* ---- checkpoints of a run in any layout (ckpt_dist.c): the sharded format of
 * ckpt_shard.h and doc/checkpoints.md. A save: every rank writes what it owns (data
 * parallel rank 0's copy, or with ZeRO-1 each rank's slices; TP rank 0's of a
 * TP-replicated tensor; the pipeline stage holding the tensor, the first for a tied
 * embedding) into its own file, rank 0 writes the index and publishes once all have
 * written. A load: each rank reads the parts of the stored slices that overlap its
 * shards and moments, from a checkpoint of any layout or a one-process state.bin.
 * Both are collectives over all processes (par NULL: one process); dir is world
 * rank 0's save directory (NULL elsewhere). */

/* What a save or load cost, the largest over the ranks. */
struct mt_ckpt_stats {
    double seconds;
    size_t counted_peak;  /* host bytes the checkpoint code held at once */
    long long rss_rise;   /* the peak resident size's rise during it (-1: unknown) */
    size_t shard_bytes;   /* the rank's own part: written, or staged to load */
    size_t block_bytes;   /* the I/O block */
    char layout[512];     /* a load: the layout that wrote the checkpoint */
    /* a save: how long training was blocked (all of a synchronous save; of an async
     * one the snapshot, the wait for the writer and the publication) and how long the
     * background write took */
    bool async;
    double blocked_s, snapshot_s, wait_s, publish_s, write_s;
};

int mt_ckpt_save_dist(const struct mt_ckpt_dir *dir, struct mt_model *m, struct mt_optim *o,
                      const struct mt_parallel *par, const struct mt_config *cfg,
                      const struct mt_train_state *s, const char *config_text,
                      struct mt_ckpt_stats *stats, struct mt_err *err);
/* A save in two halves, for checkpoint%async_save. start (a collective, at a step
 * boundary) creates DIR/iter_N.tmp and has every rank write its file: at once from
 * the training state (staging NULL), or by a writer thread while training goes on,
 * from a copy of the rank's part taken now into staging (async). The writer makes no
 * MPI call. finish (a collective, on the main thread)
 * waits for the writer, agrees that every rank wrote, gathers the index, writes it and
 * publishes; a rank's write failure fails the save on every rank and nothing is
 * published. written says, without waiting, whether this rank's writer is done (the
 * caller agrees on it before finishing early). cancel (not a collective: a run ending
 * on an error) waits for the writer and removes the unfinished directory.
 * mt_ckpt_save_dist is start and finish at once. */
struct mt_ckpt_save;
/* The host memory async saves copy the rank's part into: the backend's alloc_host
 * (page-locked on a GPU, so the copy runs at full speed), taken at the first async save
 * and kept for the next ones, since pinning gigabytes is slow; it is counted as the
 * checkpoint code's host memory while held. Zero-initialise it; release gives it back
 * (the end of the run). It must outlive every save started with it. */
struct mt_ckpt_staging {
    const struct mt_kernels *k;
    void *p;
    size_t bytes;
};
void mt_ckpt_staging_release(struct mt_ckpt_staging *st);
int mt_ckpt_save_start(const struct mt_ckpt_dir *dir, struct mt_model *m, struct mt_optim *o,
                       const struct mt_parallel *par, const struct mt_config *cfg,
                       const struct mt_train_state *s, const char *config_text,
                       struct mt_ckpt_staging *staging, struct mt_ckpt_save **out,
                       struct mt_err *err);
bool mt_ckpt_save_written(const struct mt_ckpt_save *s);
long long mt_ckpt_save_iteration(const struct mt_ckpt_save *s);
int mt_ckpt_save_finish(struct mt_ckpt_save *s, struct mt_ckpt_stats *stats, struct mt_err *err);
void mt_ckpt_save_cancel(struct mt_ckpt_save *s);

/* Saves a whole checkpoint held in host memory (v: every tensor whole, in table order)
 * in the sharded format, as one process writes it: DIR/iter_N/rank_00000.safetensors
 * and index.json, published as mt_ckpt_save_dist publishes (keeps every checkpoint). */
int mt_ckpt_save_whole(const struct mt_ckpt_dir *dir, const struct mt_ckpt_view *v,
                       const struct mt_train_state *s, const char *config_text,
                       struct mt_err *err);
/* A collective over all processes: every rank returns world rank 0's outcome rc of
 * what; rank 0 keeps its message, the others say that rank 0 failed. */
int mt_ckpt_agree_on_rank0(const struct mt_parallel *par, int rc, const char *what,
                           struct mt_err *err);
/* A collective: MT_OK when every rank's rc is; otherwise a failed rank keeps its
 * message and the others name the first rank that failed. */
int mt_ckpt_agree_all(const struct mt_parallel *par, int rc, const char *what,
                      struct mt_err *err);
/* Loads what mt_ckpt_locate finds in dir; *found as there. Corrupt or mismatched
 * checkpoints are errors naming the file and tensor, and leave the model and
 * optimizer untouched. */
int mt_ckpt_load_dist(const char *dir, bool optional, struct mt_model *m, struct mt_optim *o,
                      const struct mt_parallel *par, struct mt_train_state *s, bool *found,
                      char *loaded_path, size_t loaded_path_len, struct mt_ckpt_stats *stats,
                      struct mt_err *err);

/* ---- initial weights (ckpt_dist.c, hf.c): a run's parameters from a Hugging Face
 * directory (checkpoint%load_hf) or, with moe%use_upcycling, from a dense model's
 * checkpoint, each expert a copy of the dense MLP. Only parameters: the optimizer state
 * and expert biases stay as created, the run starts at iteration 0. Collectives over
 * all processes; each rank reads only the stored slices that overlap its shards. */
struct mt_shard_index;
/* The index of m's tensor named name (-1: none). */
int mt_ckpt_tensor_index(const struct mt_model *m, const char *name);
/* Upcycling: in ix (a dense model's stored tensors), the dense MLP of every layer that
 * is an MoE layer in m becomes its experts' tensors, copy after copy; a checkpoint that
 * already has experts, lacks a layer's MLP or whose MLP has another shape than an
 * expert is an error naming the keys (what names the source). Seals ix. */
int mt_ckpt_upcycle_index(struct mt_shard_index *ix, const struct mt_model *m,
                          const struct mt_config *cfg, const char *what, struct mt_err *err);
/* ix holds every parameter tensor of m with its global shape (the routers may be
 * absent when routers_may_lack: they keep their init) and no other parameter. */
int mt_ckpt_check_params(const struct mt_shard_index *ix, const struct mt_model *m,
                         bool routers_may_lack, const char *what, struct mt_err *err);
/* Every rank reads its shards of the tensors ix holds; the model changes only when all
 * ranks have read all. */
int mt_ckpt_load_params(struct mt_shard_index *ix, struct mt_model *m,
                        const struct mt_parallel *par, struct mt_ckpt_stats *stats,
                        struct mt_err *err);
/* Upcycles the dense checkpoint mt_ckpt_locate finds in dir into m (*found as there). */
int mt_ckpt_load_upcycled(const char *dir, bool optional, const struct mt_config *cfg,
                          struct mt_model *m, const struct mt_parallel *par, bool *found,
                          char *loaded_path, size_t loaded_path_len,
                          struct mt_ckpt_stats *stats, struct mt_err *err);
/* checkpoint%load_hf: the Hugging Face directory dir (config.json checked against cfg,
 * naming the key that differs; upcycled with moe%use_upcycling). */
int mt_hf_load(const char *dir, const struct mt_config *cfg, struct mt_model *m,
               const struct mt_parallel *par, struct mt_ckpt_stats *stats, struct mt_err *err);

/* `moetrain export-hf CKPT OUTDIR` (hf.c): a checkpoint (either format, any layout) as
 * a Hugging Face directory, streamed a block at a time. */
struct mt_hf_export_opts {
    int dtype;                  /* -1: the run's params_dtype; else MT_HF_F32 / MT_HF_BF16 */
    unsigned long long max_shard_bytes;
};
enum { MT_HF_F32 = 0, MT_HF_BF16 = 1 };
struct mt_hf_export_info {
    char iter_dir[4200];
    char architecture[64];
    int nfiles, ntensors;
    unsigned long long bytes;
    int dtype;
};
int mt_hf_export(const char *ckpt, const char *outdir, const struct mt_hf_export_opts *o,
                 struct mt_hf_export_info *info, struct mt_err *err);
/* `moetrain export-hf ...` (argv[0] is "export-hf"): the exit status. */
int mt_hf_cli(int argc, char **argv);

#endif

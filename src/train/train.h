/* moetrain: the single-process training loop (src/train).
 *
 * train.c runs the loop: micro-batches accumulated to the global batch, AdamW,
 * global-norm clipping, the LR schedule, evaluation, Megatron-style logs, a
 * JSON-lines metrics file and checkpoints. The pieces it uses are here too. */
#ifndef MT_TRAIN_TRAIN_H
#define MT_TRAIN_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config/config.h"
#include "util/error.h"

/* Consecutive non-finite steps after which training stops with an error. */
#define MT_MAX_CONSECUTIVE_NONFINITE 10

/* Runs training as configured; progress goes to log. Returns MT_OK, or an error
 * (bad data, unreadable checkpoint, a streak of NaN/Inf steps, I/O). */
int mt_train_run(const struct mt_config *cfg, const struct mt_layout *layout, FILE *log,
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

/* Saves into DIR/iter_%07lld atomically (temporary dir, fsync, rename), updates
 * DIR/latest_checkpointed_iteration.txt, then prunes to keep_last (0 = keep
 * all). config_text (the resolved namelist) is stored beside the state. */
int mt_ckpt_save(const char *dir, const struct mt_ckpt_view *v, const struct mt_train_state *s,
                 const char *config_text, int keep_last, struct mt_err *err);

/* Loads the newest checkpoint under dir (or dir itself if it is one) into v and
 * s, verifying its checksum and that its tensors match v's. *found is false
 * when dir holds no checkpoint yet (a first run); corrupt or mismatched
 * checkpoints are errors and leave v untouched. */
int mt_ckpt_load(const char *dir, struct mt_ckpt_view *v, struct mt_train_state *s,
                 bool *found, char *loaded_path, size_t loaded_path_len, struct mt_err *err);

#endif

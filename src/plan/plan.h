/* moetrain: planning a job before it runs (src/plan).
 *
 * plan.c: `moetrain plan` enumerates the layouts of a model on N GPUs of one platform
 * (TP, PP with VPP and uneven end stages, EP, ETP, micro-batch size), keeps those that
 * moetrain's own configuration rules and placement accept, ranks them by a modelled
 * step time (compute at an achievable fraction of the platform's peak, TP collectives,
 * the EP all-to-all, pipeline transfers and bubble, the data-parallel gradient
 * reduction, the optimizer; less the traffic the overlap keys run beside compute, as far
 * as that compute lasts), and checks the memory of the best ones, rank by rank, with
 * the trainer's own setup on the plan backend (mt_train_plan_memory): the figures
 * --check prints. Every assumption of the model is in one table at the top of plan.c.
 *
 * fake.c: `moetrain --fake-world N --fake-rank R` builds rank R of an N-rank job in
 * this process (its shards, stage buffers, schedule and optimizer; mt_parallel_plan's
 * communicators, which know their rank and size and refuse to talk) on a backend that allocates, counts what it allocated and compares
 * it, category by category, with the plan of that rank. */
#ifndef MT_PLAN_PLAN_H
#define MT_PLAN_PLAN_H

#include <stdio.h>

#include "config/config.h"
#include "kernels/kernels.h"
#include "util/error.h"

/* `moetrain plan ...` (argv[0] is "plan"): returns the exit status. */
int mt_plan_cli(int argc, char **argv);

/* Builds logical rank `rank` of layout l (a configuration resolved for l->world_size
 * processes) on backend k (NULL: the plan backend, which reserves address ranges and
 * backs none: nothing is touched), initialising its parameters on a backend that
 * allocates; compares its bytes by category with mt_train_plan_memory's for that rank
 * and the bytes the backend handed out with their sum. Prints both reports to out.
 * MT_OK when all are equal, else MT_ERUNTIME naming the category that differs. */
int mt_plan_fake_rank(const struct mt_config *cfg, const struct mt_layout *l, int rank,
                      const struct mt_kernels *k, FILE *out, struct mt_err *err);

#endif

/* moetrain from-megatron: a pretrain_gpt.py command line -> namelist overrides
 * (from_megatron.c), through the flag table of megatron.h. */
#ifndef MT_CONFIG_FROM_MEGATRON_H
#define MT_CONFIG_FROM_MEGATRON_H

#include <stdio.h>

#include "config/config.h"
#include "util/error.h"

/* A flag given (or a Megatron default) that did not become a key as it is. */
struct mt_megatron_note {
    char *given;          /* the flag and its values as given, or "(not given)" */
    const char *status;   /* "converted", "not implemented", "not applicable", "refused",
                             "unknown" */
    char *why;
};

struct mt_megatron_result {
    int nflags;               /* flags read */
    int noverrides;
    char **overrides;         /* "group%key=value" in namelist value syntax */
    int nnotes;
    struct mt_megatron_note *notes;
};

/* Reads Megatron-LM arguments (argv[0..argc-1]: "--flag", "--flag=V", "--flag V ...";
 * a flag's values are the words up to the next "--" word; a leading "*.py" word is
 * skipped) into overrides that moetrain's defaults become the equivalent namelist
 * with, and notes for every flag that is not mapped as it is. Megatron's defaults
 * for flags not given are applied where they differ from moetrain's, and its
 * argument rules (GQA only with --group-query-attention, the SwiGLU FFN width,
 * sequence parallelism only with TP > 1) followed. Counts of samples
 * (--train-samples, --lr-decay-samples, --lr-warmup-samples, and
 * --lr-warmup-fraction's share of the decay) become iterations when they are
 * whole global batches, else a "refused" note says why. Every override is checked
 * against the schema: one the schema rejects becomes a "not implemented" note
 * with the loader's message. Errors (MT_EINVAL): a value that cannot be
 * converted, such as a malformed --moe-layer-freq, and the mixtures of
 * iteration- and sample-based flags that Megatron rejects. */
int mt_megatron_convert(int argc, char *const argv[], struct mt_megatron_result *out,
                        struct mt_err *err);
void mt_megatron_result_free(struct mt_megatron_result *c);

/* The notes, one line each ("  --flag V: status: why"), with a count line. */
void mt_megatron_report(const struct mt_megatron_result *c, FILE *out);

/* The unit of world sizes a resolved-to-be configuration allows:
 * lcm(TP x CP, ETP x EP) x PP (ETP 0 means TP). */
int mt_megatron_world_unit(const struct mt_config_parallel *p);

#endif

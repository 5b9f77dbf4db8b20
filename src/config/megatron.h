/* Megatron-LM's command-line flags and the moetrain keys they become (megatron.c):
 * the one table behind "did you mean" for Megatron spellings and behind
 * `moetrain from-megatron`. */
#ifndef MT_CONFIG_MEGATRON_H
#define MT_CONFIG_MEGATRON_H

enum mt_megatron_kind {
    MT_MEG_VALUE,           /* --flag V    -> key = V */
    MT_MEG_SWITCH,          /* --flag      -> key = .true. (or the value in key: "k='v'") */
    MT_MEG_NOT_IMPLEMENTED, /* a feature moetrain does not have (yet) */
    MT_MEG_NOT_APPLICABLE,  /* what moetrain always does, or decides itself */
    MT_MEG_REFUSED          /* a setting moetrain will not run with */
};

/* How from-megatron turns a mapped flag's value into the key's value. */
enum mt_megatron_conv {
    MT_MEG_AS_IS,          /* the value itself (quoted for string keys) */
    MT_MEG_LAYER_PATTERN,  /* --moe-layer-freq N or "([0]*1+[1]*47)" -> per-layer 0/1 */
    MT_MEG_VPP_LAYERS,     /* layers per virtual stage -> num_layers / PP / value */
    MT_MEG_VOCAB_DIVISOR,  /* --make-vocab-size-divisible-by: pads vocab_size to D x TP */
    MT_MEG_WORDS,          /* nargs='*' (--data-path): every word one array element */
    MT_MEG_SAMPLES,        /* a sample count -> that many global batches, when whole */
    MT_MEG_WARMUP_FRACTION, /* --lr-warmup-fraction x the decay -> warmup iterations */
    MT_MEG_GRAPH_IMPL,     /* --cuda-graph-impl: transformer_engine -> local */
    MT_MEG_GRAPH_SCOPES    /* --cuda-graph-modules words; full_iteration -> impl */
};

struct mt_megatron_flag {
    const char *flag; /* "--moe-router-topk" */
    const char *key;  /* "moe%router_topk" (MT_MEG_SWITCH: may carry "=value"), or NULL */
    enum mt_megatron_kind kind;
    const char *why;  /* the kinds without a key: why, and what to do instead; a
                         converted value: how it is converted */
    enum mt_megatron_conv conv;
    /* What Megatron does when the flag is absent, where that differs from moetrain's
     * default: for a mapped flag the value from-megatron writes then; for a not
     * applicable one the value checked against `only`. NULL: nothing to do. */
    const char *megatron_default;
    /* MT_MEG_NOT_APPLICABLE holds only for this value of the flag (compared as numbers,
     * else without case), "" for a switch: only when it is given. Any other value, or
     * the switch absent, is not implemented. NULL: any value. */
    const char *only;
};

/* Every flag of the table; ends with a NULL flag. */
extern const struct mt_megatron_flag mt_megatron_flags[];

/* The entry for a flag spelled "--a-b" or "--a-b=V" (the value is ignored), or NULL. */
const struct mt_megatron_flag *mt_megatron_find(const char *flag);

/* The entry whose flag a namelist key spells, the flag's words joined by '_'
 * ("moe_aux_loss_coeff" for --moe-aux-loss-coeff); NULL when there is none. */
const struct mt_megatron_flag *mt_megatron_for_key(const char *key);

/* "mapped", "not implemented", "not applicable", "refused" */
const char *mt_megatron_kind_name(enum mt_megatron_kind kind);

#endif

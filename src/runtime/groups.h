/* moetrain: Megatron's rank generator and the parallel groups it defines.
 *
 * Logical rank r (0..world-1) is decomposed over the parallel dimensions in
 * `order` (fastest first, default tp-cp-ep-dp-pp). Attention groups come from a
 * generator over TP x CP x DP x PP (EP = 1 there); expert groups from one over
 * ETP x EP x EDP x PP on the same ranks (CP = 1 there): MoE parallel folding.
 * Pure functions: no processes, no communication. */
#ifndef MT_RUNTIME_GROUPS_H
#define MT_RUNTIME_GROUPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "config/config.h"
#include "util/error.h"

enum mt_group_kind {
    MT_GROUP_TP,     /* tensor parallel (attention/dense) */
    MT_GROUP_CP,     /* context parallel */
    MT_GROUP_DP,     /* data parallel (attention/dense parameters) */
    MT_GROUP_DP_CP,  /* data x context parallel (gradient reduction of dense params) */
    MT_GROUP_PP,     /* pipeline */
    MT_GROUP_TP_CP,  /* must lie in one NVLink domain */
    MT_GROUP_MP,     /* model parallel: tp x pp */
    MT_GROUP_EMBD,   /* first and last pipeline stage of each pp group (tied embeddings) */
    MT_GROUP_EP,     /* expert parallel */
    MT_GROUP_ETP,    /* tensor parallel inside experts */
    MT_GROUP_ETP_EP, /* must lie in one NVLink domain */
    MT_GROUP_EDP,    /* expert data parallel */
    MT_GROUP_COUNT
};

extern const char *const mt_group_names[MT_GROUP_COUNT];

/* The groups of one kind: ngroups lists of size ranks each, in
 * ranks[g * size + i]; every rank appears in exactly one group
 * (except MT_GROUP_EMBD with pp = 1, where each rank is its own group). */
struct mt_group_list {
    int ngroups, size;
    int *ranks;
};

struct mt_rank_layout {
    int world, tp, cp, pp, dp, ep, etp, edp;
    char order[32];
    struct mt_group_list groups[MT_GROUP_COUNT];
};

/* Builds every group for a resolved layout (config + mt_layout). */
int mt_groups_build(const struct mt_config_parallel *p, const struct mt_layout *l,
                    struct mt_rank_layout *out, struct mt_err *err);
void mt_groups_free(struct mt_rank_layout *rl);

/* The group of `kind` containing world rank r: its index, and r's position in it. */
void mt_groups_find(const struct mt_rank_layout *rl, enum mt_group_kind kind, int r,
                    int *group_index, int *position);

/* Where rank r sits in each kind's groups, computed from its coordinates alone (no
 * group lists: O(1) in the world size): what mt_groups_find says of the lists
 * mt_groups_build makes, group and position -1 where r is in no group of a kind
 * (MT_GROUP_EMBD, a middle pipeline stage), and the groups' size. */
struct mt_group_place {
    int group, position, size;
};
int mt_groups_locate(const struct mt_config_parallel *p, const struct mt_layout *l, int r,
                     struct mt_group_place out[MT_GROUP_COUNT], struct mt_err *err);

/* Megatron's generate_masked_orthogonal_rank_groups for sizes (fastest first)
 * and a mask of the dimensions that vary inside a group. out must hold world
 * ints; returns the group size. */
int mt_groups_masked_orthogonal(int world, int ndims, const int *sizes, const int *mask,
                                int *out);

/* Prints the groups of every kind (for --check --world-size): all of them when a kind
 * has at most max_shown groups or max_shown is 0, else the first max_shown - 1, "...",
 * and the last. Returns whether any kind was cut short. */
bool mt_groups_print(const struct mt_rank_layout *rl, int max_shown, FILE *out);

#endif

/* Private to src/model: the model struct, its views, and the pass functions. */
#ifndef MT_MODEL_INTERNAL_H
#define MT_MODEL_INTERNAL_H

#include "model/model.h"

#define MT_NO_TENSOR (-1)

enum mt_balance { MT_BALANCE_NONE, MT_BALANCE_AUX, MT_BALANCE_SEQ_AUX };

/* Tensor ids (index into m->tensors) of one layer's weights; MT_NO_TENSOR if absent. */
struct mt_layer_tensors {
    int ln1, wq, wk, wv, wo, q_norm, k_norm, ln2;
    int router, exp_gate, exp_up, exp_down; /* MoE layer */
    int sh_gate, sh_up, sh_down;            /* shared expert */
    int gate, up, down;                     /* dense MLP */
};

/* What one layer's forward saves for its backward (views into m->acts). */
struct mt_layer_acts {
    float *ln1, *ln1_rstd;      /* (N,H), (N) */
    float *q, *k, *v;           /* projections (N,Q), (N,KV), (N,KV) */
    float *q_rstd, *k_rstd;     /* QK-norm statistics (N*heads), (N*groups) */
    float *qr, *kr;             /* normed + rotated q, k */
    float *att;                 /* (B,heads,T,T) */
    float *y;                   /* attention output (N,Q) */
    float *res_mid;             /* residual after attention (N,H) */
    float *ln2, *ln2_rstd;      /* (N,H), (N) */
    /* dense MLP */
    float *gate, *up, *act;     /* (N,F) */
    /* MoE */
    float *logits;              /* router logits (N,E), forced ones when force-balancing */
    float *aux_counts;          /* (B,E) */
    float *z_lse;               /* (N) */
    int32_t *topk_idx;          /* (N,k) */
    float *topk_prob;           /* (N,k) */
    struct mt_dispatch_plan plan;
    float *xp;                  /* permuted input (R,H) */
    float *eg, *eu, *ea;        /* expert gate, up, SwiGLU (R,Fe) */
    float *ey;                  /* expert output (R,H) */
    float *sg, *su, *sa;        /* shared expert (N,Fs) */
    int rows;                   /* permuted rows of the last forward */
};

struct mt_model {
    struct mt_config cfg;
    const struct mt_kernels *k;
    int Bmax, T;
    int L, H, nh, ng, hd, Q, KV, F, V, E, Fe, Fs, topk;
    bool bf16, tied, qk_norm;
    float eps, theta;
    /* MoE */
    int nmoe;
    int *moe_of_layer;          /* (L): index among MoE layers, -1 for dense */
    struct mt_router_args router;
    enum mt_balance balance;
    float aux_coeff, z_coeff;
    double capacity_factor;     /* 0: dropless */
    bool pad_to_capacity, force_balance, expert_bias_on;
    enum mt_drop_policy drop_policy;
    float bias_rate;
    int rows_max;               /* permuted rows for Bmax */
    /* parameters */
    int ntensors;
    struct mt_param_info *tensors;
    char *names;
    float *std_of;              /* (ntensors) init std, 0 for norms (init 1) */
    int embed, final_norm, lm_head;
    struct mt_layer_tensors *lt;
    size_t nparams;
    float *params, *grads, *work; /* work == params in fp32 */
    /* activations */
    void *acts;
    size_t acts_bytes;
    float **res;                /* (L+1) residual stream (N,H): res[0] embeddings */
    struct mt_layer_acts *la;
    float *lnf, *lnf_rstd, *lm_logits, *ce_lse, *ce_loss;
    int32_t *inputs, *targets;
    /* scratch (backward temporaries and forward partial sums) */
    void *scratch;
    size_t scratch_bytes;
    float *tmp, *tmp2;          /* (N,H) */
    float *d_res, *d_ln;        /* (N,H) */
    float *dq, *dk, *dv, *dq2, *dk2, *dy; /* (N,Q) / (N,KV) */
    float *d_logits, *d_prob;   /* (N,E), (N,k) */
    float *d_rows, *d_rows2;    /* (R,H) */
    float *d_f1, *d_f2, *d_f3;  /* max((N,F), (N,Fs), (R,Fe)) */
    /* buffers */
    float *expert_bias;         /* (nmoe,E) */
    long long *expert_counts;   /* (nmoe,E) */
    int64_t *host_kept;         /* (E) */
    int32_t *host_tokens;       /* (2,Bmax,T) staging of inputs and targets */
};

/* model.c: per-expert capacity for N tokens (0: dropless) */
int mt_model_capacity(const struct mt_model *m, long long N);

/* model_pass.c */
int mt_model_run(struct mt_model *m, const int32_t *tokens, int B, bool backward,
                 float loss_scale, struct mt_model_stats *st, struct mt_err *err);

static inline float *mt_model_view(float *base, const struct mt_model *m, int tensor)
{
    return tensor == MT_NO_TENSOR ? NULL : base + m->tensors[tensor].offset;
}

#endif

/* Private to src/model: the model struct, its views, and the pass functions. */
#ifndef MT_MODEL_INTERNAL_H
#define MT_MODEL_INTERNAL_H

#include "model/model.h"

#define MT_NO_TENSOR (-1)

enum mt_balance { MT_BALANCE_NONE, MT_BALANCE_AUX, MT_BALANCE_SEQ_AUX };

/* How routed tokens reach the experts of other ranks (moe%token_dispatcher_type);
 * LOCAL when this rank holds every expert whole (EP = ETP = 1). */
enum mt_dispatch { MT_DISPATCH_LOCAL, MT_DISPATCH_ALLTOALL, MT_DISPATCH_ALLGATHER };

/* Activation recompute (&recompute): what a layer's forward does not keep for its
 * backward (m->drop[l]); the backward rebuilds it, with the same kernels in the same
 * order, in the rank's one recompute buffer (m->rc_mem), just before it is used.
 *   LN1, LN2    layernorm: the RMSNorm outputs and their TP gathers (input and
 *               statistics kept)
 *   CORE_ATTN   core_attn: the attention output and its logsumexp (q, k, v kept)
 *   MLP         mlp: a dense MLP's gathered input, gate, up and SwiGLU output
 *   MOE_ACT     moe_act: the routed experts' SwiGLU output (gate and up kept)
 *   SHARED      shared_experts: the shared expert's gathered input, gate, up, output
 *   MOE         moe: the whole MoE block (routing, dispatch, experts, shared expert;
 *               its input ln2 kept)
 *   LAYER       full: the whole layer; its recompute group (m->rc_first) keeps only
 *               the input of its first layer */
enum {
    MT_RC_LN1 = 1 << 0,
    MT_RC_CORE_ATTN = 1 << 1,
    MT_RC_LN2 = 1 << 2,
    MT_RC_MLP = 1 << 3,
    MT_RC_MOE_ACT = 1 << 4,
    MT_RC_SHARED = 1 << 5,
    MT_RC_MOE = 1 << 6,
    MT_RC_LAYER = 1 << 7,
};

/* Activation offloading (&recompute fine_grained_activation_offloading): the saved
 * tensors of a layer (m->off.mods[l]) that live in the rank's offload buffer instead of
 * the slot's activations. Forward copies them to the slot's pinned host block once the
 * layer is done; backward copies them back before the layer's backward (model_offload.c).
 *   ATTN_NORM   attn_norm: res[l], the layer's input (not a chunk's first layer: the
 *               stage's input or the embeddings stay)
 *   QKV         qkv_linear: ln1_full, the input of the q, k, v projections
 *   CORE_ATTN   core_attn: the rotated q and k, and v
 *   ATTN_PROJ   attn_proj: y, the input of o_proj (att_out itself in fp32 training)
 *   MLP_NORM    mlp_norm: res_mid, the input of the MLP's RMSNorm
 *   EXPERT_FC1  expert_fc1: xs, the routed experts' input rows (xp with the local
 *               dispatcher), which their gate and up projections read
 *   MOE_ACT     moe_act: eg and eu, the experts' gate and up, which their SwiGLU reads
 * The expert tensors take the rows the buffers are sized for (x_rows_max), and that
 * bound is what is copied: a layer whose rows overflow it keeps them on the device in
 * its overflow block (mt_model_expert_rows), and the copy moves unused rows.
 * A tensor that recompute rebuilds (m->drop) is not saved, so not offloaded. */
enum {
    MT_OFF_ATTN_NORM = 1 << 0,
    MT_OFF_QKV = 1 << 1,
    MT_OFF_CORE_ATTN = 1 << 2,
    MT_OFF_ATTN_PROJ = 1 << 3,
    MT_OFF_MLP_NORM = 1 << 4,
    MT_OFF_EXPERT_FC1 = 1 << 5,
    MT_OFF_MOE_ACT = 1 << 6,
};

/* The offload buffer and its streams' state. Layer l's offloaded tensors are one range
 * of bytes[l] at the start of mem[l % 2] (a half): a layer's tensors go to the host while
 * the next layer computes in the other half (forward), and come back while the layer
 * above computes its backward (backward). */
struct mt_offload {
    unsigned *mods;             /* (L) MT_OFF_* of each layer of the layout's chunks */
    size_t *bytes;              /* (L) its offloaded bytes (0: nothing) */
    size_t *host_at;            /* (L) where they go in the slot's host block */
    size_t half;                /* the largest layer's bytes: the size of each mem */
    void *mem[2];               /* device: layer l's tensors in mem[l % 2] (two
                                   allocations: a device orders streams per allocation) */
    void *host;                 /* pinned: one block per slot, chunk-major */
    size_t *slot_at;            /* (chunks x slots) each slot's block in host */
    size_t host_bytes;
    size_t mb_bytes;            /* bytes a micro-batch moves each way (all chunks) */
    void *ev_compute;           /* the compute stream's point the copy stream waits for */
    void *ev_d2h[2], *ev_h2d[2]; /* the last copy out of / into each half */
    bool d2h_pending[2];        /* a copy out of the half the compute stream has not
                                   waited for: the half is not to be written */
    int slot;                   /* the selected slot's block */
};

/* Tensor ids (index into m->tensors) of one layer's weights; MT_NO_TENSOR if absent. */
struct mt_layer_tensors {
    int ln1, wq, wk, wv, wo, q_norm, k_norm, ln2;
    int router, exp_gate, exp_up, exp_down; /* MoE layer */
    int sh_gate, sh_up, sh_down;            /* shared expert */
    int gate, up, down;                     /* dense MLP */
};

/* What one layer's forward saves for its backward (views into m->acts). Token counts:
 * N = B*T (the micro-batch), Nl = N/tp (this rank's sequence-parallel part); widths
 * with _l are this rank's shards (heads, F/tp, ...). */
/* Stored activations (void *) are in the model's activation dtype (adt: bf16 in bf16
 * training); statistics, router scores and routing weights (float *) are fp32. */
/* The dense quantised linears of a layer, in model_lowp.c's numbering of its scale
 * state: the copies of their inputs saved for backward (struct mt_layer_acts qx). */
enum mt_qlinear {
    MT_QL_Q, MT_QL_K, MT_QL_V, MT_QL_O, MT_QL_GATE, MT_QL_UP, MT_QL_DOWN,
    MT_QL_SH_GATE, MT_QL_SH_UP, MT_QL_SH_DOWN, MT_QL_COUNT
};

struct mt_layer_acts {
    void *ln1;                  /* (Nl,H) */
    float *ln1_rstd;            /* (Nl) */
    void *ln1_full;             /* (N,H): ln1 gathered over TP (== ln1 when tp = 1) */
    void *q, *k, *v;            /* projections (N,Q_l), (N,KV_l), (N,KV_l) */
    float *q_rstd, *k_rstd;     /* QK-norm statistics (N*heads_l), (N*groups_l) */
    void *qr, *kr;              /* normed + rotated q, k */
    float *att_lse;             /* (B,heads_l,T) logsumexp of each query row's scores */
    float *att_out;             /* (N,Q_l) attention output as attention_fwd wrote it (fp32) */
    void *y;                    /* att_out in adt for wo (== att_out in fp32) */
    void *res_mid;              /* residual after attention (Nl,H) */
    void *ln2;                  /* (Nl,H) */
    float *ln2_rstd;            /* (Nl) */
    void *ln2_full;             /* (N,H) gathered for the dense MLP / shared expert */
    /* dense MLP */
    void *gate, *up, *act;      /* (N,F_l) */
    /* MoE: routing of this rank's Nl tokens */
    float *logits;              /* router logits (Nl,E), forced ones when force-balancing */
    float *aux_counts;          /* (seqs,E), summed over the TP group */
    float *z_lse;               /* (Nl) */
    int32_t *topk_idx;          /* (Nl,k) */
    float *topk_prob;           /* (Nl,k) */
    struct mt_dispatch_plan plan; /* of the Nl tokens over all E experts */
    void *xp;                   /* permuted input (R,H) */
    void *ey;                   /* expert output in plan order (R,H) */
    /* expert side: rows this rank's experts compute, grouped by local expert */
    int32_t *x_offsets;         /* (E_l+1) */
    int32_t *hx_offsets;        /* (E_l+1) host copy of x_offsets, kept where the host
                                   computes or reads them (route, a2a_prepare, ag_prepare);
                                   the FP8/FP4 experts' GEMMs split their rows by it */
    void *xs;                   /* (Rx,H) expert input (== xp for LOCAL) */
    void *eg, *eu, *ea;         /* expert gate, up, SwiGLU (Rx,Fe_l) */
    void *eys;                  /* (Rx,H) expert output rows (ALLGATHER), in eys_dt */
    int32_t *sort_map, *unsort_map; /* (Rx) ALLTOALL: received order <-> expert order */
    long long *recv_counts;     /* ALLTOALL host: [etp][ep][E_l] rows from each source */
    bool maps_of_counts;        /* ALLTOALL: sort_map, unsort_map and x_offsets are those
                                   of recv_counts (static shapes upload them once) */
    int32_t *g_slot_row;        /* ALLGATHER: (G*Nl,k) slot -> expert row of the gathered tokens */
    float *g_prob;              /* ALLGATHER: (G*Nl,k) gathered routing weights */
    void *sg, *su, *sa;         /* shared expert (N,Fs_l) */
    /* FP8/FP4 (mt_lowp_saves): each quantised linear's input quantised in forward for
     * the wgrad GEMM of backward (mt_lowp_copy_bytes each; q, k and v share one, gate and
     * up one, where mt_lowp_shares_copies) */
    void *qx[MT_QL_COUNT];
    int rows;                   /* R: rows of the plan of the last forward */
    int x_rows;                 /* Rx */
    long long *h_offsets;       /* host copy of plan.offsets (E+1) */
    /* a step that brought more rows than planned (x_rows > m->x_rows_max): the expert
     * side lives in over (from the allocator) until the layer's backward is done;
     * home keeps the views into the slot's arena */
    void *over;
    size_t over_bytes;
    struct mt_expert_views {
        void *xs, *eg, *eu, *ea, *eys;
        int32_t *sort_map, *unsort_map;
    } home;
};

/* One in-flight micro-batch's activations (pipeline schedules): mt_model_set_stage
 * gives each slot its own views and per-layer host state; selecting a slot points
 * m->res, m->la and the head views at it. */
struct mt_act_slot {
    void *mem;
    void **res;
    struct mt_layer_acts *la;
    void *lnf, *lnf_full;
    float *lnf_rstd, *lm_logits, *ce_lse, *ce_tl;
    int32_t *inputs, *targets, *inputs_v;
    int B;                      /* the micro-batch it holds */
    long long valid;            /* its valid targets (last stage) */
    float loss_scale;
};

/* Overflow blocks kept for reuse under manual GC, at most. */
#define MT_MODEL_DEFERRED 8

struct mt_lowp;

/* CUDA graph scopes (&cuda_graph, model_graph.c): the modules captured, whether the
 * trainer is past warm-up, and the scope open now. */
enum mt_graph_module {
    MT_GM_ATTN,
    MT_GM_MLP,
    MT_GM_MOE,
    MT_GM_MOE_ROUTER,
    MT_GM_MOE_PREPROCESS,
    MT_GM_COUNT
};
struct mt_model_graphs {
    unsigned modules;           /* 1 << enum mt_graph_module, 0: no graphs */
    bool capture;               /* past &cuda_graph warmup_steps: capture what is not held */
    bool open;                  /* a scope is open (begun, not replayed) */
    bool full;                  /* impl = 'full_iteration': the trainer's one scope */
    bool iteration_open;        /* that scope is open (begun, not replayed) */
};
/* What one counted forward (a micro-batch, an evaluation batch; not a rebuild for
 * backward) adds up in backend memory. */
struct mt_fwd_record {
    double lm_sum;              /* cross-entropy over the valid targets (loss_sum) */
    double aux, z;              /* balancing and z losses, each op's float widened */
    int64_t dropped;            /* assignments dropped by capacity */
};
/* The backend-memory block of the step's scalars, read in one copy: the gradient norm's
 * sum of squares (the optimizer's), the (nmoe,E) expert loads of the training forwards,
 * then nrec_max records. */
struct mt_step_acc {
    double sumsq;
    int64_t load[];
};
/* Zeroes the records of the forwards (and the norm's sum) once read or abandoned; the
 * expert loads stay. */
void mt_model_reset_records(struct mt_model *m);
/* The current pass's record in backend memory. */
struct mt_fwd_record *mt_model_record(const struct mt_model *m);

struct mt_model {
    struct mt_config cfg;
    const struct mt_kernels *k;
    int Bmax, T;
    /* the whole model */
    int L, H, nh, ng, hd, Q, KV, F, V, E, Fe, Fs, topk;
    bool bf16, tied, qk_norm;
    enum mt_dtype adt;          /* stored activations: MT_BF16 in bf16 training */
    enum mt_dtype eys_dt;       /* eys: adt, or fp32 where it holds ETP partial sums */
    bool round_in_place;        /* bf16 training on fp32-stored activations (reference) */
    enum mt_dtype wdt;          /* the working copy of the parameters (work) */
    float eps, theta;
    /* this rank's part of it */
    struct mt_shard_coords sc;
    struct mt_comm *tp_comm, *ep_comm, *etp_comm, *xg_comm; /* xg: the ETP x EP group */
    int nh_l, ng_l, Q_l, KV_l, F_l, Fs_l, Fe_l, E_l, V_l;
    int v0, e0;                 /* first vocabulary id and first expert of this rank */
    int xg;                     /* size of the ETP x EP group */
    enum mt_dispatch dispatch;
    /* MoE */
    int nmoe;
    int *moe_of_layer;          /* (L): index among MoE layers, -1 for dense */
    int *stage_of_layer;        /* (L): the pipeline stage holding each layer */
    struct mt_router_args router;
    enum mt_balance balance;
    float aux_coeff, z_coeff;
    double capacity_factor;     /* 0: dropless */
    bool pad_to_capacity, force_balance, expert_bias_on;
    enum mt_drop_policy drop_policy;
    float bias_rate;
    int pad_align;              /* moe_router_padding_for_fp8: each local expert's rows a
                                 * multiple of it, zero rows after its own; 0: off */
    int rows_max;               /* plan rows for Bmax (R) */
    int x_rows_max;             /* expert-side rows planned for Bmax (Rx): the buffers */
    long long x_rows_worst;     /* what routing can bring at most (every source to us) */
    double expected_x_rows;     /* what a balanced routing brings */
    /* parameters */
    int ntensors;
    struct mt_param_info *tensors;
    char *names;
    float *std_of;              /* (ntensors) init std, 0 for norms (init 1) */
    int embed, final_norm, lm_head;
    /* pipeline stage (mt_model_set_stage): layers [l0, l1); embedding on the first
     * stage, final norm, LM head and loss on the last; nslots activation slots */
    int l0, l1;
    bool first, last, staged;
    int pp, pp_rank, vpp;       /* the pipeline layout (1, 0, 1 without) */
    int nchunks;                /* model chunks of the stage (virtual pipeline) */
    int *chunk_l0, *chunk_l1;
    bool first_stage, last_stage;
    int nslots;                 /* per chunk: slots[chunk * nslots + slot] */
    struct mt_act_slot *slots;
    size_t *slot_bytes;         /* per chunk */
    struct mt_layer_tensors *lt;
    /* activation recompute, per layer of the current layout's chunks: MT_RC_* flags,
     * and under full recompute the first layer of the layer's group (-1: kept whole) */
    unsigned *drop;
    int *rc_first;
    struct mt_offload off;      /* activation offloading (model_offload.c) */
    struct mt_model_hooks hooks; /* told as the passes go (mt_model_set_hooks) */
    struct mt_model_graphs graphs; /* &cuda_graph scopes (model_graph.c) */
    void *rc_mem;               /* the recompute buffer: one per rank, shared by every
                                   layer, slot and chunk (backward rebuilds one group at
                                   a time) */
    size_t rc_bytes;
    size_t nparams, nparams_global;
    float *params, *grads;
    void *work;                 /* working copy in wdt; == params in fp32 */
    /* activations */
    void *acts;
    size_t acts_bytes;
    void **res;                 /* (L+1) residual stream (Nl,H): res[0] embeddings */
    struct mt_layer_acts *la;
    void *lnf, *lnf_full;       /* (Nl,H), (N,H) */
    float *lnf_rstd, *lm_logits, *ce_lse, *ce_tl; /* (Nl), (N,V_l) fp32, (N), (N) */
    int32_t *inputs, *targets;  /* (N) */
    int32_t *inputs_v;          /* (N) inputs - v0 in this vocabulary shard, else -1 */
    /* scratch (backward temporaries, forward partial sums, communication staging) */
    void *scratch;
    size_t scratch_bytes;
    float *tmp, *tmp2;          /* (Nl,H) */
    void *tmpb, *tmp2b;         /* (Nl,H) in adt (== tmp, tmp2 when adt is fp32) */
    float *full, *full2;        /* (N,H): row-parallel partial sums, gathered gradients */
    float *d_res, *d_ln;        /* (Nl,H) */
    float *dq, *dk, *dv, *dq2, *dk2, *dy; /* (N,Q_l) / (N,KV_l) */
    float *d_logits, *d_prob;   /* (Nl,E), (Nl,k) */
    float *d_rows, *d_rows2;    /* (R,H) */
    float *d_x, *d_x2;          /* (Rx,H) */
    float *stage, *stage2;      /* (max(Rx, G*Nl),H) */
    float *g_dprob;             /* (G*Nl,k) */
    int64_t *x_kept;            /* (E_l) the expert-side plan's counts (ALLGATHER) */
    int64_t *ag_counts;         /* (E_l) ALLGATHER dropless: the rows of each of this rank's
                                   experts (expert_select) */
    float *d_f1, *d_f2, *d_f3;  /* max((N,F_l), (N,Fs_l), (Rx,Fe_l)) */
    float *lse_all;             /* (tp,N) */
    int32_t *idx_full;          /* (max(N, G*Nl),k) gathered routing */
    float *prob_full;           /* (max(N, G*Nl),k) */
    struct mt_dispatch_plan full_plan; /* over the N tokens of a micro-batch (capacity with TP) */
    int32_t *route_idx;         /* (Nl,k) topk_idx with dropped slots -1 */
    /* buffers */
    float *expert_bias;         /* (nmoe,E) host master */
    float *expert_bias_dev;     /* (nmoe,E) its backend-memory copy, which the routers read */
    int64_t *expert_load_sum;   /* (nmoe,E) over several processes: the loads summed over
                                 * the ranks for the bias update (the step's own stay for
                                 * the host's read, after it in a captured iteration) */
    struct mt_comm *world;      /* every rank (NULL: one process): the loads of the bias update */
    long long *expert_counts;   /* (nmoe,E) */
    /* The scalars of the counted forwards since the last read (struct mt_step_acc), in
     * backend memory: the ops add to them without the host waiting; read in one copy
     * (mt_model_read_stats) into its host copy. nrec_max records (1 until
     * mt_model_defer_stats), nrec of them taken; rec_valid: each record's valid targets */
    struct mt_step_acc *acc, *acc_host;
    int nrec_max, nrec, rec_cur;
    bool defer;                 /* mt_model_defer_stats: the passes leave them for the caller */
    long long *rec_valid;       /* (nrec_max) */
    int *rec_B;                 /* (nrec_max) each record's micro-batch size */
    int nahead;                 /* records mt_model_stage_tokens filled that no forward took yet */
    /* (nrec_max,3,Bmax,T) alloc_host staging of inputs, targets, shard inputs, one slot
     * per record (a slot is written again only after the read, by which the copy that
     * took it has run); host_tokens: the current pass's slot */
    int32_t *host_tokens_all, *host_tokens;
    /* uploads on the copy stream (mt_model_upload): compute done with the destinations,
     * the copies done */
    void *ev_up[2];
    /* ALLTOALL: alloc_host staging of the sort maps and offsets (2 Rx + E_l + 1) */
    int32_t *a2a_stage;
    /* routing bookkeeping on the host (one allocation, host_scratch) */
    void *host_scratch;
    int32_t *h_idx, *h_idx2;    /* (max(N, G*Nl),k) */
    int32_t *h_sort, *h_unsort; /* (Rx) */
    int32_t *h_offs;            /* (E+1) */
    long long *h_send, *h_recv, *h_start; /* (E), (ep*E_l), (etp*ep*E_l) */
    size_t *h_cnt;              /* 8 x max(ep, etp): exchange counts and displacements */
    /* &moe moe_shared_expert_overlap: the EP all-to-all in flight while the shared expert
     * runs, and how many all-to-alls were left in flight by their start then */
    bool shared_overlap;
    struct mt_comm_req a2a_req;
    long long a2a_overlapped;
    float *sh_dup;              /* (N,Fs_l) with shared_overlap: the shared expert's up
                                   output gradient, kept across the routed experts' backward */
    float *h_force;             /* (Bmax*T,E) forced router logits (force_balance), or NULL */
    /* expert-side scratch of a layer whose rows overflow the plan (its forward or
     * backward only), and the views it replaced */
    void *scratch_over;
    size_t scratch_over_bytes;
    /* with host%manual_gc, overflow blocks given back wait here for reuse by a later
     * overflow until mt_model_release_deferred (a collection) frees them */
    struct mt_deferred_block {
        void *p;
        size_t bytes;
    } deferred[MT_MODEL_DEFERRED];
    int ndeferred;
    struct mt_expert_scratch {
        float *d_x, *d_x2, *stage, *stage2, *d_f1, *d_f2, *d_f3;
        int32_t *h_sort, *h_unsort;
    } scratch_home;
    int32_t *h_over;            /* host sort maps grown past Rx (2 x h_over_rows) */
    long long h_over_rows;
    /* the FP8/FP4 recipes (model_lowp.c); NULL when &precision sets neither */
    struct mt_lowp *lp;
    size_t lp_scratch;          /* its quantised-operand buffers */
    /* the copies saved for backward of one micro-batch (all chunks), kept in the
     * activations or offloaded, and the high-precision inputs they replace there */
    size_t lp_copies, lp_replaced;
    float *buffers;             /* host: what mt_model_buffers returns (expert biases and
                                   the FP8/FP4 state), when both exist */
};

/* model.c: makes chunk the current layer range and points the activation views at
 * its slot */
void mt_model_select_slot(struct mt_model *m, int chunk, int slot);

struct mt_pass;
/* model.c: makes the expert side of layer acts a (views and scratch, host maps) hold
 * rows rows: beyond the planned x_rows_max, from the allocator until
 * mt_model_expert_release (forward: the activations too, which backward then uses);
 * fails naming layer l, the rank and the setting */
int mt_model_expert_rows(const struct mt_pass *p, int l, struct mt_layer_acts *a,
                         long long rows, bool forward);
/* Gives back the overflow scratch (keep_acts: the activations stay for backward). */
void mt_model_expert_release(struct mt_model *m, struct mt_layer_acts *a, bool keep_acts);

/* model.c: per-expert capacity for N tokens (0: dropless) */
int mt_model_capacity(const struct mt_model *m, long long N);

/* model_offload.c: the MT_OFF_* of the config's offload_modules */
unsigned mt_offload_modules(const struct mt_config *cfg);
/* Allocates the pinned host blocks (nblocks slots of chunk_bytes[chunk]) and the events,
 * once the layout set off.mods, bytes and half; off.mem is allocated with the
 * activations. */
int mt_offload_setup(struct mt_model *m, int nchunks, int nslots, const size_t *chunk_bytes,
                     struct mt_err *err);
void mt_offload_free(struct mt_model *m);

struct mt_pass;
/* Forward: before the first write into layer l's offloaded range (its input res[l], or
 * its RMSNorm), the compute stream waits for the copy out of that half, if pending. */
void mt_offload_acquire(const struct mt_pass *p, int l);
/* Forward of a training pass: layer l is done; its offloaded range goes to the slot's
 * host block on the copy stream, after the compute stream's work so far. */
void mt_offload_store(const struct mt_pass *p, int l);
/* Backward: the copy of layer l's range back from the slot's host block, queued on the
 * copy stream after the compute stream's work so far (prefetch). */
void mt_offload_load(const struct mt_pass *p, int l);
/* Backward: the compute stream waits for layer l's copy back. */
void mt_offload_wait(const struct mt_pass *p, int l);

/* model_pass.c */
int mt_model_run(struct mt_model *m, const int32_t *tokens, int B, bool backward,
                 float loss_scale, struct mt_model_stats *st, struct mt_err *err);

static inline float *mt_model_view(float *base, const struct mt_model *m, int tensor)
{
    return tensor == MT_NO_TENSOR ? NULL : base + m->tensors[tensor].offset;
}

/* One forward (and backward) call. */
struct mt_pass {
    struct mt_model *m;
    const struct mt_kernel_ops *o;
    void *ctx;
    int B, N, Nl;            /* sequences; tokens of the micro-batch; this rank's tokens */
    long long tok0;          /* index of this rank's first token in the micro-batch */
    bool train;
    bool recompute;          /* rebuilding for backward: no side effects (expert counts,
                                loss and drop sums, the routing dump) */
    float scale;             /* loss_scale */
    struct mt_model_stats *st;
    struct mt_err *err;
};

/* CUDA graph scopes (model_graph.c). A scope brackets device work that makes no
 * collective call, no host read and no allocation outside the caching allocator:
 *     bool run;
 *     MT_CHECK(mt_graph_begin(p, MT_GM_ATTN, l, segment, false, sig, &run));
 *     if (run) { ...ops... }
 *     MT_CHECK(mt_graph_end(p));
 * run is false when the scope's graph was replayed (its ops were launched as one graph).
 * The key is (module, layer, micro-batch slot, pass: forward, evaluation, recompute,
 * backward, segment); sig is a hash of the pointers, shapes and host values the ops
 * take (mt_graph_sig), so that a change is captured again, never replayed wrongly. */
int mt_graph_begin(const struct mt_pass *p, enum mt_graph_module mod, int layer, int segment,
                   bool backward, uint64_t sig, bool *run);
int mt_graph_end(const struct mt_pass *p);
/* FNV-1a over n words, continuing h (start with MT_GRAPH_SIG0). */
#define MT_GRAPH_SIG0 14695981039346656037ull
uint64_t mt_graph_sig(uint64_t h, const uintptr_t *words, size_t n);
#define MT_GRAPH_SIG(...)                                                                   \
    mt_graph_sig(MT_GRAPH_SIG0, (const uintptr_t[]){__VA_ARGS__},                          \
                 sizeof((const uintptr_t[]){__VA_ARGS__}) / sizeof(uintptr_t))
/* The scopes from cfg (&cuda_graph); MT_EUNSUPPORTED when the backend has no graphs. */
int mt_graph_setup(struct mt_model *m, struct mt_err *err);

/* A stored activation (rows,cols) in the model's activation dtype. */
static inline struct mt_tensor mt_pass_act(const struct mt_pass *p, const void *x, int64_t rows,
                                           int64_t cols)
{
    return mt_tview(x, p->m->adt, rows, cols);
}

/* model.c: the working copy of parameter tensor (its local shape as rows x last dim) */
struct mt_tensor mt_model_weight(const struct mt_model *m, int tensor);

/* model_pass.c: pieces the MoE layer shares with the dense layers */
void mt_pass_round(const struct mt_pass *p, void *x, size_t n);
/* The communication dtype of stored activations. */
enum mt_dt mt_pass_act_dt(const struct mt_pass *p);
/* A row-parallel linear's output: where the linear writes (fp32 partial sums in full
 * with TP, else out in adt), and the reduction over TP into out (adt) through fp32 tmp. */
struct mt_tensor mt_pass_rowpar_dst(const struct mt_pass *p, float *full, void *out);
int mt_pass_rowpar_finish(const struct mt_pass *p, float *full, float *tmp, void *out);
void mt_pass_linear_fwd(const struct mt_pass *p, struct mt_tensor out, struct mt_tensor in,
                        struct mt_tensor w, int N, int dout, int din);
void mt_pass_linear_bwd(const struct mt_pass *p, float *din, float beta, float *dw,
                        const float *dout, struct mt_tensor in, struct mt_tensor w, int N,
                        int d_out, int d_in);
/* The SwiGLU part of mt_pass_mlp_fwd: gate, up and act (N,F) from x (N,H); wg, wu, wd
 * are parameter tensor ids (their linears quantised as mt_pass_qlinear_fwd says); wd the
 * linear whose forward reads act next, or MT_NO_TENSOR (mt_pass_swiglu_qfwd). */
int mt_pass_mlp_act_fwd(const struct mt_pass *p, const void *x, int wg, int wu, int wd, void *gate,
                        void *up, void *act, int N, int F);
int mt_pass_mlp_fwd(const struct mt_pass *p, struct mt_tensor out, const void *x, int wg, int wu,
                    int wd, void *gate, void *up, void *act, int N, int F);
/* Weight gradients into the tensors' gradients (+=). */
int mt_pass_mlp_bwd(const struct mt_pass *p, float *dx, float beta, const float *dout,
                    const void *x, const void *gate, const void *up, const void *act, int N,
                    int F, int wg, int wu, int wd);
/* mt_pass_mlp_bwd in two parts, the same ops in the same order: the down projection,
 * SwiGLU and gate (dx = beta dx + ...; up's output gradient into dup (N,F)), then up
 * (dx += ...). Between them only dup and dx must stay; d_f1, d_f2 are free again. */
int mt_pass_mlp_bwd_gate(const struct mt_pass *p, float *dx, float beta, float *dup,
                         const float *dout, const void *x, const void *gate, const void *up,
                         const void *act, int N, int F, int wg, int wd);
int mt_pass_mlp_bwd_up(const struct mt_pass *p, float *dx, const float *dup, const void *x,
                       int N, int F, int wu);
/* Sequence parallelism over the TP group; no-ops with tp = 1, where the callers pass
 * the same buffer for both sides. full (N,C) = the (Nl,C) parts in rank order. */
int mt_pass_sp_gather(const struct mt_pass *p, void *full, const void *local, int C,
                      enum mt_dt dt);
/* local (Nl,C) = this rank's rows of the sum over the TP group of full (N,C). */
int mt_pass_sp_reduce_scatter(const struct mt_pass *p, float *local, const float *full, int C);

/* model_moe.c: the MoE block on this rank's Nl tokens; its output (Nl,H) into m->tmpb
 * (adt); the backward reads the output gradient from m->d_res and writes the input
 * gradient to m->d_ln. */
int mt_moe_fwd(const struct mt_pass *p, int l);
/* Whether a micro-batch of N tokens has routing-dependent expert offsets (dropless, or
 * capacity without padding): route reads them, once per MoE layer. */
bool mt_moe_dynamic(const struct mt_model *m, int N);
int mt_moe_bwd(const struct mt_pass *p, int l);
/* Rebuilds the routed experts' SwiGLU output of layer l (moe_act recompute). */
void mt_moe_act_rebuild(const struct mt_pass *p, int l);

/* model_lowp.c: the FP8/FP4 recipes' GEMMs (doc/fp8.md). create: nothing unless
 * &precision sets fp8_format or fp4_format; *scratch_bytes gets what it allocated for
 * the quantised operands. */
int mt_lowp_create(struct mt_model *m, const struct mt_parallel *par, size_t *scratch_bytes,
                   struct mt_err *err);
void mt_lowp_destroy(struct mt_model *m);
/* Bytes of the recipes' state (host and backend): the amax a shard's current scaling
 * reduces, the experts' host offsets, delayed scaling's scales, amaxes and histories;
 * *device the backend's part. */
size_t mt_lowp_state_bytes(const struct mt_model *m, size_t *device);
/* The checkpointed state (floats), its save into and load from mt_model_buffers. */
size_t mt_lowp_nbuffers(const struct mt_model *m);
void mt_lowp_save(const struct mt_model *m, float *out);
void mt_lowp_load(struct mt_model *m, const float *in);
/* At the start of each backward pass (loss_scale: its scale of the loss): the seed of
 * its random bits (stochastic rounding of gradients, Hadamard signs), advanced in
 * backend memory where the quantisers read it (the op random_key) and on the host,
 * whose copy mt_lowp_backward_seed returns until the next (eagerly; a replayed graph
 * advances the backend's only), and delayed scaling's gradient scales for that loss
 * scale. */
void mt_lowp_backward_begin(struct mt_model *m, float loss_scale);
/* Whether the iteration can be captured now (delayed scaling: a history entered). */
int mt_lowp_graph_ready(const struct mt_model *m, struct mt_err *err);
uint64_t mt_lowp_backward_seed(const struct mt_model *m);
/* FP8 copies saved for backward (doc/fp8.md): whether layer l's quantised linears save
 * their inputs quantised for the wgrad GEMM (then their high-precision inputs read by
 * nothing else in backward are not kept), the bytes of the copy of a (rows, cols) input,
 * and whether the linears reading one input share its copy. */
bool mt_lowp_saves(const struct mt_model *m, int l);
size_t mt_lowp_copy_bytes(const struct mt_model *m, int64_t rows, int64_t cols);
bool mt_lowp_shares_copies(const struct mt_model *m);
/* The MAX all-reduce over comm of n amaxes (backend memory of k, queued on ctx) that
 * shards and data-parallel replicas agree on, a NaN made +Inf first (struct
 * mt_quant_ops amax_nan_to_inf): a NaN on one rank reaches every rank as a non-finite
 * amax, which scales as one process's NaN does (doc/fp8.md, "Parallel layouts"). */
int mt_lowp_amax_all_reduce(const struct mt_kernels *k, void *ctx, struct mt_comm *comm, float *amax,
                            size_t n, struct mt_err *err);
/* Linear layers of parameter tensor `tensor`: quantised when the recipe covers it, else
 * mt_pass_linear_fwd / _bwd (gradient into the tensor's gradient). Errors: the amax
 * reduction of a shard's current scaling (p->err). */
/* The ops rmsnorm_fwd and swiglu_fwd of struct mt_kernels producing the input of
 * tensor's linear (MT_NO_TENSOR: no linear's forward reads it next), which, where the
 * backend can, also emit in the same pass the quantisation that linear's forward GEMM
 * (and those of the linears after it on the same input: k and v, up) then reads
 * (doc/fp8.md, "Quantisation fused with its producer"). */
void mt_pass_rmsnorm_qfwd(const struct mt_pass *p, int tensor, struct mt_tensor out, float *rstd,
                          struct mt_tensor x, struct mt_tensor w, int N, int C, float eps);
void mt_pass_swiglu_qfwd(const struct mt_pass *p, int tensor, struct mt_tensor out, struct mt_tensor gate,
                         struct mt_tensor up, int N, int F);
int mt_pass_qlinear_fwd(const struct mt_pass *p, int tensor, struct mt_tensor out,
                        struct mt_tensor in, int N, int dout, int din);
int mt_pass_qlinear_bwd(const struct mt_pass *p, int tensor, float *din, float beta,
                        const float *dout, struct mt_tensor in, int N, int d_out, int d_in);
/* Routed experts: whether tensor's grouped GEMMs are quantised, and those GEMMs (ho
 * the host copy of the expert-side row offsets, E_l + 1 of them: struct mt_layer_acts
 * hx_offsets). */
bool mt_lowp_grouped(const struct mt_pass *p, int tensor);
int mt_pass_qgrouped_fwd(const struct mt_pass *p, int tensor, const int32_t *ho,
                         struct mt_tensor x, int rows, int dout, int din, struct mt_tensor out);
int mt_pass_qgrouped_bwd(const struct mt_pass *p, int tensor, const int32_t *ho,
                         const float *dy, struct mt_tensor x, int rows, int dout, int din,
                         float *dx, float beta);

#endif

/* The FP8/FP4 recipes in the model (&precision fp8_format / fp4_format, doc/fp8.md):
 * which GEMMs run on quantised operands, how each operand is quantised for each of its
 * three uses (forward, dgrad, wgrad), and delayed scaling's amax histories, which are
 * model state (checkpointed with the expert biases through mt_model_buffers).
 *
 * A quantised linear runs each GEMM as the backend's quantised GEMM (struct
 * mt_quant_ops gemm: both operands quantised under their specs, then multiplied with
 * fp32 accumulation; the CPU backend multiplies the dequantised values, the CUDA
 * backend calls cuBLASLt's FP8/FP4 matmul on the codes and scales):
 *   forward  out = q(x) q(W)^T                 x, W: blocks along din (rows of each)
 *   dgrad    dx  = beta dx + q(dy) q'(W)       dy along dout, W quantised again along
 *                                              its columns (dout, its reduction here)
 *   wgrad    dW += q'(dy)^T q'(x)              both along the tokens (their columns);
 *                                              MT_RECIPE_NVFP4: Hadamard-transformed first
 * Where the backend saves quantised copies (struct mt_quant_ops save), a dense linear's
 * forward keeps x quantised for wgrad in the micro-batch's activations (q'(x); per-tensor
 * scaling: q(x), which the forward GEMM reads too), and wgrad reads that copy. NVFP4
 * keeps none: its q'(x) is Hadamard-transformed with signs of the backward pass.
 * Routed experts do the same per expert (each expert its own tensors, scales and
 * GEMM: the expert row counts are on the host), all experts' GEMMs of a use in one
 * call of the backend's grouped GEMM where it has one (one launch on CUDA). */
#include "model/model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/parallel.h"
#include "util/rng.h"

/* The quantised linears of a layer, for the numbering of scale state (the same on
 * every rank, whatever layers it holds). Routed experts: EXP_* + 3 e per expert e. */
enum { K_WQ = MT_QL_Q, K_WK, K_WV, K_WO, K_GATE, K_UP, K_DOWN, K_SH_GATE, K_SH_UP, K_SH_DOWN, K_EXP };
_Static_assert((int)K_EXP == (int)MT_QL_COUNT, "the dense linears are enum mt_qlinear's, in its order");
/* The three operands of a linear with scale state. */
enum { R_X = MT_Q_X, R_W = MT_Q_W, R_G = MT_Q_G, R_COUNT };

/* The largest product (multiply-adds) of one expert for which the routed experts'
 * quantised GEMMs of a use run as the backend's one grouped launch: 2^22, about 2
 * microseconds of the grouped kernel's CUDA-core arithmetic an expert, under the launch
 * and host time of the per-expert matmul it replaces (doc/fp8.md, "The grouped expert
 * GEMM"); above it, a tensor-core matmul per expert. */
#define MT_QGROUPED_MAX_MACS 4194304.0

/* The quantised GEMMs of one use for a set of experts (qgemm_experts). */
struct expert_gemms {
    int n;
    int *se;
    struct mt_tensor *a, *b, *c;
    struct mt_quant_spec *qa, *qb;
};

struct mt_lowp {
    enum mt_q_recipe recipe;
    bool hybrid;                /* E5M2 gradients (delayed and tensorwise) */
    int per_layer;              /* slots per layer: K_EXP + 3 E */
    int nslots;                 /* L * per_layer */
    int *slot_of;               /* (ntensors): the first slot of a tensor, -1 high precision */
    /* backend memory: the two operands' scratch of the quantised GEMM (spec work),
     * mt_quant_gemm_scratch_bytes(qelems) each */
    void *wa, *wb;
    size_t qelems, wbytes;
    /* delayed scaling: per slot and operand (R_COUNT a slot) a history (struct
     * mt_amax_history) in backend memory, updated there by the op amax_history: the
     * amaxes hist_dev (ns,hist_len), the histories' scales hscale_dev, the encode scales
     * scale_dev (a gradient's in the unit of its loss scale), the step's amaxes amax_dev.
     * Every history takes an entry each step: one count and newest entry for all, in
     * backend memory pos_dev {latest, count}, which the op advances (so that a captured
     * iteration rolls the histories on the device), and on the host hist_latest and
     * hist_count, advanced with it by mt_model_lowp_step. The host copies are staging
     * for setup and checkpoints. */
    float *hist_dev, *hscale_dev, *scale_dev, *amax_dev;
    int32_t *pos_dev;
    float *hist_host, *hscale_host, *scale_host;
    int hist_len, hist_count, hist_latest;
    bool max_algo;
    float fmax, gmax; /* the operands' format maximum, the gradients' */
    int margin;
    /* the loss scale of the backward passes (1 / micro-batches of the rank): gradient
     * amaxes are recorded in the unit of the unscaled loss, so that the histories, and
     * a checkpoint of them, do not depend on the layout */
    float grad_unit;
    struct mt_comm *world;      /* amaxes are reduced (max) over every rank */
    /* current scaling of a shard (TP, ETP): the logical tensor's amax, backend memory,
     * reduced (max) over the group holding the shards; one for each operand of a GEMM
     * (both are found before the GEMM quantises either), then a pair for each expert of
     * the grouped GEMM (all found before it quantises any): 2 (1 + E_l) */
    float *tamax;
    struct expert_gemms eg;     /* the experts' GEMMs of a use (E_l each), host memory */
    /* what a producer emitted for the quantisation of x, its output (mt_pass_rmsnorm_qfwd,
     * mt_pass_swiglu_qfwd), for the forward GEMMs of layer fused_layer's linears of
     * kinds fused_first.. fused_last reading x next: at fused (the end of wa), or none
     * (fused_x NULL; any other quantised GEMM ends it) */
    const void *fused_x;
    int fused_layer, fused_first, fused_last;
    void *fused;
    size_t fused_bytes;         /* taken from the end of wa, 256-aligned */
    /* randomness of stochastic rounding and of the Hadamard signs (MT_RECIPE_NVFP4): keyed by
     * the training seed, the iteration and the backward pass within it. The key lives in
     * backend memory, key_dev[MT_Q_KEY_WORDS] (kernels/quant.h), advanced there by the op
     * random_key as each backward pass begins and each iteration ends, and the
     * quantisers read the pass's seed from it (struct mt_quant_spec seed_dev): a captured
     * backward scope or iteration then draws the bits of its replay, not of its capture.
     * iter, nbwd and bwd_seed are the host's copy, advanced with it. */
    uint64_t seed;
    uint64_t *key_dev;
    long long iter;             /* optimizer steps taken (restored with the buffers) */
    int nbwd;                   /* backward passes in this iteration */
    /* data parallelism: this rank's micro-batch j of a step is the step's micro-batch
     * j dp + dp_rank (the trainer's sample order), whose random bits it draws */
    int dp, dp_rank;
    uint64_t bwd_seed;
    /* the state as mt_model_buffers stores it */
    size_t nbuf;
};

static bool streq(const char *a, const char *b) { return strcmp(a, b) == 0; }

/* Floats of the checkpointed state: the iteration (two 16-bit halves of its low 32
 * bits... kept exact in fp32), then per delayed history count, latest, scale, amax[len]. */
static size_t state_floats(const struct mt_lowp *lp)
{
    size_t per = lp->recipe == MT_RECIPE_DELAYED ? (size_t)3 + (size_t)lp->hist_len : 0;
    return 4 + per * (size_t)lp->nslots * R_COUNT;
}

static int slot(const struct mt_lowp *lp, int l, int kind, int e)
{
    return l * lp->per_layer + kind + 3 * e;
}

/* Whether layer l runs its GEMMs in high precision (first_last_layers_bf16). */
static bool layer_bf16(const struct mt_model *m, int l)
{
    const struct mt_config_precision *q = &m->cfg.precision;
    return q->first_last_layers_bf16 &&
           (l < q->num_layers_at_start_in_bf16 || l >= m->L - q->num_layers_at_end_in_bf16);
}

static void map_tensor(struct mt_lowp *lp, int tensor, int s)
{
    if (tensor != MT_NO_TENSOR) lp->slot_of[tensor] = s;
}

/* The histories from the host staging to the backend (setup, a checkpoint's load), with
 * their encode scales as the op amax_history makes them (here on the host: the planning
 * backend of --check runs no op). */
static void upload_histories(struct mt_model *m)
{
    struct mt_lowp *lp = m->lp;
    const struct mt_kernels *k = m->k;
    const size_t ns = (size_t)lp->nslots * R_COUNT;
    mt_kernels_cpu()->op.amax_history(NULL, lp->hist_host, lp->hscale_host, lp->scale_host, NULL,
                                      (int)ns, lp->hist_len, NULL, lp->max_algo, lp->fmax, lp->gmax,
                                      lp->margin, lp->grad_unit, NULL);
    const int32_t pos[2] = {lp->hist_latest, lp->hist_count};
    k->op.copy(k->ctx, lp->pos_dev, pos, sizeof pos);
    k->op.copy(k->ctx, lp->hist_dev, lp->hist_host, sizeof(float) * ns * (size_t)lp->hist_len);
    k->op.copy(k->ctx, lp->hscale_dev, lp->hscale_host, sizeof(float) * ns);
    k->op.copy(k->ctx, lp->scale_dev, lp->scale_host, sizeof(float) * ns);
    k->op.memset(k->ctx, lp->amax_dev, 0, sizeof(float) * ns);
}

/* NVFP4's key from the host's copy to the backend (setup, a checkpoint's load): the
 * iteration, no backward pass begun. */
static void upload_key(struct mt_model *m)
{
    const struct mt_lowp *lp = m->lp;
    const struct mt_kernels *k = m->k;
    uint64_t key[MT_Q_KEY_WORDS] = {0};
    key[MT_Q_KEY_SEED] = lp->bwd_seed;
    key[MT_Q_KEY_ITER] = (uint64_t)lp->iter;
    key[MT_Q_KEY_NBWD] = (uint64_t)lp->nbwd;
    k->op.copy(k->ctx, lp->key_dev, key, sizeof key);
}

int mt_lowp_create(struct mt_model *m, const struct mt_parallel *par, size_t *scratch_bytes,
                   struct mt_err *err)
{
    const struct mt_config_precision *q = &m->cfg.precision;
    const bool fp8 = q->fp8_format[0], fp4 = q->fp4_format[0];
    *scratch_bytes = 0;
    if (!fp8 && !fp4) return MT_OK;
    if (!m->k->quant)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "&precision %s = '%s': the '%s' backend does not run the FP8/FP4 "
                          "recipes yet; --backend cpu runs every recipe today",
                          fp8 ? "fp8_format" : "fp4_format", fp8 ? q->fp8_format : q->fp4_format,
                          m->k->name);
    if (!(fp4 ? m->k->quant->fp4_shards : m->k->quant->shards) && (m->sc.tp > 1 || m->sc.etp > 1))
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "&precision %s = '%s' with tensor_model_parallel_size = %d and "
                          "expert_tensor_parallel_size = %d: the '%s' backend quantises whole "
                          "tensors only under %s, and these layouts split them over ranks (each "
                          "shard must be quantised in its place in the tensor, with the tensor's "
                          "amax); use tensor and expert-tensor parallelism 1 with it on this "
                          "backend (data, pipeline and expert parallelism run it)%s, or --backend cpu",
                          fp8 ? "fp8_format" : "fp4_format", fp8 ? q->fp8_format : q->fp4_format,
                          m->sc.tp, m->sc.etp, m->k->name, fp4 ? "NVFP4" : "this recipe",
                          fp4 && m->k->quant->shards ? ", an FP8 recipe (they run on shards here)" : "");
    struct mt_lowp *lp = calloc(1, sizeof *lp);
    if (!lp) return mt_err_set(err, MT_ENOMEM, "model: out of memory for the FP8/FP4 state");
    m->lp = lp;
    lp->recipe = fp4                            ? MT_RECIPE_NVFP4
                 : streq(q->fp8_recipe, "delayed")    ? MT_RECIPE_DELAYED
                 : streq(q->fp8_recipe, "tensorwise") ? MT_RECIPE_TENSORWISE
                 : streq(q->fp8_recipe, "blockwise")  ? MT_RECIPE_BLOCKWISE
                                                      : MT_RECIPE_MXFP8;
    lp->hybrid = fp8 && streq(q->fp8_format, "hybrid");
    lp->per_layer = K_EXP + 3 * m->E;
    lp->nslots = m->L * lp->per_layer;
    lp->hist_len = q->fp8_amax_history_len;
    lp->world = par ? par->world_comm : NULL;
    lp->dp = par ? par->dp : 1;
    lp->dp_rank = par ? par->dp_rank : 0;
    lp->seed = mt_rng_key((uint64_t)m->cfg.training.seed, 0x66703871ull);
    lp->slot_of = malloc(sizeof(int) * (size_t)m->ntensors);
    if (!lp->slot_of) return mt_err_set(err, MT_ENOMEM, "model: out of memory for the FP8/FP4 state");
    for (int i = 0; i < m->ntensors; i++) lp->slot_of[i] = -1;
    size_t most = 0; /* elements of the largest operand */
#define MOST(x) do { size_t v_ = (size_t)(x); most = v_ > most ? v_ : most; } while (0)
    const size_t N = (size_t)m->Bmax * m->T;
    const size_t widest = (size_t)(m->H > m->Q_l ? m->H : m->Q_l) > (size_t)m->F_l
                              ? (size_t)(m->H > m->Q_l ? m->H : m->Q_l) : (size_t)m->F_l;
    MOST(N * widest);
    MOST(N * (size_t)m->Fs_l);
    for (int l = m->l0; l < m->l1; l++) {
        const struct mt_layer_tensors *t = &m->lt[l];
        if (layer_bf16(m, l)) continue;
        map_tensor(lp, t->wq, slot(lp, l, K_WQ, 0));
        map_tensor(lp, t->wk, slot(lp, l, K_WK, 0));
        map_tensor(lp, t->wv, slot(lp, l, K_WV, 0));
        map_tensor(lp, t->wo, slot(lp, l, K_WO, 0));
        map_tensor(lp, t->gate, slot(lp, l, K_GATE, 0));
        map_tensor(lp, t->up, slot(lp, l, K_UP, 0));
        map_tensor(lp, t->down, slot(lp, l, K_DOWN, 0));
        map_tensor(lp, t->sh_gate, slot(lp, l, K_SH_GATE, 0));
        map_tensor(lp, t->sh_up, slot(lp, l, K_SH_UP, 0));
        map_tensor(lp, t->sh_down, slot(lp, l, K_SH_DOWN, 0));
        /* the slots of the global experts this rank holds (e0..) */
        map_tensor(lp, t->exp_gate, slot(lp, l, K_EXP, m->e0));
        map_tensor(lp, t->exp_up, slot(lp, l, K_EXP + 1, m->e0));
        map_tensor(lp, t->exp_down, slot(lp, l, K_EXP + 2, m->e0));
    }
    for (int i = 0; i < m->ntensors; i++)
        if (lp->slot_of[i] >= 0) MOST(m->tensors[i].numel);
    if (m->nmoe) {
        const size_t rows = (size_t)(m->x_rows_max > m->rows_max ? m->x_rows_max : m->rows_max);
        MOST(rows * (size_t)(m->H > m->Fe_l ? m->H : m->Fe_l));
    }
#undef MOST
    lp->qelems = most;
    lp->wbytes = mt_quant_gemm_scratch_bytes(most);
    const struct mt_kernels *k = m->k;
    lp->wa = k->op.alloc(k->ctx, lp->wbytes);
    lp->wb = k->op.alloc(k->ctx, lp->wbytes);
    lp->tamax = k->op.alloc(k->ctx, 2 * sizeof(float) * (1 + (size_t)m->E_l));
    const size_t E = (size_t)m->E_l;
    lp->eg.se = malloc(sizeof(int) * (E ? E : 1));
    lp->eg.a = malloc(sizeof(struct mt_tensor) * 3 * (E ? E : 1));
    lp->eg.qa = malloc(sizeof(struct mt_quant_spec) * 2 * (E ? E : 1));
    if (!lp->tamax || !lp->eg.se || !lp->eg.a || !lp->eg.qa)
        return mt_err_set(err, MT_ENOMEM, "model: out of memory for the FP8/FP4 state");
    lp->eg.b = lp->eg.a + E;
    lp->eg.c = lp->eg.b + E;
    lp->eg.qb = lp->eg.qa + E;
    if (!lp->wa || !lp->wb)
        return mt_err_set(err, MT_ENOMEM, "model: out of memory for the quantised GEMM operands "
                          "(2 x %zu bytes)", lp->wbytes);
    *scratch_bytes = 2 * lp->wbytes;
    if (lp->recipe == MT_RECIPE_DELAYED) {
        const size_t ns = (size_t)lp->nslots * R_COUNT, nh = ns * (size_t)lp->hist_len;
        if (lp->hist_len < 1)
            return mt_err_set(err, MT_EINVAL, "&precision fp8_amax_history_len = %d: it needs at least 1",
                              lp->hist_len);
        lp->hist_dev = k->op.alloc(k->ctx, sizeof(float) * nh);
        lp->hscale_dev = k->op.alloc(k->ctx, sizeof(float) * ns);
        lp->scale_dev = k->op.alloc(k->ctx, sizeof(float) * ns);
        lp->amax_dev = k->op.alloc(k->ctx, sizeof(float) * ns);
        lp->pos_dev = k->op.alloc(k->ctx, 2 * sizeof(int32_t));
        lp->hist_host = calloc(nh, sizeof(float));
        lp->hscale_host = malloc(sizeof(float) * ns);
        lp->scale_host = malloc(sizeof(float) * ns);
        if (!lp->hist_dev || !lp->hscale_dev || !lp->scale_dev || !lp->amax_dev || !lp->pos_dev || !lp->hist_host ||
            !lp->hscale_host || !lp->scale_host)
            return mt_err_set(err, MT_ENOMEM, "model: out of memory for the amax histories");
        lp->max_algo = streq(q->fp8_amax_compute_algo, "max");
        lp->fmax = MT_E4M3_MAX;
        lp->gmax = lp->hybrid ? MT_E5M2_MAX : MT_E4M3_MAX;
        lp->margin = q->fp8_margin;
        lp->hist_latest = lp->hist_len - 1; /* as mt_amax_history_init */
        for (size_t i = 0; i < ns; i++) lp->hscale_host[i] = 1.0f;
        upload_histories(m);
    }
    if (lp->recipe == MT_RECIPE_NVFP4) {
        lp->key_dev = k->op.alloc(k->ctx, sizeof(uint64_t) * MT_Q_KEY_WORDS);
        if (!lp->key_dev) return mt_err_set(err, MT_ENOMEM, "model: out of memory for the FP8/FP4 state");
        upload_key(m);
    }
    lp->nbuf = state_floats(lp);
    return MT_OK;
}

void mt_lowp_destroy(struct mt_model *m)
{
    struct mt_lowp *lp = m->lp;
    if (!lp) return;
    const struct mt_kernels *k = m->k;
    if (lp->wa) k->op.free(k->ctx, lp->wa);
    if (lp->wb) k->op.free(k->ctx, lp->wb);
    if (lp->tamax) k->op.free(k->ctx, lp->tamax);
    free(lp->eg.se), free(lp->eg.a), free(lp->eg.qa);
    void *const dev[] = {lp->hist_dev, lp->hscale_dev, lp->scale_dev, lp->amax_dev, lp->pos_dev, lp->key_dev};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) k->op.free(k->ctx, dev[i]);
    free(lp->hist_host);
    free(lp->hscale_host);
    free(lp->scale_host);
    free(lp->slot_of);
    free(lp);
    m->lp = NULL;
}

size_t mt_lowp_state_bytes(const struct mt_model *m, size_t *device)
{
    const struct mt_lowp *lp = m->lp;
    *device = 0;
    if (!lp) return 0;
    *device = 2 * sizeof(float) * (1 + (size_t)m->E_l); /* tamax */
    if (lp->recipe == MT_RECIPE_NVFP4) *device += sizeof(uint64_t) * MT_Q_KEY_WORDS; /* key_dev */
    if (lp->recipe != MT_RECIPE_DELAYED) return *device;
    const size_t ns = (size_t)lp->nslots * R_COUNT, len = (size_t)lp->hist_len;
    *device += sizeof(float) * ns * (len + 3) + 2 * sizeof(int32_t);
    return *device + sizeof(float) * ns * (len + 2);
}

size_t mt_lowp_nbuffers(const struct mt_model *m) { return m->lp ? m->lp->nbuf : 0; }

void mt_lowp_save(const struct mt_model *m, float *out)
{
    const struct mt_lowp *lp = m->lp;
    const uint64_t it = (uint64_t)lp->iter;
    for (int i = 0; i < 4; i++) out[i] = (float)((it >> (16 * i)) & 0xffffu);
    if (lp->recipe != MT_RECIPE_DELAYED) return;
    const struct mt_kernels *k = m->k;
    const size_t ns = (size_t)lp->nslots * R_COUNT, len = (size_t)lp->hist_len;
    k->op.copy(k->ctx, lp->hist_host, lp->hist_dev, sizeof(float) * ns * len);
    k->op.copy(k->ctx, lp->hscale_host, lp->hscale_dev, sizeof(float) * ns);
    float *o = out + 4;
    for (size_t i = 0; i < ns; i++) {
        *o++ = (float)lp->hist_count;
        *o++ = (float)lp->hist_latest;
        *o++ = lp->hscale_host[i];
        memcpy(o, lp->hist_host + i * len, sizeof(float) * len);
        o += len;
    }
}

void mt_lowp_load(struct mt_model *m, const float *in)
{
    struct mt_lowp *lp = m->lp;
    uint64_t it = 0;
    for (int i = 0; i < 4; i++) it |= (uint64_t)in[i] << (16 * i);
    lp->iter = (long long)it;
    lp->nbwd = 0;
    if (lp->recipe == MT_RECIPE_NVFP4) upload_key(m);
    if (lp->recipe != MT_RECIPE_DELAYED) return;
    const float *s = in + 4;
    const size_t ns = (size_t)lp->nslots * R_COUNT, len = (size_t)lp->hist_len;
    /* every history saved the same count and newest entry (one each step) */
    lp->hist_count = (int)s[0];
    lp->hist_latest = (int)s[1];
    for (size_t i = 0; i < ns; i++) {
        lp->hscale_host[i] = s[2];
        memcpy(lp->hist_host + i * len, s + 3, sizeof(float) * len);
        s += 3 + len;
    }
    upload_histories(m);
}

int mt_lowp_amax_all_reduce(const struct mt_kernels *k, void *ctx, struct mt_comm *comm, float *amax,
                            size_t n, struct mt_err *err)
{
    k->quant->amax_nan_to_inf(ctx, amax, n);
    return mt_all_reduce(comm, amax, n, MT_DT_F32, MT_OP_MAX, err);
}

int mt_model_lowp_roll(struct mt_model *m, const struct mt_step_gate *gate, struct mt_err *err)
{
    struct mt_lowp *lp = m->lp;
    if (!lp) return MT_OK;
    const struct mt_kernels *k = m->k;
    /* NVFP4: the next iteration's key, on the backend under the same gate */
    if (lp->recipe == MT_RECIPE_NVFP4)
        k->quant->random_key(k->ctx, lp->key_dev, lp->seed, lp->dp, lp->dp_rank, true, gate);
    if (lp->recipe != MT_RECIPE_DELAYED) return MT_OK;
    const size_t ns = (size_t)lp->nslots * R_COUNT;
    /* the largest over the ranks: data-parallel replicas saw other micro-batches,
     * pipeline stages other layers (their slots hold zeros elsewhere); a step the gate
     * skips keeps its amaxes, whose reduction again with the next step's changes nothing
     * (a max of maxes) */
    if (lp->world && lp->world->size > 1)
        MT_CHECK(mt_lowp_amax_all_reduce(k, k->ctx, lp->world, lp->amax_dev, ns, err));
    /* mt_amax_history_update's step of every history, on the backend: nothing read */
    k->op.amax_history(k->ctx, lp->hist_dev, lp->hscale_dev, lp->scale_dev, lp->amax_dev, (int)ns,
                       lp->hist_len, lp->pos_dev, lp->max_algo, lp->fmax, lp->gmax, lp->margin,
                       lp->grad_unit, gate);
    return MT_OK;
}

int mt_model_lowp_step(struct mt_model *m, bool rolled, struct mt_err *err)
{
    struct mt_lowp *lp = m->lp;
    if (!lp) return MT_OK;
    lp->iter++;
    lp->nbwd = 0;
    if (!rolled) MT_CHECK(mt_model_lowp_roll(m, NULL, err));
    if (lp->recipe != MT_RECIPE_DELAYED) return MT_OK;
    /* the host's copy of the position the op advanced */
    lp->hist_latest = (lp->hist_latest + 1) % lp->hist_len;
    if (lp->hist_count < lp->hist_len) lp->hist_count++;
    return MT_OK;
}

int mt_lowp_graph_ready(const struct mt_model *m, struct mt_err *err)
{
    const struct mt_lowp *lp = m->lp;
    if (!lp || lp->recipe != MT_RECIPE_DELAYED || lp->hist_count > 0) return MT_OK;
    return mt_err_set(err, MT_EUNSUPPORTED,
                      "&cuda_graph impl = 'full_iteration' with &precision fp8_recipe = "
                      "'delayed': no warm-up step entered the amax histories (each was skipped: "
                      "its loss or gradient was not finite), and the first step's scales come "
                      "from the tensors themselves, not from the histories the graph reads; "
                      "raise &cuda_graph warmup_steps, or lower &optimizer lr");
}

const char *mt_model_lowp_recipe(const struct mt_model *m)
{
    if (!m->lp) return NULL;
    static const char *const names[] = {"fp8 delayed", "fp8 tensorwise", "fp8 blockwise",
                                        "fp8 mxfp8", "fp4 nvfp4"};
    return names[m->lp->recipe];
}

void mt_lowp_backward_begin(struct mt_model *m, float loss_scale)
{
    struct mt_lowp *lp = m->lp;
    if (!lp) return;
    if (lp->recipe == MT_RECIPE_DELAYED && loss_scale != lp->grad_unit) {
        lp->grad_unit = loss_scale; /* the gradients' encode scales in the new unit */
        const struct mt_kernels *k = m->k;
        k->op.amax_history(k->ctx, lp->hist_dev, lp->hscale_dev, lp->scale_dev, NULL,
                           lp->nslots * R_COUNT, lp->hist_len, NULL, lp->max_algo, lp->fmax,
                           lp->gmax, lp->margin, lp->grad_unit, NULL);
    }
    if (lp->recipe != MT_RECIPE_NVFP4) return;
    const uint64_t mb = (uint64_t)lp->nbwd++ * (uint64_t)lp->dp + (uint64_t)lp->dp_rank;
    lp->bwd_seed = mt_q_backward_seed(lp->seed, (uint64_t)lp->iter, mb);
    const struct mt_kernels *k = m->k;
    k->quant->random_key(k->ctx, lp->key_dev, lp->seed, lp->dp, lp->dp_rank, false, NULL);
}

uint64_t mt_lowp_backward_seed(const struct mt_model *m) { return m->lp ? m->lp->bwd_seed : 0; }

/* ------------------------------------------------------------ operand specs */

enum use { U_FWD = MT_Q_FWD, U_DGRAD = MT_Q_DGRAD, U_WGRAD = MT_Q_WGRAD };

/* The quantisation of operand role of slot s for one use. */
static struct mt_quant_spec spec(const struct mt_pass *p, int s, int role, enum use u)
{
    const struct mt_lowp *lp = p->m->lp;
    struct mt_quant_spec q = mt_quant_operand_spec(lp->recipe, lp->hybrid, (enum mt_q_role)role,
                                                   (enum mt_q_use)u);
    if (lp->recipe == MT_RECIPE_DELAYED) {
        const size_t i = (size_t)s * R_COUNT + role;
        /* an empty history (the first step) scales the tensor by its own amax:
         * Transformer Engine's scale of 1 would quantise the first gradients against a
         * fixed range, where their size (1 / micro-batches of the rank) depends on the
         * layout; every later scale follows the amaxes */
        if (lp->hist_count > 0) q.scale = lp->scale_dev + i;
        q.margin = p->m->cfg.precision.fp8_margin;
        if (p->train) q.amax = lp->amax_dev + i;
    }
    if (lp->recipe == MT_RECIPE_NVFP4) {
        q.rht_stream = (uint32_t)s;
        q.seed_dev = lp->key_dev + MT_Q_KEY_SEED;
        q.stream = (uint32_t)(((uint64_t)s * R_COUNT + role) * 3 + u);
    }
    return q;
}

/* How the operand role of slot s's linear is split over ranks (doc/fp8.md, "Parallel
 * layouts"): column-parallel linears (q, k, v, gate, up, the experts' gate and up)
 * split W's rows and dy's columns, row-parallel ones (o, down) W's and x's columns;
 * over TP, the routed experts over ETP. The other operands are whole on every rank
 * (x gathered over the sequence-parallel shards, dy of a row-parallel linear gathered
 * likewise); an expert is whole on the EP rank that holds it. */
struct shard {
    struct mt_comm *comm;
    int n, rank;
    bool rows; /* split along the rows, else the columns */
};

static struct shard shard_of(const struct mt_pass *p, int s, int role)
{
    const struct mt_model *m = p->m;
    const int kind = s % m->lp->per_layer;
    const bool expert = kind >= K_EXP;
    const bool column = expert ? (kind - K_EXP) % 3 != 2
                               : kind != K_WO && kind != K_DOWN && kind != K_SH_DOWN;
    struct shard sh = { expert ? m->etp_comm : m->tp_comm, expert ? m->sc.etp : m->sc.tp,
                        expert ? m->sc.etp_rank : m->sc.tp_rank, role == R_W && column };
    if ((role == R_X && column) || (role == R_G && !column)) sh.n = 1;
    return sh;
}

/* The spec q of operand role of slot s for x, a shard of a tensor split over ranks:
 * its place in the tensor (the random bits of stochastic rounding), and the per-tensor
 * scales of current scaling from the tensor's amax, the shards' amaxes reduced (max)
 * over the group holding them (one all-reduce of one float), so that the shard
 * quantises as the whole tensor would. probe: backend memory of x's elements in fp32,
 * where the shard's amax is found (quantising records it) into tamax, one float of
 * backend memory. Whole tensors: unchanged. */
static int place_shard(const struct mt_pass *p, struct mt_quant_spec *q, int s, int role,
                       struct mt_tensor x, float *probe, float *tamax)
{
    const struct mt_kernels *k = p->m->k;
    const struct shard sh = shard_of(p, s, role);
    if (sh.n <= 1) return MT_OK;
    q->lrows = sh.rows ? x.rows * sh.n : x.rows;
    q->lcols = sh.rows ? x.cols : x.cols * sh.n;
    q->row0 = sh.rows ? x.rows * sh.rank : 0;
    q->col0 = sh.rows ? 0 : x.cols * sh.rank;
    const bool nvfp4 = q->scaling == MT_Q_NVFP4 || q->scaling == MT_Q_NVFP4_2D;
    if (nvfp4 || (q->scaling == MT_Q_TENSOR && !q->scale)) {
        struct mt_quant_spec pr = *q;
        pr.lrows = 0;
        pr.amax = tamax;
        pr.work = NULL;
        k->op.memset(k->ctx, tamax, 0, sizeof(float));
        k->quant->qdq(p->ctx, &pr, mt_f32(probe, x.rows, x.cols), x);
        MT_CHECK(mt_lowp_amax_all_reduce(k, p->ctx, sh.comm, tamax, 1, p->err));
        q->tensor_amax = tamax;
    }
    return MT_OK;
}

/* The first operand's scratch (spec work) of a GEMM or save while a producer's emitted
 * quantisation lies at its end (lp->fused_x), without that end. */
static void work_a(const struct mt_lowp *lp, struct mt_quant_spec *q)
{
    q->work = lp->wa;
    q->work_bytes = lp->wbytes - (lp->fused_x ? lp->fused_bytes : 0);
}

static bool fused_reads(const struct mt_pass *p, int s, struct mt_tensor x);

/* c = beta c + op(q(a)) op(q(b)), the quantised GEMM of slot s's operands ra and rb for
 * use u (struct mt_quant_ops gemm), each operand with its scratch buffer; xcopy, or
 * NULL: the saved copy of the operand x (role R_X) that the GEMM reads instead of
 * quantising it. */
static int qgemm(const struct mt_pass *p, int s, enum use u, bool ta, int ra, struct mt_tensor a,
                 bool tb, int rb, struct mt_tensor b, float beta, struct mt_tensor c,
                 const void *xcopy)
{
    struct mt_lowp *lp = p->m->lp;
    /* a forward GEMM on x as its producer emitted x's quantisation reads that: the
     * codes and scales of a block scaling, the tensorwise amax; any other ends it */
    const bool fused = u == U_FWD && ra == R_X && fused_reads(p, s, a);
    if (!fused) lp->fused_x = NULL;
    struct mt_quant_spec qa = spec(p, s, ra, u), qb = spec(p, s, rb, u);
    work_a(lp, &qa);
    qb.work = lp->wb;
    qb.work_bytes = lp->wbytes;
    if (ra == R_X) qa.saved = xcopy;
    if (fused && !xcopy) {
        if (qa.scaling == MT_Q_TENSOR) qa.tensor_amax = lp->fused;
        else qa.saved = lp->fused;
    }
    if (rb == R_X) qb.saved = xcopy;
    /* each probe writes the other operand's buffer, which it quantises only later */
    if (!qa.saved) MT_CHECK(place_shard(p, &qa, s, ra, a, lp->wb, lp->tamax));
    if (!qb.saved) MT_CHECK(place_shard(p, &qb, s, rb, b, lp->wa, lp->tamax + 1));
    p->m->k->quant->gemm(p->ctx, ta, tb, &qa, a, &qb, b, beta, c);
    return MT_OK;
}

/* ------------------------------------------------------------ copies saved for backward */

bool mt_lowp_saves(const struct mt_model *m, int l)
{
    const struct mt_lowp *lp = m->lp;
    return lp && m->k->quant->save && lp->recipe != MT_RECIPE_NVFP4 && !layer_bf16(m, l);
}

/* The use whose quantisation of x the copy is: the forward's under per-tensor scaling
 * (one copy: the wgrad GEMM reads the same codes and scale transposed), the wgrad GEMM's
 * for the block recipes (blocks along the tokens, quantised from the high-precision
 * values, not from the forward's blocks along the features). */
static enum use copy_use(const struct mt_lowp *lp)
{
    return lp->recipe == MT_RECIPE_DELAYED || lp->recipe == MT_RECIPE_TENSORWISE ? U_FWD : U_WGRAD;
}

size_t mt_lowp_copy_bytes(const struct mt_model *m, int64_t rows, int64_t cols)
{
    const struct mt_lowp *lp = m->lp;
    const struct mt_quant_spec q = mt_quant_operand_spec(lp->recipe, lp->hybrid, MT_Q_X,
                                                         (enum mt_q_use)copy_use(lp));
    return m->k->quant->saved_bytes(&q, rows, cols);
}

/* Delayed scaling quantises each linear's input with its own history's scale; every
 * other recipe quantises one input alike for each linear that reads it. */
bool mt_lowp_shares_copies(const struct mt_model *m) { return m->lp->recipe != MT_RECIPE_DELAYED; }

/* The copy of slot s's input in the activations of the pass's micro-batch, or NULL
 * where its linear keeps none (a routed expert, NVFP4, evaluation). */
static void *copy_of(const struct mt_pass *p, int s)
{
    const struct mt_model *m = p->m;
    const int l = s / m->lp->per_layer, kind = s % m->lp->per_layer;
    if (!p->train || kind >= K_EXP || !mt_lowp_saves(m, l)) return NULL;
    return m->la[l].qx[kind];
}

/* Whether slot s's linear reads the copy that the linear before it, on the same input,
 * made in this forward (k and v after q, up after gate). */
static bool copy_made_before(const struct mt_pass *p, int s)
{
    const int kind = s % p->m->lp->per_layer;
    return mt_lowp_shares_copies(p->m) &&
           (kind == K_WK || kind == K_WV || kind == K_UP || kind == K_SH_UP);
}

/* copy = x, slot s's input, quantised as copy_use says (its amax recorded, a shard
 * placed in its tensor as the GEMMs place it). */
static int save_copy(const struct mt_pass *p, int s, struct mt_tensor x, void *copy)
{
    const struct mt_lowp *lp = p->m->lp;
    struct mt_quant_spec q = spec(p, s, R_X, copy_use(lp));
    work_a(lp, &q);
    MT_CHECK(place_shard(p, &q, s, R_X, x, lp->wb, lp->tamax));
    if (fused_reads(p, s, x) && q.scaling == MT_Q_TENSOR) q.tensor_amax = lp->fused; /* the producer's amax */
    p->m->k->quant->save(p->ctx, &q, copy, x);
    return MT_OK;
}

static int slot_of(const struct mt_pass *p, int tensor)
{
    return p->m->lp && tensor != MT_NO_TENSOR ? p->m->lp->slot_of[tensor] : -1;
}

/* ------------------------------------------------------------ quantisation fused with its producer */

/* The linears of a layer that read the input of kind's linear (q, k and v; gate and up):
 * the kinds first..last. */
static void readers_of(int kind, int *first, int *last)
{
    *first = *last = kind;
    if (kind == K_WQ) *last = K_WV;
    else if (kind == K_GATE) *last = K_UP;
    else if (kind == K_SH_GATE) *last = K_SH_UP;
}

/* Whether slot s's forward GEMM reads x's quantisation as its producer emitted it. */
static bool fused_reads(const struct mt_pass *p, int s, struct mt_tensor x)
{
    const struct mt_lowp *lp = p->m->lp;
    const int l = s / lp->per_layer, kind = s % lp->per_layer;
    return lp->fused_x && lp->fused_x == x.data && l == lp->fused_layer && kind >= lp->fused_first &&
           kind <= lp->fused_last;
}

/* Where the producer of out (rows, cols), the input of tensor's linear, emits out's
 * quantisation for that linear's forward GEMM (and those of the linears after it on
 * the same input) under *q (doc/fp8.md, "Quantisation fused with its producer"): the
 * end of wa, which the GEMMs reading out and save are given without it, recorded in lp;
 * NULL where it is not fused: a backend without the producer's op (struct mt_quant_ops
 * rmsnorm_fwd, swiglu_fwd), a layer in high precision, a quantisation that needs more
 * than a row (delayed scaling's history and amax record, NVFP4: mt_quant_fusable), a
 * tensorwise shard (its scale is the group's amax), activations rounded after the
 * producer (round_in_place), or scratch too small to keep the staging beside it. */
static void *fuse_into(const struct mt_pass *p, int tensor, bool has_op, struct mt_tensor out,
                       struct mt_quant_spec *q)
{
    struct mt_model *m = p->m;
    struct mt_lowp *lp = m->lp;
    if (lp) lp->fused_x = NULL;
    const int s = slot_of(p, tensor);
    if (!lp || s < 0 || !has_op || m->round_in_place || !m->k->quant->saved_bytes) return NULL;
    *q = spec(p, s, R_X, U_FWD);
    if (!mt_quant_fusable(q) || (q->scaling == MT_Q_TENSOR && shard_of(p, s, R_X).n > 1)) return NULL;
    const size_t elems = (size_t)out.rows * (size_t)out.cols;
    const size_t bytes = q->scaling == MT_Q_TENSOR ? 256
                                                   : (m->k->quant->saved_bytes(q, out.rows, out.cols) + 255) / 256 * 256;
    if (lp->wbytes < bytes + sizeof(float) * elems + 256) return NULL;
    lp->fused_x = out.data;
    lp->fused_layer = s / lp->per_layer;
    readers_of(s % lp->per_layer, &lp->fused_first, &lp->fused_last);
    lp->fused_bytes = bytes;
    lp->fused = (char *)lp->wa + (lp->wbytes - bytes) / 256 * 256;
    return lp->fused;
}

void mt_pass_rmsnorm_qfwd(const struct mt_pass *p, int tensor, struct mt_tensor out, float *rstd,
                          struct mt_tensor x, struct mt_tensor w, int N, int C, float eps)
{
    const struct mt_quant_ops *qo = p->m->k->quant;
    struct mt_quant_spec q;
    void *fused = fuse_into(p, tensor, qo && qo->rmsnorm_fwd, out, &q);
    if (fused) qo->rmsnorm_fwd(p->ctx, &q, fused, out, rstd, x, w, N, C, eps);
    else p->o->rmsnorm_fwd(p->ctx, out, rstd, x, w, N, C, eps);
}

void mt_pass_swiglu_qfwd(const struct mt_pass *p, int tensor, struct mt_tensor out, struct mt_tensor gate,
                         struct mt_tensor up, int N, int F)
{
    const struct mt_quant_ops *qo = p->m->k->quant;
    struct mt_quant_spec q;
    void *fused = fuse_into(p, tensor, qo && qo->swiglu_fwd, out, &q);
    if (fused) qo->swiglu_fwd(p->ctx, &q, fused, out, gate, up, N, F);
    else p->o->swiglu_fwd(p->ctx, out, gate, up, N, F);
}

/* ------------------------------------------------------------ linears */

// out (N,dout) = in (N,din) W^T, W = tensor (dout,din)
int mt_pass_qlinear_fwd(const struct mt_pass *p, int tensor, struct mt_tensor out,
                        struct mt_tensor in, int N, int dout, int din)
{
    const struct mt_tensor w = mt_model_weight(p->m, tensor);
    const int s = slot_of(p, tensor);
    if (s < 0) {
        mt_pass_linear_fwd(p, out, in, w, N, dout, din);
        return MT_OK;
    }
    (void)N, (void)dout, (void)din; /* out and in carry their shapes */
    struct mt_lowp *lp = p->m->lp;
    if (!fused_reads(p, s, in)) lp->fused_x = NULL;
    void *copy = copy_of(p, s);
    if (copy && !copy_made_before(p, s)) MT_CHECK(save_copy(p, s, in, copy));
    const bool fwd_reads_copy = copy && copy_use(lp) == U_FWD;
    return qgemm(p, s, U_FWD, false, R_X, in, true, R_W, w, 0.0f, out, fwd_reads_copy ? copy : NULL);
}

// din (N,din) = beta din + dout W; dW (dout,din) += dout^T in
int mt_pass_qlinear_bwd(const struct mt_pass *p, int tensor, float *din, float beta,
                        const float *dout, struct mt_tensor in, int N, int d_out, int d_in)
{
    struct mt_model *m = p->m;
    const struct mt_tensor w = mt_model_weight(m, tensor);
    float *dw = mt_model_view(m->grads, m, tensor);
    const int s = slot_of(p, tensor);
    if (s < 0) {
        mt_pass_linear_bwd(p, din, beta, dw, dout, in, w, N, d_out, d_in);
        return MT_OK;
    }
    const struct mt_tensor dy = mt_f32(dout, N, d_out);
    MT_CHECK(qgemm(p, s, U_DGRAD, false, R_G, dy, false, R_W, w, beta, mt_f32(din, N, d_in), NULL));
    return qgemm(p, s, U_WGRAD, true, R_G, dy, false, R_X, in, 1.0f, mt_f32(dw, d_out, d_in),
                 copy_of(p, s));
}

/* ------------------------------------------------------------ routed experts */

/* Rows r0..r1 of x (width cols). */
static struct mt_tensor rows_of(struct mt_tensor x, long long r0, long long r1, int cols)
{
    return mt_tview((const char *)x.data + mt_dtype_size(x.dtype) * (size_t)r0 * (size_t)cols, x.dtype,
                    r1 - r0, cols);
}

/* Expert e's weight slab (dout,din) of tensor. */
static struct mt_tensor slab_of(const struct mt_pass *p, int tensor, int e, int dout, int din)
{
    const struct mt_tensor w = mt_model_weight(p->m, tensor);
    const size_t slab = (size_t)dout * (size_t)din;
    return mt_tview((const char *)w.data + mt_dtype_size(w.dtype) * slab * (size_t)e, w.dtype, dout, din);
}

bool mt_lowp_grouped(const struct mt_pass *p, int tensor) { return slot_of(p, tensor) >= 0; }

/* The operand scratch holds at least `rows` expert-side rows of width `width`: routing
 * can bring a rank more rows than planned (mt_model_expert_rows grows the activations
 * then), and these grow with them. */
static int fit_rows(const struct mt_pass *p, int rows, int width)
{
    struct mt_lowp *lp = p->m->lp;
    lp->fused_x = NULL; /* the experts' GEMMs take all of wa, which may move */
    const struct mt_kernels *k = p->m->k;
    const size_t elems = (size_t)rows * (size_t)width;
    if (elems <= lp->qelems) return MT_OK;
    k->op.free(k->ctx, lp->wa);
    k->op.free(k->ctx, lp->wb);
    lp->qelems = elems;
    lp->wbytes = mt_quant_gemm_scratch_bytes(elems);
    lp->wa = k->op.alloc(k->ctx, lp->wbytes);
    lp->wb = k->op.alloc(k->ctx, lp->wbytes);
    if (!lp->wa || !lp->wb)
        return mt_err_set(p->err, MT_ENOMEM, "model: out of memory for the quantised GEMM "
                          "operands of %d expert rows (2 x %zu bytes)", rows, lp->wbytes);
    return MT_OK;
}

/* The quantised GEMMs of one use for a set of experts: expert i's slot se[i], its
 * operands a[i] and b[i] and its product c[i] (rows of the grouped activations, slabs
 * of the experts' weights); the arrays are the model's (struct mt_lowp eg), allocated
 * with it, so that a step allocates nothing. */
static struct expert_gemms expert_gemms_of(const struct mt_pass *p)
{
    struct expert_gemms g = p->m->lp->eg;
    g.n = 0;
    return g;
}

/* Scratch for an operand of elems elements from the model's operand buffer (*at, *left
 * bytes of it): a slice of the bound the backend needs, 256-byte aligned, while the
 * buffer holds one; else none (the backend's allocator). */
static void take_work(struct mt_quant_spec *q, char **at, size_t *left, size_t elems)
{
    const size_t need = (mt_quant_gemm_scratch_bytes(elems) + 255) / 256 * 256;
    if (need > *left) return;
    q->work = *at;
    q->work_bytes = need;
    *at += need;
    *left -= need;
}

/* c[i] = beta c[i] + op(q(a[i])) op(q(b[i])) for every expert of g, operands of roles ra
 * and rb under use u: one call of the backend's grouped GEMM where it has one (struct
 * mt_quant_ops grouped_gemm), else qgemm each. Every expert's shards are placed before
 * the grouped call quantises any, each with its pair of tensor amaxes; the experts'
 * operands share the model's two operand buffers (a's in one, b's in the other: the
 * grouped activations and the stacked weights they were sized for), slice by slice. */
static int qgemm_experts(const struct mt_pass *p, struct expert_gemms *g, enum use u, bool ta, int ra, bool tb,
                         int rb, float beta)
{
    const struct mt_lowp *lp = p->m->lp;
    const struct mt_quant_ops *qo = p->m->k->quant;
    /* The backend's grouped kernel (CUDA: qgg_kernel) runs on the CUDA cores, the
     * per-expert matmuls (cuBLASLt) on the FP8 tensor cores: the single launch pays only
     * where every expert's product is launch-bound, at most MT_QGROUPED_MAX_MACS
     * multiply-adds (doc/fp8.md, "The grouped expert GEMM"). */
    bool small = true;
    for (int i = 0; i < g->n && small; i++) {
        const int64_t k = ta ? g->a[i].rows : g->a[i].cols;
        small = (double)g->c[i].rows * (double)g->c[i].cols * (double)k <= MT_QGROUPED_MAX_MACS;
    }
    if (!qo->grouped_gemm || !small) {
        for (int i = 0; i < g->n; i++)
            MT_CHECK(qgemm(p, g->se[i], u, ta, ra, g->a[i], tb, rb, g->b[i], beta, g->c[i], NULL));
        return MT_OK;
    }
    if (!g->n) return MT_OK;
    char *wa = lp->wa, *wb = lp->wb;
    size_t left_a = lp->wbytes, left_b = lp->wbytes;
    for (int i = 0; i < g->n; i++) {
        g->qa[i] = spec(p, g->se[i], ra, u);
        g->qb[i] = spec(p, g->se[i], rb, u);
        /* each probe writes the operand buffers before the grouped call quantises into them */
        MT_CHECK(place_shard(p, &g->qa[i], g->se[i], ra, g->a[i], lp->wb, lp->tamax + 2 * (i + 1)));
        MT_CHECK(place_shard(p, &g->qb[i], g->se[i], rb, g->b[i], lp->wa, lp->tamax + 2 * (i + 1) + 1));
        take_work(&g->qa[i], &wa, &left_a, (size_t)(g->a[i].rows * g->a[i].cols));
        take_work(&g->qb[i], &wb, &left_b, (size_t)(g->b[i].rows * g->b[i].cols));
    }
    qo->grouped_gemm(p->ctx, g->n, ta, tb, g->qa, g->a, g->qb, g->b, beta, g->c);
    return MT_OK;
}

/* Every expert's rows are quantised on their own, and multiplied on their own, split by
 * ho, the expert-side row offsets the host keeps for the layer (struct mt_layer_acts
 * hx_offsets): nothing is read back from the device here.
 * out (rows,dout) = per expert x_e (m_e,din) W_e^T; W = tensor, slabs (dout,din) */
int mt_pass_qgrouped_fwd(const struct mt_pass *p, int tensor, const int32_t *ho,
                         struct mt_tensor x, int rows, int dout, int din, struct mt_tensor out)
{
    const struct mt_lowp *lp = p->m->lp;
    const int s = slot_of(p, tensor);
    MT_CHECK(fit_rows(p, rows, din > dout ? din : dout));
    struct expert_gemms g = expert_gemms_of(p);
    int rc = MT_OK;
    for (int e = 0; e < p->m->E_l && !rc; e++) {
        const long long r0 = ho[e], r1 = ho[e + 1];
        const int se = s + 3 * e;
        const struct mt_tensor we = slab_of(p, tensor, e, dout, din);
        if (r1 > r0) {
            g.se[g.n] = se;
            g.a[g.n] = rows_of(x, r0, r1, din);
            g.b[g.n] = we;
            g.c[g.n++] = rows_of(out, r0, r1, dout);
            continue;
        }
        /* an expert without rows: its weight's amax still goes to delayed scaling's
         * history (every expert's weight is seen each step) */
        struct mt_quant_spec qw = spec(p, se, R_W, U_FWD);
        if (!qw.amax) continue;
        qw.work = lp->wb;
        qw.work_bytes = lp->wbytes;
        rc = place_shard(p, &qw, se, R_W, we, lp->wa, lp->tamax);
        if (!rc) p->m->k->quant->qdq(p->ctx, &qw, mt_f32(lp->wa, dout, din), we);
    }
    if (!rc) rc = qgemm_experts(p, &g, U_FWD, false, R_X, true, R_W, 0.0f);
    return rc;
}

// dx (rows,din) = beta dx + per expert dy_e W_e; dW_e (dout,din) += dy_e^T x_e
int mt_pass_qgrouped_bwd(const struct mt_pass *p, int tensor, const int32_t *ho,
                         const float *dy, struct mt_tensor x, int rows, int dout, int din,
                         float *dx, float beta)
{
    struct mt_model *m = p->m;
    const int s = slot_of(p, tensor);
    MT_CHECK(fit_rows(p, rows, din > dout ? din : dout));
    const struct mt_tensor dyt = mt_f32(dy, rows, dout), dxt = mt_f32(dx, rows, din);
    const struct mt_tensor dw = mt_f32(mt_model_view(m->grads, m, tensor), (int64_t)m->E_l * dout, din);
    struct expert_gemms g = expert_gemms_of(p);
    /* dgrad: dy_e and W_e into dx's rows */
    for (int e = 0; e < m->E_l; e++) {
        const long long r0 = ho[e], r1 = ho[e + 1];
        if (r1 <= r0) continue;
        g.se[g.n] = s + 3 * e;
        g.a[g.n] = rows_of(dyt, r0, r1, dout);
        g.b[g.n] = slab_of(p, tensor, e, dout, din);
        g.c[g.n++] = rows_of(dxt, r0, r1, din);
    }
    int rc = qgemm_experts(p, &g, U_DGRAD, false, R_G, false, R_W, beta);
    /* wgrad: dy_e and x_e into W_e's gradient */
    for (int i = 0, e = 0; e < m->E_l; e++) {
        const long long r0 = ho[e], r1 = ho[e + 1];
        if (r1 <= r0) continue;
        g.b[i] = rows_of(x, r0, r1, din);
        g.c[i++] = rows_of(dw, (long long)e * dout, (long long)(e + 1) * dout, din);
    }
    if (!rc) rc = qgemm_experts(p, &g, U_WGRAD, true, R_G, false, R_X, 1.0f);
    return rc;
}

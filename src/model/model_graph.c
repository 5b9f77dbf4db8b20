/* CUDA graph scopes of the model (&cuda_graph, doc/host-overhead.md "CUDA graphs"): each
 * scope's ops captured once per (module, layer, micro-batch slot, pass, segment) after the
 * trainer's warm-up and replayed with one launch after that, through the backend's
 * struct mt_graph_ops; or, with impl = 'full_iteration', the trainer's iteration as one
 * scope (mt_model_iteration_begin), with none inside it. A scope never holds a host read
 * or an allocation that outlives it, nor a collective (a segment ends before one and the
 * next begins after it), except the moe scope, whose NCCL collectives are captured with it. */
#include "model/model_internal.h"

#include <string.h>

static const char *const module_names[MT_GM_COUNT] = {"attn", "mlp", "moe", "moe_router",
                                                      "moe_preprocess"};

uint64_t mt_graph_sig(uint64_t h, const uintptr_t *words, size_t n)
{
    const unsigned char *b = (const unsigned char *)words;
    for (size_t i = 0; i < n * sizeof *words; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

int mt_graph_setup(struct mt_model *m, struct mt_err *err)
{
    const struct mt_config_cuda_graph *g = &m->cfg.cuda_graph;
    m->graphs = (struct mt_model_graphs){0};
    const bool full = strcmp(g->impl, "full_iteration") == 0;
    if (!full && strcmp(g->impl, "local") != 0) return MT_OK; /* none */
    if (!m->k->graph)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "&cuda_graph impl = '%s': the %s backend has no CUDA graphs; run "
                          "--backend cuda, or set impl = 'none'",
                          g->impl, m->k->name);
    if (full) { /* the trainer's one scope, none inside */
        m->graphs.full = true;
        return MT_OK;
    }
    for (int i = 0; i < g->modules_len; i++)
        for (int j = 0; j < MT_GM_COUNT; j++)
            if (strcmp(g->modules[i], module_names[j]) == 0) m->graphs.modules |= 1u << j;
    /* the whole MoE block: its router and plan in their own scopes, its experts in its own */
    if (m->graphs.modules & (1u << MT_GM_MOE))
        m->graphs.modules |= 1u << MT_GM_MOE_ROUTER | 1u << MT_GM_MOE_PREPROCESS;
    return MT_OK;
}

/* The pass part of a key: forward, evaluation forward, recompute, backward. */
static unsigned pass_of(const struct mt_pass *p, bool backward)
{
    if (backward) return 3;
    if (p->recompute) return 2;
    return p->train ? 0 : 1;
}

int mt_graph_begin(const struct mt_pass *p, enum mt_graph_module mod, int layer, int segment,
                   bool backward, uint64_t sig, bool *run)
{
    struct mt_model *m = p->m;
    *run = true;
    if (!(m->graphs.modules & (1u << mod))) return MT_OK;
    const struct mt_graph_ops *g = m->k->graph;
    /* the forward's record of the step's scalars (mt_model_record) is one per forward:
     * the router and plan scopes add to it, and are held per record, so the step's
     * micro-batches replay their own graphs instead of recapturing one (their signatures
     * hold the record's address) */
    const bool per_record = !backward && (mod == MT_GM_MOE_ROUTER || mod == MT_GM_MOE_PREPROCESS);
    const int rec = per_record ? m->rec_cur : 0;
    const uint64_t key = (uint64_t)mod << 56 | (uint64_t)pass_of(p, backward) << 52 |
                         (uint64_t)(segment & 0xf) << 48 | (uint64_t)(layer & 0xfff) << 36 |
                         (uint64_t)(rec & 0xfff) << 24 | (uint64_t)(m->off.slot & 0xffffff);
    /* the micro-batch size and the loss scale are host values the ops take */
    uint32_t scale;
    memcpy(&scale, &p->scale, sizeof scale);
    sig = mt_graph_sig(sig, (const uintptr_t[]){(uintptr_t)p->B, (uintptr_t)p->N, scale}, 3);
    bool replayed = false;
    int rc = g->begin(m->k->ctx, key, sig, m->graphs.capture, &replayed, p->err);
    if (rc)
        return mt_err_prefix(p->err, "&cuda_graph scope %s of layer %d", module_names[mod], layer);
    *run = !replayed;
    m->graphs.open = !replayed;
    return MT_OK;
}

int mt_graph_end(const struct mt_pass *p)
{
    struct mt_model *m = p->m;
    if (!m->graphs.open) return MT_OK;
    m->graphs.open = false;
    return m->k->graph->end(m->k->ctx, p->err);
}

/* The key of the whole iteration: a module number past the scopes'. */
#define ITERATION_KEY ((uint64_t)MT_GM_COUNT << 56)

int mt_model_iteration_begin(struct mt_model *m, uint64_t sig, bool *run, struct mt_err *err)
{
    *run = true;
    if (!m->graphs.full) return MT_OK;
    /* what every kernel of the iteration addresses: the model's allocations (each view
     * is at a fixed place in one), the step's scalars and the token staging the
     * graph's copies read, the expert-side overflow block when one is held, the expert
     * biases and the world's loads, and the activation offloading's device halves and
     * pinned host blocks */
    const uintptr_t words[] = {(uintptr_t)m->params, (uintptr_t)m->grads, (uintptr_t)m->work,
                               (uintptr_t)m->acts, (uintptr_t)m->scratch, (uintptr_t)m->acc,
                               (uintptr_t)m->host_tokens_all, (uintptr_t)m->rc_mem,
                               (uintptr_t)m->scratch_over, (uintptr_t)m->expert_bias_dev,
                               (uintptr_t)m->expert_load_sum, (uintptr_t)m->off.mem[0],
                               (uintptr_t)m->off.mem[1], (uintptr_t)m->off.host,
                               (uintptr_t)m->nrec_max};
    sig = mt_graph_sig(sig, words, sizeof words / sizeof words[0]);
    if (m->graphs.capture) MT_CHECK(mt_lowp_graph_ready(m, err));
    bool replayed = false;
    if (m->k->graph->begin(m->k->ctx, ITERATION_KEY, sig, m->graphs.capture, &replayed, err))
        return mt_err_prefix(err, "&cuda_graph impl = 'full_iteration'");
    *run = !replayed;
    m->graphs.iteration_open = !replayed;
    return MT_OK;
}

int mt_model_iteration_end(struct mt_model *m, struct mt_err *err)
{
    if (!m->graphs.iteration_open) return MT_OK;
    m->graphs.iteration_open = false;
    if (m->k->graph->end(m->k->ctx, err))
        return mt_err_prefix(err, "&cuda_graph impl = 'full_iteration'");
    return MT_OK;
}

void mt_model_set_graph_capture(struct mt_model *m, bool capture) { m->graphs.capture = capture; }

bool mt_model_graph_stats(const struct mt_model *m, struct mt_graph_stats *out)
{
    if (!m->graphs.modules && !m->graphs.full) return false;
    m->k->graph->stats(m->k->ctx, out);
    return true;
}

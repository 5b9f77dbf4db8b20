/* Activation offloading (&recompute fine_grained_activation_offloading, Megatron's
 * fine-grained activation offloading): the saved tensors of the modules named in
 * offload_modules live, per layer, in one range of the rank's offload buffer (struct
 * mt_offload: two buffers, layer l in buffer l % 2) instead of the slot's activations.
 *
 * Forward (training): when layer l is done, the copy stream waits for the compute
 * stream and copies the range to the slot's pinned host block; layer l+1 computes in
 * the other half meanwhile, and the first write into half l % 2 again (layer l+2's, or
 * its input written at the end of layer l+1) waits for that copy on the device.
 * Backward: the last layer's range is copied back first; each layer's backward waits
 * for its own copy and queues the next one down (into the other half, after the
 * compute stream's work so far, i.e. after the backward of the layer that used it), so
 * it arrives while this layer computes. The host never waits. */
#include "model/model_internal.h"

#include <stdlib.h>
#include <string.h>

unsigned mt_offload_modules(const struct mt_config *cfg)
{
    const struct mt_config_recompute *r = &cfg->recompute;
    unsigned mods = 0;
    for (int i = 0; r->fine_grained_activation_offloading && i < r->offload_modules_len; i++) {
        const char *mod = r->offload_modules[i];
        mods |= strcmp(mod, "attn_norm") == 0    ? MT_OFF_ATTN_NORM
                : strcmp(mod, "qkv_linear") == 0 ? MT_OFF_QKV
                : strcmp(mod, "core_attn") == 0  ? MT_OFF_CORE_ATTN
                : strcmp(mod, "attn_proj") == 0  ? MT_OFF_ATTN_PROJ
                : strcmp(mod, "mlp_norm") == 0   ? MT_OFF_MLP_NORM
                : strcmp(mod, "expert_fc1") == 0 ? MT_OFF_EXPERT_FC1
                : strcmp(mod, "moe_act") == 0    ? MT_OFF_MOE_ACT
                                                 : 0;
    }
    return mods;
}

int mt_offload_setup(struct mt_model *m, int nchunks, int nslots, const size_t *chunk_bytes,
                     struct mt_err *err)
{
    struct mt_offload *f = &m->off;
    const struct mt_kernel_ops *o = &m->k->op;
    void *ctx = m->k->ctx;
    mt_offload_free(m);
    f->slot_at = calloc((size_t)nchunks * nslots, sizeof(size_t));
    if (!f->slot_at) return mt_err_set(err, MT_ENOMEM, "model: out of memory for the offload table");
    size_t at = 0;
    f->mb_bytes = 0;
    for (int c = 0; c < nchunks; c++) {
        for (int s = 0; s < nslots; s++) {
            f->slot_at[c * nslots + s] = at;
            at += chunk_bytes[c];
        }
        f->mb_bytes += chunk_bytes[c];
    }
    f->host_bytes = at;
    f->slot = 0;
    if (at == 0) return MT_OK;
    f->host = o->alloc_host(ctx, at);
    if (!f->host)
        return mt_err_set(err, MT_ENOMEM,
                          "model: out of pinned host memory for activation offloading (%zu bytes: "
                          "%d slot(s) of the offloaded tensors of every layer)\nhint: offload "
                          "fewer recompute%%offload_modules, or lower training%%micro_batch_size",
                          at, nchunks * nslots);
    void **evs[] = {&f->ev_compute, &f->ev_d2h[0], &f->ev_d2h[1], &f->ev_h2d[0], &f->ev_h2d[1]};
    for (size_t i = 0; i < sizeof evs / sizeof *evs; i++)
        if (!(*evs[i] = o->event_create(ctx)))
            return mt_err_set(err, MT_ENOMEM, "model: the %s backend cannot create an event",
                              m->k->name);
    return MT_OK;
}

void mt_offload_free(struct mt_model *m)
{
    struct mt_offload *f = &m->off;
    const struct mt_kernel_ops *o = &m->k->op;
    void *ctx = m->k->ctx;
    if (f->ev_d2h[0]) {
        /* the copies still queued read or write what is freed here (sync waits for the
         * compute stream, which waits for the copy stream's last point) */
        o->event_record(ctx, f->ev_d2h[0], MT_STREAM_COPY);
        o->event_wait(ctx, MT_STREAM_COMPUTE, f->ev_d2h[0]);
        o->sync(ctx);
    }
    void **evs[] = {&f->ev_compute, &f->ev_d2h[0], &f->ev_d2h[1], &f->ev_h2d[0], &f->ev_h2d[1]};
    for (size_t i = 0; i < sizeof evs / sizeof *evs; i++) {
        if (*evs[i]) o->event_destroy(ctx, *evs[i]);
        *evs[i] = NULL;
    }
    if (f->host) o->free_host(ctx, f->host);
    f->host = NULL;
    free(f->slot_at);
    f->slot_at = NULL;
    f->d2h_pending[0] = f->d2h_pending[1] = false;
}

static char *dev_range(const struct mt_model *m, int l)
{
    return m->off.mem[l % 2];
}

static char *host_range(const struct mt_model *m, int l)
{
    return (char *)m->off.host + m->off.slot_at[m->off.slot] + m->off.host_at[l];
}

/* The copy stream waits for what the compute stream has queued so far. */
static void copy_after_compute(const struct mt_model *m)
{
    const struct mt_kernel_ops *o = &m->k->op;
    o->event_record(m->k->ctx, m->off.ev_compute, MT_STREAM_COMPUTE);
    o->event_wait(m->k->ctx, MT_STREAM_COPY, m->off.ev_compute);
}

void mt_offload_acquire(const struct mt_pass *p, int l)
{
    struct mt_model *m = p->m;
    const int h = l % 2;
    if (l < m->l0 || l >= m->l1 || !m->off.bytes[l] || !m->off.d2h_pending[h]) return;
    p->o->event_wait(p->ctx, MT_STREAM_COMPUTE, m->off.ev_d2h[h]);
    m->off.d2h_pending[h] = false;
}

void mt_offload_store(const struct mt_pass *p, int l)
{
    struct mt_model *m = p->m;
    const size_t n = m->off.bytes[l];
    if (!n || !p->train || p->recompute) return;
    const int h = l % 2;
    copy_after_compute(m);
    p->o->copy_async(p->ctx, host_range(m, l), dev_range(m, l), n);
    p->o->event_record(p->ctx, m->off.ev_d2h[h], MT_STREAM_COPY);
    m->off.d2h_pending[h] = true;
    p->st->offload_d2h_bytes += (long long)n;
}

void mt_offload_load(const struct mt_pass *p, int l)
{
    struct mt_model *m = p->m;
    const size_t n = m->off.bytes[l];
    if (!n) return;
    const int h = l % 2;
    copy_after_compute(m);
    p->o->copy_async(p->ctx, dev_range(m, l), host_range(m, l), n);
    p->o->event_record(p->ctx, m->off.ev_h2d[h], MT_STREAM_COPY);
    p->st->offload_h2d_bytes += (long long)n;
}

void mt_offload_wait(const struct mt_pass *p, int l)
{
    struct mt_model *m = p->m;
    if (!m->off.bytes[l]) return;
    const int h = l % 2;
    p->o->event_wait(p->ctx, MT_STREAM_COMPUTE, m->off.ev_h2d[h]);
    /* the copy back follows every copy out of this half on the copy stream */
    m->off.d2h_pending[h] = false;
}

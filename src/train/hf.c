/* Hugging Face directories (doc/checkpoints.md): `moetrain export-hf` writes one from a
 * checkpoint, checkpoint%load_hf starts a run from one.
 *
 * A directory: config.json, model.safetensors.index.json ({"metadata": {"total_size"},
 * "weight_map": {tensor: file}}) and model-0000K-of-0000N.safetensors (or one
 * model.safetensors). Three architectures, as the transformers library names their
 * tensors (what its save_pretrained writes; it loads the same names):
 *
 *   Qwen3MoeForCausalLM  (qwen3_moe)  moetrain's names; the experts of layer L one
 *                        tensor each, model.layers.L.mlp.experts.E.gate_proj.weight
 *                        [F, H] (up_proj [F, H], down_proj [H, F]) where moetrain stacks
 *                        them ([E, F, H]); dense layers are mlp_only_layers
 *   MixtralForCausalLM   (mixtral)    the same but for the MoE block:
 *                        model.layers.L.block_sparse_moe.gate.weight (the router) and
 *                        block_sparse_moe.experts.E.w1 / w3 / w2.weight (gate, up, down)
 *   Qwen3ForCausalLM     (qwen3)      moetrain's names (every layer dense)
 *
 * Export streams: each tensor is read from the checkpoint a block of rows at a time
 * (the checkpoint reader checks their checksums), converted, written. Loading builds
 * an index of the safetensors files (every tensor a whole slice, an expert a slice of
 * moetrain's stacked tensor) and each rank reads what overlaps its shards. Loading also
 * takes the experts fused as transformers holds them in memory (both families):
 * model.layers.L.mlp.experts.gate_up_proj [E, 2F, H] (each expert's gate rows, then its
 * up rows) and mlp.experts.down_proj [E, H, F]. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "runtime/cli_end.h"
#include "train/ckpt_shard.h"
#include "train/train.h"
#include "util/json.h"

#define HF_CONFIG "config.json"
#define HF_INDEX "model.safetensors.index.json"
#define HF_SINGLE "model.safetensors"

enum family { QWEN3_MOE, MIXTRAL, QWEN3 };
static const char *const arch_names[3] = {"Qwen3MoeForCausalLM", "MixtralForCausalLM",
                                          "Qwen3ForCausalLM"};
static const char *const model_types[3] = {"qwen3_moe", "mixtral", "qwen3"};
static const char *const kinds[3] = {"gate_proj", "up_proj", "down_proj"};
static const char *const mixtral_kinds[3] = {"w1", "w3", "w2"};

static int num_moe_layers(const struct mt_config *c)
{
    int n = 0;
    for (int l = 0; l < c->model.num_layers; l++) n += c->moe.num_experts > 0 && c->moe.layer_freq[l];
    return n;
}

/* The architecture that holds a model of configuration c exactly, or why none does. */
static int family_of(const struct mt_config *c, enum family *f, struct mt_err *err)
{
    const struct mt_config_moe *e = &c->moe;
    const int nmoe = num_moe_layers(c);
    static const char *const writes =
        "export-hf writes Qwen3MoeForCausalLM, MixtralForCausalLM and Qwen3ForCausalLM";
    if (nmoe == 0) {
        if (!c->model.qk_layernorm)
            return mt_err_set(err, MT_EUNSUPPORTED,
                              "export-hf: a dense model without model%%qk_layernorm is not "
                              "Qwen3 (whose attention normalises q and k per head); %s",
                              writes);
        *f = QWEN3;
        return MT_OK;
    }
    if (strcmp(e->router_score_function, "softmax"))
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "export-hf: moe%%router_score_function = '%s', but the Qwen3-MoE and "
                          "Mixtral routers take a softmax over the experts",
                          e->router_score_function);
    if (e->router_enable_expert_bias)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "export-hf: moe%%router_enable_expert_bias = .true.: the expert bias "
                          "changes which experts a token goes to, and the Qwen3-MoE and "
                          "Mixtral routers have none");
    if (e->router_topk_scaling_factor != 1.0)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "export-hf: moe%%router_topk_scaling_factor = %g, but the Qwen3-MoE "
                          "and Mixtral routers do not scale the routing weights",
                          e->router_topk_scaling_factor);
    if (e->shared_expert_intermediate_size)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "export-hf: moe%%shared_expert_intermediate_size = %d: Qwen3-MoE and "
                          "Mixtral have no shared expert",
                          e->shared_expert_intermediate_size);
    if (c->model.qk_layernorm) {
        *f = QWEN3_MOE;
        return MT_OK;
    }
    /* without QK-norm: Mixtral, which is MoE in every layer and renormalises the top-k */
    for (int l = 0; l < c->model.num_layers; l++)
        if (!e->layer_freq[l])
            return mt_err_set(err, MT_EUNSUPPORTED,
                              "export-hf: without model%%qk_layernorm the model would be "
                              "Mixtral, which has an MoE block in every layer, but "
                              "moe%%layer_freq(%d) = 0 (Qwen3-MoE, which has dense layers, "
                              "normalises q and k: model%%qk_layernorm = .true.)",
                              l + 1);
    if (e->router_pre_softmax)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "export-hf: without model%%qk_layernorm the model would be Mixtral, "
                          "whose router renormalises the top-k probabilities, but "
                          "moe%%router_pre_softmax = .true. does not");
    *f = MIXTRAL;
    return MT_OK;
}

/* ---- names ------------------------------------------------------------------------ */

/* The Hugging Face name of moetrain tensor name (expert e of a stacked one, else -1). */
static void hf_name(enum family f, const char *name, int e, char *out, size_t len)
{
    int l, n = 0;
    char kind[16];
    if (e >= 0 && sscanf(name, "model.layers.%d.mlp.experts.%15[a-z_]%n", &l, kind, &n) == 2 &&
        !name[n]) {
        if (f == MIXTRAL) {
            int k = !strcmp(kind, "gate_proj") ? 0 : !strcmp(kind, "up_proj") ? 1 : 2;
            snprintf(out, len, "model.layers.%d.block_sparse_moe.experts.%d.%s.weight", l, e,
                     mixtral_kinds[k]);
        } else {
            snprintf(out, len, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, kind);
        }
        return;
    }
    if (f == MIXTRAL && sscanf(name, "model.layers.%d.mlp.gate.weight%n", &l, &n) == 1 && !name[n]) {
        snprintf(out, len, "model.layers.%d.block_sparse_moe.gate.weight", l);
        return;
    }
    snprintf(out, len, "%s", name);
}

/* The moetrain tensor a Hugging Face name is (or is a part of: *expert >= 0 for an
 * expert of a stacked tensor). */
static void moetrain_name(const char *hf, char *out, size_t len, int *expert)
{
    int l, e, w, n = 0;
    char kind[16];
    *expert = -1;
    if (sscanf(hf, "model.layers.%d.mlp.experts.%d.%15[a-z_].weight%n", &l, &e, kind, &n) == 3 &&
        !hf[n] && l >= 0 && e >= 0) {
        for (int k = 0; k < 3; k++)
            if (!strcmp(kind, kinds[k])) {
                snprintf(out, len, "model.layers.%d.mlp.experts.%s", l, kinds[k]);
                *expert = e;
                return;
            }
    }
    n = 0;
    if (sscanf(hf, "model.layers.%d.block_sparse_moe.experts.%d.w%d.weight%n", &l, &e, &w, &n) ==
            3 && !hf[n] && l >= 0 && e >= 0 && w >= 1 && w <= 3) {
        static const int kind_of_w[4] = {0, 0, 2, 1};
        snprintf(out, len, "model.layers.%d.mlp.experts.%s", l, kinds[kind_of_w[w]]);
        *expert = e;
        return;
    }
    n = 0;
    if (sscanf(hf, "model.layers.%d.block_sparse_moe.gate.weight%n", &l, &n) == 1 && !hf[n]) {
        snprintf(out, len, "model.layers.%d.mlp.gate.weight", l);
        return;
    }
    snprintf(out, len, "%s", hf);
}

/* ---- config.json -------------------------------------------------------------------- */

/* A real in JSON, the shortest text that reads back as the same double, with a point. */
static void json_real(FILE *f, double v)
{
    char buf[64];
    for (int p = 15; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, v);
        if (strtod(buf, NULL) == v) break;
    }
    if (!strpbrk(buf, ".eE")) strcat(buf, ".0");
    fputs(buf, f);
}

static void write_config(FILE *f, const struct mt_config *c, enum family fam, int dtype)
{
    const struct mt_config_model *m = &c->model;
    const struct mt_config_moe *e = &c->moe;
    fprintf(f, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n", arch_names[fam],
            model_types[fam]);
    fprintf(f, "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n",
            m->vocab_size, m->hidden_size, m->num_layers);
    fprintf(f, "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": "
            "%d,\n", m->num_attention_heads, m->num_query_groups, m->kv_channels);
    fprintf(f, "  \"intermediate_size\": %d,\n",
            fam == MIXTRAL ? e->moe_ffn_hidden_size : m->ffn_hidden_size);
    fputs("  \"hidden_act\": \"silu\",\n  \"rms_norm_eps\": ", f);
    json_real(f, m->norm_epsilon);
    fputs(",\n  \"rope_theta\": ", f);
    json_real(f, m->rotary_base);
    fputs(",\n  \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": ", f);
    json_real(f, m->rotary_base);
    fprintf(f, "},\n  \"max_position_embeddings\": %d,\n  \"tie_word_embeddings\": %s,\n",
            m->max_position_embeddings,
            m->untie_embeddings_and_output_weights ? "false" : "true");
    fputs("  \"initializer_range\": ", f);
    json_real(f, m->init_method_std);
    fputs(",\n  \"attention_dropout\": 0.0,\n  \"sliding_window\": null,\n", f);
    if (fam != MIXTRAL) fputs("  \"attention_bias\": false,\n  \"use_sliding_window\": false,\n", f);
    if (fam == QWEN3) fprintf(f, "  \"max_window_layers\": %d,\n", m->num_layers);
    if (fam == QWEN3_MOE) {
        fprintf(f, "  \"num_experts\": %d,\n  \"moe_intermediate_size\": %d,\n", e->num_experts,
                e->moe_ffn_hidden_size);
        fputs("  \"decoder_sparse_step\": 1,\n  \"mlp_only_layers\": [", f);
        for (int l = 0, first = 1; l < m->num_layers; l++)
            if (!e->layer_freq[l]) {
                fprintf(f, "%s%d", first ? "" : ", ", l);
                first = 0;
            }
        fprintf(f, "],\n  \"norm_topk_prob\": %s,\n", e->router_pre_softmax ? "false" : "true");
    }
    if (fam == MIXTRAL)
        fprintf(f, "  \"num_local_experts\": %d,\n  \"router_jitter_noise\": 0.0,\n",
                e->num_experts);
    if (fam != QWEN3) {
        fprintf(f, "  \"num_experts_per_tok\": %d,\n  \"output_router_logits\": false,\n"
                "  \"router_aux_loss_coef\": ", e->router_topk);
        json_real(f, e->aux_loss_coeff);
        fputs(",\n", f);
    }
    const char *dt = dtype == MT_HF_BF16 ? "bfloat16" : "float32";
    fprintf(f, "  \"torch_dtype\": \"%s\",\n  \"dtype\": \"%s\",\n  \"use_cache\": true\n}\n", dt,
            dt);
}

/* The whole of a small file (config.json, the index, a header), NUL-terminated. */
static int slurp(const char *path, size_t max, char **text, size_t *len, struct mt_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return mt_err_errno(err, "cannot open '%s'", path);
    struct stat sb;
    int rc = MT_OK;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode) || (size_t)sb.st_size > max)
        rc = mt_err_set(err, MT_ECORRUPT, "'%s' is not a regular file of at most %zu bytes", path,
                        max);
    else if (!(*text = malloc((size_t)sb.st_size + 1)))
        rc = mt_err_set(err, MT_ENOMEM, "out of memory reading '%s'", path);
    else if (fread(*text, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size)
        rc = mt_err_errno(err, "reading '%s' failed", path);
    fclose(f);
    if (rc) {
        free(*text);
        *text = NULL;
        return rc;
    }
    (*text)[sb.st_size] = '\0';
    *len = (size_t)sb.st_size;
    return MT_OK;
}

/* Checking config.json against the run's configuration: every difference names the
 * config.json key, its value, and the namelist key. */
struct cfgcheck {
    const char *path;
    const struct mt_json *root;
    struct mt_err *err;
};

static int differs_int(const struct cfgcheck *k, const char *key, long long hf, long long mt,
                       const char *mkey)
{
    return mt_err_set(k->err, MT_EINVAL,
                      "checkpoint%%load_hf: '%s' has %s = %lld but %s = %lld (the model's "
                      "shape must be the checkpoint's: set %s = %lld, or load another "
                      "directory)",
                      k->path, key, hf, mkey, mt, mkey, hf);
}

/* An integer key: present (or its default when def >= 0) and equal to mt. */
static int want_int(const struct cfgcheck *k, const char *key, long long def, long long mt,
                    const char *mkey)
{
    const struct mt_json *v = mt_json_get(k->root, key);
    long long x;
    if (!v && def >= 0) x = def;
    else if (!mt_json_int(v, 0, (long long)1 << 40, &x))
        return mt_err_set(k->err, MT_EINVAL,
                          "checkpoint%%load_hf: '%s' has no integer %s (it must be %lld, "
                          "%s)",
                          k->path, key, mt, mkey);
    return x == mt ? MT_OK : differs_int(k, key, x, mt, mkey);
}

static int want_real(const struct cfgcheck *k, const struct mt_json *v, const char *key, double def,
                     double mt, const char *mkey)
{
    double x = def;
    if (v && v->type == MT_JSON_NUMBER) x = v->number;
    else if (v && v->type != MT_JSON_NULL)
        return mt_err_set(k->err, MT_EINVAL, "checkpoint%%load_hf: '%s': %s is not a number",
                          k->path, key);
    if (x == mt) return MT_OK;
    return mt_err_set(k->err, MT_EINVAL,
                      "checkpoint%%load_hf: '%s' has %s = %.17g but %s = %.17g (set %s = %.17g)",
                      k->path, key, x, mkey, mt, mkey, x);
}

static bool json_bool(const struct mt_json *v, bool def)
{
    return v && v->type == MT_JSON_BOOL ? v->boolean : def;
}

static int want_bool(const struct cfgcheck *k, const char *key, bool def, bool want,
                     const char *why)
{
    const struct mt_json *v = mt_json_get(k->root, key);
    bool x = json_bool(v, def);
    if (x == want) return MT_OK;
    return mt_err_set(k->err, MT_EINVAL, "checkpoint%%load_hf: '%s' has %s = %s but %s", k->path,
                      key, x ? "true" : "false", why);
}

static int check_config(const char *dir, const struct mt_json *root, const struct mt_config *c,
                        struct mt_err *err)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, HF_CONFIG);
    struct cfgcheck k = {path, root, err};
    const struct mt_config_model *m = &c->model;
    const struct mt_config_moe *e = &c->moe;
    const struct mt_json *mt = mt_json_get(root, "model_type");
    int fam = -1;
    for (int i = 0; i < 3 && mt && mt->type == MT_JSON_STRING; i++)
        if (!strcmp(mt->string, model_types[i])) fam = i;
    if (fam < 0)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "checkpoint%%load_hf: '%s' has model_type %s%s%s; moetrain loads "
                          "qwen3_moe (Qwen3MoeForCausalLM), mixtral (MixtralForCausalLM) and "
                          "qwen3 (Qwen3ForCausalLM)",
                          path, mt && mt->type == MT_JSON_STRING ? "'" : "",
                          mt && mt->type == MT_JSON_STRING ? mt->string : "(none)",
                          mt && mt->type == MT_JSON_STRING ? "'" : "");
    const bool upcycle = e->use_upcycling;
    const int nmoe = num_moe_layers(c);
    if (upcycle && fam != QWEN3)
        return mt_err_set(err, MT_EINVAL,
                          "checkpoint%%load_hf: '%s' is a %s model, but moe%%use_upcycling "
                          "starts from a dense one (model_type qwen3)",
                          path, model_types[fam]);
    if (!upcycle && fam == QWEN3 && nmoe)
        return mt_err_set(err, MT_EINVAL,
                          "checkpoint%%load_hf: '%s' is a dense model (model_type qwen3) but "
                          "this model has %d MoE layers: set moe%%num_experts = 0, or "
                          "moe%%use_upcycling = .true. to make its experts copies of the dense "
                          "MLP",
                          path, nmoe);
    if (fam != QWEN3 && nmoe == 0)
        return mt_err_set(err, MT_EINVAL,
                          "checkpoint%%load_hf: '%s' is an MoE model (model_type %s) but this "
                          "model has no MoE layer: set moe%%num_experts and moe%%layer_freq",
                          path, model_types[fam]);
    const struct mt_json *act = mt_json_get(root, "hidden_act");
    if (act && (act->type != MT_JSON_STRING || strcmp(act->string, "silu")))
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "checkpoint%%load_hf: '%s' has hidden_act %s; moetrain's MLPs are "
                          "SwiGLU (silu)",
                          path, act->type == MT_JSON_STRING ? act->string : "(not a string)");
    MT_CHECK(want_bool(&k, "attention_bias", false, false,
                       "moetrain's attention projections have no bias"));
    MT_CHECK(want_int(&k, "hidden_size", -1, m->hidden_size, "model%hidden_size"));
    MT_CHECK(want_int(&k, "num_hidden_layers", -1, m->num_layers, "model%num_layers"));
    MT_CHECK(want_int(&k, "num_attention_heads", -1, m->num_attention_heads,
                      "model%num_attention_heads"));
    const struct mt_json *heads = mt_json_get(root, "num_attention_heads");
    MT_CHECK(want_int(&k, "num_key_value_heads", heads && heads->is_int ? heads->integer : -1,
                      m->num_query_groups, "model%num_query_groups"));
    MT_CHECK(want_int(&k, "head_dim",
                      heads && heads->is_int && heads->integer > 0
                          ? m->hidden_size / heads->integer : -1,
                      m->kv_channels, "model%kv_channels"));
    MT_CHECK(want_int(&k, "vocab_size", -1, m->vocab_size, "model%vocab_size"));
    const bool tied = json_bool(mt_json_get(root, "tie_word_embeddings"), false);
    if (tied == m->untie_embeddings_and_output_weights)
        return mt_err_set(err, MT_EINVAL,
                          "checkpoint%%load_hf: '%s' has tie_word_embeddings = %s but "
                          "model%%untie_embeddings_and_output_weights = %s (set it to %s)",
                          path, tied ? "true" : "false",
                          m->untie_embeddings_and_output_weights ? ".true." : ".false.",
                          tied ? ".false." : ".true.");
    if ((fam == MIXTRAL) == m->qk_layernorm)
        return mt_err_set(err, MT_EINVAL,
                          "checkpoint%%load_hf: '%s' is %s, whose attention %s q and k, but "
                          "model%%qk_layernorm = %s (set it to %s)",
                          path, model_types[fam], fam == MIXTRAL ? "does not normalise" : "normalises",
                          m->qk_layernorm ? ".true." : ".false.",
                          m->qk_layernorm ? ".false." : ".true.");
    MT_CHECK(want_real(&k, mt_json_get(root, "rms_norm_eps"), "rms_norm_eps",
                       fam == MIXTRAL ? 1e-5 : 1e-6, m->norm_epsilon, "model%norm_epsilon"));
    /* RoPE: rope_parameters (newer transformers) or rope_theta and rope_scaling */
    const struct mt_json *rp = mt_json_get(root, "rope_parameters");
    const struct mt_json *rs = mt_json_get(root, "rope_scaling");
    const struct mt_json *rt = rp ? mt_json_get(rp, "rope_type") : NULL;
    if (!rt && rs && rs->type == MT_JSON_OBJECT) rt = mt_json_get(rs, "rope_type");
    if (!rt && rs && rs->type == MT_JSON_OBJECT) rt = mt_json_get(rs, "type");
    if (rt && (rt->type != MT_JSON_STRING || strcmp(rt->string, "default")))
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "checkpoint%%load_hf: '%s' has a RoPE of type %s; moetrain's RoPE is "
                          "the default one (no scaling)",
                          path, rt->type == MT_JSON_STRING ? rt->string : "(not a string)");
    const struct mt_json *theta = rp ? mt_json_get(rp, "rope_theta") : NULL;
    if (!theta) theta = mt_json_get(root, "rope_theta");
    MT_CHECK(want_real(&k, theta, "rope_theta", fam == MIXTRAL ? 1e6 : 1e4, m->rotary_base,
                       "model%rotary_base"));
    if (json_bool(mt_json_get(root, "use_sliding_window"), false))
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "checkpoint%%load_hf: '%s' has use_sliding_window = true; moetrain's "
                          "attention is full causal attention",
                          path);
    const struct mt_json *sw = mt_json_get(root, "sliding_window");
    if (fam == MIXTRAL && sw && sw->type == MT_JSON_NUMBER && sw->number < c->training.seq_length)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "checkpoint%%load_hf: '%s' has sliding_window = %g, shorter than "
                          "training%%seq_length = %d; moetrain's attention is full causal "
                          "attention",
                          path, sw->number, c->training.seq_length);
    if (fam == QWEN3) {
        /* the dense MLP: the model's dense layers, and with upcycling every expert */
        if (nmoe < m->num_layers)
            MT_CHECK(want_int(&k, "intermediate_size", -1, m->ffn_hidden_size,
                              "model%ffn_hidden_size"));
        if (upcycle)
            MT_CHECK(want_int(&k, "intermediate_size", -1, e->moe_ffn_hidden_size,
                              "moe%moe_ffn_hidden_size (moe%use_upcycling copies the dense MLP "
                              "into every expert: Megatron's default upcycling needs the "
                              "expert width to be the dense one)"));
        return MT_OK;
    }
    /* MoE */
    const struct mt_json *ne = mt_json_get(root, fam == MIXTRAL ? "num_local_experts" : "num_experts");
    if (!ne) ne = mt_json_get(root, fam == MIXTRAL ? "num_experts" : "num_local_experts");
    long long x;
    if (!mt_json_int(ne, 0, 1 << 30, &x))
        return mt_err_set(err, MT_EINVAL, "checkpoint%%load_hf: '%s' has no number of experts",
                          path);
    if (x != e->num_experts)
        return differs_int(&k, fam == MIXTRAL ? "num_local_experts" : "num_experts", x,
                           e->num_experts, "moe%num_experts");
    MT_CHECK(want_int(&k, "num_experts_per_tok", -1, e->router_topk, "moe%router_topk"));
    if (strcmp(e->router_score_function, "softmax"))
        return mt_err_set(err, MT_EINVAL,
                          "checkpoint%%load_hf: '%s' is %s, whose router takes a softmax, but "
                          "moe%%router_score_function = '%s' (set it to 'softmax')",
                          path, model_types[fam], e->router_score_function);
    if (e->shared_expert_intermediate_size)
        return mt_err_set(err, MT_EINVAL,
                          "checkpoint%%load_hf: '%s' (%s) has no shared expert but "
                          "moe%%shared_expert_intermediate_size = %d (set it to 0)",
                          path, model_types[fam], e->shared_expert_intermediate_size);
    if (fam == MIXTRAL) {
        MT_CHECK(want_int(&k, "intermediate_size", -1, e->moe_ffn_hidden_size,
                          "moe%moe_ffn_hidden_size"));
        if (e->router_pre_softmax)
            return mt_err_set(err, MT_EINVAL,
                              "checkpoint%%load_hf: '%s' is mixtral, whose router renormalises "
                              "the top-k probabilities, but moe%%router_pre_softmax = .true. "
                              "(set it to .false.)",
                              path);
        for (int l = 0; l < m->num_layers; l++)
            if (!e->layer_freq[l])
                return mt_err_set(err, MT_EINVAL,
                                  "checkpoint%%load_hf: '%s' is mixtral, MoE in every layer, "
                                  "but moe%%layer_freq(%d) = 0",
                                  path, l + 1);
        return MT_OK;
    }
    MT_CHECK(want_int(&k, "moe_intermediate_size", -1, e->moe_ffn_hidden_size,
                      "moe%moe_ffn_hidden_size"));
    if (nmoe < m->num_layers)
        MT_CHECK(want_int(&k, "intermediate_size", -1, m->ffn_hidden_size,
                          "model%ffn_hidden_size"));
    MT_CHECK(want_bool(&k, "norm_topk_prob", false, !e->router_pre_softmax,
                       e->router_pre_softmax
                           ? "moe%router_pre_softmax = .true. (no renormalisation): set it to "
                             ".false."
                           : "moe%router_pre_softmax = .false. renormalises the top-k "
                             "probabilities: set it to .true."));
    /* which layers are MoE: decoder_sparse_step and mlp_only_layers */
    long long step = 1;
    const struct mt_json *st = mt_json_get(root, "decoder_sparse_step");
    if (st && !mt_json_int(st, 1, 1 << 30, &step))
        return mt_err_set(err, MT_EINVAL,
                          "checkpoint%%load_hf: '%s': decoder_sparse_step is not a positive "
                          "integer",
                          path);
    const struct mt_json *only = mt_json_get(root, "mlp_only_layers");
    for (int l = 0; l < m->num_layers; l++) {
        bool moe = (l + 1) % step == 0;
        for (size_t i = 0; only && only->type == MT_JSON_ARRAY && i < only->n; i++)
            if (only->items[i].is_int && only->items[i].integer == l) moe = false;
        if (moe != (e->layer_freq[l] != 0))
            return mt_err_set(err, MT_EINVAL,
                              "checkpoint%%load_hf: '%s' makes layer %d %s (decoder_sparse_step "
                              "= %lld, mlp_only_layers) but moe%%layer_freq(%d) = %d",
                              path, l, moe ? "an MoE layer" : "dense", step, l + 1,
                              e->layer_freq[l]);
    }
    return MT_OK;
}

/* ---- reading a directory's tensors into an index ------------------------------------ */

static int dtype_of(const char *s, enum mt_shard_dtype *dt, size_t *elem)
{
    if (!strcmp(s, "F32")) {
        *dt = MT_SHARD_F32;
        *elem = 4;
        return MT_OK;
    }
    if (!strcmp(s, "BF16")) {
        *dt = MT_SHARD_BF16;
        *elem = 2;
        return MT_OK;
    }
    return MT_EUNSUPPORTED;
}

/* What a load has seen of the model's tensors: per tensor how many times it was given
 * (per expert for a stacked one). */
struct seen {
    const struct mt_model *m;
    int nt;
    int *count;          /* per tensor (not stacked) */
    unsigned char **exp; /* per stacked tensor: per expert */
};

static void seen_free(struct seen *s)
{
    for (int i = 0; s->exp && i < s->nt; i++) free(s->exp[i]);
    free(s->exp);
    free(s->count);
}

/* A fused expert tensor of layer l (at byte `at` of file): gate_up_proj [E, 2F, H],
 * each expert's gate rows then its up rows, or down_proj [E, H, F]; per expert a slice
 * of moetrain's stacked gate, up or down tensor. */
static int index_fused(struct mt_shard_index *ix, const char *dir, const char *path,
                       const char *file, const char *key, int l, bool gate_up, int nd,
                       const long long *shape, uint64_t at, enum mt_shard_dtype sdt,
                       size_t elem, struct seen *sn, struct mt_err *err)
{
    const int nk = gate_up ? 2 : 1;
    const int kind[2] = {gate_up ? 0 : 2, 1};
    int ti[2];
    const struct mt_param_info *p[2];
    for (int k = 0; k < nk; k++) {
        char name[320];
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s", l, kinds[kind[k]]);
        ti[k] = mt_ckpt_tensor_index(sn->m, name);
        p[k] = ti[k] >= 0 ? mt_model_tensor(sn->m, ti[k]) : NULL;
        if (!p[k] || p[k]->ndim != 3)
            return mt_err_set(err, MT_EINVAL,
                              "checkpoint%%load_hf: '%s' holds tensor '%s', which this model "
                              "does not have (layer %d has no routed experts: moe%%layer_freq "
                              "and moe%%num_experts decide its tensors)",
                              path, key, l);
    }
    const long long E = p[0]->shape[0], rows = p[0]->shape[1], cols = p[0]->shape[2];
    const long long want[3] = {E, nk * rows, cols};
    if (nd != 3 || shape[0] != want[0] || shape[1] != want[1] || shape[2] != want[2]) {
        char w[96], h[96];
        mt_shard_dims_text(3, want, w, sizeof w);
        mt_shard_dims_text(nd, shape, h, sizeof h);
        return mt_err_set(err, MT_EINVAL,
                          "checkpoint%%load_hf: tensor '%s' is %s in '%s' but %s in this model",
                          key, h, path, w);
    }
    const uint64_t part = (uint64_t)rows * (uint64_t)cols * elem;
    for (long long e = 0; e < E; e++)
        for (int k = 0; k < nk; k++) {
            if (sn->exp[ti[k]][e]++)
                return mt_err_set(err, MT_ECORRUPT,
                                  "checkpoint%%load_hf: '%s' holds expert %lld of '%s' twice "
                                  "(fused in '%s' and one tensor per expert)",
                                  dir, e, p[k]->name, key);
            long long start[4] = {e, 0, 0, 0}, box[4] = {1, rows, cols, 0};
            MT_CHECK(mt_shard_index_add(ix, p[k]->name, 3, p[k]->shape, start, box, file,
                                        at + ((uint64_t)e * (uint64_t)nk + (uint64_t)k) * part,
                                        sdt, err));
        }
    return MT_OK;
}

/* One safetensors file's tensors into ix. */
static int index_file(struct mt_shard_index *ix, const char *dir, const char *file,
                      const struct mt_config *c, struct seen *sn, struct mt_err *err)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "rb");
    if (!f) return mt_err_errno(err, "checkpoint%%load_hf: cannot open '%s'", path);
    struct stat sb;
    uint64_t hlen = 0;
    int rc = MT_OK;
    char *text = NULL;
    if (fstat(fileno(f), &sb) != 0 || fread(&hlen, 8, 1, f) != 1 ||
        hlen > (uint64_t)sb.st_size - 8 || hlen > ((uint64_t)1 << 30))
        rc = mt_err_set(err, MT_ECORRUPT,
                        "checkpoint%%load_hf: '%s' is not a safetensors file (its header "
                        "length is missing or too large)",
                        path);
    else if (!(text = malloc(hlen + 1)))
        rc = mt_err_set(err, MT_ENOMEM, "checkpoint%%load_hf: out of memory");
    else if (fread(text, 1, hlen, f) != hlen)
        rc = mt_err_errno(err, "checkpoint%%load_hf: reading '%s' failed", path);
    fclose(f);
    struct mt_json *root = NULL;
    char what[4500];
    snprintf(what, sizeof what, "the safetensors header of '%s'", path);
    if (rc == MT_OK) rc = mt_json_parse(text, hlen, what, &root, err);
    free(text);
    const uint64_t data0 = 8 + hlen, size = (uint64_t)sb.st_size;
    for (size_t i = 0; rc == MT_OK && root && i < root->n; i++) {
        const char *key = root->keys[i];
        if (!strcmp(key, "__metadata__")) continue;
        const struct mt_json *t = &root->items[i];
        const struct mt_json *dt = mt_json_get(t, "dtype"), *sh = mt_json_get(t, "shape");
        const struct mt_json *off = mt_json_get(t, "data_offsets");
        long long a, b, shape[4] = {0};
        int nd = 0;
        bool ok = dt && dt->type == MT_JSON_STRING && sh && sh->type == MT_JSON_ARRAY &&
                  sh->n >= 1 && sh->n <= 4 && off && off->type == MT_JSON_ARRAY && off->n == 2 &&
                  mt_json_int(&off->items[0], 0, INT64_MAX, &a) &&
                  mt_json_int(&off->items[1], a, INT64_MAX, &b);
        for (size_t d = 0; ok && d < sh->n; d++)
            ok = mt_json_int(&sh->items[d], 0, (long long)1 << 40, &shape[nd++]);
        if (!ok) {
            rc = mt_err_set(err, MT_ECORRUPT,
                            "checkpoint%%load_hf: '%s': the header entry of '%s' lacks a dtype, "
                            "shape or data_offsets",
                            path, key);
            break;
        }
        enum mt_shard_dtype sdt;
        size_t elem;
        if (dtype_of(dt->string, &sdt, &elem)) {
            rc = mt_err_set(err, MT_EUNSUPPORTED,
                            "checkpoint%%load_hf: tensor '%s' in '%s' has dtype %s; moetrain "
                            "loads F32 and BF16 tensors (convert the checkpoint, e.g. with "
                            "transformers: model.to(torch.bfloat16).save_pretrained(...))",
                            key, path, dt->string);
            break;
        }
        size_t numel = 1;
        for (int d = 0; d < nd; d++) numel *= (size_t)shape[d];
        if ((uint64_t)(b - a) != numel * elem || data0 + (uint64_t)b > size) {
            rc = mt_err_set(err, MT_ECORRUPT,
                            "checkpoint%%load_hf: '%s': the data of tensor '%s' (bytes %lld..%lld "
                            "of its data) does not fit its shape or lies past the end of the file "
                            "(a truncated file?)",
                            path, key, a, b);
            break;
        }
        /* transformers' fused experts (save_pretrained(save_original_format=False)):
         * each expert's gate and up halves of gate_up_proj, and the stacked down_proj */
        int fl, fn = 0;
        char fkind[16];
        if (sscanf(key, "model.layers.%d.mlp.experts.%15[a-z_]%n", &fl, fkind, &fn) == 2 &&
            !key[fn] && (!strcmp(fkind, "gate_up_proj") || !strcmp(fkind, "down_proj"))) {
            rc = index_fused(ix, dir, path, file, key, fl, !strcmp(fkind, "gate_up_proj"), nd,
                             shape, data0 + (uint64_t)a, sdt, elem, sn, err);
            continue;
        }
        char name[320];
        int e;
        moetrain_name(key, name, sizeof name, &e);
        /* a tied model's output layer is its embedding: a copy some writers keep */
        if (!strcmp(name, "lm_head.weight") && !c->model.untie_embeddings_and_output_weights)
            continue;
        const int ti = mt_ckpt_tensor_index(sn->m, name);
        const struct mt_param_info *p = ti >= 0 ? mt_model_tensor(sn->m, ti) : NULL;
        char want[96], have[96];
        mt_shard_dims_text(nd, shape, have, sizeof have);
        if (!p && e < 0 && c->moe.use_upcycling) {
            /* the dense MLP of a layer that upcycling makes MoE: kept for the experts */
            int l, n = 0;
            char kind[16];
            if (sscanf(name, "model.layers.%d.mlp.%15[a-z_].weight%n", &l, kind, &n) == 2 &&
                !name[n] && l >= 0 && l < c->model.num_layers) {
                long long zero[4] = {0};
                rc = mt_shard_index_add(ix, name, nd, shape, zero, shape, file,
                                        data0 + (uint64_t)a, sdt, err);
                continue;
            }
        }
        if (!p || (e >= 0) != (p->ndim == 3 && strstr(p->name, ".mlp.experts."))) {
            rc = mt_err_set(err, MT_EINVAL,
                            "checkpoint%%load_hf: '%s' holds tensor '%s', which this model does "
                            "not have (moe%%layer_freq, moe%%num_experts and model%%"
                            "untie_embeddings_and_output_weights decide its tensors)",
                            path, key);
            break;
        }
        if (e >= 0) {
            bool fits = nd == 2 && e < p->shape[0] && shape[0] == p->shape[1] &&
                        shape[1] == p->shape[2];
            if (!fits) {
                if (e >= p->shape[0])
                    rc = mt_err_set(err, MT_EINVAL,
                                    "checkpoint%%load_hf: '%s' holds expert %d ('%s') but "
                                    "moe%%num_experts = %lld",
                                    path, e, key, p->shape[0]);
                else {
                    mt_shard_dims_text(2, p->shape + 1, want, sizeof want);
                    rc = mt_err_set(err, MT_EINVAL,
                                    "checkpoint%%load_hf: tensor '%s' is %s in '%s' but %s in "
                                    "this model",
                                    key, have, path, want);
                }
                break;
            }
            if (sn->exp[ti][e]++) {
                rc = mt_err_set(err, MT_ECORRUPT, "checkpoint%%load_hf: '%s' holds tensor '%s' "
                                "twice", dir, key);
                break;
            }
            long long start[4] = {e, 0, 0, 0}, box[4] = {1, shape[0], shape[1], 0};
            rc = mt_shard_index_add(ix, name, 3, p->shape, start, box, file, data0 + (uint64_t)a,
                                    sdt, err);
            continue;
        }
        bool same = nd == p->ndim;
        for (int d = 0; same && d < nd; d++) same = shape[d] == p->shape[d];
        if (!same) {
            mt_shard_dims_text(p->ndim, p->shape, want, sizeof want);
            rc = mt_err_set(err, MT_EINVAL,
                            "checkpoint%%load_hf: tensor '%s' is %s in '%s' but %s in this model",
                            key, have, path, want);
            break;
        }
        if (sn->count[ti]++) {
            rc = mt_err_set(err, MT_ECORRUPT, "checkpoint%%load_hf: '%s' holds tensor '%s' twice",
                            dir, key);
            break;
        }
        long long zero[4] = {0};
        rc = mt_shard_index_add(ix, name, nd, shape, zero, shape, file, data0 + (uint64_t)a, sdt,
                                err);
    }
    mt_json_free(root);
    return rc;
}

/* The safetensors files of dir: those its index's weight_map names (in order of first
 * mention), or model.safetensors. */
static int list_files(const char *dir, char ***files, int *n, struct mt_err *err)
{
    char path[4400];
    *files = NULL;
    *n = 0;
    snprintf(path, sizeof path, "%s/%s", dir, HF_INDEX);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        snprintf(path, sizeof path, "%s/%s", dir, HF_SINGLE);
        if (stat(path, &sb) != 0)
            return mt_err_set(err, MT_EINVAL,
                              "checkpoint%%load_hf: '%s' has neither %s nor %s: not a Hugging "
                              "Face model directory in the safetensors format",
                              dir, HF_INDEX, HF_SINGLE);
        *files = malloc(sizeof **files);
        if (!*files || !((*files)[0] = strdup(HF_SINGLE)))
            return mt_err_set(err, MT_ENOMEM, "out of memory");
        *n = 1;
        return MT_OK;
    }
    char *text = NULL;
    size_t len;
    MT_CHECK(slurp(path, (size_t)1 << 28, &text, &len, err));
    struct mt_json *root = NULL;
    char what[4500];
    snprintf(what, sizeof what, "'%s'", path);
    int rc = mt_json_parse(text, len, what, &root, err);
    free(text);
    const struct mt_json *wm = rc == MT_OK ? mt_json_get(root, "weight_map") : NULL;
    if (rc == MT_OK && (!wm || wm->type != MT_JSON_OBJECT))
        rc = mt_err_set(err, MT_ECORRUPT, "checkpoint%%load_hf: '%s' has no weight_map", path);
    for (size_t i = 0; rc == MT_OK && i < wm->n; i++) {
        const struct mt_json *v = &wm->items[i];
        if (v->type != MT_JSON_STRING || !v->string[0] || strchr(v->string, '/')) {
            rc = mt_err_set(err, MT_ECORRUPT,
                            "checkpoint%%load_hf: '%s': the file of '%s' is not a file name in "
                            "the directory",
                            path, wm->keys[i]);
            break;
        }
        bool known = false;
        for (int j = 0; j < *n && !known; j++) known = !strcmp((*files)[j], v->string);
        if (known) continue;
        char **g = realloc(*files, sizeof *g * (size_t)(*n + 1));
        if (!g || !(g[*n] = strdup(v->string))) {
            if (g) *files = g;
            rc = mt_err_set(err, MT_ENOMEM, "out of memory");
            break;
        }
        *files = g;
        (*n)++;
    }
    mt_json_free(root);
    return rc;
}

static void free_files(char **files, int n)
{
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
}

/* The index of dir's tensors for model m, with every tensor of m there (the routers may
 * be absent only when upcycling) and nothing else; upcycled when c says so. */
static int index_dir(const char *dir, const struct mt_config *c, const struct mt_model *m,
                     enum family fam, struct mt_shard_index **out, struct mt_err *err)
{
    struct seen sn = {m, mt_model_num_tensors(m), NULL, NULL};
    sn.count = calloc((size_t)sn.nt + 1, sizeof *sn.count);
    sn.exp = calloc((size_t)sn.nt + 1, sizeof *sn.exp);
    int rc = sn.count && sn.exp ? MT_OK : mt_err_set(err, MT_ENOMEM, "out of memory");
    for (int i = 0; rc == MT_OK && i < sn.nt; i++) {
        const struct mt_param_info *t = mt_model_tensor(m, i);
        if (t->ndim == 3 && strstr(t->name, ".mlp.experts.") &&
            !(sn.exp[i] = calloc((size_t)t->shape[0], 1)))
            rc = mt_err_set(err, MT_ENOMEM, "out of memory");
    }
    char **files = NULL;
    int nfiles = 0;
    struct mt_shard_index *ix = NULL;
    if (rc == MT_OK) rc = list_files(dir, &files, &nfiles, err);
    if (rc == MT_OK) rc = mt_shard_index_new(dir, &ix, err);
    for (int i = 0; rc == MT_OK && i < nfiles; i++) rc = index_file(ix, dir, files[i], c, &sn, err);
    /* every tensor of the model (upcycling: its experts come from the dense MLP, its
     * routers from the init), named as the directory would name it */
    const bool up = c->moe.use_upcycling;
    for (int i = 0; rc == MT_OK && i < sn.nt; i++) {
        const struct mt_param_info *t = mt_model_tensor(m, i);
        char name[320];
        if (sn.exp[i] && !up) {
            for (long long e = 0; e < t->shape[0]; e++)
                if (!sn.exp[i][e]) {
                    hf_name(fam, t->name, (int)e, name, sizeof name);
                    rc = mt_err_set(err, MT_EINVAL,
                                    "checkpoint%%load_hf: '%s' has no tensor '%s' that this "
                                    "model has (moe%%num_experts = %lld)",
                                    dir, name, t->shape[0]);
                    break;
                }
        } else if (!sn.exp[i] && !sn.count[i]) {
            size_t nl = strlen(t->name), k = strlen(".mlp.gate.weight");
            if (up && nl > k && !strcmp(t->name + nl - k, ".mlp.gate.weight")) continue;
            hf_name(fam, t->name, -1, name, sizeof name);
            rc = mt_err_set(err, MT_EINVAL,
                            "checkpoint%%load_hf: '%s' has no tensor '%s' that this model has",
                            dir, name);
        }
    }
    char what[4300];
    snprintf(what, sizeof what, "checkpoint%%load_hf: '%s'", dir);
    if (rc == MT_OK && up) rc = mt_ckpt_upcycle_index(ix, m, c, what, err);
    else if (rc == MT_OK) rc = mt_shard_index_seal(ix, err);
    if (rc == MT_OK) rc = mt_ckpt_check_params(ix, m, up, what, err);
    free_files(files, nfiles);
    seen_free(&sn);
    if (rc) {
        mt_shard_index_free(ix);
        return rc;
    }
    *out = ix;
    return MT_OK;
}

/* Rank 0 reads and checks config.json; the family comes back on every rank. */
static int read_config(const char *dir, const struct mt_config *c, enum family *fam,
                       struct mt_err *err)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, HF_CONFIG);
    char *text = NULL;
    size_t len;
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return mt_err_set(err, MT_EINVAL, "checkpoint%%load_hf: '%s' is not a directory", dir);
    if (stat(path, &sb) != 0)
        return mt_err_set(err, MT_EINVAL,
                          "checkpoint%%load_hf: '%s' has no %s (a Hugging Face model directory "
                          "has one, describing the model)",
                          dir, HF_CONFIG);
    MT_CHECK(slurp(path, (size_t)1 << 24, &text, &len, err));
    struct mt_json *root = NULL;
    char what[4500];
    snprintf(what, sizeof what, "'%s'", path);
    int rc = mt_json_parse(text, len, what, &root, err);
    free(text);
    if (rc == MT_OK) rc = check_config(dir, root, c, err);
    if (rc == MT_OK) {
        const struct mt_json *mt = mt_json_get(root, "model_type");
        for (int i = 0; i < 3; i++)
            if (!strcmp(mt->string, model_types[i])) *fam = (enum family)i;
    }
    mt_json_free(root);
    return rc;
}

int mt_hf_load(const char *dir, const struct mt_config *c, struct mt_model *m,
               const struct mt_parallel *par, struct mt_ckpt_stats *stats, struct mt_err *err)
{
    mt_shard_mem_reset();
    enum family fam = QWEN3;
    /* config.json is read by every rank (a small file): the same verdict everywhere */
    int rc = read_config(dir, c, &fam, err);
    rc = mt_ckpt_agree_all(par, rc, "checking checkpoint%load_hf", err);
    if (rc) return rc;
    struct mt_shard_index *ix = NULL;
    rc = index_dir(dir, c, m, fam, &ix, err);
    rc = mt_ckpt_agree_all(par, rc, "indexing checkpoint%load_hf", err);
    if (rc == MT_OK) rc = mt_ckpt_load_params(ix, m, par, stats, err);
    mt_shard_index_free(ix);
    return rc;
}

/* ---- export ----------------------------------------------------------------------------- */

/* One tensor of the export: moetrain tensor i (expert e of a stacked one, else -1). */
struct out_tensor {
    char name[320];
    int i, e, ndim;
    long long shape[3];
    uint64_t bytes;
    int file;
};

static uint16_t bf16_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The run's configuration stored beside the checkpoint, resolved as one process. */
static int checkpoint_config(const char *iter_dir, struct mt_config *c, struct mt_err *err)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/config.nml", iter_dir);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return mt_err_set(err, MT_EINVAL,
                          "export-hf: checkpoint '%s' has no config.nml (the configuration of "
                          "the run that saved it), from which config.json is written",
                          iter_dir);
    mt_config_defaults(c);
    char *files[1] = {path};
    MT_CHECK(mt_config_load(c, 1, files, 0, NULL, err));
    struct mt_config_parallel *p = &c->parallel;
    p->tensor_model_parallel_size = p->pipeline_model_parallel_size = 1;
    p->virtual_pipeline_model_parallel_size = p->context_parallel_size = 1;
    p->expert_model_parallel_size = p->expert_tensor_parallel_size = 1;
    p->decoder_first_pipeline_num_layers = p->decoder_last_pipeline_num_layers = 0;
    p->use_distributed_optimizer = false;
    p->sequence_parallel = false;
    c->training.global_batch_size = 0;
    struct mt_layout l;
    return mt_config_resolve(c, 1, &l, err);
}

static int write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }

/* Writes the data of tensor o (converted to dtype) to f, read from ix a block of rows at
 * a time. */
static int write_tensor(FILE *f, struct mt_shard_index *ix, const struct mt_param_info *t,
                        const struct out_tensor *o, int dtype, float *buf, size_t buf_floats,
                        const char *path, struct mt_err *err)
{
    const int nd = o->ndim;
    const long long rows = o->shape[0];
    long long rowlen = 1;
    for (int d = 1; d < nd; d++) rowlen *= o->shape[d];
    long long per = (long long)buf_floats / rowlen;
    if (per < 1) per = 1;
    for (long long r0 = 0; r0 < rows; r0 += per) {
        const long long nr = rows - r0 < per ? rows - r0 : per;
        struct mt_shard_piece p;
        memset(&p, 0, sizeof p);
        snprintf(p.name, sizeof p.name, "%s", t->name);
        p.ndim = t->ndim;
        if (o->e >= 0) {
            p.start[0] = o->e;
            p.shape[0] = 1;
            p.start[1] = r0;
            p.shape[1] = nr;
            p.shape[2] = t->shape[2];
        } else {
            p.start[0] = r0;
            p.shape[0] = nr;
            for (int d = 1; d < nd; d++) p.shape[d] = t->shape[d];
        }
        const size_t n = (size_t)(nr * rowlen);
        p.hi = n;
        p.data = buf;
        MT_CHECK(mt_shard_read(ix, &p, 1, err));
        int bad;
        if (dtype == MT_HF_BF16) {
            uint16_t *h = (uint16_t *)buf;
            for (size_t j = 0; j < n; j++) h[j] = bf16_of(buf[j]);
            bad = write_all(f, h, 2 * n);
        } else {
            bad = write_all(f, buf, 4 * n);
        }
        if (bad) return mt_err_errno(err, "export-hf: writing '%s' failed", path);
    }
    return MT_OK;
}

static int sync_close(FILE *f, const char *path, struct mt_err *err)
{
    bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && !ferror(f);
    ok = fclose(f) == 0 && ok;
    return ok ? MT_OK : mt_err_errno(err, "export-hf: writing '%s' failed", path);
}

static void file_name(int k, int n, char *out, size_t len)
{
    snprintf(out, len, "model-%05d-of-%05d.safetensors", k + 1, n);
}

/* Writes the export into tmp: the shard files, the index and config.json. */
static int write_export(const char *tmp, const struct mt_config *c, enum family fam, int dtype,
                        const struct mt_model *m, struct mt_shard_index *ix,
                        struct out_tensor *ot, int n, int nfiles, struct mt_err *err)
{
    const size_t buf_floats = mt_shard_block_bytes() / sizeof(float);
    float *buf = mt_shard_malloc(sizeof(float) * buf_floats);
    if (!buf) return mt_err_set(err, MT_ENOMEM, "export-hf: out of memory");
    int rc = MT_OK;
    const char *dt = dtype == MT_HF_BF16 ? "BF16" : "F32";
    for (int k = 0; rc == MT_OK && k < nfiles; k++) {
        char name[64], path[4400];
        file_name(k, nfiles, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", tmp, name);
        /* the header */
        char *h = NULL;
        size_t hl = 0;
        FILE *mf = open_memstream(&h, &hl);
        if (!mf) {
            rc = mt_err_set(err, MT_ENOMEM, "export-hf: out of memory");
            break;
        }
        fputs("{\"__metadata__\": {\"format\": \"pt\"}", mf);
        uint64_t at = 0;
        for (int j = 0; j < n; j++) {
            if (ot[j].file != k) continue;
            fputs(", ", mf);
            mt_json_write_string(mf, ot[j].name);
            fprintf(mf, ": {\"dtype\": \"%s\", \"shape\": [", dt);
            for (int d = 0; d < ot[j].ndim; d++)
                fprintf(mf, "%s%lld", d ? ", " : "", ot[j].shape[d]);
            fprintf(mf, "], \"data_offsets\": [%" PRIu64 ", %" PRIu64 "]}", at, at + ot[j].bytes);
            at += ot[j].bytes;
        }
        fputc('}', mf);
        while (ftell(mf) % 8) fputc(' ', mf);
        if (fclose(mf) != 0) {
            free(h);
            rc = mt_err_set(err, MT_ENOMEM, "export-hf: out of memory");
            break;
        }
        FILE *f = fopen(path, "wb");
        uint64_t hl64 = hl;
        if (!f) rc = mt_err_errno(err, "export-hf: cannot create '%s'", path);
        else if (write_all(f, &hl64, 8) || write_all(f, h, hl))
            rc = mt_err_errno(err, "export-hf: writing '%s' failed", path);
        free(h);
        for (int j = 0; rc == MT_OK && j < n; j++)
            if (ot[j].file == k)
                rc = write_tensor(f, ix, mt_model_tensor(m, ot[j].i), &ot[j], dtype, buf,
                                  buf_floats, path, err);
        if (f && rc == MT_OK) rc = sync_close(f, path, err);
        else if (f) fclose(f);
    }
    mt_shard_free(buf, sizeof(float) * buf_floats);
    if (rc) return rc;
    /* model.safetensors.index.json */
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", tmp, HF_INDEX);
    FILE *f = fopen(path, "w");
    if (!f) return mt_err_errno(err, "export-hf: cannot create '%s'", path);
    uint64_t total = 0;
    for (int j = 0; j < n; j++) total += ot[j].bytes;
    fprintf(f, "{\n  \"metadata\": {\"total_size\": %" PRIu64 "},\n  \"weight_map\": {", total);
    for (int j = 0; j < n; j++) {
        char name[64];
        file_name(ot[j].file, nfiles, name, sizeof name);
        fputs(j ? ",\n    " : "\n    ", f);
        mt_json_write_string(f, ot[j].name);
        fprintf(f, ": \"%s\"", name);
    }
    fputs("\n  }\n}\n", f);
    MT_CHECK(sync_close(f, path, err));
    snprintf(path, sizeof path, "%s/%s", tmp, HF_CONFIG);
    if (!(f = fopen(path, "w"))) return mt_err_errno(err, "export-hf: cannot create '%s'", path);
    write_config(f, c, fam, dtype);
    return sync_close(f, path, err);
}

/* Removes what an export left in tmp (its own file names only) and tmp. */
static void remove_export(const char *tmp, int nfiles)
{
    char path[4400], name[64];
    for (int k = 0; k < nfiles; k++) {
        file_name(k, nfiles, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", tmp, name);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/%s", tmp, HF_INDEX);
    unlink(path);
    snprintf(path, sizeof path, "%s/%s", tmp, HF_CONFIG);
    unlink(path);
    rmdir(tmp);
}

/* The export's tensors in the model's order (experts one by one), split into files of at
 * most max bytes (a larger tensor alone in its file). */
static int plan_export(const struct mt_model *m, enum family fam, int dtype,
                       unsigned long long max, struct out_tensor **out, int *count, int *nfiles,
                       struct mt_err *err)
{
    const int nt = mt_model_num_tensors(m);
    int n = 0;
    for (int i = 0; i < nt; i++) {
        const struct mt_param_info *t = mt_model_tensor(m, i);
        n += t->ndim == 3 ? (int)t->shape[0] : 1;
    }
    struct out_tensor *ot = calloc((size_t)n + 1, sizeof *ot);
    if (!ot) return mt_err_set(err, MT_ENOMEM, "export-hf: out of memory");
    const uint64_t elem = dtype == MT_HF_BF16 ? 2 : 4;
    int j = 0, file = 0;
    uint64_t in_file = 0;
    for (int i = 0; i < nt; i++) {
        const struct mt_param_info *t = mt_model_tensor(m, i);
        const int copies = t->ndim == 3 ? (int)t->shape[0] : 1;
        for (int e = 0; e < copies; e++, j++) {
            struct out_tensor *o = &ot[j];
            o->i = i;
            o->e = t->ndim == 3 ? e : -1;
            o->ndim = t->ndim == 3 ? 2 : t->ndim;
            for (int d = 0; d < o->ndim; d++) o->shape[d] = t->shape[d + (t->ndim == 3)];
            o->bytes = elem;
            for (int d = 0; d < o->ndim; d++) o->bytes *= (uint64_t)o->shape[d];
            hf_name(fam, t->name, o->e, o->name, sizeof o->name);
            if (in_file && in_file + o->bytes > max) {
                file++;
                in_file = 0;
            }
            o->file = file;
            in_file += o->bytes;
        }
    }
    *out = ot;
    *count = n;
    *nfiles = file + 1;
    return MT_OK;
}

int mt_hf_export(const char *ckpt, const char *outdir, const struct mt_hf_export_opts *o,
                 struct mt_hf_export_info *info, struct mt_err *err)
{
    memset(info, 0, sizeof *info);
    struct stat sb;
    if (stat(outdir, &sb) == 0)
        return mt_err_set(err, MT_EINVAL,
                          "export-hf: '%s' exists; give a new directory to write the model into",
                          outdir);
    if (stat(ckpt, &sb) != 0)
        return mt_err_errno(err, "export-hf: checkpoint '%s'", ckpt);
    bool found;
    MT_CHECK(mt_ckpt_locate(ckpt, false, info->iter_dir, sizeof info->iter_dir, &found, err));
    struct mt_config *c = malloc(sizeof *c);
    if (!c) return mt_err_set(err, MT_ENOMEM, "export-hf: out of memory");
    int rc = checkpoint_config(info->iter_dir, c, err);
    enum family fam = QWEN3;
    if (rc == MT_OK) rc = family_of(c, &fam, err);
    int dtype = o->dtype >= 0 ? o->dtype : !strcmp(c->precision.params_dtype, "bf16") ? MT_HF_BF16
                                                                                     : MT_HF_F32;
    /* the model's tensor table without its memory (the plan backend reserves, never backs) */
    struct mt_kernels *k = rc == MT_OK ? mt_kernels_plan_create() : NULL;
    struct mt_model *m = NULL;
    if (rc == MT_OK && !k) rc = mt_err_set(err, MT_ENOMEM, "export-hf: out of memory");
    if (rc == MT_OK) rc = mt_model_create(c, k, 1, NULL, &m, err);
    char *text = NULL;
    size_t len = 0;
    struct mt_shard_index *ix = NULL;
    if (rc == MT_OK) rc = mt_shard_index_text(info->iter_dir, &text, &len, err);
    if (rc == MT_OK) rc = mt_shard_index_open(info->iter_dir, text, len, &ix, err);
    free(text);
    if (rc == MT_OK) {
        /* the stored tensors are the configuration's model's */
        const int nt = mt_model_num_tensors(m);
        const char **names = calloc((size_t)nt + 1, sizeof *names);
        int *ndims = calloc((size_t)nt + 1, sizeof *ndims);
        long long (*shapes)[4] = calloc((size_t)nt + 1, sizeof *shapes);
        struct mt_ckpt_view v = { 0 };
        if (!names || !ndims || !shapes) rc = mt_err_set(err, MT_ENOMEM, "out of memory");
        for (int i = 0; rc == MT_OK && i < nt; i++) {
            const struct mt_param_info *t = mt_model_tensor(m, i);
            names[i] = t->name;
            ndims[i] = t->ndim;
            memcpy(shapes[i], t->shape, sizeof t->shape);
        }
        v.ntensors = nt;
        v.names = names;
        v.ndims = ndims;
        v.shapes = (const long long (*)[4])shapes;
        mt_model_buffers(m, &v.nbuffers);
        if (rc == MT_OK) rc = mt_shard_index_check(ix, &v, err);
        free(names);
        free(ndims);
        free(shapes);
    }
    struct out_tensor *ot = NULL;
    int n = 0, nfiles = 0;
    if (rc == MT_OK) rc = plan_export(m, fam, dtype, o->max_shard_bytes, &ot, &n, &nfiles, err);
    char tmp[4400];
    size_t ol = strlen(outdir);
    while (ol > 1 && outdir[ol - 1] == '/') ol--; /* "out/" is the directory out */
    snprintf(tmp, sizeof tmp, "%.*s.tmp%ld", (int)ol, outdir, (long)getpid());
    if (rc == MT_OK && mkdir(tmp, 0777) != 0)
        rc = mt_err_errno(err, "export-hf: cannot create '%s'", tmp);
    else if (rc == MT_OK) {
        rc = write_export(tmp, c, fam, dtype, m, ix, ot, n, nfiles, err);
        if (rc == MT_OK && rename(tmp, outdir) != 0)
            rc = mt_err_errno(err, "export-hf: cannot rename '%s' to '%s'", tmp, outdir);
        if (rc) remove_export(tmp, nfiles);
    }
    if (rc == MT_OK) {
        snprintf(info->architecture, sizeof info->architecture, "%s", arch_names[fam]);
        info->nfiles = nfiles;
        info->ntensors = n;
        info->dtype = dtype;
        for (int j = 0; j < n; j++) info->bytes += ot[j].bytes;
    }
    free(ot);
    mt_shard_index_free(ix);
    mt_model_destroy(m);
    if (k) mt_kernels_plan_destroy(k);
    free(c);
    return rc;
}

/* ---- the command line ---------------------------------------------------------------- */

static void usage(FILE *out)
{
    fputs("usage: moetrain export-hf [--dtype fp32|bf16] [--max-shard-size BYTES] CKPT OUTDIR\n"
          "\n"
          "Writes the model of the checkpoint CKPT (a checkpoint directory, meaning its latest\n"
          "checkpoint, or one of its iter_* directories; either format, any parallel layout)\n"
          "as a Hugging Face model directory OUTDIR (which must not exist): config.json,\n"
          "model.safetensors.index.json and model-0000K-of-0000N.safetensors, for\n"
          "Qwen3MoeForCausalLM (MoE with QK-norm), MixtralForCausalLM (MoE in every layer,\n"
          "without QK-norm) or Qwen3ForCausalLM (every layer dense). A model none of them\n"
          "holds exactly is refused, saying why.\n"
          "\n"
          "  --dtype fp32|bf16        the tensors' dtype (default: the run's\n"
          "                           precision%params_dtype; bf16 rounds to nearest even)\n"
          "  --max-shard-size BYTES   the largest file (default 5000000000; suffixes K, M, G\n"
          "                           are powers of 1000); a larger tensor gets a file alone\n"
          "\n"
          "See doc/checkpoints.md.\n",
          out);
}

static int usage_error(const char *what)
{
    fprintf(stderr, "moetrain export-hf: error: %s (see moetrain export-hf --help)\n", what);
    return 1;
}

static bool parse_size(const char *s, unsigned long long *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-') return false;
    unsigned long long mul = 1;
    if (!strcmp(end, "K") || !strcmp(end, "KB")) mul = 1000ull;
    else if (!strcmp(end, "M") || !strcmp(end, "MB")) mul = 1000000ull;
    else if (!strcmp(end, "G") || !strcmp(end, "GB")) mul = 1000000000ull;
    else if (*end) return false;
    if (v == 0 || v > ~0ull / mul) return false;
    *out = v * mul;
    return true;
}

int mt_hf_cli(int argc, char **argv)
{
    struct mt_hf_export_opts o = {-1, 5000000000ull};
    const char *paths[2];
    int npaths = 0;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(s, "--dtype") || !strcmp(s, "--max-shard-size")) {
            if (i + 1 == argc) return usage_error("an option lacks its value");
            const char *v = argv[++i];
            if (!strcmp(s, "--dtype")) {
                if (!strcmp(v, "fp32")) o.dtype = MT_HF_F32;
                else if (!strcmp(v, "bf16")) o.dtype = MT_HF_BF16;
                else return usage_error("--dtype takes fp32 or bf16");
            } else if (!parse_size(v, &o.max_shard_bytes)) {
                return usage_error("--max-shard-size takes a positive number of bytes");
            }
        } else if (s[0] == '-' && s[1]) {
            fprintf(stderr, "moetrain export-hf: error: unknown option '%s' (see moetrain "
                            "export-hf --help)\n", s);
            return 1;
        } else if (npaths == 2) {
            return usage_error("export-hf takes two paths, CKPT and OUTDIR");
        } else {
            paths[npaths++] = s;
        }
    }
    if (npaths != 2) return usage_error("export-hf takes two paths, CKPT and OUTDIR");
    struct mt_hf_export_info info;
    struct mt_err err = { 0 };
    if (mt_hf_export(paths[0], paths[1], &o, &info, &err)) {
        mt_cli_print_error("moetrain export-hf", &err, "");
        return 1;
    }
    printf("moetrain export-hf: %s -> %s: %s, %d tensors in %d file%s, %llu bytes of %s\n",
           info.iter_dir, paths[1], info.architecture, info.ntensors, info.nfiles,
           info.nfiles == 1 ? "" : "s", info.bytes, info.dtype == MT_HF_BF16 ? "bf16" : "fp32");
    return 0;
}

/* Dumps one tiny model for the independent JAX reference (tests/model/jax_ref.py):
 *   model_dump CASE OUTDIR
 * writes OUTDIR/meta.txt (configuration, tensor table, C losses), params.bin,
 * grads.bin (fp32, the params layout), tokens.bin (int32, (B, T+1)) and bias.bin
 * (expert biases, fp32). The gradients are those of the total loss lm + aux + z
 * with loss_scale 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "tests/model/tiny_config.h"

static int configure(struct mt_config *c, const char *name, int *B)
{
    tiny_config(c);
    *B = 2;
    if (strcmp(name, "softmax_aux") == 0) return 0; /* the tiny config as it is */
    if (strcmp(name, "softmax_pre_seq_tied") == 0) {
        c->moe.router_pre_softmax = true;
        strcpy(c->moe.router_load_balancing_type, "seq_aux_loss");
        c->moe.aux_loss_coeff = 0.05;
        c->moe.router_topk_scaling_factor = 2.0;
        c->moe.shared_expert_intermediate_size = 0;
        c->model.untie_embeddings_and_output_weights = false;
        c->model.qk_layernorm = false;
        c->moe.z_loss_coeff = 0.0;
        *B = 3;
        return 0;
    }
    if (strcmp(name, "sigmoid_bias") == 0) {
        strcpy(c->moe.router_score_function, "sigmoid");
        c->moe.num_experts = 6;
        c->moe.router_topk = 3;
        c->moe.router_enable_expert_bias = true;
        c->moe.router_bias_update_rate = 0.05;
        c->moe.router_topk_scaling_factor = 1.5;
        c->model.num_query_groups = 1;
        return 0;
    }
    if (strcmp(name, "forced_capacity") == 0) {
        c->moe.router_force_load_balancing = true;
        c->moe.expert_capacity_factor = 0.5;
        strcpy(c->moe.token_drop_policy, "position");
        c->moe.pad_expert_input_to_capacity = true;
        c->moe.layer_freq[1] = 1; /* all MoE */
        strcpy(c->moe.router_load_balancing_type, "none");
        c->moe.aux_loss_coeff = 0.0;
        return 0;
    }
    if (strcmp(name, "dense") == 0) {
        c->moe.num_experts = 0;
        c->model.num_query_groups = 4;
        return 0;
    }
    return -1;
}

static int write_file(const char *dir, const char *name, const void *p, size_t bytes)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes) {
        perror(path);
        return -1;
    }
    return fclose(f);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s CASE OUTDIR\n", argv[0]);
        return 2;
    }
    struct mt_config cfg;
    int B;
    if (configure(&cfg, argv[1], &B) != 0) {
        fprintf(stderr, "model_dump: unknown case '%s'\n", argv[1]);
        return 2;
    }
    struct mt_model *m;
    struct mt_err err;
    if (mt_model_create(&cfg, mt_kernels_cpu(), B, NULL, &m, &err) != MT_OK) {
        fprintf(stderr, "model_dump: %s\n", err.msg);
        return 1;
    }
    mt_model_init(m, 11);
    const int T = cfg.training.seq_length;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * (T + 1));
    tiny_tokens(tok, B, T, cfg.model.vocab_size, 5);
    struct mt_model_stats st;
    if (cfg.moe.router_enable_expert_bias) { /* one step of bias updates: nonzero biases */
        mt_model_forward_backward(m, tok, B, 1.0f, &st, &err);
        mt_model_update_expert_bias(m, true, &err);
        tiny_tokens(tok, B, T, cfg.model.vocab_size, 6);
    }
    mt_model_zero_grad(m);
    if (mt_model_forward_backward(m, tok, B, 1.0f, &st, &err) != MT_OK) {
        fprintf(stderr, "model_dump: %s\n", err.msg);
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/meta.txt", argv[2]);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    const struct mt_config_model *md = &cfg.model;
    const struct mt_config_moe *mo = &cfg.moe;
    fprintf(f, "B %d\nT %d\n", B, T);
    fprintf(f, "num_layers %d\nhidden_size %d\nnum_attention_heads %d\nnum_query_groups %d\n",
            md->num_layers, md->hidden_size, md->num_attention_heads, md->num_query_groups);
    fprintf(f, "kv_channels %d\nffn_hidden_size %d\nvocab_size %d\nrotary_base %.17g\n",
            md->kv_channels, md->ffn_hidden_size, md->vocab_size, md->rotary_base);
    fprintf(f, "norm_epsilon %.17g\nqk_layernorm %d\ntied %d\n", md->norm_epsilon,
            (int)md->qk_layernorm, (int)!md->untie_embeddings_and_output_weights);
    fprintf(f, "num_experts %d\nmoe_ffn_hidden_size %d\nrouter_topk %d\n", mo->num_experts,
            mo->moe_ffn_hidden_size, mo->router_topk);
    fprintf(f, "router_score_function %s\nrouter_pre_softmax %d\nrouter_topk_scaling_factor %.17g\n",
            mo->router_score_function, (int)mo->router_pre_softmax, mo->router_topk_scaling_factor);
    fprintf(f, "layer_freq");
    for (int l = 0; l < md->num_layers; l++) fprintf(f, " %d", mo->layer_freq[l]);
    fprintf(f, "\nrouter_load_balancing_type %s\naux_loss_coeff %.17g\nz_loss_coeff %.17g\n",
            mo->router_load_balancing_type, mo->aux_loss_coeff, mo->z_loss_coeff);
    fprintf(f, "router_enable_expert_bias %d\nrouter_force_load_balancing %d\n",
            (int)mo->router_enable_expert_bias, (int)mo->router_force_load_balancing);
    fprintf(f, "expert_capacity_factor %.17g\npad_expert_input_to_capacity %d\ntoken_drop_policy %s\n",
            mo->expert_capacity_factor, (int)mo->pad_expert_input_to_capacity, mo->token_drop_policy);
    fprintf(f, "shared_expert_intermediate_size %d\n", mo->shared_expert_intermediate_size);
    fprintf(f, "lm_loss %.17g\naux_loss %.17g\nz_loss %.17g\ndropped_tokens %lld\n", st.lm_loss,
            st.aux_loss, st.z_loss, st.dropped_tokens);
    for (int i = 0; i < mt_model_num_tensors(m); i++) {
        const struct mt_param_info *t = mt_model_tensor(m, i);
        fprintf(f, "tensor %s %zu %zu %d", t->name, t->offset, t->numel, t->ndim);
        for (int d = 0; d < t->ndim; d++) fprintf(f, " %lld", t->shape[d]);
        fprintf(f, "\n");
    }
    fclose(f);
    size_t nb;
    float *bias = mt_model_buffers(m, &nb);
    int rc = write_file(argv[2], "params.bin", mt_model_params(m), sizeof(float) * mt_model_num_params(m));
    rc |= write_file(argv[2], "grads.bin", mt_model_grads(m), sizeof(float) * mt_model_num_params(m));
    rc |= write_file(argv[2], "tokens.bin", tok, sizeof(int32_t) * (size_t)B * (T + 1));
    rc |= write_file(argv[2], "bias.bin", bias ? (const void *)bias : (const void *)"", sizeof(float) * nb);
    free(tok);
    mt_model_destroy(m);
    return rc ? 1 : 0;
}

/* A tiny Qwen3-MoE configuration for the model tests, filled field by field (the
 * tests link only the model, kernels and util modules). Layer 1 is dense, layers 0
 * and 2 are MoE; GQA with 4 heads in 2 groups and head_dim 6 != hidden/heads. */
#ifndef MT_TESTS_TINY_CONFIG_H
#define MT_TESTS_TINY_CONFIG_H

#include <string.h>

#include "config/config.h"

static inline void tiny_config(struct mt_config *c)
{
    memset(c, 0, sizeof *c);
    c->model.num_layers = 3;
    c->model.hidden_size = 16;
    c->model.num_attention_heads = 4;
    c->model.num_query_groups = 2;
    c->model.kv_channels = 6;
    c->model.ffn_hidden_size = 20;
    c->model.vocab_size = 23;
    c->model.max_position_embeddings = 64;
    c->model.rotary_base = 10000.0;
    c->model.norm_epsilon = 1e-6;
    c->model.qk_layernorm = true;
    c->model.untie_embeddings_and_output_weights = true;
    c->model.init_method_std = 0.3;
    c->moe.num_experts = 4;
    c->moe.moe_ffn_hidden_size = 12;
    c->moe.router_topk = 2;
    strcpy(c->moe.router_score_function, "softmax");
    c->moe.router_pre_softmax = false;
    c->moe.router_topk_scaling_factor = 0.0;
    strcpy(c->moe.router_dtype, "fp32");
    c->moe.layer_freq_len = 3;
    c->moe.layer_freq[0] = 1;
    c->moe.layer_freq[1] = 0;
    c->moe.layer_freq[2] = 1;
    strcpy(c->moe.router_load_balancing_type, "aux_loss");
    c->moe.aux_loss_coeff = 0.01;
    c->moe.z_loss_coeff = 0.001;
    c->moe.router_enable_expert_bias = false;
    c->moe.router_bias_update_rate = 1e-3;
    c->moe.router_force_load_balancing = false;
    c->moe.expert_capacity_factor = 0.0;
    c->moe.pad_expert_input_to_capacity = false;
    strcpy(c->moe.token_drop_policy, "probs");
    strcpy(c->moe.token_dispatcher_type, "alltoall");
    c->moe.shared_expert_intermediate_size = 10;
    c->training.micro_batch_size = 2;
    c->training.seq_length = 8;
    c->training.seed = 1234;
    strcpy(c->precision.params_dtype, "fp32");
}

/* tokens (B, T+1) in [0, V), reproducible */
static inline void tiny_tokens(int32_t *tok, int B, int T, int V, unsigned seed)
{
    unsigned x = seed * 2654435761u + 1u;
    for (int i = 0; i < B * (T + 1); i++) {
        x = x * 1103515245u + 12345u;
        tok[i] = (int32_t)((x >> 16) % (unsigned)V);
    }
}

#endif

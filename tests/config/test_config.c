/* Schema, loader, validation and printing of the typed configuration. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "config/megatron.h"
#include "config/schema.h"

/* Writes text to a temporary file; returns its path (static buffer per slot). */
static const char *tmpfile_with(const char *text, int slot)
{
    static char paths[4][64];
    snprintf(paths[slot], sizeof paths[slot], "/tmp/mt_test_config_%d_%d.nml", (int)getpid(),
             slot);
    FILE *f = fopen(paths[slot], "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return paths[slot];
}

static const char *minimal = "&data mock_data = .true. /\n";

/* Loads text (plus overrides) and resolves for world; returns rc, fills err. */
static int load_text(struct mt_config *c, const char *text, int nov, char *const ov[], int world,
                     struct mt_err *err)
{
    mt_config_defaults(c);
    char *files[2] = { (char *)tmpfile_with(minimal, 0), (char *)tmpfile_with(text, 1) };
    int rc = mt_config_load(c, 2, files, nov, ov, err);
    unlink(files[0]);
    unlink(files[1]);
    if (rc) return rc;
    struct mt_layout l;
    return mt_config_resolve(c, world, &l, err);
}

/* Loads text and resolves for world processes, expecting an error containing needle
 * (and needle2, unless NULL). */
static void expect_error_world(const char *text, int world, const char *needle,
                               const char *needle2)
{
    struct mt_config *c = malloc(sizeof *c);
    struct mt_err err = { 0 };
    int rc = load_text(c, text, 0, NULL, world, &err);
    if (rc == 0 || !strstr(err.msg, needle) || (needle2 && !strstr(err.msg, needle2))) {
        print_error("input:\n%s\nexpected an error containing: %s %s\ngot rc=%d: %s\n", text,
                    needle, needle2 ? needle2 : "", rc, err.msg);
        free(c);
        fail();
    }
    free(c);
}

static void expect_error(const char *text, const char *needle)
{
    expect_error_world(text, 1, needle, NULL);
}

static void test_defaults_resolve(void **state)
{
    (void)state;
    struct mt_config *c = malloc(sizeof *c);
    struct mt_err err = { 0 };
    assert_int_equal(load_text(c, "&model hidden_size = 96, num_attention_heads = 6 /\n", 0,
                               NULL, 1, &err),
                     0);
    assert_int_equal(c->model.kv_channels, 16);
    assert_int_equal(c->model.num_query_groups, 6);
    assert_int_equal(c->model.ffn_hidden_size, 384);
    assert_int_equal(c->moe.moe_ffn_hidden_size, 384);
    assert_int_equal(c->training.global_batch_size, 1);
    assert_int_equal(c->optimizer.lr_decay_iters, c->training.train_iters);
    assert_string_equal(c->parallel.order, "tp-cp-ep-dp-pp");
    assert_int_equal(c->moe.layer_freq_len, c->model.num_layers);
    free(c);
}

static void test_values_and_types(void **state)
{
    (void)state;
    struct mt_config *c = malloc(sizeof *c);
    struct mt_err err = { 0 };
    const char *text = "&MODEL num_layers = 4, qk_layernorm = T, rotary_base = 1d6 /\n"
                       "&moe num_experts = 8, router_topk = 2, layer_freq(2:4:2) = 2*0,\n"
                       "     router_score_function = 'SIGMOID' /\n"
                       "&optimizer lr = 3, lr_decay_style = \"cosine\" /\n"
                       "&data data_path = '0.3', 'a', '0.7', 'b' /\n";
    assert_int_equal(load_text(c, text, 0, NULL, 1, &err), 0);
    assert_int_equal(c->model.num_layers, 4);
    assert_true(c->model.qk_layernorm);
    assert_true(c->model.rotary_base == 1e6);
    assert_int_equal(c->moe.layer_freq[0], 1);
    assert_int_equal(c->moe.layer_freq[1], 0);
    assert_int_equal(c->moe.layer_freq[2], 1);
    assert_int_equal(c->moe.layer_freq[3], 0);
    assert_string_equal(c->moe.router_score_function, "sigmoid"); /* canonical spelling */
    assert_true(c->optimizer.lr == 3.0);                          /* integer into a real */
    assert_int_equal(c->data.data_path_len, 4);
    assert_string_equal(c->data.data_path[3], "b");
    free(c);
}

static void test_later_wins_and_overrides(void **state)
{
    (void)state;
    struct mt_config *c = malloc(sizeof *c);
    struct mt_err err = { 0 };
    char *ov[] = { "training%train_iters=7", "moe%layer_freq=1,0", "data%split='90,5,5'" };
    const char *text = "&training train_iters = 3 /\n&training train_iters = 5 /\n"
                       "&model num_layers = 2 /\n&moe num_experts = 4 /\n";
    assert_int_equal(load_text(c, text, 3, ov, 1, &err), 0);
    assert_int_equal(c->training.train_iters, 7);
    assert_int_equal(c->moe.layer_freq[1], 0);
    assert_string_equal(c->data.split, "90,5,5");
    free(c);
}

static void test_null_keeps_default(void **state)
{
    (void)state;
    struct mt_config *c = malloc(sizeof *c);
    struct mt_err err = { 0 };
    assert_int_equal(load_text(c, "&training seq_length = , train_iters = 9 /\n", 0, NULL, 1,
                               &err),
                     0);
    assert_int_equal(c->training.seq_length, 128);
    assert_int_equal(c->training.train_iters, 9);
    free(c);
}

static void test_unknown_names(void **state)
{
    (void)state;
    expect_error("&moe router_top_k = 2 /\n", "did you mean 'router_topk'");
    expect_error("&modle num_layers = 2 /\n", "did you mean '&model'");
    expect_error("&training lr = 0.1 /\n", "'lr' belongs in &optimizer");
    expect_error("&moe router_top_k = 2 /\n", ":1:6: error:");
}

static void test_type_and_range(void **state)
{
    (void)state;
    expect_error("&model num_layers = 'two' /\n", "num_layers expects an integer, got a string");
    expect_error("&model num_layers = 0 /\n", "num_layers = 0 is out of range");
    expect_error("&model qk_layernorm = 1 /\n", "expects a logical");
    expect_error("&moe router_score_function = 'relu' /\n", "allowed: softmax|sigmoid");
    expect_error("&optimizer adam_beta1 = 1.5 /\n", "allowed 0..1");
    expect_error("&model num_layers = 2, 3 /\n", "takes one value, got 2");
    expect_error("&model num_layers(1) = 2 /\n", "is a scalar");
    expect_error("&moe layer_freq(2000) = 1 /\n", "out of bounds");
    expect_error("&moe layer_freq(1:2) = 1, 1, 1 /\n", "too many values");
    expect_error("&moe layer_freq = 2 /\n", "out of range (allowed 0..1)");
}

static void test_cross_field(void **state)
{
    (void)state;
    expect_error("&model hidden_size = 100, num_attention_heads = 3 /\n",
                 "hidden_size = 100 is not divisible by num_attention_heads = 3");
    expect_error("&model num_attention_heads = 4, num_query_groups = 3 /\n",
                 "num_query_groups = 3 must divide num_attention_heads = 4");
    expect_error("&moe num_experts = 2, router_topk = 3 /\n",
                 "router_topk = 3 exceeds num_experts = 2");
    expect_error("&model num_layers = 3 /\n&moe num_experts = 2, layer_freq = 1, 1 /\n",
                 "layer_freq has 2 entries but &model num_layers = 3");
    expect_error("&moe layer_freq = 1, 1 /\n", "num_experts = 0");
    expect_error("&training seq_length = 8192 /\n", "exceeds &model max_position_embeddings");
    expect_error("&training micro_batch_size = 2, global_batch_size = 3 /\n",
                 "global_batch_size = 3 is not divisible by micro_batch_size (2)");
    expect_error("&parallel tensor_model_parallel_size = 2 /\n",
                 "world size 1 is not divisible by tensor_model_parallel_size (2)");
    expect_error("&moe pad_expert_input_to_capacity = T, num_experts = 2 /\n",
                 "needs expert_capacity_factor > 0");
    expect_error("&optimizer lr = 1e-3, min_lr = 1e-2 /\n", "min_lr = 0.01 exceeds lr = 0.001");
    expect_error("&data split = '1,x' /\n", "&data split = '1,x': the valid value 'x' is not a "
                 "number");
    expect_error("&checkpoint save_interval = 5 /\n", "save is empty");
    struct mt_config *c = malloc(sizeof *c);
    struct mt_err err = { 0 };
    char *ov[] = { "parallel%tensor_model_parallel_size=2" };
    assert_int_not_equal(load_text(c, "&training seq_length = 64 /\n", 1, ov, 2, &err), 0);
    assert_non_null(strstr(err.msg, "needs sequence_parallel = .true."));
    char *ov2[] = { "parallel%tensor_model_parallel_size=2", "parallel%sequence_parallel=T" };
    assert_int_not_equal(load_text(c, "&training seq_length = 63 /\n", 2, ov2, 2, &err), 0);
    assert_non_null(strstr(err.msg, "seq_length = 63 is not divisible"));
    assert_int_equal(load_text(c, "&training seq_length = 64 /\n", 2, ov2, 2, &err), 0);
    free(c);
    expect_error("&parallel order = 'tp-xx' /\n", "unknown dimension 'xx'");
    expect_error("&parallel context_parallel_size = 1, virtual_pipeline_model_parallel_size "
                 "= 2 /\n",
                 "needs pipeline_model_parallel_size > 1");
}

/* Loads text and overrides for world processes, expecting success. */
static void expect_ok(const char *text, int nov, char *const ov[], int world)
{
    struct mt_config *c = malloc(sizeof *c);
    struct mt_err err = { 0 };
    int rc = load_text(c, text, nov, ov, world, &err);
    if (rc) print_error("input:\n%s\nexpected success, got rc=%d: %s\n", text, rc, err.msg);
    free(c);
    assert_int_equal(rc, 0);
}

/* Sizes derived from several keys are computed in 64 bits and refused beyond what
 * the trainer holds (an int), naming the keys and values, instead of wrapping. */
static void test_derived_sizes_overflow(void **state)
{
    (void)state;
    /* 2^30 x DP 4 wrapped to a global batch of 0 and "0 micro-batches" */
    expect_error_world("&training micro_batch_size = 1073741824, global_batch_size = 0,"
                       " seq_length = 1 /\n",
                       4, "micro_batch_size (1073741824) x data-parallel size (4)",
                       "= 4294967296, more than 2147483647");
    expect_error_world("&training micro_batch_size = 1073741824, global_batch_size = 0 /\n", 4,
                       "micro_batch_size (1073741824) x seq_length (128)", "= 137438953472");
    expect_error("&model hidden_size = 1073741824, num_attention_heads = 2 /\n",
                 "ffn_hidden_size = 0 defaults to 4 x hidden_size (1073741824) = 4294967296");
    expect_error("&model num_attention_heads = 65536, kv_channels = 65536 /\n",
                 "num_attention_heads (65536) x kv_channels (65536), the query width = "
                 "4294967296");
    expect_error("&model max_position_embeddings = 1024 /\n&moe num_experts = 64, "
                 "router_topk = 64 /\n&training micro_batch_size = 65536, seq_length = 1024 /\n",
                 "router_topk (64), the expert rows of a micro-batch = 4294967296");
    expect_error("&moe num_experts = 2, expert_capacity_factor = 1e9 /\n",
                 "expert_capacity_factor = 1e+09 gives each of the num_experts = 2 experts a "
                 "capacity of 128000000000 rows");
    /* The largest sizes that fit are accepted. */
    expect_ok("&training micro_batch_size = 536870911, global_batch_size = 0, seq_length = 1 /\n",
              0, NULL, 4);
}

/* One rule for data_path and split, shared with the data loader: unweighted blends
 * are accepted, zero, infinite and overflowing weights or splits refused by name. */
static void test_data_rules(void **state)
{
    (void)state;
    expect_ok("&data data_path = 'a', 'b' /\n", 0, NULL, 1);
    expect_ok("&data data_path = 'a b c' /\n", 0, NULL, 1);
    expect_ok("&data data_path = '0.3 a', '0.7', 'b' /\n", 0, NULL, 1);
    expect_error("&data data_path = '0', 'a', '1', 'b' /\n",
                 "data_path(1) = '0': the weight of dataset 'a' is 0: remove the dataset");
    expect_error("&data data_path = '1', 'a', '-1', 'b' /\n",
                 "data_path(3) = '-1': the weight of dataset 'b' is negative");
    expect_error("&data data_path = '1e308', 'p1', '1e308', 'p2' /\n",
                 "the blend weights sum to more than the largest number");
    expect_error("&data data_path = '1e309', 'p1', '1', 'p2' /\n",
                 "data_path(1) = '1e309': the weight of dataset 'p1' is not a finite number");
    expect_error("&data data_path = '0.3', 'a', 'b', 'c' /\n", "mixes weights and prefixes");
    expect_error("&data data_path = '0.3', 'a', 'b' /\n",
                 "data_path(1) = '0.3' looks like a weight");
    expect_error("&data data_path = 'a', ' ', 'b' /\n", "data_path(2) is empty");
    expect_error("&data split = '1e308,1e308,1' /\n",
                 "&data split = '1e308,1e308,1': the values sum to more than the largest");
    expect_error("&data split = '1e309,1' /\n",
                 "the train value '1e309' is not a finite number");
    expect_error("&data split = '1,-1' /\n", "the valid value '-1' is negative");
    expect_error("&data split = '0,0' /\n", "must not all be zero");
    expect_error("&data split = '1,1,1,1' /\n", "more than three values");
    expect_ok("&data split = '98 / 1 / 1' /\n", 0, NULL, 1);
}

/* pp must be the last (slowest) dimension of the order, as Megatron requires. */
static void test_order_pp_last(void **state)
{
    (void)state;
    const char *moe = "&model num_layers = 2 /\n&moe num_experts = 4 /\n";
    char text[512];
    snprintf(text, sizeof text,
             "%s&parallel order = 'tp-pp-cp-ep-dp', pipeline_model_parallel_size = 2,"
             " expert_model_parallel_size = 2 /\n", moe);
    expect_error_world(text, 4, "&parallel order = 'tp-pp-cp-ep-dp': 'pp' must come last",
                       "'tp-cp-ep-dp-pp' (the default)");
    expect_error("&parallel order = 'pp-tp-dp' /\n", "'pp' must come last");
    snprintf(text, sizeof text,
             "%s&parallel order = 'ep-dp-tp-cp-pp', pipeline_model_parallel_size = 2,"
             " expert_model_parallel_size = 2 /\n", moe);
    expect_ok(text, 0, NULL, 4);
    expect_ok("&parallel order = 'dp-tp' /\n", 0, NULL, 1); /* pp of size 1 may be left out */
}

static void test_world_layout(void **state)
{
    (void)state;
    struct mt_config *c = malloc(sizeof *c);
    struct mt_err err = { 0 };
    mt_config_defaults(c);
    char *files[2] = { (char *)tmpfile_with(minimal, 0),
                       (char *)tmpfile_with("&model num_layers = 4 /\n&moe num_experts = 8 /\n"
                                            "&parallel tensor_model_parallel_size = 2,\n"
                                            " sequence_parallel = .true.,\n"
                                            " expert_model_parallel_size = 4,\n"
                                            " expert_tensor_parallel_size = 1,\n"
                                            " pipeline_model_parallel_size = 2 /\n"
                                            "&training micro_batch_size = 1,"
                                            " global_batch_size = 16 /\n",
                                            1) };
    assert_int_equal(mt_config_load(c, 2, files, 0, NULL, &err), 0);
    struct mt_layout l;
    assert_int_equal(mt_config_resolve(c, 16, &l, &err), 0);
    assert_int_equal(l.dp, 4);
    assert_int_equal(l.edp, 2);
    assert_int_equal(l.num_micro_batches, 4);
    unlink(files[0]);
    unlink(files[1]);
    free(c);
}

/* print -> parse -> print is a fixed point, and the struct is identical */
static void test_print_round_trip(void **state)
{
    (void)state;
    struct mt_config *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    struct mt_err err = { 0 };
    const char *text = "&model num_layers = 3, rotary_base = 1e6, norm_epsilon = 1e-6 /\n"
                       "&moe num_experts = 4, layer_freq = 1, 0, 1 /\n"
                       "&optimizer lr = 0.1, min_lr = 1.5e-5 /\n"
                       "&data data_path = 'it''s', split = '98,1,1' /\n"
                       "&logging metrics_file = 'm.jsonl' /\n";
    assert_int_equal(load_text(a, text, 0, NULL, 1, &err), 0);
    char *buf1 = NULL, *buf2 = NULL;
    size_t n1 = 0, n2 = 0;
    FILE *f = open_memstream(&buf1, &n1);
    assert_int_equal(mt_config_print(a, f), 0);
    fclose(f);
    mt_config_defaults(b);
    char *files[1] = { (char *)tmpfile_with(buf1, 2) };
    assert_int_equal(mt_config_load(b, 1, files, 0, NULL, &err), 0);
    struct mt_layout l;
    assert_int_equal(mt_config_resolve(b, 1, &l, &err), 0);
    f = open_memstream(&buf2, &n2);
    assert_int_equal(mt_config_print(b, f), 0);
    fclose(f);
    assert_string_equal(buf1, buf2);
    assert_true(a->optimizer.min_lr == b->optimizer.min_lr);
    assert_string_equal(b->data.data_path[0], "it's");
    unlink(files[0]);
    free(buf1);
    free(buf2);
    free(a);
    free(b);
}

/* &recompute: Megatron's combinations, and modules this model has */
static void test_recompute(void **state)
{
    (void)state;
    const char *moe = "&moe num_experts = 4, layer_freq = 0, 1 /\n";
    char text[512];
    struct mt_config *c = malloc(sizeof *c);
    struct mt_err err = { 0 };
    assert_int_equal(load_text(c, "&recompute granularity = 'selective' /\n", 0, NULL, 1, &err), 0);
    assert_int_equal(c->recompute.modules_len, 1); /* Megatron's default */
    assert_string_equal(c->recompute.modules[0], "core_attn");
    snprintf(text, sizeof text, "%s&recompute granularity = 'selective', modules = 'moe_act', "
             "'layernorm', 'mlp', 'moe' /\n", moe);
    assert_int_equal(load_text(c, text, 0, NULL, 1, &err), 0);
    assert_int_equal(c->recompute.modules_len, 4);
    assert_int_equal(load_text(c, "&recompute granularity = 'full', method = 'block', "
                               "num_layers = 2 /\n", 0, NULL, 1, &err), 0);
    free(c);
    expect_error("&recompute granularity = 'full' /\n", "needs method = 'uniform'");
    expect_error("&recompute granularity = 'full', method = 'uniform' /\n",
                 "granularity = 'full' needs num_layers >= 1");
    expect_error("&recompute granularity = 'selective', method = 'uniform' /\n",
                 "method = 'uniform' applies only with granularity = 'full'");
    expect_error("&recompute method = 'block', num_layers = 1 /\n",
                 "method = 'block' applies only with granularity = 'full' (granularity is 'none')");
    expect_error("&recompute granularity = 'selective', num_layers = 1 /\n",
                 "num_layers = 1 applies only with granularity = 'full'");
    expect_error("&recompute granularity = 'full', method = 'uniform', num_layers = 3 /\n",
                 "num_layers = 3 exceeds &model num_layers = 2");
    expect_error("&recompute granularity = 'full', method = 'uniform', num_layers = 1, "
                 "modules = 'mlp' /\n",
                 "modules applies only with granularity = 'selective'");
    expect_error("&recompute modules = 'core_attn' /\n",
                 "modules applies only with granularity = 'selective' (granularity is 'none')");
    expect_error("&recompute granularity = 'selective', modules = 'mla_up_proj' /\n",
                 "modules(1) = 'mla_up_proj' is not a module of this model; choose from");
    expect_error("&recompute granularity = 'selective', modules = 'mlp', 'mlp' /\n",
                 "modules(2) = 'mlp' repeats modules(1)");
    expect_error("&recompute granularity = 'selective', modules = 'core_attn', 'moe' /\n",
                 "modules(2) = 'moe': this model has no MoE layer");
    expect_error("&recompute granularity = 'selective', modules = 'moe_act' /\n",
                 "modules(1) = 'moe_act': this model has no MoE layer");
    snprintf(text, sizeof text, "%s&recompute granularity = 'selective', "
             "modules = 'shared_experts' /\n", moe);
    expect_error(text, "modules(1) = 'shared_experts': this model has no shared expert");
    expect_error("&moe num_experts = 4 /\n&recompute granularity = 'selective', "
                 "modules = 'mlp' /\n",
                 "modules(1) = 'mlp': this model has no dense MLP layer");
    expect_error("&recompute granularity = 'partial' /\n",
                 "granularity = 'partial' is not allowed (allowed: none|selective|full)");
    /* offloading: the routed experts' modules with MoE layers, refused without */
    c = malloc(sizeof *c);
    snprintf(text, sizeof text, "%s&recompute fine_grained_activation_offloading = .true., "
             "offload_modules = 'expert_fc1', 'moe_act', 'core_attn' /\n", moe);
    assert_int_equal(load_text(c, text, 0, NULL, 1, &err), 0);
    assert_int_equal(c->recompute.offload_modules_len, 3);
    free(c);
    expect_error("&recompute fine_grained_activation_offloading = .true., "
                 "offload_modules = 'core_attn', 'expert_fc1' /\n",
                 "offload_modules(2) = 'expert_fc1': this model has no MoE layer");
    expect_error("&recompute fine_grained_activation_offloading = .true., "
                 "offload_modules = 'expert_fc2' /\n",
                 "offload_modules(1) = 'expert_fc2' is not an offloadable module; choose from "
                 "attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act");
}

/* Megatron's spellings of moetrain keys: the flag's words joined by '_' */
static void test_megatron_spellings(void **state)
{
    (void)state;
    expect_error_world("&moe moe_aux_loss_coeff = 0.01 /\n", 1,
                       "did you mean 'moe%aux_loss_coeff'? (Megatron's --moe-aux-loss-coeff)",
                       ":1:6: error: unknown key 'moe_aux_loss_coeff' in &moe");
    expect_error("&moe moe_router_topk = 2 /\n",
                 "did you mean 'moe%router_topk'? (Megatron's --moe-router-topk)");
    expect_error("&model sequence_parallel = .true. /\n", "'sequence_parallel' belongs in &parallel");
    expect_error("&model recompute_granularity = 'full' /\n",
                 "did you mean 'recompute%granularity'? (Megatron's --recompute-granularity)");
    expect_error("&model distribute_saved_activations = .true. /\n",
                 "Megatron's --distribute-saved-activations: not implemented in moetrain");
    /* a value Megatron counts otherwise: not the key's value as it is */
    expect_error("&training train_samples = 1024 /\n",
                 "that is Megatron's --train-samples, which becomes 'training%train_iters' "
                 "converted (samples / --global-batch-size");
    /* a plain typo still gets the nearest key */
    expect_error("&moe router_top_k = 2 /\n", "did you mean 'router_topk'");
}

/* The flag table: flags unique and spelled --a-b; every key it maps to exists (the
 * part before an '=' for a switch that sets a value); every unmapped flag says why. */
static void test_megatron_table(void **state)
{
    (void)state;
    int n = 0;
    for (const struct mt_megatron_flag *f = mt_megatron_flags; f->flag; f++, n++) {
        assert_true(strncmp(f->flag, "--", 2) == 0 && !strchr(f->flag, '_'));
        assert_ptr_equal(mt_megatron_find(f->flag), f);
        if (!f->key) {
            assert_true(f->kind != MT_MEG_VALUE && f->kind != MT_MEG_SWITCH);
            assert_true(f->why && strlen(f->why) > 5);
            continue;
        }
        char group[32], name[64];
        assert_int_equal(sscanf(f->key, "%31[a-z_]%%%63[a-z0-9_]", group, name), 2);
        bool found = false;
        for (const struct mt_key *k = mt_schema; k->name; k++)
            found |= !strcmp(k->group, group) && !strcmp(k->name, name);
        if (!found) print_error("%s maps to %s, which is not a key\n", f->flag, f->key);
        assert_true(found);
    }
    assert_true(n > 100);
    assert_null(mt_megatron_find("--no-such-flag"));
    assert_non_null(mt_megatron_find("--moe-router-topk=8"));
    assert_string_equal(mt_megatron_for_key("moe_router_topk")->key, "moe%router_topk");
}

static void test_schema_table(void **state)
{
    (void)state;
    /* every key has a doc line and a known group; names are unique per group */
    for (const struct mt_key *k = mt_schema; k->name; k++) {
        assert_non_null(k->doc);
        assert_true(strlen(k->doc) > 5);
        bool found = false;
        for (size_t g = 0; mt_schema_groups[g]; g++)
            if (!strcmp(mt_schema_groups[g], k->group)) found = true;
        assert_true(found);
        for (const struct mt_key *j = k + 1; j->name; j++)
            assert_false(!strcmp(j->group, k->group) && !strcmp(j->name, k->name));
    }
}

static void test_bad_override(void **state)
{
    (void)state;
    struct mt_config *c = malloc(sizeof *c);
    struct mt_err err = { 0 };
    char *ov[] = { "training%train_iters=abc" };
    assert_int_not_equal(load_text(c, "&training /\n", 1, ov, 1, &err), 0);
    if (!strstr(err.msg, "command-line override")) {
        print_error("unexpected message: %s\n", err.msg);
        fail();
    }
    char *ov2[] = { "train_iters=5" };
    assert_int_not_equal(load_text(c, "&training /\n", 1, ov2, 1, &err), 0);
    free(c);
}

/* Megatron's pipeline layout: chunk c of stage s, even and uneven stages, and the
 * rules on decoder_first/last_pipeline_num_layers and the interleaved schedule. */
static void expect_layers(const struct mt_config *c, int stage, int chunk, int first, int n)
{
    int f = -1, k = -1;
    mt_config_pp_layers(c, stage, chunk, &f, &k);
    if (f != first || k != n) {
        print_error("stage %d chunk %d: layers %d+%d, expected %d+%d\n", stage, chunk, f, k,
                    first, n);
        fail();
    }
}

static void test_pipeline_layout(void **state)
{
    (void)state;
    struct mt_config *c = malloc(sizeof *c);
    struct mt_err err = { 0 };
    /* even, interleaved: 8 layers, PP 2 x VPP 2 -> stage 0 holds 0-1 and 4-5 */
    assert_int_equal(load_text(c, "&model num_layers = 8 /\n&parallel pipeline_model_parallel_size"
                                  " = 2, virtual_pipeline_model_parallel_size = 2 /\n"
                                  "&training global_batch_size = 4 /\n",
                               0, NULL, 2, &err),
                     0);
    expect_layers(c, 0, 0, 0, 2);
    expect_layers(c, 1, 0, 2, 2);
    expect_layers(c, 0, 1, 4, 2);
    expect_layers(c, 1, 1, 6, 2);
    /* uneven: 10 layers on PP 4, first 1, last 3: 1 | 3 | 3 | 3 */
    assert_int_equal(load_text(c, "&model num_layers = 10 /\n&parallel pipeline_model_parallel_size"
                                  " = 4, decoder_first_pipeline_num_layers = 1,"
                                  " decoder_last_pipeline_num_layers = 3 /\n",
                               0, NULL, 4, &err),
                     0);
    expect_layers(c, 0, 0, 0, 1);
    expect_layers(c, 1, 0, 1, 3);
    expect_layers(c, 2, 0, 4, 3);
    expect_layers(c, 3, 0, 7, 3);
    /* uneven and interleaved: 10 layers, PP 4 x VPP 2, first 2, last 4 */
    assert_int_equal(load_text(c, "&model num_layers = 10 /\n&parallel pipeline_model_parallel_size"
                                  " = 4, virtual_pipeline_model_parallel_size = 2,"
                                  " decoder_first_pipeline_num_layers = 2,"
                                  " decoder_last_pipeline_num_layers = 4 /\n"
                                  "&training global_batch_size = 4 /\n",
                               0, NULL, 4, &err),
                     0);
    expect_layers(c, 0, 0, 0, 1);
    expect_layers(c, 1, 0, 1, 1);
    expect_layers(c, 2, 0, 2, 1);
    expect_layers(c, 3, 0, 3, 2);
    expect_layers(c, 0, 1, 5, 1);
    expect_layers(c, 3, 1, 8, 2);
    /* only the first stage set: the rest split over the other three */
    assert_int_equal(load_text(c, "&model num_layers = 7 /\n&parallel pipeline_model_parallel_size"
                                  " = 4, decoder_first_pipeline_num_layers = 1 /\n",
                               0, NULL, 4, &err),
                     0);
    expect_layers(c, 0, 0, 0, 1);
    expect_layers(c, 3, 0, 5, 2);
    free(c);
    expect_error("&parallel decoder_first_pipeline_num_layers = 1 /\n",
                 "decoder_first_pipeline_num_layers = 1 needs pipeline_model_parallel_size > 1");
    c = malloc(sizeof *c);
    char *ov[] = { "parallel%pipeline_model_parallel_size=2" };
    assert_int_not_equal(load_text(c, "&model num_layers = 5 /\n&parallel"
                                      " decoder_first_pipeline_num_layers = 2,"
                                      " decoder_last_pipeline_num_layers = 2 /\n",
                                   1, ov, 2, &err),
                         0);
    assert_non_null(strstr(err.msg, "leave 1 of num_layers = 5 for the 0 other pipeline stage(s)"));
    char *ov4[] = { "parallel%pipeline_model_parallel_size=4" };
    assert_int_not_equal(load_text(c, "&model num_layers = 8 /\n&parallel"
                                      " decoder_first_pipeline_num_layers = 1 /\n",
                                   1, ov4, 4, &err),
                         0);
    assert_non_null(strstr(err.msg, "= 7 is not divisible by the 3 other pipeline stage(s)"));
    char *ovv[] = { "parallel%pipeline_model_parallel_size=2",
                    "parallel%virtual_pipeline_model_parallel_size=2" };
    /* a first stage whose count does not divide by VPP: the short chunk comes first */
    assert_int_equal(load_text(c, "&model num_layers = 9 /\n&parallel"
                                  " decoder_first_pipeline_num_layers = 3 /\n"
                                  "&training global_batch_size = 2 /\n",
                               2, ovv, 2, &err),
                     0);
    expect_layers(c, 0, 0, 0, 1);
    expect_layers(c, 1, 0, 1, 3);
    expect_layers(c, 0, 1, 4, 2);
    expect_layers(c, 1, 1, 6, 3);
    assert_int_not_equal(load_text(c, "&model num_layers = 8 /\n&parallel"
                                      " decoder_first_pipeline_num_layers = 3 /\n",
                                   2, ovv, 2, &err),
                         0);
    assert_non_null(strstr(err.msg, "= 5 is not divisible by the 1 other pipeline stage(s) x "
                                    "virtual_pipeline_model_parallel_size (2)"));
    assert_int_not_equal(load_text(c, "&model num_layers = 8 /\n&training global_batch_size = 6,"
                                      " micro_batch_size = 2 /\n",
                                   2, ovv, 2, &err),
                         0);
    assert_non_null(strstr(err.msg, "= 3, to be a multiple of pipeline_model_parallel_size = 2"));
    free(c);
}

/* The recipe a GPU runs (mt_config_check_recipe_gpu, Transformer Engine's rules): each
 * recipe at the compute capability below and at its threshold, and the recipe named as
 * the one that fits. */
static void expect_gpu(const char *text, int major, int minor, const char *needle)
{
    struct mt_config *c = malloc(sizeof *c);
    struct mt_err err = { 0 };
    assert_int_equal(load_text(c, text, 0, NULL, 1, &err), MT_OK);
    const int rc = mt_config_check_recipe_gpu(c, "GPU X", major, minor, &err);
    if (needle ? rc != MT_EUNSUPPORTED || !strstr(err.msg, needle) || !strstr(err.msg, "GPU X") : rc != MT_OK) {
        print_error("%s on %d.%d: expected %s, got rc=%d: %s\n", text, major, minor,
                    needle ? needle : "acceptance", rc, err.msg);
        free(c);
        fail();
    }
    free(c);
}

static void test_recipe_gpu(void **state)
{
    (void)state;
    const char *mx = "&precision params_dtype = 'bf16', fp8_format = 'e4m3', fp8_recipe = 'mxfp8' /\n";
    const char *nv = "&precision params_dtype = 'bf16', fp4_format = 'e2m1' /\n";
    const char *bw = "&precision params_dtype = 'bf16', fp8_format = 'e4m3', fp8_recipe = 'blockwise' /\n";
    const char *dl = "&precision params_dtype = 'bf16', fp8_format = 'hybrid' /\n";
    const char *tw = "&precision params_dtype = 'bf16', fp8_format = 'hybrid', fp8_recipe = 'tensorwise' /\n";
    expect_gpu("&precision params_dtype = 'bf16' /\n", 7, 0, NULL); /* no recipe: any GPU */
    expect_gpu(mx, 9, 0, "fits this GPU is fp8_recipe = 'blockwise'");
    expect_gpu(mx, 10, 0, NULL);
    expect_gpu(mx, 12, 0, "fits this GPU is fp8_recipe = 'tensorwise'"); /* TE: not on 12.x */
    expect_gpu(nv, 9, 0, "fp4_format = '', fp8_format = 'e4m3', fp8_recipe = 'blockwise'");
    expect_gpu(nv, 10, 0, NULL);
    expect_gpu(nv, 12, 0, NULL);
    expect_gpu(bw, 8, 9, "fits this GPU is fp8_recipe = 'tensorwise'");
    expect_gpu(bw, 9, 0, NULL);
    expect_gpu(bw, 10, 0, NULL);
    expect_gpu(dl, 8, 0, "runs no FP8/FP4 recipe");
    expect_gpu(dl, 8, 9, NULL);
    expect_gpu(tw, 8, 6, "compute capability 8.9 or newer");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_resolve),   cmocka_unit_test(test_values_and_types),
        cmocka_unit_test(test_later_wins_and_overrides), cmocka_unit_test(test_null_keeps_default),
        cmocka_unit_test(test_unknown_names),      cmocka_unit_test(test_type_and_range),
        cmocka_unit_test(test_cross_field),        cmocka_unit_test(test_world_layout),
        cmocka_unit_test(test_print_round_trip),   cmocka_unit_test(test_schema_table),
        cmocka_unit_test(test_bad_override),       cmocka_unit_test(test_pipeline_layout),
        cmocka_unit_test(test_derived_sizes_overflow), cmocka_unit_test(test_data_rules),
        cmocka_unit_test(test_order_pp_last),      cmocka_unit_test(test_megatron_spellings),
        cmocka_unit_test(test_megatron_table),     cmocka_unit_test(test_recompute),
        cmocka_unit_test(test_recipe_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

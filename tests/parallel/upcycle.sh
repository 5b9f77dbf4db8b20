#!/bin/sh
# moe%use_upcycling: a dense model's checkpoint (moetrain's, and the same exported as a
# Hugging Face Qwen3 directory) starts an MoE model whose every expert is a copy of the
# dense MLP. With softmax routing renormalised over the top-k (the weights sum to 1), the
# MoE layer computes the dense MLP: the upcycled run's first loss is the dense model's
# loss at the same weights on the same tokens (every sample is one sequence), to
# rounding; then it trains. The MoE runs use TP 2 x EP 2 and EP 2 (the experts' slices
# of the one dense tensor). Errors: an expert width other than the dense MLP's, and a
# checkpoint that already has experts.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
. "$MT_TOP_SRCDIR/tests/train/same_sample.sh"
need_mpirun
same_sample_data same
cat > dense.nml <<NML
&model num_layers = 2, hidden_size = 32, num_attention_heads = 4, num_query_groups = 2,
  kv_channels = 8, ffn_hidden_size = 48, vocab_size = 257, max_position_embeddings = 64,
  qk_layernorm = .true., untie_embeddings_and_output_weights = .true. /
&moe num_experts = 0 /
&training micro_batch_size = 1, global_batch_size = 2, seq_length = 16, train_iters = 2,
  eval_iters = 0, eval_interval = 100, seed = 5 /
&optimizer lr = 3.0e-3 /
&data data_path = 'same', split = '100,0,0' /
&logging log_interval = 1 /
NML
MOE="moe%num_experts=4 moe%router_topk=2 moe%moe_ffn_hidden_size=48 moe%layer_freq=1,1
moe%use_upcycling=T moe%aux_loss_coeff=1e-2 training%train_iters=3"
# go NAME NP ARGS...: a run of NP processes, metrics in NAME.jsonl
go() {
    name=$1
    np=$2
    shift 2
    set -- dense.nml "logging%metrics_file='$name.jsonl'" "$@"
    if [ "$np" = 1 ]; then "$MOETRAIN" "$@" > "$name.log" 2>&1 < /dev/null
    else launch "$np" "$MOETRAIN" "$@" parallel%distributed_timeout_minutes=1 > "$name.log" 2>&1 < /dev/null
    fi
}
loss_at() { sed -n "s/.*\"iteration\": $2,.*\"loss\": \([-0-9.eE+]*\).*/\1/p" "$1.jsonl"; }
# same_loss WHAT A B: within 1e-5 relative
same_loss() {
    echo "  $1: dense $2, upcycled $3"
    awk -v a="$2" -v b="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 1e-5 * a) }' ||
        fail "$1: the upcycled model's first loss $3 is not the dense model's $2"
}
# shellcheck disable=SC2086 # lists of overrides
{
    go dense 1 "checkpoint%save='dense'" || { cat dense.log; fail "the dense run failed"; }
    # the dense model's loss at its checkpoint: one more iteration, resumed
    go dense3 1 "checkpoint%load='dense'" training%train_iters=3 || { cat dense3.log; fail "the dense resume failed"; }
    ref=$(loss_at dense3 3)
    go up 4 $MOE $TP2 $EP2 "checkpoint%load='dense'" "checkpoint%save='up'" ||
        { cat up.log; fail "the upcycled run failed"; }
    grep -q "upcycled the dense checkpoint dense/iter_0000002" up.log || { cat up.log; fail "up did not upcycle"; }
    same_loss "from the moetrain checkpoint (TP 2 x EP 2)" "$ref" "$(loss_at up 1)"
    [ "$(field up.jsonl loss | wc -l)" = 3 ] || fail "up did not log 3 iterations"
    awk -v a="$(loss_at up 1)" -v b="$(loss_at up 3)" 'BEGIN { exit !(b > 0 && b < a) }' ||
        fail "up did not train: its loss went from $(loss_at up 1) to $(loss_at up 3)"
    "$MOETRAIN" export-hf dense hf_dense > /dev/null || fail "export-hf of the dense checkpoint failed"
    grep -q Qwen3ForCausalLM hf_dense/config.json || fail "the dense export is not Qwen3ForCausalLM"
    go uphf 2 $MOE $EP2 "checkpoint%load_hf='hf_dense'" || { cat uphf.log; fail "the upcycled run from hf_dense failed"; }
    grep -q "upcycled (every expert a copy of the dense MLP)" uphf.log || { cat uphf.log; fail "uphf did not upcycle"; }
    same_loss "from the Hugging Face directory (EP 2)" "$ref" "$(loss_at uphf 1)"
    # errors: the expert width, a checkpoint with experts
    go bad1 1 $MOE moe%moe_ffn_hidden_size=32 "checkpoint%load='dense'" && fail "an expert width of 32 was accepted"
    grep -q "moe%moe_ffn_hidden_size = 32 must equal the dense model's FFN width" bad1.log || { cat bad1.log; fail "bad1: not the message"; }
    go bad2 1 $MOE moe%moe_ffn_hidden_size=32 "checkpoint%load_hf='hf_dense'" && fail "load_hf: an expert width of 32 was accepted"
    grep -q "intermediate_size = 48 but moe%moe_ffn_hidden_size" bad2.log || { cat bad2.log; fail "bad2: not the message"; }
    go bad3 1 $MOE "checkpoint%load='up'" && fail "upcycling an MoE checkpoint was accepted"
    grep -q "already holds routed experts" bad3.log || { cat bad3.log; fail "bad3: not the message"; }
}
echo PASS

#!/bin/sh
# Hugging Face directories against transformers (tests/train/hf_oracle.py), for
# Qwen3-MoE, Mixtral and dense Qwen3, on a dataset whose every sample is one sequence:
# - export: a run's first loss (at its initial weights: the learning rate of the first
#   iteration is 0 in warmup, so its checkpoint holds them) equals the loss transformers
#   computes on the same tokens from `moetrain export-hf`'s directory (1e-5 relative);
# - import: a random model transformers wrote with save_pretrained, in fp32 and in bf16,
#   and for the MoE families in fp32 with the experts fused as transformers holds them
#   (gate_up_proj, down_proj: save_original_format=False), gives a run with
#   checkpoint%load_hf the first loss transformers computes for it.
# Skipped when torch and transformers cannot be imported.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
py=${PYTHON3:-python3}
oracle="$MT_TOP_SRCDIR/tests/train/hf_oracle.py"
"$py" -c 'import torch, transformers' > /dev/null 2>&1 ||
    { echo "SKIP: torch and transformers cannot be imported by $py (pip install torch transformers)"; exit 77; }
cd "$tmp" || exit 1
same_sample_data same
cat > base.nml <<NML
&model num_layers = 2, hidden_size = 32, num_attention_heads = 4, num_query_groups = 2,
  kv_channels = 8, ffn_hidden_size = 64, vocab_size = 257, max_position_embeddings = 64,
  qk_layernorm = .true., untie_embeddings_and_output_weights = .true. /
&moe num_experts = 4, moe_ffn_hidden_size = 32, router_topk = 2, layer_freq = 1, 0 /
&training micro_batch_size = 1, global_batch_size = 1, seq_length = 16, train_iters = 1,
  eval_iters = 0, eval_interval = 100, seed = 3 /
&optimizer lr = 1.0e-3, lr_warmup_iters = 1 /
&data data_path = 'same', split = '100,0,0' /
NML
qwen3_moe=""
mixtral="model%qk_layernorm=F moe%layer_freq=1,1"
qwen3="moe%num_experts=0 moe%layer_freq=0,0"

# first_loss NAME: the loss of NAME's first iteration
first_loss() { json_field "$1.jsonl" loss | head -n 1; }
# same_loss WHAT REF GOT: within 1e-5 relative
same_loss() {
    echo "  $1: transformers $2, moetrain $3"
    awk -v a="$2" -v b="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 1e-5 * (a < 0 ? -a : a)) }' ||
        fail "$1: moetrain's loss $3 is not transformers' $2 within 1e-5"
}
# shellcheck disable=SC2086 # the tokens
"$py" "$oracle" make tf $SAME_TOKENS > refs.txt 2> make.err || { cat make.err; fail "transformers could not write its models"; }
checks=
for family in qwen3_moe mixtral qwen3; do
    eval "ov=\$$family"
    # export: the run's first loss, checked by transformers below
    # shellcheck disable=SC2086 # a list of overrides
    "$MOETRAIN" base.nml $ov "checkpoint%save='ck_$family'" "logging%metrics_file='out_$family.jsonl'" \
        > "out_$family.log" 2>&1 || { cat "out_$family.log"; fail "$family: training failed"; }
    "$MOETRAIN" export-hf "ck_$family" "hf_$family" || fail "$family: export-hf failed"
    checks="$checks hf_$family=$(first_loss "out_$family")"
    # import, fp32 and bf16, and fp32 with fused experts
    dtypes="float32 bfloat16"
    [ "$family" = qwen3 ] || dtypes="$dtypes fused"
    for dtype in $dtypes; do
        ref=$(awk -v f="$family" -v d="$dtype" '$1 == f && $2 == d { print $3 }' refs.txt)
        # shellcheck disable=SC2086 # a list of overrides
        "$MOETRAIN" base.nml $ov "checkpoint%load_hf='tf_${family}_$dtype'" \
            "logging%metrics_file='in_${family}_$dtype.jsonl'" > "in_${family}_$dtype.log" 2>&1 ||
            { cat "in_${family}_$dtype.log"; fail "$family: load_hf of $dtype failed"; }
        grep -q "initial weights from the Hugging Face directory" "in_${family}_$dtype.log" ||
            fail "$family: the run did not say it loaded the directory"
        same_loss "$family import ($dtype)" "$ref" "$(first_loss "in_${family}_$dtype")"
    done
done
echo "export:"
# shellcheck disable=SC2086 # the directories and the tokens
"$py" "$oracle" check $checks -- $SAME_TOKENS || fail "export"
echo "PASS"

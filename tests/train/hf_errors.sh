#!/bin/sh
# Hugging Face directories that cannot be used, and models export-hf cannot write: each
# is a clear error, and nothing is written (no export directory, no checkpoint saved).
# The damaged safetensors files are made with Python's standard library (skipped
# without python3).
. "$MT_TOP_SRCDIR/tests/train/common.sh"
py=${PYTHON3:-python3}
cd "$tmp" || exit 1
cat > q.nml <<NML
&model num_layers = 2, hidden_size = 32, num_attention_heads = 4, num_query_groups = 2,
  kv_channels = 8, ffn_hidden_size = 64, vocab_size = 257, max_position_embeddings = 64,
  qk_layernorm = .true. /
&moe num_experts = 4, moe_ffn_hidden_size = 32, router_topk = 2, layer_freq = 1, 0 /
&training micro_batch_size = 2, global_batch_size = 2, seq_length = 16, train_iters = 1,
  eval_iters = 0, eval_interval = 100 /
&data data_path = 'corpus/kjv_text_document', split = '98,1,1' /
NML
"$MOETRAIN" q.nml "checkpoint%save='ck'" > ck.log 2>&1 || { cat ck.log; fail "training failed"; }
"$MOETRAIN" export-hf ck hf > /dev/null || fail "export-hf failed"

# expect NAME MESSAGE ARGS...: moetrain ARGS fails, saying MESSAGE, saving nothing
expect() {
    name=$1 msg=$2
    shift 2
    if "$MOETRAIN" "$@" "checkpoint%save='save_$name'" > "$name.log" 2>&1; then
        cat "$name.log"; fail "$name: accepted"
    fi
    grep -qF -- "$msg" "$name.log" || { cat "$name.log"; fail "$name: the message lacks: $msg"; }
    if ls "save_$name"/iter_* > /dev/null 2>&1; then fail "$name: a checkpoint was saved"; fi
    echo "  $name: $(grep -m1 'error' "$name.log")"
}
# export_fails NAME MESSAGE ARGS...: export-hf ARGS fails, saying MESSAGE; OUT is not made
export_fails() {
    name=$1 msg=$2
    shift 2
    if "$MOETRAIN" export-hf "$@" > "$name.log" 2>&1; then fail "$name: accepted"; fi
    grep -qF -- "$msg" "$name.log" || { cat "$name.log"; fail "$name: the message lacks: $msg"; }
    if ls -d out* > /dev/null 2>&1; then fail "$name: export-hf left $(ls -d out*)"; fi
    echo "  $name: $(cat "$name.log")"
}

echo "export-hf:"
mkdir exists
export_fails exists "'exists' exists; give a new directory" ck exists
"$MOETRAIN" "$small" training%train_iters=1 optimizer%lr_warmup_iters=0 "checkpoint%save='sig'" > sig.log 2>&1 || { cat sig.log; fail "training failed"; }
export_fails sigmoid "moe%router_score_function = 'sigmoid'" sig out
"$MOETRAIN" q.nml moe%shared_expert_intermediate_size=32 "checkpoint%save='shared'" > sh.log 2>&1 || fail "training failed"
export_fails shared "Qwen3-MoE and Mixtral have no shared expert" shared out
"$MOETRAIN" q.nml model%qk_layernorm=F "checkpoint%save='mixed'" > mx.log 2>&1 || fail "training failed"
export_fails mixtral_dense "Mixtral, which has an MoE block in every layer, but moe%layer_freq(2) = 0" mixed out
export_fails nockpt "checkpoint 'nowhere': No such file or directory" nowhere out
export_fails dtype "--dtype takes fp32 or bf16" --dtype fp16 ck out

echo "checkpoint%load_hf:"
expect notdir "'nowhere' is not a directory" q.nml "checkpoint%load_hf='nowhere'"
mkdir noconfig && cp hf/*.safetensors hf/*.index.json noconfig/
expect noconfig "'noconfig' has no config.json" q.nml "checkpoint%load_hf='noconfig'"
expect hidden "config.json' has hidden_size = 32 but model%hidden_size = 64" q.nml model%hidden_size=64 "checkpoint%load_hf='hf'"
expect experts "config.json' has num_experts = 4 but moe%num_experts = 8" q.nml moe%num_experts=8 "checkpoint%load_hf='hf'"
expect layers "config.json' makes layer 1 dense" q.nml moe%layer_freq=1,1 "checkpoint%load_hf='hf'"
expect qknorm "model%qk_layernorm = .false. (set it to .true.)" q.nml model%qk_layernorm=F "checkpoint%load_hf='hf'"
mkdir nofiles && cp hf/config.json nofiles/
expect nofiles "neither model.safetensors.index.json nor model.safetensors" q.nml "checkpoint%load_hf='nofiles'"

command -v "$py" > /dev/null 2>&1 || { echo "SKIP (the rest): no python3"; exit 0; }
# edit DIR KEY WHAT: rewrites DIR's one safetensors file: drops tensor KEY (drop), makes
# it F16 (f16: half its bytes), or makes it one row shorter (short)
cat > edit.py <<'PY'
import json, struct, sys, glob
d, key, what = sys.argv[1:]
path = glob.glob(d + "/model-*.safetensors")[0]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
data = raw[8 + n:]
out, blobs, at = {}, [], 0
for k, v in head.items():
    if k == "__metadata__":
        out[k] = v
        continue
    b = data[v["data_offsets"][0]:v["data_offsets"][1]]
    if k == key:
        if what == "drop":
            continue
        if what == "f16":
            v["dtype"], b = "F16", b[:len(b) // 2]
        if what == "short":
            row = len(b) // v["shape"][0]
            v["shape"][0] -= 1
            b = b[:len(b) - row]
    v["data_offsets"] = [at, at + len(b)]
    at += len(b)
    out[k] = v
    blobs.append(b)
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
for w in drop f16 short; do cp -r hf "hf_$w"; "$py" edit.py "hf_$w" model.layers.0.mlp.experts.1.up_proj.weight $w || fail "edit.py failed"; done
expect missing "'hf_drop' has no tensor 'model.layers.0.mlp.experts.1.up_proj.weight' that this model has" q.nml "checkpoint%load_hf='hf_drop'"
expect f16 "tensor 'model.layers.0.mlp.experts.1.up_proj.weight' in 'hf_f16/model-00001-of-00001.safetensors' has dtype F16; moetrain loads F32 and BF16 tensors" q.nml "checkpoint%load_hf='hf_f16'"
expect shape "tensor 'model.layers.0.mlp.experts.1.up_proj.weight' is [31, 32] in 'hf_short/model-00001-of-00001.safetensors' but [32, 32] in this model" q.nml "checkpoint%load_hf='hf_short'"
echo PASS

#!/bin/sh
# Activation offloading on the CUDA backend (tests/gpu/moetrain-emu: the real
# kernels/cuda code on the emulated device, its streams deferred, so that a copy the
# compute stream does not wait for runs late and is reported as unordered device work):
# the layout model of tests/parallel (a dense layer between MoE layers, a shared expert,
# QK-norm, sigmoid routing) trained in bf16 for 3 iterations keeping every activation,
# offloading every module, two of them, the routed experts' two (expert_fc1, moe_act),
# and every module with selective recompute. The
# losses, balancing and z losses, gradient norms and expert loads of every iteration
# and the final validation loss are bit-identical; offloading makes the host wait no
# more often; the bytes copied per step are the memory report's, and the report of
# --log-memory is --check's. The guard backend checks the copies' order against the
# CPU reference, and the CPU backend refuses the key. Never skipped.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
MOETRAIN="${MT_TOP_BUILDDIR:-.}/tests/gpu/moetrain-emu"
CPU_MOETRAIN="${MT_TOP_BUILDDIR:-.}/moetrain"
nml="$MT_TOP_SRCDIR/tests/parallel/moe.nml"
all="recompute%offload_modules='attn_norm','qkv_linear','core_attn','attn_proj','mlp_norm','expert_fc1','moe_act'"
on="recompute%fine_grained_activation_offloading=.true."
set -- training%train_iters=3 training%micro_batch_size=1 training%global_batch_size=2 \
    training%seq_length=16 training%eval_interval=3 training%eval_iters=1 logging%log_interval=1 \
    "precision%params_dtype='bf16'"
common="$*"

# train NAME BINARY BACKEND OVERRIDES...: log in $tmp/NAME.log, metrics in $tmp/NAME.jsonl
train() {
    name=$1 bin=$2 backend=$3
    shift 3
    # shellcheck disable=SC2086 # a list of overrides
    (cd "$MT_TOP_BUILDDIR" && MT_EMU_STREAMS=deferred "$bin" --backend="$backend" "$nml" $common \
        logging%log_memory=.true. "logging%metrics_file='$tmp/$name.jsonl'" "$@") \
        > "$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; fail "$name: training failed"; }
    grep -q '"val_loss": ' "$tmp/$name.jsonl" || { cat "$tmp/$name.log"; fail "$name: no val_loss"; }
}

# values NAME: the compared figures of every line
values() {
    grep -o '"\(loss\|val_loss\|aux_loss\|z_loss\|grad_norm\|dropped_tokens\|expert_load_min\|expert_load_max\)": [^,}]*' \
        "$tmp/$1.jsonl"
}

# costs NAME: the CUDA backend's kernel launches and host synchronisations of each step
costs() { grep -o 'kernel launches [0-9.]*, host synchronisations [0-9.]*' "$tmp/$1.log"; }

# report NAME: the memory report's line of its log
report() { grep '^  stage 0, rank 0: parameters' "$tmp/$1.log"; }

train keep "$MOETRAIN" cuda
values keep > "$tmp/keep.values"
[ -s "$tmp/keep.values" ] || fail "keep: no figures in its metrics"
for s in "all:$all" \
         "two:recompute%offload_modules='core_attn','mlp_norm'" \
         "experts:recompute%offload_modules='expert_fc1','moe_act'" \
         "selective:$all recompute%granularity='selective' recompute%modules='core_attn','layernorm','moe_act'"; do
    name=${s%%:*}
    # shellcheck disable=SC2086 # a list of overrides
    train "$name" "$MOETRAIN" cuda "$on" ${s#*:}
    values "$name" > "$tmp/$name.values"
    cmp -s "$tmp/keep.values" "$tmp/$name.values" ||
        { diff "$tmp/keep.values" "$tmp/$name.values" | head; fail "$name: differs from the run that keeps every activation"; }
    # per step, the host launches (recompute aside) and waits as often as without
    # offloading: copies and events are queued, never waited for on the host
    costs "$name" > "$tmp/$name.costs"
    costs keep > "$tmp/keep.costs"
    if [ "$name" = selective ]; then
        sed -i 's/.*, //' "$tmp/keep.costs" "$tmp/$name.costs"
    fi
    [ -s "$tmp/keep.costs" ] && cmp -s "$tmp/keep.costs" "$tmp/$name.costs" ||
        { diff "$tmp/keep.costs" "$tmp/$name.costs"; fail "$name: the host's launches and waits per step differ from keeping everything"; }
    syncs="$(tail -1 "$tmp/$name.costs") per step"
    # the memory report: the copies measured per step are its traffic, --check agrees
    line=$(report "$name")
    each=$(echo "$line" | sed -n 's/.* \([0-9]*\) bytes each way per step$/\1/p')
    [ -n "$each" ] && [ "$each" -gt 0 ] || fail "$name: no offload traffic in the memory report: $line"
    grep -q "offloaded per step: $each bytes to host, $each back" "$tmp/$name.log" ||
        { grep -o 'offloaded per step: [^|]*' "$tmp/$name.log" | head -3; fail "$name: the steps did not copy $each bytes each way"; }
    # shellcheck disable=SC2086 # a list of overrides
    (cd "$MT_TOP_BUILDDIR" && "$CPU_MOETRAIN" --check "$nml" $common "$on" ${s#*:}) > "$tmp/$name.check" 2>&1 ||
        { cat "$tmp/$name.check"; fail "$name: --check failed"; }
    grep -qxF -- "$line" "$tmp/$name.check" ||
        { echo "run:   $line"; grep '^  stage 0' "$tmp/$name.check"; fail "$name: --log-memory differs from --check"; }
    echo "  $name: $(wc -l < "$tmp/$name.values") figures bit-identical to keeping every activation, $syncs, $each bytes each way per step"
done
# the device memory given back: the activations shrink by more than the offload buffer
act() { report "$1" | sed -n 's/.* activations \([0-9]*\) .*/\1/p'; }
buf=$(report all | sed -n 's/.*offload buffer \([0-9]*\) .*/\1/p')
[ $(($(act keep) - $(act all))) -gt "$buf" ] ||
    fail "offloading every module keeps $(act all) bytes of activations and a $buf-byte buffer, keeping everything $(act keep)"
echo "  device activations $(act keep) -> $(act all) bytes and a $buf-byte offload buffer"

# the guard backend: the CPU kernels on emulated device memory check the copies' order
# (a tensor touched before its copy was waited for aborts), results the CPU's
train cpu "$CPU_MOETRAIN" cpu
train guard "$CPU_MOETRAIN" guard "$on" "$all"
values cpu > "$tmp/cpu.values"
values guard > "$tmp/guard.values"
cmp -s "$tmp/cpu.values" "$tmp/guard.values" ||
    { diff "$tmp/cpu.values" "$tmp/guard.values" | head; fail "guard: offloading differs from the CPU backend keeping everything"; }
echo "  guard: offloading every module is bit-identical to the CPU backend keeping everything"

# the CPU backend refuses it, at the start and in --check --backend cpu
for how in "--backend=cpu" "--check --backend=cpu"; do
    # shellcheck disable=SC2086 # the options
    if (cd "$MT_TOP_BUILDDIR" && "$CPU_MOETRAIN" $how "$nml" $common "$on" "$all") > "$tmp/refused" 2>&1; then
        fail "$how: offloading accepted on the CPU backend"
    fi
    grep -q "offloading needs a GPU backend; on the CPU backend use &recompute" "$tmp/refused" ||
        { cat "$tmp/refused"; fail "$how: not refused with the reason"; }
done
echo "activation offloading on the CUDA backend (emulated, deferred streams) trains exactly as keeping every activation"

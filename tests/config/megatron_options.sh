#!/bin/bash
# Megatron's flags given to moetrain as options: one error naming the moetrain
# setting (or why there is none), from the table of src/config/megatron.c.
set -u
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
nml=$MT_TOP_SRCDIR/namelists/tiny_moe.nml

# expect NEEDLE ARGS: moetrain ARGS fails with exactly one error line containing NEEDLE
expect() {
    needle=$1
    shift
    "$MOETRAIN" "$@" > "$tmp/out" 2>&1 && fail "moetrain $* succeeded"
    cat "$tmp/out"
    [ "$(grep -c 'error' "$tmp/out")" = 1 ] || fail "moetrain $*: not one error line"
    grep -qF -- "$needle" "$tmp/out" || fail "moetrain $*: no '$needle'"
}
expect "unknown option '--moe-router-topk'; did you mean moe%router_topk=VALUE? (Megatron's --moe-router-topk" \
    --moe-router-topk 2 "$nml"
expect "did you mean moe%router_topk=VALUE?" --moe-router-topk=2 "$nml"
expect "did you mean parallel%sequence_parallel=.true.?" --check --sequence-parallel "$nml"
expect "did you mean precision%params_dtype='bf16'?" --bf16 "$nml"
expect "did you mean recompute%granularity=VALUE? (Megatron's --recompute-granularity" \
    --recompute-granularity full "$nml"
expect "Megatron's --fp16 is refused in moetrain" --fp16 "$nml"
expect "Megatron's --train-samples becomes training%train_iters here, converted (samples / --global-batch-size" \
    --train-samples 1024 "$nml"
expect "Megatron's --lr-wsd-decay-samples is not implemented in moetrain (the warmup-stable-decay (WSD) schedule)" \
    --lr-wsd-decay-samples 4 "$nml"
expect "unknown option '--no-such-flag' (see moetrain --help)" --no-such-flag "$nml"
# and as an override, in Megatron's spelling of the key
expect "did you mean 'moe%router_topk'? (Megatron's --moe-router-topk)" --check "$nml" moe%moe_router_topk=2
expect "that is Megatron's --train-samples, which becomes 'training%train_iters' converted" --check "$nml" \
    training%train_samples=1024
echo "ok: Megatron flags as options and overrides"

#!/bin/sh
# Trains the small config: the loss falls, evaluations happen, the metrics file
# has the documented fields, and the log has Megatron's fields.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
cd "$tmp"
"$MOETRAIN" "$small" training%train_iters=30 training%eval_interval=10 \
    "logging%metrics_file='m.jsonl'" logging%log_memory=T > out.log 2>&1 || { cat out.log; fail "training failed"; }
cat out.log
for f in "consumed samples" "elapsed time per iteration (ms)" "tokens/s" "TFLOP/s" \
         "learning rate" "lm loss" "load_balancing_loss" "z_loss" "expert load min/max" \
         "grad norm" "number of skipped iterations" "memory per GPU in bytes" "validation loss at iteration 30"; do
    grep -q "$f" out.log || fail "log lacks '$f'"
done
[ "$(grep -c '"loss"' m.jsonl)" -eq 15 ] || fail "expected 15 training lines in the metrics file"
[ "$(grep -c '"val_loss"' m.jsonl)" -eq 3 ] || fail "expected 3 validation lines (iterations 10, 20, 30)"
first=$(json_field m.jsonl loss | head -1)
last=$(json_field m.jsonl loss | tail -1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }' || fail "loss did not fall: $first -> $last"
for k in iteration consumed_samples lr grad_norm tokens_per_s tflops aux_loss z_loss expert_load_min; do
    grep -q "\"$k\"" m.jsonl || fail "metrics lack $k"
done
echo "loss $first -> $last"

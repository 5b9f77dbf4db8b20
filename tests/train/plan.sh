#!/bin/sh
# moetrain plan: every layout it prints passes --check with the memory it reports (the
# most loaded rank's bytes equal the largest of --check's per-stage figures, which size
# every kind of rank), a model that fits nowhere and bad arguments fail with one clear
# message, a fixed axis is kept, and recompute is searched (or fixed by an override)
# with the bound it prunes by holding.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
cd "$tmp"
nml="$MT_TOP_SRCDIR/namelists/tiny_moe.nml"
plan() { "$MOETRAIN" plan "$@"; }
expect_fail() { # expect_fail NEEDLE ARGS...: moetrain plan must exit 1 with NEEDLE on stderr
    needle=$1; shift
    plan "$@" > out.log 2> err.log && { cat out.log err.log; fail "expected failure: $*"; }
    grep -q -- "$needle" err.log || { cat err.log; fail "message lacks '$needle': $*"; }
    [ "$(grep -c 'error: ' err.log)" -eq 1 ] || { cat err.log; fail "expected one error: $*"; }
}

# run_check ARGS: moetrain with the arguments of a printed check command, as a shell
# reads them (the command quotes the namelist strings for the shell)
run_check() { eval "\"\$MOETRAIN\" $1"; }

# 16 GPUs, 4 layouts: each one's --check passes, and its bytes are --check's largest
plan --gpus 16 --gpu h100 --global-batch 64 --top 4 "$nml" > plan.log 2>&1 ||
    { cat plan.log; fail "plan on 16 GPUs"; }
[ "$(grep -c '^ *[0-9]*\. TP' plan.log)" -eq 4 ] || { cat plan.log; fail "expected 4 layouts"; }
grep 'check: ' plan.log | sed 's/^ *check: moetrain //' > checks
n=0
while read -r args; do
    n=$((n + 1))
    planned=$(grep -A2 "^ *$n\. TP" plan.log | sed -n 's/.*total [0-9.]* (\([0-9]*\) bytes).*/\1/p')
    run_check "$args" > check.log 2>&1 || { cat check.log; fail "layout $n fails --check: $args"; }
    checked=$(sed -n 's/.*| total \([0-9]*\) (.*/\1/p' check.log | sort -n | tail -1)
    [ -n "$planned" ] && [ "$planned" = "$checked" ] ||
        { cat plan.log check.log; fail "layout $n: plan says $planned bytes, --check $checked"; }
done < checks
[ "$n" -eq 4 ] || fail "expected 4 check commands, got $n"

# the top layout fits: its check passes with the planned limit, and fails below it
args=$(head -1 checks)
limit=$(grep -m1 'total .* bytes) of' plan.log | sed 's/.* of \([0-9.]*\)$/\1/')
[ "$limit" = "74.0" ] || fail "usable memory of an H100: $limit GiB, expected 74.0"
run_check "$args precision%gpu_memory_gb=0.000001" > /dev/null 2>&1 &&
    fail "--check of the top layout should fail with a 1 KiB limit"

# a fixed axis: only layouts with TP 1 and EP 2
plan --gpus 16 --gpu h100 --global-batch 64 --top 3 "$nml" parallel%tensor_model_parallel_size=1 \
    parallel%expert_model_parallel_size=2 > fixed.log 2>&1 || { cat fixed.log; fail "fixed axes"; }
[ "$(grep -c '^ *[0-9]*\. TP 1 x .* EP 2 x' fixed.log)" -eq 3 ] || { cat fixed.log; fail "fixed TP and EP"; }
grep '^ *[0-9]*\. TP' fixed.log | grep -v 'TP 1 x .*EP 2 x' && fail "a layout outside the fixed axes"

# the namelists' &recompute: with one layout fixed, full recompute plans less memory and
# models fewer tokens/s (the forward it runs again), and its check command carries it
one="parallel%tensor_model_parallel_size=1 parallel%pipeline_model_parallel_size=1
parallel%expert_model_parallel_size=2 parallel%expert_tensor_parallel_size=1 training%micro_batch_size=2"
# shellcheck disable=SC2086
plan --gpus 16 --gpu h100 --global-batch 64 --top 1 "$nml" $one > keep.log 2>&1 || { cat keep.log; fail "plan without recompute"; }
# shellcheck disable=SC2086
plan --gpus 16 --gpu h100 --global-batch 64 --top 1 "$nml" $one "recompute%granularity='full'" \
    "recompute%method='uniform'" recompute%num_layers=1 > rc.log 2>&1 || { cat rc.log; fail "plan with recompute"; }
grep -q "check: .*\"recompute%granularity='full'\"" rc.log || { cat rc.log; fail "the check command lacks &recompute"; }
rate() { sed -n 's/.*modelled: \([0-9]*\) tokens.*/\1/p' "$1" | head -1; }
bytes() { sed -n 's/.*total [0-9.]* (\([0-9]*\) bytes).*/\1/p' "$1" | head -1; }
awk -v a="$(rate keep.log)" -v b="$(rate rc.log)" -v m="$(bytes keep.log)" -v n="$(bytes rc.log)" \
    'BEGIN { exit !(b < a && n < m && b > 0 && n > 0) }' ||
    { cat keep.log rc.log; fail "full recompute: expected fewer tokens/s and fewer bytes"; }
echo "ok: full recompute: $(rate keep.log) -> $(rate rc.log) tokens/s/GPU, $(bytes keep.log) -> $(bytes rc.log) bytes"
grep -q 'recompute searched' keep.log || { cat keep.log; fail "recompute should be searched"; }
grep -q 'recompute as the namelists and overrides set it (full uniform 1)' rc.log ||
    { cat rc.log; fail "an override should fix recompute"; }

# recompute searched: with memory between what that layout needs with and without full
# recompute, the layout fits only with some recompute setting; the fastest such is
# printed with its keys in its check command, which passes with the planned bytes, and
# the setting without recompute is shown not to fit
limit=$(awk -v a="$(bytes keep.log)" -v b="$(bytes rc.log)" 'BEGIN { printf "%.6f", (a + b) / 2 / 1073741824 }')
# shellcheck disable=SC2086
plan --gpus 16 --gpu h100 --global-batch 64 --top 1 "$nml" $one precision%gpu_memory_gb=$limit \
    > tight.log 2>&1 || { cat tight.log; fail "plan with memory for some recompute"; }
grep -q '^ *1\. TP .*, recompute \(selective\|full\)' tight.log ||
    { cat tight.log; fail "expected the fitting layout to recompute"; }
grep -q ' -  TP .*, recompute none: does not fit' tight.log ||
    { cat tight.log; fail "expected the layout without recompute shown not to fit"; }
grep -A3 '^ *1\. TP' tight.log | grep 'check: ' | sed 's/^ *check: moetrain //' > tight.check
grep -q "recompute%granularity=" tight.check || { cat tight.log; fail "no recompute keys in the check"; }
run_check "$(cat tight.check)" > tight-check.log 2>&1 || { cat tight.log tight-check.log; fail "--check of the recomputing layout"; }
planned=$(grep -A2 '^ *1\. TP' tight.log | sed -n 's/.*total [0-9.]* (\([0-9]*\) bytes).*/\1/p')
checked=$(sed -n 's/.*total \([0-9]*\) (.*/\1/p' tight-check.log | sort -n | tail -1)
[ "$planned" = "$checked" ] || { cat tight.log tight-check.log; fail "planned $planned bytes, --check $checked"; }
echo "ok: under $limit GiB: $(grep '^ *1\. TP' tight.log | sed 's/.*, recompute //')"

# the bound the search prunes with: no recompute setting saves fewer activation bytes, on
# any stage, than full recompute of groups of one layer (check_layout in src/plan/plan.c);
# a dense first layer and a shared expert, so that every module is there
acts() { # acts LOG: each stage's activation bytes
    sed -n 's/.*stage \([0-9]*\), rank .* activations \([0-9]*\) .*/\1 \2/p' "$1"; }
layout="--world-size 8 $nml parallel%tensor_model_parallel_size=2 parallel%sequence_parallel=T
parallel%pipeline_model_parallel_size=2 parallel%expert_model_parallel_size=2 training%micro_batch_size=2
moe%layer_freq=0,1 moe%shared_expert_intermediate_size=32"
# shellcheck disable=SC2086
"$MOETRAIN" --check $layout "recompute%granularity='full'" "recompute%method='uniform'" \
    recompute%num_layers=1 > full.log 2>&1 || { cat full.log; fail "--check with full recompute"; }
acts full.log > full.acts
[ "$(wc -l < full.acts)" -eq 2 ] || { cat full.log; fail "expected 2 stages"; }
for mods in "'moe_act','layernorm'" "'core_attn'" "'core_attn','moe_act','layernorm'" \
    "'core_attn','layernorm','moe'" "'mlp'" "'shared_experts'" "'layernorm','mlp'" NONE OFFLOAD \
    "OFFLOAD'core_attn','layernorm','moe'"; do
    # OFFLOAD: the search's offloading of every module but attn_norm (plan.c, offload_order)
    off="recompute%fine_grained_activation_offloading=T recompute%offload_modules='expert_fc1','moe_act','core_attn','attn_proj','qkv_linear','mlp_norm'"
    # shellcheck disable=SC2086 # a list of overrides
    case $mods in
    NONE) set -- ;;
    OFFLOAD) set -- $off ;;
    OFFLOAD*) set -- $off "recompute%granularity='selective'" "recompute%modules=${mods#OFFLOAD}" ;;
    *) set -- "recompute%granularity='selective'" "recompute%modules=$mods" ;;
    esac
    # shellcheck disable=SC2086
    "$MOETRAIN" --check $layout "$@" > sel.log 2>&1 || { cat sel.log; fail "--check with $mods"; }
    acts sel.log | paste full.acts - | awk -v m="$mods" '$1 != $3 || $2 > $4 {
        print "stage " $1 ": full recompute keeps " $2 " bytes, " m " " $4; bad = 1 }
        END { exit bad }' || fail "a recompute setting keeps fewer activations than full"
done
echo "ok: full recompute of single layers keeps the fewest activation bytes on every stage (offloading too)"

# check_first NAME: the check command in NAME.check (the first layout's of NAME.log)
# passes, and its most loaded rank's bytes are the plan's; sets $planned
check_first() {
    run_check "$(cat "$1.check")" > "$1-check.log" 2>&1 || { cat "$1.log" "$1-check.log"; fail "$1: --check of the first layout"; }
    planned=$(grep -A2 '^ *1\. TP' "$1.log" | sed -n 's/.*total [0-9.]* (\([0-9]*\) bytes).*/\1/p')
    checked=$(sed -n 's/.*| total \([0-9]*\) (.*/\1/p' "$1-check.log" | sort -n | tail -1)
    [ -n "$planned" ] && [ "$planned" = "$checked" ] ||
        { cat "$1.log" "$1-check.log"; fail "$1: planned $planned bytes, --check $checked"; }
}

# offloading searched after recompute: Qwen3-235B-A22B on 256 GB200 with its layout fixed
# (row A of doc/plan.md) and 250 GiB: no recompute setting but full or moe fits, and
# offloading the experts' modules beside cheap recompute is faster than those; the
# chosen setting's check command carries the offloading keys and passes with the bytes
# the plan reports
big="--gpu gb200 --gpus 256 --nodes-file $MT_TOP_SRCDIR/tests/fixtures/plan/gb200_4x64.nodes
--global-batch 8192 $MT_TOP_SRCDIR/namelists/qwen3_235b_a22b.nml parallel%tensor_model_parallel_size=1
parallel%pipeline_model_parallel_size=8 parallel%virtual_pipeline_model_parallel_size=3
parallel%expert_model_parallel_size=32 parallel%expert_tensor_parallel_size=1 training%micro_batch_size=1"
# shellcheck disable=SC2086
plan $big --top 1 precision%gpu_memory_gb=250 > off.log 2>&1 || { cat off.log; fail "plan with offloading"; }
grep -q '^ *1\. TP .*, recompute .*, offload expert_fc1+moe_act$' off.log ||
    { cat off.log; fail "expected the experts' modules offloaded in the first layout"; }
grep -A1 '^ *1\. TP' off.log | grep -q 'offload copies [0-9]*%' ||
    { cat off.log; fail "no offload copies in the step"; }
grep -A2 '^ *1\. TP' off.log | grep -q 'offloaded to pinned host memory [0-9.]* GiB, [1-9][0-9]* bytes each way per step' ||
    { cat off.log; fail "no pinned host memory and traffic in the memory line"; }
grep 'check: ' off.log | tail -1 | sed 's/^ *check: moetrain //' > off.check
grep -q "recompute%fine_grained_activation_offloading=T \"recompute%offload_modules='expert_fc1','moe_act'\"" off.check ||
    { cat off.log; fail "no offloading keys in the check command"; }
check_first off
grep -q '^ *-  TP .*, recompute selective moe_act+layernorm: does not fit' off.log ||
    { cat off.log; fail "expected the cheap recompute without offloading shown not to fit"; }
echo "ok: under 250 GiB: $(grep '^ *1\. TP' off.log | sed 's/.*, recompute //') ($planned bytes, as --check)"

# the FP8 axis: the platform's recipe (blockwise on H100, mxfp8 on GB200) is tried where
# moetrain's configuration rules take it; with TP, EP and ETP fixed at 1 the first layout
# runs FP8 (its GEMMs at the FP8 peak), its check command carries the recipe and passes
# with the planned bytes; every FP8 layout of a free search passes --check, i.e. the
# plan proposes FP8 only where the rules take it
fp8one="parallel%tensor_model_parallel_size=1 parallel%expert_model_parallel_size=1 parallel%expert_tensor_parallel_size=1"
for gpu in h100:blockwise gb200:mxfp8; do
    # shellcheck disable=SC2086
    plan --gpus 16 --gpu ${gpu%:*} --global-batch 64 --top 1 "$nml" $fp8one > fp8.log 2>&1 ||
        { cat fp8.log; fail "plan with FP8 on ${gpu%:*}"; }
    grep -q "^ *1\. TP 1 x .*, FP8 ${gpu#*:}, recompute" fp8.log || { cat fp8.log; fail "${gpu%:*}: expected FP8 ${gpu#*:} first"; }
    grep 'check: ' fp8.log | tail -1 | sed 's/^ *check: moetrain //' > fp8.check
    grep -q "\"precision%fp8_format='e4m3'\" \"precision%fp8_recipe='${gpu#*:}'\"" fp8.check ||
        { cat fp8.log; fail "${gpu%:*}: no FP8 keys in the check command"; }
    check_first fp8
    echo "ok: ${gpu%:*}: $(grep '^ *1\. TP' fp8.log | sed 's/^ *1\. //') ($planned bytes, as --check)"
done
# shellcheck disable=SC2086
plan --gpus 16 --gpu h100 --global-batch 64 --top 1 "$nml" $fp8one "precision%fp8_format=''" > bf16.log 2>&1 ||
    { cat bf16.log; fail "plan with precision%fp8_format=''"; }
grep -q 'precision as the namelists set it' bf16.log && ! grep -q 'FP8\|BF16' bf16.log ||
    { cat bf16.log; fail "precision%fp8_format='' should fix BF16"; }
plan --gpus 16 --gpu h100 --global-batch 64 --top 40 "$nml" parallel%tensor_model_parallel_size=1 \
    > free.log 2>&1 || { cat free.log; fail "plan, 40 layouts"; }
grep -q 'accepted by .* ([1-9][0-9]* of them in FP8 too)' free.log || { cat free.log; fail "no layout tried in FP8"; }
grep -A3 '^ *[0-9]*\. TP.*, FP8 blockwise' free.log | grep 'check: ' | sed 's/^ *check: moetrain //' > fp8s
while read -r args; do
    run_check "$args" > check.log 2>&1 || { cat check.log; fail "an FP8 layout the rules refuse: $args"; }
done < fp8s
[ -s fp8s ] && grep -q '^ *[0-9]*\. TP.*, BF16' free.log || { cat free.log; fail "expected FP8 and BF16 layouts among 40"; }
echo "ok: $(wc -l < fp8s) FP8 layouts of 40 with TP 1 pass --check"

# the overlap keys: the same layout planned with and without each; its 'overlap:' line
# says the term's traffic and what the key hides of it, and the step (from tokens/s/GPU:
# 64 x 128 tokens over 16 GPUs) is lower by that, the compute that covers it bounding it
step_ms() { awk -v t="$(rate "$1")" 'BEGIN { printf "%.10g", 64 * 128 / (t * 16) * 1e3 }'; }
olap() { grep -m1 '^    overlap: ' "$1" | sed -n "s/$2/p"; }
near() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 2e-3 * (b < 0 ? -b : b) + 1e-12) }'; }
# shellcheck disable=SC2086
plan --gpus 16 --gpu h100 --global-batch 64 --top 1 "$nml" $one > ov0.log 2>&1 || { cat ov0.log; fail "plan without overlap"; }
grep -q '^    overlap: ' ov0.log && { cat ov0.log; fail "an overlap line without the keys"; }
# overlap_grad_reduce: the tiny model's DP traffic is longer than its backward, so all the
# buckets but the last hide (n - 1) / n of the backward, and the rest is charged
# shellcheck disable=SC2086
plan --gpus 16 --gpu h100 --global-batch 64 --top 1 "$nml" $one parallel%overlap_grad_reduce=T \
    > ovg.log 2>&1 || { cat ovg.log; fail "plan with overlap_grad_reduce"; }
set -- $(olap ovg.log '.*DP \([^ ]*\) ms in \([0-9]*\) buckets, \([^ ]*\) hidden by overlap_grad_reduce behind a backward of \([^ ]*\) ms.*/\1 \2 \3 \4')
[ $# -eq 4 ] || { cat ovg.log; fail "no DP overlap in the overlap line"; }
dp=$1 nb=$2 hid=$3 bwd=$4
awk -v t="$dp" -v n="$nb" -v h="$hid" -v b="$bwd" 'BEGIN { exit !(n > 1 && h > 0 && t / 2 > b) }' ||
    { cat ovg.log; fail "overlap_grad_reduce: expected DP traffic above the backward, something hidden"; }
near "$hid" "$(awk -v n="$nb" -v b="$bwd" 'BEGIN { print (n - 1) / n * b }')" ||
    { cat ovg.log; fail "overlap_grad_reduce: $hid ms hidden, expected ($nb - 1) / $nb of the $bwd ms backward"; }
near "$(awk -v a="$(step_ms ov0.log)" -v b="$(step_ms ovg.log)" 'BEGIN { print a - b }')" "$hid" ||
    { cat ov0.log ovg.log; fail "overlap_grad_reduce: the step is not lower by the $hid ms hidden"; }
# overlap_param_gather besides: the first forward hides the all-gathers, as far as it lasts
# shellcheck disable=SC2086
plan --gpus 16 --gpu h100 --global-batch 64 --top 1 "$nml" $one parallel%overlap_grad_reduce=T \
    parallel%overlap_param_gather=T > ovp.log 2>&1 || { cat ovp.log; fail "plan with overlap_param_gather"; }
set -- $(olap ovp.log '.*hidden by overlap_grad_reduce .*, \([^ ]*\) by overlap_param_gather behind a forward of \([^ ]*\) ms.*/\1 \2')
[ $# -eq 2 ] && awk -v h="$1" 'BEGIN { exit !(h > 0) }' || { cat ovp.log; fail "nothing hidden by overlap_param_gather"; }
near "$1" "$(awk -v n="$nb" -v f="$2" 'BEGIN { print (n - 1) / n * f }')" ||
    { cat ovp.log; fail "overlap_param_gather: $1 ms hidden, expected ($nb - 1) / $nb of the $2 ms forward"; }
near "$(awk -v a="$(step_ms ovg.log)" -v b="$(step_ms ovp.log)" 'BEGIN { print a - b }')" "$1" ||
    { cat ovg.log ovp.log; fail "overlap_param_gather: the step is not lower by the $1 ms hidden"; }
echo "ok: DP $dp ms: $hid hidden by overlap_grad_reduce, $1 by overlap_param_gather, the rest charged"
# moe_shared_expert_overlap (EP 2, a shared expert): the all-to-alls behind its GEMMs
# shellcheck disable=SC2086
plan --gpus 16 --gpu h100 --global-batch 64 --top 1 "$nml" $one moe%shared_expert_intermediate_size=256 \
    > ovs0.log 2>&1 || { cat ovs0.log; fail "plan with a shared expert"; }
# shellcheck disable=SC2086
plan --gpus 16 --gpu h100 --global-batch 64 --top 1 "$nml" $one moe%shared_expert_intermediate_size=256 \
    moe%moe_shared_expert_overlap=T > ovs.log 2>&1 || { cat ovs.log; fail "plan with moe_shared_expert_overlap"; }
set -- $(olap ovs.log '.*EP all-to-all \([^ ]*\) ms, \([^ ]*\) hidden by moe_shared_expert_overlap.*/\1 \2')
[ $# -eq 2 ] && awk -v t="$1" -v h="$2" 'BEGIN { exit !(h > 0 && h < t) }' ||
    { cat ovs.log; fail "moe_shared_expert_overlap: expected a part of the all-to-alls hidden"; }
near "$(awk -v a="$(step_ms ovs0.log)" -v b="$(step_ms ovs.log)" 'BEGIN { print a - b }')" "$2" ||
    { cat ovs0.log ovs.log; fail "moe_shared_expert_overlap: the step is not lower by the $2 ms hidden"; }
echo "ok: EP all-to-all $1 ms: $2 hidden by moe_shared_expert_overlap"
# overlap_p2p_comm (PP 2 x VPP 2, 4 layers): the steady phase's transfers behind the
# passes that follow them, the warm-up's and the flush's too with the second key; the
# bubble, a share of the slowest stage's time, shrinks with them
pp="parallel%tensor_model_parallel_size=1 parallel%pipeline_model_parallel_size=2
parallel%virtual_pipeline_model_parallel_size=2 parallel%expert_model_parallel_size=2
parallel%expert_tensor_parallel_size=1 training%micro_batch_size=1 model%num_layers=4 moe%layer_freq=4*1"
last=
for keys in "" parallel%overlap_p2p_comm=T "parallel%overlap_p2p_comm=T parallel%overlap_p2p_comm_warmup_flush=T"; do
    # shellcheck disable=SC2086
    plan --gpus 16 --gpu h100 --global-batch 64 --top 1 "$nml" $pp $keys > ovpp.log 2>&1 ||
        { cat ovpp.log; fail "plan with $keys"; }
    if [ -n "$last" ]; then
        set -- $(olap ovpp.log '.*PP transfers \([^ ]*\) ms, \([^ ]*\) hidden by overlap_p2p_comm.*/\1 \2')
        [ $# -eq 2 ] && awk -v t="$1" -v h="$2" -v l="$lasthid" -v d="$(awk -v a="$(step_ms "$last")" \
            -v b="$(step_ms ovpp.log)" 'BEGIN { print a - b }')" \
            'BEGIN { exit !(h > l && h <= t && d >= (h - l) * 0.998) }' ||
            { cat "$last" ovpp.log; fail "$keys: expected more hidden ($2 of $1 ms) and the step lower by it"; }
        echo "ok: PP transfers $1 ms: $2 hidden by $keys"
        lasthid=$2
    else
        lasthid=0
    fi
    cp ovpp.log ovpp-prev.log
    last=ovpp-prev.log
done
# the order of layouts can change: the shipped Qwen3-30B-A3B case, where a layout with
# more DP traffic gains more from overlap_grad_reduce and overtakes another
q30="--gpus 256 --gpu h100 --global-batch 1024 --top 3 $MT_TOP_SRCDIR/namelists/qwen3_30b_a3b.nml"
# shellcheck disable=SC2086
plan $q30 > q0.log 2>&1 || { cat q0.log; fail "plan of Qwen3-30B-A3B"; }
# shellcheck disable=SC2086
plan $q30 parallel%overlap_grad_reduce=T parallel%overlap_param_gather=T > q1.log 2>&1 ||
    { cat q1.log; fail "plan of Qwen3-30B-A3B with overlap_grad_reduce"; }
grep '^ *[0-9]\. TP' q0.log | sed 's/^ *[0-9]*\. //' > q0.order
grep '^ *[0-9]\. TP' q1.log | sed 's/^ *[0-9]*\. //' > q1.order
[ "$(sort q0.order)" = "$(sort q1.order)" ] && ! cmp -s q0.order q1.order ||
    { cat q0.log q1.log; fail "expected the same three layouts in another order with overlap_grad_reduce"; }
echo "ok: overlap_grad_reduce reorders Qwen3-30B-A3B's layouts"

# nothing fits: one message naming the smallest layout and what to change
expect_fail "fits no layout on 16 h100 GPUs" --gpus 16 --gpu h100 --global-batch 64 "$nml" \
    precision%gpu_memory_gb=0.000001
grep -q "the smallest, TP .* needs" err.log || { cat err.log; fail "no smallest layout named"; }

# bad arguments
expect_fail "--gpu is required" --gpus 16 "$nml"
expect_fail "--gpu 'a100' is not a platform" --gpus 16 --gpu a100 "$nml"
expect_fail "--gpus N is required" --gpu h100 "$nml"
expect_fail "--gpus needs a whole number" --gpus 0 --gpu h100 "$nml"
expect_fail "--top needs a whole number" --gpus 16 --gpu h100 --top x "$nml"
expect_fail "not whole h100 nodes of 8 GPUs" --gpus 12 --gpu h100 "$nml"
expect_fail "no model namelist" --gpus 16 --gpu h100
expect_fail "unknown option '--world-size'" --world-size 16 --gpu h100 "$nml"
expect_fail "the plan sets parallel%use_distributed_optimizer" --gpus 16 --gpu h100 "$nml" \
    parallel%use_distributed_optimizer=F
expect_fail "no layout of this model on 16 GPUs is accepted with global batch 3" --gpus 16 \
    --gpu h100 --global-batch 3 "$nml"
# an overlap key no layout takes: the error quotes the rule that refuses it
expect_fail "the first refused: &moe moe_shared_expert_overlap = .true. needs a shared expert" \
    --gpus 16 --gpu h100 --global-batch 64 "$nml" moe%moe_shared_expert_overlap=T
printf 'n0 rackA\nn1 rackA\n' > two.nodes
expect_fail "lists 2 nodes of 4 gb200 GPUs (8 GPUs), but --gpus is 16" --gpus 16 --gpu gb200 \
    --nodes-file two.nodes "$nml"
expect_fail "missing.nml" --gpus 16 --gpu h100 missing.nml
echo "PASS"

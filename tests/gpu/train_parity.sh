#!/bin/sh
# Training parity: the tiny model (namelists/tiny_moe.nml, bf16, 20 iterations, a
# loss per iteration, evaluation at the end) trained once with the reference backend
# and twice with the backend under test, each run in a directory of its own.
#   (a) the two runs under test are bit-identical: loss, aux_loss, z_loss and
#       grad_norm at every iteration, and the final val_loss (as written to the
#       metrics file, %.9g: every bit of a float); under the CUDA emulator the second
#       run defers device work per stream (MT_EMU_STREAMS=deferred);
#   (b) every iteration's loss under test is within a tolerance of the reference's;
#   (d) the second run's async saves equal the first run's synchronous ones, byte for
#       byte (checkpoint%async_save through the backend's alloc_host staging).
# Prints each iteration's pair and the largest difference (figures for a report).
#
# MT_TRAIN_PARITY_BACKENDS=REF,TEST picks the backends (moetrain --backend=...),
# default cpu,cuda; the test skips (77) when TEST is cuda and `moetrain --version`
# reports no device this build has kernels for. With a TEST other than cuda (cpu, or
# guard: the CPU kernels on emulated device memory, bit for bit the CPU's results)
# every tolerance is 0: tests/gpu/train_parity_cpu.sh runs it so, everywhere, which
# checks this script without a GPU.
#
# Tolerances for cuda against cpu, both in bf16 (&precision params_dtype='bf16').
# The CPU mode stores the same tensors rounded to bf16 as the GPU does, and computes
# its GEMMs in fp32 on those bf16-exact operands; the CUDA GEMMs use bf16 tensor cores
# with fp32 accumulation on the same operands, so they differ only in the order of
# the sums (nmse <= 1e-8 per op in tests/gpu/test_parity.c, ~1e-4 relative per
# element). The one source of larger differences is attention, which rounds P (and
# in backward dS and dO) to bf16 where the CPU keeps fp32: nmse ~1e-6 forward, ~7e-6
# backward, i.e. ~1e-3 and ~3e-3 relative per element, with random sign.
# - While the weights are still the initial ones (every earlier iteration ran with
#   lr 0: warmup starts at 0, so iterations 1 and 2), only the forward differs. The
#   logits then move by ~1e-3 of their size (~0.25 at init: the loss is ln 257 + 0.03),
#   a per-token loss change of ~3e-4 of either sign, averaged over 16 x 128 tokens:
#   ~1e-5. Bound 2e-3, with room for a few tokens whose top-2 experts swap on a
#   near-tie of the router. A wrong scale, mask or term moves it by 1e-2 or more.
# - Afterwards the ~3e-3 relative gradient differences change each AdamW update by
#   about as much, and the differences compound over the run while the loss falls
#   from ~5.5 to ~2.6 (lr warming up to 3e-3). Bound 2e-2 on any iteration (under 1%
#   of the loss) and 5e-3 on the mean over the 20 iterations, which a systematic
#   error (a wrong gradient scale, a dropped term, a bad optimizer step) exceeds
#   within a few iterations, while random rounding noise keeps it well below.
# The val_loss at the end of the two trajectories is not compared: it evaluates two
# different sets of weights (the drift above, which on held-out batches reached 1.8e-2
# once while no training loss moved by more than 3.2e-3). Instead (c): the reference's
# final weights (its checkpoint) evaluated by both backends on the same held-out and
# test batches, which only the forward's rounding separates: the initial-weights bound
# (measured 4e-5).
. "$MT_TOP_SRCDIR/tests/train/common.sh"
backends=${MT_TRAIN_PARITY_BACKENDS:-cpu,cuda}
ref=${backends%%,*}
test=${backends#*,}
[ -n "$ref" ] && [ -n "$test" ] && [ "$ref,$test" = "$backends" ] ||
    fail "MT_TRAIN_PARITY_BACKENDS='$backends': expected REF,TEST (e.g. cpu,cuda)"
iters=20

skip() { echo "SKIP: $*"; exit 77; }
if [ "$test" = cuda ]; then
    version=$("$MOETRAIN" --version) || fail "moetrain --version failed"
    echo "$version"
    # backends: ... cuda (sm_90 sm_100 compute_100, NCCL)
    # devices: 1 CUDA device(s); device 0: NAME, sm_90, 79.1 GiB, runs sm_90 SASS
    # (moetrain decides which of its GPU code a device runs: mt_cuda_image_for, checked
    # by test_cuda_table; a device newer than every SASS runs the PTX)
    archs=$(echo "$version" | sed -n 's/^backends:.* cuda (\([^,)]*\).*/\1/p')
    [ -n "$archs" ] || skip "moetrain was built without CUDA"
    devices=$(echo "$version" | sed -n 's/^devices: //p')
    sm=$(echo "$devices" | sed -n 's/^[1-9][0-9]* CUDA device.*, sm_\([0-9]*\),.*/\1/p')
    [ -n "$sm" ] || skip "no usable CUDA device (${devices:-moetrain --version names none})"
    case "$devices" in
    *", no kernel image in this build") skip "device 0 is sm_$sm; this build has GPU code for $archs only" ;;
    esac
    tol_init=2e-3 tol_iter=2e-2 tol_mean=5e-3
else
    tol_init=0 tol_iter=0 tol_mean=0
fi

# train NAME BACKEND [KEY=VALUE...]: one run in $tmp/NAME, its metrics in
# $tmp/NAME/m.jsonl
train() {
    name=$1 backend=$2
    shift 2
    mkdir "$tmp/$name" && cd "$tmp/$name" || fail "cannot make $tmp/$name"
    "$MOETRAIN" --backend="$backend" "$MT_TOP_SRCDIR/namelists/tiny_moe.nml" \
        training%train_iters=$iters logging%log_interval=1 \
        training%eval_interval=$iters training%eval_iters=2 \
        "precision%params_dtype='bf16'" "logging%metrics_file='m.jsonl'" "$@" > out.log 2>&1 ||
        { cat out.log; fail "training with --backend=$backend ($name) failed"; }
    set -- "$name" "$backend"
    [ "$(grep -c '"loss": ' m.jsonl)" -eq "${expect_iters-$iters}" ] ||
        { cat m.jsonl; fail "$1: expected $iters training lines in the metrics file"; }
    grep -q '"val_loss": ' m.jsonl || { cat m.jsonl; fail "$1: no val_loss line"; }
    echo "$1 (--backend=$2): $(grep 'training done' out.log)"
    # the CUDA backend's count of dense GEMMs on cuBLASLt's fp32 fallback (a figure)
    if [ "$2" = cuda ]; then
        gemms=$(grep '^moetrain: dense GEMMs' out.log) || { cat out.log; fail "$1: no 'dense GEMMs' summary line"; }
        echo "$1: $gemms"
    fi
    cd "$tmp" || exit 1
}

# values FILE: "iteration key value" for every value of the keys compared
values() {
    awk 'function put(k,   i, s) {
             i = index($0, "\"" k "\": ")
             if (!i) return
             s = substr($0, i + length(k) + 4)
             sub(/[,}].*/, "", s)
             print it, k, s
         }
         { it = $2; sub(/,$/, "", it)
           put("loss"); put("lr"); put("aux_loss"); put("z_loss"); put("grad_norm"); put("val_loss") }' "$1"
}

train ref "$ref" "checkpoint%save='$tmp/ckpt'" checkpoint%save_interval=$iters
# Both runs under test save at iterations 10 and 20: a synchronously, b with
# checkpoint%async_save (the state copied into the backend's alloc_host memory, which
# the CUDA backend pins, and written by a thread while training goes on; the second
# save reuses the first's staging memory). Bit-identical runs must leave byte-identical
# checkpoints.
half=$((iters / 2))
train a "$test" "checkpoint%save='$tmp/ckpt_a'" checkpoint%save_interval=$half
# the second run with the CUDA emulator deferring device work per stream until it is
# waited for (ignored by a real GPU and by the CPU): bit-identical results show that
# no result depends on an order of streams the code never asked for
MT_EMU_STREAMS=deferred
export MT_EMU_STREAMS
train b "$test" "checkpoint%save='$tmp/ckpt_b'" checkpoint%save_interval=$half checkpoint%async_save=T
unset MT_EMU_STREAMS
[ "$(grep -c '^checkpoint save blocked training for [0-9.]* s (async: ' b/out.log)" = 2 ] ||
    { cat b/out.log; fail "b: expected two async saves"; }
. "$MT_TOP_SRCDIR/tests/train/same_ckpt.sh"
for it in $half $iters; do
    d=$(printf 'iter_%07d' "$it")
    same_ckpt "ckpt_a/$d" "ckpt_b/$d" ||
        fail "the async save of iteration $it (--backend=$test) differs from the synchronous one"
done
echo "checkpoints: the async saves of run b (iterations $half, $iters) are byte-identical to run a's synchronous ones"
# the reference's final weights, evaluated by each backend (the run resumes at its
# last iteration: no training step, the final evaluation only)
expect_iters=0
train eval_ref "$ref" "checkpoint%load='$tmp/ckpt'"
train eval_test "$test" "checkpoint%load='$tmp/ckpt'"
unset expect_iters
for r in ref a b; do values "$r/m.jsonl" > "$r.values"; done

# (a) determinism
if ! cmp -s a.values b.values; then
    diff a.values b.values | head -20
    fail "two runs with --backend=$test differ (first difference above: iteration key value)"
fi
echo "determinism: the two --backend=$test runs are bit-identical ($(wc -l < a.values) values)"

# (b) parity with the reference
awk -v ref="$ref" -v test="$test" -v ti="$tol_init" -v tt="$tol_iter" -v tm="$tol_mean" \
    -v iters="$iters" '
    function abs(x) { return x < 0 ? -x : x }
    function finite(s) { return s ~ /^-?[0-9.]+([eE][-+]?[0-9]+)?$/ }
    FNR == NR { if ($2 == "loss") r[$1] = $3; if ($2 == "lr") lr[$1] = $3; next }
    $2 == "loss" { t[$1] = $3 }
    END {
        printf "%9s  %-14s %-14s %s\n", "iteration", ref, test, "|difference|"
        bad = 0; init = 1; sum = 0; max = -1
        for (i = 1; i <= iters; i++) {
            if (!(i in r) || !(i in t) || !finite(r[i]) || !finite(t[i])) {
                printf "%9d  %-14s %-14s missing or not finite FAIL\n", i, r[i], t[i]; bad = 1; continue
            }
            d = abs(t[i] - r[i]); sum += d
            if (d > max) { max = d; at = i }
            bound = init ? ti : tt
            printf "%9d  %-14s %-14s %.3e%s%s\n", i, r[i], t[i], d, (init ? " (initial weights)" : ""),
                   (d > bound + 0 ? "  > " bound " FAIL" : "")
            if (d > bound + 0) bad = 1
            if (lr[i] + 0 != 0) init = 0   # later iterations see updated weights
        }
        mean = sum / iters
        printf "max |difference| %.3e at iteration %d; mean %.3e (bounds: %s at initial weights, %s per iteration, %s on the mean)\n",
               max, at, mean, ti, tt, tm
        if (mean > tm + 0) { printf "mean |difference| %.3e > %s\n", mean, tm; bad = 1 }
        exit bad
    }' ref.values a.values || fail "--backend=$test is not within tolerance of --backend=$ref (table above)"

# (c) the same weights evaluated by both backends
metric() { sed -n "s/.*\"$1\": \([^,}]*\).*/\1/p" "$2" | tail -n 1; }
for k in val_loss test_loss; do
    rv=$(metric $k eval_ref/m.jsonl) tv=$(metric $k eval_test/m.jsonl)
    awk -v k="$k" -v r="$rv" -v t="$tv" -v b="$tol_init" -v ref="$ref" -v test="$test" 'BEGIN {
        d = r - t; if (d < 0) d = -d
        ok = r ~ /^[0-9.]+([eE][-+]?[0-9]+)?$/ && t ~ /^[0-9.]+([eE][-+]?[0-9]+)?$/ && d <= b + 0
        printf "%s of the %s run'"'"'s final weights: %s %s, %s %s, |difference| %.3e (bound %s)%s\n",
               k, ref, ref, r, test, t, d, b, ok ? "" : " FAIL"
        exit !ok }' || fail "$k: --backend=$test evaluates the same weights differently from --backend=$ref"
done
echo "parity: --backend=$test within tolerance of --backend=$ref"

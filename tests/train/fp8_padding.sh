#!/bin/sh
# &moe moe_router_padding_for_fp8 on the CPU backend (doc/fp8.md, "Padding the experts'
# rows"): each FP8 recipe trained 3 steps with and without padding. Blockwise ends with
# the same losses and the same checkpoint, bit for bit (parameters and optimizer
# moments: every gradient equal), on one process and, under mpirun, with EP 2 (the rows
# exchanged, then padded on the receiving side; delayed with ETP 2 as the others): its GEMM sums each run of 128 products
# exactly, so zero rows change nothing. The others multiply with the CPU's fp32 GEMM
# (BLAS), which may sum a product of another shape in another order (padding changes
# an expert's m and k): their losses agree within 1e-5 (measured: equal, tensorwise's
# parameters one fp32 rounding apart at step 3 under OpenBLAS's Haswell kernel).
# --check counts the padded rows as the run allocates them (--log-memory); where
# padding cannot apply it is refused by name. NVFP4 is refused: its weight gradients'
# stochastic rounding draws each element's bits by its place in the expert's
# transposed rows, which padding moves (tried with the refusal lifted: the loss at
# step 2 differs, 5.46300621 against 5.46309598).
. "$MT_TOP_SRCDIR/tests/train/common.sh"
cd "$tmp" || exit 1
DELAYED="precision%fp8_format='hybrid' precision%fp8_amax_history_len=2 precision%fp8_amax_compute_algo='max'"
TENSORWISE="precision%fp8_format='hybrid' precision%fp8_recipe='tensorwise'"
BLOCKWISE="precision%fp8_format='e4m3' precision%fp8_recipe='blockwise'"
MXFP8="precision%fp8_format='e4m3' precision%fp8_recipe='mxfp8'"
RUN="training%train_iters=3 optimizer%lr_warmup_iters=1 precision%params_dtype='bf16'"

# same NAME EXACT RECIPE [LAUNCHER...]: trains with and without padding, compares the
# losses (and with EXACT = 1 the checkpoints, bit for bit)
same() {
    name=$1 exact=$2 o=$3
    shift 3
    for pad in F T; do
        # shellcheck disable=SC2086 # lists of overrides
        "$@" "$MOETRAIN" "$small" $RUN $o moe%moe_router_padding_for_fp8=$pad \
            "checkpoint%save='$name.$pad'" "logging%metrics_file='$name.$pad.jsonl'" > "$name.$pad.log" 2>&1 ||
            { cat "$name.$pad.log"; fail "$name: training with moe_router_padding_for_fp8 = $pad"; }
    done
    json_field "$name.F.jsonl" loss > F.loss
    json_field "$name.T.jsonl" loss > T.loss
    [ -s F.loss ] && paste F.loss T.loss | awk -v exact="$exact" '
        function abs(x) { return x < 0 ? -x : x }
        { if (exact ? $1 != $2 : abs($1 - $2) > 1e-5) bad = 1 } END { exit bad }' ||
        { paste F.loss T.loss; fail "$name: the losses differ with padding"; }
    if [ "$exact" = 1 ]; then
        same_ckpt "$name.F/iter_0000003" "$name.T/iter_0000003" ||
            fail "$name: parameters or optimizer state differ with padding"
    fi
    echo "$name: losses $(tr '\n' ' ' < T.loss)with padding, as without"
}
same BLOCKWISE 1 "$BLOCKWISE"
for r in DELAYED TENSORWISE MXFP8; do
    eval "o=\$$r"
    same "$r" 0 "$o"
done
if command -v mpirun > /dev/null 2>&1; then
    same BLOCKWISE.ep2 1 "$BLOCKWISE parallel%expert_model_parallel_size=2" \
        mpirun --allow-run-as-root --oversubscribe -n 2
    # ETP 2: the received rows gathered over the ETP group, then padded
    same DELAYED.etp2 0 "$DELAYED parallel%expert_tensor_parallel_size=2" \
        mpirun --allow-run-as-root --oversubscribe -n 2
else
    echo "no mpirun: the EP 2 and ETP 2 legs are not run"
fi

# memory: --check counts the padded expert rows the run allocates
bytes() { sed -n 's/.*| total \([0-9]*\) (.*/\1/p' "$1" | head -1; }
# shellcheck disable=SC2086
"$MOETRAIN" --check "$small" $MXFP8 > nopad.check 2>&1 || { cat nopad.check; fail "--check"; }
# shellcheck disable=SC2086
"$MOETRAIN" --check "$small" $MXFP8 moe%moe_router_padding_for_fp8=T > pad.check 2>&1 ||
    { cat pad.check; fail "--check with padding"; }
# shellcheck disable=SC2086
"$MOETRAIN" "$small" $MXFP8 moe%moe_router_padding_for_fp8=T training%train_iters=2 \
    optimizer%lr_warmup_iters=1 logging%log_memory=T > pad.log 2>&1 || { cat pad.log; fail "padded run"; }
c=$(bytes pad.check) l=$(bytes pad.log) n=$(bytes nopad.check)
[ -n "$c" ] && [ "$c" = "$l" ] || fail "with padding --check says $c bytes, --log-memory $l"
[ "$c" -gt "$n" ] || fail "the padded rows are not counted ($c bytes against $n without padding)"
echo "memory: $c bytes with padding (--check = --log-memory), $n without"

# where it cannot apply
expect_refused() { # expect_refused MESSAGE ARGS...
    msg=$1
    shift
    "$MOETRAIN" "$@" > refused.log 2>&1 && { cat refused.log; fail "accepted: $*"; }
    grep -qF "$msg" refused.log || { cat refused.log; fail "no '$msg' for: $*"; }
}
expect_refused "moe_router_padding_for_fp8 = .true. pads the experts' rows for the FP8/FP4 GEMMs, but neither" \
    --check "$small" moe%moe_router_padding_for_fp8=T
expect_refused "fp4_format = 'e2m1' (nvfp4): the stochastic rounding" \
    --check "$small" "precision%fp4_format='e2m1'" moe%moe_router_padding_for_fp8=T
# shellcheck disable=SC2086
expect_refused "with pad_expert_input_to_capacity = .true.: drop-and-pad already" \
    --check "$small" $BLOCKWISE moe%moe_router_padding_for_fp8=T moe%expert_capacity_factor=1 \
    moe%pad_expert_input_to_capacity=T
# shellcheck disable=SC2086
expect_refused "with token_dispatcher_type = 'allgather'" \
    --check --world-size 2 "$small" $BLOCKWISE moe%moe_router_padding_for_fp8=T \
    parallel%expert_model_parallel_size=2 "moe%token_dispatcher_type='allgather'"
echo "refusals: no FP8 recipe, NVFP4, drop-and-pad, the allgather dispatcher"

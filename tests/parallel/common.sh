# Shared by the layout-equivalence tests (sourced): the runtime tests' helpers (mpirun,
# skip, a scratch directory), runs of the model in a layout, and the comparisons. The
# mpirun tests call need_mpirun.
#
# Tolerances. Every layout computes the same sums as one process in another (fixed)
# order: DP and expert-DP gradient sums, TP partial sums reduce-scattered, the
# vocabulary-parallel logsumexp, experts' rows from several sources, ETP partial
# outputs. In fp32 (unit roundoff u = 6e-8) each reduced value then differs by a few u
# relative, and AdamW, which normalises the gradient, passes a relative gradient
# difference into the update at the same relative size: over 12 steps the
# trajectories measured stayed within ~1e-8 (loss), ~1e-6 (grad norm), ~1e-6
# (parameters, norm-based per tensor) and ~2e-6 (Adam moments of the norm weights),
# except at rounding-sensitive steps: with tied embeddings over PP 2 (seed 1234, step
# 8) the gradient norm differed by 8.7e-6 and the second moment of layer 0's q_norm
# weight by 1.3e-5 (a norm weight's gradient is a sum of many cancelling terms). The
# tests now run 3 or 4 steps (below), within 4e-8 (loss, norms) and 1e-6 (moments) of
# one process. The bounds leave 4x to 100x over the worst of the 12-step runs; a real
# fault (a missing TP or expert-DP reduction, a replica counted twice in the norm, a
# wrong shard, a token routed by local instead of global statistics) moves the loss
# by 1e-5 or more within the 3 or 4 steps, and the parameters it touches by percents
# (no expert-DP gradient reduction: the loss by 4e-5, the gradient norm by 7e-4, the
# experts' weights by 0.29, and routing decisions of margins up to 1e-3 taken
# otherwise). Routing decisions (top-k, capacity drops) must be identical: expert
# loads and dropped tokens compare exactly.
TOL_LOSS=2e-6     # lm loss, validation loss
TOL_AUX=1e-5      # balancing and z losses (small sums of many terms)
TOL_NORM=5e-5     # gradient norm
TOL_PARAMS=5e-5   # final parameters and moments, per tensor
#
# Routing decisions. The scores that routing compares (the top-k's keys: logits, or
# sigmoid + expert bias; the routing probabilities by which a full expert keeps its
# best tokens) come out of the same sums in another order, so they too differ between
# layouts by rounding. Measured with MT_DEBUG_ROUTING (below) under OpenBLAS's
# Cooperlake, Haswell and Nehalem kernels: at most 1.8e-7 in every layout of
# capacity.sh, 3.0e-7 in them at seed 1234 over 12 steps, 9.7e-7 in equivalence.sh
# (one token of layer 0 whose keys rounding moves most); no larger in the last step
# than in the first. A decision whose competing scores are further apart than twice
# that is taken alike in every layout; a nearer one is a tie that rounding breaks, and
# then the runs part: a full expert keeping the other of two tokens moved the
# parameters by 6e-4 (capacity.sh at seed 1234 under the Haswell kernel). Exact ties
# are common: tokens with the same prefix (the first tokens of two sequences that
# start alike, a sequence that starts with a repeated byte) have the same scores in
# exact arithmetic, and which of them a full expert keeps depends on how the BLAS
# kernel rounds their rows. Near ties are not rare either: with the sigmoid routing of
# moe.nml, about one top-k decision (or balancing top-k) in 1200 is within ROUTE_MARGIN
# of one, 3x more in the last of 12 steps than in the first (the expert bias evens the
# loads: the keys crowd); 13 in 12 steps of 16 sequences of 32 tokens at seed 1234.
#
# So every layout test trains a reference in one process with reference(): the first
# seed of SEEDS whose decisions are all ROUTE_MARGIN or more from a tie (checked by
# routing_margins, else "near a tie" and the next seed); then same_as checks that each
# layout took every decision of the reference, from scores within ROUTE_MARGIN / 2 of
# the reference's (8x the 1.8e-7 measured in capacity.sh; 4e-8 in the short runs).
# What this guarantees: a layout whose rounding moves the scores by less than
# ROUTE_MARGIN / 2 takes every decision as the reference does, under any BLAS kernel,
# so the comparisons test the layout and not its luck; a kernel that rounds the
# reference itself otherwise moves its margins by as little, so it picks the same seed
# or, from one within rounding of ROUTE_MARGIN, the next clear one. What it needs:
# clear seeds. The tests run short (3 or 4 steps of one-sequence micro-batches of 8 or
# 16 tokens, at most ~1900 decisions: each names its shape), where 8 to 19 seeds of
# these 20 are clear: that none is has a chance below 1e-4. A run that trains on the
# same tokens twice cannot be checked (routing.awk) and is passed over likewise.
ROUTE_MARGIN=3e-6
SEEDS="1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20" # reference()'s candidates
routing_awk="$MT_TOP_SRCDIR/tests/parallel/routing.awk"

. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
nml="$MT_TOP_SRCDIR/tests/parallel/moe.nml"
ckpt_diff="$MT_TOP_BUILDDIR/tests/parallel/ckpt_diff"
. "$MT_TOP_SRCDIR/tests/train/same_ckpt.sh"
OMP_NUM_THREADS=1 # up to 8 processes on 2 cores
export OMP_NUM_THREADS
cd "$tmp" || exit 1

# launch NP PROGRAM ARGS...: NP processes (mpirun; srun.sh launches with srun)
launch() { mpirun_np "$@"; }

# run NAME NP ARGS...: trains in a layout of NP processes (NP = 1: a plain process, the
# reference), metrics in NAME.jsonl, log in NAME.log, checkpoints under NAME/, routing
# decisions in NAME.rt (NAME.rt.RANK with NP > 1).
run() {
    name=$1
    np=$2
    shift 2
    set -- "$nml" "logging%metrics_file='$name.jsonl'" "checkpoint%save='$name'" "$@"
    rm -f "$name.rt" "$name.rt".*
    MT_DEBUG_ROUTING="$PWD/$name.rt"
    export MT_DEBUG_ROUTING
    if [ "$np" = 1 ]; then
        "$MOETRAIN" "$@" > "$name.log" 2>&1 < /dev/null
    else # mpirun forwards stdin: keep it off a caller's here-document
        launch "$np" "$MOETRAIN" "$@" parallel%distributed_timeout_minutes=1 \
            > "$name.log" 2>&1 < /dev/null
    fi || { cat "$name.log"; fail "$name: training failed"; }
    unset MT_DEBUG_ROUTING
}

# field FILE KEY: every value of KEY in a JSON-lines file, one per line
field() { sed -n "s/.*\"$2\": \([-0-9.eE+naif]*\).*/\1/p" "$1"; }

# close REF RUN KEY TOL: the values of KEY agree within TOL relative (0: exactly)
close() {
    field "$1.jsonl" "$3" > ref.col
    field "$2.jsonl" "$3" > run.col
    [ -s ref.col ] || fail "$1.jsonl has no $3"
    [ "$(wc -l < ref.col)" = "$(wc -l < run.col)" ] || fail "$2: $(wc -l < run.col) values of $3, the reference has $(wc -l < ref.col)"
    paste ref.col run.col | awk -v tol="$4" -v key="$3" -v run="$2" '
        { d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1
          r = a > 0 ? d / a : d; if (r > worst) worst = r
          if (d > tol * a || (tol == 0 && $1 != $2)) {
              printf "FAIL: %s: %s line %d: %s vs reference %s (relative %.2e > %g)\n", run, key, NR, $2, $1, r, tol
              bad = 1 } }
        END { printf "  %-16s worst relative difference %.2e\n", key, worst; exit bad }'
}

# routing_margins REF: whether every routing decision of the run REF is ROUTE_MARGIN or
# more from a tie, so that no layout's rounding can take it another way (not when REF
# trains on the same tokens twice: its decisions cannot be told apart)
routing_margins() {
    cat "$1".rt* > ref.rt
    if ! awk -v bound=$ROUTE_MARGIN -f "$routing_awk" ref.rt > margins.out; then
        grep -qF 'twice (the same tokens)' margins.out || { cat margins.out; fail "$1: cannot read its routing"; }
        echo "  $1 trains on the same tokens twice: its decisions cannot be told apart"
        return 1
    fi
    sed '$d' margins.out
    if tail -n 1 margins.out | awk -v b=$ROUTE_MARGIN '{ for (i = 2; i <= 4; i++) if ($i != "NA" && $i + 0 < b + 0) bad = 1 } END { exit bad }'; then
        clear_of_ties="${clear_of_ties:-} $1 "
        return 0
    fi
    echo "  $1 is near a tie: a decision above is less than ROUTE_MARGIN = $ROUTE_MARGIN from one, which another layout's rounding can break the other way (common.sh)"
    return 1
}

# reference NAME OVERRIDES...: NAME in one process with the first seed of SEEDS whose
# routing decisions are all clear of ties (routing_margins); its override in $seed and
# in NAME.seed, for the layouts that compare with NAME
reference() {
    ref=$1
    shift
    for s in $SEEDS; do
        seed="training%seed=$s"
        echo "$ref, seed $s:"
        run "$ref" 1 "$@" "$seed"
        if routing_margins "$ref"; then
            echo "$seed" > "$ref.seed"
            return
        fi
    done
    fail "$ref: with every seed of SEEDS, the configuration is near a tie (above)"
}

# same_routing REF RUN...: the RUNs (a run and the runs that resumed it) took every
# routing decision of REF, and when REF passed routing_margins, from scores within
# ROUTE_MARGIN / 2 of REF's (unless ROUTE_SCORES_ROUNDED=no: a layout whose scores may
# part by more than rounding, e.g. FP8 after an update, fp8_layouts.sh)
same_routing() {
    rt_ref=$1
    shift
    rt_run=$*
    cat "$rt_ref".rt* > ref.rt
    for r in "$@"; do cat "$r".rt*; done > run.rt
    awk -v bound=$ROUTE_MARGIN -f "$routing_awk" ref.rt run.rt > routing.out || { echo "FAIL: $rt_run: cannot compare its routing"; return 1; }
    sed '$d' routing.out
    # shellcheck disable=SC2046 # the fields of "compare DIFFERING LARGEST_SCORE_DIFFERENCE"
    set -- $(tail -n 1 routing.out)
    if [ "$2" != 0 ]; then
        echo "FAIL: $rt_run: $2 routing decisions differ from the reference's (above, with the reference's margins: one below ROUTE_MARGIN = $ROUTE_MARGIN is a near tie that rounding broke, the configuration is near a tie; a larger one is a fault)"
        return 1
    fi
    case "${clear_of_ties:-}" in *" $rt_ref "*) ;; *) return 0 ;; esac
    [ "${ROUTE_SCORES_ROUNDED:-yes}" = yes ] || return 0
    awk -v d="$3" -v b=$ROUTE_MARGIN 'BEGIN { exit !(d + 0 > b / 2) }' || return 0
    echo "FAIL: $rt_run: routing scores differ from the reference's by $3, more than the rounding that ROUTE_MARGIN = $ROUTE_MARGIN allows for (common.sh)"
    return 1
}

# same_as REF RUN: RUN's routing, trajectory and final checkpoint match REF's
same_as() {
    echo "$2:"
    bad=0
    same_routing "$1" "$2" || bad=1
    for k in loss val_loss; do close "$1" "$2" $k $TOL_LOSS || bad=1; done
    for k in aux_loss z_loss; do close "$1" "$2" $k $TOL_AUX || bad=1; done
    close "$1" "$2" grad_norm $TOL_NORM || bad=1
    for k in lr consumed_samples dropped_tokens expert_load_min expert_load_max; do
        close "$1" "$2" $k 0 || bad=1
    done
    last=$(cat "$1/latest_checkpointed_iteration.txt")
    it=$(printf %07d "$last")
    "$ckpt_diff" "$1/iter_$it" "$2/iter_$it" $TOL_PARAMS > diff.out || bad=1
    sed 's/^/  /' diff.out
    [ $bad = 0 ] || fail "$2 differs from $1"
}

# same_bits OFF ON N: ON's metrics (losses, norms, expert loads) and its N checkpoints are
# OFF's, bit for bit (an overlap key against the step without it)
same_bits() {
    bad=0
    for k in loss grad_norm aux_loss z_loss val_loss expert_load_min expert_load_max; do
        close "$1" "$2" $k 0 || bad=1
    done
    n=0
    for d in "$1"/iter_*; do
        same_ckpt "$d" "$2/${d##*/}" || bad=1
        n=$((n + 1))
    done
    [ $bad = 0 ] && [ $n = "$3" ] || fail "$2 is not $1, bit for bit ($n checkpoints)"
    echo "$2 against $1: losses, norms and $n checkpoints identical"
}

# Layout overrides
TP2="parallel%tensor_model_parallel_size=2 parallel%sequence_parallel=T"
TP4="parallel%tensor_model_parallel_size=4 parallel%sequence_parallel=T"
EP2="parallel%expert_model_parallel_size=2"
EP4="parallel%expert_model_parallel_size=4"
ETP1="parallel%expert_tensor_parallel_size=1"
ETP2="parallel%expert_tensor_parallel_size=2"
ZERO="parallel%use_distributed_optimizer=T"
AG="moe%token_dispatcher_type='allgather'"

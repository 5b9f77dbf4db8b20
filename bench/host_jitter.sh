#!/bin/sh
# Host jitter of the CPU training step with manual GC off and on (doc/host-overhead.md).
# usage: bench/host_jitter.sh [BUILDDIR]   (default: the current directory)
#
# Trains tiny_moe (the embedded default) for ITERS iterations (default 80) with an
# evaluation every 10 and a checkpoint save every 40, under the allocation-counting
# library (tests/util/libmt_alloccount.so, built here if missing), once with
# host%manual_gc off and once on (manual_gc_interval 20, manual_gc_eval on), ROUNDS
# times (default 2) alternately so that both see the same machine. Over the
# iterations after the first WARM (default 5) of every run, it prints:
# - the step time distribution: p50, p99 and max of the logged per-iteration time;
# - per step: host CPU time, minor page faults, heap allocations (moetrain's; the
#   OpenMP runtime's apart) as the log counts them; the faults also apart for the steps
#   right after an evaluation or an interval's end (with manual GC on, the steps after
#   its full collections, which give pages back that the step takes again) and for the
#   others;
# - the ratio on/off of each.
# NP=N (N > 1) runs N processes under mpirun (OpenMPI), one OpenMP thread each unless
# OMP_NUM_THREADS says otherwise, in the layout LAYOUT (default for 4: TP 2 with
# sequence parallelism x EP 2 x DP 2); the counters are then the largest over the ranks,
# and the MPI library's allocations get a row.
# Figures only: nothing here passes or fails. Step times on a shared machine vary
# with its load: compare the two columns of one run, not runs on different days.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
build=$(cd "${1:-.}" && pwd)
moetrain="$build/moetrain"
iters=${ITERS:-80}
rounds=${ROUNDS:-2}
warm=${WARM:-5}
[ -x "$moetrain" ] || { echo "bench/host_jitter.sh: no moetrain in $build (build first)" >&2; exit 1; }
shim="$build/tests/util/libmt_alloccount.so"
[ -r "$shim" ] || make -s -C "$build" tests/util/libmt_alloccount.so
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
np=${NP:-1}
if [ "$np" -gt 1 ]; then
    threads=${OMP_NUM_THREADS:-1}
    layout=${LAYOUT:-parallel%tensor_model_parallel_size=2 parallel%sequence_parallel=T parallel%expert_model_parallel_size=2}
    if [ "$(id -u)" = 0 ]; then # OpenMPI refuses root unless told
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
        export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
    fi
else
    threads=${OMP_NUM_THREADS:-$(getconf _NPROCESSORS_ONLN)}
    layout=
fi
export OMP_NUM_THREADS="$threads"

# launch ARGS...: moetrain ARGS under the counting library, in one process or NP
launch() {
    if [ "$np" -gt 1 ]; then
        # shellcheck disable=SC2086 # the layout's overrides
        LD_PRELOAD="$shim" mpirun --oversubscribe -np "$np" -x LD_PRELOAD -x OMP_NUM_THREADS \
            -x MOETRAIN_DATADIR "$moetrain" "$@" $layout < /dev/null
    else
        LD_PRELOAD="$shim" "$moetrain" "$@"
    fi
}

# run NAME ROUND OVERRIDES...: appends the run's iterations after warm-up to NAME.it
# as "ms cpu_ms faults allocations allocations_omp allocations_mpi after", after = 1 for
# the iteration after a multiple of 10 (an evaluation; with manual GC, a full
# collection before it, and one after iteration 20)
run() {
    name=$1 round=$2; shift 2
    rm -rf "$tmp/ck"
    (cd "$top" && export MOETRAIN_DATADIR="$build" && launch namelists/tiny_moe.nml \
        training%train_iters="$iters" training%eval_interval=10 training%eval_iters=2 \
        optimizer%lr_warmup_iters=5 logging%log_interval=1 "checkpoint%save='$tmp/ck'" \
        checkpoint%save_interval=40 "logging%metrics_file='$tmp/$name.$round.jsonl'" "$@" \
        > "$tmp/$name.$round.log" 2>&1) ||
        { echo "$name: moetrain failed:"; tail -5 "$tmp/$name.$round.log"; exit 1; }
    awk -v warm="$warm" '
        function val(key,   s) { s = $0; sub(".*\"" key "\": ", "", s); sub("[,}].*", "", s); return s }
        /"loss"/ && val("iteration") + 0 > warm {
            print val("elapsed_ms"), val("host_cpu_ms"), val("minor_faults"), val("allocations"),
                  val("allocations_omp"), val("allocations_mpi"), (val("iteration") - 1) % 10 == 0 }' \
        "$tmp/$name.$round.jsonl" >> "$tmp/$name.it"
}

# stats NAME: "p50 p99 max cpu faults allocs allocs_omp allocs_mpi faults_after
# faults_other" over NAME.it (means per step)
stats() {
    sort -g "$tmp/$1.it" | awk '
        { ms[NR] = $1; cpu += $2; f += $3; a += $4; o += $5; m += $6
          if ($7) { fa += $3; na++ } else { fo += $3; no++ } }
        function q(p,   i) { i = int(p * (NR - 1) + 0.5) + 1; return ms[i] }
        END { printf "%.2f %.2f %.2f %.2f %.3f %.3f %.3f %.3f %.3f %.3f\n", q(0.5), q(0.99), ms[NR],
                     cpu / NR, f / NR, a / NR, o / NR, m / NR, na ? fa / na : 0, no ? fo / no : 0 }'
}

: > "$tmp/off.it"
: > "$tmp/on.it"
r=1
while [ $r -le "$rounds" ]; do
    run off $r host%manual_gc=F
    run on $r host%manual_gc=T host%manual_gc_interval=20
    r=$((r + 1))
done
n=$(wc -l < "$tmp/off.it")
procs="1 process"
[ "$np" -gt 1 ] && procs="$np processes ($layout)"
echo "tiny_moe, $procs, $threads threads each, $rounds x $iters iterations per column ($n after the first $warm of each run), evaluation every 10, save every 40"
grep -m1 'manual GC (after the step' "$tmp/on.1.log" | sed 's/^/manual GC example: /'
set -- $(stats off) $(stats on)
printf "%-34s %12s %12s %8s\n" "per step" "manual GC off" "on" "on/off"
row() { printf "%-34s %12s %12s %8s\n" "$1" "$2" "$3" "$(echo "$2 $3" | awk '{ if ($1 == 0) print ($2 == 0 ? "=" : "inf"); else printf "%.2f", $2 / $1 }')"; }
row "step time p50 (ms)" "$1" "${11}"
row "step time p99 (ms)" "$2" "${12}"
row "step time max (ms)" "$3" "${13}"
row "host CPU time (ms)" "$4" "${14}"
row "minor page faults" "$5" "${15}"
row "  after an evaluation or interval" "$9" "${19}"
row "  other steps" "${10}" "${20}"
row "heap allocations, moetrain's" "$6" "${16}"
row "heap allocations, OpenMP runtime" "$7" "${17}"
[ "$np" -gt 1 ] && row "heap allocations, MPI library" "$8" "${18}"
exit 0

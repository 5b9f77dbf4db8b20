#!/bin/sh
# The host-overhead wall (doc/host-overhead.md): after warm-up (the first WARM
# iterations) a training step makes no heap allocation and takes no page fault, counted
# per step by moetrain's log under the allocation-counting library
# (tests/util/alloc_count.c, LD_PRELOAD) and getrusage, in fp32 and bf16, dropless and
# with capacity drops, with manual GC off and on; manual GC runs exactly at the steps
# its keys choose and says what it released; without the library the log says that
# allocations are not counted. The multi-rank case is tests/parallel/host_overhead.sh.
#
# Each configuration runs with two OpenMP threads and with one. With two, no
# allocation at all is asserted (moetrain's, the MPI library's, the OpenMP runtime's);
# the faults are printed: the BLAS takes its packing buffer for each call from a pool
# in the order the threads come, and a buffer first used by a larger GEMM faults in its
# pages then (measured: 13 faults, once per process, at a random step). With one thread
# the BLAS uses one buffer, and no fault is asserted; the OpenMP runtime's allocations
# (a team of one at every parallel region) are printed. The BLAS library's own
# allocations are counted apart and not asserted: OpenBLAS's small-matrix kernels for
# AVX-512 Intel CPUs (sgemm_small_kernel_b0_*_SKYLAKEX) allocate a buffer at every call,
# 64 a step here on such a machine, none on AMD's; they are the library's, not moetrain's.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
. "$MT_TOP_SRCDIR/tests/util/alloccount.sh"
WARM=2
cd "$tmp"

# run NAME OVERRIDES...: trains 8 iterations under the counting library with two
# OpenMP threads (NAME) and with one (NAME_1t)
run() {
    name=$1
    shift
    for t in 2 1; do
        n=$name
        [ $t = 1 ] && n=${name}_1t
        rm -rf ck ckgc
        OMP_NUM_THREADS=$t LD_PRELOAD="$shim" "$MOETRAIN" "$small" training%train_iters=8 \
            logging%log_interval=1 "logging%metrics_file='$n.jsonl'" "$@" > "$n.log" 2>&1 ||
            { cat "$n.log"; fail "$n: training failed"; }
    done
}

# steady NAME [AFTER]: every iteration after WARM made no allocation (two threads,
# NAME: none at all; one thread, NAME_1t: none of moetrain's) and, with one thread, took
# no minor fault; prints what else it counted. AFTER lists the iterations that follow a
# full manual GC collection between steps: malloc_trim gives free pages inside the heap
# back to the system, and the OpenMP runtime's team (allocated at every parallel region
# with one thread) may land on one of them in the next step and fault it in again
# (measured 0 or 1 per collection, depending on where the heap's free blocks lie, as in
# tests/parallel/host_overhead.sh): the collection's cost, printed, not asserted.
steady() {
    for n in "$1" "${1}_1t"; do
        awk -v warm=$WARM -v run="$n" -v one="$([ "$n" = "$1" ] && echo 0 || echo 1)" -v after=" ${2-} " '
            function val(key,   s) { s = $0; sub(".*\"" key "\": ", "", s); sub("[,}].*", "", s); return s }
            function zero(key, v) { v = val(key); if (v !~ /^[0-9.]+$/ || v + 0 != 0) { bad = 1
                    printf "FAIL: %s: iteration %d: %s = %s per step, not 0\n", run, it, key, v } }
            /"loss"/ { it = val("iteration"); if (it <= warm) next; n++
                       zero("allocations"); zero("allocations_mpi")
                       if (one && index(after, " " it " ")) { af += val("minor_faults"); omp += val("allocations_omp") }
                       else if (one) { zero("minor_faults"); omp += val("allocations_omp") }
                       else { zero("allocations_omp"); f += val("minor_faults") } }
            END { if (n == 0) { print "FAIL: " run ": no iteration after warm-up"; exit 1 }
                  if (!bad && one) printf "  %s: %d iterations after warm-up: 0 allocations, 0 minor faults%s (OpenMP runtime: %.0f allocations per step)\n", run, n, (after ~ /[0-9]/ ? sprintf(" but in the steps after a collection (%d there)", af) : ""), omp / n
                  if (!bad && !one) printf "  %s: %d iterations after warm-up: 0 allocations (%d minor faults in all, not asserted with two threads)\n", run, n, f
                  exit bad }' "$n.jsonl" || { cat "$n.log"; exit 1; }
    done
}

run fp32 training%eval_interval=3 "checkpoint%save='ck'" checkpoint%save_interval=4
steady fp32
grep -q 'heap allocations counted by the preloaded counting library' fp32.log || fail "fp32: the log does not say what is counted"
grep -q 'host per step: cpu [0-9.]* ms, minor faults [0-9.]*, allocations 0.0 (and in the MPI library 0.0, the OpenMP runtime 0.0, the BLAS library [0-9.]*)' fp32.log ||
    fail "fp32: no log line with the host counters"
! grep -q 'manual GC' fp32.log || fail "fp32: manual GC ran while host%manual_gc is off"

run bf16_drops "precision%params_dtype='bf16'" moe%expert_capacity_factor=1.0 \
    "moe%router_load_balancing_type='seq_aux_loss'" moe%shared_expert_intermediate_size=16
steady bf16_drops

# manual GC: at the start, after iterations 3 and 6 (interval 3), around the
# evaluation of iteration 4 and the save of iteration 8 (and the final evaluations)
run gc host%manual_gc=T host%manual_gc_interval=3 training%eval_interval=4 \
    "checkpoint%save='ckgc'" checkpoint%save_interval=8
steady gc "4 7"
grep 'manual GC' gc.log | sed 's/: deferred frees.*//' > gc.when
cat > gc.want <<'EOF'
manual GC (at the start of training, iteration 0)
manual GC (after the step, iteration 3)
manual GC (before evaluation, iteration 4)
manual GC (after evaluation, iteration 4)
manual GC (after the step, iteration 6)
manual GC (before evaluation, iteration 8)
manual GC (after evaluation, iteration 8)
manual GC (before the checkpoint save, iteration 8)
manual GC (after the checkpoint save, iteration 8)
manual GC (before evaluation, iteration 8)
manual GC (after evaluation, iteration 8)
EOF
diff gc.want gc.when || fail "manual GC did not run at the steps its keys choose (diff above: expected, ran)"
grep -q 'manual GC (after the checkpoint save, iteration 8): deferred frees [0-9]* bytes, scratch caches released [0-9]* bytes; heap held from the system [0-9]* -> [0-9]* bytes (released [0-9]*), free in it [0-9]* -> [0-9]* bytes; [0-9.]* ms (rank 0)' gc.log ||
    fail "the manual GC line does not say what it released"

# host%manual_gc_eval = .false. (Megatron's --no-manual-gc-eval): the start and the interval only
run gc_noeval host%manual_gc=T host%manual_gc_interval=4 host%manual_gc_eval=F training%eval_interval=4
[ "$(grep -c 'manual GC' gc_noeval.log)" = 3 ] || { grep 'manual GC' gc_noeval.log; fail "gc_noeval: expected the collections at the start and after iterations 4 and 8 only"; }

# without the counting library: allocations are not counted, and the metrics say null
"$MOETRAIN" "$small" training%train_iters=2 logging%log_interval=1 "logging%metrics_file='plain.jsonl'" > plain.log 2>&1 ||
    { cat plain.log; fail "plain: training failed"; }
grep -q 'heap allocations not counted' plain.log || fail "plain: the log does not say that allocations are not counted"
grep -q 'allocations not counted |' plain.log || fail "plain: the interval line does not say it"
grep -q '"allocations": null, "allocations_mpi": null, "allocations_omp": null' plain.jsonl || fail "plain: metrics lack the null allocations"
grep -q '"host_cpu_ms": [0-9.]*, "minor_faults": [0-9.]*' plain.jsonl || fail "plain: metrics lack host_cpu_ms and minor_faults"
echo "ok: no allocation and no page fault per step after warm-up; manual GC at its steps"

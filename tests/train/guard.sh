#!/bin/sh
# The training loop keeps its hands off backend memory: --backend guard (the CPU
# kernels on emulated device memory that host code cannot touch) trains, evaluates,
# saves and resumes with results identical, bit for bit, to --backend cpu, in fp32 and
# bf16, with expert biases (host master, device copy) and capacity drops. A host-side
# read or write of a device buffer anywhere in the loop would fault here, and would
# break the CUDA backend the same way.
. "$MT_TOP_SRCDIR/tests/train/common.sh"
cd "$tmp"
moe="$MT_TOP_SRCDIR/tests/parallel/moe.nml"
# the metrics without the timings and the host counters
strip() { sed 's/"elapsed_ms[^,]*, "tokens_per_s[^,]*, "tflops[^,]*,//; s/, "host_cpu_ms".*}/}/' "$1"; }
run() { # NAME BACKEND ARGS...
    name=$1 backend=$2
    shift 2
    "$MOETRAIN" --backend="$backend" "$@" "logging%metrics_file='$name.jsonl'" > "$name.log" 2>&1 ||
        { cat "$name.log"; fail "$name: training failed"; }
    grep -q "backend $backend" "$name.log" || fail "$name: not on the $backend backend"
}
same() { # A B: identical metrics
    strip "$1.jsonl" > a.txt
    strip "$2.jsonl" > b.txt
    [ -s a.txt ] || fail "$1: no metrics"
    cmp -s a.txt b.txt || { diff a.txt b.txt | head; fail "$2 differs from $1"; }
}
for dtype in fp32 bf16; do
    set -- precision%params_dtype="'$dtype'"
    run "small_cpu_$dtype" cpu "$small" "$@"
    run "small_guard_$dtype" guard "$small" "$@" logging%log_memory=T
    same "small_cpu_$dtype" "small_guard_$dtype"
    echo "$dtype: small model, guard = cpu"
done
run moe_cpu cpu "$moe" training%train_iters=6 moe%expert_capacity_factor=1.0
run moe_guard guard "$moe" training%train_iters=6 moe%expert_capacity_factor=1.0
same moe_cpu moe_guard
echo "expert bias, capacity drops: guard = cpu"
# save, resume, and the result of the straight run
run straight guard "$moe" training%train_iters=6 "checkpoint%save='s'"
run first guard "$moe" training%train_iters=6 training%exit_interval=3 "checkpoint%save='r'"
run second guard "$moe" training%train_iters=6 "checkpoint%load='r'" "checkpoint%save='r'"
grep -q "loaded checkpoint" second.log || fail "the resumed run did not load"
same_ckpt s/iter_0000006 r/iter_0000006 || fail "resume under the guard backend differs"
echo "checkpoint save and resume under guard: bit-exact"
# --backend cuda refuses fp32 (its GEMMs are bf16), before touching a device
if "$MOETRAIN" --backend=cuda "$small" > cuda.log 2>&1; then
    fail "--backend cuda with params_dtype fp32 ran"
fi
grep -q "set precision%params_dtype = 'bf16'" cuda.log || { cat cuda.log; fail "no fix named for --backend cuda in fp32"; }
"$MOETRAIN" --backend=gpu "$small" > bad.log 2>&1 && fail "--backend gpu accepted"
grep -q "takes cpu, cuda or guard" bad.log || { cat bad.log; fail "unclear message for --backend gpu"; }
echo "--backend errors ok"

#!/bin/sh
# CPU training throughput next to the machine's measured sgemm rate and PyTorch.
# usage: bench/cpu_step.sh [BUILDDIR]   (default: the current directory)
#
# For tiny_moe (the embedded default), bench/cpu_large.nml and bench/cpu_h512.nml:
# - tokens/s: the median over ROUNDS runs (default 3) of each run's median logged
#   interval after the first (warm-up); the same with params_dtype='bf16' (bf16 storage,
#   fp32 arithmetic) in each round, and its cost per step over fp32;
# - model GFLOP/s (Megatron's MoE FLOP count, as moetrain logs it) and that rate as a
#   fraction of the sgemm rate bench/sgemm_peak.c measures through the same BLAS;
# - the share of the step outside the GEMMs, from a perf profile of the first run (the
#   BLAS library's samples and those of moetrain's own GEMM kernel, its sg_ functions,
#   against all of moetrain's; OpenMP's runtime, mostly threads waiting at barriers,
#   shown apart); skipped with a message without perf;
# - where moetrain runs its own GEMM kernel (x86-64-v4, `moetrain --version` says
#   "GEMMs: moetrain AVX-512"), the step once more in each round with
#   MOETRAIN_CPU_GEMM=blas (the GEMMs through the BLAS), and what the kernel gains;
# - PyTorch eager on the same model and batch (bench/torch_cpu_step.py: Hugging Face's
#   Qwen3-MoE, SDPA, grouped_mm experts, fused AdamW), run alternately with moetrain in
#   each round so that both see the same machine; skipped with a message when torch
#   or transformers cannot be imported.
# The threads are OpenMP's (OMP_NUM_THREADS, default: all cores) for moetrain and the
# same number for PyTorch. Figures only: nothing here passes or fails on a rate.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
build=$(cd "${1:-.}" && pwd)
moetrain="$build/moetrain"
py=${PYTHON3:-python3}
rounds=${ROUNDS:-3}
[ -x "$moetrain" ] || { echo "bench/cpu_step.sh: no moetrain in $build (build first)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
threads=${OMP_NUM_THREADS:-$(getconf _NPROCESSORS_ONLN)}
export OMP_NUM_THREADS="$threads"

"$moetrain" --version | sed -n 's/^  *BLAS/BLAS:/p'
"$moetrain" --version | sed -n 's/.*CPU kernels: \([^)]*\)).*/CPU kernels: \1/p'
gemms=$("$moetrain" --version | sed -n 's/.*GEMMs: \([^;]*\);.*/\1/p')
echo "GEMMs: $gemms"
cc -O2 -o "$tmp/sgemm_peak" "$here/sgemm_peak.c" $(pkg-config --cflags --libs openblas 2>/dev/null || echo -lopenblas)
"$tmp/sgemm_peak" | tee "$tmp/peak.txt"
peak=$(awk '/^sgemm_peak_gflops/ {print $2}' "$tmp/peak.txt")

have_perf=no
if command -v perf >/dev/null 2>&1 && perf record -q -o "$tmp/probe.data" true >/dev/null 2>&1; then
    have_perf=yes
else
    echo "perf cannot record here: no share outside BLAS"
fi
have_torch=no
if "$py" -c 'import torch, transformers' >/dev/null 2>&1; then
    have_torch=yes
else
    echo "torch or transformers cannot be imported ($py): no PyTorch comparison" \
         "(python3 -m pip install torch transformers)"
fi

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print 0; else print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }

# moetrain_run NAME ROUND ARGS...: (MOETRAIN_CPU_GEMM=$run_gemm when set) appends "tokens/s GFLOP/s" (medians of the run's
# intervals after the first) to $tmp/NAME.mt (sets $run, not bench's $name)
moetrain_run() {
    run=$1 round=$2; shift 2
    prof=""
    [ "$round" = 1 ] && [ $have_perf = yes ] && prof="perf record -q -F 499 -o $tmp/$run.perf"
    (cd "$top" && MOETRAIN_CPU_GEMM="${run_gemm:-${MOETRAIN_CPU_GEMM:-}}" \
        MOETRAIN_DATADIR="$build" $prof "$moetrain" "$@" \
        "logging%metrics_file='$tmp/$run.jsonl'" > "$tmp/$run.log" 2>&1) ||
        { echo "$run: moetrain failed:"; tail -5 "$tmp/$run.log"; return 1; }
    sed -n 's/.*"tokens_per_s": \([0-9.e+]*\).*/\1/p' "$tmp/$run.jsonl" | sed 1d | median > "$tmp/t"
    sed -n 's/.*"tflops": \([0-9.e+-]*\).*/\1/p' "$tmp/$run.jsonl" | sed 1d | median > "$tmp/f"
    echo "$(cat "$tmp/t") $(awk '{print $1 * 1000}' "$tmp/f")" >> "$tmp/$run.mt"
}

# torch_args NAME ARGS...: bench/torch_cpu_step.py's options for the model moetrain
# resolves from ARGS
torch_args() {
    name=$1; shift
    (cd "$top" && MOETRAIN_DATADIR="$build" "$moetrain" --print-config "$@") > "$tmp/$name.cfg"
    awk -v threads="$threads" '
        /^&/ { g = substr($1, 2); next }
        /^\// { next }
        { sub(/^ +/, ""); k = $1; sub(/^[^=]*= */, ""); v[g "." k] = $0 }
        END {
            lf = v["moe.layer_freq"]; gsub(/ /, "", lf)
            printf "--layers %s --hidden %s --heads %s --groups %s --head-dim %s --ffn %s ",
                v["model.num_layers"], v["model.hidden_size"], v["model.num_attention_heads"],
                v["model.num_query_groups"], v["model.kv_channels"], v["model.ffn_hidden_size"]
            printf "--experts %s --expert-ffn %s --topk %s --vocab %s --seq %s ",
                v["moe.num_experts"], v["moe.moe_ffn_hidden_size"], v["moe.router_topk"], v["model.vocab_size"],
                v["training.seq_length"]
            printf "--micro-batch %s --global-batch %s --moe-layers %s --aux-coeff %s ",
                v["training.micro_batch_size"], v["training.global_batch_size"], lf, v["moe.aux_loss_coeff"]
            printf "--rope-theta %s --eps %s --lr %s --weight-decay %s --clip-grad %s --threads %s\n",
                v["model.rotary_base"], v["model.norm_epsilon"], v["optimizer.lr"], v["optimizer.weight_decay"], v["optimizer.clip_grad"], threads
        }' "$tmp/$name.cfg"
}

torch_run() {
    name=$1
    # shellcheck disable=SC2046
    "$py" "$here/torch_cpu_step.py" $(cat "$tmp/$name.targs") > "$tmp/$name.tlog" 2>&1 ||
        { echo "$name: torch_cpu_step.py failed:"; tail -3 "$tmp/$name.tlog"; return 0; }
    [ "${TORCH_SAID:-}" = "$name" ] || { grep -v result "$tmp/$name.tlog" | head -1; TORCH_SAID=$name; }
    sed -n 's/.*result tokens_per_s=\([0-9.]*\) gflops=\([0-9.]*\).*/\1 \2/p' "$tmp/$name.tlog" >> "$tmp/$name.pt"
}

# profile_shares NAME: "gemm% omp% other%" of moetrain's samples in the first run
profile_shares() {
    perf report -q -i "$tmp/$1.perf" --comm moetrain --sort dso,sym 2>/dev/null |
        awk '{ s = $1; sub(/%/, "", s); sym = $NF
               if ($2 ~ /blas|blis|mkl/ || ($2 == "moetrain" && sym ~ /^sg_/)) b += s
               else if ($2 ~ /gomp|iomp/) o += s; else r += s }
             END { t = b + o + r; if (t == 0) t = 1; printf "%.0f %.0f %.0f", 100 * b / t, 100 * o / t, 100 * r / t }'
}

bench() {
    name=$1; shift
    : > "$tmp/$name.mt"
    : > "$tmp/$name.pt"
    : > "$tmp/$name.bf16.mt"
    : > "$tmp/$name.blas.mt"
    [ $have_torch = yes ] && torch_args "$name" "$@" > "$tmp/$name.targs"
    r=1
    while [ $r -le "$rounds" ]; do
        moetrain_run "$name" $r "$@" || return 1
        moetrain_run "$name.bf16" - "$@" "precision%params_dtype='bf16'" || return 1
        if [ "$gemms" = "moetrain AVX-512" ]; then
            run_gemm=blas
            moetrain_run "$name.blas" - "$@" || return 1
            run_gemm=
        fi
        [ $have_torch = yes ] && torch_run "$name"
        r=$((r + 1))
    done
    tok=$(awk '{print $1}' "$tmp/$name.mt" | median)
    gf=$(awk '{print $2}' "$tmp/$name.mt" | median)
    printf "%-10s moetrain tokens/s %8.0f | model GFLOP/s %7.2f | %5.1f%% of sgemm (%.1f GFLOP/s)" \
        "$name" "$tok" "$gf" "$(echo "$gf $peak" | awk '{print 100 * $1 / $2}')" "$peak"
    if [ $have_perf = yes ]; then
        set -- $(profile_shares "$name")
        printf " | outside the GEMMs %s%% (OpenMP runtime %s%%)" "$(($2 + $3))" "$2"
    fi
    echo
    btok=$(awk '{print $1}' "$tmp/$name.bf16.mt" | median)
    printf "%-10s bf16     tokens/s %8.0f | params_dtype='bf16' costs %+.1f%% per step over fp32\n" \
        "$name" "$btok" "$(echo "$tok $btok" | awk '{print 100 * ($1 / $2 - 1)}')"
    if [ -s "$tmp/$name.blas.mt" ]; then
        ltok=$(awk '{print $1}' "$tmp/$name.blas.mt" | median)
        printf "%-10s BLAS     tokens/s %8.0f | GEMMs through the BLAS (MOETRAIN_CPU_GEMM=blas): moetrain's kernel %+.1f%% tokens/s\n" \
            "$name" "$ltok" "$(echo "$tok $ltok" | awk '{print 100 * ($1 / $2 - 1)}')"
    fi
    if [ -s "$tmp/$name.pt" ]; then
        ttok=$(awk '{print $1}' "$tmp/$name.pt" | median)
        tgf=$(awk '{print $2}' "$tmp/$name.pt" | median)
        printf "%-10s pytorch  tokens/s %8.0f | model GFLOP/s %7.2f | %5.1f%% of sgemm | moetrain/pytorch %.2fx\n" \
            "$name" "$ttok" "$tgf" "$(echo "$tgf $peak" | awk '{print 100 * $1 / $2}')" \
            "$(echo "$tok $ttok" | awk '{print $1 / $2}')"
    fi
    printf "%-10s per run (moetrain | bf16 | BLAS GEMMs | pytorch tokens/s): %s | %s | %s | %s\n" \
        "$name" \
        "$(awk '{printf "%s%.0f", (NR > 1 ? " " : ""), $1}' "$tmp/$name.mt")" \
        "$(awk '{printf "%s%.0f", (NR > 1 ? " " : ""), $1}' "$tmp/$name.bf16.mt")" \
        "$(awk '{printf "%s%.0f", (NR > 1 ? " " : ""), $1}' "$tmp/$name.blas.mt")" \
        "$(awk '{printf "%s%.0f", (NR > 1 ? " " : ""), $1}' "$tmp/$name.pt")"
}

echo "threads: $threads; rounds: $rounds (moetrain and PyTorch alternate)"
bench tiny_moe namelists/tiny_moe.nml training%train_iters=60 training%eval_interval=1000 training%eval_iters=0
bench cpu_large bench/cpu_large.nml
bench cpu_h512 bench/cpu_h512.nml

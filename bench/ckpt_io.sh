#!/bin/sh
# Checkpoint I/O throughput next to the disk's measured sequential rates.
# usage: bench/ckpt_io.sh [BUILDDIR [DIR]]   (default: the current directory; DIR, where
#        the checkpoints go, default a temporary directory under $TMPDIR or /tmp)
# A model of about 216M parameters (a 2.6 GB checkpoint: fp32 parameters and both Adam
# moments) is trained 4 iterations and saved at 2 and 4, by 1 process and by 4 (EP 4,
# with mpirun), synchronously and with checkpoint%async_save; each checkpoint is then
# loaded by 1 and by 4 processes. Printed per run: the save's or load's time, the total
# rate (checkpoint bytes / time) and the per-rank rate (the largest rank's part / time),
# each as a fraction of dd's sequential write (conv=fsync) or read (iflag=direct) rate
# on DIR; for async saves, the background write's rate and the time training was blocked
# per save. Loads read through the page cache, which the save has just filled unless
# the caches can be dropped (needs root): the script says which.
set -eu
build=$(cd "${1:-.}" && pwd)
moetrain="$build/moetrain"
[ -x "$moetrain" ] || { echo "bench/ckpt_io.sh: no moetrain in $build (build first)" >&2; exit 1; }
dir=$(mktemp -d "${2:-${TMPDIR:-/tmp}}/ckpt_io.XXXXXX")
trap 'rm -rf "$dir"' EXIT
MODEL="model%num_layers=4 model%hidden_size=1024 model%num_attention_heads=16
model%num_query_groups=4 model%kv_channels=64 model%ffn_hidden_size=4096 model%vocab_size=257
model%max_position_embeddings=64 moe%num_experts=16 moe%moe_ffn_hidden_size=1024
moe%router_topk=2 moe%layer_freq=4*1 training%micro_batch_size=1 training%global_batch_size=4
training%seq_length=8 training%eval_interval=1000 training%eval_iters=0 data%mock_data=T
logging%log_interval=1"
EP4="parallel%expert_model_parallel_size=4"
OMP_NUM_THREADS=1
export OMP_NUM_THREADS
if [ "$(id -u)" = 0 ]; then # OpenMPI refuses root unless told
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
fi

# the disk: 2 GiB written and synced, then read bypassing the cache
rate() { awk '/copied/ { for (i = 1; i <= NF; i++) if ($i ~ /^s,?$/) s = $(i - 1); print $1 / s / 1e6 }'; }
dd if=/dev/zero of="$dir/dd" bs=16M count=128 conv=fsync 2>&1 | rate > "$dir/w"
dd if="$dir/dd" of=/dev/null bs=16M iflag=direct 2>&1 | rate > "$dir/r"
rm -f "$dir/dd"
wr=$(cat "$dir/w")
rd=$(cat "$dir/r")
printf 'disk (%s): sequential write %.0f MB/s (dd conv=fsync), read %.0f MB/s (dd iflag=direct)\n' \
    "$(df -P "$dir" | awk 'NR == 2 { print $1 }')" "$wr" "$rd"
drop=no
if (sync && echo 3 > /proc/sys/vm/drop_caches) 2> /dev/null; then drop=yes; fi
echo "loads read through the page cache; dropped before each load: $drop"

launch() { # launch NP ARGS... (sh has no locals: its own variable name)
    launch_np=$1; shift
    if [ "$launch_np" = 1 ]; then "$moetrain" "$@"
    else mpirun --oversubscribe -np "$launch_np" "$moetrain" "$@" parallel%distributed_timeout_minutes=10
    fi
}
# report LOG WHAT BYTES DISKRATE NAME ASYNC: the figures of LOG's "checkpoint WHAT:" lines
# (of an async save, whose time includes training, the background write's instead)
report() {
    awk -v what="$2" -v bytes="$3" -v disk="$4" -v name="$5" -v async="${6:-0}" '
        $1 == "checkpoint" && $2 == what ":" {
            for (i = 1; i <= NF; i++) if ($i == "part") own = $(i + 1)
            s = $3; n++
            if (!async) {
                printf "%-22s %s %d: %6.2f s, total %7.1f MB/s (%.2f of the disk), per rank %7.1f MB/s\n",
                    name, what, n, s, bytes / s / 1e6, bytes / s / 1e6 / disk, own / s / 1e6
            }
        }
        /^checkpoint save blocked training/ {
            b = $6
            if ($0 ~ /async/) {
                match($0, /in the background in [0-9.]+/); w = substr($0, RSTART + 21, RLENGTH - 21)
                match($0, /snapshot [0-9.]+/); sn = substr($0, RSTART + 9, RLENGTH - 9)
                match($0, /writer [0-9.]+/); wt = substr($0, RSTART + 7, RLENGTH - 7)
                printf "%-22s save %d: written in the background in %6.2f s, total %7.1f MB/s (%.2f of the disk), per rank %7.1f MB/s; training blocked %.3f s (snapshot %s s, waiting %s s)\n",
                    name, n, w, bytes / w / 1e6, bytes / w / 1e6 / disk, own / w / 1e6, b, sn, wt
            } else {
                printf "%-22s save %d: training blocked %.3f s (synchronous)\n", name, n, b
            }
        }' "$1"
}

for np in 1 4; do
    layout=""
    [ "$np" = 4 ] && layout=$EP4
    for mode in sync async; do
        name="save_${np}_$mode"
        async=F
        [ $mode = async ] && async=T
        # shellcheck disable=SC2086 # lists of overrides
        launch "$np" $MODEL $layout training%train_iters=4 checkpoint%save_interval=2 \
            checkpoint%async_save=$async "checkpoint%save='$dir/$name'" > "$dir/$name.log" 2>&1 ||
            { tail -5 "$dir/$name.log"; echo "$name failed" >&2; exit 1; }
        bytes=$(du -sb "$dir/$name/iter_0000004" | awk '{ print $1 }')
        [ "$np$mode" = 1sync ] && sed -n 's/^model: \([0-9]*\) parameters.*/model: \1 parameters; checkpoint /p' "$dir/$name.log" | tr -d '\n' &&
            echo "$bytes bytes"
        report "$dir/$name.log" save "$bytes" "$wr" "$name ($np proc)" "$([ $mode = async ] && echo 1 || echo 0)"
        rm -rf "$dir/$name/iter_0000002"
    done
    for lnp in 1 4; do
        llayout=""
        [ "$lnp" = 4 ] && llayout=$EP4
        [ $drop = yes ] && sync && echo 3 > /proc/sys/vm/drop_caches
        name="load_${np}to$lnp"
        # shellcheck disable=SC2086
        launch "$lnp" $MODEL $llayout training%train_iters=4 "checkpoint%load='$dir/save_${np}_sync'" \
            > "$dir/$name.log" 2>&1 || { tail -5 "$dir/$name.log"; echo "$name failed" >&2; exit 1; }
        report "$dir/$name.log" load "$bytes" "$rd" "$name ($lnp proc)"
    done
    rm -rf "$dir/save_${np}_sync" "$dir/save_${np}_async"
done

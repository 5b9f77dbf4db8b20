#!/bin/bash
# Qwen3-30B-A3B (48 layers, 128 experts, top-8) on 256 GPUs: 64 nodes x 4 GPUs.
#
#   sbatch slurm/qwen3_256gpu.sh [group%key=value ...]   train (overrides go to moetrain)
#   bash slurm/qwen3_256gpu.sh --check [--verbose] [group%key=value ...]
#                                   validate the namelist and this layout for
#                                   256 processes on a login node, no Slurm
#                                   needed: prints the layout and the groups
#                                   (--verbose: every group)
#
# Submit from the moetrain source tree, or after `module load moetrain` (which
# sets MOETRAIN_NAMELISTS). The moetrain it runs: $MOETRAIN if set, else the one
# on PATH (the installed one once the module is loaded), else the build in the
# source tree it is run or submitted from (./moetrain, or the newest
# */moetrain of an out-of-tree build); it says which. Before a real run give it data, e.g.
#   sbatch slurm/qwen3_256gpu.sh "data%data_path='/lustre/corpus/qwen_text_document'" \
#          data%mock_data=.false. "checkpoint%save='/lustre/ckpt/qwen3'" checkpoint%save_interval=1000
#
# Time limits and requeue (doc/what-happens.md): with MOETRAIN_CKPT set, e.g.
#   MOETRAIN_CKPT=/lustre/ckpt/qwen3 MOETRAIN_REQUEUE=1 sbatch slurm/qwen3_256gpu.sh
# the job saves into and resumes from that directory (the first run starts from
# initialisation: checkpoint%load_optional). --signal below makes Slurm send SIGUSR1
# to every task 10 minutes before the time limit: moetrain saves a checkpoint at the
# end of the iteration it is in (all ranks agree on which) and exits with status 138
# (128 + SIGUSR1). With MOETRAIN_REQUEUE=1 the script then requeues the job, which
# resumes from that checkpoint. 10 minutes must cover one iteration plus one save on
# your file system; raise it if a save takes longer. scancel --signal=USR1 JOBID
# stops a job the same way by hand (a plain scancel sends SIGTERM: moetrain saves then
# too, if Slurm's KillWait leaves it the time).
#
# Layout (Megatron vocabulary; order tp-cp-ep-dp-pp):
#   attention/dense: TP 2 (with sequence parallelism) x PP 4 x DP 32
#   experts:         ETP 1 x EP 8 x EDP 8 x PP 4 (MoE parallel folding, same ranks)
#   48 layers / PP 4 = 12 per stage; 128 experts / EP 8 = 16 per rank.
#   global batch 1024 sequences of 4096 = micro 1 x DP 32 x 32 micro-batches.
# moetrain places the TP and EP groups inside NVLink domains (&topology
# placement = 'nvlink', the default) and binds each process to the cores and
# NUMA node of its GPU itself (&host cpu_affinity = 'gpu'), which is why srun
# must not bind (--cpu-bind=none).
#
# Memory: --check prints what each pipeline stage's most loaded rank allocates, by
# category (doc/memory.md): 39.50 GiB on stage 0, which holds 4 micro-batches in flight.
# precision%gpu_memory_gb = 74 makes --check and the job itself (before it allocates)
# refuse a change that would not fit an 80 GB H100 (79.6 GiB, less the CUDA context,
# NCCL's buffers and fragmentation, which moetrain does not allocate).
#
# Timeouts: &parallel distributed_timeout_minutes bounds every collective
# separately; a process that dies or hangs makes its peers fail within that
# time with a message naming the collective and the group ("all_reduce on
# tp[3] timed out ..."), and the job ends. --kill-on-bad-exit ends the step as
# soon as any task exits with an error, even before the runtime is up.
#
# Site-specific: --cpus-per-task (the cores that belong to one GPU on your
# nodes) and --time.
#
# The job's shape lives in the #SBATCH lines below and nowhere else: --check
# reads --nodes and --ntasks-per-node from them, and a job stops at once if
# Slurm gave it another shape (sbatch -N on the command line overrides the
# lines: change them instead, then run --check). One task per GPU:
# --ntasks-per-node must equal --gpus-per-node.
#
#SBATCH --job-name=qwen3-30b-a3b
#SBATCH --nodes=64
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=16
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --output=%x-%j.out
#SBATCH --signal=USR1@600
#SBATCH --requeue

set -euo pipefail

# sbatch_value OPTION: the value of this script's '#SBATCH --OPTION=N' line
sbatch_value() { sed -n "s/^#SBATCH --$1=\([0-9][0-9]*\)\$/\1/p" "$0"; }
NODES=$(sbatch_value nodes)
TASKS_PER_NODE=$(sbatch_value ntasks-per-node)
if [ -z "$NODES" ] || [ -z "$TASKS_PER_NODE" ] || [ "$TASKS_PER_NODE" != "$(sbatch_value gpus-per-node)" ]; then
    echo "$0: needs '#SBATCH --nodes=N', '#SBATCH --ntasks-per-node=G' and '#SBATCH --gpus-per-node=G' lines (one task per GPU)" >&2
    exit 2
fi
NML="${MOETRAIN_NAMELISTS:-namelists}/qwen3_30b_a3b.nml"

# find_moetrain: prints the moetrain to run and says on stderr which it is.
# slurm/qwen3_256gpu.sh, slurm/gb200_nvl72.sh and slurm/cpu_example.sh hold the
# same function (tests/install/slurm_check.sh checks that the copies are
# identical): sbatch sends Slurm only the script itself, which runs from a copy
# in slurmd's spool directory, so a helper file beside it cannot be sourced.
find_moetrain() {
    local top=${SLURM_SUBMIT_DIR:-$PWD} bin= b
    if [ -n "${MOETRAIN:-}" ]; then
        bin=$MOETRAIN why='$MOETRAIN'
    elif bin=$(command -v moetrain); then
        why="on PATH"
    elif [ -f "$top/namelists/${NML##*/}" ]; then
        bin=
        for b in "$top/moetrain" "$top"/*/moetrain; do
            [ -f "$b" ] && [ -x "$b" ] || continue
            if [ -z "$bin" ] || [ "$b" -nt "$bin" ]; then bin=$b; fi
        done
        why="the newest build in the source tree $top"
    fi
    if [ -z "$bin" ]; then
        echo "$0: no moetrain: not on PATH (module load moetrain), MOETRAIN not set, and no build in" \
             "$top (run from a built source tree: ./configure && make)" >&2
        return 1
    fi
    echo "$0: moetrain is $bin ($why)" >&2
    echo "$bin"
}
MOETRAIN_BIN=$(find_moetrain) || exit 2

LAYOUT=(
    parallel%tensor_model_parallel_size=2
    parallel%sequence_parallel=.true.
    parallel%pipeline_model_parallel_size=4
    parallel%expert_model_parallel_size=8
    parallel%expert_tensor_parallel_size=1
    parallel%use_distributed_optimizer=.true.
    parallel%distributed_timeout_minutes=10
    training%global_batch_size=1024
    precision%gpu_memory_gb=74
)

if [ "${1:-}" = --check ]; then
    shift
    exec "$MOETRAIN_BIN" --check --world-size $((NODES * TASKS_PER_NODE)) "$NML" "${LAYOUT[@]}" "$@"
fi

if [ "${SLURM_JOB_NUM_NODES:-}" != "$NODES" ] || [ "${SLURM_NTASKS_PER_NODE:-}" != "$TASKS_PER_NODE" ]; then
    echo "$0: this job has ${SLURM_JOB_NUM_NODES:-?} nodes x ${SLURM_NTASKS_PER_NODE:-?} tasks per node; its layout is for" \
         "$NODES x $TASKS_PER_NODE (the #SBATCH lines). Edit --nodes/--ntasks-per-node there, check the layout" \
         "with this script's --check mode, and submit without overriding them." >&2
    exit 2
fi

CKPT=()
if [ -n "${MOETRAIN_CKPT:-}" ]; then
    CKPT=("checkpoint%save='$MOETRAIN_CKPT'" "checkpoint%load='$MOETRAIN_CKPT'"
          checkpoint%load_optional=.true.)
fi

# One OpenMP thread pool per process over its cores.
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-16}

# NCCL's GPU memory (doc/architecture.md, "NCCL communicators"): this layout makes 8
# NCCL communicators per process on the first and last pipeline stages and 7 on the
# others (moetrain --check prints the count), split from one that shares its resources
# with them (splitShare; a NCCL_COMM_SPLIT_SHARE_RESOURCES=0 from the environment would
# undo that). NVLink SHARP stays as NCCL decides (on where the NVSwitches support it);
# its buffers are the largest part of a communicator's memory, so if NCCL's
# initialisation runs out of GPU memory, uncomment this (it costs the NVLS algorithms'
# speed on NVSwitch systems; measure before keeping it):
#export NCCL_NVLS_ENABLE=0

rc=0
srun --mpi=pmix --cpu-bind=none --kill-on-bad-exit=1 \
    "$MOETRAIN_BIN" "$NML" "${LAYOUT[@]}" "${CKPT[@]}" "$@" || rc=$?
# 138: stopped by the time limit's SIGUSR1 after saving its checkpoint
if [ "$rc" -eq 138 ] && [ "${MOETRAIN_REQUEUE:-0}" = 1 ] && [ -n "${MOETRAIN_CKPT:-}" ]; then
    echo "moetrain saved and stopped before the time limit: requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"

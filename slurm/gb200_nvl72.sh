#!/bin/bash
# Qwen3-235B-A22B (94 layers, 128 experts, top-8) on GB200 NVL72: 4 racks, each
# one NVLink domain of 18 compute trays x 4 GPUs (72 GPUs); a tray is a Slurm
# node. 72 nodes x 4 GPUs = 288 processes.
#
#   sbatch slurm/gb200_nvl72.sh [group%key=value ...]   train (overrides go to moetrain)
#   bash slurm/gb200_nvl72.sh --check [group%key=value ...]
#                                   validate the namelist and this layout for
#                                   288 processes on a login node, no Slurm needed
# and, to see where every rank would go on four whole racks:
#   moetrain topo --dry-run --nodes-file racks.txt --gpus-per-node 4 \
#       $MOETRAIN_NAMELISTS/qwen3_235b_a22b.nml <the LAYOUT below>
# with racks.txt one 'hostname domain' line per tray (doc/topology.md).
#
# Layout (Megatron vocabulary; order tp-cp-ep-dp-pp):
#   attention/dense: TP 4 (with sequence parallelism) x PP 4 x DP 18
#   experts:         ETP 1 x EP 8 x EDP 9 x PP 4 (MoE parallel folding)
#   94 layers over PP 4 = 23, 24, 24, 23 (the first and last stages also hold the
#   embedding and the LM head); 128 experts / EP 8 = 16 per rank.
#   global batch 1152 sequences of 4096 = micro 1 x DP 18 x 64 micro-batches.
# Memory: --check prints each stage's most loaded rank by category (doc/memory.md):
# 130.44 GiB on stage 0 with bf16 weights and activations. PP 2 would plan 203.2 GiB,
# more than a GB200's 186 GB. precision%gpu_memory_gb = 167 makes --check and the job
# refuse a change that would not fit (186 GB = 173.2 GiB, less the CUDA context,
# NCCL's buffers and fragmentation, which moetrain does not allocate).
# Check with --check before submitting.
# The TP and EP groups fold into blocks of lcm(4, 8) = 8 ranks = 2 trays, and a
# rack holds 9 such blocks exactly (72 / 8): with whole racks, &topology
# placement = 'nvlink' keeps every TP and EP group inside one NVLink domain.
# A block size that does not divide 72 (EP 16: blocks of 16) leaves GPUs of
# every rack unusable for whole blocks; moetrain then says so and what to change.
#
# Which NVLink domain a process is in: &topology nvlink_domain_source = 'nvml'
# (below) reads the GPU's fabric clique (NVML clusterUuid/cliqueId), which on
# NVL72 is the rack; it needs the NVIDIA fabric manager / IMEX services up
# (nvidia-smi -q: Fabric State Completed). It is an error, not a fallback, when
# the fabric is not up: with 'auto' such a job would silently treat every tray
# as its own domain. Alternatives: 'slurm' (the rack from SLURM_TOPOLOGY_ADDR,
# when topology.conf has one switch or block per rack) or 'file'
# (&topology domain_map_file, 'tray rack' lines).
#
# Keeping the job's nodes in whole racks (Slurm's topology plugin, set by the
# site in slurm.conf; `scontrol show config | grep Topology` shows which):
# - Slurm 22.05 and later, TopologyPlugin=topology/tree with one leaf switch
#   per rack in topology.conf (SwitchName=rack01 Nodes=...): --switches=N@T
#   asks for at most N leaf switches, waiting up to T for them; with 72 nodes
#   in 4 racks of 18, N = 4 means four whole racks (the line below).
# - Slurm 23.11 and later, TopologyPlugin=topology/block with BlockName=rackNN
#   lines and BlockSizes=18: the scheduler packs a job into as few blocks as
#   it can. The --segment=S option (Slurm 24.05 and later) builds the
#   allocation from segments of S nodes that each sit inside one block: S = 18
#   gives whole racks, S = 2 (one 8-rank block) is enough for moetrain's rule
#   and schedules sooner. Older sbatch rejects --segment, so it is commented
#   out below: on such a system remove one '#' from '##SBATCH --segment=18'
#   (--switches is then ignored).
#
# The job's shape lives in the #SBATCH lines and nowhere else: --check reads
# --nodes and --ntasks-per-node from them, and a job stops at once if Slurm
# gave it another shape. Change --switches with --nodes (racks = nodes / 18).
# Site-specific: --cpus-per-task (a tray has 2 Grace CPUs of 72 cores for its
# 4 GPUs: 36 per GPU), --time, and how your site grants IMEX channels.
#
#SBATCH --job-name=qwen3-235b-nvl72
#SBATCH --nodes=72
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=36
#SBATCH --exclusive
#SBATCH --switches=4@2:00:00
##SBATCH --segment=18
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
NML="${MOETRAIN_NAMELISTS:-namelists}/qwen3_235b_a22b.nml"

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
    parallel%tensor_model_parallel_size=4
    parallel%sequence_parallel=.true.
    parallel%pipeline_model_parallel_size=4
    parallel%decoder_first_pipeline_num_layers=23
    parallel%decoder_last_pipeline_num_layers=23
    parallel%expert_model_parallel_size=8
    parallel%expert_tensor_parallel_size=1
    parallel%use_distributed_optimizer=.true.
    parallel%distributed_timeout_minutes=10
    training%global_batch_size=1152
    precision%gpu_memory_gb=167
    "topology%nvlink_domain_source='nvml'"
    "topology%placement='nvlink'"
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

export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-36}

# moetrain binds each process to its GPU's cores itself: srun must not bind.
rc=0
srun --mpi=pmix --cpu-bind=none --kill-on-bad-exit=1 \
    "$MOETRAIN_BIN" "$NML" "${LAYOUT[@]}" "${CKPT[@]}" "$@" || rc=$?
# 138: stopped by the time limit's SIGUSR1 after saving (see slurm/qwen3_256gpu.sh)
if [ "$rc" -eq 138 ] && [ "${MOETRAIN_REQUEUE:-0}" = 1 ] && [ -n "${MOETRAIN_CKPT:-}" ]; then
    echo "moetrain saved and stopped before the time limit: requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"

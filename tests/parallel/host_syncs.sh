#!/bin/sh
# A step that stays on the device, on every rank (doc/host-overhead.md, "What the host
# waits for"): the host synchronisations per step counted by the guard backend (what the
# op table's contract makes a device wait for) under data, tensor, expert (all-to-all)
# and pipeline parallelism (1F1B and interleaved), the largest over the ranks as the log
# gives it, asserted exactly after the first step for dropless routing and for
# drop-and-pad. Per step: one read (the losses, drops, expert loads and the gradient
# norm), and per MoE layer of the rank and micro-batch one read of the split sizes when
# dropless; drop-and-pad reads none. A read per micro-batch coming back fails here.
. "$MT_TOP_SRCDIR/tests/parallel/common.sh"
need_mpirun
moe="$MT_TOP_SRCDIR/tests/parallel/moe.nml"
PAD="moe%expert_capacity_factor=1.0 moe%pad_expert_input_to_capacity=T"
# moe.nml: 2 MoE layers of 3 (layer_freq 1,0,1), global batch 16 of micro-batches of 2;
# the expert bias off unless a layout turns it on (later overrides win)
PP2="parallel%pipeline_model_parallel_size=2 model%num_layers=4 moe%layer_freq=1,0,1,0"
RC="recompute%granularity='selective' recompute%modules='moe'"
BIAS="moe%router_enable_expert_bias=T"
DELAYED="precision%fp8_format='e4m3' precision%fp8_recipe='delayed'"
BLOCKWISE="precision%fp8_format='e4m3' precision%fp8_recipe='blockwise'"
# NAME NP SYNCS OVERRIDES: every logged step waited SYNCS times on the busiest rank
for layout in \
    "dp 2 9 $ZERO" \
    "dp_pad 2 1 $ZERO $PAD" \
    "tp 2 17 $TP2 parallel%expert_tensor_parallel_size=1" \
    "tp_etp 2 17 $TP2" \
    "tp_pad 2 1 $TP2 $PAD" \
    "ep 2 9 $EP2" \
    "ep_pad 2 1 $EP2 $PAD" \
    "pp 2 9 $PP2" \
    "pp_pad 2 1 $PP2 $PAD" \
    "vpp 2 17 $PP2 parallel%virtual_pipeline_model_parallel_size=2" \
    "vpp_pad 2 1 $PP2 parallel%virtual_pipeline_model_parallel_size=2 $PAD" \
    "ep_ag 2 9 $EP2 $AG" \
    "ep_ag_pad 2 1 $EP2 $AG $PAD" \
    "ep_rc 2 9 $EP2 $RC" \
    "dp_bias 2 9 $ZERO $BIAS" \
    "ep_bias_pad 2 1 $EP2 $BIAS $PAD" \
    "ep_fp8 2 9 $EP2 $DELAYED" \
    "ep_fp8_pad 2 1 $EP2 $BLOCKWISE $PAD" \
    "ep_ag_fp8 2 9 $EP2 $AG $BLOCKWISE"; do
    # dp: 4 micro-batches per rank x 2 MoE layers + 1 = 9
    # tp (the experts whole on each rank, the vocabulary split: the shards' logsumexps
    #   combined on the backend): 8 micro-batches x 2 MoE layers + 1 = 17
    # tp_etp (the experts split over ETP 2: the all-to-all dispatcher, its sort maps
    #   uploaded on the copy stream): 17 as tp; ep: 4 micro-batches x 2 + 1 = 9;
    #   ep_pad: the counts static, the maps uploaded once (the first step: 7); tp_pad:
    #   the capacity decided over the TP group's micro-batch on the backend (drop_mask)
    # pp: each stage one MoE layer (layers 0 and 2 of 4): 8 micro-batches x 1 + 1 = 9
    #   (the first stage's embedding and the last's loss add nothing); vpp: stage 0
    #   holds the chunks of layers 0 and 2, both MoE: 8 x 2 + 1 = 17
    # ep_ag (the all-gather dispatcher: its routing masked and renumbered on the
    #   backend, the count of its experts' rows the layer's one read): 4 x 2 + 1 = 9;
    #   ep_ag_pad: static rows, nothing read: 1
    # ep_rc (selective recompute of the MoE layers: the rebuild takes its forward's
    #   offsets and sort maps): 4 x 2 + 1 = 9
    # dp_bias, ep_bias_pad (the expert bias updated on the device from the loads summed
    #   over the ranks there): no extra, 9 and 1
    # ep_fp8, ep_fp8_pad, ep_ag_fp8 (FP8 routed experts: their quantised GEMMs split by
    #   the host's copy of the expert offsets, from the counts exchanged over EP or the
    #   all-gather dispatcher's one read of its experts' rows): BF16's 9 and 1
    # shellcheck disable=SC2086 # name, np, syncs and a list of overrides
    set -- $layout
    name=$1 np=$2 want=$3
    shift 3
    mpirun_np "$np" -x OMP_NUM_THREADS "$MOETRAIN" --backend=guard "$moe" training%train_iters=3 \
        training%eval_interval=100 moe%router_enable_expert_bias=F logging%log_interval=1 \
        "logging%metrics_file='$name.jsonl'" parallel%distributed_timeout_minutes=1 "$@" \
        > "$name.log" 2>&1 < /dev/null || { cat "$name.log"; fail "$name: training failed"; }
    # after the first step (warm-up: static maps uploaded once)
    got=$(field "$name.jsonl" host_syncs | sed 1d | sort -u | tr '\n' ' ')
    [ "$got" = "$want.000 " ] || fail "$name: host synchronisations per step: $got, not $want"
    echo "  $name: $want host synchronisations per step"
done
echo "ok: one host synchronisation per step, and one per dropless MoE layer and micro-batch, on every rank"

#!/bin/sh
# Bytes one decoder layer's forward writes and reads at the Qwen3-30B-A3B proxy's widths
# (bench/qwen3_30b_proxy.nml: hidden 2048, 32 heads of 128 over 4 KV groups, QK-norm,
# 128 experts of 768 top-8), bf16 storage against fp32 storage rounded in place. 1024
# tokens (every figure but the weights' is linear in the tokens; the CPU runs the forward
# of 6 layers to count them) and a vocabulary of 1024 (it does not enter a decoder
# layer). Run from a build directory: sh ../bench/bytes_moved.sh
dir=$(dirname "$0")
MOETRAIN_DATADIR=${MOETRAIN_DATADIR:-$PWD} exec ./bench/bytes_moved "$dir/qwen3_30b_proxy.nml" \
    model%vocab_size=1024 training%seq_length=1024 "$@"

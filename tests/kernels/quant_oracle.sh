#!/bin/sh
# kernels/quant.h's FP8/FP4 codecs and Philox against NVIDIA's cuda_fp8.h, cuda_fp4.h and
# cuRAND, bit for bit (tests/kernels/quant_oracle.cc, built by the host C++ compiler
# against the CUDA headers). Skips (77) only when configure found no such headers.
mk="${MT_TOP_BUILDDIR:-.}/Makefile"
flags=$(sed -n 's/^cuda_fp_CPPFLAGS = //p' "$mk")
if [ -z "$flags" ]; then
    echo "SKIP: configure found no cuda_fp8.h/cuda_fp4.h with host conversions (the CUDA headers);"
    echo "      pass --with-cuda=DIR naming a CUDA toolkit (12.8 or later), with or without nvcc"
    exit 77
fi
oracle="${MT_TOP_BUILDDIR:-.}/tests/kernels/quant_oracle"
[ -x "$oracle" ] || { echo "FAIL: $oracle was not built (configure found the headers: $flags)"; exit 1; }
exec "$oracle"

#!/bin/sh
# The CUDA op table is complete, and mt_kernels_cuda fails cleanly without a device.
exec "${MT_TOP_BUILDDIR:-.}/tests/gpu/test_cuda_table"

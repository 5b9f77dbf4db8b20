# kernels/cpu: the C reference backend (BLAS for GEMM, OpenMP loops, fp32 math; bf16
# tensors widened to fp32 on input and rounded to nearest even on output, cpu_typed.c).
noinst_LTLIBRARIES += libmt_kernels.la
MT_MODULE_LIBS += libmt_kernels.la
libmt_kernels_la_SOURCES = \
	kernels/cpu/cpu_backend.c \
	kernels/cpu/cpu_dense.c \
	kernels/cpu/cpu_layers.c \
	kernels/cpu/cpu_loss.c \
	kernels/cpu/cpu_moe.c \
	kernels/cpu/cpu_guard.c \
	kernels/cpu/cpu_plan.c \
	kernels/cpu/cpu_typed.c \
	kernels/cpu/cpu_quant.c \
	kernels/cpu/cpu_qdq.c \
	kernels/cpu/cpu_ops.h \
	kernels/cpu/cpu_blas.h
# No code here reads the floating-point exception flags or errno; without the
# assumptions that a comparison may trap and that sqrtf sets errno, GCC turns the
# selects of clamps and max reductions into vector blends and sqrtf into one
# instruction, so `#pragma omp simd` loops with them vectorise. Values are unchanged.
libmt_kernels_la_CFLAGS = $(AM_CFLAGS) -fno-trapping-math -fno-math-errno

include tests/kernels/local.mk

# kernels/cpu: the C reference backend (BLAS for GEMM, OpenMP loops, fp32 math; bf16
# tensors widened to fp32 on input and rounded to nearest even on output, cpu_typed.c).
noinst_LTLIBRARIES += libmt_kernels.la
MT_MODULE_LIBS += libmt_kernels.la
# The compute files: built with the build's flags here and again, below, for the x86-64
# levels configure found the compiler takes (kernels/cpu/cpu_isa.h: each level's globals
# get its suffix; cpu_backend.c picks the highest the CPU has at start).
MT_CPU_LEVEL_SRC = \
	kernels/cpu/cpu_table.c \
	kernels/cpu/cpu_dense.c \
	kernels/cpu/cpu_layers.c \
	kernels/cpu/cpu_loss.c \
	kernels/cpu/cpu_moe.c \
	kernels/cpu/cpu_typed.c
libmt_kernels_la_SOURCES = \
	kernels/cpu/cpu_backend.c \
	kernels/cpu/cpu_guard.c \
	kernels/cpu/cpu_plan.c \
	kernels/cpu/cpu_quant.c \
	kernels/cpu/cpu_qdq.c \
	kernels/cpu/cpu_ops.h \
	kernels/cpu/cpu_isa.h \
	kernels/cpu/cpu_blas.h \
	$(MT_CPU_LEVEL_SRC)
# No code here reads the floating-point exception flags or errno; without the
# assumptions that a comparison may trap and that sqrtf sets errno, GCC turns the
# selects of clamps and max reductions into vector blends and sqrtf into one
# instruction, so `#pragma omp simd` loops with them vectorise. Values are unchanged.
libmt_kernels_la_CFLAGS = $(AM_CFLAGS) -fno-trapping-math -fno-math-errno

libmt_kernels_la_LIBADD =
if CPU_ISA_V3
noinst_LTLIBRARIES += libmt_kernels_v3.la
libmt_kernels_v3_la_SOURCES = $(MT_CPU_LEVEL_SRC)
libmt_kernels_v3_la_CFLAGS = $(libmt_kernels_la_CFLAGS) -march=x86-64-v3 -DMT_CPU_ISA_SUFFIX=_v3
libmt_kernels_la_LIBADD += libmt_kernels_v3.la
endif
if CPU_ISA_V4
noinst_LTLIBRARIES += libmt_kernels_v4.la
libmt_kernels_v4_la_SOURCES = $(MT_CPU_LEVEL_SRC)
libmt_kernels_v4_la_CFLAGS = $(libmt_kernels_la_CFLAGS) -march=x86-64-v4 -DMT_CPU_ISA_SUFFIX=_v4
libmt_kernels_la_LIBADD += libmt_kernels_v4.la
endif

include tests/kernels/local.mk

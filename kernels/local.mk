# kernels/: the op table (kernels.h), the CPU reference and the CUDA backend.
noinst_HEADERS += kernels/kernels.h
include kernels/cpu/local.mk

# The CUDA backend: one .cu per op family, the op table in C (cuda_backend.c). Listed
# outside the conditional so that a build without CUDA still distributes them.
MT_CUDA_SRC = \
	kernels/cuda/cuda_backend.c \
	kernels/cuda/cuda_backend.h \
	kernels/cuda/cuda_ops.h \
	kernels/cuda/cuda_common.cuh \
	kernels/cuda/cuda_memory.cu \
	kernels/cuda/cuda_gemm.cu \
	kernels/cuda/cuda_grouped_gemm.cu \
	kernels/cuda/cuda_layers.cu \
	kernels/cuda/cuda_attention.cu \
	kernels/cuda/cuda_moe.cu \
	kernels/cuda/cuda_loss.cu \
	kernels/cuda/cuda_optim.cu \
	kernels/cuda/probe.cu

if HAVE_CUDA
# .cu -> .lo through libtool, so CUDA objects link like any other object.
NVCCFLAGS = -std=c++17 -O3 -lineinfo $(NVCC_GENCODE) -Xcompiler=-Wall,-Wextra,-Werror -Werror=all-warnings \
	-I$(top_srcdir)/src -I$(top_srcdir) -I$(top_builddir)
LTNVCCCOMPILE = $(LIBTOOL) $(AM_V_lt) --tag=CC --mode=compile \
	$(top_srcdir)/build-aux/nvcc-libtool $(NVCC) $(NVCCFLAGS)
SUFFIXES = .cu
.cu.lo:
	$(AM_V_GEN)$(LTNVCCCOMPILE) -c -o $@ $<

noinst_LTLIBRARIES += libmt_cuda.la
MT_MODULE_LIBS += libmt_cuda.la
libmt_cuda_la_SOURCES = $(MT_CUDA_SRC)
libmt_cuda_la_LIBADD = $(cuda_LIBS) $(nccl_LIBS) -lstdc++
AM_CPPFLAGS += $(cuda_CFLAGS) $(nccl_CFLAGS)
else
EXTRA_DIST += $(MT_CUDA_SRC)
endif

include tests/gpu/local.mk

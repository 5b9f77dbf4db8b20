# kernels/: the op table (kernels.h), the CPU reference and the CUDA backend.
noinst_HEADERS += kernels/kernels.h kernels/quant.h kernels/quant_recipe.h
include kernels/cpu/local.mk

# The CUDA backend: one .cu per op family, the op table in C (cuda_backend.c). Listed
# outside the conditional so that a build without CUDA still distributes them.
MT_CUDA_SRC = \
	kernels/cuda/cuda_backend.c \
	kernels/cuda/cuda_backend.h \
	kernels/cuda/cuda_dl.c \
	kernels/cuda/cuda_ops.h \
	kernels/cuda/cuda_common.cuh \
	kernels/cuda/cuda_launch.cuh \
	kernels/cuda/cuda_memory.cu \
	kernels/cuda/cuda_gemm.cu \
	kernels/cuda/cuda_grouped_gemm.cu \
	kernels/cuda/cuda_layers.cu \
	kernels/cuda/cuda_attention.cu \
	kernels/cuda/cuda_moe.cu \
	kernels/cuda/cuda_loss.cu \
	kernels/cuda/cuda_optim.cu \
	kernels/cuda/cuda_quant.h \
	kernels/cuda/cuda_qrow.cuh \
	kernels/cuda/cuda_quant.cu \
	kernels/cuda/cuda_graph.cu \
	kernels/cuda/cuda_qdq.cu \
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
# The GPU code built (NVCC_GENCODE) follows --with-cuda-arch, whose list config.h
# holds (MT_CUDA_ARCHS): reconfiguring for other architectures rebuilds the .cu files.
$(libmt_cuda_la_OBJECTS): $(top_builddir)/config.h

noinst_LTLIBRARIES += libmt_cuda.la
MT_MODULE_LIBS += libmt_cuda.la
libmt_cuda_la_SOURCES = $(MT_CUDA_SRC)
libmt_cuda_la_LIBADD = $(cuda_LIBS) $(nccl_LIBS) -lstdc++
AM_CPPFLAGS += $(cuda_CFLAGS) $(nccl_CFLAGS)
else
EXTRA_DIST += $(MT_CUDA_SRC)
endif

# The CUDA execution emulator (--enable-cuda-emulation): the same kernels/cuda sources,
# each included by a one-line C++ file of kernels/cuda/emu, built by the host C++
# compiler against the emulator; it links no CUDA library (doc/cuda-emulator.md).
MT_CUDA_EMU_SRC = \
	kernels/cuda/emu/mt_emu.h \
	kernels/cuda/emu/emu_internal.h \
	kernels/cuda/emu/emu_exec.cc \
	kernels/cuda/emu/emu_runtime.cc \
	kernels/cuda/emu/emu_streams.h \
	kernels/cuda/emu/emu_streams.cc \
	kernels/cuda/emu/emu_cublaslt.cc \
	kernels/cuda/emu/emu_host.cc \
	kernels/cuda/emu/include/cub/device/device_radix_sort.cuh \
	kernels/cuda/emu/tu_cuda_memory.cc \
	kernels/cuda/emu/tu_cuda_gemm.cc \
	kernels/cuda/emu/tu_cuda_grouped_gemm.cc \
	kernels/cuda/emu/tu_cuda_layers.cc \
	kernels/cuda/emu/tu_cuda_attention.cc \
	kernels/cuda/emu/tu_cuda_moe.cc \
	kernels/cuda/emu/tu_cuda_loss.cc \
	kernels/cuda/emu/tu_cuda_optim.cc \
	kernels/cuda/emu/tu_cuda_quant.cc \
	kernels/cuda/emu/tu_cuda_graph.cc \
	kernels/cuda/emu/tu_cuda_qdq.cc \
	kernels/cuda/emu/tu_probe.cc
# Device code was written for nvcc: type punning through pointers (bf16 pairs), no
# FMA contraction wanted where _rn intrinsics stand, #pragma unroll, and unsigned
# threadIdx compared with int bounds.
MT_CUDA_EMU_CPPFLAGS = -DMT_CUDA_EMU -I$(top_srcdir)/kernels/cuda/emu/include $(AM_CPPFLAGS) $(cuda_emu_CFLAGS)
MT_CUDA_EMU_CXXFLAGS = -std=c++17 -O2 -g -Wall -Wextra -Werror -Wno-unknown-pragmas -Wno-sign-compare \
	-fno-strict-aliasing -ffp-contract=off $(MT_SANITIZE_FLAGS)

if CUDA_EMULATION
noinst_LTLIBRARIES += libmt_cuda_emu.la
libmt_cuda_emu_la_SOURCES = $(MT_CUDA_EMU_SRC) kernels/cuda/cuda_backend.c
libmt_cuda_emu_la_CPPFLAGS = $(MT_CUDA_EMU_CPPFLAGS)
libmt_cuda_emu_la_CXXFLAGS = $(MT_CUDA_EMU_CXXFLAGS)
else
EXTRA_DIST += $(MT_CUDA_EMU_SRC)
endif

include tests/gpu/local.mk

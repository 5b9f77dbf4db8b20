# kernels/: the op table (kernels.h), the CPU reference and the CUDA backend.
noinst_HEADERS += kernels/kernels.h
include kernels/cpu/local.mk

if HAVE_CUDA
# .cu -> .lo through libtool, so CUDA objects link like any other object.
NVCCFLAGS = -std=c++17 $(NVCC_GENCODE) -Xcompiler=-Wall,-Wextra,-Werror -Werror=all-warnings \
	-I$(top_srcdir)/src -I$(top_srcdir) -I$(top_builddir)
LTNVCCCOMPILE = $(LIBTOOL) $(AM_V_lt) --tag=CC --mode=compile \
	$(top_srcdir)/build-aux/nvcc-libtool $(NVCC) $(NVCCFLAGS)
SUFFIXES = .cu
.cu.lo:
	$(AM_V_GEN)$(LTNVCCCOMPILE) -c -o $@ $<

noinst_LTLIBRARIES += libmt_cuda.la
MT_MODULE_LIBS += libmt_cuda.la
libmt_cuda_la_SOURCES = kernels/cuda/probe.cu kernels/cuda/cuda_backend.h
libmt_cuda_la_LIBADD = $(cuda_LIBS) $(nccl_LIBS) -lstdc++
AM_CPPFLAGS += $(cuda_CFLAGS) $(nccl_CFLAGS)
else
EXTRA_DIST += kernels/cuda/probe.cu kernels/cuda/cuda_backend.h
endif

# tests/kernels: the CPU reference backend, op by op (included from kernels/cpu/local.mk).
KERNEL_TEST_LIBS = libmt_kernels.la libmt_util.la $(MT_LIBS) $(cmocka_LIBS)

check_PROGRAMS += tests/kernels/test_ops_fd tests/kernels/test_bf16 tests/kernels/test_guard \
	tests/kernels/test_attention
TESTS += tests/kernels/test_ops_fd tests/kernels/test_bf16 tests/kernels/test_guard \
	tests/kernels/test_attention
# every op test again on each x86-64 level of the CPU kernels (kernels/cpu/cpu_isa.h)
TESTS += tests/kernels/cpu_isa.sh
EXTRA_DIST += tests/kernels/cpu_isa.sh
noinst_HEADERS += tests/kernels/fd.h

tests_kernels_test_ops_fd_SOURCES = tests/kernels/test_ops_fd.c
tests_kernels_test_ops_fd_CPPFLAGS = $(TEST_CPPFLAGS)
tests_kernels_test_ops_fd_LDADD = $(KERNEL_TEST_LIBS)

tests_kernels_test_bf16_SOURCES = tests/kernels/test_bf16.c
tests_kernels_test_bf16_CPPFLAGS = $(TEST_CPPFLAGS)
tests_kernels_test_bf16_LDADD = $(KERNEL_TEST_LIBS)

tests_kernels_test_guard_SOURCES = tests/kernels/test_guard.c
tests_kernels_test_guard_CPPFLAGS = $(TEST_CPPFLAGS)
tests_kernels_test_guard_LDADD = $(KERNEL_TEST_LIBS)

tests_kernels_test_attention_SOURCES = tests/kernels/test_attention.c
tests_kernels_test_attention_CPPFLAGS = $(TEST_CPPFLAGS)
# the kernels' flags (kernels/cpu/local.mk), so that its exp loop vectorises as theirs do
tests_kernels_test_attention_CFLAGS = $(libmt_kernels_la_CFLAGS)
tests_kernels_test_attention_LDADD = $(KERNEL_TEST_LIBS)

# The FP8/FP4 codecs (kernels/quant.h): properties and the recipes' CPU quantisers
# (kernels/cpu/cpu_quant.c) here; bit-exactness against NVIDIA's conversions in
# quant_oracle.sh, whose C++ program needs only the CUDA headers (configure's
# HAVE_CUDA_FP_HEADERS) and skips without them.
check_PROGRAMS += tests/kernels/test_quant
TESTS += tests/kernels/test_quant tests/kernels/quant_oracle.sh
EXTRA_DIST += tests/kernels/quant_oracle.sh
tests_kernels_test_quant_SOURCES = tests/kernels/test_quant.c
tests_kernels_test_quant_CPPFLAGS = $(TEST_CPPFLAGS)
tests_kernels_test_quant_LDADD = $(KERNEL_TEST_LIBS)
if HAVE_CUDA_FP_HEADERS
check_PROGRAMS += tests/kernels/quant_oracle
tests_kernels_quant_oracle_SOURCES = tests/kernels/quant_oracle.cc
tests_kernels_quant_oracle_CPPFLAGS = $(AM_CPPFLAGS) $(cuda_fp_CPPFLAGS)
tests_kernels_quant_oracle_CXXFLAGS = -std=c++17 -O2 -Wall -Wextra -Werror -ffp-contract=off
else
EXTRA_DIST += tests/kernels/quant_oracle.cc
endif

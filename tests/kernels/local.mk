# tests/kernels: the CPU reference backend, op by op (included from kernels/cpu/local.mk).
KERNEL_TEST_LIBS = libmt_kernels.la libmt_util.la $(MT_LIBS) $(cmocka_LIBS)

check_PROGRAMS += tests/kernels/test_ops_fd tests/kernels/test_bf16 tests/kernels/test_guard \
	tests/kernels/test_attention
TESTS += tests/kernels/test_ops_fd tests/kernels/test_bf16 tests/kernels/test_guard \
	tests/kernels/test_attention
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

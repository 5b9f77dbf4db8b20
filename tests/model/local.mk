# tests/model: whole-model gradient checks (included from src/model/local.mk).
MODEL_TEST_LIBS = libmt_model.la libmt_runtime.la libmt_kernels.la libmt_config.la libmt_nml.la \
	libmt_util.la $(MT_LIBS) $(cmocka_LIBS)

check_PROGRAMS += tests/model/test_model_fd tests/model/test_model_misc tests/model/model_dump \
	tests/model/test_model_recompute tests/model/test_lowp
TESTS += tests/model/test_model_fd tests/model/test_model_misc tests/model/test_model_jax.sh \
	tests/model/test_model_recompute tests/model/test_lowp
noinst_HEADERS += tests/model/tiny_config.h tests/model/two_slots.h
EXTRA_DIST += tests/model/test_model_jax.sh tests/model/jax_ref.py

tests_model_test_model_fd_SOURCES = tests/model/test_model_fd.c
tests_model_test_model_fd_CPPFLAGS = $(TEST_CPPFLAGS)
tests_model_test_model_fd_LDADD = $(MODEL_TEST_LIBS)

tests_model_test_model_misc_SOURCES = tests/model/test_model_misc.c
tests_model_test_model_misc_CPPFLAGS = $(TEST_CPPFLAGS)
tests_model_test_model_misc_LDADD = $(MODEL_TEST_LIBS)

tests_model_test_model_recompute_SOURCES = tests/model/test_model_recompute.c
tests_model_test_model_recompute_CPPFLAGS = $(TEST_CPPFLAGS)
tests_model_test_model_recompute_LDADD = $(MODEL_TEST_LIBS)

# activation offloading on the guard backend (the copy stream's order checked)
check_PROGRAMS += tests/model/test_model_offload
TESTS += tests/model/test_model_offload
tests_model_test_model_offload_SOURCES = tests/model/test_model_offload.c
tests_model_test_model_offload_CPPFLAGS = $(TEST_CPPFLAGS)
tests_model_test_model_offload_LDADD = $(MODEL_TEST_LIBS)

# one quantised linear of each FP8/FP4 recipe against cpu_quant.c's quantisers
tests_model_test_lowp_SOURCES = tests/model/test_lowp.c
tests_model_test_lowp_CPPFLAGS = $(TEST_CPPFLAGS)
tests_model_test_lowp_LDADD = $(MODEL_TEST_LIBS)

tests_model_model_dump_SOURCES = tests/model/model_dump.c
tests_model_model_dump_CPPFLAGS = $(AM_CPPFLAGS)
tests_model_model_dump_LDADD = libmt_model.la libmt_runtime.la libmt_kernels.la libmt_config.la \
	libmt_nml.la libmt_util.la $(MT_LIBS)

# bench/bytes_moved: bytes one layer's forward writes and reads, bf16 storage against the
# fp32-stored activations rounded in place (tests/model/bytes_moved.sh checks it runs and
# that bf16 storage moves fewer bytes with no rounding pass; bench/bytes_moved.sh prints
# the Qwen3-30B-A3B proxy's figures)
check_PROGRAMS += bench/bytes_moved
TESTS += tests/model/bytes_moved.sh
EXTRA_DIST += tests/model/bytes_moved.sh bench/bytes_moved.sh
bench_bytes_moved_SOURCES = bench/bytes_moved.c
bench_bytes_moved_CPPFLAGS = $(AM_CPPFLAGS)
bench_bytes_moved_LDADD = libmt_model.la libmt_runtime.la libmt_kernels.la libmt_config.la \
	libmt_nml.la libmt_util.la $(MT_LIBS)

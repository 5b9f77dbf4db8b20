# tests/model: whole-model gradient checks (included from src/model/local.mk).
MODEL_TEST_LIBS = libmt_model.la libmt_runtime.la libmt_kernels.la libmt_config.la libmt_nml.la \
	libmt_util.la $(MT_LIBS) $(cmocka_LIBS)

check_PROGRAMS += tests/model/test_model_fd tests/model/test_model_misc tests/model/model_dump
TESTS += tests/model/test_model_fd tests/model/test_model_misc tests/model/test_model_jax.sh
noinst_HEADERS += tests/model/tiny_config.h
EXTRA_DIST += tests/model/test_model_jax.sh tests/model/jax_ref.py

tests_model_test_model_fd_SOURCES = tests/model/test_model_fd.c
tests_model_test_model_fd_CPPFLAGS = $(TEST_CPPFLAGS)
tests_model_test_model_fd_LDADD = $(MODEL_TEST_LIBS)

tests_model_test_model_misc_SOURCES = tests/model/test_model_misc.c
tests_model_test_model_misc_CPPFLAGS = $(TEST_CPPFLAGS)
tests_model_test_model_misc_LDADD = $(MODEL_TEST_LIBS)

tests_model_model_dump_SOURCES = tests/model/model_dump.c
tests_model_model_dump_CPPFLAGS = $(AM_CPPFLAGS)
tests_model_model_dump_LDADD = libmt_model.la libmt_runtime.la libmt_kernels.la libmt_config.la \
	libmt_nml.la libmt_util.la $(MT_LIBS)

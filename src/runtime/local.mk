noinst_LTLIBRARIES += libmt_runtime.la
MT_MODULE_LIBS += libmt_runtime.la
libmt_runtime_la_SOURCES = src/runtime/groups.c src/runtime/groups.h

check_PROGRAMS += tests/runtime/test_groups
TESTS += tests/runtime/test_groups
tests_runtime_test_groups_SOURCES = tests/runtime/test_groups.c
tests_runtime_test_groups_CPPFLAGS = $(TEST_CPPFLAGS)
tests_runtime_test_groups_LDADD = libmt_runtime.la libmt_util.la $(cmocka_LIBS)

noinst_LTLIBRARIES += libmt_util.la
MT_MODULE_LIBS += libmt_util.la
libmt_util_la_SOURCES = src/util/error.c src/util/error.h src/util/rng.c src/util/rng.h src/util/philox.h \
	src/util/json.c src/util/json.h src/util/crc32.c src/util/crc32.h \
	src/util/dynlib.c src/util/dynlib.h
libmt_util_la_LIBADD = -lm -lpthread -ldl

check_PROGRAMS += tests/util/test_json
TESTS += tests/util/test_json
tests_util_test_json_SOURCES = tests/util/test_json.c
tests_util_test_json_CPPFLAGS = $(TEST_CPPFLAGS)
tests_util_test_json_LDADD = libmt_util.la $(cmocka_LIBS) -lm

noinst_LTLIBRARIES += libmt_util.la
MT_MODULE_LIBS += libmt_util.la
libmt_util_la_SOURCES = src/util/error.c src/util/error.h src/util/rng.c src/util/rng.h src/util/philox.h \
	src/util/json.c src/util/json.h src/util/crc32.c src/util/crc32.h \
	src/util/dynlib.c src/util/dynlib.h src/util/hostmem.c src/util/hostmem.h
libmt_util_la_LIBADD = -lm -lpthread -ldl

check_PROGRAMS += tests/util/test_json
TESTS += tests/util/test_json
tests_util_test_json_SOURCES = tests/util/test_json.c
tests_util_test_json_CPPFLAGS = $(TEST_CPPFLAGS)
tests_util_test_json_LDADD = libmt_util.la $(cmocka_LIBS) -lm

# The allocation-counting library (LD_PRELOAD) that the host-overhead tests and
# bench/host_jitter.sh run moetrain under (doc/host-overhead.md): built for them, never
# installed. A plain rule: the build's libtool makes static libraries only.
MT_ALLOCCOUNT = tests/util/libmt_alloccount.so
$(MT_ALLOCCOUNT): $(srcdir)/tests/util/alloc_count.c
	@$(MKDIR_P) tests/util
	$(AM_V_CC)$(CC) -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -shared -fPIC -o $@ \
		$(srcdir)/tests/util/alloc_count.c -ldl
check_SCRIPTS += $(MT_ALLOCCOUNT)
CLEANFILES += $(MT_ALLOCCOUNT)
EXTRA_DIST += tests/util/alloc_count.c tests/util/alloccount.sh

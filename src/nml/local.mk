# Fortran namelist parser (generic: the config module maps it onto its keys).
noinst_LTLIBRARIES += libmt_nml.la
MT_MODULE_LIBS += libmt_nml.la
libmt_nml_la_SOURCES = src/nml/nml.c src/nml/nml.h

# Tests: fixtures (tests/fixtures/nml/{ok,bad}), gfortran as the oracle, fuzzing.
check_PROGRAMS += tests/nml/test_nml tests/nml/nml_dump
TESTS += tests/nml/test_nml tests/nml/conformance.sh tests/nml/fuzz_short.sh
tests_nml_test_nml_SOURCES = tests/nml/test_nml.c tests/nml/flatten.c tests/nml/flatten.h
tests_nml_test_nml_CPPFLAGS = $(TEST_CPPFLAGS) \
	-DMT_NML_FIXTURES='"$(abs_top_srcdir)/tests/fixtures/nml"'
tests_nml_test_nml_LDADD = libmt_nml.la libmt_util.la $(cmocka_LIBS)
tests_nml_nml_dump_SOURCES = tests/nml/nml_dump.c tests/nml/flatten.c tests/nml/flatten.h
tests_nml_nml_dump_LDADD = libmt_nml.la libmt_util.la
EXTRA_DIST += tests/fixtures/nml tests/nml/conformance.sh tests/nml/conformance.py \
	tests/nml/fuzz_short.sh tests/nml/fuzz_nml.c tests/nml/nml.dict

# The shell tests run programs that are not their own test program.
tests/nml/conformance.log: tests/nml/nml_dump$(EXEEXT)

if HAVE_FUZZ
# libFuzzer needs clang and no libtool: compile the sources straight in.
MT_NML_FUZZ_SRCS = $(srcdir)/tests/nml/fuzz_nml.c $(srcdir)/src/nml/nml.c \
	$(srcdir)/src/util/error.c
tests/nml/fuzz_nml$(EXEEXT): $(MT_NML_FUZZ_SRCS) $(srcdir)/src/nml/nml.h \
		$(srcdir)/src/util/error.h
	@$(MKDIR_P) tests/nml
	$(AM_V_CCLD)$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer \
	  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  -I$(top_srcdir)/src -o $@ $(MT_NML_FUZZ_SRCS)
tests/nml/fuzz_short.log: tests/nml/fuzz_nml$(EXEEXT)
CLEANFILES += tests/nml/fuzz_nml$(EXEEXT)
endif

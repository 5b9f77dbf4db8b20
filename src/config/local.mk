noinst_LTLIBRARIES += libmt_config.la
MT_MODULE_LIBS += libmt_config.la
libmt_config_la_SOURCES = src/config/config.c src/config/config.h \
	src/config/schema.c src/config/schema.h src/config/data_rules.c \
	src/config/namelist_path.c src/config/megatron.c src/config/megatron.h \
	src/config/from_megatron.c src/config/from_megatron.h
# where the installed namelists are (src/config/namelist_path.c)
libmt_config_la_CPPFLAGS = $(AM_CPPFLAGS) -DMT_BINDIR='"$(bindir)"' -DMT_PKGDATADIR='"$(pkgdatadir)"'

check_PROGRAMS += tests/config/test_config
TESTS += tests/config/test_config tests/config/print_config_gfortran.sh
tests_config_test_config_SOURCES = tests/config/test_config.c
tests_config_test_config_CPPFLAGS = $(TEST_CPPFLAGS)
tests_config_test_config_LDADD = libmt_config.la libmt_nml.la libmt_util.la $(cmocka_LIBS) -lm
EXTRA_DIST += tests/config/print_config_gfortran.sh tests/config/fortran_roundtrip.py
# A namelist named, not given by path: $MOETRAIN_NAMELISTS, the installed ones.
TESTS += tests/config/namelist_lookup.sh
EXTRA_DIST += tests/config/namelist_lookup.sh
# Megatron's flags as options and as keys: "did you mean" from src/config/megatron.c
TESTS += tests/config/megatron_options.sh
EXTRA_DIST += tests/config/megatron_options.sh
# moetrain from-megatron: pretrain_gpt.py arguments -> namelist (src/config/from_megatron.c)
TESTS += tests/config/from_megatron.sh
EXTRA_DIST += tests/config/from_megatron.sh

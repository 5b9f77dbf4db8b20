# src/data: Megatron indexed datasets, GPT sampling, blending, the index cache
# and mock data (libmt_data); the moetrain-preprocess tool; the bundled corpus.
noinst_LTLIBRARIES += libmt_data.la
MT_MODULE_LIBS += libmt_data.la
libmt_data_la_SOURCES = src/data/data.h src/data/data_internal.h src/data/data.c \
	src/data/indexed.c src/data/gpt.c src/data/blend.c src/data/cache.c \
	src/data/preprocess.c
libmt_data_la_CPPFLAGS = $(AM_CPPFLAGS) -DMT_PKGDATADIR='"$(pkgdatadir)"'
libmt_data_la_LIBADD = -lm

bin_PROGRAMS += moetrain-preprocess
moetrain_preprocess_SOURCES = src/data/preprocess_main.c
moetrain_preprocess_LDADD = libmt_data.la libmt_config.la libmt_util.la -lm

# The bundled corpus (corpus/README): tokenised at build time by the tool just
# built, so data_path = 'corpus/kjv_text_document' works from the build tree
# (and through MOETRAIN_DATADIR), and installed under $(pkgdatadir)/corpus.
KJV_PREFIX = corpus/kjv_text_document
corpusdir = $(pkgdatadir)/corpus
corpus_DATA = $(KJV_PREFIX).bin $(KJV_PREFIX).idx
dist_corpus_DATA = corpus/README
EXTRA_DIST += corpus/kjv.txt corpus/extract-kjv.sh
CLEANFILES += $(corpus_DATA)

$(KJV_PREFIX).bin: $(srcdir)/corpus/kjv.txt moetrain-preprocess$(EXEEXT)
	$(AM_V_GEN)$(MKDIR_P) corpus && \
	./moetrain-preprocess$(EXEEXT) --input $(srcdir)/corpus/kjv.txt --append-eod \
	  --output-prefix $(KJV_PREFIX) >/dev/null
# Both files come from one command (the automake manual's multiple-outputs rule).
$(KJV_PREFIX).idx: $(KJV_PREFIX).bin
	@test -f $@ || rm -f $(KJV_PREFIX).bin
	@test -f $@ || $(MAKE) $(AM_MAKEFLAGS) $(KJV_PREFIX).bin

# Tests: cmocka programs (TAP) and shell scripts.
DATA_TESTS = tests/data/test_indexed tests/data/test_sampling \
	tests/data/test_blend_cache tests/data/test_preprocess
check_PROGRAMS += $(DATA_TESTS)
TESTS += $(DATA_TESTS) tests/data/preprocess_cli.sh tests/data/megatron_fixture.sh
DATA_TEST_SOURCES = tests/data/helpers.c tests/data/helpers.h
DATA_TEST_LDADD = libmt_data.la libmt_config.la libmt_util.la $(cmocka_LIBS) -lm
tests_data_test_indexed_SOURCES = tests/data/test_indexed.c $(DATA_TEST_SOURCES)
tests_data_test_indexed_CPPFLAGS = $(TEST_CPPFLAGS)
tests_data_test_indexed_LDADD = $(DATA_TEST_LDADD)
tests_data_test_sampling_SOURCES = tests/data/test_sampling.c $(DATA_TEST_SOURCES)
tests_data_test_sampling_CPPFLAGS = $(TEST_CPPFLAGS)
tests_data_test_sampling_LDADD = $(DATA_TEST_LDADD)
tests_data_test_blend_cache_SOURCES = tests/data/test_blend_cache.c $(DATA_TEST_SOURCES)
tests_data_test_blend_cache_CPPFLAGS = $(TEST_CPPFLAGS)
tests_data_test_blend_cache_LDADD = $(DATA_TEST_LDADD)
tests_data_test_preprocess_SOURCES = tests/data/test_preprocess.c $(DATA_TEST_SOURCES)
tests_data_test_preprocess_CPPFLAGS = $(TEST_CPPFLAGS)
tests_data_test_preprocess_LDADD = $(DATA_TEST_LDADD)
EXTRA_DIST += tests/data/preprocess_cli.sh tests/data/megatron_fixture.sh \
	tests/fixtures/data/make_megatron_fixture.py \
	tests/fixtures/data/megatron_int32.bin tests/fixtures/data/megatron_int32.idx

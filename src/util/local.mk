noinst_LTLIBRARIES += libmt_util.la
MT_MODULE_LIBS += libmt_util.la
libmt_util_la_SOURCES = src/util/error.c src/util/error.h src/util/rng.c src/util/rng.h
libmt_util_la_LIBADD = -lm

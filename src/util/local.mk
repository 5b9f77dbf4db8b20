libmoetrain_la_SOURCES += src/util/error.c src/util/error.h src/util/rng.c src/util/rng.h

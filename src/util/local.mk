libmoetrain_la_SOURCES += src/util/error.c src/util/error.h

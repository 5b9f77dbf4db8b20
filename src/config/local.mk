noinst_LTLIBRARIES += libmt_config.la
MT_MODULE_LIBS += libmt_config.la
libmt_config_la_SOURCES = src/config/config.c src/config/config.h \
	src/config/schema.c src/config/schema.h

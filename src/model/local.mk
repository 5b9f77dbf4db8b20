# src/model: Qwen3-MoE (parameters, init, attention, router, dispatcher, experts, loss).
noinst_LTLIBRARIES += libmt_model.la
MT_MODULE_LIBS += libmt_model.la
libmt_model_la_SOURCES = \
	src/model/model.c \
	src/model/model.h \
	src/model/model_internal.h \
	src/model/model_pass.c \
	src/model/model_offload.c \
	src/model/model_moe.c \
	src/model/model_lowp.c \
	src/model/model_graph.c

include tests/model/local.mk

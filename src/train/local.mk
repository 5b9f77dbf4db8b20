noinst_LTLIBRARIES += libmt_train.la
MT_MODULE_LIBS += libmt_train.la
libmt_train_la_SOURCES = src/train/train.c src/train/train.h src/train/schedule.c \
	src/train/checkpoint.c src/train/optim.c src/train/ckpt_dist.c \
	src/train/ckpt_shard.c src/train/ckpt_shard.h src/train/ckpt_tool.c src/train/hf.c \
	src/train/agree.c

include tests/parallel/local.mk

# Manual pages: moetrain.nml(5) is generated from the schema table.
dist_man1_MANS = doc/moetrain.1 doc/moetrain-preprocess.1
man5_MANS = doc/moetrain.nml.5
noinst_PROGRAMS = doc/gen_nml_man
doc_gen_nml_man_SOURCES = doc/gen_nml_man.c
doc_gen_nml_man_LDADD = libmt_config.la libmt_nml.la libmt_util.la -lm
doc/moetrain.nml.5: doc/gen_nml_man$(EXEEXT)
	$(AM_V_GEN)$(MKDIR_P) doc && doc/gen_nml_man$(EXEEXT) > $@.tmp && mv $@.tmp $@
CLEANFILES += doc/moetrain.nml.5
dist_doc_DATA += doc/site-install.md doc/what-happens.md doc/cuda-emulator.md doc/checkpoints.md
dist_doc_DATA += NEWS doc/architecture.md doc/plan.md doc/memory.md doc/fp8.md \
	doc/host-overhead.md

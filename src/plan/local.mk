noinst_LTLIBRARIES += libmt_plan.la
MT_MODULE_LIBS += libmt_plan.la
libmt_plan_la_SOURCES = src/plan/plan.c src/plan/plan.h src/plan/fake.c

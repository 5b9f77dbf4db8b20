# tests/topo (included from src/topo/local.mk): placement, node discovery and
# affinity on hwloc XML fixtures, NVML through a fake libnvidia-ml, the CLI
# (dry runs on node files), and real multi-process runs (mpirun, Slurm).
TOPO_TEST_LIBS = libmt_topo.la libmt_runtime.la libmt_config.la libmt_nml.la libmt_util.la \
	$(MT_LIBS) $(cmocka_LIBS)
TOPO_TEST_CPPFLAGS = $(TEST_CPPFLAGS) -DMT_TOPO_FIXTURES='"$(abs_top_srcdir)/tests/fixtures/topo"'

check_PROGRAMS += tests/topo/test_place
TESTS += tests/topo/test_place
tests_topo_test_place_SOURCES = tests/topo/test_place.c
tests_topo_test_place_CPPFLAGS = $(TOPO_TEST_CPPFLAGS)
tests_topo_test_place_LDADD = $(TOPO_TEST_LIBS)


check_PROGRAMS += tests/topo/test_node
TESTS += tests/topo/test_node
tests_topo_test_node_SOURCES = tests/topo/test_node.c
tests_topo_test_node_CPPFLAGS = $(TOPO_TEST_CPPFLAGS)
tests_topo_test_node_LDADD = $(TOPO_TEST_LIBS)
EXTRA_DIST += tests/fixtures/topo

# NVML: the cmocka program runs under nvml_fake.sh, which points dlopen at a
# fake libnvidia-ml.so.1 built here twice (fabric info V and v1 entry points).
check_PROGRAMS += tests/topo/test_nvml
TESTS += tests/topo/nvml_fake.sh
tests_topo_test_nvml_SOURCES = tests/topo/test_nvml.c
tests_topo_test_nvml_CPPFLAGS = $(TOPO_TEST_CPPFLAGS)
tests_topo_test_nvml_LDADD = $(TOPO_TEST_LIBS)
FAKE_NVML_LIBS = tests/topo/fake-nvml/libnvidia-ml.so.1 tests/topo/fake-nvml-v1/libnvidia-ml.so.1
tests/topo/fake-nvml/libnvidia-ml.so.1: $(srcdir)/tests/topo/fake_nvml.c
	@$(MKDIR_P) tests/topo/fake-nvml
	$(AM_V_CC)$(CC) -std=c11 -D_GNU_SOURCE -Wall -Werror -shared -fPIC -o $@ $(srcdir)/tests/topo/fake_nvml.c
tests/topo/fake-nvml-v1/libnvidia-ml.so.1: $(srcdir)/tests/topo/fake_nvml.c
	@$(MKDIR_P) tests/topo/fake-nvml-v1
	$(AM_V_CC)$(CC) -std=c11 -D_GNU_SOURCE -DFAKE_NVML_V1 -Wall -Werror -shared -fPIC -o $@ $(srcdir)/tests/topo/fake_nvml.c
tests/topo/nvml_fake.log: tests/topo/test_nvml$(EXEEXT) $(FAKE_NVML_LIBS)
CLEANFILES += $(FAKE_NVML_LIBS)
EXTRA_DIST += tests/topo/nvml_fake.sh tests/topo/fake_nvml.c

# The CLI (dry runs, errors, a live single process) and real multi-process
# runs: mpirun on this machine, srun on the local Slurm cluster
# (tests/slurm/cluster.sh); the last two use tests/runtime/common.sh.
TESTS += tests/topo/topo_cli.sh tests/topo/mpirun.sh tests/topo/slurm.sh
tests/topo/mpirun.log tests/topo/slurm.log: tests/runtime/build.env
EXTRA_DIST += tests/topo/common.sh tests/topo/topo_cli.sh tests/topo/mpirun.sh \
	tests/topo/slurm.sh

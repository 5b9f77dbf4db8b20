# Test harness: cmocka programs speak TAP (one result per test case, through
# tap-driver.sh); *.sh tests use the exit-status driver (0 pass, 77 skip).
TEST_EXTENSIONS = .sh
LOG_DRIVER = env AM_TAP_AWK='$(AWK)' $(SHELL) $(top_srcdir)/build-aux/tap-driver.sh
SH_LOG_DRIVER = $(SHELL) $(top_srcdir)/build-aux/test-driver
SH_LOG_COMPILER = $(SHELL)
AM_TESTS_ENVIRONMENT = \
	CMOCKA_MESSAGE_OUTPUT=TAP; export CMOCKA_MESSAGE_OUTPUT; \
	MT_TOP_SRCDIR='$(abs_top_srcdir)'; export MT_TOP_SRCDIR; \
	MT_TOP_BUILDDIR='$(abs_top_builddir)'; export MT_TOP_BUILDDIR; \
	MOETRAIN='$(abs_top_builddir)/moetrain'; export MOETRAIN; \
	MOETRAIN_DATADIR='$(abs_top_builddir)'; export MOETRAIN_DATADIR; \
	GFORTRAN='$(GFORTRAN)'; export GFORTRAN; \
	PYTHON3='$(PYTHON3)'; export PYTHON3; \
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2}; export OMP_NUM_THREADS;

TEST_CPPFLAGS = $(AM_CPPFLAGS) $(cmocka_CFLAGS)

# The tests that start a local Slurm cluster run one after the other, even
# under make -j: concurrent clusters would race for ports on one host.
tests/topo/slurm.log: tests/slurm/srun_pmix.log
tests/parallel/srun.log: tests/topo/slurm.log

# The unit tests alone (the cmocka programs), e.g. for the sanitizer CI leg.
UNIT_TESTS = $(filter-out %.sh,$(TESTS))
check-unit:
	$(MAKE) $(AM_MAKEFLAGS) check TESTS='$(UNIT_TESTS)'
.PHONY: check-unit

# The tests that need a real GPU (this project's machines have none: `make check` runs
# the same code on the CUDA emulator). On a GPU node: make check-gpu
check-gpu:
	@test -n '$(GPU_TESTS)' || { echo "check-gpu: this build has no CUDA backend (configure --with-cuda)"; exit 1; }
	$(MAKE) $(AM_MAKEFLAGS) check TESTS='$(GPU_TESTS)'
.PHONY: check-gpu
include tests/train/local.mk
include tests/doc/local.mk

# The installed moetrain on a node without CUDA (tests/install; the module files'
# test registers itself in tests/install/local.mk).
TESTS += tests/install/run_anywhere.sh
EXTRA_DIST += tests/install/run_anywhere.sh
tests/install/run_anywhere.log: tests/runtime/build.env
# The job scripts' --check: which moetrain they run; qwen3_256gpu.sh's group summary.
TESTS += tests/install/slurm_check.sh
EXTRA_DIST += tests/install/slurm_check.sh

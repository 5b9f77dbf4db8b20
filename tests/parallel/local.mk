# tests/parallel: layout equivalence under mpirun and srun (doc/architecture.md, section 5),
# included from src/train/local.mk. The scripts skip (77) without MPI, PMIx, mpirun or
# Slurm; ckpt_diff compares checkpoints, optim_check runs under mpirun.
PARALLEL_TEST_LIBS = libmt_train.la libmt_model.la libmt_runtime.la libmt_kernels.la \
	libmt_config.la libmt_nml.la libmt_util.la $(MT_LIBS)
check_PROGRAMS += tests/parallel/ckpt_diff tests/parallel/optim_check tests/parallel/p2p_check \
	tests/parallel/amax_check
tests_parallel_ckpt_diff_SOURCES = tests/parallel/ckpt_diff.c
tests_parallel_ckpt_diff_LDADD = $(PARALLEL_TEST_LIBS)
tests_parallel_optim_check_SOURCES = tests/parallel/optim_check.c
tests_parallel_optim_check_LDADD = $(PARALLEL_TEST_LIBS)
tests_parallel_p2p_check_SOURCES = tests/parallel/p2p_check.c
tests_parallel_p2p_check_LDADD = $(PARALLEL_TEST_LIBS)
tests_parallel_amax_check_SOURCES = tests/parallel/amax_check.c
tests_parallel_amax_check_LDADD = $(PARALLEL_TEST_LIBS)

PARALLEL_SH = tests/parallel/equivalence.sh tests/parallel/pipeline.sh tests/parallel/capacity.sh \
	tests/parallel/checkpoint.sh tests/parallel/optim.sh tests/parallel/layout_errors.sh \
	tests/parallel/srun.sh tests/parallel/fault.sh tests/parallel/p2p.sh tests/parallel/guard.sh \
	tests/parallel/signal.sh tests/parallel/blas_kernels.sh tests/parallel/ckpt_format.sh \
	tests/parallel/ckpt_memory.sh tests/parallel/kill9.sh tests/parallel/ckpt_async.sh \
	tests/parallel/memory_plan.sh tests/parallel/bf16_storage.sh tests/parallel/hf_roundtrip.sh \
	tests/parallel/upcycle.sh tests/parallel/recompute.sh tests/parallel/host_overhead.sh \
	tests/parallel/fp8_layouts.sh tests/parallel/overlap.sh tests/parallel/host_syncs.sh \
	tests/parallel/overlap_p2p.sh tests/parallel/shared_overlap.sh tests/parallel/amax_nan.sh
TESTS += $(PARALLEL_SH)
tests/parallel/host_overhead.log: $(MT_ALLOCCOUNT)
EXTRA_DIST += $(PARALLEL_SH) tests/parallel/common.sh tests/parallel/routing.awk \
	tests/parallel/moe.nml tests/parallel/ckpt_format.py

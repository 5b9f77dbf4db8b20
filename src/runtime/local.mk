# src/runtime: bootstrap (PMIx, single), comm vtable (MPI, NCCL, self), parallel groups.
noinst_LTLIBRARIES += libmt_runtime.la
MT_MODULE_LIBS += libmt_runtime.la
libmt_runtime_la_SOURCES = src/runtime/groups.c src/runtime/groups.h src/runtime/cli_end.c src/runtime/cli_end.h \
	src/runtime/comm.c src/runtime/comm.h src/runtime/comm_internal.h src/runtime/comm_dual.c \
	src/runtime/world.c src/runtime/parallel.c src/runtime/parallel.h src/runtime/parallel_plan.c
libmt_runtime_la_CPPFLAGS = $(AM_CPPFLAGS) $(mpi_CFLAGS)
libmt_runtime_la_LIBADD = $(pmix_LIBS)
if HAVE_MPI
libmt_runtime_la_SOURCES += src/runtime/comm_mpi.c
libmt_runtime_la_LIBADD += $(mpi_LIBS)
else
EXTRA_DIST += src/runtime/comm_mpi.c
endif
if HAVE_NCCL
libmt_runtime_la_SOURCES += src/runtime/comm_nccl.c src/runtime/nccl_dl.c src/runtime/nccl_dl.h
libmt_runtime_la_CPPFLAGS += $(cuda_CFLAGS) $(nccl_CFLAGS)
libmt_runtime_la_LIBADD += $(nccl_LIBS) $(cuda_LIBS)
else
EXTRA_DIST += src/runtime/comm_nccl.c src/runtime/nccl_dl.c src/runtime/nccl_dl.h
endif

# Libraries a runtime test program links.
MT_RUNTIME_TEST_LIBS = libmt_runtime.la libmt_util.la

check_PROGRAMS += tests/runtime/test_groups
TESTS += tests/runtime/test_groups
tests_runtime_test_groups_SOURCES = tests/runtime/test_groups.c
tests_runtime_test_groups_CPPFLAGS = $(TEST_CPPFLAGS)
tests_runtime_test_groups_LDADD = libmt_runtime.la libmt_util.la $(cmocka_LIBS)

# Which NCCL communicators each rank gets (mt_parallel_device_plan; cmocka, no NCCL).
check_PROGRAMS += tests/runtime/test_device_plan
TESTS += tests/runtime/test_device_plan
tests_runtime_test_device_plan_SOURCES = tests/runtime/test_device_plan.c
tests_runtime_test_device_plan_CPPFLAGS = $(TEST_CPPFLAGS)
tests_runtime_test_device_plan_LDADD = $(MT_RUNTIME_TEST_LIBS) $(cmocka_LIBS) $(MT_LIBS) \
	$(cuda_LIBS)

# Self world and self comm, no launcher (cmocka).
check_PROGRAMS += tests/runtime/test_comm_self
TESTS += tests/runtime/test_comm_self
tests_runtime_test_comm_self_SOURCES = tests/runtime/test_comm_self.c
tests_runtime_test_comm_self_CPPFLAGS = $(TEST_CPPFLAGS)
tests_runtime_test_comm_self_LDADD = $(MT_RUNTIME_TEST_LIBS) $(cmocka_LIBS) $(MT_LIBS)

# A multi-rank program for launchers (mpirun, srun): every collective against
# hand-computed results, agreement, and fault modes (see its header comment).
check_PROGRAMS += tests/runtime/comm_check
tests_runtime_comm_check_SOURCES = tests/runtime/comm_check.c tests/runtime/check.h
tests_runtime_comm_check_LDADD = $(MT_RUNTIME_TEST_LIBS) $(MT_LIBS)

# What the shell tests need to know about this build.
if HAVE_MPI
MT_RT_HAVE_MPI = yes
else
MT_RT_HAVE_MPI = no
endif
if HAVE_PMIX
MT_RT_HAVE_PMIX = yes
else
MT_RT_HAVE_PMIX = no
endif
if HAVE_NCCL
MT_RT_HAVE_NCCL = yes
else
MT_RT_HAVE_NCCL = no
endif
check_SCRIPTS += tests/runtime/build.env
CLEANFILES += tests/runtime/build.env
tests/runtime/build.env: Makefile
	$(AM_V_GEN)$(MKDIR_P) tests/runtime && \
	printf "MPIRUN='%s'\nMT_HAVE_MPI=%s\nMT_HAVE_PMIX=%s\nMT_HAVE_NCCL=%s\n" \
		'$(MPIRUN)' $(MT_RT_HAVE_MPI) $(MT_RT_HAVE_PMIX) $(MT_RT_HAVE_NCCL) > $@

TESTS += tests/runtime/mpi_collectives.sh tests/runtime/mpi_faults.sh \
	tests/runtime/launch_errors.sh tests/runtime/cli_multirank.sh \
	tests/slurm/srun_pmix.sh tests/slurm/sbatch_script.sh
# NCCL on real GPUs (make check-gpu)
GPU_TESTS += tests/runtime/nccl_collectives.sh
EXTRA_DIST += tests/runtime/common.sh tests/runtime/lsan.supp tests/runtime/mpi_collectives.sh \
	tests/runtime/mpi_faults.sh tests/runtime/launch_errors.sh tests/runtime/cli_multirank.sh \
	tests/runtime/nccl_collectives.sh tests/slurm/cluster.sh tests/slurm/srun_pmix.sh \
	tests/slurm/job.sh tests/slurm/sbatch_script.sh
# The sbatch script users start from, installed beside the namelists.
nobase_dist_pkgdata_DATA += slurm/qwen3_256gpu.sh

if HAVE_NCCL
check_PROGRAMS += tests/runtime/nccl_check
tests_runtime_nccl_check_SOURCES = tests/runtime/nccl_check.c tests/runtime/check.h
tests_runtime_nccl_check_CPPFLAGS = $(AM_CPPFLAGS) $(cuda_CFLAGS) $(nccl_CFLAGS)
tests_runtime_nccl_check_LDADD = $(MT_RUNTIME_TEST_LIBS) $(MT_LIBS) $(cuda_LIBS)
else
EXTRA_DIST += tests/runtime/nccl_check.c tests/runtime/check.h
endif

# The emulated NCCL (kernels/cuda/emu/emu_nccl.cc, doc/cuda-emulator.md "NCCL"): a
# libnccl.so.2 of its own, which the real loader (nccl_dl.c, dynlib.c) opens through
# LD_LIBRARY_PATH, and nccl_check on the CUDA emulator (libmt_cuda_emu first in the link,
# as for tests/gpu/moetrain-emu), over 1, 2 and 4 processes. A plain rule: the build's
# libtool makes static libraries only (LT_INIT disable-shared).
EXTRA_DIST += kernels/cuda/emu/emu_nccl.cc tests/runtime/nccl_collectives_emu.sh \
	tests/runtime/emu_nccl_api.c tests/runtime/parallel_check.c tests/runtime/parallel_nccl_emu.sh \
	tests/runtime/recompute_nccl_emu.sh
EXTRA_DIST += tests/runtime/offload_nccl_emu.sh tests/runtime/emu_nccl_graph.cc tests/runtime/emu_nccl_graph.sh \
	tests/runtime/cuda_graph_moe_nccl_emu.sh tests/runtime/cuda_graph_full_nccl_emu.sh \
	tests/runtime/cuda_graph_pp_nccl_emu.sh tests/runtime/full_iteration_runs.sh
if CUDA_EMULATION
# The emulated NCCL waits for a call's stream through the program's mt_emu_stream_wait
# (the emulator's uncounted cudaStreamSynchronize; or cudaStreamSynchronize itself), as
# the emulator may defer device work, and captures a call on a capturing stream through
# cudaStreamIsCapturing and cudaLaunchHostFunc: the programs that load it export them.
MT_EMU_NCCL_EXPORT = -Wl,--export-dynamic-symbol=cudaStreamSynchronize \
	-Wl,--export-dynamic-symbol=cudaStreamIsCapturing -Wl,--export-dynamic-symbol=cudaLaunchHostFunc \
	-Wl,--export-dynamic-symbol=mt_emu_stream_wait
tests_gpu_moetrain_emu_LDFLAGS = $(AM_LDFLAGS) $(MT_EMU_NCCL_EXPORT)
if HAVE_NCCL
check_SCRIPTS += tests/runtime/emu-nccl/libnccl.so.2
CLEANFILES += tests/runtime/emu-nccl/libnccl.so.2
tests/runtime/emu-nccl/libnccl.so.2: kernels/cuda/emu/emu_nccl.cc
	$(AM_V_CXXLD)$(MKDIR_P) tests/runtime/emu-nccl && \
	$(CXX) $(cuda_emu_CFLAGS) $(MT_CUDA_EMU_CXXFLAGS) $(CXXFLAGS) -fPIC -shared \
		-pthread -Wl,-soname,libnccl.so.2 $(LDFLAGS) -o $@ $(srcdir)/kernels/cuda/emu/emu_nccl.cc

check_PROGRAMS += tests/runtime/nccl_check-emu
TESTS += tests/runtime/nccl_collectives_emu.sh
tests_runtime_nccl_check_emu_SOURCES = tests/runtime/nccl_check.c tests/runtime/check.h
tests_runtime_nccl_check_emu_CPPFLAGS = $(AM_CPPFLAGS) $(cuda_emu_CFLAGS)
tests_runtime_nccl_check_emu_LDADD = libmt_cuda_emu.la $(MT_RUNTIME_TEST_LIBS) $(MT_LIBS) -lstdc++
tests_runtime_nccl_check_emu_LDFLAGS = $(AM_LDFLAGS) $(MT_EMU_NCCL_EXPORT)
# the NCCL communicators of the parallel groups (mt_parallel_use_device) on the emulator
check_PROGRAMS += tests/runtime/parallel_check-emu
TESTS += tests/runtime/parallel_nccl_emu.sh
# activation recompute's rebuilt MoE dispatch over the emulated NCCL
TESTS += tests/runtime/recompute_nccl_emu.sh
# activation offloading's per-slot host blocks under pipeline schedules
TESTS += tests/runtime/offload_nccl_emu.sh
# the whole MoE block as a CUDA graph under EP and TP/ETP, its collectives captured
TESTS += tests/runtime/cuda_graph_moe_nccl_emu.sh
# the whole iteration as one CUDA graph under DP (ZeRO, overlap_grad_reduce), EP and TP
TESTS += tests/runtime/cuda_graph_full_nccl_emu.sh
# and under pipeline parallelism (1F1B, interleaved, with DP), the schedule captured whole
TESTS += tests/runtime/cuda_graph_pp_nccl_emu.sh
tests_runtime_parallel_check_emu_SOURCES = tests/runtime/parallel_check.c tests/runtime/check.h
tests_runtime_parallel_check_emu_CPPFLAGS = $(AM_CPPFLAGS) $(cuda_emu_CFLAGS)
tests_runtime_parallel_check_emu_LDADD = libmt_cuda_emu.la $(MT_RUNTIME_TEST_LIBS) $(MT_LIBS) -lstdc++
tests_runtime_parallel_check_emu_LDFLAGS = $(AM_LDFLAGS) $(MT_EMU_NCCL_EXPORT)
# the emulated NCCL's operations captured into CUDA graphs and replayed
check_PROGRAMS += tests/runtime/emu_nccl_graph
TESTS += tests/runtime/emu_nccl_graph.sh
tests_runtime_emu_nccl_graph_SOURCES = tests/runtime/emu_nccl_graph.cc
tests_runtime_emu_nccl_graph_CPPFLAGS = $(MT_CUDA_EMU_CPPFLAGS)
tests_runtime_emu_nccl_graph_CXXFLAGS = $(MT_CUDA_EMU_CXXFLAGS)
tests_runtime_emu_nccl_graph_LDADD = libmt_cuda_emu.la -ldl
tests_runtime_emu_nccl_graph_LDFLAGS = $(AM_LDFLAGS) $(MT_EMU_NCCL_EXPORT)
# the emulated NCCL's API itself: every type and reduction, argument checks, groups
check_PROGRAMS += tests/runtime/emu_nccl_api
tests_runtime_emu_nccl_api_SOURCES = tests/runtime/emu_nccl_api.c
tests_runtime_emu_nccl_api_CPPFLAGS = $(AM_CPPFLAGS) $(cuda_emu_CFLAGS)
tests_runtime_emu_nccl_api_LDADD = $(MT_RUNTIME_TEST_LIBS) $(MT_LIBS)
endif
endif

# tests/gpu: the CUDA backend against the CPU reference, and the GPU op benchmark
# (included from kernels/local.mk). The programs exit 77 (skip) without a CUDA device,
# except test_cuda_table, which checks the op table and the no-device error everywhere.
# The .sh wrappers run them under the exit-status driver, which understands 77.
MT_GPU_TEST_SH = tests/gpu/test_cuda_table.sh tests/gpu/test_parity.sh tests/gpu/train_parity.sh \
	tests/gpu/test_parity_cpu.sh tests/gpu/test_parity_emu.sh \
	tests/gpu/fatbin_archs.sh tests/gpu/ptxas_budget.sh \
	bench/gpu_step.sh
MT_GPU_TEST_SRC = tests/gpu/test_cuda_table.c tests/gpu/test_parity.c tests/gpu/fatbin_list.c bench/gpu_ops.c
EXTRA_DIST += kernels/cuda/ptxas-budget.txt
# The training-parity script's comparisons, CPU against CPU: needs no GPU, runs everywhere.
TESTS += tests/gpu/train_parity_cpu.sh
EXTRA_DIST += tests/gpu/train_parity_cpu.sh bench/torch_moe_step.py bench/qwen3_30b_proxy.nml
# numpy emulation of the kernels' tensor-core index math, for work without a GPU (manual)
EXTRA_DIST += tests/gpu/mma_emulation.py

if HAVE_CUDA
GPU_TEST_LIBS = libmt_cuda.la libmt_kernels.la libmt_util.la $(MT_LIBS) $(cuda_LIBS) -lstdc++

check_PROGRAMS += tests/gpu/test_cuda_table tests/gpu/test_parity bench/gpu_ops
TESTS += tests/gpu/test_cuda_table.sh tests/gpu/test_parity_cpu.sh
# On a real GPU (`make check-gpu`, tests/local.mk): the parity harness at full length
# and the training parity on the device. Not in `make check`, which runs both on the
# emulator below (test_parity_emu.sh, train_parity_emu.sh) and never skips them.
GPU_TESTS += tests/gpu/test_parity.sh tests/gpu/train_parity.sh
EXTRA_DIST += $(MT_GPU_TEST_SH)

# What nvcc built, without a GPU: the GPU code in moetrain (SASS and PTX of
# --with-cuda-arch, read by fatbin_list) and the kernels' registers and spills against
# kernels/cuda/ptxas-budget.txt (ptxas_budget.sh compiles every .cu again, ~1 minute of
# a core: started early, with the long tests).
check_PROGRAMS += tests/gpu/fatbin_list
TESTS += tests/gpu/fatbin_archs.sh
MT_LONG_TESTS += tests/gpu/ptxas_budget.sh
tests_gpu_fatbin_list_SOURCES = tests/gpu/fatbin_list.c

tests_gpu_test_cuda_table_SOURCES = tests/gpu/test_cuda_table.c
tests_gpu_test_cuda_table_LDADD = $(GPU_TEST_LIBS)

tests_gpu_test_parity_SOURCES = tests/gpu/test_parity.c
tests_gpu_test_parity_LDADD = $(GPU_TEST_LIBS)

bench_gpu_ops_SOURCES = bench/gpu_ops.c
bench_gpu_ops_LDADD = $(GPU_TEST_LIBS)
else
EXTRA_DIST += $(MT_GPU_TEST_SH) $(MT_GPU_TEST_SRC)
endif

# The same parity harness on the CUDA execution emulator (--enable-cuda-emulation):
# the real kernels/cuda code, every case, against the CPU reference, without a GPU.
if CUDA_EMULATION
check_PROGRAMS += tests/gpu/test_parity_emu
MT_LONG_TESTS += tests/gpu/test_parity_emu.sh
tests_gpu_test_parity_emu_SOURCES = tests/gpu/test_parity.c
tests_gpu_test_parity_emu_LDADD = libmt_cuda_emu.la libmt_kernels.la libmt_util.la $(MT_LIBS) -lstdc++

# The emulator's negative tests: one small kernel per check it makes (bounds, barriers,
# warp collectives, shared-memory limits), each of which must be reported.
check_PROGRAMS += tests/gpu/emu_checks
TESTS += tests/gpu/emu_checks.sh
EXTRA_DIST += tests/gpu/emu_checks.sh
tests_gpu_emu_checks_SOURCES = tests/gpu/emu_checks.cc tests/gpu/emu_test.h
tests_gpu_emu_checks_CPPFLAGS = $(MT_CUDA_EMU_CPPFLAGS)
tests_gpu_emu_checks_CXXFLAGS = $(MT_CUDA_EMU_CXXFLAGS)
tests_gpu_emu_checks_LDADD = libmt_cuda_emu.la

# Data races of kernels, reported by ThreadSanitizer through the emulator's fibers
# (--enable-sanitizers=thread); other builds check the race-free variants' results.
check_PROGRAMS += tests/gpu/emu_races
TESTS += tests/gpu/emu_races.sh
EXTRA_DIST += tests/gpu/emu_races.sh
tests_gpu_emu_races_SOURCES = tests/gpu/emu_races.cc tests/gpu/emu_test.h
tests_gpu_emu_races_CPPFLAGS = $(MT_CUDA_EMU_CPPFLAGS)
tests_gpu_emu_races_CXXFLAGS = $(MT_CUDA_EMU_CXXFLAGS)
tests_gpu_emu_races_LDADD = libmt_cuda_emu.la

# Streams and events: work ordered in every way CUDA provides runs correctly in both
# modes (MT_EMU_STREAMS=immediate, deferred); unordered work is reported.
check_PROGRAMS += tests/gpu/emu_streams
TESTS += tests/gpu/emu_streams.sh
EXTRA_DIST += tests/gpu/emu_streams.sh
tests_gpu_emu_streams_SOURCES = tests/gpu/emu_streams.cc tests/gpu/emu_test.h
tests_gpu_emu_streams_CPPFLAGS = $(MT_CUDA_EMU_CPPFLAGS)
tests_gpu_emu_streams_CXXFLAGS = $(MT_CUDA_EMU_CXXFLAGS)
tests_gpu_emu_streams_LDADD = libmt_cuda_emu.la

# Stream capture and graphs: replay equals direct issue, bit for bit; the calls a
# capture cannot hold are refused as CUDA refuses them, with the reason.
check_PROGRAMS += tests/gpu/emu_graphs
TESTS += tests/gpu/emu_graphs.sh
EXTRA_DIST += tests/gpu/emu_graphs.sh
tests_gpu_emu_graphs_SOURCES = tests/gpu/emu_graphs.cc tests/gpu/emu_test.h
tests_gpu_emu_graphs_CPPFLAGS = $(MT_CUDA_EMU_CPPFLAGS)
tests_gpu_emu_graphs_CXXFLAGS = $(MT_CUDA_EMU_CXXFLAGS)
tests_gpu_emu_graphs_LDADD = libmt_cuda_emu.la

# The CUDA backend's graphs: a scope of ops captured once and replayed, bit-identical to
# the ops run directly; the rules of scopes enforced.
check_PROGRAMS += tests/gpu/emu_cuda_graph
TESTS += tests/gpu/emu_cuda_graph.sh
EXTRA_DIST += tests/gpu/emu_cuda_graph.sh
tests_gpu_emu_cuda_graph_SOURCES = tests/gpu/emu_cuda_graph.cc tests/gpu/emu_test.h
tests_gpu_emu_cuda_graph_CPPFLAGS = $(MT_CUDA_EMU_CPPFLAGS)
tests_gpu_emu_cuda_graph_CXXFLAGS = $(MT_CUDA_EMU_CXXFLAGS)
tests_gpu_emu_cuda_graph_LDADD = libmt_cuda_emu.la libmt_kernels.la libmt_util.la $(MT_LIBS)

# Exact extents: copies past the bytes requested, or of a block in the allocator's
# cache, are errors; kernels doing so are reported under AddressSanitizer.
check_PROGRAMS += tests/gpu/emu_memory
TESTS += tests/gpu/emu_memory.sh
EXTRA_DIST += tests/gpu/emu_memory.sh
tests_gpu_emu_memory_SOURCES = tests/gpu/emu_memory.cc tests/gpu/emu_test.h
tests_gpu_emu_memory_CPPFLAGS = $(MT_CUDA_EMU_CPPFLAGS)
tests_gpu_emu_memory_CXXFLAGS = $(MT_CUDA_EMU_CXXFLAGS)
tests_gpu_emu_memory_LDADD = libmt_cuda_emu.la

# mma.sync and ldmatrix on hand-computed cases, and their fragment tables against
# NVIDIA CUTLASS's cute layouts (emu_cute_check.sh, skipped without nvidia-cutlass).
check_PROGRAMS += tests/gpu/emu_tensor_core
TESTS += tests/gpu/emu_tensor_core.sh tests/gpu/emu_cute_check.sh
EXTRA_DIST += tests/gpu/emu_tensor_core.sh tests/gpu/emu_cute_check.sh tests/gpu/emu_cute_oracle.cc
tests_gpu_emu_tensor_core_SOURCES = tests/gpu/emu_tensor_core.cc tests/gpu/emu_test.h
tests_gpu_emu_tensor_core_CPPFLAGS = $(MT_CUDA_EMU_CPPFLAGS)
tests_gpu_emu_tensor_core_CXXFLAGS = $(MT_CUDA_EMU_CXXFLAGS)
tests_gpu_emu_tensor_core_LDADD = libmt_cuda_emu.la libmt_kernels.la libmt_util.la $(MT_LIBS)

# The emulated cuBLASLt and cub against hand-computed cases.
check_PROGRAMS += tests/gpu/emu_libraries
TESTS += tests/gpu/emu_libraries.sh
EXTRA_DIST += tests/gpu/emu_libraries.sh
tests_gpu_emu_libraries_SOURCES = tests/gpu/emu_libraries.cc tests/gpu/emu_test.h
tests_gpu_emu_libraries_CPPFLAGS = $(MT_CUDA_EMU_CPPFLAGS)
tests_gpu_emu_libraries_CXXFLAGS = $(MT_CUDA_EMU_CXXFLAGS)
tests_gpu_emu_libraries_LDADD = libmt_cuda_emu.la

# The FP8/FP4 recipes on the GPU path: every device quantiser byte for byte against the
# CPU's, the block scales in cuBLASLt's order, the emulated cuBLASLt's FP8/FP4 matmuls
# against the CPU reference GEMM (H100 and GB200).
check_PROGRAMS += tests/gpu/emu_quant
TESTS += tests/gpu/emu_quant.sh
EXTRA_DIST += tests/gpu/emu_quant.sh
tests_gpu_emu_quant_SOURCES = tests/gpu/emu_quant.cc tests/gpu/emu_test.h
tests_gpu_emu_quant_CPPFLAGS = $(MT_CUDA_EMU_CPPFLAGS)
tests_gpu_emu_quant_CXXFLAGS = $(MT_CUDA_EMU_CXXFLAGS)
tests_gpu_emu_quant_LDADD = libmt_cuda_emu.la libmt_kernels.la libmt_util.la $(MT_LIBS)

# The CUDA backend's dense GEMMs: the fp32 fallback (forced by the emulated cuBLASLt's
# test knob) reported once per shape and counted; the backend's teardown destroys every
# cuBLASLt object it made, and a new backend works after it.
check_PROGRAMS += tests/gpu/emu_gemm
TESTS += tests/gpu/emu_gemm.sh
EXTRA_DIST += tests/gpu/emu_gemm.sh
tests_gpu_emu_gemm_SOURCES = tests/gpu/emu_gemm.cc tests/gpu/emu_test.h
tests_gpu_emu_gemm_CPPFLAGS = $(MT_CUDA_EMU_CPPFLAGS)
tests_gpu_emu_gemm_CXXFLAGS = $(MT_CUDA_EMU_CXXFLAGS)
tests_gpu_emu_gemm_LDADD = libmt_cuda_emu.la libmt_kernels.la libmt_util.la $(MT_LIBS)

# moetrain with the emulated device in place of a GPU: src/main.c and src/version.c as
# in a CUDA build (kernels/cuda/emu/shim/config.h), libmt_cuda_emu in place of
# libmt_cuda, first: the runtime's CUDA
# calls (NCCL's streams and events) then find the emulator's, and a build with NCCL
# never pulls in the real cudart it lists. `moetrain` itself is unchanged.
check_PROGRAMS += tests/gpu/moetrain-emu
MT_LONG_TESTS += tests/gpu/train_parity_emu.sh tests/gpu/host_counts_emu.sh tests/gpu/recompute_emu.sh
EXTRA_DIST += tests/gpu/train_parity_emu.sh tests/gpu/host_counts_emu.sh tests/gpu/recompute_emu.sh
MT_LONG_TESTS += tests/gpu/offload_emu.sh
EXTRA_DIST += tests/gpu/offload_emu.sh
MT_LONG_TESTS += tests/gpu/cuda_graph_train_emu.sh tests/gpu/cuda_graph_lowp_emu.sh
EXTRA_DIST += tests/gpu/cuda_graph_train_emu.sh tests/gpu/cuda_graph_lowp_emu.sh
MT_LONG_TESTS += tests/gpu/cuda_graph_full_recompute_emu.sh
EXTRA_DIST += tests/gpu/cuda_graph_full_recompute_emu.sh
MT_LONG_TESTS += tests/gpu/lowp_train_h100_emu.sh tests/gpu/lowp_train_gb200_emu.sh
EXTRA_DIST += tests/gpu/lowp_train_emu.sh tests/gpu/lowp_train_h100_emu.sh tests/gpu/lowp_train_gb200_emu.sh
MT_LONG_TESTS += tests/gpu/fp8_padding_emu.sh
EXTRA_DIST += tests/gpu/fp8_padding_emu.sh
tests_gpu_moetrain_emu_SOURCES = src/main.c src/version.c kernels/cuda/emu/shim/config.h
nodist_tests_gpu_moetrain_emu_SOURCES = src/revision.h
src/tests_gpu_moetrain_emu-version.$(OBJEXT): src/revision.h
tests_gpu_moetrain_emu_CPPFLAGS = -iquote $(top_srcdir)/kernels/cuda/emu/shim $(AM_CPPFLAGS) $(mpi_CFLAGS) $(cuda_emu_CFLAGS)
# src/main.c's dm_is_cuda is used only with NCCL: a CUDA build without NCCL (as this
# program is in a build without nvcc) would fail on it as unused.
tests_gpu_moetrain_emu_CFLAGS = $(AM_CFLAGS) -Wno-unused-function
tests_gpu_moetrain_emu_LDADD = libmt_cuda_emu.la $(filter-out libmt_cuda.la,$(MT_MODULE_LIBS)) $(MT_LIBS) -lstdc++
else
EXTRA_DIST += tests/gpu/emu_checks.sh tests/gpu/emu_checks.cc tests/gpu/emu_test.h
EXTRA_DIST += tests/gpu/emu_races.sh tests/gpu/emu_races.cc
EXTRA_DIST += tests/gpu/emu_streams.sh tests/gpu/emu_streams.cc tests/gpu/emu_memory.sh tests/gpu/emu_memory.cc
EXTRA_DIST += tests/gpu/emu_tensor_core.sh tests/gpu/emu_tensor_core.cc tests/gpu/emu_cute_check.sh \
	tests/gpu/emu_cute_oracle.cc tests/gpu/emu_libraries.sh tests/gpu/emu_libraries.cc \
	tests/gpu/train_parity_emu.sh tests/gpu/recompute_emu.sh kernels/cuda/emu/shim/config.h \
	tests/gpu/host_counts_emu.sh
EXTRA_DIST += tests/gpu/offload_emu.sh tests/gpu/cuda_graph_train_emu.sh tests/gpu/cuda_graph_lowp_emu.sh
EXTRA_DIST += tests/gpu/cuda_graph_full_recompute_emu.sh
EXTRA_DIST += tests/gpu/lowp_train_emu.sh tests/gpu/lowp_train_h100_emu.sh tests/gpu/lowp_train_gb200_emu.sh
EXTRA_DIST += tests/gpu/fp8_padding_emu.sh
EXTRA_DIST += tests/gpu/emu_gemm.sh tests/gpu/emu_gemm.cc
EXTRA_DIST += tests/gpu/emu_quant.sh tests/gpu/emu_quant.cc
endif

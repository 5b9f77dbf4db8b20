/* CUDA backend entry points callable from C. Compiled only when configure found CUDA.
 *
 * mt_kernels_cuda() fills the op table of kernels/kernels.h with CUDA kernels, cuBLASLt
 * and a fused (flash) attention; every tensor pointer an op takes is device memory, and
 * the memory ops allocate device memory through a caching allocator. All work is
 * queued on one stream owned by the backend, in call order; ops that return host
 * values (losses, the dropped count) and copies to or from host memory synchronise it.
 * copy_async alone runs on a second stream (MT_STREAM_COPY), ordered by the caller's
 * events (cudaEventRecord, cudaStreamWaitEvent), never waited for by the host.
 *
 * Differences a caller can see from the CPU reference, all within its contract:
 * - GEMMs (dense and grouped) and attention multiply in bf16 on tensor cores with fp32
 *   sums (MT_CUDA_GEMM_COMPUTE=tf32 or fp32, read once, changes the dense GEMMs).
 * - attention_bwd recomputes the probabilities per 64 x 64 tile from q, k and the lse,
 *   and rounds them (and dS) to bf16 for the tensor cores; the CPU keeps them fp32.
 * - A failing CUDA call inside an op (the table has no error channel) prints the call,
 *   the place and a hint, and aborts; only alloc reports failure, by returning NULL. */
#ifndef MT_KERNELS_CUDA_BACKEND_H
#define MT_KERNELS_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mt_err;
struct mt_kernels;
struct mt_kernel_ops;

/* The CUDA backend on the current device (cudaSetDevice first to pick another). Built
 * on the first call after program start or after mt_kernels_cuda_destroy, then the
 * same on every call: stream, cuBLASLt handle and workspace, allocator, GEMM plans.
 * Returns NULL with a message in err when there is no usable device. */
const struct mt_kernels *mt_kernels_cuda(struct mt_err *err);

/* Tears the backend down: waits for its stream, destroys the cached GEMM plans
 * (cuBLASLt matmul descriptors and layouts), the cuBLASLt handle, the workspace, the
 * staging buffer and the stream, and returns every block of the caching allocator to
 * the driver, including blocks still handed out (every pointer alloc returned becomes
 * invalid). Users of its stream (NCCL communicators) must be gone first. Nothing to do
 * when the backend was not built. The next mt_kernels_cuda builds a new one. Returns
 * MT_OK, or the first CUDA error met (everything is released all the same). */
int mt_kernels_cuda_destroy(struct mt_err *err);

/* Loads what a GPU run needs beyond this executable (kernels/cuda/cuda_dl.c): cuBLASLt
 * and the NVIDIA driver's libcuda.so.1. MT_EUNSUPPORTED with a message naming the
 * library that cannot be loaded, where it was looked for, and the fix. */
int mt_cuda_load_libraries(struct mt_err *err);

/* The version of the cuBLASLt (major*10000 + minor*100 + patch) and of the NVIDIA
 * driver (cudaDriverGetVersion's CUDA version) this process can load, or 0 with why in
 * err. */
size_t mt_cublaslt_version(struct mt_err *err);
int mt_cuda_driver_version(struct mt_err *err);

/* The backend's function table alone: needs no device (completeness checks). */
const struct mt_kernel_ops *mt_kernels_cuda_ops(void);

/* cudaSetDevice(device) before the backend is built; -1 with a message when that
 * device does not exist or cannot be used. */
int mt_cuda_select_device(int device, char *msg, size_t msg_len);

/* Whether p is device memory (cudaPointerGetAttributes: device or managed). */
bool mt_cuda_is_device_memory(const void *p);

/* The backend's compute stream (a cudaStream_t), for communication that must follow
 * its kernels (mt_comm_nccl_set_stream). */
void *mt_cuda_stream(const struct mt_kernels *k);

/* Device memory held by the backend's caching allocator, in bytes. */
struct mt_cuda_mem_stats {
    size_t in_use;      /* handed out by alloc (rounded sizes) and not freed */
    size_t cached;      /* freed, kept for reuse */
    size_t peak_in_use; /* high-water mark of in_use */
    size_t reserved;    /* everything obtained from cudaMalloc, cuBLASLt workspace included */
    long long device_allocs; /* cudaMalloc calls so far: flat once training is warm */
};
void mt_cuda_mem_stats(const struct mt_kernels *k, struct mt_cuda_mem_stats *s);

/* The dense GEMMs (cuBLASLt) since the backend was built. A shape for which cuBLASLt's
 * heuristic has no algorithm under the requested compute type (MT_CUDA_GEMM_COMPUTE)
 * runs with fallback_compute, without tensor cores: each such shape is printed on
 * stderr once, when first seen; these counts say how much work took that path. */
struct mt_cuda_gemm_stats {
    const char *compute;          /* requested, e.g. "CUBLAS_COMPUTE_32F_FAST_16BF" */
    const char *fallback_compute; /* "CUBLAS_COMPUTE_32F" */
    long long shapes, calls;      /* distinct shapes (cached plans), cublasLtMatmul calls */
    long long fallback_shapes, fallback_calls; /* of which on fallback_compute */
    /* the FP8/FP4 recipes' GEMMs (struct mt_quant_ops gemm): cuBLASLt FP8/FP4 matmuls,
     * those written through the epilogue (padding, NVFP4's per-tensor scales), the
     * scale modes they used, e.g. "VEC128_32F, BLK128x128_32F", and the grouped
     * quantised GEMM's launches (struct mt_quant_ops grouped_gemm) and their groups;
     * the producers that emitted their output's quantisation (struct mt_quant_ops
     * rmsnorm_fwd, swiglu_fwd) */
    long long lowp_calls, lowp_epilogues, lowp_grouped, lowp_groups, lowp_fused;
    char lowp_modes[96];
};
/* All zero (names NULL) when the backend is not built. */
void mt_cuda_gemm_stats(const struct mt_kernels *k, struct mt_cuda_gemm_stats *s);

/* What the emulated device saw since the backend was built (kernels/cuda/emu: kernel
 * launches and cuBLASLt matmuls, the host's waits), to check the backend's own counts
 * (struct mt_op_counts) against; false (nothing set) in a build for a real GPU. */
bool mt_cuda_emulated_counts(const struct mt_kernels *k, long long *launches, long long *syncs);

/* Device facts for benchmarks: name, multiprocessors, peak SM clock, and the dense
 * bf16 tensor-core peak derived from them (0 when the architecture is not known). */
struct mt_cuda_device_info {
    char name[256];
    int cc_major, cc_minor, sm_count;
    double clock_ghz;
    double bf16_dense_tflops;
    double mem_gib;
};
int mt_cuda_device_info(struct mt_cuda_device_info *info);

/* Which of the GPU code this build holds (MT_CUDA_ARCHS, configure's --with-cuda-arch:
 * sm_NN SASS, compute_NN PTX, each optionally with the suffix a or f) a GPU of compute
 * capability major.minor runs, as the CUDA driver chooses: SASS sm_XY runs on X.Z for
 * Z >= Y (sm_XYf likewise, sm_XYa on X.Y only); failing that, PTX compute_XY is
 * compiled for any X.Y or newer (compute_XYa for X.Y only, compute_XYf within X).
 * Names the entry used (the newest that fits) in which. A device with NONE fails every
 * launch with "no kernel image is available for execution on the device". */
enum mt_cuda_image { MT_CUDA_IMAGE_NONE, MT_CUDA_IMAGE_SASS, MT_CUDA_IMAGE_PTX };
enum mt_cuda_image mt_cuda_image_for(const char *archs, int major, int minor, char *which, size_t which_len);

/* MT_CUDA_ARCHS of this build. */
const char *mt_cuda_archs(void);

/* Writes a one-line description of the visible CUDA devices (or why there are none)
 * into buf, with which of this build's GPU code device 0 runs ("runs sm_90 SASS",
 * "runs compute_100 PTX (compiled at load)" or "no kernel image in this build").
 * Returns the number of devices (0 when none or no driver). */
int mt_cuda_describe(char *buf, size_t n);

/* Runs a tiny kernel (y = a*x + y on n elements) on device 0 and checks the result
 * against the host. Returns 0 on success, -1 with a message in buf otherwise. */
int mt_cuda_selftest(char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif

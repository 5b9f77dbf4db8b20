// Device discovery and a self-test kernel: the smallest proof that the CUDA build
// and the runtime work. The op table's CUDA implementation lives beside this file.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_launch.cuh"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

__global__ static void saxpy_kernel(int n, float a, const float *x, float *y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" int mt_cuda_describe(char *buf, size_t n)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(buf, n, "no CUDA device (%s)", cudaGetErrorString(e));
        return 0;
    }
    if (count == 0) {
        snprintf(buf, n, "no CUDA device");
        return 0;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        snprintf(buf, n, "%d CUDA device(s)", count);
        return count;
    }
    char which[32];
    const enum mt_cuda_image img = mt_cuda_image_for(mt_cuda_archs(), p.major, p.minor, which, sizeof which);
    snprintf(buf, n, "%d CUDA device(s); device 0: %s, sm_%d%d, %.1f GiB, %s%s%s", count, p.name, p.major, p.minor,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
             img == MT_CUDA_IMAGE_NONE ? "no kernel image in this build" : "runs ", which,
             img == MT_CUDA_IMAGE_SASS ? " SASS" : img == MT_CUDA_IMAGE_PTX ? " PTX (compiled at load)" : "");
    return count;
}

extern "C" int mt_cuda_selftest(char *buf, size_t n)
{
    const int len = 1 << 16;
    float *hx = (float *)malloc(sizeof(float) * len), *hy = (float *)malloc(sizeof(float) * len);
    float *dx = NULL, *dy = NULL;
    int rc = -1;
    cudaError_t e;
    if (!hx || !hy) { snprintf(buf, n, "host allocation failed"); goto out; }
    for (int i = 0; i < len; i++) { hx[i] = (float)i; hy[i] = 1.0f; }
    if ((e = cudaMalloc(&dx, sizeof(float) * len)) != cudaSuccess) goto cuda_fail;
    if ((e = cudaMalloc(&dy, sizeof(float) * len)) != cudaSuccess) goto cuda_fail;
    if ((e = cudaMemcpy(dx, hx, sizeof(float) * len, cudaMemcpyHostToDevice)) != cudaSuccess) goto cuda_fail;
    if ((e = cudaMemcpy(dy, hy, sizeof(float) * len, cudaMemcpyHostToDevice)) != cudaSuccess) goto cuda_fail;
    MT_LAUNCH((len + 255) / 256, 256, 0, 0, saxpy_kernel)(len, 2.0f, dx, dy);
    if ((e = cudaGetLastError()) != cudaSuccess) goto cuda_fail;
    if ((e = cudaMemcpy(hy, dy, sizeof(float) * len, cudaMemcpyDeviceToHost)) != cudaSuccess) goto cuda_fail;
    for (int i = 0; i < len; i++) {
        if (hy[i] != 2.0f * (float)i + 1.0f) {
            snprintf(buf, n, "saxpy mismatch at %d: %g", i, (double)hy[i]);
            goto out;
        }
    }
    snprintf(buf, n, "saxpy on %d elements ok", len);
    rc = 0;
    goto out;
cuda_fail:
    snprintf(buf, n, "CUDA error: %s", cudaGetErrorString(e));
out:
    cudaFree(dx);
    cudaFree(dy);
    free(hx);
    free(hy);
    return rc;
}

// The CUDA emulator's exact extents (emu_memory.sh runs each case in a process of its
// own). cudaMalloc rounds to 256 bytes and kernels/cuda's caching allocator to a size
// class; the emulator checks copies against the bytes requested and, under
// AddressSanitizer, poisons the rest, so that a kernel reading or writing past its
// tensor is reported even inside the same block, and a block back in the cache is
// freed memory.
//
//   emu_memory CASE     (emu_memory --asan: "yes" when built with AddressSanitizer)
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_launch.cuh"
#include "tests/gpu/emu_test.h"

__global__ static void read_kernel(float *out, const float *in, int i) { out[0] = in[i]; }

static float *dev(size_t bytes)
{
    void *p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, bytes));
    return static_cast<float *>(p);
}

static void read(const float *in, int i)
{
    float *out = dev(sizeof(float));
    MT_LAUNCH(1, 1, 0, nullptr, read_kernel)(out, in, i);
    CHECK_CUDA(cudaDeviceSynchronize());
}

int main(int argc, char **argv)
{
    const char *c = argc > 1 ? argv[1] : "";
    float h[256] = {};
    if (!strcmp(c, "--asan")) {
#if defined(__SANITIZE_ADDRESS__)
        puts("yes");
#else
        puts("no");
#endif
        return 0;
    }
    if (!strcmp(c, "ok")) { // every byte requested is usable, in both ways
        float *x = dev(1000);
        CHECK_CUDA(cudaMemcpy(x, h, 1000, cudaMemcpyHostToDevice));
        read(x, 249);
        float *y = dev(1024);
        ::mt_emu::note_extent(y, 1000, nullptr);
        CHECK_CUDA(cudaMemcpy(y, h, 1000, cudaMemcpyHostToDevice));
        read(y, 249);
        ::mt_emu::note_cached(y, nullptr);
        ::mt_emu::note_extent(y, 1024, nullptr); // handed out again, larger
        read(y, 255);
        puts("emu_memory: ok");
        return 0;
    }
    if (!strcmp(c, "rounding_read")) { // bytes 1000..1003 of a 1000-byte cudaMalloc (1024 rounded)
        read(dev(1000), 250);
    } else if (!strcmp(c, "class_read")) { // past 1000 bytes handed out of a 1024-byte block
        float *y = dev(1024);
        ::mt_emu::note_extent(y, 1000, nullptr);
        read(y, 250);
    } else if (!strcmp(c, "cached_read")) { // a block back in the allocator's cache
        float *y = dev(1024);
        ::mt_emu::note_extent(y, 1024, nullptr);
        ::mt_emu::note_cached(y, nullptr);
        read(y, 0);
    } else if (!strcmp(c, "class_copy")) {
        float *y = dev(1024);
        ::mt_emu::note_extent(y, 1000, nullptr);
        CHECK_CUDA(cudaMemcpy(h, y, 1024, cudaMemcpyDeviceToHost));
    } else if (!strcmp(c, "cached_copy")) {
        float *y = dev(1024);
        ::mt_emu::note_extent(y, 1024, nullptr);
        ::mt_emu::note_cached(y, nullptr);
        CHECK_CUDA(cudaMemcpy(h, y, 4, cudaMemcpyDeviceToHost));
    } else {
        fprintf(stderr, "usage: emu_memory --asan|ok|rounding_read|class_read|cached_read|class_copy|cached_copy\n");
        return 2;
    }
    fprintf(stderr, "emu_memory: %s: nothing was reported\n", c);
    return 1;
}

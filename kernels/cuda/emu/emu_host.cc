// The CUDA execution emulator: what kernels/cuda/cuda_dl.c loads at run time in a real
// build (cuBLASLt, the driver) is part of the emulator here: nothing to load, and the
// versions are those of the headers it was built against.
#include "kernels/cuda/emu/emu_internal.h"

#include <cublasLt.h>
#include <cublas_api.h>

#include "kernels/cuda/cuda_backend.h"
#include "util/error.h"

extern "C" {

int mt_cuda_load_libraries(struct mt_err *) { return MT_OK; }
size_t mt_cublaslt_version(struct mt_err *) { return CUBLAS_VERSION; }
int mt_cuda_driver_version(struct mt_err *) { return CUDART_VERSION; }

cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

} // extern "C"

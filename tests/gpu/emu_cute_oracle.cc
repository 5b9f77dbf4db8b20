// The oracle of emu_cute_check.sh: the fragment tables of mma.sync m16n8k16 bf16 and
// ldmatrix.x4 (.trans) as NVIDIA CUTLASS's cute defines them (MMA_Traits and
// Copy_Traits of the nvidia-cutlass package's headers, an encoding independent of the
// emulator's), printed in the format of `emu_tensor_core --dump`. Compiled by the test
// script against the installed headers; not part of moetrain.
#include <cute/atom/copy_traits_sm75.hpp>
#include <cute/atom/mma_traits_sm80.hpp>
#include <stdio.h>

using namespace cute;

int main()
{
    using MMA = MMA_Traits<SM80_16x8x16_F32BF16BF16F32_TN>;
    // (thread, value) -> column-major index: A is M x K, B is N x K, C is M x N
    const auto A = typename MMA::ALayout{};
    const auto B = typename MMA::BLayout{};
    const auto C = typename MMA::CLayout{};
    for (int t = 0; t < 32; t++)
        for (int v = 0; v < 8; v++) {
            const int i = (int)A(t, v);
            printf("mma A %d %d %d %d\n", t, v, i % 16, i / 16);
        }
    for (int t = 0; t < 32; t++)
        for (int v = 0; v < 4; v++) {
            const int i = (int)B(t, v);
            printf("mma B %d %d %d %d\n", t, v, i / 8, i % 8);
        }
    for (int t = 0; t < 32; t++)
        for (int v = 0; v < 4; v++) {
            const int i = (int)C(t, v);
            printf("mma C %d %d %d %d\n", t, v, i % 16, i / 16);
        }
    // ldmatrix: (destination thread, destination bit) -> bit of the 32 source rows of
    // 128 bits, row t being the one whose address thread t gave
    const auto N = typename Copy_Traits<SM75_U32x4_LDSM_N>::DstLayout{};  // (32, (32 bits, 4 regs))
    const auto T = typename Copy_Traits<SM75_U16x8_LDSM_T>::DstLayout{};  // ((4,8), (16 bits, 2 halves, 4 regs))
    for (int t = 0; t < 32; t++)
        for (int r = 0; r < 4; r++)
            for (int h = 0; h < 2; h++) {
                const int bit = (int)N(t, 16 * h + 32 * r);
                printf("ldsm N %d %d %d %d %d\n", t, r, h, bit / 128, bit % 128 / 16);
            }
    for (int t = 0; t < 32; t++)
        for (int r = 0; r < 4; r++)
            for (int h = 0; h < 2; h++) {
                const int bit = (int)T(t, 16 * h + 32 * r);
                printf("ldsm T %d %d %d %d %d\n", t, r, h, bit / 128, bit % 128 / 16);
            }
    return 0;
}

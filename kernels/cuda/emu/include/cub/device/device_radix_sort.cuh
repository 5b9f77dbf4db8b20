// The CUDA execution emulator: cub::DeviceRadixSort::SortPairs as kernels/cuda uses it,
// written from CUB's documentation. A stable sort of (key, value) pairs by the key
// bits [begin_bit, end_bit) (signed keys ordered as numbers: the sign bit flipped
// first, as CUB does), with the two-phase temporary-storage protocol: a call with
// d_temp_storage == NULL only sets temp_storage_bytes; the second call must pass at
// least that many bytes of device memory. Device work on its stream (emu_streams.h).
#ifndef MT_KERNELS_CUDA_EMU_CUB_DEVICE_RADIX_SORT_CUH
#define MT_KERNELS_CUDA_EMU_CUB_DEVICE_RADIX_SORT_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/cuda/emu/emu_streams.h"

namespace mt_emu {
void check_device_range(const char *api, const void *p, size_t bytes);
}

namespace cub {

struct DeviceRadixSort {
    template <typename KeyT, typename ValueT, typename NumItemsT>
    static cudaError_t SortPairs(void *d_temp_storage, size_t &temp_storage_bytes, const KeyT *d_keys_in,
                                 KeyT *d_keys_out, const ValueT *d_values_in, ValueT *d_values_out,
                                 NumItemsT num_items, int begin_bit = 0, int end_bit = sizeof(KeyT) * 8,
                                 cudaStream_t stream = 0)
    {
        static_assert(std::is_integral<KeyT>::value, "the emulator sorts integer keys");
        const size_t n = num_items > 0 ? (size_t)num_items : 0;
        // what CUB would use for double buffers of keys and values, and a histogram
        const size_t need = 2 * n * (sizeof(KeyT) + sizeof(ValueT)) + 4096;
        if (!d_temp_storage) {
            temp_storage_bytes = need;
            return cudaSuccess;
        }
        if (temp_storage_bytes < need) return cudaErrorInvalidValue;
        mt_emu::check_device_range("cub::DeviceRadixSort::SortPairs (temporary storage)", d_temp_storage,
                                   temp_storage_bytes);
        if (begin_bit < 0 || end_bit > (int)sizeof(KeyT) * 8 || begin_bit > end_bit) return cudaErrorInvalidValue;
        if (n == 0) return cudaSuccess;
        mt_emu::check_device_range("cub::DeviceRadixSort::SortPairs (keys in)", d_keys_in, n * sizeof(KeyT));
        mt_emu::check_device_range("cub::DeviceRadixSort::SortPairs (keys out)", d_keys_out, n * sizeof(KeyT));
        mt_emu::check_device_range("cub::DeviceRadixSort::SortPairs (values in)", d_values_in, n * sizeof(ValueT));
        mt_emu::check_device_range("cub::DeviceRadixSort::SortPairs (values out)", d_values_out, n * sizeof(ValueT));
        const mt_emu::mem_access acc[5] = {{d_keys_in, n * sizeof(KeyT), false},
                                       {d_values_in, n * sizeof(ValueT), false},
                                       {d_keys_out, n * sizeof(KeyT), true},
                                       {d_values_out, n * sizeof(ValueT), true},
                                       {d_temp_storage, temp_storage_bytes, true}};
        mt_emu::stream_work(stream, "cub::DeviceRadixSort::SortPairs", nullptr, 0, acc, 5, [=] {
            using U = typename std::make_unsigned<KeyT>::type;
            const int bits = (int)sizeof(KeyT) * 8;
            const U flip = std::is_signed<KeyT>::value ? (U)((U)1 << (bits - 1)) : (U)0;
            const U span = end_bit - begin_bit >= bits ? (U)~(U)0 : (U)(((U)1 << (end_bit - begin_bit)) - 1);
            std::vector<size_t> order(n);
            std::vector<U> digit(n);
            for (size_t i = 0; i < n; i++) {
                U u;
                memcpy(&u, &d_keys_in[i], sizeof u);
                digit[i] = (U)((U)(u ^ flip) >> begin_bit) & span;
                order[i] = i;
            }
            std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return digit[a] < digit[b]; });
            std::vector<KeyT> k(n);
            std::vector<ValueT> v(n);
            for (size_t i = 0; i < n; i++) {
                k[i] = d_keys_in[order[i]];
                v[i] = d_values_in[order[i]];
            }
            std::copy(k.begin(), k.end(), d_keys_out);
            std::copy(v.begin(), v.end(), d_values_out);
        });
        return cudaSuccess;
    }
};

} // namespace cub

#endif

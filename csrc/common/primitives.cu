// CUB's device-wide radix sort and scan behind primitives.h.
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "common/gpu_util.cuh"
#include "common/primitives.h"

namespace tf_sparseconv {
namespace gpu {

template <typename K, typename V>
GpuStatus SortPairs(Stream stream, Scratch* scratch, K* keys[2], V* values[2],
                    int64_t num_items, int end_bit, int* current) {
  *current = 0;
  if (num_items == 0) return GpuStatus::Ok();
  if (num_items > kMaxSortItems) return GpuStatus{"radix sort", "more than 2^31 - 1 items"};
  cub::DoubleBuffer<K> d_keys(keys[0], keys[1]);
  cub::DoubleBuffer<V> d_values(values[0], values[1]);
  const int n = static_cast<int>(num_items);
  size_t temp_bytes = 0;
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, d_keys, d_values, n, 0, end_bit,
                                      stream),
      "radix sort (size query)");
  void* temp = scratch->Device(temp_bytes > 0 ? temp_bytes : 1);
  if (temp == nullptr) return GpuStatus::OutOfMemory("radix sort");
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cub::DeviceRadixSort::SortPairs(temp, temp_bytes, d_keys, d_values, n, 0, end_bit,
                                      stream),
      "radix sort");
  *current = d_keys.selector;
  return GpuStatus::Ok();
}

template GpuStatus SortPairs<uint64_t, float>(Stream, Scratch*, uint64_t* [2], float* [2],
                                              int64_t, int, int*);
template GpuStatus SortPairs<uint64_t, double>(Stream, Scratch*, uint64_t* [2], double* [2],
                                               int64_t, int, int*);
template GpuStatus SortPairs<uint64_t, int32_t>(Stream, Scratch*, uint64_t* [2], int32_t* [2],
                                                int64_t, int, int*);
template GpuStatus SortPairs<uint32_t, int32_t>(Stream, Scratch*, uint32_t* [2], int32_t* [2],
                                                int64_t, int, int*);

GpuStatus ExclusiveSum(Stream stream, Scratch* scratch, const int64_t* in, int64_t* out,
                       int64_t n) {
  if (n == 0) return GpuStatus::Ok();
  if (n > kMaxSortItems) return GpuStatus{"exclusive scan", "more than 2^31 - 1 items"};
  size_t temp_bytes = 0;
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, in, out, static_cast<int>(n), stream),
      "exclusive scan (size query)");
  void* temp = scratch->Device(temp_bytes > 0 ? temp_bytes : 1);
  if (temp == nullptr) return GpuStatus::OutOfMemory("exclusive scan");
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cub::DeviceScan::ExclusiveSum(temp, temp_bytes, in, out, static_cast<int>(n), stream),
      "exclusive scan");
  return GpuStatus::Ok();
}

}  // namespace gpu
}  // namespace tf_sparseconv

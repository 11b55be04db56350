// The conversion and validation ops on the GPU. Scatter and gather kernels skip keys
// outside the layout, so that invalid input, which the Report rejects, cannot make them
// write or read out of bounds.
#include "channel/channel_sparse.cuh"
#include "channel/conversions/conversions_gpu.h"
#include "common/gpu_util.cuh"

namespace tf_sparseconv {
namespace gpu {
namespace {

__global__ void EncodeKeysKernel(KeyLayout L, const int64_t* indices, int64_t n,
                                 int64_t* keys, CheckSlot* slot) {
  ChainedKernelBegin();
  const int rank = L.d + 2;
  TF_SPARSECONV_GRID_LOOP(i, n) {
    const int64_t* row = indices + i * rank;
    int64_t lin = 0;
    bool inside = true;
    for (int j = 0; j < rank && inside; ++j) {
      const int64_t bound = j == 0 ? L.batch : j == rank - 1 ? L.channels : L.extent[j - 1];
      if (row[j] < 0 || row[j] >= bound) {
        RecordFirst(slot, i * rank + j);
        inside = false;
      } else if (j >= 1 && j < rank - 1) {
        lin += row[j] * L.stride[j - 1];
      }
    }
    keys[i] = inside ? L.key_of(row[0], row[rank - 1], lin) : 0;
  }
}

__global__ void DescribeIndexKernel(const int64_t* indices, CheckSlot* slot) {
  ChainedKernelBegin();
  if (slot->first == kNoError) return;
  slot->detail[0] = indices[slot->first];
}

__global__ void DecodeKeysKernel(KeyLayout L, const int64_t* keys, int64_t n,
                                 int64_t* indices) {
  ChainedKernelBegin();
  const int rank = L.d + 2;
  const int64_t limit = L.num_keys();
  TF_SPARSECONV_GRID_LOOP(i, n) {
    int64_t* row = indices + i * rank;
    const int64_t key = keys[i];
    if (key < 0 || key >= limit) {
      for (int j = 0; j < rank; ++j) row[j] = 0;
      continue;
    }
    const int64_t seg = L.segment_of(key), lin = L.spatial_of(key);
    row[0] = seg / L.channels;
    for (int j = 0; j < L.d; ++j) row[1 + j] = (lin / L.stride[j]) % L.extent[j];
    row[rank - 1] = seg % L.channels;
  }
}

__global__ void IotaKernel(int32_t* order, int64_t n) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(i, n) { order[i] = static_cast<int32_t>(i); }
}

template <typename T>
__global__ void GatherSortedKernel(const uint64_t* sorted, const int32_t* order,
                                   const T* values, int64_t n, int64_t* sorted_keys,
                                   T* sorted_values, int64_t* permutation,
                                   CheckSlot* duplicates) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(i, n) {
    sorted_keys[i] = static_cast<int64_t>(sorted[i]);
    sorted_values[i] = values[order[i]];
    permutation[i] = order[i];
    if (i > 0 && sorted[i] == sorted[i - 1]) RecordFirst(duplicates, i);
  }
}

__global__ void DescribeDuplicateKernel(const int64_t* sorted_keys, const int64_t* permutation,
                                        CheckSlot* slot) {
  ChainedKernelBegin();
  if (slot->first == kNoError) return;
  const int64_t i = static_cast<int64_t>(slot->first);
  slot->detail[0] = sorted_keys[i];
  slot->detail[1] = permutation[i - 1];
  slot->detail[2] = permutation[i];
}

template <typename T>
__global__ void ScatterKernel(KeyLayout L, const int64_t* keys, const T* values, int64_t n,
                              T* dense) {
  ChainedKernelBegin();
  const int64_t limit = L.num_keys();
  TF_SPARSECONV_GRID_LOOP(i, n) {
    if (keys[i] >= 0 && keys[i] < limit) dense[DenseIndex(keys[i], L)] = values[i];
  }
}

template <typename T>
__global__ void GatherKernel(KeyLayout L, const int64_t* keys, int64_t n, const T* dense,
                             T* values) {
  ChainedKernelBegin();
  const int64_t limit = L.num_keys();
  TF_SPARSECONV_GRID_LOOP(i, n) {
    values[i] = keys[i] >= 0 && keys[i] < limit ? dense[DenseIndex(keys[i], L)] : T(0);
  }
}

template <typename T>
struct IsNonZero {
  KeyLayout layout;
  const T* dense;
  __device__ bool operator()(int64_t key) const {
    return dense[DenseIndex(key, layout)] != T(0);
  }
};

template <typename T>
struct WriteNonZero {
  KeyLayout layout;
  const T* dense;
  int64_t* keys;
  T* values;
  __device__ void operator()(int64_t key, int64_t rank) const {
    keys[rank] = key;
    values[rank] = dense[DenseIndex(key, layout)];
  }
};

}  // namespace

template <typename T>
GpuStatus ValidateGpu(Stream stream, Scratch* scratch, const KeyLayout& layout,
                      const int64_t* keys, const T* values, int64_t n, bool padded, Report* report) {
  Report* device_report = nullptr;
  TF_SPARSECONV_RETURN_IF_ERROR(NewEntryReport(stream, scratch, keys, values, n, layout.num_keys(), kValidateKeys,
                                               kValidateNaN, &device_report, padded));
  return ReadReport(stream, scratch, device_report, report);
}

GpuStatus EncodeKeysGpu(Stream stream, Scratch* scratch, const KeyLayout& layout,
                        const int64_t* indices, int64_t n, int64_t* keys, Report* report) {
  Report* device_report = nullptr;
  TF_SPARSECONV_RETURN_IF_ERROR(NewReport(stream, scratch, &device_report));
  if (n > 0) {
    CheckSlot* slot = &device_report->checks[kEncodeIndices];
    LaunchChained(EncodeKeysKernel, BlocksFor(n), kThreads, 0, stream, layout, indices, n, keys, slot);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("encode keys");
    LaunchChained(DescribeIndexKernel, 1, 1, 0, stream, indices, slot);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("encode keys");
  }
  return ReadReport(stream, scratch, device_report, report);
}

GpuStatus DecodeKeysGpu(Stream stream, Scratch* scratch, const KeyLayout& layout,
                        const int64_t* keys, int64_t n, int64_t* indices, Report* report) {
  Report* device_report = nullptr;
  TF_SPARSECONV_RETURN_IF_ERROR(NewReport(stream, scratch, &device_report));
  TF_SPARSECONV_RETURN_IF_ERROR(CheckKeysInRange(stream, keys, n, layout.num_keys(),
                                                 &device_report->checks[kDecodeKeys]));
  if (n > 0) {
    LaunchChained(DecodeKeysKernel, BlocksFor(n), kThreads, 0, stream, layout, keys, n, indices);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("decode keys");
  }
  return ReadReport(stream, scratch, device_report, report);
}

template <typename T>
GpuStatus ReorderGpu(Stream stream, Scratch* scratch, const KeyLayout& layout,
                     const int64_t* keys, const T* values, int64_t n, int64_t* sorted_keys,
                     T* sorted_values, int64_t* permutation, Report* report) {
  Report* device_report = nullptr;
  TF_SPARSECONV_RETURN_IF_ERROR(NewReport(stream, scratch, &device_report));
  TF_SPARSECONV_RETURN_IF_ERROR(CheckKeysInRange(stream, keys, n, layout.num_keys(),
                                                 &device_report->checks[kReorderRange]));
  if (n > 0) {
    uint64_t* sort_keys[2] = {scratch->DeviceArray<uint64_t>(n),
                              scratch->DeviceArray<uint64_t>(n)};
    int32_t* order[2] = {scratch->DeviceArray<int32_t>(n), scratch->DeviceArray<int32_t>(n)};
    if (!sort_keys[0] || !sort_keys[1] || !order[0] || !order[1]) {
      return GpuStatus::OutOfMemory("reorder");
    }
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
        cudaMemcpyAsync(sort_keys[0], keys, sizeof(int64_t) * n, cudaMemcpyDeviceToDevice,
                        stream),
        "reorder");
    LaunchChained(IotaKernel, BlocksFor(n), kThreads, 0, stream, order[0], n);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("reorder");
    // Keys outside the layout (reported above) lose their high bits here; harmless.
    int current = 0;
    TF_SPARSECONV_RETURN_IF_ERROR(SortPairs(stream, scratch, sort_keys, order, n,
                                            BitsFor(layout.num_keys() - 1), &current));
    CheckSlot* duplicates = &device_report->checks[kReorderDuplicates];
    LaunchChained(GatherSortedKernel<T>, BlocksFor(n), kThreads, 0, stream, sort_keys[current], order[current], values,
                  n, sorted_keys, sorted_values, permutation, duplicates);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("reorder");
    LaunchChained(DescribeDuplicateKernel, 1, 1, 0, stream, sorted_keys, permutation, duplicates);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("reorder");
  }
  return ReadReport(stream, scratch, device_report, report);
}

template <typename T>
GpuStatus ToDenseGpu(Stream stream, Scratch* scratch, const KeyLayout& layout,
                     const int64_t* keys, const T* values, int64_t n, bool padded, T* dense,
                     Report* report) {
  Report* device_report = nullptr;
  if (report != nullptr) {  // else the keys were made or checked by the library: no check, no wait
    TF_SPARSECONV_RETURN_IF_ERROR(NewReport(stream, scratch, &device_report));
    TF_SPARSECONV_RETURN_IF_ERROR(CheckSortedKeys(stream, keys, n, layout.num_keys(),
                                                  &device_report->checks[kDenseKeys], padded));
  }
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaMemsetAsync(dense, 0, sizeof(T) * layout.num_keys(), stream), "to_dense");
  if (n > 0) {
    LaunchChained(ScatterKernel<T>, BlocksFor(n), kThreads, 0, stream, layout, keys, values, n, dense);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("to_dense");
  }
  return report == nullptr ? GpuStatus::Ok() : ReadReport(stream, scratch, device_report, report);
}

template <typename T>
GpuStatus GatherDenseGpu(Stream stream, Scratch* scratch, const KeyLayout& layout,
                         const int64_t* keys, int64_t n, bool padded, const T* dense, T* values,
                         Report* report) {
  if (report == nullptr) {  // the keys were checked by the op that took them: no check, no wait
    if (n > 0) {
      LaunchChained(GatherKernel<T>, BlocksFor(n), kThreads, 0, stream, layout, keys, n, dense, values);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("gather_dense");
    }
    return GpuStatus::Ok();
  }
  Report* device_report = nullptr;
  TF_SPARSECONV_RETURN_IF_ERROR(NewReport(stream, scratch, &device_report));
  TF_SPARSECONV_RETURN_IF_ERROR(CheckSortedKeys(stream, keys, n, layout.num_keys(),
                                                &device_report->checks[kDenseKeys], padded));
  if (n > 0) {
    LaunchChained(GatherKernel<T>, BlocksFor(n), kThreads, 0, stream, layout, keys, n, dense, values);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("gather_dense");
  }
  return ReadReport(stream, scratch, device_report, report);
}

template <typename T>
GpuStatus DenseToChannelSparseGpu<T>::Count(Stream stream, Scratch* scratch,
                                            const KeyLayout& layout, const T* dense,
                                            Report* report) {
  layout_ = layout;
  dense_ = dense;
  Report* device_report = nullptr;
  TF_SPARSECONV_RETURN_IF_ERROR(NewReport(stream, scratch, &device_report));
  TF_SPARSECONV_RETURN_IF_ERROR(CountCompaction(stream, scratch, IsNonZero<T>{layout, dense},
                                                layout.num_keys(), &device_report->count,
                                                &compaction_));
  return ReadReport(stream, scratch, device_report, report);
}

template <typename T>
GpuStatus DenseToChannelSparseGpu<T>::Write(Stream stream, int64_t* keys, T* values) const {
  return WriteCompaction(stream, compaction_, IsNonZero<T>{layout_, dense_},
                         WriteNonZero<T>{layout_, dense_, keys, values});
}

#define TF_SPARSECONV_INSTANTIATE(T)                                                         \
  template GpuStatus ValidateGpu<T>(Stream, Scratch*, const KeyLayout&, const int64_t*,     \
                                    const T*, int64_t, bool, Report*);                      \
  template GpuStatus ReorderGpu<T>(Stream, Scratch*, const KeyLayout&, const int64_t*,      \
                                   const T*, int64_t, int64_t*, T*, int64_t*, Report*);     \
  template GpuStatus ToDenseGpu<T>(Stream, Scratch*, const KeyLayout&, const int64_t*,      \
                                   const T*, int64_t, bool, T*, Report*);                   \
  template GpuStatus GatherDenseGpu<T>(Stream, Scratch*, const KeyLayout&, const int64_t*,  \
                                       int64_t, bool, const T*, T*, Report*);               \
  template class DenseToChannelSparseGpu<T>;
TF_SPARSECONV_INSTANTIATE(float)
TF_SPARSECONV_INSTANTIATE(double)
#undef TF_SPARSECONV_INSTANTIATE

}  // namespace gpu
}  // namespace tf_sparseconv

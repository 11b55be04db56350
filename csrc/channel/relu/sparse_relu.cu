// SparseRelu on the GPU: an order-preserving compaction of the entries with value > 0.
// Temporary memory: 16 bytes per 2048 entries (the compaction's tiles).
#include "common/gpu_util.cuh"
#include "channel/relu/sparse_relu_gpu.h"

namespace tf_sparseconv {
namespace gpu {
namespace {

template <typename T>
struct IsPositive {
  const T* values;
  __device__ bool operator()(int64_t i) const { return values[i] > T(0); }
};

template <typename T>
struct WriteKept {
  const int64_t* keys;
  const T* values;
  int64_t* out_keys;
  T* out_values;
  int64_t* kept;
  __device__ void operator()(int64_t i, int64_t rank) const {
    out_keys[rank] = keys[i];
    out_values[rank] = values[i];
    kept[rank] = i;
  }
};

}  // namespace

template <typename T>
GpuStatus SparseReluGpu<T>::Count(Stream stream, Scratch* scratch, const KeyLayout& layout,
                                  const int64_t* keys, const T* values, int64_t n,
                                  Report* report) {
  keys_ = keys;
  values_ = values;
  Report* device_report = nullptr;
  TF_SPARSECONV_RETURN_IF_ERROR(NewReport(stream, scratch, &device_report));
  TF_SPARSECONV_RETURN_IF_ERROR(CheckSortedKeys(stream, keys, n, layout.num_keys(),
                                                &device_report->checks[kReluKeys]));
  TF_SPARSECONV_RETURN_IF_ERROR(CheckNaN(stream, values, n, &device_report->checks[kReluNaN]));
  TF_SPARSECONV_RETURN_IF_ERROR(CountCompaction(stream, scratch, IsPositive<T>{values}, n,
                                                &device_report->count, &compaction_));
  return ReadReport(stream, scratch, device_report, report);
}

template <typename T>
GpuStatus SparseReluGpu<T>::Write(Stream stream, int64_t* out_keys, T* out_values,
                                  int64_t* kept) const {
  return WriteCompaction(stream, compaction_, IsPositive<T>{values_},
                         WriteKept<T>{keys_, values_, out_keys, out_values, kept});
}

template class SparseReluGpu<float>;
template class SparseReluGpu<double>;

}  // namespace gpu
}  // namespace tf_sparseconv

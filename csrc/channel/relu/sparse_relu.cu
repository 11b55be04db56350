// SparseRelu on the GPU: an order-preserving compaction of the entries with value > 0.
// Temporary memory: 16 bytes per 2048 entries (the compaction's tiles).
#include "channel/channel_sparse.cuh"
#include "channel/relu/sparse_relu_gpu.h"

namespace tf_sparseconv {
namespace gpu {
namespace {

// Entries with value > 0 (padding, whose value is 0, is never kept; its key is checked too).
template <typename T>
struct IsPositive {
  const int64_t* keys;
  const T* values;
  __device__ bool operator()(int64_t i) const { return values[i] > T(0) && keys[i] != kPaddingKey; }
};

}  // namespace

template <typename T>
GpuStatus SparseReluGpu<T>::Count(Stream stream, Scratch* scratch, const KeyLayout& layout,
                                  const int64_t* keys, const T* values, int64_t n, bool padded,
                                  Report* report) {
  keys_ = keys;
  values_ = values;
  Report* device_report = nullptr;
  TF_SPARSECONV_RETURN_IF_ERROR(NewEntryReport(stream, scratch, keys, values, n, layout.num_keys(), kReluKeys,
                                               kReluNaN, &device_report, padded));
  TF_SPARSECONV_RETURN_IF_ERROR(CountCompaction(stream, scratch, IsPositive<T>{keys, values}, n,
                                                &device_report->count, &compaction_));
  return ReadReport(stream, scratch, device_report, report);
}

template <typename T>
GpuStatus SparseReluGpu<T>::Write(Stream stream, int64_t* out_keys, T* out_values,
                                  int64_t* kept) const {
  return WriteCompaction(stream, compaction_, IsPositive<T>{keys_, values_},
                         CopyEntries<T>{keys_, values_, out_keys, out_values, kept});
}

template class SparseReluGpu<float>;
template class SparseReluGpu<double>;

}  // namespace gpu
}  // namespace tf_sparseconv

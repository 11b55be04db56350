// SparseRelu on the GPU: an order-preserving compaction of the entries with value > 0.
// Temporary memory: 16 bytes per 2048 entries (the compaction's tiles).
#include "channel/channel_sparse.cuh"
#include "channel/relu/sparse_relu_gpu.h"

namespace tf_sparseconv {
namespace gpu {
namespace {

// Entries with value > 0, and NaN (refused by Count's check where it ran; kept where it did
// not, for the next op's check); padding, whose value is 0, is never kept (its key is
// checked too).
template <typename T>
struct IsPositive {
  const int64_t* keys;
  const T* values;
  __device__ bool operator()(int64_t i) const { return !(values[i] <= T(0)) && keys[i] != kPaddingKey; }
};

// Padding after the live entries, up to capacity: the host's count, or the device's.
template <typename T>
__global__ void PadReluOutputKernel(const int64_t* device_live, int64_t host_live, int64_t capacity,
                                    int64_t* out_keys, T* out_values, int64_t* kept) {
  ChainedKernelBegin();
  const int64_t live = device_live != nullptr ? *device_live : host_live;
  TF_SPARSECONV_GRID_LOOP(j, capacity) {
    if (j < live) continue;
    out_keys[j] = kPaddingKey;
    out_values[j] = T(0);
    kept[j] = j;  // a distinct input position each (j < capacity = the input's length): the
                  // gradient's scatter adds padding's zeros without contending for one address
  }
}

}  // namespace

template <typename T>
GpuStatus SparseReluGpu<T>::Count(Stream stream, Scratch* scratch, const KeyLayout& layout,
                                  const int64_t* keys, const T* values, int64_t n, bool padded,
                                  Report* report) {
  keys_ = keys;
  values_ = values;
  n_ = n;
  Report* device_report = nullptr;
  one_pass_ = report == nullptr;
  if (one_pass_) {  // nothing checked, nothing read back: Write counts and writes in one pass
    TF_SPARSECONV_RETURN_IF_ERROR(NewReport(stream, scratch, &device_report));
    device_count_ = &device_report->count;
    return GpuStatus::Ok();
  }
  TF_SPARSECONV_RETURN_IF_ERROR(NewEntryReport(stream, scratch, keys, values, n, layout.num_keys(), kReluKeys,
                                               kReluNaN, &device_report, padded));
  TF_SPARSECONV_RETURN_IF_ERROR(CountCompaction(stream, scratch, IsPositive<T>{keys, values}, n,
                                                &device_report->count, &compaction_));
  TF_SPARSECONV_RETURN_IF_ERROR(ReadReport(stream, scratch, device_report, report));
  host_count_ = report->count;
  return GpuStatus::Ok();
}

template <typename T>
GpuStatus SparseReluGpu<T>::Write(Stream stream, Scratch* scratch, int64_t* out_keys, T* out_values, int64_t* kept,
                                  int64_t capacity) const {
  const IsPositive<T> positive{keys_, values_};
  const CopyEntries<T> copy{keys_, values_, out_keys, out_values, kept};
  if (one_pass_) {
    TF_SPARSECONV_RETURN_IF_ERROR(Compact(stream, scratch, positive, copy, n_, device_count_));
  } else {
    TF_SPARSECONV_RETURN_IF_ERROR(WriteCompaction(stream, compaction_, positive, copy));
  }
  if (capacity == 0) return GpuStatus::Ok();
  LaunchChained(PadReluOutputKernel<T>, BlocksFor(capacity), kThreads, 0, stream,
                one_pass_ ? device_count_ : static_cast<const int64_t*>(nullptr), host_count_, capacity, out_keys,
                out_values, kept);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("relu padding");
  return GpuStatus::Ok();
}

template class SparseReluGpu<float>;
template class SparseReluGpu<double>;

}  // namespace gpu
}  // namespace tf_sparseconv

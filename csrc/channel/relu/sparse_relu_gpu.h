// The GPU functor of SparseRelu (CUDA-free interface; kernels in sparse_relu.cu).
#ifndef TF_SPARSECONV_CHANNEL_RELU_SPARSE_RELU_GPU_H_
#define TF_SPARSECONV_CHANNEL_RELU_SPARSE_RELU_GPU_H_

#include <cstdint>

#include "common/gpu_common.h"

namespace tf_sparseconv {
namespace gpu {

enum ReluCheck { kReluKeys = 0, kReluNaN = 1 };

template <typename T>
class SparseReluGpu {
 public:
  // Checks keys (kReluKeys) and values (kReluNaN); report->count = entries with value > 0.
  // padded: the keys may end in padding, which is not kept. Blocks until the report is on
  // the host.
  GpuStatus Count(Stream stream, Scratch* scratch, const KeyLayout& layout, const int64_t* keys,
                  const T* values, int64_t n, bool padded, Report* report);
  // Writes the report->count kept entries and their input positions.
  GpuStatus Write(Stream stream, int64_t* out_keys, T* out_values, int64_t* kept) const;

 private:
  const int64_t* keys_ = nullptr;
  const T* values_ = nullptr;
  Compaction compaction_;
};

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_RELU_SPARSE_RELU_GPU_H_

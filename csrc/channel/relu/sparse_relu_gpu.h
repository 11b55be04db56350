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
  // the host. report nullptr: checks nothing and queues nothing; Write counts on the device.
  GpuStatus Count(Stream stream, Scratch* scratch, const KeyLayout& layout, const int64_t* keys,
                  const T* values, int64_t n, bool padded, Report* report);
  // Writes the kept entries (value > 0, or NaN where Count checked nothing) and their input
  // positions; capacity > 0: then padding up to capacity (key kPaddingKey, value 0, kept its
  // own position) after the count, the host's or, where Count read nothing back, the device's.
  GpuStatus Write(Stream stream, Scratch* scratch, int64_t* out_keys, T* out_values, int64_t* kept,
                  int64_t capacity) const;

 private:
  const int64_t* keys_ = nullptr;
  const T* values_ = nullptr;
  int64_t n_ = 0;
  int64_t* device_count_ = nullptr;  // the kept entries, counted on the device
  int64_t host_count_ = 0;           // ... and read back, where Count did
  Compaction compaction_;            // Count's first pass, where Count read the count back
  bool one_pass_ = false;            // Count read nothing back: Write compacts in one pass
};

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_RELU_SPARSE_RELU_GPU_H_

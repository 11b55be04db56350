// The GPU functor of SparseMaxPool (CUDA-free interface; kernels in max_pool.cu).
#ifndef TF_SPARSECONV_CHANNEL_MAX_POOL_MAX_POOL_GPU_H_
#define TF_SPARSECONV_CHANNEL_MAX_POOL_MAX_POOL_GPU_H_

#include <cstdint>

#include "common/gpu_common.h"

namespace tf_sparseconv {
namespace gpu {

enum MaxPoolCheck { kPoolKeys = 0, kPoolNaN = 1 };

struct PoolGeometry {
  KeyLayout in;
  KeyLayout out;
  int32_t strides[kMaxSpatialDims];
};

template <typename T>
class SparseMaxPoolGpu {
 public:
  // Checks keys (kPoolKeys) and values (kPoolNaN), orders the entries by pooled key;
  // report->count = output entries (non-empty windows). Blocks until the report is on
  // the host. n <= kMaxSortItems.
  GpuStatus Count(Stream stream, Scratch* scratch, const PoolGeometry& geometry,
                  const int64_t* keys, const T* values, int64_t n, Report* report);
  // Writes the report->count window maxima and the input position of each.
  GpuStatus Write(Stream stream, int64_t* out_keys, T* out_values, int64_t* argmax) const;

 private:
  const T* values_ = nullptr;
  int64_t n_ = 0;
  const uint64_t* pooled_ = nullptr;  // sorted pooled keys
  const int32_t* order_ = nullptr;    // the entry of each sorted pooled key
  uint64_t no_window_ = 0;            // pooled key of nothing (invalid input)
  Compaction compaction_;
};

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_MAX_POOL_MAX_POOL_GPU_H_

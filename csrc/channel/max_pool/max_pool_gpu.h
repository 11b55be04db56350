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

struct PoolOptions {
  bool check = true;          // queue the data checks
  bool padded_input = false;  // the keys may end in padding (kPaddingKey), which is skipped
  bool read_back = true;      // wait for the report (checks and count) on the host
};

template <typename T>
class SparseMaxPoolGpu {
 public:
  // Checks keys (kPoolKeys) and values (kPoolNaN) where options.check, orders the entries
  // by pooled key; the output entries (non-empty windows) are counted on the device and,
  // where options.read_back, the report with that count is read back (the host waits).
  // n <= kMaxSortItems.
  GpuStatus Count(Stream stream, Scratch* scratch, const PoolGeometry& geometry,
                  const int64_t* keys, const T* values, int64_t n, const PoolOptions& options,
                  Report* report);
  // Writes the window maxima and the input position of each; capacity > 0: then padding up
  // to capacity (key kPaddingKey, value 0, argmax its own position), after the count found on
  // the device (by this call's compaction where Count read nothing back).
  GpuStatus Write(Stream stream, Scratch* scratch, int64_t* out_keys, T* out_values, int64_t* argmax,
                  int64_t capacity) const;

 private:
  const T* values_ = nullptr;
  int64_t n_ = 0;
  const uint64_t* pooled_ = nullptr;  // sorted pooled keys
  const int32_t* order_ = nullptr;    // the entry of each sorted pooled key
  uint64_t no_window_ = 0;            // pooled key of nothing (invalid input, padding)
  int64_t* device_count_ = nullptr;  // the output entries, counted on the device
  Compaction compaction_;            // Count's first pass, where Count read the count back
  bool one_pass_ = false;            // Count read nothing back: Write compacts in one pass
};

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_MAX_POOL_MAX_POOL_GPU_H_

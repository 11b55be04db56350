// What the GPU functors (*.cu) and the GPU OpKernels (*_gpu.cc) share:
// no TensorFlow and no CUDA headers, so each side compiles it with its own compiler.
//
// The protocol of every GPU op: the OpKernel checks shapes and attributes on the host,
// then calls the functor's first phase, which launches the data checks (sorted, unique,
// in-range keys, NaN) and whatever work decides the output size, and ends with the op's
// only host round trip: one copy of a small Report (check results + output count) and
// one stream synchronisation. The OpKernel turns a failed check into the CPU kernel's
// error message, allocates the outputs, and calls the second phase, which only
// enqueues kernels.
#ifndef TF_SPARSECONV_COMMON_GPU_COMMON_H_
#define TF_SPARSECONV_COMMON_GPU_COMMON_H_

#include <cstddef>
#include <cstdint>

#include "common/key_layout.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace tf_sparseconv {
namespace gpu {

using Stream = ::CUstream_st*;

// Memory that lives until the OpKernel's Compute returns. TensorFlow's GPU allocator is
// ordered by the compute stream, so device memory may be released while kernels that
// use it are still queued. Returns nullptr when exhausted; the caller keeps the status.
class Scratch {
 public:
  virtual ~Scratch() = default;
  virtual void* Device(size_t bytes) = 0;
  // Page-locked host memory, for the uploads of host-built tables and the Report.
  virtual void* PinnedHost(size_t bytes) = 0;
  // For a functor that returns without waiting for the device (no Report): keeps the
  // pinned memory handed out so far alive until the work queued on the stream so far
  // has run on the op's stream, since the host allocator, unlike the device one, is not stream-ordered and
  // would hand the memory out again while an upload from it is still queued.
  virtual void HoldPinnedUntilQueuedWorkRuns() = 0;

  template <typename T>
  T* DeviceArray(int64_t count) {
    return static_cast<T*>(Device(sizeof(T) * static_cast<size_t>(count > 0 ? count : 1)));
  }
};

// One data check: the first offending position (kNoError if none) and what the error
// message needs to say about it.
constexpr unsigned long long kNoError = ~0ull;
struct CheckSlot {
  unsigned long long first;  // the type of CUDA's 64-bit atomicMin
  int64_t detail[3];
};

constexpr int kMaxChecks = 5;
struct Report {
  CheckSlot checks[kMaxChecks];
  int64_t count;  // the data-dependent output size, where the op has one
};

inline bool Failed(const CheckSlot& slot) { return slot.first != kNoError; }

// A CUDA failure (an error code's text) or an exhausted Scratch.
struct GpuStatus {
  const char* where = nullptr;  // nullptr: success
  const char* what = nullptr;
  bool out_of_memory = false;
  bool ok() const { return where == nullptr; }
  static GpuStatus Ok() { return GpuStatus(); }
  static GpuStatus OutOfMemory(const char* where) { return GpuStatus{where, "out of memory", true}; }
};

// The state of an order-preserving stream compaction (gpu_util.cuh) between its count
// pass, before the host round trip, and its write pass into the op's outputs.
struct Compaction {
  int64_t n = 0;
  int64_t num_tiles = 0;
  int64_t* tile_counts = nullptr;
  int64_t* tile_offsets = nullptr;
};

// The GPU kernels index sorts with int (CUB's item count) and segments with uint32.
constexpr int64_t kMaxSortItems = 2147483647;        // 2^31 - 1
constexpr int64_t kMaxSegments = 4294967294LL;       // 2^32 - 2

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_COMMON_GPU_COMMON_H_

// The channel-sparse tensor's checks on the GPU (common/gpu_util.cuh's CheckSortedKeys,
// CheckKeysInRange and CheckNaN) turned into the messages of ValidateKeys, CheckKeysInLayout
// and RejectNaN (channel_sparse.h), so both devices say the same thing, and what every GPU
// functor of the family holds. Only in builds with -DGOOGLE_CUDA=1.
#ifndef TF_SPARSECONV_CHANNEL_CHANNEL_SPARSE_GPU_H_
#define TF_SPARSECONV_CHANNEL_CHANNEL_SPARSE_GPU_H_

#if GOOGLE_CUDA

#include <cstdint>

#include "absl/status/status.h"
#include "channel/channel_sparse.h"
#include "common/gpu_common.h"
#include "common/gpu_kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_sparseconv {

// The messages of ValidateKeys and RejectNaN for a failed check.
inline absl::Status SortedKeysStatus(const gpu::CheckSlot& slot, int64_t limit,
                                     const char* what) {
  if (!gpu::Failed(slot)) return absl::OkStatus();
  return InvalidKeyError(what, static_cast<int64_t>(slot.first), slot.detail[0], slot.detail[1],
                         limit);
}

inline absl::Status NaNStatus(const gpu::CheckSlot& slot, const char* what) {
  if (!gpu::Failed(slot)) return absl::OkStatus();
  return NaNError(what, static_cast<int64_t>(slot.first));
}

// The checks of NewEntryReport (channel_sparse.cuh): the keys' (named keys_what), then the
// values' (values_what).
inline absl::Status EntryReportStatus(const gpu::Report& report, int keys_check, int nan_check, int64_t limit,
                                      const char* keys_what, const char* values_what) {
  TF_RETURN_IF_ERROR(SortedKeysStatus(report.checks[keys_check], limit, keys_what));
  return NaNStatus(report.checks[nan_check], values_what);
}

// The message of CheckKeysInLayout for a failed CheckKeysInRange.
inline absl::Status KeysInLayoutStatus(const gpu::CheckSlot& slot, int64_t limit) {
  if (!gpu::Failed(slot)) return absl::OkStatus();
  return KeyOutOfRangeError(static_cast<int64_t>(slot.first), slot.detail[0], limit);
}

// The TensorFlow side of an op's GPU functor (the Op<GPUDevice, T> specialisations): the
// op's temporary memory, which lives until Compute returns, its stream, and a failed
// gpu::GpuStatus as the op's error.
class GpuFunctorBase {
 protected:
  GpuFunctorBase(tensorflow::OpKernelContext* ctx, const char* op)
      : scratch_(ctx), stream_(GpuStream(ctx)), op_(op) {}

  absl::Status ToStatus(const gpu::GpuStatus& status) const {
    return ::tf_sparseconv::ToStatus(status, scratch_, op_);
  }

  TempScratch scratch_;
  const gpu::Stream stream_;
  const char* const op_;
};

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA
#endif  // TF_SPARSECONV_CHANNEL_CHANNEL_SPARSE_GPU_H_

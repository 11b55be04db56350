// The TensorFlow side of the GPU functors' protocol (gpu_common.h): temporary
// memory from the op's allocator, the compute stream, and a failed GpuStatus as a
// TensorFlow error (each family turns its failed checks into the CPU kernels' messages:
// channel/channel_sparse_gpu.h, site/*/*_checks.h). Only in builds with -DGOOGLE_CUDA=1.
#ifndef TF_SPARSECONV_COMMON_GPU_KERNEL_UTIL_H_
#define TF_SPARSECONV_COMMON_GPU_KERNEL_UTIL_H_

#if GOOGLE_CUDA

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/gpu_common.h"
#include "tensorflow/core/common_runtime/device/device_event_mgr.h"
#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/errors.h"
#include "xla/stream_executor/stream.h"

namespace tf_sparseconv {

// Temporaries from allocate_temp: TensorFlow's allocators (counted by
// tf.config.experimental.get_memory_info), released when Compute returns.
class TempScratch : public gpu::Scratch {
 public:
  explicit TempScratch(tensorflow::OpKernelContext* ctx) : ctx_(ctx) {}

  void* Device(size_t bytes) override { return Allocate(bytes, tensorflow::AllocatorAttributes()); }

  void* PinnedHost(size_t bytes) override {
    tensorflow::AllocatorAttributes attr;
    attr.set_on_host(true);
    attr.set_gpu_compatible(true);
    void* host = Allocate(bytes, attr);
    if (host != nullptr) pinned_.push_back(temps_.back());
    return host;
  }

  // TensorFlow's own pattern for uploads that are not waited for (GpuDeviceArrayOnHost):
  // the EventMgr drops the last references once the stream has passed this point.
  void HoldPinnedUntilQueuedWorkRuns() override {
    if (pinned_.empty()) return;
    std::vector<tensorflow::Tensor> held;
    held.swap(pinned_);
    ctx_->device()->tensorflow_accelerator_device_info()->event_mgr->ThenExecute(
        ctx_->op_device_context()->stream(), [held]() {});
  }

  // The allocator's error (ResourceExhausted) once an allocation failed.
  const absl::Status& status() const { return status_; }

 private:
  void* Allocate(size_t bytes, tensorflow::AllocatorAttributes attr) {
    if (!status_.ok()) return nullptr;
    tensorflow::Tensor temp;
    const int64_t size = static_cast<int64_t>(std::max<size_t>(bytes, 1));
    status_ = ctx_->allocate_temp(tensorflow::DT_UINT8, tensorflow::TensorShape({size}), &temp,
                                  attr);
    if (!status_.ok()) return nullptr;
    temps_.push_back(temp);
    return temp.data();
  }

  tensorflow::OpKernelContext* ctx_;
  absl::Status status_;
  std::vector<tensorflow::Tensor> temps_;
  std::vector<tensorflow::Tensor> pinned_;  // not yet held past the queued work
};

inline gpu::Stream GpuStream(tensorflow::OpKernelContext* ctx) {
  return reinterpret_cast<gpu::Stream>(
      ctx->op_device_context()->stream()->platform_specific_handle().stream);
}

inline absl::Status ToStatus(const gpu::GpuStatus& status, const TempScratch& scratch,
                             const char* op) {
  if (status.ok()) return absl::OkStatus();
  if (!scratch.status().ok()) return scratch.status();
  if (status.out_of_memory) {
    return tensorflow::errors::ResourceExhausted(op, " on GPU: out of memory (", status.where, ")");
  }
  return tensorflow::errors::Internal(op, " on GPU: ", status.where, ": ", status.what);
}

// What a GPU functor (an Op<GPUDevice, T>'s, site/*/*_kernels_gpu.cc) holds of its op: the
// temporary memory, which lives until Compute returns, the op's stream, and a failed
// gpu::GpuStatus as the op's error.
class GpuOpContext {
 protected:
  GpuOpContext(tensorflow::OpKernelContext* ctx, const char* op) : scratch_(ctx), stream_(GpuStream(ctx)), op_(op) {}

  absl::Status ToStatus(const gpu::GpuStatus& status) const {
    return ::tf_sparseconv::ToStatus(status, scratch_, op_);
  }

  TempScratch scratch_;
  const gpu::Stream stream_;
  const char* const op_;
};

// The GPU sorts count items with int.
inline absl::Status CheckSortable(int64_t items, const char* op, const char* what) {
  if (items > gpu::kMaxSortItems) {
    return tensorflow::errors::ResourceExhausted(
        op, " on GPU sorts at most 2^31 - 1 ", what, ", this input needs ", items,
        "; split the batch or run the op on the CPU");
  }
  return absl::OkStatus();
}

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA
#endif  // TF_SPARSECONV_COMMON_GPU_KERNEL_UTIL_H_

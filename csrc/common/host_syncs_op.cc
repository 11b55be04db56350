// HostSyncCount: how many times this library's ops have made the host wait for the GPU
// (host_syncs.h), as a stateful op so that graphs read it where it stands.
#include <atomic>
#include <cstdint>
#include <string>

#include "common/guarded_op_kernel.h"
#include "common/host_syncs.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"

namespace tf_sparseconv {

namespace {
std::atomic<int64_t> host_syncs{0};
std::atomic<int64_t> deferred_read_backs{0};
}  // namespace

void CountHostSync() { host_syncs.fetch_add(1, std::memory_order_relaxed); }

int64_t HostSyncCount() { return host_syncs.load(std::memory_order_relaxed); }

void CountDeferredReadBack() { deferred_read_backs.fetch_add(1, std::memory_order_relaxed); }

int64_t DeferredReadBackCount() { return deferred_read_backs.load(std::memory_order_relaxed); }

REGISTER_OP("TfSparseconv>HostSyncCount")
    .Output("count: int64")
    .Attr("what: {'waits', 'deferred'} = 'waits'")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
The number of times the library's GPU kernels have made the host wait for their stream
(to read an output size or a check's result back) since the library was loaded
(what='waits'), or the read-backs its asynchronous GPU kernels queued without waiting
(what='deferred': the outputs are allocated in a callback once the GPU has passed the
copy, and no thread blocks). CPU kernels do neither and leave both unchanged.
)doc");

class HostSyncCountOp : public GuardedOpKernel {
 public:
  explicit HostSyncCountOp(tensorflow::OpKernelConstruction* ctx) : GuardedOpKernel(ctx, "host_sync_count") {
    std::string what;
    if (AttrsOk(ctx->GetAttr("what", &what))) deferred_ = what == "deferred";
  }

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    tensorflow::Tensor* count;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({}), &count));
    count->scalar<int64_t>()() = deferred_ ? DeferredReadBackCount() : HostSyncCount();
  }

  bool deferred_ = false;
};

REGISTER_KERNEL_BUILDER(Name("TfSparseconv>HostSyncCount").Device(::tensorflow::DEVICE_CPU), HostSyncCountOp);

}  // namespace tf_sparseconv

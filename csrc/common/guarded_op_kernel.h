// The base of the library's OpKernels, for two guarantees TensorFlow's OpKernel does not give:
//  - No C++ exception leaves Compute: a host allocation that fails (a std::vector sized by
//    the data) becomes ResourceExhausted instead of terminating the process. The sizes
//    computed from the inputs are checked before this is reached; this covers what no check
//    can rule out, a machine short of memory.
//  - Attributes the kernel refuses are reported by Compute, not by the constructor.
//    TensorFlow 2.21's eager runtime, after the constructor of a GPU kernel failed, ran the
//    next call of the op with the failed call's host-memory inputs (SiteKernelMap then read
//    the refused call's spatial_shape); a kernel that always constructs avoids that path.
// Each Compute is also an event ("node:Type") in a profiler trace at the default host level:
// TensorFlow records a GPU op's host work only at level 3, and then without its name.
#ifndef TF_SPARSECONV_COMMON_GUARDED_OP_KERNEL_H_
#define TF_SPARSECONV_COMMON_GUARDED_OP_KERNEL_H_

#include <new>
#include <stdexcept>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/errors.h"
#include "tsl/profiler/lib/traceme.h"
#include "tsl/profiler/lib/traceme_encode.h"

namespace tf_sparseconv {

// fn() (returning absl::Status) with the guarantee above: a failed host allocation is
// ResourceExhausted, for work outside a GuardedOpKernel's Compute (an AsyncOpKernel's
// callbacks).
template <typename Fn>
absl::Status RunGuarded(const char* op, Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return tensorflow::errors::ResourceExhausted(op, ": out of host memory for its working tables");
  } catch (const std::length_error&) {
    return tensorflow::errors::ResourceExhausted(op, ": a working table would exceed the largest size");
  }
}

class GuardedOpKernel : public tensorflow::OpKernel {
 public:
  // `op` names the op in the errors of failed allocations.
  GuardedOpKernel(tensorflow::OpKernelConstruction* ctx, const char* op) : OpKernel(ctx), op_(op) {}

  void Compute(tensorflow::OpKernelContext* ctx) final {
    tsl::profiler::TraceMe trace([this] { return tsl::profiler::TraceMeOp(name_view(), type_string_view()); },
                                 kTraceLevel);
    OP_REQUIRES_OK(ctx, attrs_status_);
    const absl::Status status = RunGuarded(op_, [&]() -> absl::Status {
      ComputeGuarded(ctx);  // its own failures are set on ctx
      return absl::OkStatus();
    });
    if (!status.ok()) ctx->CtxFailure(status);
  }

 protected:
  // The profiler's default host level (tsl::profiler::TraceMeLevel::kInfo): the op's phases
  // are traced at it too (TraceMe(name, kTraceLevel)), free while no profiler runs.
  static constexpr int kTraceLevel = 2;

  // The op's work (it may use OP_REQUIRES, returning from it).
  virtual void ComputeGuarded(tensorflow::OpKernelContext* ctx) = 0;

  // For constructors: keeps the first failed status of reading or checking the attributes
  // for Compute to report; false once one failed (the constructor then stops).
  bool AttrsOk(const absl::Status& status) {
    if (attrs_status_.ok()) attrs_status_ = status;
    return attrs_status_.ok();
  }

 private:
  const char* const op_;
  absl::Status attrs_status_;
};

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_COMMON_GUARDED_OP_KERNEL_H_

// The OpKernel of DirectSparseConvCheckStatus (registered for the CPU in direct_conv_kernels.cc,
// for the GPU in direct_conv_kernels_gpu.cc): the statuses arrive in host memory on both
// devices, so one host-side check serves both; `data` passes through on its own device.
#ifndef TF_SPARSECONV_CHANNEL_DIRECT_CONV_CHECK_STATUS_KERNEL_H_
#define TF_SPARSECONV_CHANNEL_DIRECT_CONV_CHECK_STATUS_KERNEL_H_

#include <string>
#include <vector>

#include "channel/direct_conv/direct_conv_checks.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_sparseconv {

class DirectSparseConvCheckStatusOp : public tensorflow::OpKernel {
 public:
  explicit DirectSparseConvCheckStatusOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sources", &sources_));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    namespace errors = ::tensorflow::errors;
    tensorflow::OpInputList statuses;
    OP_REQUIRES_OK(ctx, ctx->input_list("statuses", &statuses));
    OP_REQUIRES(ctx, static_cast<size_t>(statuses.size()) == sources_.size(),
                errors::InvalidArgument("DirectSparseConvCheckStatus: ", statuses.size(), " statuses but ",
                                        sources_.size(), " sources"));
    for (int i = 0; i < statuses.size(); ++i) {
      const tensorflow::Tensor& status = statuses[i];
      OP_REQUIRES(ctx, status.dims() == 1 && status.NumElements() == kConvStatusSize,
                  errors::InvalidArgument("DirectSparseConvCheckStatus: status ", i, " must have shape [",
                                          kConvStatusSize, "], got ", status.shape().DebugString()));
      const absl::Status failed = ConvStatusError(status.flat<int64_t>().data());
      OP_REQUIRES(ctx, failed.ok(), errors::InvalidArgument(sources_[i], ": ", failed.message()));
    }
    ctx->set_output(0, ctx->input(0));
  }

 private:
  std::vector<std::string> sources_;
};

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_DIRECT_CONV_CHECK_STATUS_KERNEL_H_

// The OpKernels that read the padded convolutions' deferred data checks (their `status`
// outputs): DirectSparseConvCheckStatus (registered for the CPU in direct_conv_kernels.cc, for
// the GPU in direct_conv_kernels_gpu.cc; the statuses arrive in host memory on both devices,
// so one host-side check serves both; `data` passes through on its own device), and the CPU
// kernel of DirectSparseConvReportStatus (its GPU kernel reads them back asynchronously,
// direct_conv_kernels_gpu.cc).
#ifndef TF_SPARSECONV_CHANNEL_DIRECT_CONV_CHECK_STATUS_KERNEL_H_
#define TF_SPARSECONV_CHANNEL_DIRECT_CONV_CHECK_STATUS_KERNEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "channel/direct_conv/direct_conv_checks.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_sparseconv {

// The statuses' shapes and the first failed check among them, named by its source.
inline absl::Status StatusesError(const tensorflow::OpInputList& statuses, const std::vector<std::string>& sources,
                                  const char* op, const int64_t* host_values) {
  namespace errors = ::tensorflow::errors;
  if (static_cast<size_t>(statuses.size()) != sources.size()) {
    return errors::InvalidArgument(op, ": ", statuses.size(), " statuses but ", sources.size(), " sources");
  }
  for (int i = 0; i < statuses.size(); ++i) {
    const tensorflow::Tensor& status = statuses[i];
    if (status.dims() != 1 || status.NumElements() != kConvStatusSize) {
      return errors::InvalidArgument(op, ": status ", i, " must have shape [", kConvStatusSize, "], got ",
                                     status.shape().DebugString());
    }
  }
  if (host_values == nullptr) return absl::OkStatus();  // the shapes alone
  for (int i = 0; i < statuses.size(); ++i) {
    const absl::Status failed = ConvStatusError(host_values + i * kConvStatusSize);
    if (!failed.ok()) return errors::InvalidArgument(sources[i], ": ", failed.message());
  }
  return absl::OkStatus();
}

// The statuses of a host-memory input list, one after another.
inline std::vector<int64_t> HostStatusValues(const tensorflow::OpInputList& statuses) {
  std::vector<int64_t> values;
  for (int i = 0; i < statuses.size(); ++i) {
    const auto flat = statuses[i].flat<int64_t>();
    values.insert(values.end(), flat.data(), flat.data() + flat.size());
  }
  return values;
}

// DirectSparseConvCheckStatus (data passed through once the statuses passed) and, on the
// CPU, DirectSparseConvReportStatus (no output): statuses in host memory, checked at once.
class HostStatusesOp : public tensorflow::OpKernel {
 public:
  explicit HostStatusesOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sources", &sources_));
    const std::string& type = type_string();
    op_ = type.substr(type.find('>') + 1);  // the name without the namespace
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    tensorflow::OpInputList statuses;
    OP_REQUIRES_OK(ctx, ctx->input_list("statuses", &statuses));
    OP_REQUIRES_OK(ctx, StatusesError(statuses, sources_, op_.c_str(), nullptr));
    OP_REQUIRES_OK(ctx, StatusesError(statuses, sources_, op_.c_str(), HostStatusValues(statuses).data()));
    if (num_outputs() > 0) ctx->set_output(0, ctx->input(0));
  }

 private:
  std::vector<std::string> sources_;
  std::string op_;
};

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_DIRECT_CONV_CHECK_STATUS_KERNEL_H_

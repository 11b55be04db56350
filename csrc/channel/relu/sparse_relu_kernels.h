// The sparse ReLU's OpKernel, one template for both devices: the shape checks and the
// allocation here, the data checks and the arithmetic in SparseReluFunctor<Device, T>
// (CPU: sparse_relu_kernels.cc; GPU: sparse_relu_kernels_gpu.cc over sparse_relu.cu).
#ifndef TF_SPARSECONV_CHANNEL_RELU_SPARSE_RELU_KERNELS_H_
#define TF_SPARSECONV_CHANNEL_RELU_SPARSE_RELU_KERNELS_H_

#include <cstdint>

#include "channel/channel_sparse.h"
#include "common/device.h"
#include "common/guarded_op_kernel.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_sparseconv {

// The functor's contract, specialised per device:
//   explicit SparseReluFunctor(OpKernelContext* ctx);
//   absl::Status Count(const KeyLayout& layout, const int64_t* keys, const T* values,
//                      int64_t n, bool padded, bool no_wait, int64_t* count);
//     (padded, the op's padded_input: the GPU's checks accept a padded tail and its count
//     skips it; the CPU gets the live prefix.)
//     The data checks, keys sorted, unique and in range ("relu input", ValidateKeys) and
//     values free of NaN ("relu input values", RejectNaN), then *count = the entries with
//     value > 0. The CPU checks on the host; the GPU on the device, its results read back
//     with the count in the op's one host round trip and turned into the same messages
//     (channel_sparse_gpu.h). no_wait (padded_output with inputs_checked): the GPU checks
//     nothing and reads nothing back (*count = kReluCountOnDevice); the CPU ignores it.
//   absl::Status Write(int64_t* out_keys, T* out_values, int64_t* kept, int64_t capacity);
//     The *count kept entries in key order and the input position of each; capacity > 0
//     (padded_output): then padding up to capacity (key kPaddingKey, value 0, kept its own
//     position), after the count Count found (on the device where it read nothing back).
template <typename Device, typename T>
class SparseReluFunctor;

constexpr int64_t kReluCountOnDevice = -1;

template <typename Device, typename T>
class SparseReluOp : public GuardedOpKernel {
 public:
  explicit SparseReluOp(tensorflow::OpKernelConstruction* ctx) : GuardedOpKernel(ctx, "sparse_relu") {
    AttrsOk(ctx->GetAttr("padded_input", &padded_));
    AttrsOk(ctx->GetAttr("padded_output", &padded_output_));
    AttrsOk(ctx->GetAttr("inputs_checked", &inputs_checked_));
  }

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    using ::tensorflow::Tensor;
    using ::tensorflow::TensorShape;
    const Tensor& keys = ctx->input(0);
    const Tensor& values = ctx->input(1);
    KeyLayout L;
    OP_REQUIRES_OK(ctx, CheckSparseTensor(keys, values, ctx->input(2), "relu input", &L));
    const int64_t length = keys.NumElements();
    int64_t n = length;
    OP_REQUIRES_OK(ctx, (EntriesToRead<Device, T>(keys.flat<int64_t>().data(), values.flat<T>().data(), n, padded_,
                                                  L, "relu input", "relu input values", &n)));
    SparseReluFunctor<Device, T> relu(ctx);
    int64_t m = 0;
    OP_REQUIRES_OK(ctx, relu.Count(L, keys.flat<int64_t>().data(), values.flat<T>().data(), n, padded_,
                                   padded_output_ && inputs_checked_, &m));
    // A padded output has the input's length (padding included): the planner's bound.
    const int64_t size = padded_output_ ? length : m;
    Tensor *out_keys, *out_values, *kept;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({size}), &out_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({size}), &out_values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({size}), &kept));
    OP_REQUIRES_OK(ctx, relu.Write(out_keys->flat<int64_t>().data(), out_values->flat<T>().data(),
                                   kept->flat<int64_t>().data(), padded_output_ ? size : 0));
  }

  bool padded_ = false;
  bool padded_output_ = false;
  bool inputs_checked_ = false;
};

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_RELU_SPARSE_RELU_KERNELS_H_

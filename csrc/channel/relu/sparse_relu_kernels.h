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
//                      int64_t n, bool padded, int64_t* count);
//     (padded, the op's padded_input: the GPU's checks accept a padded tail and its count
//     skips it; the CPU gets the live prefix.)
//     The data checks, keys sorted, unique and in range ("relu input", ValidateKeys) and
//     values free of NaN ("relu input values", RejectNaN), then *count = the entries with
//     value > 0. The CPU checks on the host; the GPU on the device, its results read back
//     with the count in the op's one host round trip and turned into the same messages
//     (channel_sparse_gpu.h).
//   absl::Status Write(int64_t* out_keys, T* out_values, int64_t* kept);
//     The *count kept entries in key order and the input position of each.
template <typename Device, typename T>
class SparseReluFunctor;

template <typename Device, typename T>
class SparseReluOp : public GuardedOpKernel {
 public:
  explicit SparseReluOp(tensorflow::OpKernelConstruction* ctx) : GuardedOpKernel(ctx, "sparse_relu") {
    AttrsOk(ctx->GetAttr("padded_input", &padded_));
  }

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    using ::tensorflow::Tensor;
    using ::tensorflow::TensorShape;
    const Tensor& keys = ctx->input(0);
    const Tensor& values = ctx->input(1);
    KeyLayout L;
    OP_REQUIRES_OK(ctx, CheckSparseTensor(keys, values, ctx->input(2), "relu input", &L));
    int64_t n = keys.NumElements();
    OP_REQUIRES_OK(ctx, (EntriesToRead<Device, T>(keys.flat<int64_t>().data(), values.flat<T>().data(), n, padded_,
                                                  L, "relu input", "relu input values", &n)));
    SparseReluFunctor<Device, T> relu(ctx);
    int64_t m = 0;
    OP_REQUIRES_OK(ctx, relu.Count(L, keys.flat<int64_t>().data(), values.flat<T>().data(), n, padded_, &m));
    Tensor *out_keys, *out_values, *kept;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m}), &out_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({m}), &out_values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({m}), &kept));
    OP_REQUIRES_OK(ctx, relu.Write(out_keys->flat<int64_t>().data(), out_values->flat<T>().data(),
                                   kept->flat<int64_t>().data()));
  }

  bool padded_ = false;
};

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_RELU_SPARSE_RELU_KERNELS_H_

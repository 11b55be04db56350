// CPU kernel of the sparse ReLU.
#include "channel/channel_sparse.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_sparseconv {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

template <typename T>
class SparseReluOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    const Tensor& values = ctx->input(1);
    KeyLayout L;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(2), &L));
    OP_REQUIRES_OK(ctx, ValidateKeysTensor(keys, L, "relu input"));
    OP_REQUIRES_OK(ctx, ValidateValuesMatchKeys(keys, values, "relu input"));
    const int64_t n = keys.NumElements();
    const T* v = values.flat<T>().data();
    OP_REQUIRES_OK(ctx, RejectNaN(v, n, "relu input values"));
    int64_t m = 0;
    for (int64_t i = 0; i < n; ++i) m += v[i] > T(0);
    Tensor *out_keys, *out_values, *kept;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m}), &out_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({m}), &out_values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({m}), &kept));
    const int64_t* k = keys.flat<int64_t>().data();
    int64_t* ok = out_keys->flat<int64_t>().data();
    T* ov = out_values->flat<T>().data();
    int64_t* kp = kept->flat<int64_t>().data();
    for (int64_t i = 0, j = 0; i < n; ++i) {
      if (!(v[i] > T(0))) continue;
      ok[j] = k[i];
      ov[j] = v[i];
      kp[j++] = i;
    }
  }
};

REGISTER_KERNEL_BUILDER(
    Name("SparseRelu").Device(::tensorflow::DEVICE_CPU).TypeConstraint<float>("T"),
    SparseReluOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("SparseRelu").Device(::tensorflow::DEVICE_CPU).TypeConstraint<double>("T"),
    SparseReluOp<double>);

}  // namespace tf_sparseconv

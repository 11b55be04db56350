// GPU kernel of the sparse ReLU: checks and allocation here, arithmetic in
// sparse_relu.cu.
#if GOOGLE_CUDA

#include "channel/channel_sparse.h"
#include "channel/channel_sparse_gpu.h"
#include "channel/relu/sparse_relu_gpu.h"
#include "common/gpu_kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_sparseconv {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

template <typename T>
class SparseReluGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    const Tensor& values = ctx->input(1);
    KeyLayout L;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(2), &L));
    OP_REQUIRES_OK(ctx, CheckKeysVector(keys, "relu input"));
    OP_REQUIRES_OK(ctx, ValidateValuesMatchKeys(keys, values, "relu input"));
    TempScratch scratch(ctx);
    gpu::SparseReluGpu<T> relu;
    gpu::Report report;
    OP_REQUIRES_OK(ctx, ToStatus(relu.Count(GpuStream(ctx), &scratch, L,
                                            keys.flat<int64_t>().data(), values.flat<T>().data(),
                                            keys.NumElements(), &report),
                                 scratch, "SparseRelu"));
    OP_REQUIRES_OK(ctx, SortedKeysStatus(report.checks[gpu::kReluKeys], L.num_keys(),
                                         "relu input"));
    OP_REQUIRES_OK(ctx, NaNStatus(report.checks[gpu::kReluNaN], "relu input values"));
    Tensor *out_keys, *out_values, *kept;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({report.count}), &out_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({report.count}), &out_values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({report.count}), &kept));
    OP_REQUIRES_OK(ctx, ToStatus(relu.Write(GpuStream(ctx), out_keys->flat<int64_t>().data(),
                                            out_values->flat<T>().data(),
                                            kept->flat<int64_t>().data()),
                                 scratch, "SparseRelu"));
  }
};

#define REGISTER_GPU(T)                                        \
  REGISTER_KERNEL_BUILDER(Name("SparseRelu")                   \
                              .Device(::tensorflow::DEVICE_GPU) \
                              .TypeConstraint<T>("T")          \
                              .HostMemory("dense_shape"),      \
                          SparseReluGpuOp<T>);
REGISTER_GPU(float);
REGISTER_GPU(double);
#undef REGISTER_GPU

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA

// GPU kernel of the sparse max-pooling op: checks and allocation here, arithmetic in
// max_pool.cu.
#if GOOGLE_CUDA

#include <vector>

#include "channel/channel_sparse.h"
#include "channel/channel_sparse_gpu.h"
#include "channel/max_pool/max_pool.h"
#include "channel/max_pool/max_pool_gpu.h"
#include "common/gpu_kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_sparseconv {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

template <typename T>
class SparseMaxPoolGpuOp : public OpKernel {
 public:
  explicit SparseMaxPoolGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("strides", &strides_));
    OP_REQUIRES_OK(ctx, CheckStridesAttr(strides_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    const Tensor& values = ctx->input(1);
    gpu::PoolGeometry g;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(2), &g.in));
    OP_REQUIRES_OK(ctx, CheckStridesMatch(strides_, g.in));
    OP_REQUIRES_OK(ctx, CheckKeysVector(keys, "max_pool input"));
    OP_REQUIRES_OK(ctx, ValidateValuesMatchKeys(keys, values, "max_pool input"));
    std::vector<int64_t> out_dims;
    OP_REQUIRES_OK(ctx, PooledLayout(g.in, strides_, &out_dims, &g.out));
    for (int j = 0; j < g.in.d; ++j) g.strides[j] = strides_[j];
    const int64_t n = keys.NumElements();
    OP_REQUIRES_OK(ctx, CheckSortable(n, "SparseMaxPool", "entries"));

    TempScratch scratch(ctx);
    gpu::SparseMaxPoolGpu<T> pool;
    gpu::Report report;
    OP_REQUIRES_OK(ctx, ToStatus(pool.Count(GpuStream(ctx), &scratch, g,
                                            keys.flat<int64_t>().data(), values.flat<T>().data(),
                                            n, &report),
                                 scratch, "SparseMaxPool"));
    OP_REQUIRES_OK(ctx, SortedKeysStatus(report.checks[gpu::kPoolKeys], g.in.num_keys(),
                                         "max_pool input"));
    OP_REQUIRES_OK(ctx, NaNStatus(report.checks[gpu::kPoolNaN], "max_pool input values"));
    const int64_t m = report.count;
    Tensor *out_keys, *out_values, *out_shape, *argmax;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m}), &out_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({m}), &out_values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({g.in.d + 2}), &out_shape));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({m}), &argmax));
    for (int j = 0; j < g.in.d + 2; ++j) out_shape->flat<int64_t>()(j) = out_dims[j];
    OP_REQUIRES_OK(ctx, ToStatus(pool.Write(GpuStream(ctx), out_keys->flat<int64_t>().data(),
                                            out_values->flat<T>().data(),
                                            argmax->flat<int64_t>().data()),
                                 scratch, "SparseMaxPool"));
  }

 private:
  std::vector<int32_t> strides_;
};

#define REGISTER_GPU(T)                                          \
  REGISTER_KERNEL_BUILDER(Name("SparseMaxPool")                  \
                              .Device(::tensorflow::DEVICE_GPU)  \
                              .TypeConstraint<T>("T")            \
                              .HostMemory("dense_shape")         \
                              .HostMemory("out_dense_shape"),    \
                          SparseMaxPoolGpuOp<T>);
REGISTER_GPU(float);
REGISTER_GPU(double);
#undef REGISTER_GPU

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA

// The GPU functors of RowBatchNorm, RowBatchNormGrad, RowScaleShift and RowNormalize, over
// row_batch_norm.cu, and the GPU registration of their OpKernels
// (row_batch_norm_kernels.h). They queue the kernels and return without waiting.
#if GOOGLE_CUDA

#include <cstdint>

#include "common/gpu_kernel_util.h"
#include "site/batch_norm/row_batch_norm_gpu.h"
#include "site/batch_norm/row_batch_norm_kernels.h"
#include "site/conv/site_gpu_storage.h"
#include "tensorflow/core/framework/bfloat16.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_sparseconv {

namespace {

class RowBatchNormGpuContext : public GpuOpContext {
 public:
  RowBatchNormGpuContext(tensorflow::OpKernelContext* ctx, const char* op) : GpuOpContext(ctx, op) {}
  using GpuOpContext::ToStatus;
  gpu::Scratch* scratch() { return &scratch_; }
  gpu::Stream stream() const { return stream_; }
};

}  // namespace

template <typename T>
struct RowBatchNormFunctor<GPUDevice, T> {
  absl::Status operator()(tensorflow::OpKernelContext* ctx, const RowBatchNormArgs<T>& a) {
    RowBatchNormGpuContext g(ctx, "RowBatchNorm");
    RowBatchNormArgs<typename GpuStorage<T>::type> s;
    s.x = Stored(a.x);
    s.gamma = a.gamma;
    s.beta = a.beta;
    s.n = a.n;
    s.c = a.c;
    s.epsilon = a.epsilon;
    s.y = Stored(a.y);
    s.mean = a.mean;
    s.variance = a.variance;
    s.inv_std = a.inv_std;
    return g.ToStatus(gpu::RowBatchNorm(s, g.scratch(), g.stream()));
  }
};

template <typename T>
struct RowBatchNormGradFunctor<GPUDevice, T> {
  absl::Status operator()(tensorflow::OpKernelContext* ctx, const RowBatchNormGradArgs<T>& a) {
    RowBatchNormGpuContext g(ctx, "RowBatchNormGrad");
    RowBatchNormGradArgs<typename GpuStorage<T>::type> s;
    s.dy = Stored(a.dy);
    s.x = Stored(a.x);
    s.gamma = a.gamma;
    s.mean = a.mean;
    s.inv_std = a.inv_std;
    s.n = a.n;
    s.c = a.c;
    s.dx = Stored(a.dx);
    s.dgamma = a.dgamma;
    s.dbeta = a.dbeta;
    return g.ToStatus(gpu::RowBatchNormGrad(s, g.scratch(), g.stream()));
  }
};

template <typename T>
struct RowScaleShiftFunctor<GPUDevice, T> {
  absl::Status operator()(tensorflow::OpKernelContext* ctx, const RowScaleShiftArgs<T>& a) {
    RowBatchNormGpuContext g(ctx, "RowScaleShift");
    RowScaleShiftArgs<typename GpuStorage<T>::type> s;
    s.x = Stored(a.x);
    s.scale = a.scale;
    s.shift = a.shift;
    s.n = a.n;
    s.c = a.c;
    s.y = Stored(a.y);
    return g.ToStatus(gpu::RowScaleShift(s, g.stream()));
  }
};

template <typename T>
struct RowNormalizeFunctor<GPUDevice, T> {
  absl::Status operator()(tensorflow::OpKernelContext* ctx, const RowNormalizeArgs<T>& a) {
    RowBatchNormGpuContext g(ctx, "RowNormalize");
    RowNormalizeArgs<typename GpuStorage<T>::type> s;
    s.x = Stored(a.x);
    s.mean = a.mean;
    s.variance = a.variance;
    s.gamma = a.gamma;
    s.beta = a.beta;
    s.n = a.n;
    s.c = a.c;
    s.epsilon = a.epsilon;
    s.y = Stored(a.y);
    return g.ToStatus(gpu::RowNormalize(s, g.scratch(), g.stream()));
  }
};

#define REGISTER_ROW_BATCH_NORM_GPU(T)                                                                     \
  REGISTER_KERNEL_BUILDER(                                                                                 \
      Name("TfSparseconv>RowBatchNorm").Device(::tensorflow::DEVICE_GPU).TypeConstraint<T>("T"),          \
      RowBatchNormOp<GPUDevice, T>);                                                                       \
  REGISTER_KERNEL_BUILDER(                                                                                 \
      Name("TfSparseconv>RowBatchNormGrad").Device(::tensorflow::DEVICE_GPU).TypeConstraint<T>("T"),      \
      RowBatchNormGradOp<GPUDevice, T>);                                                                   \
  REGISTER_KERNEL_BUILDER(                                                                                 \
      Name("TfSparseconv>RowScaleShift").Device(::tensorflow::DEVICE_GPU).TypeConstraint<T>("T"),         \
      RowScaleShiftOp<GPUDevice, T>);                                                                      \
  REGISTER_KERNEL_BUILDER(                                                                                 \
      Name("TfSparseconv>RowNormalize").Device(::tensorflow::DEVICE_GPU).TypeConstraint<T>("T"),          \
      RowNormalizeOp<GPUDevice, T>);
REGISTER_ROW_BATCH_NORM_GPU(float)
REGISTER_ROW_BATCH_NORM_GPU(Eigen::half)
REGISTER_ROW_BATCH_NORM_GPU(Eigen::bfloat16)
#undef REGISTER_ROW_BATCH_NORM_GPU

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA

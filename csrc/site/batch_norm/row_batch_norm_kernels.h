// The OpKernels of RowBatchNorm, RowBatchNormGrad, RowScaleShift and RowNormalize, one template each for
// both devices: the shape checks and the allocation here, the arithmetic in the functors
// (CPU: row_batch_norm_kernels.cc; GPU: row_batch_norm_kernels_gpu.cc over
// row_batch_norm.cu). Nothing is read back: the GPU functors only queue their kernels.
#ifndef TF_SPARSECONV_SITE_BATCH_NORM_ROW_BATCH_NORM_KERNELS_H_
#define TF_SPARSECONV_SITE_BATCH_NORM_ROW_BATCH_NORM_KERNELS_H_

#include <cmath>
#include <cstdint>
#include <limits>

#include "common/device.h"
#include "common/guarded_op_kernel.h"
#include "site/batch_norm/row_batch_norm.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_sparseconv {

// Each returns the functor's status (a GPU launch failure; the CPU's are always OK).
template <typename Device, typename T>
struct RowBatchNormFunctor {
  absl::Status operator()(tensorflow::OpKernelContext* ctx, const RowBatchNormArgs<T>& a);
};
template <typename Device, typename T>
struct RowBatchNormGradFunctor {
  absl::Status operator()(tensorflow::OpKernelContext* ctx, const RowBatchNormGradArgs<T>& a);
};
template <typename Device, typename T>
struct RowScaleShiftFunctor {
  absl::Status operator()(tensorflow::OpKernelContext* ctx, const RowScaleShiftArgs<T>& a);
};
template <typename Device, typename T>
struct RowNormalizeFunctor {
  absl::Status operator()(tensorflow::OpKernelContext* ctx, const RowNormalizeArgs<T>& a);
};

// The epsilon attribute of RowBatchNorm and RowNormalize: finite and > 0.
inline absl::Status ReadEpsilon(tensorflow::OpKernelConstruction* ctx, const char* op, float* epsilon) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("epsilon", epsilon));
  if (!(*epsilon > 0) || !std::isfinite(*epsilon)) {
    return tensorflow::errors::InvalidArgument(op, ": epsilon must be a finite number > 0, got ", *epsilon);
  }
  return absl::OkStatus();
}

// x must be a matrix [N, C] and each named vector [C]; the GPU kernels index rows with
// int64 and columns with int.
inline absl::Status CheckRows(const char* op, const tensorflow::Tensor& x, const char* x_name,
                              std::initializer_list<std::pair<const char*, const tensorflow::Tensor*>> vectors) {
  if (x.dims() != 2) {
    return tensorflow::errors::InvalidArgument(op, ": ", x_name, " must be rows [N, C], got shape ",
                                               x.shape().DebugString());
  }
  if (x.dim_size(1) > std::numeric_limits<int>::max()) {
    return tensorflow::errors::InvalidArgument(op, ": at most 2^31 - 1 columns, got ", x.dim_size(1));
  }
  for (const auto& [name, v] : vectors) {
    if (v->dims() != 1 || v->dim_size(0) != x.dim_size(1)) {
      return tensorflow::errors::InvalidArgument(op, ": ", name, " must have one entry per column of ", x_name,
                                                 " (", x.dim_size(1), "), got shape ", v->shape().DebugString());
    }
  }
  return absl::OkStatus();
}

template <typename Device, typename T>
class RowBatchNormOp : public GuardedOpKernel {
 public:
  explicit RowBatchNormOp(tensorflow::OpKernelConstruction* ctx) : GuardedOpKernel(ctx, "RowBatchNorm") {
    AttrsOk(ReadEpsilon(ctx, "RowBatchNorm", &epsilon_));
  }

 protected:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    const tensorflow::Tensor& x = ctx->input(0);
    const tensorflow::Tensor& gamma = ctx->input(1);
    const tensorflow::Tensor& beta = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckRows("RowBatchNorm", x, "x", {{"gamma", &gamma}, {"beta", &beta}}));
    const int64_t c = x.dim_size(1);
    tensorflow::Tensor *y, *mean, *variance, *inv_std;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, tensorflow::TensorShape({c}), &mean));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, tensorflow::TensorShape({c}), &variance));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, tensorflow::TensorShape({c}), &inv_std));
    RowBatchNormArgs<T> a;
    a.x = x.flat<T>().data();
    a.gamma = gamma.flat<float>().data();
    a.beta = beta.flat<float>().data();
    a.n = x.dim_size(0);
    a.c = c;
    a.epsilon = epsilon_;
    a.y = y->flat<T>().data();
    a.mean = mean->flat<float>().data();
    a.variance = variance->flat<float>().data();
    a.inv_std = inv_std->flat<float>().data();
    OP_REQUIRES_OK(ctx, RowBatchNormFunctor<Device, T>()(ctx, a));
  }

 private:
  float epsilon_ = 0;
};

template <typename Device, typename T>
class RowBatchNormGradOp : public GuardedOpKernel {
 public:
  explicit RowBatchNormGradOp(tensorflow::OpKernelConstruction* ctx) : GuardedOpKernel(ctx, "RowBatchNormGrad") {}

 protected:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    const tensorflow::Tensor& dy = ctx->input(0);
    const tensorflow::Tensor& x = ctx->input(1);
    const tensorflow::Tensor& gamma = ctx->input(2);
    const tensorflow::Tensor& mean = ctx->input(3);
    const tensorflow::Tensor& inv_std = ctx->input(4);
    OP_REQUIRES_OK(ctx, CheckRows("RowBatchNormGrad", x, "x",
                                  {{"gamma", &gamma}, {"mean", &mean}, {"inv_std", &inv_std}}));
    OP_REQUIRES(ctx, dy.shape() == x.shape(),
                tensorflow::errors::InvalidArgument("RowBatchNormGrad: dy must have x's shape ",
                                                    x.shape().DebugString(), ", got ", dy.shape().DebugString()));
    const int64_t c = x.dim_size(1);
    tensorflow::Tensor *dx, *dgamma, *dbeta;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &dx));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, tensorflow::TensorShape({c}), &dgamma));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, tensorflow::TensorShape({c}), &dbeta));
    RowBatchNormGradArgs<T> a;
    a.dy = dy.flat<T>().data();
    a.x = x.flat<T>().data();
    a.gamma = gamma.flat<float>().data();
    a.mean = mean.flat<float>().data();
    a.inv_std = inv_std.flat<float>().data();
    a.n = x.dim_size(0);
    a.c = c;
    a.dx = dx->flat<T>().data();
    a.dgamma = dgamma->flat<float>().data();
    a.dbeta = dbeta->flat<float>().data();
    OP_REQUIRES_OK(ctx, RowBatchNormGradFunctor<Device, T>()(ctx, a));
  }
};

template <typename Device, typename T>
class RowScaleShiftOp : public GuardedOpKernel {
 public:
  explicit RowScaleShiftOp(tensorflow::OpKernelConstruction* ctx) : GuardedOpKernel(ctx, "RowScaleShift") {}

 protected:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    const tensorflow::Tensor& x = ctx->input(0);
    const tensorflow::Tensor& scale = ctx->input(1);
    const tensorflow::Tensor& shift = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckRows("RowScaleShift", x, "x", {{"scale", &scale}, {"shift", &shift}}));
    tensorflow::Tensor* y;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    RowScaleShiftArgs<T> a;
    a.x = x.flat<T>().data();
    a.scale = scale.flat<float>().data();
    a.shift = shift.flat<float>().data();
    a.n = x.dim_size(0);
    a.c = x.dim_size(1);
    a.y = y->flat<T>().data();
    OP_REQUIRES_OK(ctx, RowScaleShiftFunctor<Device, T>()(ctx, a));
  }
};

template <typename Device, typename T>
class RowNormalizeOp : public GuardedOpKernel {
 public:
  explicit RowNormalizeOp(tensorflow::OpKernelConstruction* ctx) : GuardedOpKernel(ctx, "RowNormalize") {
    AttrsOk(ReadEpsilon(ctx, "RowNormalize", &epsilon_));
  }

 protected:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    const tensorflow::Tensor& x = ctx->input(0);
    const tensorflow::Tensor& mean = ctx->input(1);
    const tensorflow::Tensor& variance = ctx->input(2);
    const tensorflow::Tensor& gamma = ctx->input(3);
    const tensorflow::Tensor& beta = ctx->input(4);
    OP_REQUIRES_OK(ctx, CheckRows("RowNormalize", x, "x",
                                  {{"mean", &mean}, {"variance", &variance}, {"gamma", &gamma}, {"beta", &beta}}));
    tensorflow::Tensor* y;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    RowNormalizeArgs<T> a;
    a.x = x.flat<T>().data();
    a.mean = mean.flat<float>().data();
    a.variance = variance.flat<float>().data();
    a.gamma = gamma.flat<float>().data();
    a.beta = beta.flat<float>().data();
    a.n = x.dim_size(0);
    a.c = x.dim_size(1);
    a.epsilon = epsilon_;
    a.y = y->flat<T>().data();
    OP_REQUIRES_OK(ctx, RowNormalizeFunctor<Device, T>()(ctx, a));
  }

 private:
  float epsilon_ = 0;
};

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_BATCH_NORM_ROW_BATCH_NORM_KERNELS_H_

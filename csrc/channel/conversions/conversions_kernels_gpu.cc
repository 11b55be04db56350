// GPU kernels of the conversion and validation ops: checks and allocation here,
// arithmetic in conversions.cu.
#if GOOGLE_CUDA

#include "channel/channel_sparse.h"
#include "channel/channel_sparse_gpu.h"
#include "channel/conversions/conversions_gpu.h"
#include "common/gpu_kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_sparseconv {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

template <typename T>
class ChannelSparseValidateGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(2), &L));
    OP_REQUIRES_OK(ctx, CheckKeysVector(ctx->input(0), "channel-sparse"));
    OP_REQUIRES_OK(ctx, ValidateValuesMatchKeys(ctx->input(0), ctx->input(1), "channel-sparse"));
    TempScratch scratch(ctx);
    gpu::Report report;
    OP_REQUIRES_OK(ctx, ToStatus(gpu::ValidateGpu<T>(GpuStream(ctx), &scratch, L,
                                                     ctx->input(0).flat<int64_t>().data(),
                                                     ctx->input(1).flat<T>().data(),
                                                     ctx->input(0).NumElements(), &report),
                                 scratch, "ChannelSparseValidate"));
    OP_REQUIRES_OK(ctx, SortedKeysStatus(report.checks[gpu::kValidateKeys], L.num_keys(),
                                         "channel-sparse"));
    OP_REQUIRES_OK(ctx, NaNStatus(report.checks[gpu::kValidateNaN], "values"));
    ctx->set_output(0, ctx->input(0));
    ctx->set_output(1, ctx->input(1));
  }
};

class ChannelSparseEncodeKeysGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(1), &L));
    const Tensor& indices = ctx->input(0);
    const int rank = L.d + 2;
    OP_REQUIRES_OK(ctx, CheckIndicesShape(indices, L));
    const int64_t n = indices.dim_size(0);
    Tensor* keys;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &keys));
    TempScratch scratch(ctx);
    gpu::Report report;
    OP_REQUIRES_OK(ctx, ToStatus(gpu::EncodeKeysGpu(GpuStream(ctx), &scratch, L,
                                                    indices.flat<int64_t>().data(), n,
                                                    keys->flat<int64_t>().data(), &report),
                                 scratch, "ChannelSparseEncodeKeys"));
    const gpu::CheckSlot& slot = report.checks[gpu::kEncodeIndices];
    if (gpu::Failed(slot)) {
      const int64_t i = static_cast<int64_t>(slot.first) / rank;
      const int j = static_cast<int>(static_cast<int64_t>(slot.first) % rank);
      OP_REQUIRES(ctx, false, IndexOutOfRangeError(i, j, slot.detail[0], IndexColumnBound(L, j)));
    }
  }
};

class ChannelSparseDecodeKeysGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(1), &L));
    const Tensor& keys = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckUnsortedKeysVector(keys));
    const int64_t n = keys.NumElements();
    Tensor* indices;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, L.d + 2}), &indices));
    TempScratch scratch(ctx);
    gpu::Report report;
    OP_REQUIRES_OK(ctx, ToStatus(gpu::DecodeKeysGpu(GpuStream(ctx), &scratch, L,
                                                    keys.flat<int64_t>().data(), n,
                                                    indices->flat<int64_t>().data(), &report),
                                 scratch, "ChannelSparseDecodeKeys"));
    const gpu::CheckSlot& slot = report.checks[gpu::kDecodeKeys];
    OP_REQUIRES(ctx, !gpu::Failed(slot),
                KeyOutOfRangeError(static_cast<int64_t>(slot.first), slot.detail[0],
                                   L.num_keys()));
  }
};

template <typename T>
class ChannelSparseReorderGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(2), &L));
    const Tensor& keys = ctx->input(0);
    const Tensor& values = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckUnsortedKeysVector(keys));
    OP_REQUIRES_OK(ctx, ValidateValuesMatchKeys(keys, values, "reorder"));
    const int64_t n = keys.NumElements();
    OP_REQUIRES_OK(ctx, CheckSortable(n, "ChannelSparseReorder", "keys"));
    Tensor *sorted_keys, *sorted_values, *perm;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &sorted_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &sorted_values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &perm));
    TempScratch scratch(ctx);
    gpu::Report report;
    OP_REQUIRES_OK(ctx, ToStatus(gpu::ReorderGpu<T>(GpuStream(ctx), &scratch, L,
                                                    keys.flat<int64_t>().data(),
                                                    values.flat<T>().data(), n,
                                                    sorted_keys->flat<int64_t>().data(),
                                                    sorted_values->flat<T>().data(),
                                                    perm->flat<int64_t>().data(), &report),
                                 scratch, "ChannelSparseReorder"));
    const gpu::CheckSlot& range = report.checks[gpu::kReorderRange];
    OP_REQUIRES(ctx, !gpu::Failed(range),
                KeyOutOfRangeError(static_cast<int64_t>(range.first), range.detail[0],
                                   L.num_keys()));
    const gpu::CheckSlot& duplicate = report.checks[gpu::kReorderDuplicates];
    OP_REQUIRES(ctx, !gpu::Failed(duplicate),
                DuplicateKeyError(duplicate.detail[0], duplicate.detail[1], duplicate.detail[2]));
  }
};

template <typename T>
class ChannelSparseToDenseGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(2), &L));
    OP_REQUIRES_OK(ctx, CheckKeysVector(ctx->input(0), "to_dense"));
    OP_REQUIRES_OK(ctx, ValidateValuesMatchKeys(ctx->input(0), ctx->input(1), "to_dense"));
    TensorShape shape;
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape(ctx->input(2).flat<int64_t>(), &shape));
    Tensor* dense;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &dense));
    TempScratch scratch(ctx);
    gpu::Report report;
    OP_REQUIRES_OK(ctx, ToStatus(gpu::ToDenseGpu<T>(GpuStream(ctx), &scratch, L,
                                                    ctx->input(0).flat<int64_t>().data(),
                                                    ctx->input(1).flat<T>().data(),
                                                    ctx->input(0).NumElements(),
                                                    dense->flat<T>().data(), &report),
                                 scratch, "ChannelSparseToDense"));
    OP_REQUIRES_OK(ctx, SortedKeysStatus(report.checks[gpu::kDenseKeys], L.num_keys(),
                                         "to_dense"));
  }
};

template <typename T>
class ChannelSparseGatherDenseGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, LayoutOfDense(ctx->input(1), &L));
    OP_REQUIRES_OK(ctx, CheckKeysVector(ctx->input(0), "gather_dense"));
    const int64_t n = ctx->input(0).NumElements();
    Tensor* values;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &values));
    TempScratch scratch(ctx);
    gpu::Report report;
    OP_REQUIRES_OK(ctx, ToStatus(gpu::GatherDenseGpu<T>(GpuStream(ctx), &scratch, L,
                                                        ctx->input(0).flat<int64_t>().data(), n,
                                                        ctx->input(1).flat<T>().data(),
                                                        values->flat<T>().data(), &report),
                                 scratch, "ChannelSparseGatherDense"));
    OP_REQUIRES_OK(ctx, SortedKeysStatus(report.checks[gpu::kDenseKeys], L.num_keys(),
                                         "gather_dense"));
  }
};

template <typename T>
class DenseToChannelSparseGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& dense = ctx->input(0);
    KeyLayout L;
    OP_REQUIRES_OK(ctx, LayoutOfDense(dense, &L));
    TempScratch scratch(ctx);
    gpu::DenseToChannelSparseGpu<T> convert;
    gpu::Report report;
    OP_REQUIRES_OK(ctx, ToStatus(convert.Count(GpuStream(ctx), &scratch, L,
                                               dense.flat<T>().data(), &report),
                                 scratch, "DenseToChannelSparse"));
    Tensor *keys, *values, *shape;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({report.count}), &keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({report.count}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({dense.dims()}), &shape));
    for (int i = 0; i < dense.dims(); ++i) shape->flat<int64_t>()(i) = dense.dim_size(i);
    OP_REQUIRES_OK(ctx, ToStatus(convert.Write(GpuStream(ctx), keys->flat<int64_t>().data(),
                                               values->flat<T>().data()),
                                 scratch, "DenseToChannelSparse"));
  }
};

#define REGISTER_GPU(T)                                                                    \
  REGISTER_KERNEL_BUILDER(Name("ChannelSparseValidate")                                    \
                              .Device(::tensorflow::DEVICE_GPU)                            \
                              .TypeConstraint<T>("T")                                      \
                              .HostMemory("dense_shape"),                                  \
                          ChannelSparseValidateGpuOp<T>);                                  \
  REGISTER_KERNEL_BUILDER(Name("ChannelSparseReorder")                                     \
                              .Device(::tensorflow::DEVICE_GPU)                            \
                              .TypeConstraint<T>("T")                                      \
                              .HostMemory("dense_shape"),                                  \
                          ChannelSparseReorderGpuOp<T>);                                   \
  REGISTER_KERNEL_BUILDER(Name("ChannelSparseToDense")                                     \
                              .Device(::tensorflow::DEVICE_GPU)                            \
                              .TypeConstraint<T>("T")                                      \
                              .HostMemory("dense_shape"),                                  \
                          ChannelSparseToDenseGpuOp<T>);                                   \
  REGISTER_KERNEL_BUILDER(                                                                 \
      Name("ChannelSparseGatherDense").Device(::tensorflow::DEVICE_GPU).TypeConstraint<T>("T"), \
      ChannelSparseGatherDenseGpuOp<T>);                                                   \
  REGISTER_KERNEL_BUILDER(Name("DenseToChannelSparse")                                     \
                              .Device(::tensorflow::DEVICE_GPU)                            \
                              .TypeConstraint<T>("T")                                      \
                              .HostMemory("dense_shape"),                                  \
                          DenseToChannelSparseGpuOp<T>);
REGISTER_GPU(float);
REGISTER_GPU(double);
#undef REGISTER_GPU

REGISTER_KERNEL_BUILDER(Name("ChannelSparseEncodeKeys")
                            .Device(::tensorflow::DEVICE_GPU)
                            .HostMemory("dense_shape"),
                        ChannelSparseEncodeKeysGpuOp);
REGISTER_KERNEL_BUILDER(Name("ChannelSparseDecodeKeys")
                            .Device(::tensorflow::DEVICE_GPU)
                            .HostMemory("dense_shape"),
                        ChannelSparseDecodeKeysGpuOp);

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA

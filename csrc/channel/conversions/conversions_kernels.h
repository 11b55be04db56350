// The conversion and validation ops' OpKernels, one template each for both devices: the
// shape checks and the allocation here, the data checks and the arithmetic in a functor per
// op and device (CPU: conversions_kernels.cc; GPU: conversions_kernels_gpu.cc over
// conversions.cu).
//
// Each functor is constructed with the op's context (explicit XFunctor(OpKernelContext*))
// for one call. It runs the op's data checks itself and returns the first failure as its
// status: the CPU on the host, before it writes; the GPU on the device, in the pass that
// does the work (which is why the outputs are allocated before it runs), the results read
// back in the op's one host round trip and turned into the CPU's messages
// (channel_sparse_gpu.h). Only the GPU has size limits (its sorts count items with int):
// those are the functors' CheckLimits, run before anything is allocated.
#ifndef TF_SPARSECONV_CHANNEL_CONVERSIONS_CONVERSIONS_KERNELS_H_
#define TF_SPARSECONV_CHANNEL_CONVERSIONS_CONVERSIONS_KERNELS_H_

#include <algorithm>
#include <cstdint>

#include "channel/channel_sparse.h"
#include "common/device.h"
#include "common/guarded_op_kernel.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_sparseconv {

// ChannelSparseValidate:
//   absl::Status operator()(const KeyLayout&, const int64_t* keys, const T* values, int64_t n,
//                           bool padded);
//   keys sorted, unique and in range ("channel-sparse", ValidateKeys), then no NaN ("values");
//   padded (the op's padded_input): the GPU's check accepts a padded tail (the CPU's gets the
//   live prefix, EntriesToRead).
template <typename Device, typename T>
struct ValidateFunctor;

// ChannelSparseEncodeKeys:
//   absl::Status operator()(const KeyLayout&, const int64_t* indices, int64_t n, int64_t* keys);
//   the first index outside its column's bound (IndexOutOfRangeError), rows in order.
template <typename Device>
struct EncodeKeysFunctor;

// ChannelSparseDecodeKeys:
//   absl::Status operator()(const KeyLayout&, const int64_t* keys, int64_t n, int64_t* indices);
//   the first key out of range (CheckKeysInLayout).
template <typename Device>
struct DecodeKeysFunctor;

// ChannelSparseReorder:
//   static absl::Status CheckLimits(int64_t n);
//   absl::Status operator()(const KeyLayout&, const int64_t* keys, const T* values, int64_t n,
//                           int64_t* sorted_keys, T* sorted_values, int64_t* permutation);
//   the first key out of range (CheckKeysInLayout), then the first duplicate in sorted
//   order (DuplicateKeyError); a stable sort.
template <typename Device, typename T>
struct ReorderFunctor;

// ChannelSparseToDense and ChannelSparseGatherDense:
//   absl::Status operator()(const KeyLayout&, const int64_t* keys, const T* values, int64_t n,
//                           T* dense, bool inputs_checked, bool padded);
//   absl::Status operator()(const KeyLayout&, const int64_t* keys, int64_t n, const T* dense,
//                           T* values, bool inputs_checked, bool padded);
//   keys sorted, unique and in range ("to_dense" / "gather_dense", ValidateKeys); the GPU
//   leaves that check (and its wait) out where inputs_checked (the ops' attr).
template <typename Device, typename T>
struct ToDenseFunctor;
template <typename Device, typename T>
struct GatherDenseFunctor;

// DenseToChannelSparse, in two phases around the allocation (no data checks):
//   absl::Status Count(const KeyLayout&, const T* dense, int64_t* count);  // non-zeros
//   absl::Status Write(int64_t* keys, T* values);                         // in key order
template <typename Device, typename T>
class DenseToChannelSparseFunctor;

template <typename Device, typename T>
class ChannelSparseValidateOp : public GuardedOpKernel {
 public:
  explicit ChannelSparseValidateOp(tensorflow::OpKernelConstruction* ctx)
      : GuardedOpKernel(ctx, "channel_sparse_validate") {
    AttrsOk(ctx->GetAttr("padded_input", &padded_));
  }

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, CheckSparseTensor(ctx->input(0), ctx->input(1), ctx->input(2), "channel-sparse", &L));
    int64_t n = 0;
    OP_REQUIRES_OK(ctx, (EntriesToRead<Device, T>(ctx->input(0).flat<int64_t>().data(), ctx->input(1).flat<T>().data(),
                                                  ctx->input(0).NumElements(), padded_, L, "channel-sparse", "values",
                                                  &n)));
    OP_REQUIRES_OK(ctx, ValidateFunctor<Device, T>(ctx)(L, ctx->input(0).flat<int64_t>().data(),
                                                        ctx->input(1).flat<T>().data(), n, padded_));
    ctx->set_output(0, ctx->input(0));
    ctx->set_output(1, ctx->input(1));
  }

  bool padded_ = false;
};

template <typename Device>
class ChannelSparseEncodeKeysOp : public GuardedOpKernel {
 public:
  explicit ChannelSparseEncodeKeysOp(tensorflow::OpKernelConstruction* ctx) : GuardedOpKernel(ctx, "channel_sparse_encode_keys") {}

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(1), &L));
    const tensorflow::Tensor& indices = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckIndicesShape(indices, L));
    const int64_t n = indices.dim_size(0);
    tensorflow::Tensor* keys;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({n}), &keys));
    OP_REQUIRES_OK(ctx, EncodeKeysFunctor<Device>(ctx)(L, indices.flat<int64_t>().data(), n,
                                                       keys->flat<int64_t>().data()));
  }
};

template <typename Device>
class ChannelSparseDecodeKeysOp : public GuardedOpKernel {
 public:
  explicit ChannelSparseDecodeKeysOp(tensorflow::OpKernelConstruction* ctx) : GuardedOpKernel(ctx, "channel_sparse_decode_keys") {}

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(1), &L));
    const tensorflow::Tensor& keys = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckUnsortedKeysVector(keys));
    const int64_t n = keys.NumElements();
    tensorflow::Tensor* indices;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({n, L.d + 2}), &indices));
    OP_REQUIRES_OK(ctx, DecodeKeysFunctor<Device>(ctx)(L, keys.flat<int64_t>().data(), n,
                                                       indices->flat<int64_t>().data()));
  }
};

template <typename Device, typename T>
class ChannelSparseReorderOp : public GuardedOpKernel {
 public:
  explicit ChannelSparseReorderOp(tensorflow::OpKernelConstruction* ctx) : GuardedOpKernel(ctx, "channel_sparse_reorder") {}

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    using ::tensorflow::TensorShape;
    KeyLayout L;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(2), &L));
    const tensorflow::Tensor& keys = ctx->input(0);
    const tensorflow::Tensor& values = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckUnsortedKeysVector(keys));
    OP_REQUIRES_OK(ctx, ValidateValuesMatchKeys(keys, values, "reorder"));
    const int64_t n = keys.NumElements();
    OP_REQUIRES_OK(ctx, ReorderFunctor<Device, T>::CheckLimits(n));
    tensorflow::Tensor *sorted_keys, *sorted_values, *perm;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &sorted_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &sorted_values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &perm));
    OP_REQUIRES_OK(ctx, ReorderFunctor<Device, T>(ctx)(L, keys.flat<int64_t>().data(), values.flat<T>().data(), n,
                                                       sorted_keys->flat<int64_t>().data(),
                                                       sorted_values->flat<T>().data(), perm->flat<int64_t>().data()));
  }
};

template <typename Device, typename T>
class ChannelSparseToDenseOp : public GuardedOpKernel {
 public:
  explicit ChannelSparseToDenseOp(tensorflow::OpKernelConstruction* ctx)
      : GuardedOpKernel(ctx, "channel_sparse_to_dense") {
    AttrsOk(ctx->GetAttr("inputs_checked", &inputs_checked_));
    AttrsOk(ctx->GetAttr("padded_input", &padded_));
  }

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, CheckSparseTensor(ctx->input(0), ctx->input(1), ctx->input(2), "to_dense", &L));
    int64_t n = 0;
    OP_REQUIRES_OK(ctx, (EntriesToRead<Device, T>(ctx->input(0).flat<int64_t>().data(), nullptr,
                                                  ctx->input(0).NumElements(), padded_, L, "to_dense", nullptr, &n)));
    tensorflow::TensorShape shape;
    OP_REQUIRES_OK(ctx, tensorflow::TensorShape::BuildTensorShape(ctx->input(2).flat<int64_t>(), &shape));
    tensorflow::Tensor* dense;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &dense));
    OP_REQUIRES_OK(ctx, ToDenseFunctor<Device, T>(ctx)(L, ctx->input(0).flat<int64_t>().data(),
                                                       ctx->input(1).flat<T>().data(), n, dense->flat<T>().data(),
                                                       inputs_checked_, padded_));
  }

  bool inputs_checked_ = false;
  bool padded_ = false;
};

template <typename Device, typename T>
class ChannelSparseGatherDenseOp : public GuardedOpKernel {
 public:
  explicit ChannelSparseGatherDenseOp(tensorflow::OpKernelConstruction* ctx)
      : GuardedOpKernel(ctx, "channel_sparse_gather_dense") {
    AttrsOk(ctx->GetAttr("inputs_checked", &inputs_checked_));
    AttrsOk(ctx->GetAttr("padded_input", &padded_));
  }

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, LayoutOfDense(ctx->input(1), &L));
    OP_REQUIRES_OK(ctx, CheckKeysVector(ctx->input(0), "gather_dense"));
    const int64_t capacity = ctx->input(0).NumElements();
    int64_t n = 0;
    OP_REQUIRES_OK(ctx, (EntriesToRead<Device, T>(ctx->input(0).flat<int64_t>().data(), nullptr, capacity, padded_, L,
                                                  "gather_dense", nullptr, &n)));
    tensorflow::Tensor* values;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({capacity}), &values));
    T* out = values->flat<T>().data();
    OP_REQUIRES_OK(ctx, GatherDenseFunctor<Device, T>(ctx)(L, ctx->input(0).flat<int64_t>().data(), n,
                                                           ctx->input(1).flat<T>().data(), out, inputs_checked_,
                                                           padded_));
    std::fill(out + n, out + capacity, T(0));  // the CPU's padding (on the GPU n == capacity)
  }

  bool inputs_checked_ = false;
  bool padded_ = false;
};

template <typename Device, typename T>
class DenseToChannelSparseOp : public GuardedOpKernel {
 public:
  explicit DenseToChannelSparseOp(tensorflow::OpKernelConstruction* ctx) : GuardedOpKernel(ctx, "dense_to_channel_sparse") {}

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    using ::tensorflow::TensorShape;
    const tensorflow::Tensor& dense = ctx->input(0);
    KeyLayout L;
    OP_REQUIRES_OK(ctx, LayoutOfDense(dense, &L));
    DenseToChannelSparseFunctor<Device, T> convert(ctx);
    int64_t n = 0;
    OP_REQUIRES_OK(ctx, convert.Count(L, dense.flat<T>().data(), &n));
    tensorflow::Tensor *keys, *values, *shape;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({dense.dims()}), &shape));
    for (int i = 0; i < dense.dims(); ++i) shape->flat<int64_t>()(i) = dense.dim_size(i);
    OP_REQUIRES_OK(ctx, convert.Write(keys->flat<int64_t>().data(), values->flat<T>().data()));
  }
};

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_CONVERSIONS_CONVERSIONS_KERNELS_H_

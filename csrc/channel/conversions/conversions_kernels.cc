// CPU kernels of the channel-sparse conversion and validation ops.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <numeric>
#include <vector>

#include "channel/channel_sparse.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_sparseconv {

using CPUDevice = Eigen::ThreadPoolDevice;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

namespace {

// Keys may be unsorted here (Decode, Reorder) but must lie inside the layout.
absl::Status CheckKeysInRange(const Tensor& keys, const KeyLayout& layout) {
  TF_RETURN_IF_ERROR(CheckUnsortedKeysVector(keys));
  const int64_t* k = keys.flat<int64_t>().data();
  for (int64_t i = 0; i < keys.NumElements(); ++i) {
    if (k[i] < 0 || k[i] >= layout.num_keys()) return KeyOutOfRangeError(i, k[i], layout.num_keys());
  }
  return absl::OkStatus();
}

}  // namespace

template <typename T>
class ChannelSparseValidateOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(2), &L));
    OP_REQUIRES_OK(ctx, ValidateKeysTensor(ctx->input(0), L, "channel-sparse"));
    OP_REQUIRES_OK(ctx, ValidateValuesMatchKeys(ctx->input(0), ctx->input(1), "channel-sparse"));
    OP_REQUIRES_OK(ctx, RejectNaN(ctx->input(1).flat<T>().data(), ctx->input(1).NumElements(),
                                  "values"));
    ctx->set_output(0, ctx->input(0));
    ctx->set_output(1, ctx->input(1));
  }
};

class ChannelSparseEncodeKeysOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(1), &L));
    const Tensor& indices = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckIndicesShape(indices, L));
    const int64_t n = indices.dim_size(0), rank = L.d + 2;
    Tensor* keys;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &keys));
    const int64_t* idx = indices.flat<int64_t>().data();
    int64_t* k = keys->flat<int64_t>().data();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t* row = idx + i * rank;
      int64_t lin = 0;
      for (int j = 0; j < rank; ++j) {
        const int64_t bound = IndexColumnBound(L, j);
        OP_REQUIRES(ctx, row[j] >= 0 && row[j] < bound, IndexOutOfRangeError(i, j, row[j], bound));
        if (j >= 1 && j < rank - 1) lin += row[j] * L.stride[j - 1];
      }
      k[i] = L.key_of(row[0], row[rank - 1], lin);
    }
  }
};

class ChannelSparseDecodeKeysOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(1), &L));
    const Tensor& keys = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckKeysInRange(keys, L));
    const int64_t n = keys.NumElements(), rank = L.d + 2;
    Tensor* indices;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, rank}), &indices));
    const int64_t* k = keys.flat<int64_t>().data();
    int64_t* out = indices->flat<int64_t>().data();
    std::vector<int32_t> x(L.d);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t seg = L.segment_of(k[i]);
      DecodeSpatial(L.spatial_of(k[i]), L, x.data());
      int64_t* row = out + i * rank;
      row[0] = seg / L.channels;
      for (int j = 0; j < L.d; ++j) row[1 + j] = x[j];
      row[rank - 1] = seg % L.channels;
    }
  }
};

template <typename T>
class ChannelSparseReorderOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(2), &L));
    const Tensor& keys = ctx->input(0);
    const Tensor& values = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeysInRange(keys, L));
    OP_REQUIRES_OK(ctx, ValidateValuesMatchKeys(keys, values, "reorder"));
    const int64_t n = keys.NumElements();
    const int64_t* k = keys.flat<int64_t>().data();
    const T* v = values.flat<T>().data();
    Tensor *sorted_keys, *sorted_values, *perm;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &sorted_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &sorted_values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &perm));
    int64_t* p = perm->flat<int64_t>().data();
    std::iota(p, p + n, int64_t{0});
    std::stable_sort(p, p + n, [&](int64_t a, int64_t b) { return k[a] < k[b]; });
    int64_t* sk = sorted_keys->flat<int64_t>().data();
    T* sv = sorted_values->flat<T>().data();
    for (int64_t i = 0; i < n; ++i) {
      sk[i] = k[p[i]];
      sv[i] = v[p[i]];
      OP_REQUIRES(ctx, i == 0 || sk[i] != sk[i - 1], DuplicateKeyError(sk[i], p[i - 1], p[i]));
    }
  }
};

template <typename T>
class ChannelSparseToDenseOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(2), &L));
    OP_REQUIRES_OK(ctx, ValidateKeysTensor(ctx->input(0), L, "to_dense"));
    OP_REQUIRES_OK(ctx, ValidateValuesMatchKeys(ctx->input(0), ctx->input(1), "to_dense"));
    TensorShape shape;
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape(ctx->input(2).flat<int64_t>(), &shape));
    Tensor* dense;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &dense));
    T* out = dense->flat<T>().data();
    std::fill(out, out + dense->NumElements(), T(0));
    const int64_t* k = ctx->input(0).flat<int64_t>().data();
    const T* v = ctx->input(1).flat<T>().data();
    for (int64_t i = 0; i < ctx->input(0).NumElements(); ++i) out[DenseIndex(k[i], L)] = v[i];
  }
};

template <typename T>
class ChannelSparseGatherDenseOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    KeyLayout L;
    OP_REQUIRES_OK(ctx, LayoutOfDense(ctx->input(1), &L));
    OP_REQUIRES_OK(ctx, ValidateKeysTensor(ctx->input(0), L, "gather_dense"));
    const int64_t n = ctx->input(0).NumElements();
    Tensor* values;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &values));
    const int64_t* k = ctx->input(0).flat<int64_t>().data();
    const T* dense = ctx->input(1).flat<T>().data();
    T* out = values->flat<T>().data();
    for (int64_t i = 0; i < n; ++i) out[i] = dense[DenseIndex(k[i], L)];
  }
};

template <typename T>
class DenseToChannelSparseOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& dense = ctx->input(0);
    KeyLayout L;
    OP_REQUIRES_OK(ctx, LayoutOfDense(dense, &L));
    const T* x = dense.flat<T>().data();
    const int64_t C = L.channels, S = L.spatial_size;
    // Pass 1 counts the non-zeros of every (b, c) segment; pass 2 walks the dense
    // tensor in memory order, which visits each segment in increasing spatial order.
    std::vector<int64_t> offset(L.num_segments() + 1, 0);
    for (int64_t b = 0; b < L.batch; ++b)
      for (int64_t lin = 0; lin < S; ++lin)
        for (int64_t c = 0; c < C; ++c)
          if (x[(b * S + lin) * C + c] != T(0)) ++offset[b * C + c + 1];
    for (int64_t s = 0; s < L.num_segments(); ++s) offset[s + 1] += offset[s];
    const int64_t n = offset[L.num_segments()];
    Tensor *keys, *values, *shape;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({dense.dims()}), &shape));
    for (int i = 0; i < dense.dims(); ++i) shape->flat<int64_t>()(i) = dense.dim_size(i);
    int64_t* k = keys->flat<int64_t>().data();
    T* v = values->flat<T>().data();
    for (int64_t b = 0; b < L.batch; ++b)
      for (int64_t lin = 0; lin < S; ++lin)
        for (int64_t c = 0; c < C; ++c) {
          const T value = x[(b * S + lin) * C + c];
          if (value == T(0)) continue;
          const int64_t at = offset[b * C + c]++;
          k[at] = L.key_of(b, c, lin);
          v[at] = value;
        }
  }
};

#define REGISTER_CPU(T)                                                                      \
  REGISTER_KERNEL_BUILDER(Name("ChannelSparseValidate")                                      \
                              .Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),      \
                          ChannelSparseValidateOp<T>);                                       \
  REGISTER_KERNEL_BUILDER(Name("ChannelSparseReorder")                                       \
                              .Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),      \
                          ChannelSparseReorderOp<T>);                                        \
  REGISTER_KERNEL_BUILDER(Name("ChannelSparseToDense")                                       \
                              .Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),      \
                          ChannelSparseToDenseOp<T>);                                        \
  REGISTER_KERNEL_BUILDER(Name("ChannelSparseGatherDense")                                   \
                              .Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),      \
                          ChannelSparseGatherDenseOp<T>);                                    \
  REGISTER_KERNEL_BUILDER(Name("DenseToChannelSparse")                                       \
                              .Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),      \
                          DenseToChannelSparseOp<T>);
REGISTER_CPU(float);
REGISTER_CPU(double);
#undef REGISTER_CPU

REGISTER_KERNEL_BUILDER(Name("ChannelSparseEncodeKeys").Device(::tensorflow::DEVICE_CPU),
                        ChannelSparseEncodeKeysOp);
REGISTER_KERNEL_BUILDER(Name("ChannelSparseDecodeKeys").Device(::tensorflow::DEVICE_CPU),
                        ChannelSparseDecodeKeysOp);

}  // namespace tf_sparseconv

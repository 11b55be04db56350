// The sparse max-pooling op's OpKernel, one template for both devices: the attribute and
// shape checks and the allocation here, the data checks and the arithmetic in
// SparseMaxPoolFunctor<Device, T> (CPU: max_pool_kernels.cc; GPU: max_pool_kernels_gpu.cc
// over max_pool.cu).
#ifndef TF_SPARSECONV_CHANNEL_MAX_POOL_MAX_POOL_KERNELS_H_
#define TF_SPARSECONV_CHANNEL_MAX_POOL_MAX_POOL_KERNELS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "channel/channel_sparse.h"
#include "channel/max_pool/max_pool.h"
#include "common/device.h"
#include "common/guarded_op_kernel.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_sparseconv {

// The functor's contract, specialised per device:
//   SparseMaxPoolFunctor(OpKernelContext* ctx, const PoolFlags& flags);
//   absl::Status Count(const KeyLayout& in, const KeyLayout& out,
//                      const std::vector<int32_t>& strides, const int64_t* keys,
//                      const T* values, int64_t n, int64_t* count);
//     (n: the entries to read; on the GPU, where the input may be padded, its length, the
//     padding skipped by the kernels; *count is left alone where the GPU does not read it
//     back: padded output of checked inputs.)
//     The data checks, keys sorted, unique and in range ("max_pool input", ValidateKeys)
//     and values free of NaN ("max_pool input values", RejectNaN), then orders the entries
//     by pooled key; *count = the non-empty windows. The CPU checks on the host; the GPU
//     first refuses more entries than it sorts (CheckSortable), then checks on the device,
//     its results read back with the count in the op's one host round trip and turned
//     into the same messages (channel_sparse_gpu.h).
//   absl::Status Write(int64_t* out_keys, T* out_values, int64_t* argmax, int64_t capacity);
//     The *count window maxima in key order and the input position of each (ties to the
//     smaller key); with padded output, padding after them up to capacity.
template <typename Device, typename T>
class SparseMaxPoolFunctor;

// The op's attributes of the same names.
struct PoolFlags {
  bool padded_input = false;
  bool padded_output = false;
  bool inputs_checked = false;
};

template <typename Device, typename T>
class SparseMaxPoolOp : public GuardedOpKernel {
 public:
  explicit SparseMaxPoolOp(tensorflow::OpKernelConstruction* ctx) : GuardedOpKernel(ctx, "sparse_max_pool") {
    if (AttrsOk(ctx->GetAttr("strides", &strides_))) AttrsOk(CheckStridesAttr(strides_));
    AttrsOk(ctx->GetAttr("padded_input", &flags_.padded_input));
    AttrsOk(ctx->GetAttr("padded_output", &flags_.padded_output));
    AttrsOk(ctx->GetAttr("inputs_checked", &flags_.inputs_checked));
  }

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    using ::tensorflow::Tensor;
    using ::tensorflow::TensorShape;
    const Tensor& keys = ctx->input(0);
    const Tensor& values = ctx->input(1);
    KeyLayout in;
    OP_REQUIRES_OK(ctx, CheckSparseTensor(keys, values, ctx->input(2), "max_pool input", &in));
    OP_REQUIRES_OK(ctx, CheckSegmentCount(in.batch, in.channels, "max_pool input"));
    OP_REQUIRES_OK(ctx, CheckStridesMatch(strides_, in));
    std::vector<int64_t> out_dims;
    KeyLayout out;
    OP_REQUIRES_OK(ctx, PooledLayout(in, strides_, &out_dims, &out));
    SparseMaxPoolFunctor<Device, T> pool(ctx, flags_);
    int64_t n = keys.NumElements();
    // A padded output's length: at most one entry per input entry and per output cell.
    const int64_t capacity = std::min(n, out.num_keys());
    OP_REQUIRES_OK(ctx, (EntriesToRead<Device, T>(keys.flat<int64_t>().data(), values.flat<T>().data(), n,
                                                  flags_.padded_input, in, "max_pool input", "max_pool input values",
                                                  &n)));
    int64_t m = 0;
    OP_REQUIRES_OK(ctx, pool.Count(in, out, strides_, keys.flat<int64_t>().data(), values.flat<T>().data(), n, &m));
    if (flags_.padded_output) m = capacity;
    Tensor *out_keys, *out_values, *out_shape, *argmax;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m}), &out_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({m}), &out_values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({in.d + 2}), &out_shape));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({m}), &argmax));
    for (int j = 0; j < in.d + 2; ++j) out_shape->flat<int64_t>()(j) = out_dims[j];
    OP_REQUIRES_OK(ctx, pool.Write(out_keys->flat<int64_t>().data(), out_values->flat<T>().data(),
                                   argmax->flat<int64_t>().data(), m));
  }

 private:
  std::vector<int32_t> strides_;
  PoolFlags flags_;
};

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_MAX_POOL_MAX_POOL_KERNELS_H_

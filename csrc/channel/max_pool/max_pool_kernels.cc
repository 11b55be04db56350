// CPU kernel of the sparse max-pooling op: per (b, c) segment, order the entries by
// their pooled position (stably, so key order breaks ties), then reduce each run.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <numeric>
#include <vector>

#include "channel/channel_sparse.h"
#include "channel/max_pool/max_pool.h"
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

template <typename T>
class SparseMaxPoolOp : public OpKernel {
 public:
  explicit SparseMaxPoolOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("strides", &strides_));
    OP_REQUIRES_OK(ctx, CheckStridesAttr(strides_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    const Tensor& values = ctx->input(1);
    KeyLayout in;
    OP_REQUIRES_OK(ctx, MakeKeyLayout(ctx->input(2), &in));
    OP_REQUIRES_OK(ctx, CheckStridesMatch(strides_, in));
    OP_REQUIRES_OK(ctx, ValidateKeysTensor(keys, in, "max_pool input"));
    OP_REQUIRES_OK(ctx, ValidateValuesMatchKeys(keys, values, "max_pool input"));
    const int64_t n = keys.NumElements();
    const int64_t* k = keys.flat<int64_t>().data();
    const T* v = values.flat<T>().data();
    OP_REQUIRES_OK(ctx, RejectNaN(v, n, "max_pool input values"));

    std::vector<int64_t> out_dims;
    KeyLayout out;
    OP_REQUIRES_OK(ctx, PooledLayout(in, strides_, &out_dims, &out));

    std::vector<int64_t> in_offsets;
    SegmentOffsets(k, n, in, &in_offsets);
    // pooled[i]: the output key of entry i; order: entries sorted by (pooled, i).
    std::vector<int64_t> pooled(n), order(n);
    std::vector<int64_t> seg_count(in.num_segments() + 1, 0);
    const CPUDevice& device = ctx->eigen_device<CPUDevice>();
    device.parallelFor(
        in.num_segments(), Eigen::TensorOpCost(0, 0, 20.0 * (1.0 + n / (in.num_segments() + 1.0))),
        [&](Eigen::Index first, Eigen::Index last) {
          std::vector<int32_t> x(in.d);
          for (Eigen::Index s = first; s < last; ++s) {
            const int64_t s0 = in_offsets[s], s1 = in_offsets[s + 1];
            for (int64_t i = s0; i < s1; ++i) {
              DecodeSpatial(in.spatial_of(k[i]), in, x.data());
              int64_t lin = 0;
              for (int j = 0; j < in.d; ++j) lin += (x[j] / strides_[j]) * out.stride[j];
              pooled[i] = s * out.spatial_size + lin;
              order[i] = i;
            }
            std::stable_sort(order.begin() + s0, order.begin() + s1,
                             [&](int64_t a, int64_t b) { return pooled[a] < pooled[b]; });
            int64_t runs = 0;
            for (int64_t i = s0; i < s1; ++i)
              runs += (i == s0 || pooled[order[i]] != pooled[order[i - 1]]);
            seg_count[s + 1] = runs;
          }
        });
    for (int64_t s = 0; s < in.num_segments(); ++s) seg_count[s + 1] += seg_count[s];
    const int64_t m = seg_count[in.num_segments()];
    Tensor *out_keys, *out_values, *out_shape, *argmax;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m}), &out_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({m}), &out_values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({in.d + 2}), &out_shape));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({m}), &argmax));
    for (int j = 0; j < in.d + 2; ++j) out_shape->flat<int64_t>()(j) = out_dims[j];
    int64_t* ok = out_keys->flat<int64_t>().data();
    T* ov = out_values->flat<T>().data();
    int64_t* am = argmax->flat<int64_t>().data();
    device.parallelFor(in.num_segments(), Eigen::TensorOpCost(0, 0, 5.0 * (1.0 + n / (in.num_segments() + 1.0))),
                       [&](Eigen::Index first, Eigen::Index last) {
                         for (Eigen::Index s = first; s < last; ++s) {
                           int64_t j = seg_count[s] - 1;
                           for (int64_t i = in_offsets[s]; i < in_offsets[s + 1]; ++i) {
                             const int64_t e = order[i];
                             if (i == in_offsets[s] || pooled[e] != ok[j]) {
                               ++j;
                               ok[j] = pooled[e];
                               ov[j] = v[e];
                               am[j] = e;
                             } else if (v[e] > ov[j]) {  // strict: ties keep the smaller key
                               ov[j] = v[e];
                               am[j] = e;
                             }
                           }
                         }
                       });
  }

 private:
  std::vector<int32_t> strides_;
};

REGISTER_KERNEL_BUILDER(
    Name("SparseMaxPool").Device(::tensorflow::DEVICE_CPU).TypeConstraint<float>("T"),
    SparseMaxPoolOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("SparseMaxPool").Device(::tensorflow::DEVICE_CPU).TypeConstraint<double>("T"),
    SparseMaxPoolOp<double>);

}  // namespace tf_sparseconv

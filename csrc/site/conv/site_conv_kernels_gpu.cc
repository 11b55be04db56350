// GPU kernels of SiteSparseConv and SiteSparseConvFilterGrad: the CPU kernels' shape
// checks and the splits (offset_splits lives in host memory) here, the row checks and
// the arithmetic on the device (site_conv.cu), and the CPU kernels' messages in
// the CPU's order: the splits' ends, then pair by pair (row ranges, repeated output
// rows) up to the first offset whose split falls, that split, then NaN features.
// With map_is_trusted the device checks are skipped: the splits are checked on the host,
// the kernels are queued and Compute returns without waiting for the device.
#if GOOGLE_CUDA

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "common/gpu_kernel_util.h"
#include "site/conv/site_conv.h"
#include "site/conv/site_conv_checks.h"
#include "site/conv/site_conv_gpu.h"
#include "tensorflow/core/framework/bfloat16.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/tensor_float_32_utils.h"
#include "tensorflow/core/util/determinism.h"

namespace tf_sparseconv {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

namespace {

// The kernels' view of TensorFlow's element types: the same bits.
template <typename T>
struct GpuStorage {
  using type = T;
};
template <>
struct GpuStorage<Eigen::half> {
  using type = gpu::Half;
};
template <>
struct GpuStorage<Eigen::bfloat16> {
  using type = gpu::BFloat16;
};
static_assert(sizeof(Eigen::half) == sizeof(gpu::Half) && sizeof(Eigen::bfloat16) == sizeof(gpu::BFloat16),
              "half types must be 16-bit");

// The CPU's first check of the splits, and the rising prefix whose pairs the device
// checks: offsets before the first offset q with splits[q] > splits[q + 1] or
// splits[q + 1] > pairs (*bad_offset = q, or volume if none).
absl::Status CheckedPrefix(const SiteMapView& map, gpu::CheckedMap* checked, int64_t* bad_offset) {
  const int32_t* s = map.offset_splits;
  if (s[0] != 0 || s[map.volume] != map.pairs) return BadSplitsError(0, s[0], s[map.volume], map.pairs);
  int64_t q = 0;
  while (q < map.volume && s[q] <= s[q + 1] && s[q + 1] <= map.pairs) ++q;
  *bad_offset = q;
  checked->offsets = q;
  checked->pairs = s[q];
  return absl::OkStatus();
}

// Turns the device's row checks into the CPU's first error, if any.
absl::Status MapRowsStatus(OpKernelContext* ctx, TempScratch* scratch, const gpu::Report& report,
                           const SiteMapView& map, const gpu::CheckedMap& checked, int64_t bad_offset, int64_t num_in,
                           int64_t num_out, const char* op) {
  const gpu::CheckSlot& rows = report.checks[gpu::kSiteRows];
  uint64_t first_bad_rows = rows.first;  // kNoError (the largest value) if none
  gpu::CheckSlot repeat;
  repeat.first = gpu::kNoError;
  if (gpu::Failed(report.checks[gpu::kSiteRepeat])) {
    // Which repeat comes first is only known after a sort: the error path's own round trip.
    TF_RETURN_IF_ERROR(ToStatus(gpu::FirstRepeatedOutputRow(GpuStream(ctx), scratch, map.out_rows,
                                                            map.offset_splits, checked, num_out, &repeat),
                                *scratch, op));
  }
  // At one pair the CPU checks in_rows, then out_rows, then the repeat.
  if (gpu::Failed(rows) && first_bad_rows <= repeat.first) {
    const int64_t p = static_cast<int64_t>(first_bad_rows);
    const int64_t in = rows.detail[0], out = rows.detail[1];
    if (in < 0 || in >= num_in) return MapRowOutOfRangeError("in_rows", p, in, num_in);
    return MapRowOutOfRangeError("out_rows", p, out, num_out);
  }
  if (gpu::Failed(repeat)) {
    const int64_t p = static_cast<int64_t>(repeat.first);
    const int32_t* s = map.offset_splits;
    // The offset owning pair p: the last q with s[q] <= p among the rising prefix.
    const int64_t q = std::upper_bound(s, s + checked.offsets + 1, p) - s - 1;
    return RepeatedOutputRowError(q, repeat.detail[0]);
  }
  if (bad_offset < map.volume) {
    const int32_t* s = map.offset_splits;
    return BadSplitsError(bad_offset, s[bad_offset], s[bad_offset + 1], map.pairs);
  }
  return absl::OkStatus();
}

// A trusted map's checks are all on the host: the splits must rise through every offset.
absl::Status TrustedSplitsStatus(const SiteMapView& map, int64_t bad_offset) {
  if (bad_offset == map.volume) return absl::OkStatus();
  const int32_t* s = map.offset_splits;
  return BadSplitsError(bad_offset, s[bad_offset], s[bad_offset + 1], map.pairs);
}

}  // namespace

template <typename T>
class SiteSparseConvGpuOp : public OpKernel {
 public:
  explicit SiteSparseConvGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("map_is_trusted", &map_is_trusted_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("map_is_submanifold", &map_is_submanifold_));
    std::string dataflow;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dataflow", &dataflow));
    OP_REQUIRES_OK(ctx, ParseSiteDataflow(dataflow, &dataflow_));
  }

  void Compute(OpKernelContext* ctx) override {
    using G = typename GpuStorage<T>::type;
    const Tensor& features = ctx->input(0);
    const Tensor& filters = ctx->input(1);
    const Tensor& num_out_t = ctx->input(5);
    OP_REQUIRES_OK(ctx, CheckSiteConvInputs(features, filters, num_out_t));
    SiteMapView map;
    OP_REQUIRES_OK(ctx, CheckSiteMapShapes(ctx->input(2), ctx->input(3), ctx->input(4), filters.dim_size(0), &map));
    OP_REQUIRES_OK(ctx, CheckSortable(map.pairs, "SiteSparseConv", "kernel-map pairs"));
    gpu::CheckedMap checked;
    int64_t bad_offset = 0;
    OP_REQUIRES_OK(ctx, CheckedPrefix(map, &checked, &bad_offset));
    if (map_is_trusted_) OP_REQUIRES_OK(ctx, TrustedSplitsStatus(map, bad_offset));
    SiteConvArgs<G> a = SiteConvArgsOf<G>(map, features.dim_size(0), num_out_t.scalar<int32_t>()(),
                                          features.dim_size(1), filters.dim_size(2));
    a.features = reinterpret_cast<const G*>(features.flat<T>().data());
    a.filters = reinterpret_cast<const G*>(filters.flat<T>().data());
    const Tensor& neighbours = ctx->input(6);
    bool neighbours_given = false;
    OP_REQUIRES_OK(ctx, CheckNeighboursInput(neighbours, a.num_out, a.volume, map_is_trusted_, &neighbours_given));
    OP_REQUIRES_OK(ctx, CheckSubmanifoldClaim(map_is_submanifold_, a.num_in, a.num_out, a.volume));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({a.num_out, a.cout}), &out));
    TempScratch scratch(ctx);
    gpu::Report report;
    gpu::SiteConvOptions options;
    options.deterministic = tensorflow::OpDeterminismRequired();
    // float multiplies in TF32 where TensorFlow allows it, as its own MatMul and Conv do.
    options.allow_tf32 = std::is_same<T, float>::value && tensorflow::tensor_float_32_execution_enabled();
    options.dataflow = dataflow_;
    options.trusted = map_is_trusted_;
    OP_REQUIRES_OK(ctx, ToStatus(gpu::SiteConvForwardGpu<G>(
                                     GpuStream(ctx), &scratch, a, checked, options,
                                     neighbours_given ? neighbours.flat<int32_t>().data() : nullptr,
                                     reinterpret_cast<G*>(out->flat<T>().data()), &report),
                                 scratch, "SiteSparseConv"));
    if (map_is_trusted_) return;  // no report: nothing was checked on the device
    OP_REQUIRES_OK(ctx, MapRowsStatus(ctx, &scratch, report, map, checked, bad_offset, a.num_in, a.num_out,
                                      "SiteSparseConv"));
    const gpu::CheckSlot& nan = report.checks[gpu::kSiteNaN];
    if (gpu::Failed(nan)) {
      const int64_t e = static_cast<int64_t>(nan.first);
      OP_REQUIRES_OK(ctx, NaNRowError("features", e / a.cin, e % a.cin));
    }
  }

 private:
  bool map_is_trusted_ = false;
  bool map_is_submanifold_ = false;
  SiteDataflow dataflow_ = SiteDataflow::kAuto;
};

template <typename T>
class SiteSparseConvFilterGradGpuOp : public OpKernel {
 public:
  explicit SiteSparseConvFilterGradGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("map_is_trusted", &map_is_trusted_));
  }

  void Compute(OpKernelContext* ctx) override {
    using G = typename GpuStorage<T>::type;
    const Tensor& features = ctx->input(0);
    const Tensor& out_grad = ctx->input(1);
    const Tensor& splits = ctx->input(4);
    OP_REQUIRES_OK(ctx, CheckSiteFilterGradInputs(features, out_grad, splits));
    SiteMapView map;
    OP_REQUIRES_OK(ctx, CheckSiteMapShapes(ctx->input(2), ctx->input(3), splits, splits.NumElements() - 1, &map));
    OP_REQUIRES_OK(ctx, CheckSortable(map.pairs, "SiteSparseConvFilterGrad", "kernel-map pairs"));
    gpu::CheckedMap checked;
    int64_t bad_offset = 0;
    OP_REQUIRES_OK(ctx, CheckedPrefix(map, &checked, &bad_offset));
    if (map_is_trusted_) OP_REQUIRES_OK(ctx, TrustedSplitsStatus(map, bad_offset));
    SiteConvArgs<G> a = SiteConvArgsOf<G>(map, features.dim_size(0), out_grad.dim_size(0),
                                          features.dim_size(1), out_grad.dim_size(1));
    a.features = reinterpret_cast<const G*>(features.flat<T>().data());
    Tensor* filter_grad;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({a.volume, a.cin, a.cout}), &filter_grad));
    TempScratch scratch(ctx);
    gpu::Report report;
    const bool allow_tf32 = std::is_same<T, float>::value && tensorflow::tensor_float_32_execution_enabled();
    OP_REQUIRES_OK(ctx, ToStatus(gpu::SiteConvFilterGradGpu<G>(
                                     GpuStream(ctx), &scratch, a, checked, allow_tf32, map_is_trusted_,
                                     reinterpret_cast<const G*>(out_grad.flat<T>().data()),
                                     reinterpret_cast<G*>(filter_grad->flat<T>().data()), &report),
                                 scratch, "SiteSparseConvFilterGrad"));
    if (map_is_trusted_) return;
    OP_REQUIRES_OK(ctx, MapRowsStatus(ctx, &scratch, report, map, checked, bad_offset, a.num_in, a.num_out,
                                      "SiteSparseConvFilterGrad"));
  }

 private:
  bool map_is_trusted_ = false;
};

class SiteNeighbourTableGpuOp : public OpKernel {
 public:
  explicit SiteNeighbourTableGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("map_is_trusted", &map_is_trusted_));
  }

  void Compute(OpKernelContext* ctx) override {
    SiteMapView map;
    int64_t num_in = 0, num_out = 0;
    OP_REQUIRES_OK(ctx, CheckNeighbourTableInputs(ctx->input(0), ctx->input(1), ctx->input(2), ctx->input(3),
                                                  ctx->input(4), &map, &num_in, &num_out));
    OP_REQUIRES_OK(ctx, CheckSortable(map.pairs, "SiteNeighbourTable", "kernel-map pairs"));
    gpu::CheckedMap checked;
    int64_t bad_offset = 0;
    OP_REQUIRES_OK(ctx, CheckedPrefix(map, &checked, &bad_offset));
    if (map_is_trusted_) OP_REQUIRES_OK(ctx, TrustedSplitsStatus(map, bad_offset));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_out, NeighbourTableWidth(map.volume)}), &out));
    TempScratch scratch(ctx);
    gpu::Report report;
    OP_REQUIRES_OK(ctx, ToStatus(gpu::SiteNeighbourTableGpu(GpuStream(ctx), &scratch, map.in_rows, map.out_rows,
                                                            map.offset_splits, checked, map.volume, num_in, num_out,
                                                            map_is_trusted_, out->flat<int32_t>().data(), &report),
                                 scratch, "SiteNeighbourTable"));
    if (map_is_trusted_) return;
    OP_REQUIRES_OK(ctx,
                   MapRowsStatus(ctx, &scratch, report, map, checked, bad_offset, num_in, num_out, "SiteNeighbourTable"));
  }

 private:
  bool map_is_trusted_ = false;
};
REGISTER_KERNEL_BUILDER(Name("SiteNeighbourTable")
                            .Device(::tensorflow::DEVICE_GPU)
                            .HostMemory("offset_splits")
                            .HostMemory("num_in")
                            .HostMemory("num_out"),
                        SiteNeighbourTableGpuOp);

#define REGISTER_SITE_CONV_GPU(T)                                        \
  REGISTER_KERNEL_BUILDER(Name("SiteSparseConv")                         \
                              .Device(::tensorflow::DEVICE_GPU)          \
                              .TypeConstraint<T>("T")                    \
                              .HostMemory("offset_splits")               \
                              .HostMemory("num_out"),                    \
                          SiteSparseConvGpuOp<T>);                       \
  REGISTER_KERNEL_BUILDER(Name("SiteSparseConvFilterGrad")               \
                              .Device(::tensorflow::DEVICE_GPU)          \
                              .TypeConstraint<T>("T")                    \
                              .HostMemory("offset_splits"),              \
                          SiteSparseConvFilterGradGpuOp<T>);
REGISTER_SITE_CONV_GPU(float)
REGISTER_SITE_CONV_GPU(double)
REGISTER_SITE_CONV_GPU(Eigen::half)
REGISTER_SITE_CONV_GPU(Eigen::bfloat16)
#undef REGISTER_SITE_CONV_GPU

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA

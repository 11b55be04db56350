// The GPU functors of SiteSparseConv, SiteSparseConvFilterGrad and SiteNeighbourTable, over
// site_conv.cu, and the GPU registration of their OpKernels (site_conv_kernels.h). The
// splits (offset_splits lives in host memory) are checked here, the rows on the device,
// and a failed check comes back as the CPU kernels' message in the CPU's order: the
// splits' ends, then pair by pair (row ranges, repeated output rows) up to the first
// offset whose split falls, that split, then NaN features. With map_is_trusted the device
// checks are skipped: the splits are checked on the host, the kernels are queued and
// Compute returns without waiting for the device.
#if GOOGLE_CUDA

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/gpu_kernel_util.h"
#include "site/conv/site_conv.h"
#include "site/conv/site_conv_checks.h"
#include "site/conv/site_conv_gpu.h"
#include "site/conv/site_gpu_storage.h"
#include "site/conv/site_conv_kernels.h"
#include "tensorflow/core/framework/bfloat16.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/tensor_float_32_utils.h"
#include "tensorflow/core/util/determinism.h"

namespace tf_sparseconv {

using ::tensorflow::OpKernelContext;

namespace {

// The call's arguments as the kernels see them.
template <typename T>
SiteConvArgs<typename GpuStorage<T>::type> StoredArgs(const SiteConvArgs<T>& a) {
  SiteConvArgs<typename GpuStorage<T>::type> g;
  g.features = Stored(a.features);
  g.filters = Stored(a.filters);
  g.in_rows = a.in_rows;
  g.out_rows = a.out_rows;
  g.offset_splits = a.offset_splits;
  g.volume = a.volume;
  g.pairs = a.pairs;
  g.num_in = a.num_in;
  g.num_out = a.num_out;
  g.cin = a.cin;
  g.cout = a.cout;
  g.epilogue = a.epilogue;  // float (double for double) either way: AccumulatorOf
  return g;
}

// float multiplies in TF32 where TensorFlow allows it, as its own MatMul and Conv do.
template <typename T>
bool AllowTf32() {
  return std::is_same<T, float>::value && tensorflow::tensor_float_32_execution_enabled();
}

}  // namespace

// What the three functors share: the host's checks of the splits before anything runs
// (PrepareMap), and the device's checks of the rows turned into the CPU's first error
// after the run (MapStatus).
class GpuSiteMapFunctor : protected GpuOpContext {
 protected:
  GpuSiteMapFunctor(OpKernelContext* ctx, const char* op, bool trusted) : GpuOpContext(ctx, op), trusted_(trusted) {}

  // The sort limit, the CPU's first check of the splits (their ends), and the rising
  // prefix whose pairs the device checks: offsets before the first offset q with
  // splits[q] > splits[q + 1] or splits[q + 1] > pairs (bad_offset_ = q, or volume if
  // none). A trusted map's checks are all here: its splits must rise through every offset.
  absl::Status PrepareMap(const SiteMapView& map) {
    TF_RETURN_IF_ERROR(CheckSortable(map.pairs, op_, "kernel-map pairs"));
    map_ = map;
    const int32_t* s = map.offset_splits;
    if (s[0] != 0 || s[map.volume] != map.pairs) return BadSplitsError(0, s[0], s[map.volume], map.pairs);
    int64_t q = 0;
    while (q < map.volume && s[q] <= s[q + 1] && s[q + 1] <= map.pairs) ++q;
    bad_offset_ = q;
    checked_.offsets = q;
    checked_.pairs = s[q];
    if (trusted_ && bad_offset_ < map.volume) return BadSplitsError(q, s[q], s[q + 1], map.pairs);
    return absl::OkStatus();
  }

  // After the device's run: its row checks (report_) as the CPU's first error, if any;
  // nothing for a trusted map, whose rows were not checked.
  absl::Status MapStatus(int64_t num_in, int64_t num_out) {
    if (trusted_) return absl::OkStatus();
    const gpu::CheckSlot& rows = report_.checks[gpu::kSiteRows];
    const uint64_t first_bad_rows = rows.first;  // kNoError (the largest value) if none
    gpu::CheckSlot repeat;
    repeat.first = gpu::kNoError;
    if (gpu::Failed(report_.checks[gpu::kSiteRepeat])) {
      // Which repeat comes first is only known after a sort: the error path's own round trip.
      TF_RETURN_IF_ERROR(ToStatus(gpu::FirstRepeatedOutputRow(stream_, &scratch_, map_.out_rows,
                                                              map_.offset_splits, checked_, num_out, &repeat)));
    }
    // At one pair the CPU checks in_rows, then out_rows, then the repeat.
    if (gpu::Failed(rows) && first_bad_rows <= repeat.first) {
      const int64_t p = static_cast<int64_t>(first_bad_rows);
      const int64_t in = rows.detail[0], out = rows.detail[1];
      if (in < 0 || in >= num_in) return MapRowOutOfRangeError("in_rows", p, in, num_in);
      return MapRowOutOfRangeError("out_rows", p, out, num_out);
    }
    const int32_t* s = map_.offset_splits;
    if (gpu::Failed(repeat)) {
      const int64_t p = static_cast<int64_t>(repeat.first);
      // The offset owning pair p: the last q with s[q] <= p among the rising prefix.
      const int64_t q = std::upper_bound(s, s + checked_.offsets + 1, p) - s - 1;
      return RepeatedOutputRowError(q, repeat.detail[0]);
    }
    if (bad_offset_ < map_.volume) return BadSplitsError(bad_offset_, s[bad_offset_], s[bad_offset_ + 1], map_.pairs);
    return absl::OkStatus();
  }

  const bool trusted_;
  SiteMapView map_;
  gpu::CheckedMap checked_;
  int64_t bad_offset_ = 0;
  gpu::Report report_;
};

template <typename T>
class SiteConvFunctor<GPUDevice, T> : GpuSiteMapFunctor {
 public:
  SiteConvFunctor(OpKernelContext* ctx, const SiteConvAttrs& attrs)
      : GpuSiteMapFunctor(ctx, "SiteSparseConv", attrs.map_is_trusted),
        dataflow_(attrs.dataflow),
        map_is_table_(attrs.map_is_table) {}

  absl::Status Prepare(const SiteMapView& map, const SiteConvArgs<T>&) { return PrepareMap(map); }

  // map_is_table: the output-stationary tiles read the table alone (SiteConvForwardGpu's
  // from_table_only); a call they cannot run is refused, since there are no pairs to fall
  // back on.
  absl::Status UseTable(const tensorflow::Tensor&, SiteMapView*, SiteConvArgs<T>* a) {
    if (a->cin == 0) return absl::OkStatus();  // no products: the output is zeros either way
    std::string why = gpu::OutputStationaryUnavailable(StoredArgs(*a), AllowTf32<T>());
    if (dataflow_ == SiteDataflow::kPairs || (dataflow_ == SiteDataflow::kAuto && sizeof(T) != 2)) {
      why = "this dataflow reads the pairs";
    }
    if (why.empty()) return absl::OkStatus();
    return tensorflow::errors::InvalidArgument(
        "map_is_table on the GPU runs the output-stationary tiles from the table alone (half or bfloat16 with "
        "dataflow='auto', or dataflow='outputs'), which do not apply here: ", why,
        "; give the map's pairs instead (SiteTablePairs of the table, or SiteKernelMap)");
  }

  absl::Status Run(const SiteConvArgs<T>& a, const int32_t* neighbours, T* out) {
    if (dataflow_ == SiteDataflow::kOutputs) {
      const std::string why = gpu::OutputStationaryUnavailable(StoredArgs(a), AllowTf32<T>());
      if (!why.empty()) {
        return tensorflow::errors::InvalidArgument(
            "dataflow='outputs' (output-stationary tiles on tensor cores) does not apply to this convolution: ", why,
            "; use dataflow='auto', which chooses the pairs dataflow here, or 'pairs'");
      }
    }
    gpu::SiteConvOptions options;
    options.deterministic = tensorflow::OpDeterminismRequired();
    options.allow_tf32 = AllowTf32<T>();
    options.dataflow = dataflow_;
    options.trusted = trusted_;
    options.map_is_table = map_is_table_;
    TF_RETURN_IF_ERROR(ToStatus(gpu::SiteConvForwardGpu(stream_, &scratch_, StoredArgs(a), checked_, options,
                                                        neighbours, Stored(out), &report_)));
    TF_RETURN_IF_ERROR(MapStatus(a.num_in, a.num_out));
    const gpu::CheckSlot& nan = report_.checks[gpu::kSiteNaN];
    if (trusted_ || !gpu::Failed(nan)) return absl::OkStatus();
    const int64_t e = static_cast<int64_t>(nan.first);
    return NaNRowError("features", e / a.cin, e % a.cin);
  }

 private:
  const SiteDataflow dataflow_;
  const bool map_is_table_;
};

template <typename T>
class SiteConvFilterGradFunctor<GPUDevice, T> : GpuSiteMapFunctor {
 public:
  SiteConvFilterGradFunctor(OpKernelContext* ctx, const SiteConvAttrs& attrs)
      : GpuSiteMapFunctor(ctx, "SiteSparseConvFilterGrad", attrs.map_is_trusted) {}

  absl::Status Prepare(const SiteMapView& map, const SiteConvArgs<T>&) { return PrepareMap(map); }

  absl::Status Run(const SiteConvArgs<T>& a, const T* out_grad, T* filter_grad) {
    TF_RETURN_IF_ERROR(ToStatus(gpu::SiteConvFilterGradGpu(stream_, &scratch_, StoredArgs(a), checked_,
                                                           AllowTf32<T>(), trusted_, Stored(out_grad),
                                                           Stored(filter_grad), &report_)));
    return MapStatus(a.num_in, a.num_out);
  }
};

template <>
class SiteNeighbourTableFunctor<GPUDevice> : GpuSiteMapFunctor {
 public:
  SiteNeighbourTableFunctor(OpKernelContext* ctx, const SiteConvAttrs& attrs)
      : GpuSiteMapFunctor(ctx, "SiteNeighbourTable", attrs.map_is_trusted) {}

  absl::Status Prepare(const SiteMapView& map, int64_t, int64_t) { return PrepareMap(map); }

  absl::Status Run(const SiteMapView& map, int64_t num_in, int64_t num_out, int32_t* table) {
    TF_RETURN_IF_ERROR(ToStatus(gpu::SiteNeighbourTableGpu(stream_, &scratch_, map.in_rows, map.out_rows,
                                                           map.offset_splits, checked_, map.volume, num_in, num_out,
                                                           trusted_, table, &report_)));
    return MapStatus(num_in, num_out);
  }
};

REGISTER_KERNEL_BUILDER(Name("TfSparseconv>SiteNeighbourTable")
                            .Device(::tensorflow::DEVICE_GPU)
                            .HostMemory("offset_splits")
                            .HostMemory("num_in")
                            .HostMemory("num_out"),
                        SiteNeighbourTableOp<GPUDevice>);

#define REGISTER_SITE_CONV_GPU(T)                                        \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>SiteSparseConv")            \
                              .Device(::tensorflow::DEVICE_GPU)          \
                              .TypeConstraint<T>("T")                    \
                              .HostMemory("offset_splits")               \
                              .HostMemory("num_out"),                    \
                          SiteSparseConvOp<GPUDevice, T>);               \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>SiteSparseConvFilterGrad")  \
                              .Device(::tensorflow::DEVICE_GPU)          \
                              .TypeConstraint<T>("T")                    \
                              .HostMemory("offset_splits"),              \
                          SiteSparseConvFilterGradOp<GPUDevice, T>);
REGISTER_SITE_CONV_GPU(float)
REGISTER_SITE_CONV_GPU(double)
REGISTER_SITE_CONV_GPU(Eigen::half)
REGISTER_SITE_CONV_GPU(Eigen::bfloat16)
#undef REGISTER_SITE_CONV_GPU

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA

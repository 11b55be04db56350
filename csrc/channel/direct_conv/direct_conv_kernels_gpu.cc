// The GPU functors of DirectSparseConv and DirectSparseConvBackprop, over direct_conv.cu,
// and the GPU registration of their OpKernels (direct_conv_kernels.h): the data checks run
// on the device. dense_shape and filter_mask live in host memory: the present weights are
// listed on the host, as on the CPU, and sent to the device as a table.
#if GOOGLE_CUDA

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

#include "channel/channel_sparse_gpu.h"
#include "channel/direct_conv/check_status_kernel.h"
#include "channel/direct_conv/direct_conv.h"
#include "channel/direct_conv/direct_conv_checks.h"
#include "channel/direct_conv/direct_conv_gpu.h"
#include "channel/direct_conv/direct_conv_kernels.h"
#include "common/gpu_kernel_util.h"
#include "common/host_syncs.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/util/determinism.h"
#include "xla/stream_executor/device_address.h"
#include "xla/stream_executor/stream.h"

namespace tf_sparseconv {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

namespace {

// The present weights regrouped by input channel; row ic lists them by (oc, kernel
// offset), which is the order in which the CPU kernel sums one output entry.
struct WeightTable {
  std::vector<gpu::GpuPresentWeight> items;
  std::vector<int64_t> row_begin;
  std::vector<int64_t> pair_begin;  // the (ic, oc) runs within the rows
  std::vector<int64_t> offset_rep;  // one present weight per kernel offset that has any, by offset
  std::vector<uint8_t> present;     // present[filter_index]: 1 for a present weight
  int64_t max_row = 0;

  gpu::GpuWeightTable View() const {
    gpu::GpuWeightTable view;
    view.items = items.data();
    view.row_begin = row_begin.data();
    view.pair_begin = pair_begin.data();
    view.offset_rep = offset_rep.data();
    view.num_offsets = static_cast<int64_t>(offset_rep.size());
    view.present = present.data();
    view.present_size = static_cast<int64_t>(present.size());
    view.count = static_cast<int64_t>(items.size());
    view.max_row = max_row;
    return view;
  }
};

WeightTable ByInputChannel(const PresentWeights& w, int d) {
  WeightTable table;
  table.row_begin.push_back(0);
  // The filter is [K..., Cin, Cout]: a weight's kernel offset is filter_index / (Cin * Cout).
  const int64_t per_offset = w.cin * w.cout;
  std::vector<int64_t> offset_first;  // the first item of each kernel offset, -1: none
  for (int64_t ic = 0; ic < w.cin; ++ic) {
    for (int64_t oc = 0; oc < w.cout; ++oc) {
      table.pair_begin.push_back(static_cast<int64_t>(table.items.size()));
      for (const PresentWeight* pw = w.begin(oc, ic); pw != w.end(oc, ic); ++pw) {
        gpu::GpuPresentWeight g = {};
        g.lin_delta = pw->lin_delta;
        g.filter_index = pw->filter_index;
        g.ic = static_cast<int32_t>(ic);
        g.oc = static_cast<int32_t>(oc);
        const int64_t offset = per_offset > 0 ? pw->filter_index / per_offset : 0;
        g.offset_bit = static_cast<int32_t>(offset % 32);
        for (int j = 0; j < d; ++j) {
          g.lo[j] = pw->lo[j];
          g.hi[j] = pw->hi[j];
        }
        if (offset >= static_cast<int64_t>(offset_first.size())) {
          offset_first.resize(offset + 1, -1);
          table.present.resize((offset + 1) * per_offset, 0);  // whole filter rows of every offset seen
        }
        if (offset_first[offset] < 0) offset_first[offset] = static_cast<int64_t>(table.items.size());
        table.present[pw->filter_index] = 1;
        table.items.push_back(g);
      }
    }
    table.row_begin.push_back(static_cast<int64_t>(table.items.size()));
    table.max_row = std::max(table.max_row, table.row_begin[ic + 1] - table.row_begin[ic]);
  }
  table.pair_begin.push_back(static_cast<int64_t>(table.items.size()));
  for (int64_t first : offset_first) {
    if (first >= 0) table.offset_rep.push_back(first);  // ascending kernel offset: the CPU's order
  }
  return table;
}

// A kernel's present-weight tables of its last call, on the host and on the device, used
// again while what they derive from is unchanged: in training the mask changes only where the
// network is pruned, and building the tables alone took 4.0 ms of host time per 22.8 ms
// OctNet3 32^3 training step (dev/step_host_events.py --merged, lent H200, 2026-12-01).
class WeightTableCache {
 public:
  // What the tables derive from: the mask, the kernel's and the input's spatial shape, the
  // channels.
  struct Key {
    std::vector<uint8_t> mask;
    int d = 0;
    int64_t kernel_size[kMaxSpatialDims] = {};
    int64_t extent[kMaxSpatialDims] = {};
    int64_t cin = 0;
    int64_t cout = 0;

    template <typename T>
    bool Matches(const ConvTensors<T>& in) const {
      const KeyLayout& L = in.layout;
      if (d != L.d || cin != L.channels || cout != in.shapes.cout ||
          static_cast<int64_t>(mask.size()) != in.filter_size) {
        return false;
      }
      for (int j = 0; j < d; ++j) {
        if (kernel_size[j] != in.shapes.kernel_size[j] || extent[j] != L.extent[j]) return false;
      }
      return mask.empty() || std::memcmp(mask.data(), in.mask, mask.size()) == 0;
    }
  };

  struct Entry {
    Key key;
    WeightTable table;
    Tensor device;               // the tables on the device (UploadWeightTables)
    gpu::GpuWeightTable weights; // table's view, with the device copies and GradWeightsPack's answer
  };

  // The entry for `in`: the last one where its key matches, else a new one, built and its
  // upload queued on the op's stream. A replaced entry's device memory is freed once no call
  // holds it; TensorFlow's device allocator is ordered by the one compute stream, on which
  // every use of it was queued.
  template <typename T>
  absl::Status Get(OpKernelContext* ctx, TempScratch* scratch, const ConvTensors<T>& in,
                   std::shared_ptr<const Entry>* entry) {
    absl::MutexLock lock(&mu_);
    if (last_ != nullptr && last_->key.Matches(in)) {
      *entry = last_;
      return absl::OkStatus();
    }
    const KeyLayout& L = in.layout;
    auto fresh = std::make_shared<Entry>();
    Key& key = fresh->key;
    key.mask.resize(in.filter_size);
    if (in.filter_size > 0) std::memcpy(key.mask.data(), in.mask, in.filter_size);
    key.d = L.d;
    for (int j = 0; j < L.d; ++j) {
      key.kernel_size[j] = in.shapes.kernel_size[j];
      key.extent[j] = L.extent[j];
    }
    key.cin = L.channels;
    key.cout = in.shapes.cout;
    fresh->table = ByInputChannel(BuildPresentWeights(in.mask, in.shapes.kernel_size, L.channels, key.cout, L), L.d);
    gpu::GpuWeightTable& weights = fresh->weights;
    weights = fresh->table.View();
    weights.grad_pack = gpu::GradWeightsPack(L, key.cout, weights) ? 1 : 0;
    const size_t bytes = gpu::WeightTablesBytes(weights, key.cin, key.cout);
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_UINT8, TensorShape({static_cast<int64_t>(bytes)}),
                                          &fresh->device));
    TF_RETURN_IF_ERROR(ToStatus(gpu::UploadWeightTables(GpuStream(ctx), scratch, weights, key.cin, key.cout,
                                                        fresh->device.data(), &weights.on_device),
                                *scratch, "DirectSparseConv"));
    // The staging buffer stays alive until the upload has run, whether or not the call waits.
    scratch->HoldPinnedUntilQueuedWorkRuns();
    last_ = std::move(fresh);
    *entry = last_;
    return absl::OkStatus();
  }

 private:
  absl::Mutex mu_;
  std::shared_ptr<const Entry> last_;
};

// The device's view of inputs 0-4: the weight tables of the kernel's cache (whose vectors
// args->weights points into, and whose device copies it names).
template <typename T>
absl::Status GpuConvArgs(OpKernelContext* ctx, TempScratch* scratch, WeightTableCache* cache,
                         const ConvTensors<T>& in, std::shared_ptr<const WeightTableCache::Entry>* tables,
                         gpu::DirectConvGpuArgs<T>* args) {
  TF_RETURN_IF_ERROR(cache->Get(ctx, scratch, in, tables));
  in.CopyTo(args);
  args->padded = in.padded;
  args->out_padded = in.out_padded;
  args->weights = (*tables)->weights;
  return absl::OkStatus();
}

// Consecutive example ranges [b0, b1) whose contribution buffers (entries * bytes_per_entry)
// stay within limit; an example above the limit alone is a group of its own.
std::vector<std::pair<int64_t, int64_t>> ExampleGroups(const std::vector<int64_t>& begin, double bytes_per_entry,
                                                       double limit) {
  std::vector<std::pair<int64_t, int64_t>> groups;
  const int64_t batch = static_cast<int64_t>(begin.size()) - 1;
  for (int64_t b0 = 0; b0 < batch;) {
    int64_t b1 = b0 + 1;
    while (b1 < batch && static_cast<double>(begin[b1 + 1] - begin[b0]) * bytes_per_entry <= limit) ++b1;
    groups.emplace_back(b0, b1);
    b0 = b1;
  }
  return groups;
}

// The forward's device-side checks (ConvCheck slots) as the CPU's messages.
absl::Status ForwardReportStatus(const gpu::Report& report, const KeyLayout& L) {
  TF_RETURN_IF_ERROR(
      EntryReportStatus(report, gpu::kConvKeys, gpu::kConvValues, L.num_keys(), "input", "input values"));
  TF_RETURN_IF_ERROR(NaNStatus(report.checks[gpu::kConvFilter], "filter"));
  TF_RETURN_IF_ERROR(NaNStatus(report.checks[gpu::kConvBias], "bias"));
  return gpu::Failed(report.checks[gpu::kConvReluNaN]) ? FusedReluNaNError() : absl::OkStatus();
}

}  // namespace

// The data checks run on the device, in Count (in groups: in a pass of their own first);
// Prepare settles the dataflow, and whether the sort runs in groups of examples to keep its
// contribution buffers within temp_limit_bytes, and refuses what the GPU kernels cannot index.
template <typename T>
class DirectSparseConvFunctor<GPUDevice, T> : GpuFunctorBase {
 public:
  using Cache = WeightTableCache;

  DirectSparseConvFunctor(OpKernelContext* ctx, const ConvAttrs& attrs, Cache* cache)
      : GpuFunctorBase(ctx, "DirectSparseConv"), ctx_(ctx), attrs_(attrs), cache_(cache) {}

  absl::Status Prepare(const ConvTensors<T>& in, const T* bias) {
    TF_RETURN_IF_ERROR(GpuConvArgs(ctx_, &scratch_, cache_, in, &tables_, &args_));
    args_.relu = attrs_.relu;
    args_.keys_checked = attrs_.inputs_checked;
    bias_ = bias;
    const KeyLayout& L = args_.in_layout;
    k_ = attrs_.EffectiveK(L.spatial_size);
    temp_limit_ = static_cast<double>(attrs_.temp_limit_bytes);
    args_.deterministic = tensorflow::OpDeterminismRequired();
    if (attrs_.dataflow == DirectConvDataflow::kAtomic && args_.deterministic) {
      return errors::InvalidArgument("DirectSparseConv: dataflow 'atomic' sums with float atomics, in an order "
                                     "that varies, and TensorFlow's op determinism is enabled; use 'auto', "
                                     "'sort', 'dense' or 'bitmap'");
    }
    // temp_limit_bytes caps the sort's buffers; where 'auto' would take the bitmaps or the
    // atomic sums and they exceed the limit, it decides again without the atomic sums: the
    // dense grid where that rule takes it, else the sort (in groups), so that the cap holds.
    dataflow_ = attrs_.dataflow;
    if (dataflow_ == DirectConvDataflow::kAuto && attrs_.temp_limit_bytes > 0) {
      const gpu::ForwardPath path = gpu::ForwardPathOf(args_, dataflow_);
      if ((path == gpu::ForwardPath::kBitmap && gpu::BitmapForwardBytes(args_) > temp_limit_) ||
          (path == gpu::ForwardPath::kAtomic && gpu::AtomicForwardBytes(args_) > temp_limit_)) {
        gpu::DirectConvGpuArgs<T> without_atomics = args_;
        without_atomics.deterministic = true;  // AtomicAllowed is false: UseDenseGrid's rule without them
        dataflow_ = gpu::UseDenseGrid(without_atomics, DirectConvDataflow::kAuto) ? DirectConvDataflow::kDense
                                                                                   : DirectConvDataflow::kSort;
      }
    }
    // In groups, each group's contributions are checked against the sort's limit instead.
    const gpu::ForwardPath path = gpu::ForwardPathOf(args_, dataflow_);
    in_groups_ = path == gpu::ForwardPath::kSort && attrs_.temp_limit_bytes > 0 && L.batch > 1 && args_.n > 0 &&
                 gpu::SortForwardBytes(args_) > temp_limit_;
    if (path != gpu::ForwardPath::kDense && !in_groups_) {  // the sort's and the bitmaps' slot indices
      TF_RETURN_IF_ERROR(CheckSortable(gpu::ContributionSlots(args_.n, args_.weights.max_row), "DirectSparseConv",
                                       "contributions (entries x present weights of one input "
                                       "channel)"));
    }
    if (L.batch * args_.cout > gpu::kMaxSegments) {
      return errors::ResourceExhausted("DirectSparseConv on GPU supports at most 2^32 - 2 "
                                       "(batch, output channel) segments");
    }
    // Keys a library op made need no check, and a padded output no size: nothing to wait
    // for. The other checks go to the status output, read once where the network's sparse
    // part ends (DirectSparseConvReportStatus). With TF_SPARSECONV_CHECK_EVERY_OP=1 the
    // Python layer does not set inputs_checked.
    no_wait_ = attrs_.padded_output && attrs_.inputs_checked && !in_groups_;
    return absl::OkStatus();
  }

  absl::Status Count(int64_t* touched, int64_t* positive, int64_t* count) {
    if (in_groups_) return CountInGroups(touched, positive, count);
    if (no_wait_) {
      *count = kCountOnDevice;
      return ToStatus(conv_.Run(stream_, &scratch_, args_, bias_, attrs_.selection, k_, dataflow_, touched,
                                positive, nullptr));
    }
    gpu::Report report;
    TF_RETURN_IF_ERROR(ToStatus(conv_.Run(stream_, &scratch_, args_, bias_, attrs_.selection, k_, dataflow_,
                                          touched, positive, &report)));
    TF_RETURN_IF_ERROR(ForwardReportStatus(report, args_.in_layout));
    *count = report.count;
    return absl::OkStatus();
  }

  // The padded output, allocated before Count: where it is the touched set, Run writes it there.
  static constexpr bool kPaddedOutputFirst = true;
  void GivePaddedOutput(int64_t* keys, T* values, int64_t capacity, bool capped) {
    if (in_groups_) return;  // Count's count is the host's, checked against the cap before Write
    args_.padded_keys = keys;
    args_.padded_values = values;
    args_.padded_capacity = capacity;
    args_.padded_capped = capped;
  }

  bool Staged(int64_t, Tensor*, Tensor*) const { return false; }

  absl::Status WritePadded(int64_t count, int64_t capacity, int64_t* out_keys, T* out_values) {
    if (!in_groups_) {
      return ToStatus(conv_.WritePadded(stream_, out_keys, out_values, capacity,
                                        no_wait_ ? conv_.device_report() : nullptr, count,
                                        args_.in_layout.num_keys(), status_));
    }
    TF_RETURN_IF_ERROR(Write(out_keys, out_values));
    return ToStatus(gpu::PadConvOutput<T>(stream_, no_wait_ ? conv_.device_report() : nullptr, count, capacity,
                                          out_keys, out_values));
  }

  // A padded output (not in groups) writes the status in WritePadded's launch.
  absl::Status WriteStatus(int64_t* status) {
    if (attrs_.padded_output && !in_groups_) {
      status_ = status;
      return absl::OkStatus();
    }
    return ToStatus(gpu::ConvStatus(stream_, no_wait_ ? conv_.device_report() : nullptr,
                                    args_.in_layout.num_keys(), status));
  }

  absl::Status Write(int64_t* out_keys, T* out_values) {
    if (in_groups_) return WriteInGroups(out_keys, out_values);
    return ToStatus(conv_.Write(stream_, out_keys, out_values));
  }

 private:
  // The sort dataflow in groups of whole examples, each group's temporaries released before
  // the next: once to count every group's kept entries (and fill the counts), then, with
  // the output allocated, once more to write them. Twice the work for a peak of the output
  // and one group's temporaries instead of the whole batch's (direct_conv_gpu.h).
  absl::Status CountInGroups(int64_t* touched, int64_t* positive, int64_t* count) {
    const KeyLayout& L = args_.in_layout;
    begin_.assign(L.batch + 1, 0);
    {
      // The groups are found from the keys, so they are checked over all entries first.
      TempScratch scratch(ctx_);
      gpu::Report report;
      TF_RETURN_IF_ERROR(::tf_sparseconv::ToStatus(
          gpu::DirectConvCheckInputs<T>(stream_, &scratch, args_, bias_, &report), scratch, op_));
      TF_RETURN_IF_ERROR(ForwardReportStatus(report, L));
      TF_RETURN_IF_ERROR(::tf_sparseconv::ToStatus(
          gpu::ExampleBegins(stream_, &scratch, args_.keys, args_.n, L.batch, L.channels * L.spatial_size,
                             begin_.data()),
          scratch, op_));
    }
    const double bytes_per_entry = gpu::SortForwardBytes(args_) / static_cast<double>(args_.n);
    groups_ = ExampleGroups(begin_, bytes_per_entry, temp_limit_);
    const int64_t segments = L.batch * args_.cout;
    TF_RETURN_IF_ERROR(ctx_->allocate_temp(tensorflow::DT_INT64, TensorShape({2, segments}), &group_counts_));
    int64_t* group_touched = group_counts_.flat<int64_t>().data();
    int64_t* group_positive = group_touched + segments;
    kept_.assign(groups_.size(), 0);
    for (size_t i = 0; i < groups_.size(); ++i) {
      TempScratch scratch(ctx_);
      gpu::DirectConvForwardGpu<T> conv;
      gpu::Report report;
      TF_RETURN_IF_ERROR(RunGroup(groups_[i], &scratch, &conv, &report));
      TF_RETURN_IF_ERROR(ForwardReportStatus(report, L));
      kept_[i] = report.count;
      const int64_t first = groups_[i].first * args_.cout;
      const int64_t n = (groups_[i].second - groups_[i].first) * args_.cout;
      TF_RETURN_IF_ERROR(::tf_sparseconv::ToStatus(
          gpu::CopyCounts(stream_, touched + first, group_touched + first, n), scratch, op_));
      TF_RETURN_IF_ERROR(::tf_sparseconv::ToStatus(
          gpu::CopyCounts(stream_, positive + first, group_positive + first, n), scratch, op_));
    }
    int64_t total = 0;
    for (int64_t kept : kept_) total += kept;
    *count = total;
    return absl::OkStatus();
  }

  absl::Status WriteInGroups(int64_t* out_keys, T* out_values) {
    int64_t offset = 0;
    for (size_t i = 0; i < groups_.size(); ++i) {
      if (kept_[i] == 0) continue;
      TempScratch scratch(ctx_);
      gpu::DirectConvForwardGpu<T> conv;
      gpu::Report report;
      TF_RETURN_IF_ERROR(RunGroup(groups_[i], &scratch, &conv, &report));
      if (report.count != kept_[i]) {
        return errors::Internal("DirectSparseConv: examples ", groups_[i].first, "..", groups_[i].second - 1,
                                " kept ", report.count, " entries on the second pass, ", kept_[i], " on the first");
      }
      TF_RETURN_IF_ERROR(::tf_sparseconv::ToStatus(
          conv.Write(stream_, out_keys + offset, out_values + offset), scratch, op_));
      offset += kept_[i];
    }
    return absl::OkStatus();
  }

  absl::Status RunGroup(const std::pair<int64_t, int64_t>& g, TempScratch* scratch,
                        gpu::DirectConvForwardGpu<T>* conv, gpu::Report* report) {
    const int64_t segments = args_.in_layout.batch * args_.cout;
    int64_t* group_touched = group_counts_.flat<int64_t>().data();
    int64_t* group_positive = group_touched + segments;
    gpu::DirectConvGpuArgs<T> part = args_;
    part.keys = args_.keys + begin_[g.first];
    part.values = args_.values + begin_[g.first];
    part.n = begin_[g.second] - begin_[g.first];
    TF_RETURN_IF_ERROR(CheckSortable(gpu::ContributionSlots(part.n, args_.weights.max_row), "DirectSparseConv",
                                     "contributions of one group of examples (temp_limit_bytes)"));
    return ::tf_sparseconv::ToStatus(conv->Run(stream_, scratch, part, bias_, attrs_.selection, k_,
                                               DirectConvDataflow::kSort, group_touched, group_positive,
                                               report),
                                     *scratch, op_);
  }

  OpKernelContext* const ctx_;
  const ConvAttrs attrs_;
  Cache* const cache_;
  std::shared_ptr<const WeightTableCache::Entry> tables_;
  gpu::DirectConvGpuArgs<T> args_;
  const T* bias_ = nullptr;
  int64_t k_ = 0;
  double temp_limit_ = 0;
  DirectConvDataflow dataflow_ = DirectConvDataflow::kAuto;  // attrs_.dataflow, or the sort under a temp limit
  bool in_groups_ = false;
  bool no_wait_ = false;
  int64_t* status_ = nullptr;  // the status output, for WritePadded
  gpu::DirectConvForwardGpu<T> conv_;
  // In groups: the first entry of each example, the groups, each group's kept entries, and
  // the [2, B * Cout] counts the groups' runs write before they are copied out.
  std::vector<int64_t> begin_;
  std::vector<std::pair<int64_t, int64_t>> groups_;
  std::vector<int64_t> kept_;
  Tensor group_counts_;
};

// The data checks run on the device with the gradients.
template <typename T>
class DirectSparseConvBackpropFunctor<GPUDevice, T> : GpuFunctorBase {
 public:
  using Cache = WeightTableCache;

  DirectSparseConvBackpropFunctor(OpKernelContext* ctx, DirectConvDataflow dataflow, bool inputs_checked,
                                  Cache* cache)
      : GpuFunctorBase(ctx, "DirectSparseConvBackprop"),
        ctx_(ctx),
        dataflow_(dataflow),
        inputs_checked_(inputs_checked),
        cache_(cache) {}

  absl::Status Prepare(const ConvTensors<T>& in, const int64_t* out_keys, const T* out_grad, int64_t n_out) {
    TF_RETURN_IF_ERROR(GpuConvArgs(ctx_, &scratch_, cache_, in, &tables_, &args_));
    args_.deterministic = tensorflow::OpDeterminismRequired();  // the forward's 'auto' rule (UseDenseGrid)
    out_keys_ = out_keys;
    out_grad_ = out_grad;
    n_out_ = n_out;
    return absl::OkStatus();
  }

  absl::Status Run(T* in_grad, T* filter_grad, T* bias_grad) {
    if (inputs_checked_) {  // no report: queued without checks, not waited for
      return ToStatus(gpu::DirectConvBackpropGpu<T>(stream_, &scratch_, args_, out_keys_, out_grad_, n_out_,
                                                    dataflow_, in_grad, filter_grad, bias_grad, nullptr));
    }
    gpu::Report report;
    TF_RETURN_IF_ERROR(ToStatus(gpu::DirectConvBackpropGpu<T>(stream_, &scratch_, args_, out_keys_, out_grad_,
                                                              n_out_, dataflow_, in_grad, filter_grad, bias_grad,
                                                              &report)));
    const KeyLayout& L = args_.in_layout;
    TF_RETURN_IF_ERROR(
        EntryReportStatus(report, gpu::kBackpropKeys, gpu::kBackpropValues, L.num_keys(), "input", "input values"));
    TF_RETURN_IF_ERROR(NaNStatus(report.checks[gpu::kBackpropFilter], "filter"));
    return SortedKeysStatus(report.checks[gpu::kBackpropOutKeys], L.WithChannels(args_.cout).num_keys(), "output");
  }

 private:
  OpKernelContext* const ctx_;
  const DirectConvDataflow dataflow_;
  const bool inputs_checked_;
  Cache* const cache_;
  std::shared_ptr<const WeightTableCache::Entry> tables_;
  gpu::DirectConvGpuArgs<T> args_;
  const int64_t* out_keys_ = nullptr;
  const T* out_grad_ = nullptr;
  int64_t n_out_ = 0;
};

#define REGISTER_GPU(T)                                                 \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>DirectSparseConv")         \
                              .Device(::tensorflow::DEVICE_GPU)         \
                              .TypeConstraint<T>("T")                   \
                              .HostMemory("dense_shape")                \
                              .HostMemory("filter_mask")                \
                              .HostMemory("out_dense_shape"),           \
                          DirectSparseConvOp<GPUDevice, T>);            \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>DirectSparseConvBackprop") \
                              .Device(::tensorflow::DEVICE_GPU)         \
                              .TypeConstraint<T>("T")                   \
                              .HostMemory("dense_shape")                \
                              .HostMemory("filter_mask"),               \
                          DirectSparseConvBackpropOp<GPUDevice, T>);
REGISTER_GPU(float);
REGISTER_GPU(double);
#undef REGISTER_GPU
namespace {

// DirectSparseConvReportStatus on the GPU: the statuses stay in device memory; ComputeAsync
// queues their copy into pinned host memory and returns, and TensorFlow's EventMgr checks
// them once the stream has passed the copy. No thread waits, and no op takes an output of
// this one, so the ops after the convolutions are queued while the GPU works; the step's
// function ends with the error, if any, once the check has run.
class DirectSparseConvReportStatusGpuOp : public tensorflow::AsyncOpKernel {
 public:
  explicit DirectSparseConvReportStatusGpuOp(tensorflow::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sources", &sources_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    static constexpr char kOp[] = "DirectSparseConvReportStatus";
    tensorflow::OpInputList statuses;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->input_list("statuses", &statuses), done);
    OP_REQUIRES_OK_ASYNC(ctx, StatusesError(statuses, sources_, kOp, nullptr), done);
    const int64_t n = statuses.size();
    tensorflow::AllocatorAttributes pinned;
    pinned.set_on_host(true);
    pinned.set_gpu_compatible(true);
    Tensor host;
    OP_REQUIRES_OK_ASYNC(
        ctx, ctx->allocate_temp(tensorflow::DT_INT64, TensorShape({n * kConvStatusSize}), &host, pinned), done);
    ::stream_executor::Stream* stream = ctx->op_device_context()->stream();
    constexpr uint64_t kBytes = kConvStatusSize * sizeof(int64_t);
    for (int64_t i = 0; i < n; ++i) {
      const ::stream_executor::DeviceAddressBase status(
          const_cast<int64_t*>(statuses[static_cast<int>(i)].flat<int64_t>().data()), kBytes);
      OP_REQUIRES_OK_ASYNC(ctx, stream->Memcpy(host.flat<int64_t>().data() + i * kConvStatusSize, status, kBytes),
                           done);
    }
    CountDeferredReadBack();
    // The callback holds the inputs (their device memory until the copy has run) and the
    // pinned buffer; the executor holds the context until done().
    std::vector<Tensor> held;
    for (int64_t i = 0; i < n; ++i) held.push_back(statuses[static_cast<int>(i)]);
    ctx->device()->tensorflow_accelerator_device_info()->event_mgr->ThenExecute(
        stream, [ctx, host, held = std::move(held), sources = sources_, done = std::move(done)]() {
          const int64_t* values = host.flat<int64_t>().data();
          for (size_t i = 0; i < sources.size(); ++i) {
            const absl::Status failed = ConvStatusError(values + i * kConvStatusSize);
            if (!failed.ok()) {
              ctx->SetStatus(errors::InvalidArgument(sources[i], ": ", failed.message()));
              break;
            }
          }
          done();
        });
  }

 private:
  std::vector<std::string> sources_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("TfSparseconv>DirectSparseConvCheckStatus")
                            .Device(::tensorflow::DEVICE_GPU)
                            .HostMemory("statuses"),
                        HostStatusesOp);
REGISTER_KERNEL_BUILDER(Name("TfSparseconv>DirectSparseConvReportStatus").Device(::tensorflow::DEVICE_GPU),
                        DirectSparseConvReportStatusGpuOp);

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA

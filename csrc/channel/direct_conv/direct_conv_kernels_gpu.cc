// GPU kernels of DirectSparseConv and DirectSparseConvBackprop: the checks of the CPU
// kernels (shapes here, data on the device) and the allocation; the arithmetic is in
// direct_conv.cu. dense_shape and filter_mask live in host memory: the present
// weights are listed on the host, as on the CPU, and sent to the device as a table.
#if GOOGLE_CUDA

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <utility>
#include <vector>

#include "channel/channel_sparse_gpu.h"
#include "channel/direct_conv/direct_conv.h"
#include "channel/direct_conv/direct_conv_checks.h"
#include "channel/direct_conv/direct_conv_gpu.h"
#include "common/gpu_kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_sparseconv {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
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

// Host-side checks of inputs 0-4 and the weight table.
template <typename T>
absl::Status PrepareGpuConv(OpKernelContext* ctx, ConvShapes* shapes, WeightTable* table,
                            gpu::DirectConvGpuArgs<T>* args) {
  const Tensor& keys = ctx->input(0);
  const Tensor& values = ctx->input(1);
  const Tensor& filter = ctx->input(3);
  const Tensor& mask = ctx->input(4);
  KeyLayout L;
  TF_RETURN_IF_ERROR(MakeKeyLayout(ctx->input(2), &L));
  TF_RETURN_IF_ERROR(CheckKeysVector(keys, "input"));
  TF_RETURN_IF_ERROR(CheckConvShapes(keys, values, filter, mask, L, shapes));
  const PresentWeights weights =
      BuildPresentWeights(mask.flat<bool>().data(), shapes->kernel_size, L.channels,
                          shapes->cout, L);
  *table = ByInputChannel(weights, L.d);
  args->in_layout = L;
  args->cout = shapes->cout;
  args->keys = keys.flat<int64_t>().data();
  args->values = values.flat<T>().data();
  args->n = keys.NumElements();
  args->filter = filter.flat<T>().data();
  args->filter_size = filter.NumElements();
  args->weights = table->View();
  return absl::OkStatus();
}

// TF_SPARSECONV_DIRECT_DATAFLOW: "auto" (or unset), "sort" or "dense" (direct_conv_gpu.h).
absl::Status DataflowFromEnvironment(gpu::DirectConvDataflow* dataflow) {
  static constexpr const char* kChoices[] = {"auto", "sort", "dense"};  // DirectConvDataflow's order
  return EnumFromEnvironment("TF_SPARSECONV_DIRECT_DATAFLOW", kChoices, dataflow);
}

// TF_SPARSECONV_DIRECT_TEMP_LIMIT_MB: a limit in MiB on the sort dataflow's contribution
// buffers (0 or unset: none). Where the buffers of one run would exceed it, the forward runs
// in groups of whole examples, each within the limit where one example fits it.
absl::Status TempLimitFromEnvironment(int64_t* bytes) {
  *bytes = 0;
  const char* text = std::getenv("TF_SPARSECONV_DIRECT_TEMP_LIMIT_MB");
  if (text == nullptr || *text == '\0') return absl::OkStatus();
  char* end = nullptr;
  errno = 0;
  const long long mib = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0' || mib < 0 || mib > (1LL << 40)) {
    return errors::InvalidArgument("TF_SPARSECONV_DIRECT_TEMP_LIMIT_MB must be a non-negative whole number of MiB "
                                   "(0: no limit), got \"", text, "\"");
  }
  *bytes = static_cast<int64_t>(mib) << 20;
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

}  // namespace

template <typename T>
class DirectSparseConvGpuOp : public OpKernel {
 public:
  explicit DirectSparseConvGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) { attrs_.Read(ctx); }

  void Compute(OpKernelContext* ctx) override {
    ConvShapes shapes;
    WeightTable table;
    gpu::DirectConvGpuArgs<T> args;
    OP_REQUIRES_OK(ctx, PrepareGpuConv<T>(ctx, &shapes, &table, &args));
    const Tensor& bias = ctx->input(5);
    OP_REQUIRES_OK(ctx, CheckBiasShape(bias, shapes.cout));
    const KeyLayout& L = args.in_layout;
    gpu::DirectConvDataflow dataflow = gpu::DirectConvDataflow::kAuto;
    OP_REQUIRES_OK(ctx, DataflowFromEnvironment(&dataflow));
    int64_t temp_limit = 0;
    OP_REQUIRES_OK(ctx, TempLimitFromEnvironment(&temp_limit));
    // In groups, each group's contributions are checked against the sort's limit instead.
    const bool sort = !gpu::UseDenseGrid(args, dataflow);
    const bool in_groups = sort && temp_limit > 0 && L.batch > 1 && args.n > 0 &&
                           gpu::SortForwardBytes(args) > static_cast<double>(temp_limit);
    if (sort && !in_groups) {
      OP_REQUIRES_OK(ctx, CheckSortable(gpu::ContributionSlots(args.n, table.max_row),
                                        "DirectSparseConv",
                                        "contributions (entries x present weights of one input "
                                        "channel)"));
    }
    OP_REQUIRES(ctx, L.batch * shapes.cout <= gpu::kMaxSegments,
                errors::ResourceExhausted("DirectSparseConv on GPU supports at most 2^32 - 2 "
                                          "(batch, output channel) segments"));
    Tensor *out_shape, *touched, *positive;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ctx->input(2).shape(), &out_shape));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({L.batch, shapes.cout}), &touched));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({L.batch, shapes.cout}), &positive));
    auto shape_out = out_shape->flat<int64_t>();
    shape_out = ctx->input(2).flat<int64_t>();
    shape_out(L.d + 1) = shapes.cout;

    if (in_groups) {
      ComputeInGroups(ctx, args, bias.flat<T>().data(), static_cast<double>(temp_limit),
                      touched->flat<int64_t>().data(), positive->flat<int64_t>().data());
      return;
    }
    TempScratch scratch(ctx);
    gpu::DirectConvForwardGpu<T> conv;
    gpu::Report report;
    OP_REQUIRES_OK(ctx, ToStatus(conv.Run(GpuStream(ctx), &scratch, args, bias.flat<T>().data(),
                                          attrs_.selection, attrs_.EffectiveK(L.spatial_size), dataflow,
                                          touched->flat<int64_t>().data(),
                                          positive->flat<int64_t>().data(), &report),
                                 scratch, "DirectSparseConv"));
    OP_REQUIRES_OK(ctx, ReportStatus(report, L));
    Tensor *out_keys, *out_values;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({report.count}), &out_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({report.count}), &out_values));
    OP_REQUIRES_OK(ctx, ToStatus(conv.Write(GpuStream(ctx), out_keys->flat<int64_t>().data(),
                                            out_values->flat<T>().data()),
                                 scratch, "DirectSparseConv"));
  }

 private:
  static absl::Status ReportStatus(const gpu::Report& report, const KeyLayout& L) {
    TF_RETURN_IF_ERROR(SortedKeysStatus(report.checks[gpu::kConvKeys], L.num_keys(), "input"));
    TF_RETURN_IF_ERROR(NaNStatus(report.checks[gpu::kConvValues], "input values"));
    TF_RETURN_IF_ERROR(NaNStatus(report.checks[gpu::kConvFilter], "filter"));
    return NaNStatus(report.checks[gpu::kConvBias], "bias");
  }

  // The sort dataflow in groups of whole examples, each group's temporaries released before
  // the next: once to count every group's kept entries (and fill the counts), then, with
  // the output allocated, once more to write them. Twice the work for a peak of the output
  // and one group's temporaries instead of the whole batch's (direct_conv_gpu.h).
  void ComputeInGroups(OpKernelContext* ctx, const gpu::DirectConvGpuArgs<T>& args, const T* bias, double limit,
                       int64_t* touched, int64_t* positive) {
    const KeyLayout& L = args.in_layout;
    const gpu::Stream stream = GpuStream(ctx);
    std::vector<int64_t> begin(L.batch + 1);
    {
      // The groups are found from the keys, so they are checked over all entries first.
      TempScratch scratch(ctx);
      gpu::Report report;
      OP_REQUIRES_OK(ctx, ToStatus(gpu::DirectConvCheckInputs<T>(stream, &scratch, args, bias, &report), scratch,
                                   "DirectSparseConv"));
      OP_REQUIRES_OK(ctx, ReportStatus(report, L));
      OP_REQUIRES_OK(ctx, ToStatus(gpu::ExampleBegins(stream, &scratch, args.keys, args.n, L.batch,
                                                      L.channels * L.spatial_size, begin.data()),
                                   scratch, "DirectSparseConv"));
    }
    const double bytes_per_entry = gpu::SortForwardBytes(args) / static_cast<double>(args.n);
    const auto groups = ExampleGroups(begin, bytes_per_entry, limit);
    const int64_t segments = L.batch * args.cout;
    Tensor group_counts;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT64, TensorShape({2, segments}), &group_counts));
    int64_t* group_touched = group_counts.flat<int64_t>().data();
    int64_t* group_positive = group_touched + segments;
    const int64_t k = attrs_.EffectiveK(L.spatial_size);
    auto run_group = [&](const std::pair<int64_t, int64_t>& g, TempScratch* scratch,
                         gpu::DirectConvForwardGpu<T>* conv, gpu::Report* report) {
      gpu::DirectConvGpuArgs<T> part = args;
      part.keys = args.keys + begin[g.first];
      part.values = args.values + begin[g.first];
      part.n = begin[g.second] - begin[g.first];
      TF_RETURN_IF_ERROR(CheckSortable(gpu::ContributionSlots(part.n, args.weights.max_row), "DirectSparseConv",
                                       "contributions of one group of examples (TF_SPARSECONV_DIRECT_TEMP_LIMIT_MB)"));
      return ToStatus(conv->Run(stream, scratch, part, bias, attrs_.selection, k, gpu::DirectConvDataflow::kSort,
                                group_touched, group_positive, report),
                      *scratch, "DirectSparseConv");
    };
    std::vector<int64_t> kept(groups.size());
    for (size_t i = 0; i < groups.size(); ++i) {
      TempScratch scratch(ctx);
      gpu::DirectConvForwardGpu<T> conv;
      gpu::Report report;
      OP_REQUIRES_OK(ctx, run_group(groups[i], &scratch, &conv, &report));
      OP_REQUIRES_OK(ctx, ReportStatus(report, L));
      kept[i] = report.count;
      const int64_t first = groups[i].first * args.cout, count = (groups[i].second - groups[i].first) * args.cout;
      OP_REQUIRES_OK(ctx, ToStatus(gpu::CopyCounts(stream, touched + first, group_touched + first, count), scratch,
                                   "DirectSparseConv"));
      OP_REQUIRES_OK(ctx, ToStatus(gpu::CopyCounts(stream, positive + first, group_positive + first, count),
                                   scratch, "DirectSparseConv"));
    }
    int64_t total = 0;
    for (int64_t count : kept) total += count;
    Tensor *out_keys, *out_values;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total}), &out_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({total}), &out_values));
    int64_t offset = 0;
    for (size_t i = 0; i < groups.size(); ++i) {
      if (kept[i] == 0) continue;
      TempScratch scratch(ctx);
      gpu::DirectConvForwardGpu<T> conv;
      gpu::Report report;
      OP_REQUIRES_OK(ctx, run_group(groups[i], &scratch, &conv, &report));
      OP_REQUIRES(ctx, report.count == kept[i],
                  errors::Internal("DirectSparseConv: examples ", groups[i].first, "..", groups[i].second - 1,
                                   " kept ", report.count, " entries on the second pass, ", kept[i], " on the first"));
      OP_REQUIRES_OK(ctx, ToStatus(conv.Write(stream, out_keys->flat<int64_t>().data() + offset,
                                              out_values->flat<T>().data() + offset),
                                   scratch, "DirectSparseConv"));
      offset += kept[i];
    }
  }

  ConvAttrs attrs_;
};

template <typename T>
class DirectSparseConvBackpropGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    ConvShapes shapes;
    WeightTable table;
    gpu::DirectConvGpuArgs<T> args;
    OP_REQUIRES_OK(ctx, PrepareGpuConv<T>(ctx, &shapes, &table, &args));
    const Tensor& out_keys = ctx->input(5);
    const Tensor& out_grad = ctx->input(6);
    OP_REQUIRES_OK(ctx, CheckKeysVector(out_keys, "output"));
    OP_REQUIRES_OK(ctx, ValidateValuesMatchKeys(out_keys, out_grad, "output gradient"));
    Tensor *in_grad, *filter_grad, *bias_grad;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ctx->input(1).shape(), &in_grad));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, ctx->input(3).shape(), &filter_grad));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({shapes.cout}), &bias_grad));

    gpu::DirectConvDataflow dataflow = gpu::DirectConvDataflow::kAuto;
    OP_REQUIRES_OK(ctx, DataflowFromEnvironment(&dataflow));
    TempScratch scratch(ctx);
    gpu::Report report;
    OP_REQUIRES_OK(ctx, ToStatus(gpu::DirectConvBackpropGpu<T>(
                                     GpuStream(ctx), &scratch, args,
                                     out_keys.flat<int64_t>().data(), out_grad.flat<T>().data(),
                                     out_keys.NumElements(), dataflow, in_grad->flat<T>().data(),
                                     filter_grad->flat<T>().data(), bias_grad->flat<T>().data(),
                                     &report),
                                 scratch, "DirectSparseConvBackprop"));
    const KeyLayout& L = args.in_layout;
    OP_REQUIRES_OK(ctx, SortedKeysStatus(report.checks[gpu::kBackpropKeys], L.num_keys(), "input"));
    OP_REQUIRES_OK(ctx, NaNStatus(report.checks[gpu::kBackpropValues], "input values"));
    OP_REQUIRES_OK(ctx, NaNStatus(report.checks[gpu::kBackpropFilter], "filter"));
    OP_REQUIRES_OK(ctx, SortedKeysStatus(report.checks[gpu::kBackpropOutKeys],
                                         L.WithChannels(shapes.cout).num_keys(), "output"));
  }
};

#define REGISTER_GPU(T)                                                      \
  REGISTER_KERNEL_BUILDER(Name("DirectSparseConv")                           \
                              .Device(::tensorflow::DEVICE_GPU)              \
                              .TypeConstraint<T>("T")                        \
                              .HostMemory("dense_shape")                     \
                              .HostMemory("filter_mask")                     \
                              .HostMemory("out_dense_shape"),                \
                          DirectSparseConvGpuOp<T>);                         \
  REGISTER_KERNEL_BUILDER(Name("DirectSparseConvBackprop")                   \
                              .Device(::tensorflow::DEVICE_GPU)              \
                              .TypeConstraint<T>("T")                        \
                              .HostMemory("dense_shape")                     \
                              .HostMemory("filter_mask"),                    \
                          DirectSparseConvBackpropGpuOp<T>);
REGISTER_GPU(float);
REGISTER_GPU(double);
#undef REGISTER_GPU

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA

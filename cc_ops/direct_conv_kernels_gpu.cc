// GPU kernels of DirectSparseConv and DirectSparseConvBackprop: the checks of the CPU
// kernels (shapes here, data on the device) and the allocation; the arithmetic is in
// cuda/direct_conv.cu. dense_shape and filter_mask live in host memory: the present
// weights are listed on the host, as on the CPU, and sent to the device as a table.
#if GOOGLE_CUDA

#include <algorithm>
#include <cstdint>
#include <vector>

#include "direct_conv.h"
#include "direct_conv_checks.h"
#include "direct_conv_gpu.h"
#include "gpu_kernel_util.h"
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
        if (offset >= static_cast<int64_t>(offset_first.size())) offset_first.resize(offset + 1, -1);
        if (offset_first[offset] < 0) offset_first[offset] = static_cast<int64_t>(table.items.size());
        if (pw->filter_index >= static_cast<int64_t>(table.present.size())) {
          table.present.resize(pw->filter_index + 1, 0);
        }
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
  // Whole filter rows (all Cout of the last offset's last input channel) are addressable.
  table.present.resize(offset_first.size() * static_cast<size_t>(per_offset), 0);
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
    if (!gpu::UseDenseGrid(args, dataflow)) {
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

    TempScratch scratch(ctx);
    gpu::DirectConvForwardGpu<T> conv;
    gpu::Report report;
    OP_REQUIRES_OK(ctx, ToStatus(conv.Run(GpuStream(ctx), &scratch, args, bias.flat<T>().data(),
                                          attrs_.selection, attrs_.EffectiveK(L.spatial_size), dataflow,
                                          touched->flat<int64_t>().data(),
                                          positive->flat<int64_t>().data(), &report),
                                 scratch, "DirectSparseConv"));
    OP_REQUIRES_OK(ctx, SortedKeysStatus(report.checks[gpu::kConvKeys], L.num_keys(), "input"));
    OP_REQUIRES_OK(ctx, NaNStatus(report.checks[gpu::kConvValues], "input values"));
    OP_REQUIRES_OK(ctx, NaNStatus(report.checks[gpu::kConvFilter], "filter"));
    OP_REQUIRES_OK(ctx, NaNStatus(report.checks[gpu::kConvBias], "bias"));
    Tensor *out_keys, *out_values;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({report.count}), &out_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({report.count}), &out_values));
    OP_REQUIRES_OK(ctx, ToStatus(conv.Write(GpuStream(ctx), out_keys->flat<int64_t>().data(),
                                            out_values->flat<T>().data()),
                                 scratch, "DirectSparseConv"));
  }

 private:
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

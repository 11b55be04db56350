// The OpKernels of DirectSparseConv and DirectSparseConvBackprop, one template each for both
// devices: the attribute and shape checks and the allocation here; the data checks and the
// arithmetic in DirectSparseConvFunctor / DirectSparseConvBackpropFunctor<Device, T> (CPU:
// direct_conv_kernels.cc over the functors of direct_conv.h; GPU: direct_conv_kernels_gpu.cc
// over direct_conv.cu).
//
// The data checks (keys sorted, unique and in range: "input", "output"; no NaN in "input
// values", "filter", "bias") are the functors': the CPU runs them on the host in Prepare,
// before anything is allocated; the GPU runs them on the device with the work (Count,
// Run), their results read back in the op's one host round trip and turned into the same
// messages (channel_sparse_gpu.h). The GPU's Prepare instead lists the present weights,
// chooses its dataflow and refuses inputs beyond its limits (sort sizes, segments).
#ifndef TF_SPARSECONV_CHANNEL_DIRECT_CONV_DIRECT_CONV_KERNELS_H_
#define TF_SPARSECONV_CHANNEL_DIRECT_CONV_DIRECT_CONV_KERNELS_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "channel/channel_sparse.h"
#include "channel/direct_conv/direct_conv.h"
#include "channel/direct_conv/direct_conv_checks.h"
#include "common/device.h"
#include "common/guarded_op_kernel.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tsl/profiler/lib/traceme.h"

namespace tf_sparseconv {

// The forward's and backward's inputs 0-4, their shapes checked.
template <typename T>
struct ConvTensors {
  KeyLayout layout;                   // [B, R..., Cin]
  ConvShapes shapes;
  const int64_t* keys = nullptr;
  const T* values = nullptr;
  int64_t n = 0;
  const T* filter = nullptr;          // [K..., Cin, Cout]
  int64_t filter_size = 0;
  const bool* mask = nullptr;         // host memory on both devices
  int64_t capacity = 0;               // the input's length: n, or n and padding after it
  bool padded = false;                // the op's padded_input
  bool out_padded = false;            // the backprop's padded_output: out_keys may end in padding

  // What both devices' arguments (DirectConvArgs, gpu::DirectConvGpuArgs) take from them.
  template <typename Args>
  void CopyTo(Args* a) const {
    a->in_layout = layout;
    a->cout = shapes.cout;
    a->keys = keys;
    a->values = values;
    a->n = n;
    a->filter = filter;
    a->filter_size = filter_size;
  }
};

// State an OpKernel keeps across its calls for its functors where a device has some (the
// GPU's present-weight tables, direct_conv_kernels_gpu.cc): none on the CPU.
struct NoConvCache {};

// DirectSparseConv, per device:
//   using Cache = ...;  // the kernel's state across calls, given to every call's functor
//   DirectSparseConvFunctor(OpKernelContext* ctx, const ConvAttrs& attrs, Cache* cache);
//   absl::Status Prepare(const ConvTensors<T>& in, const T* bias);
//   static constexpr bool kPaddedOutputFirst;
//   void GivePaddedOutput(int64_t* out_keys, T* out_values, int64_t capacity, bool capped);
//     Where kPaddedOutputFirst, a padded output is allocated before Count and given here (the
//     GPU writes the touched set into it where that is the output). capped: capacity is a
//     user-given max_entries below the proven bound, which the kept entries may exceed: the
//     writes then stop at capacity, and an overflow the host does not see (count
//     kCountOnDevice) goes to the status output's capacity slot.
//   absl::Status Count(int64_t* touched_counts, int64_t* positive_counts, int64_t* count);
//     The convolution, bias and k-selection; fills both [B, Cout] counts; *count = the
//     kept entries.
//   bool Staged(int64_t count, Tensor* out_keys, Tensor* out_values);
//     Where the kept entries already lie in buffers of the functor's (the CPU's k-selected
//     path stages them in per-segment slots, compacted in place), those buffers, set as
//     outputs 0 and 1 instead of allocating and copying; otherwise false.
//   absl::Status Write(int64_t* out_keys, T* out_values);  // the kept entries in key order
//   absl::Status WritePadded(int64_t count, int64_t capacity, int64_t* out_keys, T* out_values);
//     padded_output: the kept entries, then padding up to capacity. count is Count's, or
//     kCountOnDevice where the GPU queued its work without waiting (inputs_checked).
//   absl::Status WriteStatus(int64_t* status);  // the status output (kConvStatusSize values),
//     or, on the GPU with padded_output, where WritePadded (called next) writes it.
template <typename Device, typename T>
class DirectSparseConvFunctor;

// Count's count where the GPU's functor did not wait for its device (padded_output with
// inputs_checked): the kept entries are known on the device only.
constexpr int64_t kCountOnDevice = -1;

// DirectSparseConvBackprop, per device:
//   using Cache = ...;
//   DirectSparseConvBackpropFunctor(OpKernelContext* ctx, DirectConvDataflow dataflow,
//                                   bool inputs_checked,  // the op's attr of that name
//                                   Cache* cache);
//   absl::Status Prepare(const ConvTensors<T>& in, const int64_t* out_keys,
//                        const T* out_grad, int64_t n_out);
//   absl::Status Run(T* in_grad, T* filter_grad, T* bias_grad);  // Eq. 3; a gradient
//                                                                 // nullptr: not computed
template <typename Device, typename T>
class DirectSparseConvBackpropFunctor;

// Inputs 0-4 (keys, values, dense_shape, filter, filter_mask) of both ops. A padded input
// (padded_input): on the CPU, n is its live prefix, the whole input checked first; on the
// GPU, n is its length, and the kernels skip the padding (EntriesToRead).
template <typename Device, typename T>
absl::Status CheckConvTensors(tensorflow::OpKernelContext* ctx, bool padded_input, ConvTensors<T>* in) {
  const tensorflow::Tensor& keys = ctx->input(0);
  const tensorflow::Tensor& values = ctx->input(1);
  const tensorflow::Tensor& filter = ctx->input(3);
  const tensorflow::Tensor& mask = ctx->input(4);
  TF_RETURN_IF_ERROR(CheckSparseTensor(keys, values, ctx->input(2), "input", &in->layout));
  TF_RETURN_IF_ERROR(CheckConvShapes(filter, mask, in->layout, &in->shapes));
  // Per-segment tables of the input (B * Cin) and of the output (B * Cout).
  TF_RETURN_IF_ERROR(CheckSegmentCount(in->layout.batch, in->layout.channels, "input"));
  TF_RETURN_IF_ERROR(CheckSegmentCount(in->layout.batch, in->shapes.cout, "output"));
  in->keys = keys.flat<int64_t>().data();
  in->values = values.flat<T>().data();
  in->capacity = keys.NumElements();
  in->n = in->capacity;
  in->padded = padded_input;
  TF_RETURN_IF_ERROR((EntriesToRead<Device, T>(in->keys, in->values, in->capacity, padded_input, in->layout, "input",
                                                "input values", &in->n)));
  in->filter = filter.flat<T>().data();
  in->filter_size = filter.NumElements();
  in->mask = mask.flat<bool>().data();
  return absl::OkStatus();
}

template <typename Device, typename T>
class DirectSparseConvOp : public GuardedOpKernel {
 public:
  explicit DirectSparseConvOp(tensorflow::OpKernelConstruction* ctx) : GuardedOpKernel(ctx, "direct_conv") {
    AttrsOk(attrs_.Read(ctx));
    AttrsOk(ctx->GetAttr("padded_input", &padded_input_));
  }

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    using ::tensorflow::Tensor;
    using ::tensorflow::TensorShape;
    ConvTensors<T> in;
    OP_REQUIRES_OK(ctx, (CheckConvTensors<Device, T>(ctx, padded_input_, &in)));
    const Tensor& bias = ctx->input(5);
    const int64_t cout = in.shapes.cout;
    OP_REQUIRES_OK(ctx, CheckBiasShape(bias, cout));
    DirectSparseConvFunctor<Device, T> conv(ctx, attrs_, &cache_);
    {
      tsl::profiler::TraceMe trace("DirectSparseConv prepare", kTraceLevel);
      OP_REQUIRES_OK(ctx, conv.Prepare(in, bias.flat<T>().data()));
    }
    const KeyLayout& L = in.layout;
    Tensor *out_shape, *touched, *positive;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ctx->input(2).shape(), &out_shape));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({L.batch, cout}), &touched));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({L.batch, cout}), &positive));
    auto shape_out = out_shape->flat<int64_t>();
    shape_out = ctx->input(2).flat<int64_t>();
    shape_out(L.d + 1) = cout;
    // A padded output's size is known from the shapes. The GPU allocates it first and may
    // write the touched set straight into it; the CPU after Count, as the exact output (its
    // temporaries would otherwise add to the peak the memory planner bounds).
    Tensor *out_keys = nullptr, *out_values = nullptr;
    // A user-given max_entries caps it; more kept entries than that are refused.
    const int64_t bound =
        attrs_.padded_output ? OutputCapacity(attrs_, L, cout, in.mask, in.filter_size, in.capacity) : 0;
    const bool capped = attrs_.padded_output && attrs_.max_entries > 0 && attrs_.max_entries < bound;
    const int64_t capacity = capped ? attrs_.max_entries : bound;
    if (attrs_.padded_output && DirectSparseConvFunctor<Device, T>::kPaddedOutputFirst) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({capacity}), &out_keys));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({capacity}), &out_values));
      conv.GivePaddedOutput(out_keys->flat<int64_t>().data(), out_values->flat<T>().data(), capacity, capped);
    }
    int64_t m = 0;
    {
      tsl::profiler::TraceMe trace("DirectSparseConv count", kTraceLevel);
      OP_REQUIRES_OK(ctx, conv.Count(touched->flat<int64_t>().data(), positive->flat<int64_t>().data(), &m));
    }
    OP_REQUIRES(ctx, attrs_.max_entries == 0 || m == kCountOnDevice || m <= attrs_.max_entries,
                CapacityError(m, attrs_.max_entries));
    Tensor* status;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(5, TensorShape({kConvStatusSize}), &status));
    OP_REQUIRES_OK(ctx, conv.WriteStatus(status->flat<int64_t>().data()));
    if (attrs_.padded_output) {
      if (out_keys == nullptr) {
        OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({capacity}), &out_keys));
        OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({capacity}), &out_values));
      }
      OP_REQUIRES_OK(ctx, conv.WritePadded(m, capacity, out_keys->flat<int64_t>().data(),
                                           out_values->flat<T>().data()));
      return;
    }
    Tensor staged_keys, staged_values;
    if (conv.Staged(m, &staged_keys, &staged_values)) {
      ctx->set_output(0, staged_keys);
      ctx->set_output(1, staged_values);
      return;
    }
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m}), &out_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({m}), &out_values));
    OP_REQUIRES_OK(ctx, conv.Write(out_keys->flat<int64_t>().data(), out_values->flat<T>().data()));
  }

 private:
  ConvAttrs attrs_;
  bool padded_input_ = false;
  typename DirectSparseConvFunctor<Device, T>::Cache cache_;
};

template <typename Device, typename T>
class DirectSparseConvBackpropOp : public GuardedOpKernel {
 public:
  explicit DirectSparseConvBackpropOp(tensorflow::OpKernelConstruction* ctx)
      : GuardedOpKernel(ctx, "direct_conv_backprop") {
    AttrsOk(ReadDataflow(ctx, &dataflow_));
    AttrsOk(ctx->GetAttr("inputs_checked", &inputs_checked_));
    AttrsOk(ctx->GetAttr("padded_input", &padded_input_));
    AttrsOk(ctx->GetAttr("padded_output", &padded_output_));
  }

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    using ::tensorflow::Tensor;
    using ::tensorflow::TensorShape;
    ConvTensors<T> in;
    OP_REQUIRES_OK(ctx, (CheckConvTensors<Device, T>(ctx, padded_input_, &in)));
    const Tensor& out_keys = ctx->input(5);
    const Tensor& out_grad = ctx->input(6);
    OP_REQUIRES_OK(ctx, CheckKeysVector(out_keys, "output"));
    OP_REQUIRES_OK(ctx, ValidateValuesMatchKeys(out_keys, out_grad, "output gradient"));
    // A padded forward output: the CPU reads its live prefix (out_grad of padding is ignored).
    int64_t n_out = out_keys.NumElements();
    OP_REQUIRES_OK(ctx, (EntriesToRead<Device, T>(out_keys.flat<int64_t>().data(), out_grad.flat<T>().data(), n_out,
                                                   padded_output_, in.layout.WithChannels(in.shapes.cout), "output",
                                                   nullptr, &n_out)));
    in.out_padded = padded_output_;
    DirectSparseConvBackpropFunctor<Device, T> backprop(ctx, dataflow_, inputs_checked_, &cache_);
    {
      tsl::profiler::TraceMe trace("DirectSparseConvBackprop prepare", kTraceLevel);
      OP_REQUIRES_OK(ctx, backprop.Prepare(in, out_keys.flat<int64_t>().data(), out_grad.flat<T>().data(), n_out));
    }
    Tensor *in_grad, *filter_grad, *bias_grad;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ctx->input(1).shape(), &in_grad));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, ctx->input(3).shape(), &filter_grad));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({in.shapes.cout}), &bias_grad));
    // A gradient no op reads (a network's first convolution's input gradient in a training
    // step, where the executor knows it) is allocated but not computed.
    T* const in_grad_data = ctx->output_required(0) ? in_grad->flat<T>().data() : nullptr;
    T* const filter_grad_data = ctx->output_required(1) ? filter_grad->flat<T>().data() : nullptr;
    {
      tsl::profiler::TraceMe trace("DirectSparseConvBackprop run", kTraceLevel);
      OP_REQUIRES_OK(ctx, backprop.Run(in_grad_data, filter_grad_data, bias_grad->flat<T>().data()));
    }
    if (std::is_same<Device, CPUDevice>::value && in_grad_data != nullptr) {
      std::fill(in_grad_data + in.n, in_grad_data + in.capacity, T(0));  // the padding's (the GPU's kernel writes it)
    }
  }

 private:
  DirectConvDataflow dataflow_ = DirectConvDataflow::kAuto;
  bool inputs_checked_ = false;
  bool padded_input_ = false;
  bool padded_output_ = false;
  typename DirectSparseConvBackpropFunctor<Device, T>::Cache cache_;
};

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_DIRECT_CONV_DIRECT_CONV_KERNELS_H_

// Registration and shape functions of the direct sparse convolution ops.
#include "channel/direct_conv/direct_conv_checks.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_sparseconv {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("TfSparseconv>DirectSparseConv")
    .Input("in_keys: int64")
    .Input("in_values: T")
    .Input("dense_shape: int64")
    .Input("filter: T")
    .Input("filter_mask: bool")
    .Input("bias: T")
    .Output("out_keys: int64")
    .Output("out_values: T")
    .Output("out_dense_shape: int64")
    .Output("touched_counts: int64")
    .Output("positive_counts: int64")
    .Output("status: int64")
    .Attr("T: {float, double}")
    .Attr("selection: {'none', 'signed', 'abs'} = 'none'")
    .Attr("k: int = 0")
    .Attr("rho_up: float = 0")
    .Attr("dataflow: {'auto', 'sort', 'dense', 'bitmap', 'atomic'} = 'auto'")
    .Attr("temp_limit_bytes: int = 0")
    .Attr("activation: {'none', 'relu'} = 'none'")
    .Attr("padded_input: bool = false")
    .Attr("padded_output: bool = false")
    .Attr("inputs_checked: bool = false")
    .Attr("max_entries: int = 0")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 1, &unused));
      ShapeHandle filter = c->input(3);
      DimensionHandle cout = c->UnknownDim();
      if (c->RankKnown(filter)) cout = c->Dim(filter, c->Rank(filter) - 1);
      const DimensionHandle n = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Vector(n));
      c->set_output(2, c->input(2));
      c->set_output(3, c->Matrix(c->UnknownDim(), cout));
      c->set_output(4, c->Matrix(c->UnknownDim(), cout));
      c->set_output(5, c->Vector(kConvStatusSize));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Direct sparse convolution of a channel-sparse tensor (Hackel et al., Algorithm 1).

Cross-correlation with stride 1 and 'same' zero padding; only weights whose
filter_mask entry is true are visited. The output support is the set of positions
reached by a present entry through a present weight; the bias is added there only.
With selection 'signed' (largest values) or 'abs' (largest magnitudes), at most k
entries per (batch, output channel) are kept, ties going to the smaller key;
k = ceil(rho_up * R1 * ... * Rd) when rho_up is given instead of k.

dataflow chooses how the touched set is formed, the same two ways on both devices, with
the same result: 'sort' takes the contributions in output-key order and sums them per key,
its memory following the contributions (the GPU radix-sorts them, the CPU k-way merges
the sorted stream of each present weight); 'dense' works in buffers over the grid, its
memory following B * R1 * ... * Rd. 'bitmap' (GPU only; the CPU refuses it) marks a bit per
input and per output key and reads the touched keys from the output bits in order, without
a sort. 'atomic' (GPU only; refused on the CPU and under op determinism) finds the touched
keys as 'bitmap' does, then adds every contribution to its output with a float atomic: no
sort and no search, the same touched set, values within rounding (their last bits vary run
to run). 'auto' picks per call by each device's rule (the GPU: by temporary memory, never
'atomic' under op determinism; the CPU: a cost model).
temp_limit_bytes caps the contribution buffers of the GPU's sort (0: no cap): where those of
the whole batch would exceed it, the forward runs in groups of whole examples, twice the
work for a lower peak, with the same result. The CPU's sort merges streams and holds no such
buffers, so the cap always holds there; 'dense' needs none.
activation 'relu' keeps only the kept entries with value > 0: SparseRelu fused into the
op, with the same output as SparseRelu of the unfused output but no second op (on the
GPU, no second host round trip). A NaN among the touched entries is then refused
(InvalidArgument), as SparseRelu refuses NaN input.

padded_input: the input may end in padding (keys equal to the largest int64, after every
  live key; a library op's padded output), which is absent; elsewhere such a key is out of
  range.
padded_output: the outputs have a length known before the op runs (the k-selection
  bound B * Cout * min(k, S), capped by the input's length times the present weights of
  an input channel; without selection B * Cout * S so capped): the live entries, then
  padding. On the GPU, with inputs_checked, the op then queues its work and returns
  without waiting for the device; its data checks land in `status`, which
  DirectSparseConvReportStatus (or DirectSparseConvCheckStatus) turns into the error later.
inputs_checked: the caller vouches that in_keys were made by one of the library's ops
  (sorted, unique, in range); the input keys are then not checked again on the GPU. Values,
  filter and bias are checked in any case.
max_entries: a cap on the kept entries (0: none); more are refused with InvalidArgument.
  With padded_output the outputs' length is then the smaller of the bound and max_entries;
  where the GPU did not wait for its count, an overflow goes to `status` (its capacity slot)
  and the output holds the first max_entries kept entries.

in_keys: sorted unique int64 keys of the input, layout (b * Cin + c) * S + lin(x).
in_values: one value per key.
dense_shape: [B, R1, ..., Rd, Cin]; B * Cin and B * Cout at most 2^24 (the op keeps a
  table entry per (batch, channel) segment).
filter: [K1, ..., Kd, Cin, Cout], odd kernel sizes.
filter_mask: same shape as filter; false marks a pruned weight.
bias: [Cout].
out_keys: sorted keys of the output, dense shape [B, R1, ..., Rd, Cout].
touched_counts: [B, Cout] support size of each output segment before k-selection.
positive_counts: [B, Cout] entries > 0 of each segment before k-selection (what a
  following ReLU would keep without the bound; the density of Eq. 4), with either
  activation.
status: [25] int64, the GPU's data checks and its count against max_entries of a
  padded_output call that did not wait for them (direct_conv_checks.h, kConvStatusSize);
  otherwise all -1 (passed).
)doc");

REGISTER_OP("TfSparseconv>DirectSparseConvBackprop")
    .Input("in_keys: int64")
    .Input("in_values: T")
    .Input("dense_shape: int64")
    .Input("filter: T")
    .Input("filter_mask: bool")
    .Input("out_keys: int64")
    .Input("out_grad: T")
    .Output("in_grad: T")
    .Output("filter_grad: T")
    .Output("bias_grad: T")
    .Attr("T: {float, double}")
    .Attr("dataflow: {'auto', 'sort', 'dense', 'bitmap', 'atomic'} = 'auto'")
    .Attr("inputs_checked: bool = false")
    .Attr("padded_input: bool = false")
    .Attr("padded_output: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      c->set_output(1, c->input(3));
      ShapeHandle filter = c->input(3);
      DimensionHandle cout = c->UnknownDim();
      if (c->RankKnown(filter)) cout = c->Dim(filter, c->Rank(filter) - 1);
      c->set_output(2, c->Vector(cout));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Gradients of DirectSparseConv (Hackel et al., Algorithm 2 and Eq. 3): the input
gradient exists only at the input entries, the filter gradient only at present
weights, and the bias gradient sums over the kept output entries.

dataflow: the forward's; 'sort', 'bitmap' and 'atomic' find the output entries by searching the
sorted out_keys, 'dense' through the dense output grid, 'auto' by each device's rule.
inputs_checked: the caller vouches that in_keys, in_values, filter and out_keys are the
inputs and output keys of a DirectSparseConv call, which checked them (its gradient does);
the GPU kernel then queues its work without checking them again and without waiting for
the device. The CPU kernel checks them in any case (its checks cost no wait).
padded_input: the forward's; padding entries of the input get a gradient of 0.
padded_output: the forward's; out_keys may end in padding, whose out_grad is ignored.
)doc");

REGISTER_OP("TfSparseconv>DirectSparseConvCheckStatus")
    .Input("data: T")
    .Input("statuses: N * int64")
    .Output("checked: T")
    .Attr("T: type")
    .Attr("N: int >= 1")
    .Attr("sources: list(string)")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc(R"doc(
data, unchanged, once the `status` outputs of DirectSparseConv calls with padded_output
show that their data checks passed; otherwise the first failed check's InvalidArgument,
prefixed with the name in `sources` of the call that failed. One wait for the device for
all of them (the statuses are read in host memory), and every op after it waits too;
to_dense uses DirectSparseConvReportStatus instead, which no op waits for.

statuses: N status outputs of DirectSparseConv.
sources: N names, one per status (the convolutions' op names).
)doc");

REGISTER_OP("TfSparseconv>DirectSparseConvReportStatus")
    .Input("statuses: N * int64")
    .Attr("N: int >= 1")
    .Attr("sources: list(string)")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
The first failed data check among the `status` outputs of DirectSparseConv calls with
padded_output, as InvalidArgument prefixed with the name in `sources` of the call that failed;
nothing where all passed. No op takes an output of it, so that no op waits for it: on the GPU
it copies the statuses to the host and returns, and checks them once the device has passed
the copy (no thread waits). A traced function that holds it (a stateful op) ends only once it
has run, with its error: at the latest at the end of the step, whose other ops (an
optimizer's updates among them) may have run by then.

statuses: N status outputs of DirectSparseConv.
sources: N names, one per status (the convolutions' op names).
)doc");

}  // namespace tf_sparseconv

// Registration of the site-sparse convolution ops: the gather-GEMM-scatter convolution over
// a kernel map (site/kernel_map/site_kernel_map_op.cc), its neighbour table and its filter
// gradient.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

#include "site/conv/site_conv_checks.h"

namespace tf_sparseconv {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("TfSparseconv>SiteSparseConv")
    .Input("features: T")
    .Input("filters: T")
    .Input("in_rows: int32")
    .Input("out_rows: int32")
    .Input("offset_splits: int32")
    .Input("num_out: int32")
    .Input("neighbours: int32")
    .Input("epilogue: epilogue_types")
    .Output("out_features: T")
    .Attr("T: {float, double, half, bfloat16}")
    .Attr("map_is_trusted: bool = false")
    .Attr("map_is_submanifold: bool = false")
    .Attr("map_is_table: bool = false")
    .Attr("dataflow: {'auto', 'pairs', 'outputs'} = 'auto'")
    .Attr("cpu_products: {'auto', 'avx2', 'portable'} = 'auto'")
    .Attr("epilogue_types: list({float, double}) >= 0 = []")
    .Attr("epsilon: float = 0.001")
    .Attr("activation: {'none', 'relu'} = 'none'")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle features, filters, neighbours;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(6), 1, &neighbours));
      TF_RETURN_IF_ERROR(c->WithRankAtMost(neighbours, 2, &neighbours));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &features));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &filters));
      DimensionHandle cin;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(features, 1), c->Dim(filters, 1), &cin));
      DimensionHandle rows = c->UnknownDim();
      const ::tensorflow::Tensor* num_out = c->input_tensor(5);
      if (num_out != nullptr) rows = c->MakeDim(num_out->scalar<int32_t>()());
      DimensionHandle cout = c->Dim(filters, 2);
      for (int i = 7; i < c->num_inputs(); ++i) {  // the epilogue's vectors: [Cout] each
        ShapeHandle column;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &column));
        TF_RETURN_IF_ERROR(c->Merge(cout, c->Dim(column, 0), &cout));
      }
      c->set_output(0, c->Matrix(rows, cout));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Sparse convolution of site features by gather-GEMM-scatter: for every kernel offset q,
out_features[out_rows[p]] += features[in_rows[p]] @ filters[q] over q's pairs.
filters is [K, Cin, Cout] (the kernel [k1, ..., kd, Cin, Cout] with its offsets
flattened). half and bfloat16 accumulate in float32 (on the GPU, from sm_80 for bfloat16
and sm_70 for half, their products run on tensor cores). On the GPU from sm_80, float
follows TensorFlow's TF32 setting (tf.config.experimental.enable_tensor_float_32_execution,
on by default, as for MatMul and Conv2D): its products then run on tensor cores with
each factor rounded to TF32 (10 mantissa bits) and float32 sums; where cin and cout are
multiples of 4. With TF32 off, or on the CPU, products are full float32. num_out is the
number of output sites.
neighbours: empty (shape [0]), or SiteNeighbourTable's table of this map (with
map_is_trusted). It changes no value beyond rounding: the GPU's output-stationary
dataflow reads it instead of building a table in the call; everywhere else it is checked
for its shape and not read.
dataflow: how the GPU computes the output (docs/gpu-kernels.md, "The site family"). 'pairs':
tiles of pairs, their products scatter-added onto the output rows (with atomics; under
TensorFlow's op determinism one launch per offset without them). 'outputs': tiles of
output rows from the neighbour table (given, or built in the call), each row computed over
all its offsets and stored once; on sm_80+ for kernels of at most 32 offsets whose rows
are whole 16-byte vectors (half and bfloat16, and float with TF32), InvalidArgument
elsewhere (double, float with TF32 off, older GPUs, other widths or kernels), which
names the reason; 'auto' chooses the pairs there.
'auto': 'outputs' for half and bfloat16 given a neighbour table or under op
determinism, 'pairs' otherwise. The CPU kernel has one dataflow, per-offset
gather-GEMM-scatter over the pairs: 'auto' and 'pairs' run it, 'outputs' is
InvalidArgument there.
cpu_products: the CPU kernel's products. 'auto': AVX-512 tiles where the CPU has AVX-512,
else AVX2 and FMA tiles where it has those (float, and half and bfloat16 converted to
float; both widths give the same bits), Eigen's GEMM otherwise; 'avx2': at most the AVX2
tiles (e.g. to test them on a CPU with AVX-512); 'portable': Eigen's GEMM always (the
portable path, e.g. to test it on a CPU with AVX2, or to match another machine's CPU
results). No effect on the GPU.
map_is_trusted: the caller promises that the map is valid (every in_rows[p] <
num_in, every out_rows[p] < num_out, at most one pair per output row and offset), as
SiteKernelMap's maps are by construction; tf_sparseconv's wrappers set it for those
maps only. The shape checks and the host-side checks of offset_splits stay either way.
On the GPU a trusted call skips the row checks and the NaN scan of the features,
which need a host round trip, so it enqueues its kernels without waiting for the
device; a NaN then propagates into the output instead of raising. The CPU kernel
checks rows and NaN features whatever the attr says (those checks cost no round trip
there). An untrusted map is checked on every device and a bad one raises
InvalidArgument; a trusted map that breaks the promise is undefined behaviour on the
GPU (out-of-bounds reads and writes).
map_is_submanifold: the caller promises that the map is a submanifold map whose
offsets pair up mirrored (offset q's pairs are offset volume - 1 - q's reversed), as
SiteKernelMap's 'submanifold' maps are by construction. It changes no value of this op;
its gradient then computes the input gradient over the same pairs with the filters
transposed and their offsets mirrored, reading the same neighbours table, instead of
over the reversed pairs without one. Requires map_is_trusted (the mirroring is not
checked), num_out == the number of input rows and an odd number of offsets
(InvalidArgument otherwise).
epilogue, epsilon, activation: what happens to each output value v of column c once its
sums are done, before it is rounded to T: act(n(v) * scale[c] + shift[c]). epilogue holds
no tensor (n(v) = v, scale 1, shift 0), one (shift: a bias), two (scale, shift), or four
(mean, variance, scale, shift: a batch norm in inference, n(v) = (v - mean[c]) /
sqrt(variance[c] + epsilon), epsilon > 0), each [Cout] and float32 (double for T =
double); activation 'relu' takes max(., 0), 'none' leaves the value. On the GPU's
output-stationary tiles the epilogue is applied as each row is stored, so a layer's bias,
batch norm and ReLU cost no pass over the rows of their own.
map_is_table: the map is the neighbours table alone (SiteSubmanifoldNeighbours', or
SiteNeighbourTable's of a SiteKernelMap submanifold map): in_rows and out_rows are empty,
offset_splits is volume + 1 zeros, and map_is_trusted and map_is_submanifold are set
(InvalidArgument otherwise). The map's pairs are then SiteTablePairs' of the table, and
no op before this one had to count them. The CPU derives them (checking the table's
rows); the GPU runs the output-stationary tiles from the table, so there it needs half or
bfloat16 with dataflow 'auto', or 'outputs', and the tiles' other requirements
(InvalidArgument otherwise, naming the reason).
)doc");

REGISTER_OP("TfSparseconv>SiteNeighbourTable")
    .Input("in_rows: int32")
    .Input("out_rows: int32")
    .Input("offset_splits: int32")
    .Input("num_in: int32")
    .Input("num_out: int32")
    .Output("neighbours: int32")
    .Attr("map_is_trusted: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle splits;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &splits));
      DimensionHandle width = c->UnknownDim();
      if (c->ValueKnown(c->Dim(splits, 0))) width = c->MakeDim(NeighbourTableWidth(c->Value(c->Dim(splits, 0)) - 1));
      DimensionHandle rows = c->UnknownDim();
      const ::tensorflow::Tensor* num_out = c->input_tensor(4);
      if (num_out != nullptr) rows = c->MakeDim(num_out->scalar<int32_t>()());
      c->set_output(0, c->Matrix(rows, width));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The output-major neighbour table of a kernel map with at most 32 offsets, for
SiteSparseConv's `neighbours` input: neighbours [num_out, volume + 2] int32.
neighbours[o, q] is the input row that feeds output row o through offset q (-1: none).
The last two columns list the output rows sorted by their neighbour masks (bit q set
where neighbours[o, q] >= 0; ascending, ties by row): at sorted position i,
neighbours[i, volume] is the mask and neighbours[i, volume + 1] the output row. num_in
and num_out are the numbers of input and output sites. Rows with equal masks then sit
together, so the tiles of the GPU's output-stationary dataflow multiply few empty rows.
Build the table once per map, like the map itself (the GPU kernel: one pass over the
pairs and a radix sort). The map is checked as SiteSparseConv checks it (map_is_trusted:
as there).
)doc");

REGISTER_OP("TfSparseconv>SiteSparseConvFilterGrad")
    .Input("features: T")
    .Input("out_grad: T")
    .Input("in_rows: int32")
    .Input("out_rows: int32")
    .Input("offset_splits: int32")
    .Output("filter_grad: T")
    .Attr("T: {float, double, half, bfloat16}")
    .Attr("map_is_trusted: bool = false")
    .Attr("cpu_products: {'auto', 'avx2', 'portable'} = 'auto'")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle features, out_grad, splits;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &features));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &out_grad));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &splits));
      DimensionHandle volume;
      TF_RETURN_IF_ERROR(c->Subtract(c->Dim(splits, 0), 1, &volume));
      c->set_output(0, c->MakeShape({volume, c->Dim(features, 1), c->Dim(out_grad, 1)}));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Gradient of SiteSparseConv with respect to its filters: filter_grad[q] =
features[in_rows]^T @ out_grad[out_rows] over offset q's pairs. float follows
TensorFlow's TF32 setting on the GPU from sm_80, as SiteSparseConv does.
map_is_trusted: as for SiteSparseConv, a promise that the map is valid. A trusted call
on the GPU skips the row checks and their host round trip; the CPU kernel checks the
rows regardless.
cpu_products: as for SiteSparseConv, the CPU kernel's widest tiles ('auto'), at most
AVX2 tiles ('avx2') or Eigen's GEMM ('portable').
)doc");

}  // namespace tf_sparseconv

// Registration of SiteKernelMap: which input site feeds which output site through which
// kernel offset, the map every site-sparse convolution op (site/conv/) takes.
#include "site/conv/site_conv.h"
#include "site/kernel_map/site_kernel_map_checks.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_sparseconv {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("TfSparseconv>SiteKernelMap")
    .Input("coords: int32")
    .Input("spatial_shape: int32")
    .Input("batch_size: int32")
    .Output("out_coords: int32")
    .Output("out_spatial_shape: int32")
    .Output("in_rows: int32")
    .Output("out_rows: int32")
    .Output("offset_splits: int32")
    .Attr("mode: {'submanifold', 'strided', 'transposed'}")
    .Attr("kernel_size: list(int) >= 1")
    .Attr("strides: list(int) >= 1")
    .Attr("padding: list(int) >= 1")
    .Attr("dilation: list(int) >= 1")
    .Attr("builder: {'hash', 'sort'} = 'hash'")
    .SetShapeFn([](InferenceContext* c) {
      std::vector<int> kernel;
      TF_RETURN_IF_ERROR(c->GetAttr("kernel_size", &kernel));
      // A volume the kernel refuses (kMaxKernelVolume, with its message) or a product that
      // overflows leaves the splits' length unknown here.
      int64_t volume = 1;
      bool known = true;
      for (int k : kernel) {
        known = known && k >= 1 && !__builtin_mul_overflow(volume, int64_t{k}, &volume) &&
                volume <= kMaxKernelVolume;
      }
      ShapeHandle coords;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &coords));
      c->set_output(0, c->Matrix(c->UnknownDim(), c->Dim(coords, 1)));
      c->set_output(1, c->Vector(static_cast<int64_t>(kernel.size())));
      c->set_output(2, c->Vector(c->UnknownDim()));
      c->set_output(3, c->Vector(c->UnknownDim()));
      c->set_output(4, c->Vector(known ? c->MakeDim(volume + 1) : c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The kernel map of a site-sparse convolution: which input site feeds which output site
through which kernel offset. coords [N, 1 + d] holds a batch index and d spatial
coordinates per site (unique, in range, any order). Outputs: the output sites
(out_coords: the input sites for 'submanifold'; otherwise every site some input
reaches, sorted by batch then coordinates), their spatial shape, and the pairs
(in_rows[p], out_rows[p]) grouped by kernel offset: offset q owns pairs
offset_splits[q] .. offset_splits[q + 1]. Build it once per geometry and reuse it in
every layer with that geometry. Conventions are spconv 2.x's (site_geometry.h).
builder: how the GPU kernel builds the map: 'hash' (a hash table of the sites, probed
per site and kernel offset) or 'sort' (the sites sorted once, each offset's shifted
queries searched in them, as in Minuet). Both give identical outputs, the CPU kernel's;
the CPU kernel has one builder (a hash table) and accepts either value.
A kernel has at most 2^20 offsets (the product of kernel_size), since the map's tables
are sized by it before any site is read; more is InvalidArgument.
)doc");

REGISTER_OP("TfSparseconv>SiteSubmanifoldNeighbours")
    .Input("coords: int32")
    .Input("spatial_shape: int32")
    .Input("batch_size: int32")
    .Output("neighbours: int32")
    .Attr("kernel_size: list(int) >= 1")
    .Attr("dilation: list(int) >= 1")
    .Attr("sites_checked: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      std::vector<int> kernel;
      TF_RETURN_IF_ERROR(c->GetAttr("kernel_size", &kernel));
      int64_t volume = 1;
      bool known = true;
      for (int k : kernel) known = known && k >= 1 && (volume *= k) <= kMaxNeighbourVolume;
      ShapeHandle coords;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &coords));
      c->set_output(0, c->Matrix(c->Dim(coords, 0),
                                 known ? c->MakeDim(NeighbourTableWidth(volume)) : c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The submanifold kernel map of coords as a neighbour table, without its pairs:
neighbours [N, volume + 2] int32 is exactly SiteNeighbourTable of
SiteKernelMap(coords, mode='submanifold', kernel_size, strides 1, padding 0, dilation)
(site/conv/site_conv_op.cc gives the layout), for kernels of at most 32 offsets. Its size
is known before the op runs, so the GPU kernel allocates it at once and waits for
nothing where sites_checked is set; otherwise the sites are checked as SiteKernelMap
checks them (in range, each once: InvalidArgument), on the GPU read back asynchronously.
sites_checked: the caller promises that the sites passed those checks (e.g. they are the
sites of a map SiteKernelMap built); the CPU checks them whatever the attr says, and the
GPU gives garbage rows, never out-of-range ones, for sites that break the promise.
SiteSparseConv reads the table alone with map_is_table; SiteTablePairs gives its pairs.
)doc");

REGISTER_OP("TfSparseconv>SiteTablePairs")
    .Input("neighbours: int32")
    .Output("in_rows: int32")
    .Output("out_rows: int32")
    .Output("offset_splits: int32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle table;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &table));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      const auto width = c->Dim(table, 1);
      c->set_output(2, c->Vector(c->ValueKnown(width) ? c->MakeDim(c->Value(width) - 1) : c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The pairs of a submanifold map from its neighbour table (SiteSubmanifoldNeighbours', or
SiteNeighbourTable's of a SiteKernelMap 'submanifold' map): in_rows, out_rows and
offset_splits [volume + 1] equal to SiteKernelMap's outputs for that map (offset q's
pairs are (i, neighbours[i, volume - 1 - q]) for the rows i, ascending, where that entry
is >= 0: a submanifold map's offsets pair up mirrored). neighbours must be
[N, volume + 2] with an odd volume of at most 32 and entries in [-1, N)
(InvalidArgument otherwise). The convolution's gradient uses it for the filter gradient
of a map given as a table alone; on the GPU the pair counts are read back asynchronously.
)doc");

}  // namespace tf_sparseconv

// Checks and error messages of the site-sparse convolution ops (a kernel map applied to
// feature rows), shared by their CPU and GPU kernels so both devices accept the same
// inputs and say the same thing about bad ones.
#ifndef TF_SPARSECONV_SITE_CONV_SITE_CONV_CHECKS_H_
#define TF_SPARSECONV_SITE_CONV_SITE_CONV_CHECKS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "site/conv/site_conv.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/errors.h"

namespace tf_sparseconv {

// The kernel map as the convolution ops take it: for kernel offset q, pairs
// offset_splits[q] .. offset_splits[q+1] of (in_rows, out_rows).
struct SiteMapView {
  const int32_t* in_rows = nullptr;
  const int32_t* out_rows = nullptr;
  const int32_t* offset_splits = nullptr;
  int64_t pairs = 0;
  int64_t volume = 0;
};

// Shape checks of a kernel map against the feature rows it is applied to; the row
// values themselves are checked by each device's kernel.
inline absl::Status CheckSiteMapShapes(const tensorflow::Tensor& in_rows, const tensorflow::Tensor& out_rows,
                                       const tensorflow::Tensor& offset_splits, int64_t volume,
                                       SiteMapView* view) {
  if (in_rows.dims() != 1 || out_rows.dims() != 1 || in_rows.NumElements() != out_rows.NumElements()) {
    return tensorflow::errors::InvalidArgument("in_rows and out_rows must be vectors of equal length, got shapes ",
                                               in_rows.shape().DebugString(), " and ",
                                               out_rows.shape().DebugString());
  }
  if (offset_splits.dims() != 1 || offset_splits.NumElements() != volume + 1) {
    return tensorflow::errors::InvalidArgument(
        "offset_splits must have one entry per kernel offset plus one (", volume + 1,
        " for this kernel), got shape ", offset_splits.shape().DebugString(),
        "; was the kernel map built for another kernel size?");
  }
  view->in_rows = in_rows.flat<int32_t>().data();
  view->out_rows = out_rows.flat<int32_t>().data();
  view->offset_splits = offset_splits.flat<int32_t>().data();
  view->pairs = in_rows.NumElements();
  view->volume = volume;
  return absl::OkStatus();
}

// The functor arguments of one convolution call from its checked map and sizes; the
// caller sets the data pointers (features, filters), whose storage type differs by device.
template <typename S>
SiteConvArgs<S> SiteConvArgsOf(const SiteMapView& map, int64_t num_in, int64_t num_out, int64_t cin,
                               int64_t cout) {
  SiteConvArgs<S> a;
  a.in_rows = map.in_rows;
  a.out_rows = map.out_rows;
  a.offset_splits = map.offset_splits;
  a.volume = map.volume;
  a.pairs = map.pairs;
  a.num_in = num_in;
  a.num_out = num_out;
  a.cin = cin;
  a.cout = cout;
  return a;
}

inline absl::Status BadSplitsError(int64_t q, int64_t begin, int64_t end, int64_t pairs) {
  return tensorflow::errors::InvalidArgument(
      "offset_splits must rise from 0 to the number of pairs (", pairs, "); offset ", q, " spans [", begin, ", ",
      end, ")");
}

inline absl::Status MapRowOutOfRangeError(const char* which, int64_t pair, int64_t row, int64_t limit) {
  return tensorflow::errors::InvalidArgument(
      which, "[", pair, "] = ", row, " is outside [0, ", limit,
      "): the kernel map belongs to another set of sites (rebuild it, or use the map of these sites)");
}

inline absl::Status RepeatedOutputRowError(int64_t q, int64_t row) {
  return tensorflow::errors::InvalidArgument(
      "output row ", row, " appears twice for kernel offset ", q,
      ": a kernel map has at most one pair per output site and offset");
}

// Shape checks of SiteSparseConv's features [N, Cin], filters [K, Cin, Cout] and num_out.
inline absl::Status CheckSiteConvInputs(const tensorflow::Tensor& features, const tensorflow::Tensor& filters,
                                        const tensorflow::Tensor& num_out) {
  if (features.dims() != 2) {
    return tensorflow::errors::InvalidArgument("features must be [N, Cin], got shape ",
                                               features.shape().DebugString());
  }
  if (filters.dims() != 3 || filters.dim_size(1) != features.dim_size(1)) {
    return tensorflow::errors::InvalidArgument("filters must be [K, Cin, Cout] with Cin = ", features.dim_size(1),
                                               " (the feature width), got shape ", filters.shape().DebugString());
  }
  if (num_out.dims() != 0 || num_out.scalar<int32_t>()() < 0) {
    return tensorflow::errors::InvalidArgument("num_out must be a non-negative scalar");
  }
  return absl::OkStatus();
}

// Shape checks of SiteSparseConvFilterGrad's features, out_grad and offset_splits.
inline absl::Status CheckSiteFilterGradInputs(const tensorflow::Tensor& features, const tensorflow::Tensor& out_grad,
                                              const tensorflow::Tensor& offset_splits) {
  if (features.dims() != 2 || out_grad.dims() != 2) {
    return tensorflow::errors::InvalidArgument("features and out_grad must be matrices, got shapes ",
                                               features.shape().DebugString(), " and ",
                                               out_grad.shape().DebugString());
  }
  if (offset_splits.dims() != 1 || offset_splits.NumElements() < 1) {
    return tensorflow::errors::InvalidArgument("offset_splits must be a non-empty vector");
  }
  return absl::OkStatus();
}

// input: the tensor the volume was read from, which the message names.
inline absl::Status CheckNeighbourVolume(int64_t volume, const char* input) {
  if (volume < 1 || volume > kMaxNeighbourVolume) {
    return tensorflow::errors::InvalidArgument(input, ": a neighbour table holds kernels of 1 to ",
                                               kMaxNeighbourVolume, " offsets (one mask bit each), got ", volume,
                                               " offsets");
  }
  return absl::OkStatus();
}

// SiteNeighbourTable's inputs (in_rows, out_rows, offset_splits, num_in, num_out):
// their shapes, a volume of at most 32 offsets (from the splits' length), and the map's
// view and sizes. The rows themselves are checked by each device's kernel.
inline absl::Status CheckNeighbourTableInputs(const tensorflow::Tensor& in_rows, const tensorflow::Tensor& out_rows,
                                              const tensorflow::Tensor& offset_splits, const tensorflow::Tensor& num_in,
                                              const tensorflow::Tensor& num_out, SiteMapView* map,
                                              int64_t* num_in_value, int64_t* num_out_value) {
  if (offset_splits.dims() != 1 || offset_splits.NumElements() < 2) {
    return tensorflow::errors::InvalidArgument("offset_splits must be a vector of volume + 1 >= 2 entries, got shape ",
                                               offset_splits.shape().DebugString());
  }
  if (num_in.dims() != 0 || num_out.dims() != 0 || num_in.scalar<int32_t>()() < 0 ||
      num_out.scalar<int32_t>()() < 0) {
    return tensorflow::errors::InvalidArgument("num_in and num_out must be non-negative scalars");
  }
  const int64_t volume = offset_splits.NumElements() - 1;
  TF_RETURN_IF_ERROR(CheckNeighbourVolume(volume, "offset_splits"));
  TF_RETURN_IF_ERROR(CheckSiteMapShapes(in_rows, out_rows, offset_splits, volume, map));
  *num_in_value = num_in.scalar<int32_t>()();
  *num_out_value = num_out.scalar<int32_t>()();
  return absl::OkStatus();
}

// SiteSparseConv's neighbours input: empty, or [num_out, volume + 2] from
// SiteNeighbourTable of a trusted map (*given says which).
inline absl::Status CheckNeighboursInput(const tensorflow::Tensor& neighbours, int64_t num_out, int64_t volume,
                                         bool map_is_trusted, bool* given) {
  *given = neighbours.NumElements() > 0 || neighbours.dims() == 2;
  if (!*given) {
    if (neighbours.dims() != 1) {
      return tensorflow::errors::InvalidArgument("neighbours must be empty (shape [0]) or [num_out, volume + 2], got ",
                                                 neighbours.shape().DebugString());
    }
    return absl::OkStatus();
  }
  TF_RETURN_IF_ERROR(CheckNeighbourVolume(volume, "neighbours"));
  if (neighbours.dims() != 2 || neighbours.dim_size(0) != num_out ||
      neighbours.dim_size(1) != NeighbourTableWidth(volume)) {
    return tensorflow::errors::InvalidArgument("neighbours must be SiteNeighbourTable's [num_out, volume + 2] = [",
                                               num_out, ", ", NeighbourTableWidth(volume), "] for this map, got ",
                                               neighbours.shape().DebugString());
  }
  if (!map_is_trusted) {
    return tensorflow::errors::InvalidArgument(
        "neighbours are read without checks, so they are accepted with map_is_trusted only (a table "
        "SiteNeighbourTable built from this trusted map)");
  }
  return absl::OkStatus();
}

// SiteSparseConv's dataflow attr (TensorFlow admits only the listed values).
inline absl::Status ParseSiteDataflow(const std::string& name, SiteDataflow* dataflow) {
  if (name == "auto") {
    *dataflow = SiteDataflow::kAuto;
  } else if (name == "pairs") {
    *dataflow = SiteDataflow::kPairs;
  } else if (name == "outputs") {
    *dataflow = SiteDataflow::kOutputs;
  } else {
    return tensorflow::errors::InvalidArgument("dataflow must be 'auto', 'pairs' or 'outputs', got '", name, "'");
  }
  return absl::OkStatus();
}

// The CPU kernel has one dataflow, the pairs' (per-offset gather-GEMM-scatter).
inline absl::Status CheckCpuDataflow(SiteDataflow dataflow) {
  if (dataflow == SiteDataflow::kOutputs) {
    return tensorflow::errors::InvalidArgument(
        "dataflow='outputs' runs on the GPU only (output-stationary tiles on tensor cores); the CPU kernel has "
        "one dataflow, per-offset gather-GEMM-scatter over the pairs: use dataflow='auto' or 'pairs' on the CPU");
  }
  return absl::OkStatus();
}

// SiteSparseConv's map_is_submanifold promise, as far as shapes can check it: the map
// keeps its sites and its offsets pair up around a centre. Whether the offsets are
// mirrored is not checked (it would cost a sort of the pairs per call), so the promise
// is taken with map_is_trusted only, for SiteKernelMap's own submanifold maps.
inline absl::Status CheckSubmanifoldClaim(bool claimed, bool trusted, int64_t num_in, int64_t num_out,
                                          int64_t volume) {
  if (!claimed) return absl::OkStatus();
  if (!trusted) {
    return tensorflow::errors::InvalidArgument(
        "map_is_submanifold needs map_is_trusted: the gradient then relies on the offsets being mirrored (offset "
        "q's pairs reversed are offset volume - 1 - q's), which is not checked; SiteKernelMap's submanifold maps "
        "are, so pass both for those, and neither for a map built otherwise");
  }
  if (num_in != num_out || volume % 2 == 0) {
    return tensorflow::errors::InvalidArgument(
        "map_is_submanifold promises a submanifold map (as many output as input sites, an odd number of kernel "
        "offsets), got ", num_in, " input and ", num_out, " output sites and ", volume, " offsets");
  }
  return absl::OkStatus();
}

// map_is_table: the neighbours table is the whole map, a trusted submanifold one (its
// pairs are SiteTablePairs'); the pair inputs are empty and the splits all zero.
inline absl::Status CheckTableMapClaim(const SiteMapView& map, bool neighbours_given, bool submanifold) {
  bool empty = map.pairs == 0;
  for (int64_t q = 0; empty && q <= map.volume; ++q) empty = map.offset_splits[q] == 0;
  if (!neighbours_given || !submanifold || !empty) {
    return tensorflow::errors::InvalidArgument(
        "map_is_table reads the map from neighbours alone (SiteSubmanifoldNeighbours' table of a submanifold map): "
        "it needs a neighbours table, map_is_trusted and map_is_submanifold, empty in_rows and out_rows and "
        "offset_splits of zeros, got ", map.pairs, " pairs, ", neighbours_given ? "a" : "no", " table and ",
        submanifold ? "" : "no ", "map_is_submanifold");
  }
  return absl::OkStatus();
}

// A NaN at entry (row, column) of a [rows, width] matrix such as the features.
inline absl::Status NaNRowError(const char* what, int64_t row, int64_t column) {
  return tensorflow::errors::InvalidArgument(what, " row ", row, " column ", column, " is NaN");
}

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_CONV_CHECKS_H_

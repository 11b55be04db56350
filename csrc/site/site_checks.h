// Checks and error messages shared by the CPU and GPU kernels of the site-sparse family,
// so both devices accept the same inputs and say the same thing about bad ones.
#ifndef TF_SPARSECONV_SITE_SITE_CHECKS_H_
#define TF_SPARSECONV_SITE_SITE_CHECKS_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "site/conv/site_conv.h"
#include "site/kernel_map/site_geometry.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/errors.h"

namespace tf_sparseconv {

// The attributes of SiteKernelMap, read once at kernel construction.
struct SiteMapAttrs {
  SiteMapMode mode = SiteMapMode::kSubmanifold;
  std::vector<int64_t> kernel, stride, padding, dilation;

  absl::Status Parse(tensorflow::OpKernelConstruction* ctx) {
    std::string mode_name;
    TF_RETURN_IF_ERROR(ctx->GetAttr("mode", &mode_name));
    if (mode_name == "submanifold") {
      mode = SiteMapMode::kSubmanifold;
    } else if (mode_name == "strided") {
      mode = SiteMapMode::kStrided;
    } else if (mode_name == "transposed") {
      mode = SiteMapMode::kTransposed;
    } else {
      return tensorflow::errors::InvalidArgument(
          "mode must be 'submanifold', 'strided' or 'transposed', got '", mode_name, "'");
    }
    TF_RETURN_IF_ERROR(ctx->GetAttr("kernel_size", &kernel));
    TF_RETURN_IF_ERROR(ctx->GetAttr("strides", &stride));
    TF_RETURN_IF_ERROR(ctx->GetAttr("padding", &padding));
    TF_RETURN_IF_ERROR(ctx->GetAttr("dilation", &dilation));
    const size_t d = kernel.size();
    if (d < 1 || d > static_cast<size_t>(kMaxSpatialDims)) {
      return tensorflow::errors::InvalidArgument("kernel_size must have 1 to ", kMaxSpatialDims,
                                                 " entries (one per spatial dimension), got ", d);
    }
    if (stride.size() != d || padding.size() != d || dilation.size() != d) {
      return tensorflow::errors::InvalidArgument(
          "kernel_size, strides, padding and dilation must have one entry per spatial dimension, got ", d,
          ", ", stride.size(), ", ", padding.size(), " and ", dilation.size());
    }
    for (size_t j = 0; j < d; ++j) {
      if (kernel[j] < 1 || stride[j] < 1 || dilation[j] < 1 || padding[j] < 0) {
        return tensorflow::errors::InvalidArgument(
            "kernel_size, strides and dilation must be >= 1 and padding >= 0; dimension ", j, " has ",
            kernel[j], ", ", stride[j], ", ", dilation[j], " and ", padding[j]);
      }
      if (mode == SiteMapMode::kSubmanifold && kernel[j] % 2 == 0) {
        return tensorflow::errors::InvalidArgument(
            "a submanifold convolution needs an odd kernel (its centre is the output site itself); "
            "kernel_size[", j, "] = ", kernel[j]);
      }
      if (mode == SiteMapMode::kSubmanifold && (stride[j] != 1 || padding[j] != 0)) {
        return tensorflow::errors::InvalidArgument(
            "a submanifold convolution keeps the input sites: strides must be 1 and padding 0, got ",
            stride[j], " and ", padding[j], " in dimension ", j);
      }
    }
    return absl::OkStatus();
  }
};

// Geometry from the attributes and the input spatial shape [d] and batch size.
inline absl::Status MakeSiteGeometry(const SiteMapAttrs& attrs, const tensorflow::Tensor& spatial_shape,
                                     const tensorflow::Tensor& batch_size, SiteGeometry* g) {
  const int d = static_cast<int>(attrs.kernel.size());
  if (spatial_shape.dims() != 1 || spatial_shape.NumElements() != d) {
    return tensorflow::errors::InvalidArgument("spatial_shape must be a vector of ", d,
                                               " extents (one per kernel dimension), got shape ",
                                               spatial_shape.shape().DebugString());
  }
  if (batch_size.dims() != 0) {
    return tensorflow::errors::InvalidArgument("batch_size must be a scalar, got shape ",
                                               batch_size.shape().DebugString());
  }
  g->d = d;
  g->mode = attrs.mode;
  g->batch = batch_size.scalar<int32_t>()();
  if (g->batch < 1) return tensorflow::errors::InvalidArgument("batch_size must be >= 1, got ", g->batch);
  auto shape = spatial_shape.flat<int32_t>();
  g->volume = 1;
  g->out_spatial_size = 1;
  for (int j = 0; j < d; ++j) {
    g->kernel[j] = attrs.kernel[j];
    g->stride[j] = attrs.stride[j];
    g->padding[j] = attrs.padding[j];
    g->dilation[j] = attrs.dilation[j];
    g->in_shape[j] = shape(j);
    if (shape(j) < 1) {
      return tensorflow::errors::InvalidArgument("spatial_shape entries must be >= 1, got spatial_shape[", j,
                                                 "] = ", shape(j));
    }
    const int64_t span = g->dilation[j] * (g->kernel[j] - 1);
    int64_t out;
    switch (attrs.mode) {
      case SiteMapMode::kSubmanifold:
        out = g->in_shape[j];
        break;
      case SiteMapMode::kStrided:
        out = (g->in_shape[j] + 2 * g->padding[j] - span - 1) / g->stride[j] + 1;
        if (g->in_shape[j] + 2 * g->padding[j] - span - 1 < 0) out = 0;
        break;
      default:
        out = (g->in_shape[j] - 1) * g->stride[j] - 2 * g->padding[j] + span + 1;
        break;
    }
    if (out < 1 || out > std::numeric_limits<int32_t>::max()) {
      return tensorflow::errors::InvalidArgument(
          "the output spatial extent of dimension ", j, " would be ", out, " (input ", g->in_shape[j],
          ", kernel ", g->kernel[j], ", stride ", g->stride[j], ", padding ", g->padding[j], ", dilation ",
          g->dilation[j], "); it must be in [1, 2^31 - 1]");
    }
    g->out_shape[j] = out;
    g->volume *= g->kernel[j];
  }
  // Site keys are (batch, coordinates) row-major over the larger grid: they must fit int64.
  int64_t cells = g->batch;
  for (int j = 0; j < d; ++j) {
    const int64_t extent = g->in_shape[j] > g->out_shape[j] ? g->in_shape[j] : g->out_shape[j];
    if (__builtin_mul_overflow(cells, extent, &cells)) {
      return tensorflow::errors::InvalidArgument(
          "key overflow: batch_size times the spatial extents must stay below 2^63");
    }
  }
  for (int j = 0; j < d; ++j) g->out_spatial_size *= g->out_shape[j];
  return absl::OkStatus();
}

inline absl::Status CheckCoordsShape(const tensorflow::Tensor& coords, int d) {
  if (coords.dims() != 2 || coords.dim_size(1) != d + 1) {
    return tensorflow::errors::InvalidArgument(
        "coords must be [N, ", d + 1, "] (batch index, then ", d, " spatial coordinates), got shape ",
        coords.shape().DebugString());
  }
  if (coords.dim_size(0) > std::numeric_limits<int32_t>::max()) {
    return tensorflow::errors::InvalidArgument("at most 2^31 - 1 sites are supported, got ", coords.dim_size(0));
  }
  return absl::OkStatus();
}

inline absl::Status CoordOutOfRangeError(int64_t row, int column, int64_t value, int64_t limit) {
  if (column == 0) {
    return tensorflow::errors::InvalidArgument("site ", row, " has batch index ", value,
                                               ", outside [0, batch_size = ", limit, ")");
  }
  return tensorflow::errors::InvalidArgument("site ", row, " has coordinate ", value, " in spatial dimension ",
                                             column - 1, ", outside [0, ", limit, ")");
}

inline absl::Status DuplicateSiteError(int64_t first, int64_t second) {
  return tensorflow::errors::InvalidArgument("sites ", first, " and ", second,
                                             " have the same coordinates; each site must appear once "
                                             "(merge duplicates, e.g. with tf_sparseconv.voxelize_sites)");
}

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

inline absl::Status CheckNeighbourVolume(int64_t volume) {
  if (volume < 1 || volume > kMaxNeighbourVolume) {
    return tensorflow::errors::InvalidArgument("a neighbour table holds kernels of 1 to ", kMaxNeighbourVolume,
                                               " offsets (one mask bit each), got ", volume, " offsets");
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
  TF_RETURN_IF_ERROR(CheckNeighbourVolume(volume));
  TF_RETURN_IF_ERROR(CheckSiteMapShapes(in_rows, out_rows, offset_splits, volume, map));
  *num_in_value = num_in.scalar<int32_t>()();
  *num_out_value = num_out.scalar<int32_t>()();
  return absl::OkStatus();
}

// SiteNeighbourTable's mask_groups attr.
inline absl::Status CheckMaskGroups(int64_t mask_groups) {
  if (mask_groups < 1 || mask_groups > kMaxMaskGroups) {
    return tensorflow::errors::InvalidArgument("mask_groups must be 1 to ", kMaxMaskGroups, ", got ", mask_groups);
  }
  return absl::OkStatus();
}

// SiteSparseConv's neighbours input: empty, or [num_out, volume + 2 * groups] from
// SiteNeighbourTable of a trusted map (*given says which, *groups its mask groups).
inline absl::Status CheckNeighboursInput(const tensorflow::Tensor& neighbours, int64_t num_out, int64_t volume,
                                         bool map_is_trusted, bool* given, int64_t* groups) {
  *given = neighbours.NumElements() > 0 || neighbours.dims() == 2;
  *groups = 0;
  if (!*given) {
    if (neighbours.dims() != 1) {
      return tensorflow::errors::InvalidArgument(
          "neighbours must be empty (shape [0]) or [num_out, volume + 2 * mask groups], got ",
          neighbours.shape().DebugString());
    }
    return absl::OkStatus();
  }
  TF_RETURN_IF_ERROR(CheckNeighbourVolume(volume));
  const int64_t extra = neighbours.dims() == 2 ? neighbours.dim_size(1) - volume : -1;
  const int64_t most = MaskGroupsFor(volume, kMaxMaskGroups);
  if (neighbours.dims() != 2 || neighbours.dim_size(0) != num_out || extra < 2 || extra % 2 != 0 ||
      extra / 2 > most) {
    return tensorflow::errors::InvalidArgument(
        "neighbours must be SiteNeighbourTable's [num_out, volume + 2 * mask groups] = [", num_out, ", ", volume,
        " + 2 * (1 to ", most, ")] for this map, got ", neighbours.shape().DebugString());
  }
  if (!map_is_trusted) {
    return tensorflow::errors::InvalidArgument(
        "neighbours are read without checks, so they are accepted with map_is_trusted only (a table "
        "SiteNeighbourTable built from this trusted map)");
  }
  *groups = extra / 2;
  return absl::OkStatus();
}

// SiteSparseConv's map_is_submanifold promise, as far as shapes can check it: the map
// keeps its sites and its offsets pair up around a centre.
inline absl::Status CheckSubmanifoldClaim(bool claimed, int64_t num_in, int64_t num_out, int64_t volume) {
  if (!claimed) return absl::OkStatus();
  if (num_in != num_out || volume % 2 == 0) {
    return tensorflow::errors::InvalidArgument(
        "map_is_submanifold promises a submanifold map (as many output as input sites, an odd number of kernel "
        "offsets), got ", num_in, " input and ", num_out, " output sites and ", volume, " offsets");
  }
  return absl::OkStatus();
}

// A NaN at entry (row, column) of a [rows, width] matrix such as the features.
inline absl::Status NaNRowError(const char* what, int64_t row, int64_t column) {
  return tensorflow::errors::InvalidArgument(what, " row ", row, " column ", column, " is NaN");
}

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_SITE_CHECKS_H_

// Checks and error messages of SiteKernelMap (its attributes, the geometry they give, the
// sites), shared by its CPU and GPU kernels so both devices accept the same inputs and say
// the same thing about bad ones.
#ifndef TF_SPARSECONV_SITE_KERNEL_MAP_SITE_KERNEL_MAP_CHECKS_H_
#define TF_SPARSECONV_SITE_KERNEL_MAP_SITE_KERNEL_MAP_CHECKS_H_

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

// The most kernel offsets (k1 * ... * kd) a map may have: 2^20, e.g. a 101^3 window. The
// map's offset_splits (an output) and the builders' per-offset tables are sized by the
// volume before any site is read.
constexpr int64_t kMaxKernelVolume = int64_t{1} << 20;

// The attributes of SiteKernelMap, read once at kernel construction.
struct SiteMapAttrs {
  SiteMapMode mode = SiteMapMode::kSubmanifold;
  std::vector<int64_t> kernel, stride, padding, dilation;
  // How the GPU builds the map ('hash' or 'sort'); both give the CPU's map, and the CPU's
  // one builder serves either value.
  std::string builder = "hash";

  absl::Status Parse(tensorflow::OpKernelConstruction* ctx) {
    TF_RETURN_IF_ERROR(ctx->GetAttr("builder", &builder));
    if (builder != "hash" && builder != "sort") {
      return tensorflow::errors::InvalidArgument("builder must be 'hash' or 'sort', got '", builder, "'");
    }
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
    return Validate();
  }

  // SiteSubmanifoldNeighbours' attributes: a submanifold map's kernel_size and dilation
  // (strides 1, padding 0), at most kMaxNeighbourVolume offsets (one 32-bit mask per row).
  absl::Status ParseSubmanifold(tensorflow::OpKernelConstruction* ctx) {
    mode = SiteMapMode::kSubmanifold;
    TF_RETURN_IF_ERROR(ctx->GetAttr("kernel_size", &kernel));
    TF_RETURN_IF_ERROR(ctx->GetAttr("dilation", &dilation));
    stride.assign(kernel.size(), 1);
    padding.assign(kernel.size(), 0);
    TF_RETURN_IF_ERROR(Validate());
    int64_t volume = 1;
    for (int64_t k : kernel) volume *= k;  // Validate bounded it by kMaxKernelVolume
    if (volume > kMaxNeighbourVolume) {
      return tensorflow::errors::InvalidArgument("a neighbour table holds kernels of at most ", kMaxNeighbourVolume,
                                                 " offsets (one 32-bit mask per row), and this kernel has ", volume,
                                                 "; build the map's pairs with SiteKernelMap instead");
    }
    return absl::OkStatus();
  }

  absl::Status Validate() const {
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
    int64_t volume = 1;
    for (size_t j = 0; j < d; ++j) {
      if (__builtin_mul_overflow(volume, kernel[j], &volume) || volume > kMaxKernelVolume) {
        std::string sizes;
        for (size_t i = 0; i < d; ++i) sizes += (i ? ", " : "") + std::to_string(kernel[i]);
        return tensorflow::errors::InvalidArgument(
            "kernel_size [", sizes, "] has more than ", kMaxKernelVolume,
            " (2^20) offsets (the product of its entries), the most a kernel map supports");
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
    // Every product and sum in checked 64-bit arithmetic: attributes near 2^62 would
    // otherwise wrap to a small extent. With the extent in int32 range, the per-site
    // arithmetic of SiteGeometry::OutputOf stays within the terms checked here.
    int64_t span = 0, twice_padding = 0, out = 0;
    bool overflow = __builtin_mul_overflow(g->dilation[j], g->kernel[j] - 1, &span) ||
                    __builtin_mul_overflow(g->padding[j], int64_t{2}, &twice_padding);
    switch (attrs.mode) {
      case SiteMapMode::kSubmanifold:
        out = g->in_shape[j];
        break;
      case SiteMapMode::kStrided: {
        int64_t reach = 0;  // in + 2p - span - 1
        overflow = overflow || __builtin_add_overflow(g->in_shape[j], twice_padding, &reach) ||
                   __builtin_sub_overflow(reach, span, &reach) || __builtin_sub_overflow(reach, 1, &reach);
        out = overflow || reach < 0 ? 0 : reach / g->stride[j] + 1;
        break;
      }
      default: {
        int64_t stretched = 0;  // (in - 1) s
        overflow = overflow || __builtin_mul_overflow(g->in_shape[j] - 1, g->stride[j], &stretched) ||
                   __builtin_sub_overflow(stretched, twice_padding, &out) ||
                   __builtin_add_overflow(out, span, &out) || __builtin_add_overflow(out, 1, &out);
        break;
      }
    }
    if (overflow) {
      return tensorflow::errors::InvalidArgument(
          "the geometry of dimension ", j, " overflows 64-bit arithmetic (input ", g->in_shape[j],
          ", kernel ", g->kernel[j], ", stride ", g->stride[j], ", padding ", g->padding[j], ", dilation ",
          g->dilation[j], "): dilation * (kernel - 1), 2 * padding and the output extent must fit int64");
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

// A map op's geometry from its inputs (coords, spatial_shape, batch_size), with the
// coordinates' shape checked against it.
inline absl::Status SiteCallGeometry(tensorflow::OpKernelContext* ctx, const SiteMapAttrs& attrs, SiteGeometry* g) {
  TF_RETURN_IF_ERROR(MakeSiteGeometry(attrs, ctx->input(1), ctx->input(2), g));
  return CheckCoordsShape(ctx->input(0), g->d);
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

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_KERNEL_MAP_SITE_KERNEL_MAP_CHECKS_H_

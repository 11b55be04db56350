// Geometry of the site-sparse convolution family: active sites with integer coordinates
// (batch index first, then d spatial coordinates) and a feature row per site.
//
// Plain data and arithmetic, no TensorFlow or CUDA headers, so the CPU kernels and the
// CUDA sources share one definition of which input site feeds which output site.
//
// Conventions follow spconv 2.x so that models port and outputs can be compared:
//   strided    (SparseConv):      out = floor((in + 2p - dil*(k-1) - 1) / s) + 1, and
//                                 input x feeds output o through offset q when
//                                 x = o*s - p + q*dil;
//   submanifold (SubMConv):       output sites = input sites, x = o + (q - (k-1)/2)*dil
//                                 (odd kernels only, so the centre is a site itself);
//   transposed (SparseConvTranspose): out = (in - 1)*s - 2p + dil*(k-1) + 1, and input
//                                 x feeds o = x*s - p + q*dil (the strided relation with
//                                 input and output exchanged).
// The kernel offset q is flattened row-major over the kernel dimensions, as the kernel
// tensor [k1, ..., kd, Cin, Cout] is.
#ifndef TF_SPARSECONV_SITE_KERNEL_MAP_SITE_GEOMETRY_H_
#define TF_SPARSECONV_SITE_KERNEL_MAP_SITE_GEOMETRY_H_

#include <cstdint>

#include "common/key_layout.h"

namespace tf_sparseconv {

enum class SiteMapMode : int { kSubmanifold = 0, kStrided = 1, kTransposed = 2 };

struct SiteGeometry {
  int d = 0;
  SiteMapMode mode = SiteMapMode::kSubmanifold;
  int64_t batch = 0;
  int64_t kernel[kMaxSpatialDims] = {};
  int64_t stride[kMaxSpatialDims] = {};
  int64_t padding[kMaxSpatialDims] = {};
  int64_t dilation[kMaxSpatialDims] = {};
  int64_t in_shape[kMaxSpatialDims] = {};
  int64_t out_shape[kMaxSpatialDims] = {};
  int64_t volume = 1;  // kernel offsets K = k1 * ... * kd
  int64_t out_spatial_size = 1;

  // Kernel offset q -> its per-dimension index, row-major.
  TF_SPARSECONV_HOST_DEVICE void Unflatten(int64_t q, int64_t* index) const {
    for (int j = d - 1; j >= 0; --j) {
      index[j] = q % kernel[j];
      q /= kernel[j];
    }
  }

  // The output coordinate (along every dimension) that input coordinate x feeds through
  // kernel offset index `qi`, or false when there is none (off the stride grid or
  // outside the output).
  // (This and OutKey run over kMaxSpatialDims with constant indices, unrolled on the GPU,
  // so that a kernel's coordinate arrays stay in registers; a loop to d put them on the stack.)
  TF_SPARSECONV_HOST_DEVICE bool OutputOf(const int32_t* x, const int64_t* qi, int64_t* o) const {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < kMaxSpatialDims; ++j) {
      if (j >= d) break;
      int64_t v;
      switch (mode) {
        case SiteMapMode::kSubmanifold:
          v = x[j] - (qi[j] - (kernel[j] - 1) / 2) * dilation[j];
          break;
        case SiteMapMode::kStrided: {
          const int64_t t = x[j] + padding[j] - qi[j] * dilation[j];
          if (t < 0 || t % stride[j] != 0) return false;
          v = t / stride[j];
          break;
        }
        default:
          v = static_cast<int64_t>(x[j]) * stride[j] - padding[j] + qi[j] * dilation[j];
          break;
      }
      if (v < 0 || v >= out_shape[j]) return false;
      o[j] = v;
    }
    return true;
  }

  // Row-major key of (batch, spatial coordinate) over the output grid.
  TF_SPARSECONV_HOST_DEVICE int64_t OutKey(int64_t b, const int64_t* o) const {
    int64_t key = b;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < kMaxSpatialDims; ++j) {
      if (j < d) key = key * out_shape[j] + o[j];
    }
    return key;
  }
  TF_SPARSECONV_HOST_DEVICE void DecodeOutKey(int64_t key, int32_t* coords) const {
    for (int j = d - 1; j >= 0; --j) {
      coords[1 + j] = static_cast<int32_t>(key % out_shape[j]);
      key /= out_shape[j];
    }
    coords[0] = static_cast<int32_t>(key);
  }
};

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_KERNEL_MAP_SITE_GEOMETRY_H_

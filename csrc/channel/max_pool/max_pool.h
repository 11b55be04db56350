// Sparse max-pooling (Hackel et al. §3.3), window = stride: the attribute check and the
// pooled layout, shared by the CPU and GPU kernels.
#ifndef TF_SPARSECONV_CHANNEL_MAX_POOL_MAX_POOL_H_
#define TF_SPARSECONV_CHANNEL_MAX_POOL_MAX_POOL_H_

#include <cstdint>
#include <vector>

#include "channel/channel_sparse.h"

namespace tf_sparseconv {

inline absl::Status CheckStridesAttr(const std::vector<int32_t>& strides) {
  for (size_t j = 0; j < strides.size(); ++j) {
    if (strides[j] < 1) {
      return tensorflow::errors::InvalidArgument("strides must be >= 1, got strides[", j,
                                                 "] = ", strides[j]);
    }
  }
  return absl::OkStatus();
}

inline absl::Status CheckStridesMatch(const std::vector<int32_t>& strides, const KeyLayout& in) {
  if (static_cast<int>(strides.size()) != in.d) {
    return tensorflow::errors::InvalidArgument("strides has ", strides.size(),
                                               " entries but the input has ", in.d,
                                               " spatial dimensions");
  }
  return absl::OkStatus();
}

// The entry at x moves to floor(x / s); the output extents are ceil(R / s).
inline absl::Status PooledLayout(const KeyLayout& in, const std::vector<int32_t>& strides,
                                 std::vector<int64_t>* out_dims, KeyLayout* out) {
  out_dims->assign(in.d + 2, 0);
  (*out_dims)[0] = in.batch;
  for (int j = 0; j < in.d; ++j) {
    (*out_dims)[1 + j] = (in.extent[j] + strides[j] - 1) / strides[j];
  }
  (*out_dims)[in.d + 1] = in.channels;
  return MakeKeyLayoutFromDims(out_dims->data(), in.d + 2, out);
}

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_MAX_POOL_MAX_POOL_H_

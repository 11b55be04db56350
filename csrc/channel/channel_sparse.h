// The channel-sparse tensor: a logical dense tensor [B, R1, ..., Rd, C] stored as
// sorted, unique int64 keys plus a values vector; the key layout is in common/key_layout.h.
//
// This header is shared by every op of the family; it holds no TensorFlow kernel code
// beyond Status-returning validation, so CPU and GPU kernels can both use it. The GPU
// kernels find the offending entry on the device and build their errors with the same
// *Error functions as the CPU loops below, so both devices say the same thing.
#ifndef TF_SPARSECONV_CHANNEL_CHANNEL_SPARSE_H_
#define TF_SPARSECONV_CHANNEL_CHANNEL_SPARSE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "common/device.h"
#include "common/key_layout.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/errors.h"

namespace tf_sparseconv {

// Builds the layout from extents, rejecting non-positive dimensions and key overflow
// (B * C * S must stay below 2^63 so that every key is a valid non-negative int64).
inline absl::Status MakeKeyLayoutFromDims(const int64_t* dims, int rank,
                                          KeyLayout* layout) {
  if (rank < 3 || rank > kMaxSpatialDims + 2) {
    return tensorflow::errors::InvalidArgument(
        "dense_shape must have 3 to ", kMaxSpatialDims + 2,
        " entries [B, R1, ..., Rd, C] (1 to ", kMaxSpatialDims,
        " spatial dimensions), got ", rank);
  }
  KeyLayout l;
  l.d = rank - 2;
  l.batch = dims[0];
  l.channels = dims[rank - 1];
  for (int i = 0; i < rank; ++i) {
    if (dims[i] <= 0) {
      return tensorflow::errors::InvalidArgument(
          "dense_shape entries must be positive, got dense_shape[", i, "] = ", dims[i]);
    }
  }
  // Spatial coordinates are decoded to int32 (half the memory of int64 per entry and
  // dimension); no voxel grid comes near 2^31 cells along one axis.
  for (int j = 1; j < rank - 1; ++j) {
    if (dims[j] > std::numeric_limits<int32_t>::max()) {
      return tensorflow::errors::InvalidArgument(
          "spatial extent dense_shape[", j, "] = ", dims[j],
          " exceeds 2^31 - 1, the largest supported extent of one spatial dimension");
    }
  }
  int64_t total = 1;
  for (int i = 0; i < rank; ++i) {
    if (__builtin_mul_overflow(total, dims[i], &total)) {
      return tensorflow::errors::InvalidArgument(
          "key overflow: the product of dense_shape (B * R1 * ... * Rd * C) must be "
          "below 2^63 to fit int64 keys; reduce the resolution, batch or channels");
    }
  }
  int64_t s = 1;
  for (int j = l.d - 1; j >= 0; --j) {
    l.extent[j] = dims[1 + j];
    l.stride[j] = s;
    s *= l.extent[j];
  }
  l.spatial_size = s;
  *layout = l;
  return absl::OkStatus();
}

inline absl::Status MakeKeyLayout(const tensorflow::Tensor& dense_shape,
                                  KeyLayout* layout) {
  if (dense_shape.dims() != 1) {
    return tensorflow::errors::InvalidArgument(
        "dense_shape must be a 1-D int64 tensor, got rank ", dense_shape.dims());
  }
  const int rank = static_cast<int>(dense_shape.NumElements());
  std::vector<int64_t> dims(rank);
  auto flat = dense_shape.flat<int64_t>();
  for (int i = 0; i < rank; ++i) dims[i] = flat(i);
  return MakeKeyLayoutFromDims(dims.data(), rank, layout);
}

// The most (batch, channel) segments an op that keeps per-segment tables (segment offsets,
// counts: 8 to 16 bytes each, on the host and the device) accepts: 2^24, i.e. B * C of a
// batch of 256 with 65536 channels. The tables are sized from dense_shape alone, so an
// empty tensor with a huge B or C would otherwise allocate them before any data is read.
constexpr int64_t kMaxSegments = int64_t{1} << 24;

// Refuses a layout (`what`: the tensor, e.g. "input") whose B * C exceeds kMaxSegments;
// `channels` is C, or the output's channel count when the table is the output's.
inline absl::Status CheckSegmentCount(int64_t batch, int64_t channels, const char* what) {
  int64_t segments;
  if (__builtin_mul_overflow(batch, channels, &segments) || segments > kMaxSegments) {
    return tensorflow::errors::InvalidArgument(
        "the dense_shape of ", what, " has B = ", batch, " and C = ", channels,
        ", more than ", kMaxSegments, " (2^24) (batch, channel) segments, the most supported; "
        "split the batch or the channels");
  }
  return absl::OkStatus();
}

// The error of entry i of a key array whose entries before i are valid: out of range,
// or not above the previous key (key_before; unused when i == 0).
inline absl::Status InvalidKeyError(const char* what, int64_t i, int64_t key,
                                    int64_t key_before, int64_t limit) {
  if (key < 0 || key >= limit) {
    return tensorflow::errors::InvalidArgument(
        what, " key out of range at entry ", i, ": ", key, " is not in [0, ", limit,
        ") for the given dense_shape");
  }
  if (i > 0 && key == key_before) {
    return tensorflow::errors::InvalidArgument(
        what, " keys must be unique: entries ", i - 1, " and ", i, " share key ", key,
        "; merge duplicates before building the tensor");
  }
  return tensorflow::errors::InvalidArgument(
      what, " keys must be sorted (entry ", i, " = ", key, " < entry ", i - 1, " = ",
      key_before, "); call tf_sparseconv.reorder()");
}

// Keys must be strictly increasing (sorted and unique) and inside [0, B*C*S).
inline absl::Status ValidateKeys(const int64_t* keys, int64_t n,
                                 const KeyLayout& layout, const char* what) {
  const int64_t limit = layout.num_keys();
  for (int64_t i = 0; i < n; ++i) {
    if (keys[i] < 0 || keys[i] >= limit || (i > 0 && keys[i] <= keys[i - 1])) {
      return InvalidKeyError(what, i, keys[i], i > 0 ? keys[i - 1] : 0, limit);
    }
  }
  return absl::OkStatus();
}

inline absl::Status CheckKeysVector(const tensorflow::Tensor& keys, const char* what) {
  if (keys.dims() != 1) {
    return tensorflow::errors::InvalidArgument(what, " keys must be 1-D, got rank ",
                                               keys.dims());
  }
  return absl::OkStatus();
}

// The keys of Decode and Reorder, which may be unsorted.
inline absl::Status CheckUnsortedKeysVector(const tensorflow::Tensor& keys) {
  if (keys.dims() != 1) {
    return tensorflow::errors::InvalidArgument("keys must be 1-D, got rank ", keys.dims());
  }
  return absl::OkStatus();
}

inline absl::Status ValidateKeysTensor(const tensorflow::Tensor& keys,
                                       const KeyLayout& layout, const char* what) {
  TF_RETURN_IF_ERROR(CheckKeysVector(keys, what));
  return ValidateKeys(keys.flat<int64_t>().data(), keys.NumElements(), layout, what);
}

inline absl::Status ValidateValuesMatchKeys(const tensorflow::Tensor& keys,
                                            const tensorflow::Tensor& values,
                                            const char* what) {
  if (values.dims() != 1 || values.NumElements() != keys.NumElements()) {
    return tensorflow::errors::InvalidArgument(
        what, " values must be 1-D with one value per key: got shape ",
        values.shape().DebugString(), " for ", keys.NumElements(), " keys");
  }
  return absl::OkStatus();
}

// A channel-sparse tensor given as keys, values and dense_shape: its layout, keys a vector
// and one value per key; `what` names the tensor in the messages.
inline absl::Status CheckSparseTensor(const tensorflow::Tensor& keys, const tensorflow::Tensor& values,
                                      const tensorflow::Tensor& dense_shape, const char* what,
                                      KeyLayout* layout) {
  TF_RETURN_IF_ERROR(MakeKeyLayout(dense_shape, layout));
  TF_RETURN_IF_ERROR(CheckKeysVector(keys, what));
  return ValidateValuesMatchKeys(keys, values, what);
}

inline absl::Status NaNError(const char* what, int64_t i) {
  return tensorflow::errors::InvalidArgument(what, " contains NaN at position ", i);
}

template <typename T>
absl::Status RejectNaN(const T* x, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return NaNError(what, i);
  }
  return absl::OkStatus();
}

// ValidateKeys of keys that may end in padding (kPaddingKey, common/key_layout.h, after every
// live key): the first entry that is out of range or not above its predecessor, padding
// skipped, so a live key after padding is unsorted; the GPU's check (CheckSortedKeys with a
// padded tail) finds the same entry.
inline absl::Status ValidatePaddedKeys(const int64_t* keys, int64_t n, const KeyLayout& layout, const char* what) {
  const int64_t limit = layout.num_keys();
  for (int64_t i = 0; i < n; ++i) {
    if (keys[i] == kPaddingKey) continue;
    if (keys[i] < 0 || keys[i] >= limit || (i > 0 && keys[i] <= keys[i - 1])) {
      return InvalidKeyError(what, i, keys[i], i > 0 ? keys[i - 1] : 0, limit);
    }
  }
  return absl::OkStatus();
}

// The entries an op's functor reads (*live): on the GPU all n (its checks accept a padded tail
// and its kernels skip it); on the CPU all n, or, where the op was told its input may be padded
// (padded_input), the live prefix (one binary search). There a padded input is checked here
// whole, in the GPU's order (keys, then NaN among the values, padding's included, where
// values_what names them): the functor's own checks of the prefix then pass.
template <typename Device, typename T>
absl::Status EntriesToRead(const int64_t* keys, const T* values, int64_t n, bool padded_input,
                           const KeyLayout& layout, const char* what, const char* values_what, int64_t* live) {
  *live = n;
  if (!padded_input || !std::is_same<Device, CPUDevice>::value) return absl::OkStatus();
  TF_RETURN_IF_ERROR(ValidatePaddedKeys(keys, n, layout, what));
  if (values_what != nullptr) TF_RETURN_IF_ERROR(RejectNaN(values, n, values_what));
  *live = std::lower_bound(keys, keys + n, kPaddingKey) - keys;
  return absl::OkStatus();
}

// Errors of the conversion ops, whose keys may be unsorted (Decode, Reorder) or which
// read indices (Encode).
inline absl::Status KeyOutOfRangeError(int64_t i, int64_t key, int64_t limit) {
  return tensorflow::errors::InvalidArgument("key out of range at entry ", i, ": ", key,
                                             " is not in [0, ", limit, ")");
}

// Keys that may be unsorted (Decode, Reorder) but must lie inside the layout.
inline absl::Status CheckKeysInLayout(const int64_t* keys, int64_t n, const KeyLayout& layout) {
  for (int64_t i = 0; i < n; ++i) {
    if (keys[i] < 0 || keys[i] >= layout.num_keys()) return KeyOutOfRangeError(i, keys[i], layout.num_keys());
  }
  return absl::OkStatus();
}

// Indices [N, d+2] rows are (b, x1..xd, c): the exclusive upper bound of column j.
inline int64_t IndexColumnBound(const KeyLayout& layout, int j) {
  return j == 0 ? layout.batch : j == layout.d + 1 ? layout.channels : layout.extent[j - 1];
}

inline absl::Status CheckIndicesShape(const tensorflow::Tensor& indices, const KeyLayout& layout) {
  if (indices.dims() == 2 && indices.dim_size(1) == layout.d + 2) return absl::OkStatus();
  return tensorflow::errors::InvalidArgument("indices must have shape [N, ", layout.d + 2,
                                             "] (b, x1..xd, c), got ",
                                             indices.shape().DebugString());
}

inline absl::Status IndexOutOfRangeError(int64_t i, int64_t j, int64_t index, int64_t bound) {
  return tensorflow::errors::InvalidArgument("index out of range: indices[", i, ", ", j,
                                             "] = ", index, " is not in [0, ", bound, ")");
}

inline absl::Status DuplicateKeyError(int64_t key, int64_t entry_a, int64_t entry_b) {
  return tensorflow::errors::InvalidArgument("duplicate key ", key, " (input entries ",
                                             entry_a, " and ", entry_b,
                                             "); merge duplicates first");
}

// The layout of a dense [B, R1, ..., Rd, C] tensor.
inline absl::Status LayoutOfDense(const tensorflow::Tensor& dense, KeyLayout* layout) {
  if (dense.dims() < 3 || dense.dims() > kMaxSpatialDims + 2) {
    return tensorflow::errors::InvalidArgument(
        "dense must have rank 3 to ", kMaxSpatialDims + 2, " [B, R1, ..., Rd, C] (1 to ", kMaxSpatialDims,
        " spatial dimensions), got shape ", dense.shape().DebugString());
  }
  std::vector<int64_t> dims(dense.dims());
  for (int i = 0; i < dense.dims(); ++i) dims[i] = dense.dim_size(i);
  if (dense.NumElements() == 0 && dense.dims() >= 3) {
    return tensorflow::errors::InvalidArgument("dense tensor has a zero dimension: ",
                                               dense.shape().DebugString());
  }
  return MakeKeyLayoutFromDims(dims.data(), dense.dims(), layout);
}

// offsets[s] .. offsets[s+1] is the entry range of segment s (keys must be validated).
inline void SegmentOffsets(const int64_t* keys, int64_t n, const KeyLayout& layout,
                           std::vector<int64_t>* offsets) {
  const int64_t num_segments = layout.num_segments();
  offsets->assign(num_segments + 1, n);
  int64_t seg = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = layout.segment_of(keys[i]);
    while (seg <= s) (*offsets)[seg++] = i;
  }
  // Segments after the last entry start (and end) at n: already set by assign().
}

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_CHANNEL_SPARSE_H_

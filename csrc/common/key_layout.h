// The key layout of the channel-sparse tensor, shared by the CPU kernels and the CUDA
// sources: plain data and arithmetic, no TensorFlow or CUDA headers, so nvcc compiles it
// as host and device code.
//
// Key layout (Hackel et al. §3): key = (b * C + c) * S + lin(x), with S = R1 * ... * Rd
// and lin(x) the row-major spatial index. Sorting by key therefore sorts by batch,
// then channel, then spatial position, and each (batch, channel) pair is one
// contiguous "segment" of the entries.
#ifndef TF_SPARSECONV_COMMON_KEY_LAYOUT_H_
#define TF_SPARSECONV_COMMON_KEY_LAYOUT_H_

#include <cstdint>

#if defined(__CUDACC__)
#define TF_SPARSECONV_HOST_DEVICE __host__ __device__
#else
#define TF_SPARSECONV_HOST_DEVICE
#endif

namespace tf_sparseconv {

constexpr int kMaxSpatialDims = 4;

// The key of a padding entry: a library op may allocate its output at a bound known before
// it runs and end it in padding, entries with this key (above every valid key, so the keys
// stay sorted) and value 0, after every live entry. Ops told that an input may be padded
// (their padded_input attribute) treat padding as absent; anywhere else it is out of range.
constexpr int64_t kPaddingKey = INT64_MAX;

struct KeyLayout {
  int d = 0;                              // number of spatial dimensions
  int64_t batch = 0;                      // B
  int64_t channels = 0;                   // C
  int64_t extent[kMaxSpatialDims] = {};   // R1 ... Rd
  int64_t stride[kMaxSpatialDims] = {};   // row-major strides of the spatial index
  int64_t spatial_size = 0;               // S = R1 * ... * Rd

  TF_SPARSECONV_HOST_DEVICE int64_t num_segments() const { return batch * channels; }
  TF_SPARSECONV_HOST_DEVICE int64_t num_keys() const { return batch * channels * spatial_size; }
  TF_SPARSECONV_HOST_DEVICE int64_t segment_of(int64_t key) const { return key / spatial_size; }
  TF_SPARSECONV_HOST_DEVICE int64_t spatial_of(int64_t key) const { return key % spatial_size; }
  TF_SPARSECONV_HOST_DEVICE int64_t key_of(int64_t b, int64_t c, int64_t lin) const {
    return (b * channels + c) * spatial_size + lin;
  }
  // The same spatial layout with a different channel count.
  TF_SPARSECONV_HOST_DEVICE KeyLayout WithChannels(int64_t c) const {
    KeyLayout out = *this;
    out.channels = c;
    return out;
  }
};

// The spatial coordinates of a spatial index: coords[j] = x_j.
// Unrolled over kMaxSpatialDims with constant indices on the GPU, so that a kernel's
// coordinate array stays in registers (a loop to layout.d put it on the stack).
TF_SPARSECONV_HOST_DEVICE inline void DecodeSpatial(int64_t lin, const KeyLayout& layout,
                                                    int32_t* coords) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < kMaxSpatialDims; ++j) {
    if (j < layout.d) coords[j] = static_cast<int32_t>((lin / layout.stride[j]) % layout.extent[j]);
  }
}

// Position of the entry with key `key` in a dense [B, R..., C] buffer (memory order
// b, spatial, channel, whereas keys are ordered b, channel, spatial).
TF_SPARSECONV_HOST_DEVICE inline int64_t DenseIndex(int64_t key, const KeyLayout& L) {
  const int64_t seg = key / L.spatial_size, lin = key % L.spatial_size;
  const int64_t b = seg / L.channels, c = seg % L.channels;
  return (b * L.spatial_size + lin) * L.channels + c;
}

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_COMMON_KEY_LAYOUT_H_

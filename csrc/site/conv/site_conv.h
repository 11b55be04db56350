// What the site-sparse convolution's devices share, free of TensorFlow and CUDA headers: a
// call's arguments (the CPU functors in site_conv_kernels.cc and the GPU kernels in
// site_conv.cu compute from them) and its epilogue, the neighbour table's layout, the
// dataflow choice and the accumulator type.
#ifndef TF_SPARSECONV_SITE_CONV_SITE_CONV_H_
#define TF_SPARSECONV_SITE_CONV_SITE_CONV_H_

#include <cstdint>

namespace tf_sparseconv {

// The forward's epilogue (SiteSparseConv's `epilogue` inputs and `epsilon` and
// `activation` attrs): each output value v of column c becomes act(n(v) * scale[c] +
// shift[c]), n(v) = (v - mean[c]) / sqrt(variance[c] + epsilon) where mean and variance
// are given (a batch norm's moving statistics) and v otherwise, computed in the
// accumulator type before the output is rounded to its own type. The vectors: [cout] in
// the call's device memory, or nullptr (mean, variance: no normalisation; scale 1; shift
// 0); relu: act is max(., 0), else identity.
template <typename A>
struct SiteEpilogue {
  const A* mean = nullptr;
  const A* variance = nullptr;
  const A* scale = nullptr;
  const A* shift = nullptr;
  A epsilon = 0;
  bool relu = false;
  bool Any() const { return variance != nullptr || scale != nullptr || shift != nullptr || relu; }
};

// float for float, half and bfloat16 (half-precision storage, float32 arithmetic);
// double for double.
template <typename T>
struct AccumulatorOf {
  using type = float;
};
template <>
struct AccumulatorOf<double> {
  using type = double;
};

// Everything one call of the convolution (and its filter gradient) computes from: out
// [num_out, cout] = sum over offsets q and their pairs p of features[in_rows[p]] @
// filters[q], accumulated in AccumulatorOf<T> and written as T through the epilogue. The
// products run on valid rows only: every in_row < num_in, every out_row < num_out, splits
// rising from 0 to pairs, and no output row twice within one kernel offset (so one
// offset's scatter never collides with itself and needs no atomics on the CPU).
template <typename T>
struct SiteConvArgs {
  const T* features = nullptr;   // [num_in, cin]
  const T* filters = nullptr;    // [volume, cin, cout]
  const int32_t* in_rows = nullptr;
  const int32_t* out_rows = nullptr;
  const int32_t* offset_splits = nullptr;  // host copy on every device: [volume + 1]
  int64_t volume = 0, pairs = 0, num_in = 0, num_out = 0, cin = 0, cout = 0;
  SiteEpilogue<typename AccumulatorOf<T>::type> epilogue;  // the forward's only
};

// SiteNeighbourTable's layout (site_conv_op.cc), shared by the CPU and GPU kernels: one
// 32-bit neighbour mask per output row, so at most 32 kernel offsets, and rows of
// volume + 2 int32: the input row per offset, then the outputs sorted by their masks, as
// (mask, output row), so that the rows of one output-stationary tile share most of their
// offsets. One sorted order over the whole mask: splitting it into groups (spconv's mask
// split) leaves fewer rows without a pair in a tile but costs one more pass over the
// output per group, which measured slower for most layers (docs/gpu-kernels.md, "What was
// tried").
constexpr int64_t kMaxNeighbourVolume = 32;
constexpr int64_t NeighbourTableWidth(int64_t volume) { return volume + 2; }

// SiteSparseConv's dataflow attr: 'auto', 'pairs' or 'outputs' (site_conv_op.cc). The CPU
// has one dataflow, the pairs'; the GPU's choices are in site_conv_gpu.h.
enum class SiteDataflow { kAuto, kPairs, kOutputs };

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_CONV_H_

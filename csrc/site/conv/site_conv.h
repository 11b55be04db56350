// Functor contracts of the site-sparse convolution (gather-GEMM-scatter), shared by the
// CPU kernels (site_conv_kernels.cc) and the GPU kernels (site_conv.cu).
#ifndef TF_SPARSECONV_SITE_CONV_SITE_CONV_H_
#define TF_SPARSECONV_SITE_CONV_SITE_CONV_H_

#include <cstdint>

namespace tf_sparseconv {

// Everything one call of the convolution needs, with the rows already validated: every
// in_row < num_in, every out_row < num_out, splits rising from 0 to pairs, and no output
// row twice within one kernel offset (so one offset's scatter never collides with
// itself and needs no atomics on the CPU).
template <typename T>
struct SiteConvArgs {
  const T* features = nullptr;   // [num_in, cin]
  const T* filters = nullptr;    // [volume, cin, cout]
  const int32_t* in_rows = nullptr;
  const int32_t* out_rows = nullptr;
  const int32_t* offset_splits = nullptr;  // host copy on every device: [volume + 1]
  int64_t volume = 0, pairs = 0, num_in = 0, num_out = 0, cin = 0, cout = 0;
};

// out[num_out, cout] = sum over offsets q and their pairs p of
//   features[in_rows[p]] @ filters[q], accumulated in AccumulatorOf<T> and written as T.
template <typename Device, typename T>
struct SiteConvFunctor {
  void operator()(const Device& device, const SiteConvArgs<T>& args, T* out);
};

// filter_grad[volume, cin, cout]: filter_grad[q] = sum over q's pairs of
//   features[in_rows[p]]^T out_grad[out_rows[p]] (args.filters unused, cout from out_grad).
template <typename Device, typename T>
struct SiteConvFilterGradFunctor {
  void operator()(const Device& device, const SiteConvArgs<T>& args, const T* out_grad, T* filter_grad);
};

// SiteNeighbourTable's layout (site_conv_op.cc), shared by the CPU and GPU kernels: one
// 32-bit neighbour mask per output row, so at most 32 kernel offsets, and rows of
// volume + 2 * groups int32: the input row per offset, then per mask group g (offsets
// MaskGroupBegin(g) .. MaskGroupBegin(g + 1) - 1) the outputs sorted by their mask's bits
// of that group, as (bits, output row). Splitting the mask (spconv's mask split) makes the
// rows a sorted tile shares far more alike: the tiles multiply fewer rows without a pair
// (benchmarks/site_table_waste.py: at most 2.2x the pairs with one group, 1.42x with two,
// 1.19x with three), at one more pass over the output per group.
constexpr int64_t kMaxNeighbourVolume = 32;
constexpr int64_t kMaxMaskGroups = 4;
// SiteNeighbourTable's mask_groups default (its REGISTER_OP says the same), and the
// groups of the tables the GPU forward builds per call. One group: on an H200 (2026-11-24,
// four scenes, fp16 forward, README) two groups were faster only for submanifold layers of
// 128 channels (by 6-8%) and slower for every strided, inverse and 32/64-channel layer; the
// rows a tile multiplies without a pair cost less than one more pass over the output.
constexpr int64_t kDefaultMaskGroups = 1;
// At most one group per offset (and one for an empty kernel).
constexpr int64_t MaskGroupsFor(int64_t volume, int64_t requested) {
  return requested < volume ? (requested < 1 ? 1 : requested) : (volume < 1 ? 1 : volume);
}
constexpr int64_t NeighbourTableWidth(int64_t volume, int64_t groups) { return volume + 2 * groups; }
// The first offset of group g (g = groups: volume), contiguous groups of near-equal size.
constexpr int64_t MaskGroupBegin(int64_t volume, int64_t groups, int64_t g) { return g * volume / groups; }

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

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_CONV_H_

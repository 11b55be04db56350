// Direct sparse convolution (Hackel et al., Algorithm 1 forward, Algorithm 2 backward):
// the contract shared by the per-device functors.
//
// Semantics: cross-correlation like tf.nn.convolution, stride 1, 'same' zero padding,
// odd kernel sizes. Only present (unpruned) filter weights are visited. The output
// support of segment (b, oc) is the structural "touched" set: every position that some
// present input entry reaches through some present weight. The bias is added to those
// entries only, then k-selection keeps at most k of them per (b, oc).
#ifndef TF_SPARSECONV_CHANNEL_DIRECT_CONV_DIRECT_CONV_H_
#define TF_SPARSECONV_CHANNEL_DIRECT_CONV_DIRECT_CONV_H_

#include <cstdint>
#include <vector>

#include "channel/channel_sparse.h"
#include "channel/direct_conv/direct_conv_choices.h"

namespace tf_sparseconv {

// One present filter weight, seen from the input: entry x feeds output y = x - delta.
struct PresentWeight {
  int64_t filter_index;               // flat index into the [K..., Cin, Cout] filter
  int64_t lin_delta;                  // delta in row-major spatial index units
  int32_t lo[kMaxSpatialDims];        // x_j must lie in [lo_j, hi_j) for y to be inside
  int32_t hi[kMaxSpatialDims];
};

// Present weights grouped by (oc, ic): the CSR row oc * cin + ic.
struct PresentWeights {
  int64_t cin = 0, cout = 0;
  std::vector<int64_t> row_begin;     // size cout * cin + 1
  std::vector<PresentWeight> items;
  const PresentWeight* begin(int64_t oc, int64_t ic) const {
    return items.data() + row_begin[oc * cin + ic];
  }
  const PresentWeight* end(int64_t oc, int64_t ic) const {
    return items.data() + row_begin[oc * cin + ic + 1];
  }
  int64_t count() const { return static_cast<int64_t>(items.size()); }
};

// Builds the present-weight lists of a [K1..Kd, Cin, Cout] filter (mask may be null:
// all present) for inputs of the given spatial layout.
PresentWeights BuildPresentWeights(const bool* mask, const int64_t* kernel_size,
                                   int64_t cin, int64_t cout, const KeyLayout& layout);

template <typename T>
struct DirectConvArgs {
  KeyLayout in_layout;                  // [B, R..., Cin]
  int64_t cout = 0;
  const int64_t* keys = nullptr;        // sorted, unique, validated
  const T* values = nullptr;
  int64_t n = 0;
  const int32_t* coords = nullptr;      // decoded spatial coordinates, n * d
  const int64_t* in_offsets = nullptr;  // segment (b, ic) -> entry range, B*Cin+1
  const T* filter = nullptr;            // [K..., Cin, Cout]
  int64_t filter_size = 0;
  const PresentWeights* weights = nullptr;
  const T* bias = nullptr;              // [Cout]
  SelectionMode selection = SelectionMode::kNone;
  int64_t k = 0;                        // per (b, oc) bound when selection != kNone
  // kDense works per batch element in a position-major [R1*...*Rd, Cout] buffer with
  // vectorisable [Cout] rows (gather-GEMM-scatter); kSort k-way merges the sorted
  // contribution streams of one (b, oc) segment; kAuto picks the cheaper. Identical results.
  DirectConvDataflow dataflow = DirectConvDataflow::kAuto;
  // The fused ReLU (activation 'relu'): after k-selection only entries > 0 stay.
  bool relu = false;
};

// The kept entries of one output segment (b, oc), sorted by spatial index.
template <typename T>
struct SegmentResult {
  std::vector<int64_t> lin;
  std::vector<T> values;
  int64_t touched = 0;   // size of the support before k-selection
  int64_t positive = 0;  // entries > 0 before k-selection: what a following ReLU keeps
  int64_t nan = 0;       // NaN entries before k-selection (refused with the fused ReLU)
  int64_t kept = 0;      // entries emitted into a SegmentSink (then lin/values are freed)
};

// Where segments write their kept entries when the output is staged: segment u's slot
// starts at slot_begin[u]; keys are written whole ((b * Cout + oc) * S + lin).
template <typename T>
struct SegmentSink {
  int64_t* keys;
  T* values;
  const int64_t* slot_begin;
  int64_t spatial_size;
};

template <typename Device, typename T>
struct DirectConvForwardFunctor {
  // results has B * Cout segments on return, in key order; with a sink, each segment's
  // kept entries are moved into its slot as soon as it is finished.
  void operator()(const Device& device, const DirectConvArgs<T>& args,
                  std::vector<SegmentResult<T>>* results, const SegmentSink<T>* sink);
};

template <typename T>
struct DirectConvBackpropArgs {
  DirectConvArgs<T> forward;            // the forward inputs (bias, selection unused)
  const int64_t* out_keys = nullptr;    // the forward's kept output keys
  const T* out_grad = nullptr;          // dL/d out_values
  int64_t n_out = 0;
  const int64_t* out_offsets = nullptr; // segment (b, oc) -> entry range, B*Cout+1
  // kDense scatters out_grad into a [B*Cout*S] buffer (an output key is its index there)
  // and reads it directly; kSort searches the sorted out_keys.
  DirectConvDataflow dataflow = DirectConvDataflow::kAuto;
};

// The dense path's forward scratch per block, [slab, Cout] sums and flags (bytes; the
// grid is processed in slabs of positions beyond this), and the largest [B, S, Cout]
// gradient buffer the automatic choice allows for its backward.
constexpr int64_t kDenseSlabBytes = int64_t{8} << 20;
// Scratch up to this size stays in a core's cache (the cost model's threshold).
constexpr int64_t kCacheFriendlyScratchBytes = int64_t{2} << 20;
constexpr int64_t kMaxDenseGradientBytes = int64_t{256} << 20;

// Eq. 3: gradients only at present input entries and present weights; entries that
// k-selection dropped are absent from out_keys and so receive nothing. A null in_grad or
// filter_grad is not computed.
template <typename Device, typename T>
struct DirectConvBackpropFunctor {
  void operator()(const Device& device, const DirectConvBackpropArgs<T>& args,
                  T* in_grad, T* filter_grad, T* bias_grad);
};

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_DIRECT_CONV_DIRECT_CONV_H_

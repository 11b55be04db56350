// Direct sparse convolution (Hackel et al., Algorithm 1 forward, Algorithm 2 backward):
// the contract shared by the per-device functors.
//
// Semantics: cross-correlation like tf.nn.convolution, stride 1, 'same' zero padding,
// odd kernel sizes. Only present (unpruned) filter weights are visited. The output
// support of segment (b, oc) is the structural "touched" set: every position that some
// present input entry reaches through some present weight. The bias is added to those
// entries only, then k-selection keeps at most k of them per (b, oc).
#ifndef TF_SPARSECONV_CC_OPS_DIRECT_CONV_H_
#define TF_SPARSECONV_CC_OPS_DIRECT_CONV_H_

#include <cstdint>
#include <vector>

#include "channel_sparse.h"
#include "selection_mode.h"

namespace tf_sparseconv {

// How the responses of one (b, oc) segment are summed. Both give bit-identical results
// (contributions to one output position are added in the same order); they differ in
// cost: kDense scans an R1*...*Rd buffer, kMerge k-way merges the sorted contribution
// streams (memory proportional to the entries). kAuto picks the cheaper per segment.
enum class Accumulator { kAuto, kDense, kMerge };

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
  Accumulator accumulator = Accumulator::kAuto;
};

// The kept entries of one output segment (b, oc), sorted by spatial index.
template <typename T>
struct SegmentResult {
  std::vector<int64_t> lin;
  std::vector<T> values;
  int64_t touched = 0;  // size of the support before k-selection
};

template <typename Device, typename T>
struct DirectConvForwardFunctor {
  // results has B * Cout segments on return, in key order.
  void operator()(const Device& device, const DirectConvArgs<T>& args,
                  std::vector<SegmentResult<T>>* results);
};

template <typename T>
struct DirectConvBackpropArgs {
  DirectConvArgs<T> forward;            // the forward inputs (bias, selection unused)
  const int64_t* out_keys = nullptr;    // the forward's kept output keys
  const T* out_grad = nullptr;          // dL/d out_values
  int64_t n_out = 0;
  const int64_t* out_offsets = nullptr; // segment (b, oc) -> entry range, B*Cout+1
};

// Eq. 3: gradients only at present input entries and present weights; entries that
// k-selection dropped are absent from out_keys and so receive nothing.
template <typename Device, typename T>
struct DirectConvBackpropFunctor {
  void operator()(const Device& device, const DirectConvBackpropArgs<T>& args,
                  T* in_grad, T* filter_grad, T* bias_grad);
};

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CC_OPS_DIRECT_CONV_H_

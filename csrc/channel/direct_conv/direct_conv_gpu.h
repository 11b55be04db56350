// The GPU functors of DirectSparseConv and DirectSparseConvBackprop (CUDA-free interface;
// kernels in direct_conv.cu). Same contract as direct_conv.h: stride 1,
// 'same' zero padding, only present weights, the output support is the touched set,
// bias there only, then k-selection per (b, oc) with ties to the smaller key.
#ifndef TF_SPARSECONV_CHANNEL_DIRECT_CONV_DIRECT_CONV_GPU_H_
#define TF_SPARSECONV_CHANNEL_DIRECT_CONV_DIRECT_CONV_GPU_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "channel/direct_conv/direct_conv_choices.h"
#include "common/gpu_common.h"

namespace tf_sparseconv {
namespace gpu {

// One present filter weight, seen from the input: entry x feeds output y = x - delta.
struct alignas(16) GpuPresentWeight {
  int64_t lin_delta;             // delta in row-major spatial index units
  int64_t filter_index;          // flat index into the [K..., Cin, Cout] filter
  int32_t ic;
  int32_t oc;
  int32_t offset_bit;            // (kernel offset index) % 32: its bit in a neighbour mask
  int32_t lo[kMaxSpatialDims];   // x_j must lie in [lo_j, hi_j) for y to be inside
  int32_t hi[kMaxSpatialDims];
};

// The tables of a GpuWeightTable on the device, with an initial report (every check passed,
// count 0) to start a call's report from: a kernel's cache of its last call's tables
// (direct_conv_kernels_gpu.cc, UploadWeightTables), which the functors read.
struct GpuWeightTablesOnDevice {
  const GpuPresentWeight* items = nullptr;
  const int64_t* row_begin = nullptr;
  const int64_t* pair_begin = nullptr;
  const int64_t* offset_rep = nullptr;
  const uint8_t* present = nullptr;
  const Report* initial_report = nullptr;
};

// The present weights grouped by input channel, in host memory: row ic is
// items[row_begin[ic] .. row_begin[ic + 1]), ordered by (oc, kernel offset), the order
// in which the CPU kernel sums the contributions to one output entry.
struct GpuWeightTable {
  const GpuPresentWeight* items = nullptr;
  const int64_t* row_begin = nullptr;  // cin + 1
  const int64_t* pair_begin = nullptr; // cin * cout + 1: the (ic, oc) runs, ic-major
  const int64_t* offset_rep = nullptr; // num_offsets: an item of each kernel offset present at all,
  int64_t num_offsets = 0;             //   in ascending offset order
  const uint8_t* present = nullptr;    // present_size: 1 at the filter index of each present weight
  int64_t present_size = 0;
  int64_t count = 0;
  int64_t max_row = 0;                 // the longest row
  GpuWeightTablesOnDevice on_device;   // the same tables on the device
  int grad_pack = -1;                  // GradWeightsPack's answer (1 or 0); -1: not asked, unpacked kernels
};

// Whether every present weight packs for the gradient kernels: its output offset
// (oc * S - lin_delta) in 32 bits and its spatial deltas in signed bytes.
bool GradWeightsPack(const KeyLayout& L, int64_t cout, const GpuWeightTable& w);

// The device bytes of all of w's tables and an initial report (cin input, cout output
// channels), each 16-byte aligned; UploadWeightTables queues their upload into `device`
// (that many bytes) through pinned memory of scratch's, and points *view at them.
size_t WeightTablesBytes(const GpuWeightTable& w, int64_t cin, int64_t cout);
GpuStatus UploadWeightTables(Stream stream, Scratch* scratch, const GpuWeightTable& w, int64_t cin, int64_t cout,
                             void* device, GpuWeightTablesOnDevice* view);

template <typename T>
struct DirectConvGpuArgs {
  KeyLayout in_layout;                 // [B, R..., Cin]
  int64_t cout = 0;
  const int64_t* keys = nullptr;       // device; checked here, not before
  const T* values = nullptr;
  int64_t n = 0;
  const T* filter = nullptr;           // device, [K..., Cin, Cout]
  int64_t filter_size = 0;
  GpuWeightTable weights;
  bool relu = false;                   // the fused ReLU: of the kept entries, only those > 0
  bool padded = false;                 // keys may end in padding (kPaddingKey), which is skipped
  bool out_padded = false;             // the backprop's out_keys may end in padding, skipped
  bool keys_checked = false;           // the forward's keys were made by a library op: not checked again
  bool deterministic = false;          // TensorFlow's op determinism: 'auto' never takes the float atomics
  // padded_output: the output, allocated before Run. Where every touched entry is kept (no
  // k-selection, no fused ReLU) and it holds the touched bound, the dense grid, the bitmaps and
  // the atomic sums write the touched set there, and WritePadded only pads the rest.
  int64_t* padded_keys = nullptr;
  T* padded_values = nullptr;
  int64_t padded_capacity = 0;
  // padded_capacity is a user-given max_entries below the proven bound: the kept entries past
  // it are not written, and their count goes to the status output's capacity slot.
  bool padded_capped = false;
};

// Contribution slots of the forward pass: n * max_row, which must not exceed
// kMaxSortItems (the OpKernel says so before calling).
inline int64_t ContributionSlots(int64_t n, int64_t max_row) { return n * max_row; }

// How the forward forms the touched set (DirectConvDataflow, direct_conv_choices.h):
//  kSort:  every (entry, present weight) contribution in a slot, radix-sorted by output
//          key and summed per run; temporary memory ~ U * (16 + 2 * sizeof(T)) for the
//          U = n * max_row slots, whatever the grid.
//  kDense: the input scattered into a dense [B, Cin, R^d] buffer with a presence bitmap,
//          and a 32-bit neighbour mask per site (b, y): bit (offset % 32) set where the
//          site y + delta of a present kernel offset holds an entry of any channel. Then
//          one thread per site (b, y) and 8 output channels (one per output where R^d is
//          not a multiple of 32) skips a site whose mask is 0 and otherwise sums its
//          present inputs, weights whose bit is clear skipped, in the CPU's order (each
//          input read once for all its channels), and marks a touched bitmap, compacted in
//          key order; temporary memory ~ B * R^d * ((Cin + Cout) * (sizeof(T) + 1/8)
//          + 4 + 1/8), whatever the entries. The paper's dense R^d buffers, used only where
//          they are the smaller.
//  kAuto:  kDense where its temporary memory is below kSort's (and, where kAtomic may run, its
//          sites are few against the contributions: kMinSlotsPerDenseThread); else the bitmaps below where
//          theirs is at most twice kSort's or 256 MiB and an output channel has at most
//          kMaxBitmapProbes present weights on average; else, without op determinism and from
//          kMinAtomicSlots contributions, kAtomic where its memory fits as the bitmaps' must
//          (AtomicAllowed); else kSort.
// kBitmap (ForwardPath::kBitmap, also chosen by kAuto): a presence bit per input key
// [B, Cin, R^d] and per output key [B, Cout, R^d]. Each (entry, present weight) sets its
// output's bit (integer atomicOr); the set bits, counted per tile of words and scanned,
// are the touched keys in key order, with no sort; then one thread per touched entry sums
// its inputs in the CPU's order, each found by its bit and the bits before it in its word
// (the word's first entry is recorded when the input is marked). Temporary memory
// ~ B * R^d * (Cin / 4 + Cout / 8) bytes + the touched keys and values + the entries' data.
// All three give the same touched set and bit-identical values (the CPU's summation order).
// kAtomic (ForwardPath::kAtomic, also chosen by kAuto without op determinism): kBitmap's output
// bits alone give the touched keys in order, and with them each 32-bit word's rank (the touched
// entries before it), so an output key's place in the touched set is its word's rank plus the
// set bits below it in the word; then one thread per contribution slot adds value * w at that
// place with a float atomic, and one pass over the touched set adds the bias. Every
// contribution is computed twice (to mark, then to add) and none is stored or sorted.
// Temporary memory ~ B * R^d * Cout / 4 bytes + the touched keys and values + the entries'
// data. The same touched set as the others; the sums' order, so their last bits, vary.

template <typename T>
inline double SortForwardBytes(const DirectConvGpuArgs<T>& a) {
  return static_cast<double>(ContributionSlots(a.n, a.weights.max_row)) * (16.0 + 2.0 * sizeof(T));
}
template <typename T>
inline double DenseForwardBytes(const DirectConvGpuArgs<T>& a) {
  const double grid = static_cast<double>(a.in_layout.batch) * static_cast<double>(a.in_layout.spatial_size);
  // input buffer and bitmap; site bitmap and neighbour masks; output values and bitmap;
  // touched keys and values, selection keys
  return grid * static_cast<double>(a.in_layout.channels) * (sizeof(T) + 0.125) + grid * (4.0 + 0.125) +
         grid * static_cast<double>(a.cout) * (sizeof(T) + 0.125 + 8.0 + sizeof(T) + 16.0);
}
// The bitmaps' and the atomic sums' common part: the touched keys and values, at most one per
// slot or output key, and the entries' data.
template <typename T>
inline double TouchedSetBytes(const DirectConvGpuArgs<T>& a) {
  const double outputs = static_cast<double>(a.in_layout.batch) * static_cast<double>(a.in_layout.spatial_size) *
                         static_cast<double>(a.cout);
  const double touched = std::min(static_cast<double>(ContributionSlots(a.n, a.weights.max_row)), outputs);
  return touched * (8.0 + sizeof(T)) + static_cast<double>(a.n) * (12.0 + 4.0 * a.in_layout.d);
}
template <typename T>
inline double BitmapForwardBytes(const DirectConvGpuArgs<T>& a) {
  const double sites = static_cast<double>(a.in_layout.batch) * static_cast<double>(a.in_layout.spatial_size);
  // input bits and each word's first entry; output bits
  return sites * static_cast<double>(a.in_layout.channels) * 0.25 + sites * static_cast<double>(a.cout) * 0.125 +
         TouchedSetBytes(a);
}
template <typename T>
inline double AtomicForwardBytes(const DirectConvGpuArgs<T>& a) {
  const double sites = static_cast<double>(a.in_layout.batch) * static_cast<double>(a.in_layout.spatial_size);
  // output bits and each word's rank
  return sites * static_cast<double>(a.cout) * 0.25 + TouchedSetBytes(a);
}

// The temporary memory 'auto' allows the bitmaps and the atomic sums: at most twice the sort's
// or 256 MiB.
template <typename T>
inline bool WithinBitmapBudget(const DirectConvGpuArgs<T>& a, double bytes) {
  return bytes <= 2.0 * SortForwardBytes(a) || bytes <= 256.0 * (1 << 20);
}

// Below this many contribution slots 'auto' keeps the deterministic dataflows: their time is
// the launches', not the sums'.
constexpr int64_t kMinAtomicSlots = int64_t{1} << 20;
// 'auto' may take the atomic sums: no op determinism, enough slots, and memory within what
// the bitmaps may take.
template <typename T>
inline bool AtomicAllowed(const DirectConvGpuArgs<T>& a) {
  return !a.deterministic && ContributionSlots(a.n, a.weights.max_row) >= kMinAtomicSlots &&
         WithinBitmapBudget(a, AtomicForwardBytes(a));
}
// Where 'auto' may take the atomic sums, the dense grid runs only where it has at least this
// many contribution slots per thread of its per-site kernel (a site and 8 output channels):
// the dense kernel visits every site of the grid, the atomic sums every contribution. H200,
// 2026-11-30: OctNet3's 32^3 training batches, whose convolutions after the first have roughly
// 90 to 1,000 slots per dense thread, ran a step in 35 ms with them on the dense grid and in
// 129 ms on the atomic sums; the six-layer stack's pooled levels (about 10 to 55) ran faster
// on the atomic sums (128^3, rho_f 0.1: 2.55 against 2.94 ms a stack).
constexpr double kMinSlotsPerDenseThread = 40.0;
// The bitmaps, where 'auto' would take them after the dense grid: their memory at most twice
// the sort's or 256 MiB (the input's entry indices are int32 in their word table), and at most
// kMaxBitmapProbes present weights per output channel on average (each touched entry tests
// the presence bit of every present weight of its output channel: beyond that the sort is
// faster; H200: bitmaps 1.6x slower at 27 weights per (1 -> 8) output channel, as fast at 13.5,
// 1.5x faster at 2.7).
constexpr double kMaxBitmapProbes = 12.0;
template <typename T>
inline bool BitmapsFit(const DirectConvGpuArgs<T>& a) {
  const bool fits = a.n < (int64_t{1} << 31) && WithinBitmapBudget(a, BitmapForwardBytes(a));
  return fits && static_cast<double>(a.weights.count) <= kMaxBitmapProbes * static_cast<double>(a.cout);
}
// The dense grid: where its temporary memory is below the sort's, which follows the
// contributions, and, where 'auto' would otherwise take the atomic sums, the grid's sites are
// few against the contributions (kMinSlotsPerDenseThread).
template <typename T>
inline bool UseDenseGrid(const DirectConvGpuArgs<T>& a, DirectConvDataflow dataflow) {
  if (dataflow != DirectConvDataflow::kAuto) return dataflow == DirectConvDataflow::kDense;
  if (DenseForwardBytes(a) >= SortForwardBytes(a)) return false;
  if (!AtomicAllowed(a) || BitmapsFit(a)) return true;
  const double dense_threads = static_cast<double>(a.in_layout.batch) * static_cast<double>(a.in_layout.spatial_size) *
                               std::ceil(static_cast<double>(a.cout) / 8.0);
  return static_cast<double>(ContributionSlots(a.n, a.weights.max_row)) >= kMinSlotsPerDenseThread * dense_threads;
}

// The backward's output lookups: a grid of output gradients over every output key (sizeof(T)
// per key, set once per call, then one random read per (entry, present weight)) where the
// forward would take the dense grid, and elsewhere where the grid stays within the bitmaps'
// budget and has at most kGridKeysPerLookup keys per lookup; else a binary search of the
// sorted output keys per lookup (~log2(n_out) dependent reads, then the gradient's).
// kSort forced keeps the searches (so that tests reach them).
constexpr double kGridKeysPerLookup = 16.0;
template <typename T>
inline bool UseOutGradGrid(const DirectConvGpuArgs<T>& a, DirectConvDataflow dataflow) {
  if (a.n == 0) return false;
  if (dataflow == DirectConvDataflow::kSort) return false;
  if (UseDenseGrid(a, dataflow)) return true;
  const double keys = static_cast<double>(a.in_layout.batch) * static_cast<double>(a.in_layout.spatial_size) *
                      static_cast<double>(a.cout);
  return WithinBitmapBudget(a, keys * sizeof(T)) &&
         keys <= kGridKeysPerLookup * static_cast<double>(ContributionSlots(a.n, a.weights.max_row));
}

// How the forward runs (the dataflow kAuto resolved).
enum class ForwardPath { kSort, kDense, kBitmap, kAtomic };
template <typename T>
inline ForwardPath ForwardPathOf(const DirectConvGpuArgs<T>& a, DirectConvDataflow dataflow) {
  if (dataflow == DirectConvDataflow::kSort) return ForwardPath::kSort;
  if (dataflow == DirectConvDataflow::kBitmap) return ForwardPath::kBitmap;
  if (dataflow == DirectConvDataflow::kAtomic) return ForwardPath::kAtomic;
  if (UseDenseGrid(a, dataflow)) return ForwardPath::kDense;
  if (BitmapsFit(a)) return ForwardPath::kBitmap;
  return AtomicAllowed(a) ? ForwardPath::kAtomic : ForwardPath::kSort;
}

// kConvReluNaN: with the fused ReLU, the first touched entry that is NaN.
enum ConvCheck { kConvKeys = 0, kConvValues = 1, kConvFilter = 2, kConvBias = 3, kConvReluNaN = 4 };

template <typename T>
class DirectConvForwardGpu {
 public:
  // Checks (ConvCheck), computes the touched set, adds the bias, selects k per (b, oc);
  // writes touched_counts and positive_counts (entries > 0 before k-selection), each
  // [B * Cout]; report->count = kept entries (with args.relu, those > 0). Blocks until the
  // report is on the host; with report nullptr it does not: the work is queued, and the
  // report stays on the device (device_report()) for PadConvOutput and ConvStatus.
  GpuStatus Run(Stream stream, Scratch* scratch, const DirectConvGpuArgs<T>& args,
                const T* bias, SelectionMode selection, int64_t k, DirectConvDataflow dataflow,
                int64_t* touched_counts, int64_t* positive_counts, Report* report);
  // Writes the report->count kept entries in key order.
  GpuStatus Write(Stream stream, int64_t* out_keys, T* out_values) const;
  // Write, then PadConvOutput's padding up to capacity (one launch where every touched entry
  // is kept), with the status output (ConvStatus) in the same launch where status is given.
  GpuStatus WritePadded(Stream stream, int64_t* out_keys, T* out_values, int64_t capacity,
                        const Report* device_report, int64_t live, int64_t limit, int64_t* status) const;
  // The report of a Run that did not wait (nullptr after one that did).
  const Report* device_report() const { return unread_report_; }

 private:
  const Report* unread_report_ = nullptr;
  const int64_t* touched_keys_ = nullptr;
  const T* touched_values_ = nullptr;
  const int64_t* touched_total_ = nullptr;  // device
  const uint8_t* keep_ = nullptr;           // nullptr: keep every touched entry
  const T* relu_values_ = nullptr;          // the fused ReLU's test (nullptr: none)
  Compaction kept_;                         // the kept entries' first pass (else Run wrote them)
  const int64_t* kept_in_ = nullptr;        // the padded output Run compacted the kept entries into
  bool keep_all_ = false;                   // every touched entry is kept: Write copies them
  int64_t cap_ = 0;                         // a capped padded output's capacity (else 0)
  int64_t touched_bound_ = 0;
};

// A forward in groups of whole examples (the attribute temp_limit_bytes, the OpKernel):
// each output key and each (b, oc) selection involves one example only, so running
// DirectConvForwardGpu on the entries of examples [b0, b1) (keys and values offset, n the
// group's, the layout the whole batch's) gives exactly the whole run's entries of those
// examples, and their counts in touched/positive_counts[b0 * Cout, b1 * Cout).

// host_begin[b] = the first entry with key >= b * per_example, b = 0 .. batch (sorted keys;
// batch + 1 values). Blocks until they are on the host.
GpuStatus ExampleBegins(Stream stream, Scratch* scratch, const int64_t* keys, int64_t n, int64_t batch,
                        int64_t per_example, int64_t* host_begin);
// to[0, count) = from[0, count), both on the device, queued on the stream.
GpuStatus CopyCounts(Stream stream, int64_t* to, const int64_t* from, int64_t count);
// The forward's data checks alone (ConvCheck slots, over all entries). Blocks until the
// report is on the host.
template <typename T>
GpuStatus DirectConvCheckInputs(Stream stream, Scratch* scratch, const DirectConvGpuArgs<T>& args, const T* bias,
                                Report* report);

// The padding of a padded_output call: out_keys/out_values[live, capacity) = (kPaddingKey,
// 0), where live is the kept count in device_report (all of them padding if a check of it
// failed: its status says why), or, with device_report nullptr, the host's live; and,
// where status is given, ConvStatus's output in the same launch.
template <typename T>
GpuStatus PadConvOutput(Stream stream, const Report* device_report, int64_t live, int64_t capacity,
                        int64_t* out_keys, T* out_values, int64_t limit = 0, int64_t* status = nullptr,
                        int64_t cap = 0);
// The status output (direct_conv_checks.h, kConvStatusSize values): device_report's checks
// and limit, and with cap > 0 (a capped padded output's capacity) its capacity slot, or, with
// device_report nullptr (the host has checked), all -1.
GpuStatus ConvStatus(Stream stream, const Report* device_report, int64_t limit, int64_t* status, int64_t cap = 0);

enum ConvBackpropCheck {
  kBackpropKeys = 0,
  kBackpropValues = 1,
  kBackpropFilter = 2,
  kBackpropOutKeys = 3
};

// Eq. 3: gradients at the input entries, the present weights (all other filter_grad
// entries are 0) and the bias. Checks (ConvBackpropCheck), then blocks until the report
// is on the host; with report nullptr (inputs checked by the forward call), neither: the
// work is queued and the call returns. Where UseOutGradGrid(args, dataflow), the output gradients are read
// from a dense [B * Cout * R^d] grid of them (built per call) instead of through binary searches.
// in_grad or filter_grad nullptr: that gradient is not computed (no op reads it).
template <typename T>
GpuStatus DirectConvBackpropGpu(Stream stream, Scratch* scratch,
                                const DirectConvGpuArgs<T>& args, const int64_t* out_keys,
                                const T* out_grad, int64_t n_out, DirectConvDataflow dataflow,
                                T* in_grad, T* filter_grad, T* bias_grad, Report* report);

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_DIRECT_CONV_DIRECT_CONV_GPU_H_

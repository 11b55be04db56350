// DirectSparseConv and its backprop on the GPU (Hackel et al., Algorithms 1 and 2),
// deterministic but for the atomic sums: no float atomics elsewhere (integer atomics count,
// in any order, exactly).
//
// Forward, sort-based, memory proportional to the contributions:
//  1. Every input entry i owns max_row contribution slots, one per present weight of its
//     input channel (fewer weights or an output outside the grid leave a slot empty).
//     Slot (i, r) holds (output key, value_i * w); empty slots hold a key past every
//     output key. The slot count n * max_row is known on the host, so no count is read
//     back before the sort: the op keeps its one host round trip.
//  2. A stable radix sort by output key. Entries are in key order (b, ic, x), and for a
//     fixed output y = x - delta the entries of one input channel are in kernel-offset
//     order, so each output key's contributions end up in (ic, kernel offset) order,
//     the CPU kernel's order: summed left to right with the CPU's roundings, the values
//     are bit-identical to the CPU kernel's.
//  3. A compaction of the first slot of each output key sums its run and adds the bias:
//     the touched set, sorted by key; touched_counts from binary searches.
//  4. k-selection: per (b, oc) segment of more than k touched entries, a radix select of
//     the k-th largest score (8-bit digits, most significant first: a histogram per round),
//     then the entries above it and the first of its ties in key order are kept: the k
//     largest, ties to the smaller key.
//  5. A compaction of the kept entries gives the output size (read back with the
//     checks) and, after the OpKernel allocated the outputs, writes them in key order;
//     where every touched entry is kept, the touched set is copied (and padded) instead.
//
// Forward on the bitmaps (ForwardPath::kBitmap, direct_conv_gpu.h) replaces steps 1-3: a
// bit per input and per output key, the output bits set from every (entry, present
// weight), read out in key order per tile of words (the touched set without a sort), and
// one thread per touched entry summing its present inputs in the CPU's order; the
// per-segment counts come from those two kernels, so no binary searches.
//
// The atomic sums (ForwardPath::kAtomic, never under op determinism) keep the bitmaps' output
// bits and touched keys, and add every contribution with a float atomic at its key's place
// in the touched set (its word's rank plus the set bits below it): no input bits, no
// per-output search, no sort; the last bits of a sum depend on the order the atomics ran.
//
// Temporary memory of the forward pass, U = n * max_row contribution slots:
//   U * (16 + 2 * sizeof(T))   keys and values of the contributions, double-buffered
//                              (the touched set and k-selection's ties reuse them)
//   + V * 9 with k-selection   the ranks of the ties and keep flags, for
//                              V = min(U, B * Cout * R^d) >= the touched entries (the
//                              ties and the segment of each entry reuse the contributions'
//                              buffers), and 1 KiB + 16 bytes per segment (histograms)
//   + n * (12 + 4 * d)         per-entry output base, input channel, coordinates
//   + 32 bytes per 2048 slots, (B * Cout + 1) * 8, the weight table, CUB's scratch.
//
// Backprop, one thread per input entry for in_grad (same order as the CPU, so
// bit-identical), binary search of the output key in the sorted out_keys; filter_grad
// and bias_grad from fixed partitions summed by fixed-order trees (a warp per part of the
// filter gradient, a block per part of the bias gradient), so they are deterministic but
// not bit-identical to the CPU's sequential sums.
// Temporary memory of the backprop: n * (12 + 4 * d) + (B * Cin + B * Cout + 2) * 8
//   + sizeof(T) * (P * B * G + B * Cout * G') for the partial sums, G, G' <= 256.
#include <cstdint>
#include <cstring>

#include "channel/channel_sparse.cuh"
#include "channel/direct_conv/direct_conv_gpu.h"
#include "common/gpu_util.cuh"

namespace tf_sparseconv {
namespace gpu {
namespace {

// The score of k-selection as an unsigned integer that sorts like the number.
template <typename T>
struct ScoreBits;
template <>
struct ScoreBits<float> {
  using type = uint32_t;
  __device__ static uint32_t Ordered(float x) {
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  }
};
template <>
struct ScoreBits<double> {
  using type = uint64_t;
  __device__ static uint64_t Ordered(double x) {
    const uint64_t u = static_cast<uint64_t>(__double_as_longlong(x));
    return (u & 0x8000000000000000ull) ? ~u : (u | 0x8000000000000000ull);
  }
};

// The spatial delta of w's kernel offset in dimension j (x = y + delta), recovered from
// lo = max(0, delta) and hi = min(R, R + delta).
__host__ __device__ inline int32_t SpatialDelta(const GpuPresentWeight& w, int j, int64_t extent) {
  return w.lo[j] > 0 ? w.lo[j] : w.hi[j] - static_cast<int32_t>(extent);
}

__device__ inline bool Reaches(const int32_t* x, const GpuPresentWeight& w, int d) {
  bool inside = true;
#pragma unroll
  for (int j = 0; j < kMaxSpatialDims; ++j) {  // constant indices: a loaded w stays in registers
    if (j < d) inside = inside && x[j] >= w.lo[j] && x[j] < w.hi[j];
  }
  return inside;
}

// The data of every input entry that the contribution kernels need: the output key of
// its position in output channel 0, its input channel (-1: padding) and its coordinates.
struct EntryData {
  int64_t* out_base;
  int32_t* ic;
  int32_t* coords;  // n * d
};

// Entry i's data from its (checked) key; false for padding (a padded input's tail), which
// reaches nothing.
__device__ inline bool StoreEntryData(const KeyLayout& L, int64_t cout, int64_t key, int64_t i, EntryData e) {
  if (key == kPaddingKey) {
    e.out_base[i] = 0;
    e.ic[i] = -1;
    return false;
  }
  const int64_t seg = L.segment_of(key);
  const int64_t lin = key - seg * L.spatial_size;
  const int64_t b = seg / L.channels;
  e.out_base[i] = b * cout * L.spatial_size + lin;
  e.ic[i] = static_cast<int32_t>(seg - b * L.channels);
  DecodeSpatial(lin, L, e.coords + i * L.d);
  return true;
}

// The forward's NaN checks (the first NaN of the values, the filter and the bias, each in its
// ConvCheck slot), run by the first kernel over the input's entries of each dataflow rather
// than in a launch of their own. checks nullptr: none (the backprop's entry data).
template <typename T>
struct ForwardNaN {
  const T* values = nullptr;
  int64_t n = 0;
  const T* filter = nullptr;
  int64_t filter_size = 0;
  const T* bias = nullptr;
  int64_t cout = 0;
  CheckSlot* checks = nullptr;

  __device__ void Run() const {
    if (checks == nullptr) return;
    TF_SPARSECONV_GRID_LOOP(i, n + filter_size + cout) {
      if (i < n) {
        if (isnan(values[i])) RecordFirst(&checks[kConvValues], i);
      } else if (i < n + filter_size) {
        if (isnan(filter[i - n])) RecordFirst(&checks[kConvFilter], i - n);
      } else if (isnan(bias[i - n - filter_size])) {
        RecordFirst(&checks[kConvBias], i - n - filter_size);
      }
    }
  }
};

template <typename T>
__global__ void EntryDataKernel(KeyLayout L, int64_t cout, const int64_t* keys, int64_t n,
                                const Report* report, EntryData e, ForwardNaN<T> nan) {
  ChainedKernelBegin();
  nan.Run();
  if (!ChecksPassed(report)) return;
  TF_SPARSECONV_GRID_LOOP(i, n) StoreEntryData(L, cout, keys[i], i, e);
}

// Index: the integer type of the slot arithmetic, uint32_t where the slots fit (a 64-bit
// division per slot took most of this kernel's time).
template <typename T, typename Index>
__global__ void ContributionsKernel(KeyLayout L, EntryData e, const T* values, const T* filter,
                                    const GpuPresentWeight* weights, const int64_t* row_begin,
                                    int64_t max_row, int64_t num_slots, uint64_t no_output,
                                    const Report* report, uint64_t* out_keys, T* products) {
  ChainedKernelBegin();
  const bool valid = ChecksPassed(report);
  const Index row_length = static_cast<Index>(max_row);
  TF_SPARSECONV_GRID_LOOP(slot, num_slots) {
    uint64_t key = no_output;
    T product = T(0);
    const Index i = static_cast<Index>(slot) / row_length;
    if (valid && e.ic[i] >= 0) {
      const int64_t r = static_cast<Index>(slot) - i * row_length;
      const int64_t row = row_begin[e.ic[i]];
      if (r < row_begin[e.ic[i] + 1] - row) {
        const GpuPresentWeight& w = weights[row + r];
        if (Reaches(e.coords + static_cast<int64_t>(i) * L.d, w, L.d)) {
          key = static_cast<uint64_t>(e.out_base[i] + w.oc * L.spatial_size - w.lin_delta);
          product = MulRn(values[i], filter[w.filter_index]);
        }
      }
    }
    out_keys[slot] = key;
    products[slot] = product;
  }
}

// Sums the run of equal keys that starts at q in slot order, then adds the bias, like
// the CPU's dense accumulator (0 + c1 + c2 + ...) + bias.
template <typename T>
struct SumContributions {
  const uint64_t* keys;
  const T* products;
  int64_t num_slots;
  const T* bias;
  int64_t spatial_size;
  int64_t cout;
  int64_t* touched_keys;
  T* touched_values;
  __device__ void operator()(int64_t q, int64_t rank) const {
    const uint64_t key = keys[q];
    T sum = T(0);
    for (int64_t p = q; p < num_slots && keys[p] == key; ++p) sum = AddRn(sum, products[p]);
    const int64_t oc = (static_cast<int64_t>(key) / spatial_size) % cout;
    touched_keys[rank] = static_cast<int64_t>(key);
    touched_values[rank] = AddRn(sum, bias[oc]);
  }
};

// begin[s] = first touched entry of segment s, for s in [0, num_segments]; positive[s] = 0
// (PositiveCountKernel adds to it next).
__global__ void SegmentBeginKernel(const int64_t* touched_keys, const int64_t* touched_total,
                                   int64_t num_segments, int64_t spatial_size, int64_t* begin, int64_t* positive) {
  ChainedKernelBegin();
  const int64_t total = *touched_total;
  TF_SPARSECONV_GRID_LOOP(s, num_segments + 1) {
    begin[s] = LowerBound(touched_keys, total, s * spatial_size);
    if (s < num_segments) positive[s] = 0;
  }
}

// counts[segment] += the block's threads with `here` (integer atomics, so the result does
// not depend on their order), for the block's positions [base, min(base + kThreads, end))
// whose segments rise (sorted keys): one atomic where they all share one segment, else one
// per warp and segment. Every thread of the block calls it (it holds barriers).
__device__ inline void CountPerSegment(int64_t segment, bool here, int64_t base, int64_t end,
                                       int64_t* block_segment, int64_t* counts) {
  if (threadIdx.x == 0) block_segment[0] = segment;
  const int64_t last = (end - base < kThreads ? end - base : kThreads) - 1;
  if (threadIdx.x == last) block_segment[1] = segment;
  __syncthreads();
  const bool one_segment = block_segment[0] == block_segment[1];  // sorted: all between are equal
  const int count = __syncthreads_count(here);
  if (one_segment) {
    if (threadIdx.x == 0 && count > 0) {
      atomicAdd(reinterpret_cast<unsigned long long*>(&counts[block_segment[0]]),
                static_cast<unsigned long long>(count));
    }
  } else {
    const unsigned int lanes = __ballot_sync(0xffffffffu, here);
    if (here) {
      const unsigned int same = __match_any_sync(lanes, static_cast<unsigned long long>(segment)) & lanes;
      if ((threadIdx.x % 32) == static_cast<unsigned int>(__ffs(same) - 1)) {
        atomicAdd(reinterpret_cast<unsigned long long*>(&counts[segment]),
                  static_cast<unsigned long long>(__popc(same)));
      }
    }
  }
  __syncthreads();  // block_segment is rewritten by the caller's next iteration
}

// positive[s] = touched entries > 0 of segment s (before k-selection). Integer atomics:
// exact and independent of the order, so the result is deterministic. The touched keys are
// sorted, so a block's kThreads consecutive entries mostly share one segment: the block
// counts them together (one atomic per block), else each warp per segment among its lanes
// (one atomic per warp and segment). One atomic per entry on the few segments of a large
// grid (B * Cout = 8) took 2 ms of a 4 ms convolution (H200, 256^3, 2026-11-29).
// Its first num_segments threads also write counts[s] = begin[s + 1] - begin[s].
template <typename T>
__global__ void __launch_bounds__(kThreads)
PositiveCountKernel(const int64_t* touched_keys, const T* touched_values, const int64_t* touched_total,
                    int64_t num_slots, int64_t spatial_size, const int64_t* begin, int64_t num_segments,
                    int64_t* counts, int64_t* positive) {
  ChainedKernelBegin();
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; s < num_segments;
       s += static_cast<int64_t>(gridDim.x) * kThreads) {
    counts[s] = begin[s + 1] - begin[s];
  }
  const int64_t total = *touched_total;
  const int64_t end = total < num_slots ? total : num_slots;
  __shared__ int64_t block_segment[2];
  // the loop's bounds are the same for the whole block: every thread reaches each barrier
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads; base < end;
       base += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t j = base + threadIdx.x;
    const bool in_range = j < end;
    const int64_t segment = in_range ? touched_keys[j] / spatial_size : -1;
    CountPerSegment(segment, in_range && touched_values[j] > T(0), base, end, block_segment, positive);
  }
}

// Blocks for a grid-stride loop over `blocks` blocks' work, at most 65,536.
inline unsigned int LoopBlocks(int64_t blocks) {
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks > 65536 ? 65536 : blocks));
}

// ---- k-selection: a radix select per (b, oc) segment, no sort ----
//
// Segment s keeps the k entries with the largest score bits U (ScoreBits: ordered like the
// score), ties to the smaller key, i.e. the earlier position: the order of a stable sort by
// score, descending. Where a segment holds more than k entries, kRadixBits-bit digits of U,
// most significant first, narrow down the k-th largest U (the threshold t): per round, a
// histogram of the digit over the entries whose higher digits equal the prefix found so
// far, then the digit where the count from the top reaches the entries still to pick
// (remaining). After the last round prefix = t and remaining = how many entries equal to t
// are kept, the first ones in key order (ranked only in segments that drop some of them).
// Work ~ rounds passes over the touched set, against the two radix sorts of every touched
// entry it replaces.
constexpr int kRadixBits = 8;
constexpr int kRadixBins = 1 << kRadixBits;
constexpr int kSelectItems = 16;  // entries per thread and tile of the histogram kernel

template <typename T>
__device__ inline typename ScoreBits<T>::type ScoreOf(T value, bool by_magnitude) {
  T s = by_magnitude ? fabs(value) : value;
  if (s == T(0)) s = T(0);  // -0 == +0 on the CPU: a tie, decided by the key
  return ScoreBits<T>::Ordered(s);
}

// k-selection's start, one launch: remaining[s] = k where segment s holds more than k entries
// (it is selected), else -1 (every entry kept); prefix[s] = 0; partial_ties[s] = 0; the first
// round's histograms zeroed, a bin per thread (a thread per segment zeroing its 256 bins took
// 67 us per call at 2,048 segments). An entry's segment is found from begin (OwnerOf), not
// stored: a segment per entry cost a pass over the touched keys and 4 bytes an entry in
// every later pass.
template <typename Bits>
__global__ void SelectStartKernel(const int64_t* begin, int64_t num_segments, int64_t k, Bits* prefix,
                                  int64_t* remaining, int64_t* partial_ties, uint32_t* hist) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(s, num_segments) {
    remaining[s] = begin[s + 1] - begin[s] > k ? k : -1;
    prefix[s] = 0;
    partial_ties[s] = 0;
  }
  TF_SPARSECONV_GRID_LOOP(bin, num_segments * kRadixBins) hist[bin] = 0u;
}

// The touched set's end: its total, at most the bound the buffers were sized for.
__device__ inline int64_t TouchedEnd(const int64_t* touched_total, int64_t touched_bound) {
  const int64_t total = *touched_total;
  return total < touched_bound ? total : touched_bound;
}

// hist[s * kRadixBins + digit] += entries of selected segments whose digit at `shift` is
// `digit` and whose higher digits equal prefix[s]. A tile of kThreads * kSelectItems
// consecutive entries within one segment (the sorted keys make that the common case on
// large segments) counts in shared memory and adds its non-zero bins once; a tile across
// segments adds each entry to the global histogram, each thread walking begin from the
// tile's first segment (its entries rise).
template <typename T>
__global__ void __launch_bounds__(kThreads)
SelectHistogramKernel(const T* values, bool by_magnitude, const int64_t* begin, int64_t num_segments,
                      const int64_t* touched_total, int64_t touched_bound, const typename ScoreBits<T>::type* prefix,
                      const int64_t* remaining, int shift, uint32_t* hist) {
  ChainedKernelBegin();
  using Bits = typename ScoreBits<T>::type;
  constexpr int kBits = 8 * sizeof(Bits);
  __shared__ uint32_t bins[kRadixBins];
  __shared__ int64_t tile_segment[2];
  const int64_t end = TouchedEnd(touched_total, touched_bound);
  constexpr int64_t kTile = static_cast<int64_t>(kThreads) * kSelectItems;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kTile; base < end;
       base += static_cast<int64_t>(gridDim.x) * kTile) {
    const int64_t tile_end = base + kTile < end ? base + kTile : end;
    for (int b = threadIdx.x; b < kRadixBins; b += kThreads) bins[b] = 0;
    if (threadIdx.x == 0) {
      tile_segment[0] = OwnerOf(begin, num_segments, base);
      tile_segment[1] = OwnerOf(begin, num_segments, tile_end - 1);
    }
    __syncthreads();
    const bool shared_bins = tile_segment[0] == tile_segment[1];
    const int64_t s0 = tile_segment[0];
    if (!shared_bins || remaining[s0] >= 0) {  // a whole tile of an unselected segment has nothing to count
      int64_t s = s0;
      for (int64_t j = base + threadIdx.x; j < tile_end; j += kThreads) {
        while (begin[s + 1] <= j) ++s;  // j < end <= begin[num_segments]
        if (remaining[s] < 0) continue;
        const Bits u = ScoreOf(values[j], by_magnitude);
        const int high = shift + kRadixBits;
        if (high < kBits && (u >> high) != (prefix[s] >> high)) continue;
        const uint32_t digit = static_cast<uint32_t>(u >> shift) & (kRadixBins - 1);
        if (shared_bins) {
          atomicAdd(&bins[digit], 1u);
        } else {
          atomicAdd(&hist[s * kRadixBins + digit], 1u);
        }
      }
    }
    __syncthreads();
    if (shared_bins) {
      for (int b = threadIdx.x; b < kRadixBins; b += kThreads) {
        if (bins[b] != 0u) atomicAdd(&hist[s0 * kRadixBins + b], bins[b]);
      }
    }
    __syncthreads();  // bins and tile_segment are rewritten by the next tile
  }
}

constexpr int kBinsPerLane = kRadixBins / 32;

// One round's digit of one segment, by one warp whose lane l holds the segment's bins
// 8l .. 8l + 7 (`bins`): the digit where the count from the top bin reaches `want`; the
// entries of the higher bins are kept. True on the one lane that found it, with *digit and
// *left = want less those entries. The counts above each lane's bins are a warp scan; where
// no bin reaches want, lane 0 takes digit 0, as a one-thread scan from the top would.
__device__ inline bool ChooseDigit(const uint32_t (&bins)[kBinsPerLane], int64_t want, int lane, int* digit,
                                   int64_t* left) {
  int64_t mine = 0;
#pragma unroll
  for (int b = 0; b < kBinsPerLane; ++b) mine += bins[b];
  // above = the bins of the higher lanes: an inclusive scan from lane 31 down, minus mine
  int64_t from_top = mine;
  for (int step = 1; step < 32; step *= 2) {
    const int64_t other = __shfl_down_sync(0xffffffffu, from_top, step);
    if (lane + step < 32) from_top += other;
  }
  int64_t above = from_top - mine;
  // the lane whose bins cross want (the highest such lane: bins above it hold fewer),
  // else lane 0 takes digit 0, as the one-thread scan did
  const bool crosses = above < want && above + mine >= want;
  const unsigned int crossing = __ballot_sync(0xffffffffu, crosses || (want == 0 && lane == 31));
  const int chosen = crossing != 0u ? 31 - __clz(crossing) : 0;
  if (lane != chosen) return false;
  *digit = lane * kBinsPerLane;
  for (int b = kBinsPerLane - 1; b >= 0; --b) {
    if (above + bins[b] >= want || b == 0) {
      *digit = lane * kBinsPerLane + b;
      break;
    }
    above += bins[b];
  }
  *left = want - above;
  return true;
}

// Per selected segment, one warp: ChooseDigit of the round at `shift`, added to prefix[s],
// remaining[s] the entries still to pick. The next round's histogram (the other buffer) of
// every segment is zeroed here. In the last round (partial_ties given) the chosen bin counts
// the entries equal to the threshold: partial_ties[s] = that count where fewer of them are
// kept (their rank in key order decides, SelectKeepTilesKernel), else it stays 0.
template <typename Bits>
__global__ void SelectDigitKernel(const uint32_t* hist, int64_t num_segments, int shift, Bits* prefix,
                                  int64_t* remaining, uint32_t* next_hist, int64_t* partial_ties) {
  ChainedKernelBegin();
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; s < num_segments;
       s += warps) {
    const int64_t want = remaining[s];  // the same for the whole warp
#pragma unroll
    for (int b = 0; b < kBinsPerLane; ++b) next_hist[s * kRadixBins + lane * kBinsPerLane + b] = 0u;
    if (want < 0) continue;
    uint32_t bins[kBinsPerLane];
#pragma unroll
    for (int b = 0; b < kBinsPerLane; ++b) bins[b] = hist[s * kRadixBins + lane * kBinsPerLane + b];
    int digit;
    int64_t left;
    if (ChooseDigit(bins, want, lane, &digit, &left)) {
      prefix[s] |= static_cast<Bits>(digit) << shift;
      remaining[s] = left;
      if (partial_ties != nullptr) {
        uint32_t ties = 0;
#pragma unroll
        for (int b = 0; b < kBinsPerLane; ++b) ties = lane * kBinsPerLane + b == digit ? bins[b] : ties;
        if (static_cast<int64_t>(ties) > left) partial_ties[s] = ties;
      }
    }
  }
}

// The entries of segments that keep only some of their entries equal to the threshold
// (partial_ties[s] > 0): At(j, s) for entry j of segment s, AtScore given its score. The one
// test of both CountPartialTiesKernel and SelectKeepTilesKernel, whose counts must agree.
template <typename T>
struct PartialTies {
  using Bits = typename ScoreBits<T>::type;
  const T* values;
  bool by_magnitude;
  const Bits* prefix;
  const int64_t* partial_ties;
  __device__ Bits Score(int64_t j) const { return ScoreOf(values[j], by_magnitude); }
  __device__ bool AtScore(Bits u, int64_t s) const { return partial_ties[s] > 0 && u == prefix[s]; }
  __device__ bool At(int64_t j, int64_t s) const { return partial_ties[s] > 0 && Score(j) == prefix[s]; }
};

// tile_counts[t] = the partial ties among entries [t * kTileSize, (t + 1) * kTileSize) (the
// tiles of SelectKeepTilesKernel, kTileItems consecutive entries a thread), each thread finding
// its first entry's segment once and walking begin from there (a search per entry took 36 us
// of each 256^3 layer of the six-layer stack).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    CountPartialTiesKernel(PartialTies<T> ties, const int64_t* begin, int64_t num_segments,
                           const int64_t* touched_total, int64_t touched_bound, int64_t num_tiles,
                           int64_t* tile_counts) {
  ChainedKernelBegin();
  using BlockReduce = cub::BlockReduce<int, kThreads>;
  __shared__ typename BlockReduce::TempStorage reduce;
  const int64_t end = TouchedEnd(touched_total, touched_bound);
  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const int64_t first = tile * kTileSize + static_cast<int64_t>(threadIdx.x) * kTileItems;
    int count = 0;
    if (first < end) {
      int64_t s = OwnerOf(begin, num_segments, first);
      for (int i = 0; i < kTileItems && first + i < end; ++i) {
        while (begin[s + 1] <= first + i) ++s;
        count += ties.At(first + i, s) ? 1 : 0;
      }
    }
    const int tile_total = BlockReduce(reduce).Sum(count);
    if (threadIdx.x == 0) tile_counts[tile] = tile_total;
    __syncthreads();  // reduce is reused by the next tile
  }
}

// keep[j] for j < touched_bound, a tile of kTileSize entries per block as WriteTilesKernel:
// every entry of an unselected segment; of a selected one, the scores above the threshold
// prefix[s] and those equal to it where all are kept (partial_ties[s] 0), else the first
// remaining[s] of them in key order: their rank is tile_offsets (the scan of
// CountPartialTiesKernel's counts) plus a block scan, less tie_base[s] (the exclusive sum of
// partial_ties).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    SelectKeepTilesKernel(PartialTies<T> ties, const int64_t* begin, int64_t num_segments,
                          const int64_t* touched_total, int64_t touched_bound, const int64_t* remaining,
                          const int64_t* tie_base, int64_t num_tiles, const int64_t* tile_offsets, uint8_t* keep) {
  ChainedKernelBegin();
  using Bits = typename ScoreBits<T>::type;
  using BlockScan = cub::BlockScan<int, kThreads>;
  __shared__ typename BlockScan::TempStorage scan;
  const int64_t end = TouchedEnd(touched_total, touched_bound);
  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const int64_t first = tile * kTileSize + static_cast<int64_t>(threadIdx.x) * kTileItems;
    uint8_t kept[kTileItems];
    int64_t rank_limit[kTileItems];  // a partial tie is kept where its rank is below this
    int tile_ties = 0;
    int64_t s = first < end ? OwnerOf(begin, num_segments, first) : 0;
#pragma unroll
    for (int i = 0; i < kTileItems; ++i) {
      const int64_t j = first + i;
      kept[i] = 0;
      rank_limit[i] = -1;
      if (j >= end) continue;
      while (begin[s + 1] <= j) ++s;
      const int64_t want = remaining[s];
      if (want < 0) {
        kept[i] = 1;
        continue;
      }
      const Bits u = ties.Score(j);
      if (ties.AtScore(u, s)) {
        rank_limit[i] = tie_base[s] + want;
        ++tile_ties;
      } else {
        kept[i] = u >= ties.prefix[s] ? 1 : 0;  // above the threshold, or at it where all such are kept
      }
    }
    int before = 0;
    BlockScan(scan).ExclusiveSum(tile_ties, before);
    int64_t rank = tile_offsets[tile] + before;
#pragma unroll
    for (int i = 0; i < kTileItems; ++i) {
      if (rank_limit[i] >= 0) kept[i] = rank++ < rank_limit[i] ? 1 : 0;
      if (first + i < touched_bound) keep[first + i] = kept[i];
    }
    __syncthreads();  // scan's storage is reused by the next tile
  }
}

// k-selection of many small segments in one launch: a block per segment runs every round of
// SelectHistogramKernel and SelectDigitKernel over its own entries [begin[s], begin[s + 1]),
// the histogram in shared memory, then marks keep as SelectTieKernel, the tie scan and
// SelectKeepKernel do, the ties ranked by a block scan in key order: the same kept set in
// one launch where the rounds took about a dozen (OctNet3's batches at 32^3 hold 256 to 768
// segments of a few thousand entries). keep is written for the segments' entries only.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    SelectSegmentsKernel(const T* values, bool by_magnitude, const int64_t* begin, int64_t num_segments, int64_t k,
                         uint8_t* keep) {
  ChainedKernelBegin();
  using Bits = typename ScoreBits<T>::type;
  constexpr int kBits = 8 * sizeof(Bits);
  using BlockScan = cub::BlockScan<int, kThreads>;
  __shared__ uint32_t bins[kRadixBins];
  __shared__ typename BlockScan::TempStorage scan;
  __shared__ Bits round_prefix;
  __shared__ int64_t round_left;
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int64_t s = blockIdx.x; s < num_segments; s += gridDim.x) {  // the same s for the whole block
    const int64_t first = begin[s], last = begin[s + 1];
    if (last - first <= k) {  // not selected: every entry kept
      for (int64_t j = first + threadIdx.x; j < last; j += kThreads) keep[j] = 1;
      continue;
    }
    Bits prefix = 0;
    int64_t want = k;
    for (int shift = kBits - kRadixBits; shift >= 0; shift -= kRadixBits) {
      for (int b = threadIdx.x; b < kRadixBins; b += kThreads) bins[b] = 0u;
      __syncthreads();
      const int high = shift + kRadixBits;
      for (int64_t j = first + threadIdx.x; j < last; j += kThreads) {
        const Bits u = ScoreOf(values[j], by_magnitude);
        if (high < kBits && (u >> high) != (prefix >> high)) continue;
        atomicAdd(&bins[static_cast<uint32_t>(u >> shift) & (kRadixBins - 1)], 1u);
      }
      __syncthreads();
      if (threadIdx.x < 32) {
        uint32_t mine[kBinsPerLane];
#pragma unroll
        for (int b = 0; b < kBinsPerLane; ++b) mine[b] = bins[lane * kBinsPerLane + b];
        int digit;
        int64_t left;
        if (ChooseDigit(mine, want, lane, &digit, &left)) {
          round_prefix = prefix | (static_cast<Bits>(digit) << shift);
          round_left = left;
        }
      }
      __syncthreads();
      prefix = round_prefix;
      want = round_left;
      __syncthreads();  // round_prefix and round_left are rewritten by the next round
    }
    // prefix is the threshold; keep the scores above it and the first `want` ties
    int64_t ties_before = 0;
    for (int64_t base = first; base < last; base += kThreads) {
      const int64_t j = base + threadIdx.x;
      Bits u = 0;
      if (j < last) u = ScoreOf(values[j], by_magnitude);
      const int is_tie = j < last && u == prefix ? 1 : 0;
      int rank, tile_ties;
      BlockScan(scan).ExclusiveSum(is_tie, rank, tile_ties);
      if (j < last) keep[j] = u > prefix || (is_tie && ties_before + rank < want) ? 1 : 0;
      ties_before += tile_ties;
      __syncthreads();  // scan's storage is reused by the next tile
    }
  }
}

// k-selection by rounds of launches over the whole touched set (SelectStartKernel, per round
// SelectHistogramKernel and SelectDigitKernel, then the ranks of the ties where some of them
// are kept and SelectKeepTilesKernel): for few or large segments, which one block each would
// leave most of the GPU idle on.
template <typename T>
GpuStatus SelectByRounds(Stream stream, Scratch* scratch, const T* values, bool by_magnitude,
                         const int64_t* touched_total, int64_t touched_bound, const int64_t* segment_begin,
                         int64_t num_segments, int64_t k, uint8_t* keep) {
  using Bits = typename ScoreBits<T>::type;
  Bits* prefix = scratch->DeviceArray<Bits>(num_segments);
  int64_t* remaining = scratch->DeviceArray<int64_t>(num_segments);
  int64_t* partial_ties = scratch->DeviceArray<int64_t>(num_segments);
  int64_t* tie_base = scratch->DeviceArray<int64_t>(num_segments);
  int64_t* ties_total = scratch->DeviceArray<int64_t>(2);  // ScanCounts' and the compaction's totals
  uint32_t* hist = scratch->DeviceArray<uint32_t>(2 * num_segments * kRadixBins);  // two rounds' buffers
  if (!prefix || !remaining || !partial_ties || !tie_base || !ties_total || !hist) {
    return GpuStatus::OutOfMemory("k-selection");
  }
  LaunchChained(SelectStartKernel<Bits>, BlocksFor(num_segments * kRadixBins), kThreads, 0, stream, segment_begin,
                num_segments, k, prefix, remaining, partial_ties, hist);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("k-selection");
  const int64_t tiles = (touched_bound + kThreads * kSelectItems - 1) / (kThreads * kSelectItems);
  int round = 0;
  for (int shift = 8 * static_cast<int>(sizeof(Bits)) - kRadixBits; shift >= 0; shift -= kRadixBits, ++round) {
    uint32_t* round_hist = hist + (round % 2) * num_segments * kRadixBins;
    uint32_t* next_hist = hist + ((round + 1) % 2) * num_segments * kRadixBins;
    LaunchChained(SelectHistogramKernel<T>, LoopBlocks(tiles), kThreads, 0, stream, values, by_magnitude, segment_begin,
                  num_segments, touched_total, touched_bound, prefix, remaining, shift, round_hist);
    LaunchChained(SelectDigitKernel<Bits>, BlocksFor(num_segments * 32), kThreads, 0, stream, round_hist, num_segments,
                  shift, prefix, remaining, next_hist, shift == 0 ? partial_ties : nullptr);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("k-selection");
  }
  TF_SPARSECONV_RETURN_IF_ERROR(ScanCounts(stream, scratch, partial_ties, tie_base, num_segments, ties_total));
  const int64_t num_tiles = (touched_bound + kTileSize - 1) / kTileSize;
  int64_t* tile_counts = scratch->DeviceArray<int64_t>(num_tiles);
  int64_t* tile_offsets = scratch->DeviceArray<int64_t>(num_tiles);
  if (!tile_counts || !tile_offsets) return GpuStatus::OutOfMemory("k-selection ties");
  const PartialTies<T> ties{values, by_magnitude, prefix, partial_ties};
  LaunchChained(CountPartialTiesKernel<T>, TileBlocks(num_tiles), kThreads, 0, stream, ties, segment_begin,
                num_segments, touched_total, touched_bound, num_tiles, tile_counts);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("k-selection ties");
  TF_SPARSECONV_RETURN_IF_ERROR(ScanCounts(stream, scratch, tile_counts, tile_offsets, num_tiles, ties_total + 1));
  LaunchChained(SelectKeepTilesKernel<T>, TileBlocks(num_tiles), kThreads, 0, stream, ties, segment_begin, num_segments,
                touched_total, touched_bound, remaining, tie_base, num_tiles, tile_offsets, keep);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("k-selection");
  return GpuStatus::Ok();
}

// SelectSegmentsKernel's block per segment where the segments are many (blocks enough to
// fill the GPU) and no larger than the grids of OctNet3 at 32^3 on average (the touched
// bound: a block's passes over its entries stay short); SelectByRounds elsewhere.
constexpr int64_t kBlockSelectMinSegments = 256;
constexpr int64_t kBlockSelectMaxAverage = 32768;
inline bool SelectsByBlocks(int64_t num_segments, int64_t touched_bound) {
  return num_segments >= kBlockSelectMinSegments && touched_bound <= num_segments * kBlockSelectMaxAverage;
}

// CopyEntries of the first `capacity` selected entries (a capped padded output: the others
// are counted, not written).
template <typename T>
struct CopyEntriesBelow {
  CopyEntries<T> copy;
  int64_t capacity;
  __device__ void operator()(int64_t q, int64_t rank) const {
    if (rank < capacity) copy(q, rank);
  }
};

template <typename T>
struct IsKept {
  const int64_t* touched_total;
  const uint8_t* keep;      // nullptr: all touched entries
  const T* relu_values;     // the fused ReLU: only entries > 0 (nullptr: any value)
  __device__ bool operator()(int64_t q) const {
    return q < *touched_total && (keep == nullptr || keep[q] != 0) &&
           (relu_values == nullptr || relu_values[q] > T(0));
  }
};

// The fused ReLU refuses NaN as SparseRelu does: the first NaN among the touched entries.
template <typename T>
__global__ void TouchedNaNKernel(const T* touched_values, const int64_t* touched_total, int64_t touched_bound,
                                 CheckSlot* slot) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(q, touched_bound) {
    if (q < *touched_total && isnan(touched_values[q])) RecordFirst(slot, q);
  }
}

// ---- backprop ----

// A fixed-order tree over the block's threads (blockDim.x == kThreads): the same sum for
// the same inputs on every run.
template <typename T>
__device__ T BlockSum(T value, T* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      shared[threadIdx.x] = AddRn(shared[threadIdx.x], shared[threadIdx.x + stride]);
    }
    __syncthreads();
  }
  const T total = shared[0];
  __syncthreads();  // the caller's next BlockSum rewrites shared
  return total;
}

// A fixed shuffle tree over a warp's lanes (offsets 16 to 1): the same sum for the same
// inputs on every run, in lane 0 (the whole warp calls it).
template <typename T>
__device__ T WarpSum(T value) {
  for (int offset = 16; offset > 0; offset /= 2) value = AddRn(value, __shfl_down_sync(0xffffffffu, value, offset));
  return value;
}

// Where an output key's entry is: a binary search in the sorted out_keys.
struct OutputLookup {
  const int64_t* out_keys;
  int64_t n_out;
  __device__ int64_t Find(int64_t key) const {
    const int64_t p = LowerBound(out_keys, n_out, key);
    return p < n_out && out_keys[p] == key ? p : -1;
  }
};

// The grid of output gradients marks "no output entry" with all-ones bits (a NaN that
// arithmetic does not produce); an output gradient with those bits is stored as the
// canonical NaN, which gives the same NaN sums.
__device__ inline bool IsNoOutput(float v) { return __float_as_uint(v) == 0xffffffffu; }
__device__ inline bool IsNoOutput(double v) { return __double_as_longlong(v) == -1LL; }
__device__ inline float GridValue(float v) { return IsNoOutput(v) ? __uint_as_float(0x7fffffffu) : v; }
__device__ inline double GridValue(double v) {
  return IsNoOutput(v) ? __longlong_as_double(0x7fffffffffffffffLL) : v;
}

// The output gradient of an output key, if the key has an output entry. With a grid (the
// gradient scattered to a dense array over the output keys, built once per call) that is one
// random read; without, a binary search, then the gradient's read.
template <typename T>
struct OutGradLookup {
  OutputLookup out;
  const T* out_grad;
  const T* grid;  // nullptr: search out_keys
  __device__ bool At(int64_t key, T* g) const {
    if (grid != nullptr) {
      const T v = grid[key];
      *g = v;
      return !IsNoOutput(v);
    }
    const int64_t p = out.Find(key);
    if (p < 0) return false;
    *g = out_grad[p];
    return true;
  }
};

template <typename T>
__global__ void OutGradGridKernel(const int64_t* out_keys, const T* out_grad, int64_t n_out, int64_t num_keys,
                                  const Report* report, T* grid) {
  ChainedKernelBegin();
  if (!ChecksPassed(report)) return;
  TF_SPARSECONV_GRID_LOOP(p, n_out) {
    const int64_t key = out_keys[p];
    if (key >= 0 && key < num_keys) grid[key] = GridValue(out_grad[p]);  // padding keys lie beyond
  }
}

// The output key that entry i feeds through w, or -1 (outside the grid). The key may still
// have no output entry (dropped by k-selection): OutGradLookup::At says.
__device__ inline int64_t LinkedKey(const KeyLayout& L, const EntryData& e, int64_t i, const GpuPresentWeight& w) {
  if (!Reaches(e.coords + i * L.d, w, L.d)) return -1;
  return e.out_base[i] + w.oc * L.spatial_size - w.lin_delta;
}

// Loads in flight per thread in the gradient kernels: each output lookup is one or more
// dependent random reads, so a thread issues kGradUnroll of them before it adds any, in the
// same order as one at a time.
constexpr int kGradUnroll = 4;

// What the gradient kernels read of a present weight where the weights pack, in one 16-byte
// load: the output key's offset from the entry's out_base (oc * S - lin_delta), the kernel
// offset's spatial delta per dimension as signed bytes, and the filter value itself. Unpacked,
// they read the same from the 48-byte GpuPresentWeight and the filter, some fifteen loads per
// (entry, weight).
template <typename T>
struct __align__(16) GradWeight {
  int32_t out_delta;
  uint32_t deltas;
  T value;
};

template <typename T>
__global__ void GradWeightsKernel(KeyLayout L, const GpuPresentWeight* weights, int64_t count, const T* filter,
                                  GradWeight<T>* packed) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(p, count) {
    const GpuPresentWeight& w = weights[p];
    uint32_t deltas = 0;
    for (int j = 0; j < L.d; ++j) {
      const int32_t delta = SpatialDelta(w, j, L.extent[j]);
      deltas |= static_cast<uint32_t>(static_cast<uint8_t>(static_cast<int8_t>(delta))) << (8 * j);
    }
    packed[p] = GradWeight<T>{static_cast<int32_t>(w.oc * L.spatial_size - w.lin_delta), deltas,
                              filter[w.filter_index]};
  }
}

// Entry i's coordinates, in registers (constant indices).
__device__ inline void EntryCoords(const KeyLayout& L, const EntryData& e, int64_t i, int32_t (&x)[kMaxSpatialDims]) {
#pragma unroll
  for (int j = 0; j < kMaxSpatialDims; ++j) x[j] = j < L.d ? e.coords[i * L.d + j] : 0;
}

// Whether the output site x - delta of a packed weight's offset lies in the grid.
__device__ inline bool PackedReaches(const KeyLayout& L, const int32_t (&x)[kMaxSpatialDims], uint32_t deltas) {
  bool reaches = true;
#pragma unroll
  for (int j = 0; j < kMaxSpatialDims; ++j) {
    if (j < L.d) {
      const int32_t y = x[j] - static_cast<int8_t>(deltas >> (8 * j));
      reaches = reaches && y >= 0 && y < static_cast<int32_t>(L.extent[j]);
    }
  }
  return reaches;
}

// The input gradient's two sources of present weights. For item r of entry i's row, Link says
// whether the weight links i to an output entry and, where it does, gives the filter value
// and that output's gradient;
// Prepare what it reads of entry i once per entry.
template <typename T>
struct UnpackedWeights {  // where the weights do not pack: the table and the filter
  const GpuPresentWeight* items;
  const T* filter;
  struct Entry {};
  __device__ Entry Prepare(const KeyLayout&, const EntryData&, int64_t) const { return {}; }
  __device__ bool Link(const KeyLayout& L, const EntryData& e, int64_t i, const Entry&, int64_t r,
                       const OutGradLookup<T>& out, T* value, T* grad) const {
    const GpuPresentWeight& w = items[r];
    const int64_t key = LinkedKey(L, e, i, w);
    if (key < 0 || !out.At(key, grad)) return false;
    *value = filter[w.filter_index];
    return true;
  }
};

template <typename T>
struct PackedWeights {  // GradWeight: one load per weight; the entry's coordinates and out_base read once
  const GradWeight<T>* items;
  struct Entry {
    int32_t x[kMaxSpatialDims];
    int64_t out_base;
  };
  __device__ Entry Prepare(const KeyLayout& L, const EntryData& e, int64_t i) const {
    Entry entry;
    EntryCoords(L, e, i, entry.x);
    entry.out_base = e.out_base[i];
    return entry;
  }
  __device__ bool Link(const KeyLayout& L, const EntryData&, int64_t, const Entry& entry, int64_t r,
                       const OutGradLookup<T>& out, T* value, T* grad) const {
    const GradWeight<T> w = items[r];
    *value = w.value;
    return PackedReaches(L, entry.x, w.deltas) && out.At(entry.out_base + w.out_delta, grad);
  }
};

// dL/dx of each entry: the sum over its row's weights of out_grad[linked output] * w in the
// order of kInGradGroup (direct_conv_choices.h), as the CPU's search path sums (so the same
// bits), a group's lookups in flight at once.
template <typename T, typename Weights>
__global__ void InGradKernel(KeyLayout L, EntryData e, Weights weights, const int64_t* row_begin,
                             OutGradLookup<T> out, int64_t n, const Report* report, T* in_grad) {
  ChainedKernelBegin();
  const bool valid = ChecksPassed(report);
  TF_SPARSECONV_GRID_LOOP(i, n) {
    T sum = T(0);
    if (valid && e.ic[i] >= 0) {  // padding: 0
      const int32_t ic = e.ic[i];
      const typename Weights::Entry entry = weights.Prepare(L, e, i);
      const int64_t end = row_begin[ic + 1];
      for (int64_t r0 = row_begin[ic]; r0 < end; r0 += kInGradGroup) {
        T term[kInGradGroup];
        bool linked[kInGradGroup];
#pragma unroll
        for (int u = 0; u < kInGradGroup; ++u) {
          linked[u] = false;
          term[u] = T(0);
          if (r0 + u < end) {
            T value, grad;
            if (weights.Link(L, e, i, entry, r0 + u, out, &value, &grad)) {
              linked[u] = true;
              term[u] = MulRn(grad, value);
            }
          }
        }
        T group_sum = T(0);
#pragma unroll
        for (int u = 0; u < kInGradGroup; ++u) {
          if (linked[u]) group_sum = AddRn(group_sum, term[u]);
        }
        sum = AddRn(sum, group_sum);
      }
    }
    in_grad[i] = sum;
  }
}

// dL/dx from the groups' sums that FilterGradGroupKernel<T, true> wrote (in_partial[g * n + i]
// for the g-th group of entry i's row): added in the row's order, InGradKernel's sums.
template <typename T>
__global__ void InGradFromGroupsKernel(EntryData e, const int64_t* row_begin, const T* in_partial, int64_t n,
                                       const Report* report, T* in_grad) {
  ChainedKernelBegin();
  const bool valid = ChecksPassed(report);
  TF_SPARSECONV_GRID_LOOP(i, n) {
    T sum = T(0);
    if (valid && e.ic[i] >= 0) {  // padding: 0
      const int32_t ic = e.ic[i];
      const int64_t groups = (row_begin[ic + 1] - row_begin[ic] + kInGradGroup - 1) / kInGradGroup;
      for (int64_t g = 0; g < groups; ++g) sum = AddRn(sum, in_partial[g * n + i]);
    }
    in_grad[i] = sum;
  }
}

__global__ void KeyBoundsKernel(const int64_t* keys, int64_t n, int64_t num_segments,
                                int64_t spatial_size, const Report* report, int64_t* begin) {
  ChainedKernelBegin();
  const bool valid = ChecksPassed(report);
  TF_SPARSECONV_GRID_LOOP(s, num_segments + 1) {
    begin[s] = valid ? LowerBound(keys, n, s * spatial_size) : 0;
  }
}

// Warp task t = (w, b, c) sums g * v over part c of input segment (b, ic(w)): each lane its
// entries lo + lane, lo + lane + 32, ... in order, then a fixed shuffle tree over the lanes,
// so the same inputs give the same sum on every run. (A block per task, with a 256-thread
// tree for the ~2 entries per thread of a training batch's segment, took 10 of a 28 ms
// OctNet3 step's GPU time on an H200, 2026-11-29.)
template <typename T>
__global__ void __launch_bounds__(kThreads)
    FilterGradPartialKernel(KeyLayout L, EntryData e, const T* values,
                            const GpuPresentWeight* weights, int64_t num_weights,
                            const int64_t* in_begin, OutGradLookup<T> out,
                            int64_t parts, const Report* report, T* partial) {
  ChainedKernelBegin();
  const bool valid = ChecksPassed(report);
  const int lane = threadIdx.x % 32;
  const int64_t num_tasks = num_weights * L.batch * parts;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  for (int64_t task = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32; task < num_tasks;
       task += warps) {
    const int64_t w = task / (L.batch * parts);
    const int64_t b = (task / parts) % L.batch;
    const int64_t c = task % parts;
    T sum = T(0);
    if (valid) {
      const GpuPresentWeight& pw = weights[w];
      const int64_t seg = b * L.channels + pw.ic;
      const int64_t len = in_begin[seg + 1] - in_begin[seg];
      const int64_t lo = in_begin[seg] + len * c / parts;
      const int64_t hi = in_begin[seg] + len * (c + 1) / parts;
      for (int64_t i0 = lo + lane; i0 < hi; i0 += 32 * kGradUnroll) {
        T term[kGradUnroll];
        bool linked[kGradUnroll];
#pragma unroll
        for (int u = 0; u < kGradUnroll; ++u) {
          const int64_t i = i0 + 32 * u;
          linked[u] = false;
          term[u] = T(0);
          if (i < hi) {
            const int64_t key = LinkedKey(L, e, i, pw);
            T grad;
            if (key >= 0 && out.At(key, &grad)) {
              linked[u] = true;
              term[u] = MulRn(grad, values[i]);
            }
          }
        }
#pragma unroll
        for (int u = 0; u < kGradUnroll; ++u) {
          if (linked[u]) sum = AddRn(sum, term[u]);
        }
      }
    }
    sum = WarpSum(sum);
    if (lane == 0) partial[task] = sum;
  }
}

// FilterGradPartialKernel for kGradGroup consecutive weights of one input channel's row at
// once: a warp task t = (group, b, c) reads each entry of part c of segment (b, ic) once for
// the group's weights (FilterGradPartialKernel reads it again for every weight), the
// weights' packed offsets held in registers. Each weight's lane sums and shuffle tree are
// FilterGradPartialKernel's, in the same order, and land in the same partial slots: the same bits.
// kWithInput: each entry's sum of grad * w over the group (in order) goes to
// in_partial[(group's place in the row) * n + i] too, so that the input gradient needs no
// lookups of its own (InGradFromGroupsKernel adds them; a group is kInGradGroup weights).
constexpr int kGradGroup = kInGradGroup;

template <typename T, bool kWithInput>
__global__ void __launch_bounds__(kThreads)
    FilterGradGroupKernel(KeyLayout L, EntryData e, const T* values, const GradWeight<T>* weights,
                          const int64_t* row_begin, int64_t groups_per_row, const int64_t* in_begin,
                          OutGradLookup<T> out, int64_t parts, const Report* report, T* partial, int64_t n,
                          T* in_partial) {
  ChainedKernelBegin();
  const bool valid = ChecksPassed(report);
  const int lane = threadIdx.x % 32;
  const int64_t per_weight = L.batch * parts;
  const int64_t num_tasks = L.channels * groups_per_row * per_weight;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  for (int64_t task = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32; task < num_tasks;
       task += warps) {
    const int64_t group = task / per_weight;
    const int64_t b = (task / parts) % L.batch;
    const int64_t c = task % parts;
    const int64_t ic = group / groups_per_row;
    const int64_t w0 = row_begin[ic] + (group - ic * groups_per_row) * kGradGroup;
    const int64_t row_end = row_begin[ic + 1];
    if (w0 >= row_end) continue;  // a shorter row than the longest: the same for the whole warp
    const int nw = static_cast<int>(row_end - w0 < kGradGroup ? row_end - w0 : kGradGroup);
    int32_t out_delta[kGradGroup];
    uint32_t deltas[kGradGroup];
    T w_value[kGradGroup];
#pragma unroll
    for (int u = 0; u < kGradGroup; ++u) {
      const GradWeight<T> w = weights[w0 + (u < nw ? u : 0)];
      out_delta[u] = w.out_delta;
      deltas[u] = w.deltas;
      w_value[u] = w.value;
    }
    T* group_in = kWithInput ? in_partial + (group - ic * groups_per_row) * n : nullptr;
    T sum[kGradGroup];
#pragma unroll
    for (int u = 0; u < kGradGroup; ++u) sum[u] = T(0);
    if (valid) {
      const int64_t seg = b * L.channels + ic;
      const int64_t len = in_begin[seg + 1] - in_begin[seg];
      const int64_t lo = in_begin[seg] + len * c / parts;
      const int64_t hi = in_begin[seg] + len * (c + 1) / parts;
      for (int64_t i = lo + lane; i < hi; i += 32) {
        int32_t x[kMaxSpatialDims];
        EntryCoords(L, e, i, x);
        const int64_t out_base = e.out_base[i];
        const T value = values[i];
        T grad[kGradGroup];
        bool linked[kGradGroup];
#pragma unroll
        for (int u = 0; u < kGradGroup; ++u) {
          linked[u] = u < nw && PackedReaches(L, x, deltas[u]) && out.At(out_base + out_delta[u], &grad[u]);
        }
        T in_sum = T(0);
#pragma unroll
        for (int u = 0; u < kGradGroup; ++u) {
          if (!linked[u]) continue;
          sum[u] = AddRn(sum[u], MulRn(grad[u], value));
          if (kWithInput) in_sum = AddRn(in_sum, MulRn(grad[u], w_value[u]));  // InGradKernel's group sum
        }
        if (kWithInput) group_in[i] = in_sum;
      }
    }
#pragma unroll
    for (int u = 0; u < kGradGroup; ++u) {
      sum[u] = WarpSum(sum[u]);
      if (lane == 0 && u < nw) partial[(w0 + u) * per_weight + b * parts + c] = sum[u];
    }
  }
}

// A warp per weight adds its B * parts partial sums: lane l those at l, l + 32, ... in order,
// then a fixed shuffle tree, so the same inputs give the same sum on every run. (A thread per
// weight, adding them one after another from reads parts_per_weight apart, took 0.97 ms of
// OctNet3's 32^3 training step on an H200, 2026-12-01.)
template <typename T>
__global__ void __launch_bounds__(kThreads)
    FilterGradKernel(const GpuPresentWeight* weights, int64_t num_weights, const T* partial,
                     int64_t parts_per_weight, T* filter_grad) {
  ChainedKernelBegin();
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32; w < num_weights;
       w += warps) {  // the same w for the whole warp
    T sum = T(0);
    for (int64_t j = lane; j < parts_per_weight; j += 32) sum = AddRn(sum, partial[w * parts_per_weight + j]);
    sum = WarpSum(sum);
    if (lane == 0) filter_grad[weights[w].filter_index] = sum;
  }
}

// Block (s, c) sums out_grad over part c of output segment s.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    BiasGradPartialKernel(const int64_t* out_begin, int64_t num_segments, const T* out_grad,
                          int64_t parts, const Report* report, T* partial) {
  ChainedKernelBegin();
  __shared__ T shared[kThreads];
  const bool valid = ChecksPassed(report);
  for (int64_t blk = blockIdx.x; blk < num_segments * parts; blk += gridDim.x) {
    const int64_t s = blk / parts;
    const int64_t c = blk % parts;
    T sum = T(0);
    if (valid) {
      const int64_t len = out_begin[s + 1] - out_begin[s];
      const int64_t lo = out_begin[s] + len * c / parts;
      const int64_t hi = out_begin[s] + len * (c + 1) / parts;
      for (int64_t p = lo + threadIdx.x; p < hi; p += kThreads) sum = AddRn(sum, out_grad[p]);
    }
    const T total = BlockSum(sum, shared);
    if (threadIdx.x == 0) partial[blk] = total;
  }
}

template <typename T>
__global__ void BiasGradKernel(const T* partial, int64_t batch, int64_t cout, int64_t parts,
                               T* bias_grad) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(oc, cout) {
    T sum = T(0);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t c = 0; c < parts; ++c) sum = AddRn(sum, partial[(b * cout + oc) * parts + c]);
    }
    bias_grad[oc] = sum;
  }
}

// The most bytes of groups' sums (entries times groups of the longest row) that the filter
// gradient's pass writes for the input gradient: 512 MiB, 128 Mi values in float, enough for
// every layer of OctNet3 at 64^3 in batches of 32 (the largest, 2.35 M entries of 16 channels
// at 32^3: 127 M sums); beyond, InGradKernel looks the links up again (the same sums).
constexpr int64_t kMaxInGradGroupBytes = int64_t{512} << 20;

// The groups of kGradGroup weights in the longest row: FilterGradGroupKernel's groups per
// input channel, and the groups' sums per entry that it writes for the input gradient.
inline int64_t GroupsPerRow(int64_t max_row) { return (max_row + kGradGroup - 1) / kGradGroup; }

// Parts per segment so that a block of kThreads sums about 8 items per thread.
inline int64_t PartsFor(int64_t items, int64_t segments) {
  const int64_t per_segment = segments > 0 ? items / segments : 0;
  const int64_t parts = (per_segment + kTileSize - 1) / kTileSize;
  return parts < 1 ? 1 : (parts > 256 ? 256 : parts);
}

// --- the dense-grid forward (DirectConvDataflow::kDense) ----------------------------------------

// dense_in[key] = values[i], bit `key` of in_bits and bit (b, lin) of site_bits for every
// entry; dense_in is not cleared, it is read only where the bitmap says an entry is.
template <typename T>
__global__ void ScatterDenseKernel(KeyLayout L, const int64_t* keys, const T* values, int64_t n,
                                   const Report* report, T* dense_in, uint32_t* in_bits, uint32_t* site_bits,
                                   ForwardNaN<T> nan) {
  ChainedKernelBegin();
  nan.Run();
  if (!ChecksPassed(report)) return;  // unsorted or out-of-range keys: nothing is computed
  const int64_t num_keys = L.num_keys(), per_batch = L.channels * L.spatial_size;
  TF_SPARSECONV_GRID_LOOP(i, n) {
    const int64_t key = keys[i];
    if (key < 0 || key >= num_keys) continue;
    dense_in[key] = values[i];
    atomicOr(in_bits + (key >> 5), 1u << (key & 31));
    const int64_t site = key / per_batch * L.spatial_size + key % L.spatial_size;
    atomicOr(site_bits + (site >> 5), 1u << (site & 31));
  }
}

// Whether the input site x = y + delta (SpatialDelta) of output site y and present weight w
// lies in the grid.
// (Unrolled over kMaxSpatialDims with constant indices, so that y stays in registers: a
// loop to L.d put the caller's coordinates on the stack.)
__device__ inline bool InputInGrid(const int32_t* y, const GpuPresentWeight& w, const KeyLayout& L) {
  bool inside = true;
#pragma unroll
  for (int j = 0; j < kMaxSpatialDims; ++j) {
    if (j < L.d) {
      const int32_t x = y[j] + SpatialDelta(w, j, L.extent[j]);
      inside = inside && x >= 0 && x < L.extent[j];
    }
  }
  return inside;
}

// mask[b * S + lin(y)]: bit (offset % 32) set for each present kernel offset whose input
// site y + delta lies in the grid and holds an entry of any channel. Exact for up to 32
// offsets; beyond, offsets share bits and a set bit only means "maybe" (never a miss).
__global__ void NeighbourMaskKernel(KeyLayout L, const GpuPresentWeight* weights, const int64_t* offset_rep,
                                    int64_t num_offsets, const uint32_t* site_bits, const Report* report,
                                    uint32_t* mask) {
  ChainedKernelBegin();
  if (!ChecksPassed(report)) return;
  TF_SPARSECONV_GRID_LOOP(site, L.batch * L.spatial_size) {
    const int64_t b = site / L.spatial_size, lin = site - b * L.spatial_size;
    int32_t y[kMaxSpatialDims];
    DecodeSpatial(lin, L, y);
    uint32_t bits = 0;
    for (int64_t r = 0; r < num_offsets; ++r) {
      const GpuPresentWeight& w = weights[offset_rep[r]];
      const int64_t neighbour = site + w.lin_delta;
      if (InputInGrid(y, w, L) && ((site_bits[neighbour >> 5] >> (neighbour & 31)) & 1u)) bits |= 1u << w.offset_bit;
    }
    mask[site] = bits;
  }
}

// One thread per output key o = (b * Cout + oc) * S + lin(y) of the dense grid: the sum over
// ic ascending, then the (ic, oc) weights in kernel-offset order (x = y + delta ascending),
// of value(x, ic) * w -- the order of the sorted contributions and of the CPU -- and the
// bias, where at least one input is present. The site's neighbour mask skips sites with no
// input in reach and weights whose offset reaches none, without changing that order. Each
// warp's 32 consecutive outputs form one word of the touched bitmap, written by one lane:
// no atomics.
template <typename T>
__global__ void DenseAccumulateKernel(KeyLayout L, int64_t cout, const T* dense_in, const uint32_t* in_bits,
                                      const uint32_t* neighbour_mask, const T* filter,
                                      const GpuPresentWeight* weights, const int64_t* pair_begin, const T* bias,
                                      const Report* report, T* out_values, uint32_t* out_bits) {
  ChainedKernelBegin();
  if (!ChecksPassed(report)) return;
  const int64_t total = L.batch * cout * L.spatial_size;
  const int64_t words = (total + 31) / 32;
  const int64_t warp_stride = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t word = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; word < words;
       word += warp_stride) {
    const int64_t o = word * 32 + lane;
    bool touched = false;
    const int64_t seg = o / L.spatial_size, lin = o - seg * L.spatial_size;
    const int64_t b = seg / cout, oc = seg - b * cout;
    const uint32_t mask = o < total ? neighbour_mask[b * L.spatial_size + lin] : 0u;
    if (mask != 0u) {
      int32_t y[kMaxSpatialDims];
      DecodeSpatial(lin, L, y);
      T sum = T(0);
      for (int64_t ic = 0; ic < L.channels; ++ic) {
        const int64_t base = (b * L.channels + ic) * L.spatial_size + lin;
        const int64_t end = pair_begin[ic * cout + oc + 1];
        for (int64_t p = pair_begin[ic * cout + oc]; p < end; ++p) {
          const GpuPresentWeight& w = weights[p];
          if (!((mask >> w.offset_bit) & 1u) || !InputInGrid(y, w, L)) continue;
          const int64_t key = base + w.lin_delta;
          if ((in_bits[key >> 5] >> (key & 31)) & 1u) {
            sum = AddRn(sum, MulRn(dense_in[key], filter[w.filter_index]));
            touched = true;
          }
        }
      }
      if (touched) out_values[o] = AddRn(sum, bias[oc]);
    }
    const unsigned int bits = __ballot_sync(0xffffffffu, touched);
    if (lane == 0) out_bits[word] = bits;
  }
}

// Where R^d is a multiple of 32: one thread per site (b, y) and kDenseChunk output
// channels oc0 .. oc0 + kDenseChunk - 1, so each present input value(x, ic) is read once
// for all of them. Per output the sums run over ic ascending, then kernel offsets ascending
// -- the CPU's order, as in DenseAccumulateKernel. A warp's 32 lanes are 32 consecutive
// sites of one (b, chunk), so per output channel they form one word of the touched bitmap.
constexpr int kDenseChunk = 8;

// A dense-site thread's outputs at site lin of example b, channels oc0 .. oc0 + n_oc - 1: each
// touched sum plus its bias, and each channel's touched bits, one word per 32 consecutive sites
// (a warp's; n_oc is the same for all its lanes: one chunk).
template <typename T>
__device__ inline void WriteChunkSums(int64_t b, int64_t cout, int64_t oc0, int n_oc, int64_t S, int64_t lin,
                                      const T (&sum)[kDenseChunk], uint32_t touched, const T* bias, int lane,
                                      T* out_values, uint32_t* out_bits) {
#pragma unroll
  for (int j = 0; j < kDenseChunk; ++j) {
    if (j >= n_oc) break;
    const int64_t o = (b * cout + oc0 + j) * S + lin;
    const bool is_touched = (touched >> j) & 1u;
    if (is_touched) out_values[o] = AddRn(sum[j], bias[oc0 + j]);
    const unsigned int bits = __ballot_sync(0xffffffffu, is_touched);
    if (lane == 0) out_bits[o >> 5] = bits;
  }
}

template <typename T>
__global__ void DenseSiteAccumulateKernel(KeyLayout L, int64_t cout, const T* dense_in, const uint32_t* in_bits,
                                          const uint32_t* neighbour_mask, const T* filter, const uint8_t* present,
                                          const GpuPresentWeight* weights, const int64_t* offset_rep,
                                          int64_t num_offsets, const T* bias, const Report* report,
                                          T* out_values, uint32_t* out_bits) {
  ChainedKernelBegin();
  if (!ChecksPassed(report)) return;
  const int64_t S = L.spatial_size, cin = L.channels;
  const int64_t chunks = (cout + kDenseChunk - 1) / kDenseChunk;
  const int lane = threadIdx.x % 32;
  // S % 32 == 0 and the stride is a multiple of 32: every warp iteration is whole.
  TF_SPARSECONV_GRID_LOOP(t, L.batch * chunks * S) {
    const int64_t lin = t % S, rest = t / S;
    const int64_t chunk = rest % chunks, b = rest / chunks;
    const int64_t oc0 = chunk * kDenseChunk;
    const int n_oc = static_cast<int>(cout - oc0 < kDenseChunk ? cout - oc0 : kDenseChunk);
    const uint32_t mask = neighbour_mask[b * S + lin];
    T sum[kDenseChunk];
#pragma unroll
    for (int j = 0; j < kDenseChunk; ++j) sum[j] = T(0);
    uint32_t touched = 0;
    if (mask != 0u) {
      int32_t y[kMaxSpatialDims];
      DecodeSpatial(lin, L, y);
      for (int64_t ic = 0; ic < cin; ++ic) {
        const int64_t base = (b * cin + ic) * S + lin;
        for (int64_t r = 0; r < num_offsets; ++r) {
          const GpuPresentWeight& w = weights[offset_rep[r]];
          if (!((mask >> w.offset_bit) & 1u) || !InputInGrid(y, w, L)) continue;
          const int64_t key = base + w.lin_delta;
          if (!((in_bits[key >> 5] >> (key & 31)) & 1u)) continue;
          const T value = dense_in[key];
          // the filter row of (this offset, ic): [K..., Cin, Cout] from w's own index
          const int64_t row = w.filter_index - (static_cast<int64_t>(w.ic) * cout + w.oc) + ic * cout + oc0;
#pragma unroll
          for (int j = 0; j < kDenseChunk; ++j) {
            if (j < n_oc && present[row + j]) {
              sum[j] = AddRn(sum[j], MulRn(value, filter[row + j]));
              touched |= 1u << j;
            }
          }
        }
      }
    }
    WriteChunkSums(b, cout, oc0, n_oc, S, lin, sum, touched, bias, lane, out_values, out_bits);
  }
}

// DenseSiteAccumulateKernel with its weights in shared memory, where every present kernel
// offset has a bit of the neighbour mask to itself (so a set bit also says the input site is
// in the grid) and the chunk's weights fit: the block takes one chunk (blockIdx.y) and first
// copies, per (ic, present offset r), the chunk's 8 filter values (0 where absent) and a byte
// of which are present, and per offset its spatial delta and mask bit. Each (ic, r) step is
// then two global loads (the input's bit and value) and three shared ones, where the kernel
// above issues some thirty, most of them the same address in every lane. The same sums in the
// same order: the CPU's values.
struct DenseOffset {
  int32_t lin_delta;
  int32_t bit;
};

// A chunk's 8 filter values from shared memory in 16-byte loads (chunk_filter is 16-byte
// aligned and each (ic, r) row is 8 values long).
__device__ inline void LoadChunk(const float* src, float (&w)[kDenseChunk]) {
  const float4 a = reinterpret_cast<const float4*>(src)[0], b = reinterpret_cast<const float4*>(src)[1];
  w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}
__device__ inline void LoadChunk(const double* src, double (&w)[kDenseChunk]) {
#pragma unroll
  for (int h = 0; h < kDenseChunk / 2; ++h) {
    const double2 v = reinterpret_cast<const double2*>(src)[h];
    w[2 * h] = v.x, w[2 * h + 1] = v.y;
  }
}
static_assert(kDenseChunk == 8, "LoadChunk reads 8 values");

template <typename T>
inline size_t DenseSharedBytes(int64_t cin, int64_t num_offsets) {
  return static_cast<size_t>(cin * num_offsets) * (kDenseChunk * sizeof(T) + 1) +
         static_cast<size_t>(num_offsets) * sizeof(DenseOffset);
}

// Whether DenseSiteSharedKernel may run: each present offset with a mask bit of its own (at
// most 32 offsets, all bits distinct), 32-bit spatial deltas, and the chunk's weights within
// the 48 KiB of shared memory a launch gets without asking.
template <typename T>
bool DenseWeightsShared(const DirectConvGpuArgs<T>& a) {
  const GpuWeightTable& t = a.weights;
  if (t.num_offsets < 1 || t.num_offsets > 32 || a.in_layout.spatial_size > INT32_MAX) return false;
  if (DenseSharedBytes<T>(a.in_layout.channels, t.num_offsets) > 48 * 1024) return false;
  uint32_t bits = 0;
  for (int64_t r = 0; r < t.num_offsets; ++r) {
    const uint32_t bit = 1u << t.items[t.offset_rep[r]].offset_bit;
    if (bits & bit) return false;
    bits |= bit;
  }
  return true;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    DenseSiteSharedKernel(KeyLayout L, int64_t cout, const T* dense_in, const uint32_t* in_bits,
                          const uint32_t* neighbour_mask, const T* filter, const uint8_t* present,
                          const GpuPresentWeight* weights, const int64_t* offset_rep, int num_offsets, const T* bias,
                          const Report* report, T* out_values, uint32_t* out_bits) {
  ChainedKernelBegin();
  if (!ChecksPassed(report)) return;
  extern __shared__ __align__(16) unsigned char shared[];
  const int cin = static_cast<int>(L.channels), R = num_offsets;
  T* chunk_filter = reinterpret_cast<T*>(shared);                                      // [cin][R][kDenseChunk]
  DenseOffset* offsets = reinterpret_cast<DenseOffset*>(chunk_filter + cin * R * kDenseChunk);  // [R]
  uint8_t* chunk_present = reinterpret_cast<uint8_t*>(offsets + R);                    // [cin][R]
  const int64_t oc0 = static_cast<int64_t>(blockIdx.y) * kDenseChunk;
  const int n_oc = static_cast<int>(cout - oc0 < kDenseChunk ? cout - oc0 : kDenseChunk);
  for (int q = threadIdx.x; q < cin * R; q += kThreads) {
    const int ic = q / R, r = q - ic * R;
    const GpuPresentWeight& w = weights[offset_rep[r]];
    // the filter row of (this offset, ic): [K..., Cin, Cout] from w's own index
    const int64_t row = w.filter_index - (static_cast<int64_t>(w.ic) * cout + w.oc) + ic * cout + oc0;
    uint32_t bits = 0;
#pragma unroll
    for (int j = 0; j < kDenseChunk; ++j) {
      const bool here = j < n_oc && present[row + j];
      chunk_filter[q * kDenseChunk + j] = here ? filter[row + j] : T(0);
      bits |= here ? 1u << j : 0u;
    }
    chunk_present[q] = static_cast<uint8_t>(bits);
    if (ic == 0) offsets[r] = DenseOffset{static_cast<int32_t>(w.lin_delta), w.offset_bit};
  }
  __syncthreads();
  const int64_t S = L.spatial_size, sites = L.batch * S;
  const int lane = threadIdx.x % 32;
  // S % 32 == 0 and the stride is a multiple of 32: every warp iteration is whole.
  for (int64_t site = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; site < sites;
       site += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t b = site / S, lin = site - b * S;
    const uint32_t mask = neighbour_mask[site];
    T sum[kDenseChunk];
#pragma unroll
    for (int j = 0; j < kDenseChunk; ++j) sum[j] = T(0);
    uint32_t touched = 0;
    if (mask != 0u) {
      for (int ic = 0; ic < cin; ++ic) {
        const int64_t base = (b * cin + ic) * S + lin;
        for (int r = 0; r < R; ++r) {
          const DenseOffset off = offsets[r];
          if (!((mask >> off.bit) & 1u)) continue;  // no entry at y + delta, or outside the grid
          const int64_t key = base + off.lin_delta;
          if (!((in_bits[key >> 5] >> (key & 31)) & 1u)) continue;
          const T value = dense_in[key];
          const int q = ic * R + r;
          const uint32_t here = chunk_present[q];
          T w[kDenseChunk];
          LoadChunk(chunk_filter + q * kDenseChunk, w);
#pragma unroll
          for (int j = 0; j < kDenseChunk; ++j) {
            if ((here >> j) & 1u) sum[j] = AddRn(sum[j], MulRn(value, w[j]));
          }
          touched |= here;
        }
      }
    }
    WriteChunkSums(b, cout, oc0, n_oc, S, lin, sum, touched, bias, lane, out_values, out_bits);
  }
}

// ---- the bitmaps (ForwardPath::kBitmap, direct_conv_gpu.h) ----

// in_bits: a bit per input key; word_first[w]: the first entry whose key lies in word w,
// written for the words that hold an entry, the only ones read; EntryDataKernel's data; and
// both per-segment counts zeroed.
template <typename T>
__global__ void MarkInputsKernel(KeyLayout L, int64_t cout, const int64_t* keys, int64_t n, const Report* report,
                                 uint32_t* in_bits, int32_t* word_first, EntryData e, int64_t num_segments,
                                 int64_t* touched_counts, int64_t* positive_counts, ForwardNaN<T> nan) {
  ChainedKernelBegin();
  nan.Run();
  TF_SPARSECONV_GRID_LOOP(s, num_segments) {  // zeroed for WriteBitTilesKernel and BitmapSumsKernel
    touched_counts[s] = 0;
    positive_counts[s] = 0;
  }
  if (!ChecksPassed(report)) return;
  TF_SPARSECONV_GRID_LOOP(i, n) {
    const int64_t key = keys[i];
    if (!StoreEntryData(L, cout, key, i, e)) continue;
    atomicOr(in_bits + (key >> 5), 1u << (key & 31));
    if (i == 0 || (keys[i - 1] >> 5) != (key >> 5)) word_first[key >> 5] = static_cast<int32_t>(i);
  }
}

// A present weight in 16-byte loads: read field by field, the kernels issued a load per field
// used (about ten), each a separate L1 request.
__device__ inline GpuPresentWeight LoadWeight(const GpuPresentWeight* p) {
  static_assert(sizeof(GpuPresentWeight) % 16 == 0 && alignof(GpuPresentWeight) == 16, "whole 16-byte loads");
  GpuPresentWeight w;
  const int4* src = reinterpret_cast<const int4*>(p);
  int4* dst = reinterpret_cast<int4*>(&w);
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(GpuPresentWeight) / 16); ++k) dst[k] = __ldg(src + k);
  return w;
}

// Contribution slot `slot` = (entry i, r-th present weight of its input channel): false where
// the entry is padding, the row has fewer weights or the output lies outside the grid; else
// *i, *w and the output key *o. Index: the slot arithmetic's integer type, as ContributionsKernel's.
template <typename Index>
__device__ inline bool SlotOutput(const KeyLayout& L, const EntryData& e, const GpuPresentWeight* weights,
                                  const int64_t* row_begin, Index row_length, int64_t slot, Index* i,
                                  GpuPresentWeight* w, int64_t* o) {
  *i = static_cast<Index>(slot) / row_length;
  if (e.ic[*i] < 0) return false;
  const int64_t r = static_cast<Index>(slot) - *i * row_length;
  const int64_t row = row_begin[e.ic[*i]];
  if (r >= row_begin[e.ic[*i] + 1] - row) return false;
  *w = LoadWeight(&weights[row + r]);
  if (!Reaches(e.coords + static_cast<int64_t>(*i) * L.d, *w, L.d)) return false;
  *o = e.out_base[*i] + w->oc * L.spatial_size - w->lin_delta;
  return true;
}

// out_bits: the bit of every output key that an (entry, present weight) reaches; one
// thread per contribution slot, as ContributionsKernel.
template <typename Index>
__global__ void MarkOutputsKernel(KeyLayout L, EntryData e, const GpuPresentWeight* weights,
                                  const int64_t* row_begin, int64_t max_row, int64_t num_slots,
                                  const Report* report, uint32_t* out_bits) {
  ChainedKernelBegin();
  if (!ChecksPassed(report)) return;
  const Index row_length = static_cast<Index>(max_row);
  TF_SPARSECONV_GRID_LOOP(slot, num_slots) {
    Index i;
    GpuPresentWeight w;
    int64_t o;
    if (!SlotOutput(L, e, weights, row_begin, row_length, slot, &i, &w, &o)) continue;
    atomicOr(out_bits + (o >> 5), 1u << (o & 31));
  }
}

// The set bits of a bitmap in order, in one pass over the words (the one-pass compaction of
// gpu_util.cuh over words: tiles from a ticket, each tile's start from a look-back at its
// predecessors' published counts), in place of a count pass, a scan and a write pass (the
// count pass read the 16.7 MB bitmap of a 256^3 layer of 8 channels a second time; with the
// scan's launch about a tenth of the layer's GPU time).
// Also counts[s] += the set bits in [s * segment_size, (s + 1) * segment_size) (counts zeroed
// before): one atomic per tile where its words lie in one segment, else per thread or run of
// a segment's bits; and, given word_rank, word_rank[w] = the set bits before word w (the
// atomic dataflow's places).
// A warp takes 32 * kTileItems consecutive words of the tile, a word per lane and round, so
// that the lanes of a round write their indices side by side (a thread's own 8 consecutive
// words scattered each warp's writes over 8x as many cache lines).
static_assert(kThreads % 32 == 0 && kTileSize == static_cast<int64_t>(kThreads) * kTileItems,
              "a tile is the block's warps' 32 * kTileItems words each");
static_assert(kMaxSortItems <= static_cast<int64_t>(UINT32_MAX), "word ranks (< the touched entries) fit 32 bits");

// The 32-bit words after a bitmap's out_words that WriteBitTilesKernel needs zeroed (its tiles'
// states and the ticket, 8-byte aligned where the bitmap starts so).
inline int64_t ReadOutStateWords(int64_t out_words) {
  return (out_words & 1) + 2 * OnePassStates((out_words + kTileSize - 1) / kTileSize);
}

__global__ void __launch_bounds__(kThreads)
    WriteBitTilesKernel(const uint32_t* bits, int64_t words, int64_t num_tiles, unsigned long long* state,
                        int64_t* total, int64_t* indices, int64_t segment_size, int64_t* counts,
                        uint32_t* word_rank) {
  ChainedKernelBegin();
  constexpr int kWarps = kThreads / 32;
  __shared__ int warp_total[kWarps];
  __shared__ int64_t tile_ticket, tile_before;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  for (;;) {
    if (threadIdx.x == 0) tile_ticket = NextTile(state, num_tiles);
    __syncthreads();
    const int64_t tile = tile_ticket;
    if (tile >= num_tiles) break;
    // word j of this thread: first + j * 32
    const int64_t first = tile * kTileSize + static_cast<int64_t>(warp) * 32 * kTileItems + lane;
    uint32_t word[kTileItems];
    int set = 0;
    for (int j = 0; j < kTileItems; ++j) {
      word[j] = first + j * 32 < words ? bits[first + j * 32] : 0u;
      set += __popc(word[j]);
    }
    int in_warp = set;
    for (int d = 16; d > 0; d /= 2) in_warp += __shfl_xor_sync(0xffffffffu, in_warp, d);
    if (lane == 0) warp_total[warp] = in_warp;
    __syncthreads();
    int before_warp = 0, tile_total = 0;
    for (int v = 0; v < kWarps; ++v) {
      before_warp += v < warp ? warp_total[v] : 0;
      tile_total += warp_total[v];
    }
    if (warp == 0) {
      const int64_t before = TileStart(state, tile, num_tiles, tile_total, lane, total);
      if (lane == 0) tile_before = before;
    }
    __syncthreads();
    int64_t round_start = tile_before + before_warp;  // the rank of this warp's round-j words
    int64_t lo = INT64_MAX, hi = -1;  // the segments of this thread's first and last set bits
    for (int j = 0; j < kTileItems; ++j) {
      const int here = __popc(word[j]);
      int inclusive = here;
      for (int d = 1; d < 32; d *= 2) {
        const int other = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += other;
      }
      int64_t rank = round_start + inclusive - here;
      round_start += __shfl_sync(0xffffffffu, inclusive, 31);
      const int64_t w_index = first + j * 32;
      if (word_rank != nullptr && w_index < words) word_rank[w_index] = static_cast<uint32_t>(rank);
      for (uint32_t w = word[j]; w != 0u; w &= w - 1u) {
        const int64_t index = w_index * 32 + (__ffs(w) - 1);
        indices[rank++] = index;
        if (lo == INT64_MAX) lo = index / segment_size;
        hi = index;
      }
    }
    if (hi >= 0) hi /= segment_size;
    // The segments of the tile's first and last bit (not of its set bits: no block reduction)
    const int64_t tile_end = (tile + 1) * kTileSize < words ? (tile + 1) * kTileSize : words;
    if (tile * kTileSize * 32 / segment_size == (tile_end * 32 - 1) / segment_size) {
      if (threadIdx.x == 0 && tile_total > 0) {
        atomicAdd(reinterpret_cast<unsigned long long*>(&counts[tile * kTileSize * 32 / segment_size]),
                  static_cast<unsigned long long>(tile_total));
      }
    } else if (lo == hi) {
      atomicAdd(reinterpret_cast<unsigned long long*>(&counts[lo]), static_cast<unsigned long long>(set));
    } else if (set > 0) {  // this thread's bits span segments: one atomic per run of a segment
      // (its words lie 32 apart, so on small grids most threads span several segments)
      int64_t run_segment = lo, run_count = 0;
      for (int j = 0; j < kTileItems; ++j) {
        for (uint32_t w = word[j]; w != 0u; w &= w - 1u) {
          const int64_t segment = ((first + j * 32) * 32 + (__ffs(w) - 1)) / segment_size;
          if (segment != run_segment) {  // the bits rise, so a segment's bits are one run
            atomicAdd(reinterpret_cast<unsigned long long*>(&counts[run_segment]),
                      static_cast<unsigned long long>(run_count));
            run_segment = segment;
            run_count = 0;
          }
          ++run_count;
        }
      }
      atomicAdd(reinterpret_cast<unsigned long long*>(&counts[run_segment]), static_cast<unsigned long long>(run_count));
    }
    __syncthreads();  // warp_total, tile_ticket and tile_before are rewritten for the next tile
  }
}

// One thread per touched entry o = (b * Cout + oc) * S + lin(y): the sum over ic ascending,
// then the (ic, oc) weights in kernel-offset order, of value(y + delta, ic) * w where that
// input is present (its bit), found at word_first of its word plus the set bits below it:
// DenseAccumulateKernel's order and roundings, so the CPU's values.
// Index: the integer type of the key arithmetic, uint32_t where every key fits (64-bit
// divisions took most of this kernel's time). Also counts each segment's entries > 0
// (CountPerSegment; positive zeroed before), as PositiveCountKernel does for the other paths.
template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads)
    BitmapSumsKernel(KeyLayout L, int64_t cout, const int64_t* touched_keys, const int64_t* touched_total,
                     const uint32_t* in_bits, const int32_t* word_first, const T* values, const T* filter,
                     const GpuPresentWeight* weights, const int64_t* pair_begin, const T* bias, T* touched_values,
                     int64_t* positive, CheckSlot* relu_nan) {
  ChainedKernelBegin();
  __shared__ int64_t block_segment[2];
  const int64_t total = *touched_total;
  const Index S = static_cast<Index>(L.spatial_size), cin = static_cast<Index>(L.channels);
  const Index n_oc = static_cast<Index>(cout);
  // the loop's bounds are the same for the whole block: every thread reaches each barrier
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads; base < total;
       base += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t j = base + threadIdx.x;
    int64_t segment = -1;
    bool positive_here = false;
    if (j < total) {
      const Index o = static_cast<Index>(touched_keys[j]);
      const Index seg = o / S, lin = o - seg * S;
      const Index b = seg / n_oc, oc = seg - b * n_oc;
      int32_t y[kMaxSpatialDims];
#pragma unroll
      for (int k = 0; k < kMaxSpatialDims; ++k) {  // constant indices: y stays in registers
        y[k] = k < L.d ? static_cast<int32_t>((lin / static_cast<Index>(L.stride[k])) %
                                              static_cast<Index>(L.extent[k]))
                       : 0;
      }
      T sum = T(0);
      for (Index ic = 0; ic < cin; ++ic) {
        const int64_t in_base = static_cast<int64_t>((b * cin + ic) * S + lin);
        const int64_t end = pair_begin[ic * n_oc + oc + 1];
        for (int64_t p = pair_begin[ic * n_oc + oc]; p < end; ++p) {
          const GpuPresentWeight w = LoadWeight(&weights[p]);
          if (!InputInGrid(y, w, L)) continue;
          const int64_t key = in_base + w.lin_delta;
          const uint32_t word = in_bits[key >> 5];
          const uint32_t bit = static_cast<uint32_t>(key & 31);
          if (!((word >> bit) & 1u)) continue;
          const int64_t entry = word_first[key >> 5] + __popc(word & ((1u << bit) - 1u));
          sum = AddRn(sum, MulRn(values[entry], filter[w.filter_index]));
        }
      }
      const T value = AddRn(sum, bias[oc]);
      touched_values[j] = value;
      if (relu_nan != nullptr && isnan(value)) RecordFirst(relu_nan, j);  // TouchedNaNKernel's check
      segment = static_cast<int64_t>(seg);
      positive_here = value > T(0);
    }
    CountPerSegment(segment, positive_here, base, total, block_segment, positive);
  }
}

// ---- the atomic sums (ForwardPath::kAtomic, direct_conv_gpu.h) ----

// touched_values[place of o] += value_i * w for every (entry, present weight) that reaches an
// output o, one thread per contribution slot as MarkOutputsKernel; the place is o's word's
// rank plus the set bits below o in its word (every such o has its bit set: the same slots
// marked it). Float atomics: the sum's order, and so its last bits, vary run to run.
template <typename T, typename Index>
__global__ void AtomicContributionsKernel(KeyLayout L, EntryData e, const T* values, const T* filter,
                                          const GpuPresentWeight* weights, const int64_t* row_begin,
                                          int64_t max_row, int64_t num_slots, const Report* report,
                                          const uint32_t* out_bits, const uint32_t* word_rank, T* touched_values) {
  ChainedKernelBegin();
  if (!ChecksPassed(report)) return;
  const Index row_length = static_cast<Index>(max_row);
  TF_SPARSECONV_GRID_LOOP(slot, num_slots) {
    Index i;
    GpuPresentWeight w;
    int64_t o;
    if (!SlotOutput(L, e, weights, row_begin, row_length, slot, &i, &w, &o)) continue;
    const uint32_t below = out_bits[o >> 5] & ((1u << (o & 31)) - 1u);
    const int64_t place = static_cast<int64_t>(word_rank[o >> 5]) + __popc(below);
    atomicAdd(touched_values + place, MulRn(values[i], filter[w.filter_index]));
  }
}

// The bias added to every touched sum, and each segment's entries > 0 counted (CountPerSegment;
// positive zeroed before), as BitmapSumsKernel ends.
template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads)
    AtomicBiasKernel(const int64_t* touched_keys, const int64_t* touched_total, int64_t spatial_size, int64_t cout,
                     const T* bias, T* touched_values, int64_t* positive, CheckSlot* relu_nan) {
  ChainedKernelBegin();
  __shared__ int64_t block_segment[2];
  const int64_t total = *touched_total;
  const Index S = static_cast<Index>(spatial_size), n_oc = static_cast<Index>(cout);
  // the loop's bounds are the same for the whole block: every thread reaches each barrier
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads; base < total;
       base += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t j = base + threadIdx.x;
    int64_t segment = -1;
    bool positive_here = false;
    if (j < total) {
      const Index seg = static_cast<Index>(touched_keys[j]) / S;
      const T value = AddRn(touched_values[j], bias[seg % n_oc]);
      touched_values[j] = value;
      if (relu_nan != nullptr && isnan(value)) RecordFirst(relu_nan, j);  // TouchedNaNKernel's check
      segment = static_cast<int64_t>(seg);
      positive_here = value > T(0);
    }
    CountPerSegment(segment, positive_here, base, total, block_segment, positive);
  }
}

struct IsTouchedBit {
  const uint32_t* bits;
  __device__ bool operator()(int64_t o) const { return (bits[o >> 5] >> (o & 31)) & 1u; }
};

template <typename T>
struct CopyTouched {
  const T* values;
  int64_t* touched_keys;
  T* touched_values;
  __device__ void operator()(int64_t o, int64_t rank) const {
    touched_keys[rank] = o;
    touched_values[rank] = values[o];
  }
};

// The touched set from the output bits (the bitmaps and the atomic sums): every (entry, present
// weight) sets its output's bit in out_bits (out_words words, then ReadOutStateWords(out_words)
// words for the read-out, all zeroed before), then the set bits are written in key order to
// touched_keys, their total to touched_total, each segment's count added to touched_counts
// (zeroed before) and, given word_rank, each word's rank.
GpuStatus MarkAndReadOutputBits(Stream stream, const KeyLayout& L, const EntryData& e, const GpuPresentWeight* weights,
                                const int64_t* row_begin, int64_t max_row, int64_t n, int64_t num_slots,
                                const Report* report, uint32_t* out_bits, int64_t out_words, int64_t* touched_keys,
                                int64_t* touched_total, int64_t* touched_counts, uint32_t* word_rank) {
  const int64_t num_tiles = (out_words + kTileSize - 1) / kTileSize;
  if (n > 0) {
    if (num_slots <= static_cast<int64_t>(UINT32_MAX)) {
      LaunchChained(MarkOutputsKernel<uint32_t>, BlocksFor(num_slots), kThreads, 0, stream, L, e, weights, row_begin,
                    max_row, num_slots, report, out_bits);
    } else {
      LaunchChained(MarkOutputsKernel<uint64_t>, BlocksFor(num_slots), kThreads, 0, stream, L, e, weights, row_begin,
                    max_row, num_slots, report, out_bits);
    }
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("output bits");
  }
  if (num_tiles == 0) {
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(cudaMemsetAsync(touched_total, 0, sizeof(int64_t), stream), "touched set");
    return GpuStatus::Ok();
  }
  auto* state = reinterpret_cast<unsigned long long*>(out_bits + out_words + (out_words & 1));
  LaunchChained(WriteBitTilesKernel, TileBlocks(num_tiles), kThreads, 0, stream, out_bits, out_words, num_tiles, state,
                touched_total, touched_keys, L.spatial_size, touched_counts, word_rank);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("touched set");
  return GpuStatus::Ok();
}

// The weight table's views that only the dense grid reads, on the device.
struct DenseTables {
  const int64_t* pair_begin = nullptr;
  const int64_t* offset_rep = nullptr;
  const uint8_t* present = nullptr;  // [K..., Cin, Cout] byte table: is this weight present
};

// ForwardNaN's checks in a launch of their own, where no kernel over the entries runs.
template <typename T>
__global__ void ForwardNaNKernel(ForwardNaN<T> nan) {
  ChainedKernelBegin();
  nan.Run();
}

template <typename T>
ForwardNaN<T> ForwardNaNOf(const DirectConvGpuArgs<T>& a, const T* bias, Report* device_report) {
  ForwardNaN<T> nan;
  nan.values = a.values;
  nan.n = a.n;
  nan.filter = a.filter;
  nan.filter_size = a.filter_size;
  nan.bias = bias;
  nan.cout = a.cout;
  nan.checks = device_report->checks;
  return nan;
}

// The forward's data checks (ConvCheck slots) queued into device_report; the keys are not
// checked again where a library op made them (keys_checked). The NaN checks go with the
// first kernel over the entries where one runs (nan_with_entries: the input has entries).
template <typename T>
GpuStatus QueueForwardChecks(Stream stream, const DirectConvGpuArgs<T>& a, const T* bias, Report* device_report,
                             bool nan_with_entries) {
  CheckSlot* checks = device_report->checks;
  if (!a.keys_checked) {
    TF_SPARSECONV_RETURN_IF_ERROR(
        CheckSortedKeys(stream, a.keys, a.n, a.in_layout.num_keys(), &checks[kConvKeys], a.padded));
  }
  const int64_t items = a.n + a.filter_size + a.cout;
  if (items > 0 && !nan_with_entries) {
    LaunchChained(ForwardNaNKernel<T>, BlocksFor(items), kThreads, 0, stream, ForwardNaNOf(a, bias, device_report));
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("NaN check");
  }
  return GpuStatus::Ok();
}

// One host table to upload, and where its device address goes.
struct UploadItem {
  const void* host;
  size_t bytes;
  const void** device;
};

// The bytes the items take on the device, each at a 16-byte boundary (LoadWeight reads the
// present weights in 16-byte loads).
constexpr size_t kTableAlign = alignof(GpuPresentWeight);
inline size_t AlignedBytes(size_t bytes) { return (bytes + kTableAlign - 1) / kTableAlign * kTableAlign; }
inline size_t ItemsBytes(const UploadItem* items, int count) {
  size_t total = 0;
  for (int t = 0; t < count; ++t) total += AlignedBytes(items[t].bytes);
  return total;
}

// Copies the items into `device` (ItemsBytes of them) in one copy through one pinned buffer.
GpuStatus UploadItems(Stream stream, Scratch* scratch, UploadItem* items, int count, char* device) {
  const size_t total = ItemsBytes(items, count);
  char* pinned = static_cast<char*>(scratch->PinnedHost(total));
  if (pinned == nullptr) return GpuStatus::OutOfMemory("present weights");
  size_t offset = 0;
  for (int t = 0; t < count; ++t) {
    if (items[t].bytes > 0) std::memcpy(pinned + offset, items[t].host, items[t].bytes);
    *items[t].device = device + offset;
    offset += AlignedBytes(items[t].bytes);
  }
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaMemcpyAsync(device, pinned, total, cudaMemcpyHostToDevice, stream), "present weights");
  return GpuStatus::Ok();
}

// The weight tables on the device, from the kernel's cache (GpuWeightTable::on_device; given
// `dense`, the dense grid's tables as well; given `pair_begin`, that table as well), and, where
// *device_report is null, a new report copied from the cache's initial one (every check
// passed, count 0: NewReport's bytes).
template <typename T>
GpuStatus DeviceTables(Stream stream, Scratch* scratch, const DirectConvGpuArgs<T>& a, Report** device_report,
                       const GpuPresentWeight** weights, const int64_t** row_begin, DenseTables* dense = nullptr,
                       const int64_t** pair_begin = nullptr) {
  const GpuWeightTablesOnDevice& cached = a.weights.on_device;
  if (cached.items == nullptr) return GpuStatus{"present weights", "the weight tables are not on the device"};
  *weights = cached.items;
  *row_begin = cached.row_begin;
  if (dense != nullptr) {
    dense->pair_begin = cached.pair_begin;
    dense->offset_rep = cached.offset_rep;
    dense->present = cached.present;
  } else if (pair_begin != nullptr) {
    *pair_begin = cached.pair_begin;
  }
  if (*device_report != nullptr) return GpuStatus::Ok();
  *device_report = static_cast<Report*>(scratch->Device(sizeof(Report)));
  if (*device_report == nullptr) return GpuStatus::OutOfMemory("report");
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaMemcpyAsync(*device_report, cached.initial_report, sizeof(Report), cudaMemcpyDeviceToDevice, stream),
      "report");
  return GpuStatus::Ok();
}

// The items of every table a call may read, the initial report first (for the cache).
int AllTables(const GpuWeightTable& w, int64_t cin, int64_t cout, const Report* initial, GpuWeightTablesOnDevice* view,
              UploadItem* items) {
  int count = 0;
  items[count++] = {initial, sizeof(Report), reinterpret_cast<const void**>(&view->initial_report)};
  items[count++] = {w.items, sizeof(GpuPresentWeight) * w.count, reinterpret_cast<const void**>(&view->items)};
  items[count++] = {w.row_begin, sizeof(int64_t) * (cin + 1), reinterpret_cast<const void**>(&view->row_begin)};
  items[count++] = {w.pair_begin, sizeof(int64_t) * (cin * cout + 1),
                    reinterpret_cast<const void**>(&view->pair_begin)};
  items[count++] = {w.offset_rep, sizeof(int64_t) * w.num_offsets, reinterpret_cast<const void**>(&view->offset_rep)};
  items[count++] = {w.present, static_cast<size_t>(w.present_size), reinterpret_cast<const void**>(&view->present)};
  return count;
}

// The per-entry data (EntryData) of the input's entries, queued after the checks; the
// bitmaps compute it themselves as they mark the input (data_by_caller: only allocated).
template <typename T>
GpuStatus PrepareEntryData(Stream stream, Scratch* scratch, const DirectConvGpuArgs<T>& a, const Report* report,
                           bool data_by_caller, EntryData* e, const ForwardNaN<T>& nan = ForwardNaN<T>()) {
  e->out_base = scratch->DeviceArray<int64_t>(a.n);
  e->ic = scratch->DeviceArray<int32_t>(a.n);
  e->coords = scratch->DeviceArray<int32_t>(a.n * a.in_layout.d);
  if (!e->out_base || !e->ic || !e->coords) return GpuStatus::OutOfMemory("entry data");
  if (a.n > 0 && !data_by_caller) {
    LaunchChained(EntryDataKernel<T>, BlocksFor(a.n), kThreads, 0, stream, a.in_layout, a.cout, a.keys, a.n, report, *e,
                  nan);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("entry data");
  }
  return GpuStatus::Ok();
}

}  // namespace

bool GradWeightsPack(const KeyLayout& L, int64_t cout, const GpuWeightTable& w) {
  if (cout * L.spatial_size > INT32_MAX) return false;
  for (int64_t p = 0; p < w.count; ++p) {
    for (int j = 0; j < L.d; ++j) {
      const int32_t delta = SpatialDelta(w.items[p], j, L.extent[j]);
      if (delta < INT8_MIN || delta > INT8_MAX) return false;
    }
  }
  return true;
}

size_t WeightTablesBytes(const GpuWeightTable& w, int64_t cin, int64_t cout) {
  const Report initial = InitialReport();
  GpuWeightTablesOnDevice view;
  UploadItem items[6];
  return ItemsBytes(items, AllTables(w, cin, cout, &initial, &view, items));
}

GpuStatus UploadWeightTables(Stream stream, Scratch* scratch, const GpuWeightTable& w, int64_t cin, int64_t cout,
                             void* device, GpuWeightTablesOnDevice* view) {
  const Report initial = InitialReport();
  UploadItem items[6];
  const int count = AllTables(w, cin, cout, &initial, view, items);
  return UploadItems(stream, scratch, items, count, static_cast<char*>(device));
}

template <typename T>
GpuStatus DirectConvForwardGpu<T>::Run(Stream stream, Scratch* scratch,
                                       const DirectConvGpuArgs<T>& a, const T* bias,
                                       SelectionMode selection, int64_t k,
                                       DirectConvDataflow dataflow, int64_t* touched_counts,
                                       int64_t* positive_counts, Report* report) {
  const KeyLayout& L = a.in_layout;
  const int64_t num_segments = L.batch * a.cout;
  const int64_t num_slots = ContributionSlots(a.n, a.weights.max_row);
  const ForwardPath path = ForwardPathOf(a, dataflow);
  const bool dense = path == ForwardPath::kDense, bitmap = path == ForwardPath::kBitmap;
  const bool atomic = path == ForwardPath::kAtomic;
  if ((!dense && num_slots > kMaxSortItems) || num_segments > kMaxSegments) {
    return GpuStatus{"direct conv", "too many contributions or segments"};
  }
  const uint64_t no_output = static_cast<uint64_t>(num_segments * L.spatial_size);
  // Touched keys are distinct and below no_output, and each needs a contribution, so the
  // touched set never exceeds either bound; the passes over it run on that many items.
  const int64_t touched_bound = std::min<int64_t>(num_slots, static_cast<int64_t>(no_output));

  Report* device_report = nullptr;  // new, from the cache's initial report
  const GpuPresentWeight* weights = nullptr;
  const int64_t* row_begin = nullptr;
  const int64_t* pair_begin = nullptr;
  DenseTables tables;
  TF_SPARSECONV_RETURN_IF_ERROR(DeviceTables(stream, scratch, a, &device_report, &weights, &row_begin,
                                             dense ? &tables : nullptr, bitmap ? &pair_begin : nullptr));
  // Every dataflow's first kernel over the entries also takes the NaN checks (`nan`); the
  // dense grid and the bitmaps run theirs only where something is touched.
  const bool entries_kernel_runs = a.n > 0 && (touched_bound > 0 || (!dense && !bitmap));
  TF_SPARSECONV_RETURN_IF_ERROR(QueueForwardChecks(stream, a, bias, device_report, entries_kernel_runs));
  const ForwardNaN<T> nan = ForwardNaNOf(a, bias, device_report);
  EntryData e;
  if (!dense) {  // the dense grid needs no per-entry data
    TF_SPARSECONV_RETURN_IF_ERROR(PrepareEntryData(stream, scratch, a, device_report, bitmap, &e,
                                                   bitmap ? ForwardNaN<T>() : nan));
  }
  touched_bound_ = touched_bound;
  cap_ = a.padded_capped && a.padded_keys != nullptr ? a.padded_capacity : 0;
  // The fused ReLU's NaN check: in the kernel that writes the touched values where it is the
  // bitmaps' or the atomic sums' (their last kernel), else in TouchedNaNKernel below.
  CheckSlot* relu_nan = a.relu && (bitmap || atomic) ? &device_report->checks[kConvReluNaN] : nullptr;

  // Where every touched entry is kept, the touched total is the report's count itself (no
  // copy of it at the end).
  const bool total_is_count = selection == SelectionMode::kNone && !a.relu;
  int64_t* touched_total = total_is_count ? &device_report->count : scratch->DeviceArray<int64_t>(1);
  // The touched set of the dense grid, the bitmaps and the atomic sums goes straight into a
  // padded output the caller gave (DirectConvGpuArgs::padded_keys) where it is the output.
  const bool into_output = (dense || bitmap || atomic) && total_is_count && a.padded_keys != nullptr &&
                           a.padded_values != nullptr && a.padded_capacity >= touched_bound && touched_bound > 0;
  auto touched_buffers = [&](int64_t** keys, T** values) {
    *keys = into_output ? a.padded_keys : scratch->DeviceArray<int64_t>(touched_bound);
    *values = into_output ? a.padded_values : scratch->DeviceArray<T>(touched_bound);
  };
  int64_t* segment_begin = scratch->DeviceArray<int64_t>(num_segments + 1);
  if (!touched_total || !segment_begin) return GpuStatus::OutOfMemory("touched set");
  touched_total_ = touched_total;
  uint64_t* slot_keys[2] = {nullptr, nullptr};
  T* slot_values[2] = {nullptr, nullptr};
  int current = 0;
  if (touched_bound == 0) {
    if (!total_is_count) {  // the report's count is 0 already
      TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
          cudaMemsetAsync(touched_total, 0, sizeof(int64_t), stream), "touched set");
    }
  } else if (dense) {
    const int64_t in_keys = L.num_keys(), total = static_cast<int64_t>(no_output);
    const int64_t sites = L.batch * L.spatial_size;
    T* dense_in = scratch->DeviceArray<T>(in_keys);
    uint32_t* in_bits = scratch->DeviceArray<uint32_t>((in_keys + 31) / 32);
    uint32_t* site_bits = scratch->DeviceArray<uint32_t>((sites + 31) / 32);
    uint32_t* neighbour_mask = scratch->DeviceArray<uint32_t>(sites);
    T* out_values = scratch->DeviceArray<T>(total);
    uint32_t* out_bits = scratch->DeviceArray<uint32_t>((total + 31) / 32);
    int64_t* touched_keys;
    T* touched_values;
    touched_buffers(&touched_keys, &touched_values);
    if (!dense_in || !in_bits || !site_bits || !neighbour_mask || !out_values || !out_bits || !touched_keys ||
        !touched_values) {
      return GpuStatus::OutOfMemory("dense grid");
    }
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
        cudaMemsetAsync(in_bits, 0, sizeof(uint32_t) * ((in_keys + 31) / 32), stream), "dense grid");
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
        cudaMemsetAsync(site_bits, 0, sizeof(uint32_t) * ((sites + 31) / 32), stream), "dense grid");
    if (a.n > 0) {
      LaunchChained(ScatterDenseKernel<T>, BlocksFor(a.n), kThreads, 0, stream, L, a.keys, a.values, a.n, device_report,
                    dense_in, in_bits, site_bits, nan);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("dense grid input");
    }
    // A failed check leaves the masks unwritten; the kernel below reads none of them then.
    LaunchChained(NeighbourMaskKernel, BlocksFor(sites), kThreads, 0, stream, L, weights, tables.offset_rep,
                  a.weights.num_offsets, site_bits, device_report, neighbour_mask);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("dense grid neighbours");
    // The kernel clears the words of out_bits it owns; a failed check leaves them unset.
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
        cudaMemsetAsync(out_bits, 0, sizeof(uint32_t) * ((total + 31) / 32), stream), "dense grid");
    const int64_t chunks = (a.cout + kDenseChunk - 1) / kDenseChunk;
    if (L.spatial_size % 32 == 0 && chunks <= 65535 && DenseWeightsShared(a)) {
      LaunchChained(DenseSiteSharedKernel<T>,
                    dim3(std::min(BlocksFor(sites), 4096u), static_cast<unsigned int>(chunks)), kThreads,
                    DenseSharedBytes<T>(L.channels, a.weights.num_offsets), stream, L, a.cout, dense_in, in_bits,
                    neighbour_mask, a.filter, tables.present, weights, tables.offset_rep,
                    static_cast<int>(a.weights.num_offsets), bias, device_report, out_values, out_bits);
    } else if (L.spatial_size % 32 == 0) {
      const int64_t threads = sites * chunks;
      LaunchChained(DenseSiteAccumulateKernel<T>, BlocksFor(threads), kThreads, 0, stream, L, a.cout, dense_in, in_bits,
                    neighbour_mask, a.filter, tables.present, weights, tables.offset_rep, a.weights.num_offsets, bias,
                    device_report, out_values, out_bits);
    } else {
      LaunchChained(DenseAccumulateKernel<T>, BlocksFor(total), kThreads, 0, stream, L, a.cout, dense_in, in_bits,
                    neighbour_mask, a.filter, weights, tables.pair_begin, bias, device_report, out_values, out_bits);
    }
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("dense grid sums");
    TF_SPARSECONV_RETURN_IF_ERROR(Compact(stream, scratch, IsTouchedBit{out_bits},
                                          CopyTouched<T>{out_values, touched_keys, touched_values}, total,
                                          touched_total));
    touched_keys_ = touched_keys;
    touched_values_ = touched_values;
  } else if (bitmap) {
    if (a.n > INT32_MAX) return GpuStatus{"direct conv", "the bitmap dataflow takes fewer than 2^31 entries"};
    const int64_t in_words = (L.num_keys() + 31) / 32;
    const int64_t out_words = static_cast<int64_t>((no_output + 31) / 32);
    // in_bits, out_bits and the read-out's state (8-byte aligned: in_words made even) in one
    // allocation, zeroed by one memset
    const int64_t in_span = in_words + (in_words & 1);
    const int64_t bit_words = in_span + out_words + ReadOutStateWords(out_words);
    uint32_t* in_bits = scratch->DeviceArray<uint32_t>(bit_words);
    int32_t* word_first = scratch->DeviceArray<int32_t>(in_words);
    int64_t* touched_keys;
    T* touched_values;
    touched_buffers(&touched_keys, &touched_values);
    if (!in_bits || !word_first || !touched_keys || !touched_values) return GpuStatus::OutOfMemory("bitmaps");
    uint32_t* out_bits = in_bits + in_span;
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(cudaMemsetAsync(in_bits, 0, sizeof(uint32_t) * bit_words, stream),
                                            "bitmaps");
    if (a.n > 0) {  // also the entries' data, which the output bits read, and both counts zeroed
      LaunchChained(MarkInputsKernel<T>, BlocksFor(std::max(a.n, num_segments)), kThreads, 0, stream, L, a.cout, a.keys,
                    a.n, device_report, in_bits, word_first, e, num_segments, touched_counts, positive_counts, nan);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("bitmaps");
    }
    TF_SPARSECONV_RETURN_IF_ERROR(MarkAndReadOutputBits(stream, L, e, weights, row_begin, a.weights.max_row, a.n,
                                                        num_slots, device_report, out_bits, out_words, touched_keys,
                                                        touched_total, touched_counts, nullptr));
    if (no_output <= UINT32_MAX && static_cast<uint64_t>(L.num_keys()) <= UINT32_MAX) {
      LaunchChained(BitmapSumsKernel<T, uint32_t>, BlocksFor(touched_bound), kThreads, 0, stream, L, a.cout,
                    touched_keys, touched_total, in_bits, word_first, a.values, a.filter, weights, pair_begin, bias,
                    touched_values, positive_counts, relu_nan);
    } else {
      LaunchChained(BitmapSumsKernel<T, uint64_t>, BlocksFor(touched_bound), kThreads, 0, stream, L, a.cout,
                    touched_keys, touched_total, in_bits, word_first, a.values, a.filter, weights, pair_begin, bias,
                    touched_values, positive_counts, relu_nan);
    }
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("touched set");
    touched_keys_ = touched_keys;
    touched_values_ = touched_values;
  } else if (atomic) {
    const int64_t out_words = static_cast<int64_t>((no_output + 31) / 32);
    // the bits and the read-out's state (zeroed by one memset), then each word's rank
    const int64_t bit_words = out_words + ReadOutStateWords(out_words);
    uint32_t* out_bits = scratch->DeviceArray<uint32_t>(bit_words + out_words);
    int64_t* touched_keys;
    T* touched_values;
    touched_buffers(&touched_keys, &touched_values);
    if (!out_bits || !touched_keys || !touched_values) return GpuStatus::OutOfMemory("atomic sums");
    uint32_t* word_rank = out_bits + bit_words;
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
        cudaMemsetAsync(out_bits, 0, sizeof(uint32_t) * bit_words, stream), "atomic sums");
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
        cudaMemsetAsync(touched_values, 0, sizeof(T) * touched_bound, stream), "atomic sums");
    // zeroed for WriteBitTilesKernel and AtomicBiasKernel
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
        cudaMemsetAsync(touched_counts, 0, sizeof(int64_t) * num_segments, stream), "atomic sums");
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
        cudaMemsetAsync(positive_counts, 0, sizeof(int64_t) * num_segments, stream), "atomic sums");
    TF_SPARSECONV_RETURN_IF_ERROR(MarkAndReadOutputBits(stream, L, e, weights, row_begin, a.weights.max_row, a.n,
                                                        num_slots, device_report, out_bits, out_words, touched_keys,
                                                        touched_total, touched_counts, word_rank));
    if (a.n > 0) {
      if (num_slots <= static_cast<int64_t>(UINT32_MAX)) {
        LaunchChained(AtomicContributionsKernel<T, uint32_t>, BlocksFor(num_slots), kThreads, 0, stream, L, e, a.values,
                      a.filter, weights, row_begin, a.weights.max_row, num_slots, device_report, out_bits, word_rank,
                      touched_values);
      } else {
        LaunchChained(AtomicContributionsKernel<T, uint64_t>, BlocksFor(num_slots), kThreads, 0, stream, L, e, a.values,
                      a.filter, weights, row_begin, a.weights.max_row, num_slots, device_report, out_bits, word_rank,
                      touched_values);
      }
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("atomic sums");
    }
    if (no_output <= UINT32_MAX) {
      LaunchChained(AtomicBiasKernel<T, uint32_t>, BlocksFor(touched_bound), kThreads, 0, stream, touched_keys,
                    touched_total, L.spatial_size, a.cout, bias, touched_values, positive_counts, relu_nan);
    } else {
      LaunchChained(AtomicBiasKernel<T, uint64_t>, BlocksFor(touched_bound), kThreads, 0, stream, touched_keys,
                    touched_total, L.spatial_size, a.cout, bias, touched_values, positive_counts, relu_nan);
    }
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("atomic sums");
    touched_keys_ = touched_keys;
    touched_values_ = touched_values;
  } else {
    for (int buffer = 0; buffer < 2; ++buffer) {
      slot_keys[buffer] = scratch->DeviceArray<uint64_t>(num_slots);
      slot_values[buffer] = scratch->DeviceArray<T>(num_slots);
      if (!slot_keys[buffer] || !slot_values[buffer]) {
        return GpuStatus::OutOfMemory("contributions");
      }
    }
    if (num_slots <= static_cast<int64_t>(UINT32_MAX)) {
      LaunchChained(ContributionsKernel<T, uint32_t>, BlocksFor(num_slots), kThreads, 0, stream, L, e, a.values,
                    a.filter, weights, row_begin, a.weights.max_row, num_slots, no_output, device_report, slot_keys[0],
                    slot_values[0]);
    } else {
      LaunchChained(ContributionsKernel<T, uint64_t>, BlocksFor(num_slots), kThreads, 0, stream, L, e, a.values,
                    a.filter, weights, row_begin, a.weights.max_row, num_slots, no_output, device_report, slot_keys[0],
                    slot_values[0]);
    }
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("contributions");
    TF_SPARSECONV_RETURN_IF_ERROR(SortPairs(stream, scratch, slot_keys, slot_values, num_slots,
                                            BitsFor(no_output), &current));
    // The sorted contributions are in buffer `current`; the touched set goes to the other.
    int64_t* touched_keys = reinterpret_cast<int64_t*>(slot_keys[1 - current]);
    T* touched_values = slot_values[1 - current];
    touched_keys_ = touched_keys;
    touched_values_ = touched_values;
    TF_SPARSECONV_RETURN_IF_ERROR(Compact(
        stream, scratch, IsRunStart{slot_keys[current], no_output},
        SumContributions<T>{slot_keys[current], slot_values[current], num_slots, bias, L.spatial_size, a.cout,
                            touched_keys, touched_values},
        num_slots, touched_total));
  }
  if ((bitmap || atomic) && touched_bound > 0) {
    // both counts are written; k-selection's segment begins are their scan
    if (selection != SelectionMode::kNone) {
      TF_SPARSECONV_RETURN_IF_ERROR(ScanCounts(stream, scratch, touched_counts, segment_begin, num_segments,
                                               segment_begin + num_segments));
    }
  } else {
    LaunchChained(SegmentBeginKernel, BlocksFor(num_segments + 1), kThreads, 0, stream, touched_keys_, touched_total,
                  num_segments, L.spatial_size, segment_begin, positive_counts);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("touched counts");
    LaunchChained(PositiveCountKernel<T>, BlocksFor(std::max(touched_bound, num_segments)), kThreads, 0, stream,
                  touched_keys_, touched_values_, touched_total, touched_bound, L.spatial_size, segment_begin,
                  num_segments, touched_counts, positive_counts);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("positive counts");
  }
  if (touched_bound > 0) {
    if (a.relu && relu_nan == nullptr) {
      LaunchChained(TouchedNaNKernel<T>, BlocksFor(touched_bound), kThreads, 0, stream, touched_values_, touched_total,
                    touched_bound, &device_report->checks[kConvReluNaN]);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("relu NaN check");
    }
  }
  relu_values_ = a.relu ? touched_values_ : nullptr;

  if (selection != SelectionMode::kNone && touched_bound > 0) {
    const bool by_magnitude = selection == SelectionMode::kAbs;
    uint8_t* keep = scratch->DeviceArray<uint8_t>(touched_bound);
    if (!keep) return GpuStatus::OutOfMemory("k-selection");
    if (SelectsByBlocks(num_segments, touched_bound)) {
      LaunchChained(SelectSegmentsKernel<T>, LoopBlocks(num_segments), kThreads, 0, stream, touched_values_,
                    by_magnitude, segment_begin, num_segments, k, keep);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("k-selection");
    } else {
      TF_SPARSECONV_RETURN_IF_ERROR(SelectByRounds(stream, scratch, touched_values_, by_magnitude, touched_total,
                                                   touched_bound, segment_begin, num_segments, k, keep));
    }
    keep_ = keep;
  }
  keep_all_ = keep_ == nullptr && relu_values_ == nullptr;
  if (keep_all_) {  // the output is the touched set: its count, and a copy in Write
    if (!total_is_count) {
      TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
          cudaMemcpyAsync(&device_report->count, touched_total, sizeof(int64_t), cudaMemcpyDeviceToDevice, stream),
          "kept entries");
    }
  } else if (a.padded_keys != nullptr && a.padded_values != nullptr) {
    // A padded output the caller gave: the kept entries go into it in one pass (the count is
    // only the report's, read back or not); WritePadded then pads the rest.
    TF_SPARSECONV_RETURN_IF_ERROR(
        Compact(stream, scratch, IsKept<T>{touched_total, keep_, relu_values_},
                CopyEntriesBelow<T>{{touched_keys_, touched_values_, a.padded_keys, a.padded_values, nullptr},
                                    a.padded_capacity},
                touched_bound, &device_report->count));
    kept_in_ = a.padded_keys;
  } else {
    TF_SPARSECONV_RETURN_IF_ERROR(CountCompaction(stream, scratch, IsKept<T>{touched_total, keep_, relu_values_},
                                                  touched_bound, &device_report->count, &kept_));
  }
  if (report == nullptr) {
    unread_report_ = device_report;
    scratch->HoldPinnedUntilQueuedWorkRuns();  // any pinned memory of this call, past its queued work
    return GpuStatus::Ok();
  }
  return ReadReport(stream, scratch, device_report, report);
}

template <typename T>
__global__ void CopyTouchedKernel(const int64_t* keys, const T* values, const int64_t* total, int64_t bound,
                                  int64_t* out_keys, T* out_values) {
  ChainedKernelBegin();
  const int64_t n = TouchedEnd(total, bound);
  TF_SPARSECONV_GRID_LOOP(q, n) {
    out_keys[q] = keys[q];
    out_values[q] = values[q];
  }
}

// The live entries of a padded output: the host's count where it read the report
// (report nullptr), else the report's count, or none where a check failed.
__device__ inline int64_t PaddedLive(const Report* report, int64_t host_live) {
  return report == nullptr ? host_live : ChecksPassed(report) ? report->count : 0;
}

// The status output (direct_conv_checks.h, kConvStatusSize values), by block 0's first
// threads: the report's checks, its count against cap (a capped padded output's capacity;
// 0: none) and the limit, or, with report nullptr (the host has checked), all -1. Nothing
// where status is nullptr.
__device__ inline void WriteConvStatus(const Report* report, int64_t limit, int64_t cap, int64_t* status) {
  static_assert(kConvKeys == 0 && kConvValues == 1 && kConvFilter == 2 && kConvBias == 3 && kConvReluNaN == 4,
                "the status output's slot order (direct_conv_checks.h)");
  static_assert(kConvCheckSlots == 5 && kConvCheckSlots <= kMaxChecks, "one status slot per ConvCheck");
  static_assert(kConvCapacitySlot == kConvCheckSlots && kConvStatusSlots == kConvCheckSlots + 1,
                "the checks' slots, then the capacity slot");
  static_assert(kConvStatusSize == 4 * kConvStatusSlots + 1, "four values per slot, then the limit");
  const int c = static_cast<int>(threadIdx.x);
  if (status == nullptr || blockIdx.x != 0 || c > kConvStatusSlots) return;
  if (c == kConvStatusSlots) {
    status[4 * kConvStatusSlots] = report == nullptr ? -1 : limit;
  } else if (report == nullptr) {
    for (int j = 0; j < 4; ++j) status[4 * c + j] = -1;
  } else if (c == kConvCapacitySlot) {
    const bool over = cap > 0 && ChecksPassed(report) && report->count > cap;
    status[4 * c] = over ? report->count : -1;
    status[4 * c + 1] = over ? cap : -1;
    status[4 * c + 2] = -1;
    status[4 * c + 3] = -1;
  } else {
    const CheckSlot& slot = report->checks[c];
    status[4 * c] = slot.first == kNoError ? -1 : static_cast<int64_t>(slot.first);
    for (int j = 0; j < 3; ++j) status[4 * c + 1 + j] = slot.detail[j];
  }
}

// The touched set's first PaddedLive entries, then padding up to capacity; the status
// output too, where given (one launch for both).
template <typename T>
__global__ void CopyTouchedPaddedKernel(const int64_t* keys, const T* values, const Report* report,
                                        int64_t host_live, int64_t capacity, int64_t* out_keys, T* out_values,
                                        int64_t limit, int64_t* status, int64_t cap) {
  ChainedKernelBegin();
  WriteConvStatus(report, limit, cap, status);
  const int64_t live = PaddedLive(report, host_live);
  TF_SPARSECONV_GRID_LOOP(q, capacity) {
    if (q < live) {
      out_keys[q] = keys[q];
      out_values[q] = values[q];
    } else {
      out_keys[q] = kPaddingKey;
      out_values[q] = T(0);
    }
  }
}

template <typename T>
GpuStatus DirectConvForwardGpu<T>::WritePadded(Stream stream, int64_t* out_keys, T* out_values, int64_t capacity,
                                               const Report* device_report, int64_t live, int64_t limit,
                                               int64_t* status) const {
  if (!keep_all_) {
    if (out_keys != kept_in_) {  // a capped output's writes stop at its capacity: Run's Compact only
      if (cap_ > 0) return GpuStatus{"direct conv output", "a capped padded output is written by Run"};
      TF_SPARSECONV_RETURN_IF_ERROR(Write(stream, out_keys, out_values));
    }
    return PadConvOutput<T>(stream, device_report, live, capacity, out_keys, out_values, limit, status, cap_);
  }
  if (out_keys == touched_keys_ && out_values == touched_values_) {  // Run wrote the touched set there
    return PadConvOutput<T>(stream, device_report, live, capacity, out_keys, out_values, limit, status, cap_);
  }
  if (capacity == 0) {
    return status == nullptr ? GpuStatus::Ok() : ConvStatus(stream, device_report, limit, status, cap_);
  }
  LaunchChained(CopyTouchedPaddedKernel<T>, BlocksFor(capacity), kThreads, 0, stream, touched_keys_, touched_values_,
                device_report, live, capacity, out_keys, out_values, limit, status, cap_);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("output entries");
  return GpuStatus::Ok();
}

template <typename T>
GpuStatus DirectConvForwardGpu<T>::Write(Stream stream, int64_t* out_keys, T* out_values) const {
  if (kept_in_ != nullptr) return GpuStatus{"direct conv output", "Run wrote the kept entries (WritePadded pads)"};
  if (keep_all_) {
    if (touched_bound_ == 0) return GpuStatus::Ok();
    LaunchChained(CopyTouchedKernel<T>, BlocksFor(touched_bound_), kThreads, 0, stream, touched_keys_, touched_values_,
                  touched_total_, touched_bound_, out_keys, out_values);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("output entries");
    return GpuStatus::Ok();
  }
  return WriteCompaction(stream, kept_, IsKept<T>{touched_total_, keep_, relu_values_},
                         CopyEntries<T>{touched_keys_, touched_values_, out_keys, out_values, nullptr});
}

namespace {

template <typename T>
__global__ void PadConvOutputKernel(const Report* report, int64_t host_live, int64_t capacity, int64_t* out_keys,
                                    T* out_values, int64_t limit, int64_t* status, int64_t cap) {
  ChainedKernelBegin();
  WriteConvStatus(report, limit, cap, status);
  const int64_t live = PaddedLive(report, host_live);
  TF_SPARSECONV_GRID_LOOP(j, capacity) {
    if (j < live) continue;
    out_keys[j] = kPaddingKey;
    out_values[j] = T(0);
  }
}

__global__ void ConvStatusKernel(const Report* report, int64_t limit, int64_t* status, int64_t cap) {
  ChainedKernelBegin();
  WriteConvStatus(report, limit, cap, status);
}

}  // namespace

template <typename T>
GpuStatus PadConvOutput(Stream stream, const Report* device_report, int64_t live, int64_t capacity,
                        int64_t* out_keys, T* out_values, int64_t limit, int64_t* status, int64_t cap) {
  if (capacity == 0) {
    return status == nullptr ? GpuStatus::Ok() : ConvStatus(stream, device_report, limit, status, cap);
  }
  LaunchChained(PadConvOutputKernel<T>, BlocksFor(capacity), kThreads, 0, stream, device_report, live, capacity,
                out_keys, out_values, limit, status, cap);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("direct conv padding");
  return GpuStatus::Ok();
}

GpuStatus ConvStatus(Stream stream, const Report* device_report, int64_t limit, int64_t* status, int64_t cap) {
  LaunchChained(ConvStatusKernel, 1, 32, 0, stream, device_report, limit, status, cap);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("direct conv status");
  return GpuStatus::Ok();
}

// The filter gradient: per (weight, example, part of the input segment) partial sums, then a
// warp per weight adds them. Given in_grad (packed weights only), the input gradient from the
// same lookups: FilterGradGroupKernel's groups' sums, then InGradFromGroupsKernel.
template <typename T>
static GpuStatus FilterGradient(Stream stream, Scratch* scratch, const DirectConvGpuArgs<T>& a, const KeyLayout& L,
                                const EntryData& e, const GpuPresentWeight* weights, const int64_t* row_begin,
                                const GradWeight<T>* packed, const OutGradLookup<T>& out, const Report* device_report,
                                T* filter_grad, T* in_grad) {
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaMemsetAsync(filter_grad, 0, sizeof(T) * a.filter_size, stream), "filter gradient");
  const int64_t in_segments = L.num_segments();
  int64_t* in_begin = scratch->DeviceArray<int64_t>(in_segments + 1);
  if (!in_begin) return GpuStatus::OutOfMemory("filter gradient");
  LaunchChained(KeyBoundsKernel, BlocksFor(in_segments + 1), kThreads, 0, stream, a.keys, a.n, in_segments,
                L.spatial_size, device_report, in_begin);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("filter gradient");
  if (a.weights.count == 0) return GpuStatus::Ok();  // no weights, none packed: in_grad is null here
  const int64_t parts = PartsFor(a.n, in_segments);
  const int64_t parts_per_weight = L.batch * parts;
  T* partial = scratch->DeviceArray<T>(a.weights.count * parts_per_weight);
  if (!partial) return GpuStatus::OutOfMemory("filter gradient");
  const int64_t warps_per_block = kThreads / 32;
  if (packed != nullptr) {
    const int64_t groups_per_row = GroupsPerRow(a.weights.max_row);
    const int64_t tasks = L.channels * groups_per_row * parts_per_weight;
    T* in_partial = nullptr;
    if (in_grad != nullptr) {
      in_partial = scratch->DeviceArray<T>(groups_per_row * a.n);
      if (!in_partial) return GpuStatus::OutOfMemory("input gradient");
    }
    LaunchChained(in_grad != nullptr ? FilterGradGroupKernel<T, true> : FilterGradGroupKernel<T, false>,
                  LoopBlocks((tasks + warps_per_block - 1) / warps_per_block), kThreads, 0, stream, L, e, a.values,
                  packed, row_begin, groups_per_row, in_begin, out, parts, device_report, partial, a.n, in_partial);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("filter gradient");
    if (in_grad != nullptr) {
      LaunchChained(InGradFromGroupsKernel<T>, BlocksFor(a.n), kThreads, 0, stream, e, row_begin, in_partial, a.n,
                    device_report, in_grad);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("input gradient");
    }
  } else {
    LaunchChained(FilterGradPartialKernel<T>,
                  LoopBlocks((a.weights.count * parts_per_weight + warps_per_block - 1) / warps_per_block), kThreads,
                  0, stream, L, e, a.values, weights, a.weights.count, in_begin, out, parts, device_report, partial);
  }
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("filter gradient");
  LaunchChained(FilterGradKernel<T>, LoopBlocks((a.weights.count + warps_per_block - 1) / warps_per_block), kThreads,
                0, stream, weights, a.weights.count, partial, parts_per_weight, filter_grad);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("filter gradient");
  return GpuStatus::Ok();
}

template <typename T>
GpuStatus DirectConvBackpropGpu(Stream stream, Scratch* scratch, const DirectConvGpuArgs<T>& a,
                                const int64_t* out_keys, const T* out_grad, int64_t n_out,
                                DirectConvDataflow dataflow, T* in_grad, T* filter_grad, T* bias_grad,
                                Report* report) {
  const KeyLayout& L = a.in_layout;
  const KeyLayout out_layout = L.WithChannels(a.cout);
  const bool check = report != nullptr;  // else the inputs were checked by the forward call
  Report* device_report = nullptr;
  if (check) {
    TF_SPARSECONV_RETURN_IF_ERROR(NewEntryReport(stream, scratch, a.keys, a.values, a.n, L.num_keys(),
                                                 kBackpropKeys, kBackpropValues, &device_report, a.padded));
    CheckSlot* checks = device_report->checks;
    TF_SPARSECONV_RETURN_IF_ERROR(
        CheckNaN(stream, a.filter, a.filter_size, &checks[kBackpropFilter]));
    TF_SPARSECONV_RETURN_IF_ERROR(CheckSortedKeys(stream, out_keys, n_out, out_layout.num_keys(),
                                                  &checks[kBackpropOutKeys], a.out_padded));
  }
  // Unchecked, the kernels below still note internal errors in a new report (DeviceTables);
  // nobody reads it.
  const GpuPresentWeight* weights = nullptr;
  const int64_t* row_begin = nullptr;
  TF_SPARSECONV_RETURN_IF_ERROR(DeviceTables(stream, scratch, a, &device_report, &weights, &row_begin));
  EntryData e;
  TF_SPARSECONV_RETURN_IF_ERROR(PrepareEntryData(stream, scratch, a, device_report, false, &e));

  // The output gradients by output key (UseOutGradGrid), else a search of out_keys.
  OutGradLookup<T> out{OutputLookup{out_keys, n_out}, out_grad, nullptr};
  const bool lookups = in_grad != nullptr || filter_grad != nullptr;
  if (lookups && UseOutGradGrid(a, dataflow)) {
    const int64_t num_out_keys = out_layout.num_keys();
    T* grid = scratch->DeviceArray<T>(num_out_keys);
    if (!grid) return GpuStatus::OutOfMemory("output gradient grid");
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(cudaMemsetAsync(grid, 0xff, sizeof(T) * num_out_keys, stream),
                                            "output gradient grid");  // all-ones bits: no output
    if (n_out > 0) {
      LaunchChained(OutGradGridKernel<T>, BlocksFor(n_out), kThreads, 0, stream, out_keys, out_grad, n_out,
                    num_out_keys, device_report, grid);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("output gradient grid");
    }
    out.grid = grid;
  }
  // The weights packed for the gradient kernels, where they pack (GradWeightsPack, asked by
  // the kernel's cache) and a gradient kernel runs.
  GradWeight<T>* packed = nullptr;
  if (lookups && a.n > 0 && a.weights.count > 0 && a.weights.grad_pack == 1) {
    packed = scratch->DeviceArray<GradWeight<T>>(a.weights.count);
    if (!packed) return GpuStatus::OutOfMemory("packed weights");
    LaunchChained(GradWeightsKernel<T>, BlocksFor(a.weights.count), kThreads, 0, stream, L, weights, a.weights.count,
                  a.filter, packed);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("packed weights");
  }
  // With both gradients and packed weights the filter gradient's pass gives the input gradient
  // as well, where its groups' sums (a value per entry and group of the longest row) fit.
  const bool in_grad_from_groups =
      in_grad != nullptr && filter_grad != nullptr && packed != nullptr &&
      GroupsPerRow(a.weights.max_row) * a.n <= kMaxInGradGroupBytes / int64_t{sizeof(T)};
  if (in_grad == nullptr || in_grad_from_groups) {
    // not asked for, or made in FilterGradient
  } else if (packed != nullptr) {
    LaunchChained(InGradKernel<T, PackedWeights<T>>, BlocksFor(a.n), kThreads, 0, stream, L, e,
                  PackedWeights<T>{packed}, row_begin, out, a.n, device_report, in_grad);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("input gradient");
  } else if (a.n > 0) {
    LaunchChained(InGradKernel<T, UnpackedWeights<T>>, BlocksFor(a.n), kThreads, 0, stream, L, e,
                  UnpackedWeights<T>{weights, a.filter}, row_begin, out, a.n, device_report, in_grad);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("input gradient");
  }

  if (filter_grad != nullptr) {
    TF_SPARSECONV_RETURN_IF_ERROR(FilterGradient(stream, scratch, a, L, e, weights, row_begin, packed, out,
                                                 device_report, filter_grad, in_grad_from_groups ? in_grad : nullptr));
  }

  const int64_t out_segments = out_layout.num_segments();
  const int64_t bias_parts = PartsFor(n_out, out_segments);
  int64_t* out_begin = scratch->DeviceArray<int64_t>(out_segments + 1);
  T* bias_partial = scratch->DeviceArray<T>(out_segments * bias_parts);
  if (!out_begin || !bias_partial) return GpuStatus::OutOfMemory("bias gradient");
  LaunchChained(KeyBoundsKernel, BlocksFor(out_segments + 1), kThreads, 0, stream, out_keys, n_out, out_segments,
                L.spatial_size, device_report, out_begin);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("bias gradient");
  LaunchChained(BiasGradPartialKernel<T>, LoopBlocks(out_segments * bias_parts), kThreads, 0, stream, out_begin,
                out_segments, out_grad, bias_parts, device_report, bias_partial);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("bias gradient");
  LaunchChained(BiasGradKernel<T>, BlocksFor(a.cout), kThreads, 0, stream, bias_partial, L.batch, a.cout, bias_parts,
                bias_grad);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("bias gradient");
  if (!check) {
    scratch->HoldPinnedUntilQueuedWorkRuns();  // any pinned memory of this call, past its queued work
    return GpuStatus::Ok();
  }
  return ReadReport(stream, scratch, device_report, report);
}

__global__ void ExampleBeginKernel(const int64_t* keys, int64_t n, int64_t batch, int64_t per_example,
                                   int64_t* begin) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(b, batch + 1) { begin[b] = LowerBound(keys, n, b * per_example); }
}

GpuStatus ExampleBegins(Stream stream, Scratch* scratch, const int64_t* keys, int64_t n, int64_t batch,
                        int64_t per_example, int64_t* host_begin) {
  int64_t* begin = scratch->DeviceArray<int64_t>(batch + 1);
  int64_t* pinned = static_cast<int64_t*>(scratch->PinnedHost(sizeof(int64_t) * (batch + 1)));
  if (!begin || !pinned) return GpuStatus::OutOfMemory("example offsets");
  LaunchChained(ExampleBeginKernel, BlocksFor(batch + 1), kThreads, 0, stream, keys, n, batch, per_example, begin);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("example offsets");
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaMemcpyAsync(pinned, begin, sizeof(int64_t) * (batch + 1), cudaMemcpyDeviceToHost, stream),
      "example offsets");
  TF_SPARSECONV_RETURN_IF_ERROR(WaitForStream(stream));
  std::memcpy(host_begin, pinned, sizeof(int64_t) * (batch + 1));
  return GpuStatus::Ok();
}

GpuStatus CopyCounts(Stream stream, int64_t* to, const int64_t* from, int64_t count) {
  if (count == 0) return GpuStatus::Ok();
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaMemcpyAsync(to, from, sizeof(int64_t) * count, cudaMemcpyDeviceToDevice, stream), "counts copy");
  return GpuStatus::Ok();
}

template <typename T>
GpuStatus DirectConvCheckInputs(Stream stream, Scratch* scratch, const DirectConvGpuArgs<T>& a, const T* bias,
                                Report* report) {
  Report* device_report = nullptr;
  TF_SPARSECONV_RETURN_IF_ERROR(NewReport(stream, scratch, &device_report));
  TF_SPARSECONV_RETURN_IF_ERROR(QueueForwardChecks(stream, a, bias, device_report, false));
  return ReadReport(stream, scratch, device_report, report);
}

template GpuStatus DirectConvCheckInputs<float>(Stream, Scratch*, const DirectConvGpuArgs<float>&, const float*,
                                                Report*);
template GpuStatus DirectConvCheckInputs<double>(Stream, Scratch*, const DirectConvGpuArgs<double>&, const double*,
                                                 Report*);
template class DirectConvForwardGpu<float>;
template class DirectConvForwardGpu<double>;
template GpuStatus PadConvOutput<float>(Stream, const Report*, int64_t, int64_t, int64_t*, float*, int64_t,
                                        int64_t*, int64_t);
template GpuStatus PadConvOutput<double>(Stream, const Report*, int64_t, int64_t, int64_t*, double*, int64_t,
                                         int64_t*, int64_t);
template GpuStatus DirectConvBackpropGpu<float>(Stream, Scratch*, const DirectConvGpuArgs<float>&,
                                                const int64_t*, const float*, int64_t,
                                                DirectConvDataflow, float*, float*, float*, Report*);
template GpuStatus DirectConvBackpropGpu<double>(Stream, Scratch*,
                                                 const DirectConvGpuArgs<double>&,
                                                 const int64_t*, const double*, int64_t,
                                                 DirectConvDataflow, double*, double*, double*, Report*);

}  // namespace gpu
}  // namespace tf_sparseconv

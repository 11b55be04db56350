// The CPU functors of DirectSparseConv and DirectSparseConvBackprop, whose arithmetic runs
// on TensorFlow's intra-op thread pool, and the CPU registration of their OpKernels
// (direct_conv_kernels.h, which validate and allocate).
#define EIGEN_USE_THREADS

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "channel/direct_conv/check_status_kernel.h"
#include "channel/direct_conv/direct_conv.h"
#include "channel/direct_conv/direct_conv_checks.h"
#include "channel/direct_conv/direct_conv_kernels.h"
#include "common/divisor32.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_sparseconv {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

PresentWeights BuildPresentWeights(const bool* mask, const int64_t* kernel_size,
                                   int64_t cin, int64_t cout, const KeyLayout& layout) {
  const int d = layout.d;
  int64_t num_offsets = 1;
  for (int j = 0; j < d; ++j) num_offsets *= kernel_size[j];
  PresentWeights w;
  w.cin = cin;
  w.cout = cout;
  w.row_begin.assign(cout * cin + 1, 0);
  // Count, then fill, so each (oc, ic) row is contiguous and in kernel-offset order.
  for (int64_t off = 0; off < num_offsets; ++off)
    for (int64_t ic = 0; ic < cin; ++ic)
      for (int64_t oc = 0; oc < cout; ++oc)
        if (mask == nullptr || mask[(off * cin + ic) * cout + oc])
          ++w.row_begin[oc * cin + ic + 1];
  for (int64_t r = 0; r < cout * cin; ++r) w.row_begin[r + 1] += w.row_begin[r];
  w.items.resize(w.row_begin[cout * cin]);
  std::vector<int64_t> cursor(w.row_begin.begin(), w.row_begin.end() - 1);
  for (int64_t off = 0; off < num_offsets; ++off) {
    PresentWeight pw;
    pw.lin_delta = 0;
    int64_t rest = off;
    for (int j = d - 1; j >= 0; --j) {
      const int64_t kj = rest % kernel_size[j];
      rest /= kernel_size[j];
      const int64_t delta = kj - (kernel_size[j] - 1) / 2;
      pw.lin_delta += delta * layout.stride[j];
      pw.lo[j] = static_cast<int32_t>(std::max<int64_t>(0, delta));
      pw.hi[j] = static_cast<int32_t>(std::min<int64_t>(layout.extent[j],
                                                        layout.extent[j] + delta));
    }
    for (int64_t ic = 0; ic < cin; ++ic)
      for (int64_t oc = 0; oc < cout; ++oc) {
        const int64_t fi = (off * cin + ic) * cout + oc;
        if (mask != nullptr && !mask[fi]) continue;
        pw.filter_index = fi;
        w.items[cursor[oc * cin + ic]++] = pw;
      }
  }
  return w;
}

namespace {

inline bool Reaches(const int32_t* x, const PresentWeight& pw, int d) {
  for (int j = 0; j < d; ++j)
    if (x[j] < pw.lo[j] || x[j] >= pw.hi[j]) return false;
  return true;
}

// One sorted stream of contributions: the entries of input segment (b, ic), shifted by
// one present weight. Shifting preserves order, so each stream is sorted by output
// position, and the k-way merge of all streams visits output positions in order.
template <typename T>
struct ContributionStream {
  int64_t pos, end, base;  // entry cursor, end, key of lin 0 in this input segment
  const PresentWeight* pw;
  T w;
  int64_t out_lin;
};

template <typename T>
bool AdvanceToValid(const DirectConvArgs<T>& a, ContributionStream<T>* s) {
  const int d = a.in_layout.d;
  while (s->pos < s->end) {
    if (Reaches(a.coords + s->pos * d, *s->pw, d)) {
      s->out_lin = a.keys[s->pos] - s->base - s->pw->lin_delta;
      return true;
    }
    ++s->pos;
  }
  return false;
}

// Keeps at most k entries by score, ties to the smaller spatial index, in index order:
// nth_element on a copy of the scores finds the k-th largest score t; one pass in
// position order then keeps every entry above t and the first entries equal to t.
template <typename T>
void SelectTopK(SelectionMode mode, int64_t k, SegmentResult<T>* r) {
  const int64_t m = static_cast<int64_t>(r->lin.size());
  if (mode == SelectionMode::kNone || m <= k) return;
  const T* v = r->values.data();
  auto score = [&](int64_t i) { return mode == SelectionMode::kAbs ? std::abs(v[i]) : v[i]; };
  std::vector<T> scores(m);
  for (int64_t i = 0; i < m; ++i) scores[i] = score(i);
  std::nth_element(scores.begin(), scores.begin() + (k - 1), scores.end(), std::greater<T>());
  const T threshold = scores[k - 1];
  int64_t above = 0;
  for (int64_t i = 0; i < k; ++i) above += scores[i] > threshold;  // the k best hold all > t
  int64_t ties_left = k - above, kept = 0;
  for (int64_t i = 0; i < m; ++i) {
    const T si = score(i);
    if (si > threshold || (si == threshold && ties_left-- > 0)) {
      r->lin[kept] = r->lin[i];
      r->values[kept] = r->values[i];
      ++kept;
    }
  }
  r->lin.resize(kept);
  r->values.resize(kept);
}

template <typename T>
void FinishSegment(const DirectConvArgs<T>& a, int64_t oc, SegmentResult<T>* out);

// Moves segment u's kept entries into its slot of the staged output, if there is one.
template <typename T>
void Emit(const SegmentSink<T>* sink, int64_t u, SegmentResult<T>* r) {
  if (sink == nullptr) return;
  const int64_t at = sink->slot_begin[u];
  for (size_t j = 0; j < r->lin.size(); ++j) {
    sink->keys[at + j] = u * sink->spatial_size + r->lin[j];
    sink->values[at + j] = r->values[j];
  }
  r->kept = static_cast<int64_t>(r->lin.size());
  std::vector<int64_t>().swap(r->lin);
  std::vector<T>().swap(r->values);
}

// What the dense path needs beside the args: per input channel the kernel offsets with
// at least one present weight (filter_index = the [Cout] row (offset * Cin + ic) * Cout),
// the filter with pruned weights zeroed, and the mask as bytes.
template <typename T>
struct DenseTables {
  std::vector<std::vector<PresentWeight>> reaches;
  // Per reach, its present output channels when the row is mostly pruned (fewer than a
  // third present): then only those are visited, so pruning saves time here too.
  std::vector<std::vector<std::vector<int32_t>>> sparse_rows;
  // Per reach: 1 where all Cout weights of its row are present (no mask to apply).
  std::vector<std::vector<uint8_t>> full_rows;
  // Per reach: offset * Cout, its row in an [offsets, Cout] table of one input channel.
  std::vector<std::vector<int64_t>> offset_rows;
  // Per input channel, the box [inner_lo, inner_hi) of positions that every one of its
  // reaches reaches: an entry inside it skips the per-offset bound checks.
  std::vector<std::array<int32_t, kMaxSpatialDims>> inner_lo, inner_hi;
  std::vector<T> masked_filter;
  std::vector<uint8_t> mask;
  int64_t max_abs_delta = 0;  // largest |lin_delta| of any present offset
};

inline bool Inside(const int32_t* x, const int32_t* lo, const int32_t* hi, int d) {
  bool inside = true;
  for (int j = 0; j < d; ++j) inside &= (x[j] >= lo[j]) & (x[j] < hi[j]);
  return inside;
}

// row += v * w over a whole [Cout] row (its outputs are marked touched by the row's
// kRowFull flag). __restrict lets the compiler vectorise; a product then a sum (never
// fused), as in the merge path.
template <typename T>
inline void AddScaledRow(T* __restrict row, const T* __restrict w, T v, int64_t n) {
  for (int64_t oc = 0; oc < n; ++oc) row[oc] += v * w[oc];
}

// lanes += row * w, elementwise.
template <typename T>
inline void AddProducts(T* __restrict lanes, const T* __restrict row, const T* __restrict w, int64_t n) {
  for (int64_t oc = 0; oc < n; ++oc) lanes[oc] += row[oc] * w[oc];
}

// lanes += row * w and acc += v * row, elementwise (dL/dx's and dL/dw's terms of a row).
template <typename T>
inline void AddProductsAndScaled(T* __restrict lanes, T* __restrict acc, const T* __restrict row,
                                 const T* __restrict w, T v, int64_t n) {
  for (int64_t oc = 0; oc < n; ++oc) {
    lanes[oc] += row[oc] * w[oc];
    acc[oc] += v * row[oc];
  }
}

// The same over a partly pruned row: pruned weights add nothing (not v * 0, NaN for an
// infinite v) and do not mark the output touched. A blend, not a branch.
template <typename T>
inline void AddScaledMaskedRow(T* __restrict row, uint8_t* __restrict flags, const T* __restrict w,
                               const uint8_t* __restrict m, T v, int64_t n) {
  for (int64_t oc = 0; oc < n; ++oc) {
    row[oc] += m[oc] ? v * w[oc] : T(0);
    flags[oc] |= m[oc];
  }
}

// Calls fn(oc) for the output channels a reach's row must visit.
template <typename Fn>
inline void ForEachRowChannel(const std::vector<int32_t>& sparse_row, int64_t cout, Fn fn) {
  if (sparse_row.empty()) {
    for (int64_t oc = 0; oc < cout; ++oc) fn(oc);
  } else {
    for (const int32_t oc : sparse_row) fn(oc);
  }
}

template <typename T>
DenseTables<T> BuildDenseTables(const DirectConvArgs<T>& a) {
  const int64_t cin = a.in_layout.channels, cout = a.cout;
  DenseTables<T> t;
  t.reaches.resize(cin);
  t.masked_filter.assign(a.filter_size, T(0));
  t.mask.assign(a.filter_size, 0);
  std::vector<uint8_t> listed(a.filter_size / cout, 0);  // one flag per (offset, ic) row
  for (const PresentWeight& pw : a.weights->items) {
    t.masked_filter[pw.filter_index] = a.filter[pw.filter_index];
    t.mask[pw.filter_index] = 1;
    const int64_t row = pw.filter_index / cout;
    if (listed[row]) continue;
    listed[row] = 1;
    PresentWeight r = pw;
    r.filter_index = row * cout;
    t.reaches[row % cin].push_back(r);
    t.max_abs_delta = std::max(t.max_abs_delta, std::abs(pw.lin_delta));
  }
  t.sparse_rows.resize(cin);
  t.full_rows.resize(cin);
  t.offset_rows.resize(cin);
  t.inner_lo.resize(cin);
  t.inner_hi.resize(cin);
  for (int64_t ic = 0; ic < cin; ++ic) {
    auto& list = t.reaches[ic];  // kernel-offset order: the merge path's summation order
    std::sort(list.begin(), list.end(), [](const PresentWeight& x, const PresentWeight& y) {
      return x.filter_index < y.filter_index;
    });
    t.inner_lo[ic].fill(0);
    t.inner_hi[ic].fill(std::numeric_limits<int32_t>::max());
    for (const PresentWeight& r : list) {
      std::vector<int32_t> present;
      for (int64_t oc = 0; oc < cout; ++oc)
        if (t.mask[r.filter_index + oc]) present.push_back(static_cast<int32_t>(oc));
      t.full_rows[ic].push_back(static_cast<int64_t>(present.size()) == cout);
      t.offset_rows[ic].push_back(r.filter_index / (cin * cout) * cout);
      if (3 * static_cast<int64_t>(present.size()) >= cout) present.clear();  // dense row
      t.sparse_rows[ic].push_back(std::move(present));
      for (int j = 0; j < a.in_layout.d; ++j) {
        t.inner_lo[ic][j] = std::max(t.inner_lo[ic][j], r.lo[j]);
        t.inner_hi[ic][j] = std::min(t.inner_hi[ic][j], r.hi[j]);
      }
    }
  }
  return t;
}

// Output positions the dense path holds at once: the whole grid if its scratch fits
// kDenseSlabBytes, else slabs of that size but at least 8 * max|delta|, so that at most
// a quarter of the inputs near a slab's border are visited twice.
template <typename T>
int64_t DenseSlabCells(int64_t spatial_size, int64_t cout, int64_t max_abs_delta) {
  const int64_t cell_bytes = cout * (static_cast<int64_t>(sizeof(T)) + 1) + 1;
  const int64_t fitting = std::max<int64_t>(1, kDenseSlabBytes / cell_bytes);
  return std::min(spatial_size, std::max(fitting, 8 * max_abs_delta));
}

// Per-block scratch of the dense path, allocated on first use: position-major sums and
// touched flags [S, Cout], and per position a byte of RowState bits that skips untouched
// rows quickly and spares a row that only full rows reached its [Cout] flags.
enum RowState : uint8_t { kRowFull = 1, kRowPartial = 2 };

template <typename T>
struct DenseScratch {
  std::vector<T> sum;
  std::vector<uint8_t> touched;
  std::vector<uint8_t> row_touched;
};

// The dense path (gather-GEMM-scatter): one batch element, all output channels at once.
// Each (input entry, kernel offset) adds v * w[offset, ic, :] to one contiguous [Cout] row,
// a vectorisable multiply-add; pruned weights add nothing (not v * 0, NaN for an infinite
// v) and do not mark the row touched.
// For one output (y, oc) the additions come in (ic, offset) order, as in the merge path,
// so both give identical values.
template <typename T>
void ConvolveBatchElement(const DirectConvArgs<T>& a, const DenseTables<T>& t, int64_t b,
                          DenseScratch<T>* scratch, SegmentResult<T>* out) {
  const KeyLayout& L = a.in_layout;
  const int64_t S = L.spatial_size, cin = L.channels, cout = a.cout;
  const int d = L.d;
  const int64_t slab = DenseSlabCells<T>(S, cout, t.max_abs_delta);
  if (scratch->sum.empty()) {
    scratch->sum.assign(slab * cout, T(0));
    scratch->touched.assign(slab * cout, 0);
    scratch->row_touched.assign(slab + 8, 0);  // +8: word reads past the end
  }
  T* sum = scratch->sum.data();
  uint8_t* touched = scratch->touched.data();
  uint8_t* row_touched = scratch->row_touched.data();
  for (int64_t oc = 0; oc < cout; ++oc) {
    out[oc].lin.clear();
    out[oc].values.clear();
  }
  // Output positions [y0, y1) at a time; the inputs that reach them have lin in
  // [y0 - max|delta|, y1 + max|delta|), one contiguous key range per input segment.
  for (int64_t y0 = 0; y0 < S; y0 += slab) {
    const int64_t y1 = std::min(S, y0 + slab);
    for (int64_t ic = 0; ic < cin; ++ic) {
      const int64_t seg = b * cin + ic;
      const int64_t base = seg * S;
      const int64_t* first = a.keys + a.in_offsets[seg];
      const int64_t* last = a.keys + a.in_offsets[seg + 1];
      if (y0 > 0 || y1 < S) {
        first = std::lower_bound(first, last, base + y0 - t.max_abs_delta);
        last = std::lower_bound(first, last, base + y1 + t.max_abs_delta);
      }
      const PresentWeight* reaches = t.reaches[ic].data();
      const int64_t num_reaches = static_cast<int64_t>(t.reaches[ic].size());
      const std::vector<int32_t>* sparse_rows = t.sparse_rows[ic].data();
      const uint8_t* full_rows = t.full_rows[ic].data();
      const bool whole_grid = y0 == 0 && y1 == S;
      for (int64_t i = first - a.keys; i < last - a.keys; ++i) {
        const int32_t* x = a.coords + i * d;
        const T v = a.values[i];
        const int64_t lin = a.keys[i] - base;
        const bool inner = Inside(x, t.inner_lo[ic].data(), t.inner_hi[ic].data(), d);
        for (int64_t ri = 0; ri < num_reaches; ++ri) {
          const PresentWeight& r = reaches[ri];
          const int64_t y = lin - r.lin_delta;
          if (!inner && !Reaches(x, r, d)) continue;
          if (!whole_grid && (y < y0 || y >= y1)) continue;
          const T* w = t.masked_filter.data() + r.filter_index;
          T* row = sum + (y - y0) * cout;
          uint8_t* flags = touched + (y - y0) * cout;
          if (full_rows[ri]) {
            AddScaledRow(row, w, v, cout);
            row_touched[y - y0] |= kRowFull;
            continue;
          }
          if (sparse_rows[ri].empty()) {
            AddScaledMaskedRow(row, flags, w, t.mask.data() + r.filter_index, v, cout);
          } else {
            for (const int32_t oc : sparse_rows[ri]) {
              row[oc] += v * w[oc];
              flags[oc] = 1;
            }
          }
          row_touched[y - y0] |= kRowPartial;
        }
      }
    }
    for (int64_t row_index = 0; row_index < y1 - y0;) {
      uint64_t word;
      std::memcpy(&word, row_touched + row_index, 8);
      if (word == 0) {
        row_index += 8;
        continue;
      }
      const uint8_t state = row_touched[row_index];
      if (state) {
        T* row = sum + row_index * cout;
        uint8_t* flags = touched + row_index * cout;
        for (int64_t oc = 0; oc < cout; ++oc) {
          if ((state & kRowFull) || flags[oc]) {
            out[oc].lin.push_back(y0 + row_index);
            out[oc].values.push_back(row[oc]);
          }
          row[oc] = T(0);
        }
        if (state & kRowPartial) std::memset(flags, 0, cout);
        row_touched[row_index] = 0;
      }
      ++row_index;
    }
  }
  for (int64_t oc = 0; oc < cout; ++oc) FinishSegment(a, oc, &out[oc]);
}

// The merge path: one (b, oc) segment, k-way merging its sorted contribution streams.
template <typename T>
void ConvolveSegment(const DirectConvArgs<T>& a, int64_t b, int64_t oc, SegmentResult<T>* out) {
  const KeyLayout& L = a.in_layout;
  const int64_t cin = L.channels;
  std::vector<ContributionStream<T>> streams;
  int64_t contributions = 0;
  for (int64_t ic = 0; ic < cin; ++ic) {
    const int64_t seg = b * cin + ic;
    const int64_t s0 = a.in_offsets[seg], s1 = a.in_offsets[seg + 1];
    if (s0 == s1) continue;
    for (const PresentWeight* pw = a.weights->begin(oc, ic); pw != a.weights->end(oc, ic);
         ++pw) {
      streams.push_back({s0, s1, seg * L.spatial_size, pw, a.filter[pw->filter_index], 0});
      contributions += s1 - s0;
    }
  }
  out->lin.clear();
  out->values.clear();
  if (streams.empty()) {
    out->touched = 0;
    out->positive = 0;
    out->nan = 0;
    return;
  }
  {
    std::vector<int32_t> heap;  // stream indices, min-heap on (out_lin, stream index)
    heap.reserve(streams.size());
    auto later = [&](int32_t x, int32_t y) {
      const int64_t lx = streams[x].out_lin, ly = streams[y].out_lin;
      return lx > ly || (lx == ly && x > y);
    };
    for (int32_t si = 0; si < static_cast<int32_t>(streams.size()); ++si)
      if (AdvanceToValid(a, &streams[si])) heap.push_back(si);
    std::make_heap(heap.begin(), heap.end(), later);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), later);
      ContributionStream<T>& s = streams[heap.back()];
      const T c = a.values[s.pos] * s.w;
      if (!out->lin.empty() && out->lin.back() == s.out_lin) {
        out->values.back() += c;
      } else {
        out->lin.push_back(s.out_lin);
        out->values.push_back(c);
      }
      ++s.pos;
      if (AdvanceToValid(a, &s)) {
        std::push_heap(heap.begin(), heap.end(), later);
      } else {
        heap.pop_back();
      }
    }
  }
  FinishSegment(a, oc, out);
}

// Bias on the touched entries, the positive count, k-selection (Alg. 1 lines 10-12).
template <typename T>
void FinishSegment(const DirectConvArgs<T>& a, int64_t oc, SegmentResult<T>* out) {
  out->touched = static_cast<int64_t>(out->lin.size());
  const T bias = a.bias[oc];
  out->positive = 0;
  out->nan = 0;
  for (T& v : out->values) {
    v += bias;
    out->positive += v > T(0);
    out->nan += std::isnan(v);
  }
  // The fused ReLU: of the kept entries, those > 0, in order. After a signed selection that
  // is the k largest of the entries > 0 (every entry > 0 ranks above every other), so there
  // the ReLU goes first and the selection runs over the positive entries only (the same
  // entries and order: the k-th largest, and the first of its ties, are the same).
  const bool relu_first = a.relu && a.selection != SelectionMode::kAbs;
  if (!relu_first) SelectTopK(a.selection, a.k, out);
  if (a.relu) {
    size_t kept = 0;
    for (size_t j = 0; j < out->values.size(); ++j) {
      if (!(out->values[j] > T(0))) continue;
      out->lin[kept] = out->lin[j];
      out->values[kept++] = out->values[j];
    }
    out->lin.resize(kept);
    out->values.resize(kept);
  }
  if (relu_first) SelectTopK(a.selection, a.k, out);
  // Results of all segments live until the output is assembled: release the touched
  // set's excess so that they hold at most k entries each (the memory bound).
  out->lin.shrink_to_fit();
  out->values.shrink_to_fit();
}

// Visits every (input entry, kept output entry) pair linked by one present weight, in
// input order; out_keys of the segment are sorted, so the search pointer only moves on.
template <typename T, typename Fn>
void ForEachLink(const DirectConvBackpropArgs<T>& g, int64_t b, int64_t ic, int64_t oc,
                 const PresentWeight& pw, Fn fn) {
  const DirectConvArgs<T>& a = g.forward;
  const KeyLayout& L = a.in_layout;
  const int d = L.d;
  const int64_t in_seg = b * L.channels + ic;
  const int64_t out_seg = b * a.cout + oc;
  const int64_t o1 = g.out_offsets[out_seg + 1];
  int64_t p = g.out_offsets[out_seg];
  if (p == o1) return;
  const int64_t shift = (out_seg - in_seg) * L.spatial_size - pw.lin_delta;
  for (int64_t i = a.in_offsets[in_seg]; i < a.in_offsets[in_seg + 1]; ++i) {
    if (!Reaches(a.coords + i * d, pw, d)) continue;
    const int64_t target = a.keys[i] + shift;
    if (g.out_keys[p] < target) {
      p = std::lower_bound(g.out_keys + p, g.out_keys + o1, target) - g.out_keys;
      if (p == o1) return;
    }
    if (g.out_keys[p] == target) fn(i, p);
  }
}

}  // namespace

template <typename T>
struct DirectConvForwardFunctor<CPUDevice, T> {
  void operator()(const CPUDevice& device, const DirectConvArgs<T>& args,
                  std::vector<SegmentResult<T>>* results, const SegmentSink<T>* sink) {
    const KeyLayout& L = args.in_layout;
    const int64_t batch = L.batch, cin = L.channels, cout = args.cout, S = L.spatial_size;
    const int64_t units = batch * cout;
    results->resize(units);
    // Contributions (entry, present weight) and (entry, offset) row updates, for the cost model.
    double contributions = 0, row_updates = 0;
    const DenseTables<T> tables = args.dataflow == DirectConvDataflow::kSort ? DenseTables<T>()
                                                                            : BuildDenseTables(args);
    for (int64_t ic = 0; ic < cin; ++ic) {
      int64_t present = 0;
      for (int64_t oc = 0; oc < cout; ++oc) present += args.weights->end(oc, ic) - args.weights->begin(oc, ic);
      int64_t entries = 0;
      for (int64_t b = 0; b < batch; ++b) entries += args.in_offsets[b * cin + ic + 1] - args.in_offsets[b * cin + ic];
      contributions += static_cast<double>(entries) * present;
      if (!tables.reaches.empty()) row_updates += static_cast<double>(entries) * tables.reaches[ic].size();
    }
    bool dense = args.dataflow == DirectConvDataflow::kDense;
    if (args.dataflow == DirectConvDataflow::kAuto) {
      // Dense: a word test per 8 positions, vectorised [Cout] row updates, and each
      // touched row's extraction; merge: heap steps of log2(#streams) per contribution.
      const double streams = std::max(1.0, static_cast<double>(args.weights->count()) / cout);
      // A slab scratch beyond the per-core cache turns each row update into a memory
      // miss (measured at 256^3: ~16x a cached update); the merge path streams.
      const int64_t slab = DenseSlabCells<T>(S, cout, tables.max_abs_delta);
      const double scratch_bytes = slab * (cout * (sizeof(T) + 1.0) + 1.0);
      const double miss = scratch_bytes > kCacheFriendlyScratchBytes ? 16.0 : 1.0;
      const double dense_cost = batch * S / 8.0 + row_updates * (2.0 + cout / 4.0) * miss +
                                std::min(static_cast<double>(batch * S), row_updates) * cout;
      const double merge_cost = contributions * (4.0 + 2.0 * std::log2(streams + 1.0));
      dense = dense_cost < merge_cost;
    }
    if (dense) {
      // Scratch buffers (up to kDenseSlabBytes each) pass from one block of examples to the
      // next instead of being allocated, page-faulted and zeroed per block: at most one
      // per thread exists at a time.
      std::mutex pool_mutex;
      std::vector<std::unique_ptr<DenseScratch<T>>> pool;
      device.parallelFor(batch, Eigen::TensorOpCost(0, 0, 10.0 * (1.0 + row_updates * cout / batch)),
                         [&](Eigen::Index first, Eigen::Index last) {
                           std::unique_ptr<DenseScratch<T>> scratch;
                           {
                             std::lock_guard<std::mutex> lock(pool_mutex);
                             if (!pool.empty()) {
                               scratch = std::move(pool.back());
                               pool.pop_back();
                             }
                           }
                           if (!scratch) scratch = std::make_unique<DenseScratch<T>>();
                           for (Eigen::Index b = first; b < last; ++b) {
                             ConvolveBatchElement(args, tables, b, scratch.get(), results->data() + b * cout);
                             for (int64_t oc = 0; oc < cout; ++oc)
                               Emit(sink, b * cout + oc, &(*results)[b * cout + oc]);
                           }
                           std::lock_guard<std::mutex> lock(pool_mutex);
                           pool.push_back(std::move(scratch));
                         });
      return;
    }
    device.parallelFor(units, Eigen::TensorOpCost(0, 0, 10.0 * (1.0 + contributions / units)),
                       [&](Eigen::Index first, Eigen::Index last) {
                         for (Eigen::Index u = first; u < last; ++u) {
                           ConvolveSegment(args, u / cout, u % cout, &(*results)[u]);
                           Emit(sink, u, &(*results)[u]);
                         }
                       });
  }
};

namespace {

// Backward through the merge path's layout: for every present weight, walk the input
// segment and find its outputs in the sorted out_keys (a forward-only search). A null
// in_grad or filter_grad is not computed.
template <typename T>
void SearchBackprop(const CPUDevice& device, const DirectConvBackpropArgs<T>& g, T* in_grad,
                    T* filter_grad, double links) {
  const DirectConvArgs<T>& a = g.forward;
  const int64_t batch = a.in_layout.batch, cin = a.in_layout.channels, cout = a.cout;
  const PresentWeights& W = *a.weights;
  const double work = 10.0 * (1.0 + links / std::max<int64_t>(1, cin * cout));
  // dL/dx: each (b, ic) segment is owned by one thread, so no atomics are needed and the
  // summation order is fixed: the row of ic's weights (oc, then kernel offset) in groups of
  // kInGradGroup, each group's terms summed per entry, then the groups' sums in order (the
  // GPU's order, so the same bits): deterministic.
  if (in_grad != nullptr) {
    device.parallelFor(batch * cin, Eigen::TensorOpCost(0, 0, work * cout / batch),
                       [&](Eigen::Index first, Eigen::Index last) {
                         std::vector<T> group_sum;  // per entry of the segment
                         for (Eigen::Index u = first; u < last; ++u) {
                           const int64_t b = u / cin, ic = u % cin;
                           const int64_t begin = a.in_offsets[u], end = a.in_offsets[u + 1];
                           group_sum.assign(end - begin, T(0));
                           int in_group = 0;
                           const auto add_group = [&] {
                             for (int64_t i = begin; i < end; ++i) {
                               in_grad[i] += group_sum[i - begin];
                               group_sum[i - begin] = T(0);
                             }
                             in_group = 0;
                           };
                           for (int64_t oc = 0; oc < cout; ++oc)
                             for (const PresentWeight* pw = W.begin(oc, ic); pw != W.end(oc, ic); ++pw) {
                               const T w = a.filter[pw->filter_index];
                               ForEachLink(g, b, ic, oc, *pw, [&](int64_t i, int64_t p) {
                                 group_sum[i - begin] += g.out_grad[p] * w;
                               });
                               if (++in_group == kInGradGroup) add_group();
                             }
                           if (in_group > 0) add_group();
                         }
                       });
  }
  // dL/dw: only present weights get a gradient (Eq. 3); one thread per (ic, oc).
  if (filter_grad != nullptr) {
    device.parallelFor(cin * cout, Eigen::TensorOpCost(0, 0, work * batch),
                       [&](Eigen::Index first, Eigen::Index last) {
                         for (Eigen::Index u = first; u < last; ++u) {
                           const int64_t oc = u / cin, ic = u % cin;
                           for (const PresentWeight* pw = W.begin(oc, ic); pw != W.end(oc, ic); ++pw) {
                             T acc = T(0);
                             for (int64_t b = 0; b < batch; ++b)
                               ForEachLink(g, b, ic, oc, *pw, [&](int64_t i, int64_t p) {
                                 acc += g.out_grad[p] * a.values[i];
                               });
                             filter_grad[pw->filter_index] = acc;
                           }
                         }
                       });
  }
}

// Backward through the dense path's layout: one example's dL/dy scattered into a
// position-major [S, Cout] buffer (an output absent after k-selection holds 0: no gradient,
// Eq. 3), then per (entry, offset) a [Cout] dot product for dL/dx and a [Cout] update for
// dL/dw.
template <typename T>
void DenseBackprop(const CPUDevice& device, const DirectConvBackpropArgs<T>& g, T* in_grad,
                   T* filter_grad) {
  const DirectConvArgs<T>& a = g.forward;
  const KeyLayout& L = a.in_layout;
  const int64_t batch = L.batch, cin = L.channels, cout = a.cout, S = L.spatial_size;
  const int d = L.d;
  const DenseTables<T> t = BuildDenseTables(a);
  const double per_entry = 1.0 + 2.0 * cout * (t.masked_filter.size() / std::max<int64_t>(1, cin * cout));
  // One pass over the entries gives both gradients. Units are batch chunks; a unit takes
  // its examples one at a time, scatters the example's dL/dy into a position-major [S, Cout]
  // buffer, then visits its entries of every input channel. Each entry's dL/dx is its own;
  // the dL/dw partial sums of (chunk, ic) are added in chunk order below, so the result
  // does not depend on the thread count. Pruned weights get none (Eq. 3).
  const int64_t chunks = std::min<int64_t>(batch, 16);
  const int64_t offsets = a.filter_size / (cin * cout);
  const bool want_in = in_grad != nullptr, want_filter = filter_grad != nullptr;
  const int64_t part_size = offsets * cout;
  std::vector<T> partial(want_filter ? chunks * cin * part_size : 0, T(0));
  device.parallelFor(chunks, Eigen::TensorOpCost(0, 0, 2.0 * per_entry * (1.0 + a.n / chunks)),
                     [&](Eigen::Index first, Eigen::Index last) {
                       // dL/dx of an entry: one partial sum per output channel (over the
                       // reaches, in offset order), added in channel order at the end:
                       // cout independent sums instead of one chain, the same on every run.
                       std::vector<T> lanes(cout);
                       std::vector<T> grad(S * cout, T(0));  // an absent output's dL/dy is 0
                       T* G = grad.data();
                       for (Eigen::Index chunk = first; chunk < last; ++chunk) {
                         for (int64_t b = chunk * batch / chunks; b < (chunk + 1) * batch / chunks; ++b) {
                           const int64_t p0 = g.out_offsets[b * cout], p1 = g.out_offsets[(b + 1) * cout];
                           for (int64_t p = p0; p < p1; ++p)
                             G[(g.out_keys[p] % S) * cout + (g.out_keys[p] / S) % cout] = g.out_grad[p];
                           for (int64_t ic = 0; ic < cin; ++ic) {
                             T* part = want_filter ? partial.data() + (chunk * cin + ic) * part_size : nullptr;
                             const PresentWeight* reaches = t.reaches[ic].data();
                             const int64_t num_reaches = static_cast<int64_t>(t.reaches[ic].size());
                             const uint8_t* full_rows = t.full_rows[ic].data();
                             const int64_t seg = b * cin + ic;
                             for (int64_t i = a.in_offsets[seg]; i < a.in_offsets[seg + 1]; ++i) {
                               const int32_t* x = a.coords + i * d;
                               const int64_t lin = a.keys[i] - seg * S;
                               const T v = a.values[i];
                               const bool inner = Inside(x, t.inner_lo[ic].data(), t.inner_hi[ic].data(), d);
                               if (want_in) std::fill(lanes.begin(), lanes.end(), T(0));
                               for (int64_t ri = 0; ri < num_reaches; ++ri) {
                                 const PresentWeight& r = reaches[ri];
                                 if (!inner && !Reaches(x, r, d)) continue;
                                 const T* row = G + (lin - r.lin_delta) * cout;
                                 const T* w = t.masked_filter.data() + r.filter_index;
                                 T* acc = want_filter ? part + t.offset_rows[ic][ri] : nullptr;
                                 if (full_rows[ri]) {
                                   if (!want_in) {
                                     AddScaledRow(acc, row, v, cout);
                                   } else if (!want_filter) {
                                     AddProducts(lanes.data(), row, w, cout);
                                   } else {
                                     AddProductsAndScaled(lanes.data(), acc, row, w, v, cout);
                                   }
                                   continue;
                                 }
                                 // Pruned weights add nothing to dL/dx (a non-finite gradient
                                 // times 0 is NaN); their dL/dw sums are dropped below.
                                 const uint8_t* m = t.mask.data() + r.filter_index;
                                 ForEachRowChannel(t.sparse_rows[ic][ri], cout, [&](int64_t oc) {
                                   lanes[oc] += m[oc] ? row[oc] * w[oc] : T(0);
                                   if (want_filter) acc[oc] += v * row[oc];
                                 });
                               }
                               if (!want_in) continue;
                               T sum = T(0);
                               for (int64_t oc = 0; oc < cout; ++oc) sum += lanes[oc];
                               in_grad[i] = sum;
                             }
                           }
                           for (int64_t p = p0; p < p1; ++p)
                             G[(g.out_keys[p] % S) * cout + (g.out_keys[p] / S) % cout] = T(0);
                         }
                       }
                     });
  if (!want_filter) return;
  for (int64_t ic = 0; ic < cin; ++ic)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const T* part = partial.data() + (chunk * cin + ic) * part_size;
      for (int64_t off = 0; off < offsets; ++off)
        for (int64_t oc = 0; oc < cout; ++oc) {
          const int64_t fi = (off * cin + ic) * cout + oc;
          if (t.mask[fi]) filter_grad[fi] += part[off * cout + oc];
        }
    }
}

}  // namespace

template <typename T>
struct DirectConvBackpropFunctor<CPUDevice, T> {
  void operator()(const CPUDevice& device, const DirectConvBackpropArgs<T>& g, T* in_grad,
                  T* filter_grad, T* bias_grad) {
    const DirectConvArgs<T>& a = g.forward;
    const KeyLayout& L = a.in_layout;
    const int64_t batch = L.batch, cin = L.channels, cout = a.cout, S = L.spatial_size;
    const PresentWeights& W = *a.weights;
    // Lookups: every (input entry, present weight) pair of the same input channel.
    double links = 0;
    for (int64_t ic = 0; ic < cin; ++ic) {
      int64_t weights_of_ic = 0;
      for (int64_t oc = 0; oc < cout; ++oc) weights_of_ic += W.end(oc, ic) - W.begin(oc, ic);
      int64_t entries = 0;
      for (int64_t b = 0; b < batch; ++b)
        entries += a.in_offsets[b * cin + ic + 1] - a.in_offsets[b * cin + ic];
      links += static_cast<double>(entries) * weights_of_ic;
    }
    const int64_t grad_cells = batch * S * cout;
    bool dense = g.dataflow == DirectConvDataflow::kDense;
    if (g.dataflow == DirectConvDataflow::kAuto) {
      // A search costs ~log2 of the segment size; the buffer costs its zero-fill.
      const double search = std::log2(2.0 + static_cast<double>(g.n_out) / std::max<int64_t>(1, batch * cout));
      dense = grad_cells * static_cast<int64_t>(sizeof(T)) <= kMaxDenseGradientBytes &&
              grad_cells / 4.0 < links * search;
    }
    if (in_grad != nullptr) std::fill(in_grad, in_grad + a.n, T(0));
    if (filter_grad != nullptr) std::fill(filter_grad, filter_grad + a.filter_size, T(0));
    if (in_grad == nullptr && filter_grad == nullptr) {
      // only the bias gradient is asked for
    } else if (dense) {
      DenseBackprop(device, g, in_grad, filter_grad);
    } else {
      SearchBackprop(device, g, in_grad, filter_grad, links);
    }
    for (int64_t oc = 0; oc < cout; ++oc) {
      T acc = T(0);
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t seg = b * cout + oc;
        for (int64_t p = g.out_offsets[seg]; p < g.out_offsets[seg + 1]; ++p)
          acc += g.out_grad[p];
      }
      bias_grad[oc] = acc;
    }
  }
};

namespace {

// The host tables of the input: decoded coordinates, segment offsets and present weights.
// The keys must have been validated.
template <typename T>
struct HostTables {
  std::vector<int32_t> coords;
  std::vector<int64_t> in_offsets;
  PresentWeights weights;

  void Build(const CPUDevice& device, const ConvTensors<T>& in) {
    const KeyLayout& L = in.layout;
    coords.resize(in.n * L.d);
    if (L.spatial_size <= kMaxDivisor32) {
      // Keys are sorted, so a chunk divides only where an entry starts another segment,
      // and the spatial parts decode by multiplications (Divisor32) instead of 2d 64-bit
      // divisions.
      const SpatialDivisors divide(L);
      const int64_t S = L.spatial_size;
      device.parallelFor(in.n, Eigen::TensorOpCost(8, 4 * L.d, 4.0 * (2 * L.d + 1)),
                         [&](Eigen::Index first, Eigen::Index last) {
                           int64_t base = first < last ? in.keys[first] / S * S : 0;
                           for (Eigen::Index i = first; i < last; ++i) {
                             const int64_t key = in.keys[i];
                             if (key - base >= S) base = key - key % S;  // the next segment
                             const uint32_t lin = static_cast<uint32_t>(key - base);
                             for (int j = 0; j < L.d; ++j)
                               coords[i * L.d + j] = static_cast<int32_t>(divide.Coord(lin, j));
                           }
                         });
    } else {
      // 2d + 1 integer divisions per entry: worth the pool at a few hundred thousand entries.
      device.parallelFor(in.n, Eigen::TensorOpCost(8, 4 * L.d, 20.0 * (2 * L.d + 1)),
                         [&](Eigen::Index first, Eigen::Index last) {
                           for (Eigen::Index i = first; i < last; ++i)
                             DecodeSpatial(L.spatial_of(in.keys[i]), L, &coords[i * L.d]);
                         });
    }
    SegmentOffsets(in.keys, in.n, L, &in_offsets);
    weights = BuildPresentWeights(in.mask, in.shapes.kernel_size, L.channels, in.shapes.cout, L);
  }

  DirectConvArgs<T> Args(const ConvTensors<T>& in) const {
    DirectConvArgs<T> a;
    in.CopyTo(&a);
    a.coords = coords.data();
    a.in_offsets = in_offsets.data();
    a.weights = &weights;
    return a;
  }
};

// The data checks of inputs 0-4, on the host.
template <typename T>
absl::Status CheckConvData(const ConvTensors<T>& in) {
  TF_RETURN_IF_ERROR(ValidateKeys(in.keys, in.n, in.layout, "input"));
  TF_RETURN_IF_ERROR(RejectNaN(in.values, in.n, "input values"));
  return RejectNaN(in.filter, in.filter_size, "filter");
}

}  // namespace

template <typename T>
class DirectSparseConvFunctor<CPUDevice, T> {
 public:
  using Cache = NoConvCache;

  DirectSparseConvFunctor(OpKernelContext* ctx, const ConvAttrs& attrs, Cache* /*cache*/)
      : ctx_(ctx), device_(ctx->eigen_device<CPUDevice>()), attrs_(attrs) {}

  absl::Status Prepare(const ConvTensors<T>& in, const T* bias) {
    if (attrs_.dataflow == DirectConvDataflow::kBitmap || attrs_.dataflow == DirectConvDataflow::kAtomic) {
      return errors::InvalidArgument("DirectSparseConv: dataflow '",
                                     attrs_.dataflow == DirectConvDataflow::kBitmap ? "bitmap" : "atomic",
                                     "' runs on the GPU only; on the CPU use 'auto', 'sort' or 'dense'");
    }
    TF_RETURN_IF_ERROR(CheckConvData(in));
    TF_RETURN_IF_ERROR(RejectNaN(bias, in.shapes.cout, "bias"));
    tables_.Build(device_, in);
    a_ = tables_.Args(in);
    a_.bias = bias;
    a_.selection = attrs_.selection;
    a_.dataflow = attrs_.dataflow;
    a_.k = attrs_.EffectiveK(in.layout.spatial_size);
    a_.relu = attrs_.relu;
    return absl::OkStatus();
  }

  absl::Status Count(int64_t* tc, int64_t* pc, int64_t* count) {
    const KeyLayout& L = a_.in_layout;
    const int64_t cout = a_.cout;
    const int64_t units = L.batch * cout;
    if (a_.selection != SelectionMode::kNone) {
      // Each segment keeps at most min(k, its contributions) entries, known before it
      // runs: they go straight into that slot of a staged output, compacted afterwards,
      // so the kept entries exist once (the output is at most B * Cout * k entries).
      std::vector<int64_t> slot(units + 1, 0);
      for (int64_t u = 0; u < units; ++u) {
        const int64_t b = u / cout, oc = u % cout;
        int64_t contributions = 0;
        for (int64_t ic = 0; ic < L.channels; ++ic)
          contributions += (tables_.in_offsets[b * L.channels + ic + 1] - tables_.in_offsets[b * L.channels + ic]) *
                           (tables_.weights.end(oc, ic) - tables_.weights.begin(oc, ic));
        slot[u + 1] = slot[u] + std::min(a_.k, contributions);
      }
      TF_RETURN_IF_ERROR(ctx_->allocate_temp(::tensorflow::DT_INT64, TensorShape({slot[units]}), &staged_keys_));
      TF_RETURN_IF_ERROR(ctx_->allocate_temp(::tensorflow::DataTypeToEnum<T>::v(), TensorShape({slot[units]}),
                                             &staged_values_));
      SegmentSink<T> sink{staged_keys_.flat<int64_t>().data(), staged_values_.flat<T>().data(), slot.data(),
                          L.spatial_size};
      DirectConvForwardFunctor<CPUDevice, T>()(device_, a_, &results_, &sink);
      int64_t n = 0;
      for (int64_t u = 0; u < units; ++u) {  // slots only move forward: memmove in order
        std::memmove(sink.keys + n, sink.keys + slot[u], results_[u].kept * sizeof(int64_t));
        std::memmove(sink.values + n, sink.values + slot[u], results_[u].kept * sizeof(T));
        n += results_[u].kept;
      }
      *count = n;
    } else {
      DirectConvForwardFunctor<CPUDevice, T>()(device_, a_, &results_, nullptr);
      offset_.assign(units + 1, 0);
      for (int64_t u = 0; u < units; ++u) offset_[u + 1] = offset_[u] + results_[u].lin.size();
      *count = offset_[units];
    }
    for (int64_t u = 0; u < units; ++u) {
      tc[u] = results_[u].touched;
      pc[u] = results_[u].positive;
      if (a_.relu && results_[u].nan > 0) return FusedReluNaNError();
    }
    return absl::OkStatus();
  }

  static constexpr bool kPaddedOutputFirst = false;  // allocated after Count: see the op
  void GivePaddedOutput(int64_t*, T*, int64_t, bool) {}

  bool Staged(int64_t count, Tensor* out_keys, Tensor* out_values) const {
    if (a_.selection == SelectionMode::kNone) return false;
    *out_keys = staged_keys_.Slice(0, count);
    *out_values = staged_values_.Slice(0, count);
    return true;
  }

  absl::Status WritePadded(int64_t count, int64_t capacity, int64_t* ok, T* ov) {
    if (a_.selection != SelectionMode::kNone) {  // the kept entries are staged (Count)
      std::copy_n(staged_keys_.flat<int64_t>().data(), count, ok);
      std::copy_n(staged_values_.flat<T>().data(), count, ov);
    } else {
      TF_RETURN_IF_ERROR(Write(ok, ov));
    }
    std::fill(ok + count, ok + capacity, kPaddingKey);
    std::fill(ov + count, ov + capacity, T(0));
    return absl::OkStatus();
  }

  // The CPU checks on the host (Prepare, Count): a call that returns has passed them all.
  absl::Status WriteStatus(int64_t* status) {
    std::fill_n(status, kConvStatusSize, int64_t{-1});
    return absl::OkStatus();
  }

  absl::Status Write(int64_t* ok, T* ov) {
    const int64_t units = a_.in_layout.batch * a_.cout;
    const int64_t S = a_.in_layout.spatial_size;
    device_.parallelFor(units, Eigen::TensorOpCost(0, 0, 1.0 + offset_[units] / (units + 1.0)),
                        [&](Eigen::Index first, Eigen::Index last) {
                          for (Eigen::Index u = first; u < last; ++u) {
                            const SegmentResult<T>& r = results_[u];
                            for (size_t j = 0; j < r.lin.size(); ++j) {
                              ok[offset_[u] + j] = u * S + r.lin[j];
                              ov[offset_[u] + j] = r.values[j];
                            }
                          }
                        });
    return absl::OkStatus();
  }

 private:
  OpKernelContext* const ctx_;
  const CPUDevice& device_;
  const ConvAttrs attrs_;
  HostTables<T> tables_;
  DirectConvArgs<T> a_;
  std::vector<SegmentResult<T>> results_;
  std::vector<int64_t> offset_;  // segment u's first output entry (no selection)
  Tensor staged_keys_, staged_values_;
};

template <typename T>
class DirectSparseConvBackpropFunctor<CPUDevice, T> {
 public:
  using Cache = NoConvCache;

  // inputs_checked: unused; the CPU checks in any case (its checks cost no wait)
  DirectSparseConvBackpropFunctor(OpKernelContext* ctx, DirectConvDataflow dataflow, bool /*inputs_checked*/,
                                  Cache* /*cache*/)
      : device_(ctx->eigen_device<CPUDevice>()), dataflow_(dataflow) {}

  absl::Status Prepare(const ConvTensors<T>& in, const int64_t* out_keys, const T* out_grad, int64_t n_out) {
    TF_RETURN_IF_ERROR(CheckConvData(in));
    const KeyLayout out_layout = in.layout.WithChannels(in.shapes.cout);
    TF_RETURN_IF_ERROR(ValidateKeys(out_keys, n_out, out_layout, "output"));
    tables_.Build(device_, in);
    SegmentOffsets(out_keys, n_out, out_layout, &out_offsets_);
    g_.forward = tables_.Args(in);
    g_.out_keys = out_keys;
    g_.out_grad = out_grad;
    g_.n_out = n_out;
    g_.out_offsets = out_offsets_.data();
    // the bitmap and atomic forwards' output keys are sorted as the sort's: searched the same way
    g_.dataflow = dataflow_ == DirectConvDataflow::kBitmap || dataflow_ == DirectConvDataflow::kAtomic
                      ? DirectConvDataflow::kSort
                      : dataflow_;
    return absl::OkStatus();
  }

  absl::Status Run(T* in_grad, T* filter_grad, T* bias_grad) {
    DirectConvBackpropFunctor<CPUDevice, T>()(device_, g_, in_grad, filter_grad, bias_grad);
    return absl::OkStatus();
  }

 private:
  const CPUDevice& device_;
  const DirectConvDataflow dataflow_;
  HostTables<T> tables_;
  std::vector<int64_t> out_offsets_;
  DirectConvBackpropArgs<T> g_;
};

#define REGISTER_CPU(T)                                                                              \
  REGISTER_KERNEL_BUILDER(                                                                           \
      Name("TfSparseconv>DirectSparseConv").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      DirectSparseConvOp<CPUDevice, T>);                                                             \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>DirectSparseConvBackprop")                              \
                              .Device(::tensorflow::DEVICE_CPU)                                      \
                              .TypeConstraint<T>("T"),                                               \
                          DirectSparseConvBackpropOp<CPUDevice, T>);
REGISTER_CPU(float);
REGISTER_CPU(double);
#undef REGISTER_CPU
REGISTER_KERNEL_BUILDER(Name("TfSparseconv>DirectSparseConvCheckStatus").Device(::tensorflow::DEVICE_CPU),
                        HostStatusesOp);
REGISTER_KERNEL_BUILDER(Name("TfSparseconv>DirectSparseConvReportStatus").Device(::tensorflow::DEVICE_CPU),
                        HostStatusesOp);

}  // namespace tf_sparseconv

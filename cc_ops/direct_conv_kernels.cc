// CPU kernels of DirectSparseConv and DirectSparseConvBackprop: the OpKernels validate
// and allocate; the functors do the arithmetic on TensorFlow's intra-op thread pool.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "direct_conv.h"
#include "direct_conv_checks.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_sparseconv {

using CPUDevice = Eigen::ThreadPoolDevice;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
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

// Keeps at most k entries by score, ties to the smaller spatial index, in index order.
template <typename T>
void SelectTopK(SelectionMode mode, int64_t k, SegmentResult<T>* r) {
  const int64_t m = static_cast<int64_t>(r->lin.size());
  if (mode == SelectionMode::kNone || m <= k) return;
  const T* v = r->values.data();
  auto score = [&](int64_t i) { return mode == SelectionMode::kAbs ? std::abs(v[i]) : v[i]; };
  std::vector<int64_t> order(m);
  for (int64_t i = 0; i < m; ++i) order[i] = i;
  std::nth_element(order.begin(), order.begin() + k, order.end(),
                   [&](int64_t a, int64_t b) {
                     const T sa = score(a), sb = score(b);
                     return sa > sb || (sa == sb && a < b);
                   });
  order.resize(k);
  std::sort(order.begin(), order.end());
  for (int64_t j = 0; j < k; ++j) {
    r->lin[j] = r->lin[order[j]];
    r->values[j] = r->values[order[j]];
  }
  r->lin.resize(k);
  r->values.resize(k);
}

// Per-thread scratch of the dense accumulator, allocated on first use.
template <typename T>
struct DenseScratch {
  std::vector<T> sum;
  std::vector<uint8_t> touched;
};

template <typename T>
void ConvolveSegment(const DirectConvArgs<T>& a, int64_t b, int64_t oc,
                     DenseScratch<T>* scratch, SegmentResult<T>* out) {
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
    return;
  }
  bool use_dense = a.accumulator == Accumulator::kDense;
  if (a.accumulator == Accumulator::kAuto) {
    // Dense: zero-fill and scan S cells (8 flags per word) plus the contributions;
    // merge: a heap step of log2(#streams) per contribution.
    const double log_streams = std::log2(static_cast<double>(streams.size()) + 1.0);
    const double dense_cost = L.spatial_size / 8.0 + contributions;
    const double merge_cost = contributions * (1.0 + log_streams);
    use_dense = dense_cost < merge_cost && L.spatial_size <= (int64_t{1} << 26);
  }
  const int d = L.d;
  if (use_dense) {
    if (scratch->sum.empty()) {
      scratch->sum.assign(L.spatial_size, T(0));
      scratch->touched.assign(L.spatial_size + 8, 0);  // +8: word reads past the end
    }
    T* sum = scratch->sum.data();
    uint8_t* touched = scratch->touched.data();
    for (const auto& s : streams) {
      for (int64_t i = s.pos; i < s.end; ++i) {
        if (!Reaches(a.coords + i * d, *s.pw, d)) continue;
        const int64_t y = a.keys[i] - s.base - s.pw->lin_delta;
        sum[y] += a.values[i] * s.w;
        touched[y] = 1;
      }
    }
    for (int64_t y = 0; y < L.spatial_size;) {
      uint64_t word;
      std::memcpy(&word, touched + y, 8);
      if (word == 0) {
        y += 8;
        continue;
      }
      if (touched[y]) {
        out->lin.push_back(y);
        out->values.push_back(sum[y]);
        sum[y] = T(0);
        touched[y] = 0;
      }
      ++y;
    }
  } else {
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
  out->touched = static_cast<int64_t>(out->lin.size());
  const T bias = a.bias[oc];
  for (T& v : out->values) v += bias;
  SelectTopK(a.selection, a.k, out);
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
                  std::vector<SegmentResult<T>>* results) {
    const int64_t units = args.in_layout.batch * args.cout;
    results->resize(units);
    const double per_unit = 1.0 + static_cast<double>(args.n) *
                                      std::max<int64_t>(1, args.weights->count()) /
                                      std::max<int64_t>(1, units);
    device.parallelFor(units, Eigen::TensorOpCost(0, 0, 10.0 * per_unit),
                       [&](Eigen::Index first, Eigen::Index last) {
                         DenseScratch<T> scratch;
                         for (Eigen::Index u = first; u < last; ++u) {
                           ConvolveSegment(args, u / args.cout, u % args.cout, &scratch,
                                           &(*results)[u]);
                         }
                       });
  }
};

template <typename T>
struct DirectConvBackpropFunctor<CPUDevice, T> {
  void operator()(const CPUDevice& device, const DirectConvBackpropArgs<T>& g, T* in_grad,
                  T* filter_grad, T* bias_grad) {
    const DirectConvArgs<T>& a = g.forward;
    const int64_t batch = a.in_layout.batch, cin = a.in_layout.channels, cout = a.cout;
    const PresentWeights& W = *a.weights;
    const double work = 10.0 * (1.0 + static_cast<double>(a.n) *
                                          std::max<int64_t>(1, W.count()) /
                                          std::max<int64_t>(1, cin * cout));
    // dL/dx: each (b, ic) segment is owned by one thread, so no atomics are needed and
    // the summation order is fixed (oc, then kernel offset): deterministic.
    std::fill(in_grad, in_grad + a.n, T(0));
    device.parallelFor(batch * cin, Eigen::TensorOpCost(0, 0, work * cout / batch),
                       [&](Eigen::Index first, Eigen::Index last) {
                         for (Eigen::Index u = first; u < last; ++u) {
                           const int64_t b = u / cin, ic = u % cin;
                           for (int64_t oc = 0; oc < cout; ++oc)
                             for (const PresentWeight* pw = W.begin(oc, ic);
                                  pw != W.end(oc, ic); ++pw) {
                               const T w = a.filter[pw->filter_index];
                               ForEachLink(g, b, ic, oc, *pw, [&](int64_t i, int64_t p) {
                                 in_grad[i] += g.out_grad[p] * w;
                               });
                             }
                         }
                       });
    // dL/dw: only present weights get a gradient (Eq. 3); one thread per (ic, oc).
    std::fill(filter_grad, filter_grad + a.filter_size, T(0));
    device.parallelFor(cin * cout, Eigen::TensorOpCost(0, 0, work * batch),
                       [&](Eigen::Index first, Eigen::Index last) {
                         for (Eigen::Index u = first; u < last; ++u) {
                           const int64_t oc = u / cin, ic = u % cin;
                           for (const PresentWeight* pw = W.begin(oc, ic);
                                pw != W.end(oc, ic); ++pw) {
                             T acc = T(0);
                             for (int64_t b = 0; b < batch; ++b)
                               ForEachLink(g, b, ic, oc, *pw, [&](int64_t i, int64_t p) {
                                 acc += g.out_grad[p] * a.values[i];
                               });
                             filter_grad[pw->filter_index] = acc;
                           }
                         }
                       });
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

// Checks shared by the forward and backward kernels; fills the layout, the kernel size
// and the decoded coordinates / segment offsets of the input.
template <typename T>
struct ConvInputs {
  KeyLayout layout;
  int64_t kernel_size[kMaxSpatialDims];
  int64_t cout = 0;
  std::vector<int32_t> coords;
  std::vector<int64_t> in_offsets;
  PresentWeights weights;
};

template <typename T>
absl::Status PrepareConvInputs(OpKernelContext* ctx, ConvInputs<T>* c) {
  const Tensor& keys = ctx->input(0);
  const Tensor& values = ctx->input(1);
  const Tensor& filter = ctx->input(3);
  const Tensor& mask = ctx->input(4);
  TF_RETURN_IF_ERROR(MakeKeyLayout(ctx->input(2), &c->layout));
  TF_RETURN_IF_ERROR(ValidateKeysTensor(keys, c->layout, "input"));
  const KeyLayout& L = c->layout;
  ConvShapes shapes;
  TF_RETURN_IF_ERROR(CheckConvShapes(keys, values, filter, mask, L, &shapes));
  std::copy(shapes.kernel_size, shapes.kernel_size + kMaxSpatialDims, c->kernel_size);
  c->cout = shapes.cout;
  TF_RETURN_IF_ERROR(RejectNaN(values.flat<T>().data(), values.NumElements(), "input values"));
  TF_RETURN_IF_ERROR(RejectNaN(filter.flat<T>().data(), filter.NumElements(), "filter"));
  const int64_t n = keys.NumElements();
  const int64_t* k = keys.flat<int64_t>().data();
  c->coords.resize(n * L.d);
  for (int64_t i = 0; i < n; ++i) DecodeSpatial(L.spatial_of(k[i]), L, &c->coords[i * L.d]);
  SegmentOffsets(k, n, L, &c->in_offsets);
  c->weights = BuildPresentWeights(mask.flat<bool>().data(), c->kernel_size, L.channels,
                                   c->cout, L);
  return absl::OkStatus();
}

template <typename T>
DirectConvArgs<T> MakeArgs(OpKernelContext* ctx, const ConvInputs<T>& c) {
  DirectConvArgs<T> a;
  a.in_layout = c.layout;
  a.cout = c.cout;
  a.keys = ctx->input(0).flat<int64_t>().data();
  a.values = ctx->input(1).flat<T>().data();
  a.n = ctx->input(0).NumElements();
  a.coords = c.coords.data();
  a.in_offsets = c.in_offsets.data();
  a.filter = ctx->input(3).flat<T>().data();
  a.filter_size = ctx->input(3).NumElements();
  a.weights = &c.weights;
  return a;
}

}  // namespace

template <typename T>
class DirectSparseConvOp : public OpKernel {
 public:
  explicit DirectSparseConvOp(OpKernelConstruction* ctx) : OpKernel(ctx) { attrs_.Read(ctx); }

  void Compute(OpKernelContext* ctx) override {
    ConvInputs<T> c;
    OP_REQUIRES_OK(ctx, PrepareConvInputs<T>(ctx, &c));
    const Tensor& bias = ctx->input(5);
    OP_REQUIRES_OK(ctx, CheckBiasShape(bias, c.cout));
    OP_REQUIRES_OK(ctx, RejectNaN(bias.flat<T>().data(), c.cout, "bias"));
    DirectConvArgs<T> a = MakeArgs(ctx, c);
    a.bias = bias.flat<T>().data();
    a.selection = attrs_.selection;
    a.accumulator = attrs_.accumulator;
    a.k = attrs_.EffectiveK(c.layout.spatial_size);
    const CPUDevice& device = ctx->eigen_device<CPUDevice>();
    std::vector<SegmentResult<T>> results;
    DirectConvForwardFunctor<CPUDevice, T>()(device, a, &results);

    const int64_t units = static_cast<int64_t>(results.size());
    std::vector<int64_t> offset(units + 1, 0);
    for (int64_t u = 0; u < units; ++u) offset[u + 1] = offset[u] + results[u].lin.size();
    Tensor *out_keys, *out_values, *out_shape, *touched;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({offset[units]}), &out_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({offset[units]}), &out_values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ctx->input(2).shape(), &out_shape));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            3, TensorShape({c.layout.batch, c.cout}), &touched));
    auto shape_out = out_shape->flat<int64_t>();
    shape_out = ctx->input(2).flat<int64_t>();
    shape_out(c.layout.d + 1) = c.cout;
    int64_t* ok = out_keys->flat<int64_t>().data();
    T* ov = out_values->flat<T>().data();
    int64_t* tc = touched->flat<int64_t>().data();
    const int64_t S = c.layout.spatial_size;
    device.parallelFor(units, Eigen::TensorOpCost(0, 0, 1.0 + offset[units] / (units + 1.0)),
                       [&](Eigen::Index first, Eigen::Index last) {
                         for (Eigen::Index u = first; u < last; ++u) {
                           const SegmentResult<T>& r = results[u];
                           for (size_t j = 0; j < r.lin.size(); ++j) {
                             ok[offset[u] + j] = u * S + r.lin[j];
                             ov[offset[u] + j] = r.values[j];
                           }
                           tc[u] = r.touched;
                         }
                       });
  }

 private:
  ConvAttrs attrs_;
};

template <typename T>
class DirectSparseConvBackpropOp : public OpKernel {
 public:
  explicit DirectSparseConvBackpropOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    ConvInputs<T> c;
    OP_REQUIRES_OK(ctx, PrepareConvInputs<T>(ctx, &c));
    const Tensor& out_keys = ctx->input(5);
    const Tensor& out_grad = ctx->input(6);
    const KeyLayout out_layout = c.layout.WithChannels(c.cout);
    OP_REQUIRES_OK(ctx, ValidateKeysTensor(out_keys, out_layout, "output"));
    OP_REQUIRES_OK(ctx, ValidateValuesMatchKeys(out_keys, out_grad, "output gradient"));
    std::vector<int64_t> out_offsets;
    SegmentOffsets(out_keys.flat<int64_t>().data(), out_keys.NumElements(), out_layout,
                   &out_offsets);
    DirectConvBackpropArgs<T> g;
    g.forward = MakeArgs(ctx, c);
    g.out_keys = out_keys.flat<int64_t>().data();
    g.out_grad = out_grad.flat<T>().data();
    g.n_out = out_keys.NumElements();
    g.out_offsets = out_offsets.data();
    Tensor *in_grad, *filter_grad, *bias_grad;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ctx->input(1).shape(), &in_grad));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, ctx->input(3).shape(), &filter_grad));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({c.cout}), &bias_grad));
    DirectConvBackpropFunctor<CPUDevice, T>()(ctx->eigen_device<CPUDevice>(), g,
                                              in_grad->flat<T>().data(),
                                              filter_grad->flat<T>().data(),
                                              bias_grad->flat<T>().data());
  }
};

#define REGISTER_CPU(T)                                                               \
  REGISTER_KERNEL_BUILDER(                                                            \
      Name("DirectSparseConv").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      DirectSparseConvOp<T>);                                                         \
  REGISTER_KERNEL_BUILDER(Name("DirectSparseConvBackprop")                            \
                              .Device(::tensorflow::DEVICE_CPU)                       \
                              .TypeConstraint<T>("T"),                                \
                          DirectSparseConvBackpropOp<T>);
REGISTER_CPU(float);
REGISTER_CPU(double);
#undef REGISTER_CPU

}  // namespace tf_sparseconv

// The CPU functors of SiteSparseConv, SiteSparseConvFilterGrad and SiteNeighbourTable and
// the CPU registration of their OpKernels (site_conv_kernels.h). The functors gather a
// block of input rows, multiply it by the offset's filter (Eigen's GEMM, or AVX2 or AVX-512
// tiles of our own, site_gemm_avx2.cc and site_gemm_avx512.cc) and scatter-add the products into the output rows. The map's
// rows and the features' NaNs are checked on every call, map_is_trusted or not: on the CPU
// those checks need no round trip and cost little next to the GEMMs.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "site/conv/site_conv.h"
#include "site/conv/site_conv_checks.h"
#include "site/conv/site_conv_kernels.h"
#include "site/conv/site_gemm_cpu.h"
#include "site/kernel_map/neighbour_table_cpu.h"
#include "tensorflow/core/framework/bfloat16.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "Eigen/Core"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_sparseconv {

using ::tensorflow::OpKernelContext;

namespace {

// Pairs per gathered block: a [block, Cin] slab of a few tens of KiB stays in L1/L2.
constexpr int64_t kPairBlock = 128;

template <typename A>
using RowMajor = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <typename T, typename A>
void ToAccumulator(const T* x, int64_t n, A* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<A>(x[i]);
}

// Float32 rows of a block of pairs for the AVX2 products: float features are used where
// they are; half types are converted into `staging` ([rows, width]) first.
template <typename T>
void RowPointers(const T* x, int64_t width, const int32_t* rows, int64_t n, float* staging, const float** out) {
  for (int64_t r = 0; r < n; ++r) {
    if constexpr (std::is_same_v<T, float>) {
      out[r] = x + rows[r] * width;
    } else {
      ToAccumulator(x + rows[r] * width, width, staging + r * width);
      out[r] = staging + r * width;
    }
  }
}

// out [n, cout] = act(n(acc) * scale + shift) per column (site_conv.h's SiteEpilogue) in
// T, acc the float32 (or double) sums (out itself where T is the accumulator): the
// epilogue as one scale and one shift per column, applied over blocks of rows in parallel.
template <typename T, typename A>
void ApplyEpilogue(const CPUDevice& device, const SiteEpilogue<A>& e, int64_t n, int64_t cout, const A* acc,
                   T* out) {
  std::vector<A> scale(cout), shift(cout);
  for (int64_t c = 0; c < cout; ++c) {
    scale[c] = e.scale != nullptr ? e.scale[c] : A(1);
    shift[c] = e.shift != nullptr ? e.shift[c] : A(0);
    if (e.variance != nullptr) {
      scale[c] /= std::sqrt(e.variance[c] + e.epsilon);
      shift[c] -= e.mean[c] * scale[c];
    }
  }
  const double bytes = static_cast<double>(cout) * (sizeof(A) + sizeof(T));
  device.parallelFor(n, Eigen::TensorOpCost(bytes, bytes, 2.0 * cout), [&](Eigen::Index first, Eigen::Index last) {
    for (Eigen::Index r = first; r < last; ++r) {
      const A* src = acc + r * cout;
      T* dst = out + r * cout;
      for (int64_t c = 0; c < cout; ++c) {
        A v = src[c] * scale[c] + shift[c];
        if (e.relu && v < A(0)) v = A(0);  // NaN stays NaN, as in tf.nn.relu
        dst[c] = static_cast<T>(v);
      }
    }
  });
}

// out = the convolution (site_conv.h) of a map whose rows are checked.
template <typename T>
void ConvOnCpu(const CPUDevice& device, const SiteConvArgs<T>& a, CpuProducts products, T* out) {
  using A = typename AccumulatorOf<T>::type;
  std::vector<A> filters(a.volume * a.cin * a.cout);
  ToAccumulator(a.filters, static_cast<int64_t>(filters.size()), filters.data());
  // float and double accumulate in place; half types in a float32 copy of the output.
  std::vector<A> staged;
  A* acc;
  if constexpr (std::is_same_v<A, T>) {
    acc = out;
  } else {
    staged.resize(a.num_out * a.cout);
    acc = staged.data();
  }
  std::fill(acc, acc + a.num_out * a.cout, A(0));
  for (int64_t q = 0; q < a.volume; ++q) {
    const int64_t begin = a.offset_splits[q], count = a.offset_splits[q + 1] - begin;
    if (count == 0) continue;
    const Eigen::Map<const RowMajor<A>> w(filters.data() + q * a.cin * a.cout, a.cin, a.cout);
    const int64_t blocks = (count + kPairBlock - 1) / kPairBlock;
    if constexpr (std::is_same_v<A, float>) {
      if (products != CpuProducts::kPortable) {
        const auto product = products == CpuProducts::kAvx512 ? GatherGemmScatterAvx512 : GatherGemmScatterAvx2;
        device.parallelFor(blocks, Eigen::TensorOpCost(0, 0, 2.0 * kPairBlock * a.cin * a.cout),
                           [&](Eigen::Index first, Eigen::Index last) {
                             std::vector<float> staging(std::is_same_v<T, float> ? 0 : kPairBlock * a.cin);
                             const float* in[kPairBlock];
                             float* dst[kPairBlock];
                             for (Eigen::Index blk = first; blk < last; ++blk) {
                               const int64_t p0 = begin + blk * kPairBlock;
                               const int64_t rows = std::min(kPairBlock, begin + count - p0);
                               RowPointers(a.features, a.cin, a.in_rows + p0, rows, staging.data(), in);
                               for (int64_t r = 0; r < rows; ++r) dst[r] = acc + a.out_rows[p0 + r] * a.cout;
                               product(rows, a.cin, a.cout, in, w.data(), dst);
                             }
                           });
        continue;
      }
    }
    device.parallelFor(blocks, Eigen::TensorOpCost(0, 0, 2.0 * kPairBlock * a.cin * a.cout),
                       [&](Eigen::Index first, Eigen::Index last) {
                         RowMajor<A> gathered(kPairBlock, a.cin), product(kPairBlock, a.cout);
                         for (Eigen::Index blk = first; blk < last; ++blk) {
                           const int64_t p0 = begin + blk * kPairBlock;
                           const int64_t rows = std::min(kPairBlock, begin + count - p0);
                           for (int64_t r = 0; r < rows; ++r)
                             ToAccumulator(a.features + a.in_rows[p0 + r] * a.cin, a.cin, &gathered(r, 0));
                           product.topRows(rows).noalias() = gathered.topRows(rows) * w;
                           // Output rows are unique within one offset (checked), so the
                           // blocks of this offset never write the same row.
                           for (int64_t r = 0; r < rows; ++r) {
                             A* dst = acc + a.out_rows[p0 + r] * a.cout;
                             const A* src = &product(r, 0);
                             for (int64_t c = 0; c < a.cout; ++c) dst[c] += src[c];
                           }
                         }
                       });
  }
  if (a.epilogue.Any()) {
    ApplyEpilogue(device, a.epilogue, a.num_out, a.cout, acc, out);  // and the conversion to T
  } else if constexpr (!std::is_same_v<A, T>) {
    for (int64_t i = 0; i < a.num_out * a.cout; ++i) out[i] = static_cast<T>(acc[i]);
  }
}

// filter_grad[q] = features[in_rows]^T out_grad[out_rows] over q's pairs, the rows checked.
template <typename T>
void FilterGradOnCpu(const CPUDevice& device, const SiteConvArgs<T>& a, CpuProducts products, const T* out_grad,
                     T* filter_grad) {
  using A = typename AccumulatorOf<T>::type;
  // One offset per task: offsets write disjoint filter slices, so no reduction is needed
  // and the sum order (by pair) does not depend on the thread count.
  if constexpr (std::is_same_v<A, float>) {
    if (products != CpuProducts::kPortable) {
      const auto product = products == CpuProducts::kAvx512 ? OuterProductSumAvx512 : OuterProductSumAvx2;
      device.parallelFor(a.volume, Eigen::TensorOpCost(0, 0, 2.0 * a.pairs / a.volume * a.cin * a.cout),
                         [&](Eigen::Index first, Eigen::Index last) {
                           const bool convert = !std::is_same_v<T, float>;
                           std::vector<float> x_staging(convert ? kPairBlock * a.cin : 0);
                           std::vector<float> g_staging(convert ? kPairBlock * a.cout : 0);
                           std::vector<float> dw(a.cin * a.cout);
                           const float* x[kPairBlock];
                           const float* g[kPairBlock];
                           for (Eigen::Index q = first; q < last; ++q) {
                             std::fill(dw.begin(), dw.end(), 0.0f);
                             const int64_t begin = a.offset_splits[q], end = a.offset_splits[q + 1];
                             for (int64_t p0 = begin; p0 < end; p0 += kPairBlock) {
                               const int64_t rows = std::min(kPairBlock, end - p0);
                               RowPointers(a.features, a.cin, a.in_rows + p0, rows, x_staging.data(), x);
                               RowPointers(out_grad, a.cout, a.out_rows + p0, rows, g_staging.data(), g);
                               product(rows, a.cin, a.cout, x, g, dw.data());
                             }
                             T* dst = filter_grad + q * a.cin * a.cout;
                             for (int64_t i = 0; i < a.cin * a.cout; ++i) dst[i] = static_cast<T>(dw[i]);
                           }
                         });
      return;
    }
  }
  device.parallelFor(a.volume, Eigen::TensorOpCost(0, 0, 2.0 * a.pairs / a.volume * a.cin * a.cout),
                     [&](Eigen::Index first, Eigen::Index last) {
                       RowMajor<A> x(kPairBlock, a.cin), g(kPairBlock, a.cout), dw(a.cin, a.cout);
                       for (Eigen::Index q = first; q < last; ++q) {
                         dw.setZero();
                         const int64_t begin = a.offset_splits[q], end = a.offset_splits[q + 1];
                         for (int64_t p0 = begin; p0 < end; p0 += kPairBlock) {
                           const int64_t rows = std::min(kPairBlock, end - p0);
                           for (int64_t r = 0; r < rows; ++r) {
                             ToAccumulator(a.features + a.in_rows[p0 + r] * a.cin, a.cin, &x(r, 0));
                             ToAccumulator(out_grad + a.out_rows[p0 + r] * a.cout, a.cout, &g(r, 0));
                           }
                           dw.noalias() += x.topRows(rows).transpose() * g.topRows(rows);
                         }
                         T* dst = filter_grad + q * a.cin * a.cout;
                         for (int64_t i = 0; i < a.cin * a.cout; ++i) dst[i] = static_cast<T>(dw.data()[i]);
                       }
                     });
}

template <typename T>
absl::Status RejectNaNRows(const T* x, int64_t n, int64_t width, const char* what) {
  for (int64_t i = 0; i < n * width; ++i) {
    if (std::isnan(static_cast<float>(x[i]))) return NaNRowError(what, i / width, i % width);
  }
  return absl::OkStatus();
}

// Row ranges, rising splits, and at most one pair per output row and offset.
absl::Status CheckSiteMapRows(const SiteMapView& map, int64_t num_in, int64_t num_out) {
  if (map.offset_splits[0] != 0 || map.offset_splits[map.volume] != map.pairs) {
    return BadSplitsError(0, map.offset_splits[0], map.offset_splits[map.volume], map.pairs);
  }
  // The repeat check: a table over the output rows where num_out is within a small factor
  // of the pairs, else (num_out is a scalar input, 2^31 - 1 at most) each offset's rows
  // sorted, so the check's memory follows the map, not num_out.
  const bool by_row = num_out <= 2 * map.pairs + 4096;
  std::vector<int32_t> last_offset(by_row ? num_out : 0, -1);
  std::vector<int32_t> rows;
  for (int64_t q = 0; q < map.volume; ++q) {
    const int64_t begin = map.offset_splits[q], end = map.offset_splits[q + 1];
    if (begin > end || end > map.pairs) return BadSplitsError(q, begin, end, map.pairs);
    for (int64_t p = begin; p < end; ++p) {
      const int64_t i = map.in_rows[p], o = map.out_rows[p];
      if (i < 0 || i >= num_in) return MapRowOutOfRangeError("in_rows", p, i, num_in);
      if (o < 0 || o >= num_out) return MapRowOutOfRangeError("out_rows", p, o, num_out);
      if (by_row) {
        if (last_offset[o] == q) return RepeatedOutputRowError(q, o);
        last_offset[o] = static_cast<int32_t>(q);
      }
    }
    if (!by_row) {
      rows.assign(map.out_rows + begin, map.out_rows + end);
      std::sort(rows.begin(), rows.end());
      const auto repeat = std::adjacent_find(rows.begin(), rows.end());
      if (repeat != rows.end()) return RepeatedOutputRowError(q, *repeat);
    }
  }
  return absl::OkStatus();
}

}  // namespace

// What the CPU functors of the convolution and its filter gradient hold: the thread pool,
// and which products run: the widest tiles that cpu_products allows and the CPU has.
class CpuSiteConvFunctor {
 protected:
  CpuSiteConvFunctor(OpKernelContext* ctx, const SiteConvAttrs& attrs)
      : device_(ctx->eigen_device<CPUDevice>()), attrs_(attrs) {
    static const bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    static const bool has_avx512 = has_avx2 && __builtin_cpu_supports("avx512f");
    products_ = attrs.products == CpuProducts::kPortable || !has_avx2 ? CpuProducts::kPortable
                : attrs.products == CpuProducts::kAvx512 && has_avx512 ? CpuProducts::kAvx512
                                                                       : CpuProducts::kAvx2;
  }

  const CPUDevice& device_;
  const SiteConvAttrs& attrs_;
  CpuProducts products_ = CpuProducts::kPortable;
};

template <typename T>
class SiteConvFunctor<CPUDevice, T> : CpuSiteConvFunctor {
 public:
  SiteConvFunctor(OpKernelContext* ctx, const SiteConvAttrs& attrs) : CpuSiteConvFunctor(ctx, attrs) {}

  absl::Status Prepare(const SiteMapView& map, const SiteConvArgs<T>& a) {
    TF_RETURN_IF_ERROR(CheckCpuDataflow(attrs_.dataflow));
    TF_RETURN_IF_ERROR(CheckSiteMapRows(map, a.num_in, a.num_out));
    return RejectNaNRows(a.features, a.num_in, a.cin, "features");
  }

  // The products read the pairs, given a neighbour table or not.
  absl::Status Run(const SiteConvArgs<T>& a, const int32_t* /*neighbours*/, T* out) {
    ConvOnCpu(device_, a, products_, out);
    return absl::OkStatus();
  }

  // map_is_table: the table's pairs (SiteTablePairs'), held until the call ends.
  absl::Status UseTable(const tensorflow::Tensor& neighbours, SiteMapView* map, SiteConvArgs<T>* a) {
    const int32_t* table = neighbours.flat<int32_t>().data();
    const int64_t n = neighbours.dim_size(0);
    int64_t volume = 0;
    TF_RETURN_IF_ERROR(CheckPairsTable(neighbours, table, &volume));
    TF_RETURN_IF_ERROR(TablePairSplits(table, n, volume, &splits_));
    in_rows_.resize(splits_[volume]);
    out_rows_.resize(splits_[volume]);
    TablePairsOnCpu(table, n, volume, splits_.data(), in_rows_.data(), out_rows_.data());
    map->in_rows = a->in_rows = in_rows_.data();
    map->out_rows = a->out_rows = out_rows_.data();
    map->offset_splits = a->offset_splits = splits_.data();
    map->pairs = a->pairs = splits_[volume];
    return absl::OkStatus();
  }

 private:
  std::vector<int32_t> in_rows_, out_rows_, splits_;
};

template <typename T>
class SiteConvFilterGradFunctor<CPUDevice, T> : CpuSiteConvFunctor {
 public:
  SiteConvFilterGradFunctor(OpKernelContext* ctx, const SiteConvAttrs& attrs) : CpuSiteConvFunctor(ctx, attrs) {}

  absl::Status Prepare(const SiteMapView& map, const SiteConvArgs<T>& a) {
    return CheckSiteMapRows(map, a.num_in, a.num_out);
  }

  absl::Status Run(const SiteConvArgs<T>& a, const T* out_grad, T* filter_grad) {
    FilterGradOnCpu(device_, a, products_, out_grad, filter_grad);
    return absl::OkStatus();
  }
};

template <>
class SiteNeighbourTableFunctor<CPUDevice> {
 public:
  SiteNeighbourTableFunctor(OpKernelContext*, const SiteConvAttrs&) {}

  absl::Status Prepare(const SiteMapView& map, int64_t num_in, int64_t num_out) {
    return CheckSiteMapRows(map, num_in, num_out);
  }

  absl::Status Run(const SiteMapView& map, int64_t /*num_in*/, int64_t num_out, int32_t* table) {
    NeighbourTableOnCpu(map.in_rows, map.out_rows, map.offset_splits, map.volume, num_out, table);
    return absl::OkStatus();
  }
};

REGISTER_KERNEL_BUILDER(Name("TfSparseconv>SiteNeighbourTable").Device(::tensorflow::DEVICE_CPU),
                        SiteNeighbourTableOp<CPUDevice>);

#define REGISTER_SITE_CONV_CPU(T)                                                                            \
  REGISTER_KERNEL_BUILDER(                                                                                   \
      Name("TfSparseconv>SiteSparseConv").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),           \
      SiteSparseConvOp<CPUDevice, T>);                                                                       \
  REGISTER_KERNEL_BUILDER(                                                                                   \
      Name("TfSparseconv>SiteSparseConvFilterGrad").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      SiteSparseConvFilterGradOp<CPUDevice, T>);
REGISTER_SITE_CONV_CPU(float)
REGISTER_SITE_CONV_CPU(double)
REGISTER_SITE_CONV_CPU(Eigen::half)
REGISTER_SITE_CONV_CPU(Eigen::bfloat16)
#undef REGISTER_SITE_CONV_CPU

}  // namespace tf_sparseconv

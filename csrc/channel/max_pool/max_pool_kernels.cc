// The sparse max-pooling op's CPU functor: per (b, c) segment, order the entries by their
// pooled position (stably, so key order breaks ties: a counting sort on small pooled grids,
// else a stable sort), then reduce each run; and the CPU
// registration of its OpKernel (max_pool_kernels.h).
#define EIGEN_USE_THREADS

#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "channel/max_pool/max_pool_kernels.h"
#include "common/divisor32.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_sparseconv {

// A segment is ordered by a counting sort where the pooled grid has at most this many
// positions plus 8 per entry of the segment (its cost is linear in both), else by a stable
// sort (n log n), which wins for a few entries on a large grid.
constexpr int64_t kCountingSortCells = 1024;

template <typename T>
class SparseMaxPoolFunctor<CPUDevice, T> {
 public:
  SparseMaxPoolFunctor(tensorflow::OpKernelContext* ctx, const PoolFlags&)
      : device_(ctx->eigen_device<CPUDevice>()) {}

  absl::Status Count(const KeyLayout& in, const KeyLayout& out, const std::vector<int32_t>& strides,
                     const int64_t* k, const T* v, int64_t n, int64_t* count) {
    TF_RETURN_IF_ERROR(ValidateKeys(k, n, in, "max_pool input"));
    TF_RETURN_IF_ERROR(RejectNaN(v, n, "max_pool input values"));
    values_ = v;
    n_ = n;
    num_segments_ = in.num_segments();
    SegmentOffsets(k, n, in, &in_offsets_);
    // pooled_[i]: the output key of entry i; order_: entries sorted by (pooled, i).
    // (uninitialised: every slot is written below; zeroing them took 5-10 ms at millions of entries)
    pooled_.reset(new int64_t[n > 0 ? n : 1]);
    order_.reset(new int64_t[n > 0 ? n : 1]);
    seg_count_.assign(num_segments_ + 1, 0);
    // Within a segment an entry's spatial index is its key less the segment's base, and where
    // it fits 32 bits its coordinates and their pooled ones divide by multiplications
    // (Divisor32): the 3d divisions per entry had been most of the pooling's time.
    const bool fast = in.spatial_size <= kMaxDivisor32;
    const SpatialDivisors divide(in);
    Divisor32 pool[kMaxSpatialDims];
    for (int j = 0; j < in.d; ++j) pool[j] = Divisor32(static_cast<uint32_t>(strides[j]));
    device_.parallelFor(
        num_segments_, Eigen::TensorOpCost(0, 0, 20.0 * (1.0 + n / (num_segments_ + 1.0))),
        [&](Eigen::Index first, Eigen::Index last) {
          std::vector<int32_t> x(in.d);
          std::vector<int64_t> starts;  // counting sort's per-position starts, where it is used
          for (Eigen::Index s = first; s < last; ++s) {
            const int64_t s0 = in_offsets_[s], s1 = in_offsets_[s + 1];
            const int64_t in_base = s * in.spatial_size;
            for (int64_t i = s0; i < s1; ++i) {
              int64_t lin = 0;
              if (fast) {
                const uint32_t in_lin = static_cast<uint32_t>(k[i] - in_base);
                for (int j = 0; j < in.d; ++j)
                  lin += static_cast<int64_t>(pool[j].Div(divide.Coord(in_lin, j))) * out.stride[j];
              } else {
                DecodeSpatial(k[i] - in_base, in, x.data());
                for (int j = 0; j < in.d; ++j) lin += (x[j] / strides[j]) * out.stride[j];
              }
              pooled_[i] = s * out.spatial_size + lin;
              order_[i] = i;
            }
            if (s1 > s0 && out.spatial_size <= kCountingSortCells + 8 * (s1 - s0)) {
              // A stable counting sort by pooled position: linear where the pooled grid is
              // not much larger than the segment (the same order as the stable sort below).
              starts.assign(out.spatial_size + 1, 0);
              const int64_t base = s * out.spatial_size;
              for (int64_t i = s0; i < s1; ++i) ++starts[pooled_[i] - base + 1];
              for (int64_t c = 0; c < out.spatial_size; ++c) starts[c + 1] += starts[c];
              for (int64_t i = s0; i < s1; ++i) order_[s0 + starts[pooled_[i] - base]++] = i;
            } else {
              std::stable_sort(order_.get() + s0, order_.get() + s1,
                               [&](int64_t a, int64_t b) { return pooled_[a] < pooled_[b]; });
            }
            int64_t runs = 0;
            for (int64_t i = s0; i < s1; ++i)
              runs += (i == s0 || pooled_[order_[i]] != pooled_[order_[i - 1]]);
            seg_count_[s + 1] = runs;
          }
        });
    for (int64_t s = 0; s < num_segments_; ++s) seg_count_[s + 1] += seg_count_[s];
    *count = seg_count_[num_segments_];
    return absl::OkStatus();
  }

  absl::Status Write(int64_t* ok, T* ov, int64_t* am, int64_t capacity) {
    // Padding after the live entries (padded output; capacity is the count otherwise).
    const int64_t live = seg_count_[num_segments_];
    std::fill(ok + live, ok + capacity, kPaddingKey);
    std::fill(ov + live, ov + capacity, T(0));
    std::iota(am + live, am + capacity, live);  // distinct positions, as on the GPU (max_pool.cu)
    const T* v = values_;
    device_.parallelFor(num_segments_, Eigen::TensorOpCost(0, 0, 5.0 * (1.0 + n_ / (num_segments_ + 1.0))),
                        [&](Eigen::Index first, Eigen::Index last) {
                          for (Eigen::Index s = first; s < last; ++s) {
                            int64_t j = seg_count_[s] - 1;
                            for (int64_t i = in_offsets_[s]; i < in_offsets_[s + 1]; ++i) {
                              const int64_t e = order_[i];
                              if (i == in_offsets_[s] || pooled_[e] != ok[j]) {
                                ++j;
                                ok[j] = pooled_[e];
                                ov[j] = v[e];
                                am[j] = e;
                              } else if (v[e] > ov[j]) {  // strict: ties keep the smaller key
                                ov[j] = v[e];
                                am[j] = e;
                              }
                            }
                          }
                        });
    return absl::OkStatus();
  }

 private:
  const CPUDevice& device_;
  const T* values_ = nullptr;
  int64_t n_ = 0;
  int64_t num_segments_ = 0;
  std::vector<int64_t> in_offsets_, seg_count_;
  std::unique_ptr<int64_t[]> pooled_, order_;  // per entry: its output key; entries by (pooled, index)
};

#define REGISTER_CPU(T)                                                                           \
  REGISTER_KERNEL_BUILDER(                                                                        \
      Name("TfSparseconv>SparseMaxPool").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      SparseMaxPoolOp<CPUDevice, T>);
REGISTER_CPU(float);
REGISTER_CPU(double);
#undef REGISTER_CPU

}  // namespace tf_sparseconv

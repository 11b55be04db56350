// SiteKernelMap's CPU functor and the CPU registration of its OpKernel
// (site_kernel_map_kernels.h): a hash table over the sites, probed once per (site, kernel
// offset); work is spread over kernel offsets, so the pairs of each offset come out in
// input-row order whatever the thread count.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "common/guarded_op_kernel.h"
#include "site/conv/site_conv.h"
#include "site/kernel_map/neighbour_table_cpu.h"
#include "site/kernel_map/site_geometry.h"
#include "site/kernel_map/site_kernel_map_checks.h"
#include "site/kernel_map/site_kernel_map_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_sparseconv {

using ::tensorflow::OpKernelContext;

namespace {

// Open addressing, linear probing: int64 site key -> int32 row. Keys are >= 0, so -1
// marks an empty slot; the table is at most half full.
class SiteHashTable {
 public:
  explicit SiteHashTable(int64_t n) {
    int64_t capacity = 16;
    while (capacity < 2 * n) capacity <<= 1;
    mask_ = capacity - 1;
    keys_.assign(capacity, -1);
    rows_.resize(capacity);
  }
  // The row already stored under key, or -1 after storing row.
  int32_t Insert(int64_t key, int32_t row) {
    for (uint64_t s = Hash(key) & mask_;; s = (s + 1) & mask_) {
      if (keys_[s] == -1) {
        keys_[s] = key;
        rows_[s] = row;
        return -1;
      }
      if (keys_[s] == key) return rows_[s];
    }
  }
  int32_t Find(int64_t key) const {
    for (uint64_t s = Hash(key) & mask_;; s = (s + 1) & mask_) {
      if (keys_[s] == key) return rows_[s];
      if (keys_[s] == -1) return -1;
    }
  }

 private:
  static uint64_t Hash(int64_t key) {  // splitmix64 finaliser
    uint64_t z = static_cast<uint64_t>(key) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t mask_ = 0;
  std::vector<int64_t> keys_;
  std::vector<int32_t> rows_;
};

int64_t InputKey(const SiteGeometry& g, const int32_t* site) {
  int64_t key = site[0];
  for (int j = 0; j < g.d; ++j) key = key * g.in_shape[j] + site[1 + j];
  return key;
}

}  // namespace

template <>
class SiteKernelMapFunctor<CPUDevice> {
 public:
  SiteKernelMapFunctor(OpKernelContext* ctx, const SiteMapAttrs&) : device_(ctx->eigen_device<CPUDevice>()) {}

  absl::Status Count(const SiteGeometry& g, const int32_t* coords, int64_t n, SiteMapCounts* counts) {
    g_ = g;
    coords_ = coords;
    n_ = n;
    const int width = g.d + 1;
    for (int64_t i = 0; i < n; ++i) {
      for (int j = 0; j < width; ++j) {
        const int64_t limit = j == 0 ? g.batch : g.in_shape[j - 1];
        const int32_t v = coords[i * width + j];
        if (v < 0 || v >= limit) return CoordOutOfRangeError(i, j, v, limit);
      }
    }
    SiteHashTable sites(n);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t first = sites.Insert(InputKey(g, coords + i * width), static_cast<int32_t>(i));
      if (first >= 0) return DuplicateSiteError(first, i);
    }

    // Per offset: (output key, input row) of every pair, in input-row order; for a
    // submanifold map the output row itself, since only existing sites are outputs.
    const bool submanifold = g.mode == SiteMapMode::kSubmanifold;
    by_offset_.assign(g.volume, {});
    device_.parallelFor(g.volume, Eigen::TensorOpCost(0, 0, 20.0 * n), [&](Eigen::Index first, Eigen::Index last) {
      int64_t qi[kMaxSpatialDims], o[kMaxSpatialDims];
      for (Eigen::Index q = first; q < last; ++q) {
        g.Unflatten(q, qi);
        auto& pairs = by_offset_[q];
        for (int64_t i = 0; i < n; ++i) {
          const int32_t* site = coords + i * width;
          if (!g.OutputOf(site + 1, qi, o)) continue;
          const int64_t key = g.OutKey(site[0], o);
          if (!submanifold) {
            pairs.emplace_back(key, static_cast<int32_t>(i));
          } else if (const int32_t row = sites.Find(key); row >= 0) {
            pairs.emplace_back(row, static_cast<int32_t>(i));
          }
        }
      }
    });
    pairs_ = 0;
    for (const auto& v : by_offset_) pairs_ += v.size();
    if (pairs_ > std::numeric_limits<int32_t>::max()) {
      return tensorflow::errors::InvalidArgument("the kernel map would have ", pairs_,
                                                 " pairs; at most 2^31 - 1 are supported");
    }

    // Output sites: the input sites themselves, or every key some pair reaches, sorted.
    if (!submanifold) {
      out_keys_.reserve(pairs_);
      for (const auto& v : by_offset_)
        for (const auto& p : v) out_keys_.push_back(p.first);
      std::sort(out_keys_.begin(), out_keys_.end());
      out_keys_.erase(std::unique(out_keys_.begin(), out_keys_.end()), out_keys_.end());
      if (static_cast<int64_t>(out_keys_.size()) > std::numeric_limits<int32_t>::max()) {
        return tensorflow::errors::InvalidArgument("more than 2^31 - 1 output sites");
      }
      reached_ = std::make_unique<SiteHashTable>(out_keys_.size());
      for (size_t r = 0; r < out_keys_.size(); ++r) reached_->Insert(out_keys_[r], static_cast<int32_t>(r));
    }
    counts->pairs = pairs_;
    counts->out_sites = submanifold ? n : static_cast<int64_t>(out_keys_.size());
    counts->offset_splits.assign(g.volume + 1, 0);
    for (int64_t q = 0; q < g.volume; ++q) {
      counts->offset_splits[q + 1] = counts->offset_splits[q] + static_cast<int32_t>(by_offset_[q].size());
    }
    splits_ = counts->offset_splits;
    return absl::OkStatus();
  }

  absl::Status Write(int32_t* out_coords, int32_t* in_rows, int32_t* out_rows) {
    const bool submanifold = g_.mode == SiteMapMode::kSubmanifold;
    const int width = g_.d + 1;
    if (submanifold) {
      if (n_ > 0) std::memcpy(out_coords, coords_, sizeof(int32_t) * n_ * width);
    } else {
      for (size_t r = 0; r < out_keys_.size(); ++r) g_.DecodeOutKey(out_keys_[r], out_coords + r * width);
    }
    device_.parallelFor(g_.volume, Eigen::TensorOpCost(0, 0, 20.0 * pairs_ / g_.volume),
                        [&](Eigen::Index first, Eigen::Index last) {
                          for (Eigen::Index q = first; q < last; ++q) {
                            int64_t p = splits_[q];
                            for (const auto& pair : by_offset_[q]) {
                              in_rows[p] = pair.second;
                              out_rows[p++] =
                                  submanifold ? static_cast<int32_t>(pair.first) : reached_->Find(pair.first);
                            }
                          }
                        });
    return absl::OkStatus();
  }

 private:
  const CPUDevice& device_;
  SiteGeometry g_;
  const int32_t* coords_ = nullptr;
  int64_t n_ = 0;
  int64_t pairs_ = 0;
  std::vector<std::vector<std::pair<int64_t, int32_t>>> by_offset_;
  std::vector<int64_t> out_keys_;
  std::unique_ptr<SiteHashTable> reached_;  // output key -> output row (strided, transposed)
  std::vector<int32_t> splits_;
};

REGISTER_KERNEL_BUILDER(Name("TfSparseconv>SiteKernelMap")
                            .Device(::tensorflow::DEVICE_CPU)
                            .HostMemory("spatial_shape")
                            .HostMemory("batch_size"),
                        SiteKernelMapOp<CPUDevice>);

// SiteSubmanifoldNeighbours on the CPU: the map's pairs (checking the sites whatever
// sites_checked says), then their table.
class SiteSubmanifoldNeighboursCpuOp : public GuardedOpKernel {
 public:
  explicit SiteSubmanifoldNeighboursCpuOp(tensorflow::OpKernelConstruction* ctx)
      : GuardedOpKernel(ctx, "site_submanifold_neighbours") {
    AttrsOk(attrs_.ParseSubmanifold(ctx));
  }

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    SiteGeometry g;
    OP_REQUIRES_OK(ctx, SiteCallGeometry(ctx, attrs_, &g));
    const tensorflow::Tensor& coords = ctx->input(0);
    const int64_t n = coords.dim_size(0);
    SiteKernelMapFunctor<CPUDevice> map(ctx, attrs_);
    SiteMapCounts counts;
    OP_REQUIRES_OK(ctx, map.Count(g, coords.flat<int32_t>().data(), n, &counts));
    std::vector<int32_t> out_coords(n * (g.d + 1)), in_rows(counts.pairs), out_rows(counts.pairs);
    OP_REQUIRES_OK(ctx, map.Write(out_coords.data(), in_rows.data(), out_rows.data()));
    tensorflow::Tensor* table;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({n, NeighbourTableWidth(g.volume)}), &table));
    NeighbourTableOnCpu(in_rows.data(), out_rows.data(), counts.offset_splits.data(), g.volume, n,
                        table->flat<int32_t>().data());
  }

  SiteMapAttrs attrs_;
};

REGISTER_KERNEL_BUILDER(Name("TfSparseconv>SiteSubmanifoldNeighbours")
                            .Device(::tensorflow::DEVICE_CPU)
                            .HostMemory("spatial_shape")
                            .HostMemory("batch_size"),
                        SiteSubmanifoldNeighboursCpuOp);

// SiteTablePairs on the CPU: the table's rows checked, then its pairs.
class SiteTablePairsCpuOp : public GuardedOpKernel {
 public:
  explicit SiteTablePairsCpuOp(tensorflow::OpKernelConstruction* ctx) : GuardedOpKernel(ctx, "site_table_pairs") {}

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    const tensorflow::Tensor& neighbours = ctx->input(0);
    int64_t volume = 0;
    const int32_t* table = neighbours.flat<int32_t>().data();
    OP_REQUIRES_OK(ctx, CheckPairsTable(neighbours, table, &volume));
    const int64_t n = neighbours.dim_size(0);
    std::vector<int32_t> splits;
    OP_REQUIRES_OK(ctx, TablePairSplits(table, n, volume, &splits));
    tensorflow::Tensor *in_rows, *out_rows, *offset_splits;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({splits[volume]}), &in_rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, tensorflow::TensorShape({splits[volume]}), &out_rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, tensorflow::TensorShape({volume + 1}), &offset_splits));
    std::copy(splits.begin(), splits.end(), offset_splits->flat<int32_t>().data());
    TablePairsOnCpu(table, n, volume, splits.data(), in_rows->flat<int32_t>().data(),
                    out_rows->flat<int32_t>().data());
  }
};

REGISTER_KERNEL_BUILDER(Name("TfSparseconv>SiteTablePairs").Device(::tensorflow::DEVICE_CPU), SiteTablePairsCpuOp);

}  // namespace tf_sparseconv

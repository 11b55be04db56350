// CPU kernel of SiteKernelMap: a hash table over the sites, probed once per (site,
// kernel offset); work is spread over kernel offsets, so the pairs of each offset come
// out in input-row order whatever the thread count.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "site/kernel_map/site_geometry.h"
#include "site/kernel_map/site_kernel_map_checks.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_sparseconv {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using CPUDevice = Eigen::ThreadPoolDevice;

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

class SiteKernelMapOp : public OpKernel {
 public:
  explicit SiteKernelMapOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Parse(ctx));
    // The GPU's choice of builder; both give this kernel's output, so the CPU's one
    // builder serves either value.
    std::string builder;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("builder", &builder));
  }

  void Compute(OpKernelContext* ctx) override {
    SiteGeometry g;
    OP_REQUIRES_OK(ctx, MakeSiteGeometry(attrs_, ctx->input(1), ctx->input(2), &g));
    const Tensor& coords_t = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckCoordsShape(coords_t, g.d));
    const int64_t n = coords_t.dim_size(0);
    const int width = g.d + 1;
    const int32_t* coords = coords_t.flat<int32_t>().data();
    for (int64_t i = 0; i < n; ++i) {
      for (int j = 0; j < width; ++j) {
        const int64_t limit = j == 0 ? g.batch : g.in_shape[j - 1];
        const int32_t v = coords[i * width + j];
        OP_REQUIRES(ctx, v >= 0 && v < limit, CoordOutOfRangeError(i, j, v, limit));
      }
    }
    SiteHashTable sites(n);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t first = sites.Insert(InputKey(g, coords + i * width), static_cast<int32_t>(i));
      OP_REQUIRES(ctx, first < 0, DuplicateSiteError(first, i));
    }

    // Per offset: (output key, input row) of every pair, in input-row order; for a
    // submanifold map the output row itself, since only existing sites are outputs.
    const bool submanifold = g.mode == SiteMapMode::kSubmanifold;
    const CPUDevice& device = ctx->eigen_device<CPUDevice>();
    std::vector<std::vector<std::pair<int64_t, int32_t>>> by_offset(g.volume);
    device.parallelFor(g.volume, Eigen::TensorOpCost(0, 0, 20.0 * n), [&](Eigen::Index first, Eigen::Index last) {
      int64_t qi[kMaxSpatialDims], o[kMaxSpatialDims];
      for (Eigen::Index q = first; q < last; ++q) {
        g.Unflatten(q, qi);
        auto& pairs = by_offset[q];
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
    int64_t pairs = 0;
    for (const auto& v : by_offset) pairs += v.size();
    OP_REQUIRES(ctx, pairs <= std::numeric_limits<int32_t>::max(),
                tensorflow::errors::InvalidArgument("the kernel map would have ", pairs,
                                                    " pairs; at most 2^31 - 1 are supported"));

    // Output sites: the input sites themselves, or every key some pair reaches, sorted.
    std::vector<int64_t> out_keys;
    std::unique_ptr<SiteHashTable> reached;
    if (!submanifold) {
      out_keys.reserve(pairs);
      for (const auto& v : by_offset)
        for (const auto& p : v) out_keys.push_back(p.first);
      std::sort(out_keys.begin(), out_keys.end());
      out_keys.erase(std::unique(out_keys.begin(), out_keys.end()), out_keys.end());
      OP_REQUIRES(ctx, static_cast<int64_t>(out_keys.size()) <= std::numeric_limits<int32_t>::max(),
                  tensorflow::errors::InvalidArgument("more than 2^31 - 1 output sites"));
      reached = std::make_unique<SiteHashTable>(out_keys.size());
      for (size_t r = 0; r < out_keys.size(); ++r) reached->Insert(out_keys[r], static_cast<int32_t>(r));
    }
    const int64_t m = submanifold ? n : static_cast<int64_t>(out_keys.size());

    Tensor *out_coords, *out_shape, *in_rows, *out_rows, *splits;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m, width}), &out_coords));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({g.d}), &out_shape));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({pairs}), &in_rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({pairs}), &out_rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({g.volume + 1}), &splits));
    int32_t* oc = out_coords->flat<int32_t>().data();
    if (submanifold) {
      if (n > 0) std::memcpy(oc, coords, sizeof(int32_t) * n * width);
    } else {
      for (int64_t r = 0; r < m; ++r) g.DecodeOutKey(out_keys[r], oc + r * width);
    }
    for (int j = 0; j < g.d; ++j) out_shape->flat<int32_t>()(j) = static_cast<int32_t>(g.out_shape[j]);
    int32_t* split = splits->flat<int32_t>().data();
    split[0] = 0;
    for (int64_t q = 0; q < g.volume; ++q) split[q + 1] = split[q] + static_cast<int32_t>(by_offset[q].size());
    int32_t* ir = in_rows->flat<int32_t>().data();
    int32_t* orow = out_rows->flat<int32_t>().data();
    device.parallelFor(g.volume, Eigen::TensorOpCost(0, 0, 20.0 * pairs / g.volume),
                       [&](Eigen::Index first, Eigen::Index last) {
                         for (Eigen::Index q = first; q < last; ++q) {
                           int64_t p = split[q];
                           for (const auto& pair : by_offset[q]) {
                             ir[p] = pair.second;
                             orow[p++] = submanifold ? static_cast<int32_t>(pair.first) : reached->Find(pair.first);
                           }
                         }
                       });
  }

 private:
  SiteMapAttrs attrs_;
};

REGISTER_KERNEL_BUILDER(Name("SiteKernelMap")
                            .Device(::tensorflow::DEVICE_CPU)
                            .HostMemory("spatial_shape")
                            .HostMemory("batch_size"),
                        SiteKernelMapOp);

}  // namespace tf_sparseconv

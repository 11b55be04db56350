// A submanifold map as a neighbour table and back, on the CPU: SiteNeighbourTable's layout
// (site/conv/site_conv_op.cc) from a map's pairs, and the pairs of a submanifold map from
// its table in SiteKernelMap's order. Shared by SiteNeighbourTable, SiteSubmanifoldNeighbours,
// SiteTablePairs and SiteSparseConv's map_is_table on the CPU.
#ifndef TF_SPARSECONV_SITE_KERNEL_MAP_NEIGHBOUR_TABLE_CPU_H_
#define TF_SPARSECONV_SITE_KERNEL_MAP_NEIGHBOUR_TABLE_CPU_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "site/conv/site_conv.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/errors.h"

namespace tf_sparseconv {

// The table [num_out, volume + 2] of a checked map (pairs of offset q at
// splits[q] .. splits[q + 1]): the input row per output row and offset (-1: none), then
// the outputs stably sorted by their masks, which is the order of the GPU's LSD radix sort.
inline void NeighbourTableOnCpu(const int32_t* in_rows, const int32_t* out_rows, const int32_t* splits,
                                int64_t volume, int64_t num_out, int32_t* table) {
  const int64_t width = NeighbourTableWidth(volume);
  std::fill(table, table + num_out * width, -1);
  std::vector<uint32_t> masks(num_out, 0u);
  for (int64_t q = 0; q < volume; ++q) {
    for (int64_t p = splits[q]; p < splits[q + 1]; ++p) {
      table[out_rows[p] * width + q] = in_rows[p];
      masks[out_rows[p]] |= 1u << q;
    }
  }
  std::vector<int32_t> order(num_out);
  for (int64_t o = 0; o < num_out; ++o) order[o] = static_cast<int32_t>(o);
  std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return masks[x] < masks[y]; });
  for (int64_t i = 0; i < num_out; ++i) {
    table[i * width + volume] = static_cast<int32_t>(masks[order[i]]);
    table[i * width + volume + 1] = order[i];
  }
}

// A table that SiteTablePairs and map_is_table accept: [n, volume + 2] with an odd
// volume of at most kMaxNeighbourVolume (*volume) and, where entries is given, every
// neighbour entry in [-1, n) (the CPU reads them; the GPU trusts its own tables' rows).
inline absl::Status CheckPairsTable(const tensorflow::Tensor& table, const int32_t* entries, int64_t* volume) {
  if (table.dims() != 2 || table.dim_size(1) < 3 || table.dim_size(1) - 2 > kMaxNeighbourVolume ||
      (table.dim_size(1) - 2) % 2 == 0) {
    return tensorflow::errors::InvalidArgument(
        "neighbours must be a submanifold map's neighbour table [N, volume + 2] with an odd volume of at most ",
        kMaxNeighbourVolume, ", got shape ", table.shape().DebugString());
  }
  const int64_t n = table.dim_size(0), v = table.dim_size(1) - 2, width = v + 2;
  *volume = v;
  if (entries == nullptr) return absl::OkStatus();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t q = 0; q < v; ++q) {
      const int32_t r = entries[i * width + q];
      if (r < -1 || r >= n) {
        return tensorflow::errors::InvalidArgument("neighbours[", i, ", ", q, "] = ", r, " is outside [-1, ", n,
                                                   "): not a neighbour table of these ", n, " sites");
      }
    }
  }
  return absl::OkStatus();
}

// splits [volume + 1] of the pairs of the submanifold map whose table is table [n, width]:
// offset q has a pair for every row i with table[i, volume - 1 - q] >= 0. At most 2^31 - 1
// pairs, as SiteKernelMap's maps (InvalidArgument otherwise).
inline absl::Status TablePairSplits(const int32_t* table, int64_t n, int64_t volume, std::vector<int32_t>* splits) {
  const int64_t width = NeighbourTableWidth(volume);
  std::vector<int64_t> counts(volume, 0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t q = 0; q < volume; ++q) counts[q] += table[i * width + volume - 1 - q] >= 0;
  }
  int64_t total = 0;
  splits->assign(volume + 1, 0);
  for (int64_t q = 0; q < volume; ++q) {
    total += counts[q];
    if (total > std::numeric_limits<int32_t>::max()) {
      return tensorflow::errors::InvalidArgument("the table's map would have more than 2^31 - 1 pairs");
    }
    (*splits)[q + 1] = static_cast<int32_t>(total);
  }
  return absl::OkStatus();
}

// The pairs themselves, in SiteKernelMap's order: grouped by offset, within one offset by
// input row (i feeds output table[i, volume - 1 - q] through q: the mirrored offset's pair
// of output i reversed).
inline void TablePairsOnCpu(const int32_t* table, int64_t n, int64_t volume, const int32_t* splits,
                            int32_t* in_rows, int32_t* out_rows) {
  const int64_t width = NeighbourTableWidth(volume);
  for (int64_t q = 0; q < volume; ++q) {
    int64_t p = splits[q];
    for (int64_t i = 0; i < n; ++i) {
      const int32_t o = table[i * width + volume - 1 - q];
      if (o < 0) continue;
      in_rows[p] = static_cast<int32_t>(i);
      out_rows[p++] = o;
    }
  }
}

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_KERNEL_MAP_NEIGHBOUR_TABLE_CPU_H_

// SiteKernelMap on the GPU, with two builders (site_kernel_map_gpu.h), both producing
// exactly the CPU kernel's outputs: the checks, the site keys and the pairs here, each
// builder's duplicate check, candidates and output sites in site_kernel_map_hash.cu and
// site_kernel_map_sort.cu.
//
// What both builders share:
//  - The checks run in the CPU's order. The range check records the first flat entry
//    row * (1 + d) + column outside its range. The duplicate check records the lowest
//    later row that repeats an earlier site, paired with the lowest row of those
//    coordinates, which is what the CPU's in-order insertion reports.
//  - Every (kernel offset q, site i) candidate gets one slot found[q * n + i]: the output
//    row that site i feeds through offset q, or -1. An order-preserving compaction of
//    the slots in index order then emits the pairs grouped by offset and, within one
//    offset, by input row: the CPU's order, without sorting the pairs. The index space
//    of every offset is padded to whole compaction tiles, so the pair count of each
//    offset is a tile offset, read back with the op's one copy to the host (waited for
//    asynchronously, site_kernel_map_kernels_gpu.cc).
//  - Output sites of strided and transposed maps: every reached key, sorted, as on the
//    CPU.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/gpu_util.cuh"
#include "site/kernel_map/site_kernel_map.cuh"
#include "site/conv/site_conv_gpu.h"
#include "site/kernel_map/site_kernel_map_gpu.h"

namespace tf_sparseconv {
namespace gpu {
namespace {

// Row-major key of (batch, coordinates) over the input grid, as the CPU's InputKey.
__device__ inline int64_t InputKey(const SiteGeometry& g, const int32_t* site) {
  int64_t key = site[0];
  for (int j = 0; j < g.d; ++j) key = key * g.in_shape[j] + site[1 + j];
  return key;
}

// ---- Checks --------------------------------------------------------------------------

__global__ void CheckCoordsKernel(const int32_t* coords, int64_t total, SiteGeometry g,
                                  SiteMapDeviceReport* report) {
  ChainedKernelBegin();
  const int width = g.d + 1;
  TF_SPARSECONV_GRID_LOOP(e, total) {
    const int j = static_cast<int>(e % width);
    const int64_t limit = j == 0 ? g.batch : g.in_shape[j - 1];
    const int32_t v = coords[e];
    if (v < 0 || v >= limit) RecordFirst(&report->range, e);
  }
}

__global__ void DescribeCoordKernel(const int32_t* coords, SiteMapDeviceReport* report) {
  ChainedKernelBegin();
  if (report->range.first == kNoError) return;
  report->range.detail[0] = coords[report->range.first];
}

// Keys of the sites (0 for all once a coordinate is out of range: the host reports that
// error, and nothing downstream then depends on coordinates outside the grid).
__global__ void SiteKeysKernel(const int32_t* coords, int64_t n, SiteGeometry g,
                               const SiteMapDeviceReport* report, uint64_t* keys, int32_t* rows) {
  ChainedKernelBegin();
  const bool in_range = SitesInRange(report);
  const int width = g.d + 1;
  TF_SPARSECONV_GRID_LOOP(i, n) {
    keys[i] = in_range ? static_cast<uint64_t>(InputKey(g, coords + i * width)) : 0;
    if (rows != nullptr) rows[i] = static_cast<int32_t>(i);
  }
}

// ---- Pairs -----------------------------------------------------------------------------

// Index idx = q * stride + i of the padded candidate space (stride: whole tiles >= n).
struct HasPair {
  const int32_t* found;
  int64_t n;
  int64_t stride;
  __device__ bool operator()(int64_t idx) const {
    const int64_t q = idx / stride;
    const int64_t i = idx - q * stride;
    return i < n && found[q * n + i] >= 0;
  }
};

struct EmitPair {
  const int32_t* found;
  int64_t n;
  int64_t stride;
  const int32_t* slot_rows;  // nullptr: found holds output rows
  int32_t* in_rows;
  int32_t* out_rows;
  __device__ void operator()(int64_t idx, int64_t rank) const {
    const int64_t q = idx / stride;
    const int64_t i = idx - q * stride;
    const int32_t v = found[q * n + i];
    in_rows[rank] = static_cast<int32_t>(i);
    out_rows[rank] = slot_rows != nullptr ? slot_rows[v] : v;
  }
};

// The neighbour columns of a submanifold map's table from found: output row i's entry at
// offset volume - 1 - q is the row site i feeds through q; masks[i] its mask. A block
// stages its kTableRows rows in shared memory (found's reads coalesced, one thread per row
// so the mask needs no atomics) and stores them as one contiguous stretch of the table;
// the last two columns get -1 here and SortNeighbourRows' values after.
constexpr int kTableRows = 128;

__global__ void __launch_bounds__(kTableRows) TableFromFoundKernel(const int32_t* found, int64_t n, int64_t volume,
                                                                   int32_t* table, uint32_t* masks) {
  ChainedKernelBegin();
  __shared__ int32_t rows[kTableRows * (32 + 2)];
  const int64_t width = volume + 2;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kTableRows; first < n;
       first += static_cast<int64_t>(gridDim.x) * kTableRows) {
    const int64_t count = n - first < kTableRows ? n - first : kTableRows;
    const int t = threadIdx.x;
    if (t < count) {
      const int64_t i = first + t;
      uint32_t mask = 0;
      for (int64_t q = 0; q < volume; ++q) {
        const int32_t o = found[q * n + i];
        const int64_t column = volume - 1 - q;
        rows[t * width + column] = o;
        if (o >= 0) mask |= 1u << column;
      }
      rows[t * width + volume] = -1;
      rows[t * width + volume + 1] = -1;
      masks[i] = mask;
    }
    __syncthreads();
    for (int64_t e = t; e < count * width; e += kTableRows) table[first * width + e] = rows[e];
    __syncthreads();
  }
}

__global__ void CheckTableKernel(const int32_t* table, int64_t n, int64_t volume, SiteMapDeviceReport* report) {
  ChainedKernelBegin();
  const int64_t width = volume + 2;
  TF_SPARSECONV_GRID_LOOP(e, n * volume) {
    const int64_t i = e / volume, q = e - i * volume;
    const int32_t v = table[i * width + q];
    if (v < -1 || v >= n) RecordFirst(&report->range, i * width + q);
  }
}

__global__ void DescribeTableEntryKernel(const int32_t* table, SiteMapDeviceReport* report) {
  ChainedKernelBegin();
  if (report->range.first == kNoError) return;
  report->range.detail[0] = table[report->range.first];
}

// A table's pairs (TablePairsGpu): index idx = q * stride + i as for HasPair, site i's
// entry at the mirrored offset.
struct TableHasPair {
  const int32_t* table;
  int64_t n;
  int64_t stride;
  int64_t volume;
  __device__ bool operator()(int64_t idx) const {
    const int64_t q = idx / stride;
    const int64_t i = idx - q * stride;
    return i < n && table[i * (volume + 2) + volume - 1 - q] >= 0;
  }
};

struct TableEmitPair {
  const int32_t* table;
  int64_t stride;
  int64_t volume;
  int32_t* in_rows;
  int32_t* out_rows;
  __device__ void operator()(int64_t idx, int64_t rank) const {
    const int64_t q = idx / stride;
    const int64_t i = idx - q * stride;
    in_rows[rank] = static_cast<int32_t>(i);
    out_rows[rank] = table[i * (volume + 2) + volume - 1 - q];
  }
};

// Offset q's pairs start at the rank of its first tile.
__global__ void OffsetStartsKernel(const int64_t* tile_offsets, int64_t tiles_per_offset, int64_t volume,
                                   const int64_t* total, int64_t* starts) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(q, volume + 1) {
    starts[q] = q < volume ? tile_offsets[q * tiles_per_offset] : *total;
  }
}


size_t ReportBytes(int64_t volume) {
  return sizeof(SiteMapDeviceReport) + sizeof(int64_t) * static_cast<size_t>(volume + 1);
}

// The report in device memory, followed by volume + 1 int64 offset starts (zero), every
// check's `first` kNoError (all bits set).
GpuStatus NewMapReport(Stream stream, Scratch* scratch, int64_t volume, SiteMapDeviceReport** report) {
  const size_t bytes = ReportBytes(volume);
  *report = static_cast<SiteMapDeviceReport*>(scratch->Device(bytes));
  if (*report == nullptr) return GpuStatus::OutOfMemory("report");
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(cudaMemsetAsync(*report, 0, bytes, stream), "report");
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaMemsetAsync(*report, 0xFF, offsetof(SiteMapDeviceReport, pairs), stream), "report");
  return GpuStatus::Ok();
}

// Each offset's index range padded to whole compaction tiles, so that its first tile's
// offset is its first pair.
int64_t OffsetStride(int64_t n) { return (n + kTileSize - 1) / kTileSize * kTileSize; }

// The pairs of every offset, as has_pair says over the index space q * stride + i
// (stride = OffsetStride(n)): their total into report->pairs and each offset's first pair
// into the offset starts after the report.
template <typename Pred>
GpuStatus CountOffsetPairs(Stream stream, Scratch* scratch, Pred has_pair, int64_t stride, int64_t volume,
                           SiteMapDeviceReport* report, Compaction* compaction) {
  TF_SPARSECONV_RETURN_IF_ERROR(
      CountCompaction(stream, scratch, has_pair, volume * stride, &report->pairs, compaction));
  if (compaction->num_tiles > 0) {
    LaunchChained(OffsetStartsKernel, BlocksFor(volume + 1), kThreads, 0, stream, compaction->tile_offsets,
                  stride / kTileSize, volume, &report->pairs, reinterpret_cast<int64_t*>(report + 1));
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("offset splits");
  }
  return GpuStatus::Ok();
}

// The op's one read-back: the report and the offset starts in one copy into pinned host
// memory (*pinned), read once the stream has passed it.
GpuStatus CopyMapReport(Stream stream, Scratch* scratch, const SiteMapDeviceReport* report, int64_t volume,
                        void** pinned) {
  *pinned = scratch->PinnedHost(ReportBytes(volume));
  if (*pinned == nullptr) return GpuStatus::OutOfMemory("report (host)");
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaMemcpyAsync(*pinned, report, ReportBytes(volume), cudaMemcpyDeviceToHost, stream), "report copy");
  return GpuStatus::Ok();
}

// The copied report, and its offset starts as offset splits [volume + 1].
SiteMapDeviceReport ReadMapReport(const void* pinned, int64_t volume, std::vector<int32_t>* splits) {
  SiteMapDeviceReport host;
  std::memcpy(&host, pinned, sizeof(SiteMapDeviceReport));
  splits->resize(static_cast<size_t>(volume + 1));
  const int64_t* starts = reinterpret_cast<const int64_t*>(static_cast<const char*>(pinned) + sizeof(host));
  for (int64_t q = 0; q <= volume; ++q) (*splits)[q] = static_cast<int32_t>(starts[q]);
  return host;
}

}  // namespace

GpuStatus SiteKernelMapGpu::Count(Stream stream, Scratch* scratch, const SiteGeometry& g,
                                  SiteMapBuilder builder, const int32_t* coords, int64_t n, bool count_pairs) {
  g_ = g;
  builder_ = builder;
  coords_ = coords;
  n_ = n;
  const int width = g.d + 1;
  const int64_t volume = g.volume;
  const int64_t candidates = volume * n;
  if (candidates > kMaxSortItems) return GpuStatus{"kernel map", "more than 2^31 - 1 candidates"};

  SiteMapDeviceReport* device_report = nullptr;
  TF_SPARSECONV_RETURN_IF_ERROR(NewMapReport(stream, scratch, volume, &device_report));

  // The per-dimension index of every kernel offset, so that no kernel divides by the
  // kernel extents per candidate.
  std::vector<int32_t> index(static_cast<size_t>(volume * g.d));
  for (int64_t q = 0; q < volume; ++q) {
    int64_t qi[kMaxSpatialDims];
    g.Unflatten(q, qi);
    for (int j = 0; j < g.d; ++j) index[q * g.d + j] = static_cast<int32_t>(qi[j]);
  }
  void* device_index = nullptr;
  TF_SPARSECONV_RETURN_IF_ERROR(
      Upload(stream, scratch, index.data(), sizeof(int32_t) * index.size(), &device_index, "kernel offsets"));
  const int32_t* offset_index = static_cast<const int32_t*>(device_index);

  // Range check, then the keys of the sites.
  if (n > 0) {
    LaunchChained(CheckCoordsKernel, BlocksFor(n * width), kThreads, 0, stream, coords, n * width, g, device_report);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site range check");
    LaunchChained(DescribeCoordKernel, 1, 1, 0, stream, coords, device_report);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site range check");
  }
  const bool sort_sites = builder == SiteMapBuilder::kSort;
  uint64_t* site_keys[2] = {scratch->DeviceArray<uint64_t>(n), nullptr};
  int32_t* site_rows[2] = {nullptr, nullptr};
  if (sort_sites) {
    site_keys[1] = scratch->DeviceArray<uint64_t>(n);
    site_rows[0] = scratch->DeviceArray<int32_t>(n);
    site_rows[1] = scratch->DeviceArray<int32_t>(n);
    if (!site_keys[1] || !site_rows[0] || !site_rows[1]) return GpuStatus::OutOfMemory("site keys");
  }
  found_ = scratch->DeviceArray<int32_t>(candidates);
  if (!site_keys[0] || !found_) return GpuStatus::OutOfMemory("site keys");
  if (n > 0) {
    LaunchChained(SiteKeysKernel, BlocksFor(n), kThreads, 0, stream, coords, n, g, device_report, site_keys[0],
                  site_rows[0]);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site keys");
  }

  // The builder's duplicate check, found (one slot per (offset, site) candidate) and, for
  // strided and transposed maps, the output sites.
  TF_SPARSECONV_RETURN_IF_ERROR(
      sort_sites ? CountSort(stream, scratch, offset_index, site_keys, site_rows, device_report)
                 : CountHash(stream, scratch, offset_index, site_keys, site_rows, device_report));

  offset_stride_ = OffsetStride(n);
  if (count_pairs) {
    TF_SPARSECONV_RETURN_IF_ERROR(CountOffsetPairs(stream, scratch, HasPair{found_, n, offset_stride_},
                                                   offset_stride_, volume, device_report, &pair_compaction_));
  }
  return CopyMapReport(stream, scratch, device_report, volume, &pinned_report_);
}

void SiteKernelMapGpu::ReadReport(SiteMapReport* report) {
  const SiteMapDeviceReport host = ReadMapReport(pinned_report_, g_.volume, &report->offset_splits);
  report->range = host.range;
  report->duplicate = host.duplicate;
  report->table_full = host.table_full;
  report->pairs = host.pairs;
  report->out_sites = g_.mode == SiteMapMode::kSubmanifold ? n_ : host.out_sites;
  pairs_ = report->pairs;
  out_sites_ = report->out_sites;
}

GpuStatus SiteKernelMapGpu::Write(Stream stream, Scratch* scratch, int32_t* out_coords, int32_t* in_rows,
                                  int32_t* out_rows) {
  const int width = g_.d + 1;
  const int32_t* slot_rows = nullptr;
  if (g_.mode == SiteMapMode::kSubmanifold) {
    if (n_ > 0) {
      TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
          cudaMemcpyAsync(out_coords, coords_, sizeof(int32_t) * n_ * width, cudaMemcpyDeviceToDevice, stream),
          "output sites");
    }
  } else if (builder_ == SiteMapBuilder::kHash) {
    TF_SPARSECONV_RETURN_IF_ERROR(WriteHash(stream, scratch, out_coords));
    slot_rows = out_table_rows_;
  } else {
    TF_SPARSECONV_RETURN_IF_ERROR(WriteSort(stream, out_coords));
  }
  return WriteCompaction(stream, pair_compaction_, HasPair{found_, n_, offset_stride_},
                         EmitPair{found_, n_, offset_stride_, slot_rows, in_rows, out_rows});
}

GpuStatus SiteKernelMapGpu::WriteNeighbourTable(Stream stream, Scratch* scratch, int32_t* table) {
  if (g_.mode != SiteMapMode::kSubmanifold || g_.volume > 32) {
    return GpuStatus{"neighbour table", "a table holds a submanifold map of at most 32 offsets"};
  }
  if (n_ == 0) return GpuStatus::Ok();
  uint32_t* masks = scratch->DeviceArray<uint32_t>(n_);
  if (masks == nullptr) return GpuStatus::OutOfMemory("neighbour table");
  const int64_t blocks = (n_ + kTableRows - 1) / kTableRows;
  LaunchChained(TableFromFoundKernel, static_cast<unsigned int>(blocks < 65536 ? blocks : 65536), kTableRows, 0, stream,
                found_, n_, g_.volume, table, masks);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("neighbour table");
  return SortNeighbourRows(stream, scratch, masks, n_, g_.volume, table);
}

GpuStatus TablePairsGpu::Count(Stream stream, Scratch* scratch, const int32_t* table, int64_t n, int64_t volume) {
  table_ = table;
  n_ = n;
  volume_ = volume;
  SiteMapDeviceReport* device_report = nullptr;
  TF_SPARSECONV_RETURN_IF_ERROR(NewMapReport(stream, scratch, volume, &device_report));
  if (n * volume > 0) {
    LaunchChained(CheckTableKernel, BlocksFor(n * volume), kThreads, 0, stream, table, n, volume, device_report);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("table check");
    LaunchChained(DescribeTableEntryKernel, 1, 1, 0, stream, table, device_report);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("table check");
  }
  offset_stride_ = OffsetStride(n);
  TF_SPARSECONV_RETURN_IF_ERROR(CountOffsetPairs(stream, scratch, TableHasPair{table, n, offset_stride_, volume},
                                                 offset_stride_, volume, device_report, &pair_compaction_));
  return CopyMapReport(stream, scratch, device_report, volume, &pinned_report_);
}

void TablePairsGpu::ReadReport(TablePairsReport* report) {
  const SiteMapDeviceReport host = ReadMapReport(pinned_report_, volume_, &report->offset_splits);
  report->range = host.range;
  report->pairs = host.pairs;
}

GpuStatus TablePairsGpu::Write(Stream stream, int32_t* in_rows, int32_t* out_rows) {
  return WriteCompaction(stream, pair_compaction_, TableHasPair{table_, n_, offset_stride_, volume_},
                         TableEmitPair{table_, offset_stride_, volume_, in_rows, out_rows});
}

}  // namespace gpu
}  // namespace tf_sparseconv

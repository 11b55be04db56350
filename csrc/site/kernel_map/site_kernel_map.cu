// SiteKernelMap on the GPU, with two builders (site_kernel_map_gpu.h), both producing
// exactly the CPU kernel's outputs.
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
//    offset is a tile offset, read back with the op's one host round trip.
//  - Output sites of strided and transposed maps: every reached key, sorted, as on the
//    CPU.
#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/gpu_util.cuh"
#include "site/kernel_map/site_kernel_map_gpu.h"

namespace tf_sparseconv {
namespace gpu {
namespace {

constexpr unsigned long long kEmptyKey = ~0ull;  // no site key is 2^64 - 1 (keys < 2^63)

// Queries per chunk of the sort builder's searches: one thread each.
constexpr int kQueryChunk = kThreads;
// Keys a chunk stages in shared memory for its fine search (8 KiB); a chunk of
// consecutive sorted sites shifted by one offset usually hits about kQueryChunk keys.
constexpr int kStagedKeys = 1024;

// The report in device memory, followed by volume + 1 int64 offset starts; the whole
// block is copied to the host in one piece.
struct DeviceReport {
  CheckSlot range;
  CheckSlot duplicate;
  CheckSlot table_full;
  int64_t pairs;
  int64_t out_sites;
};

__device__ inline bool SitesInRange(const DeviceReport* report) {
  return report->range.first == kNoError;
}

// Row-major key of (batch, coordinates) over the input grid, as the CPU's InputKey.
__device__ inline int64_t InputKey(const SiteGeometry& g, const int32_t* site) {
  int64_t key = site[0];
  for (int j = 0; j < g.d; ++j) key = key * g.in_shape[j] + site[1 + j];
  return key;
}

__device__ inline void LoadOffset(const int32_t* offset_index, int d, int64_t q, int64_t* qi) {
  for (int j = 0; j < d; ++j) qi[j] = offset_index[q * d + j];
}

// First position p in [0, n) with a[p] > value (n if none).
__device__ inline int64_t UpperBound(const int64_t* a, int64_t n, int64_t value) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (a[mid] <= value) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// ---- Checks --------------------------------------------------------------------------

__global__ void CheckCoordsKernel(const int32_t* coords, int64_t total, SiteGeometry g,
                                  DeviceReport* report) {
  const int width = g.d + 1;
  TF_SPARSECONV_GRID_LOOP(e, total) {
    const int j = static_cast<int>(e % width);
    const int64_t limit = j == 0 ? g.batch : g.in_shape[j - 1];
    const int32_t v = coords[e];
    if (v < 0 || v >= limit) RecordFirst(&report->range, e);
  }
}

__global__ void DescribeCoordKernel(const int32_t* coords, DeviceReport* report) {
  if (report->range.first == kNoError) return;
  report->range.detail[0] = coords[report->range.first];
}

// Keys of the sites (0 for all once a coordinate is out of range: the host reports that
// error, and nothing downstream then depends on coordinates outside the grid).
__global__ void SiteKeysKernel(const int32_t* coords, int64_t n, SiteGeometry g,
                               const DeviceReport* report, uint64_t* keys, int32_t* rows) {
  const bool in_range = SitesInRange(report);
  const int width = g.d + 1;
  TF_SPARSECONV_GRID_LOOP(i, n) {
    keys[i] = in_range ? static_cast<uint64_t>(InputKey(g, coords + i * width)) : 0;
    if (rows != nullptr) rows[i] = static_cast<int32_t>(i);
  }
}

// After a stable sort by key, equal keys hold their rows in ascending order: the second
// entry of a run is the lowest later row of those coordinates, the first the earliest.
__global__ void SortedDuplicatesKernel(const uint64_t* keys, const int32_t* rows, int64_t n,
                                       DeviceReport* report) {
  TF_SPARSECONV_GRID_LOOP(p, n) {
    if (p == 0 || keys[p] != keys[p - 1]) continue;
    if (p >= 2 && keys[p - 2] == keys[p - 1]) continue;  // the third or later of its run
    RecordFirst(&report->duplicate, static_cast<int64_t>((static_cast<uint64_t>(rows[p]) << 32) |
                                                         static_cast<uint32_t>(rows[p - 1])));
  }
}

// ---- Hash tables ---------------------------------------------------------------------

// splitmix64 finaliser, as the CPU table.
__device__ inline uint64_t HashKey(uint64_t key) {
  uint64_t z = key + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Open addressing with linear probing; the capacity is a power of two at least twice
// the number of distinct keys, so probe sequences stay short and an empty slot ends
// every search. The probe count is bounded all the same, so that a wrong capacity
// shows up as an error instead of a hang.
struct DeviceTable {
  unsigned long long* keys;  // kEmptyKey where free
  int32_t* rows;
  uint64_t mask;             // capacity - 1
};

// The slot that holds key (claimed if the key is new), or -1 if the table is full.
__device__ inline int64_t TableInsert(const DeviceTable& t, unsigned long long key) {
  uint64_t s = HashKey(key) & t.mask;
  for (uint64_t probes = 0; probes <= t.mask; ++probes, s = (s + 1) & t.mask) {
    const unsigned long long prev = atomicCAS(&t.keys[s], kEmptyKey, key);
    if (prev == kEmptyKey || prev == key) return static_cast<int64_t>(s);
  }
  return -1;
}

// Read-only probe, in a kernel after the inserting one.
__device__ inline int32_t TableFind(const DeviceTable& t, unsigned long long key) {
  uint64_t s = HashKey(key) & t.mask;
  for (uint64_t probes = 0; probes <= t.mask; ++probes, s = (s + 1) & t.mask) {
    const unsigned long long k = t.keys[s];
    if (k == key) return t.rows[s];
    if (k == kEmptyKey) return -1;
  }
  return -1;
}

__global__ void FillKernel(int32_t* a, int64_t n, int32_t value) {
  TF_SPARSECONV_GRID_LOOP(i, n) { a[i] = value; }
}

// Every site claims the slot of its key; the slot keeps the lowest row (atomicMin), the
// row the CPU's in-order insertion keeps.
__global__ void InsertSitesKernel(const uint64_t* keys, int64_t n, DeviceTable t,
                                  int64_t* slot_of, DeviceReport* report) {
  TF_SPARSECONV_GRID_LOOP(i, n) {
    const int64_t s = TableInsert(t, keys[i]);
    slot_of[i] = s;
    if (s < 0) {
      RecordFirst(&report->table_full, i);
      continue;
    }
    atomicMin(&t.rows[s], static_cast<int32_t>(i));
  }
}

__global__ void HashDuplicatesKernel(const int32_t* table_rows, const int64_t* slot_of, int64_t n,
                                     DeviceReport* report) {
  TF_SPARSECONV_GRID_LOOP(i, n) {
    if (slot_of[i] < 0) continue;
    const int32_t first = table_rows[slot_of[i]];
    if (first != i) {
      RecordFirst(&report->duplicate,
                  static_cast<int64_t>((static_cast<uint64_t>(i) << 32) | static_cast<uint32_t>(first)));
    }
  }
}

// Submanifold, hash: one probe per candidate; i varies fastest, so the coordinate reads
// and the found writes are coalesced.
__global__ void ProbeSubmanifoldKernel(const int32_t* coords, int64_t n, SiteGeometry g,
                                       const int32_t* offset_index, DeviceTable t,
                                       const DeviceReport* report, int32_t* found) {
  const bool in_range = SitesInRange(report);
  const int width = g.d + 1;
  TF_SPARSECONV_GRID_LOOP(idx, g.volume * n) {
    const int64_t q = idx / n;
    const int64_t i = idx - q * n;
    int32_t row = -1;
    int64_t qi[kMaxSpatialDims], o[kMaxSpatialDims];
    LoadOffset(offset_index, g.d, q, qi);
    const int32_t* site = coords + i * width;
    if (in_range && g.OutputOf(site + 1, qi, o)) {
      row = TableFind(t, static_cast<unsigned long long>(g.OutKey(site[0], o)));
    }
    found[idx] = row;
  }
}

// Strided and transposed, hash: every reached key claims a slot of the output table;
// found holds the slot until the distinct keys are sorted (Write).
__global__ void InsertCandidatesKernel(const int32_t* coords, int64_t n, SiteGeometry g,
                                       const int32_t* offset_index, DeviceTable t,
                                       DeviceReport* report, int32_t* found) {
  const bool in_range = SitesInRange(report);
  const int width = g.d + 1;
  TF_SPARSECONV_GRID_LOOP(idx, g.volume * n) {
    const int64_t q = idx / n;
    const int64_t i = idx - q * n;
    int32_t slot = -1;
    int64_t qi[kMaxSpatialDims], o[kMaxSpatialDims];
    LoadOffset(offset_index, g.d, q, qi);
    const int32_t* site = coords + i * width;
    if (in_range && g.OutputOf(site + 1, qi, o)) {
      const int64_t s = TableInsert(t, static_cast<unsigned long long>(g.OutKey(site[0], o)));
      if (s < 0) {
        RecordFirst(&report->table_full, idx);
      } else {
        slot = static_cast<int32_t>(s);  // capacity <= 2^31
      }
    }
    found[idx] = slot;
  }
}

struct IsOccupied {
  const unsigned long long* keys;
  __device__ bool operator()(int64_t s) const { return keys[s] != kEmptyKey; }
};

struct EmitOccupied {
  const unsigned long long* keys;
  uint64_t* out_keys;
  int32_t* out_slots;
  __device__ void operator()(int64_t s, int64_t rank) const {
    out_keys[rank] = keys[s];
    out_slots[rank] = static_cast<int32_t>(s);
  }
};

// The sorted distinct keys are the output sites: slot -> output row, and the coordinates.
__global__ void RankSlotsKernel(const uint64_t* keys, const int32_t* slots, int64_t m, SiteGeometry g,
                                int32_t* slot_rows, int32_t* out_coords) {
  const int width = g.d + 1;
  TF_SPARSECONV_GRID_LOOP(r, m) {
    slot_rows[slots[r]] = static_cast<int32_t>(r);
    g.DecodeOutKey(static_cast<int64_t>(keys[r]), out_coords + r * width);
  }
}

// ---- Sort builder ----------------------------------------------------------------------

__global__ void SortedCoordsKernel(const int32_t* coords, const int32_t* rows, int64_t n, int width,
                                   int32_t* sorted_coords) {
  TF_SPARSECONV_GRID_LOOP(e, n * width) {
    const int64_t t = e / width;
    sorted_coords[e] = coords[static_cast<int64_t>(rows[t]) * width + (e - t * width)];
  }
}

// A submanifold query of offset q is the site's key plus a constant whenever its
// coordinates stay inside the grid (the only queries that can match), so the queries of
// consecutive sorted sites are sorted too: Minuet's segmented query sorting, with the
// sort of the sites as the only sort.
__device__ inline int64_t SubmanifoldKeyDelta(const SiteGeometry& g, const int64_t* qi) {
  int64_t delta = 0, stride = 1;
  for (int j = g.d - 1; j >= 0; --j) {
    delta -= (qi[j] - (g.kernel[j] - 1) / 2) * g.dilation[j] * stride;
    stride *= g.in_shape[j];
  }
  return delta;
}

// The coarse traversal: chunk c of offset q (sorted sites c * kQueryChunk ...) can only
// hit keys in [key(first site) + delta, key(last site) + delta]; that range of the
// sorted keys is [ranges[2 item], ranges[2 item + 1]). Neighbouring threads search
// neighbouring values, so the upper levels of the searches stay in cache.
__global__ void QueryRangesKernel(SiteGeometry g, const int32_t* offset_index, const int64_t* keys,
                                  int64_t n, int64_t chunks, int32_t* ranges) {
  TF_SPARSECONV_GRID_LOOP(item, g.volume * chunks) {
    const int64_t q = item / chunks;
    const int64_t c = item - q * chunks;
    int64_t qi[kMaxSpatialDims];
    LoadOffset(offset_index, g.d, q, qi);
    const int64_t delta = SubmanifoldKeyDelta(g, qi);
    const int64_t first = c * kQueryChunk;
    const int64_t last = (first + kQueryChunk < n ? first + kQueryChunk : n) - 1;
    ranges[2 * item] = static_cast<int32_t>(LowerBound(keys, n, keys[first] + delta));
    ranges[2 * item + 1] = static_cast<int32_t>(UpperBound(keys, n, keys[last] + delta));
  }
}

// The fine traversal: one block per (offset, chunk) stages the chunk's key range in
// shared memory and every thread binary-searches its query there (in global memory,
// within the same narrow range, when the range is too long to stage).
__global__ void __launch_bounds__(kThreads)
    SortedSearchKernel(SiteGeometry g, const int32_t* offset_index, const int64_t* keys,
                       const int32_t* rows, const int32_t* sorted_coords, int64_t n, int64_t chunks,
                       const int32_t* ranges, int32_t* found) {
  __shared__ int64_t staged[kStagedKeys];
  const int width = g.d + 1;
  const int64_t items = g.volume * chunks;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t q = item / chunks;
    const int64_t c = item - q * chunks;
    const int64_t lo = ranges[2 * item];
    const int64_t count = ranges[2 * item + 1] - lo;
    const bool stage = count <= kStagedKeys;
    if (stage) {
      for (int64_t k = threadIdx.x; k < count; k += blockDim.x) staged[k] = keys[lo + k];
    }
    __syncthreads();
    const int64_t t = c * kQueryChunk + threadIdx.x;
    if (t < n) {
      int64_t qi[kMaxSpatialDims], o[kMaxSpatialDims];
      LoadOffset(offset_index, g.d, q, qi);
      const int32_t* site = sorted_coords + t * width;
      int32_t row = -1;
      if (g.OutputOf(site + 1, qi, o)) {
        const int64_t key = g.OutKey(site[0], o);
        const int64_t* range = stage ? staged : keys + lo;
        const int64_t pos = LowerBound(range, count, key);
        if (pos < count && range[pos] == key) row = rows[lo + pos];
      }
      found[q * n + rows[t]] = row;
    }
    __syncthreads();  // staged is refilled by the next item
  }
}

// Strided and transposed, sort: every candidate's reached key (no_output if none) and
// its own index, for a radix sort that brings equal keys together.
__global__ void CandidateKeysKernel(const int32_t* coords, int64_t n, SiteGeometry g,
                                    const int32_t* offset_index, const DeviceReport* report,
                                    uint64_t no_output, uint64_t* keys, int32_t* index,
                                    int32_t* found) {
  const bool in_range = SitesInRange(report);
  const int width = g.d + 1;
  TF_SPARSECONV_GRID_LOOP(idx, g.volume * n) {
    const int64_t q = idx / n;
    const int64_t i = idx - q * n;
    int64_t qi[kMaxSpatialDims], o[kMaxSpatialDims];
    LoadOffset(offset_index, g.d, q, qi);
    const int32_t* site = coords + i * width;
    const bool reached = in_range && g.OutputOf(site + 1, qi, o);
    keys[idx] = reached ? static_cast<uint64_t>(g.OutKey(site[0], o)) : no_output;
    index[idx] = static_cast<int32_t>(idx);  // volume * n <= 2^31 - 1
    found[idx] = -1;
  }
}

struct IsFirstOfRun {
  const uint64_t* keys;
  uint64_t no_output;
  __device__ bool operator()(int64_t p) const {
    return keys[p] != no_output && (p == 0 || keys[p] != keys[p - 1]);
  }
};

// The rank of a run is its output row; a run is at most `volume` long (one input per
// offset and output), so its first entry labels the whole run.
struct EmitRun {
  const uint64_t* keys;
  const int32_t* index;
  int64_t total;
  uint64_t* unique_keys;
  int32_t* found;
  __device__ void operator()(int64_t p, int64_t rank) const {
    const uint64_t key = keys[p];
    unique_keys[rank] = key;
    for (int64_t r = p; r < total && keys[r] == key; ++r) found[index[r]] = static_cast<int32_t>(rank);
  }
};

__global__ void DecodeKeysKernel(const uint64_t* keys, int64_t m, SiteGeometry g, int32_t* out_coords) {
  const int width = g.d + 1;
  TF_SPARSECONV_GRID_LOOP(r, m) { g.DecodeOutKey(static_cast<int64_t>(keys[r]), out_coords + r * width); }
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

// Offset q's pairs start at the rank of its first tile.
__global__ void OffsetStartsKernel(const int64_t* tile_offsets, int64_t tiles_per_offset, int64_t volume,
                                   const int64_t* total, int64_t* starts) {
  TF_SPARSECONV_GRID_LOOP(q, volume + 1) {
    starts[q] = q < volume ? tile_offsets[q * tiles_per_offset] : *total;
  }
}

inline int64_t PowerOfTwoAtLeast(int64_t n) {
  int64_t p = 16;
  while (p < n) p <<= 1;
  return p;
}

inline int64_t Gcd(int64_t a, int64_t b) {
  while (b != 0) {
    const int64_t r = a % b;
    a = b;
    b = r;
  }
  return a;
}

// An upper bound on the output sites of a strided or transposed map: per dimension, an
// input coordinate reaches at most ceil(k / period) outputs, period = s / gcd(s, dil)
// (strided: (x + p - q dil) must be a multiple of s), or k (transposed); and there are
// no more outputs than output cells.
int64_t ReachableSitesBound(const SiteGeometry& g, int64_t n) {
  int64_t per_site = 1;
  for (int j = 0; j < g.d; ++j) {
    int64_t reach = g.kernel[j];
    if (g.mode == SiteMapMode::kStrided) {
      const int64_t period = g.stride[j] / Gcd(g.stride[j], g.dilation[j]);
      reach = (g.kernel[j] + period - 1) / period;
    }
    per_site *= reach;
  }
  const int64_t by_sites = n * per_site;  // <= volume * n <= 2^31 - 1
  const int64_t cells = g.batch * g.out_spatial_size;
  return by_sites < cells ? by_sites : cells;
}

}  // namespace

GpuStatus SiteKernelMapGpu::Count(Stream stream, Scratch* scratch, const SiteGeometry& g,
                                  SiteMapBuilder builder, const int32_t* coords, int64_t n,
                                  SiteMapReport* report) {
  g_ = g;
  builder_ = builder;
  coords_ = coords;
  n_ = n;
  const int width = g.d + 1;
  const int64_t volume = g.volume;
  const int64_t candidates = volume * n;
  if (candidates > kMaxSortItems) return GpuStatus{"kernel map", "more than 2^31 - 1 candidates"};
  const bool submanifold = g.mode == SiteMapMode::kSubmanifold;

  const size_t report_bytes = sizeof(DeviceReport) + sizeof(int64_t) * static_cast<size_t>(volume + 1);
  DeviceReport* device_report = static_cast<DeviceReport*>(scratch->Device(report_bytes));
  if (device_report == nullptr) return GpuStatus::OutOfMemory("report");
  int64_t* offset_starts = reinterpret_cast<int64_t*>(device_report + 1);
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(cudaMemsetAsync(device_report, 0, report_bytes, stream), "report");
  // All bits set: every check's `first` is kNoError.
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaMemsetAsync(device_report, 0xFF, offsetof(DeviceReport, pairs), stream), "report");

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
    CheckCoordsKernel<<<BlocksFor(n * width), kThreads, 0, stream>>>(coords, n * width, g, device_report);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site range check");
    DescribeCoordKernel<<<1, 1, 0, stream>>>(coords, device_report);
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
    SiteKeysKernel<<<BlocksFor(n), kThreads, 0, stream>>>(coords, n, g, device_report, site_keys[0],
                                                          site_rows[0]);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site keys");
  }
  int64_t in_cells = g.batch;  // MakeSiteGeometry checked that this product fits
  for (int j = 0; j < g.d; ++j) in_cells *= g.in_shape[j];
  const int64_t out_cells = g.batch * g.out_spatial_size;

  // Duplicate check; the sort builder keeps the sorted sites for its searches.
  DeviceTable sites = {nullptr, nullptr, 0};
  const uint64_t* sorted_keys = nullptr;
  const int32_t* sorted_rows = nullptr;
  if (sort_sites) {
    int current = 0;
    TF_SPARSECONV_RETURN_IF_ERROR(SortPairs(stream, scratch, site_keys, site_rows, n,
                                            BitsFor(static_cast<uint64_t>(in_cells - 1)), &current));
    sorted_keys = site_keys[current];
    sorted_rows = site_rows[current];
    if (n > 0) {
      SortedDuplicatesKernel<<<BlocksFor(n), kThreads, 0, stream>>>(sorted_keys, sorted_rows, n,
                                                                    device_report);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("duplicate check");
    }
  } else {
    const int64_t capacity = PowerOfTwoAtLeast(2 * n);
    sites.keys = scratch->DeviceArray<unsigned long long>(capacity);
    sites.rows = scratch->DeviceArray<int32_t>(capacity);
    sites.mask = static_cast<uint64_t>(capacity - 1);
    int64_t* slot_of = scratch->DeviceArray<int64_t>(n);
    if (!sites.keys || !sites.rows || !slot_of) return GpuStatus::OutOfMemory("site table");
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
        cudaMemsetAsync(sites.keys, 0xFF, sizeof(unsigned long long) * capacity, stream), "site table");
    FillKernel<<<BlocksFor(capacity), kThreads, 0, stream>>>(sites.rows, capacity, INT32_MAX);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site table");
    if (n > 0) {
      InsertSitesKernel<<<BlocksFor(n), kThreads, 0, stream>>>(site_keys[0], n, sites, slot_of, device_report);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site table");
      HashDuplicatesKernel<<<BlocksFor(n), kThreads, 0, stream>>>(sites.rows, slot_of, n, device_report);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("duplicate check");
    }
  }

  // found: one slot per (offset, site) candidate.
  if (submanifold && !sort_sites) {
    if (candidates > 0) {
      ProbeSubmanifoldKernel<<<BlocksFor(candidates), kThreads, 0, stream>>>(coords, n, g, offset_index, sites,
                                                                             device_report, found_);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site probes");
    }
  } else if (submanifold) {
    if (candidates > 0) {
      const int64_t chunks = (n + kQueryChunk - 1) / kQueryChunk;
      int32_t* sorted_coords = scratch->DeviceArray<int32_t>(n * width);
      int32_t* ranges = scratch->DeviceArray<int32_t>(2 * volume * chunks);
      if (!sorted_coords || !ranges) return GpuStatus::OutOfMemory("site searches");
      SortedCoordsKernel<<<BlocksFor(n * width), kThreads, 0, stream>>>(coords, sorted_rows, n, width,
                                                                       sorted_coords);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site searches");
      const int64_t* keys = reinterpret_cast<const int64_t*>(sorted_keys);  // keys < 2^63
      QueryRangesKernel<<<BlocksFor(volume * chunks), kThreads, 0, stream>>>(g, offset_index, keys, n, chunks,
                                                                            ranges);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site searches");
      const int64_t items = volume * chunks;
      const unsigned int blocks = static_cast<unsigned int>(items < (1 << 20) ? items : (1 << 20));
      SortedSearchKernel<<<blocks, kThreads, 0, stream>>>(g, offset_index, keys, sorted_rows, sorted_coords, n,
                                                          chunks, ranges, found_);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site searches");
    }
  } else if (!sort_sites) {
    // Strided or transposed, hash: deduplicate the reached keys in a second table.
    int64_t capacity = PowerOfTwoAtLeast(2 * ReachableSitesBound(g, n));
    if (capacity > (int64_t{1} << 31)) capacity = int64_t{1} << 31;  // slots fit int32; > volume * n
    DeviceTable reached;
    reached.keys = scratch->DeviceArray<unsigned long long>(capacity);
    reached.rows = scratch->DeviceArray<int32_t>(capacity);
    reached.mask = static_cast<uint64_t>(capacity - 1);
    if (!reached.keys || !reached.rows) return GpuStatus::OutOfMemory("output site table");
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
        cudaMemsetAsync(reached.keys, 0xFF, sizeof(unsigned long long) * capacity, stream), "output site table");
    if (candidates > 0) {
      InsertCandidatesKernel<<<BlocksFor(candidates), kThreads, 0, stream>>>(coords, n, g, offset_index, reached,
                                                                             device_report, found_);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("output site table");
    }
    out_table_keys_ = reached.keys;
    out_table_rows_ = reached.rows;
    out_table_capacity_ = capacity;
    TF_SPARSECONV_RETURN_IF_ERROR(CountCompaction(stream, scratch, IsOccupied{reached.keys}, capacity,
                                                  &device_report->out_sites, &occupied_));
  } else {
    // Strided or transposed, sort: sort every candidate's reached key; each run of equal
    // keys is one output site, its rank the output row.
    const uint64_t no_output = static_cast<uint64_t>(out_cells);
    uint64_t* keys[2] = {scratch->DeviceArray<uint64_t>(candidates), scratch->DeviceArray<uint64_t>(candidates)};
    int32_t* index[2] = {scratch->DeviceArray<int32_t>(candidates), scratch->DeviceArray<int32_t>(candidates)};
    if (!keys[0] || !keys[1] || !index[0] || !index[1]) return GpuStatus::OutOfMemory("candidate keys");
    if (candidates > 0) {
      CandidateKeysKernel<<<BlocksFor(candidates), kThreads, 0, stream>>>(coords, n, g, offset_index, device_report,
                                                                          no_output, keys[0], index[0], found_);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("candidate keys");
    }
    int current = 0;
    TF_SPARSECONV_RETURN_IF_ERROR(
        SortPairs(stream, scratch, keys, index, candidates, BitsFor(no_output), &current));
    const IsFirstOfRun first_of_run{keys[current], no_output};
    Compaction runs;
    TF_SPARSECONV_RETURN_IF_ERROR(
        CountCompaction(stream, scratch, first_of_run, candidates, &device_report->out_sites, &runs));
    TF_SPARSECONV_RETURN_IF_ERROR(WriteCompaction(
        stream, runs, first_of_run, EmitRun{keys[current], index[current], candidates, keys[1 - current], found_}));
    out_keys_ = keys[1 - current];
  }

  // Pair counts: each offset's index range is padded to whole tiles, so its first tile's
  // offset is its first pair.
  const int64_t tiles_per_offset = (n + kTileSize - 1) / kTileSize;
  offset_stride_ = tiles_per_offset * kTileSize;
  const HasPair has_pair{found_, n, offset_stride_};
  TF_SPARSECONV_RETURN_IF_ERROR(
      CountCompaction(stream, scratch, has_pair, volume * offset_stride_, &device_report->pairs, &pair_compaction_));
  if (pair_compaction_.num_tiles > 0) {
    OffsetStartsKernel<<<BlocksFor(volume + 1), kThreads, 0, stream>>>(
        pair_compaction_.tile_offsets, tiles_per_offset, volume, &device_report->pairs, offset_starts);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("offset splits");
  }

  // The op's one host round trip: the report and the offset starts in one copy.
  void* pinned = scratch->PinnedHost(report_bytes);
  if (pinned == nullptr) return GpuStatus::OutOfMemory("report (host)");
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaMemcpyAsync(pinned, device_report, report_bytes, cudaMemcpyDeviceToHost, stream), "report copy");
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(cudaStreamSynchronize(stream), "stream synchronize");
  DeviceReport host;
  std::memcpy(&host, pinned, sizeof(DeviceReport));
  report->range = host.range;
  report->duplicate = host.duplicate;
  report->table_full = host.table_full;
  report->pairs = host.pairs;
  report->out_sites = submanifold ? n : host.out_sites;
  report->offset_splits.resize(static_cast<size_t>(volume + 1));
  const int64_t* starts = reinterpret_cast<const int64_t*>(static_cast<const char*>(pinned) + sizeof(DeviceReport));
  for (int64_t q = 0; q <= volume; ++q) report->offset_splits[q] = static_cast<int32_t>(starts[q]);
  pairs_ = report->pairs;
  out_sites_ = report->out_sites;
  return GpuStatus::Ok();
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
    // The distinct reached keys in slot order, sorted: their ranks are the output rows.
    if (out_sites_ > 0) {
      uint64_t* keys[2] = {scratch->DeviceArray<uint64_t>(out_sites_), scratch->DeviceArray<uint64_t>(out_sites_)};
      int32_t* slots[2] = {scratch->DeviceArray<int32_t>(out_sites_), scratch->DeviceArray<int32_t>(out_sites_)};
      if (!keys[0] || !keys[1] || !slots[0] || !slots[1]) return GpuStatus::OutOfMemory("output sites");
      TF_SPARSECONV_RETURN_IF_ERROR(WriteCompaction(stream, occupied_, IsOccupied{out_table_keys_},
                                                    EmitOccupied{out_table_keys_, keys[0], slots[0]}));
      int current = 0;
      const uint64_t out_cells = static_cast<uint64_t>(g_.batch * g_.out_spatial_size);
      TF_SPARSECONV_RETURN_IF_ERROR(
          SortPairs(stream, scratch, keys, slots, out_sites_, BitsFor(out_cells - 1), &current));
      RankSlotsKernel<<<BlocksFor(out_sites_), kThreads, 0, stream>>>(keys[current], slots[current], out_sites_, g_,
                                                                      out_table_rows_, out_coords);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("output sites");
    }
    slot_rows = out_table_rows_;
  } else if (out_sites_ > 0) {
    DecodeKeysKernel<<<BlocksFor(out_sites_), kThreads, 0, stream>>>(out_keys_, out_sites_, g_, out_coords);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("output sites");
  }
  return WriteCompaction(stream, pair_compaction_, HasPair{found_, n_, offset_stride_},
                         EmitPair{found_, n_, offset_stride_, slot_rows, in_rows, out_rows});
}

}  // namespace gpu
}  // namespace tf_sparseconv

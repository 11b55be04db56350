// SiteKernelMap's hash builder on the GPU (SiteMapBuilder::kHash, site_kernel_map_gpu.h):
// open-addressing tables of the site keys and, for strided and transposed maps, of the
// reached keys.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "common/gpu_util.cuh"
#include "site/kernel_map/site_kernel_map.cuh"
#include "site/kernel_map/site_kernel_map_gpu.h"

namespace tf_sparseconv {
namespace gpu {
namespace {

constexpr unsigned long long kEmptyKey = ~0ull;  // no site key is 2^64 - 1 (keys < 2^63)

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
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(i, n) { a[i] = value; }
}

// Every site claims the slot of its key; the slot keeps the lowest row (atomicMin), the
// row the CPU's in-order insertion keeps.
__global__ void InsertSitesKernel(const uint64_t* keys, int64_t n, DeviceTable t,
                                  int64_t* slot_of, SiteMapDeviceReport* report) {
  ChainedKernelBegin();
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
                                     SiteMapDeviceReport* report) {
  ChainedKernelBegin();
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
                                       const SiteMapDeviceReport* report, int32_t* found) {
  ChainedKernelBegin();
  const bool in_range = SitesInRange(report);
  TF_SPARSECONV_GRID_LOOP(idx, g.volume * n) {
    int32_t row = -1;
    int64_t key;
    if (CandidateOutKey(coords, n, g, offset_index, in_range, idx, &key)) {
      row = TableFind(t, static_cast<unsigned long long>(key));
    }
    found[idx] = row;
  }
}

// Strided and transposed, hash: every reached key claims a slot of the output table;
// found holds the slot until the distinct keys are sorted (Write).
__global__ void InsertCandidatesKernel(const int32_t* coords, int64_t n, SiteGeometry g,
                                       const int32_t* offset_index, DeviceTable t,
                                       SiteMapDeviceReport* report, int32_t* found) {
  ChainedKernelBegin();
  const bool in_range = SitesInRange(report);
  TF_SPARSECONV_GRID_LOOP(idx, g.volume * n) {
    int32_t slot = -1;
    int64_t key;
    if (CandidateOutKey(coords, n, g, offset_index, in_range, idx, &key)) {
      const int64_t s = TableInsert(t, static_cast<unsigned long long>(key));
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
  ChainedKernelBegin();
  const int width = g.d + 1;
  TF_SPARSECONV_GRID_LOOP(r, m) {
    slot_rows[slots[r]] = static_cast<int32_t>(r);
    g.DecodeOutKey(static_cast<int64_t>(keys[r]), out_coords + r * width);
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
      reach = (g.kernel[j] - 1) / period + 1;  // ceil(k / period); k + period - 1 overflows for s near 2^63
    }
    per_site *= reach;
  }
  const int64_t by_sites = n * per_site;  // <= volume * n <= 2^31 - 1
  const int64_t cells = g.batch * g.out_spatial_size;
  return by_sites < cells ? by_sites : cells;
}

}  // namespace

// The duplicate check in a hash table of the sites; then per candidate, a probe of that
// table (submanifold) or a slot of a second table of the reached keys (strided and
// transposed), whose occupied slots are counted as the output sites.
GpuStatus SiteKernelMapGpu::CountHash(Stream stream, Scratch* scratch, const int32_t* offset_index,
                                      uint64_t* site_keys[2], int32_t* site_rows[2],
                                      SiteMapDeviceReport* device_report) {
  const SiteGeometry& g = g_;
  const int32_t* coords = coords_;
  const int64_t n = n_;
  const int64_t volume = g.volume;
  const int64_t candidates = volume * n;
  const bool submanifold = g.mode == SiteMapMode::kSubmanifold;

  // Duplicate check.
  DeviceTable sites = {nullptr, nullptr, 0};
  {
    const int64_t capacity = PowerOfTwoAtLeast(2 * n);
    sites.keys = scratch->DeviceArray<unsigned long long>(capacity);
    sites.rows = scratch->DeviceArray<int32_t>(capacity);
    sites.mask = static_cast<uint64_t>(capacity - 1);
    int64_t* slot_of = scratch->DeviceArray<int64_t>(n);
    if (!sites.keys || !sites.rows || !slot_of) return GpuStatus::OutOfMemory("site table");
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
        cudaMemsetAsync(sites.keys, 0xFF, sizeof(unsigned long long) * capacity, stream), "site table");
    LaunchChained(FillKernel, BlocksFor(capacity), kThreads, 0, stream, sites.rows, capacity, INT32_MAX);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site table");
    if (n > 0) {
      LaunchChained(InsertSitesKernel, BlocksFor(n), kThreads, 0, stream, site_keys[0], n, sites, slot_of,
                    device_report);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site table");
      LaunchChained(HashDuplicatesKernel, BlocksFor(n), kThreads, 0, stream, sites.rows, slot_of, n, device_report);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("duplicate check");
    }
  }

  // found: one slot per (offset, site) candidate.
  if (submanifold) {
    if (candidates > 0) {
      LaunchChained(ProbeSubmanifoldKernel, BlocksFor(candidates), kThreads, 0, stream, coords, n, g, offset_index,
                    sites, device_report, found_);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site probes");
    }
  } else {
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
      LaunchChained(InsertCandidatesKernel, BlocksFor(candidates), kThreads, 0, stream, coords, n, g, offset_index,
                    reached, device_report, found_);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("output site table");
    }
    out_table_keys_ = reached.keys;
    out_table_rows_ = reached.rows;
    out_table_capacity_ = capacity;
    TF_SPARSECONV_RETURN_IF_ERROR(CountCompaction(stream, scratch, IsOccupied{reached.keys}, capacity,
                                                  &device_report->out_sites, &occupied_));
  }
  return GpuStatus::Ok();
}

// The output sites of a strided or transposed map: the distinct reached keys in slot
// order, sorted: their ranks are the output rows (out_table_rows_, slot -> row).
GpuStatus SiteKernelMapGpu::WriteHash(Stream stream, Scratch* scratch, int32_t* out_coords) {
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
    LaunchChained(RankSlotsKernel, BlocksFor(out_sites_), kThreads, 0, stream, keys[current], slots[current],
                  out_sites_, g_, out_table_rows_, out_coords);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("output sites");
  }
  return GpuStatus::Ok();
}

}  // namespace gpu
}  // namespace tf_sparseconv

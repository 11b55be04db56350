// SiteKernelMap's sort builder on the GPU (SiteMapBuilder::kSort, site_kernel_map_gpu.h):
// Minuet's map step, the sites sorted once and searched per kernel offset; strided and
// transposed maps radix-sort the reached keys.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/gpu_util.cuh"
#include "site/kernel_map/site_kernel_map.cuh"
#include "site/kernel_map/site_kernel_map_gpu.h"

namespace tf_sparseconv {
namespace gpu {
namespace {

// Queries per chunk of the sort builder's searches: one thread each.
constexpr int kQueryChunk = kThreads;
// Keys a chunk stages in shared memory for its fine search (8 KiB); a chunk of
// consecutive sorted sites shifted by one offset usually hits about kQueryChunk keys.
constexpr int kStagedKeys = 1024;

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

// After a stable sort by key, equal keys hold their rows in ascending order: the second
// entry of a run is the lowest later row of those coordinates, the first the earliest.
__global__ void SortedDuplicatesKernel(const uint64_t* keys, const int32_t* rows, int64_t n,
                                       SiteMapDeviceReport* report) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(p, n) {
    if (p == 0 || keys[p] != keys[p - 1]) continue;
    if (p >= 2 && keys[p - 2] == keys[p - 1]) continue;  // the third or later of its run
    RecordFirst(&report->duplicate, static_cast<int64_t>((static_cast<uint64_t>(rows[p]) << 32) |
                                                         static_cast<uint32_t>(rows[p - 1])));
  }
}

// ---- Sort builder ----------------------------------------------------------------------

__global__ void SortedCoordsKernel(const int32_t* coords, const int32_t* rows, int64_t n, int width,
                                   int32_t* sorted_coords) {
  ChainedKernelBegin();
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
  ChainedKernelBegin();
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
  ChainedKernelBegin();
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
                                    const int32_t* offset_index, const SiteMapDeviceReport* report,
                                    uint64_t no_output, uint64_t* keys, int32_t* index,
                                    int32_t* found) {
  ChainedKernelBegin();
  const bool in_range = SitesInRange(report);
  TF_SPARSECONV_GRID_LOOP(idx, g.volume * n) {
    int64_t key;
    const bool reached = CandidateOutKey(coords, n, g, offset_index, in_range, idx, &key);
    keys[idx] = reached ? static_cast<uint64_t>(key) : no_output;
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
  ChainedKernelBegin();
  const int width = g.d + 1;
  TF_SPARSECONV_GRID_LOOP(r, m) { g.DecodeOutKey(static_cast<int64_t>(keys[r]), out_coords + r * width); }
}

}  // namespace

// The sites sorted once, which is the duplicate check too; then per candidate, a search
// of the sorted sites (submanifold) or a radix sort of every candidate's reached key
// (strided and transposed), whose runs are the output sites.
GpuStatus SiteKernelMapGpu::CountSort(Stream stream, Scratch* scratch, const int32_t* offset_index,
                                      uint64_t* site_keys[2], int32_t* site_rows[2],
                                      SiteMapDeviceReport* device_report) {
  const SiteGeometry& g = g_;
  const int32_t* coords = coords_;
  const int64_t n = n_;
  const int64_t volume = g.volume;
  const int64_t candidates = volume * n;
  const int width = g.d + 1;
  const bool submanifold = g.mode == SiteMapMode::kSubmanifold;
  int64_t in_cells = g.batch;  // MakeSiteGeometry checked that this product fits
  for (int j = 0; j < g.d; ++j) in_cells *= g.in_shape[j];
  const int64_t out_cells = g.batch * g.out_spatial_size;

  // Duplicate check; the sorted sites are kept for the searches.
  const uint64_t* sorted_keys = nullptr;
  const int32_t* sorted_rows = nullptr;
  {
    int current = 0;
    TF_SPARSECONV_RETURN_IF_ERROR(SortPairs(stream, scratch, site_keys, site_rows, n,
                                            BitsFor(static_cast<uint64_t>(in_cells - 1)), &current));
    sorted_keys = site_keys[current];
    sorted_rows = site_rows[current];
    if (n > 0) {
      LaunchChained(SortedDuplicatesKernel, BlocksFor(n), kThreads, 0, stream, sorted_keys, sorted_rows, n,
                    device_report);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("duplicate check");
    }
  }

  // found: one slot per (offset, site) candidate.
  if (submanifold) {
    if (candidates > 0) {
      const int64_t chunks = (n + kQueryChunk - 1) / kQueryChunk;
      int32_t* sorted_coords = scratch->DeviceArray<int32_t>(n * width);
      int32_t* ranges = scratch->DeviceArray<int32_t>(2 * volume * chunks);
      if (!sorted_coords || !ranges) return GpuStatus::OutOfMemory("site searches");
      LaunchChained(SortedCoordsKernel, BlocksFor(n * width), kThreads, 0, stream, coords, sorted_rows, n, width,
                    sorted_coords);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site searches");
      const int64_t* keys = reinterpret_cast<const int64_t*>(sorted_keys);  // keys < 2^63
      LaunchChained(QueryRangesKernel, BlocksFor(volume * chunks), kThreads, 0, stream, g, offset_index, keys, n,
                    chunks, ranges);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site searches");
      const int64_t items = volume * chunks;
      const unsigned int blocks = static_cast<unsigned int>(items < (1 << 20) ? items : (1 << 20));
      LaunchChained(SortedSearchKernel, blocks, kThreads, 0, stream, g, offset_index, keys, sorted_rows, sorted_coords,
                    n, chunks, ranges, found_);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("site searches");
    }
  } else {
    // Strided or transposed, sort: sort every candidate's reached key; each run of equal
    // keys is one output site, its rank the output row.
    const uint64_t no_output = static_cast<uint64_t>(out_cells);
    uint64_t* keys[2] = {scratch->DeviceArray<uint64_t>(candidates), scratch->DeviceArray<uint64_t>(candidates)};
    int32_t* index[2] = {scratch->DeviceArray<int32_t>(candidates), scratch->DeviceArray<int32_t>(candidates)};
    if (!keys[0] || !keys[1] || !index[0] || !index[1]) return GpuStatus::OutOfMemory("candidate keys");
    if (candidates > 0) {
      LaunchChained(CandidateKeysKernel, BlocksFor(candidates), kThreads, 0, stream, coords, n, g, offset_index,
                    device_report, no_output, keys[0], index[0], found_);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("candidate keys");
    }
    int current = 0;
    TF_SPARSECONV_RETURN_IF_ERROR(
        SortPairs(stream, scratch, keys, index, candidates, BitsFor(no_output), &current));
    TF_SPARSECONV_RETURN_IF_ERROR(Compact(stream, scratch, IsFirstOfRun{keys[current], no_output},
                                          EmitRun{keys[current], index[current], candidates, keys[1 - current], found_},
                                          candidates, &device_report->out_sites));
    out_keys_ = keys[1 - current];
  }
  return GpuStatus::Ok();
}

// The unique reached keys, already sorted by Count, decoded into the output sites.
GpuStatus SiteKernelMapGpu::WriteSort(Stream stream, int32_t* out_coords) {
  if (out_sites_ > 0) {
    LaunchChained(DecodeKeysKernel, BlocksFor(out_sites_), kThreads, 0, stream, out_keys_, out_sites_, g_, out_coords);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("output sites");
  }
  return GpuStatus::Ok();
}

}  // namespace gpu
}  // namespace tf_sparseconv

// What SiteKernelMapGpu's skeleton (site_kernel_map.cu) and its two builders
// (site_kernel_map_hash.cu, site_kernel_map_sort.cu) share on the device.
#ifndef TF_SPARSECONV_SITE_KERNEL_MAP_SITE_KERNEL_MAP_CUH_
#define TF_SPARSECONV_SITE_KERNEL_MAP_SITE_KERNEL_MAP_CUH_

#include <cstdint>

#include "common/gpu_util.cuh"
#include "site/kernel_map/site_kernel_map_gpu.h"

namespace tf_sparseconv {
namespace gpu {

// The report in device memory, followed by volume + 1 int64 offset starts; the whole
// block is copied to the host in one piece.
struct SiteMapDeviceReport {
  CheckSlot range;
  CheckSlot duplicate;
  CheckSlot table_full;
  int64_t pairs;
  int64_t out_sites;
};

__device__ inline bool SitesInRange(const SiteMapDeviceReport* report) {
  return report->range.first == kNoError;
}

__device__ inline void LoadOffset(const int32_t* offset_index, int d, int64_t q, int64_t* qi) {
#pragma unroll
  for (int j = 0; j < kMaxSpatialDims; ++j) {  // constant indices: qi stays in registers
    if (j < d) qi[j] = offset_index[q * d + j];
  }
}

// Candidate idx of the grid over volume * n (i varies fastest, q = idx / n): site i moved by
// kernel offset q. True, with the key of the output site it reaches, where the sites passed
// the range check and the offset lands on an output site.
__device__ inline bool CandidateOutKey(const int32_t* coords, int64_t n, const SiteGeometry& g,
                                       const int32_t* offset_index, bool in_range, int64_t idx,
                                       int64_t* key) {
  const int64_t q = idx / n;
  const int64_t i = idx - q * n;
  int64_t qi[kMaxSpatialDims], o[kMaxSpatialDims];
  LoadOffset(offset_index, g.d, q, qi);
  const int32_t* site = coords + i * (g.d + 1);
  if (!in_range || !g.OutputOf(site + 1, qi, o)) return false;
  *key = g.OutKey(site[0], o);
  return true;
}

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_KERNEL_MAP_SITE_KERNEL_MAP_CUH_

// The GPU functor of SiteKernelMap (CUDA-free interface; kernels in site_kernel_map.cu,
// and each builder's in site_kernel_map_hash.cu and site_kernel_map_sort.cu).
// Same contract as the CPU kernel (site_kernel_map_kernels.cc): the same output
// sites in the same order, and the pairs grouped by kernel offset and, within one offset,
// ordered by input row.
#ifndef TF_SPARSECONV_SITE_KERNEL_MAP_SITE_KERNEL_MAP_GPU_H_
#define TF_SPARSECONV_SITE_KERNEL_MAP_SITE_KERNEL_MAP_GPU_H_

#include <cstdint>
#include <vector>

#include "common/gpu_common.h"
#include "site/kernel_map/site_geometry.h"

namespace tf_sparseconv {
namespace gpu {

// How the GPU finds the output site of every (site, kernel offset) candidate. Both give
// identical outputs; they differ in speed and temporary memory.
//   kHash: an open-addressing table of site keys, probed once per candidate (submanifold);
//          strided and transposed maps deduplicate the reached keys in a second table and
//          sort only the distinct ones.
//   kSort: Minuet's map step (seed 002 §4, §5.1): the site keys are sorted once; for each
//          kernel offset the shifted queries of consecutive sorted sites form a sorted
//          segment, whose chunks are matched against the sorted keys by a coarse search
//          (the range of keys a chunk can hit) and a fine search in that range, staged in
//          shared memory. Strided and transposed maps radix-sort the reached keys instead
//          (the sort that finds the output sites already pairs every candidate with its
//          output row).
enum class SiteMapBuilder : int { kHash = 0, kSort = 1 };

// The report in device memory (site_kernel_map.cuh).
struct SiteMapDeviceReport;

// What the host learns in the op's one read-back.
struct SiteMapReport {
  // The first entry row * (1 + d) + column outside its range, detail[0] = its value.
  CheckSlot range;
  // The first site that repeats an earlier one: first = (later row << 32) | earlier row,
  // the pair the CPU kernel reports (earlier = the lowest row with those coordinates).
  CheckSlot duplicate;
  // A hash table that filled up (an internal error: its capacity bound was wrong).
  CheckSlot table_full;
  int64_t pairs = 0;
  int64_t out_sites = 0;
  std::vector<int32_t> offset_splits;  // volume + 1
};

// The site-key extents must satisfy MakeSiteGeometry's checks, and volume * n <=
// kMaxSortItems (candidates are indexed and sorted with int).
//
// Temporary memory, with C = volume * n candidates:
//   hash, submanifold   n * 28 + 12 * (pow2 >= 2n) + C * 4
//   hash, otherwise     the above + 12 * (pow2 >= 2 * reachable sites) + C * 4
//                       + 24 * out_sites
//   sort, submanifold   n * (24 + 4 * (1 + d)) + C * 4 + 8 * volume * n / 256
//   sort, otherwise     n * 24 + C * 28
//   + 16 bytes per 2048 candidates (compactions) and CUB's sort scratch.
class SiteKernelMapGpu {
 public:
  // Queues the checks of the sites (range, then duplicates), the search for every pair
  // and output site, and the copy of the report, with the pair count of every offset,
  // into pinned host memory from scratch. Does not wait: ReadReport reads the copy once
  // the stream has passed it (a wait, or an EventMgr callback).
  // count_pairs false: the pairs are not counted (for WriteNeighbourTable; the report's
  // checks are still copied, its pair count and offset splits are not).
  GpuStatus Count(Stream stream, Scratch* scratch, const SiteGeometry& geometry,
                  SiteMapBuilder builder, const int32_t* coords, int64_t n, bool count_pairs = true);
  void ReadReport(SiteMapReport* report);
  // Writes out_coords [out_sites, 1 + d] and in_rows, out_rows [pairs]; only enqueues.
  GpuStatus Write(Stream stream, Scratch* scratch, int32_t* out_coords, int32_t* in_rows,
                  int32_t* out_rows);
  // A submanifold map (volume <= 32) as SiteNeighbourTable's table [n, volume + 2]
  // (site/conv/site_conv_op.cc), straight after Count: output row i's entry at offset
  // volume - 1 - q is the row site i feeds through q (the offsets are mirrored). Only
  // enqueues. Temporary memory: 16 * n bytes and the radix sort's scratch.
  GpuStatus WriteNeighbourTable(Stream stream, Scratch* scratch, int32_t* table);

 private:
  // Each builder's part of Count: the duplicate check, found_, and the output sites of a
  // strided or transposed map (site_kernel_map_hash.cu, site_kernel_map_sort.cu).
  GpuStatus CountHash(Stream stream, Scratch* scratch, const int32_t* offset_index, uint64_t* site_keys[2],
                      int32_t* site_rows[2], SiteMapDeviceReport* device_report);
  GpuStatus CountSort(Stream stream, Scratch* scratch, const int32_t* offset_index, uint64_t* site_keys[2],
                      int32_t* site_rows[2], SiteMapDeviceReport* device_report);
  // Each builder's part of Write: the output sites of a strided or transposed map.
  GpuStatus WriteHash(Stream stream, Scratch* scratch, int32_t* out_coords);
  GpuStatus WriteSort(Stream stream, int32_t* out_coords);

  SiteGeometry g_;
  SiteMapBuilder builder_ = SiteMapBuilder::kHash;
  const int32_t* coords_ = nullptr;
  int64_t n_ = 0;
  int64_t pairs_ = 0;
  int64_t out_sites_ = 0;
  void* pinned_report_ = nullptr;  // Count's copy of the report (pinned host memory)
  // found[q * n + i]: the output row (submanifold; strided/transposed with kSort) or the
  // hash-table slot (strided/transposed with kHash) that site i feeds through offset q,
  // or -1.
  int32_t* found_ = nullptr;
  int64_t offset_stride_ = 0;  // the pair compaction's index space per offset
  Compaction pair_compaction_;
  // Strided and transposed maps.
  unsigned long long* out_table_keys_ = nullptr;  // kHash: the reached keys
  int32_t* out_table_rows_ = nullptr;             // kHash: slot -> output row (Write)
  int64_t out_table_capacity_ = 0;
  Compaction occupied_;                           // kHash: the occupied slots
  const uint64_t* out_keys_ = nullptr;            // kSort: the sorted output keys
};

// SiteTablePairs on the GPU: the pairs of a submanifold map from its neighbour table
// [n, volume + 2], in SiteKernelMap's order (offset q's pairs are (i, table[i, volume - 1 - q])
// for the rows i, ascending, where that entry is >= 0).
struct TablePairsReport {
  // The first neighbour entry i * (volume + 2) + q outside [-1, n), detail[0] = its value.
  CheckSlot range;
  int64_t pairs = 0;
  std::vector<int32_t> offset_splits;  // volume + 1
};

class TablePairsGpu {
 public:
  // Queues the entries' range check, the pair counts and the copy of the report into
  // pinned host memory; does not wait (ReadReport once the stream has passed it).
  GpuStatus Count(Stream stream, Scratch* scratch, const int32_t* table, int64_t n, int64_t volume);
  void ReadReport(TablePairsReport* report);
  // Writes in_rows, out_rows [pairs]; only enqueues.
  GpuStatus Write(Stream stream, int32_t* in_rows, int32_t* out_rows);

 private:
  const int32_t* table_ = nullptr;
  int64_t n_ = 0, volume_ = 0, offset_stride_ = 0;
  void* pinned_report_ = nullptr;
  Compaction pair_compaction_;
};

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_KERNEL_MAP_SITE_KERNEL_MAP_GPU_H_

// The non-template parts of gpu_util.cuh: key checks, the Report and its round trip.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/gpu_util.cuh"
#include "common/host_syncs.h"

namespace tf_sparseconv {
namespace gpu {
namespace {

__global__ void CheckSortedKeysKernel(const int64_t* keys, int64_t n, int64_t limit, bool padded_tail,
                                      CheckSlot* slot) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(i, n) {
    const int64_t key = keys[i];
    // A padding key is valid after a live key or after padding (a tail of them).
    if (padded_tail && key == kPaddingKey) continue;
    if (key < 0 || key >= limit || (i > 0 && key <= keys[i - 1])) RecordFirst(slot, i);
  }
}

__global__ void DescribeSortedKeysKernel(const int64_t* keys, CheckSlot* slot) {
  ChainedKernelBegin();
  if (slot->first == kNoError) return;
  const int64_t i = static_cast<int64_t>(slot->first);
  slot->detail[0] = keys[i];
  slot->detail[1] = i > 0 ? keys[i - 1] : 0;
}

__global__ void CheckKeysInRangeKernel(const int64_t* keys, int64_t n, int64_t limit,
                                       CheckSlot* slot) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(i, n) {
    if (keys[i] < 0 || keys[i] >= limit) RecordFirst(slot, i);
  }
}

__global__ void DescribeKeyKernel(const int64_t* keys, CheckSlot* slot) {
  ChainedKernelBegin();
  if (slot->first == kNoError) return;
  slot->detail[0] = keys[slot->first];
}

template <typename T>
__global__ void CheckNaNKernel(const T* x, int64_t n, CheckSlot* slot) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(i, n) {
    if (isnan(x[i])) RecordFirst(slot, i);
  }
}

// One block: offsets = the exclusive scan of counts, *total = their sum, chunk by chunk
// with a carry. A launch instead of CUB's two plus the total's.
constexpr int kScanThreads = 1024;
constexpr int kScanItems = 4;

__global__ void __launch_bounds__(kScanThreads)
    ScanCountsKernel(const int64_t* counts, int64_t n, int64_t* offsets, int64_t* total) {
  ChainedKernelBegin();
  using BlockScan = cub::BlockScan<int64_t, kScanThreads>;
  __shared__ typename BlockScan::TempStorage temp;
  int64_t carry = 0;
  for (int64_t base = 0; base < n; base += static_cast<int64_t>(kScanThreads) * kScanItems) {
    const int64_t first = base + static_cast<int64_t>(threadIdx.x) * kScanItems;
    int64_t items[kScanItems];
    for (int j = 0; j < kScanItems; ++j) items[j] = first + j < n ? counts[first + j] : 0;
    int64_t chunk_total = 0;
    BlockScan(temp).ExclusiveSum(items, items, chunk_total);
    for (int j = 0; j < kScanItems; ++j) {
      if (first + j < n) offsets[first + j] = carry + items[j];
    }
    carry += chunk_total;
    __syncthreads();  // temp is reused by the next chunk
  }
  if (threadIdx.x == 0) *total = carry;
}

__global__ void CompactionTotalKernel(const int64_t* tile_counts, const int64_t* tile_offsets,
                                      int64_t num_tiles, int64_t* total) {
  ChainedKernelBegin();
  *total = tile_offsets[num_tiles - 1] + tile_counts[num_tiles - 1];
}

}  // namespace

bool ChainedLaunchAllowed() {
  static const bool switched_on = [] {
    const char* value = std::getenv("TF_SPARSECONV_CHAINED_LAUNCH");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  if (!switched_on) return false;
  constexpr int kDevices = 64;
  static std::atomic<int> capable[kDevices];  // 0 not yet asked, 1 no, 2 yes
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) {
    (void)cudaGetLastError();  // not a launch's error: the launch goes unchained
    return false;
  }
  int known = capable[device].load(std::memory_order_relaxed);
  if (known == 0) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    known = major >= 9 ? 2 : 1;
    capable[device].store(known, std::memory_order_relaxed);
  }
  return known == 2;
}

GpuStatus CheckSortedKeys(Stream stream, const int64_t* keys, int64_t n, int64_t limit,
                          CheckSlot* slot, bool padded_tail) {
  if (n == 0) return GpuStatus::Ok();
  LaunchChained(CheckSortedKeysKernel, BlocksFor(n), kThreads, 0, stream, keys, n, limit, padded_tail, slot);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("key check");
  LaunchChained(DescribeSortedKeysKernel, 1, 1, 0, stream, keys, slot);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("key check");
  return GpuStatus::Ok();
}

GpuStatus CheckKeysInRange(Stream stream, const int64_t* keys, int64_t n, int64_t limit,
                           CheckSlot* slot) {
  if (n == 0) return GpuStatus::Ok();
  LaunchChained(CheckKeysInRangeKernel, BlocksFor(n), kThreads, 0, stream, keys, n, limit, slot);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("key range check");
  LaunchChained(DescribeKeyKernel, 1, 1, 0, stream, keys, slot);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("key range check");
  return GpuStatus::Ok();
}

template <typename T>
GpuStatus CheckNaN(Stream stream, const T* x, int64_t n, CheckSlot* slot) {
  if (n == 0) return GpuStatus::Ok();
  LaunchChained(CheckNaNKernel<T>, BlocksFor(n), kThreads, 0, stream, x, n, slot);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("NaN check");
  return GpuStatus::Ok();
}

template GpuStatus CheckNaN<float>(Stream, const float*, int64_t, CheckSlot*);
template GpuStatus CheckNaN<double>(Stream, const double*, int64_t, CheckSlot*);

GpuStatus CompactionTotal(Stream stream, const int64_t* tile_counts,
                          const int64_t* tile_offsets, int64_t num_tiles, int64_t* total) {
  LaunchChained(CompactionTotalKernel, 1, 1, 0, stream, tile_counts, tile_offsets, num_tiles, total);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("compaction total");
  return GpuStatus::Ok();
}

GpuStatus ScanCounts(Stream stream, Scratch* scratch, const int64_t* counts, int64_t* offsets, int64_t n,
                     int64_t* total) {
  if (n == 0) {
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(cudaMemsetAsync(total, 0, sizeof(int64_t), stream), "scan total");
    return GpuStatus::Ok();
  }
  if (n > kOneBlockScanItems) {
    TF_SPARSECONV_RETURN_IF_ERROR(ExclusiveSum(stream, scratch, counts, offsets, n));
    return CompactionTotal(stream, counts, offsets, n, total);
  }
  LaunchChained(ScanCountsKernel, 1, kScanThreads, 0, stream, counts, n, offsets, total);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("scan");
  return GpuStatus::Ok();
}

GpuStatus NewReport(Stream stream, Scratch* scratch, Report** report) {
  *report = static_cast<Report*>(scratch->Device(sizeof(Report)));
  if (*report == nullptr) return GpuStatus::OutOfMemory("report");
  // All bits set: every CheckSlot::first is kNoError.
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(cudaMemsetAsync(*report, 0xFF, sizeof(Report), stream),
                                          "report");
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaMemsetAsync(&(*report)->count, 0, sizeof((*report)->count), stream), "report");
  return GpuStatus::Ok();
}

GpuStatus WaitForStream(Stream stream) {
  CountHostSync();
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(cudaStreamSynchronize(stream), "stream synchronize");
  return GpuStatus::Ok();
}

GpuStatus ReadReport(Stream stream, Scratch* scratch, const Report* device_report,
                     Report* host_report) {
  Report* pinned = static_cast<Report*>(scratch->PinnedHost(sizeof(Report)));
  if (pinned == nullptr) return GpuStatus::OutOfMemory("report (host)");
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaMemcpyAsync(pinned, device_report, sizeof(Report), cudaMemcpyDeviceToHost, stream),
      "report copy");
  TF_SPARSECONV_RETURN_IF_ERROR(WaitForStream(stream));
  std::memcpy(host_report, pinned, sizeof(Report));
  return GpuStatus::Ok();
}

GpuStatus Upload(Stream stream, Scratch* scratch, const void* host, size_t bytes,
                 void** device, const char* what) {
  *device = scratch->Device(bytes > 0 ? bytes : 1);
  if (*device == nullptr) return GpuStatus::OutOfMemory(what);
  if (bytes == 0) return GpuStatus::Ok();
  void* pinned = scratch->PinnedHost(bytes);
  if (pinned == nullptr) return GpuStatus::OutOfMemory(what);
  std::memcpy(pinned, host, bytes);
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaMemcpyAsync(*device, pinned, bytes, cudaMemcpyHostToDevice, stream), what);
  return GpuStatus::Ok();
}

}  // namespace gpu
}  // namespace tf_sparseconv

// Device-side building blocks of the GPU functors: launch helpers, the data checks that
// fill a Report, order-preserving stream compaction, and the host round trip.
//
// Determinism: nothing here adds floating-point numbers in an order that depends on
// thread timing. The atomics are integer ones whose results do not depend on the order
// they land in: atomicMin on check positions, and the one-pass compaction's tile tickets
// and published counts (which tile a block takes varies; each tile's rank does not).
#ifndef TF_SPARSECONV_COMMON_GPU_UTIL_CUH_
#define TF_SPARSECONV_COMMON_GPU_UTIL_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "common/gpu_common.h"
#include "common/primitives.h"

namespace tf_sparseconv {
namespace gpu {

#define TF_SPARSECONV_RETURN_IF_CUDA_ERROR(where)                  \
  do {                                                             \
    const cudaError_t cuda_error_ = cudaGetLastError();            \
    if (cuda_error_ != cudaSuccess) {                              \
      return GpuStatus{(where), cudaGetErrorString(cuda_error_)};  \
    }                                                              \
  } while (0)

#define TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(call, where)        \
  do {                                                              \
    const cudaError_t cuda_error_ = (call);                         \
    if (cuda_error_ != cudaSuccess) {                               \
      return GpuStatus{(where), cudaGetErrorString(cuda_error_)};   \
    }                                                               \
  } while (0)

#define TF_SPARSECONV_RETURN_IF_ERROR(expr)  \
  do {                                       \
    const GpuStatus status_ = (expr);        \
    if (!status_.ok()) return status_;       \
  } while (0)

constexpr int kThreads = 256;

// Every element-wise kernel loops with a grid stride, so any grid covers any n.
inline unsigned int BlocksFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks > 65536 ? 65536 : blocks));
}

#define TF_SPARSECONV_GRID_LOOP(i, n)                                              \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;    \
       i < (n); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// ---- Chained launches ------------------------------------------------------------------
//
// Between two dependent kernels the GPU idles about a microsecond (the first one's drain,
// the second one's launch); a convolution of a dozen launches lost a tenth of its time so.
// LaunchChained launches with programmatic dependent launch (sm_90 and later): the kernel's
// blocks may be scheduled while the kernel before it in the stream still runs. Every kernel
// so launched calls ChainedKernelBegin() first: it waits until the kernels before it have
// ended and their writes are visible, then lets the next chained kernel's blocks be
// scheduled. Kernels before it need not be chained ones; before sm_90, and with
// TF_SPARSECONV_CHAINED_LAUNCH=0 in the environment, it is an ordinary launch.
__device__ __forceinline__ void ChainedKernelBegin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches on the current device may be chained (compute capability 9.0 or later,
// and not switched off by TF_SPARSECONV_CHAINED_LAUNCH=0); in gpu_util.cu.
bool ChainedLaunchAllowed();

template <typename... Params, typename... Args>
void LaunchChained(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, Stream stream,
                   Args&&... args) {
#if CUDART_VERSION < 11080  // no cudaLaunchKernelEx before CUDA 11.8: an ordinary launch
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
#else
  cudaLaunchAttribute chained[1];
  chained[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  chained[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = chained;
  config.numAttrs = ChainedLaunchAllowed() ? 1 : 0;
  // A failed launch sets the runtime's last error, which callers check as after any launch.
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
#endif
}

// Bits that hold every value in [0, max_value]: the end_bit of a radix sort.
inline int BitsFor(uint64_t max_value) {
  int bits = 1;
  while (bits < 64 && (max_value >> bits) != 0) ++bits;
  return bits;
}

// Products and sums with explicit rounding: nvcc would otherwise contract a * b + c
// into one fused multiply-add, and the results would differ from the CPU kernels',
// which round the product first.
__device__ inline float MulRn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double MulRn(double a, double b) { return __dmul_rn(a, b); }
__device__ inline float AddRn(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double AddRn(double a, double b) { return __dadd_rn(a, b); }

// The segment owning position p: the q in [0, segments) with begin[q] <= p < begin[q + 1],
// for begin rising from begin[0] = 0 to begin[segments] > p (empty segments are skipped).
__device__ inline int64_t OwnerOf(const int64_t* begin, int64_t segments, int64_t p) {
  int64_t lo = 0, hi = segments;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (begin[mid] <= p) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// First position p in [0, n) with a[p] >= value (n if none).
__device__ inline int64_t LowerBound(const int64_t* a, int64_t n, int64_t value) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (a[mid] < value) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// ---- Data checks --------------------------------------------------------------------

// Kernels that run after the checks read this first: on invalid input they write
// nothing that depends on the data (keys could index out of bounds).
__device__ inline bool ChecksPassed(const Report* report) {
  for (int c = 0; c < kMaxChecks; ++c) {
    if (report->checks[c].first != kNoError) return false;
  }
  return true;
}

__device__ inline void RecordFirst(CheckSlot* slot, int64_t position) {
  atomicMin(&slot->first, static_cast<unsigned long long>(position));
}

// ValidateKeys of channel/channel_sparse.h: records the first entry that is out of range or not
// above its predecessor, with detail = {its key, the key before it}. padded_tail: keys may
// end in padding (kPaddingKey, common/key_layout.h); a live key after padding is unsorted.
GpuStatus CheckSortedKeys(Stream stream, const int64_t* keys, int64_t n, int64_t limit,
                          CheckSlot* slot, bool padded_tail = false);
// CheckKeysInRange of the conversions (keys may be unsorted): the first key outside
// [0, limit), with detail = {its key}.
GpuStatus CheckKeysInRange(Stream stream, const int64_t* keys, int64_t n, int64_t limit,
                           CheckSlot* slot);

// RejectNaN of channel/channel_sparse.h: the first NaN (float and double, in gpu_util.cu).
template <typename T>
GpuStatus CheckNaN(Stream stream, const T* x, int64_t n, CheckSlot* slot);

// ---- The Report and the host round trip ----------------------------------------------

// A Report in device memory with every check passed and count 0.
GpuStatus NewReport(Stream stream, Scratch* scratch, Report** report);
// NewReport's bytes on the host, for an op that uploads its report with other tables: all
// bits set (every CheckSlot::first is kNoError), then count 0.
inline Report InitialReport() {
  Report report;
  std::memset(&report, 0xFF, sizeof(report));
  report.count = 0;
  return report;
}

// The host waits for the stream (counted: common/host_syncs.h); also surfaces any error of
// the kernels queued before (a fault, a bad launch).
GpuStatus WaitForStream(Stream stream);

// The op's one host round trip: copies the Report to pinned host memory and waits for
// the stream.
GpuStatus ReadReport(Stream stream, Scratch* scratch, const Report* device_report,
                     Report* host_report);

// Copies a host table to the device through pinned memory that lives until Compute
// returns, which is after ReadReport has waited for the copy.
GpuStatus Upload(Stream stream, Scratch* scratch, const void* host, size_t bytes,
                 void** device, const char* what);

// ---- Order-preserving stream compaction -----------------------------------------------
//
// Selects the positions q in [0, n) with pred(q) and hands each to emit(q, rank), rank
// counting the selected positions before q. Two passes over fixed tiles of the index
// range: CountCompaction counts per tile and scans the counts (the total lands in
// device memory, e.g. the Report, so the host learns the output size from the one
// round trip); WriteCompaction recounts each tile and emits in order. pred must give
// the same answer in both passes. Temporary memory: 16 bytes per tile of 2048 indices.
// Where the total need not reach the host before the write, Compact (below) does both
// in one pass.

constexpr int kTileItems = 8;
constexpr int64_t kTileSize = static_cast<int64_t>(kThreads) * kTileItems;

inline unsigned int TileBlocks(int64_t num_tiles) {
  return static_cast<unsigned int>(num_tiles > 65536 ? 65536 : num_tiles);
}

// tile_counts[t] = the sum of count(q) over the tile's positions q < n: the selected ones
// where count is a predicate, or whatever it counts per position (the set bits of a word).
template <typename Count>
__global__ void __launch_bounds__(kThreads)
    CountTilesKernel(Count count, int64_t n, int64_t num_tiles, int64_t* tile_counts) {
  ChainedKernelBegin();
  using BlockReduce = cub::BlockReduce<int, kThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const int64_t first = tile * kTileSize + static_cast<int64_t>(threadIdx.x) * kTileItems;
    int selected = 0;
    for (int j = 0; j < kTileItems; ++j) {
      const int64_t q = first + j;
      if (q < n) selected += static_cast<int>(count(q));
    }
    const int tile_total = BlockReduce(temp).Sum(selected);
    if (threadIdx.x == 0) tile_counts[tile] = tile_total;
    __syncthreads();  // temp is reused by the next tile
  }
}

// hit[j] = pred(first + j) for the thread's kTileItems positions from first that lie below n;
// returns how many hit.
template <typename Pred>
__device__ inline int TileHits(Pred pred, int64_t n, int64_t first, bool (&hit)[kTileItems]) {
  int selected = 0;
  for (int j = 0; j < kTileItems; ++j) {
    const int64_t q = first + j;
    hit[j] = q < n && pred(q);
    selected += hit[j];
  }
  return selected;
}

template <typename Pred, typename Emit>
__global__ void __launch_bounds__(kThreads)
    WriteTilesKernel(Pred pred, Emit emit, int64_t n, int64_t num_tiles,
                     const int64_t* tile_offsets) {
  ChainedKernelBegin();
  using BlockScan = cub::BlockScan<int, kThreads>;
  __shared__ typename BlockScan::TempStorage temp;
  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const int64_t first = tile * kTileSize + static_cast<int64_t>(threadIdx.x) * kTileItems;
    bool hit[kTileItems];
    const int selected = TileHits(pred, n, first, hit);
    int before = 0;
    BlockScan(temp).ExclusiveSum(selected, before);
    int64_t rank = tile_offsets[tile] + before;
    for (int j = 0; j < kTileItems; ++j) {
      if (hit[j]) emit(first + j, rank++);
    }
    __syncthreads();
  }
}

// *total = tile_offsets[last] + tile_counts[last].
GpuStatus CompactionTotal(Stream stream, const int64_t* tile_counts,
                          const int64_t* tile_offsets, int64_t num_tiles, int64_t* total);

// offsets[i] = counts[0] + ... + counts[i - 1] and *total = the sum of all n counts, on the
// device: one block's launch up to kOneBlockScanItems counts (a compaction's tiles), CUB's
// scan beyond.
constexpr int64_t kOneBlockScanItems = 65536;
GpuStatus ScanCounts(Stream stream, Scratch* scratch, const int64_t* counts, int64_t* offsets, int64_t n,
                     int64_t* total);

// ---- One pass: a decoupled look-back ----
//
// Where the selected positions' total need not reach the host before they are written (an
// output allocated at its bound), Compact does both passes' work in one: tiles are taken in
// order from a ticket counter; each tile publishes its own count, finds the count of the tiles
// before it by looking back at its predecessors' published states, and publishes its inclusive
// prefix. A tile waits only for tiles that hold a ticket before its own, whose blocks run, so
// it cannot wait forever. Integer sums: the same ranks and total as the two passes.

// A tile's published state, one 64-bit word: a flag in the top two bits (0: nothing yet), the
// count below.
constexpr int kTileStateShift = 62;
constexpr unsigned long long kTileCountOnly = 1ull << kTileStateShift;  // the tile's own count
constexpr unsigned long long kTilePrefix = 2ull << kTileStateShift;     // the count up to its end
constexpr unsigned long long kTileCountMask = (1ull << kTileStateShift) - 1;

// The zeroed 64-bit words a one-pass kernel over num_tiles tiles needs: a state per tile, then
// the ticket counter.
inline int64_t OnePassStates(int64_t num_tiles) { return num_tiles + 1; }

// The block's next tile (by one thread): tickets in the order blocks ask.
__device__ inline int64_t NextTile(unsigned long long* state, int64_t num_tiles) {
  return static_cast<int64_t>(atomicAdd(state + num_tiles, 1ull));
}

// Called by one whole warp per tile of num_tiles: publishes the tile's count, returns the
// count of the tiles before it (in every lane) and publishes the tile's inclusive prefix; the
// last tile writes the whole count to *total. The look-back
// reads 32 predecessors at once, the nearest first, and sums their counts up to the nearest
// that has published its prefix; a lane waits while its predecessor has published nothing.
// (One thread reading one predecessor's prefix at a time chained the tiles: 2,048 tiles of a
// 256^3 convolution's output bits took 17 us longer, 2026-12-01.)
__device__ inline int64_t TileStart(unsigned long long* state, int64_t tile, int64_t num_tiles, int64_t count,
                                    int lane, int64_t* total) {
  const auto mine = static_cast<unsigned long long>(count);
  if (tile == 0) {
    if (lane == 0) {
      atomicExch(state, kTilePrefix | mine);
      if (num_tiles == 1) *total = count;
    }
    return 0;
  }
  if (lane == 0) atomicExch(state + tile, kTileCountOnly | mine);
  int64_t before = 0;
  for (int64_t last = tile - 1;; last -= 32) {
    const int64_t p = last - lane;
    unsigned long long s = kTilePrefix;  // before tile 0: nothing
    if (p >= 0) {
      do {
        s = *reinterpret_cast<const volatile unsigned long long*>(state + p);
      } while (s == 0);
    }
    const unsigned int prefix_lanes = __ballot_sync(0xffffffffu, s >= kTilePrefix);
    const int stop = prefix_lanes != 0u ? __ffs(prefix_lanes) - 1 : 31;  // the nearest prefix
    int64_t counted = lane <= stop ? static_cast<int64_t>(s & kTileCountMask) : 0;
    for (int d = 16; d > 0; d /= 2) counted += __shfl_xor_sync(0xffffffffu, counted, d);
    before += counted;
    if (prefix_lanes != 0u) break;
  }
  if (lane == 0) {
    atomicExch(state + tile, kTilePrefix | static_cast<unsigned long long>(before + count));
    if (tile == num_tiles - 1) *total = before + count;
  }
  return before;
}

// WriteTilesKernel with the tiles' starts from TileStart (which writes *total).
template <typename Pred, typename Emit>
__global__ void __launch_bounds__(kThreads)
    CompactTilesKernel(Pred pred, Emit emit, int64_t n, int64_t num_tiles, unsigned long long* state,
                       int64_t* total) {
  ChainedKernelBegin();
  using BlockScan = cub::BlockScan<int, kThreads>;
  __shared__ typename BlockScan::TempStorage temp;
  __shared__ int64_t tile_ticket, tile_before;
  for (;;) {
    if (threadIdx.x == 0) tile_ticket = NextTile(state, num_tiles);
    __syncthreads();
    const int64_t tile = tile_ticket;
    if (tile >= num_tiles) break;
    const int64_t first = tile * kTileSize + static_cast<int64_t>(threadIdx.x) * kTileItems;
    bool hit[kTileItems];
    const int selected = TileHits(pred, n, first, hit);
    int before = 0, tile_total = 0;
    BlockScan(temp).ExclusiveSum(selected, before, tile_total);
    if (threadIdx.x < 32) {
      const int64_t start = TileStart(state, tile, num_tiles, tile_total, static_cast<int>(threadIdx.x), total);
      if (threadIdx.x == 0) tile_before = start;
    }
    __syncthreads();
    int64_t rank = tile_before + before;
    for (int j = 0; j < kTileItems; ++j) {
      if (hit[j]) emit(first + j, rank++);
    }
    __syncthreads();  // temp, tile_ticket and tile_before are rewritten for the next tile
  }
}

// CountCompaction and WriteCompaction in one launch (and a memset of the tiles' states), the
// total in *total on the device.
template <typename Pred, typename Emit>
GpuStatus Compact(Stream stream, Scratch* scratch, Pred pred, Emit emit, int64_t n, int64_t* total) {
  const int64_t num_tiles = (n + kTileSize - 1) / kTileSize;
  if (num_tiles == 0) {
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(cudaMemsetAsync(total, 0, sizeof(int64_t), stream), "compaction total");
    return GpuStatus::Ok();
  }
  const int64_t states = OnePassStates(num_tiles);
  auto* state = scratch->DeviceArray<unsigned long long>(states);
  if (state == nullptr) return GpuStatus::OutOfMemory("compaction tiles");
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(cudaMemsetAsync(state, 0, sizeof(unsigned long long) * states, stream),
                                          "compaction tiles");
  LaunchChained(CompactTilesKernel<Pred, Emit>, TileBlocks(num_tiles), kThreads, 0, stream, pred, emit, n, num_tiles,
                state, total);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("compaction");
  return GpuStatus::Ok();
}

template <typename Pred>
GpuStatus CountCompaction(Stream stream, Scratch* scratch, Pred pred, int64_t n,
                          int64_t* total, Compaction* c) {
  c->n = n;
  c->num_tiles = (n + kTileSize - 1) / kTileSize;
  if (c->num_tiles == 0) {
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(cudaMemsetAsync(total, 0, sizeof(int64_t), stream),
                                            "compaction total");
    return GpuStatus::Ok();
  }
  c->tile_counts = scratch->DeviceArray<int64_t>(c->num_tiles);
  c->tile_offsets = scratch->DeviceArray<int64_t>(c->num_tiles);
  if (c->tile_counts == nullptr || c->tile_offsets == nullptr) {
    return GpuStatus::OutOfMemory("compaction tiles");
  }
  LaunchChained(CountTilesKernel<Pred>, TileBlocks(c->num_tiles), kThreads, 0, stream, pred, n, c->num_tiles,
                c->tile_counts);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("compaction count");
  return ScanCounts(stream, scratch, c->tile_counts, c->tile_offsets, c->num_tiles, total);
}

template <typename Pred, typename Emit>
GpuStatus WriteCompaction(Stream stream, const Compaction& c, Pred pred, Emit emit) {
  if (c.num_tiles == 0) return GpuStatus::Ok();
  LaunchChained(WriteTilesKernel<Pred, Emit>, TileBlocks(c.num_tiles), kThreads, 0, stream, pred, emit, c.n,
                c.num_tiles, c.tile_offsets);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("compaction write");
  return GpuStatus::Ok();
}

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_COMMON_GPU_UTIL_CUH_

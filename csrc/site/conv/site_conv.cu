// SiteSparseConv and SiteSparseConvFilterGrad on the GPU: gather-GEMM-scatter with tiles
// in shared memory and our own GEMM loops (the op library links only the CUDA runtime,
// so no cuBLAS).
//
// Forward. The pairs of every offset are cut into tiles of kTileRows pairs; a block takes
// one tile and kTileCols output channels, gathers the tile's input rows kTileDepth input
// channels at a time into shared memory (converted to the accumulator type), multiplies
// them by the offset's filter slice, and adds the [kTileRows, kTileCols] product onto the
// tile's output rows.
// Why atomic adds by default: output rows are unique within one offset but not across
// offsets, and one launch over the tiles of all offsets keeps every SM busy although the
// offsets' pair counts differ widely (a 3^3 submanifold map of a LiDAR scan has all n
// sites at the centre offset and a few percent of them at the corners). One launch per
// offset, which needs no atomics, pays a launch and a tail of idle SMs per offset (27
// for a 3^3 kernel). Atomic adds make the float sums' order depend on timing, so under
// TensorFlow's op determinism the same kernel runs one launch per offset, in offset
// order (the CPU's order), with plain read-modify-write adds: reproducible bit for bit.
// float and double are accumulated in the output itself (double atomicAdd needs sm_60,
// below every architecture we build); half and bfloat16 in a float32 buffer that is
// converted at the end.
//
// Tensor cores. half (sm_70 and later) and bfloat16 (sm_80 and later) multiply on tensor
// cores through WMMA (16 x 16 x 16 fragments, float32 accumulators), with the same tiles
// and the same grid as the CUDA-core path, which remains the code of float, double and
// of the architectures without those MMAs (bfloat16 on sm_75): a block gathers the 64
// input rows of its tile kMmaDepth channels at a time into shared memory as they are
// stored (16-bit, eight per 16-byte load where rows allow), zero-padding rows past the
// offset's pairs and channels past cin; each of the 8 warps owns a 16 x 32 piece of the
// 64 x 64 output tile; the accumulators go through shared memory to the same float32
// scatter-add as the CUDA-core path. A product of two half or bfloat16 values is exact
// in float32, so the tensor cores change only the order of the float32 sums.
//
// On sm_80 and later, rows of whole 16-byte vectors take pipelined kernels of their own
// (gathers through cp.async): site_conv_mma_sync.cuh (mma.sync: half, bfloat16, and
// float with TF32), site_conv_simt.cuh (float, CUDA cores, TF32 not allowed) and, for
// float's filter gradient, site_conv_filter_grad.cuh; the kernels below remain those of
// double, of sm_75 (and sm_70 half) and of other rows.
//
// Filter gradient. dW[q] = X[in_rows]^T G[out_rows] over q's pairs is a reduction over
// pairs: each offset's pairs are cut into fixed chunks, a block computes one chunk's
// partial product for a [64 x 64] tile of dW[q], and a second kernel adds the partials of
// each offset in chunk order. No atomics, so the result does not depend on timing.
//
// The map is checked first (the CPU's CheckSiteMapRows, in_rows/out_rows ranges and at
// most one pair per output row and offset, the latter with a bitmask of (row, offset)
// flags, or a sort of the pairs where the bitmask would be much larger than they are);
// the products run only when every check passed, so bad rows never index memory.
// A trusted map (map_is_trusted, SiteKernelMap's) is not checked: no Report, no round
// trip, and the functors return once the work is queued.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "common/gpu_util.cuh"
#include "site/conv/site_conv_filter_grad.cuh"
#include "site/conv/site_conv_gpu.h"
#include "site/conv/site_half.cuh"
#include "site/conv/site_conv_mma_sync.cuh"
#include "site/conv/site_conv_outputs.cuh"
#include "site/conv/site_conv_pipeline.cuh"
#include "site/conv/site_conv_simt.cuh"
#include "site/conv/site_epilogue.cuh"
#include "site/conv/site_vector.cuh"

namespace tf_sparseconv {
namespace gpu {
namespace {

constexpr int kTileRows = 64;   // pairs per forward tile
constexpr int kTileCols = 64;   // output channels per tile; input channels per filter-gradient tile
constexpr int kTileDepth = 16;  // input channels per forward step; pairs per filter-gradient step
constexpr int kSub = 4;         // each of 16 x 16 threads owns 4 x 4 results, 16 apart
static_assert(kThreads == 256 && kTileRows == 16 * kSub && kTileCols == 16 * kSub,
              "the GEMM tiles assume 16 x 16 threads with 4 x 4 results each");
// Grid-stride loops take any number of tiles; more blocks than this only queue.
constexpr int64_t kMaxBlocks = int64_t{1} << 20;
// The filter gradient aims at about this many blocks, with at least kMinChunkPairs pairs
// per chunk, which bounds the partial sums' memory.
constexpr double kFilterGradBlocks = 2048;
constexpr int64_t kMinChunkPairs = 512;
// Tensor-core tiles: kMmaDepth input channels (forward) or pairs (filter gradient) per
// step, two 16-deep MMAs. Shared rows of 16-bit values are padded by kMmaPad elements
// (16 bytes), which keeps every fragment's first element 32-byte aligned (WMMA's rule:
// 16 rows of 80 or 144 bytes are multiples of 32) and spreads the rows over the banks;
// the float32 staging of the accumulators is padded by 4 (16 rows of 272 bytes).
constexpr int kMmaDepth = 32;
constexpr int kMmaPad = 8;
constexpr int kMmaLdC = kTileCols + 4;
static_assert(kTileRows * kMmaDepth / 8 == kThreads && kMmaDepth * kTileCols / 8 == kThreads,
              "every thread stages one 8-element vector per tile and step");
static_assert(kTileRows == 64 && kTileCols == 64 && kThreads == 256,
              "8 warps: 4 along the 64 rows, 2 along the 64 columns, 16 x 32 each");
static_assert(kMinChunkPairs % kMmaDepth == 0, "filter-gradient chunks are whole tensor-core steps");

// The WMMA element type of a 16-bit storage type where this architecture multiplies it
// on tensor cores (kAvailable). The host pass sees every specialisation, each device
// pass those of its architecture, so a kernel's body picks its path per architecture.
template <typename T>
struct Mma {
  static constexpr bool kAvailable = false;
};
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700
template <>
struct Mma<Half> {
  static constexpr bool kAvailable = true;
  using type = __half;
};
#endif
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
template <>
struct Mma<BFloat16> {
  static constexpr bool kAvailable = true;
  using type = __nv_bfloat16;
};
#endif

// Eight consecutive 16-bit values from src, of which the first `valid` exist and the rest
// are zero padding: one 16-byte load where all eight exist and src is 16-byte aligned
// (vectors: the row length is a multiple of 8 and the base pointer aligned), otherwise
// one load per existing value. src is not read when valid <= 0.
__device__ inline uint4 Load8(const uint16_t* src, int64_t valid, bool vectors) {
  if (valid >= 8 && vectors) return __ldg(reinterpret_cast<const uint4*>(src));
  uint32_t v[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (i < valid) v[i / 2] |= static_cast<uint32_t>(__ldg(src + i)) << (16 * (i % 2));
  }
  return make_uint4(v[0], v[1], v[2], v[3]);
}

// 16 bytes of consecutive values (8 of 16 bits or 4 floats) from src, of which the first
// `valid` exist: Load8's rule for either width.
__device__ inline uint4 LoadVector(const uint16_t* src, int64_t valid, bool vectors) {
  return Load8(src, valid, vectors);
}
__device__ inline uint4 LoadVector(const float* src, int64_t valid, bool vectors) {
  if (valid >= 4 && vectors) return __ldg(reinterpret_cast<const uint4*>(src));
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (i < valid) v[i] = __ldg(src + i);
  }
  return make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
}

inline unsigned int GridFor(int64_t items) {
  return static_cast<unsigned int>(items < 1 ? 1 : (items > kMaxBlocks ? kMaxBlocks : items));
}

// ---- Checks ----------------------------------------------------------------------------

// seen holds one bit per (output row, offset): a second pair setting the same bit repeats
// an output row within an offset. Which pair repeats first is left to the error path
// (FirstRepeatedOutputRow), since the bit's setter order depends on timing. seen ==
// nullptr: the ranges only (the repeats are then found by sorting, MarkFirstRepeat).
__global__ void CheckMapRowsKernel(const int32_t* in_rows, const int32_t* out_rows, const int64_t* splits,
                                   CheckedMap checked, int64_t num_in, int64_t num_out, int64_t volume,
                                   unsigned int* seen, Report* report) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(p, checked.pairs) {
    const int64_t i = in_rows[p], o = out_rows[p];
    const bool out_ok = o >= 0 && o < num_out;
    if (i < 0 || i >= num_in || !out_ok) RecordFirst(&report->checks[kSiteRows], p);
    if (!out_ok || seen == nullptr) continue;
    const int64_t bit = o * volume + OwnerOf(splits, checked.offsets, p);
    const unsigned int mask = 1u << (bit & 31);
    if (atomicOr(&seen[bit >> 5], mask) & mask) RecordFirst(&report->checks[kSiteRepeat], p);
  }
}

__global__ void DescribeRowsKernel(const int32_t* in_rows, const int32_t* out_rows, Report* report) {
  ChainedKernelBegin();
  CheckSlot& slot = report->checks[kSiteRows];
  if (slot.first == kNoError) return;
  slot.detail[0] = in_rows[slot.first];
  slot.detail[1] = out_rows[slot.first];
}

template <typename T>
__global__ void NaNKernel(const T* x, int64_t n, CheckSlot* slot) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(i, n) {
    if (isnan(ToAcc(x[i]))) RecordFirst(slot, i);
  }
}

// Sort keys for the exact repeat position: (offset, output row), pairs with an output row
// out of range last.
__global__ void RepeatKeysKernel(const int32_t* out_rows, const int64_t* splits, CheckedMap checked,
                                 int64_t num_out, uint64_t none, uint64_t* keys, int32_t* pairs) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(p, checked.pairs) {
    const int64_t o = out_rows[p];
    keys[p] = o >= 0 && o < num_out
                  ? static_cast<uint64_t>(OwnerOf(splits, checked.offsets, p) * num_out + o)
                  : none;
    pairs[p] = static_cast<int32_t>(p);
  }
}

// After a stable sort the pairs of one (offset, row) are in pair order; every one but the
// first repeats the row, and the lowest of those is where the CPU stops.
__global__ void FirstRepeatKernel(const uint64_t* keys, const int32_t* pairs, int64_t n, uint64_t none,
                                  CheckSlot* slot) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(s, n) {
    if (s > 0 && keys[s] != none && keys[s] == keys[s - 1]) RecordFirst(slot, pairs[s]);
  }
}

__global__ void DescribeRepeatKernel(const int32_t* out_rows, CheckSlot* slot) {
  ChainedKernelBegin();
  if (slot->first == kNoError) return;
  slot->detail[0] = out_rows[slot->first];
}

// ---- Forward -------------------------------------------------------------------------

// One step of the CUDA-core tiles (forward and filter gradient): acc[i][j] += the sum over
// k of as[k][ty + 16 i] * bs[k][tx + 16 j], each of 16 x 16 threads owning kSub x kSub
// results 16 apart.
template <typename A, int kLdA, int kLdB>
__device__ __forceinline__ void AccumulateProducts(const A (&as)[kTileDepth][kLdA], const A (&bs)[kTileDepth][kLdB],
                                                   int tx, int ty, A (&acc)[kSub][kSub]) {
#pragma unroll
  for (int k = 0; k < kTileDepth; ++k) {
    A a[kSub], b[kSub];
#pragma unroll
    for (int i = 0; i < kSub; ++i) a[i] = as[k][ty + 16 * i];
#pragma unroll
    for (int j = 0; j < kSub; ++j) b[j] = bs[k][tx + 16 * j];
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
#pragma unroll
      for (int j = 0; j < kSub; ++j) acc[i][j] += a[i] * b[j];
    }
  }
}

template <typename T, typename A, bool kAtomic>
__device__ void CudaCoreGatherGemmScatter(const T* features, const T* filters, const int32_t* in_rows,
                                          const int32_t* out_rows, const int64_t* splits, const int64_t* tile_begin,
                                          int64_t volume, int64_t cin, int64_t cout, int64_t col_tiles,
                                          int64_t first_tile, int64_t num_tiles, A* out) {
  // gathered[k][r]: row r of the tile, input channel k0 + k. The +1 spreads the gather's
  // stores (consecutive threads: consecutive k of one row) over the banks.
  __shared__ A gathered[kTileDepth][kTileRows + 1];
  __shared__ A weights[kTileDepth][kTileCols];
  __shared__ int32_t rows_in[kTileRows];
  __shared__ int32_t rows_out[kTileRows];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t items = num_tiles * col_tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const PairTile t = PairTileOf(item, col_tiles, first_tile, tile_begin, splits, volume, kTileRows, kTileCols);
    if (threadIdx.x < kTileRows) {
      const int64_t p = t.p0 + threadIdx.x;
      rows_in[threadIdx.x] = p < t.p_end ? in_rows[p] : -1;
      rows_out[threadIdx.x] = p < t.p_end ? out_rows[p] : -1;
    }
    __syncthreads();
    A acc[kSub][kSub];
    ZeroTile(acc);
    const T* w = filters + t.q * cin * cout;
    for (int64_t k0 = 0; k0 < cin; k0 += kTileDepth) {
      for (int e = threadIdx.x; e < kTileDepth * kTileRows; e += kThreads) {
        const int r = e / kTileDepth, k = e % kTileDepth;
        const int64_t row = rows_in[r];
        gathered[k][r] = row >= 0 && k0 + k < cin ? ToAcc(features[row * cin + k0 + k]) : A(0);
      }
      for (int e = threadIdx.x; e < kTileDepth * kTileCols; e += kThreads) {
        const int k = e / kTileCols, c = e % kTileCols;
        weights[k][c] = k0 + k < cin && t.col0 + c < cout ? ToAcc(w[(k0 + k) * cout + t.col0 + c]) : A(0);
      }
      __syncthreads();
      AccumulateProducts(gathered, weights, tx, ty, acc);
      __syncthreads();  // gathered and weights are refilled next step
    }
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
      const int64_t o = rows_out[ty + 16 * i];
      if (o < 0) continue;
      A* dst = out + o * cout;
#pragma unroll
      for (int j = 0; j < kSub; ++j) {
        const int64_t c = t.col0 + tx + 16 * j;
        if (c >= cout) continue;
        if constexpr (kAtomic) {
          atomicAdd(dst + c, acc[i][j]);
        } else {
          dst[c] += acc[i][j];  // one launch per offset: no other thread has this (row, column)
        }
      }
    }
    __syncthreads();  // rows_in and rows_out are refilled by the next item
  }
}

// The same tiles on tensor cores (M: the WMMA element type, the bits of T).
template <typename M, bool kAtomic, typename T>
__device__ void TensorCoreGatherGemmScatter(const T* features, const T* filters, const int32_t* in_rows,
                                            const int32_t* out_rows, const int64_t* splits,
                                            const int64_t* tile_begin, int64_t volume, int64_t cin, int64_t cout,
                                            int64_t col_tiles, int64_t first_tile, int64_t num_tiles, float* out) {
  namespace wmma = nvcuda::wmma;
  static_assert(sizeof(T) == 2 && sizeof(M) == 2, "16-bit storage");
  constexpr int kLdA = kMmaDepth + kMmaPad;  // gathered[r][k]: row r of the tile, input channel k0 + k
  constexpr int kLdB = kTileCols + kMmaPad;  // weights[k][c]: input channel k0 + k, output channel col0 + c
  __shared__ __align__(32) uint16_t gathered[kTileRows * kLdA];
  __shared__ __align__(32) uint16_t weights[kMmaDepth * kLdB];
  __shared__ __align__(32) float product[kTileRows * kMmaLdC];
  __shared__ int32_t rows_out[kTileRows];
  const uint16_t* x = reinterpret_cast<const uint16_t*>(features);
  const uint16_t* filters16 = reinterpret_cast<const uint16_t*>(filters);
  const int warp = threadIdx.x / 32;
  const int wm = warp % 4, wn = warp / 4;  // the warp's rows 16 wm .. 16 wm + 16, columns 32 wn .. 32 wn + 32
  // What this thread stages per step: 8 channels of one gathered row, 8 columns of one
  // filter row.
  const int a_row = threadIdx.x / (kMmaDepth / 8), a_col = threadIdx.x % (kMmaDepth / 8) * 8;
  const int b_row = threadIdx.x / (kTileCols / 8), b_col = threadIdx.x % (kTileCols / 8) * 8;
  const bool x_vectors = cin % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const bool w_vectors = cout % 8 == 0 && reinterpret_cast<uintptr_t>(filters16) % 16 == 0;
  const int64_t items = num_tiles * col_tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const PairTile t = PairTileOf(item, col_tiles, first_tile, tile_begin, splits, volume, kTileRows, kTileCols);
    const int64_t col0 = t.col0;
    if (threadIdx.x < kTileRows) {
      const int64_t p = t.p0 + threadIdx.x;
      rows_out[threadIdx.x] = p < t.p_end ? out_rows[p] : -1;
    }
    const int64_t row = t.p0 + a_row < t.p_end ? in_rows[t.p0 + a_row] : -1;
    const uint16_t* w = filters16 + t.q * cin * cout;
    // The next step's values are loaded before this step's MMAs, so the gather's latency
    // overlaps the arithmetic.
    auto load_a = [&](int64_t k0) {
      const int64_t k = k0 + a_col;
      return row >= 0 ? Load8(x + row * cin + k, cin - k, x_vectors) : make_uint4(0u, 0u, 0u, 0u);
    };
    auto load_b = [&](int64_t k0) {
      const int64_t k = k0 + b_row, c = col0 + b_col;
      return k < cin ? Load8(w + k * cout + c, cout - c, w_vectors) : make_uint4(0u, 0u, 0u, 0u);
    };
    uint4 a_next = load_a(0), b_next = load_b(0);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
    wmma::fill_fragment(acc[0], 0.0f);
    wmma::fill_fragment(acc[1], 0.0f);
    for (int64_t k0 = 0; k0 < cin; k0 += kMmaDepth) {
      *reinterpret_cast<uint4*>(gathered + a_row * kLdA + a_col) = a_next;
      *reinterpret_cast<uint4*>(weights + b_row * kLdB + b_col) = b_next;
      __syncthreads();
      if (k0 + kMmaDepth < cin) {
        a_next = load_a(k0 + kMmaDepth);
        b_next = load_b(k0 + kMmaDepth);
      }
#pragma unroll
      for (int kk = 0; kk < kMmaDepth; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, M, wmma::row_major> a;
        wmma::load_matrix_sync(a, reinterpret_cast<const M*>(gathered + 16 * wm * kLdA + kk), kLdA);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, M, wmma::row_major> b;
          wmma::load_matrix_sync(b, reinterpret_cast<const M*>(weights + kk * kLdB + 32 * wn + 16 * j), kLdB);
          wmma::mma_sync(acc[j], a, b, acc[j]);
        }
      }
      __syncthreads();  // gathered and weights are refilled next step
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(product + 16 * wm * kMmaLdC + 32 * wn + 16 * j, acc[j], kMmaLdC, wmma::mem_row_major);
    }
    __syncthreads();
    // Consecutive threads: consecutive columns of one output row.
    for (int e = threadIdx.x; e < kTileRows * kTileCols; e += kThreads) {
      const int r = e / kTileCols, c = e % kTileCols;
      const int64_t o = rows_out[r];
      if (o < 0 || col0 + c >= cout) continue;
      float* dst = out + o * cout + col0 + c;
      if constexpr (kAtomic) {
        atomicAdd(dst, product[r * kMmaLdC + c]);
      } else {
        *dst += product[r * kMmaLdC + c];  // one launch per offset: no other thread has this (row, column)
      }
    }
    __syncthreads();  // rows_out and product are refilled by the next item
  }
}

// report: nullptr for a trusted map; otherwise the products run only if every check passed.
template <typename T, typename A, bool kAtomic>
__global__ void __launch_bounds__(kThreads)
    GatherGemmScatterKernel(const T* features, const T* filters, const int32_t* in_rows, const int32_t* out_rows,
                            const int64_t* splits, const int64_t* tile_begin, int64_t volume, int64_t cin,
                            int64_t cout, int64_t col_tiles, int64_t first_tile, int64_t num_tiles,
                            const Report* report, A* out) {
  ChainedKernelBegin();
  // Uniform over the block: no barrier is skipped by some threads only.
  if (report != nullptr && !ChecksPassed(report)) return;
  if constexpr (Mma<T>::kAvailable) {
    TensorCoreGatherGemmScatter<typename Mma<T>::type, kAtomic>(features, filters, in_rows, out_rows, splits,
                                                                 tile_begin, volume, cin, cout, col_tiles,
                                                                 first_tile, num_tiles, out);
  } else {
    CudaCoreGatherGemmScatter<T, A, kAtomic>(features, filters, in_rows, out_rows, splits, tile_begin, volume, cin,
                                             cout, col_tiles, first_tile, num_tiles, out);
  }
}

// out = the accumulator acc [n / cout, cout] in the output's type.
template <typename T, typename A>
__global__ void ConvertKernel(const A* acc, int64_t n, T* out) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(i, n) { out[i] = FromAcc<T>::Convert(acc[i]); }
}

// out [rows, cout] = act(acc * s + b) per column in the output's type, (s, b) the
// epilogue's affine map per column (ColumnAffineKernel's coefficients); acc may be out
// (float, double): each thread reads its kV adjacent elements of one row before it writes
// them (site_vector.cuh).
template <typename T, typename A, int kV>
__global__ void AffineRowsKernel(const A* acc, int64_t total, int64_t cout, const A* coefficients, bool relu,
                                 T* out) {
  ChainedKernelBegin();
  const int64_t vectors = total / kV;
  const int64_t row_vectors = cout / kV;
  const bool narrow = vectors <= 0xffffffffLL;
  TF_SPARSECONV_GRID_LOOP(v, vectors) {
    const int64_t j = FirstColumn<kV>(v, row_vectors, narrow);
    const int64_t i = v * kV;
    A x[kV];
    LoadVec<kV>(acc + i, x);
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      x[k] = x[k] * __ldg(coefficients + j + k) + __ldg(coefficients + cout + j + k);
      if (relu && x[k] < A(0)) x[k] = A(0);  // NaN stays NaN, as in tf.nn.relu
    }
    StoreVec<kV>(out + i, x);
  }
}

// ---- Filter gradient -------------------------------------------------------------------

template <typename T, typename A>
__device__ void CudaCoreFilterGradPartial(const T* features, const T* out_grad, const int32_t* in_rows,
                                          const int32_t* out_rows, const int64_t* splits, const int64_t* chunk_begin,
                                          int64_t volume, int64_t chunk_pairs, int64_t num_chunks, int64_t cin,
                                          int64_t cout, int64_t in_tiles, int64_t out_tiles, A* partial) {
  __shared__ A x[kTileDepth][kTileCols];     // [pair][input channel k0 + k]
  __shared__ A grad[kTileDepth][kTileCols];  // [pair][output channel c0 + c]
  __shared__ int32_t rows_in[kTileDepth];
  __shared__ int32_t rows_out[kTileDepth];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t tiles = in_tiles * out_tiles;  // hoisted: computed per item it costs registers
  const int64_t items = num_chunks * tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const ChunkTile t = ChunkTileOf(item, in_tiles, out_tiles, chunk_begin, splits, volume, chunk_pairs, kTileCols,
                                    kTileCols);
    const int64_t k0 = t.k0, c0 = t.c0;
    A acc[kSub][kSub];
    ZeroTile(acc);
    for (int64_t p0 = t.begin; p0 < t.end; p0 += kTileDepth) {
      if (threadIdx.x < kTileDepth) {
        const int64_t p = p0 + threadIdx.x;
        rows_in[threadIdx.x] = p < t.end ? in_rows[p] : -1;
        rows_out[threadIdx.x] = p < t.end ? out_rows[p] : -1;
      }
      __syncthreads();
      for (int e = threadIdx.x; e < kTileDepth * kTileCols; e += kThreads) {
        const int r = e / kTileCols, k = e % kTileCols;
        const int64_t in = rows_in[r], o = rows_out[r];
        x[r][k] = in >= 0 && k0 + k < cin ? ToAcc(features[in * cin + k0 + k]) : A(0);
        grad[r][k] = o >= 0 && c0 + k < cout ? ToAcc(out_grad[o * cout + c0 + k]) : A(0);
      }
      __syncthreads();
      AccumulateProducts(x, grad, tx, ty, acc);
      __syncthreads();  // rows, x and grad are refilled next step
    }
    A* dst = partial + t.chunk * cin * cout;
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
      const int64_t k = k0 + ty + 16 * i;
      if (k >= cin) continue;
#pragma unroll
      for (int j = 0; j < kSub; ++j) {
        const int64_t c = c0 + tx + 16 * j;
        if (c < cout) dst[k * cout + c] = acc[i][j];
      }
    }
  }
}

// The same tiles on tensor cores: the [64 input channels x 64 output channels] tile of
// one chunk's X^T G, kMmaDepth pairs per step; X^T is X's shared rows read column-major.
// M: half or bfloat16 (16-bit storage), or TF32 (float storage, each factor rounded to
// TF32 after the fragment load).
template <typename M, typename T>
__device__ void TensorCoreFilterGradPartial(const T* features, const T* out_grad, const int32_t* in_rows,
                                            const int32_t* out_rows, const int64_t* splits,
                                            const int64_t* chunk_begin, int64_t volume, int64_t chunk_pairs,
                                            int64_t num_chunks, int64_t cin, int64_t cout, int64_t in_tiles,
                                            int64_t out_tiles, float* partial) {
  namespace wmma = nvcuda::wmma;
  using S = typename pipelined::Element<M>::Stored;
  using Load = typename pipelined::Element<M>::Load;
  using W = typename pipelined::Wmma<M>::type;
  constexpr bool kTf32 = std::is_same<M, pipelined::Tf32>::value;
  constexpr int kMmaK = pipelined::Element<M>::kMmaK;
  constexpr int kVec = 16 / sizeof(S);
  constexpr int kLoads = kMmaDepth * kTileCols / kVec / kThreads;  // 16-byte vectors per thread and step
  static_assert(sizeof(T) == sizeof(S), "the storage of M");
  constexpr int kLd = kTileCols + kVec;  // rows padded by 16 bytes
  __shared__ __align__(32) S x_rows[kMmaDepth * kLd];           // [pair][input channel k0 + k]
  __shared__ __align__(32) S grad_rows[kMmaDepth * kLd];        // [pair][output channel c0 + c]
  __shared__ __align__(32) float product[kTileCols * kMmaLdC];  // [input channel][output channel]
  const S* x = reinterpret_cast<const S*>(features);
  const S* g = reinterpret_cast<const S*>(out_grad);
  const int warp = threadIdx.x / 32;
  const int wm = warp % 4, wn = warp / 4;  // input channels 16 wm .. 16 wm + 16, output channels 32 wn .. + 32
  // What this thread stages per step: kLoads vectors of kVec channels, each of one pair's
  // input row and of its output-gradient row.
  int s_row[kLoads], s_col[kLoads];
#pragma unroll
  for (int l = 0; l < kLoads; ++l) {
    const int v = threadIdx.x + l * kThreads;
    s_row[l] = v / (kTileCols / kVec);
    s_col[l] = v % (kTileCols / kVec) * kVec;
  }
  const bool x_vectors = cin % kVec == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const bool g_vectors = cout % kVec == 0 && reinterpret_cast<uintptr_t>(g) % 16 == 0;
  const int64_t tiles = in_tiles * out_tiles;  // hoisted: computed per item it costs registers
  const int64_t items = num_chunks * tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const ChunkTile t = ChunkTileOf(item, in_tiles, out_tiles, chunk_begin, splits, volume, chunk_pairs, kTileCols,
                                    kTileCols);
    const int64_t begin = t.begin, end = t.end, k0 = t.k0, c0 = t.c0;
    uint4 x_next[kLoads], g_next[kLoads];
    // The next step's rows are loaded before this step's MMAs (latency under arithmetic).
    auto stage = [&](int64_t p0) {
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        const int64_t p = p0 + s_row[l];
        const int64_t in = p < end ? in_rows[p] : -1, o = p < end ? out_rows[p] : -1;
        const int64_t k = k0 + s_col[l], c = c0 + s_col[l];
        x_next[l] = in >= 0 ? LoadVector(x + in * cin + k, cin - k, x_vectors) : make_uint4(0u, 0u, 0u, 0u);
        g_next[l] = o >= 0 ? LoadVector(g + o * cout + c, cout - c, g_vectors) : make_uint4(0u, 0u, 0u, 0u);
      }
    };
    stage(begin);
    wmma::fragment<wmma::accumulator, 16, 16, kMmaK, float> acc[2];
    wmma::fill_fragment(acc[0], 0.0f);
    wmma::fill_fragment(acc[1], 0.0f);
    for (int64_t p0 = begin; p0 < end; p0 += kMmaDepth) {
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        *reinterpret_cast<uint4*>(x_rows + s_row[l] * kLd + s_col[l]) = x_next[l];
        *reinterpret_cast<uint4*>(grad_rows + s_row[l] * kLd + s_col[l]) = g_next[l];
      }
      __syncthreads();
      if (p0 + kMmaDepth < end) stage(p0 + kMmaDepth);
#pragma unroll
      for (int kk = 0; kk < kMmaDepth; kk += kMmaK) {
        // Element (m, k) of X^T is x_rows[(kk + k) * kLd + 16 wm + m]: column-major.
        wmma::fragment<wmma::matrix_a, 16, 16, kMmaK, W, wmma::col_major> a;
        wmma::load_matrix_sync(a, reinterpret_cast<const Load*>(x_rows + kk * kLd + 16 * wm), kLd);
        if constexpr (kTf32) pipelined::RoundToTf32(a);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          wmma::fragment<wmma::matrix_b, 16, 16, kMmaK, W, wmma::row_major> b;
          wmma::load_matrix_sync(b, reinterpret_cast<const Load*>(grad_rows + kk * kLd + 32 * wn + 16 * j), kLd);
          if constexpr (kTf32) pipelined::RoundToTf32(b);
          wmma::mma_sync(acc[j], a, b, acc[j]);
        }
      }
      __syncthreads();  // x_rows and grad_rows are refilled next step
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(product + 16 * wm * kMmaLdC + 32 * wn + 16 * j, acc[j], kMmaLdC, wmma::mem_row_major);
    }
    __syncthreads();
    float* dst = partial + t.chunk * cin * cout;
    for (int e = threadIdx.x; e < kTileCols * kTileCols; e += kThreads) {
      const int r = e / kTileCols, c = e % kTileCols;
      if (k0 + r < cin && c0 + c < cout) dst[(k0 + r) * cout + c0 + c] = product[r * kMmaLdC + c];
    }
    __syncthreads();  // product is refilled by the next item
  }
}

// report: nullptr for a trusted map; otherwise the products run only if every check passed.
// kTf32 (float on sm_80+ with TF32 allowed) is a kernel of its own: the paths' shared
// arrays add up within one kernel, and the CUDA-core path's occupancy would pay for both.
template <typename T, typename A, bool kTf32>
__global__ void __launch_bounds__(kThreads)
    FilterGradPartialKernel(const T* features, const T* out_grad, const int32_t* in_rows, const int32_t* out_rows,
                            const int64_t* splits, const int64_t* chunk_begin, int64_t volume, int64_t chunk_pairs,
                            int64_t num_chunks, int64_t cin, int64_t cout, int64_t in_tiles, int64_t out_tiles,
                            const Report* report, A* partial) {
  ChainedKernelBegin();
  if (report != nullptr && !ChecksPassed(report)) return;
  if constexpr (kTf32) {
    static_assert(std::is_same<T, float>::value, "TF32 multiplies float");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    TensorCoreFilterGradPartial<pipelined::Tf32>(features, out_grad, in_rows, out_rows, splits,
                                                               chunk_begin, volume, chunk_pairs, num_chunks, cin,
                                                               cout, in_tiles, out_tiles, partial);
#endif
  } else if constexpr (Mma<T>::kAvailable) {
    TensorCoreFilterGradPartial<typename Mma<T>::type>(features, out_grad, in_rows, out_rows, splits, chunk_begin,
                                                       volume, chunk_pairs, num_chunks, cin, cout, in_tiles,
                                                       out_tiles, partial);
  } else {
    CudaCoreFilterGradPartial<T, A>(features, out_grad, in_rows, out_rows, splits, chunk_begin, volume, chunk_pairs,
                                    num_chunks, cin, cout, in_tiles, out_tiles, partial);
  }
}

template <typename T, typename A>
__global__ void FilterGradReduceKernel(const A* partial, const int64_t* chunk_begin, int64_t volume,
                                       int64_t slice, T* filter_grad) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(idx, volume * slice) {
    const int64_t q = idx / slice;
    const int64_t e = idx - q * slice;
    A sum = A(0);
    for (int64_t chunk = chunk_begin[q]; chunk < chunk_begin[q + 1]; ++chunk) sum += partial[chunk * slice + e];
    filter_grad[idx] = FromAcc<T>::Convert(sum);
  }
}

// ---- Host side -------------------------------------------------------------------------

// On the device: splits (volume + 1), then the first unit (tile or chunk) of every offset
// (volume + 1), units = ceil(pairs / unit) per offset. Only when every split rises are
// units defined; otherwise they are all 0 and nothing is computed.
struct OffsetTable {
  const int64_t* splits = nullptr;
  const int64_t* unit_begin = nullptr;
  std::vector<int64_t> host_unit_begin;
  int64_t units = 0;
};

GpuStatus UploadOffsetTable(Stream stream, Scratch* scratch, const int32_t* host_splits, int64_t volume,
                            const CheckedMap& checked, int64_t unit, OffsetTable* table) {
  std::vector<int64_t> host(static_cast<size_t>(2 * (volume + 1)), 0);
  for (int64_t q = 0; q <= volume; ++q) host[q] = host_splits[q];
  int64_t* unit_begin = host.data() + volume + 1;
  if (checked.offsets == volume) {
    for (int64_t q = 0; q < volume; ++q) {
      unit_begin[q + 1] = unit_begin[q] + (host[q + 1] - host[q] + unit - 1) / unit;
    }
  }
  table->host_unit_begin.assign(unit_begin, unit_begin + volume + 1);
  table->units = unit_begin[volume];
  void* device = nullptr;
  TF_SPARSECONV_RETURN_IF_ERROR(
      Upload(stream, scratch, host.data(), sizeof(int64_t) * host.size(), &device, "offset table"));
  table->splits = static_cast<const int64_t*>(device);
  table->unit_begin = table->splits + volume + 1;
  return GpuStatus::Ok();
}

// Records in slot the first pair (in pair order, among the checked pairs with out_rows in
// range) whose output row an earlier pair of its offset already has: (offset, row) keys
// stably sorted, 24 bytes per pair and the sort's scratch. splits: device memory.
GpuStatus MarkFirstRepeat(Stream stream, Scratch* scratch, const int32_t* out_rows, const int64_t* splits,
                          const CheckedMap& checked, int64_t num_out, CheckSlot* slot) {
  const uint64_t none = static_cast<uint64_t>(checked.offsets * num_out);  // above every (q, row) key
  uint64_t* keys[2] = {scratch->DeviceArray<uint64_t>(checked.pairs), scratch->DeviceArray<uint64_t>(checked.pairs)};
  int32_t* pairs[2] = {scratch->DeviceArray<int32_t>(checked.pairs), scratch->DeviceArray<int32_t>(checked.pairs)};
  if (!keys[0] || !keys[1] || !pairs[0] || !pairs[1]) return GpuStatus::OutOfMemory("repeated-row search");
  LaunchChained(RepeatKeysKernel, BlocksFor(checked.pairs), kThreads, 0, stream, out_rows, splits, checked, num_out,
                none, keys[0], pairs[0]);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("repeated-row search");
  int current = 0;
  TF_SPARSECONV_RETURN_IF_ERROR(SortPairs(stream, scratch, keys, pairs, checked.pairs, BitsFor(none), &current));
  LaunchChained(FirstRepeatKernel, BlocksFor(checked.pairs), kThreads, 0, stream, keys[current], pairs[current],
                checked.pairs, none, slot);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("repeated-row search");
  return GpuStatus::Ok();
}

GpuStatus CheckMap(Stream stream, Scratch* scratch, const int32_t* in_rows, const int32_t* out_rows,
                   const int64_t* splits, const CheckedMap& checked, int64_t num_in, int64_t num_out,
                   int64_t volume, Report* report) {
  if (checked.pairs == 0) return GpuStatus::Ok();
  // The repeat check: a bitmask over (output row, offset) where it is within a small
  // factor of the pairs' own memory, else (num_out is a scalar input, 2^31 - 1 at most,
  // times up to 2^20 offsets) a sort of the pairs' (offset, row) keys, as the CPU's check
  // sorts, so the check's memory follows the map, not num_out.
  int64_t bits = 0;
  const bool by_bits = !__builtin_mul_overflow(num_out, volume, &bits) && bits / 32 <= 2 * checked.pairs + 4096;
  unsigned int* seen = nullptr;
  if (by_bits) {
    const int64_t words = (bits + 31) / 32;
    seen = scratch->DeviceArray<unsigned int>(words);
    if (seen == nullptr) return GpuStatus::OutOfMemory("repeated-row check");
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
        cudaMemsetAsync(seen, 0, sizeof(unsigned int) * (words > 0 ? words : 1), stream), "repeated-row check");
  }
  LaunchChained(CheckMapRowsKernel, BlocksFor(checked.pairs), kThreads, 0, stream, in_rows, out_rows, splits, checked,
                num_in, num_out, volume, seen, report);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("map check");
  LaunchChained(DescribeRowsKernel, 1, 1, 0, stream, in_rows, out_rows, report);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("map check");
  if (!by_bits) {
    TF_SPARSECONV_RETURN_IF_ERROR(
        MarkFirstRepeat(stream, scratch, out_rows, splits, checked, num_out, &report->checks[kSiteRepeat]));
  }
  return GpuStatus::Ok();
}

template <typename T, typename A, bool kAtomic>
GpuStatus LaunchGatherGemmScatter(Stream stream, const SiteConvArgs<T>& a, const OffsetTable& table,
                                  int64_t first_tile, int64_t num_tiles, const Report* report, A* out) {
  const int64_t col_tiles = (a.cout + kTileCols - 1) / kTileCols;
  LaunchChained(GatherGemmScatterKernel<T, A, kAtomic>, GridFor(num_tiles * col_tiles), kThreads, 0, stream, a.features,
                a.filters, a.in_rows, a.out_rows, table.splits, table.unit_begin, a.volume, a.cin, a.cout, col_tiles,
                first_tile, num_tiles, report, out);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("gather-GEMM-scatter");
  return GpuStatus::Ok();
}

// The element type of the mma.sync tiles (site_conv_mma_sync.cuh, site_conv_outputs.cuh)
// for storage type T (void: none).
template <typename T>
struct PipelinedMma {
  using type = void;
};
template <>
struct PipelinedMma<Half> {
  using type = __half;
};
template <>
struct PipelinedMma<BFloat16> {
  using type = __nv_bfloat16;
};
template <>
struct PipelinedMma<float> {
  using type = pipelined::Tf32;
};

int CurrentComputeMajor() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return 0;
  return major;
}

// Why the pipelined tensor-core kernels (mma.sync) cannot run this forward, or "" where
// they can: they need sm_80 and later, half or bfloat16, or float with TF32 allowed, and
// rows of whole 16-byte vectors.
template <typename T>
std::string PipelinedUnavailable(const SiteConvArgs<T>& a, bool allow_tf32) {
  if constexpr (std::is_void<typename PipelinedMma<T>::type>::value) {
    return "they multiply half, bfloat16 and float (with TF32) on tensor cores, and there is no such kernel for "
           "double";
  } else {
    if (std::is_same<T, float>::value && !allow_tf32) {
      return "float multiplies on them in TF32 only, and TF32 is off "
             "(tf.config.experimental.enable_tensor_float_32_execution)";
    }
    constexpr int64_t vec = 16 / sizeof(T);
    if (a.cin % vec != 0 || a.cout % vec != 0) {
      return "their rows are whole 16-byte vectors: input and output channels must be multiples of " +
             std::to_string(vec) + " for this dtype, got " + std::to_string(a.cin) + " and " + std::to_string(a.cout);
    }
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (!aligned(a.features) || !aligned(a.filters)) return "features and filters must start on 16-byte boundaries";
    const int major = CurrentComputeMajor();
    if (major < 8) {
      return "they need compute capability 8.0 or later (sm_80), and this GPU's is " + std::to_string(major) + ".x";
    }
    return "";
  }
}

// Whether the forward runs on the pipelined tensor-core kernels.
template <typename T>
bool UsePipelined(const SiteConvArgs<T>& a, bool allow_tf32) {
  return a.cin > 0 && PipelinedUnavailable(a, allow_tf32).empty();
}

// Whether float's forward runs on site_conv_simt.cuh's pipelined CUDA-core kernel: sm_80
// and later with TF32 not allowed; whole 16-byte vectors per row.
template <typename T>
bool UseSimtPipelined(const SiteConvArgs<T>& a, bool allow_tf32) {
  if constexpr (!std::is_same<T, float>::value) {
    return false;
  } else {
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return !allow_tf32 && a.cin > 0 && a.cin % 4 == 0 && a.cout % 4 == 0 && aligned(a.features) &&
           aligned(a.filters) && CurrentComputeMajor() >= 8;
  }
}

template <int kBN, bool kAtomic>
GpuStatus LaunchSimtTiles(Stream stream, const SiteConvArgs<float>& a, const OffsetTable& table, int64_t first_tile,
                          int64_t num_tiles, const Report* report, float* out) {
  using Layout = simt::Layout<kBN>;
  const auto kernel = simt::GatherGemmScatterKernel<kBN, kAtomic>;
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Layout::kSharedBytes)),
      "gather-GEMM-scatter (shared memory)");
  const int64_t col_tiles = (a.cout + kBN - 1) / kBN;
  LaunchChained(kernel, GridFor(num_tiles * col_tiles), simt::kBlockThreads, Layout::kSharedBytes, stream, a.features,
                a.filters, a.in_rows, a.out_rows, table.splits, table.unit_begin, a.volume, a.cin, a.cout, col_tiles,
                first_tile, num_tiles, report, out);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("gather-GEMM-scatter");
  return GpuStatus::Ok();
}

template <typename M, int kBN, bool kAtomic, int kStepBytes, typename T>
GpuStatus LaunchMmaSyncTiles(Stream stream, const SiteConvArgs<T>& a, const OffsetTable& table, int64_t first_tile,
                             int64_t num_tiles, const Report* report, float* out) {
  using Layout = mma_sync::Layout<M, kBN, kStepBytes>;
  using S = typename Layout::S;
  const auto kernel = mma_sync::GatherGemmScatterKernel<M, kBN, kAtomic, kStepBytes>;
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Layout::kSharedBytes)),
      "gather-GEMM-scatter (shared memory)");
  const int64_t col_tiles = (a.cout + kBN - 1) / kBN;
  LaunchChained(kernel, GridFor(num_tiles * col_tiles), mma_sync::kBlockThreads, Layout::kSharedBytes, stream,
                reinterpret_cast<const S*>(a.features), reinterpret_cast<const S*>(a.filters), a.in_rows, a.out_rows,
                table.splits, table.unit_begin, a.volume, a.cin, a.cout, col_tiles, first_tile, num_tiles, report, out);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("gather-GEMM-scatter");
  return GpuStatus::Ok();
}

// Output tiles as wide as cout needs, up to 128 columns.
template <bool kAtomic>
GpuStatus LaunchSimt(Stream stream, const SiteConvArgs<float>& a, const OffsetTable& table, int64_t first_tile,
                     int64_t num_tiles, const Report* report, float* out) {
  if (a.cout <= 32) return LaunchSimtTiles<32, kAtomic>(stream, a, table, first_tile, num_tiles, report, out);
  if (a.cout <= 64) return LaunchSimtTiles<64, kAtomic>(stream, a, table, first_tile, num_tiles, report, out);
  return LaunchSimtTiles<128, kAtomic>(stream, a, table, first_tile, num_tiles, report, out);
}

// Whether half and bfloat16 tiles step through the input rows 128 bytes at a time: for
// inputs of at least 128 channels in whole 64-channel steps, and for the output-stationary
// tiles only where outputs average two pairs or more (inverse convolutions, one pair per
// output, gather mostly zero rows and keep the occupancy of the smaller stages); float
// (TF32) always steps 64 bytes. The measurements behind the rule: docs/gpu-kernels.md.
template <typename M, typename T>
bool WideRowSteps(const SiteConvArgs<T>& a, bool output_stationary, bool submanifold_table = false) {
  if (std::is_same<M, pipelined::Tf32>::value) return false;
  // A map given as its table alone (map_is_table) has no pair count on the host; it is a
  // submanifold map, whose outputs each have their own centre pair and, on the surfaces
  // sites sample, several neighbours (the LiDAR frame at 5 cm: 7.8 pairs per output).
  return a.cin >= 128 && a.cin % 64 == 0 && (!output_stationary || submanifold_table || a.pairs >= 2 * a.num_out);
}

// Output tiles as wide as cout needs, up to 128 columns.
template <typename M, bool kAtomic, int kStepBytes, typename T>
GpuStatus LaunchMmaSyncWidth(Stream stream, const SiteConvArgs<T>& a, const OffsetTable& table, int64_t first_tile,
                             int64_t num_tiles, const Report* report, float* out) {
  if (a.cout <= 32) {
    return LaunchMmaSyncTiles<M, 32, kAtomic, kStepBytes>(stream, a, table, first_tile, num_tiles, report, out);
  }
  if (a.cout <= 64) {
    return LaunchMmaSyncTiles<M, 64, kAtomic, kStepBytes>(stream, a, table, first_tile, num_tiles, report, out);
  }
  return LaunchMmaSyncTiles<M, 128, kAtomic, kStepBytes>(stream, a, table, first_tile, num_tiles, report, out);
}

template <bool kAtomic, typename T>
GpuStatus LaunchPipelined(Stream stream, const SiteConvArgs<T>& a, const OffsetTable& table,
                          int64_t first_tile, int64_t num_tiles, const Report* report, float* out) {
  using M = typename PipelinedMma<T>::type;
  if constexpr (std::is_void<M>::value) {
    return GpuStatus{"gather-GEMM-scatter", "no tensor-core kernel for this type"};
  } else {
    // site_conv_mma_sync.cuh's kernel (float with TF32, half, bfloat16).
    if constexpr (!std::is_same<M, pipelined::Tf32>::value) {
      if (WideRowSteps<M>(a, false)) {
        return LaunchMmaSyncWidth<M, kAtomic, 128>(stream, a, table, first_tile, num_tiles, report, out);
      }
    }
    return LaunchMmaSyncWidth<M, kAtomic, 64>(stream, a, table, first_tile, num_tiles, report, out);
  }
}

// The output-stationary tiles (site_conv_outputs.cuh) of kBN columns.
template <typename M, int kBN, int kStepBytes, typename T>
GpuStatus LaunchOutputStationaryTiles(Stream stream, const SiteConvArgs<T>& a, const int32_t* neighbours,
                                      const Report* report, const float* coefficients, T* out) {
  using Layout = mma_sync::Layout<M, kBN, kStepBytes>;
  using S = typename Layout::S;
  const auto kernel = output_stationary::GatherGemmStoreKernel<M, kBN, kStepBytes>;
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Layout::kSharedBytes)),
      "gather-GEMM-store (shared memory)");
  const int64_t col_tiles = (a.cout + kBN - 1) / kBN;
  const int64_t tiles = (a.num_out + Layout::kTileRows - 1) / Layout::kTileRows;
  LaunchChained(kernel, GridFor(tiles * col_tiles), mma_sync::kBlockThreads, Layout::kSharedBytes, stream,
                reinterpret_cast<const S*>(a.features), reinterpret_cast<const S*>(a.filters), neighbours, a.volume,
                a.num_out, a.cin, a.cout, col_tiles, report, coefficients, a.epilogue.relu,
                reinterpret_cast<S*>(out));
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("gather-GEMM-store");
  return GpuStatus::Ok();
}

// Output tiles as wide as cout needs, up to 128 columns.
template <typename M, int kStepBytes, typename T>
GpuStatus LaunchOutputStationaryWidth(Stream stream, const SiteConvArgs<T>& a, const int32_t* neighbours,
                                      const Report* report, const float* coefficients, T* out) {
  if (a.cout <= 32) {
    return LaunchOutputStationaryTiles<M, 32, kStepBytes>(stream, a, neighbours, report, coefficients, out);
  }
  if (a.cout <= 64) {
    return LaunchOutputStationaryTiles<M, 64, kStepBytes>(stream, a, neighbours, report, coefficients, out);
  }
  return LaunchOutputStationaryTiles<M, 128, kStepBytes>(stream, a, neighbours, report, coefficients, out);
}

// The tiles, their epilogue (if any) as one affine map per column computed first
// (ColumnAffineKernel: 8 * cout bytes of temporary memory).
template <typename M, typename T>
GpuStatus LaunchOutputStationary(Stream stream, Scratch* scratch, const SiteConvArgs<T>& a,
                                 const int32_t* neighbours, const Report* report, bool submanifold_table, T* out) {
  float* coefficients = nullptr;
  if (a.epilogue.Any()) {
    coefficients = scratch->DeviceArray<float>(2 * a.cout);
    if (coefficients == nullptr) return GpuStatus::OutOfMemory("epilogue coefficients");
    LaunchChained(ColumnAffineKernel<float>, BlocksFor(a.cout), kThreads, 0, stream, a.epilogue, a.cout,
                  coefficients);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("epilogue coefficients");
  }
  if constexpr (!std::is_same<M, pipelined::Tf32>::value) {
    if (WideRowSteps<M>(a, true, submanifold_table)) {
      return LaunchOutputStationaryWidth<M, 128>(stream, a, neighbours, report, coefficients, out);
    }
  }
  return LaunchOutputStationaryWidth<M, 64>(stream, a, neighbours, report, coefficients, out);
}

// One of site_conv_filter_grad.cuh's partial-product kernels over [kBM x kBN] tiles of
// dW: kernel(features, out_grad, ...) with shared_bytes of dynamic shared memory.
template <int kBM, int kBN, typename Kernel, typename S, typename T>
GpuStatus LaunchFilterGradKernel(Stream stream, Kernel kernel, size_t shared_bytes, const SiteConvArgs<T>& a,
                                 const S* features, const S* out_grad, const OffsetTable& table, int64_t chunk_pairs,
                                 const Report* report, float* partial) {
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes)),
      "filter gradient (shared memory)");
  const int64_t in_tiles = (a.cin + kBM - 1) / kBM, out_tiles = (a.cout + kBN - 1) / kBN;
  LaunchChained(kernel, GridFor(table.units * in_tiles * out_tiles), filter_grad::kBlockThreads, shared_bytes, stream,
                features, out_grad, a.in_rows, a.out_rows, table.splits, table.unit_begin, a.volume, chunk_pairs,
                table.units, a.cin, a.cout, in_tiles, out_tiles, report, partial);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("filter gradient");
  return GpuStatus::Ok();
}

// launch(kBM, kBN) for the tile shape [tile_in x tile_out] (64 or 128 channels each way),
// the sides as std::integral_constant<int, ...>.
template <typename Launch>
GpuStatus ForFilterGradTiles(int64_t tile_in, int64_t tile_out, const Launch& launch) {
  using Wide = std::integral_constant<int, 128>;
  using Narrow = std::integral_constant<int, 64>;
  if (tile_in == 128 && tile_out == 128) return launch(Wide{}, Wide{});
  if (tile_in == 128) return launch(Wide{}, Narrow{});
  if (tile_out == 128) return launch(Narrow{}, Wide{});
  return launch(Narrow{}, Narrow{});
}

// site_conv_filter_grad.cuh's 16-bit partial products (M: __half or __nv_bfloat16) in
// [tile_in x tile_out] tiles (64 or 128).
template <typename M, typename T>
GpuStatus LaunchFilterGrad16(Stream stream, const SiteConvArgs<T>& a, const T* out_grad, const OffsetTable& table,
                             int64_t chunk_pairs, int64_t tile_in, int64_t tile_out, const Report* report,
                             float* partial) {
  return ForFilterGradTiles(tile_in, tile_out, [&](auto bm, auto bn) {
    constexpr int kBM = decltype(bm)::value, kBN = decltype(bn)::value;
    return LaunchFilterGradKernel<kBM, kBN>(stream, filter_grad::PartialKernel16<M, kBM, kBN>,
                                            filter_grad::Layout16<kBM, kBN>::kSharedBytes, a,
                                            reinterpret_cast<const uint16_t*>(a.features),
                                            reinterpret_cast<const uint16_t*>(out_grad), table, chunk_pairs, report,
                                            partial);
  });
}

// site_conv_filter_grad.cuh's partial products in [tile_in x tile_out] tiles (64 or 128).
GpuStatus LaunchFilterGradPipelined(Stream stream, const SiteConvArgs<float>& a, const float* out_grad,
                                    const OffsetTable& table, int64_t chunk_pairs, int64_t tile_in, int64_t tile_out,
                                    bool tf32, const Report* report, float* partial) {
  return ForFilterGradTiles(tile_in, tile_out, [&](auto bm, auto bn) {
    constexpr int kBM = decltype(bm)::value, kBN = decltype(bn)::value;
    constexpr size_t kShared = filter_grad::Layout<kBM, kBN>::kSharedBytes;
    return tf32 ? LaunchFilterGradKernel<kBM, kBN>(stream, filter_grad::PartialKernel<kBM, kBN, true>, kShared, a,
                                                   a.features, out_grad, table, chunk_pairs, report, partial)
                : LaunchFilterGradKernel<kBM, kBN>(stream, filter_grad::PartialKernel<kBM, kBN, false>, kShared, a,
                                                   a.features, out_grad, table, chunk_pairs, report, partial);
  });
}

// SiteNeighbourTable's layout (site_conv_outputs.cuh) of a map with volume <= 32 into
// neighbours [num_out, volume + 2]: the table, then the outputs sorted by their masks.
// Temporary memory: 20 * num_out bytes and the sort's scratch.
GpuStatus BuildNeighbourTable(Stream stream, Scratch* scratch, const int32_t* in_rows, const int32_t* out_rows,
                              const int64_t* device_splits, int64_t volume, int64_t pairs, int64_t num_in,
                              int64_t num_out, int32_t* neighbours) {
  const int64_t n = num_out, width = NeighbourTableWidth(volume);
  if (n == 0) return GpuStatus::Ok();
  uint32_t* masks = scratch->DeviceArray<uint32_t>(n);
  if (!masks) return GpuStatus::OutOfMemory("neighbour table");
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(cudaMemsetAsync(neighbours, 0xff, sizeof(int32_t) * n * width, stream),
                                          "neighbour table");  // -1: none
  TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(cudaMemsetAsync(masks, 0, sizeof(uint32_t) * n, stream), "neighbour table");
  if (pairs > 0) {
    LaunchChained(output_stationary::NeighbourTableKernel, BlocksFor(pairs), kThreads, 0, stream, in_rows, out_rows,
                  device_splits, volume, width, pairs, num_in, n, neighbours, masks);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("neighbour table");
  }
  return SortNeighbourRows(stream, scratch, masks, n, volume, neighbours);
}

// The whole output-stationary forward: the neighbour table (unless given), then the
// products. Temporary memory without a given table: 4 * num_out * (volume + 7) bytes and
// the sort's scratch. submanifold_table: the table is the whole map (map_is_table).
template <typename T>
GpuStatus OutputStationaryForward(Stream stream, Scratch* scratch, const SiteConvArgs<T>& a,
                                  const OffsetTable& offsets, const int32_t* neighbours, const Report* report,
                                  bool submanifold_table, T* out) {
  using M = typename PipelinedMma<T>::type;
  if constexpr (std::is_void<M>::value) {
    return GpuStatus{"gather-GEMM-store", "no tensor-core kernel for this type"};
  } else {
    if (neighbours == nullptr) {
      int32_t* built = scratch->DeviceArray<int32_t>(a.num_out * NeighbourTableWidth(a.volume));
      if (built == nullptr) return GpuStatus::OutOfMemory("neighbour table");
      TF_SPARSECONV_RETURN_IF_ERROR(BuildNeighbourTable(stream, scratch, a.in_rows, a.out_rows, offsets.splits,
                                                        a.volume, a.pairs, a.num_in, a.num_out, built));
      neighbours = built;
    }
    return LaunchOutputStationary<M>(stream, scratch, a, neighbours, report, submanifold_table, out);
  }
}

}  // namespace

template <typename T>
std::string OutputStationaryUnavailable(const SiteConvArgs<T>& a, bool allow_tf32) {
  std::string why = PipelinedUnavailable(a, allow_tf32);
  if (why.empty() && a.volume > kMaxNeighbourVolume) {
    why = "their neighbour tables hold kernels of at most " + std::to_string(kMaxNeighbourVolume) +
          " offsets, and this kernel has " + std::to_string(a.volume);
  }
  return why;
}

template <typename T>
GpuStatus SiteConvForwardGpu(Stream stream, Scratch* scratch, const SiteConvArgs<T>& a, const CheckedMap& checked,
                             const SiteConvOptions& options, const int32_t* neighbours, T* out, Report* report) {
  using A = typename AccumulatorOf<T>::type;
  const bool trusted = options.trusted, deterministic = options.deterministic;
  Report* device_report = nullptr;  // stays nullptr for a trusted map: the kernels then skip the report
  if (!trusted) TF_SPARSECONV_RETURN_IF_ERROR(NewReport(stream, scratch, &device_report));
  const bool pipelined = UsePipelined(a, options.allow_tf32);
  const bool simt = UseSimtPipelined(a, options.allow_tf32);
  const int64_t outputs = a.num_out * a.cout;
  // auto: output-stationary for half and bfloat16 under determinism or from a given table
  // (at any width); the pairs otherwise, and always for float, whose TF32 table tiles are
  // slower than its pair tiles (docs/gpu-kernels.md, "What was tried").
  const SiteDataflow dataflow = options.dataflow;
  const bool want_outputs =
      dataflow == SiteDataflow::kOutputs ||
      (dataflow == SiteDataflow::kAuto && sizeof(T) == 2 && (deterministic || neighbours != nullptr));
  const bool output_stationary = want_outputs && pipelined && a.volume <= kMaxNeighbourVolume;
  // A trusted map's given table is all the output-stationary tiles read: no offset table
  // then, so no upload (a copy in the stream and a pinned buffer per call).
  const bool from_table_only =
      trusted && neighbours != nullptr && output_stationary && checked.offsets == a.volume;
  OffsetTable table;
  if (!from_table_only) {
    TF_SPARSECONV_RETURN_IF_ERROR(UploadOffsetTable(stream, scratch, a.offset_splits, a.volume, checked,
                                                    pipelined || simt ? pipelined::kBM : kTileRows, &table));
  }
  const int64_t features = a.num_in * a.cin;
  if (!trusted) {
    TF_SPARSECONV_RETURN_IF_ERROR(CheckMap(stream, scratch, a.in_rows, a.out_rows, table.splits, checked, a.num_in,
                                           a.num_out, a.volume, device_report));
    if (features > 0) {
      LaunchChained(NaNKernel<T>, BlocksFor(features), kThreads, 0, stream, a.features, features,
                    &device_report->checks[kSiteNaN]);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("NaN check");
    }
  }
  if (outputs > 0 && output_stationary && checked.offsets == a.volume) {
    // Every output row is stored, with zeros where it has no pairs: no clearing first.
    TF_SPARSECONV_RETURN_IF_ERROR(OutputStationaryForward(stream, scratch, a, table, neighbours, device_report,
                                                          options.map_is_table, out));
  } else if (outputs > 0) {
    A* acc = nullptr;
    if constexpr (std::is_same<A, T>::value) {
      acc = out;
    } else {
      acc = scratch->DeviceArray<A>(outputs);
      if (acc == nullptr) return GpuStatus::OutOfMemory("float32 accumulator");
    }
    TF_SPARSECONV_RETURN_IF_CUDA_CALL_FAILS(cudaMemsetAsync(acc, 0, sizeof(A) * outputs, stream), "output");
    if (table.units > 0 && a.cin > 0) {
      if (deterministic) {
        for (int64_t q = 0; q < a.volume; ++q) {
          const int64_t first = table.host_unit_begin[q], count = table.host_unit_begin[q + 1] - first;
          if (count == 0) continue;
          if constexpr (std::is_same<A, float>::value) {
            if (pipelined) {
              TF_SPARSECONV_RETURN_IF_ERROR(
                  (LaunchPipelined<false>(stream, a, table, first, count, device_report, acc)));
              continue;
            }
          }
          if constexpr (std::is_same<T, float>::value) {
            if (simt) {
              TF_SPARSECONV_RETURN_IF_ERROR((LaunchSimt<false>(stream, a, table, first, count, device_report, acc)));
              continue;
            }
          }
          TF_SPARSECONV_RETURN_IF_ERROR((LaunchGatherGemmScatter<T, A, false>(stream, a, table, first, count,
                                                                               device_report, acc)));
        }
      } else if constexpr (std::is_same<A, float>::value) {
        if (pipelined) {
          TF_SPARSECONV_RETURN_IF_ERROR((LaunchPipelined<true>(stream, a, table, 0, table.units, device_report, acc)));
        } else if constexpr (std::is_same<T, float>::value) {
          TF_SPARSECONV_RETURN_IF_ERROR(
              (simt ? LaunchSimt<true>(stream, a, table, 0, table.units, device_report, acc)
                    : LaunchGatherGemmScatter<T, A, true>(stream, a, table, 0, table.units, device_report, acc)));
        } else {
          TF_SPARSECONV_RETURN_IF_ERROR(
              (LaunchGatherGemmScatter<T, A, true>(stream, a, table, 0, table.units, device_report, acc)));
        }
      } else {
        TF_SPARSECONV_RETURN_IF_ERROR(
            (LaunchGatherGemmScatter<T, A, true>(stream, a, table, 0, table.units, device_report, acc)));
      }
    }
    if (a.epilogue.Any()) {  // the conversion (if any) and the epilogue in one pass
      A* coefficients = scratch->DeviceArray<A>(2 * a.cout);
      if (coefficients == nullptr) return GpuStatus::OutOfMemory("epilogue coefficients");
      LaunchChained(ColumnAffineKernel<A>, BlocksFor(a.cout), kThreads, 0, stream, a.epilogue, a.cout, coefficients);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("epilogue coefficients");
      const int64_t total = a.num_out * a.cout;
      const int v = std::min(VectorWidth<A>(a.cout, {acc}), VectorWidth<T>(a.cout, {out}));
      WithVectorWidth<A>(v, [&](auto width) {  // A is at least as wide as T
        LaunchChained(AffineRowsKernel<T, A, decltype(width)::value>, BlocksFor(total / width), kThreads, 0, stream,
                      acc, total, a.cout, coefficients, a.epilogue.relu, out);
      });
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("epilogue");
    } else if constexpr (!std::is_same<A, T>::value) {
      LaunchChained(ConvertKernel<T, A>, BlocksFor(outputs), kThreads, 0, stream, acc, outputs, out);
      TF_SPARSECONV_RETURN_IF_CUDA_ERROR("output conversion");
    }
  }
  if (trusted) {
    scratch->HoldPinnedUntilQueuedWorkRuns();  // the offset table's upload may still be queued
    return GpuStatus::Ok();
  }
  return ReadReport(stream, scratch, device_report, report);
}

template <typename T>
GpuStatus SiteConvFilterGradGpu(Stream stream, Scratch* scratch, const SiteConvArgs<T>& a, const CheckedMap& checked,
                                bool allow_tf32, bool trusted, const T* out_grad, T* filter_grad, Report* report) {
  using A = typename AccumulatorOf<T>::type;
  const bool tf32 = std::is_same<T, float>::value && allow_tf32 && CurrentComputeMajor() >= 8;
  Report* device_report = nullptr;  // stays nullptr for a trusted map
  if (!trusted) TF_SPARSECONV_RETURN_IF_ERROR(NewReport(stream, scratch, &device_report));
  // float on sm_80+ with whole 16-byte vectors: site_conv_filter_grad.cuh's pipelined
  // kernels, in tiles of 64 or 128 channels each way.
  // Half and bfloat16 with channels in whole 16-byte vectors: the same tiles on the tensor
  // cores through mma.sync (PartialKernel16).
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  constexpr bool k16 = std::is_same<T, Half>::value || std::is_same<T, BFloat16>::value;
  const int vector = k16 ? 8 : 4;
  const bool pipelined = (std::is_same<T, float>::value || k16) && a.cin % vector == 0 && a.cout % vector == 0 &&
                         aligned(a.features) && aligned(out_grad) && CurrentComputeMajor() >= 8;
  const int64_t tile_in = pipelined && a.cin > 64 ? 128 : kTileCols;
  const int64_t tile_out = pipelined && a.cout > 64 ? 128 : kTileCols;
  const int64_t in_tiles = (a.cin + tile_in - 1) / tile_in;
  const int64_t out_tiles = (a.cout + tile_out - 1) / tile_out;
  // Chunks: a function of the shapes only, so the partition (and the sum order) is the
  // same on every run and every GPU.
  const double target = static_cast<double>(a.pairs) * static_cast<double>(in_tiles * out_tiles) / kFilterGradBlocks;
  int64_t chunk_pairs = kMinChunkPairs;
  if (target > static_cast<double>(chunk_pairs)) {
    chunk_pairs = (static_cast<int64_t>(target) + kMmaDepth - 1) / kMmaDepth * kMmaDepth;  // whole steps of both paths
  }
  OffsetTable table;
  TF_SPARSECONV_RETURN_IF_ERROR(
      UploadOffsetTable(stream, scratch, a.offset_splits, a.volume, checked, chunk_pairs, &table));
  if (!trusted) {
    TF_SPARSECONV_RETURN_IF_ERROR(CheckMap(stream, scratch, a.in_rows, a.out_rows, table.splits, checked, a.num_in,
                                           a.num_out, a.volume, device_report));
  }
  const int64_t slice = a.cin * a.cout;
  if (a.volume * slice > 0) {
    A* partial = nullptr;
    if (table.units > 0) {
      partial = scratch->DeviceArray<A>(table.units * slice);
      if (partial == nullptr) return GpuStatus::OutOfMemory("filter gradient partial sums");
      if constexpr (std::is_same<T, float>::value) {
        if (pipelined) {
          TF_SPARSECONV_RETURN_IF_ERROR(LaunchFilterGradPipelined(stream, a, out_grad, table, chunk_pairs, tile_in,
                                                                  tile_out, tf32, device_report, partial));
        }
      } else if constexpr (k16) {
        if (pipelined) {
          TF_SPARSECONV_RETURN_IF_ERROR(LaunchFilterGrad16<typename PipelinedMma<T>::type>(
              stream, a, out_grad, table, chunk_pairs, tile_in, tile_out, device_report, partial));
        }
      }
      if (!pipelined) {
        const auto kernel = tf32 ? FilterGradPartialKernel<T, A, std::is_same<T, float>::value>
                                 : FilterGradPartialKernel<T, A, false>;
        LaunchChained(kernel, GridFor(table.units * in_tiles * out_tiles), kThreads, 0, stream, a.features, out_grad,
                      a.in_rows, a.out_rows, table.splits, table.unit_begin, a.volume, chunk_pairs, table.units, a.cin,
                      a.cout, in_tiles, out_tiles, device_report, partial);
        TF_SPARSECONV_RETURN_IF_CUDA_ERROR("filter gradient");
      }
    }
    LaunchChained(FilterGradReduceKernel<T, A>, BlocksFor(a.volume * slice), kThreads, 0, stream, partial,
                  table.unit_begin, a.volume, slice, filter_grad);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("filter gradient");
  }
  if (trusted) {
    scratch->HoldPinnedUntilQueuedWorkRuns();
    return GpuStatus::Ok();
  }
  return ReadReport(stream, scratch, device_report, report);
}

GpuStatus SortNeighbourRows(Stream stream, Scratch* scratch, uint32_t* masks, int64_t n, int64_t volume,
                            int32_t* table) {
  if (n == 0) return GpuStatus::Ok();
  uint32_t* keys[2] = {masks, scratch->DeviceArray<uint32_t>(n)};
  int32_t* rows[2] = {scratch->DeviceArray<int32_t>(n), scratch->DeviceArray<int32_t>(n)};
  if (!keys[1] || !rows[0] || !rows[1]) return GpuStatus::OutOfMemory("neighbour table");
  LaunchChained(output_stationary::OutputRowsKernel, BlocksFor(n), kThreads, 0, stream, n, rows[0]);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("neighbour table");
  int current = 0;
  TF_SPARSECONV_RETURN_IF_ERROR(SortPairs(stream, scratch, keys, rows, n, static_cast<int>(volume), &current));
  LaunchChained(output_stationary::SortedColumnsKernel, BlocksFor(n), kThreads, 0, stream, keys[current], rows[current],
                n, NeighbourTableWidth(volume), volume, table);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("neighbour table");
  return GpuStatus::Ok();
}

GpuStatus SiteNeighbourTableGpu(Stream stream, Scratch* scratch, const int32_t* in_rows, const int32_t* out_rows,
                                const int32_t* host_splits, const CheckedMap& checked, int64_t volume,
                                int64_t num_in, int64_t num_out, bool trusted, int32_t* neighbours,
                                Report* report) {
  Report* device_report = nullptr;
  if (!trusted) TF_SPARSECONV_RETURN_IF_ERROR(NewReport(stream, scratch, &device_report));
  OffsetTable table;
  TF_SPARSECONV_RETURN_IF_ERROR(UploadOffsetTable(stream, scratch, host_splits, volume, checked, 1, &table));
  if (!trusted) {
    TF_SPARSECONV_RETURN_IF_ERROR(
        CheckMap(stream, scratch, in_rows, out_rows, table.splits, checked, num_in, num_out, volume, device_report));
  }
  TF_SPARSECONV_RETURN_IF_ERROR(BuildNeighbourTable(stream, scratch, in_rows, out_rows, table.splits, volume,
                                                    checked.pairs, num_in, num_out, neighbours));
  if (trusted) {
    scratch->HoldPinnedUntilQueuedWorkRuns();
    return GpuStatus::Ok();
  }
  return ReadReport(stream, scratch, device_report, report);
}

GpuStatus FirstRepeatedOutputRow(Stream stream, Scratch* scratch, const int32_t* out_rows, const int32_t* host_splits,
                                 const CheckedMap& checked, int64_t num_out, CheckSlot* result) {
  Report* device_report = nullptr;
  TF_SPARSECONV_RETURN_IF_ERROR(NewReport(stream, scratch, &device_report));
  CheckSlot* slot = &device_report->checks[0];
  if (checked.pairs > 0) {
    std::vector<int64_t> splits(host_splits, host_splits + checked.offsets + 1);
    void* device = nullptr;
    TF_SPARSECONV_RETURN_IF_ERROR(
        Upload(stream, scratch, splits.data(), sizeof(int64_t) * splits.size(), &device, "offset splits"));
    TF_SPARSECONV_RETURN_IF_ERROR(MarkFirstRepeat(stream, scratch, out_rows, static_cast<const int64_t*>(device),
                                                  checked, num_out, slot));
    LaunchChained(DescribeRepeatKernel, 1, 1, 0, stream, out_rows, slot);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("repeated-row search");
  }
  Report host;
  TF_SPARSECONV_RETURN_IF_ERROR(ReadReport(stream, scratch, device_report, &host));
  *result = host.checks[0];
  return GpuStatus::Ok();
}

#define TF_SPARSECONV_INSTANTIATE_SITE_CONV(T)                                                               \
  template std::string OutputStationaryUnavailable<T>(const SiteConvArgs<T>&, bool);                          \
  template GpuStatus SiteConvForwardGpu<T>(Stream, Scratch*, const SiteConvArgs<T>&, const CheckedMap&,       \
                                           const SiteConvOptions&, const int32_t*, T*, Report*);              \
  template GpuStatus SiteConvFilterGradGpu<T>(Stream, Scratch*, const SiteConvArgs<T>&, const CheckedMap&,    \
                                              bool, bool, const T*, T*, Report*);
TF_SPARSECONV_INSTANTIATE_SITE_CONV(float)
TF_SPARSECONV_INSTANTIATE_SITE_CONV(double)
TF_SPARSECONV_INSTANTIATE_SITE_CONV(Half)
TF_SPARSECONV_INSTANTIATE_SITE_CONV(BFloat16)
#undef TF_SPARSECONV_INSTANTIATE_SITE_CONV

}  // namespace gpu
}  // namespace tf_sparseconv

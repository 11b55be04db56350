// An output-stationary forward of SiteSparseConv for small kernels (volume <= 32) on the
// tensor cores of sm_80 and later: each output row is computed by one block, over all
// the offsets it has a pair at, and stored once in the output type. No float atomics, no
// float32 accumulator to clear and convert, and the sum order is fixed, so the result is
// deterministic as it stands.
//
// It reads the map as a neighbour table (SiteNeighbourTable's layout, width = volume + 2
// int32 per row): table[o * width + q] = input row of output o at offset q (-1: none),
// and two columns volume, volume + 1: at sorted position i, the neighbour mask of the
// i-th output (bit q: a pair at q) and that output's row, the outputs sorted by their
// masks (stable radix sort) so that a block's 128 rows share most of their offsets. The
// block runs the offsets in the union of its rows' masks, gathering zero rows (cp.async
// zero-fill, no memory read) where a row has none, and stores every output row. This is
// spconv's MaskImplicitGemm on our map layout. The table is built per call, or once per
// map by SiteNeighbourTable and passed in.
//
// The pipeline and the products are the pair tiles' (site_conv_mma_sync.cuh: mma.sync
// with ldmatrix fragments, or TF32 m16n8k8); the same requirements hold (16-byte vectors
// per row and aligned pointers).
#ifndef TF_SPARSECONV_SITE_CONV_SITE_CONV_OUTPUTS_CUH_
#define TF_SPARSECONV_SITE_CONV_SITE_CONV_OUTPUTS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/gpu_util.cuh"
#include "site/conv/site_conv.h"
#include "site/conv/site_conv_mma_sync.cuh"
#include "site/conv/site_epilogue.cuh"
#include "site/conv/site_conv_pipeline.cuh"

namespace tf_sparseconv {
namespace gpu {
namespace output_stationary {

using pipelined::CopyAsync16;
using pipelined::Element;
using pipelined::kBlockThreads;
using pipelined::kStages;
using pipelined::Tf32;
using pipelined::WaitCopies;

// table[o * width + q] = in_rows[p] and bit q of masks[o] for every pair p of offset q
// (width = NeighbourTableWidth, site_conv.h). Rows out of range are skipped: an
// unchecked map's products never run (Report).
__global__ void NeighbourTableKernel(const int32_t* in_rows, const int32_t* out_rows, const int64_t* splits,
                                     int64_t volume, int64_t width, int64_t pairs, int64_t num_in, int64_t num_out,
                                     int32_t* table, uint32_t* masks) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(p, pairs) {
    const int64_t q = OwnerOf(splits, volume, p);  // the offset of pair p
    const int64_t i = in_rows[p], o = out_rows[p];
    if (i < 0 || i >= num_in || o < 0 || o >= num_out) continue;
    table[o * width + q] = static_cast<int32_t>(i);
    atomicOr(masks + o, 1u << q);
  }
}

// The sort's values: the output rows in order.
__global__ void OutputRowsKernel(int64_t n, int32_t* rows) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(o, n) { rows[o] = static_cast<int32_t>(o); }
}

// The table's last two columns: the sorted masks and the output row at each sorted position.
__global__ void SortedColumnsKernel(const uint32_t* sorted_masks, const int32_t* order, int64_t n, int64_t width,
                                    int64_t volume, int32_t* table) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(i, n) {
    table[i * width + volume] = static_cast<int32_t>(sorted_masks[i]);
    table[i * width + volume + 1] = order[i];
  }
}

// Two consecutive outputs from float32 values: a float2, or a half2 / bfloat162 (both
// 4-byte aligned: the column is even and rows hold a multiple of 8 elements).
template <typename M>
__device__ inline void Store2(typename Element<M>::Stored* dst, float x, float y) {
  if constexpr (std::is_same<M, Tf32>::value) {
    *reinterpret_cast<float2*>(dst) = make_float2(x, y);
  } else if constexpr (std::is_same<M, __half>::value) {
    *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(x, y);
  } else {
    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(x, y);
  }
}

// A tile of kRows output rows (in the table's sorted order) and the offsets any of them
// has a pair at, in shared memory; the block's threads all call it, between barriers.
template <int kRows>
__device__ inline void LoadTile(const int32_t* table, int64_t tile, int64_t num_out, int64_t volume, int64_t width,
                                int32_t* rows, int* offsets, int* num_offsets, unsigned int* tile_mask) {
  if (threadIdx.x == 0) *tile_mask = 0u;
  __syncthreads();
  if (threadIdx.x < kRows) {
    const int64_t i = tile * kRows + threadIdx.x;
    rows[threadIdx.x] = i < num_out ? table[i * width + volume + 1] : -1;
    if (i < num_out) atomicOr(tile_mask, static_cast<uint32_t>(table[i * width + volume]));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int n = 0;
    for (int q = 0; q < volume; ++q) {
      if (*tile_mask & (1u << q)) offsets[n++] = q;
    }
    *num_offsets = n;
  }
  __syncthreads();
}

// Queues the cp.async copies of one step of a tile: step = (offset index, kBK channels);
// this thread's input rows (of the tile rows a_row + r * kARowStride, r < kAPasses,
// through the table; zero-filled where a row has no pair at the offset) and its share
// of the filter rows. Steps must be issued in order 0, 1, 2, ... (RunPipeline does): the
// step's offset, channels and stage are counted along instead of divided out.
// The table entries of the next offset are read one offset ahead into registers, and
// the source pointers are formed once per offset, so that the copies neither wait for a
// table read nor cost more instructions than the products they feed (docs/gpu-kernels.md,
// "What was tried"). L: the tile layout (mma_sync::Layout).
template <typename L, int kBN>
struct TableGather {
  using S = typename L::S;
  static constexpr int kBPerThread = (L::kBVectors + kBlockThreads - 1) / kBlockThreads;
  static constexpr int kBRowVectors = kBN / L::kVec;  // 16-byte pieces of a filter row

  const S* features;
  const S* filters;
  const int32_t* table;
  const int* offsets;
  S* a_stages;
  S* b_stages;
  int64_t width, cin, cout, k_steps, col0;
  const int32_t* rows;  // the tile's output rows (shared memory), -1 past the end
  int a_row, a_chunk, num_offsets;
  // Where the next step stands: its offset index, its k-step within the offset, its stage.
  mutable int n = 0, ks = 0, buffer = 0;
  mutable int32_t in_now[L::kAPasses];   // the input rows at the current offset (-1: none)
  mutable int32_t in_next[L::kAPasses];  // ... and at the next one (loads in flight)
  mutable const S* w = nullptr;          // the current offset's filter at column col0

  // The input rows of this thread's tile rows at offset index m (-1: none, or m past the last).
  __device__ void ReadTable(int m, int32_t (&in)[L::kAPasses]) const {
    const int64_t q = m < num_offsets ? offsets[m] : 0;
#pragma unroll
    for (int r = 0; r < L::kAPasses; ++r) {
      const int64_t o = rows[a_row + r * L::kARowStride];
      in[r] = o >= 0 && m < num_offsets ? table[o * width + q] : -1;
    }
  }

  // Before the first step: the first offset's entries.
  __device__ void Start() const { ReadTable(0, in_next); }

  __device__ void operator()(int64_t /*step: counted along*/) const {
    // Index arithmetic in 32 bits where it fits (channel counts, a filter's rows), with
    // 32 x 32 -> 64-bit products for the row offsets: one instruction each.
    const int cin32 = static_cast<int>(cin), cout32 = static_cast<int>(cout);
    if (ks == 0) {  // a new offset: its filter and input rows, and the next offset's entries
      w = filters + static_cast<int64_t>(offsets[n]) * cin * cout + col0;
#pragma unroll
      for (int r = 0; r < L::kAPasses; ++r) in_now[r] = in_next[r];
      ReadTable(n + 1, in_next);
    }
    const int k0 = ks * L::kBK;
    S* a = a_stages + buffer * L::kAStage;
    S* b = b_stages + buffer * L::kBStage;
    const int k = k0 + a_chunk * L::kVec;
#pragma unroll
    for (int r = 0; r < L::kAPasses; ++r) {
      const bool ok = in_now[r] >= 0 && k < cin32;
      // Without a row the copy reads nothing (zero-fill); its address stays in range.
      const S* src = features + static_cast<int64_t>(ok ? in_now[r] : 0) * cin32 + (ok ? k : 0);
      CopyAsync16(a + (a_row + r * L::kARowStride) * L::kLdA + a_chunk * L::kVec, src, ok);
    }
    const S* wk = w + static_cast<int64_t>(k0) * cout32;
    const int64_t cols_left = cout - col0;
#pragma unroll
    for (int j = 0; j < kBPerThread; ++j) {
      const int v = threadIdx.x + j * kBlockThreads;
      if (L::kBVectors % kBlockThreads == 0 || v < L::kBVectors) {
        const int kr = v / kBRowVectors, c = (v % kBRowVectors) * L::kVec;
        const bool ok = kr < cin32 - k0 && c < cols_left;
        CopyAsync16(b + kr * L::kLdB + c, ok ? wk + (kr * cout32 + c) : filters, ok);
      }
    }
    if (++ks == k_steps) {
      ks = 0;
      ++n;
    }
    buffer = buffer + 1 == kStages ? 0 : buffer + 1;
  }
};

// ForEachAccumulatorPair's stores through the epilogue as one affine map per column
// (ColumnAffineKernel's coefficients): each lane's column pair reads its two scales and
// two shifts once (8-byte loads: c is even) for all the rows it holds.
template <typename M, int kBN, typename Acc>
__device__ __forceinline__ void StoreThroughAffine(const int32_t* rows, int64_t col0, int64_t cout, int wm, int wn,
                                                   int lane, Acc& acc, const float* coefficients, bool relu,
                                                   typename Element<M>::Stored* out) {
  using L = mma_sync::Layout<M, kBN>;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < L::kFN; ++j) {
    const int64_t c = col0 + wn * L::kWN + 8 * j + 2 * t;
    if (c >= cout) continue;
    const float2 s = __ldg(reinterpret_cast<const float2*>(coefficients + c));
    const float2 b = __ldg(reinterpret_cast<const float2*>(coefficients + cout + c));
#pragma unroll
    for (int i = 0; i < L::kFM; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t o = rows[wm * L::kWM + 16 * i + 8 * h + g];
        if (o < 0) continue;
        float x = acc[i][j][2 * h] * s.x + b.x, y = acc[i][j][2 * h + 1] * s.y + b.y;
        if (relu) {  // NaN stays NaN, as in tf.nn.relu
          x = x < 0.0f ? 0.0f : x;
          y = y < 0.0f ? 0.0f : y;
        }
        Store2<M>(out + o * cout + c, x, y);
      }
    }
  }
}

// Blocks per SM the table kernel is compiled for (its registers capped to fit): as many
// as its shared memory allows on sm_90 (228 KB per SM, 1 KB of it per block for the
// system, about 0.4 KB static), at most 2 for 128-column tiles (64 float accumulators a
// thread), 3 for 64 and 4 for 32 columns. Left to itself the compiler keeps the copies'
// loop-invariant addresses in registers and takes more, which cost 128 x 128 tiles their
// second block per SM and narrower tiles one or two.
template <typename L, int kBN>
constexpr int TableMinBlocks() {
  constexpr int kBySharedMemory = static_cast<int>((228 * 1024) / (L::kSharedBytes + 1024 + 512));
  constexpr int kByAccumulators = kBN == 128 ? 2 : kBN == 64 ? 3 : 4;
  return std::max(1, std::min(kBySharedMemory, kByAccumulators));
}

// The output-stationary tiles (128 output rows in the table's order x kBN columns): per
// tile, its rows and offsets (LoadTile), the gathers of its steps through the table
// (TableGather), the products of the pair tiles' kernel (mma_sync::PipelinedProducts), and
// each lane's column pairs stored from registers. Rows without pairs get zero sums: every
// output row is stored, through the epilogue (site_conv.h) where coefficients (its affine
// map per column, ColumnAffineKernel's) are given. report: nullptr for a trusted map;
// otherwise the products run only if every check passed.
template <typename M, int kBN, int kStepBytes>
__global__ void __launch_bounds__(kBlockThreads, (TableMinBlocks<mma_sync::Layout<M, kBN, kStepBytes>, kBN>()))
    GatherGemmStoreKernel(const typename Element<M>::Stored* features, const typename Element<M>::Stored* filters,
                          const int32_t* table, int64_t volume, int64_t num_out, int64_t cin, int64_t cout,
                          int64_t col_tiles, const Report* report, const float* coefficients, bool relu,
                          typename Element<M>::Stored* out) {
  ChainedKernelBegin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // Uniform over the block: no barrier is skipped by some threads only.
  if (report != nullptr && !ChecksPassed(report)) return;
  using L = mma_sync::Layout<M, kBN, kStepBytes>;
  using S = typename L::S;
  extern __shared__ __align__(128) unsigned char shared[];
  __shared__ int offsets[kMaxNeighbourVolume];
  __shared__ int num_offsets;
  __shared__ unsigned int tile_mask;
  S* a_stages = reinterpret_cast<S*>(shared);
  S* b_stages = a_stages + kStages * L::kAStage;
  int32_t* rows = reinterpret_cast<int32_t*>(shared + L::kPipelineBytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp % L::kWarpsM, wn = warp / L::kWarpsM;
  const int a_row = threadIdx.x / L::kAChunks, a_chunk = threadIdx.x % L::kAChunks;
  const int64_t k_steps = (cin + L::kBK - 1) / L::kBK;
  const int64_t tiles = (num_out + L::kTileRows - 1) / L::kTileRows;
  const int64_t width = volume + 2;  // NeighbourTableWidth (site_conv.h)
  for (int64_t item = blockIdx.x; item < tiles * col_tiles; item += gridDim.x) {
    const int64_t tile = item / col_tiles;
    const int64_t col0 = (item % col_tiles) * kBN;
    LoadTile<L::kTileRows>(table, tile, num_out, volume, width, rows, offsets, &num_offsets, &tile_mask);
    const int64_t steps = num_offsets * k_steps;  // the same for the whole block
    const TableGather<L, kBN> issue{features, filters, table, offsets, a_stages, b_stages, width, cin,
                                    cout,     k_steps, col0,  rows,    a_row,    a_chunk,  num_offsets};
    issue.Start();
    float acc[L::kFM][L::kFN][4];
    mma_sync::PipelinedProducts<M, kBN, kStepBytes>(steps, issue, a_stages, b_stages, wm, wn, lane, acc);
    WaitCopies<0>();
    if (coefficients != nullptr) {  // uniform over the block
      StoreThroughAffine<M, kBN>(rows, col0, cout, wm, wn, lane, acc, coefficients, relu, out);
    } else {
      mma_sync::ForEachAccumulatorPair<M, kBN>(
          rows, col0, cout, wm, wn, lane, acc,
          [&](int64_t o, int64_t c, float x, float y) { Store2<M>(out + o * cout + c, x, y); });
    }
    __syncthreads();  // rows, the offset list and the stages are refilled by the next item
  }
#endif
}

}  // namespace output_stationary
}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_CONV_OUTPUTS_CUH_

// SiteSparseConvFilterGrad's partial products on sm_80 and later, with the pairs' rows
// pipelined through cp.async: float on the CUDA cores (kTf32 false: TF32 not allowed) or
// on the tensor cores through mma.sync m16n8k8 TF32 (site_conv_mma_sync.cuh), half and
// bfloat16 on the tensor cores through mma.sync m16n8k16 (PartialKernel16, at the end).
//
// dW[q] = X[in_rows]^T G[out_rows] over q's pairs. As site_conv.cu's kernels, a block
// computes one chunk's partial product for one [kBM input channels x kBN output channels]
// tile of dW[q] (FilterGradReduceKernel then adds the chunks in order: no atomics). Each
// step stages kBK pairs: their input rows' kBM channels and their gradient rows' kBN
// channels, as stored (row-major, the tile's channels contiguous), while the products of
// the previous steps run.
//
// Why beside site_conv.cu's filter-gradient kernels: those stage through registers and
// wait, in 64 x 64 tiles whose threads own 4 x 4 results (CUDA cores) or whose warps own
// 16 x 32 (WMMA); at 128 to 256 channels they are the backward's slowest part.
//
// CUDA cores: each thread owns kMG groups of 4 input channels x kNG groups of 4 output
// channels; per pair it reads kMG + kNG 16-byte vectors for 16 kMG kNG FMAs.
// Tensor cores: A = X^T (input channels x pairs), B = G (pairs x output channels); with
// g = lane / 4, t = lane % 4 lane (g, t) reads A (g, t) = X[pair t][channel g] and
// B (t, g) = G[pair t][channel g] (and the +8 / +4 ones): rows kBM + 8 and kBN + 8 floats
// long (multiples of 32 plus 8), so the 32 lanes hit 32 banks.
//
// Requirements (checked by the host): cin and cout multiples of 4, 16-byte aligned
// feature and gradient pointers.
#ifndef TF_SPARSECONV_SITE_CONV_SITE_CONV_FILTER_GRAD_CUH_
#define TF_SPARSECONV_SITE_CONV_SITE_CONV_FILTER_GRAD_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "common/gpu_util.cuh"
#include "site/conv/site_conv_mma_sync.cuh"
#include "site/conv/site_conv_pipeline.cuh"

namespace tf_sparseconv {
namespace gpu {
namespace filter_grad {

using pipelined::kBlockThreads;
using pipelined::kStages;
using pipelined::kWarps;

template <int kBM, int kBN>
struct Layout {
  static constexpr int kBK = 16;  // pairs per step
  static constexpr int kLdX = kBM + 8;
  static constexpr int kLdG = kBN + 8;
  static constexpr int kXStage = kBK * kLdX;
  static constexpr int kGStage = kBK * kLdG;
  static constexpr int kXVectors = kBK * kBM / 4;
  static constexpr int kGVectors = kBK * kBN / 4;
  static constexpr size_t kSharedBytes = sizeof(float) * static_cast<size_t>(kStages) * (kXStage + kGStage);
  // CUDA cores
  static constexpr int kColThreads = 16;
  static constexpr int kRowThreads = kBlockThreads / kColThreads;
  static constexpr int kMG = kBM / (4 * kRowThreads);
  static constexpr int kNG = kBN / (4 * kColThreads);
  // Tensor cores
  static constexpr int kWarpsN = kBN >= 64 ? 2 : 1;
  static constexpr int kWarpsM = kWarps / kWarpsN;
  static constexpr int kWM = kBM / kWarpsM;
  static constexpr int kWN = kBN / kWarpsN;
  static constexpr int kFM = kWM / 16;
  static constexpr int kFN = kWN / 8;
  static_assert(kBM % 64 == 0 && kBN % 64 == 0, "64- or 128-channel tiles");
  static_assert(kMG >= 1 && kNG >= 1 && kFM >= 1 && kFN >= 1, "every thread and warp owns results");
  static_assert(kXVectors % kBlockThreads == 0 && kGVectors % kBlockThreads == 0, "whole copies per thread");
};

// Queues the copies of kWidth channels from first_column of the rows (through rows[p]) of
// pairs p0 .. p0 + kPairs - 1, zero-filled past `end` and past row_length, into a stage of
// kPairs rows ld elements apart, 16 bytes (4 float or 8 16-bit elements) per copy.
template <int kPairs, int kWidth, typename S>
__device__ __forceinline__ void CopyPairRows(S* stage, int ld, int64_t p0, int64_t end, const int32_t* rows,
                                             const S* source, int64_t row_length, int64_t first_column) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(S));
#pragma unroll
  for (int v = threadIdx.x; v < kPairs * kWidth / kVec; v += kBlockThreads) {
    const int r = v / (kWidth / kVec), cc = v % (kWidth / kVec);
    const int64_t p = p0 + r, c = first_column + cc * kVec;
    const int64_t row = p < end ? rows[p] : -1;
    const bool ok = row >= 0 && c < row_length;
    pipelined::CopyAsync16(stage + r * ld + cc * kVec, ok ? source + row * row_length + c : source, ok);
  }
}

// Stores warp (wm, wn)'s tensor-core accumulators (kWM x kWN of the tile, in m16 x n8
// pieces, C fragment layout) into dst [cin, cout] from (k0, c0): lane (g, t) holds output
// channels 2t, 2t + 1 of input channels g and g + 8 of each piece (cout even: both columns
// or neither exist).
template <int kWM, int kWN, int kFM, int kFN>
__device__ __forceinline__ void StoreAccumulators(const float (&acc)[kFM][kFN][4], float* dst, int64_t k0, int64_t c0,
                                                  int wm, int wn, int lane, int64_t cin, int64_t cout) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < kFM; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t k = k0 + wm * kWM + 16 * i + 8 * h + g;
      if (k >= cin) continue;
#pragma unroll
      for (int j = 0; j < kFN; ++j) {
        const int64_t c = c0 + wn * kWN + 8 * j + 2 * t;
        if (c < cout) *reinterpret_cast<float2*>(dst + k * cout + c) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
    }
  }
}

template <int kBM, int kBN, bool kTf32>
__global__ void __launch_bounds__(kBlockThreads)
    PartialKernel(const float* features, const float* out_grad, const int32_t* in_rows, const int32_t* out_rows,
                  const int64_t* splits, const int64_t* chunk_begin, int64_t volume, int64_t chunk_pairs,
                  int64_t num_chunks, int64_t cin, int64_t cout, int64_t in_tiles, int64_t out_tiles,
                  const Report* report, float* partial) {
  ChainedKernelBegin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (report != nullptr && !ChecksPassed(report)) return;
  using L = Layout<kBM, kBN>;
  extern __shared__ __align__(128) unsigned char shared[];
  float* x_stages = reinterpret_cast<float*>(shared);
  float* g_stages = x_stages + kStages * L::kXStage;
  const int64_t tiles = in_tiles * out_tiles;  // hoisted: computed per item it costs registers
  const int64_t items = num_chunks * tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const ChunkTile t = ChunkTileOf(item, in_tiles, out_tiles, chunk_begin, splits, volume, chunk_pairs, kBM, kBN);
    const int64_t k0 = t.k0, c0 = t.c0;
    const int64_t steps = (t.end - t.begin + L::kBK - 1) / L::kBK;
    auto issue = [&](int64_t step) {
      const int buffer = static_cast<int>(step % kStages);
      const int64_t p0 = t.begin + step * L::kBK;
      CopyPairRows<L::kBK, kBM>(x_stages + buffer * L::kXStage, L::kLdX, p0, t.end, in_rows, features, cin, k0);
      CopyPairRows<L::kBK, kBN>(g_stages + buffer * L::kGStage, L::kLdG, p0, t.end, out_rows, out_grad, cout, c0);
    };
    float* dst = partial + t.chunk * cin * cout;
    if constexpr (kTf32) {
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      const int wm = warp % L::kWarpsM, wn = warp / L::kWarpsM;
      const int g = lane / 4, t = lane % 4;
      float acc[L::kFM][L::kFN][4];
      pipelined::ZeroAccumulators(acc);
      pipelined::RunPipeline(steps, issue, [&](int buffer) {
        const float* xs = x_stages + buffer * L::kXStage + t * L::kLdX + wm * L::kWM + g;
        const float* gs = g_stages + buffer * L::kGStage + t * L::kLdG + wn * L::kWN + g;
#pragma unroll
        for (int k8 = 0; k8 < L::kBK; k8 += 8) {
          uint32_t af[L::kFM][4];
#pragma unroll
          for (int i = 0; i < L::kFM; ++i) {
            const float* ai = xs + k8 * L::kLdX + 16 * i;
            af[i][0] = mma_sync::ToTf32(ai[0]);
            af[i][1] = mma_sync::ToTf32(ai[8]);
            af[i][2] = mma_sync::ToTf32(ai[4 * L::kLdX]);
            af[i][3] = mma_sync::ToTf32(ai[4 * L::kLdX + 8]);
          }
#pragma unroll
          for (int j = 0; j < L::kFN; ++j) {
            const float* bj = gs + k8 * L::kLdG + 8 * j;
            const uint32_t b0 = mma_sync::ToTf32(bj[0]), b1 = mma_sync::ToTf32(bj[4 * L::kLdG]);
#pragma unroll
            for (int i = 0; i < L::kFM; ++i) mma_sync::MmaTf32(acc[i][j], af[i], b0, b1);
          }
        }
      });
      StoreAccumulators<L::kWM, L::kWN>(acc, dst, k0, c0, wm, wn, lane, cin, cout);
    } else {
      const int tx = threadIdx.x % L::kColThreads, ty = threadIdx.x / L::kColThreads;
      float acc[4 * L::kMG][4 * L::kNG];
      ZeroTile(acc);
      pipelined::RunPipeline(steps, issue, [&](int buffer) {
        const float* xs = x_stages + buffer * L::kXStage + ty * 4;
        const float* gs = g_stages + buffer * L::kGStage + tx * 4;
#pragma unroll 4
        for (int r = 0; r < L::kBK; ++r) {
          float4 xv[L::kMG], gv[L::kNG];
#pragma unroll
          for (int m = 0; m < L::kMG; ++m) {
            xv[m] = *reinterpret_cast<const float4*>(xs + r * L::kLdX + m * 4 * L::kRowThreads);
          }
#pragma unroll
          for (int n = 0; n < L::kNG; ++n) {
            gv[n] = *reinterpret_cast<const float4*>(gs + r * L::kLdG + n * 4 * L::kColThreads);
          }
#pragma unroll
          for (int m = 0; m < L::kMG; ++m) {
            const float xm[4] = {xv[m].x, xv[m].y, xv[m].z, xv[m].w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
#pragma unroll
              for (int n = 0; n < L::kNG; ++n) {
                acc[4 * m + i][4 * n + 0] = fmaf(xm[i], gv[n].x, acc[4 * m + i][4 * n + 0]);
                acc[4 * m + i][4 * n + 1] = fmaf(xm[i], gv[n].y, acc[4 * m + i][4 * n + 1]);
                acc[4 * m + i][4 * n + 2] = fmaf(xm[i], gv[n].z, acc[4 * m + i][4 * n + 2]);
                acc[4 * m + i][4 * n + 3] = fmaf(xm[i], gv[n].w, acc[4 * m + i][4 * n + 3]);
              }
            }
          }
        }
      });
#pragma unroll
      for (int m = 0; m < L::kMG; ++m) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t k = k0 + m * 4 * L::kRowThreads + ty * 4 + i;
          if (k >= cin) continue;
#pragma unroll
          for (int n = 0; n < L::kNG; ++n) {
            const int64_t c = c0 + n * 4 * L::kColThreads + tx * 4;
            if (c < cout) {
              *reinterpret_cast<float4*>(dst + k * cout + c) =
                  make_float4(acc[4 * m + i][4 * n], acc[4 * m + i][4 * n + 1], acc[4 * m + i][4 * n + 2],
                              acc[4 * m + i][4 * n + 3]);
            }
          }
        }
      }
    }
    pipelined::WaitCopies<0>();  // only empty groups can be left, but none may outlive the item
    __syncthreads();             // the stages are refilled by the next item
  }
#endif
}

// Half and bfloat16 on sm_80 and later (M: __half or __nv_bfloat16): the same chunk tiles
// through mma.sync m16n8k16 with float accumulators. A = X^T is the transpose of the
// stage as stored (pairs x channels), so ldmatrix.trans gives its fragments: lanes 8i ..
// 8i + 7 point at pair rows 8 (i / 2) + lane % 8, channel column 8 (i % 2), matrix i
// being a0 .. a3 (channels 0-7 / 8-15 by pairs 0-7 / 8-15). B = G is loaded as the
// forward loads its filter (site_conv_mma_sync.cuh). Rows of kBM + 8 and kBN + 8
// elements (272 or 144 bytes) put the 8 rows of one ldmatrix phase on distinct 16-byte
// bank groups. Requirements (checked by the host): cin and cout multiples of 8, 16-byte
// aligned feature and gradient pointers.
template <int kBM, int kBN>
struct Layout16 {
  static constexpr int kBK = 32;  // pairs per step: two m16n8k16 depths
  static constexpr int kLdX = kBM + 8;
  static constexpr int kLdG = kBN + 8;
  static constexpr int kXStage = kBK * kLdX;
  static constexpr int kGStage = kBK * kLdG;
  static constexpr size_t kSharedBytes = sizeof(uint16_t) * static_cast<size_t>(kStages) * (kXStage + kGStage);
  static constexpr int kWarpsN = kBN >= 64 ? 2 : 1;
  static constexpr int kWarpsM = kWarps / kWarpsN;
  static constexpr int kWM = kBM / kWarpsM;
  static constexpr int kWN = kBN / kWarpsN;
  static constexpr int kFM = kWM / 16;
  static constexpr int kFN = kWN / 8;
  static_assert(kBM % 64 == 0 && kBN % 64 == 0, "64- or 128-channel tiles");
  static_assert(kFM >= 1 && kFN % 2 == 0, "whole m16 pieces and pairs of n8 pieces per warp");
  static_assert((kLdX * sizeof(uint16_t)) % 16 == 0 && (kLdG * sizeof(uint16_t)) % 16 == 0, "16-byte rows");
};

template <typename M, int kBM, int kBN>
__global__ void __launch_bounds__(kBlockThreads)
    PartialKernel16(const uint16_t* features, const uint16_t* out_grad, const int32_t* in_rows,
                    const int32_t* out_rows, const int64_t* splits, const int64_t* chunk_begin, int64_t volume,
                    int64_t chunk_pairs, int64_t num_chunks, int64_t cin, int64_t cout, int64_t in_tiles,
                    int64_t out_tiles, const Report* report, float* partial) {
  ChainedKernelBegin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (report != nullptr && !ChecksPassed(report)) return;
  using L = Layout16<kBM, kBN>;
  extern __shared__ __align__(128) unsigned char shared[];
  uint16_t* x_stages = reinterpret_cast<uint16_t*>(shared);
  uint16_t* g_stages = x_stages + kStages * L::kXStage;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp % L::kWarpsM, wn = warp / L::kWarpsM;
  // This lane's ldmatrix rows (see above) within a stage.
  const int a_offset = (8 * (lane / 16) + lane % 8) * L::kLdX + wm * L::kWM + 8 * ((lane / 8) % 2);
  const int b_offset = (8 * ((lane / 8) % 2) + lane % 8) * L::kLdG + wn * L::kWN + 8 * (lane / 16);
  const int64_t tiles = in_tiles * out_tiles;
  const int64_t items = num_chunks * tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const ChunkTile t = ChunkTileOf(item, in_tiles, out_tiles, chunk_begin, splits, volume, chunk_pairs, kBM, kBN);
    const int64_t k0 = t.k0, c0 = t.c0;
    const int64_t steps = (t.end - t.begin + L::kBK - 1) / L::kBK;
    auto issue = [&](int64_t step) {
      const int buffer = static_cast<int>(step % kStages);
      const int64_t p0 = t.begin + step * L::kBK;
      CopyPairRows<L::kBK, kBM>(x_stages + buffer * L::kXStage, L::kLdX, p0, t.end, in_rows, features, cin, k0);
      CopyPairRows<L::kBK, kBN>(g_stages + buffer * L::kGStage, L::kLdG, p0, t.end, out_rows, out_grad, cout, c0);
    };
    float acc[L::kFM][L::kFN][4];
    pipelined::ZeroAccumulators(acc);
    pipelined::RunPipeline(steps, issue, [&](int buffer) {
      const uint16_t* a = x_stages + buffer * L::kXStage + a_offset;
      const uint16_t* b = g_stages + buffer * L::kGStage + b_offset;
#pragma unroll
      for (int k16 = 0; k16 < L::kBK; k16 += 16) {
        uint32_t af[L::kFM][4];
#pragma unroll
        for (int i = 0; i < L::kFM; ++i) mma_sync::LoadMatrices<true>(af[i], a + k16 * L::kLdX + 16 * i);
#pragma unroll
        for (int j = 0; j < L::kFN; j += 2) {
          uint32_t bf[4];  // b0, b1 of piece j, then of piece j + 1
          mma_sync::LoadMatrices<true>(bf, b + k16 * L::kLdG + 8 * j);
#pragma unroll
          for (int i = 0; i < L::kFM; ++i) {
            mma_sync::Mma16<M>(acc[i][j], af[i], bf[0], bf[1]);
            mma_sync::Mma16<M>(acc[i][j + 1], af[i], bf[2], bf[3]);
          }
        }
      }
    });
    StoreAccumulators<L::kWM, L::kWN>(acc, partial + t.chunk * cin * cout, k0, c0, wm, wn, lane, cin, cout);
    pipelined::WaitCopies<0>();  // only empty groups can be left, but none may outlive the item
    __syncthreads();             // the stages are refilled by the next item
  }
#endif
}

}  // namespace filter_grad
}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_CONV_FILTER_GRAD_CUH_

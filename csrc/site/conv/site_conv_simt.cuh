// The forward gather-GEMM-scatter of SiteSparseConv (and so its input gradient) in float32
// on the CUDA cores of sm_80 and later, for float when TF32 is not allowed: tiles of 128
// pairs fed by site_conv_pipeline.cuh's cp.async pipeline, with the products in FMAs.
//
// Why not site_conv.cu's CUDA-core kernel: it gathers one float per thread and step into
// shared memory through registers and waits for it, and each thread owns 4 x 4 results
// read from shared memory one float at a time (8 loads per 16 FMAs). Here the gathers of
// the next steps are in flight while the current one multiplies, and each thread owns up
// to 8 x 8 results, reading its input rows and filter columns as 16-byte vectors: for a
// 128 x 128 tile 16 vector loads per 256 FMAs, about twice as fast (docs/gpu-kernels.md,
// "What was tried").
//
// Thread layout: kColThreads threads along the columns, each owning kNG groups of 4
// consecutive columns (kColThreads * 4 apart), and kRowThreads along the rows, each
// owning kMG groups of 4 consecutive rows (kRowThreads * 4 apart). Reading a row's 4
// channels as one vector, a quarter warp (one 16-byte phase) shares one row group, so
// the loads broadcast; the filter rows' vectors are consecutive across the columns.
//
// Requirements (checked by the host before choosing this path): cin and cout multiples
// of 4 and 16-byte aligned feature and filter pointers.
#ifndef TF_SPARSECONV_SITE_CONV_SITE_CONV_SIMT_CUH_
#define TF_SPARSECONV_SITE_CONV_SITE_CONV_SIMT_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "common/gpu_util.cuh"
#include "site/conv/site_conv_pipeline.cuh"

namespace tf_sparseconv {
namespace gpu {
namespace simt {

using pipelined::kBlockThreads;
using pipelined::kBM;
using pipelined::kStages;

template <int kBN>
struct Layout {
  // Shared-memory stages: 16 channels per step, rows padded by 16 bytes (80-byte input rows).
  using S = float;
  static constexpr int kVec = 4;  // floats per 16-byte copy
  static constexpr int kBK = 16;
  static constexpr int kLdA = kBK + kVec;
  static constexpr int kLdB = kBN + kVec;
  static constexpr int kAStage = kBM * kLdA;  // floats
  static constexpr int kBStage = kBK * kLdB;
  static constexpr int kBVectors = kBK * kBN / kVec;  // 16-byte copies of filter rows per step
  static constexpr size_t kPipelineBytes = sizeof(float) * static_cast<size_t>(kStages) * (kAStage + kBStage);
  // Input-row copies (pipelined::PairTileCopies): thread x copies 16-byte piece x % 4 of
  // the tile rows x / 4 and x / 4 + 64.
  static constexpr int kAChunks = kBK / kVec;
  static constexpr int kARowStride = kBlockThreads / kAChunks;
  static constexpr int kAPasses = kBM / kARowStride;
  static constexpr int kColThreads = kBN / 4 < 16 ? kBN / 4 : 16;
  static constexpr int kRowThreads = kBlockThreads / kColThreads;
  static constexpr int kNG = kBN / (4 * kColThreads);  // column groups per thread
  static constexpr int kMG = kBM / (4 * kRowThreads);  // row groups per thread
  static constexpr size_t kSharedBytes = kPipelineBytes + sizeof(int32_t) * kBM;
  static_assert(kBK % 4 == 0 && kNG >= 1 && kMG >= 1, "whole 4 x 4 groups per thread");
  static_assert(kColThreads * kRowThreads == kBlockThreads, "every thread owns results");
  static_assert(kAPasses * kARowStride == kBM, "the block's threads copy whole input rows");
};

// Two blocks per SM: at 128 columns the 8 x 8 results would otherwise take 169 registers
// and one block per SM; capped at 128 it runs faster (docs/gpu-kernels.md).
template <int kBN, bool kAtomic>
__global__ void __launch_bounds__(kBlockThreads, 2)
    GatherGemmScatterKernel(const float* features, const float* filters, const int32_t* in_rows,
                            const int32_t* out_rows, const int64_t* splits, const int64_t* tile_begin, int64_t volume,
                            int64_t cin, int64_t cout, int64_t col_tiles, int64_t first_tile, int64_t num_tiles,
                            const Report* report, float* out) {
  ChainedKernelBegin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // report: nullptr for a trusted map; otherwise the products run only if every check
  // passed (uniform over the block, so no barrier is skipped by some threads only).
  if (report != nullptr && !ChecksPassed(report)) return;
  using L = Layout<kBN>;
  extern __shared__ __align__(128) unsigned char shared[];
  float* a_stages = reinterpret_cast<float*>(shared);
  float* b_stages = a_stages + kStages * L::kAStage;
  int32_t* rows_out = reinterpret_cast<int32_t*>(shared + L::kPipelineBytes);
  const int tx = threadIdx.x % L::kColThreads, ty = threadIdx.x / L::kColThreads;
  const int64_t steps = (cin + L::kBK - 1) / L::kBK;
  const int64_t items = num_tiles * col_tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const PairTile t = PairTileOf(item, col_tiles, first_tile, tile_begin, splits, volume, kBM, kBN);
    const int64_t col0 = t.col0;
    if (threadIdx.x < kBM) rows_out[threadIdx.x] = t.p0 + threadIdx.x < t.p_end ? out_rows[t.p0 + threadIdx.x] : -1;
    const pipelined::PairTileCopies<L, kBN> issue(t, in_rows, features, filters, a_stages, b_stages, cin, cout);
    float acc[4 * L::kMG][4 * L::kNG];
    ZeroTile(acc);
    pipelined::RunPipeline(steps, issue, [&](int buffer) {
      const float* a = a_stages + buffer * L::kAStage;
      const float* b = b_stages + buffer * L::kBStage;
#pragma unroll
      for (int k4 = 0; k4 < L::kBK; k4 += 4) {
        float4 av[4 * L::kMG];  // this thread's rows, channels k4 .. k4 + 3
#pragma unroll
        for (int g = 0; g < L::kMG; ++g) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int r = g * 4 * L::kRowThreads + ty * 4 + i;
            av[4 * g + i] = *reinterpret_cast<const float4*>(a + r * L::kLdA + k4);
          }
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          float4 bv[L::kNG];
#pragma unroll
          for (int g = 0; g < L::kNG; ++g) {
            bv[g] = *reinterpret_cast<const float4*>(b + (k4 + kk) * L::kLdB + g * 4 * L::kColThreads + tx * 4);
          }
#pragma unroll
          for (int i = 0; i < 4 * L::kMG; ++i) {
            const float x = kk == 0 ? av[i].x : kk == 1 ? av[i].y : kk == 2 ? av[i].z : av[i].w;
#pragma unroll
            for (int g = 0; g < L::kNG; ++g) {
              acc[i][4 * g + 0] = fmaf(x, bv[g].x, acc[i][4 * g + 0]);
              acc[i][4 * g + 1] = fmaf(x, bv[g].y, acc[i][4 * g + 1]);
              acc[i][4 * g + 2] = fmaf(x, bv[g].z, acc[i][4 * g + 2]);
              acc[i][4 * g + 3] = fmaf(x, bv[g].w, acc[i][4 * g + 3]);
            }
          }
        }
      }
    });
    pipelined::WaitCopies<0>();  // only empty groups can be left, but none may outlive the item
    // Scatter-add: 4 consecutive columns per add (cout is a multiple of 4).
#pragma unroll
    for (int g = 0; g < L::kMG; ++g) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t o = rows_out[g * 4 * L::kRowThreads + ty * 4 + i];
        if (o < 0) continue;
#pragma unroll
        for (int h = 0; h < L::kNG; ++h) {
          const int64_t c = col0 + h * 4 * L::kColThreads + tx * 4;
          if (c < cout) pipelined::Add4<kAtomic>(out + o * cout + c, &acc[4 * g + i][4 * h]);
        }
      }
    }
    __syncthreads();  // rows_out and the stages are refilled by the next item
  }
#endif
}

}  // namespace simt
}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_CONV_SIMT_CUH_

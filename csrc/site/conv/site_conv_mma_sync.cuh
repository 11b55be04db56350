// The forward gather-GEMM-scatter of SiteSparseConv (and so its input gradient) on the
// tensor cores of sm_80 and later through mma.sync directly: float with TF32 allowed
// (m16n8k8), half and bfloat16 (m16n8k16), in tiles of 128 pairs x up to 128 columns fed
// by site_conv_pipeline.cuh's cp.async pipeline.
//
// Why not WMMA: its TF32 fragments are loaded from shared memory by load_matrix_sync,
// then rounded element by element, and its accumulators leave through store_matrix_sync
// and a staging area before the scatter. With the PTX fragment layouts known, each lane
// loads exactly its values per MMA (TF32: 4 + 2 floats, rounded once; 16-bit: ldmatrix),
// and scatter-adds its accumulators from registers: about twice as fast (docs/gpu-kernels.md,
// "What was tried").
//
// Fragment layouts (PTX ISA), with g = lane / 4 and t = lane % 4:
// - m16n8k8 TF32: A (16 x 8): a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4);
//   B (8 x 8): b0 (t, g), b1 (t + 4, g).
// - m16n8k16 half / bfloat16 (two 16-bit values per register): A: a0 (g, 2t..2t+1),
//   a1 (g + 8, 2t..), a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..), which ldmatrix.x4 gives from
//   the A rows 0-15 at columns 0 and 8; B: b0 (2t..2t+1, g), b1 (2t + 8.., g), which
//   ldmatrix.x4.trans gives for two 8-column pieces from the B rows 0-15.
// - C (16 x 8, float): c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1).
// Bank conflicts: A rows are 80 (or, with 128-byte steps, 144) bytes apart, so the 8 rows
// of one ldmatrix phase, or the lanes (g, t) of a TF32 load at bank (20 g + t) % 32, hit
// distinct banks; B rows are
// kBN + 8 elements long (kBN a multiple of 32): TF32 lanes read bank (8 t + g) % 32, and
// 16-bit rows of 2 kBN + 16 bytes put 8 ldmatrix rows on distinct 16-byte bank groups.
//
// Requirements (checked by the host before choosing this path): cin and cout multiples
// of 16 bytes' worth of elements (4 float, 8 half / bfloat16) and 16-byte aligned feature
// and filter pointers.
#ifndef TF_SPARSECONV_SITE_CONV_SITE_CONV_MMA_SYNC_CUH_
#define TF_SPARSECONV_SITE_CONV_SITE_CONV_MMA_SYNC_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/gpu_util.cuh"
#include "site/conv/site_conv_pipeline.cuh"

namespace tf_sparseconv {
namespace gpu {
namespace mma_sync {

using pipelined::kBlockThreads;
using pipelined::kBM;
using pipelined::kStages;
using pipelined::kWarps;

// M: pipelined::Tf32 (float storage), __half or __nv_bfloat16 (16-bit storage).
// kStepBytes: the bytes of each input row one pipeline step brings in, 64 or 128 (whole
// 128-byte lines per row and half the steps and barriers for the same channels; for wide
// inputs, site_conv.cu's WideRowSteps).
template <typename M, int kBN, int kStepBytes = 64>
struct Layout {
  using S = typename pipelined::Element<M>::Stored;
  static constexpr bool kTf32 = std::is_same<M, pipelined::Tf32>::value;
  static constexpr int kVec = 16 / sizeof(S);             // elements per 16-byte copy
  static constexpr int kMmaK = kTf32 ? 8 : 16;            // depth of one MMA
  static constexpr int kBK = kStepBytes / sizeof(S);      // channels per step
  static constexpr int kLdA = kBK + kVec;                 // rows padded by 16 bytes (80 or 144 bytes)
  static constexpr int kLdB = kBN + 8;                    // see the bank conflicts above
  static constexpr int kWarpsN = kBN >= 64 ? 2 : 1;  // two warp columns from 64 columns
  static constexpr int kWarpsM = kWarps / kWarpsN;
  static constexpr int kTileRows = kBM;
  static constexpr int kWM = kBM / kWarpsM;       // rows per warp
  static constexpr int kWN = kBN / kWarpsN;       // columns per warp
  static constexpr int kFM = kWM / 16;            // m16 pieces per warp
  static constexpr int kFN = kWN / 8;             // n8 pieces per warp
  static constexpr int kAStage = kBM * kLdA;
  static constexpr int kBStage = kBK * kLdB;
  static constexpr int kBVectors = kBK * kBN / kVec;
  static constexpr size_t kPipelineBytes = sizeof(S) * static_cast<size_t>(kStages) * (kAStage + kBStage);
  static constexpr size_t kSharedBytes = kPipelineBytes + sizeof(int32_t) * kBM;
  // Input-row copies: thread x copies 16-byte piece x % kAChunks of the tile rows
  // x / kAChunks + r * kARowStride, r < kAPasses (2 rows of 64-byte steps, 4 of 128-byte).
  static constexpr int kAChunks = kBK / kVec;
  static constexpr int kARowStride = kBlockThreads / kAChunks;
  static constexpr int kAPasses = kBM / kARowStride;
  static_assert(kStepBytes == 64 || kStepBytes == 128, "steps of 64 or 128 bytes per row");
  static_assert(kBN % 32 == 0 && kWM % 16 == 0 && kWN % 16 == 0, "whole fragments (and ldmatrix pairs) per warp");
  static_assert(kAPasses * kARowStride == kBM && kARowStride * kAChunks == kBlockThreads,
                "the block's threads copy whole input rows");
  static_assert((kLdB * sizeof(S)) % 16 == 0, "16-byte aligned filter rows");
};

__device__ inline uint32_t ToTf32(float x) {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#endif
  return r;
}

__device__ inline void MmaTf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// D += A B for m16n8k16 with 16-bit A and B (half or bfloat16), float accumulators.
template <typename M>
__device__ inline void Mma16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same<M, __half>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

// Four 8 x 8 matrices of 16-bit values from shared memory, each lane giving one row's
// address (lanes 8i .. 8i + 7: matrix i); trans: each matrix transposed.
template <bool kTrans>
__device__ inline void LoadMatrices(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned int address = static_cast<unsigned int>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  }
#endif
}

// Adds 2 consecutive floats: one vector atomic on sm_90, two scalar ones before.
template <bool kAtomic>
__device__ inline void Add2(float* dst, float x, float y) {
  if constexpr (kAtomic) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2*>(dst), make_float2(x, y));
#else
    atomicAdd(dst, x);
    atomicAdd(dst + 1, y);
#endif
  } else {
    float2 o = *reinterpret_cast<float2*>(dst);
    o.x += x;
    o.y += y;
    *reinterpret_cast<float2*>(dst) = o;  // one launch per offset: no other thread has these
  }
}

// The products of a tile over `steps` steps of kBK channels through the cp.async pipeline:
// issue(step) queues the copies of one step's A and B stages (and commits nothing); acc
// gets this warp's (wm, wn) piece of the tile, float32, in the C fragment layout above.
// The kernels of this file and the output-stationary one (site_conv_outputs.cuh) share it.
template <typename M, int kBN, int kStepBytes, typename Issue>
__device__ __forceinline__ void PipelinedProducts(int64_t steps, const Issue& issue, const typename Layout<M, kBN>::S* a_stages,
                                                  const typename Layout<M, kBN>::S* b_stages, int wm, int wn, int lane,
                                                  float (&acc)[Layout<M, kBN>::kFM][Layout<M, kBN>::kFN][4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = Layout<M, kBN, kStepBytes>;
  using S = typename L::S;
  const int g = lane / 4, t = lane % 4;
  pipelined::ZeroAccumulators(acc);
  pipelined::RunPipeline(steps, issue, [&](int buffer) {
    if constexpr (L::kTf32) {
      const float* a = a_stages + buffer * L::kAStage + (wm * L::kWM + g) * L::kLdA + t;
      const float* b = b_stages + buffer * L::kBStage + t * L::kLdB + wn * L::kWN + g;
#pragma unroll
      for (int k8 = 0; k8 < L::kBK; k8 += 8) {
        uint32_t af[L::kFM][4];
#pragma unroll
        for (int i = 0; i < L::kFM; ++i) {
          const float* ai = a + 16 * i * L::kLdA + k8;
          af[i][0] = ToTf32(ai[0]);
          af[i][1] = ToTf32(ai[8 * L::kLdA]);
          af[i][2] = ToTf32(ai[4]);
          af[i][3] = ToTf32(ai[8 * L::kLdA + 4]);
        }
#pragma unroll
        for (int j = 0; j < L::kFN; ++j) {
          const float* bj = b + k8 * L::kLdB + 8 * j;
          const uint32_t b0 = ToTf32(bj[0]), b1 = ToTf32(bj[4 * L::kLdB]);
#pragma unroll
          for (int i = 0; i < L::kFM; ++i) MmaTf32(acc[i][j], af[i], b0, b1);
        }
      }
    } else {
      // ldmatrix rows: A row lane % 16 at column 8 (lane / 16); B row 8 ((lane / 8) % 2)
      // + lane % 8 at column 8 (lane / 16), for n8 pieces j and j + 1.
      const S* a = a_stages + buffer * L::kAStage + (wm * L::kWM + lane % 16) * L::kLdA + 8 * (lane / 16);
      const S* b = b_stages + buffer * L::kBStage + (8 * ((lane / 8) % 2) + lane % 8) * L::kLdB + wn * L::kWN +
                   8 * (lane / 16);
#pragma unroll
      for (int k16 = 0; k16 < L::kBK; k16 += 16) {
        uint32_t af[L::kFM][4];
#pragma unroll
        for (int i = 0; i < L::kFM; ++i) LoadMatrices<false>(af[i], a + 16 * i * L::kLdA + k16);
#pragma unroll
        for (int j = 0; j < L::kFN; j += 2) {
          uint32_t bf[4];  // b0, b1 of piece j, then of piece j + 1
          LoadMatrices<true>(bf, b + k16 * L::kLdB + 8 * j);
#pragma unroll
          for (int i = 0; i < L::kFM; ++i) {
            Mma16<M>(acc[i][j], af[i], bf[0], bf[1]);
            Mma16<M>(acc[i][j + 1], af[i], bf[2], bf[3]);
          }
        }
      }
    }
  });
#endif
}

// Calls put(o, c, x, y) for each pair of accumulators of this warp's piece of a tile:
// lane (g, t) holds columns 2t, 2t + 1 of rows g and g + 8 of each 16 x 8 piece. o: the
// output row (rows[r] for tile row r; negative rows are skipped), c: the first column,
// below cout (cout is a multiple of 4, so both columns or neither exist).
// acc: the warp's accumulators.
template <typename M, int kBN, typename Acc, typename Put>
__device__ __forceinline__ void ForEachAccumulatorPair(const int32_t* rows, int64_t col0, int64_t cout, int wm, int wn,
                                                       int lane, Acc& acc, const Put& put) {
  using L = Layout<M, kBN>;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < L::kFM; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t o = rows[wm * L::kWM + 16 * i + 8 * h + g];
      if (o < 0) continue;
#pragma unroll
      for (int j = 0; j < L::kFN; ++j) {
        const int64_t c = col0 + wn * L::kWN + 8 * j + 2 * t;
        if (c < cout) put(o, c, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
    }
  }
}

template <typename M, int kBN, bool kAtomic, int kStepBytes>
__global__ void __launch_bounds__(kBlockThreads)
    GatherGemmScatterKernel(const typename Layout<M, kBN>::S* features, const typename Layout<M, kBN>::S* filters,
                            const int32_t* in_rows,
                            const int32_t* out_rows, const int64_t* splits, const int64_t* tile_begin, int64_t volume,
                            int64_t cin, int64_t cout, int64_t col_tiles, int64_t first_tile, int64_t num_tiles,
                            const Report* report, float* out) {
  ChainedKernelBegin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // report: nullptr for a trusted map; otherwise the products run only if every check
  // passed (uniform over the block, so no barrier is skipped by some threads only).
  if (report != nullptr && !ChecksPassed(report)) return;
  using L = Layout<M, kBN, kStepBytes>;
  using S = typename L::S;
  extern __shared__ __align__(128) unsigned char shared[];
  S* a_stages = reinterpret_cast<S*>(shared);
  S* b_stages = a_stages + kStages * L::kAStage;
  int32_t* rows_out = reinterpret_cast<int32_t*>(shared + L::kPipelineBytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp % L::kWarpsM, wn = warp / L::kWarpsM;
  const int64_t steps = (cin + L::kBK - 1) / L::kBK;
  const int64_t items = num_tiles * col_tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const PairTile t = PairTileOf(item, col_tiles, first_tile, tile_begin, splits, volume, kBM, kBN);
    if (threadIdx.x < kBM) rows_out[threadIdx.x] = t.p0 + threadIdx.x < t.p_end ? out_rows[t.p0 + threadIdx.x] : -1;
    const pipelined::PairTileCopies<L, kBN> issue(t, in_rows, features, filters, a_stages, b_stages, cin, cout);
    float acc[L::kFM][L::kFN][4];
    PipelinedProducts<M, kBN, kStepBytes>(steps, issue, a_stages, b_stages, wm, wn, lane, acc);
    pipelined::WaitCopies<0>();  // only empty groups can be left, but none may outlive the item
    // Scatter-add from the accumulators.
    ForEachAccumulatorPair<M, kBN>(rows_out, t.col0, cout, wm, wn, lane, acc,
                                   [&](int64_t o, int64_t c, float x, float y) { Add2<kAtomic>(out + o * cout + c, x, y); });
    __syncthreads();  // rows_out and the stages are refilled by the next item
  }
#endif
}

}  // namespace mma_sync
}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_CONV_MMA_SYNC_CUH_

// The pieces the pipelined site-convolution kernels of sm_80 and later share: tiles of
// kBM = 128 pairs or output rows whose input rows are gathered through cp.async (16 bytes
// per copy, zero-filled past the pairs and channels) kStages - 1 steps ahead of the step
// being multiplied, the 16-byte atomic adds of sm_90, and the WMMA products of the
// output-stationary kernel (site_conv_outputs.cuh): 8 warps each own a 16 x 32, 32 x 32
// or 32 x 64 piece of the tile, so each fragment load feeds 2 to 4 MMAs.
//
// The pair tiles' forward kernels are site_conv_mma_sync.cuh (tensor cores through
// mma.sync: float with TF32, half, bfloat16) and site_conv_simt.cuh (float without TF32).
// WMMA's pair-tile kernel, which this file held, was slower on an H200 (lidar frame at 5
// cm, forward, fp16): 0.743 against 0.609 ms at 256 -> 256 channels, 0.479 against 0.384
// at 128 -> 128 (README).
//
// Requirements of every kernel built on these: cin and cout multiples of 16 bytes' worth
// of elements (8 half / bfloat16, 4 float) and 16-byte aligned feature and filter
// pointers, so that every copy is one aligned 16-byte vector.
#ifndef TF_SPARSECONV_SITE_CONV_SITE_CONV_MMA_CUH_
#define TF_SPARSECONV_SITE_CONV_SITE_CONV_MMA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "common/gpu_util.cuh"

namespace tf_sparseconv {
namespace gpu {
namespace pipelined {

namespace wmma = nvcuda::wmma;

constexpr int kBM = 128;     // pairs per block
constexpr int kStages = 3;   // steps in flight
constexpr int kWarps = 8;
constexpr int kBlockThreads = 32 * kWarps;
constexpr int kStageLd = 20;  // per-warp float staging of one 16 x 16 accumulator (80-byte rows)

// Our name for "float, multiplied as TF32". WMMA's own, wmma::precision::tf32, exists only
// in the device passes of sm_80 and later, and the kernels are compiled for sm_75 too.
struct Tf32 {};

// Per element type M (__half, __nv_bfloat16 or Tf32): the stored element, the depth of
// one MMA, and the pointer type load_matrix_sync takes.
template <typename M>
struct Element {
  using Stored = uint16_t;
  using Load = M;
  static constexpr int kMmaK = 16;
};
template <>
struct Element<Tf32> {
  using Stored = float;
  using Load = float;
  static constexpr int kMmaK = 8;
};

// The WMMA element type of M; used only in code compiled for sm_80 and later.
template <typename M>
struct Wmma {
  using type = M;
};
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
template <>
struct Wmma<Tf32> {
  using type = wmma::precision::tf32;
};
#endif

// Rounds a TF32 fragment's loaded float32 values to TF32 (round to nearest), as WMMA asks.
template <typename Fragment>
__device__ inline void RoundToTf32(Fragment& fragment) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#pragma unroll
  for (int e = 0; e < fragment.num_elements; ++e) fragment.x[e] = wmma::__float_to_tf32(fragment.x[e]);
#endif
}

template <typename M, int kBN>
struct Tiles {
  using S = typename Element<M>::Stored;
  static constexpr int kMmaK = Element<M>::kMmaK;
  static constexpr int kVec = 16 / sizeof(S);  // elements per 16-byte copy
  static constexpr int kBK = 2 * kMmaK;        // channels per step: 64 bytes of a row
  static constexpr int kLdA = kBK + kVec;      // padded by 16 bytes: 80-byte rows
  static constexpr int kLdB = kBN + kVec;
  static constexpr int kWarpsN = kBN >= 64 ? 2 : 1;
  static constexpr int kWarpsM = kWarps / kWarpsN;
  static constexpr int kTileRows = kBM;
  static constexpr int kWM = kBM / kWarpsM;
  static constexpr int kWN = kBN / kWarpsN;
  static constexpr int kFM = kWM / 16;
  static constexpr int kFN = kWN / 16;
  static constexpr int kAStage = kBM * kLdA;  // elements
  static constexpr int kBStage = kBK * kLdB;
  static constexpr int kAVectors = kBM * kBK / kVec;  // 16-byte copies per step
  static constexpr int kBVectors = kBK * kBN / kVec;
  static constexpr size_t kPipelineBytes = sizeof(S) * static_cast<size_t>(kStages) * (kAStage + kBStage);
  static constexpr size_t kStagingBytes = sizeof(float) * kWarps * 16 * kStageLd;
  static constexpr size_t kSharedBytes = kPipelineBytes + kStagingBytes + sizeof(int32_t) * kBM;
  static_assert(kAVectors == 2 * kBlockThreads, "every thread copies two input-row vectors per step");
  // The input-row copies in mma_sync::Layout's terms (site_conv_outputs.cuh's TableGather).
  static constexpr int kAChunks = kBK / kVec;
  static constexpr int kARowStride = kBlockThreads / kAChunks;
  static constexpr int kAPasses = kBM / kARowStride;
  static_assert(kWM % 16 == 0 && kWN % 16 == 0, "whole fragments per warp");
  // WMMA wants 32-byte aligned fragment pointers: rows of 80 bytes in groups of 16, and
  // filter rows of kLdB elements in groups of kMmaK.
  static_assert((16 * kLdA * sizeof(S)) % 32 == 0 && (kMmaK * kLdB * sizeof(S)) % 32 == 0, "fragment alignment");
};

__device__ inline void CopyAsync16(void* shared, const void* global, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned int dst = static_cast<unsigned int>(__cvta_generic_to_shared(shared));
  const int bytes = valid ? 16 : 0;  // 0: nothing is read, the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global), "r"(bytes));
#endif
}
__device__ inline void CommitCopies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int kPending>
__device__ inline void WaitCopies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

// Sets a warp's mma.sync accumulators (kFM x kFN pieces of 4 floats) to zero.
template <int kFM, int kFN>
__device__ __forceinline__ void ZeroAccumulators(float (&acc)[kFM][kFN][4]) {
#pragma unroll
  for (int i = 0; i < kFM; ++i) {
#pragma unroll
    for (int j = 0; j < kFN; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    }
  }
}

// The cp.async pipeline's schedule over `steps` steps of one tile: the first kStages - 1
// are queued up front; then each step waits for its own copies (this thread's, and through
// the barrier everyone's), queues the step kStages - 1 ahead into the stage the barrier
// just freed, and runs compute(buffer) on stage step % kStages. Every step commits one
// copy group, empty ones too, since the wait counts groups; afterwards only empty groups
// can be in flight. issue(step) queues one step's copies and commits nothing.
template <typename Issue, typename Compute>
__device__ __forceinline__ void RunPipeline(int64_t steps, const Issue& issue, const Compute& compute) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) issue(s);
    CommitCopies();
  }
  for (int64_t step = 0; step < steps; ++step) {
    WaitCopies<kStages - 2>();
    __syncthreads();
    if (step + kStages - 1 < steps) issue(step + kStages - 1);
    CommitCopies();
    compute(static_cast<int>(step % kStages));
  }
}

// Adds 4 consecutive floats: one vector atomic on sm_90, four scalar ones before.
template <bool kAtomic>
__device__ inline void Add4(float* dst, const float* v) {
  if constexpr (kAtomic) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4*>(dst), make_float4(v[0], v[1], v[2], v[3]));
#else
    for (int i = 0; i < 4; ++i) atomicAdd(dst + i, v[i]);
#endif
  } else {
    float4 o = *reinterpret_cast<float4*>(dst);
    o.x += v[0];
    o.y += v[1];
    o.z += v[2];
    o.w += v[3];
    *reinterpret_cast<float4*>(dst) = o;  // one launch per offset: no other thread has these
  }
}

// One warp's accumulators: its kFM x kFN pieces of 16 x 16 of the block's kBM x kBN tile.
template <typename M, int kBN>
using Accumulators =
    wmma::fragment<wmma::accumulator, 16, 16, Tiles<M, kBN>::kMmaK, float>[Tiles<M, kBN>::kFM][Tiles<M, kBN>::kFN];

// The pipelined products of the pair-tile and the output-stationary kernels: `steps`
// k-steps, each queued by issue(step) into stage step % kStages (one copy group per step),
// multiplied on the tensor cores into acc, which is cleared first. Only empty copy groups
// can be left in flight.
template <typename M, int kBN, typename Issue>
__device__ __forceinline__ void PipelinedProducts(int64_t steps, const Issue& issue,
                                                  const typename Tiles<M, kBN>::S* a_stages,
                                                  const typename Tiles<M, kBN>::S* b_stages, int wm, int wn,
                                                  Accumulators<M, kBN>& acc) {
  using T = Tiles<M, kBN>;
  using Load = typename Element<M>::Load;
  using W = typename Wmma<M>::type;
  constexpr bool kTf32 = std::is_same<M, Tf32>::value;
#pragma unroll
  for (int i = 0; i < T::kFM; ++i) {
#pragma unroll
    for (int j = 0; j < T::kFN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }
  RunPipeline(steps, issue, [&](int buffer) {
    const Load* a = reinterpret_cast<const Load*>(a_stages + buffer * T::kAStage);
    const Load* b = reinterpret_cast<const Load*>(b_stages + buffer * T::kBStage);
#pragma unroll
    for (int kk = 0; kk < T::kBK; kk += T::kMmaK) {
      wmma::fragment<wmma::matrix_a, 16, 16, T::kMmaK, W, wmma::row_major> fa[T::kFM];
#pragma unroll
      for (int i = 0; i < T::kFM; ++i) {
        wmma::load_matrix_sync(fa[i], a + (wm * T::kWM + 16 * i) * T::kLdA + kk, T::kLdA);
        if constexpr (kTf32) RoundToTf32(fa[i]);
      }
#pragma unroll
      for (int j = 0; j < T::kFN; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, T::kMmaK, W, wmma::row_major> fb;
        wmma::load_matrix_sync(fb, b + kk * T::kLdB + wn * T::kWN + 16 * j, T::kLdB);
        if constexpr (kTf32) RoundToTf32(fb);
#pragma unroll
        for (int i = 0; i < T::kFM; ++i) wmma::mma_sync(acc[i][j], fa[i], fb, acc[i][j]);
      }
    }
  });
}

}  // namespace pipelined
}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_CONV_MMA_CUH_

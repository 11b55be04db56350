// The pieces the pipelined site-convolution kernels of sm_80 and later share: tiles of
// kBM = 128 pairs or output rows whose input rows are gathered through cp.async (16 bytes
// per copy, zero-filled past the pairs and channels) kStages - 1 steps ahead of the step
// being multiplied, and the 16-byte atomic adds of sm_90; and the element types of the
// tensor-core kernels (half, bfloat16, and float as TF32).
//
// The kernels built on these: the pair tiles' forward, site_conv_mma_sync.cuh (tensor
// cores through mma.sync: float with TF32, half, bfloat16) and site_conv_simt.cuh (float
// without TF32); the output-stationary forward (site_conv_outputs.cuh); float's filter
// gradient (site_conv_filter_grad.cuh). Every one of them needs cin and cout multiples of
// 16 bytes' worth of elements (8 half / bfloat16, 4 float) and 16-byte aligned pointers to
// the rows it copies, so that every copy is one aligned 16-byte vector.
#ifndef TF_SPARSECONV_SITE_CONV_SITE_CONV_PIPELINE_CUH_
#define TF_SPARSECONV_SITE_CONV_SITE_CONV_PIPELINE_CUH_

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

// The WMMA element type of M (site_conv.cu's filter-gradient tiles); used only in code
// compiled for sm_80 and later.
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

}  // namespace pipelined
}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_CONV_PIPELINE_CUH_

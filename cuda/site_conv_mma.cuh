// The forward gather-GEMM-scatter of SiteSparseConv (and so its input gradient) on the
// tensor cores of sm_80 and later, with the gathers pipelined through cp.async: half and
// bfloat16 always, float through TF32 when TensorFlow allows TF32 (its default; the op
// asks tensor_float_32_execution_enabled()).
//
// Why a second kernel beside site_conv.cu's: that one stages each 64 x 32 step through
// registers and does two MMAs per fragment load, so its SMs wait on shared memory and on
// the gather's latency. Here a block owns 128 pairs of one offset and kBN output
// channels; 8 warps each own a 16 x 32, 32 x 32 or 32 x 64 piece (4 to 8 accumulators,
// so each fragment load feeds 2 to 4 MMAs), and the input rows and filter rows of the
// next kStages - 1 steps are already in flight (cp.async, 16 bytes per copy, zero-filled
// past the pairs and channels) while the current step multiplies.
//
// The scatter-add stays as in site_conv.cu (atomics across offsets, or plain adds with
// one launch per offset under op determinism), but each warp adds its own 16 x 16 pieces
// straight from a small staging area, 8 consecutive columns per lane (one float4 atomic
// per 4 columns on sm_90).
//
// Requirements (checked by the host before choosing this path): cin and cout multiples
// of 16 bytes' worth of elements (8 half / bfloat16, 4 float) and 16-byte aligned feature
// and filter pointers, so that every copy is one aligned 16-byte vector.
#ifndef TF_SPARSECONV_CUDA_SITE_CONV_MMA_CUH_
#define TF_SPARSECONV_CUDA_SITE_CONV_MMA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "gpu_util.cuh"

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
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) issue(s);
    CommitCopies();  // empty groups too: the wait below counts groups
  }
#pragma unroll
  for (int i = 0; i < T::kFM; ++i) {
#pragma unroll
    for (int j = 0; j < T::kFN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }
  for (int64_t step = 0; step < steps; ++step) {
    WaitCopies<kStages - 2>();  // this step's copies have landed (this thread's)
    __syncthreads();            // ... and everyone's; the buffer refilled below is free
    if (step + kStages - 1 < steps) issue(step + kStages - 1);
    CommitCopies();
    const int buffer = static_cast<int>(step % kStages);
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
  }
}

template <typename M, int kBN, bool kAtomic>
__global__ void __launch_bounds__(kBlockThreads)
    GatherGemmScatterKernel(const typename Element<M>::Stored* features, const typename Element<M>::Stored* filters,
                            const int32_t* in_rows, const int32_t* out_rows, const int64_t* splits,
                            const int64_t* tile_begin, int64_t volume, int64_t cin, int64_t cout, int64_t col_tiles,
                            int64_t first_tile, int64_t num_tiles, const Report* report, float* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // report: nullptr for a trusted map; otherwise the products run only if every check
  // passed (uniform over the block, so no barrier is skipped by some threads only).
  if (report != nullptr && !ChecksPassed(report)) return;
  using T = Tiles<M, kBN>;
  using S = typename T::S;
  extern __shared__ __align__(128) unsigned char shared[];
  S* a_stages = reinterpret_cast<S*>(shared);
  S* b_stages = a_stages + kStages * T::kAStage;
  float* staging = reinterpret_cast<float*>(shared + T::kPipelineBytes);
  int32_t* rows_out = reinterpret_cast<int32_t*>(shared + T::kPipelineBytes + T::kStagingBytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp % T::kWarpsM, wn = warp / T::kWarpsM;
  float* my_staging = staging + warp * 16 * kStageLd;
  const int a_row = threadIdx.x / 4, a_chunk = threadIdx.x % 4;  // and a_row + 64
  const int64_t steps = (cin + T::kBK - 1) / T::kBK;
  const int64_t items = num_tiles * col_tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t tile = first_tile + item / col_tiles;
    const int64_t col0 = (item % col_tiles) * kBN;
    const int64_t q = OwnerOf(tile_begin, volume, tile);
    const int64_t p0 = splits[q] + (tile - tile_begin[q]) * kBM;
    const int64_t p_end = splits[q + 1];
    if (threadIdx.x < kBM) rows_out[threadIdx.x] = p0 + threadIdx.x < p_end ? out_rows[p0 + threadIdx.x] : -1;
    const int64_t row0 = p0 + a_row < p_end ? in_rows[p0 + a_row] : -1;
    const int64_t row1 = p0 + a_row + 64 < p_end ? in_rows[p0 + a_row + 64] : -1;
    const S* w = filters + q * cin * cout;
    auto issue = [&](int64_t step) {
      const int buffer = static_cast<int>(step % kStages);
      const int64_t k0 = step * T::kBK;
      S* a = a_stages + buffer * T::kAStage;
      S* b = b_stages + buffer * T::kBStage;
      const int64_t k = k0 + a_chunk * T::kVec;
      CopyAsync16(a + a_row * T::kLdA + a_chunk * T::kVec, row0 >= 0 && k < cin ? features + row0 * cin + k : features,
                  row0 >= 0 && k < cin);
      CopyAsync16(a + (a_row + 64) * T::kLdA + a_chunk * T::kVec,
                  row1 >= 0 && k < cin ? features + row1 * cin + k : features, row1 >= 0 && k < cin);
      for (int v = threadIdx.x; v < T::kBVectors; v += kBlockThreads) {
        const int kr = v / (kBN / T::kVec), cc = v % (kBN / T::kVec);
        const int64_t kk = k0 + kr, c = col0 + cc * T::kVec;
        const bool ok = kk < cin && c < cout;
        CopyAsync16(b + kr * T::kLdB + cc * T::kVec, ok ? w + kk * cout + c : filters, ok);
      }
    };
    Accumulators<M, kBN> acc;
    PipelinedProducts<M, kBN>(steps, issue, a_stages, b_stages, wm, wn, acc);
    WaitCopies<0>();  // only empty groups can be left, but none may outlive the item
    // Scatter-add: each warp its own accumulators, one 16 x 16 piece at a time; lane l
    // adds row l / 2, columns 8 (l % 2) .. + 8 of the piece.
    const int r = lane / 2, c8 = (lane % 2) * 8;
#pragma unroll
    for (int i = 0; i < T::kFM; ++i) {
      const int64_t o = rows_out[wm * T::kWM + 16 * i + r];
#pragma unroll
      for (int j = 0; j < T::kFN; ++j) {
        wmma::store_matrix_sync(my_staging, acc[i][j], kStageLd, wmma::mem_row_major);
        __syncwarp();
        const int64_t c = col0 + wn * T::kWN + 16 * j + c8;
        if (o >= 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (c + 4 * h + 4 <= cout) Add4<kAtomic>(out + o * cout + c + 4 * h, my_staging + r * kStageLd + c8 + 4 * h);
          }
        }
        __syncwarp();  // the staging is overwritten by the next piece
      }
    }
    __syncthreads();  // rows_out and the stages are refilled by the next item
  }
#endif
}

}  // namespace pipelined
}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CUDA_SITE_CONV_MMA_CUH_

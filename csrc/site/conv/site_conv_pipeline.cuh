// The pieces the site-convolution kernels share: where a block's item of work lies (a tile
// of pairs and columns, or a chunk of pairs and a tile of the filter gradient), and for the
// pipelined kernels of sm_80 and later, tiles of kBM = 128 pairs or output rows whose input
// rows are gathered through cp.async (16 bytes per copy, zero-filled past the pairs and
// channels) kStages - 1 steps ahead of the step being multiplied, the 16-byte atomic adds
// of sm_90, and the element types of the tensor-core kernels (half, bfloat16, and float as
// TF32).
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

// One item of a forward kernel's grid-stride loop over the tiles of all offsets: tile
// first_tile + item / col_tiles, of `rows` pairs (offset q's tiles start at tile_begin[q]),
// and the item % col_tiles-th tile of `cols` output columns. The tile holds pairs p0 ..
// min(p0 + rows, p_end) - 1 of offset q.
struct PairTile {
  int64_t q, p0, p_end, col0;
};
__device__ __forceinline__ PairTile PairTileOf(int64_t item, int64_t col_tiles, int64_t first_tile, const int64_t* tile_begin,
                                      const int64_t* splits, int64_t volume, int rows, int cols) {
  const int64_t tile = first_tile + item / col_tiles;
  const int64_t col0 = (item % col_tiles) * cols;
  const int64_t q = OwnerOf(tile_begin, volume, tile);
  const int64_t p0 = splits[q] + (tile - tile_begin[q]) * rows;
  const int64_t p_end = splits[q + 1];
  return PairTile{q, p0, p_end, col0};
}

// One item of a filter-gradient kernel's grid-stride loop: chunk item / (in_tiles *
// out_tiles) of `chunk_pairs` pairs (offset q's chunks start at chunk_begin[q]; the chunk
// holds pairs begin .. end - 1), and the tile of dW[q] it computes, input channels k0 ..
// k0 + tile_in - 1 by output channels c0 .. c0 + tile_out - 1.
struct ChunkTile {
  int64_t chunk, begin, end, k0, c0;
};
__device__ inline ChunkTile ChunkTileOf(int64_t item, int64_t in_tiles, int64_t out_tiles, const int64_t* chunk_begin,
                                        const int64_t* splits, int64_t volume, int64_t chunk_pairs, int tile_in,
                                        int tile_out) {
  const int64_t tiles = in_tiles * out_tiles;
  const int64_t chunk = item / tiles, tile = item - chunk * tiles;
  const int64_t q = OwnerOf(chunk_begin, volume, chunk);
  const int64_t begin = splits[q] + (chunk - chunk_begin[q]) * chunk_pairs;
  const int64_t end = begin + chunk_pairs < splits[q + 1] ? begin + chunk_pairs : splits[q + 1];
  return ChunkTile{chunk, begin, end, (tile / out_tiles) * tile_in, (tile % out_tiles) * tile_out};
}

// Sets a thread's kM x kN results to zero.
template <typename A, int kM, int kN>
__device__ __forceinline__ void ZeroTile(A (&acc)[kM][kN]) {
#pragma unroll
  for (int i = 0; i < kM; ++i) {
#pragma unroll
    for (int j = 0; j < kN; ++j) acc[i][j] = A(0);
  }
}

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

// The copies of a pair tile's steps, issue(step) of RunPipeline for the pipelined pair
// kernels: step s brings channels s * kBK .. s * kBK + kBK - 1 of the tile's input rows
// (this thread's chunk of tile rows a_row + r * kARowStride; zero-filled past the pairs and
// past cin) into stage s % kStages, and the same channels of the offset's filter at columns
// col0 .. col0 + kBN - 1 (zero-filled past cout). L: the tile layout (mma_sync::Layout,
// simt::Layout), whose constants of the same names mean the same.
template <typename L, int kBN>
struct PairTileCopies {
  using S = typename L::S;

  __device__ PairTileCopies(const PairTile& t, const int32_t* in_rows, const S* features, const S* filters,
                            S* a_stages, S* b_stages, int64_t cin, int64_t cout)
      : features(features),
        filters(filters),
        w(filters + t.q * cin * cout),
        a_stages(a_stages),
        b_stages(b_stages),
        cin(cin),
        cout(cout),
        col0(t.col0),
        a_row(threadIdx.x / L::kAChunks),
        a_chunk(threadIdx.x % L::kAChunks) {
#pragma unroll
    for (int r = 0; r < L::kAPasses; ++r) {
      const int64_t p = t.p0 + a_row + r * L::kARowStride;
      in_row[r] = p < t.p_end ? in_rows[p] : -1;
    }
  }

  __device__ void operator()(int64_t step) const {
    const int buffer = static_cast<int>(step % kStages);
    const int64_t k0 = step * L::kBK;
    S* a = a_stages + buffer * L::kAStage;
    S* b = b_stages + buffer * L::kBStage;
    const int64_t k = k0 + a_chunk * L::kVec;
#pragma unroll
    for (int r = 0; r < L::kAPasses; ++r) {
      const bool ok = in_row[r] >= 0 && k < cin;
      CopyAsync16(a + (a_row + r * L::kARowStride) * L::kLdA + a_chunk * L::kVec,
                  ok ? features + in_row[r] * cin + k : features, ok);
    }
    for (int v = threadIdx.x; v < L::kBVectors; v += kBlockThreads) {
      const int kr = v / (kBN / L::kVec), cc = v % (kBN / L::kVec);
      const int64_t kk = k0 + kr, c = col0 + cc * L::kVec;
      const bool ok = kk < cin && c < cout;
      CopyAsync16(b + kr * L::kLdB + cc * L::kVec, ok ? w + kk * cout + c : filters, ok);
    }
  }

  const S* features;
  const S* filters;
  const S* w;  // the tile's offset's filter
  S* a_stages;
  S* b_stages;
  int64_t cin, cout, col0;
  int a_row, a_chunk;
  int64_t in_row[L::kAPasses];  // -1: no pair
};

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

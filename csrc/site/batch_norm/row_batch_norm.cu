// The GPU kernels of RowBatchNorm, RowBatchNormGrad and RowScaleShift (row_batch_norm.h).
//
// Column sums: one block per chunk of rows (row_batch_norm.h's RowChunks), 32 columns by 8
// rows of threads; a thread adds its column over every eighth row of the chunk, the block
// adds its 8 rows of sums in a fixed order and writes the chunk's partial sums, and a
// second kernel, a warp per column, adds the chunks' in a fixed order and turns them into
// the per-column coefficients of the element-wise pass. No float atomics: the result does
// not depend on thread timing. The element-wise passes (y from x; dx from dy and x) are
// one centred multiply-add per operand and column, over the rows with a grid stride.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/gpu_util.cuh"
#include "site/batch_norm/row_batch_norm_gpu.h"
#include "site/conv/site_half.cuh"

namespace tf_sparseconv {
namespace gpu {

namespace {

template <typename T>
__device__ inline float Load(const T* p) {
  return ToAcc(*p);
}
template <typename T>
__device__ inline void Store(T* p, float v) {
  *p = FromAcc<T>::Convert(v);
}

constexpr int kColumns = 32;  // threadIdx.x
constexpr int kRows = 8;      // threadIdx.y

// The two per-column sums of a chunk: forward (x - pivot, (x - pivot)^2), with pivot the
// first row; backward (dy, dy * (x - mean)).
template <typename T, bool kBackward>
__global__ void ChunkSumsKernel(const T* x, const T* dy, const float* mean, int64_t n, int64_t c, int64_t per,
                                float* part1, float* part2) {
  __shared__ float s1[kRows][kColumns];
  __shared__ float s2[kRows][kColumns];
  const int64_t chunk = blockIdx.x;
  const int64_t first = chunk * per;
  const int64_t last = first + per < n ? first + per : n;
  for (int64_t c0 = 0; c0 < c; c0 += kColumns) {
    const int64_t j = c0 + threadIdx.x;
    float a1 = 0.0f, a2 = 0.0f;
    if (j < c) {
      const float center = kBackward ? mean[j] : Load(x + j);
      for (int64_t r = first + threadIdx.y; r < last; r += kRows) {
        const float d = Load(x + r * c + j) - center;
        if (kBackward) {
          const float g = Load(dy + r * c + j);
          a1 += g;
          a2 += g * d;
        } else {
          a1 += d;
          a2 += d * d;
        }
      }
    }
    s1[threadIdx.y][threadIdx.x] = a1;
    s2[threadIdx.y][threadIdx.x] = a2;
    __syncthreads();
    if (threadIdx.y == 0 && j < c) {
      float t1 = 0.0f, t2 = 0.0f;
      for (int i = 0; i < kRows; ++i) {
        t1 += s1[i][threadIdx.x];
        t2 += s2[i][threadIdx.x];
      }
      part1[chunk * c + j] = t1;
      part2[chunk * c + j] = t2;
    }
    __syncthreads();
  }
}

// The chunks' partial sums of column j added up by one warp: lane l adds chunks l, l + 32,
// ..., then a fixed shuffle tree adds the lanes (the same order on every run); lane 0
// holds the totals. A thread adding all 1,024 chunks alone took 50 us per call.
__device__ inline void ColumnTotals(const float* part1, const float* part2, int64_t chunks, int64_t c, int64_t j,
                                    int lane, float* t1, float* t2) {
  float a1 = 0.0f, a2 = 0.0f;
  for (int64_t k = lane; k < chunks; k += 32) {
    a1 += part1[k * c + j];
    a2 += part2[k * c + j];
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    a1 += __shfl_down_sync(0xffffffffu, a1, offset);
    a2 += __shfl_down_sync(0xffffffffu, a2, offset);
  }
  *t1 = a1;
  *t2 = a2;
}

// A warp per column (warp-uniform loop, so every lane reaches the shuffles).
#define TF_SPARSECONV_WARP_PER_COLUMN(j, c, lane)                                                  \
  const int lane = static_cast<int>(threadIdx.x & 31);                                             \
  for (int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; j < (c);   \
       j += (static_cast<int64_t>(blockDim.x) * gridDim.x) >> 5)

inline unsigned int WarpBlocksFor(int64_t columns) { return BlocksFor(columns * 32); }

// Forward: the statistics and y = (x - mean) * scale + beta's scale, a warp per column.
template <typename T>
__global__ void StatisticsKernel(const T* x, const float* gamma, const float* part1,
                                 const float* part2, int64_t chunks, int64_t n, int64_t c, float epsilon, float* mean,
                                 float* variance, float* inv_std, float* scale) {
  TF_SPARSECONV_WARP_PER_COLUMN(j, c, lane) {
    float t1, t2;
    ColumnTotals(part1, part2, chunks, c, j, lane, &t1, &t2);
    if (lane != 0) continue;
    const float shifted_mean = t1 / static_cast<float>(n);
    const float raw = t2 / static_cast<float>(n) - shifted_mean * shifted_mean;
    const float var = raw < 0.0f ? 0.0f : raw;  // rounding below 0 clamped, NaN kept (fmaxf would drop it)
    const float m = Load(x + j) + shifted_mean;
    const float s = 1.0f / sqrtf(var + epsilon);
    mean[j] = m;
    variance[j] = var;
    inv_std[j] = s;
    scale[j] = gamma[j] * s;
  }
}

// Backward: dgamma, dbeta and dx = dy * A + (x - mean) * B + C's coefficients, a warp per
// column.
__global__ void GradCoefficientsKernel(const float* gamma, const float* mean, const float* inv_std,
                                       const float* part1, const float* part2, int64_t chunks, int64_t n, int64_t c,
                                       float* dgamma, float* dbeta, float* coef_dy, float* coef_x, float* coef_1) {
  TF_SPARSECONV_WARP_PER_COLUMN(j, c, lane) {
    float t1, t2;
    ColumnTotals(part1, part2, chunks, c, j, lane, &t1, &t2);
    if (lane != 0) continue;
    const float db = t1;
    const float dg = t2 * inv_std[j];
    dbeta[j] = db;
    dgamma[j] = dg;
    const float k1 = gamma[j] * inv_std[j];
    const float k2 = db / static_cast<float>(n);
    const float k3 = dg * inv_std[j] / static_cast<float>(n);
    coef_dy[j] = k1;
    coef_x[j] = -k1 * k3;
    coef_1[j] = -k1 * k2;
  }
}

// out = (a - a_center[j]) * ca[j] + (b - b_center[j]) * cb[j] + cc[j] per element of column
// j (centers: 0 when null; b: none when null). Centred, so rows far from zero keep their
// precision (x * scale + (beta - mean * scale) would cancel).
template <typename T>
__global__ void ColumnAffineKernel(const T* a, const float* a_center, const float* ca, const T* b,
                                   const float* b_center, const float* cb, const float* cc, int64_t total, int64_t c,
                                   T* out) {
  const bool narrow = total <= 0xffffffffLL;  // 32-bit remainders, far cheaper than 64-bit ones
  TF_SPARSECONV_GRID_LOOP(i, total) {
    const int64_t j = narrow ? static_cast<int64_t>(static_cast<uint32_t>(i) % static_cast<uint32_t>(c)) : i % c;
    float v = (Load(a + i) - (a_center != nullptr ? a_center[j] : 0.0f)) * ca[j] + cc[j];
    if (b != nullptr) v += (Load(b + i) - (b_center != nullptr ? b_center[j] : 0.0f)) * cb[j];
    Store(out + i, v);
  }
}

__global__ void FillKernel(float* p, int64_t count, float value) {
  TF_SPARSECONV_GRID_LOOP(i, count) { p[i] = value; }
}

}  // namespace

template <typename T>
GpuStatus RowBatchNorm(const RowBatchNormArgs<T>& a, Scratch* scratch, Stream stream) {
  const int64_t n = a.n, c = a.c;
  if (c == 0) return GpuStatus::Ok();
  if (n == 0) {  // no rows: no statistics
    const float nan = __builtin_nanf("");
    FillKernel<<<BlocksFor(c), kThreads, 0, stream>>>(a.mean, c, nan);
    FillKernel<<<BlocksFor(c), kThreads, 0, stream>>>(a.variance, c, nan);
    FillKernel<<<BlocksFor(c), kThreads, 0, stream>>>(a.inv_std, c, nan);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNorm fill");
    return GpuStatus::Ok();
  }
  const int64_t chunks = RowChunks(n);
  float* part = scratch->DeviceArray<float>(2 * chunks * c + c);
  if (part == nullptr) return GpuStatus::OutOfMemory("RowBatchNorm partial sums");
  float* scale = part + 2 * chunks * c;
  ChunkSumsKernel<T, false><<<static_cast<unsigned int>(chunks), dim3(kColumns, kRows), 0, stream>>>(
      a.x, nullptr, nullptr, n, c, RowsPerChunk(n), part, part + chunks * c);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNorm sums");
  StatisticsKernel<T><<<WarpBlocksFor(c), kThreads, 0, stream>>>(a.x, a.gamma, part, part + chunks * c, chunks, n,
                                                               c, a.epsilon, a.mean, a.variance, a.inv_std, scale);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNorm statistics");
  ColumnAffineKernel<T><<<BlocksFor(n * c), kThreads, 0, stream>>>(a.x, a.mean, scale, nullptr, nullptr, nullptr,
                                                                   a.beta, n * c, c, a.y);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNorm normalise");
  return GpuStatus::Ok();
}

template <typename T>
GpuStatus RowBatchNormGrad(const RowBatchNormGradArgs<T>& a, Scratch* scratch, Stream stream) {
  const int64_t n = a.n, c = a.c;
  if (c == 0) return GpuStatus::Ok();
  if (n == 0) {
    FillKernel<<<BlocksFor(c), kThreads, 0, stream>>>(a.dgamma, c, 0.0f);
    FillKernel<<<BlocksFor(c), kThreads, 0, stream>>>(a.dbeta, c, 0.0f);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNormGrad fill");
    return GpuStatus::Ok();
  }
  const int64_t chunks = RowChunks(n);
  float* part = scratch->DeviceArray<float>(2 * chunks * c + 3 * c);
  if (part == nullptr) return GpuStatus::OutOfMemory("RowBatchNormGrad partial sums");
  float* coef = part + 2 * chunks * c;
  ChunkSumsKernel<T, true><<<static_cast<unsigned int>(chunks), dim3(kColumns, kRows), 0, stream>>>(
      a.x, a.dy, a.mean, n, c, RowsPerChunk(n), part, part + chunks * c);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNormGrad sums");
  GradCoefficientsKernel<<<WarpBlocksFor(c), kThreads, 0, stream>>>(a.gamma, a.mean, a.inv_std, part, part + chunks * c,
                                                                 chunks, n, c, a.dgamma, a.dbeta, coef, coef + c,
                                                                 coef + 2 * c);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNormGrad coefficients");
  ColumnAffineKernel<T><<<BlocksFor(n * c), kThreads, 0, stream>>>(a.dy, nullptr, coef, a.x, a.mean, coef + c,
                                                                   coef + 2 * c, n * c, c, a.dx);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNormGrad dx");
  return GpuStatus::Ok();
}

template <typename T>
GpuStatus RowScaleShift(const RowScaleShiftArgs<T>& a, Stream stream) {
  if (a.n == 0 || a.c == 0) return GpuStatus::Ok();
  ColumnAffineKernel<T><<<BlocksFor(a.n * a.c), kThreads, 0, stream>>>(a.x, nullptr, a.scale, nullptr, nullptr,
                                                                       nullptr, a.shift, a.n * a.c, a.c, a.y);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowScaleShift");
  return GpuStatus::Ok();
}

#define INSTANTIATE_ROW_BATCH_NORM(T)                                                         \
  template GpuStatus RowBatchNorm<T>(const RowBatchNormArgs<T>&, Scratch*, Stream);           \
  template GpuStatus RowBatchNormGrad<T>(const RowBatchNormGradArgs<T>&, Scratch*, Stream);   \
  template GpuStatus RowScaleShift<T>(const RowScaleShiftArgs<T>&, Stream);
INSTANTIATE_ROW_BATCH_NORM(float)
INSTANTIATE_ROW_BATCH_NORM(Half)
INSTANTIATE_ROW_BATCH_NORM(BFloat16)
#undef INSTANTIATE_ROW_BATCH_NORM

}  // namespace gpu
}  // namespace tf_sparseconv

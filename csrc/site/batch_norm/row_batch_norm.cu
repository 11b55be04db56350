// The GPU kernels of RowBatchNorm, RowBatchNormGrad, RowScaleShift and RowNormalize
// (row_batch_norm.h).
//
// Column sums: one block per chunk of rows (row_batch_norm.h's RowChunks), 32 threads across
// (each with 1, 2 or 4 adjacent columns, read in one load) by 8 rows of threads; a thread
// adds its columns over every eighth row of the chunk, the block
// adds its 8 rows of sums in a fixed order and writes the chunk's partial sums, and a
// second kernel, a warp per column, adds the chunks' in a fixed order and turns them into
// the per-column coefficients of the element-wise pass. No float atomics: the result does
// not depend on thread timing. The element-wise passes (y from x; dx from dy and x) are
// one centred multiply-add per operand and column, over the rows with a grid stride, 1, 2
// or 4 elements per thread and access. The vector width changes no result.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/gpu_util.cuh"
#include "site/batch_norm/row_batch_norm_gpu.h"
#include "site/conv/site_half.cuh"
#include "site/conv/site_vector.cuh"

namespace tf_sparseconv {
namespace gpu {

namespace {

template <typename T>
__device__ inline float Load(const T* p) {
  return ToAcc(*p);
}

constexpr int kColumns = 32;  // threadIdx.x
constexpr int kRows = 8;      // threadIdx.y

// The two per-column sums of a chunk, in double: forward (x - pivot, (x - pivot)^2), with
// pivot the first row; backward (dy, dy * (x - mean)). Float sums overflow where the
// statistics or dgamma do not (row_batch_norm.h). A thread holds kV adjacent columns (c a
// multiple of kV, rows aligned to kV elements), read in one load per row; each column's
// sum runs over the same rows in the same order for every kV.
using Sum = double;

template <typename T, bool kBackward, int kV>
__global__ void ChunkSumsKernel(const T* x, const T* dy, const float* mean, int64_t n, int64_t c, int64_t per,
                                Sum* part1, Sum* part2) {
  ChainedKernelBegin();
  __shared__ Sum s1[kRows][kColumns * kV];
  __shared__ Sum s2[kRows][kColumns * kV];
  const int64_t chunk = blockIdx.x;
  const int64_t first = chunk * per;
  const int64_t last = first + per < n ? first + per : n;
  for (int64_t c0 = 0; c0 < c; c0 += kColumns * kV) {
    const int64_t j = c0 + threadIdx.x * kV;  // j < c: all kV columns are
    Sum a1[kV], a2[kV];
#pragma unroll
    for (int k = 0; k < kV; ++k) a1[k] = a2[k] = Sum(0);
    if (j < c) {
      float center[kV];
      if (kBackward) {
#pragma unroll
        for (int k = 0; k < kV; ++k) center[k] = mean[j + k];
      } else {
        LoadVec<kV>(x + j, center);
      }
#pragma unroll 4
      for (int64_t r = first + threadIdx.y; r < last; r += kRows) {
        float xv[kV];
        LoadVec<kV>(x + r * c + j, xv);
        if (kBackward) {
          float g[kV];
          LoadVec<kV>(dy + r * c + j, g);
#pragma unroll
          for (int k = 0; k < kV; ++k) {
            a1[k] += g[k];
            a2[k] += static_cast<Sum>(g[k]) * (static_cast<Sum>(xv[k]) - center[k]);
          }
        } else {
#pragma unroll
          for (int k = 0; k < kV; ++k) {
            const Sum d = static_cast<Sum>(xv[k]) - center[k];
            a1[k] += d;
            a2[k] += d * d;
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      s1[threadIdx.y][threadIdx.x * kV + k] = a1[k];
      s2[threadIdx.y][threadIdx.x * kV + k] = a2[k];
    }
    __syncthreads();
    if (threadIdx.y == 0 && j < c) {
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        Sum t1 = Sum(0), t2 = Sum(0);
        for (int i = 0; i < kRows; ++i) {
          t1 += s1[i][threadIdx.x * kV + k];
          t2 += s2[i][threadIdx.x * kV + k];
        }
        part1[chunk * c + j + k] = t1;
        part2[chunk * c + j + k] = t2;
      }
    }
    __syncthreads();
  }
}

// The chunks' partial sums of column j added up by one warp: lane l adds chunks l, l + 32,
// ..., then a fixed shuffle tree adds the lanes (the same order on every run); lane 0
// holds the totals. A thread adding all 1,024 chunks alone took 50 us per call.
__device__ inline void ColumnTotals(const Sum* part1, const Sum* part2, int64_t chunks, int64_t c, int64_t j,
                                    int lane, Sum* t1, Sum* t2) {
  Sum a1 = Sum(0), a2 = Sum(0);
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

// Forward: the statistics, and y's coefficients per column (NormalizeRowsKernel), a warp
// per column, in double from the double sums; mean, variance and inv_std rounded once.
template <typename T>
__global__ void StatisticsKernel(const T* x, const float* gamma, const double* part1, const double* part2,
                                 int64_t chunks, int64_t n, int64_t c, float epsilon, float* mean, float* variance,
                                 float* inv_std, double* coef) {
  ChainedKernelBegin();
  TF_SPARSECONV_WARP_PER_COLUMN(j, c, lane) {
    double t1, t2;
    ColumnTotals(part1, part2, chunks, c, j, lane, &t1, &t2);
    if (lane != 0) continue;
    const double shifted_mean = t1 / static_cast<double>(n);
    const double raw = t2 / static_cast<double>(n) - shifted_mean * shifted_mean;
    const double var = raw < 0.0 ? 0.0 : raw;  // rounding below 0 clamped, NaN kept (fmax would drop it)
    const double m = static_cast<double>(Load(x + j)) + shifted_mean;
    const double s = 1.0 / sqrt(var + static_cast<double>(epsilon));
    mean[j] = static_cast<float>(m);
    variance[j] = static_cast<float>(var);
    inv_std[j] = static_cast<float>(s);
    coef[j] = m;
    coef[c + j] = static_cast<double>(gamma[j]) * s;
  }
}

// y = (x - mean) * gamma * inv_std + beta per element, in double from StatisticsKernel's
// coefficients, rounded once. kV adjacent elements of one row per thread, as
// ColumnAffineKernel.
template <typename T, int kV>
__global__ void NormalizeRowsKernel(const T* x, const double* coef, const float* beta, int64_t total, int64_t c,
                                    T* y) {
  ChainedKernelBegin();
  const int64_t vectors = total / kV;
  const int64_t row_vectors = c / kV;
  const bool narrow = vectors <= 0xffffffffLL;
  TF_SPARSECONV_GRID_LOOP(v, vectors) {
    const int64_t j = FirstColumn<kV>(v, row_vectors, narrow);
    const int64_t i = v * kV;
    float xv[kV], o[kV];
    LoadVec<kV>(x + i, xv);
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      o[k] = static_cast<float>((static_cast<double>(xv[k]) - coef[j + k]) * coef[c + j + k] +
                                static_cast<double>(beta[j + k]));
    }
    StoreVec<kV>(y + i, o);
  }
}

// Backward: dgamma, dbeta and dx's coefficients per column (GradDxKernel), a warp per
// column, in double from the double sums: dgamma / n and the like are formed before any
// rounding, so a finite result does not come out infinite from a float intermediate.
__global__ void GradCoefficientsKernel(const float* gamma, const float* inv_std, const double* part1,
                                       const double* part2, int64_t chunks, int64_t n, int64_t c, float* dgamma,
                                       float* dbeta, double* coef) {
  ChainedKernelBegin();
  TF_SPARSECONV_WARP_PER_COLUMN(j, c, lane) {
    double t1, t2;
    ColumnTotals(part1, part2, chunks, c, j, lane, &t1, &t2);
    if (lane != 0) continue;
    const double inv = inv_std[j];
    const double dg = t2 * inv;
    dbeta[j] = static_cast<float>(t1);
    dgamma[j] = static_cast<float>(dg);
    coef[j] = static_cast<double>(gamma[j]) * inv;                       // gamma * inv_std
    coef[c + j] = t1 / static_cast<double>(n);                          // dbeta / n
    coef[2 * c + j] = inv * (dg / static_cast<double>(n));              // inv_std * dgamma / n
  }
}

// dx = gamma * inv_std * (dy - dbeta / n - (x - mean) * inv_std * dgamma / n) per element,
// in double from GradCoefficientsKernel's coefficients, rounded once (row_batch_norm.h).
// kV adjacent elements of one row per thread, as ColumnAffineKernel.
template <typename T, int kV>
__global__ void GradDxKernel(const T* dy, const T* x, const float* mean, const double* coef, int64_t total,
                             int64_t c, T* dx) {
  ChainedKernelBegin();
  const int64_t vectors = total / kV;
  const int64_t row_vectors = c / kV;
  const bool narrow = vectors <= 0xffffffffLL;
  TF_SPARSECONV_GRID_LOOP(v, vectors) {
    const int64_t j = FirstColumn<kV>(v, row_vectors, narrow);
    const int64_t i = v * kV;
    float gv[kV], xv[kV], o[kV];
    LoadVec<kV>(dy + i, gv);
    LoadVec<kV>(x + i, xv);
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      const double centred = static_cast<double>(xv[k]) - static_cast<double>(mean[j + k]);
      const double inner = (static_cast<double>(gv[k]) - coef[c + j + k]) - centred * coef[2 * c + j + k];
      o[k] = static_cast<float>(coef[j + k] * inner);
    }
    StoreVec<kV>(dx + i, o);
  }
}

// out = (a - a_center[j]) * ca[j] + (b - b_center[j]) * cb[j] + cc[j] per element of column
// j (centers: 0 when null; b: none when null). Centred, so rows far from zero keep their
// precision (x * scale + (beta - mean * scale) would cancel). A thread takes kV adjacent
// elements of one row (c a multiple of kV, rows aligned to kV elements) in one load and
// one store per operand; each element's arithmetic is the same for every kV.
template <typename T, int kV>
__global__ void ColumnAffineKernel(const T* a, const float* a_center, const float* ca, const T* b,
                                   const float* b_center, const float* cb, const float* cc, int64_t total, int64_t c,
                                   T* out) {
  ChainedKernelBegin();
  const int64_t vectors = total / kV;
  const int64_t row_vectors = c / kV;
  const bool narrow = vectors <= 0xffffffffLL;
  TF_SPARSECONV_GRID_LOOP(v, vectors) {
    const int64_t j = FirstColumn<kV>(v, row_vectors, narrow);
    const int64_t i = v * kV;
    float av[kV], bv[kV], o[kV];
    LoadVec<kV>(a + i, av);
    if (b != nullptr) LoadVec<kV>(b + i, bv);
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      float value = (av[k] - (a_center != nullptr ? a_center[j + k] : 0.0f)) * ca[j + k] + cc[j + k];
      if (b != nullptr) value += (bv[k] - (b_center != nullptr ? b_center[j + k] : 0.0f)) * cb[j + k];
      o[k] = value;
    }
    StoreVec<kV>(out + i, o);
  }
}

template <typename T, bool kBackward>
void LaunchChunkSums(const T* x, const T* dy, const float* mean, int64_t n, int64_t c, int64_t chunks, Sum* part,
                     Stream stream) {
  const dim3 grid(static_cast<unsigned int>(chunks)), block(kColumns, kRows);
  const int64_t per = RowsPerChunk(n);
  Sum* part2 = part + chunks * c;
  WithVectorWidth<T>(VectorWidth<T>(c, {x, dy}), [&](auto width) {
    LaunchChained(ChunkSumsKernel<T, kBackward, decltype(width)::value>, grid, block, 0, stream, x, dy, mean, n, c, per,
                  part, part2);
  });
}

template <typename T>
void LaunchColumnAffine(const T* a, const float* a_center, const float* ca, const T* b, const float* b_center,
                        const float* cb, const float* cc, int64_t total, int64_t c, T* out, Stream stream) {
  const int v = VectorWidth<T>(c, {a, b, out});
  const unsigned int blocks = BlocksFor(total / v);
  WithVectorWidth<T>(v, [&](auto width) {
    LaunchChained(ColumnAffineKernel<T, decltype(width)::value>, blocks, kThreads, 0, stream, a, a_center, ca, b,
                  b_center, cb, cc, total, c, out);
  });
}

// scale[j] = gamma[j] / sqrt(variance[j] + epsilon) (RowNormalize: float, from given statistics).
__global__ void NormalizeScaleKernel(const float* gamma, const float* variance, int64_t c, float epsilon,
                                     float* scale) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(j, c) { scale[j] = gamma[j] * (1.0f / sqrtf(variance[j] + epsilon)); }
}

__global__ void FillKernel(float* p, int64_t count, float value) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(i, count) { p[i] = value; }
}

}  // namespace

template <typename T>
GpuStatus RowBatchNorm(const RowBatchNormArgs<T>& a, Scratch* scratch, Stream stream) {
  const int64_t n = a.n, c = a.c;
  if (c == 0) return GpuStatus::Ok();
  if (n == 0) {  // no rows: no statistics
    const float nan = __builtin_nanf("");
    LaunchChained(FillKernel, BlocksFor(c), kThreads, 0, stream, a.mean, c, nan);
    LaunchChained(FillKernel, BlocksFor(c), kThreads, 0, stream, a.variance, c, nan);
    LaunchChained(FillKernel, BlocksFor(c), kThreads, 0, stream, a.inv_std, c, nan);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNorm fill");
    return GpuStatus::Ok();
  }
  const int64_t chunks = RowChunks(n);
  double* part = scratch->DeviceArray<double>(2 * chunks * c + 2 * c);
  if (part == nullptr) return GpuStatus::OutOfMemory("RowBatchNorm partial sums");
  double* coef = part + 2 * chunks * c;
  LaunchChunkSums<T, false>(a.x, nullptr, nullptr, n, c, chunks, part, stream);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNorm sums");
  LaunchChained(StatisticsKernel<T>, WarpBlocksFor(c), kThreads, 0, stream, a.x, a.gamma, part, part + chunks * c,
                chunks, n, c, a.epsilon, a.mean, a.variance, a.inv_std, coef);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNorm statistics");
  const int v = VectorWidth<T>(c, {a.x, a.y});
  const unsigned int blocks = BlocksFor(n * c / v);
  WithVectorWidth<T>(v, [&](auto width) {
    LaunchChained(NormalizeRowsKernel<T, decltype(width)::value>, blocks, kThreads, 0, stream, a.x, coef, a.beta, n * c,
                  c, a.y);
  });
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNorm normalise");
  return GpuStatus::Ok();
}

template <typename T>
GpuStatus RowBatchNormGrad(const RowBatchNormGradArgs<T>& a, Scratch* scratch, Stream stream) {
  const int64_t n = a.n, c = a.c;
  if (c == 0) return GpuStatus::Ok();
  if (n == 0) {
    LaunchChained(FillKernel, BlocksFor(c), kThreads, 0, stream, a.dgamma, c, 0.0f);
    LaunchChained(FillKernel, BlocksFor(c), kThreads, 0, stream, a.dbeta, c, 0.0f);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNormGrad fill");
    return GpuStatus::Ok();
  }
  const int64_t chunks = RowChunks(n);
  double* part = scratch->DeviceArray<double>(2 * chunks * c + 3 * c);
  if (part == nullptr) return GpuStatus::OutOfMemory("RowBatchNormGrad partial sums");
  double* coef = part + 2 * chunks * c;
  LaunchChunkSums<T, true>(a.x, a.dy, a.mean, n, c, chunks, part, stream);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNormGrad sums");
  LaunchChained(GradCoefficientsKernel, WarpBlocksFor(c), kThreads, 0, stream, a.gamma, a.inv_std, part,
                part + chunks * c, chunks, n, c, a.dgamma, a.dbeta, coef);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNormGrad coefficients");
  const int v = VectorWidth<T>(c, {a.dy, a.x, a.dx});
  const unsigned int blocks = BlocksFor(n * c / v);
  WithVectorWidth<T>(v, [&](auto width) {
    LaunchChained(GradDxKernel<T, decltype(width)::value>, blocks, kThreads, 0, stream, a.dy, a.x, a.mean, coef, n * c,
                  c, a.dx);
  });
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowBatchNormGrad dx");
  return GpuStatus::Ok();
}

template <typename T>
GpuStatus RowScaleShift(const RowScaleShiftArgs<T>& a, Stream stream) {
  if (a.n == 0 || a.c == 0) return GpuStatus::Ok();
  LaunchColumnAffine<T>(a.x, nullptr, a.scale, nullptr, nullptr, nullptr, a.shift, a.n * a.c, a.c, a.y, stream);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowScaleShift");
  return GpuStatus::Ok();
}

template <typename T>
GpuStatus RowNormalize(const RowNormalizeArgs<T>& a, Scratch* scratch, Stream stream) {
  if (a.c == 0) return GpuStatus::Ok();
  float* scale = scratch->DeviceArray<float>(a.c);
  if (scale == nullptr) return GpuStatus::OutOfMemory("RowNormalize scales");
  LaunchChained(NormalizeScaleKernel, BlocksFor(a.c), kThreads, 0, stream, a.gamma, a.variance, a.c, a.epsilon, scale);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowNormalize scales");
  if (a.n == 0) return GpuStatus::Ok();
  LaunchColumnAffine<T>(a.x, a.mean, scale, nullptr, nullptr, nullptr, a.beta, a.n * a.c, a.c, a.y, stream);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("RowNormalize");
  return GpuStatus::Ok();
}

#define INSTANTIATE_ROW_BATCH_NORM(T)                                                         \
  template GpuStatus RowBatchNorm<T>(const RowBatchNormArgs<T>&, Scratch*, Stream);           \
  template GpuStatus RowBatchNormGrad<T>(const RowBatchNormGradArgs<T>&, Scratch*, Stream);   \
  template GpuStatus RowScaleShift<T>(const RowScaleShiftArgs<T>&, Stream);                   \
  template GpuStatus RowNormalize<T>(const RowNormalizeArgs<T>&, Scratch*, Stream);
INSTANTIATE_ROW_BATCH_NORM(float)
INSTANTIATE_ROW_BATCH_NORM(Half)
INSTANTIATE_ROW_BATCH_NORM(BFloat16)
#undef INSTANTIATE_ROW_BATCH_NORM

}  // namespace gpu
}  // namespace tf_sparseconv

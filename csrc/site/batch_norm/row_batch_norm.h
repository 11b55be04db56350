// Batch normalization of feature rows [n, c] over the rows, per column (channel): the
// contract of the RowBatchNorm, RowBatchNormGrad, RowScaleShift and RowNormalize functors, shared by the
// CPU (row_batch_norm_kernels.cc) and the GPU (row_batch_norm.cu). Statistics, gamma, beta
// and dgamma, dbeta are float32 whatever the rows' type (half, bfloat16, float). RowBatchNorm
// and RowBatchNormGrad sum in float64 and form y and dx in float64, rounding each result
// once: float32 intermediates (squared deviations, sum(dy * (x - mean)), gamma *
// inv_std^2 * dgamma / n) overflow where the results do not. RowScaleShift and
// RowNormalize compute in float32.
//
// Forward (training): mean = sum(x) / n, variance = sum((x - mean)^2) / n (biased, the
// one the rows are normalised with), inv_std = 1 / sqrt(variance + epsilon),
// y = (x - mean) * inv_std * gamma + beta.
// Backward: with xhat = (x - mean) * inv_std, dbeta = sum(dy), dgamma = sum(dy * xhat),
// dx = gamma * inv_std * (dy - dbeta / n - xhat * dgamma / n): the gradient through the
// batch's own mean and variance, as Keras' layer in training mode.
// Scale-shift: y = x * scale + shift.
// Normalize (inference from moving statistics): scale = gamma / sqrt(variance + epsilon)
// per column, y = (x - mean) * scale + beta.
//
// The sums are deterministic: each device splits the rows into chunks fixed by n alone
// and adds the chunks' partial sums in chunk order. The variance is summed about a pivot
// (the first row), so rows far from zero lose no precision to cancellation.
#ifndef TF_SPARSECONV_SITE_BATCH_NORM_ROW_BATCH_NORM_H_
#define TF_SPARSECONV_SITE_BATCH_NORM_ROW_BATCH_NORM_H_

#include <cstdint>

namespace tf_sparseconv {

template <typename T>
struct RowBatchNormArgs {
  const T* x = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  int64_t n = 0;
  int64_t c = 0;
  float epsilon = 0;
  T* y = nullptr;
  float* mean = nullptr;
  float* variance = nullptr;
  float* inv_std = nullptr;
};

template <typename T>
struct RowBatchNormGradArgs {
  const T* dy = nullptr;
  const T* x = nullptr;
  const float* gamma = nullptr;
  const float* mean = nullptr;
  const float* inv_std = nullptr;
  int64_t n = 0;
  int64_t c = 0;
  T* dx = nullptr;
  float* dgamma = nullptr;
  float* dbeta = nullptr;
};

template <typename T>
struct RowScaleShiftArgs {
  const T* x = nullptr;
  const float* scale = nullptr;
  const float* shift = nullptr;
  int64_t n = 0;
  int64_t c = 0;
  T* y = nullptr;
};

template <typename T>
struct RowNormalizeArgs {
  const T* x = nullptr;
  const float* mean = nullptr;
  const float* variance = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  int64_t n = 0;
  int64_t c = 0;
  float epsilon = 0;
  T* y = nullptr;
};

// Rows per chunk of the deterministic sums: chunks of at least kMinChunkRows rows, at most
// kMaxChunks chunks.
constexpr int64_t kMinChunkRows = 256;
constexpr int64_t kMaxChunks = 1024;

inline int64_t RowChunks(int64_t n) {
  int64_t chunks = (n + kMinChunkRows - 1) / kMinChunkRows;
  return chunks < 1 ? 1 : (chunks > kMaxChunks ? kMaxChunks : chunks);
}
inline int64_t RowsPerChunk(int64_t n) {
  const int64_t chunks = RowChunks(n);
  return (n + chunks - 1) / chunks;
}

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_BATCH_NORM_ROW_BATCH_NORM_H_

// The CPU functors of RowBatchNorm, RowBatchNormGrad, RowScaleShift and RowNormalize (the contract in
// row_batch_norm.h) and the CPU registration of their OpKernels (row_batch_norm_kernels.h).
// The chunks of the sums run on TensorFlow's CPU thread pool; their partial sums are added
// in chunk order, so the result does not depend on the pool.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "site/batch_norm/row_batch_norm_kernels.h"
#include "tensorflow/core/framework/bfloat16.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_sparseconv {

namespace {

// Runs chunk(k, first_row, end_row) for the RowChunks(n) chunks of the rows on the pool.
template <typename Chunk>
void ForEachChunk(tensorflow::OpKernelContext* ctx, int64_t n, int64_t c, const Chunk& chunk) {
  const int64_t chunks = RowChunks(n);
  const int64_t per = RowsPerChunk(n);
  ctx->eigen_cpu_device().parallelFor(
      chunks, Eigen::TensorOpCost(0, 0, 4.0 * static_cast<double>(per * c)), [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) {
          const int64_t first = k * per;
          const int64_t last = std::min(n, first + per);
          if (first < last) chunk(k, first, last);
        }
      });
}

// Per column: sum over the chunks, in chunk order, of part[k * c + j].
void AddChunks(const std::vector<double>& part, int64_t chunks, int64_t c, std::vector<double>* out) {
  out->assign(c, 0.0);
  for (int64_t k = 0; k < chunks; ++k) {
    for (int64_t j = 0; j < c; ++j) (*out)[j] += part[k * c + j];
  }
}

}  // namespace

template <typename T>
struct RowBatchNormFunctor<CPUDevice, T> {
  absl::Status operator()(tensorflow::OpKernelContext* ctx, const RowBatchNormArgs<T>& a) {
    const int64_t n = a.n, c = a.c;
    if (c == 0) return absl::OkStatus();
    if (n == 0) {  // no rows: no statistics
      for (int64_t j = 0; j < c; ++j) {
        a.mean[j] = a.variance[j] = a.inv_std[j] = std::numeric_limits<float>::quiet_NaN();
      }
      return absl::OkStatus();
    }
    // The sums, the statistics and y in double, each result rounded once: float squares
    // overflow where the variance does not (row_batch_norm.h). The GPU computes the same
    // expressions.
    const int64_t chunks = RowChunks(n);
    std::vector<double> pivot(c);
    for (int64_t j = 0; j < c; ++j) pivot[j] = static_cast<float>(a.x[j]);
    std::vector<double> part1(chunks * c, 0.0), part2(chunks * c, 0.0);
    ForEachChunk(ctx, n, c, [&](int64_t k, int64_t first, int64_t last) {
      double* s1 = &part1[k * c];
      double* s2 = &part2[k * c];
      for (int64_t r = first; r < last; ++r) {
        const T* row = a.x + r * c;
        for (int64_t j = 0; j < c; ++j) {
          const double d = static_cast<double>(static_cast<float>(row[j])) - pivot[j];
          s1[j] += d;
          s2[j] += d * d;
        }
      }
    });
    std::vector<double> sum1, sum2;
    AddChunks(part1, chunks, c, &sum1);
    AddChunks(part2, chunks, c, &sum2);
    std::vector<double> mean(c), scale(c);
    for (int64_t j = 0; j < c; ++j) {
      const double shifted_mean = sum1[j] / static_cast<double>(n);
      const double raw = sum2[j] / static_cast<double>(n) - shifted_mean * shifted_mean;
      const double variance = raw < 0.0 ? 0.0 : raw;  // rounding below 0 clamped, NaN kept
      const double inv = 1.0 / std::sqrt(variance + static_cast<double>(a.epsilon));
      mean[j] = pivot[j] + shifted_mean;
      a.mean[j] = static_cast<float>(mean[j]);
      a.variance[j] = static_cast<float>(variance);
      a.inv_std[j] = static_cast<float>(inv);
      scale[j] = static_cast<double>(a.gamma[j]) * inv;
    }
    ForEachChunk(ctx, n, c, [&](int64_t, int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {
        for (int64_t j = 0; j < c; ++j) {
          const double x = static_cast<float>(a.x[r * c + j]);
          a.y[r * c + j] = static_cast<T>(static_cast<float>((x - mean[j]) * scale[j] + a.beta[j]));
        }
      }
    });
    return absl::OkStatus();
  }
};

template <typename T>
struct RowBatchNormGradFunctor<CPUDevice, T> {
  absl::Status operator()(tensorflow::OpKernelContext* ctx, const RowBatchNormGradArgs<T>& a) {
    const int64_t n = a.n, c = a.c;
    for (int64_t j = 0; j < c; ++j) a.dgamma[j] = a.dbeta[j] = 0.0f;
    if (n == 0 || c == 0) return absl::OkStatus();
    // The sums and dx's coefficients in double, dx rounded once: a float intermediate
    // (the sum of dy * (x - mean), gamma * inv_std^2 * dgamma / n) overflows where a finite
    // result does not (row_batch_norm.h). The GPU computes the same expressions.
    const int64_t chunks = RowChunks(n);
    std::vector<double> part1(chunks * c, 0.0), part2(chunks * c, 0.0);
    ForEachChunk(ctx, n, c, [&](int64_t k, int64_t first, int64_t last) {
      double* s1 = &part1[k * c];
      double* s2 = &part2[k * c];
      for (int64_t r = first; r < last; ++r) {
        for (int64_t j = 0; j < c; ++j) {
          const double dy = static_cast<float>(a.dy[r * c + j]);
          s1[j] += dy;
          s2[j] += dy * (static_cast<double>(static_cast<float>(a.x[r * c + j])) - a.mean[j]);
        }
      }
    });
    std::vector<double> sum_dy, sum_dy_xc;
    AddChunks(part1, chunks, c, &sum_dy);
    AddChunks(part2, chunks, c, &sum_dy_xc);
    // dx = k1 * (dy - k2 - (x - mean) * k3) per column (row_batch_norm.h's dx)
    std::vector<double> k1(c), k2(c), k3(c);
    for (int64_t j = 0; j < c; ++j) {
      const double inv = a.inv_std[j];
      const double dg = sum_dy_xc[j] * inv;
      a.dbeta[j] = static_cast<float>(sum_dy[j]);
      a.dgamma[j] = static_cast<float>(dg);
      k1[j] = static_cast<double>(a.gamma[j]) * inv;
      k2[j] = sum_dy[j] / static_cast<double>(n);
      k3[j] = inv * (dg / static_cast<double>(n));
    }
    ForEachChunk(ctx, n, c, [&](int64_t, int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {
        for (int64_t j = 0; j < c; ++j) {
          const double centred = static_cast<double>(static_cast<float>(a.x[r * c + j])) - a.mean[j];
          const double inner = (static_cast<double>(static_cast<float>(a.dy[r * c + j])) - k2[j]) - centred * k3[j];
          a.dx[r * c + j] = static_cast<T>(static_cast<float>(k1[j] * inner));
        }
      }
    });
    return absl::OkStatus();
  }
};

template <typename T>
struct RowScaleShiftFunctor<CPUDevice, T> {
  absl::Status operator()(tensorflow::OpKernelContext* ctx, const RowScaleShiftArgs<T>& a) {
    const int64_t c = a.c;
    ForEachChunk(ctx, a.n, c, [&](int64_t, int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {
        for (int64_t j = 0; j < c; ++j) {
          a.y[r * c + j] = static_cast<T>(static_cast<float>(a.x[r * c + j]) * a.scale[j] + a.shift[j]);
        }
      }
    });
    return absl::OkStatus();
  }
};

template <typename T>
struct RowNormalizeFunctor<CPUDevice, T> {
  absl::Status operator()(tensorflow::OpKernelContext* ctx, const RowNormalizeArgs<T>& a) {
    const int64_t c = a.c;
    std::vector<float> scale(static_cast<size_t>(c));
    for (int64_t j = 0; j < c; ++j) scale[j] = a.gamma[j] * (1.0f / std::sqrt(a.variance[j] + a.epsilon));
    ForEachChunk(ctx, a.n, c, [&](int64_t, int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {
        for (int64_t j = 0; j < c; ++j) {
          a.y[r * c + j] = static_cast<T>((static_cast<float>(a.x[r * c + j]) - a.mean[j]) * scale[j] + a.beta[j]);
        }
      }
    });
    return absl::OkStatus();
  }
};

#define REGISTER_ROW_BATCH_NORM_CPU(T)                                                                     \
  REGISTER_KERNEL_BUILDER(                                                                                 \
      Name("TfSparseconv>RowBatchNorm").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),          \
      RowBatchNormOp<CPUDevice, T>);                                                                       \
  REGISTER_KERNEL_BUILDER(                                                                                 \
      Name("TfSparseconv>RowBatchNormGrad").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),      \
      RowBatchNormGradOp<CPUDevice, T>);                                                                   \
  REGISTER_KERNEL_BUILDER(                                                                                 \
      Name("TfSparseconv>RowScaleShift").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),         \
      RowScaleShiftOp<CPUDevice, T>);                                                                      \
  REGISTER_KERNEL_BUILDER(                                                                                 \
      Name("TfSparseconv>RowNormalize").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),          \
      RowNormalizeOp<CPUDevice, T>);
REGISTER_ROW_BATCH_NORM_CPU(float)
REGISTER_ROW_BATCH_NORM_CPU(Eigen::half)
REGISTER_ROW_BATCH_NORM_CPU(Eigen::bfloat16)
#undef REGISTER_ROW_BATCH_NORM_CPU

}  // namespace tf_sparseconv

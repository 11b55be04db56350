// The GPU functors of RowBatchNorm, RowBatchNormGrad, RowScaleShift and RowNormalize (CUDA-free
// interface; kernels in row_batch_norm.cu): the contract of row_batch_norm.h with every
// pointer in device memory. They queue their kernels on `stream` and return: nothing is
// read back.
#ifndef TF_SPARSECONV_SITE_BATCH_NORM_ROW_BATCH_NORM_GPU_H_
#define TF_SPARSECONV_SITE_BATCH_NORM_ROW_BATCH_NORM_GPU_H_

#include "common/gpu_common.h"
#include "site/batch_norm/row_batch_norm.h"
#include "site/conv/site_conv_gpu.h"  // the 16-bit storage types Half and BFloat16

namespace tf_sparseconv {
namespace gpu {

// T: float, Half, BFloat16.
template <typename T>
GpuStatus RowBatchNorm(const RowBatchNormArgs<T>& a, Scratch* scratch, Stream stream);
template <typename T>
GpuStatus RowBatchNormGrad(const RowBatchNormGradArgs<T>& a, Scratch* scratch, Stream stream);
template <typename T>
GpuStatus RowScaleShift(const RowScaleShiftArgs<T>& a, Stream stream);
// Temporary memory: 4 * c bytes (the columns' scales).
template <typename T>
GpuStatus RowNormalize(const RowNormalizeArgs<T>& a, Scratch* scratch, Stream stream);

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_BATCH_NORM_ROW_BATCH_NORM_GPU_H_

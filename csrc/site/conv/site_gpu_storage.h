// TensorFlow's element types as the site GPU kernels see them (the same bits): GpuStorage
// maps Eigen::half and Eigen::bfloat16 to gpu::Half and gpu::BFloat16, Stored reinterprets
// a pointer. For the *_kernels_gpu.cc units (TensorFlow headers), shared by the site
// convolution and the row batch norm.
#ifndef TF_SPARSECONV_SITE_CONV_SITE_GPU_STORAGE_H_
#define TF_SPARSECONV_SITE_CONV_SITE_GPU_STORAGE_H_
#if GOOGLE_CUDA

#include "site/conv/site_conv_gpu.h"
#include "tensorflow/core/framework/bfloat16.h"
#include "tensorflow/core/framework/numeric_types.h"

namespace tf_sparseconv {

template <typename T>
struct GpuStorage {
  using type = T;
};
template <>
struct GpuStorage<Eigen::half> {
  using type = gpu::Half;
};
template <>
struct GpuStorage<Eigen::bfloat16> {
  using type = gpu::BFloat16;
};
static_assert(sizeof(Eigen::half) == sizeof(gpu::Half) && sizeof(Eigen::bfloat16) == sizeof(gpu::BFloat16),
              "half types must be 16-bit");

template <typename T>
const typename GpuStorage<T>::type* Stored(const T* x) {
  return reinterpret_cast<const typename GpuStorage<T>::type*>(x);
}
template <typename T>
typename GpuStorage<T>::type* Stored(T* x) {
  return reinterpret_cast<typename GpuStorage<T>::type*>(x);
}

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA
#endif  // TF_SPARSECONV_SITE_CONV_SITE_GPU_STORAGE_H_

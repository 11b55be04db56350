// The 16-bit storage types of the site kernels (Half, BFloat16: site_conv_gpu.h) in the
// kernels' arithmetic: ToAcc widens a stored value to its accumulator type (float; double
// stays double), FromAcc<T>::Convert rounds an accumulator to nearest even, as Eigen's
// conversions on the CPU. Shared by site_conv.cu and batch_norm/row_batch_norm.cu.
#ifndef TF_SPARSECONV_SITE_CONV_SITE_HALF_CUH_
#define TF_SPARSECONV_SITE_CONV_SITE_HALF_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "site/conv/site_conv_gpu.h"

namespace tf_sparseconv {
namespace gpu {

__device__ inline float ToAcc(float x) { return x; }
__device__ inline double ToAcc(double x) { return x; }
__device__ inline float ToAcc(Half x) { return __half2float(__ushort_as_half(x.bits)); }
__device__ inline float ToAcc(BFloat16 x) { return __uint_as_float(static_cast<uint32_t>(x.bits) << 16); }

template <typename T>
struct FromAcc;
template <>
struct FromAcc<float> {
  __device__ static float Convert(float x) { return x; }
};
template <>
struct FromAcc<double> {
  __device__ static double Convert(double x) { return x; }
};
template <>
struct FromAcc<Half> {
  __device__ static Half Convert(float x) { return Half{__half_as_ushort(__float2half_rn(x))}; }
};
template <>
struct FromAcc<BFloat16> {
  __device__ static BFloat16 Convert(float x) { return BFloat16{__bfloat16_as_ushort(__float2bfloat16_rn(x))}; }
};

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_HALF_CUH_

// The convolution's epilogue on the GPU (site_conv.h's SiteEpilogue): act(n(v) * scale[c]
// + shift[c]) for an output value v of column c, n the optional normalisation by mean and
// variance, in the accumulator type, before the value is rounded to the output's type. Shared by the output-stationary tiles, which apply it
// as they store a row, and the passes after the pair tiles (site_conv.cu).
#ifndef TF_SPARSECONV_SITE_CONV_SITE_EPILOGUE_CUH_
#define TF_SPARSECONV_SITE_CONV_SITE_EPILOGUE_CUH_

#include <cstdint>

#include "site/conv/site_conv.h"

namespace tf_sparseconv {
namespace gpu {

// SiteEpilogue::Any in device code (site_conv.h stays free of CUDA's qualifiers).
template <typename A>
__device__ __forceinline__ bool HasEpilogue(const SiteEpilogue<A>& e) {
  return e.variance != nullptr || e.scale != nullptr || e.shift != nullptr || e.relu;
}

__device__ __forceinline__ float InverseRoot(float x) { return rsqrtf(x); }
__device__ __forceinline__ double InverseRoot(double x) { return rsqrt(x); }

template <typename A>
__device__ __forceinline__ A ApplyEpilogue(const SiteEpilogue<A>& e, int64_t c, A v) {
  if (e.variance != nullptr) v = (v - __ldg(e.mean + c)) * InverseRoot(__ldg(e.variance + c) + e.epsilon);
  if (e.scale != nullptr) v *= __ldg(e.scale + c);
  if (e.shift != nullptr) v += __ldg(e.shift + c);
  return e.relu && v < A(0) ? A(0) : v;  // NaN stays NaN, as in tf.nn.relu
}

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_EPILOGUE_CUH_

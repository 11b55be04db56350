// The convolution's epilogue on the GPU (site_conv.h's SiteEpilogue): act(n(v) * scale[c]
// + shift[c]) for an output value v of column c, n the optional normalisation by mean and
// variance, in the accumulator type, before the value is rounded to the output's type.
// The kernels apply it as one affine map per column, computed once per call by
// ColumnAffineKernel: the output-stationary tiles as they store a row
// (site_conv_outputs.cuh), and one pass after the pair tiles (site_conv.cu).
#ifndef TF_SPARSECONV_SITE_CONV_SITE_EPILOGUE_CUH_
#define TF_SPARSECONV_SITE_CONV_SITE_EPILOGUE_CUH_

#include <cstdint>

#include "common/gpu_util.cuh"
#include "site/conv/site_conv.h"

namespace tf_sparseconv {
namespace gpu {

__device__ __forceinline__ float InverseRoot(float x) { return rsqrtf(x); }
__device__ __forceinline__ double InverseRoot(double x) { return rsqrt(x); }

// The epilogue as one affine map per column, for kernels that apply it to many rows of
// the same columns: coefficients[c] = the scale s of column c and coefficients[cout + c]
// its shift b, so that act(n(v) * scale + shift) = act(v * s + b).
template <typename A>
__global__ void ColumnAffineKernel(SiteEpilogue<A> e, int64_t cout, A* coefficients) {
  ChainedKernelBegin();
  TF_SPARSECONV_GRID_LOOP(c, cout) {
    A s = e.scale != nullptr ? e.scale[c] : A(1);
    A b = e.shift != nullptr ? e.shift[c] : A(0);
    if (e.variance != nullptr) {
      s *= InverseRoot(e.variance[c] + e.epsilon);
      b -= e.mean[c] * s;
    }
    coefficients[c] = s;
    coefficients[cout + c] = b;
  }
}

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_EPILOGUE_CUH_

// The float32 products of the CPU site convolution with AVX2 and FMA (site_gemm_avx2.cc,
// compiled with -mavx2 -mfma) and with AVX-512 (site_gemm_avx512.cc, -mavx512f), each
// called only where the CPU has it. TensorFlow's own build targets CPUs without them, so
// Eigen's GEMM in our kernels runs 128-bit SSE without fused multiply-adds; these
// register-tiled loops run 256- or 512-bit FMAs straight from the gathered rows to the
// output rows. The sum over the reduced index runs in its natural order, with the same
// fused multiply-adds in both widths: the results depend neither on the thread count nor
// on the width.
#ifndef TF_SPARSECONV_SITE_CONV_SITE_GEMM_CPU_H_
#define TF_SPARSECONV_SITE_CONV_SITE_GEMM_CPU_H_

#include <cstdint>

namespace tf_sparseconv {

// The products a call runs: Eigen's GEMM, the AVX2 tiles or the AVX-512 tiles.
enum class CpuProducts { kPortable, kAvx2, kAvx512 };

// out_rows[r][c] += sum over k < cin of in_rows[r][k] * w[k * cout + c], for r < rows and
// c < cout. Distinct out_rows; w is [cin, cout] row-major.
void GatherGemmScatterAvx2(int64_t rows, int64_t cin, int64_t cout, const float* const* in_rows, const float* w,
                           float* const* out_rows);

// dw[k * cout + c] += sum over r < rows of x_rows[r][k] * g_rows[r][c], for k < cin and
// c < cout; dw is [cin, cout] row-major.
void OuterProductSumAvx2(int64_t rows, int64_t cin, int64_t cout, const float* const* x_rows,
                         const float* const* g_rows, float* dw);

// The same two products with AVX-512 (same contracts, same results).
void GatherGemmScatterAvx512(int64_t rows, int64_t cin, int64_t cout, const float* const* in_rows, const float* w,
                             float* const* out_rows);
void OuterProductSumAvx512(int64_t rows, int64_t cin, int64_t cout, const float* const* x_rows,
                           const float* const* g_rows, float* dw);

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_GEMM_CPU_H_
